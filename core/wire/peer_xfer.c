/* kvshim peer client: transfers (peer_xfer.h): the streaming copy, inline replies read into
 * the caller's buffers, the SHM and inline stores, write-behind and the registration of a cache
 * peer's pool mapping. */
#include "peer_xfer.h"

#include <endian.h>
#include <poll.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel.h"
#include "internal.h"
#include "log.h"
#include "peer_conn.h"
#include "prim.h"
#include "sock.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- copy out of a peer's pool -------------------------------------------------------------- */

#if defined(__x86_64__)
__attribute__((target("avx2"))) static void copy_stream_avx2(void *dst, const void *src,
                                                              size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t head = (32 - ((uintptr_t)d & 31)) & 31; /* streaming stores need 32-byte alignment */
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 128; d += 128, s += 128, n -= 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)s);
    __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
    __m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));
    _mm256_stream_si256((__m256i *)d, a);
    _mm256_stream_si256((__m256i *)(d + 32), b);
    _mm256_stream_si256((__m256i *)(d + 64), c);
    _mm256_stream_si256((__m256i *)(d + 96), e);
  }
  _mm_sfence(); /* order the streamed bytes before anything the caller does next */
  memcpy(d, s, n);
}

static int have_avx2(void) {
  static int cached = -1; /* -1 unknown; a racing first call computes the same value */
  int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx2") ? 1 : 0;
    __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
  }
  return v;
}
#endif

void kvs_peers_copy_stream(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  if (have_avx2()) {
    copy_stream_avx2(dst, src, n);
    return;
  }
#endif
  memcpy(dst, src, n);
}

void kvs_peers_copy(void *dst, const void *src, size_t n) {
  if (n >= KVS_PEERS_COPY_NT_MIN) kvs_peers_copy_stream(dst, src, n);
  else memcpy(dst, src, n);
}

/* ---- inline replies read straight into the caller's buffers ------------------------------- */

/* Reading one message frame by frame: the first frame's header, what is left of the current
 * frame, whether more frames follow. */
typedef struct mreader {
  kvs_proto_header_t first;
  size_t left;
  bool more;
  uint32_t limit;
} mreader_t;

/* n bytes of the message into dst (NULL: read and drop), across frame boundaries. */
static int mread(pconn_t *c, mreader_t *mr, void *dst, uint64_t n, uint64_t deadline) {
  uint8_t scratch[4096];
  uint8_t *d = dst;
  while (n) {
    if (mr->left == 0) {
      if (!mr->more) return -EBADMSG; /* the message ended before its contents did */
      uint8_t hb[KVS_PROTO_HEADER_SIZE];
      kvs_proto_header_t h;
      KVS_TRY(kvs__peer_rx_read(c, hb, sizeof hb, NULL, deadline));
      KVS_TRY(kvs_proto_header_decode(hb, sizeof hb, mr->limit, &h));
      KVS_TRY(kvs_proto_frame_continues(&mr->first, &h));
      mr->left = h.length;
      mr->more = (h.flags & KVS_PROTO_F_MORE) != 0;
      continue;
    }
    size_t k = n < mr->left ? (size_t)n : mr->left;
    if (!d && k > sizeof scratch) k = sizeof scratch;
    KVS_TRY(kvs__peer_rx_read(c, d ? d : scratch, k, NULL, deadline));
    if (d) d += k;
    mr->left -= k;
    n -= k;
  }
  return 0;
}

/* PREPARE_RETRIEVE (inline) on c, its reply's objects received straight into into's buffers
 * (c->lock held). *delivered gets the keys delivered, r the reply's head. Returns 0, the ERROR
 * code the peer sent (connection kept), or another negative errno (connection closed). */
