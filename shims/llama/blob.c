/* shims/llama: the one blob format of both llama adapters, its checker and the engine's state
 * functions, timed in the llama_state_*_ns counters (blob.h). No cache and no runtime: the flows
 * are blob_flow.c. */
#include <errno.h>
#include <string.h>
#include <time.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t: kvs__llama_hasher_t's state */
#include <xxhash.h>

#include "blob.h"
#include "blob_hash.h"
#include "internal.h"
#include "rows.h" /* KVS_STAT_llama_* (shims/llama/llama_rows.h, composed) */
#include "stats.h"

/* ---- the checksum ----------------------------------------------------------------------------- */

/* 1: the AVX2 build of XXH3, 0: the portable one. */
static int hash_avx2(void) {
  static int g_avx2 = -1; /* -1: not asked yet (a race asks twice, same answer) */
  int use = __atomic_load_n(&g_avx2, __ATOMIC_RELAXED);
  if (use < 0) {
    int have = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    have = kvs__llama_hash_avx2_built && __builtin_cpu_supports("avx2");
#endif
    use = have;
    __atomic_store_n(&g_avx2, use, __ATOMIC_RELAXED);
  }
  return use;
}

uint64_t kvs__llama_hash(const void *p, size_t n, uint64_t seed) {
  if (hash_avx2()) return kvs__llama_hash_avx2(p, n, seed);
  return XXH3_64bits_withSeed(p, n, seed);
}

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((kvs__llama_hasher_t *)0)->state) &&
                   _Alignof(XXH3_state_t) <= 64,
               "kvs__llama_hasher_t holds an XXH3_state_t");

/* reset and digest are the portable build's (every build keeps the state the same way: the
 * AVX2 update only accumulates stripes with wider instructions) */
void kvs__llama_hasher_init(kvs__llama_hasher_t *h, uint64_t seed) {
  memset(h->state, 0, sizeof h->state); /* XXH3_INITSTATE, before a _withSeed reset */
  (void)XXH3_64bits_reset_withSeed((XXH3_state_t *)(void *)h->state, seed);
}

void kvs__llama_hasher_update(kvs__llama_hasher_t *h, const void *p, size_t n) {
  if (hash_avx2()) kvs__llama_hash_avx2_update(h->state, p, n);
  else (void)XXH3_64bits_update((XXH3_state_t *)(void *)h->state, p, n);
}

uint64_t kvs__llama_hasher_digest(const kvs__llama_hasher_t *h) {
  return XXH3_64bits_digest((const XXH3_state_t *)(const void *)h->state);
}

uint64_t kvs__llama_blob_checksum_fast(const uint8_t *blob, uint64_t blob_len) {
  uint64_t h = XXH3_64bits(blob, offsetof(kvs__llama_blob_hdr_t, checksum));
  return kvs__llama_hash(blob + KVS_LLAMA_BLOB_HDR, (size_t)(blob_len - KVS_LLAMA_BLOB_HDR), h);
}

/* ---- the checker ------------------------------------------------------------------------------ */

kvs__llama_blob_status_t kvs__llama_blob_check(const uint8_t *blob, uint64_t len,
                                               const kvs__llama_blob_want_t *want,
                                               kvs__llama_blob_hdr_t *hdr) {
  kvs__llama_blob_hdr_t h;
  if (!blob || len < KVS_LLAMA_BLOB_HDR) return KVS_LLAMA_BLOB_SHORT;
  memcpy(&h, blob, sizeof h);
  if (h.magic != KVS_LLAMA_BLOB_MAGIC || h.version != KVS_LLAMA_BLOB_VERSION ||
      h.hdr_size != KVS_LLAMA_BLOB_HDR || h.kind != want->kind)
    return KVS_LLAMA_BLOB_FOREIGN;
  /* n_tokens < 2^32 and state_size is checked against len first: no overflow below. */
  uint64_t rest = len - KVS_LLAMA_BLOB_HDR;
  uint64_t tok_bytes = 4 * (uint64_t)h.n_tokens;
  if (tok_bytes > rest || h.state_size != rest - tok_bytes) return KVS_LLAMA_BLOB_LENGTH;
  bool keyed_ok = h.kind == KVS_LLAMA_BLOB_KIND_PREFIX
                      ? h.chunk_tokens == want->chunk && want->chunk != 0 &&
                            h.keyed_tokens != 0 && h.keyed_tokens % want->chunk == 0 &&
                            h.keyed_tokens <= h.n_tokens &&
                            (h.canon_tokens == 0 || (h.canon_tokens >= h.keyed_tokens &&
                                                     h.canon_tokens <= h.n_tokens))
                      : h.keyed_tokens == 0 && h.chunk_tokens == 0 && h.canon_tokens == 0;
  if (!keyed_ok) return KVS_LLAMA_BLOB_KEYED;
  uint32_t state_magic = 0;
  if (h.state_size >= KVS_LLAMA_STATE_HDR)
    memcpy(&state_magic, blob + KVS_LLAMA_BLOB_HDR + tok_bytes, sizeof state_magic);
  if (state_magic != KVS_LLAMA_STATE_MAGIC) return KVS_LLAMA_BLOB_STATE;
  if (!want->model_fp || memcmp(h.model_fp, want->model_fp, KVS_LLAMA_FP_SIZE) != 0)
    return KVS_LLAMA_BLOB_MODEL;
  if (h.ns_lo != want->ns.lo || h.ns_hi != want->ns.hi) return KVS_LLAMA_BLOB_NAMESPACE;
  if (kvs__llama_blob_checksum_fast(blob, len) != h.checksum) return KVS_LLAMA_BLOB_CHECKSUM;
  if (hdr) *hdr = h;
  return KVS_LLAMA_BLOB_OK;
}

