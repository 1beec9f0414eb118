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
 *            peers' run of the rest, prefetched into the local store in one batched retrieve
 *            (so the loads that follow are local hits). When the run is still short of every
 *            full chunk, the engine's own lookup is asked too and the larger answer returned
 *            (a chunk beyond kvshim's run is then loaded by the engine's own load_chunk).
 *   load     local store (pin, copy to the caller's buffer, release), else one peer retrieve
 *            straight into the buffer, else pass-through. KVO_OK only after a complete copy.
 *   store    reserve in the local store, copy from the caller's buffer, commit, queue a
 *            write-behind push to a cache peer; PRESENT is kept too. Anything else (no space,
 *            being written elsewhere, a failed copy) is counted and passed through, so the
 *            engine's module may still keep the chunk.
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
#include "preload.h"
#include "proto.h"
#include "stats.h"
#include "store.h"
#include "tensor.h"

/* Keys chained per batch on the stack by kvo_lookup (16 bytes each). */
#define KVO_KEY_BATCH 256

/* The hooked names come from kvo_hooks.h (KVS_KVO_HOOKS); the wrappers below are written out
 * by hand, their signatures being the ABI's. */
enum {
#define KVO_ENUM(name) KVO_H_##name,
  KVS_KVO_HOOKS(KVO_ENUM)
#undef KVO_ENUM
  KVO_H__COUNT
};

static const char *const kvo_names[KVO_H__COUNT] = {
#define KVO_NAME(name) #name,
    KVS_KVO_HOOKS(KVO_NAME)
#undef KVO_NAME
};

/* The engine's functions, resolved once each (a miss is retried: the module may be loaded
 * later). Never a libkvshim address. */
static _Atomic(void *) g_real[KVO_H__COUNT];
/* Set by the family init when the runtime is ACTIVE and the kvo family enabled. */
static atomic_bool g_kvo_on;

static void *kvo_real(int which) {
  void *f = atomic_load_explicit(&g_real[which], memory_order_acquire);
  if (kvs__likely(f != NULL)) return f;
  kvs__hook_depth++;
  f = kvs__resolve_engine_symbol(kvo_names[which]);
  kvs__hook_depth--;
  if (f && kvs__addr_in_self(f)) f = NULL;
  if (f) atomic_store_explicit(&g_real[which], f, memory_order_release);
  return f;
}

/* The runtime when kvshim may serve kvo calls now (may start it), else NULL. */
static inline kvs__runtime_t *kvo_rt(void) {
  if (kvs__unlikely(kvs__hook_depth != 0)) return NULL;
  kvs__runtime_t *rt = kvs__preload_ensure_init();
  if (!rt || !atomic_load_explicit(&g_kvo_on, memory_order_relaxed)) return NULL;
  return rt;
}

/* The kvshim part of each hook runs with the re-entry guard raised. */
#define KVO_ENTER() (kvs__hook_depth++, kvs__hook_count())
#define KVO_LEAVE() (kvs__hook_depth--)

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

/* ---- lookup --------------------------------------------------------------------------------- */

/* Prefetch sink: each object a peer delivers is written into the local store (reserve, copy)
 * and committed once the retrieve confirms the copy (kvo_prefetch_end: a peer whose pins
 * expired under the copy gets it thrown away). An object that cannot be kept locally is
 * skipped (the load falls back to a peer retrieve); one of the wrong size stops the delivery. */
typedef struct kvo_prefetch {
  kvs__runtime_t *rt;
  const kvs_key_t *keys;
  const kvs_layout_t *layout;
  uint64_t chunk_bytes;
  size_t kept;
  size_t n_xfers;
  kvs_xfer_t xfers[KVO_KEY_BATCH]; /* copied, not yet committed */
} kvo_prefetch_t;

static void kvo_prefetch_end(kvo_prefetch_t *p, bool keep) {
  for (size_t i = 0; i < p->n_xfers; i++) {
    if (keep && kvs_store_commit(p->rt->store, KVS_OWNER_LOCAL, p->xfers[i]) == 0) p->kept++;
    else if (!keep) kvs_store_abort(p->rt->store, KVS_OWNER_LOCAL, p->xfers[i]);
  }
  p->n_xfers = 0;
}

static int kvo_prefetch_sink(void *ctx, size_t key_index, const kvs_layout_t *layout,
                             const void *bytes, uint64_t len) {
  (void)layout; /* the key names the chunk; its size is what must agree */
  kvo_prefetch_t *p = ctx;
  if (len != p->chunk_bytes) return -EPROTO;
  kvs_store_t *st = p->rt->store;
  uint8_t outcome = 0;
  kvs_extent_t ext;
  kvs_xfer_t xfer = 0;
  int rc = kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &p->keys[key_index], 1, p->layout, 0,
                                   &outcome, &ext, &xfer);
  if (rc == 1) {
    memcpy(kvs_pool_base(p->rt->pool) + ext.offset, bytes, (size_t)len);
    if (p->n_xfers < KVO_KEY_BATCH) p->xfers[p->n_xfers++] = xfer;
    else kvs_store_abort(st, KVS_OWNER_LOCAL, xfer);
  } else if (rc == 0 && outcome == KVS_RES_PRESENT) {
    p->kept++;
  }
  return 0;
}

