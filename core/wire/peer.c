/* kvshim peer client: the queries (peer.h). None runs a discovery or starts a thread: they
 * ask the peers the table holds (the runtime's watcher keeps it current, design §3.8). */
#include "peer.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "peer_conn.h"

static int lookup_one(kvs_peers_t *p, pconn_t *c, const kvs_key_t *keys, size_t n) {
  /* A serve with a remote tier may fetch what it lacks within reply_wait_ms. Other peers get
   * 0, as protocol v1 requires. */
  uint32_t wait = kvs__peer_reply_wait_ms(p);
  kvs_proto_lookup_t m = {.n_keys = (uint32_t)n, .keys = keys,
                          .remote_wait_ms = c->remote ? (wait ? wait : 1) : 0};
  uint8_t *rep = NULL;
  size_t rn = 0;
  pthread_mutex_lock(&c->lock);
  kvs_stats_inc(p->stats, KVS_STAT_peer_lookups);
  int rc;
  KVS__PEER_RPC(rc, p, c, KVS_OP_LOOKUP, kvs_proto_lookup_encode, &m, &rep, &rn);
  pthread_mutex_unlock(&c->lock);
  kvs_proto_lookup_reply_t r;
  if (rc == 0) rc = kvs_proto_lookup_reply_decode(rep, rn, &r);
  free(rep);
  return rc < 0 ? rc : (int)(r.found <= n ? r.found : n);
}

int kvs_peers_lookup(kvs_peers_t *p, const kvs_key_t *keys, size_t n, uint64_t *best) {
  if (best) *best = 0;
  if (!keys || n == 0) return 0;
  if (n > KVS_PROTO_MAX_KEYS) n = KVS_PROTO_MAX_KEYS;
  /* Snapshot the live ids, then ask each without the table lock. */
  uint64_t ids[64];
  int n_ids = 0;
  pthread_mutex_lock(&p->table_lock);
  for (pconn_t *c = p->conns; c && n_ids < 64; c = c->next)
    if (c->fd >= 0) ids[n_ids++] = c->info.instance_id;
  pthread_mutex_unlock(&p->table_lock);
  int run = 0;
  for (int i = 0; i < n_ids && (size_t)run < n; i++) {
    pconn_t *c = kvs__peer_grab(p, ids[i], false);
    if (!c) continue;
    int r = lookup_one(p, c, keys, n);
    kvs__peer_unref(p, c);
    if (r > run) {
      run = r;
      if (best) *best = ids[i];
    }
  }
  return run;
}

static int into_sink(void *ctx, size_t i, const kvs_layout_t *l, const void *bytes, uint64_t len) {
  const kvs__peer_into_t *t = ctx;
  (void)l;
  if (len > t->caps[i]) return -ENOBUFS;
  kvs_peers_copy(t->bufs[i], bytes, (size_t)len);
  t->lens[i] = len;
  return 0;
}

static int retrieve(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    kvs_peer_sink_fn sink, void *ctx, const kvs__peer_into_t *into);

int kvs_peers_retrieve(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                       kvs_peer_sink_fn sink, void *ctx) {
  return retrieve(p, instance, keys, n, sink, ctx, NULL);
}

int kvs_peers_retrieve_into(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                            void *const *bufs, const uint64_t *caps, uint64_t *lens) {
  if (!bufs || !caps || !lens) return -EINVAL;
  kvs__peer_into_t t = {bufs, caps, lens};
  for (size_t i = 0; i < n && i < KVS_PROTO_MAX_KEYS; i++) lens[i] = 0;
  return retrieve(p, instance, keys, n, into_sink, &t, &t);
}

