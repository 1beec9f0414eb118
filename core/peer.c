/* kvshim peer: see peer.h. */
#include "peer.h"

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "coord.h"
#include "internal.h"
#include "log.h"
#include "pool.h"
#include "prim.h"
#include "proto.h"
#include "sock.h"
#include "tensor.h"

#define DISCOVER_INTERVAL_MS 200
#define MAX_REPLY_BYTES (2ull << 30)
#define PUSH_MAX_KEYS 256u
#define PENALTY_SLOTS 64
#define PENALTY_MIN_MS 1000u
#define PENALTY_MAX_MS 30000u

typedef struct pconn {
  struct pconn *next;
  pthread_mutex_t lock; /* serialises calls on fd */
  int fd;               /* -1 when dead */
  uint64_t next_rid;
  uint32_t peer_max_frame;
  uint32_t peer_caps;   /* the server's HELLO caps */
  kvs_peer_info_t info;
  kvs_pool_t *pool;     /* the peer's pool, mapped (SHM) or NULL (inline) */
  bool remote;          /* its HELLO offered KVS_PROTO_CAP_REMOTE (a serve with a remote tier) */
  uint64_t unread_rid;  /* a request sent with rpc_post whose reply is still unread (0: none) */
  /* Bytes read from fd but not consumed yet: a reply's header and a small payload arrive with
   * one recvmsg (the rest of a large payload is read straight into its buffer). */
  uint32_t rx_pos, rx_len;
  uint8_t rx[4096];
  uint16_t unread_op;
  unsigned refs;        /* callers using it outside the table lock; guarded by table lock */
  bool listed;          /* still in the table */
  /* The pool mapping registered with the accelerator's driver (pool_pin_start): pin_started
   * under the table lock; pin_ops, pin_stats set before the thread starts; pinned written by
   * the thread and read after pthread_join (conn_free). */
  bool pin_started;
  bool pinned;
  pthread_t pin_thread;
  const kvs_accel_ops_t *pin_ops;
  kvs_stats_t *pin_stats;
} pconn_t;

typedef struct push_item {
  struct push_item *next;
  uint32_t n;
  kvs_key_t keys[];
} push_item_t;

struct kvs_peers {
  kvs_options_t opts;
  char dir[4096];
  uint64_t instance_id;
  uint8_t role;
  kvs_store_t *local;
  kvs_stats_t *stats;
  pthread_mutex_t table_lock;   /* guards conns, refs, listed, has_cache, last_discover_ms */
  pthread_mutex_t discover_lock;/* one discovery at a time */
  pconn_t *conns;
  bool has_cache;
  uint64_t last_discover_ms;
  /* The group directory's modification time when the last scan began (discover_lock): a
   * socket created or removed since changes it, and the next discovery then scans at once
   * instead of waiting out DISCOVER_INTERVAL_MS (a peer that starts just after a scan is found
   * by the next lookup, not up to 200 ms later). */
  struct timespec dir_mtime;
  /* Peers that failed recently are not re-dialled before retry_at (1 s, doubling to 30 s): a
   * stuck peer that still accepts connections would otherwise cost every discovery a whole
   * RPC deadline on the engine's thread. Guarded by table_lock. */
  struct { uint64_t id, retry_at_ms; uint32_t backoff_ms; } penalty[PENALTY_SLOTS];
  /* write-behind */
  pthread_mutex_t push_lock;    /* guards the queue fields below */
  pthread_cond_t push_cond;
  push_item_t *q_head, *q_tail;
  uint32_t q_len, q_cap;
  bool push_busy, push_stop, push_thread_started;
  pthread_t push_thread;
  kvs_owner_t push_owner;
  uint32_t flush_ms;
};

static uint64_t deadline_of(const kvs_peers_t *p) {
  return kvs__now_ns() + (uint64_t)p->opts.rpc_timeout_ms * 1000000ull;
}

static void conn_kill(pconn_t *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  c->rx_pos = c->rx_len = 0;
}

/* Read exactly len bytes of c's stream into dst: what the stash holds first, then one recvmsg
 * into the stash for anything short (the rest of a payload larger than the stash straight into
 * dst). fd_out (may be NULL) gets an fd passed with the bytes read (a Unix stream never returns
 * bytes of two sendmsgs with different descriptors in one recvmsg, so an fd always comes with
 * the first bytes of its frame). 0 or a negative errno; on error an fd received is closed. */
static int rx_read(pconn_t *c, void *dst, size_t len, int *fd_out, uint64_t deadline) {
  uint8_t *d = dst;
  if (fd_out) *fd_out = -1;
  while (len) {
    if (c->rx_pos < c->rx_len) {
      size_t n = c->rx_len - c->rx_pos < len ? c->rx_len - c->rx_pos : len;
      memcpy(d, c->rx + c->rx_pos, n);
      c->rx_pos += (uint32_t)n;
      d += n, len -= n;
      continue;
    }
    c->rx_pos = c->rx_len = 0;
    bool direct = len >= sizeof c->rx;
    ssize_t r = kvs_sock_recv_some(c->fd, direct ? d : c->rx, direct ? len : sizeof c->rx,
                                   fd_out && *fd_out < 0 ? fd_out : NULL);
    if (r == -EAGAIN) {
      int w = kvs_sock_wait(c->fd, POLLIN, deadline);
      if (w == 0) continue;
      r = w;
    }
    if (r < 0) {
      if (fd_out && *fd_out >= 0) close(*fd_out), *fd_out = -1;
      return (int)r;
    }
    if (direct) d += r, len -= (size_t)r;
    else c->rx_len = (uint32_t)r;
  }
  return 0;
}

