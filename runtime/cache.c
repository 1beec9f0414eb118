/* runtime/cache: the tiers behind one facade (cache.h; design §3.7). The only file under shims/
 * and runtime/ besides runtime.c that calls the store and the peer client. */
#include "cache.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "discovery.h"
#include "internal.h"
#include "log.h"
#include "peer.h"
#include "proto.h"
#include "stats.h"
#include "store.h"

_Static_assert(KVS__CACHE_MISS == (int)KVS_FETCH_MISS && KVS__CACHE_LOCAL == (int)KVS_FETCH_LOCAL &&
                   KVS__CACHE_COPIED == (int)KVS_FETCH_COPIED,
               "fetch statuses are core/wire/peer.h's");

static inline void count(kvs_stat_id_t id) { kvs_stats_inc(kvs_stats_global(), id); }

/* The peer whose run this thread's last lookup counted (0: none): its loads copy from there. A
 * load on another thread, or one the peer no longer serves, takes a fetch. */
static __thread uint64_t g_hint __attribute__((tls_model("initial-exec")));
/* Chunks of that run not loaded yet: the keeps of this thread's loads are released to the
 * keep-behind thread when it reaches 0 (the request's loads are done), when a load from the
 * peer fails, or at this thread's next request (kvs__cache_lookup_start). */
static __thread size_t g_left __attribute__((tls_model("initial-exec")));

/* ---- where an object is ------------------------------------------------------------------- */

uint64_t kvs__cache_peer(kvs__runtime_t *rt) {
  if (!rt->peers || !rt->opts.one_copy) return 0;
  KVS__REENTRY_GUARD();
  kvs__discovery_wait_first();        /* the watcher refreshes the table (design §3.8) */
  return kvs__runtime_cache_peer(rt);
}

bool kvs__cache_peer_has_tiers(kvs__runtime_t *rt, uint64_t instance) {
  return rt->peers && kvs_peers_has_tiers(rt->peers, instance);
}

bool kvs__cache_has_local(kvs__runtime_t *rt, kvs_key_t key) {
  KVS__REENTRY_GUARD();
  return kvs_store_lookup(rt->store, KVS_OWNER_LOCAL, &key, 1, false, NULL) == 1;
}

int kvs__cache_peers_run(kvs__runtime_t *rt, const kvs_key_t *keys, size_t n, uint64_t *where) {
  uint64_t best = 0;
  int run = 0;
  if (rt->peers && n) {
    KVS__REENTRY_GUARD();
    kvs__discovery_wait_first();
    run = kvs_peers_lookup(rt->peers, keys, n, &best); /* the peers the watcher found */
  }
  if (run < 0) run = 0;
  if (where) *where = run > 0 ? best : 0;
  return run;
}

void kvs__cache_lookup_start(void) {
  if (g_left || g_hint) kvs__runtime_keep_release();
  g_hint = 0;
  g_left = 0;
}

size_t kvs__cache_lookup(kvs__runtime_t *rt, const kvs_key_t *keys, size_t n) {
  KVS__REENTRY_GUARD();
  int r = kvs_store_lookup(rt->store, KVS_OWNER_LOCAL, keys, n, false, NULL);
  size_t got = r > 0 ? (size_t)r : 0;
  if (got == n || !rt->peers) return got;
  kvs__discovery_wait_first(); /* the peers the watcher found (design §3.8) */
  uint64_t cache = kvs__runtime_cache_peer(rt);
  if (cache) {
    /* One copy per node: what the cache peer holds stays there (each load reads it in place);
     * one LOOKUP to it for the whole batch. When it answers, the other engines keep no copies
     * of their own, so it is the only peer asked. */
    int cr = kvs_peers_lookup_at(rt->peers, cache, keys + got, n - got);
    if (cr >= 0) return got + (size_t)cr;
    count(KVS_STAT_cache_peer_fallbacks);
  }
  /* Cold start: nothing is copied here. Each load copies its chunk from this peer's pool
   * straight into the caller's buffer, and the local copy is made behind the engine. */
  uint64_t best = 0;
  int pr = kvs_peers_lookup(rt->peers, keys + got, n - got, &best);
  if (pr > 0 && best) {
    got += (size_t)pr;
    g_left = best == g_hint ? g_left + (size_t)pr : (size_t)pr;
    g_hint = best;
  }
  return got;
}