static int retrieve(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    kvs_peer_sink_fn sink, void *ctx, const kvs__peer_into_t *into) {
  if (!keys || n == 0 || !sink) return -EINVAL;
  if (n > KVS_PROTO_MAX_KEYS) n = KVS_PROTO_MAX_KEYS;
  /* With one peer to ask, its PREPARE_RETRIEVE is the lookup: it pins and describes the
   * leading run it holds (n_found), so the retrieve takes one round trip, not two
   * (docs/protocol.md 6, "SHM retrieve"). It stands in for the LOOKUP in peer_lookups; an
   * empty run is a lookup miss, as before (not a peer_misses). With several peers, LOOKUP
   * each and retrieve from the longest run. */
  bool asked = false;
  if (!instance) {
    instance = kvs__peer_sole(p);
    asked = instance != 0;
  }
  if (!instance) {
    int run = kvs_peers_lookup(p, keys, n, &instance);
    if (run <= 0 || !instance) return 0;
    n = (size_t)run;
  }
  pconn_t *c = kvs__peer_grab(p, instance, false);
  if (!c) return asked ? 0 : -ENOENT;
  if (asked) kvs_stats_inc(p->stats, KVS_STAT_peer_lookups);
  bool shm = c->pool != NULL && p->opts.strategy != KVS_STRATEGY_INLINE;
  /* A server that takes AUTO_RELEASE ends the pins by itself (docs/protocol.md 4.7): a fast
   * copy then needs no COMMIT_RETRIEVE at all, and the retrieve is one round trip. */
  bool auto_rel = shm && (c->peer_caps & KVS_PROTO_CAP_AUTO_RELEASE);
  kvs_proto_prepare_retrieve_t m = {shm ? KVS_PROTO_STRATEGY_SHM : KVS_PROTO_STRATEGY_INLINE,
                                    (uint32_t)n, keys,
                                    auto_rel ? KVS_PROTO_RETRIEVE_AUTO_RELEASE : 0};
  uint8_t *rep = NULL;
  size_t rn = 0;
  kvs_proto_object_t *objs = calloc(n, sizeof *objs);
  pthread_mutex_lock(&c->lock);
  uint64_t asked_ms = kvs__now_ms(); /* the peer's pins cannot be older than this */
  int rc = -ENOMEM;
  kvs_proto_prepare_retrieve_reply_t r = {0};
  int delivered = 0;
  bool streamed = objs && into && !shm; /* inline into the caller's buffers: no reply buffer */
  if (streamed)
    rc = kvs__peer_retrieve_inline_into(p, c, &m, objs, n, into, &r, &delivered);
  else if (objs)
    KVS__PEER_RPC(rc, p, c, KVS_OP_PREPARE_RETRIEVE, kvs_proto_prepare_retrieve_encode, &m, &rep,
                &rn);
  if (rc == 0 && !streamed) rc = kvs_proto_prepare_retrieve_reply_decode(rep, rn, objs, n, &r);
  if (rc == 0 && !streamed) {
    for (uint32_t i = 0; i < r.n_objects; i++) {
      const kvs_proto_object_t *o = &objs[i];
      if (o->key_index != (uint32_t)delivered) break; /* only the leading run */
      const void *bytes;
      if (r.is_inline) {
        bytes = o->data;
      } else {
        bytes = kvs__peer_place(c, o->offset, o->length);
        if (!bytes) {
          rc = -EFAULT; /* a peer pointing outside its own pool: stop, report a miss */
          break;
        }
      }
      if (sink(ctx, o->key_index, &o->layout, bytes, o->length) < 0) break;
      kvs_stats_add(p->stats, KVS_STAT_peer_bytes_in, o->length);
      /* an object covers the keys up to the next record's (aliases of one object) */
      delivered = (int)(i + 1 < r.n_objects ? objs[i + 1].key_index : r.n_found);
    }
    if (r.xfer) { /* unpin at the peer */
      kvs_proto_xfer_t x = {r.xfer};
      uint8_t b[16];
      size_t n2 = 0;
      if (kvs_proto_xfer_encode(&x, b, sizeof b, &n2) == 0) {
        /* docs/protocol.md §6: a pin that outlived its lease may have had its extent reused
         * while we copied; the only signal is ENOENT on COMMIT_RETRIEVE. No lease is shorter
         * than KVS_LEASE_MIN_MS, so a copy done within that of the request is certainly good
         * and the unpin is posted (no round trip); a slower one waits for the verdict. */
        uint64_t trusted_ms = r.pin_ms ? r.pin_ms : KVS_LEASE_MIN_MS;
        if (kvs__now_ms() - asked_ms < trusted_ms) {
          /* AUTO_RELEASE honoured (pin_ms > 0): the server ends the pins itself */
          if (!r.pin_ms) kvs__peer_rpc_post(p, c, KVS_OP_COMMIT_RETRIEVE, b, n2);
        } else {
          uint8_t *cr = NULL;
          size_t crn = 0;
          int v = kvs__peer_rpc(p, c, KVS_OP_COMMIT_RETRIEVE, b, n2, &cr, &crn, NULL);
          free(cr);
          if (v == -ENOENT && delivered > 0) {
            kvs_stats_inc(p->stats, KVS_STAT_peer_stale_reads);
            kvs_log_debug("peer %016" PRIx64 ": pins expired during the copy: %d objects "
                          "thrown away", c->info.instance_id, delivered);
            delivered = 0;
            rc = -ESTALE;
          }
        }
      }
    }
  }
  pthread_mutex_unlock(&c->lock);
  free(rep);
  free(objs);
  kvs__peer_unref(p, c);
  if (delivered > 0) kvs_stats_add(p->stats, KVS_STAT_peer_hits, (uint64_t)delivered);
  else if (!asked || rc < 0 || r.n_found > 0) kvs_stats_inc(p->stats, KVS_STAT_peer_misses);
  return rc < 0 && delivered == 0 ? rc : delivered;
}