/* Send request rid (split at the peer's max_frame). 0 or a transport errno. */
static int send_request(pconn_t *c, uint16_t op, uint64_t rid, const void *req, size_t req_len,
                        uint64_t deadline) {
  uint32_t fmax = c->peer_max_frame ? c->peer_max_frame : KVS_PROTO_MIN_MAX_FRAME;
  size_t off = 0;
  for (;;) {
    kvs_proto_header_t h;
    KVS_TRY(kvs_proto_frame_header(op, 0, rid, req_len, off, fmax, &h));
    uint8_t hb[KVS_PROTO_HEADER_SIZE];
    kvs_proto_header_encode(&h, hb);
    struct iovec iov[2] = {{hb, sizeof hb}, {(char *)req + off, h.length}};
    KVS_TRY(kvs_sock_send_all(c->fd, iov, 2, -1, deadline));
    off += h.length;
    if (!(h.flags & KVS_PROTO_F_MORE)) return 0;
  }
}

/* Read the whole reply to request rid (op). Returns 0 with *reply (malloc'd, caller frees) and
 * *reply_len; 1 when the peer answered ERROR (its code in *code; nothing to free); or a
 * negative errno when the connection is unusable (nothing to free). fd_out (may be NULL) gets
 * an fd passed with the reply (-1 when none; closed again on failure). */
static int read_reply(kvs_peers_t *p, pconn_t *c, uint16_t op, uint64_t rid, uint64_t deadline,
                      bool wait_first, uint8_t **reply, size_t *reply_len, int *fd_out,
                      int *code) {
  if (fd_out) *fd_out = -1;
  kvs_proto_header_t want = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION, op, 0, rid, 0};
  kvs_proto_header_t first;
  uint8_t *buf = NULL;
  size_t len = 0;
  bool more = true, have_first = false;
  uint32_t limit = c->peer_max_frame ? (uint32_t)p->opts.max_frame : KVS_PROTO_MIN_MAX_FRAME;
  /* Right after a request the reply cannot be there yet: wait rather than try a read that
   * would fail. */
  int rc = wait_first && c->rx_pos == c->rx_len ? kvs_sock_wait(c->fd, POLLIN, deadline) : 0;
  while (rc == 0 && more) {
    uint8_t hb[KVS_PROTO_HEADER_SIZE];
    int got_fd = -1;
    rc = rx_read(c, hb, sizeof hb, have_first ? NULL : &got_fd, deadline);
    if (rc < 0) break;
    if (got_fd >= 0) {
      if (fd_out) *fd_out = got_fd;
      else close(got_fd);
    }
    kvs_proto_header_t h;
    rc = kvs_proto_header_decode(hb, sizeof hb, limit, &h);
    if (rc == 0) rc = have_first ? kvs_proto_frame_continues(&first, &h)
                                 : kvs_proto_reply_matches(&want, &h);
    if (rc < 0) break;
    if (!have_first) first = h, have_first = true;
    if (len + h.length > MAX_REPLY_BYTES) {
      rc = -EMSGSIZE;
      break;
    }
    uint8_t *nb = realloc(buf, len + h.length ? len + h.length : 8);
    if (!nb) {
      rc = -ENOMEM;
      break;
    }
    buf = nb;
    rc = rx_read(c, buf + len, h.length, NULL, deadline);
    len += h.length;
    more = (h.flags & KVS_PROTO_F_MORE) != 0;
  }
  if (rc == 0 && first.opcode == KVS_OP_ERROR) {
    kvs_proto_error_t e = {0};
    rc = kvs_proto_error_decode(buf, len, &e); /* a malformed ERROR: the connection goes */
    if (rc == 0) {
      kvs_log_debug("peer %016" PRIx64 " answered %s with %s: %.*s", c->info.instance_id,
                    kvs_proto_opcode_name(op), kvs_proto_strerror(e.code), (int)e.message_len,
                    e.message ? e.message : "");
      *code = e.code;
      rc = 1;
    }
  }
  if (rc != 0) {
    free(buf);
    if (fd_out && *fd_out >= 0) close(*fd_out), *fd_out = -1;
    return rc;
  }
  *reply = buf;
  *reply_len = len;
  return 0;
}

/* Read (and drop) the reply to a request sent with rpc_post. Its answer changes nothing for
 * anyone; an ERROR in it is ignored. 0 or a transport errno. */
static int drain(kvs_peers_t *p, pconn_t *c, uint64_t deadline) {
  if (!c->unread_rid) return 0;
  uint8_t *buf = NULL;
  size_t len = 0;
  int code = 0;
  int rc = read_reply(p, c, c->unread_op, c->unread_rid, deadline, false, &buf, &len, NULL, &code);
  c->unread_rid = 0;
  if (rc == 0) free(buf);
  return rc < 0 ? rc : 0;
}

/* Hold instance id off (table_lock not held by the caller). */
static void penalize(kvs_peers_t *p, uint64_t id) {
  uint64_t now = kvs__now_ms();
  pthread_mutex_lock(&p->table_lock);
  int slot = -1, oldest = 0;
  for (int i = 0; i < PENALTY_SLOTS; i++) {
    if (p->penalty[i].id == id) { slot = i; break; }
    if (p->penalty[i].retry_at_ms < p->penalty[oldest].retry_at_ms) oldest = i;
  }
  if (slot < 0) {
    slot = oldest;
    p->penalty[slot].id = id;
    p->penalty[slot].backoff_ms = 0;
  }
  uint32_t b = p->penalty[slot].backoff_ms;
  b = b ? (b * 2 > PENALTY_MAX_MS ? PENALTY_MAX_MS : b * 2) : PENALTY_MIN_MS;
  p->penalty[slot].backoff_ms = b;
  p->penalty[slot].retry_at_ms = now + b;
  pthread_mutex_unlock(&p->table_lock);
}

/* With table_lock held: is id held off now? A successful dial clears it (clear = true). */
static bool penalized(kvs_peers_t *p, uint64_t id, uint64_t now, bool clear) {
  for (int i = 0; i < PENALTY_SLOTS; i++)
    if (p->penalty[i].id == id) {
      if (clear) p->penalty[i].id = 0, p->penalty[i].retry_at_ms = 0, p->penalty[i].backoff_ms = 0;
      return !clear && now < p->penalty[i].retry_at_ms;
    }
  return false;
}