const char *kvs__llama_blob_status_name(kvs__llama_blob_status_t s) {
  switch (s) {
  case KVS_LLAMA_BLOB_OK: return "ok";
  case KVS_LLAMA_BLOB_SHORT: return "shorter than its header";
  case KVS_LLAMA_BLOB_FOREIGN: return "foreign magic, version or kind";
  case KVS_LLAMA_BLOB_LENGTH: return "length does not match its header (truncated?)";
  case KVS_LLAMA_BLOB_KEYED: return "keyed tokens or chunk size inconsistent";
  case KVS_LLAMA_BLOB_STATE: return "not a llama.cpp sequence state";
  case KVS_LLAMA_BLOB_MODEL: return "saved by another model";
  case KVS_LLAMA_BLOB_NAMESPACE: return "saved by a context with other KV settings";
  case KVS_LLAMA_BLOB_CHECKSUM: return "checksum mismatch (corrupted)";
  }
  return "unknown";
}

/* ---- the engine's sequence state functions ---------------------------------------------------- */

bool kvs__llama_state_api_ok(const kvs__llama_state_api_t *a) {
  return (a->get_size || a->get_size_ext) && (a->get_data || a->get_data_ext) &&
         (a->set_data || a->set_data_ext);
}

/* The engine's own time in the state calls kvshim makes (llama_state_{get,set}_ns): what a
 * snapshot or restore costs that kvshim cannot shrink, beside what it adds (docs/PERF.md 13). */
static void state_time(kvs_stat_id_t id, uint64_t t0) {
  kvs_stats_add(kvs_stats_global(), id, kvs__now_ns() - t0);
}

size_t kvs__llama_state_size(const kvs__llama_state_api_t *a, struct llama_context *ctx,
                             int32_t seq) {
  uint64_t t0 = kvs__now_ns();
  size_t r = a->get_size_ext ? a->get_size_ext(ctx, seq, 0) : a->get_size ? a->get_size(ctx, seq)
                                                                          : 0;
  state_time(KVS_STAT_llama_state_get_ns, t0);
  return r;
}

/* One get (dst) or set (src) of a sequence's state, the _ext form where the engine has it. */
static size_t state_io(const kvs__llama_state_api_t *a, struct llama_context *ctx, uint8_t *dst,
                       const uint8_t *src, size_t size, int32_t seq) {
  uint64_t t0 = kvs__now_ns();
  size_t r = 0;
  if (dst)
    r = a->get_data_ext ? a->get_data_ext(ctx, dst, size, seq, 0)
        : a->get_data   ? a->get_data(ctx, dst, size, seq)
                        : 0;
  else
    r = a->set_data_ext ? a->set_data_ext(ctx, src, size, seq, 0)
        : a->set_data   ? a->set_data(ctx, src, size, seq)
                        : 0;
  state_time(dst ? KVS_STAT_llama_state_get_ns : KVS_STAT_llama_state_set_ns, t0);
  return r;
}

size_t kvs__llama_state_get(const kvs__llama_state_api_t *a, struct llama_context *ctx, uint8_t *dst,
                            size_t size, int32_t seq) {
  return dst ? state_io(a, ctx, dst, NULL, size, seq) : 0;
}

size_t kvs__llama_state_set(const kvs__llama_state_api_t *a, struct llama_context *ctx,
                            const uint8_t *src, size_t size, int32_t seq) {
  return state_io(a, ctx, NULL, src, size, seq);
}
