/* kvshim peer client: connections, framing, HELLO and back-off (peer_conn.h). */
#include "peer_conn.h"

#include <poll.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "sock.h"

uint64_t kvs__peer_deadline(const kvs_peers_t *p) {
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
int kvs__peer_rx_read(pconn_t *c, void *dst, size_t len, int *fd_out, uint64_t deadline) {
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
int kvs__peer_send_request(pconn_t *c, uint16_t op, uint64_t rid, const void *req, size_t req_len,
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
    rc = kvs__peer_rx_read(c, hb, sizeof hb, have_first ? NULL : &got_fd, deadline);
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
    rc = kvs__peer_rx_read(c, buf + len, h.length, NULL, deadline);
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
int kvs__peer_drain(kvs_peers_t *p, pconn_t *c, uint64_t deadline) {
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
bool kvs__peer_penalized(kvs_peers_t *p, uint64_t id, uint64_t now, bool clear) {
  for (int i = 0; i < PENALTY_SLOTS; i++)
    if (p->penalty[i].id == id) {
      if (clear) p->penalty[i].id = 0, p->penalty[i].retry_at_ms = 0, p->penalty[i].backoff_ms = 0;
      return !clear && now < p->penalty[i].retry_at_ms;
    }
  return false;
}

int kvs__peer_conn_failed(kvs_peers_t *p, pconn_t *c, uint16_t op, int rc) {
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
int kvs__peer_rpc(kvs_peers_t *p, pconn_t *c, uint16_t op, const void *req, size_t req_len,
                  uint8_t **reply, size_t *reply_len, int *fd_out) {
  if (fd_out) *fd_out = -1;
  if (c->fd < 0) return -ENOTCONN;
  uint64_t deadline = kvs__peer_deadline(p);
  uint64_t rid = ++c->next_rid;
  int code = 0;
  /* Send first: a posted request's reply comes before ours, and the peer works on both while
   * we read the first. */
  int rc = kvs__peer_send_request(c, op, rid, req, req_len, deadline);
  if (rc == 0) rc = kvs__peer_drain(p, c, deadline);
  if (rc == 0) rc = read_reply(p, c, op, rid, deadline, true, reply, reply_len, fd_out, &code);
  if (rc < 0) return kvs__peer_conn_failed(p, c, op, rc);
  return rc == 1 ? (code < 0 ? code : -EIO) : 0;
}

int kvs__peer_rpc_batch(kvs_peers_t *p, pconn_t *c, uint16_t op, uint8_t *const *reqs,
                        const size_t *req_lens, size_t n, uint8_t **replies, size_t *reply_lens,
                        int *rcs) {
  for (size_t i = 0; i < n; i++) replies[i] = NULL, reply_lens[i] = 0, rcs[i] = 0;
  if (n == 0 || n > KVS__PEER_BATCH_MAX) return -EINVAL;
  if (c->fd < 0) return -ENOTCONN;
  uint64_t deadline = kvs__peer_deadline(p);
  uint64_t rid0 = c->next_rid + 1;
  c->next_rid += n;
  /* every request one frame (they are small): all the frames in one send, so the peer reads
   * them in one wake-up; else one request after another */
  uint32_t fmax = c->peer_max_frame ? c->peer_max_frame : KVS_PROTO_MIN_MAX_FRAME;
  uint8_t hb[KVS__PEER_BATCH_MAX][KVS_PROTO_HEADER_SIZE];
  struct iovec iov[2 * KVS__PEER_BATCH_MAX];
  bool one_send = true;
  int rc = 0;
  for (size_t i = 0; rc == 0 && one_send && i < n; i++) {
    kvs_proto_header_t h;
    rc = kvs_proto_frame_header(op, 0, rid0 + i, req_lens[i], 0, fmax, &h);
    one_send = rc == 0 && !(h.flags & KVS_PROTO_F_MORE);
    kvs_proto_header_encode(&h, hb[i]);
    iov[2 * i] = (struct iovec){hb[i], sizeof hb[i]};
    iov[2 * i + 1] = (struct iovec){reqs[i], req_lens[i]};
  }
  if (rc == 0 && one_send) rc = kvs_sock_send_all(c->fd, iov, (int)(2 * n), -1, deadline);
  for (size_t i = 0; rc == 0 && !one_send && i < n; i++)
    rc = kvs__peer_send_request(c, op, rid0 + i, reqs[i], req_lens[i], deadline);
  if (rc == 0) rc = kvs__peer_drain(p, c, deadline); /* a posted request's reply comes first */
  for (size_t i = 0; rc == 0 && i < n; i++) {
    int code = 0;
    int r = read_reply(p, c, op, rid0 + i, deadline, i == 0, &replies[i], &reply_lens[i], NULL,
                       &code);
    if (r < 0) rc = r;
    else if (r == 1) rcs[i] = code < 0 ? code : -EIO;
  }
  if (rc == 0) return 0;
  for (size_t i = 0; i < n; i++) free(replies[i]), replies[i] = NULL;
  return kvs__peer_conn_failed(p, c, op, rc);
}

/* Send a request whose answer nobody waits for (COMMIT_RETRIEVE: the unpin happens when the
 * peer reads it, in order; its empty reply is read by the next call on this connection). This
 * takes one round trip off the caller's path. Only for requests with tiny replies: the next
 * call sends before it reads, which must never wait on a peer blocked sending a large reply.
 * 0 or a negative errno (connection closed). */
int kvs__peer_rpc_post(kvs_peers_t *p, pconn_t *c, uint16_t op, const void *req, size_t req_len) {
  if (c->fd < 0) return -ENOTCONN;
  uint64_t deadline = kvs__peer_deadline(p);
  uint64_t rid = ++c->next_rid;
  int rc = kvs__peer_send_request(c, op, rid, req, req_len, deadline);
  if (rc == 0) rc = kvs__peer_drain(p, c, deadline);
  if (rc < 0) return kvs__peer_conn_failed(p, c, op, rc);
  c->unread_rid = rid;
  c->unread_op = op;
  return 0;
}

/* Connect and HELLO. Returns a new connection (not in the table) or NULL. */
pconn_t *kvs__peer_dial(kvs_peers_t *p, const char *path, uint64_t id) {
  int fd;
  int rc = kvs_sock_connect(path, kvs__peer_deadline(p), &fd);
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
  if (rc == 0) rc = kvs__peer_rpc(p, c, KVS_OP_HELLO, req, n, &rep, &rn, &pool_fd);
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
    if (kvs_pool_attach(pool_fd, true, &c->pool) == 0) {
      c->info.strategy = KVS_PROTO_STRATEGY_SHM;
      uint64_t granules =
          (kvs_pool_segment_size(c->pool) + KVS__PEER_GRANULE - 1) / KVS__PEER_GRANULE;
      c->populated = calloc((size_t)(granules + 63) / 64, sizeof *c->populated);
    } else
      kvs_log_info("cannot map the pool of %s: using inline transfers", path);
  }
  if (pool_fd >= 0) close(pool_fd); /* the mapping keeps the segment */
  return c;
}

void kvs__peer_conn_free(pconn_t *c) {
  conn_kill(c);
  kvs__peer_unpin(c); /* before the mapping goes: never a registration on an unmapped range */
  kvs_pool_destroy(c->pool, true);
  free((void *)c->populated);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

void kvs__peer_unref(kvs_peers_t *p, pconn_t *c) {
  pthread_mutex_lock(&p->table_lock);
  bool dead = --c->refs == 0 && !c->listed;
  pthread_mutex_unlock(&p->table_lock);
  if (dead) kvs__peer_conn_free(c);
}

void kvs__peer_ref(kvs_peers_t *p, pconn_t *c, unsigned n) {
  pthread_mutex_lock(&p->table_lock);
  c->refs += n;
  pthread_mutex_unlock(&p->table_lock);
}

/* Take a reference on the live connection to instance (0 = cache peer, else first live). */
pconn_t *kvs__peer_grab(kvs_peers_t *p, uint64_t instance, bool prefer_cache) {
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
uint32_t kvs__peer_reply_wait_ms(const kvs_peers_t *p) {
  return (uint32_t)(p->opts.rpc_timeout_ms - p->opts.rpc_timeout_ms / 4);
}

/* The one live peer, when there is exactly one and a LOOKUP could not tell it more than its
 * PREPARE_RETRIEVE will (no remote tier: only a LOOKUP's remote_wait_ms asks a serve to consult
 * it, docs/protocol.md 4.3); 0 otherwise. */
uint64_t kvs__peer_sole(kvs_peers_t *p) {
  uint64_t id = 0;
  int live = 0;
  pthread_mutex_lock(&p->table_lock);
  for (pconn_t *c = p->conns; c; c = c->next)
    if (c->fd >= 0 && live++ == 0 && !c->remote) id = c->info.instance_id;
  pthread_mutex_unlock(&p->table_lock);
  return live == 1 ? id : 0;
}
