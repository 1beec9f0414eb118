/* kvshim coord: see coord.h. */
#include "coord.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "prim.h"
#include "proto.h"
#include "sock.h"

#define SWEEP_INTERVAL_MS 500
#define WATCH_TICK_MS 1 /* a waiting WATCH is checked at least this often (a local lookup) */
#define STOP_FLUSH_MS 200
#define MSG_KEEP_BYTES (1u << 20) /* a receive buffer larger than this is freed after use */
/* Out of file descriptors (EMFILE/ENFILE): the listener leaves epoll for a back-off that
 * starts here and doubles up to ACCEPT_BACKOFF_MAX_MS, and comes back at once when one of our
 * connections closes. Without this a readable listener and a failing accept4 spin a core. */
#define ACCEPT_BACKOFF_MIN_MS 10
#define ACCEPT_BACKOFF_MAX_MS 1000

/* One reply (or ERROR) being sent, split into frames of at most frame_max payload bytes. */
typedef struct outmsg {
  struct outmsg *next;
  uint8_t *payload; /* owned (malloc) */
  size_t len;       /* payload bytes */
  size_t off;       /* payload bytes sent */
  size_t frame_end; /* payload offset where the current frame ends */
  uint16_t opcode;
  uint64_t request_id;
  uint32_t frame_max;
  uint8_t hdr[KVS_PROTO_HEADER_SIZE];
  uint8_t hdr_off;  /* header bytes sent; KVS_PROTO_HEADER_SIZE when none is pending */
  bool started;     /* first frame header computed */
  bool last_frame;  /* the current frame has no F_MORE */
  int pass_fd;      /* travels with the first byte; borrowed (the pool's fd) */
  /* An inline retrieve reply sent straight from the pool: the message is payload[0, head_len)
   * (head and table) followed by the extents ext[0, n_ext), pinned by pin_xfer until the last
   * byte left (or the connection closed). Sent only before pin_deadline_ms, well inside the
   * pin's lease: after it the connection is closed rather than send bytes that a reclaimed
   * extent may no longer hold. head_len == len when there are none. */
  size_t head_len;
  struct iovec *ext;
  int n_ext;
  kvs_store_t *store;
  kvs_owner_t owner;
  kvs_xfer_t pin_xfer;
  uint64_t pin_deadline_ms;
} outmsg_t;

#define TX_IOV 64 /* iovec entries per sendmsg: a frame's header and up to 63 pieces */
#define ZCOPY_MIN_BYTES (64u << 10)  /* inline replies with fewer data bytes are copied */
#define ZCOPY_MIN_LEASE_MS 2000u     /* zero-copy only with leases at least this long ... */
#define ZCOPY_LEASE_MARGIN_MS 1000u  /* ... and sent only until this long before the lease ends */

/* An SHM write transfer handed out on a connection, with its slots, for COMMIT_STORE checks. */
typedef struct wxfer {
  struct wxfer *next;
  kvs_xfer_t xfer;
  uint32_t n_slots;
  uint32_t n_keys;          /* the request's keys, for the remote tier's write-behind */
  bool object;              /* kind OBJECT: keys[0] primary, the rest aliases */
  kvs_key_t *keys;          /* after slots[], in the same allocation */
  kvs_proto_slot_t slots[]; /* as sent in the PREPARE_STORE reply */
} wxfer_t;

/* A reply that waits: a LOOKUP waiting for the remote tier (kvs_coord_remote_t.fetch), or a
 * WATCH waiting for its keys to change (re-checked every WATCH_TICK_MS and at kvs_coord_wake). */
typedef struct deferred {
  struct deferred *next;
  uint64_t token;       /* unique per coordinator (0: a WATCH, never a tier's done token) */
  struct conn *conn;
  uint64_t request_id;
  uint64_t deadline_ms; /* kvs__now_ms clock */
  bool watch;           /* a WATCH (docs/protocol.md 4.12), else a LOOKUP */
  uint32_t n_keys;
  kvs_key_t keys[];
} deferred_t;

typedef enum { CONN_AWAIT_HELLO, CONN_READY } conn_state_t;

typedef struct conn {
  struct conn *next;
  int fd;
  conn_state_t state;
  kvs_owner_t owner;      /* 0 until HELLO */
  uint8_t strategy;       /* KVS_PROTO_STRATEGY_SHM or _INLINE after HELLO */
  uint8_t peer_role;
  uint32_t peer_max_frame;
  uint32_t peer_caps;     /* the client's HELLO caps (KVS_PROTO_CAP_*) */
  uid_t uid;
  pid_t pid;
  /* receive side */
  uint8_t hdr[KVS_PROTO_HEADER_SIZE];
  size_t hdr_got;
  kvs_proto_header_t first; /* first frame header of the message being received */
  bool in_message;          /* a frame with F_MORE was received: the message goes on */
  size_t frame_left;        /* payload bytes of the current frame still to read */
  bool reading_payload;
  uint8_t *msg;             /* message bytes (malloc: 8-byte aligned for the codec) */
  size_t msg_len, msg_cap;
  /* Bytes read from fd and not consumed yet: a request's header and a small payload come in
   * with one recvmsg (the rest of a large payload is read straight into msg). Requests left
   * here are served before the socket is asked again (service()). */
  uint32_t rx_pos, rx_len;
  uint8_t rx[4096];
  /* send side */
  outmsg_t *tx_head, *tx_tail;
  bool closing;             /* close once tx is empty */
  bool reading;             /* EPOLLIN armed */
  uint32_t armed;           /* epoll events registered now (epoll_ctl only when they change) */
  wxfer_t *wxfers;
  bool deferred;            /* a LOOKUP reply waits for the remote tier: read nothing */
  /* AUTO_RELEASE (docs/protocol.md 4.7): the read transfer of the last PREPARE_RETRIEVE that
   * asked for it, released at auto_until_ms, at the next request, or at close */
  kvs_xfer_t auto_xfer;
  uint64_t auto_until_ms;
} conn_t;

struct kvs_coord {
  uint32_t n_auto;    /* connections with an auto_xfer pending */
  kvs_store_t *store;
  kvs_pool_t *pool;
  bool has_tensors;
  kvs_coord_tensors_t tensors; /* EXPORT_TENSORS' answers (has_tensors) */
  kvs_stats_t *stats;
  uint8_t role;
  uint8_t strategy;   /* KVSHIM_STRATEGY */
  uint64_t instance_id;
  uint32_t max_frame; /* largest frame payload we accept */
  uint64_t max_message;
  char group[KVS_OPT_STR_MAX];
  char allow_uids[KVS_OPT_STR_MAX];
  kvs_options_t uid_opts; /* only allow_uids is used */
  char path[KVS_SOCK_PATH_MAX + 1];
  int listen_fd, epoll_fd, stop_fd;
  pthread_t thread;
  conn_t *conns;
  unsigned n_conns; /* read by other threads: atomic */
  uint64_t next_sweep_ms;
  /* remote tier (kvshim serve): deferred LOOKUPs are owned by the coordinator thread; done
   * tokens arrive from the tier's threads under done_lock and wake the loop through done_fd. */
  bool has_remote;
  kvs_coord_remote_t remote;
  deferred_t *deferred;
  uint32_t n_watches; /* WATCHes among them */
  uint64_t next_token;
  int done_fd;
  pthread_mutex_t done_lock;
  uint64_t *done; /* tokens finished, not yet handled (done_cap entries) */
  size_t n_done, done_cap;
  /* accept back-off (coordinator thread only): listener out of epoll while accept_paused */
  bool accept_paused;
  bool accept_episode;      /* an fd-exhaustion episode is on: logged and counted once */
  uint32_t accept_backoff_ms;
  uint64_t accept_resume_ms; /* kvs__now_ms() at which the listener is tried again */
};

/* ---- helpers ------------------------------------------------------------------------------ */

int kvs_coord_socket_name(const char *run_dir, const char *group, uint64_t instance_id,
                          char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s/%s/%016" PRIx64 ".sock", run_dir, group, instance_id);
  if (n < 0 || (size_t)n >= cap || (size_t)n > KVS_SOCK_PATH_MAX) return -ENAMETOOLONG;
  return 0;
}

size_t kvs_coord_render_stats(kvs_store_t *store, kvs_stats_t *st, int json, char *buf,
                              size_t cap) {
  if (store) {
    kvs_store_info_t info;
    kvs_store_info(store, &info);
    kvs_stats_set(st, KVS_STAT_store_objects, info.objects_ready);
    kvs_stats_set(st, KVS_STAT_store_keys, info.keys);
    kvs_stats_set(st, KVS_STAT_store_used_bytes, info.used_bytes);
    kvs_stats_set(st, KVS_STAT_store_reserved_bytes, info.reserved_bytes);
    kvs_stats_set(st, KVS_STAT_store_free_bytes, info.free_bytes);
    kvs_stats_set(st, KVS_STAT_store_arena_bytes, info.arena_bytes);
    kvs_stats_set(st, KVS_STAT_pool_fragmentation_pct, info.fragmentation_pct);
  }
  return json ? kvs_stats_render_json(st, buf, cap) : kvs_stats_render_info(st, buf, cap);
}

