/* shims/llama/blob.c: the one on-pool format both llama adapters store (the state adapter,
 * llama.c, design §10.2; the prefix cache, prefix.c, design §10.3), its one checker and the
 * engine's state functions. Pure: the flows a blob goes through over the cache are
 * blob_flow.h. Internal: nothing here is exported. The test hosts read this header to corrupt
 * cached blobs on purpose.
 *
 * One store object per saved sequence state:
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
 *
 * Two kinds share the header:
 *   SEQ     a llama_state_seq_save_file (llama.c), bound under the path key and the token
 *           prefix key; keyed_tokens == chunk_tokens == 0; file_* record the state file
 *           written through at save time.
 *   PREFIX  a prefix-cache snapshot (prefix.c), bound under the chunk keys h(0) .. h(J - 1),
 *           J = keyed_tokens / chunk_tokens (primary: the last); file_* are 0.
 *
 * Invariants of a blob kvshim accepts (kvs__llama_blob_check), all checked before a single byte
 * reaches the engine:
 *     magic, version and hdr_size are this file's; kind == the kind asked for;
 *     object length == hdr_size + 4 n_tokens + state_size  (no truncated or padded blob);
 *     SEQ: keyed_tokens == chunk_tokens == 0; PREFIX: chunk_tokens == ours,
 *          0 < keyed_tokens <= n_tokens, keyed_tokens % chunk_tokens == 0, canon_tokens == 0
 *          or keyed_tokens <= canon_tokens <= n_tokens; SEQ: canon_tokens == 0;
 *     state_size >= 8 and the state starts with KVS_LLAMA_STATE_MAGIC;
 *     model_fp == the fingerprint of the model of the context it is restored into;
 *     (ns_lo, ns_hi) == the namespace key of that context (model + KV settings);
 *     checksum == kvs__llama_blob_checksum(blob)  (any flipped byte is refused).
 * All fields little-endian (the hosts kvshim supports are). */
#ifndef KVSHIM_LLAMA_BLOB_H
#define KVSHIM_LLAMA_BLOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "keys.h"
#include "model.h" /* KVS_LLAMA_FP_SIZE */

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvshim llama shim: blobs are little-endian and stored in host order"
#endif

#define KVS_LLAMA_BLOB_MAGIC 0x4c53564bu /* "KVSL" */
#define KVS_LLAMA_BLOB_VERSION 2         /* 1: the state adapter's 96-byte header (and "KVSP") */
#define KVS_LLAMA_BLOB_KIND_SEQ 1u       /* llama_state_seq_save_file (llama.c) */
#define KVS_LLAMA_BLOB_KIND_PREFIX 2u    /* a prefix-cache snapshot (prefix.c) */

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
  uint32_t kind;           /* KVS_LLAMA_BLOB_KIND_* */
  uint32_t n_tokens;       /* i32 tokens following the header (cells in the state) */
  uint32_t keyed_tokens;   /* PREFIX: tokens covered by chunk keys; SEQ: 0 */
  uint32_t chunk_tokens;   /* PREFIX: KVSHIM_CHUNK_TOKENS of the producer; SEQ: 0 */
  uint64_t state_size;     /* bytes of the in-memory sequence state after the tokens */
  uint8_t model_fp[KVS_LLAMA_FP_SIZE]; /* fingerprint of the model that produced the state */
  uint64_t ns_lo, ns_hi;   /* namespace key of the producer (model, and KV settings: PREFIX) */
  uint64_t saved_ns;       /* CLOCK_REALTIME of the save, ns */
  /* SEQ: identity of the state file written through at save time (file_known == 1), so a load
   * can tell that the file was replaced since (then the file, not this blob, is the truth). */
  uint64_t file_dev, file_ino, file_size;
  int64_t file_mtime_ns;
  uint32_t file_known;
  uint32_t canon_tokens;   /* PREFIX: leading tokens whose KV is canonical (prefix_shadow.h), a
                            * restore may stop at any aligned position up to it; 0 (older
                            * producers): keyed_tokens. SEQ: 0 */
  uint64_t checksum;       /* kvs__llama_blob_checksum */
} kvs__llama_blob_hdr_t;

