/* shims/llama/chunks.c: a llama.cpp sequence state split into a frame and one object per
 * chunk of tokens, and a state assembled back from a frame and the first chunks (design §10.4).
 * Pure functions over bytes: no store, no peers, no engine calls, no allocation. Internal:
 * nothing here is exported. It is the one parser of the state's body (blob.c checks only the
 * 8-byte state header in front of it).
 *
 * The state (llama_state_seq_get_data of the pinned llama.cpp; llama-context.cpp:3079-3095,
 * llama-kv-cache.cpp:2053-2330 state_write / _meta / _data; an ISWA cache writes its base cache
 * then its SWA cache, llama-kv-cache-iswa.cpp:259-265). All fields little-endian:
 *
 *     u32 0xaf143cd8, i32 seq_id,
 *     section[1 or 2]:                       one per KV cache of the memory
 *       u32 n_stream
 *       stream[n_stream]: u32 cell_count, and when cell_count > 0:
 *         cell[cell_count]: i32 pos, u32 n_seq_id (1), [ext: i32 x, i32 y, i32 tok], i32 seq_id
 *         u32 v_trans, u32 n_layer
 *         K, per layer:  i32 type, u64 row, row bytes per cell      (cells in order)
 *         V, per layer (none for an MLA cache):
 *           v_trans 0:   i32 type, u64 row, row bytes per cell
 *           v_trans 1:   i32 type, u32 el, u32 n_embd, then for each of the n_embd elements
 *                        el bytes per cell: one token's V is a strided slice of the layer
 *
 * ext (llama_kv_cell_ext) is present when the cache has_cell_ext() (M-RoPE, PLE models); V
 * when the cache is not MLA; neither is written in the state, so the scanner tries the four
 * readings and accepts a state that exactly one of them reads to its last byte.
 *
 * Splittable (kvs__llama_chunks_scan == OK) when, in every section, exactly one stream holds
 * cells, it is the stream the engine writes the sequence into (0 when n_stream == 1, else
 * seq_id: seq_to_stream, llama-kv-cache.cpp:147-155), and its cells are the sequence at
 * positions 0..n-1 in order (cell i: pos i, one seq id, the header's), the same n in every
 * section. Anything else (an SWA cache that dropped cells, a sequence not starting at 0,
 * recurrent memory, an unknown layout) is refused and stays a whole blob.
 *
 * The frame (kvs__llama_frame_hdr_t, then n_sections section records, then one layer record
 * per layer of each section): everything of the state that is not per token. It names no
 * sequence and no token count, so every state of one context layout has the same frame.
 * Its checksum is its identity (frame_id).
 *
 * A chunk object (kvs__llama_chunk_hdr_t, i32 token[n], payload): tokens [c T, c T + n) of
 * the state, T = chunk_tokens, n <= T. Payload, per section: ext[n] (12 bytes each, when
 * ext), then per layer the K rows of the n cells, then per layer their V (v_trans 0: the n
 * rows; v_trans 1: for each element j, the n cells' el bytes). n * cell_bytes in all.
 *
 * Assembly writes the state the engine itself writes for the sequence seq holding the first
 * sum(n) tokens: byte for byte what get_data returns for it (tested against the fake llama,
 * which writes this format). */
#ifndef KVSHIM_LLAMA_CHUNKS_H
#define KVSHIM_LLAMA_CHUNKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keys.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvshim llama shim: chunk objects are little-endian and stored in host order"
#endif

#define KVS_LLAMA_FRAME_MAGIC 0x4653564bu /* "KVSF" */
#define KVS_LLAMA_CHUNK_MAGIC 0x4b53564bu /* "KVSK" */
#define KVS_LLAMA_CHUNKS_VERSION 1

/* Bounds of the pinned llama.cpp: LLAMA_MAX_SEQ 256 streams (llama-cparams.h:8),
 * LLAMA_MAX_LAYERS 512 (llama-hparams.h:11); ggml types are < GGML_TYPE_COUNT (43 in ggml.h),
 * held here to < 64 so a release adding types still splits (the engine checks the type). */
#define KVS_LLAMA_CHUNKS_MAX_STREAMS 256u
#define KVS_LLAMA_CHUNKS_MAX_LAYERS 512u
#define KVS_LLAMA_CHUNKS_MAX_TYPE 64
#define KVS_LLAMA_CHUNKS_MAX_SECTIONS 2u       /* a KV cache, or an ISWA pair (base, SWA) */
#define KVS_LLAMA_CHUNKS_MAX_ROW (1ull << 32)   /* bytes of one K/V row of one cell */
#define KVS_LLAMA_CHUNKS_MAX_CELLS (1u << 24)   /* tokens of one state */
#define KVS_LLAMA_CHUNKS_MAX_CELL (1ull << 32)  /* bytes per token of all layers (no overflow:
                                                 * MAX_CELLS * MAX_CELL < 2^57) */