/* ---- fetch: a peer's objects into local reservations ---------------------------------------- */

typedef struct fetch_ctx {
  kvs_store_t *local;
  uint8_t *base;             /* the local pool */
  const kvs_key_t *keys;     /* asked for */
  const kvs_layout_t *layout;
  kvs_fetch_keys_fn keys_fn;
  void *ctx;
  kvs_fetch_t *out;
} fetch_ctx_t;

static int fetch_sink(void *ctx, size_t i, const kvs_layout_t *layout, const void *bytes,
                      uint64_t len) {
  fetch_ctx_t *f = ctx;
  kvs_fetch_t *o = &f->out[i];
  uint8_t oc = 0;
  int rc;
  if (f->layout) { /* a chunk: the key names it, its size must agree */
    if (len != kvs_layout_nbytes(f->layout)) return -EPROTO;
    rc = kvs_store_reserve_write(f->local, KVS_OWNER_LOCAL, &f->keys[i], 1, f->layout, 0, &oc,
                                 &o->extent, &o->xfer);
  } else { /* a blob: one object, bound under the keys its bytes give */
    if (layout->dtype != KVS_DTYPE_U8 || layout->ndim != 1 || layout->shape[0] != len)
      return -EPROTO;
    const kvs_key_t *bind = &f->keys[i];
    int nk = f->keys_fn ? f->keys_fn(f->ctx, i, bytes, len, &bind) : 1;
    if (nk <= 0) return -EPROTO;
    kvs_layout_t l = kvs_layout_blob(len);
    rc = kvs_store_reserve_object(f->local, KVS_OWNER_LOCAL, bind, (size_t)nk, &l, 0, &oc,
                                  &o->extent, &o->xfer);
  }
  if (rc == 1) {
    memcpy(f->base + o->extent.offset, bytes, (size_t)len);
    o->status = KVS_FETCH_COPIED;
  } else if (rc == 0 && oc == KVS_RES_PRESENT) {
    o->status = KVS_FETCH_LOCAL;
  } /* else MISS: not kept here (no room, being written); the rest may still be */
  return 0;
}

int kvs_peers_fetch(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    const kvs_layout_t *layout, kvs_fetch_keys_fn keys_fn, void *ctx,
                    kvs_fetch_t *out) {
  if (!p || !keys || !out || n == 0) return -EINVAL;
  memset(out, 0, n * sizeof *out);
  if (!p->local) return -ENOTSUP;
  fetch_ctx_t f = {p->local, kvs_pool_base(kvs_store_pool(p->local)), keys, layout, keys_fn, ctx,
                   out};
  int rc = kvs_peers_retrieve(p, instance, keys, n, fetch_sink, &f);
  if (rc == -ESTALE) /* the peer's pins expired during the copy: no copy may be kept */
    for (size_t i = 0; i < n; i++)
      if (out[i].status == KVS_FETCH_COPIED) {
        kvs_store_abort(p->local, KVS_OWNER_LOCAL, out[i].xfer);
        out[i].status = KVS_FETCH_MISS;
      }
  return rc;
}