static int conn_failed(kvs_peers_t *p, pconn_t *c, uint16_t op, int rc) {
  kvs_stats_inc(p->stats, KVS_STAT_peer_errors);
  penalize(p, c->info.instance_id);
  kvs_log_debug("peer %016" PRIx64 ": %s failed (%s); connection closed", c->info.instance_id,
                kvs_proto_opcode_name(op), strerror(-rc));
  conn_kill(c);
  c->unread_rid = 0;
  return rc;
}

/* One request/response on a connection (caller holds c->lock). *reply is malloc'd (caller
 * frees) and holds the whole reply payload. fd_out (may be NULL) gets an fd passed with the
 * reply. Returns 0, the ERROR code the peer sent (connection kept), or another negative errno
 * (connection closed). */
static int rpc(kvs_peers_t *p, pconn_t *c, uint16_t op, const void *req, size_t req_len,
               uint8_t **reply, size_t *reply_len, int *fd_out) {
  if (fd_out) *fd_out = -1;
  if (c->fd < 0) return -ENOTCONN;
  uint64_t deadline = deadline_of(p);
  uint64_t rid = ++c->next_rid;
  int code = 0;
  /* Send first: a posted request's reply comes before ours, and the peer works on both while
   * we read the first. */
  int rc = send_request(c, op, rid, req, req_len, deadline);
  if (rc == 0) rc = drain(p, c, deadline);
  if (rc == 0) rc = read_reply(p, c, op, rid, deadline, true, reply, reply_len, fd_out, &code);
  if (rc < 0) return conn_failed(p, c, op, rc);
  return rc == 1 ? (code < 0 ? code : -EIO) : 0;
}

/* Send a request whose answer nobody waits for (COMMIT_RETRIEVE: the unpin happens when the
 * peer reads it, in order; its empty reply is read by the next call on this connection). This
 * takes one round trip off the caller's path. Only for requests with tiny replies: the next
 * call sends before it reads, which must never wait on a peer blocked sending a large reply.
 * 0 or a negative errno (connection closed). */
static int rpc_post(kvs_peers_t *p, pconn_t *c, uint16_t op, const void *req, size_t req_len) {
  if (c->fd < 0) return -ENOTCONN;
  uint64_t deadline = deadline_of(p);
  uint64_t rid = ++c->next_rid;
  int rc = send_request(c, op, rid, req, req_len, deadline);
  if (rc == 0) rc = drain(p, c, deadline);
  if (rc < 0) return conn_failed(p, c, op, rc);
  c->unread_rid = rid;
  c->unread_op = op;
  return 0;
}

/* Encode with a size query and call; rc gets 0 or a negative errno (a statement, ISO C). */
#define RPC_ENCODED(rc, p, c, op, encfn, msgp, reply, reply_len)                              \
  do {                                                                                        \
    size_t n_ = 0;                                                                            \
    int r_ = encfn((msgp), NULL, 0, &n_);                                                     \
    uint8_t *b_ = r_ == 0 ? malloc(n_ ? n_ : 1) : NULL;                                       \
    if (r_ == 0) r_ = b_ ? encfn((msgp), b_, n_, &n_) : -ENOMEM;                              \
    if (r_ == 0) r_ = rpc((p), (c), (op), b_, n_, (reply), (reply_len), NULL);                \
    free(b_);                                                                                 \
    (rc) = r_;                                                                                \
  } while (0)

/* Connect and HELLO. Returns a new connection (not in the table) or NULL. */
static pconn_t *dial(kvs_peers_t *p, const char *path, uint64_t id) {
  int fd;
  int rc = kvs_sock_connect(path, deadline_of(p), &fd);
  if (rc == -ECONNREFUSED) {
    (void)kvs_sock_remove_stale(path); /* kept while bound: its process may not listen yet */
    return NULL;
  }
  if (rc < 0) {
    if (rc != -ENOENT) penalize(p, id); /* e.g. a full backlog that never drains */
    return NULL;
  }
  pconn_t *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return NULL;
  }
  pthread_mutex_init(&c->lock, NULL);
  c->fd = fd;
  snprintf(c->info.path, sizeof c->info.path, "%.127s", path);
  c->info.instance_id = id;

  kvs_proto_hello_t me;
  memset(&me, 0, sizeof me);
  me.version_min = KVS_PROTO_VERSION_MIN;
  me.version_max = KVS_PROTO_VERSION_MAX;
  me.role = p->role;
  me.strategy_requested = (uint8_t)p->opts.strategy;
  me.strategy_chosen = KVS_PROTO_STRATEGY_AUTO;
  me.pid = (uint32_t)getpid();
  me.caps = KVS_PROTO_CAP_SHM | KVS_PROTO_CAP_INLINE | KVS_PROTO_CAP_SKIPPED |
            KVS_PROTO_CAP_MAX_MESSAGE | KVS_PROTO_CAP_AUTO_RELEASE;
  me.instance_id = p->instance_id;
  me.max_frame = (uint32_t)p->opts.max_frame;
  snprintf(me.group, sizeof me.group, "%.64s", p->opts.group);
  uint8_t req[256], *rep = NULL;
  size_t n = 0, rn = 0;
  int pool_fd = -1;
  kvs_proto_hello_t h;
  rc = kvs_proto_hello_encode(&me, req, sizeof req, &n);
  if (rc == 0) rc = rpc(p, c, KVS_OP_HELLO, req, n, &rep, &rn, &pool_fd);
  if (rc == 0) rc = kvs_proto_hello_decode(rep, rn, &h);
  if (rc == 0) rc = kvs_proto_hello_check(&h, true);
  free(rep);
  if (rc < 0) {
    if (pool_fd >= 0) close(pool_fd);
    kvs_log_info("HELLO to %s failed: %s", path, kvs_proto_strerror(rc));
    conn_kill(c);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return NULL;
  }
  c->peer_max_frame = h.max_frame;
  c->peer_caps = h.caps;
  c->info.pid = h.pid;
  c->info.role = h.role;
  c->info.instance_id = h.instance_id;
  c->info.pool_segment_size = h.pool_segment_size;
  c->info.arena_size = h.pool_arena_size;
  c->info.arena_used = h.pool_arena_used;
  c->info.strategy = KVS_PROTO_STRATEGY_INLINE;
  c->remote = (h.caps & KVS_PROTO_CAP_REMOTE) != 0;
  if (h.strategy_chosen == KVS_PROTO_STRATEGY_SHM && pool_fd >= 0) {
    if (kvs_pool_attach(pool_fd, true, &c->pool) == 0)
      c->info.strategy = KVS_PROTO_STRATEGY_SHM;
    else
      kvs_log_info("cannot map the pool of %s: using inline transfers", path);
  }
  if (pool_fd >= 0) close(pool_fd); /* the mapping keeps the segment */
  return c;
}