int kvs__peer_retrieve_inline_into(kvs_peers_t *p, pconn_t *c,
                                   const kvs_proto_prepare_retrieve_t *m,
                                   kvs_proto_object_t *objs, size_t cap,
                                   const kvs__peer_into_t *into,
                                   kvs_proto_prepare_retrieve_reply_t *r, int *delivered) {
  *delivered = 0;
  if (c->fd < 0) return -ENOTCONN;
  uint64_t deadline = kvs__peer_deadline(p);
  uint64_t rid = ++c->next_rid;
  size_t qn = 0;
  int rc = kvs_proto_prepare_retrieve_encode(m, NULL, 0, &qn);
  uint8_t *q = rc == 0 ? malloc(qn) : NULL;
  if (rc == 0) rc = q ? kvs_proto_prepare_retrieve_encode(m, q, qn, &qn) : -ENOMEM;
  if (rc < 0) {
    free(q);
    return rc;
  }
  rc = kvs__peer_send_request(c, KVS_OP_PREPARE_RETRIEVE, rid, q, qn, deadline);
  free(q);
  if (rc == 0) rc = kvs__peer_drain(p, c, deadline);
  if (rc == 0 && c->rx_pos == c->rx_len) rc = kvs_sock_wait(c->fd, POLLIN, deadline);
  uint8_t hb[KVS_PROTO_HEADER_SIZE];
  mreader_t mr = {.limit = c->peer_max_frame ? (uint32_t)p->opts.max_frame
                                             : KVS_PROTO_MIN_MAX_FRAME};
  if (rc == 0) rc = kvs__peer_rx_read(c, hb, sizeof hb, NULL, deadline);
  if (rc == 0) rc = kvs_proto_header_decode(hb, sizeof hb, mr.limit, &mr.first);
  kvs_proto_header_t want = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION, KVS_OP_PREPARE_RETRIEVE, 0,
                             rid, 0};
  if (rc == 0) rc = kvs_proto_reply_matches(&want, &mr.first);
  mr.left = mr.first.length;
  mr.more = (mr.first.flags & KVS_PROTO_F_MORE) != 0;
  if (rc == 0 && mr.first.opcode == KVS_OP_ERROR) { /* a single small frame (2.1) */
    uint8_t eb[8 + 256];
    kvs_proto_error_t e = {0};
    rc = mr.left <= sizeof eb ? mread(c, &mr, eb, mr.left, deadline) : -EBADMSG;
    if (rc == 0) rc = kvs_proto_error_decode(eb, mr.first.length, &e);
    if (rc == 0) return e.code < 0 ? e.code : -EIO;
  }
  /* the head, then each record (32 bytes and 8 per dimension): the table's length */
  uint8_t *tbl = NULL;
  size_t tlen = 24;
  if (rc == 0) rc = (tbl = malloc(24 + cap * (32 + 8 * KVS_LAYOUT_MAX_DIMS))) ? 0 : -ENOMEM;
  if (rc == 0) rc = mread(c, &mr, tbl, 24, deadline);
  uint32_t n_obj = 0;
  if (rc == 0) memcpy(&n_obj, tbl + 12, 4), n_obj = le32toh(n_obj);
  if (rc == 0 && n_obj > cap) rc = -EBADMSG;
  for (uint32_t i = 0; rc == 0 && i < n_obj; i++) {
    uint32_t ndim;
    rc = mread(c, &mr, tbl + tlen, 32, deadline);
    memcpy(&ndim, tbl + tlen + 28, 4), ndim = le32toh(ndim);
    if (rc == 0 && ndim > KVS_LAYOUT_MAX_DIMS) rc = -EBADMSG;
    if (rc == 0) rc = mread(c, &mr, tbl + tlen + 32, 8 * (uint64_t)ndim, deadline);
    tlen += 32 + 8 * (size_t)ndim;
  }
  if (rc == 0) rc = kvs_proto_prepare_retrieve_reply_decode_table(tbl, tlen, objs, cap, r);
  free(tbl);
  if (rc == 0 && !r->is_inline) rc = -EPROTO;
  /* the bytes, each object straight into its buffer while the run lasts; the rest dropped */
  bool run = true;
  for (uint32_t i = 0; rc == 0 && i < r->n_objects; i++) {
    const kvs_proto_object_t *o = &objs[i];
    run = run && o->key_index == (uint32_t)*delivered && o->length <= into->caps[o->key_index];
    rc = mread(c, &mr, run ? into->bufs[o->key_index] : NULL, o->length, deadline);
    if (rc == 0 && run) {
      into->lens[o->key_index] = o->length;
      kvs_stats_add(p->stats, KVS_STAT_peer_bytes_in, o->length);
      *delivered = (int)(i + 1 < r->n_objects ? objs[i + 1].key_index : r->n_found);
    }
  }
  if (rc == 0 && (mr.left || mr.more)) rc = -EBADMSG; /* bytes after the last object */
  if (rc < 0) {
    *delivered = 0;
    return kvs__peer_conn_failed(p, c, KVS_OP_PREPARE_RETRIEVE, rc);
  }
  return 0;
}