static void arm(kvs_coord_t *c, conn_t *k) {
  struct epoll_event ev = {.data.ptr = k};
  k->reading = !k->closing && k->tx_head == NULL && !k->deferred;
  ev.events = (k->reading ? EPOLLIN : 0) | (k->tx_head ? EPOLLOUT : 0) | EPOLLRDHUP;
  if (ev.events == k->armed) return; /* the usual case: a reply went out at once */
  if (epoll_ctl(c->epoll_fd, EPOLL_CTL_MOD, k->fd, &ev) == 0) k->armed = ev.events;
}

/* Free a reply; the pins of a zero-copy one end here (on a closed connection its owner's
 * release ended them already, and this release is a no-op). */
static void outmsg_free(outmsg_t *m) {
  if (m->pin_xfer) (void)kvs_store_release(m->store, m->owner, m->pin_xfer);
  free(m->ext);
  free(m->payload);
  free(m);
}

/* Queue a reply. payload is malloc'd and owned by the queue from here on (freed on failure). */
static void queue_msg(conn_t *k, uint16_t opcode, uint64_t rid, uint8_t *payload, size_t len,
                      int pass_fd) {
  outmsg_t *m = calloc(1, sizeof *m);
  if (!m) { /* cannot even answer: close, the peer sees a reset and reports a miss */
    free(payload);
    k->closing = true;
    return;
  }
  m->payload = payload;
  m->len = len;
  m->head_len = len;
  m->opcode = opcode;
  m->request_id = rid;
  m->frame_max = k->peer_max_frame ? k->peer_max_frame : KVS_PROTO_MIN_MAX_FRAME;
  m->hdr_off = KVS_PROTO_HEADER_SIZE;
  m->pass_fd = pass_fd;
  if (k->tx_tail) k->tx_tail->next = m;
  else k->tx_head = m;
  k->tx_tail = m;
}

static void queue_error(kvs_coord_t *c, conn_t *k, uint64_t rid, int code, const char *msg) {
  kvs_proto_error_t e;
  kvs_proto_error_init(&e, code, msg);
  size_t len = 0;
  kvs_proto_error_encode(&e, NULL, 0, &len);
  uint8_t *p = malloc(len ? len : 1);
  if (!p || kvs_proto_error_encode(&e, p, len, &len) < 0) {
    free(p);
    k->closing = true;
    return;
  }
  kvs_stats_inc(c->stats, KVS_STAT_coord_errors);
  queue_msg(k, KVS_OP_ERROR, rid, p, len, -1);
}

/* A frame we cannot read on: answer ERROR and close after it is sent. */
static void protocol_error(kvs_coord_t *c, conn_t *k, uint64_t rid, int code, const char *what) {
  kvs_stats_inc(c->stats, KVS_STAT_coord_bad_frames);
  kvs_log_info("peer pid %ld: %s (%s): closing the connection", (long)k->pid, what,
               kvs_proto_strerror(code));
  queue_error(c, k, rid, code, what);
  k->closing = true;
}

/* Encode a message with a size query first; queue it. enc has the codec's signature. */
#define QUEUE_ENCODED(c, k, op, rid, encfn, msgp)                                            \
  do {                                                                                       \
    size_t len_ = 0;                                                                         \
    int rc_ = encfn((msgp), NULL, 0, &len_);                                                 \
    uint8_t *p_ = rc_ == 0 ? malloc(len_ ? len_ : 1) : NULL;                                 \
    if (rc_ == 0 && p_) rc_ = encfn((msgp), p_, len_, &len_);                                \
    if (rc_ < 0 || !p_) {                                                                    \
      free(p_);                                                                              \
      queue_error((c), (k), (rid), p_ ? rc_ : -ENOMEM, "cannot encode the reply");           \
    } else {                                                                                 \
      queue_msg((k), (op), (rid), p_, len_, -1);                                             \
    }                                                                                        \
  } while (0)

static void forget_wxfer(conn_t *k, kvs_xfer_t xfer) {
  for (wxfer_t **pp = &k->wxfers; *pp; pp = &(*pp)->next)
    if ((*pp)->xfer == xfer) {
      wxfer_t *dead = *pp;
      *pp = dead->next;
      free(dead);
      return;
    }
}
static wxfer_t *find_wxfer(conn_t *k, kvs_xfer_t xfer) {
  for (wxfer_t *w = k->wxfers; w; w = w->next)
    if (w->xfer == xfer) return w;
  return NULL;
}

static void service(kvs_coord_t *c, conn_t *k, uint32_t events);

/* ---- request handlers (each queues exactly one reply or ERROR) ---------------------------- */

/* A client that predates the SKIPPED outcome (no KVS_PROTO_CAP_SKIPPED in its HELLO) gets, for
 * each SKIPPED key, the outcome of the key that blocked the ALL_OR_NOTHING request, as version
 * 1 first had it (docs/protocol.md §5.1). */
static void outcomes_for(const conn_t *k, uint8_t *o, uint32_t n) {
  if (k->peer_caps & KVS_PROTO_CAP_SKIPPED) return;
  uint8_t blocker = KVS_RES_BUSY;
  for (uint32_t i = 0; i < n; i++)
    if (o[i] != KVS_RES_RESERVED && o[i] != KVS_RES_PRESENT && o[i] != KVS_RES_SKIPPED) {
      blocker = o[i];
      break;
    }
  for (uint32_t i = 0; i < n; i++)
    if (o[i] == KVS_RES_SKIPPED) o[i] = blocker;
}

static void on_hello(kvs_coord_t *c, conn_t *k, uint64_t rid, const kvs_proto_hello_t *req) {
  int rc = kvs_proto_hello_check(req, false);
  if (rc < 0) {
    protocol_error(c, k, rid, rc, "bad HELLO");
    return;
  }
  if (k->state != CONN_AWAIT_HELLO) {
    protocol_error(c, k, rid, -EPROTO, "second HELLO");
    return;
  }
  kvs_proto_hello_t me;
  memset(&me, 0, sizeof me);
  me.version_min = KVS_PROTO_VERSION_MIN;
  me.version_max = KVS_PROTO_VERSION_MAX;
  uint16_t version;
  if (kvs_proto_negotiate_version(req, &me, &version) < 0) {
    protocol_error(c, k, rid, -EPROTONOSUPPORT, "no common protocol version");
    return;
  }
  if (strcmp(req->group, c->group) != 0 && req->group[0]) {
    /* docs/protocol.md §5: informational; the socket directory is what separates groups. */
    kvs_log_info("peer pid %ld says group '%s', ours is '%s'", (long)k->pid, req->group, c->group);
  }
  kvs_owner_t owner;
  rc = kvs_store_owner_open(c->store, &owner);
  if (rc < 0) {
    queue_error(c, k, rid, rc, "server cannot take another connection");
    k->closing = true;
    return;
  }
  bool can_offer = c->pool && kvs_pool_fd(c->pool) >= 0;
  uint8_t strategy = kvs_proto_choose_strategy(c->strategy, req, can_offer);
  k->owner = owner;
  k->state = CONN_READY;
  k->strategy = strategy;
  k->peer_role = req->role;
  k->peer_max_frame = req->max_frame;
  k->peer_caps = req->caps;
  kvs_store_info_t info;
  kvs_store_info(c->store, &info);
  me.role = c->role;
  me.strategy_requested = c->strategy;
  me.strategy_chosen = strategy;
  me.flags = strategy == KVS_PROTO_STRATEGY_SHM ? KVS_PROTO_HELLO_POOL_FD : 0;
  me.pid = (uint32_t)getpid();
  me.caps = KVS_PROTO_CAP_INLINE | (can_offer ? KVS_PROTO_CAP_SHM : 0) | KVS_PROTO_CAP_SKIPPED |
            KVS_PROTO_CAP_MAX_MESSAGE | KVS_PROTO_CAP_REPORT_BAD | KVS_PROTO_CAP_AUTO_RELEASE | KVS_PROTO_CAP_WATCH |
            (c->has_remote ? KVS_PROTO_CAP_REMOTE : 0);
  if (req->caps & KVS_PROTO_CAP_MAX_MESSAGE) me.max_message = c->max_message;
  me.instance_id = c->instance_id;
  me.pool_segment_size = c->pool ? kvs_pool_segment_size(c->pool) : 0;
  me.pool_arena_size = info.arena_bytes;
  me.pool_arena_used = info.used_bytes + info.reserved_bytes;
  me.max_frame = c->max_frame;
  snprintf(me.group, sizeof me.group, "%.64s", c->group);
  size_t n = 0;
  kvs_proto_hello_encode(&me, NULL, 0, &n);
  uint8_t *out = malloc(n);
  if (!out || kvs_proto_hello_encode(&me, out, n, &n) < 0) {
    free(out);
    protocol_error(c, k, rid, -ENOMEM, "cannot encode HELLO");
    return;
  }
  queue_msg(k, KVS_OP_HELLO, rid, out, n,
            strategy == KVS_PROTO_STRATEGY_SHM ? kvs_pool_fd(c->pool) : -1);
}