static void pool_unpin(pconn_t *c);

static void conn_free(pconn_t *c) {
  conn_kill(c);
  pool_unpin(c); /* before the mapping goes: never a registration on an unmapped range */
  kvs_pool_destroy(c->pool, true);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static void unref(kvs_peers_t *p, pconn_t *c) {
  pthread_mutex_lock(&p->table_lock);
  bool dead = --c->refs == 0 && !c->listed;
  pthread_mutex_unlock(&p->table_lock);
  if (dead) conn_free(c);
}

/* Parse "<16 hex>.sock". */
static void pool_pin_start(kvs_peers_t *p, pconn_t *c);

static int parse_sock_name(const char *name, uint64_t *id) {
  if (strlen(name) != 21 || strcmp(name + 16, ".sock") != 0) return -EINVAL;
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) {
    char ch = name[i];
    unsigned d = ch >= '0' && ch <= '9' ? (unsigned)(ch - '0')
                 : ch >= 'a' && ch <= 'f' ? (unsigned)(ch - 'a' + 10) : 16u;
    if (d > 15) return -EINVAL;
    v = v << 4 | d;
  }
  *id = v;
  return 0;
}

int kvs_peers_discover(kvs_peers_t *p, bool force) {
  pthread_mutex_lock(&p->discover_lock);
  uint64_t now = kvs__now_ms();
  pthread_mutex_lock(&p->table_lock);
  bool recent = !force && p->last_discover_ms && now - p->last_discover_ms < DISCOVER_INTERVAL_MS;
  pthread_mutex_unlock(&p->table_lock);
  struct stat dst;
  bool dir_known = stat(p->dir, &dst) == 0;
  if (recent && dir_known && (dst.st_mtim.tv_sec != p->dir_mtime.tv_sec ||
                              dst.st_mtim.tv_nsec != p->dir_mtime.tv_nsec))
    recent = false; /* the directory changed since the last scan: a peer came or went */
  if (!recent) {
    if (dir_known) p->dir_mtime = dst.st_mtim; /* before the scan: a later change rescans */
    DIR *d = opendir(p->dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
      uint64_t id;
      if (parse_sock_name(e->d_name, &id) < 0 || id == p->instance_id) continue;
      bool have = false;
      pthread_mutex_lock(&p->table_lock);
      for (pconn_t *c = p->conns; c && !have; c = c->next)
        have = c->info.instance_id == id && c->fd >= 0;
      bool held_off = !have && penalized(p, id, now, false);
      pthread_mutex_unlock(&p->table_lock);
      if (have) continue;
      char path[4400];
      snprintf(path, sizeof path, "%s/%s", p->dir, e->d_name);
      if (held_off) { /* no HELLO to a peer that failed lately; still notice when it is gone */
        int fd;
        int rc = kvs_sock_connect(path, kvs__now_ns() + 50000000ull, &fd);
        if (rc == -ECONNREFUSED) {
          (void)kvs_sock_remove_stale(path);
        } else if (rc == 0) {
          close(fd);
        }
        continue;
      }
      pconn_t *c = dial(p, path, id); /* no lock held across the I/O */
      if (!c) continue;
      pthread_mutex_lock(&p->table_lock);
      penalized(p, id, now, true);
      c->listed = true;
      c->next = p->conns;
      p->conns = c;
      pthread_mutex_unlock(&p->table_lock);
    }
    if (d) closedir(d);
  }
  /* Forget dead connections; recompute whether a cache peer is there. A cache peer is adopted
   * here: its pool mapping is registered with the accelerator (pool_pin_start), now or, when
   * the accelerator is installed later, at the next discovery (every lookup runs one). */
  pconn_t *graveyard = NULL;
  int live = 0;
  pthread_mutex_lock(&p->table_lock);
  p->has_cache = false;
  for (pconn_t **pp = &p->conns; *pp;) {
    pconn_t *c = *pp;
    if (c->fd < 0) {
      *pp = c->next;
      c->listed = false;
      if (c->refs == 0) c->next = graveyard, graveyard = c;
      continue;
    }
    live++;
    if (c->info.role == KVS_PROTO_ROLE_CACHE) {
      p->has_cache = true;
      pool_pin_start(p, c);
    }
    pp = &c->next;
  }
  if (!recent) p->last_discover_ms = now;
  pthread_mutex_unlock(&p->table_lock);
  pthread_mutex_unlock(&p->discover_lock);
  while (graveyard) {
    pconn_t *c = graveyard;
    graveyard = c->next;
    conn_free(c);
  }
  return live;
}

int kvs_peers_list(kvs_peers_t *p, kvs_peer_info_t *out, size_t cap) {
  int n = 0;
  pthread_mutex_lock(&p->table_lock);
  for (pconn_t *c = p->conns; c; c = c->next) {
    if (c->fd < 0) continue;
    if ((size_t)n < cap) out[n] = c->info;
    n++;
  }
  pthread_mutex_unlock(&p->table_lock);
  return n;
}