/* ---- chunks ---------------------------------------------------------------------------------- */

/* Copy the local chunk `key` (exactly len bytes) out: 1 copied, 0 not here, -1 here but not
 * copied (another object under the key, or the copy failed: counted in hook_fallbacks). */
static int load_local(kvs__runtime_t *rt, kvs_key_t key, uint64_t len, void *dst,
                      kvs__cache_copy_fn copy, void *ctx) {
  kvs_xfer_t xfer = 0;
  if (kvs_store_lookup(rt->store, KVS_OWNER_LOCAL, &key, 1, true, &xfer) != 1) return 0;
  kvs_object_view_t v;
  int rc = kvs_store_read_pinned(rt->store, KVS_OWNER_LOCAL, xfer, &v, 1);
  if (rc == 1 && v.extent.length == len)
    rc = copy(ctx, 0, dst, kvs_pool_base(rt->pool) + v.extent.offset, (size_t)len);
  else
    rc = -EPROTO; /* another object under this key (not a chunk of this layout) */
  kvs_store_release(rt->store, KVS_OWNER_LOCAL, xfer);
  if (rc == 0) return 1;
  kvs__hook_fallback();
  kvs_log_debug("cache: local chunk not copied: %s", strerror(-rc));
  return -1;
}

/* Copies chunk `key` from peer `instance`'s pool straight into dst, under its pin: 1 copied, 0
 * not there, negative errno. A copy that outlived its pin (-ESTALE: the pin had ended,
 * docs/protocol.md 4.7 and 6; a thread preempted for pin_ms on a loaded machine) says nothing
 * about the peer: it is redone under a fresh pin, up to STALE_RETRIES times. */
#define STALE_RETRIES 2
static int peer_copy(kvs__runtime_t *rt, uint64_t instance, kvs_key_t key, uint64_t len,
                     void *dst, kvs__cache_copy_fn copy, void *ctx) {
  int r = -ESTALE;
  for (int i = 0; i <= STALE_RETRIES && r == -ESTALE; i++)
    r = kvs_peers_retrieve_copy(rt->peers, instance, &key, 1, len, &dst, copy, ctx);
  return r;
}

int kvs__cache_load(kvs__runtime_t *rt, kvs_key_t key, const kvs_layout_t *layout, void *dst,
                    kvs__cache_copy_fn copy, void *ctx) {
  KVS__REENTRY_GUARD();
  const uint64_t len = kvs_layout_nbytes(layout);
  if (load_local(rt, key, len, dst, copy, ctx) == 1) return 1;
  if (!rt->peers) return 0;
  uint64_t cache = kvs__runtime_cache_peer(rt);
  if (cache) { /* one copy per node: from the cache peer's pool into dst, under its pin */
    int r = peer_copy(rt, cache, key, len, dst, copy, ctx);
    if (r == 1) {
      count(KVS_STAT_cache_peer_loads);
      return 1;
    }
    if (r < 0) count(KVS_STAT_cache_peer_fallbacks);
  }
  uint64_t hint = g_hint;
  if (hint && hint != cache) {
    /* The peer this thread's lookup counted: one copy, its pool -> dst, under its pin; the
     * local copy is kept behind the engine. Any failure: the fetch below. */
    if (peer_copy(rt, hint, key, len, dst, copy, ctx) == 1) {
      if (g_left) g_left--;
      kvs__runtime_keep(rt, hint, &key, 1, layout, g_left == 0); /* full queue: not kept */
      return 1;
    }
    g_hint = 0;
    g_left = 0;
    kvs__runtime_keep_release();
  }
  kvs_fetch_t f;
  kvs_peers_fetch(rt->peers, 0, &key, 1, layout, NULL, NULL, &f); /* errors: misses */
  if (f.status == KVS_FETCH_LOCAL) /* it became local meanwhile */
    return load_local(rt, key, len, dst, copy, ctx) == 1;
  if (f.status != KVS_FETCH_COPIED) return 0;
  /* The one place a fetched chunk is settled: kept when its copy out succeeded. */
  int rc = copy(ctx, 0, dst, kvs_pool_base(rt->pool) + f.extent.offset, (size_t)len);
  if (rc < 0) {
    kvs_store_abort(rt->store, KVS_OWNER_LOCAL, f.xfer);
    return 0;
  }
  kvs_store_commit(rt->store, KVS_OWNER_LOCAL, f.xfer); /* a failed commit only loses the local copy */
  return 1;
}