/* PREPARE_STORE with a strategy: on success *r points into *rep (the caller frees *rep). */
static int prepare_store(kvs_peers_t *p, pconn_t *c, uint8_t strategy, const kvs_key_t *keys,
                         size_t n, const kvs_layout_t *layout, bool object, uint8_t **rep,
                         kvs_proto_prepare_store_reply_t *r) {
  kvs_proto_prepare_store_t m = {strategy, object ? KVS_PROTO_KIND_OBJECT : KVS_PROTO_KIND_CHUNKS,
                                 0, *layout, (uint32_t)n, keys};
  size_t rn = 0;
  *rep = NULL;
  int rc;
  KVS__PEER_RPC(rc, p, c, KVS_OP_PREPARE_STORE, kvs_proto_prepare_store_encode, &m, rep, &rn);
  if (rc == 0) rc = kvs_proto_prepare_store_reply_decode(*rep, rn, r);
  if (rc < 0) {
    free(*rep);
    *rep = NULL;
  }
  return rc;
}

/* kvs_peers_store, with a copy function (NULL: memcpy; else SHM peers only: -ENOTSUP). */
static int store_with(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                      const kvs_layout_t *layout, bool object, const void *const *bufs,
                      uint8_t *outcomes, kvs_peer_copy_fn copy, void *cctx) {
  if (!keys || n == 0 || n > KVS_PROTO_MAX_KEYS || !layout || !bufs) return -EINVAL;
  if (!kvs_layout_nbytes(layout)) return -EINVAL;
  pconn_t *c = kvs__peer_grab(p, instance, true);
  if (!c) return -ENOENT;
  pthread_mutex_lock(&c->lock);
  bool shm = c->pool != NULL && p->opts.strategy != KVS_STRATEGY_INLINE;
  if (copy && !shm) {
    pthread_mutex_unlock(&c->lock);
    kvs__peer_unref(p, c);
    return -ENOTSUP;
  }
  uint8_t *rep;
  kvs_proto_prepare_store_reply_t r;
  int rc = prepare_store(p, c, shm ? KVS_PROTO_STRATEGY_SHM : KVS_PROTO_STRATEGY_INLINE, keys, n,
                         layout, object, &rep, &r);
  if (rc >= 0)
    rc = shm ? kvs__peer_store_shm(p, c, rep, &r, object, bufs, outcomes, copy, cctx)
             : kvs__peer_store_inline(p, c, rep, &r, keys, n, layout, object, bufs, outcomes);
  pthread_mutex_unlock(&c->lock);
  kvs__peer_unref(p, c);
  if (rc > 0) kvs_stats_add(p->stats, KVS_STAT_peer_stores, (uint64_t)rc);
  return rc;
}

int kvs_peers_store(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    const kvs_layout_t *layout, bool object, const void *const *bufs,
                    uint8_t *outcomes) {
  return store_with(p, instance, keys, n, layout, object, bufs, outcomes, NULL, NULL);
}

/* One call to peer `instance` on its own: rc gets 0, -ENOENT (no such live peer), nocap_rc
 * (the peer lacks a capability in cap: nothing sent) or the call's negative errno; on 0 *reply
 * (the caller frees it) holds *reply_len bytes. counter (a kvs_stat_id_t, or -1) is counted
 * when the call is made. */
#define RPC_TO(rc, p, instance, cap, nocap_rc, counter, op, encfn, msgp, reply, rlen)             \
  do {                                                                                             \
    pconn_t *c_ = kvs__peer_grab((p), (instance), false);                                          \
    (rc) = c_ ? (nocap_rc) : -ENOENT;                                                              \
    if (c_ && (c_->peer_caps & (cap)) == (cap)) {                                                  \
      if ((counter) >= 0) kvs_stats_inc((p)->stats, (kvs_stat_id_t)(counter));                     \
      pthread_mutex_lock(&c_->lock);                                                               \
      KVS__PEER_RPC(rc, p, c_, op, encfn, msgp, reply, rlen);                                      \
      pthread_mutex_unlock(&c_->lock);                                                             \
    }                                                                                              \
    if (c_) kvs__peer_unref((p), c_);                                                              \
  } while (0)