_Static_assert(sizeof(kvs__llama_blob_hdr_t) == 120, "blob header layout is an ABI");
_Static_assert(offsetof(kvs__llama_blob_hdr_t, state_size) == 24, "blob header layout is an ABI");
_Static_assert(offsetof(kvs__llama_blob_hdr_t, model_fp) == 32, "blob header layout is an ABI");
_Static_assert(offsetof(kvs__llama_blob_hdr_t, saved_ns) == 64, "blob header layout is an ABI");
_Static_assert(offsetof(kvs__llama_blob_hdr_t, checksum) == 112, "blob header layout is an ABI");

#define KVS_LLAMA_BLOB_HDR ((uint64_t)sizeof(kvs__llama_blob_hdr_t))

/* XXH3-64 of the header up to the checksum field, chained (as the seed) into XXH3-64 of
 * everything after the header: tokens and state. blob_len >= KVS_LLAMA_BLOB_HDR. The portable
 * reference, as the tests compute it; kvshim computes the same value with
 * kvs__llama_blob_checksum_fast (AVX2 where the CPU has it, blob_hash.h). */
static inline uint64_t kvs__llama_blob_checksum(const uint8_t *blob, uint64_t blob_len) {
  uint64_t h = XXH3_64bits(blob, offsetof(kvs__llama_blob_hdr_t, checksum));
  return XXH3_64bits_withSeed(blob + KVS_LLAMA_BLOB_HDR, (size_t)(blob_len - KVS_LLAMA_BLOB_HDR),
                              h);
}

/* kvs__llama_blob_checksum, the same value, with the widest hash the CPU has (blob.c): what
 * kvshim's own seal and check use. */
uint64_t kvs__llama_blob_checksum_fast(const uint8_t *blob, uint64_t blob_len);
/* XXH3_64bits_withSeed(p, n, seed), through the AVX2 build (blob_hash.h) when the CPU has AVX2
 * (asked once), else the portable one (SSE2 on x86-64). */
uint64_t kvs__llama_hash(const void *p, size_t n, uint64_t seed);

/* kvs__llama_hash in pieces (XXH3's streaming form, the same dispatch): init with the seed,
 * update with consecutive pieces, digest gives the value kvs__llama_hash gives for the pieces in
 * one buffer. Lets a reader hash a piece while it is in cache, then copy it (chunks.c's
 * assembly). The state is XXH3_state_t (blob.c checks that it fits). */
typedef struct kvs__llama_hasher {
  _Alignas(64) unsigned char state[704];
} kvs__llama_hasher_t;
void kvs__llama_hasher_init(kvs__llama_hasher_t *h, uint64_t seed);
void kvs__llama_hasher_update(kvs__llama_hasher_t *h, const void *p, size_t n);
uint64_t kvs__llama_hasher_digest(const kvs__llama_hasher_t *h);

/* The byte count llama_state_seq_save_file / _load_file return for n tokens and an in-memory
 * state of state_size (>= 8) bytes. */
static inline uint64_t kvs__llama_file_bytes(uint64_t n_tokens, uint64_t state_size) {
  return KVS_LLAMA_SEQ_FILE_HDR + 4 * n_tokens + (state_size - KVS_LLAMA_STATE_HDR);
}

/* ---- the checker ------------------------------------------------------------------------------ */

/* Outcome of kvs__llama_blob_check (each refusal is a distinct reason, logged and counted). */
typedef enum kvs__llama_blob_status {
  KVS_LLAMA_BLOB_OK = 0,
  KVS_LLAMA_BLOB_SHORT,      /* shorter than a header */
  KVS_LLAMA_BLOB_FOREIGN,    /* magic, version, header size or kind not ours */
  KVS_LLAMA_BLOB_LENGTH,     /* object length != header + tokens + state (truncated/padded) */
  KVS_LLAMA_BLOB_KEYED,      /* keyed / chunk / canon_tokens inconsistent or not ours */
  KVS_LLAMA_BLOB_STATE,      /* state too short or not starting with KVS_LLAMA_STATE_MAGIC */
  KVS_LLAMA_BLOB_MODEL,      /* made by another model */
  KVS_LLAMA_BLOB_NAMESPACE,  /* made in another namespace (KV types, settings, salt) */
  KVS_LLAMA_BLOB_CHECKSUM,   /* bytes changed since the save */
} kvs__llama_blob_status_t;