int kvs__cache_save(kvs__runtime_t *rt, kvs_key_t key, const kvs_layout_t *layout,
                    const void *src, kvs__cache_copy_fn copy, void *ctx) {
  KVS__REENTRY_GUARD();
  const uint64_t len = kvs_layout_nbytes(layout);
  uint64_t cache = rt->peers ? kvs__runtime_cache_peer(rt) : 0;
  if (cache) {
    /* One copy per node: straight into the cache peer's pool (PREPARE_STORE slot, src copied
     * into it, COMMIT_STORE); PRESENT is kept too. Anything else keeps the chunk here. */
    uint8_t oc = 0;
    int r = kvs_peers_store_into(rt->peers, cache, &key, 1, layout, false, &src, &oc, copy, ctx);
    if (r == 1) {
      count(KVS_STAT_cache_peer_stores);
      return 0;
    }
    if (r == -ENOTSUP) cache = 0; /* served inline: own copy + write-behind, as without one */
    else count(KVS_STAT_cache_peer_fallbacks);
  }
  uint8_t outcome = 0;
  kvs_extent_t ext;
  kvs_xfer_t xfer = 0;
  int rc = kvs_store_reserve_write(rt->store, KVS_OWNER_LOCAL, &key, 1, layout, 0, &outcome,
                                   &ext, &xfer);
  if (rc < 0) return rc;
  if (rc == 0) return outcome == KVS_RES_PRESENT ? 0 : -ENOSPC;
  rc = copy(ctx, 0, kvs_pool_base(rt->pool) + ext.offset, src, (size_t)len);
  if (rc < 0) {
    kvs_store_abort(rt->store, KVS_OWNER_LOCAL, xfer); /* never published */
    kvs__hook_fallback();
    return rc;
  }
  KVS_TRY(kvs_store_commit(rt->store, KVS_OWNER_LOCAL, xfer));
  /* Write-behind to a cache peer; -ENOTSUP (none, or KVSHIM_PUSH=off) and a full queue
   * (counted by the peer client) do not change the answer: the chunk is kept here. Saves are on
   * the engine's path, so they dial nothing: they push to a cache peer the watcher found
   * (its first scan awaited, design §3.8; kvs_peers_cache_peer: no I/O). */
  if (rt->peers && !cache) {
    kvs__discovery_wait_watcher();
    if (kvs_peers_cache_peer(rt->peers)) kvs_peers_push(rt->peers, &key, 1);
  }
  return 0;
}

/* ---- objects --------------------------------------------------------------------------------- */

static int outcome_errno(uint8_t oc) {
  switch (oc) {
  case KVS_RES_BUSY: return -EBUSY;
  case KVS_RES_NO_SPACE: return -ENOSPC;
  case KVS_RES_TOO_LARGE: return -EFBIG;
  case KVS_RES_PRESENT: return -EEXIST;
  default: return -EINVAL;
  }
}

/* The caller's fill behind a check of the slot's size (a slot of another size is the peer's
 * fault); the fill's own failure is recorded to be returned as is. */
typedef struct slot_fill {
  kvs__cache_copy_fn fill;
  void *ctx;
  uint64_t len;
  int rc; /* the fill's negative errno, or 0 */
} slot_fill_t;

static int slot_fill(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  slot_fill_t *f = ctx;
  if (len != f->len) return -EPROTO;
  int rc = f->fill(f->ctx, i, dst, src, len);
  if (rc < 0) f->rc = rc;
  return rc;
}