/* RPC_TO whose reply is decoded by decfn into *outp and freed: what *outp points into the
 * reply is gone when it returns, so only its scalars may be used. */
#define RPC_TO_DECODED(rc, p, instance, cap, nocap_rc, counter, op, encfn, msgp, decfn, outp)      \
  do {                                                                                             \
    uint8_t *rep_ = NULL;                                                                          \
    size_t rn_ = 0;                                                                                \
    RPC_TO(rc, p, instance, cap, nocap_rc, counter, op, encfn, msgp, &rep_, &rn_);                 \
    if ((rc) == 0) (rc) = decfn(rep_, rn_, (outp));                                                \
    free(rep_);                                                                                    \
  } while (0)

int kvs_peers_stats(kvs_peers_t *p, uint64_t instance, bool json, char *buf, size_t cap) {
  if (!buf || cap == 0) return -EINVAL;
  kvs_proto_stats_t m = {json ? KVS_PROTO_STATS_JSON : KVS_PROTO_STATS_INFO};
  uint8_t *rep = NULL;
  size_t rn = 0;
  int rc;
  RPC_TO(rc, p, instance, 0, 0, -1, KVS_OP_STATS, kvs_proto_stats_encode, &m, &rep, &rn);
  kvs_proto_text_t t;
  if (rc == 0) rc = kvs_proto_text_decode(rep, rn, &t);
  if (rc == 0) {
    size_t n = t.len < cap - 1 ? t.len : cap - 1;
    memcpy(buf, t.text, n);
    buf[n] = '\0';
    rc = (int)n;
  }
  free(rep);
  return rc;
}

int kvs_peers_ping(kvs_peers_t *p, uint64_t instance) {
  uint64_t nonce = kvs__now_ns();
  kvs_proto_ping_t m = {nonce, 0, NULL}, r;
  int rc;
  RPC_TO_DECODED(rc, p, instance, 0, 0, -1, KVS_OP_PING, kvs_proto_ping_encode, &m,
                 kvs_proto_ping_decode, &r);
  return rc == 0 && r.nonce != nonce ? -EPROTO : rc;
}

int kvs_peers_report_bad(kvs_peers_t *p, uint64_t instance, kvs_key_t key, uint64_t len,
                         uint64_t checksum) {
  if (!p || !instance || !len) return -EINVAL;
  kvs_proto_report_t m = {key, len, checksum};
  kvs_proto_report_reply_t r;
  int rc; /* a peer that predates REPORT_BAD would close the connection on it: -EOPNOTSUPP */
  RPC_TO_DECODED(rc, p, instance, KVS_PROTO_CAP_REPORT_BAD, -EOPNOTSUPP,
                 KVS_STAT_peer_bad_reports, KVS_OP_REPORT_BAD, kvs_proto_report_encode, &m,
                 kvs_proto_report_reply_decode, &r);
  return rc < 0 ? rc : (int)r.dropped;
}

/* ---- create / destroy ------------------------------------------------------------------------ */

int kvs_peers_create(const kvs_peers_config_t *cfg, kvs_peers_t **out) {
  if (!cfg || !cfg->opts || !out) return -EINVAL;
  kvs_peers_t *p = calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  p->opts = *cfg->opts;
  int n = snprintf(p->dir, sizeof p->dir, "%s/%s", p->opts.run_dir, p->opts.group);
  if (n < 0 || (size_t)n >= sizeof p->dir) {
    free(p);
    return -ENAMETOOLONG;
  }
  p->instance_id = cfg->instance_id;
  p->role = cfg->role ? cfg->role : KVS_PROTO_ROLE_ENGINE;
  p->local = cfg->local;
  p->stats = cfg->stats ? cfg->stats : kvs_stats_global();
  p->q_cap = cfg->push_queue ? cfg->push_queue : 1024;
  p->flush_ms = cfg->flush_ms ? cfg->flush_ms : 2000;
  pthread_mutex_init(&p->table_lock, NULL);
  pthread_mutex_init(&p->discover_lock, NULL);
  pthread_mutex_init(&p->push_lock, NULL);
  pthread_cond_init(&p->push_cond, NULL);
  if (p->local && p->opts.push != KVS_PUSH_OFF &&
      kvs_store_owner_open(p->local, &p->push_owner) < 0)
    p->push_owner = 0;
  kvs__peer_push_start(p); /* write-behind's thread, when it pushes at all */
  *out = p;
  return 0;
}