static void reply_lookup(kvs_coord_t *c, conn_t *k, uint64_t rid, const kvs_key_t *keys,
                         uint32_t n) {
  int rc = kvs_store_lookup(c->store, k->owner, keys, n, false, NULL);
  if (rc < 0) {
    queue_error(c, k, rid, rc, "lookup failed");
    return;
  }
  kvs_proto_lookup_reply_t rep = {(uint32_t)rc};
  QUEUE_ENCODED(c, k, KVS_OP_LOOKUP, rid, kvs_proto_lookup_reply_encode, &rep);
}

/* A deferred reply to request rid of k over keys[0, n), due wait_ms from now (token 0), or NULL
 * when out of memory. The caller owns it until defer() lists it. */
static deferred_t *deferred_new(conn_t *k, uint64_t rid, const kvs_key_t *keys, uint32_t n,
                                uint32_t wait_ms, bool watch) {
  deferred_t *d = calloc(1, sizeof *d + sizeof(kvs_key_t) * n);
  if (!d) return NULL;
  d->conn = k;
  d->request_id = rid;
  d->deadline_ms = kvs__now_ms() + wait_ms;
  d->watch = watch;
  d->n_keys = n;
  memcpy(d->keys, keys, sizeof(kvs_key_t) * n);
  return d;
}

/* List d (the coordinator owns it now) and hold k's requests until it is answered. */
static void defer(kvs_coord_t *c, conn_t *k, deferred_t *d) {
  d->next = c->deferred;
  c->deferred = d;
  k->deferred = true; /* requests are answered in order: read nothing until it is */
}

/* Ask the remote tier for what the pool lacks; true when the reply is deferred. */
static bool defer_lookup(kvs_coord_t *c, conn_t *k, uint64_t rid, const kvs_proto_lookup_t *req,
                         int found) {
  if (!c->has_remote || req->remote_wait_ms == 0 || found < 0 || (uint32_t)found >= req->n_keys)
    return false;
  deferred_t *d = deferred_new(k, rid, req->keys, req->n_keys, req->remote_wait_ms, false);
  if (!d) return false;
  d->token = ++c->next_token;
  if (c->remote.fetch(c->remote.ctx, d->keys, (size_t)found, d->n_keys, d->deadline_ms,
                      d->token) < 0) {
    free(d);
    return false;
  }
  defer(c, k, d);
  return true;
}

static void on_lookup(kvs_coord_t *c, conn_t *k, uint64_t rid, const kvs_proto_lookup_t *req) {
  int rc = kvs_store_lookup(c->store, k->owner, req->keys, req->n_keys, false, NULL);
  if (rc < 0) {
    queue_error(c, k, rid, rc, "lookup failed");
    return;
  }
  if (defer_lookup(c, k, rid, req, rc)) return;
  kvs_proto_lookup_reply_t rep = {(uint32_t)rc};
  QUEUE_ENCODED(c, k, KVS_OP_LOOKUP, rid, kvs_proto_lookup_reply_encode, &rep);
}

static void on_prepare_store(kvs_coord_t *c, conn_t *k, uint64_t rid,
                             const kvs_proto_prepare_store_t *req) {
  int rc;
  bool object = req->kind == KVS_PROTO_KIND_OBJECT;
  uint32_t n_out = object ? 1 : req->n_keys;
  uint8_t outcomes[KVS_PROTO_MAX_KEYS];
  kvs_proto_prepare_store_reply_t rep = {0};
  rep.n_outcomes = n_out;
  rep.outcomes = outcomes;

  if (req->strategy == KVS_PROTO_STRATEGY_INLINE) {
    /* An empty context: nothing is reserved; tell the peer which keys it need not send. */
    for (uint32_t i = 0; i < n_out; i++) {
      int found = kvs_store_lookup(c->store, k->owner, &req->keys[i], 1, false, NULL);
      outcomes[i] = found == 1 ? KVS_RES_PRESENT : KVS_RES_RESERVED;
    }
    QUEUE_ENCODED(c, k, KVS_OP_PREPARE_STORE, rid, kvs_proto_prepare_store_reply_encode, &rep);
    return;
  }
  if (k->strategy != KVS_PROTO_STRATEGY_SHM) {
    queue_error(c, k, rid, -EOPNOTSUPP, "SHM was not negotiated on this connection");
    return;
  }

  kvs_extent_t *ext = malloc(sizeof *ext * n_out);
  wxfer_t *w = malloc(sizeof *w + sizeof(kvs_proto_slot_t) * n_out +
                      (c->has_remote ? sizeof(kvs_key_t) * req->n_keys : 0));
  if (!ext || !w) {
    free(ext);
    free(w);
    queue_error(c, k, rid, -ENOMEM, "out of memory");
    return;
  }
  kvs_xfer_t xfer = 0;
  if (object)
    rc = kvs_store_reserve_object(c->store, k->owner, req->keys, req->n_keys, &req->layout,
                                  req->mode, outcomes, ext, &xfer);
  else
    rc = kvs_store_reserve_write(c->store, k->owner, req->keys, req->n_keys, &req->layout,
                                 req->mode, outcomes, ext, &xfer);
  if (rc < 0) {
    free(ext);
    free(w);
    queue_error(c, k, rid, rc, "reservation failed");
    return;
  }
  uint32_t n_slots = 0;
  for (uint32_t i = 0; i < n_out; i++)
    if (outcomes[i] == KVS_RES_RESERVED)
      w->slots[n_slots++] = (kvs_proto_slot_t){i, 0, ext[i].offset, ext[i].length};
  free(ext);
  outcomes_for(k, outcomes, n_out);
  rep.xfer = xfer;
  rep.n_slots = n_slots;
  rep.slots = w->slots;
  if (xfer) {
    w->xfer = xfer;
    w->n_slots = n_slots;
    w->object = object;
    w->n_keys = c->has_remote ? req->n_keys : 0;
    w->keys = (kvs_key_t *)(void *)(w->slots + n_out);
    if (w->n_keys) memcpy(w->keys, req->keys, sizeof(kvs_key_t) * w->n_keys);
    w->next = k->wxfers;
    k->wxfers = w;
  }
  QUEUE_ENCODED(c, k, KVS_OP_PREPARE_STORE, rid, kvs_proto_prepare_store_reply_encode, &rep);
  if (!xfer) free(w);
}

/* Check the slots a peer names in an SHM commit against what this connection was handed:
 * every slot inside the pool, inside the transfer, and the whole transfer named once. */
static int check_commit_slots(kvs_coord_t *c, const wxfer_t *w, const kvs_proto_slot_t *slots,
                              uint32_t n) {
  uint64_t seg = kvs_pool_segment_size(c->pool);
  for (uint32_t i = 0; i < n; i++)
    if (slots[i].offset > seg || slots[i].length > seg - slots[i].offset) return -EFAULT;
  if (!w) return 0; /* the store decides: -ENOENT or -EPERM */
  for (uint32_t i = 0; i < n; i++) {
    bool ok = false;
    for (uint32_t j = 0; j < w->n_slots && !ok; j++)
      ok = w->slots[j].key_index == slots[i].key_index && w->slots[j].offset == slots[i].offset &&
           w->slots[j].length == slots[i].length;
    if (!ok) return -EFAULT;
  }
  return n == w->n_slots ? 0 : -EINVAL;
}

/* Hand what a commit published to the remote tier: an object with its aliases, or the chunks
 * whose outcome[i] (or slot) says they were written by this commit. */
static void publish_remote(kvs_coord_t *c, const kvs_key_t *keys, uint32_t n, bool object,
                           const uint8_t *outcomes, const kvs_proto_slot_t *slots,
                           uint32_t n_slots) {
  if (!c->has_remote || n == 0) return;
  if (object) {
    c->remote.published(c->remote.ctx, keys, n, true);
    return;
  }
  kvs_key_t *pick = malloc(sizeof *pick * n);
  if (!pick) return;
  uint32_t m = 0;
  if (slots) {
    for (uint32_t i = 0; i < n_slots; i++)
      if (slots[i].key_index < n) pick[m++] = keys[slots[i].key_index];
  } else {
    for (uint32_t i = 0; i < n; i++)
      if (outcomes[i] == KVS_RES_RESERVED) pick[m++] = keys[i];
  }
  if (m) c->remote.published(c->remote.ctx, pick, m, false);
  free(pick);
}