int kvs__cache_save_at_peer(kvs__runtime_t *rt, uint64_t cache, const kvs_key_t *keys, size_t nk,
                            uint64_t len, bool replace, kvs__cache_copy_fn fill, void *ctx) {
  kvs_layout_t l = kvs_layout_blob(len);
  const void *buf = NULL;
  uint8_t oc[KVS_PROTO_MAX_KEYS] = {0}; /* 1 for an object; room for a peer that sends more */
  slot_fill_t f = {fill, ctx, len, 0};
  KVS__REENTRY_GUARD();
  int r = kvs_peers_store_into(rt->peers, cache, keys, nk, &l, true, &buf, oc, slot_fill, &f);
  if (f.rc < 0) return f.rc; /* the caller's own failure: nothing published, nothing counted */
  if (r == -ENOTSUP) return 1; /* served inline: own copy + write-behind, as before (kvo too) */
  if (r == 1 && oc[0] == KVS_RES_RESERVED) {
    if (replace) kvs_store_remove(rt->store, &keys[0]); /* an older own copy: -ENOENT, fine */
    count(KVS_STAT_cache_peer_stores);
    return 0;
  }
  if (r == 1 && oc[0] == KVS_RES_PRESENT) return replace ? 1 : -EEXIST;
  count(KVS_STAT_cache_peer_fallbacks);
  return 1;
}

int kvs__cache_reserve(kvs__runtime_t *rt, const kvs_key_t *keys, size_t nk, uint64_t len,
                       bool replace, uint8_t **bytes, kvs__cache_ref_t *ref) {
  KVS__REENTRY_GUARD();
  /* If a cache peer just failed and is gone, the pool is the cache again (full size), not the
   * lean staging area sized while it was there. */
  if (rt->peers && rt->opts.one_copy) (void)kvs__runtime_cache_peer(rt);
  kvs_layout_t l = kvs_layout_blob(len);
  /* replace: a READY object under keys[0] is removed first; a reader's pin can hold it
   * briefly, so try a few times. */
  for (int attempt = 0; attempt < 4; attempt++) {
    uint8_t oc = 0;
    kvs_extent_t ext;
    kvs_xfer_t xfer = 0;
    int rc = kvs_store_reserve_object(rt->store, KVS_OWNER_LOCAL, keys, nk, &l, 0, &oc, &ext,
                                      &xfer);
    if (rc == 1) {
      *bytes = kvs_pool_base(rt->pool) + ext.offset;
      *ref = xfer;
      return 0;
    }
    if (rc < 0) return rc;
    if (oc != KVS_RES_PRESENT || !replace) return outcome_errno(oc);
    if (kvs_store_remove(rt->store, &keys[0]) == -EBUSY) {
      struct timespec ts = {0, 1000000L << attempt};
      nanosleep(&ts, NULL);
    }
  }
  return -EBUSY;
}

int kvs__cache_commit(kvs__runtime_t *rt, const kvs_key_t *keys, size_t nk, kvs__cache_ref_t ref) {
  KVS__REENTRY_GUARD();
  int rc = kvs_store_commit(rt->store, KVS_OWNER_LOCAL, ref);
  if (rc == 0 && rt->peers) {
    kvs__discovery_wait_watcher(); /* the cache peer the watcher finds at start (design §3.8) */
    kvs_peers_push(rt->peers, keys, nk); /* -ENOTSUP: no cache peer */
  }
  return rc;
}

void kvs__cache_abort(kvs__runtime_t *rt, kvs__cache_ref_t ref) {
  KVS__REENTRY_GUARD();
  kvs_store_abort(rt->store, KVS_OWNER_LOCAL, ref);
}

/* w[0..n) (n <= KVS_PEERS_RESERVE_MAX) at cache peer `cache`: those it reserves begun (rc 0),
 * those it holds already -EEXIST, the others left for the own pool (rc 1). */
static void writes_at_peer(kvs__runtime_t *rt, uint64_t cache, kvs__cache_write_t *w, size_t n) {
  kvs_peer_resv_t *r[KVS_PEERS_RESERVE_MAX] = {0};
  for (size_t i = 0; i < n; i++) {
    w[i].peer = (kvs_peer_resv_t){.keys = w[i].keys, .n_keys = w[i].nk, .len = w[i].len};
    r[i] = &w[i].peer;
  }
  int got = kvs_peers_reserve(rt->peers, cache, r, n);
  for (size_t i = 0; i < n; i++) {
    if (w[i].peer.conn) {
      w[i].bytes = w[i].peer.dst;
      w[i].rc = 0;
    } else if (got >= 0 && w[i].peer.outcome == KVS_RES_PRESENT) {
      w[i].rc = -EEXIST;
    } else {
      if (got != -ENOTSUP) count(KVS_STAT_cache_peer_fallbacks); /* inline: own copy, as before */
      w[i].rc = 1;
    }
  }
}