void kvs_peers_destroy(kvs_peers_t *p) {
  if (!p) return;
  kvs__peer_push_stop(p);
  if (p->push_owner) kvs_store_owner_release(p->local, p->push_owner);
  while (p->conns) {
    pconn_t *c = p->conns;
    p->conns = c->next;
    kvs__peer_conn_free(c);
  }
  pthread_mutex_destroy(&p->table_lock);
  pthread_mutex_destroy(&p->discover_lock);
  pthread_mutex_destroy(&p->push_lock);
  pthread_cond_destroy(&p->push_cond);
  free(p);
}

/* ---- one copy per node (design §3.5): the engine side's helpers --------------------------- */

typedef struct copy_ctx {
  void *const *dsts;
  uint64_t want;        /* each object's exact length */
  kvs_peer_copy_fn copy;
  void *copy_ctx;
  size_t copied;        /* objects copied (the leading run) */
} copy_ctx_t;

static int copy_sink(void *ctx, size_t i, const kvs_layout_t *layout, const void *bytes,
                     uint64_t len) {
  (void)layout;
  copy_ctx_t *x = ctx;
  if (len != x->want || i != x->copied) return -EPROTO;
  int rc = x->copy ? x->copy(x->copy_ctx, i, x->dsts[i], bytes, (size_t)len)
                   : (kvs_peers_copy(x->dsts[i], bytes, (size_t)len), 0);
  if (rc < 0) return rc;
  x->copied++;
  return 0;
}

int kvs_peers_retrieve_copy(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                            uint64_t len, void *const *dsts, kvs_peer_copy_fn copy, void *ctx) {
  if (!p || !keys || !dsts || n == 0 || len == 0) return -EINVAL;
  copy_ctx_t x = {dsts, len, copy, ctx, 0};
  int rc = kvs_peers_retrieve(p, instance, keys, n, copy_sink, &x);
  if (rc < 0) return rc; /* -ESTALE included: what was copied must not be used */
  return (int)(x.copied < (size_t)rc ? x.copied : (size_t)rc);
}

int kvs_peers_store_into(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                         const kvs_layout_t *layout, bool object, const void *const *bufs,
                         uint8_t *outcomes, kvs_peer_copy_fn copy, void *ctx) {
  if (!p || !copy) return -EINVAL;
  return store_with(p, instance, keys, n, layout, object, bufs, outcomes, copy, ctx);
}

/* ---- a write held across the caller's own work (kvs_peer_resv_t) ---------------------------- */

/* The requests of one pipelined batch, encoded into one buffer (kvs__peer_rpc_batch's input),
 * and what came back. */
typedef struct batch {
  uint8_t *buf;
  uint8_t *reqs[KVS_PEERS_RESERVE_MAX];
  size_t lens[KVS_PEERS_RESERVE_MAX];
  uint8_t *reps[KVS_PEERS_RESERVE_MAX];
  size_t rlens[KVS_PEERS_RESERVE_MAX];
  int codes[KVS_PEERS_RESERVE_MAX];
} batch_t;

static void batch_free(batch_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) free(b->reps[i]);
  free(b->buf);
}

/* Encodes request i of a batch into buf (cap bytes; NULL/0: only *len), as the proto encoders. */
typedef int (*encode_at_fn)(void *ctx, size_t i, uint8_t *buf, size_t cap, size_t *len);

/* Encode requests 0..n into b (sized first, then written). 0 or a negative errno. */
static int batch_encode(batch_t *b, size_t n, encode_at_fn enc, void *ctx) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    int rc = enc(ctx, i, NULL, 0, &b->lens[i]);
    if (rc < 0) return rc;
    total += b->lens[i];
  }
  b->buf = malloc(total ? total : 1);
  if (!b->buf) return -ENOMEM;
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    b->reqs[i] = b->buf + off;
    int rc = enc(ctx, i, b->reqs[i], b->lens[i], &b->lens[i]);
    if (rc < 0) return rc;
    off += b->lens[i];
  }
  return 0;
}