/* Take a reference on the live connection to instance (0 = cache peer, else first live). */
static pconn_t *grab(kvs_peers_t *p, uint64_t instance, bool prefer_cache) {
  pconn_t *pick = NULL;
  pthread_mutex_lock(&p->table_lock);
  for (pconn_t *c = p->conns; c; c = c->next) {
    if (c->fd < 0) continue;
    if (instance) {
      if (c->info.instance_id == instance) { pick = c; break; }
    } else if (!pick || (prefer_cache && c->info.role == KVS_PROTO_ROLE_CACHE &&
                         pick->info.role != KVS_PROTO_ROLE_CACHE)) {
      pick = c;
    }
  }
  if (pick) pick->refs++;
  pthread_mutex_unlock(&p->table_lock);
  return pick;
}

/* How long a server may wait before it replies (a LOOKUP's remote_wait_ms, a WATCH's wait_ms):
 * three quarters of our deadline, leaving it a quarter to send the reply (docs/protocol.md
 * 4.3, 4.12). */
static uint32_t reply_wait_ms(const kvs_peers_t *p) {
  return (uint32_t)(p->opts.rpc_timeout_ms - p->opts.rpc_timeout_ms / 4);
}

static int lookup_one(kvs_peers_t *p, pconn_t *c, const kvs_key_t *keys, size_t n) {
  /* A serve with a remote tier may fetch what it lacks within reply_wait_ms. Other peers get
   * 0, as protocol v1 requires. */
  uint32_t wait = reply_wait_ms(p);
  kvs_proto_lookup_t m = {.n_keys = (uint32_t)n, .keys = keys,
                          .remote_wait_ms = c->remote ? (wait ? wait : 1) : 0};
  uint8_t *rep = NULL;
  size_t rn = 0;
  pthread_mutex_lock(&c->lock);
  kvs_stats_inc(p->stats, KVS_STAT_peer_lookups);
  int rc;
  RPC_ENCODED(rc, p, c, KVS_OP_LOOKUP, kvs_proto_lookup_encode, &m, &rep, &rn);
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
  kvs_peers_discover(p, false);
  /* Snapshot the live ids, then ask each without the table lock. */
  uint64_t ids[64];
  int n_ids = 0;
  pthread_mutex_lock(&p->table_lock);
  for (pconn_t *c = p->conns; c && n_ids < 64; c = c->next)
    if (c->fd >= 0) ids[n_ids++] = c->info.instance_id;
  pthread_mutex_unlock(&p->table_lock);
  int run = 0;
  for (int i = 0; i < n_ids && (size_t)run < n; i++) {
    pconn_t *c = grab(p, ids[i], false);
    if (!c) continue;
    int r = lookup_one(p, c, keys, n);
    unref(p, c);
    if (r > run) {
      run = r;
      if (best) *best = ids[i];
    }
  }
  return run;
}

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

/* The one live peer, when there is exactly one and a LOOKUP could not tell it more than its
 * PREPARE_RETRIEVE will (no remote tier: only a LOOKUP's remote_wait_ms asks a serve to consult
 * it, docs/protocol.md 4.3); 0 otherwise. */
static uint64_t sole_peer(kvs_peers_t *p) {
  uint64_t id = 0;
  int live = 0;
  pthread_mutex_lock(&p->table_lock);
  for (pconn_t *c = p->conns; c; c = c->next)
    if (c->fd >= 0 && live++ == 0 && !c->remote) id = c->info.instance_id;
  pthread_mutex_unlock(&p->table_lock);
  return live == 1 ? id : 0;
}

/* ---- inline replies read straight into the caller's buffers ------------------------------- */

typedef struct into {
  void *const *bufs;
  const uint64_t *caps;
  uint64_t *lens;
} into_t;

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
      KVS_TRY(rx_read(c, hb, sizeof hb, NULL, deadline));
      KVS_TRY(kvs_proto_header_decode(hb, sizeof hb, mr->limit, &h));
      KVS_TRY(kvs_proto_frame_continues(&mr->first, &h));
      mr->left = h.length;
      mr->more = (h.flags & KVS_PROTO_F_MORE) != 0;
      continue;
    }
    size_t k = n < mr->left ? (size_t)n : mr->left;
    if (!d && k > sizeof scratch) k = sizeof scratch;
    KVS_TRY(rx_read(c, d ? d : scratch, k, NULL, deadline));
    if (d) d += k;
    mr->left -= k;
    n -= k;
  }
  return 0;
}

/* PREPARE_RETRIEVE (inline) on c, its reply's objects received straight into into's buffers
 * (c->lock held). *delivered gets the keys delivered, r the reply's head. Returns 0, the ERROR
 * code the peer sent (connection kept), or another negative errno (connection closed). */
static int retrieve_inline_into(kvs_peers_t *p, pconn_t *c, const kvs_proto_prepare_retrieve_t *m,
                                kvs_proto_object_t *objs, size_t cap, const into_t *into,
                                kvs_proto_prepare_retrieve_reply_t *r, int *delivered) {
  *delivered = 0;
  if (c->fd < 0) return -ENOTCONN;
  uint64_t deadline = deadline_of(p);
  uint64_t rid = ++c->next_rid;
  size_t qn = 0;
  int rc = kvs_proto_prepare_retrieve_encode(m, NULL, 0, &qn);
  uint8_t *q = rc == 0 ? malloc(qn) : NULL;
  if (rc == 0) rc = q ? kvs_proto_prepare_retrieve_encode(m, q, qn, &qn) : -ENOMEM;
  if (rc < 0) {
    free(q);
    return rc;
  }
  rc = send_request(c, KVS_OP_PREPARE_RETRIEVE, rid, q, qn, deadline);
  free(q);
  if (rc == 0) rc = drain(p, c, deadline);
  if (rc == 0 && c->rx_pos == c->rx_len) rc = kvs_sock_wait(c->fd, POLLIN, deadline);
  uint8_t hb[KVS_PROTO_HEADER_SIZE];
  mreader_t mr = {.limit = c->peer_max_frame ? (uint32_t)p->opts.max_frame
                                             : KVS_PROTO_MIN_MAX_FRAME};
  if (rc == 0) rc = rx_read(c, hb, sizeof hb, NULL, deadline);
  if (rc == 0) rc = kvs_proto_header_decode(hb, sizeof hb, mr.limit, &mr.first);
  kvs_proto_header_t want = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION, KVS_OP_PREPARE_RETRIEVE, 0, rid, 0};
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
    return conn_failed(p, c, KVS_OP_PREPARE_RETRIEVE, rc);
  }
  return 0;
}