static bool place_populated(const pconn_t *c, uint64_t g) {
  return atomic_load_explicit(&c->populated[g / 64], memory_order_relaxed) >> (g % 64) & 1;
}

uint8_t *kvs__peer_place(pconn_t *c, uint64_t offset, uint64_t len) {
  uint64_t seg = c->pool ? kvs_pool_segment_size(c->pool) : 0;
  if (!c->pool || offset > seg || len > seg - offset) return NULL;
  uint8_t *base = kvs_pool_base(c->pool);
  if (len < KVS__PEER_POPULATE_MIN || !c->populated ||
      atomic_load_explicit(&c->populate_off, memory_order_relaxed))
    return base + offset;
  const uint64_t G = KVS__PEER_GRANULE, page = kvs_pool_page_size(c->pool), end = offset + len;
  const bool write = kvs_pool_is_writable(c->pool);
  for (uint64_t g = offset / G, last = (end - 1) / G; g <= last;) {
    if (place_populated(c, g)) {
      g++;
      continue;
    }
    uint64_t h = g; /* [g, h]: a run of granules not populated whole, one madvise */
    while (h < last && !place_populated(c, h + 1)) h++;
    uint64_t lo = offset > g * G ? offset / page * page : g * G;
    uint64_t hi = (h + 1) * G < seg ? (h + 1) * G : seg;
    if (end < hi) hi = (end + page - 1) / page * page;
    int rc; /* two threads may populate one range at once: harmless */
    do rc = kvs__prim_populate(base + lo, (size_t)(hi - lo), write);
    while (rc == -EINTR || rc == -EAGAIN);
    if (rc == -EINVAL) { /* before 5.14 (or pages it cannot populate): faults, as before */
      atomic_store_explicit(&c->populate_off, true, memory_order_relaxed);
      break;
    }
    if (rc < 0) {
      kvs_log_warn("cache peer %016" PRIx64 ": its pool's pages at %" PRIu64 " cannot be "
                   "mapped here (%s): not used", c->info.instance_id, lo, strerror(-rc));
      return NULL;
    }
    for (; g <= h; g++) { /* the granules now populated whole */
      uint64_t g_hi = (g + 1) * G < seg ? (g + 1) * G : seg;
      if (g * G >= lo && g_hi <= hi)
        atomic_fetch_or_explicit(&c->populated[g / 64], (uint64_t)1 << (g % 64),
                                 memory_order_relaxed);
    }
  }
  return base + offset;
}

void kvs__peer_abort(kvs_peers_t *p, pconn_t *c, uint64_t xfer) {
  kvs_proto_xfer_t x = {xfer};
  uint8_t *r = NULL;
  size_t n = 0;
  int rc;
  KVS__PEER_RPC(rc, p, c, KVS_OP_ABORT, kvs_proto_xfer_encode, &x, &r, &n);
  (void)rc;
  free(r);
}

/* SHM store, after the PREPARE_STORE reply r (in rep, freed here): copy into the peer's pool,
 * commit naming every slot. */
int kvs__peer_store_shm(kvs_peers_t *p, pconn_t *c, uint8_t *rep,
                        const kvs_proto_prepare_store_reply_t *rp, bool object,
                        const void *const *bufs, uint8_t *outcomes, kvs_peer_copy_fn copy,
                        void *cctx) {
  const kvs_proto_prepare_store_reply_t r = *rp;
  int rc = 0;
  int kept = 0;
  for (uint32_t i = 0; i < r.n_outcomes; i++) {
    if (outcomes) outcomes[i] = r.outcomes[i];
    if (r.outcomes[i] == KVS_RES_PRESENT) kept++;
  }
  for (uint32_t i = 0; i < r.n_slots; i++) {
    const kvs_proto_slot_t *s = &r.slots[i];
    uint8_t *dst = kvs__peer_place(c, s->offset, s->length);
    if (!dst) {
      rc = -EFAULT;
      break;
    }
    const void *src = bufs[object ? 0 : s->key_index];
    if (!copy) memcpy(dst, src, s->length);
    else if ((rc = copy(cctx, s->key_index, dst, src, s->length)) < 0) break;
  }
  if (r.xfer && rc == 0) {
    uint8_t *r2 = NULL;
    size_t n2 = 0;
    kvs_proto_commit_store_t cm = {0};
    cm.xfer = r.xfer;
    cm.n_slots = r.n_slots;
    cm.slots = r.slots;
    KVS__PEER_RPC(rc, p, c, KVS_OP_COMMIT_STORE, kvs_proto_commit_store_encode, &cm, &r2, &n2);
    if (rc == 0) kept += (int)r.n_slots;
    free(r2);
  } else if (r.xfer) {
    kvs__peer_abort(p, c, r.xfer);
  }
  free(rep);
  return rc < 0 ? rc : kept;
}