/* PREPARE_STORE of r[i]: one object, a 1-D u8 layout of its length. */
static int resv_encode(void *ctx, size_t i, uint8_t *buf, size_t cap, size_t *len) {
  const kvs_peer_resv_t *o = ((kvs_peer_resv_t *const *)ctx)[i];
  kvs_proto_prepare_store_t m = {KVS_PROTO_STRATEGY_SHM, KVS_PROTO_KIND_OBJECT, 0,
                                 kvs_layout_blob(o->len), o->n_keys, o->keys};
  return kvs_proto_prepare_store_encode(&m, buf, cap, len);
}

int kvs_peers_reserve(kvs_peers_t *p, uint64_t instance, kvs_peer_resv_t *const *r, size_t n) {
  if (!p || !r || n == 0 || n > KVS_PEERS_RESERVE_MAX) return -EINVAL;
  for (size_t i = 0; i < n; i++) {
    if (!r[i] || !r[i]->keys || !r[i]->n_keys || r[i]->n_keys > KVS_PROTO_MAX_KEYS || !r[i]->len)
      return -EINVAL;
    r[i]->outcome = 0, r[i]->dst = NULL, r[i]->xfer = r[i]->offset = 0, r[i]->conn = NULL;
  }
  pconn_t *c = kvs__peer_grab(p, instance, true);
  if (!c) return -ENOENT;
  batch_t b = {0};
  int rc = batch_encode(&b, n, resv_encode, (void *)r);
  unsigned got = 0;
  pthread_mutex_lock(&c->lock);
  if (rc == 0 && (!c->pool || p->opts.strategy == KVS_STRATEGY_INLINE)) rc = -ENOTSUP;
  if (rc == 0)
    rc = kvs__peer_rpc_batch(p, c, KVS_OP_PREPARE_STORE, b.reqs, b.lens, n, b.reps, b.rlens,
                             b.codes);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    kvs_proto_prepare_store_reply_t rep;
    if (b.codes[i] || kvs_proto_prepare_store_reply_decode(b.reps[i], b.rlens[i], &rep) < 0)
      continue; /* refused or malformed: not reserved (a transfer we cannot name lapses) */
    kvs_peer_resv_t *o = r[i];
    o->outcome = rep.n_outcomes ? rep.outcomes[0] : 0;
    if (!rep.xfer) continue;
    const kvs_proto_slot_t *s = rep.n_slots == 1 ? &rep.slots[0] : NULL;
    uint8_t *dst = o->outcome == KVS_RES_RESERVED && s && s->key_index == 0 &&
                           s->length == o->len
                       ? kvs__peer_place(c, s->offset, s->length)
                       : NULL;
    if (dst) {
      o->dst = dst;
      o->xfer = rep.xfer;
      o->offset = s->offset;
      o->conn = c;
      got++;
    } else {
      kvs__peer_abort(p, c, rep.xfer);
      o->outcome = 0;
    }
  }
  pthread_mutex_unlock(&c->lock);
  batch_free(&b, rc == 0 ? n : 0);
  if (got > 1) kvs__peer_ref(p, c, got - 1); /* one reference per reservation */
  else if (got == 0) kvs__peer_unref(p, c);
  return rc < 0 ? rc : (int)got;
}

/* COMMIT_STORE of r[i]: its one slot, as the PREPARE_STORE reply gave it. */
static int publish_encode(void *ctx, size_t i, uint8_t *buf, size_t cap, size_t *len) {
  const kvs_peer_resv_t *o = ((kvs_peer_resv_t *const *)ctx)[i];
  const kvs_proto_slot_t slot = {0, 0, o->offset, o->len};
  kvs_proto_commit_store_t m = {0};
  m.xfer = o->xfer;
  m.n_slots = 1;
  m.slots = &slot;
  return kvs_proto_commit_store_encode(&m, buf, cap, len);
}