/* Inline commit: reserve, copy the bytes from the message into the extents, commit. */
static void commit_inline(kvs_coord_t *c, conn_t *k, uint64_t rid,
                          const kvs_proto_commit_store_t *req) {
  bool object = req->kind == KVS_PROTO_KIND_OBJECT;
  uint32_t n = req->n_entries;
  uint32_t n_out = object ? 1 : n;
  uint64_t want = kvs_layout_nbytes(&req->layout);
  uint8_t outcomes[KVS_PROTO_MAX_KEYS];
  kvs_key_t *keys = malloc(sizeof *keys * n);
  kvs_extent_t *ext = malloc(sizeof *ext * n_out);
  if (!keys || !ext) {
    free(keys);
    free(ext);
    queue_error(c, k, rid, -ENOMEM, "out of memory");
    return;
  }
  for (uint32_t i = 0; i < n; i++) {
    keys[i] = req->entries[i].key;
    uint64_t expect = (object && i > 0) ? 0 : want;
    if (req->entries[i].length != expect) {
      free(keys);
      free(ext);
      queue_error(c, k, rid, -EINVAL, "entry length disagrees with the layout");
      return;
    }
  }
  kvs_xfer_t xfer = 0;
  int rc = object ? kvs_store_reserve_object(c->store, k->owner, keys, n, &req->layout, req->mode,
                                             outcomes, ext, &xfer)
                  : kvs_store_reserve_write(c->store, k->owner, keys, n, &req->layout, req->mode,
                                            outcomes, ext, &xfer);
  if (rc < 0) {
    free(keys);
    free(ext);
    queue_error(c, k, rid, rc, "reservation failed");
    return;
  }
  uint8_t *base = kvs_pool_base(c->pool);
  uint32_t reserved = 0;
  for (uint32_t i = 0; i < n_out; i++) {
    if (outcomes[i] != KVS_RES_RESERVED) continue;
    /* Outside the store lock; the lease keeps the extent ours until commit. */
    memcpy(base + ext[i].offset, req->data + (uint64_t)i * want, want);
    reserved++;
  }
  free(ext);
  if (xfer) {
    rc = kvs_store_commit(c->store, k->owner, xfer);
    if (rc < 0) {
      free(keys);
      queue_error(c, k, rid, rc, "commit failed");
      return;
    }
    if (!object || outcomes[0] == KVS_RES_RESERVED)
      publish_remote(c, keys, n, object, outcomes, NULL, 0);
  }
  free(keys);
  outcomes_for(k, outcomes, n_out);
  kvs_proto_commit_store_reply_t rep = {reserved, n_out, outcomes};
  QUEUE_ENCODED(c, k, KVS_OP_COMMIT_STORE, rid, kvs_proto_commit_store_reply_encode, &rep);
}

static void on_commit_store(kvs_coord_t *c, conn_t *k, uint64_t rid,
                            const kvs_proto_commit_store_t *req) {
  int rc;
  if (req->is_inline) {
    if (req->xfer) { /* the SHM reservation this inline commit replaces: abort it, never leak */
      rc = kvs_store_abort(c->store, k->owner, req->xfer);
      forget_wxfer(k, req->xfer);
      if (rc < 0 && rc != -ENOENT) {
        queue_error(c, k, rid, rc, "cannot abort that transfer");
        return;
      }
    }
    commit_inline(c, k, rid, req);
    return;
  }
  wxfer_t *w = find_wxfer(k, req->xfer);
  rc = check_commit_slots(c, w, req->slots, req->n_slots);
  if (rc == -EFAULT) {
    if (w) kvs_store_abort(c->store, k->owner, req->xfer), forget_wxfer(k, req->xfer);
    protocol_error(c, k, rid, -EFAULT, "slot outside the pool or outside the transfer");
    return;
  }
  if (rc < 0) {
    kvs_store_abort(c->store, k->owner, req->xfer);
    forget_wxfer(k, req->xfer);
    queue_error(c, k, rid, rc, "commit must name every slot of the transfer");
    return;
  }
  rc = kvs_store_commit(c->store, k->owner, req->xfer);
  if (rc < 0) {
    queue_error(c, k, rid, rc, "commit refused");
    return;
  }
  if (w) publish_remote(c, w->keys, w->n_keys, w->object, NULL, w->slots, w->n_slots);
  kvs_proto_commit_store_reply_t rep = {w ? w->n_slots : 0, 0, NULL};
  forget_wxfer(k, req->xfer);
  QUEUE_ENCODED(c, k, KVS_OP_COMMIT_STORE, rid, kvs_proto_commit_store_reply_encode, &rep);
}

static void on_abort(kvs_coord_t *c, conn_t *k, uint64_t rid, const kvs_proto_xfer_t *req) {
  int rc = kvs_store_abort(c->store, k->owner, req->xfer);
  if (rc < 0) {
    queue_error(c, k, rid, rc, "abort refused");
    return;
  }
  forget_wxfer(k, req->xfer);
  queue_msg(k, KVS_OP_ABORT, rid, malloc(1), 0, -1);
}

/* AUTO_RELEASE pins last at most this long (or the lease, when shorter): how long an idle
 * client's last retrieve keeps its objects from eviction. */
#define AUTO_PIN_MAX_MS 1000u

/* End k's AUTO_RELEASE pins now (the lease may have ended them already: nothing to do). */
static void auto_release(kvs_coord_t *c, conn_t *k) {
  if (!k->auto_xfer) return;
  (void)kvs_store_release(c->store, k->owner, k->auto_xfer);
  k->auto_xfer = 0;
  c->n_auto--;
}

/* Release the AUTO_RELEASE pins whose time is up (only while some are pending). */
static void expire_auto(kvs_coord_t *c, uint64_t now) {
  for (conn_t *k = c->conns; k && c->n_auto; k = k->next)
    if (k->auto_xfer && now >= k->auto_until_ms) auto_release(c, k);
}

static void on_prepare_retrieve(kvs_coord_t *c, conn_t *k, uint64_t rid,
                                const kvs_proto_prepare_retrieve_t *req) {
  bool shm = req->strategy == KVS_PROTO_STRATEGY_SHM;
  if (shm && k->strategy != KVS_PROTO_STRATEGY_SHM) {
    queue_error(c, k, rid, -EOPNOTSUPP, "SHM was not negotiated on this connection");
    return;
  }
  kvs_xfer_t xfer = 0;
  int found = kvs_store_lookup(c->store, k->owner, req->keys, req->n_keys, true, &xfer);
  if (found < 0) {
    queue_error(c, k, rid, found, "lookup failed");
    return;
  }
  kvs_proto_object_t *objs = NULL;
  kvs_object_view_t *views = NULL;
  if (found > 0) {
    objs = calloc((size_t)found, sizeof *objs);
    views = calloc((size_t)found, sizeof *views);
    int nv = (objs && views) ? kvs_store_read_pinned(c->store, k->owner, xfer, views, (size_t)found)
                             : -ENOMEM;
    if (nv != found) {
      free(objs);
      free(views);
      kvs_store_release(c->store, k->owner, xfer);
      queue_error(c, k, rid, nv < 0 ? nv : -EIO, "cannot read the pinned objects");
      return;
    }
  }
  kvs_proto_prepare_retrieve_reply_t rep = {0};
  rep.n_found = (uint32_t)found;
  rep.objects = objs;
  rep.is_inline = !shm;
  rep.xfer = shm ? xfer : 0;
  /* AUTO_RELEASE from a client that announced it (docs/protocol.md 4.7): the pins end by
   * themselves pin_ms from now (never later than the lease would end them), or when the
   * client's next request arrives; the client trusts a copy finished within pin_ms of its
   * request without asking. */
  if (shm && xfer && (req->flags & KVS_PROTO_RETRIEVE_AUTO_RELEASE) &&
      (k->peer_caps & KVS_PROTO_CAP_AUTO_RELEASE)) {
    uint32_t lease = kvs_store_lease_ms(c->store);
    rep.pin_ms = lease < AUTO_PIN_MAX_MS ? lease : AUTO_PIN_MAX_MS;
    auto_release(c, k); /* none is pending here (dispatch ended it): kept for safety */
    k->auto_xfer = xfer;
    k->auto_until_ms = kvs__now_ms() + rep.pin_ms;
    c->n_auto++;
  }
  /* One record per object: keys in a row that name the same object (a primary and its
   * aliases) share the record of the first of them (docs/protocol.md §4.7), so its bytes
   * travel once. views[] is compacted to the objects as they go out. */
  uint32_t no = 0;
  for (int i = 0; i < found; i++) {
    if (no && views[i].extent.offset == views[no - 1].extent.offset) continue;
    views[no] = views[i];
    objs[no].key_index = (uint32_t)i;
    objs[no].offset = shm ? views[i].extent.offset : 0;
    objs[no].length = views[i].extent.length;
    objs[no].layout = views[i].layout;
    objs[no].data = NULL; /* inline: filled below straight from the pool */
    rep.data_len += shm ? 0 : views[i].extent.length;
    no++;
  }
  rep.n_objects = no;
  size_t n = 0;
  int rc = kvs_proto_prepare_retrieve_reply_encode(&rep, NULL, 0, &n);
  uint8_t *out = rc == 0 ? malloc(n ? n : 1) : NULL;
  if (out) rc = kvs_proto_prepare_retrieve_reply_encode(&rep, out, n, &n);
  /* Large inline replies go out straight from the pool (sendmsg over the pinned extents, the
   * pins held until the last byte left): no copy into the reply. Only with a lease long enough
   * that a slow reader cannot outlast it unnoticed (see outmsg_t). */
  uint32_t lease = kvs_store_lease_ms(c->store);
  struct iovec *ext = NULL;
  if (rc == 0 && out && !shm && xfer && rep.data_len >= ZCOPY_MIN_BYTES &&
      lease >= ZCOPY_MIN_LEASE_MS && (ext = calloc(no, sizeof *ext)) != NULL) {
    uint8_t *base = kvs_pool_base(c->pool);
    for (uint32_t i = 0; i < no; i++)
      ext[i] = (struct iovec){base + views[i].extent.offset, views[i].extent.length};
    size_t head_len = n - rep.data_len;
    uint8_t *shrunk = realloc(out, head_len ? head_len : 1); /* the data region was never used */
    if (shrunk) out = shrunk;
    kvs_stats_add(c->stats, KVS_STAT_coord_bytes_out, rep.data_len);
    free(objs);
    free(views);
    queue_msg(k, KVS_OP_PREPARE_RETRIEVE, rid, out, n, -1);
    outmsg_t *m = k->tx_tail;
    if (!m || m->payload != out) { /* could not queue: the connection closes, its pins end */
      free(ext);
      return;
    }
    m->head_len = head_len;
    m->ext = ext;
    m->n_ext = (int)no;
    m->store = c->store;
    m->owner = k->owner;
    m->pin_xfer = xfer;
    m->pin_deadline_ms = kvs__now_ms() + lease - ZCOPY_LEASE_MARGIN_MS;
    return;
  }
  if (rc == 0 && out && !shm) {
    /* The bytes are the payload's tail, in object order; copy them while the pins hold. */
    uint8_t *dst = out + n - rep.data_len, *base = kvs_pool_base(c->pool);
    for (uint32_t i = 0; i < no; i++) {
      memcpy(dst, base + views[i].extent.offset, views[i].extent.length);
      dst += views[i].extent.length;
    }
    kvs_stats_add(c->stats, KVS_STAT_coord_bytes_out, rep.data_len);
  }
  if (!shm && xfer) kvs_store_release(c->store, k->owner, xfer); /* inline: pins end now */
  free(objs);
  free(views);
  if (rc < 0 || !out) {
    free(out);
    if (shm && xfer) kvs_store_release(c->store, k->owner, xfer);
    queue_error(c, k, rid, out ? rc : -ENOMEM, "cannot encode the reply");
    return;
  }
  queue_msg(k, KVS_OP_PREPARE_RETRIEVE, rid, out, n, -1);
}