/* Inline store, after the PREPARE_STORE reply r (in rep, freed here) said which keys to send:
 * send them with the commit. */
int kvs__peer_store_inline(kvs_peers_t *p, pconn_t *c, uint8_t *rep,
                           const kvs_proto_prepare_store_reply_t *rp, const kvs_key_t *keys,
                           size_t n, const kvs_layout_t *layout, bool object,
                           const void *const *bufs, uint8_t *outcomes) {
  const kvs_proto_prepare_store_reply_t r = *rp;
  int rc = 0;
  uint64_t obj_bytes = kvs_layout_nbytes(layout);
  kvs_proto_entry_t *entries = calloc(n, sizeof *entries);
  uint32_t *src = calloc(n, sizeof *src);
  uint32_t n_entries = 0, present = 0;
  if (!entries || !src) rc = -ENOMEM;
  for (uint32_t i = 0; rc == 0 && i < r.n_outcomes; i++) {
    if (outcomes) outcomes[i] = r.outcomes[i];
    if (r.outcomes[i] == KVS_RES_PRESENT) present++;
    if (r.outcomes[i] != KVS_RES_RESERVED) continue;
    src[n_entries] = i;
    entries[n_entries++] = (kvs_proto_entry_t){keys[i], obj_bytes};
  }
  if (rc == 0 && object && n_entries == 1)
    for (size_t i = 1; i < n; i++) entries[n_entries++] = (kvs_proto_entry_t){keys[i], 0};
  free(rep);
  int kept = (int)present;
  if (rc == 0 && n_entries > 0) {
    uint32_t n_objs = object ? 1 : n_entries;
    kvs_proto_commit_store_t cm = {0};
    cm.is_inline = 1;
    cm.kind = object ? KVS_PROTO_KIND_OBJECT : KVS_PROTO_KIND_CHUNKS;
    cm.layout = *layout;
    cm.n_entries = n_entries;
    cm.entries = entries;
    cm.data = NULL; /* filled below, in place */
    cm.data_len = obj_bytes * n_objs;
    size_t len = 0;
    rc = kvs_proto_commit_store_encode(&cm, NULL, 0, &len);
    uint8_t *buf = rc == 0 ? malloc(len) : NULL;
    if (rc == 0) rc = buf ? kvs_proto_commit_store_encode(&cm, buf, len, &len) : -ENOMEM;
    if (rc == 0) {
      uint8_t *dst = buf + len - cm.data_len;
      for (uint32_t i = 0; i < n_objs; i++)
        memcpy(dst + (uint64_t)i * obj_bytes, bufs[object ? 0 : src[i]], obj_bytes);
      uint8_t *r2 = NULL;
      size_t n2 = 0;
      rc = kvs__peer_rpc(p, c, KVS_OP_COMMIT_STORE, buf, len, &r2, &n2, NULL);
      kvs_proto_commit_store_reply_t cr;
      if (rc == 0) rc = kvs_proto_commit_store_reply_decode(r2, n2, &cr);
      if (rc == 0) {
        kept += (int)cr.committed;
        for (uint32_t i = 0; outcomes && i < cr.n_outcomes && i < n_entries; i++)
          outcomes[object ? 0 : src[i]] = cr.outcomes[i];
      }
      free(r2);
    }
    free(buf);
  }
  free(entries);
  free(src);
  return rc < 0 ? rc : kept;
}

/* ---- write-behind ---------------------------------------------------------------------------- */

static void push_one(kvs_peers_t *p, push_item_t *it) {
  kvs_xfer_t xfer = 0;
  int found = kvs_store_lookup(p->local, p->push_owner, it->keys, 1, true, &xfer);
  if (found != 1) { /* evicted before we got to it */
    kvs_stats_inc(p->stats, KVS_STAT_push_dropped);
    return;
  }
  kvs_object_view_t v;
  int rc = kvs_store_read_pinned(p->local, p->push_owner, xfer, &v, 1);
  if (rc == 1) {
    const void *src = kvs_pool_base(kvs_store_pool(p->local)) + v.extent.offset;
    uint8_t outcome = 0;
    rc = kvs_peers_store(p, 0, it->keys, it->n, &v.layout, true, &src, &outcome);
    if (rc > 0 && p->has_cache) kvs_stats_inc(p->stats, KVS_STAT_push_sent);
    else kvs_stats_inc(p->stats, KVS_STAT_push_dropped);
  } else {
    kvs_stats_inc(p->stats, KVS_STAT_push_dropped);
  }
  kvs_store_release(p->local, p->push_owner, xfer);
}

