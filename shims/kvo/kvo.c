/* shims/kvo: kvshim's side of the kvo offload-hook ABI (design §10.1, §3, §6).
 *
 * libkvshim.so defines kvo_lookup, kvo_load_chunk and kvo_store_chunk under the exact names of
 * <kvshim/kvo.h>; an engine that calls its offload module through the PLT (or through
 * dlsym(RTLD_DEFAULT)) reaches these wrappers first. Each wrapper serves the call from the
 * node-wide cache and calls the engine's own function (the "real" one, found in the engine's
 * module with kvs__resolve_engine_symbol, never in libkvshim) on a miss, on anything kvshim
 * cannot handle, and on every internal failure. kvshim never makes a kvo call fail that the
 * engine's module would have served.
 *
 * Keys (design §6). The namespace of a descriptor is
 *     engine "kvo/layout=<layout>", model = model_id bytes (up to the first NUL), dtype,
 *     layers, kv_heads, head_dim, chunk_tokens, rank, world_size, salt = KVSHIM_SALT
 * and chunk i of a token sequence is h(i) of its tokens [0, (i + 1) * chunk_tokens): the same
 * chain every kvshim process computes, so one engine process finds what another stored.
 * Objects are stored with the layout [layers][2][chunk_tokens][kv_heads][head_dim] of the
 * descriptor's dtype (kvo dtype codes are kvs dtype codes), nbytes == desc->chunk_bytes.
 *
 * What each call does (pass-through = the engine's function, with the caller's arguments). The
 * tiers are the runtime's (runtime/cache.h, design §3.7): this file computes keys and copies
 * bytes between a pool and the caller's buffer.
 *   lookup   the cache's leading run of the full chunks, batch by batch (kvs__cache_lookup:
 *            local, then the cache peer alone in one-copy mode, else the other peers; nothing
 *            is copied yet). When the run is still short of every full chunk, the engine's own
 *            lookup is asked too and the larger answer returned (a chunk beyond kvshim's run is
 *            then loaded by the engine's own load_chunk).
 *   load     kvs__cache_load copies the chunk into the caller's buffer from whichever tier
 *            holds it (a peer's chunk is kept behind the engine), else pass-through. KVO_OK
 *            only after a complete copy.
 *   store    kvs__cache_save copies the caller's buffer into the cache (the cache peer's pool
 *            in one-copy mode, else the own store + write-behind); PRESENT is kept too.
 *            Anything else (no space, being written elsewhere, a failed copy) is counted and
 *            passed through, so the engine's module may still keep the chunk.
 * Device buffers are copied through kvs_accel_get() (the CUDA shim installs copies through the
 * real driver). With the default accelerator table a "device" pointer is not host memory:
 * such calls pass through untouched.
 *
 * Pass-through without looking: re-entry (kvs__hook_depth != 0), KVSHIM_ENABLE=0, the kvo
 * family disabled (KVSHIM_HOOKS), a runtime that failed to start, an invalid descriptor, or
 * arguments the ABI calls errors (the engine's function reports them). A missing engine
 * function is answered -ENOSYS (never a call through NULL) unless kvshim served the call.
 *
 * Allocation: none on the hit paths. Keys are chained on the stack in batches of
 * KVO_KEY_BATCH; peer calls allocate their messages (peer.c). */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <kvshim/kvo.h>

#include "accel.h"
#include "cache.h"
#include "internal.h"
#include "keys.h"
#include "kvo_hooks.h"
#include "runtime.h"
#include "stats.h"

/* Keys chained per batch on the stack by kvo_lookup (16 bytes each). */
#define KVO_KEY_BATCH 256

/* The tables of the family (runtime/family_tables.h) from kvo_hooks.h: the engine's functions
 * (kvo_real_<name>(), never a libkvshim address; a miss is retried: the module may be loaded
 * later). The wrappers below are written out by hand, their signatures being the ABI's. */