/* kvshim's leading run of the n_full chunks of tokens, prefetching peer runs locally. */
static size_t kvo_run(kvs__runtime_t *rt, const kvo_desc_t *d, const uint32_t *tokens,
                      size_t n_full) {
  kvs_key_t keys[KVO_KEY_BATCH];
  kvs_key_t prev = kvo_ns_key(rt, d);
  const kvs_layout_t layout = kvo_layout(d);
  const size_t C = d->chunk_tokens;
  size_t run = 0;
  while (run < n_full) {
    size_t nb = kvs_keys_chunks(prev, tokens + run * C, (n_full - run) * C, d->chunk_tokens,
                                keys, KVO_KEY_BATCH);
    if (nb == 0) break;
    prev = keys[nb - 1];
    int r = kvs_store_lookup(rt->store, KVS_OWNER_LOCAL, keys, nb, false, NULL);
    size_t got = r > 0 ? (size_t)r : 0;
    if (got < nb && rt->peers) {
      uint64_t best = 0;
      int pr = kvs_peers_lookup(rt->peers, keys + got, nb - got, &best);
      if (pr > 0 && best) {
        kvo_prefetch_t pf = {.rt = rt, .keys = keys + got, .layout = &layout,
                             .chunk_bytes = d->chunk_bytes};
        int delivered = kvs_peers_retrieve(rt->peers, best, keys + got, (size_t)pr,
                                           kvo_prefetch_sink, &pf);
        kvo_prefetch_end(&pf, delivered > 0);
        if (delivered > 0) got += (size_t)delivered;
        if (delivered > 0 && pf.kept < (size_t)delivered)
          kvs_log_debug("kvo: prefetched %d chunks from a peer, %zu kept locally", delivered,
                        pf.kept);
      }
    }
    run += got;
    if (got < nb) break;
  }
  return run;
}

KVO_API int kvo_lookup(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens) {
  kvo_lookup_fn real = (kvo_lookup_fn)kvo_real(KVO_H_kvo_lookup);
  kvs__runtime_t *rt = kvo_rt();
  if (!rt || !kvo_desc_ok(desc) || (!tokens && n_tokens > 0))
    return real ? real(desc, tokens, n_tokens) : -ENOSYS;
  size_t n_full = n_tokens / desc->chunk_tokens;
  if (n_full == 0) return real ? real(desc, tokens, n_tokens) : 0;
  KVO_ENTER();
  size_t run = kvo_run(rt, desc, tokens, n_full);
  KVO_LEAVE();
  if (run < n_full && real) {
    /* The engine's own cache may hold more (kvshim declined some stores): the larger run
     * wins; chunks past kvshim's run are then served by the engine's load_chunk. */
    int own = real(desc, tokens, n_tokens);
    if (own > 0 && (size_t)own > run) run = (size_t)own;
  }
  return run > (size_t)INT32_MAX ? -EOVERFLOW : (int)run;
}

/* ---- load ------------------------------------------------------------------------------------ */

typedef struct kvo_load_sink_ctx {
  int buf_kind;
  uint64_t buf;
  uint64_t chunk_bytes;
  int rc; /* of the copy */
} kvo_load_sink_ctx_t;

static int kvo_load_sink(void *ctx, size_t key_index, const kvs_layout_t *layout,
                         const void *bytes, uint64_t len) {
  (void)key_index;
  (void)layout;
  kvo_load_sink_ctx_t *c = ctx;
  if (len != c->chunk_bytes) return c->rc = -EPROTO;
  return c->rc = kvo_copy_out(c->buf_kind, c->buf, bytes, (size_t)len);
}

/* KVO_OK when chunk `key` was copied into the buffer, KVO_MISS otherwise. */
static int kvo_load(kvs__runtime_t *rt, const kvo_desc_t *d, kvs_key_t key, int buf_kind,
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
    if (rc == 0) return KVO_OK;
    kvs__hook_fallback();
    kvs_log_debug("kvo: local chunk not copied: %s", strerror(-rc));
  }
  if (rt->peers) {
    kvo_load_sink_ctx_t c = {.buf_kind = buf_kind, .buf = buf, .chunk_bytes = d->chunk_bytes};
    int got = kvs_peers_retrieve(rt->peers, 0, &key, 1, kvo_load_sink, &c);
    if (got == 1 && c.rc == 0) return KVO_OK;
  }
  return KVO_MISS;
}