#define KVS_LLAMA_CELL_EXT 12u                  /* sizeof(llama_kv_cell_ext): x, y, tok */

#define KVS_LLAMA_FRAME_EXT 1u   /* flags: cells carry llama_kv_cell_ext */
#define KVS_LLAMA_FRAME_HAS_V 2u /* flags: V follows K (not an MLA cache) */

typedef struct kvs__llama_frame_hdr {
  uint32_t magic;        /* KVS_LLAMA_FRAME_MAGIC */
  uint16_t version;      /* KVS_LLAMA_CHUNKS_VERSION */
  uint16_t hdr_size;     /* sizeof(kvs__llama_frame_hdr_t) */
  uint32_t chunk_tokens; /* T of the chunks made with it */
  uint32_t n_sections;   /* 1 ..= KVS_LLAMA_CHUNKS_MAX_SECTIONS */
  uint32_t flags;        /* KVS_LLAMA_FRAME_* */
  uint32_t n_layers;     /* layer records in all sections */
  uint64_t cell_bytes;   /* payload bytes per token of a chunk */
  uint64_t ns_lo, ns_hi; /* namespace key of the producer (model + KV settings) */
  uint64_t size;         /* bytes of the whole frame, this header included */
  uint64_t checksum;     /* the frame's id: XXH3 of the header before it, then the rest */
} kvs__llama_frame_hdr_t;
_Static_assert(sizeof(kvs__llama_frame_hdr_t) == 64, "frame header layout is an ABI");

typedef struct kvs__llama_frame_sec {
  uint32_t n_stream; /* 1 ..= KVS_LLAMA_CHUNKS_MAX_STREAMS */
  uint32_t v_trans;  /* 0 or 1 */
  uint32_t n_layer;  /* 1 ..= KVS_LLAMA_CHUNKS_MAX_LAYERS */
  uint32_t zero;
} kvs__llama_frame_sec_t;
_Static_assert(sizeof(kvs__llama_frame_sec_t) == 16, "frame layout is an ABI");

typedef struct kvs__llama_frame_layer {
  int32_t k_type, v_type; /* ggml types (v_type 0 without V) */
  uint64_t k_row;         /* K bytes per cell */
  uint64_t v_row;         /* v_trans 0: V bytes per cell; else 0 */
  uint32_t v_el, v_embd;  /* v_trans 1: bytes per element, elements per cell; else 0 */
} kvs__llama_frame_layer_t;
_Static_assert(sizeof(kvs__llama_frame_layer_t) == 32, "frame layout is an ABI");

typedef struct kvs__llama_chunk_hdr {
  uint32_t magic;        /* KVS_LLAMA_CHUNK_MAGIC */
  uint16_t version;      /* KVS_LLAMA_CHUNKS_VERSION */
  uint16_t hdr_size;     /* sizeof(kvs__llama_chunk_hdr_t) */
  uint32_t index;        /* c: tokens [c T, c T + n_tokens) of the state */
  uint32_t n_tokens;     /* 1 ..= chunk_tokens */
  uint32_t chunk_tokens; /* T */
  uint32_t zero;
  uint64_t frame_id;     /* the frame whose layout the payload follows */
  uint64_t payload;      /* n_tokens * cell_bytes */
  uint64_t ns_lo, ns_hi; /* namespace key of the producer */
  uint64_t checksum;     /* XXH3 of the header before this field, then of the payload */
} kvs__llama_chunk_hdr_t;
_Static_assert(sizeof(kvs__llama_chunk_hdr_t) == 64, "chunk header layout is an ABI");

/* Every refusal is a distinct reason (logged and counted by the caller). */
typedef enum kvs__llama_chunks_status {
  KVS_LLAMA_CHUNKS_OK = 0,
  KVS_LLAMA_CHUNKS_SHORT,     /* shorter than its header */
  KVS_LLAMA_CHUNKS_FOREIGN,   /* not a sequence state / magic, version or header size not ours */
  KVS_LLAMA_CHUNKS_LAYOUT,    /* a state no single reading of the format parses to its end */
  KVS_LLAMA_CHUNKS_CELLS,     /* cells not the sequence at 0..n-1 in one stream (not splittable) */
  KVS_LLAMA_CHUNKS_FIELD,     /* a frame or chunk field out of range or inconsistent */
  KVS_LLAMA_CHUNKS_LENGTH,    /* object length != what its header says (truncated, padded) */
  KVS_LLAMA_CHUNKS_NAMESPACE, /* made in another namespace (model, KV settings) */
  KVS_LLAMA_CHUNKS_FRAME,     /* a chunk of another frame, or another chunk size */
  KVS_LLAMA_CHUNKS_ORDER,     /* chunks not 0, 1, 2.. or a short chunk before the last */
  KVS_LLAMA_CHUNKS_CHECKSUM,  /* bytes changed since the split */
  KVS_LLAMA_CHUNKS_SPACE,     /* the destination is too small */
} kvs__llama_chunks_status_t;
const char *kvs__llama_chunks_status_name(kvs__llama_chunks_status_t s);