#define KVS_FAMILY_OF(X)                                                                      \
  X(kvs__family_kvo, "kvo", KVS_HOOK_KVO, "kvo_", KVS_KVO_HOOKS, KVS__NO_ROWS, kvs__kvo_pfn_, \
    kvo_real_)
#include "family_tables.h"

/* The runtime when kvshim may serve kvo calls now (may start it), else NULL. */
static inline kvs__runtime_t *kvo_rt(void) {
  if (kvs__unlikely(kvs__hook_depth != 0)) return NULL;
  kvs__runtime_t *rt = kvs__runtime_get();
  return rt && kvs__family_on(&kvs__family_kvo) ? rt : NULL;
}

/* The kvshim part of each hook runs with the re-entry guard raised. */

/* ---- keys ---------------------------------------------------------------------------------- */

/* h(-1) of a (valid) descriptor in this process's tenant (KVSHIM_SALT). */
static kvs_key_t kvo_ns_key(const kvs__runtime_t *rt, const kvo_desc_t *d) {
  /* The descriptor's shape, field for field; the rest zero until filled below. */
  kvs_namespace_t ns = {.dtype = d->dtype, .layers = d->layers, .kv_heads = d->kv_heads,
                        .head_dim = d->head_dim, .chunk_tokens = d->chunk_tokens,
                        .rank = d->rank, .world_size = d->world_size};
  /* "kvo/layout=<decimal>": the layout code is part of the identity (kvo.h). */
  static const char prefix[] = "kvo/layout=";
  memcpy(ns.engine, prefix, sizeof prefix - 1);
  char digits[10];
  int nd = 0;
  uint32_t v = d->layout;
  do {
    digits[nd++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  for (int i = 0; i < nd; i++) ns.engine[sizeof prefix - 1 + i] = digits[nd - 1 - i];
  size_t id_len = strnlen(d->model_id, KVO_MODEL_ID_MAX);
  _Static_assert(KVO_MODEL_ID_MAX <= KVS_NS_STR_MAX, "model id fits the namespace");
  memcpy(ns.model, d->model_id, id_len);
  ns.model_len = (uint32_t)id_len;
  kvs_namespace_set_salt(&ns, rt->opts.core.salt);
  return kvs_keys_namespace(&ns);
}

/* h(i): the key of chunk i (tokens [0, (i + 1) * chunk_tokens) must exist). */
static kvs_key_t kvo_chunk_key(kvs_key_t ns, const kvo_desc_t *d, const uint32_t *tokens,
                               size_t i) {
  kvs_key_t h = ns;
  for (size_t c = 0; c <= i; c++)
    h = kvs_keys_chain(h, tokens + c * d->chunk_tokens, d->chunk_tokens);
  return h;
}

static kvs_layout_t kvo_layout(const kvo_desc_t *d) {
  kvs_layout_t l;
  memset(&l, 0, sizeof l);
  l.dtype = d->dtype;
  l.ndim = 5;
  l.shape[0] = d->layers;
  l.shape[1] = 2;
  l.shape[2] = d->chunk_tokens;
  l.shape[3] = d->kv_heads;
  l.shape[4] = d->head_dim;
  return l;
}

/* ---- argument checks ------------------------------------------------------------------------ */

/* A descriptor kvshim can key: valid by the ABI's rule, and a chunk that fits in memory. */
static bool kvo_desc_ok(const kvo_desc_t *d) {
  return kvo_desc_check(d) == 0 && d->chunk_bytes <= SIZE_MAX;
}

/* Arguments of load/store that the ABI accepts; anything else goes to the engine's function,
 * which reports the error. */
static bool kvo_chunk_args_ok(const kvo_desc_t *d, const uint32_t *tokens, size_t n_tokens,
                              size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  if (!kvo_desc_ok(d) || !tokens || buf == 0) return false;
  if (buf_kind != KVO_BUF_HOST && buf_kind != KVO_BUF_DEVICE) return false;
  if (buf_len < d->chunk_bytes) return false;
  size_t need;
  if (__builtin_add_overflow(chunk_index, 1, &need) ||
      __builtin_mul_overflow(need, (size_t)d->chunk_tokens, &need))
    return false;
  return n_tokens >= need;
}

/* Device buffers need a real accelerator copy; the default table would treat a device
 * address as host memory. */
static inline bool kvo_buf_usable(int buf_kind) {
  return buf_kind == KVO_BUF_HOST || kvs_accel_get() != kvs_accel_default();
}

/* Copy len bytes between the pool (host) and the caller's buffer. */
static int kvo_copy_out(int buf_kind, uint64_t buf, const void *src, size_t len) {
  if (buf_kind == KVO_BUF_HOST) {
    memcpy((void *)(uintptr_t)buf, src, len);
    return 0;
  }
  return kvs_accel_get()->copy((void *)(uintptr_t)buf, src, len, KVS_COPY_H2D);
}
static int kvo_copy_in(void *dst, int buf_kind, uint64_t buf, size_t len) {
  if (buf_kind == KVO_BUF_HOST) {
    memcpy(dst, (const void *)(uintptr_t)buf, len);
    return 0;
  }
  return kvs_accel_get()->copy(dst, (const void *)(uintptr_t)buf, len, KVS_COPY_D2H);
}

/* kvs__cache_copy_fn between a pool and the caller's buffer: ctx is the kvo buffer kind. */
static int kvo_cache_out(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  (void)i;
  return kvo_copy_out(*(const int *)ctx, (uint64_t)(uintptr_t)dst, src, len);
}
static int kvo_cache_in(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  (void)i;
  return kvo_copy_in(dst, *(const int *)ctx, (uint64_t)(uintptr_t)src, len);
}

/* ---- lookup --------------------------------------------------------------------------------- */

/* kvshim's leading run of the n_full chunks of tokens, batch by batch through the cache facade
 * (local, then the cache peer or another peer, remembered there for this thread's loads). */
static size_t kvo_run(kvs__runtime_t *rt, const kvo_desc_t *d, const uint32_t *tokens,
                      size_t n_full) {
  kvs_key_t keys[KVO_KEY_BATCH];
  kvs_key_t prev = kvo_ns_key(rt, d);
  const size_t C = d->chunk_tokens;
  size_t run = 0;
  kvs__cache_lookup_start();
  while (run < n_full) {
    size_t nb = kvs_keys_chunks(prev, tokens + run * C, (n_full - run) * C, d->chunk_tokens,
                                keys, KVO_KEY_BATCH);
    if (nb == 0) break;
    prev = keys[nb - 1];
    size_t got = kvs__cache_lookup(rt, keys, nb);
    run += got;
    if (got < nb) break;
  }
  return run;
}

KVO_API int kvo_lookup(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens) {
  kvo_lookup_fn real = kvo_real_kvo_lookup();
  kvs__runtime_t *rt = kvo_rt();
  if (!rt || !kvo_desc_ok(desc) || (!tokens && n_tokens > 0))
    return real ? real(desc, tokens, n_tokens) : -ENOSYS;
  size_t n_full = n_tokens / desc->chunk_tokens;
  if (n_full == 0) return real ? real(desc, tokens, n_tokens) : 0;
  size_t run;
  {
    KVS__HOOK_ENTER();
    run = kvo_run(rt, desc, tokens, n_full);
  }
  if (run < n_full && real) {
    /* The engine's own cache may hold more (kvshim declined some stores): the larger run
     * wins; chunks past kvshim's run are then served by the engine's load_chunk. */
    int own = real(desc, tokens, n_tokens);
    if (own > 0 && (size_t)own > run) run = (size_t)own;
  }
  return run > (size_t)INT32_MAX ? -EOVERFLOW : (int)run;
}

/* ---- load ------------------------------------------------------------------------------------ */

/* KVO_OK when chunk `key` was copied into the buffer (from whichever tier holds it), KVO_MISS
 * otherwise. */
static int kvo_load(kvs__runtime_t *rt, const kvo_desc_t *d, kvs_key_t key, int buf_kind,
                    uint64_t buf) {
  const kvs_layout_t layout = kvo_layout(d);
  return kvs__cache_load(rt, key, &layout, (void *)(uintptr_t)buf, kvo_cache_out, &buf_kind)
             ? KVO_OK
             : KVO_MISS;
}

/* ---- store ----------------------------------------------------------------------------------- */

/* 0 when the cache now holds chunk `key` (written now or already there). */
static int kvo_store(kvs__runtime_t *rt, const kvo_desc_t *d, kvs_key_t key, int buf_kind,
                     uint64_t buf) {
  const kvs_layout_t layout = kvo_layout(d);
  return kvs__cache_save(rt, key, &layout, (const void *)(uintptr_t)buf, kvo_cache_in,
                         &buf_kind);
}

/* ---- the two chunk hooks --------------------------------------------------------------------- */

/* The runtime when kvshim serves this chunk call, and the chunk's key; NULL: pass through. */
static kvs__runtime_t *kvo_chunk_enter(const kvo_desc_t *d, const uint32_t *tokens,
                                       size_t n_tokens, size_t chunk_index, int buf_kind,
                                       uint64_t buf, size_t buf_len, kvs_key_t *key) {
  kvs__runtime_t *rt = kvo_rt();
  if (!rt || !kvo_chunk_args_ok(d, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) ||
      !kvo_buf_usable(buf_kind))
    return NULL;
  *key = kvo_chunk_key(kvo_ns_key(rt, d), d, tokens, chunk_index);
  return rt;
}

/* The engine's own kvo_load_chunk / kvo_store_chunk (one signature). */
typedef kvo_load_chunk_fn kvo_chunk_fn;

/* One chunk hook: kvshim's load (store = false) or store, counted; anything kvshim does not
 * serve goes to the engine's own function real (-ENOSYS without one and without a runtime;
 * KVO_MISS / KVO_NOT_KEPT without one). */
static int kvo_chunk_hook(bool store, kvo_chunk_fn real, const kvo_desc_t *desc,
                          const uint32_t *tokens, size_t n_tokens, size_t chunk_index,
                          int buf_kind, uint64_t buf, size_t buf_len) {
  kvs_key_t key;
  kvs__runtime_t *rt =
      kvo_chunk_enter(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len, &key);
  if (!rt)
    return real ? real(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) : -ENOSYS;
  int rc;
  {
    KVS__HOOK_ENTER();
    if (store) {
      rc = kvo_store(rt, desc, key, buf_kind, buf) == 0 ? KVO_OK : KVO_NOT_KEPT;
      kvs_stats_inc(kvs_stats_global(),
                    rc == KVO_OK ? KVS_STAT_hook_stores : KVS_STAT_hook_store_failures);
    } else {
      rc = kvo_load(rt, desc, key, buf_kind, buf) == KVO_OK ? KVO_OK : KVO_MISS;
      kvs_stats_inc(kvs_stats_global(), rc == KVO_OK ? KVS_STAT_hook_hits : KVS_STAT_hook_misses);
    }
  }
  if (rc == KVO_OK) return KVO_OK;
  return real ? real(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) : rc;
}

KVO_API int kvo_load_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                           size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  return kvo_chunk_hook(false, kvo_real_kvo_load_chunk(), desc, tokens, n_tokens, chunk_index,
                        buf_kind, buf, buf_len);
}

KVO_API int kvo_store_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                            size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  return kvo_chunk_hook(true, kvo_real_kvo_store_chunk(), desc, tokens, n_tokens, chunk_index,
                        buf_kind, buf, buf_len);
}

/* ---- family ---------------------------------------------------------------------------------- */

/* dlsym(handle or RTLD_NEXT, "kvo_...") that found the engine's function gets the wrapper; any
 * other definition (another module the engine chose on purpose) is left alone: the generic
 * rule. The child of a fork builds its own runtime (and turns the family on again). */
const kvs__family_t kvs__family_kvo = {KVS__FAMILY_HEAD};