static void on_commit_retrieve(kvs_coord_t *c, conn_t *k, uint64_t rid,
                               const kvs_proto_xfer_t *req) {
  if (req->xfer) {
    int rc = kvs_store_release(c->store, k->owner, req->xfer);
    if (rc < 0) {
      queue_error(c, k, rid, rc, "release refused");
      return;
    }
  }
  queue_msg(k, KVS_OP_COMMIT_RETRIEVE, rid, malloc(1), 0, -1);
}

static void on_stats(kvs_coord_t *c, conn_t *k, uint64_t rid, const kvs_proto_stats_t *req) {
  char text[16384];
  size_t n = kvs_coord_render_stats(c->store, c->stats, req->format == KVS_PROTO_STATS_JSON, text,
                                    sizeof text);
  if (n >= sizeof text) n = sizeof text - 1;
  kvs_proto_text_t rep = {(uint32_t)n, text};
  QUEUE_ENCODED(c, k, KVS_OP_STATS, rid, kvs_proto_text_encode, &rep);
}

static void on_ping(kvs_coord_t *c, conn_t *k, uint64_t rid, const kvs_proto_ping_t *req) {
  QUEUE_ENCODED(c, k, KVS_OP_PING, rid, kvs_proto_ping_encode, req);
}

static void on_export_tensors(kvs_coord_t *c, conn_t *k, uint64_t rid,
                              const kvs_proto_export_t *req) {
  kvs_proto_export_reply_t rep = {0};
  kvs_tensor_desc_t *descs = NULL;
  kvs_proto_blob_t *blobs = NULL;
  uint8_t *enc = NULL;
  int n = 0;
  if (c->has_tensors) {
    n = c->tensors.query(c->tensors.ctx, req->address, req->length, NULL, 0);
    if (n < 0) {
      queue_error(c, k, rid, n, "bad address range");
      return;
    }
    if (n > (int)KVS_PROTO_MAX_DESCS) n = KVS_PROTO_MAX_DESCS;
  }
  if (n > 0) {
    descs = calloc((size_t)n, sizeof *descs);
    blobs = calloc((size_t)n, sizeof *blobs);
    enc = malloc((size_t)n * KVS_PROTO_MAX_DESC_BYTES);
    if (!descs || !blobs || !enc) {
      free(descs), free(blobs), free(enc);
      queue_error(c, k, rid, -ENOMEM, "out of memory");
      return;
    }
    n = c->tensors.query(c->tensors.ctx, req->address, req->length, descs, (size_t)n);
    if (n > (int)KVS_PROTO_MAX_DESCS) n = KVS_PROTO_MAX_DESCS;
    for (int i = 0; i < n; i++) {
      uint8_t *dst = enc + (size_t)i * KVS_PROTO_MAX_DESC_BYTES;
      int w = kvs_tensor_encode(&descs[i], dst, KVS_PROTO_MAX_DESC_BYTES);
      if (w <= 0) {
        free(descs), free(blobs), free(enc);
        queue_error(c, k, rid, w < 0 ? w : -EIO, "cannot encode a descriptor");
        return;
      }
      blobs[i] = (kvs_proto_blob_t){(uint32_t)w, dst};
    }
  }
  rep.n_descs = (uint32_t)(n > 0 ? n : 0);
  rep.descs = blobs;
  QUEUE_ENCODED(c, k, KVS_OP_EXPORT_TENSORS, rid, kvs_proto_export_reply_encode, &rep);
  free(descs), free(blobs), free(enc);
}

/* REPORT_BAD (docs/protocol.md 4.11): drop the object under key when its bytes are exactly the
 * ones the reporter judged bad (same length and XXH3-64): a report about an object rewritten
 * since it was read is ignored. Hashing happens under our own pin, outside the store lock. */
static void on_report_bad(kvs_coord_t *c, conn_t *k, uint64_t rid,
                          const kvs_proto_report_t *req) {
  kvs_stats_inc(c->stats, KVS_STAT_coord_bad_reports);
  kvs_proto_report_reply_t rep = {0};
  kvs_xfer_t xfer = 0;
  kvs_object_view_t v;
  if (kvs_store_lookup(c->store, k->owner, &req->key, 1, true, &xfer) == 1) {
    bool same = kvs_store_read_pinned(c->store, k->owner, xfer, &v, 1) == 1 &&
                v.extent.length == req->length &&
                kvs_checksum64(kvs_pool_base(c->pool) + v.extent.offset, v.extent.length) ==
                    req->checksum;
    kvs_store_release(c->store, k->owner, xfer);
    if (same && kvs_store_remove(c->store, &req->key) == 0) rep.dropped = 1;
  }
  if (rep.dropped) {
    kvs_stats_inc(c->stats, KVS_STAT_coord_bad_dropped);
    kvs_log_info("peer pid %ld reported a bad object (%" PRIu64 " bytes): dropped", (long)k->pid,
                 req->length);
  }
  QUEUE_ENCODED(c, k, KVS_OP_REPORT_BAD, rid, kvs_proto_report_reply_encode, &rep);
}

/* ---- WATCH (docs/protocol.md 4.12) ---------------------------------------------------------- */

/* The state a WATCH of keys would report now, or -1: nothing changed yet (keys[0] held). */
static int watch_state(kvs_coord_t *c, const conn_t *k, const kvs_key_t *keys, uint32_t n) {
  if (kvs_store_lookup(c->store, k->owner, &keys[0], 1, false, NULL) != 1)
    return (int)KVS_PROTO_WATCH_GONE;
  for (uint32_t i = 1; i < n; i++)
    if (kvs_store_lookup(c->store, k->owner, &keys[i], 1, false, NULL) == 1)
      return (int)KVS_PROTO_WATCH_PRESENT;
  return -1;
}

static void reply_watch(kvs_coord_t *c, conn_t *k, uint64_t rid, uint32_t state) {
  kvs_proto_watch_reply_t rep = {state};
  QUEUE_ENCODED(c, k, KVS_OP_WATCH, rid, kvs_proto_watch_reply_encode, &rep);
}