static void *push_main(void *arg) {
  kvs_peers_t *p = arg;
  pthread_mutex_lock(&p->push_lock);
  push_item_t *it;
  while ((it = KVS__FIFO_WAIT_POP(p->q_head, p->q_tail, p->push_stop, &p->push_cond,
                                  &p->push_lock))) {
    p->q_len--;
    p->push_busy = true;
    pthread_mutex_unlock(&p->push_lock);
    pthread_mutex_lock(&p->table_lock);
    bool cache = p->has_cache; /* as the last discovery left it */
    pthread_mutex_unlock(&p->table_lock);
    if (cache) push_one(p, it);
    else kvs_stats_inc(p->stats, KVS_STAT_push_dropped);
    free(it);
    pthread_mutex_lock(&p->push_lock);
    p->push_busy = false;
    pthread_cond_broadcast(&p->push_cond);
  }
  pthread_mutex_unlock(&p->push_lock);
  return NULL;
}

int kvs_peers_push(kvs_peers_t *p, const kvs_key_t *keys, size_t n) {
  if (!p->local || p->opts.push == KVS_PUSH_OFF || !p->push_owner) return -ENOTSUP;
  if (!keys || n == 0) return -EINVAL;
  if (!p->push_thread_started) return -ENOTSUP;
  pthread_mutex_lock(&p->table_lock);
  bool cache = p->has_cache;
  pthread_mutex_unlock(&p->table_lock);
  if (!cache) return -ENOTSUP;
  if (n > PUSH_MAX_KEYS) n = PUSH_MAX_KEYS;
  pthread_mutex_lock(&p->push_lock);
  if (p->q_len >= p->q_cap || p->push_stop) {
    pthread_mutex_unlock(&p->push_lock);
    kvs_stats_inc(p->stats, KVS_STAT_push_dropped);
    return -ENOSPC;
  }
  pthread_mutex_unlock(&p->push_lock);
  push_item_t *it = malloc(sizeof *it + n * sizeof(kvs_key_t));
  if (!it) {
    kvs_stats_inc(p->stats, KVS_STAT_push_dropped);
    return -ENOSPC;
  }
  it->next = NULL;
  it->n = (uint32_t)n;
  memcpy(it->keys, keys, n * sizeof *keys);
  pthread_mutex_lock(&p->push_lock);
  int rc = 0;
  if (p->q_len >= p->q_cap || p->push_stop) {
    free(it);
    kvs_stats_inc(p->stats, KVS_STAT_push_dropped);
    rc = -ENOSPC;
  } else {
    KVS__FIFO_PUSH(p->q_head, p->q_tail, it);
    p->q_len++;
    kvs_stats_inc(p->stats, KVS_STAT_push_queued);
    pthread_cond_broadcast(&p->push_cond);
  }
  pthread_mutex_unlock(&p->push_lock);
  return rc;
}

int kvs_peers_flush(kvs_peers_t *p, uint32_t timeout_ms) {
  struct timespec ts = kvs__realtime_after_ms(timeout_ms);
  pthread_mutex_lock(&p->push_lock);
  while ((p->q_head || p->push_busy) && p->push_thread_started)
    if (pthread_cond_timedwait(&p->push_cond, &p->push_lock, &ts) == ETIMEDOUT) break;
  int left = (int)p->q_len + (p->push_busy ? 1 : 0);
  pthread_mutex_unlock(&p->push_lock);
  return left;
}

void kvs__peer_push_start(kvs_peers_t *p) {
  if (!p->local || p->opts.push == KVS_PUSH_OFF || !p->push_owner) return;
  /* Through prim: a full signal mask (core/prim.h); the thread sleeps until an item comes. */
  p->push_thread_started = kvs__prim_thread_start(&p->push_thread, NULL, push_main, p) == 0;
  if (!p->push_thread_started) kvs_log_info("write-behind: no thread: pushing is off");
}