/* What kvs__llama_chunks_scan learnt of a splittable state. */
typedef struct kvs__llama_chunks_scan {
  uint32_t n_cells;    /* tokens of the sequence */
  int32_t seq;         /* the header's seq_id */
  uint32_t n_sections;
  uint32_t flags;      /* KVS_LLAMA_FRAME_* */
  uint32_t n_layers;   /* in all sections */
  uint64_t cell_bytes; /* chunk payload bytes per token */
  uint64_t frame_size; /* bytes of its frame */
  uint64_t sec_off[KVS_LLAMA_CHUNKS_MAX_SECTIONS]; /* offset of each section's n_stream */
} kvs__llama_chunks_scan_t;

/* Read state[0, len) (a whole llama_state_seq_get_data output). OK: splittable, *out filled;
 * else FOREIGN, LAYOUT or CELLS, *out untouched. */
kvs__llama_chunks_status_t kvs__llama_chunks_scan(const uint8_t *state, size_t len,
                                                  kvs__llama_chunks_scan_t *out);

/* Write the frame of a scanned state into dst (cap >= sc->frame_size), for chunks of T tokens
 * in namespace ns, and return its id (== its checksum); 0 with nothing written when cap is too
 * small or T is 0. */
uint64_t kvs__llama_chunks_frame(const uint8_t *state, const kvs__llama_chunks_scan_t *sc,
                                 uint32_t T, kvs_key_t ns, uint8_t *dst, size_t cap);

/* Bytes of chunk c of the first `upto` tokens of a scanned state (upto is capped at
 * sc->n_cells; 0: c is past the last of them). */
uint64_t kvs__llama_chunk_size(const kvs__llama_chunks_scan_t *sc, uint32_t T, uint32_t upto,
                               uint32_t c);

/* kvs__llama_chunk_size of a state of N tokens in frame (checked), before it is written. */
uint64_t kvs__llama_frame_chunk_size(const uint8_t *frame, uint64_t N, uint32_t T, uint32_t upto,
                                     uint32_t c);

/* Write chunk c of the first `upto` tokens of the scanned state (its tokens tok[c T, c T + n),
 * n = min(T, upto - c T), tok holding sc->n_cells tokens) into dst (cap >=
 * kvs__llama_chunk_size), with frame, the state's own frame (kvs__llama_chunks_frame with the
 * same T and ns). upto < n_cells makes a short last chunk of a state's canonical tokens (the
 * prefix cache's continuation chunk, design §10.4). OK, SPACE or FIELD (c out of range). */
kvs__llama_chunks_status_t kvs__llama_chunk_write(const uint8_t *state,
                                                  const kvs__llama_chunks_scan_t *sc,
                                                  const int32_t *tok, uint32_t T, uint32_t upto,
                                                  uint32_t c, const uint8_t *frame, kvs_key_t ns,
                                                  uint8_t *dst, size_t cap);

/* Runs of a state that lie in chunk objects, not in the state buffer (design §10.4, direct loads
 * and direct snapshots). Assembling: each payload run of at least `min` bytes is recorded in
 * runs[] (while there is room; past cap it is copied as usual) instead of copied into dst; every
 * run is still hashed before the assembly returns OK, and on OK runs[0, n) are sorted by off and
 * do not overlap. Planning a chunk (kvs__llama_chunk_plan): each of its payload runs of at least
 * `min` bytes is recorded, for the engine to write there. bytes is their sum. The caller owns
 * runs. */
typedef struct kvs__llama_run {
  uint64_t off;   /* bytes [off, off + len) of the state */
  uint64_t len;
  uint8_t *chunk; /* are chunk[0, len): in a chunk object's payload (a plan's NULL: nowhere,
                   * the engine's write of them is dropped) */
} kvs__llama_run_t;

typedef struct kvs__llama_defer {
  kvs__llama_run_t *runs;
  uint32_t cap, n;
  uint64_t min, bytes;
} kvs__llama_defer_t;