static int into_sink(void *ctx, size_t i, const kvs_layout_t *l, const void *bytes, uint64_t len) {
  const into_t *t = ctx;
  (void)l;
  if (len > t->caps[i]) return -ENOBUFS;
  kvs_peers_copy(t->bufs[i], bytes, (size_t)len);
  t->lens[i] = len;
  return 0;
}

static int retrieve(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    kvs_peer_sink_fn sink, void *ctx, const into_t *into);

int kvs_peers_retrieve(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                       kvs_peer_sink_fn sink, void *ctx) {
  return retrieve(p, instance, keys, n, sink, ctx, NULL);
}

int kvs_peers_retrieve_into(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                            void *const *bufs, const uint64_t *caps, uint64_t *lens) {
  if (!bufs || !caps || !lens) return -EINVAL;
  into_t t = {bufs, caps, lens};
  for (size_t i = 0; i < n && i < KVS_PROTO_MAX_KEYS; i++) lens[i] = 0;
  return retrieve(p, instance, keys, n, into_sink, &t, &t);
}

static int retrieve(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    kvs_peer_sink_fn sink, void *ctx, const into_t *into) {
  if (!keys || n == 0 || !sink) return -EINVAL;
  if (n > KVS_PROTO_MAX_KEYS) n = KVS_PROTO_MAX_KEYS;
  /* With one peer to ask, its PREPARE_RETRIEVE is the lookup: it pins and describes the
   * leading run it holds (n_found), so the retrieve takes one round trip, not two
   * (docs/protocol.md 6, "SHM retrieve"). It stands in for the LOOKUP in peer_lookups; an
   * empty run is a lookup miss, as before (not a peer_misses). With several peers, LOOKUP
   * each and retrieve from the longest run. */
  bool asked = false;
  if (!instance) {
    kvs_peers_discover(p, false);
    instance = sole_peer(p);
    asked = instance != 0;
  }
  if (!instance) {
    int run = kvs_peers_lookup(p, keys, n, &instance);
    if (run <= 0 || !instance) return 0;
    n = (size_t)run;
  }
  pconn_t *c = grab(p, instance, false);
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
    rc = retrieve_inline_into(p, c, &m, objs, n, into, &r, &delivered);
  else if (objs)
    RPC_ENCODED(rc, p, c, KVS_OP_PREPARE_RETRIEVE, kvs_proto_prepare_retrieve_encode, &m, &rep,
                &rn);
  if (rc == 0 && !streamed) rc = kvs_proto_prepare_retrieve_reply_decode(rep, rn, objs, n, &r);
  if (rc == 0 && !streamed) {
    uint64_t seg = c->pool ? kvs_pool_segment_size(c->pool) : 0;
    const uint8_t *base = c->pool ? kvs_pool_base(c->pool) : NULL;
    for (uint32_t i = 0; i < r.n_objects; i++) {
      const kvs_proto_object_t *o = &objs[i];
      if (o->key_index != (uint32_t)delivered) break; /* only the leading run */
      const void *bytes;
      if (r.is_inline) {
        bytes = o->data;
      } else {
        if (!base || o->offset > seg || o->length > seg - o->offset) {
          rc = -EFAULT; /* a peer pointing outside its own pool: stop, report a miss */
          break;
        }
        bytes = base + o->offset;
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
          if (!r.pin_ms) rpc_post(p, c, KVS_OP_COMMIT_RETRIEVE, b, n2);
        } else {
          uint8_t *cr = NULL;
          size_t crn = 0;
          int v = rpc(p, c, KVS_OP_COMMIT_RETRIEVE, b, n2, &cr, &crn, NULL);
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
  unref(p, c);
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
  RPC_ENCODED(rc, p, c, KVS_OP_PREPARE_STORE, kvs_proto_prepare_store_encode, &m, rep, &rn);
  if (rc == 0) rc = kvs_proto_prepare_store_reply_decode(*rep, rn, r);
  if (rc < 0) {
    free(*rep);
    *rep = NULL;
  }
  return rc;
}

/* SHM store, after the PREPARE_STORE reply r (in rep, freed here): copy into the peer's pool,
 * commit naming every slot. */
static int store_shm(kvs_peers_t *p, pconn_t *c, uint8_t *rep,
                     const kvs_proto_prepare_store_reply_t *rp, bool object,
                     const void *const *bufs, uint8_t *outcomes, kvs_peer_copy_fn copy,
                     void *cctx) {
  const kvs_proto_prepare_store_reply_t r = *rp;
  int rc = 0;
  uint64_t seg = kvs_pool_segment_size(c->pool);
  uint8_t *base = kvs_pool_base(c->pool);
  int kept = 0;
  for (uint32_t i = 0; i < r.n_outcomes; i++) {
    if (outcomes) outcomes[i] = r.outcomes[i];
    if (r.outcomes[i] == KVS_RES_PRESENT) kept++;
  }
  for (uint32_t i = 0; i < r.n_slots; i++) {
    const kvs_proto_slot_t *s = &r.slots[i];
    if (s->offset > seg || s->length > seg - s->offset) {
      rc = -EFAULT;
      break;
    }
    const void *src = bufs[object ? 0 : s->key_index];
    if (!copy) memcpy(base + s->offset, src, s->length);
    else if ((rc = copy(cctx, s->key_index, base + s->offset, src, s->length)) < 0) break;
  }
  if (r.xfer) {
    uint8_t *r2 = NULL;
    size_t n2 = 0;
    if (rc == 0) {
      kvs_proto_commit_store_t cm = {0};
      cm.xfer = r.xfer;
      cm.n_slots = r.n_slots;
      cm.slots = r.slots;
      RPC_ENCODED(rc, p, c, KVS_OP_COMMIT_STORE, kvs_proto_commit_store_encode, &cm, &r2, &n2);
      if (rc == 0) kept += (int)r.n_slots;
    } else {
      kvs_proto_xfer_t x = {r.xfer};
      int arc; /* an abort that fails only costs the peer a lease */
      RPC_ENCODED(arc, p, c, KVS_OP_ABORT, kvs_proto_xfer_encode, &x, &r2, &n2);
      (void)arc;
    }
    free(r2);
  }
  free(rep);
  return rc < 0 ? rc : kept;
}

/* Inline store, after the PREPARE_STORE reply r (in rep, freed here) said which keys to send:
 * send them with the commit. */
static int store_inline(kvs_peers_t *p, pconn_t *c, uint8_t *rep,
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
      rc = rpc(p, c, KVS_OP_COMMIT_STORE, buf, len, &r2, &n2, NULL);
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

/* kvs_peers_store, with a copy function (NULL: memcpy; else SHM peers only: -ENOTSUP). */
static int store_with(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                      const kvs_layout_t *layout, bool object, const void *const *bufs,
                      uint8_t *outcomes, kvs_peer_copy_fn copy, void *cctx) {
  if (!keys || n == 0 || n > KVS_PROTO_MAX_KEYS || !layout || !bufs) return -EINVAL;
  if (!kvs_layout_nbytes(layout)) return -EINVAL;
  if (!instance) kvs_peers_discover(p, false);
  pconn_t *c = grab(p, instance, true);
  if (!c) return -ENOENT;
  pthread_mutex_lock(&c->lock);
  bool shm = c->pool != NULL && p->opts.strategy != KVS_STRATEGY_INLINE;
  if (copy && !shm) {
    pthread_mutex_unlock(&c->lock);
    unref(p, c);
    return -ENOTSUP;
  }
  uint8_t *rep;
  kvs_proto_prepare_store_reply_t r;
  int rc = prepare_store(p, c, shm ? KVS_PROTO_STRATEGY_SHM : KVS_PROTO_STRATEGY_INLINE, keys, n,
                         layout, object, &rep, &r);
  if (rc >= 0)
    rc = shm ? store_shm(p, c, rep, &r, object, bufs, outcomes, copy, cctx)
             : store_inline(p, c, rep, &r, keys, n, layout, object, bufs, outcomes);
  pthread_mutex_unlock(&c->lock);
  unref(p, c);
  if (rc > 0) kvs_stats_add(p->stats, KVS_STAT_peer_stores, (uint64_t)rc);
  return rc;
}

int kvs_peers_store(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    const kvs_layout_t *layout, bool object, const void *const *bufs,
                    uint8_t *outcomes) {
  return store_with(p, instance, keys, n, layout, object, bufs, outcomes, NULL, NULL);
}

/* One call to peer `instance` on its own: rc gets 0, -ENOENT (no such live peer) or the
 * call's negative errno; on 0 *reply (the caller frees it) holds *reply_len bytes. */
#define RPC_TO(rc, p, instance, op, encfn, msgp, reply, reply_len)                            \
  do {                                                                                        \
    pconn_t *c_ = grab((p), (instance), false);                                               \
    (rc) = -ENOENT;                                                                           \
    if (c_) {                                                                                 \
      pthread_mutex_lock(&c_->lock);                                                          \
      RPC_ENCODED(rc, p, c_, op, encfn, msgp, reply, reply_len);                              \
      pthread_mutex_unlock(&c_->lock);                                                        \
      unref((p), c_);                                                                         \
    }                                                                                         \
  } while (0)

int kvs_peers_stats(kvs_peers_t *p, uint64_t instance, bool json, char *buf, size_t cap) {
  if (!buf || cap == 0) return -EINVAL;
  kvs_proto_stats_t m = {json ? KVS_PROTO_STATS_JSON : KVS_PROTO_STATS_INFO};
  uint8_t *rep = NULL;
  size_t rn = 0;
  int rc;
  RPC_TO(rc, p, instance, KVS_OP_STATS, kvs_proto_stats_encode, &m, &rep, &rn);
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
  kvs_proto_ping_t m = {nonce, 0, NULL};
  uint8_t *rep = NULL;
  size_t rn = 0;
  int rc;
  RPC_TO(rc, p, instance, KVS_OP_PING, kvs_proto_ping_encode, &m, &rep, &rn);
  kvs_proto_ping_t r;
  if (rc == 0) rc = kvs_proto_ping_decode(rep, rn, &r);
  if (rc == 0 && r.nonce != nonce) rc = -EPROTO;
  free(rep);
  return rc;
}

int kvs_peers_report_bad(kvs_peers_t *p, uint64_t instance, kvs_key_t key, uint64_t len,
                         uint64_t checksum) {
  if (!p || !instance || !len) return -EINVAL;
  pconn_t *c = grab(p, instance, false);
  if (!c) return -ENOENT;
  int rc = -EOPNOTSUPP; /* a peer that predates REPORT_BAD would close the connection on it */
  uint8_t *rep = NULL;
  size_t rn = 0;
  if (c->peer_caps & KVS_PROTO_CAP_REPORT_BAD) {
    kvs_proto_report_t m = {key, len, checksum};
    kvs_stats_inc(p->stats, KVS_STAT_peer_bad_reports);
    pthread_mutex_lock(&c->lock);
    RPC_ENCODED(rc, p, c, KVS_OP_REPORT_BAD, kvs_proto_report_encode, &m, &rep, &rn);
    pthread_mutex_unlock(&c->lock);
  }
  unref(p, c);
  kvs_proto_report_reply_t r;
  if (rc == 0) rc = kvs_proto_report_reply_decode(rep, rn, &r);
  free(rep);
  return rc < 0 ? rc : (int)r.dropped;
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
  for (;;) {
    while (!p->q_head && !p->push_stop) pthread_cond_wait(&p->push_cond, &p->push_lock);
    if (!p->q_head) break;
    push_item_t *it = p->q_head;
    p->q_head = it->next;
    if (!p->q_head) p->q_tail = NULL;
    p->q_len--;
    p->push_busy = true;
    pthread_mutex_unlock(&p->push_lock);
    kvs_peers_discover(p, false);
    if (p->has_cache) push_one(p, it);
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
  kvs_peers_discover(p, false);
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
    if (!p->push_thread_started)
      p->push_thread_started = kvs__prim_thread_start(&p->push_thread, NULL, push_main, p) == 0;
    if (p->q_tail) p->q_tail->next = it;
    else p->q_head = it;
    p->q_tail = it;
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
  *out = p;
  return 0;
}

void kvs_peers_destroy(kvs_peers_t *p) {
  if (!p) return;
  if (p->push_thread_started) {
    int left = kvs_peers_flush(p, p->flush_ms);
    pthread_mutex_lock(&p->push_lock);
    p->push_stop = true;
    /* What did not make it in time is dropped, and counted. */
    while (p->q_head) {
      push_item_t *it = p->q_head;
      p->q_head = it->next;
      free(it);
      kvs_stats_inc(p->stats, KVS_STAT_push_dropped);
    }
    p->q_tail = NULL;
    p->q_len = 0;
    pthread_cond_broadcast(&p->push_cond);
    pthread_mutex_unlock(&p->push_lock);
    pthread_join(p->push_thread, NULL);
    if (left) kvs_log_info("write-behind: %d objects not pushed at exit", left);
  }
  if (p->push_owner) kvs_store_owner_release(p->local, p->push_owner);
  while (p->conns) {
    pconn_t *c = p->conns;
    p->conns = c->next;
    conn_free(c);
  }
  pthread_mutex_destroy(&p->table_lock);
  pthread_mutex_destroy(&p->discover_lock);
  pthread_mutex_destroy(&p->push_lock);
  pthread_cond_destroy(&p->push_cond);
  free(p);
}

/* ---- one copy per node (design §3.5): the engine side's helpers --------------------------- */

/* The cache peer's pool mapping registered with the accelerator's driver, so the device copies
 * from and to it by DMA instead of through the driver's staging buffers. Registration faults in
 * and page-locks the whole mapping (serve prefaults its pool anyway), which takes long for a
 * large pool: one thread at nice 19 does it, never the engine's call. The mapping is
 * writable (stores copy device buffers into it), so it is registered with pin; a mapping
 * attached read-only would use pin_readonly (READ_ONLY where the device supports it). Only with
 * an accelerator installed (the default table pins nothing). A failure changes nothing: copies
 * still work, staged by the driver. conn_free joins the thread and unregisters before it
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

/* Under the table lock, when discovery adopts c as the cache peer (kvs_peers_discover). */
static void pool_pin_start(kvs_peers_t *p, pconn_t *c) {
  if (c->pin_started || !c->pool) return;
  const kvs_accel_ops_t *ops = kvs_accel_get();
  if (ops == kvs_accel_default()) return; /* no accelerator yet: again at the next discovery */
  c->pin_started = true;
  c->pin_ops = ops;
  c->pin_stats = p->stats;
  if (kvs__prim_thread_start(&c->pin_thread, NULL, pool_pin_main, c) != 0)
    c->pin_started = false;
}

static void pool_unpin(pconn_t *c) {
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

uint64_t kvs_peers_cache_peer(kvs_peers_t *p) {
  if (!p) return 0;
  uint64_t id = 0;
  pthread_mutex_lock(&p->table_lock);
  for (pconn_t *c = p->conns; c && !id; c = c->next)
    if (c->fd >= 0 && c->info.role == KVS_PROTO_ROLE_CACHE) id = c->info.instance_id;
  pthread_mutex_unlock(&p->table_lock);
  return id;
}

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

int kvs_peers_watch(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    uint32_t wait_ms) {
  if (!p || !keys || n == 0 || n > KVS_PROTO_MAX_WATCH_KEYS) return -EINVAL;
  pconn_t *c = grab(p, instance, false);
  if (!c) return -ENOENT;
  if (!(c->peer_caps & KVS_PROTO_CAP_WATCH)) {
    unref(p, c);
    return -ENOTSUP;
  }
  uint32_t most = reply_wait_ms(p); /* the reply comes within our own deadline */
  if (most > KVS_PROTO_MAX_WATCH_MS) most = KVS_PROTO_MAX_WATCH_MS;
  kvs_proto_watch_t m = {.n_keys = (uint32_t)n, .wait_ms = wait_ms < most ? wait_ms : most,
                         .keys = keys};
  uint8_t *rep = NULL;
  size_t rn = 0;
  pthread_mutex_lock(&c->lock);
  kvs_stats_inc(p->stats, KVS_STAT_peer_watches);
  int rc;
  RPC_ENCODED(rc, p, c, KVS_OP_WATCH, kvs_proto_watch_encode, &m, &rep, &rn);
  pthread_mutex_unlock(&c->lock);
  unref(p, c);
  kvs_proto_watch_reply_t r;
  if (rc == 0) rc = kvs_proto_watch_reply_decode(rep, rn, &r);
  free(rep);
  return rc < 0 ? rc : (int)r.state;
}

int kvs_peers_lookup_at(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n) {
  if (!p || !keys || n == 0) return -EINVAL;
  if (n > KVS_PROTO_MAX_KEYS) n = KVS_PROTO_MAX_KEYS;
  pconn_t *c = grab(p, instance, false);
  if (!c) return -ENOENT;
  int r = lookup_one(p, c, keys, n);
  unref(p, c);
  return r;
}