void kvs__cache_writes_begin(kvs__runtime_t *rt, uint64_t cache, kvs__cache_write_t *w,
                             size_t n) {
  for (size_t i = 0; i < n; i++) {
    w[i].rc = 1, w[i].bytes = NULL, w[i].ref = 0;
    w[i].peer.conn = NULL;
  }
  if (cache) { /* one copy per node: the slots in the cache peer's pool, as save_at_peer's */
    KVS__REENTRY_GUARD();
    for (size_t i = 0; i < n; i += KVS_PEERS_RESERVE_MAX) {
      size_t k = n - i < KVS_PEERS_RESERVE_MAX ? n - i : KVS_PEERS_RESERVE_MAX;
      writes_at_peer(rt, cache, w + i, k);
    }
  }
  for (size_t i = 0; i < n; i++)
    if (w[i].rc == 1)
      w[i].rc = kvs__cache_reserve(rt, w[i].keys, w[i].nk, w[i].len, false, &w[i].bytes,
                                   &w[i].ref);
}

/* Publish the writes *pw[0..k) (k <= KVS_PEERS_RESERVE_MAX) begun at the cache peer. */
static size_t publish_at_peer(kvs__runtime_t *rt, kvs__cache_write_t *const *pw, size_t k) {
  kvs_peer_resv_t *r[KVS_PEERS_RESERVE_MAX] = {0};
  for (size_t i = 0; i < k; i++) r[i] = &pw[i]->peer;
  KVS__REENTRY_GUARD();
  int got = kvs_peers_publish(rt->peers, r, k);
  for (size_t i = 0; i < k; i++) pw[i]->rc = r[i]->rc;
  if (got <= 0) return 0;
  kvs_stats_add(kvs_stats_global(), KVS_STAT_cache_peer_stores, (uint64_t)got);
  return (size_t)got;
}

size_t kvs__cache_writes_publish(kvs__runtime_t *rt, kvs__cache_write_t *w, size_t n) {
  size_t published = 0, k = 0;
  kvs__cache_write_t *pw[KVS_PEERS_RESERVE_MAX];
  for (size_t i = 0; i < n; i++) {
    if (w[i].rc != 0) continue; /* not begun */
    if (!w[i].peer.conn) {
      w[i].rc = kvs__cache_commit(rt, w[i].keys, w[i].nk, w[i].ref);
      published += w[i].rc == 0;
      continue;
    }
    pw[k++] = &w[i];
    if (k == KVS_PEERS_RESERVE_MAX) published += publish_at_peer(rt, pw, k), k = 0;
  }
  if (k) published += publish_at_peer(rt, pw, k);
  return published;
}

void kvs__cache_write_drop(kvs__runtime_t *rt, kvs__cache_write_t *w) {
  if (w->rc != 0) return;
  w->rc = -ECANCELED;
  if (!w->peer.conn) {
    kvs__cache_abort(rt, w->ref);
    return;
  }
  KVS__REENTRY_GUARD();
  kvs_peers_unreserve(rt->peers, &w->peer);
}

bool kvs__cache_pin(kvs__runtime_t *rt, kvs_key_t key, const uint8_t **bytes, uint64_t *len,
                    kvs__cache_ref_t *ref) {
  KVS__REENTRY_GUARD();
  kvs_xfer_t x = 0;
  kvs_object_view_t v;
  if (kvs_store_lookup(rt->store, KVS_OWNER_LOCAL, &key, 1, true, &x) != 1) return false;
  if (kvs_store_read_pinned(rt->store, KVS_OWNER_LOCAL, x, &v, 1) != 1) {
    kvs_store_release(rt->store, KVS_OWNER_LOCAL, x);
    return false;
  }
  *bytes = kvs_pool_base(rt->pool) + v.extent.offset;
  *len = v.extent.length;
  *ref = x;
  return true;
}

