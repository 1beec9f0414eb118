/* shims/llama: internals shared by llama.c, fingerprint.c and the adapter's tests (the test
 * host reads this header to corrupt cached blobs on purpose). Nothing here is exported.
 *
 * What the adapter stores (design §10.2). One store object per saved sequence state:
 *
 *     [kvs__llama_blob_hdr_t][i32 token[n_tokens]][state: state_size bytes]
 *
 * where state is exactly what llama_state_seq_get_data returned for the sequence:
 *     u32 KVS_LLAMA_STATE_MAGIC (0xaf143cd8), i32 seq_id, body
 * and the state file the engine would have written is
 *     u32 'ggsq' (0x67677371), u32 3, u32 n_tokens, i32 token[n_tokens], body
 * (llama-context.cpp of the pinned llama.cpp: the file lacks the in-memory 8-byte header and
 * the in-memory state lacks the tokens). Hence for n tokens and a state of S bytes:
 *     file bytes = 12 + 4 n + (S - 8)          (kvs__llama_file_bytes)
 * which is what llama_state_seq_save_file and _load_file return.
 *
 * Invariants of a blob kvshim accepts (kvs__llama_blob_check), all checked before a single byte
 * reaches the engine:
 *     magic, version and hdr_size are this file's; kind == KVS_LLAMA_BLOB_KIND_SEQ;
 *     object length == hdr_size + 4 n_tokens + state_size  (no truncated or padded blob);
 *     state_size >= 8 and the state starts with KVS_LLAMA_STATE_MAGIC;
 *     model_fp == the fingerprint of the model of the context it is restored into;
 *     checksum == kvs__llama_blob_checksum(blob)  (any flipped byte is refused).
 * All fields little-endian (the hosts kvshim supports are). */
#ifndef KVSHIM_LLAMA_INTERNAL_H
#define KVSHIM_LLAMA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvshim llama shim: blobs are little-endian and stored in host order"
#endif

#define KVS_LLAMA_BLOB_MAGIC 0x4c53564bu /* "KVSL" */
#define KVS_LLAMA_BLOB_VERSION 1
#define KVS_LLAMA_BLOB_KIND_SEQ 1u       /* one sequence's state (llama_state_seq_*) */
#define KVS_LLAMA_FP_SIZE 16             /* model fingerprint bytes (XXH3-128, canonical) */

/* llama.cpp's own constants (pinned version: llama.h and llama-context.cpp). */
#define KVS_LLAMA_STATE_MAGIC 0xaf143cd8u    /* first u32 of llama_state_seq_get_data output */
#define KVS_LLAMA_STATE_HDR 8u               /* that magic + i32 seq_id */
#define KVS_LLAMA_SEQ_FILE_MAGIC 0x67677371u /* LLAMA_STATE_SEQ_MAGIC, 'ggsq' */
#define KVS_LLAMA_SEQ_FILE_VERSION 3u        /* LLAMA_STATE_SEQ_VERSION */
#define KVS_LLAMA_SEQ_FILE_HDR 12u           /* magic, version, n_token_count */

typedef struct kvs__llama_blob_hdr {
  uint32_t magic;          /* KVS_LLAMA_BLOB_MAGIC */
  uint16_t version;        /* KVS_LLAMA_BLOB_VERSION */
  uint16_t hdr_size;       /* sizeof(kvs__llama_blob_hdr_t) */
  uint32_t kind;           /* KVS_LLAMA_BLOB_KIND_SEQ */
  uint32_t n_tokens;       /* i32 tokens following the header */
  uint64_t state_size;     /* bytes of the in-memory sequence state after the tokens */
  uint8_t model_fp[KVS_LLAMA_FP_SIZE]; /* fingerprint of the model that produced the state */
  uint64_t saved_ns;       /* CLOCK_REALTIME of the save, ns */
  /* Identity of the state file written through at save time (file_known == 1), so a load can
   * tell that the file was replaced since (then the file, not this blob, is the truth). */
  uint64_t file_dev, file_ino, file_size;
  int64_t file_mtime_ns;
  uint32_t file_known;
  uint32_t reserved;       /* 0 */
  uint64_t checksum;       /* kvs__llama_blob_checksum */
} kvs__llama_blob_hdr_t;

_Static_assert(sizeof(kvs__llama_blob_hdr_t) == 96, "blob header layout is an ABI");
_Static_assert(offsetof(kvs__llama_blob_hdr_t, model_fp) == 24, "blob header layout is an ABI");
_Static_assert(offsetof(kvs__llama_blob_hdr_t, checksum) == 88, "blob header layout is an ABI");

#define KVS_LLAMA_BLOB_HDR ((uint64_t)sizeof(kvs__llama_blob_hdr_t))

/* XXH3-64 of the header up to the checksum field, chained (as the seed) into XXH3-64 of
 * everything after the header: tokens and state. blob_len >= KVS_LLAMA_BLOB_HDR. */