/* Direct snapshots (design §10.4): chunk c of the first `upto` tokens of the state of sequence
 * seq holding N tokens in frame (checked; the frame of the state about to be written at state),
 * to be written at dst (cap >= its size): each payload run of at least d->min bytes is appended
 * to d (d->n, d->bytes grow; no room: FIELD, d->n then unusable) as its place in the state and
 * its place in dst. Nothing is read or written at state or dst. Then the engine writes the state
 * with those runs sent to dst, and kvs__llama_chunk_finish completes the chunk. OK, SPACE or
 * FIELD. */
kvs__llama_chunks_status_t kvs__llama_chunk_plan(const uint8_t *frame, uint64_t N, int32_t seq,
                                                 uint32_t T, uint32_t upto, uint32_t c,
                                                 const uint8_t *state, uint8_t *dst, size_t cap,
                                                 kvs__llama_defer_t *d);

/* Direct snapshots: tokens [a, a + n) of the same state that nobody reads (chunks held already):
 * each of their payload runs of at least d->min bytes is appended to d with chunk NULL, for the
 * engine's writes of them to be dropped; the tokens of several chunks in one range make one run
 * per layer (per element of a transposed V). Nothing at state is read or written. OK, or FIELD
 * (a bad range, or no room: d as it was). */
kvs__llama_chunks_status_t kvs__llama_plan_drop(const uint8_t *frame, uint64_t N, int32_t seq,
                                                uint64_t a, uint64_t n, const uint8_t *state,
                                                kvs__llama_defer_t *d);

/* kvs__llama_chunk_write for a chunk planned with runs of at least `min` bytes: those are in
 * dst already (the engine wrote them); the header, the tokens and the shorter runs are written
 * from the scanned state, and the checksum over all of it. min UINT64_MAX: kvs__llama_chunk_write
 * itself. */
kvs__llama_chunks_status_t kvs__llama_chunk_finish(const uint8_t *state,
                                                   const kvs__llama_chunks_scan_t *sc,
                                                   const int32_t *tok, uint32_t T, uint32_t upto,
                                                   uint32_t c, const uint8_t *frame, kvs_key_t ns,
                                                   uint8_t *dst, size_t cap, uint64_t min);

/* Sort d's runs by their place in the state (in place, no allocation). */
void kvs__llama_runs_sort(kvs__llama_defer_t *d);

/* Check a frame object: every field, its length and its checksum, against the chunk size T and
 * namespace ns of the restoring context. On OK *hdr (when not NULL) is its header. */
kvs__llama_chunks_status_t kvs__llama_frame_check(const uint8_t *f, size_t len, uint32_t T,
                                                  kvs_key_t ns, kvs__llama_frame_hdr_t *hdr);

/* Check a chunk object against a checked frame (*fh) and its expected index c. On OK *hdr
 * (when not NULL) is its header; its tokens are at chunk + sizeof(kvs__llama_chunk_hdr_t). */
kvs__llama_chunks_status_t kvs__llama_chunk_check(const uint8_t *chunk, size_t len,
                                                  const kvs__llama_frame_hdr_t *fh, uint32_t c,
                                                  kvs__llama_chunk_hdr_t *hdr);

/* Bytes of the state for n tokens in frame f (checked), or 0 when n is out of range. */
uint64_t kvs__llama_chunks_state_size(const uint8_t *f, uint64_t n);
/* Its inverse: the tokens of a state of `size` bytes in frame f, or 0 when no count gives it. */
uint64_t kvs__llama_chunks_state_tokens(const uint8_t *f, uint64_t size);


/* Assemble into dst (cap bytes) the state of sequence seq holding the tokens of the chunks
 * ch[0 .. nch) (lengths chlen), in frame f, every object checked (kvs__llama_frame_check with T
 * and ns, kvs__llama_chunk_check with index i for ch[i]). last_n: of the last chunk only its
 * first last_n tokens (0: all; more than it holds: FIELD), the part of a continuation chunk
 * that matches the prompt (its checksum still covers all of it). One read of each chunk: each
 * run of its payload hashed while in cache, then copied into place, its checksum compared at its
 * end (design §10.4). OK with *out_len the
 * state's bytes, or the first refusal; *out_len is set only on OK, and nothing is written to
 * dst on a refusal but CHECKSUM (the chunks before the damaged one were copied: dst holds no
 * usable state). defer (NULL: every byte copied): runs recorded, see kvs__llama_defer_t; n and
 * bytes are reset first. */
kvs__llama_chunks_status_t kvs__llama_chunks_assemble(const uint8_t *f, size_t flen, uint32_t T,
                                                      kvs_key_t ns, const uint8_t *const *ch,
                                                      const size_t *chlen, uint32_t nch,
                                                      uint32_t last_n, int32_t seq, uint8_t *dst,
                                                      size_t cap, size_t *out_len,
                                                      kvs__llama_defer_t *defer);

#endif