void kvs__cache_unpin(kvs__runtime_t *rt, kvs_key_t key, kvs__cache_ref_t ref, bool drop) {
  KVS__REENTRY_GUARD();
  kvs_store_release(rt->store, KVS_OWNER_LOCAL, ref);
  if (drop) kvs_store_remove(rt->store, &key); /* -EBUSY: a reader has it; fine */
}

int kvs__cache_read_cache_peer(kvs__runtime_t *rt, const kvs_key_t *keys, size_t n,
                               kvs__cache_sink_fn sink, void *ctx) {
  if (!rt->peers) return 0;
  KVS__REENTRY_GUARD();
  kvs__discovery_wait_first();
  uint64_t cache = kvs__runtime_cache_peer(rt);
  if (!cache) return 0;
  int r = kvs_peers_retrieve(rt->peers, cache, keys, n, sink, ctx);
  if (r < 0 && r != -ESTALE) count(KVS_STAT_cache_peer_fallbacks);
  return r;
}

int kvs__cache_fetch(kvs__runtime_t *rt, uint64_t instance, kvs_key_t key,
                     kvs__cache_keys_fn keys_fn, void *ctx, kvs__cache_fetch_t *f) {
  f->staged = false;
  if (!rt->peers) return KVS__CACHE_MISS;
  kvs_fetch_t out = {.status = KVS_FETCH_MISS};
  KVS__REENTRY_GUARD();
  kvs_peers_fetch(rt->peers, instance, &key, 1, NULL, keys_fn, ctx, &out); /* errors: misses */
  if (out.status == KVS_FETCH_COPIED) {
    f->bytes = kvs_pool_base(rt->pool) + out.extent.offset;
    f->len = out.extent.length;
    f->ref = out.xfer;
    /* One copy per node: an object the cache peer holds stays there only. */
    uint64_t cache = rt->opts.one_copy ? kvs__runtime_cache_peer(rt) : 0;
    f->staged = cache != 0 && instance == cache;
  }
  return (int)out.status;
}

void kvs__cache_fetch_end(kvs__runtime_t *rt, const kvs__cache_fetch_t *f, bool keep) {
  KVS__REENTRY_GUARD();
  if (keep && !f->staged) kvs_store_commit(rt->store, KVS_OWNER_LOCAL, f->ref);
  else kvs_store_abort(rt->store, KVS_OWNER_LOCAL, f->ref);
}

void kvs__cache_report_bad(kvs__runtime_t *rt, uint64_t instance, kvs_key_t key, uint64_t len,
                           uint64_t checksum) {
  if (!rt->peers || !instance) return;
  KVS__REENTRY_GUARD();
  kvs_peers_report_bad(rt->peers, instance, key, len, checksum);
}

/* ---- marks ----------------------------------------------------------------------------------- */

bool kvs__cache_mark(kvs__runtime_t *rt, kvs_key_t key, uint64_t value) {
  KVS__REENTRY_GUARD();
  kvs_layout_t l = kvs_layout_blob(sizeof value);
  uint8_t outcome = 0;
  kvs_extent_t ext;
  kvs_xfer_t x = 0;
  if (kvs_store_reserve_object(rt->store, KVS_OWNER_LOCAL, &key, 1, &l, KVS_RESERVE_NO_EVICT,
                               &outcome, &ext, &x) != 1)
    return false;
  memcpy(kvs_pool_base(rt->pool) + ext.offset, &value, sizeof value);
  return kvs_store_commit(rt->store, KVS_OWNER_LOCAL, x) == 0;
}

void kvs__cache_unmark(kvs__runtime_t *rt, kvs_key_t key) {
  KVS__REENTRY_GUARD();
  (void)kvs_store_remove(rt->store, &key);
}

int kvs__cache_watch(kvs__runtime_t *rt, uint64_t instance, const kvs_key_t *keys, size_t n,
                     uint32_t wait_ms) {
  if (!rt->peers) return -ENOENT;
  KVS__REENTRY_GUARD();
  return kvs_peers_watch(rt->peers, instance, keys, n, wait_ms);
}