static void on_watch(kvs_coord_t *c, conn_t *k, uint64_t rid, const kvs_proto_watch_t *req) {
  kvs_stats_inc(c->stats, KVS_STAT_coord_watches);
  int st = watch_state(c, k, req->keys, req->n_keys);
  if (st >= 0 || req->wait_ms == 0) {
    reply_watch(c, k, rid, st >= 0 ? (uint32_t)st : KVS_PROTO_WATCH_HELD);
    return;
  }
  deferred_t *d = deferred_new(k, rid, req->keys, req->n_keys, req->wait_ms, true);
  if (!d) {
    queue_error(c, k, rid, -ENOMEM, "cannot wait");
    return;
  }
  defer(c, k, d);
  c->n_watches++;
}

static void dispatch(kvs_coord_t *c, conn_t *k, uint16_t op, uint64_t rid, const uint8_t *p,
                     size_t len) {
  kvs_stats_inc(c->stats, KVS_STAT_coord_requests);
  if (k->auto_xfer) {
    /* The client sent its next request: it is done with the pins of its last AUTO_RELEASE
     * retrieve, unless this request ends them itself (a slow copy asking for the verdict). */
    kvs_proto_xfer_t x = {0};
    if ((op == KVS_OP_COMMIT_RETRIEVE || op == KVS_OP_ABORT) &&
        kvs_proto_xfer_decode(p, len, &x) == 0 && x.xfer == k->auto_xfer) {
      k->auto_xfer = 0;
      c->n_auto--;
    } else {
      auto_release(c, k);
    }
  }
  if (k->state == CONN_AWAIT_HELLO && op != KVS_OP_HELLO) {
    protocol_error(c, k, rid, -EPROTO, "request before HELLO");
    return;
  }
  switch (op) {
    /* Every request's opening (KVS_PROTO_REQUESTS): decode its payload (docs/protocol.md
     * section 4); a malformed one is answered ERROR and closes the connection; the handler gets
     * the decoded request. */
#define KVS__COORD_REQUEST(OP, handler, request)                                              \
  case KVS_OP_##OP: {                                                                         \
    kvs_proto_##request##_t req;                                                              \
    int rc = kvs_proto_##request##_decode(p, len, &req);                                      \
    if (rc < 0)                                                                               \
      protocol_error(c, k, rid, rc, "bad " #OP);                                              \
    else                                                                                      \
      on_##handler(c, k, rid, &req);                                                          \
    break;                                                                                    \
  }
    KVS_PROTO_REQUESTS(KVS__COORD_REQUEST)
#undef KVS__COORD_REQUEST
    default: protocol_error(c, k, rid, -EOPNOTSUPP, "not a request opcode"); break;
  }
}

/* ---- connection I/O ------------------------------------------------------------------------ */

static void close_conn(kvs_coord_t *c, conn_t *k) {
  for (deferred_t **pp = &c->deferred; *pp;) {
    deferred_t *d = *pp;
    if (d->conn != k) {
      pp = &d->next;
      continue;
    }
    *pp = d->next; /* the tier's late done is ignored */
    if (d->watch) c->n_watches--;
    free(d);
  }
  epoll_ctl(c->epoll_fd, EPOLL_CTL_DEL, k->fd, NULL);
  close(k->fd);
  if (k->auto_xfer) k->auto_xfer = 0, c->n_auto--; /* its pins end with the owner's leases */
  if (k->owner) kvs_store_owner_release(c->store, k->owner); /* every lease ends here */
  while (k->tx_head) {
    outmsg_t *m = k->tx_head;
    k->tx_head = m->next;
    outmsg_free(m);
  }
  while (k->wxfers) {
    wxfer_t *w = k->wxfers;
    k->wxfers = w->next;
    free(w);
  }
  free(k->msg);
  for (conn_t **pp = &c->conns; *pp; pp = &(*pp)->next)
    if (*pp == k) {
      *pp = k->next;
      break;
    }
  __atomic_fetch_sub(&c->n_conns, 1, __ATOMIC_RELAXED);
  free(k);
  if (c->accept_paused) c->accept_resume_ms = 0; /* a descriptor came free: try again now */
}

/* The message bytes [off, end) as an iovec over payload and extents: how many entries. */
static int msg_iov(const outmsg_t *m, size_t off, size_t end, struct iovec *iov, int cap) {
  int n = 0;
  if (off < m->head_len && n < cap) {
    size_t e = end < m->head_len ? end : m->head_len;
    iov[n++] = (struct iovec){m->payload + off, e - off};
    off = e;
  }
  size_t at = m->head_len;
  for (int i = 0; i < m->n_ext && off < end && n < cap; i++) {
    size_t l = m->ext[i].iov_len;
    if (off < at + l) {
      size_t s0 = off - at, e = end < at + l ? end - at : l;
      iov[n++] = (struct iovec){(uint8_t *)m->ext[i].iov_base + s0, e - s0};
      off = at + e;
    }
    at += l;
  }
  return n;
}

/* Send what the socket takes. Returns 0, or a negative errno (connection dead). */
static int flush_tx(conn_t *k) {
  while (k->tx_head) {
    outmsg_t *m = k->tx_head;
    if (m->hdr_off == KVS_PROTO_HEADER_SIZE) { /* need the next frame's header */
      if (m->started && m->last_frame && m->off == m->frame_end) {
        k->tx_head = m->next;
        if (!k->tx_head) k->tx_tail = NULL;
        outmsg_free(m);
        continue;
      }
      if (m->pin_xfer && kvs__now_ms() >= m->pin_deadline_ms) return -ETIMEDOUT;
      if (m->started && m->off < m->frame_end) goto payload;
      kvs_proto_header_t h;
      int rc = kvs_proto_frame_header(m->opcode, KVS_PROTO_F_REPLY, m->request_id, m->len, m->off,
                                      m->frame_max, &h);
      if (rc < 0) return rc;
      kvs_proto_header_encode(&h, m->hdr);
      m->hdr_off = 0;
      m->frame_end = m->off + h.length;
      m->last_frame = !(h.flags & KVS_PROTO_F_MORE);
      m->started = true;
    }
    while (m->hdr_off < KVS_PROTO_HEADER_SIZE) {
      /* Header and this frame's payload in one sendmsg: one syscall, one wake-up. */
      struct iovec iov[TX_IOV];
      iov[0] = (struct iovec){m->hdr + m->hdr_off, KVS_PROTO_HEADER_SIZE - m->hdr_off};
      int niov = 1 + msg_iov(m, m->off, m->frame_end, iov + 1, TX_IOV - 1);
      ssize_t r = kvs_sock_sendv_some(k->fd, iov, niov, m->pass_fd);
      if (r < 0) return (int)r;
      if (r == 0) return 0;
      m->pass_fd = -1;
      size_t h = (size_t)r < iov[0].iov_len ? (size_t)r : iov[0].iov_len;
      m->hdr_off += (uint8_t)h;
      m->off += (size_t)r - h;
    }
  payload:
    while (m->off < m->frame_end) {
      if (m->pin_xfer && kvs__now_ms() >= m->pin_deadline_ms) return -ETIMEDOUT;
      struct iovec iov[TX_IOV];
      int niov = msg_iov(m, m->off, m->frame_end, iov, TX_IOV);
      ssize_t r = kvs_sock_sendv_some(k->fd, iov, niov, -1);
      if (r < 0) return (int)r;
      if (r == 0) return 0;
      m->off += (size_t)r;
    }
  }
  return 0;
}

/* The peer went away (rc < 0). A frame it left half-sent is a truncated, malformed frame:
 * counted like any other (nobody is left to answer). */
static int rx_gone(kvs_coord_t *c, conn_t *k, int rc) {
  if (k->hdr_got || k->reading_payload || k->in_message) {
    kvs_stats_inc(c->stats, KVS_STAT_coord_bad_frames);
    kvs_log_info("peer pid %ld closed in the middle of a frame", (long)k->pid);
  }
  return rc;
}

/* Up to len bytes of k's stream into dst: from the stash, else one recvmsg (into the stash
 * when len is short of it). Returns the count, -EAGAIN when nothing is there, or -errno. */
static ssize_t rx_some(conn_t *k, void *dst, size_t len) {
  if (k->rx_pos == k->rx_len) {
    k->rx_pos = k->rx_len = 0;
    if (len >= sizeof k->rx) return kvs_sock_recv_some(k->fd, dst, len, NULL);
    ssize_t r = kvs_sock_recv_some(k->fd, k->rx, sizeof k->rx, NULL);
    if (r < 0) return r;
    k->rx_len = (uint32_t)r;
  }
  size_t n = k->rx_len - k->rx_pos < len ? k->rx_len - k->rx_pos : len;
  memcpy(dst, k->rx + k->rx_pos, n);
  k->rx_pos += (uint32_t)n;
  return (ssize_t)n;
}

