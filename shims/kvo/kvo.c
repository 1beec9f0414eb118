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
 * What each call does (pass-through = the engine's function, with the caller's arguments):
 *   lookup   local leading run r of the full chunks; when r is short and peers exist, the
 *            peers' run of the rest (one LOOKUP per batch; nothing is copied yet), and the
 *            peer that holds it is remembered for this thread's loads. When the run is still
 *            short of every full chunk, the engine's own lookup is asked too and the larger
 *            answer returned (a chunk beyond kvshim's run is then loaded by the engine's own
 *            load_chunk).
 *   load     local store (pin, copy to the caller's buffer, release), else the peer the lookup
 *            found: copied from its pool straight into the buffer under its pin
 *            (kvs_peers_retrieve_copy, one copy on the engine's path) and queued to be kept
 *            in the local store by the runtime's keep-behind thread (kvs__runtime_keep: cold
 *            start, the pages of the own pool are not touched on the request's path), else
 *            one peer fetch into the local store (kvs_peers_fetch), copied to the buffer and
 *            kept, else pass-through. KVO_OK only after a complete copy.
 *   store    reserve in the local store, copy from the caller's buffer, commit, queue a
 *            write-behind push to a cache peer; PRESENT is kept too. Anything else (no space,
 *            being written elsewhere, a failed copy) is counted and passed through, so the
 *            engine's module may still keep the chunk.
 * One copy per node (KVSHIM_ONE_COPY=1, design §3.5): while a `kvshim serve` cache peer is
 * connected (kvs__runtime_cache_peer), lookup asks it alone (one LOOKUP per batch) and
 * prefetches nothing, load copies from its pool straight into the buffer under its pin
 * (kvs_peers_retrieve_copy), and store copies the buffer straight into a slot of its pool
 * (kvs_peers_store_into: PREPARE_STORE, copy, COMMIT_STORE); nothing is kept locally. A call
 * it fails or refuses falls back to the paths above (cache_peer_fallbacks); a cache peer
 * reached inline gets the own copy + write-behind.
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

#include "internal.h"
#include "keys.h"
#include "kvo_hooks.h"
#include "log.h"
#include "peer.h"
#include "proto.h"
#include "runtime.h"
#include "stats.h"
#include "store.h"
#include "tensor.h"

/* Keys chained per batch on the stack by kvo_lookup (16 bytes each). */
#define KVO_KEY_BATCH 256

/* The peer whose run this thread's last kvo_lookup counted (0: none): its loads copy from
 * there. A load on another thread, or one the peer no longer serves, takes kvs_peers_fetch. */
static __thread uint64_t kvo_peer_hint __attribute__((tls_model("initial-exec")));
/* Chunks of that run not loaded yet: the keeps of this thread's loads are released to the
 * keep-behind thread when it reaches 0 (the request's loads are done), when a load from the
 * peer fails, or at this thread's next lookup. */
static __thread size_t kvo_peer_left __attribute__((tls_model("initial-exec")));

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
  kvs_namespace_t ns;
  memset(&ns, 0, sizeof ns);
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
  ns.dtype = d->dtype;
  ns.layers = d->layers;
  ns.kv_heads = d->kv_heads;
  ns.head_dim = d->head_dim;
  ns.chunk_tokens = d->chunk_tokens;
  ns.rank = d->rank;
  ns.world_size = d->world_size;
  kvs_namespace_set_salt(&ns, rt->opts.salt);
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

/* kvs_peer_copy_fn for the cache peer's pool: ctx is the kvo buffer kind. */
static int kvo_peer_copy_out(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  (void)i;
  return kvo_copy_out(*(const int *)ctx, (uint64_t)(uintptr_t)dst, src, len);
}
static int kvo_peer_copy_in(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  (void)i;
  return kvo_copy_in(dst, *(const int *)ctx, (uint64_t)(uintptr_t)src, len);
}

/* ---- lookup --------------------------------------------------------------------------------- */

/* Peer chunks are fetched into local extents (kvs_peers_fetch: a chunk of the wrong size stops
 * the delivery). The one place they are settled: a COPIED chunk whose copy to the caller
 * succeeded (or that was only prefetched) is committed and kept, any other is aborted. Returns
 * whether chunk f is now held READY locally. */
static bool kvo_settle(kvs__runtime_t *rt, const kvs_fetch_t *f, bool ok) {
  if (f->status == KVS_FETCH_LOCAL) return true;
  if (f->status != KVS_FETCH_COPIED) return false;
  if (ok) return kvs_store_commit(rt->store, KVS_OWNER_LOCAL, f->xfer) == 0;
  kvs_store_abort(rt->store, KVS_OWNER_LOCAL, f->xfer);
  return false;
}

/* kvshim's leading run of the n_full chunks of tokens: local, then a cache peer's or another
 * peer's (remembered in kvo_peer_hint for the loads). */
static size_t kvo_run(kvs__runtime_t *rt, const kvo_desc_t *d, const uint32_t *tokens,
                      size_t n_full) {
  kvs_key_t keys[KVO_KEY_BATCH];
  kvs_key_t prev = kvo_ns_key(rt, d);
  const size_t C = d->chunk_tokens;
  size_t run = 0;
  if (kvo_peer_left || kvo_peer_hint) kvs__runtime_keep_release();
  kvo_peer_hint = 0;
  kvo_peer_left = 0;
  while (run < n_full) {
    size_t nb = kvs_keys_chunks(prev, tokens + run * C, (n_full - run) * C, d->chunk_tokens,
                                keys, KVO_KEY_BATCH);
    if (nb == 0) break;
    prev = keys[nb - 1];
    int r = kvs_store_lookup(rt->store, KVS_OWNER_LOCAL, keys, nb, false, NULL);
    size_t got = r > 0 ? (size_t)r : 0;
    uint64_t cache = 0;
    if (got < nb && rt->peers) {
      kvs_peers_discover(rt->peers, false); /* rate-limited; kvs_peers_lookup would run it */
      cache = kvs__runtime_cache_peer(rt);
    }
    if (cache) {
      /* One copy per node: what the cache peer holds stays there (each load reads it in
       * place); one LOOKUP to it for the whole batch. */
      int cr = kvs_peers_lookup_at(rt->peers, cache, keys + got, nb - got);
      if (cr > 0) got += (size_t)cr;
      else if (cr < 0) kvs_stats_inc(kvs_stats_global(), KVS_STAT_cache_peer_fallbacks);
      /* The cache peer answered: the other engines keep no copies of their own (one copy per
       * node), so it is the only peer asked. */
      if (cr >= 0) {
        run += got;
        if (got < nb) break;
        continue;
      }
    }
    if (got < nb && rt->peers) {
      /* Cold start: nothing is copied here. Each load copies its chunk from this peer's pool
       * straight into the engine's buffer, and the local copy is made behind the engine. */
      uint64_t best = 0;
      int pr = kvs_peers_lookup(rt->peers, keys + got, nb - got, &best);
      if (pr > 0 && best) {
        got += (size_t)pr;
        kvo_peer_left = best == kvo_peer_hint ? kvo_peer_left + (size_t)pr : (size_t)pr;
        kvo_peer_hint = best;
      }
    }
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

/* Copy the local chunk `key` into the buffer: 1 copied, 0 not here, -1 here but not copied. */
static int kvo_load_local(kvs__runtime_t *rt, const kvo_desc_t *d, kvs_key_t key, int buf_kind,
                          uint64_t buf) {
  kvs_xfer_t xfer = 0;
  int r = kvs_store_lookup(rt->store, KVS_OWNER_LOCAL, &key, 1, true, &xfer);
  if (r == 1) {
    kvs_object_view_t v;
    int rc = kvs_store_read_pinned(rt->store, KVS_OWNER_LOCAL, xfer, &v, 1);
    if (rc == 1 && v.extent.length == d->chunk_bytes)
      rc = kvo_copy_out(buf_kind, buf, kvs_pool_base(rt->pool) + v.extent.offset,
                        (size_t)d->chunk_bytes);
    else
      rc = -EPROTO; /* another object under this key (not a kvo chunk of this size) */
    kvs_store_release(rt->store, KVS_OWNER_LOCAL, xfer);
    if (rc == 0) return 1;
    kvs__hook_fallback();
    kvs_log_debug("kvo: local chunk not copied: %s", strerror(-rc));
    return -1;
  }
  return 0;
}

/* Copies chunk `key` from peer `instance`'s pool straight into the buffer, under its pin
 * (kvs_peers_retrieve_copy): 1 copied, 0 not there, negative errno. A copy that outlived its
 * pin (-ESTALE: the pin had ended, docs/protocol.md 4.7 and 6; a thread preempted for pin_ms
 * on a loaded machine) says nothing about the peer: it is redone under a fresh pin, up to
 * KVO_STALE_RETRIES times, before the caller falls back. */
#define KVO_STALE_RETRIES 2
static int kvo_peer_copy(kvs__runtime_t *rt, uint64_t instance, const kvo_desc_t *d,
                         kvs_key_t key, int *buf_kind, uint64_t buf) {
  void *dst = (void *)(uintptr_t)buf;
  int r = -ESTALE;
  for (int i = 0; i <= KVO_STALE_RETRIES && r == -ESTALE; i++)
    r = kvs_peers_retrieve_copy(rt->peers, instance, &key, 1, d->chunk_bytes, &dst,
                                kvo_peer_copy_out, buf_kind);
  return r;
}

/* KVO_OK when chunk `key` was copied into the buffer, KVO_MISS otherwise. A peer's chunk is
 * fetched into the local store, copied out, and kept. */
static int kvo_load(kvs__runtime_t *rt, const kvo_desc_t *d, kvs_key_t key, int buf_kind,
                    uint64_t buf) {
  if (kvo_load_local(rt, d, key, buf_kind, buf) == 1) return KVO_OK;
  if (!rt->peers) return KVO_MISS;
  uint64_t cache = kvs__runtime_cache_peer(rt);
  if (cache) { /* one copy per node: from the cache peer's pool into the buffer, under its pin */
    int r = kvo_peer_copy(rt, cache, d, key, &buf_kind, buf);
    if (r == 1) {
      kvs_stats_inc(kvs_stats_global(), KVS_STAT_cache_peer_loads);
      return KVO_OK;
    }
    if (r < 0) kvs_stats_inc(kvs_stats_global(), KVS_STAT_cache_peer_fallbacks);
  }
  const kvs_layout_t layout = kvo_layout(d);
  uint64_t hint = kvo_peer_hint;
  if (hint && hint != cache) {
    /* The peer this thread's lookup counted: one copy, its pool -> the buffer, under its pin;
     * the local copy is kept behind the engine. Any failure: the fetch below. */
    int r = kvo_peer_copy(rt, hint, d, key, &buf_kind, buf);
    if (r == 1) {
      if (kvo_peer_left) kvo_peer_left--;
      /* A full queue: not kept, still served. */
      kvs__runtime_keep(rt, hint, &key, 1, &layout, kvo_peer_left == 0);
      return KVO_OK;
    }
    kvo_peer_hint = 0;
    kvo_peer_left = 0;
    kvs__runtime_keep_release();
  }
  kvs_fetch_t f;
  kvs_peers_fetch(rt->peers, 0, &key, 1, &layout, NULL, NULL, &f); /* errors: misses */
  if (f.status == KVS_FETCH_LOCAL) /* it became local meanwhile */
    return kvo_load_local(rt, d, key, buf_kind, buf) == 1 ? KVO_OK : KVO_MISS;
  if (f.status != KVS_FETCH_COPIED) return KVO_MISS;
  int rc = kvo_copy_out(buf_kind, buf, kvs_pool_base(rt->pool) + f.extent.offset,
                        (size_t)d->chunk_bytes);
  kvo_settle(rt, &f, rc == 0);
  return rc == 0 ? KVO_OK : KVO_MISS;
}

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

KVO_API int kvo_load_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                           size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  kvo_load_chunk_fn real = kvo_real_kvo_load_chunk();
  kvs_key_t key;
  kvs__runtime_t *rt =
      kvo_chunk_enter(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len, &key);
  if (!rt)
    return real ? real(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) : -ENOSYS;
  int rc;
  {
    KVS__HOOK_ENTER();
    rc = kvo_load(rt, desc, key, buf_kind, buf);
    kvs_stats_inc(kvs_stats_global(), rc == KVO_OK ? KVS_STAT_hook_hits : KVS_STAT_hook_misses);
  }
  if (rc == KVO_OK) return KVO_OK;
  return real ? real(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) : KVO_MISS;
}

/* ---- store ----------------------------------------------------------------------------------- */

/* 0 when the local store now holds chunk `key` (written now or already READY). */
static int kvo_store(kvs__runtime_t *rt, const kvo_desc_t *d, kvs_key_t key, int buf_kind,
                     uint64_t buf) {
  const kvs_layout_t layout = kvo_layout(d);
  uint64_t cache = rt->peers ? kvs__runtime_cache_peer(rt) : 0;
  if (cache) {
    /* One copy per node: straight into the cache peer's pool (PREPARE_STORE slot, the buffer
     * copied into it, COMMIT_STORE); PRESENT is kept too. Anything else keeps the chunk here,
     * as without a cache peer. */
    const void *src = (const void *)(uintptr_t)buf;
    uint8_t oc = 0;
    int r = kvs_peers_store_into(rt->peers, cache, &key, 1, &layout, false, &src, &oc,
                                 kvo_peer_copy_in, &buf_kind);
    if (r == 1) {
      kvs_stats_inc(kvs_stats_global(), KVS_STAT_cache_peer_stores);
      return 0;
    }
    if (r == -ENOTSUP) cache = 0; /* served inline: own copy + write-behind, as before */
    else kvs_stats_inc(kvs_stats_global(), KVS_STAT_cache_peer_fallbacks);
  }
  uint8_t outcome = 0;
  kvs_extent_t ext;
  kvs_xfer_t xfer = 0;
  int rc = kvs_store_reserve_write(rt->store, KVS_OWNER_LOCAL, &key, 1, &layout, 0, &outcome,
                                   &ext, &xfer);
  if (rc < 0) return rc;
  if (rc == 0) return outcome == KVS_RES_PRESENT ? 0 : -ENOSPC;
  rc = kvo_copy_in(kvs_pool_base(rt->pool) + ext.offset, buf_kind, buf, (size_t)d->chunk_bytes);
  if (rc < 0) {
    kvs_store_abort(rt->store, KVS_OWNER_LOCAL, xfer); /* never published */
    kvs__hook_fallback();
    return rc;
  }
  KVS_TRY(kvs_store_commit(rt->store, KVS_OWNER_LOCAL, xfer));
  /* Write-behind to a cache peer; -ENOTSUP (none, or KVSHIM_PUSH=off) and a full queue
   * (counted by the peer client) do not change the answer: the chunk is kept here.
   * kvs_peers_push runs a discovery first, which dials every new or restarted socket in the
   * caller's thread (a peer that accepts but does not answer costs a whole RPC deadline each
   * time). Stores are on the engine's path, so they push only to a cache peer already found
   * by a lookup's discovery (kvs_peers_cache_peer: no discovery, no I/O). */
  if (rt->peers && !cache && kvs_peers_cache_peer(rt->peers)) kvs_peers_push(rt->peers, &key, 1);
  return 0;
}

KVO_API int kvo_store_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                            size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  kvo_store_chunk_fn real = kvo_real_kvo_store_chunk();
  kvs_key_t key;
  kvs__runtime_t *rt =
      kvo_chunk_enter(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len, &key);
  if (!rt)
    return real ? real(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) : -ENOSYS;
  int rc;
  {
    KVS__HOOK_ENTER();
    rc = kvo_store(rt, desc, key, buf_kind, buf);
    kvs_stats_inc(kvs_stats_global(),
                  rc == 0 ? KVS_STAT_hook_stores : KVS_STAT_hook_store_failures);
  }
  if (rc == 0) return KVO_OK;
  return real ? real(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) : KVO_NOT_KEPT;
}

/* ---- family ---------------------------------------------------------------------------------- */

/* dlsym(handle or RTLD_NEXT, "kvo_...") that found the engine's function gets the wrapper; any
 * other definition (another module the engine chose on purpose) is left alone: the generic
 * rule. The child of a fork builds its own runtime (and turns the family on again). */
const kvs__family_t kvs__family_kvo = {KVS__FAMILY_HEAD};