/* What the restoring context expects of a blob. */
typedef struct kvs__llama_blob_want {
  uint32_t kind;                         /* KVS_LLAMA_BLOB_KIND_* */
  uint32_t chunk;                        /* PREFIX: our chunk_tokens */
  const uint8_t *model_fp;               /* KVS_LLAMA_FP_SIZE bytes */
  kvs_key_t ns;                          /* namespace key */
} kvs__llama_blob_want_t;

/* Check every invariant above; on OK *hdr (when not NULL) is the header (copied: blob may be
 * unaligned); on a refusal *hdr is untouched. */
kvs__llama_blob_status_t kvs__llama_blob_check(const uint8_t *blob, uint64_t len,
                                               const kvs__llama_blob_want_t *want,
                                               kvs__llama_blob_hdr_t *hdr);
const char *kvs__llama_blob_status_name(kvs__llama_blob_status_t s);

/* ---- the engine's sequence state functions ---------------------------------------------------- */

struct llama_context;

/* Each pair: the _ext form (called with flags 0) is used when present, else the plain one (in
 * the pinned llama.cpp the plain functions are the _ext ones with flags 0, called through
 * libllama's PLT, so they would re-enter kvshim's hooks; older versions have only the plain
 * ones). Filled by each adapter from its real-function table. */
typedef struct kvs__llama_state_api {
  size_t (*get_size)(struct llama_context *ctx, int32_t seq_id);
  size_t (*get_size_ext)(struct llama_context *ctx, int32_t seq_id, uint32_t flags);
  size_t (*get_data)(struct llama_context *ctx, uint8_t *dst, size_t size, int32_t seq_id);
  size_t (*get_data_ext)(struct llama_context *ctx, uint8_t *dst, size_t size, int32_t seq_id,
                         uint32_t flags);
  size_t (*set_data)(struct llama_context *ctx, const uint8_t *src, size_t size, int32_t seq_id);
  size_t (*set_data_ext)(struct llama_context *ctx, const uint8_t *src, size_t size,
                         int32_t seq_id, uint32_t flags);
} kvs__llama_state_api_t;

/* The fields of kvs__llama_state_api_t and the llama.h function of each: an adapter fills the
 * struct from its real-function table with X(field, name, arg). */
#define KVS_LLAMA_STATE_FNS(X, arg)                                                           \
  X(get_size, llama_state_seq_get_size, arg)                                                  \
  X(get_size_ext, llama_state_seq_get_size_ext, arg)                                          \
  X(get_data, llama_state_seq_get_data, arg)                                                  \
  X(get_data_ext, llama_state_seq_get_data_ext, arg)                                          \
  X(set_data, llama_state_seq_set_data, arg)                                                  \
  X(set_data_ext, llama_state_seq_set_data_ext, arg)

/* Every one of get_size, get_data and set_data is there in one form or the other. */
bool kvs__llama_state_api_ok(const kvs__llama_state_api_t *a);
/* The engine's functions (0 when the api lacks one: the engine's own failure value). */
size_t kvs__llama_state_size(const kvs__llama_state_api_t *a, struct llama_context *ctx,
                             int32_t seq);
size_t kvs__llama_state_get(const kvs__llama_state_api_t *a, struct llama_context *ctx, uint8_t *dst,
                            size_t size, int32_t seq);
size_t kvs__llama_state_set(const kvs__llama_state_api_t *a, struct llama_context *ctx,
                            const uint8_t *src, size_t size, int32_t seq);

#endif