static inline uint64_t kvs__llama_blob_checksum(const uint8_t *blob, uint64_t blob_len) {
  uint64_t h = XXH3_64bits(blob, offsetof(kvs__llama_blob_hdr_t, checksum));
  return XXH3_64bits_withSeed(blob + KVS_LLAMA_BLOB_HDR, (size_t)(blob_len - KVS_LLAMA_BLOB_HDR),
                              h);
}

/* The byte count llama_state_seq_save_file / _load_file return for n tokens and an in-memory
 * state of state_size (>= 8) bytes. */
static inline uint64_t kvs__llama_file_bytes(uint64_t n_tokens, uint64_t state_size) {
  return KVS_LLAMA_SEQ_FILE_HDR + 4 * n_tokens + (state_size - KVS_LLAMA_STATE_HDR);
}

/* Outcome of kvs__llama_blob_check (each refusal is a distinct reason, logged and counted). */
typedef enum kvs__llama_blob_status {
  KVS_LLAMA_BLOB_OK = 0,
  KVS_LLAMA_BLOB_SHORT,      /* shorter than a header */
  KVS_LLAMA_BLOB_FOREIGN,    /* magic, version, header size or kind not ours */
  KVS_LLAMA_BLOB_LENGTH,     /* object length != header + tokens + state (truncated/padded) */
  KVS_LLAMA_BLOB_STATE,      /* state too short or not starting with KVS_LLAMA_STATE_MAGIC */
  KVS_LLAMA_BLOB_MODEL,      /* made by another model */
  KVS_LLAMA_BLOB_CHECKSUM,   /* bytes changed since the save */
} kvs__llama_blob_status_t;

/* Check every invariant above; on OK *hdr is the header (copied: blob may be unaligned). */
kvs__llama_blob_status_t kvs__llama_blob_check(const uint8_t *blob, uint64_t len,
                                               const uint8_t model_fp[KVS_LLAMA_FP_SIZE],
                                               kvs__llama_blob_hdr_t *hdr);
const char *kvs__llama_blob_status_name(kvs__llama_blob_status_t s);

/* ---- fingerprint.c -------------------------------------------------------------------------- */

/* What went into a fingerprint (for logs and tests). */
typedef struct kvs__llama_fp_info {
  uint64_t size;      /* file bytes */
  int64_t mtime_ns;
  uint32_t gguf_version; /* 0 when the file is not GGUF or its metadata could not be read */
  uint32_t general_keys; /* general.* keys hashed */
  uint64_t n_kv;      /* metadata entries walked */
} kvs__llama_fp_info_t;

#define KVS_LLAMA_FP_EDGE (1u << 20) /* bytes hashed at the head and at the tail of the file */

/* Fingerprint a model file: XXH3-128 over a versioned record of its size, mtime, the XXH3-128
 * of its first and last KVS_LLAMA_FP_EDGE bytes and every GGUF general.* metadata entry (key,
 * type and value bytes; walking stops, and is recorded as stopped, at the first malformed
 * entry). Never the architecture's shape alone: two fine-tunes of one shape differ in their
 * bytes. No heap allocation (a stack buffer and pread). Returns 0 and fills out (and *info
 * when not NULL), or a negative errno: -EINVAL (NULL, not a regular file) or open/fstat/pread
 * errors. */
int kvs__llama_fingerprint(const char *path, uint8_t out[KVS_LLAMA_FP_SIZE],
                           kvs__llama_fp_info_t *info);

/* The absolute, lexically normalised form of path ("//" and "/./" collapsed, "/x/.." removed;
 * relative paths are taken from the current directory), so two processes naming one file
 * differently get one key. Symlinks are not resolved (the file may not exist yet). Returns the
 * length, or -ENAMETOOLONG / -ENOENT (cwd unavailable). */
int kvs__llama_canon_path(const char *path, char *out, size_t cap);

/* ---- shared by llama.c and prefix.c (the prefix cache, design §10.3) --------------------------- */

struct llama_context;
struct llama_model;

/* llama.c: the fingerprint of a model loaded through the hooked llama_model_load_from_file.
 * Returns false (fp untouched) for a model kvshim did not see load or could not fingerprint. */
bool kvs__llama_model_fingerprint(const struct llama_model *model, uint8_t fp[KVS_LLAMA_FP_SIZE]);

/* prefix.c: the engine is replacing the KV of sequence seq of ctx by a state load
 * (llama_state_seq_set_data[_ext], llama_state_seq_load_file; seq < 0: the whole context,
 * llama_state_load_file / llama_state_set_data). The prefix cache stops trusting what it knew of
 * it until it is cleared. Cheap when the prefix cache is off; safe from any thread. */
void kvs__llama_prefix_state_load(struct llama_context *ctx, int32_t seq);

#endif