void kvs__peer_push_stop(kvs_peers_t *p) {
  if (!p->push_thread_started) return;
  int left = kvs_peers_flush(p, p->flush_ms);
  pthread_mutex_lock(&p->push_lock);
  p->push_stop = true;
  /* What did not make it in time is dropped, and counted. */
  for (push_item_t *it; (it = KVS__FIFO_POP(p->q_head, p->q_tail)); free(it))
    kvs_stats_inc(p->stats, KVS_STAT_push_dropped);
  p->q_len = 0;
  pthread_cond_broadcast(&p->push_cond);
  pthread_mutex_unlock(&p->push_lock);
  pthread_join(p->push_thread, NULL);
  p->push_thread_started = false;
  if (left) kvs_log_info("write-behind: %d objects not pushed at exit", left);
}

/* ---- the cache peer's pool mapping (design §3.5) ---------------------------------------- */

/* The cache peer's pool mapping registered with the accelerator's driver, so the device copies
 * from and to it by DMA instead of through the driver's staging buffers. Registration faults in
 * and page-locks the whole mapping (serve prefaults its pool anyway), which takes long for a
 * large pool: one thread at nice 19 does it, never the engine's call. The mapping is
 * writable (stores copy device buffers into it), so it is registered with pin; a mapping
 * attached read-only would use pin_readonly (READ_ONLY where the device supports it). Only with
 * an accelerator installed (the default table pins nothing). A failure changes nothing: copies
 * still work, staged by the driver. kvs__peer_conn_free joins the thread and unregisters before it
 * unmaps. */
static void *pool_pin_main(void *arg) {
  pconn_t *c = arg;
  kvs__prim_thread_background(); /* nice 19, never SCHED_IDLE (core/prim.h says why) */
  const kvs_accel_ops_t *ops = c->pin_ops;
  int (*pin)(void *, size_t) =
      !kvs_pool_is_writable(c->pool) && ops->pin_readonly ? ops->pin_readonly : ops->pin;
  void *base = kvs_pool_base(c->pool);
  uint64_t len = kvs_pool_segment_size(c->pool);
  int rc = pin(base, (size_t)len);
  if (rc == 0) {
    c->pinned = true;
    kvs_stats_inc(c->pin_stats, KVS_STAT_cache_peer_pool_pins);
    kvs_log_debug("cache peer %016" PRIx64 ": pool mapping %p +%" PRIu64 " registered (%s)",
                  c->info.instance_id, base, len, ops->name);
  } else {
    kvs_log_info("cache peer %016" PRIx64 ": pool mapping not registered (%s: %s): copies are "
                 "staged by the driver", c->info.instance_id, ops->name, strerror(-rc));
  }
  return NULL;
}

/* Under the table lock, when the cache peer is adopted (kvs_peers_pin_cache). */
void kvs__peer_pin_start(kvs_peers_t *p, pconn_t *c) {
  if (c->pin_started || !c->pool) return;
  const kvs_accel_ops_t *ops = kvs_accel_get();
  if (ops == kvs_accel_default()) return; /* no accelerator yet: again at the next discovery */
  c->pin_started = true;
  c->pin_ops = ops;
  c->pin_stats = p->stats;
  if (kvs__prim_thread_start(&c->pin_thread, NULL, pool_pin_main, c) != 0)
    c->pin_started = false;
}

void kvs__peer_unpin(pconn_t *c) {
  if (!c->pin_started) return;
  pthread_join(c->pin_thread, NULL); /* a registration in progress finishes first */
  c->pin_started = false;
  if (!c->pinned) return;
  c->pinned = false;
  /* Fails harmlessly when the engine has already released its device context (at exit): the
   * driver dropped the registration with it. */
  int rc = c->pin_ops->unpin(kvs_pool_base(c->pool));
  kvs_log_debug("cache peer %016" PRIx64 ": pool mapping unregistered: %s", c->info.instance_id,
                rc < 0 ? strerror(-rc) : "ok");
}

int kvs_peers_pin_cache(kvs_peers_t *p) {
  if (!p) return -EINVAL;
  int rc = -ENOENT;
  pthread_mutex_lock(&p->table_lock);
  for (pconn_t *c = p->conns; c && rc == -ENOENT; c = c->next) {
    if (c->fd < 0 || c->info.role != KVS_PROTO_ROLE_CACHE) continue;
    kvs__peer_pin_start(p, c);
    rc = c->pin_started ? 1 : 0;
  }
  pthread_mutex_unlock(&p->table_lock);
  return rc;
}