/* Publish r[0..n), all reserved on connection c, in one batch; each ends (its reference too). */
static int publish_on(kvs_peers_t *p, pconn_t *c, kvs_peer_resv_t *const *r, size_t n) {
  batch_t b = {0};
  int rc = batch_encode(&b, n, publish_encode, (void *)r);
  pthread_mutex_lock(&c->lock);
  if (rc == 0)
    rc = kvs__peer_rpc_batch(p, c, KVS_OP_COMMIT_STORE, b.reqs, b.lens, n, b.reps, b.rlens,
                             b.codes);
  else
    for (size_t i = 0; i < n; i++) kvs__peer_abort(p, c, r[i]->xfer);
  pthread_mutex_unlock(&c->lock);
  int published = 0;
  for (size_t i = 0; i < n; i++) {
    r[i]->rc = rc < 0 ? rc : b.codes[i];
    published += r[i]->rc == 0;
    r[i]->conn = NULL;
    kvs__peer_unref(p, c);
  }
  batch_free(&b, rc == 0 ? n : 0);
  if (published) kvs_stats_add(p->stats, KVS_STAT_peer_stores, (uint64_t)published);
  return published;
}

int kvs_peers_publish(kvs_peers_t *p, kvs_peer_resv_t *const *r, size_t n) {
  if (!p || !r || n > KVS_PEERS_RESERVE_MAX) return -EINVAL;
  int published = 0;
  kvs_peer_resv_t *run[KVS_PEERS_RESERVE_MAX];
  for (size_t i = 0; i < n; i++)
    if (!r[i]->conn) r[i]->rc = -EINVAL; /* nothing to publish */
  for (size_t i = 0; i < n; i++) {
    if (!r[i]->conn) continue; /* not reserved, or published with an earlier connection's */
    pconn_t *c = r[i]->conn; /* every reservation on c from i on */
    size_t k = 0;
    for (size_t j = i; j < n; j++)
      if (r[j]->conn == c) run[k++] = r[j];
    published += publish_on(p, c, run, k);
  }
  return published;
}

void kvs_peers_unreserve(kvs_peers_t *p, kvs_peer_resv_t *r) {
  pconn_t *c = r->conn;
  if (!p || !c) return;
  pthread_mutex_lock(&c->lock);
  kvs__peer_abort(p, c, r->xfer);
  pthread_mutex_unlock(&c->lock);
  kvs__peer_unref(p, c);
  r->dst = NULL, r->xfer = r->offset = 0, r->conn = NULL;
}

int kvs_peers_watch(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    uint32_t wait_ms) {
  if (!p || !keys || n == 0 || n > KVS_PROTO_MAX_WATCH_KEYS) return -EINVAL;
  uint32_t most = kvs__peer_reply_wait_ms(p); /* the reply comes within our own deadline */
  if (most > KVS_PROTO_MAX_WATCH_MS) most = KVS_PROTO_MAX_WATCH_MS;
  kvs_proto_watch_t m = {.n_keys = (uint32_t)n, .wait_ms = wait_ms < most ? wait_ms : most,
                         .keys = keys};
  kvs_proto_watch_reply_t r;
  int rc; /* a peer that predates WATCH: -ENOTSUP, poll it with LOOKUPs */
  RPC_TO_DECODED(rc, p, instance, KVS_PROTO_CAP_WATCH, -ENOTSUP, KVS_STAT_peer_watches,
                 KVS_OP_WATCH, kvs_proto_watch_encode, &m, kvs_proto_watch_reply_decode, &r);
  return rc < 0 ? rc : (int)r.state;
}

bool kvs_peers_has_tiers(kvs_peers_t *p, uint64_t instance) {
  pconn_t *c = p ? kvs__peer_grab(p, instance, true) : NULL;
  if (!c) return false;
  bool tiers = c->remote;
  kvs__peer_unref(p, c);
  return tiers;
}

int kvs_peers_lookup_at(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n) {
  if (!p || !keys || n == 0) return -EINVAL;
  if (n > KVS_PROTO_MAX_KEYS) n = KVS_PROTO_MAX_KEYS;
  pconn_t *c = kvs__peer_grab(p, instance, false);
  if (!c) return -ENOENT;
  int r = lookup_one(p, c, keys, n);
  kvs__peer_unref(p, c);
  return r;
}