/* Read and dispatch until the socket is empty or a reply is pending. 0, or negative: close. */
static int pump_rx(kvs_coord_t *c, conn_t *k) {
  while (!k->closing && !k->tx_head && !k->deferred) {
    if (!k->reading_payload) {
      ssize_t r = rx_some(k, k->hdr + k->hdr_got, sizeof k->hdr - k->hdr_got);
      if (r == -EAGAIN) return 0;
      if (r < 0) return rx_gone(c, k, (int)r);
      k->hdr_got += (size_t)r;
      if (k->hdr_got < sizeof k->hdr) continue;
      k->hdr_got = 0;
      kvs_proto_header_t h;
      kvs_proto_header_parse(k->hdr, sizeof k->hdr, &h);
      /* docs/protocol.md §8: the ERROR carries the request id when the magic was right (also
       * for a frame marked REPLY or an ERROR: the id is the sender's, whatever it meant). */
      uint64_t rid = h.magic != KVS_PROTO_MAGIC ? 0 : h.request_id;
      uint32_t limit = k->state == CONN_READY ? c->max_frame : KVS_PROTO_MIN_MAX_FRAME;
      int rc = kvs_proto_header_validate(&h, limit);
      if (rc < 0) {
        protocol_error(c, k, rid, rc, "bad frame header");
        return 0;
      }
      if (h.flags & KVS_PROTO_F_REPLY) {
        protocol_error(c, k, rid, -EPROTO, "a reply sent to the server");
        return 0;
      }
      if (k->in_message) {
        if (kvs_proto_frame_continues(&k->first, &h) < 0) {
          protocol_error(c, k, rid, -EPROTO, "split message mismatch");
          return 0;
        }
      } else {
        k->first = h;
        k->msg_len = 0;
      }
      if ((uint64_t)k->msg_len + h.length > c->max_message) {
        protocol_error(c, k, rid, -EMSGSIZE, "message larger than the server accepts");
        return 0;
      }
      if (k->msg_len + h.length > k->msg_cap) {
        size_t cap = k->msg_len + h.length;
        uint8_t *m = realloc(k->msg, cap ? cap : 8);
        if (!m) {
          protocol_error(c, k, rid, -ENOMEM, "out of memory for the message");
          return 0;
        }
        k->msg = m;
        k->msg_cap = cap;
      }
      k->in_message = (h.flags & KVS_PROTO_F_MORE) != 0;
      k->frame_left = h.length;
      k->reading_payload = true;
    }
    while (k->frame_left) {
      ssize_t r = rx_some(k, k->msg + k->msg_len, k->frame_left);
      if (r == -EAGAIN) return 0;
      if (r < 0) return rx_gone(c, k, (int)r);
      k->msg_len += (size_t)r;
      k->frame_left -= (size_t)r;
    }
    k->reading_payload = false;
    if (k->in_message) continue;
    dispatch(c, k, k->first.opcode, k->first.request_id, k->msg, k->msg_len);
    if (k->msg_cap > MSG_KEEP_BYTES) {
      free(k->msg);
      k->msg = NULL;
      k->msg_cap = 0;
    }
    k->msg_len = 0;
  }
  return 0;
}

static void service(kvs_coord_t *c, conn_t *k, uint32_t events) {
  int rc = 0;
  if (events & (EPOLLOUT | EPOLLIN)) rc = flush_tx(k);
  if (rc == 0 && (events & EPOLLIN)) rc = pump_rx(c, k);
  if (rc == 0) rc = flush_tx(k);
  if (rc == 0 && !k->tx_head && !k->closing && (events & (EPOLLRDHUP | EPOLLHUP)) &&
      !(events & EPOLLIN))
    rc = -ECONNRESET;
  if (rc < 0 || (k->closing && !k->tx_head)) {
    close_conn(c, k);
    return;
  }
  arm(c, k);
  /* A reply just went out and the peer may have pipelined more: read it now, from the socket
   * (after EPOLLOUT) or from what an earlier recvmsg left in the stash (no event will say so). */
  bool again = (events & EPOLLOUT) != 0;
  while (!k->tx_head && !k->closing && !k->deferred && (again || k->rx_pos < k->rx_len)) {
    again = false;
    rc = pump_rx(c, k);
    if (rc == 0) rc = flush_tx(k);
    if (rc < 0 || (k->closing && !k->tx_head)) {
      close_conn(c, k);
      return;
    }
    arm(c, k);
  }
}

static void listener_arm(kvs_coord_t *c, bool on) {
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->listen_fd};
  if (on == !c->accept_paused) return;
  epoll_ctl(c->epoll_fd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, c->listen_fd, &ev);
  c->accept_paused = !on;
}

/* accept4 failed for want of a descriptor (or kernel memory): stop listening for a while.
 * Clients wait in the backlog (their RPC deadline bounds it); our connections are served. */
static void accept_pause(kvs_coord_t *c, int err) {
  if (!c->accept_episode) {
    c->accept_episode = true;
    c->accept_backoff_ms = ACCEPT_BACKOFF_MIN_MS;
    kvs_stats_inc(c->stats, KVS_STAT_coord_accept_paused);
    kvs_log_warn("cannot accept connections: %s (%u open): pausing the listener, serving the "
                 "connections we have (raise `ulimit -n`)", strerror(-err),
                 __atomic_load_n(&c->n_conns, __ATOMIC_RELAXED));
  } else if (c->accept_backoff_ms < ACCEPT_BACKOFF_MAX_MS) {
    c->accept_backoff_ms *= 2;
    if (c->accept_backoff_ms > ACCEPT_BACKOFF_MAX_MS) c->accept_backoff_ms = ACCEPT_BACKOFF_MAX_MS;
  }
  c->accept_resume_ms = kvs__now_ms() + c->accept_backoff_ms;
  listener_arm(c, false);
}

static void accept_all(kvs_coord_t *c) {
  for (;;) {
    int fd;
    int rc = kvs_sock_accept(c->listen_fd, &fd);
    if (rc == -EMFILE || rc == -ENFILE || rc == -ENOBUFS || rc == -ENOMEM) {
      accept_pause(c, rc);
      return;
    }
    if (rc < 0) return;
    if (c->accept_episode) {
      c->accept_episode = false;
      kvs_log_info("accepting connections again");
    }
    conn_t *k = calloc(1, sizeof *k);
    if (!k) {
      close(fd);
      continue;
    }
    k->fd = fd;
    kvs_sock_peer_cred(fd, &k->uid, &k->pid);
    k->next = c->conns;
    c->conns = k;
    __atomic_fetch_add(&c->n_conns, 1, __ATOMIC_RELAXED);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = k};
    epoll_ctl(c->epoll_fd, EPOLL_CTL_ADD, fd, &ev);
    k->armed = ev.events;
    k->reading = true;
    kvs_stats_inc(c->stats, KVS_STAT_coord_connections);
    if (!kvs_options_uid_allowed(&c->uid_opts, k->uid)) {
      kvs_stats_inc(c->stats, KVS_STAT_coord_refused);
      kvs_log_warn("refused a connection from uid %u (pid %ld): not our uid and not in "
                   "KVSHIM_ALLOW_UIDS", (unsigned)k->uid, (long)k->pid);
      queue_error(c, k, 0, -EACCES, "uid not allowed");
      k->closing = true;
      service(c, k, EPOLLOUT);
    }
  }
}

/* Answer a deferred LOOKUP from the pool as it is now (a WATCH: its state, HELD when it timed
 * out unchanged), and read the connection again. */
static void finish_deferred(kvs_coord_t *c, deferred_t *d, bool timed_out) {
  for (deferred_t **pp = &c->deferred; *pp; pp = &(*pp)->next)
    if (*pp == d) {
      *pp = d->next;
      break;
    }
  conn_t *k = d->conn;
  k->deferred = false;
  if (d->watch) {
    int st = watch_state(c, k, d->keys, d->n_keys);
    c->n_watches--;
    reply_watch(c, k, d->request_id, st >= 0 ? (uint32_t)st : KVS_PROTO_WATCH_HELD);
  } else {
    if (timed_out) kvs_stats_inc(c->stats, KVS_STAT_remote_timeouts);
    reply_lookup(c, k, d->request_id, d->keys, d->n_keys);
  }
  free(d);
  service(c, k, EPOLLOUT); /* send it, then read what the peer pipelined meanwhile */
}

static void handle_done(kvs_coord_t *c) {
  uint64_t v;
  ssize_t r = read(c->done_fd, &v, sizeof v);
  (void)r;
  for (;;) {
    uint64_t token = 0;
    pthread_mutex_lock(&c->done_lock);
    if (c->n_done) token = c->done[--c->n_done];
    pthread_mutex_unlock(&c->done_lock);
    if (!token) return;
    for (deferred_t *d = c->deferred; d; d = d->next)
      if (!d->watch && d->token == token) {
        finish_deferred(c, d, false);
        break;
      }
  }
}