KVO_API int kvo_load_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                           size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  kvo_load_chunk_fn real = (kvo_load_chunk_fn)kvo_real(KVO_H_kvo_load_chunk);
  kvs__runtime_t *rt = kvo_rt();
  if (!rt || !kvo_chunk_args_ok(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) ||
      !kvo_buf_usable(buf_kind))
    return real ? real(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) : -ENOSYS;
  KVO_ENTER();
  kvs_key_t key = kvo_chunk_key(kvo_ns_key(rt, desc), desc, tokens, chunk_index);
  int rc = kvo_load(rt, desc, key, buf_kind, buf);
  kvs_stats_inc(kvs_stats_global(), rc == KVO_OK ? KVS_STAT_hook_hits : KVS_STAT_hook_misses);
  KVO_LEAVE();
  if (rc == KVO_OK) return KVO_OK;
  return real ? real(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) : KVO_MISS;
}

/* ---- store ----------------------------------------------------------------------------------- */

/* Whether a cache peer is among the connected peers (no discovery). kvs_peers_push runs a
 * discovery first, which dials every new or restarted socket in the caller's thread: a peer
 * that accepts but does not answer costs a whole RPC deadline each time. Stores are on the
 * engine's path, so they push only to a cache peer already found by a lookup's discovery. */
static bool kvo_cache_peer_known(kvs_peers_t *peers) {
  kvs_peer_info_t info[8];
  int n = kvs_peers_list(peers, info, KVS__ARRAY_LEN(info));
  if (n > (int)KVS__ARRAY_LEN(info)) return true; /* not all listed: let the push decide */
  for (int i = 0; i < n; i++)
    if (info[i].role == KVS_PROTO_ROLE_CACHE) return true;
  return false;
}

/* 0 when the local store now holds chunk `key` (written now or already READY). */
static int kvo_store(kvs__runtime_t *rt, const kvo_desc_t *d, kvs_key_t key, int buf_kind,
                     uint64_t buf) {
  const kvs_layout_t layout = kvo_layout(d);
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
   * (counted by the peer client) do not change the answer: the chunk is kept here. */
  if (rt->peers && kvo_cache_peer_known(rt->peers)) kvs_peers_push(rt->peers, &key, 1);
  return 0;
}

KVO_API int kvo_store_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                            size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  kvo_store_chunk_fn real = (kvo_store_chunk_fn)kvo_real(KVO_H_kvo_store_chunk);
  kvs__runtime_t *rt = kvo_rt();
  if (!rt || !kvo_chunk_args_ok(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) ||
      !kvo_buf_usable(buf_kind))
    return real ? real(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) : -ENOSYS;
  KVO_ENTER();
  kvs_key_t key = kvo_chunk_key(kvo_ns_key(rt, desc), desc, tokens, chunk_index);
  int rc = kvo_store(rt, desc, key, buf_kind, buf);
  kvs_stats_inc(kvs_stats_global(), rc == 0 ? KVS_STAT_hook_stores : KVS_STAT_hook_store_failures);
  KVO_LEAVE();
  if (rc == 0) return KVO_OK;
  return real ? real(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len) : KVO_NOT_KEPT;
}

/* ---- family ---------------------------------------------------------------------------------- */

/* On the path of every dlsym with the "kvo_" prefix (preload.c checks it first). */
KVS__DLSYM_PATH static bool kvo_hooks_name(const char *name) {
  if (name[0] != 'k' || name[1] != 'v' || name[2] != 'o' || name[3] != '_') return false;
  for (size_t i = 0; i < KVO_H__COUNT; i++)
    if (strcmp(kvo_names[i], name) == 0) return true;
  return false;
}

typedef void (*kvo_code_t)(void);
static const kvo_code_t kvo_wrappers[KVO_H__COUNT] = {
#define KVO_WRAPPER_PTR(name) (kvo_code_t)&name,
    KVS_KVO_HOOKS(KVO_WRAPPER_PTR)
#undef KVO_WRAPPER_PTR
};

/* A dlsym(handle or RTLD_NEXT, "kvo_...") that found the engine's function gets the wrapper;
 * any other definition (another module the engine chose on purpose) is left alone. */
static void *kvo_dlsym_substitute(const char *name, void *found) {
  if (!found || kvs__hook_depth != 0) return found;
  for (size_t i = 0; i < KVO_H__COUNT; i++)
    if (strcmp(kvo_names[i], name) == 0)
      return kvo_real((int)i) == found ? (void *)kvo_wrappers[i] : found;
  return found;
}

static int kvo_family_init(kvs__runtime_t *rt) {
  (void)rt;
  atomic_store(&g_kvo_on, true);
  return 0;
}

static void kvo_fork_child(void) {
  /* The child builds its own runtime (and sets this again); resolved pointers stay valid. */
  atomic_store(&g_kvo_on, false);
}

const kvs__family_t kvs__family_kvo = {
    .name = "kvo",
    .flag = KVS_HOOK_KVO,
    .hooks_name = kvo_hooks_name,
    .dlsym_substitute = kvo_dlsym_substitute,
    .init = kvo_family_init,
    .fork_child = kvo_fork_child,
};