/* Milliseconds epoll may sleep: the sweep interval, or less when a deferred reply is due (a
 * WATCH: its next check). */
static int wait_ms(kvs_coord_t *c) {
  uint64_t now = kvs__now_ms(), due = now + (c->n_watches ? WATCH_TICK_MS : SWEEP_INTERVAL_MS);
  for (deferred_t *d = c->deferred; d; d = d->next)
    if (d->deadline_ms < due) due = d->deadline_ms;
  return due <= now ? 0 : (int)(due - now);
}

/* Answer every WATCH whose keys changed (the store is this process's: its engine thread or a
 * peer's request changed it). */
static void check_watches(kvs_coord_t *c) {
  for (;;) {
    deferred_t *ready = NULL;
    for (deferred_t *d = c->deferred; d && !ready; d = d->next)
      if (d->watch && watch_state(c, d->conn, d->keys, d->n_keys) >= 0) ready = d;
    if (!ready) return;
    finish_deferred(c, ready, false);
  }
}

static void expire_deferred(kvs_coord_t *c, uint64_t now) {
  for (;;) {
    deferred_t *due = NULL;
    for (deferred_t *d = c->deferred; d && !due; d = d->next)
      if (d->deadline_ms <= now) due = d;
    if (!due) return;
    finish_deferred(c, due, true);
  }
}

static void *coord_main(void *arg) {
  kvs_coord_t *c = arg;
  struct epoll_event evs[64];
  for (;;) {
    int timeout = wait_ms(c);
    if (c->accept_paused) {
      uint64_t t = kvs__now_ms();
      int until = c->accept_resume_ms <= t ? 0 : (int)(c->accept_resume_ms - t);
      if (until < timeout) timeout = until;
    }
    if (c->n_auto) { /* wake for the first AUTO_RELEASE deadline */
      uint64_t t = kvs__now_ms();
      for (conn_t *k = c->conns; k; k = k->next)
        if (k->auto_xfer) {
          int until = k->auto_until_ms <= t ? 0 : (int)(k->auto_until_ms - t);
          if (until < timeout) timeout = until;
        }
    }
    int n = epoll_wait(c->epoll_fd, evs, 64, timeout);
    uint64_t now = kvs__now_ms();
    if (c->n_auto) expire_auto(c, now);
    if (c->accept_paused && now >= c->accept_resume_ms) {
      listener_arm(c, true); /* level-triggered: a waiting client wakes us next round */
    }
    if (now >= c->next_sweep_ms) {
      kvs_store_sweep(c->store, now);
      c->next_sweep_ms = now + SWEEP_INTERVAL_MS;
    }
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == &c->stop_fd) return NULL;
      if (p == &c->listen_fd) accept_all(c);
      else if (p == &c->done_fd) handle_done(c);
      else service(c, p, evs[i].events);
    }
    if (c->n_watches) check_watches(c);
    if (c->deferred) expire_deferred(c, kvs__now_ms());
  }
}

void kvs_coord_remote_done(kvs_coord_t *c, uint64_t token) {
  if (!c || !token) return;
  pthread_mutex_lock(&c->done_lock);
  if (c->n_done == c->done_cap) { /* grow outside the hot path: tokens are few */
    size_t cap = c->done_cap ? c->done_cap * 2 : 64;
    uint64_t *d = realloc(c->done, cap * sizeof *d);
    if (d) c->done = d, c->done_cap = cap;
  }
  bool queued = c->n_done < c->done_cap;
  if (queued) c->done[c->n_done++] = token;
  pthread_mutex_unlock(&c->done_lock);
  /* A token that could not be queued is answered at its deadline instead. */
  uint64_t one = 1;
  if (queued) {
    ssize_t w = write(c->done_fd, &one, sizeof one);
    (void)w;
  }
}

/* ---- start / stop -------------------------------------------------------------------------- */

int kvs_coord_start(const kvs_coord_config_t *cfg, kvs_coord_t **out) {
  if (!cfg || !cfg->store || !cfg->opts || !cfg->instance_id || !out) return -EINVAL;
  const kvs_options_t *o = cfg->opts;
  kvs_coord_t *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->store = cfg->store;
  c->pool = cfg->pool;
  if (cfg->tensors && cfg->tensors->query) {
    c->tensors = *cfg->tensors;
    c->has_tensors = true;
  }
  c->stats = cfg->stats ? cfg->stats : kvs_stats_global();
  c->role = cfg->role ? cfg->role : KVS_PROTO_ROLE_ENGINE;
  c->strategy = (uint8_t)o->strategy;
  c->instance_id = cfg->instance_id;
  c->max_frame = (uint32_t)o->max_frame;
  uint64_t arena = c->pool ? kvs_pool_header(c->pool)->cache_size : 0;
  c->max_message = arena + (1u << 20) > c->max_frame ? arena + (1u << 20) : c->max_frame;
  snprintf(c->group, sizeof c->group, "%s", o->group);
  kvs_options_defaults(&c->uid_opts);
  memcpy(c->uid_opts.allow_uids, o->allow_uids, sizeof o->allow_uids);
  c->listen_fd = c->epoll_fd = c->stop_fd = c->done_fd = -1;
  if (cfg->remote && cfg->remote->fetch && cfg->remote->published) {
    c->remote = *cfg->remote;
    c->has_remote = true;
  }
  pthread_mutex_init(&c->done_lock, NULL);

  char dir[4096];
  int rc = -ENAMETOOLONG;
  if ((size_t)snprintf(dir, sizeof dir, "%s/%s", o->run_dir, o->group) >= sizeof dir) goto fail;
  rc = kvs_dir_ensure_private(o->run_dir);
  if (rc == 0) rc = kvs_dir_ensure_private(dir);
  if (rc < 0) {
    kvs_log_warn("run directory %s unusable (%s): no coordinator", dir, strerror(-rc));
    goto fail;
  }
  rc = kvs_coord_socket_name(o->run_dir, o->group, c->instance_id, c->path, sizeof c->path);
  if (rc < 0) {
    kvs_log_warn("socket path under %s is longer than %d bytes: no coordinator (set a shorter "
                 "KVSHIM_RUN_DIR)", dir, KVS_SOCK_PATH_MAX);
    goto fail;
  }
  rc = kvs_sock_listen(c->path, 128, &c->listen_fd);
  if (rc < 0) {
    kvs_log_warn("cannot listen on %s: %s", c->path, strerror(-rc));
    goto fail;
  }
  c->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  c->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  c->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (c->epoll_fd < 0 || c->stop_fd < 0 || c->done_fd < 0) {
    rc = -errno;
    goto fail_unlink;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->listen_fd};
  epoll_ctl(c->epoll_fd, EPOLL_CTL_ADD, c->listen_fd, &ev);
  ev.data.ptr = &c->stop_fd;
  epoll_ctl(c->epoll_fd, EPOLL_CTL_ADD, c->stop_fd, &ev);
  ev.data.ptr = &c->done_fd;
  epoll_ctl(c->epoll_fd, EPOLL_CTL_ADD, c->done_fd, &ev);
  /* The coordinator thread must not take signals meant for the engine. */
  rc = kvs__prim_thread_start(&c->thread, NULL, coord_main, c);
  if (rc < 0) goto fail_unlink;
  *out = c;
  return 0;
fail_unlink:
  unlink(c->path);
fail:
  if (c->listen_fd >= 0) close(c->listen_fd);
  if (c->epoll_fd >= 0) close(c->epoll_fd);
  if (c->stop_fd >= 0) close(c->stop_fd);
  if (c->done_fd >= 0) close(c->done_fd);
  pthread_mutex_destroy(&c->done_lock);
  free(c);
  return rc;
}

void kvs_coord_stop(kvs_coord_t *c) {
  if (!c) return;
  uint64_t one = 1;
  ssize_t w = write(c->stop_fd, &one, sizeof one);
  (void)w;
  pthread_join(c->thread, NULL);
  /* No new peers: the socket file goes first. */
  unlink(c->path);
  close(c->listen_fd);
  /* Drain: give pending replies a moment, then close everything. */
  uint64_t deadline = kvs__now_ms() + STOP_FLUSH_MS;
  for (conn_t *k = c->conns; k; k = k->next) {
    while (k->tx_head && kvs__now_ms() < deadline) {
      if (flush_tx(k) < 0) break;
      if (k->tx_head) usleep(1000);
    }
  }
  while (c->conns) close_conn(c, c->conns);
  close(c->epoll_fd);
  close(c->stop_fd);
  close(c->done_fd);
  pthread_mutex_destroy(&c->done_lock);
  free(c->done);
  kvs__free_poisoned(c, sizeof *c);
}

const char *kvs_coord_socket_path(const kvs_coord_t *c) { return c->path; }
unsigned kvs_coord_connections(kvs_coord_t *c) {
  return __atomic_load_n(&c->n_conns, __ATOMIC_RELAXED);
}
