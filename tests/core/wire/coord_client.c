/* Shared helpers of the coordinator tests: see coord_client.h. */
#include "coord_client.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "sock.h"

/* ---- utilities ------------------------------------------------------------------------------ */

_Noreturn void ts_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "coord test harness: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  _exit(99);
}

uint64_t ts_now_ms(void) { return kvs__now_ms(); }

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

kvs_key_t tk(uint64_t seed, uint64_t i) {
  kvs_key_t k = {mix64(seed * 0x100000001b3ull + i), mix64(~seed) ^ 0x6b76736869746573ull};
  if (kvs_key_is_zero(k)) k.lo = 1;
  return k;
}

static uint64_t pat_seed(kvs_key_t key) { return mix64(key.lo ^ (key.hi << 17 | key.hi >> 47)); }

void pat_fill(void *dst, uint64_t len, kvs_key_t key) {
  uint64_t s = pat_seed(key), n = len / 8, i;
  uint8_t *d = dst;
  for (i = 0; i < n; i++) {
    uint64_t w = mix64(s + i);
    memcpy(d + i * 8, &w, 8);
  }
  if (len % 8) {
    uint64_t w = mix64(s + i);
    memcpy(d + i * 8, &w, len % 8);
  }
}

uint64_t pat_check(const void *p, uint64_t len, kvs_key_t key) {
  uint64_t s = pat_seed(key), n = len / 8, i;
  const uint8_t *b = p;
  for (i = 0; i < n; i++) {
    uint64_t w = mix64(s + i), g;
    memcpy(&g, b + i * 8, 8);
    if (g != w) return 1 + i * 8;
  }
  if (len % 8) {
    uint64_t w = mix64(s + i);
    if (memcmp(b + i * 8, &w, len % 8) != 0) return 1 + i * 8;
  }
  return 0;
}

int ts_mkdtemp(char *buf, size_t cap, const char *prefix) {
  int n = snprintf(buf, cap, "/tmp/%s-XXXXXX", prefix);
  if (n < 0 || (size_t)n >= cap) return -ENAMETOOLONG;
  return mkdtemp(buf) ? 0 : -errno;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *f) {
  (void)st, (void)flag, (void)f;
  remove(path);
  return 0;
}
void ts_rmtree(const char *path) {
  if (path && path[0]) nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

pid_t ts_fork(int (*fn)(void *), void *arg) {
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) ts_die("fork: %s", strerror(errno));
  if (pid == 0) {
    /* Never outlive the test (a test killed by its timeout cannot reap us). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(98);
    _exit(fn(arg) & 0xff);
  }
  return pid;
}

int ts_wait_child(pid_t pid, int timeout_ms) {
  uint64_t end = ts_now_ms() + (uint64_t)timeout_ms;
  for (;;) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0 && errno != EINTR) return -errno;
    if (ts_now_ms() >= end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -ETIMEDOUT;
    }
    usleep(2000);
  }
}

/* ---- raw client ----------------------------------------------------------------------------- */

static uint64_t deadline_ms(int ms) { return kvs__now_ns() + (uint64_t)ms * 1000000ull; }

int cc_connect(cc_t *c, const char *path) {
  memset(c, 0, sizeof *c);
  c->fd = -1;
  c->peer_max_frame = KVS_PROTO_MIN_MAX_FRAME;
  c->my_max_frame = KVS_PROTO_MIN_MAX_FRAME;
  return kvs_sock_connect(path, deadline_ms(CC_TIMEOUT_MS), &c->fd);
}

void cc_close(cc_t *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  kvs_pool_destroy(c->pool, true);
  c->pool = NULL;
}

int cc_send_raw(cc_t *c, const void *p, size_t len) {
  struct iovec iov = {(void *)p, len};
  return kvs_sock_send_all(c->fd, &iov, 1, -1, deadline_ms(CC_TIMEOUT_MS));
}

int cc_send_frame(cc_t *c, const kvs_proto_header_t *h, const void *payload) {
  /* Header and payload in one send: a server that refuses the header may close at once, and
   * a payload sent separately would then meet EPIPE. */
  size_t n = payload ? h->length : 0;
  uint8_t *b = malloc(KVS_PROTO_HEADER_SIZE + n);
  if (!b) return -ENOMEM;
  kvs_proto_header_encode(h, b);
  if (n) memcpy(b + KVS_PROTO_HEADER_SIZE, payload, n);
  int rc = cc_send_raw(c, b, KVS_PROTO_HEADER_SIZE + n);
  free(b);
  return rc;
}

int cc_send(cc_t *c, uint16_t op, const void *p, size_t len, uint64_t *rid_out) {
  uint64_t rid = ++c->next_rid;
  if (rid_out) *rid_out = rid;
  uint64_t off = 0;
  for (;;) {
    kvs_proto_header_t h;
    KVS_TRY(kvs_proto_frame_header(op, 0, rid, len, off, c->peer_max_frame, &h));
    KVS_TRY(cc_send_frame(c, &h, (const uint8_t *)p + off));
    off += h.length;
    if (!(h.flags & KVS_PROTO_F_MORE)) return 0;
  }
}

void cc_msg_free(cc_msg_t *m) {
  free(m->payload);
  m->payload = NULL;
  m->len = 0;
  if (m->fd >= 0) close(m->fd);
  m->fd = -1;
}

int cc_recv(cc_t *c, cc_msg_t *m, int timeout_ms) {
  memset(m, 0, sizeof *m);
  m->fd = -1;
  uint64_t dl = deadline_ms(timeout_ms);
  bool first = true;
  for (;;) {
    uint8_t hb[KVS_PROTO_HEADER_SIZE];
    int fd = -1;
    int rc = kvs_sock_recv_all(c->fd, hb, sizeof hb, first ? &fd : NULL, dl);
    if (rc < 0) goto fail;
    if (fd >= 0) m->fd = fd;
    kvs_proto_header_t h;
    rc = kvs_proto_header_decode(hb, sizeof hb, c->my_max_frame, &h);
    if (rc == 0 && !first) rc = kvs_proto_frame_continues(&m->h, &h);
    if (rc < 0) goto fail;
    if (first) m->h = h;
    uint8_t *nb = realloc(m->payload, m->len + h.length + 8);
    if (!nb) {
      rc = -ENOMEM;
      goto fail;
    }
    m->payload = nb;
    rc = kvs_sock_recv_all(c->fd, m->payload + m->len, h.length, NULL, dl);
    if (rc < 0) goto fail;
    m->len += h.length;
    m->frames++;
    first = false;
    if (!(h.flags & KVS_PROTO_F_MORE)) return 0;
    continue;
  fail:
    cc_msg_free(m);
    return rc;
  }
}

int cc_error_code(const cc_msg_t *m, char *msg, size_t cap) {
  kvs_proto_error_t e;
  if (m->h.opcode != KVS_OP_ERROR) return 0;
  if (kvs_proto_error_decode(m->payload, m->len, &e) < 0) return -EBADMSG;
  if (msg && cap) snprintf(msg, cap, "%.*s", (int)e.message_len, e.message ? e.message : "");
  return e.code;
}

int cc_call(cc_t *c, uint16_t op, const void *p, size_t len, cc_msg_t *reply) {
  uint64_t rid;
  memset(reply, 0, sizeof *reply);
  reply->fd = -1;
  KVS_TRY(cc_send(c, op, p, len, &rid));
  KVS_TRY(cc_recv(c, reply, CC_TIMEOUT_MS));
  if (!(reply->h.flags & KVS_PROTO_F_REPLY) || reply->h.request_id != rid) return -EPROTO;
  if (reply->h.opcode == KVS_OP_ERROR) {
    int code = cc_error_code(reply, NULL, 0);
    return code < 0 ? code : -EBADMSG;
  }
  return reply->h.opcode == op ? 0 : -EPROTO;
}

bool cc_wait_closed(cc_t *c, int timeout_ms) {
  uint64_t dl = deadline_ms(timeout_ms);
  uint8_t buf[4096];
  for (;;) {
    int rc = kvs_sock_recv_all(c->fd, buf, 1, NULL, dl);
    if (rc == -ETIMEDOUT) return false;
    if (rc < 0) return true; /* EOF or reset */
  }
}

int cc_send_hello(cc_t *c, const kvs_proto_hello_t *me, uint64_t rid) {
  uint8_t buf[256];
  size_t n = 0;
  KVS_TRY(kvs_proto_hello_encode(me, buf, sizeof buf, &n));
  kvs_proto_header_t h = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION, KVS_OP_HELLO, 0, rid, (uint32_t)n};
  return cc_send_frame(c, &h, buf);
}

int cc_hello(cc_t *c, uint8_t strategy, uint32_t caps, uint32_t max_frame) {
  kvs_proto_hello_t me;
  memset(&me, 0, sizeof me);
  me.version_min = KVS_PROTO_VERSION_MIN;
  me.version_max = KVS_PROTO_VERSION_MAX;
  me.role = KVS_PROTO_ROLE_TOOL;
  me.strategy_requested = strategy;
  me.strategy_chosen = KVS_PROTO_STRATEGY_AUTO;
  me.pid = (uint32_t)getpid();
  me.caps = caps;
  me.instance_id = 0x7e57c11e47ull;
  me.max_frame = max_frame ? max_frame : KVS_PROTO_DEFAULT_MAX_FRAME;
  snprintf(me.group, sizeof me.group, "t");
  uint8_t buf[256];
  size_t n = 0;
  KVS_TRY(kvs_proto_hello_encode(&me, buf, sizeof buf, &n));
  c->my_max_frame = me.max_frame;
  cc_msg_t r;
  int rc = cc_call(c, KVS_OP_HELLO, buf, n, &r);
  if (rc == 0) rc = kvs_proto_hello_decode(r.payload, r.len, &c->server);
  if (rc == 0) rc = kvs_proto_hello_check(&c->server, true);
  if (rc == 0) {
    c->helloed = true;
    c->peer_max_frame = c->server.max_frame;
    if (r.fd >= 0 && kvs_pool_attach(r.fd, true, &c->pool) < 0) rc = -EPROTO;
  }
  cc_msg_free(&r);
  return rc;
}

int cc_open(cc_t *c, const char *path, uint8_t strategy) {
  KVS_TRY(cc_connect(c, path));
  int rc = cc_hello(c, strategy, KVS_PROTO_CAP_SHM | KVS_PROTO_CAP_INLINE, 0);
  if (rc < 0) cc_close(c);
  return rc;
}

/* Encode with a size query into a malloc'd buffer, call, free. */
#define CC_CALL_ENCODED(c, op, encfn, msgp, reply)                                           \
  ({                                                                                         \
    size_t n_ = 0;                                                                           \
    int r_ = encfn((msgp), NULL, 0, &n_);                                                    \
    uint8_t *b_ = r_ == 0 ? malloc(n_ ? n_ : 1) : NULL;                                      \
    if (r_ == 0) r_ = b_ ? encfn((msgp), b_, n_, &n_) : -ENOMEM;                             \
    if (r_ == 0) r_ = cc_call((c), (op), b_, n_, (reply));                                   \
    else memset((reply), 0, sizeof *(reply)), (reply)->fd = -1;                              \
    free(b_);                                                                                \
    r_;                                                                                      \
  })

/* CC_CALL_ENCODED whose reply is decoded by decfn into *outp and freed: what *outp points into
 * the reply is gone when it returns, so only its scalars may be used. */
#define CC_CALL_DECODED(c, op, encfn, msgp, decfn, outp)                                     \
  ({                                                                                         \
    cc_msg_t m_;                                                                             \
    int rc_ = CC_CALL_ENCODED(c, op, encfn, msgp, &m_);                                      \
    if (rc_ == 0) rc_ = decfn(m_.payload, m_.len, (outp));                                   \
    cc_msg_free(&m_);                                                                        \
    rc_;                                                                                     \
  })

/* CC_CALL_DECODED of kvs_proto_<name>_t whose answer is one scalar of its reply: on success
 * *outp = reply.field (outp may be NULL). */
#define CC_CALL_REPLY_FIELD(c, op, name, msgp, field, outp)                                  \
  ({                                                                                         \
    kvs_proto_##name##_reply_t rep_;                                                         \
    int rcf_ = CC_CALL_DECODED(c, op, kvs_proto_##name##_encode, msgp,                       \
                               kvs_proto_##name##_reply_decode, &rep_);                      \
    if (rcf_ == 0 && (outp)) *(outp) = rep_.field;                                           \
    rcf_;                                                                                    \
  })

int cc_lookup(cc_t *c, const kvs_key_t *keys, uint32_t n, uint32_t *found) {
  kvs_proto_lookup_t m = {.n_keys = n, .keys = keys};
  return CC_CALL_REPLY_FIELD(c, KVS_OP_LOOKUP, lookup, &m, found, found);
}

int cc_prepare_store(cc_t *c, uint8_t strategy, uint8_t kind, const kvs_layout_t *layout,
                     const kvs_key_t *keys, uint32_t n, cc_pstore_t *out) {
  if (n > CC_MAX) return -E2BIG;
  kvs_proto_prepare_store_t m = {strategy, kind, 0, *layout, n, keys};
  cc_msg_t r;
  int rc = CC_CALL_ENCODED(c, KVS_OP_PREPARE_STORE, kvs_proto_prepare_store_encode, &m, &r);
  kvs_proto_prepare_store_reply_t pr;
  if (rc == 0) rc = kvs_proto_prepare_store_reply_decode(r.payload, r.len, &pr);
  if (rc == 0 && (pr.n_outcomes > CC_MAX || pr.n_slots > CC_MAX)) rc = -E2BIG;
  if (rc == 0) {
    out->xfer = pr.xfer;
    out->n_outcomes = pr.n_outcomes;
    out->n_slots = pr.n_slots;
    memcpy(out->outcomes, pr.outcomes, pr.n_outcomes);
    if (pr.n_slots) memcpy(out->slots, pr.slots, pr.n_slots * sizeof *pr.slots);
  }
  cc_msg_free(&r);
  return rc;
}

int cc_commit_shm(cc_t *c, uint64_t xfer, const kvs_proto_slot_t *slots, uint32_t n,
                  uint32_t *committed) {
  kvs_proto_commit_store_t m;
  memset(&m, 0, sizeof m);
  m.xfer = xfer;
  m.n_slots = n;
  m.slots = slots;
  return CC_CALL_REPLY_FIELD(c, KVS_OP_COMMIT_STORE, commit_store, &m, committed, committed);
}

int cc_commit_inline(cc_t *c, uint64_t xfer, uint8_t kind, const kvs_layout_t *layout,
                     const kvs_key_t *keys, uint32_t n, const void *const *bufs,
                     uint32_t *committed, uint8_t *outcomes) {
  if (n > CC_MAX || n == 0) return -EINVAL;
  uint64_t obj = kvs_layout_nbytes(layout);
  bool object = kind == KVS_PROTO_KIND_OBJECT;
  uint32_t n_objs = object ? 1 : n;
  kvs_proto_entry_t *entries = calloc(n, sizeof *entries);
  if (!entries) return -ENOMEM;
  for (uint32_t i = 0; i < n; i++) entries[i] = (kvs_proto_entry_t){keys[i], object && i ? 0 : obj};
  kvs_proto_commit_store_t m;
  memset(&m, 0, sizeof m);
  m.xfer = xfer;
  m.is_inline = 1;
  m.kind = kind;
  m.layout = *layout;
  m.n_entries = n;
  m.entries = entries;
  m.data = NULL;
  m.data_len = obj * n_objs;
  size_t len = 0;
  int rc = kvs_proto_commit_store_encode(&m, NULL, 0, &len);
  uint8_t *buf = rc == 0 ? malloc(len) : NULL;
  if (rc == 0) rc = buf ? kvs_proto_commit_store_encode(&m, buf, len, &len) : -ENOMEM;
  cc_msg_t r = {.fd = -1};
  if (rc == 0) {
    uint8_t *dst = buf + len - m.data_len;
    for (uint32_t i = 0; i < n_objs; i++) memcpy(dst + i * obj, bufs[i], obj);
    rc = cc_call(c, KVS_OP_COMMIT_STORE, buf, len, &r);
  }
  kvs_proto_commit_store_reply_t cr;
  if (rc == 0) rc = kvs_proto_commit_store_reply_decode(r.payload, r.len, &cr);
  if (rc == 0) {
    if (committed) *committed = cr.committed;
    if (outcomes) memcpy(outcomes, cr.outcomes, cr.n_outcomes);
  }
  cc_msg_free(&r);
  free(buf);
  free(entries);
  return rc;
}

int cc_write_and_commit(cc_t *c, const cc_pstore_t *ps, const kvs_key_t *keys, uint8_t kind) {
  if (!c->pool) return -ENOTCONN;
  uint8_t *base = kvs_pool_base(c->pool);
  for (uint32_t i = 0; i < ps->n_slots; i++) {
    const kvs_proto_slot_t *s = &ps->slots[i];
    pat_fill(base + s->offset, s->length, keys[kind == KVS_PROTO_KIND_OBJECT ? 0 : s->key_index]);
  }
  uint32_t committed = 0;
  KVS_TRY(cc_commit_shm(c, ps->xfer, ps->slots, ps->n_slots, &committed));
  return (int)committed;
}

static int xfer_call(cc_t *c, uint16_t op, uint64_t xfer) {
  kvs_proto_xfer_t m = {xfer};
  cc_msg_t r;
  int rc = CC_CALL_ENCODED(c, op, kvs_proto_xfer_encode, &m, &r);
  if (rc == 0) rc = kvs_proto_empty_decode(r.payload, r.len);
  cc_msg_free(&r);
  return rc;
}
int cc_abort(cc_t *c, uint64_t xfer) { return xfer_call(c, KVS_OP_ABORT, xfer); }
int cc_commit_retrieve(cc_t *c, uint64_t xfer) { return xfer_call(c, KVS_OP_COMMIT_RETRIEVE, xfer); }

int cc_prepare_retrieve(cc_t *c, uint8_t strategy, const kvs_key_t *keys, uint32_t n,
                        cc_pretr_t *out) {
  memset(out, 0, sizeof *out);
  out->msg.fd = -1;
  kvs_proto_prepare_retrieve_t m = {strategy, n, keys, 0};
  int rc = CC_CALL_ENCODED(c, KVS_OP_PREPARE_RETRIEVE, kvs_proto_prepare_retrieve_encode, &m,
                           &out->msg);
  kvs_proto_prepare_retrieve_reply_t pr;
  if (rc == 0)
    rc = kvs_proto_prepare_retrieve_reply_decode(out->msg.payload, out->msg.len, out->objects,
                                                 CC_MAX, &pr);
  if (rc == 0) {
    out->xfer = pr.xfer;
    out->n_found = pr.n_found;
    out->n_objects = pr.n_objects;
    out->is_inline = pr.is_inline;
  } else {
    cc_msg_free(&out->msg);
  }
  return rc;
}

void cc_pretr_free(cc_pretr_t *r) { cc_msg_free(&r->msg); }

const uint8_t *cc_object_bytes(const cc_t *c, const cc_pretr_t *r, uint32_t i) {
  if (r->is_inline) return r->objects[i].data;
  if (!c->pool) return NULL;
  return kvs_pool_base(c->pool) + r->objects[i].offset;
}

int cc_stats(cc_t *c, uint8_t format, char *buf, size_t cap) {
  kvs_proto_stats_t m = {format};
  cc_msg_t r;
  int rc = CC_CALL_ENCODED(c, KVS_OP_STATS, kvs_proto_stats_encode, &m, &r);
  kvs_proto_text_t t;
  if (rc == 0) rc = kvs_proto_text_decode(r.payload, r.len, &t);
  if (rc == 0) {
    size_t n = t.len < cap - 1 ? t.len : cap - 1;
    memcpy(buf, t.text, n);
    buf[n] = '\0';
    rc = (int)n;
  }
  cc_msg_free(&r);
  return rc;
}

int cc_ping(cc_t *c, uint64_t nonce, const void *echo, uint32_t echo_len) {
  kvs_proto_ping_t m = {nonce, echo_len, echo};
  cc_msg_t r;
  int rc = CC_CALL_ENCODED(c, KVS_OP_PING, kvs_proto_ping_encode, &m, &r);
  kvs_proto_ping_t pr;
  if (rc == 0) rc = kvs_proto_ping_decode(r.payload, r.len, &pr);
  if (rc == 0 && (pr.nonce != nonce || pr.echo_len != echo_len ||
                  (echo_len && memcmp(pr.echo, echo, echo_len) != 0)))
    rc = -EPROTO;
  cc_msg_free(&r);
  return rc;
}

int cc_export(cc_t *c, uint64_t addr, uint64_t len, kvs_tensor_desc_t *descs, size_t cap) {
  kvs_proto_export_t m = {addr, len};
  cc_msg_t r;
  int rc = CC_CALL_ENCODED(c, KVS_OP_EXPORT_TENSORS, kvs_proto_export_encode, &m, &r);
  kvs_proto_blob_t blobs[64];
  kvs_proto_export_reply_t er;
  if (rc == 0) rc = kvs_proto_export_reply_decode(r.payload, r.len, blobs, 64, &er);
  for (uint32_t i = 0; rc == 0 && i < er.n_descs && i < cap; i++)
    rc = kvs_tensor_decode(blobs[i].data, blobs[i].len, &descs[i]);
  if (rc == 0) rc = (int)er.n_descs;
  cc_msg_free(&r);
  return rc;
}

/* ---- in-process server ----------------------------------------------------------------------- */

int ts_server_init(ts_server_t *s, uint64_t cache_bytes) {
  memset(s, 0, sizeof *s);
  KVS_TRY(ts_mkdtemp(s->root, sizeof s->root, "kvs-coordtest"));
  kvs_options_defaults(&s->opts);
  snprintf(s->opts.run_dir, sizeof s->opts.run_dir, "%s/run", s->root);
  snprintf(s->opts.group, sizeof s->opts.group, "t");
  s->opts.pool_size = cache_bytes;
  s->opts.rpc_timeout_ms = 3000;
  kvs_stats_init(&s->stats);
  s->instance_id = mix64((uint64_t)getpid() ^ ts_now_ms()) | 1;
  s->role = KVS_PROTO_ROLE_CACHE;
  return 0;
}

int ts_server_start(ts_server_t *s) {
  kvs_pool_config_t pc = {.cache_size = s->opts.pool_size, .instance_id = s->instance_id};
  KVS_TRY(kvs_pool_create(&pc, &s->pool));
  kvs_store_config_t sc = {.pool = s->pool, .lease_ms = (uint32_t)s->opts.lease_ms,
                           .stats = &s->stats};
  int rc = kvs_store_create(&sc, &s->store);
  if (rc < 0) return rc;
  kvs_coord_config_t cc = {.store = s->store, .pool = s->pool, .opts = &s->opts,
                           .role = s->role, .instance_id = s->instance_id,
                           .tensors = &s->tensors, .stats = &s->stats, .remote = s->remote};
  rc = kvs_coord_start(&cc, &s->coord);
  if (rc < 0) return rc;
  snprintf(s->path, sizeof s->path, "%s", kvs_coord_socket_path(s->coord));
  return 0;
}

void ts_server_stop(ts_server_t *s, bool remove_root) {
  kvs_coord_stop(s->coord);
  s->coord = NULL;
  if (s->store) kvs_store_destroy(s->store, true);
  s->store = NULL;
  kvs_pool_destroy(s->pool, true);
  s->pool = NULL;
  if (remove_root) ts_rmtree(s->root);
}

void ts_server_reset(ts_server_t *s) {
  if (s->root[0]) ts_server_stop(s, true);
  memset(s, 0, sizeof *s);
}

uint64_t ts_stat(const ts_server_t *s, kvs_stat_id_t id) { return kvs_stats_get(&s->stats, id); }

kvs_store_info_t ts_info(kvs_store_t *st) {
  kvs_store_info_t in;
  kvs_store_info(st, &in);
  return in;
}

int ts_wait_baseline(kvs_store_t *st, const kvs_store_info_t *base, kvs_coord_t *coord,
                     unsigned conns, int timeout_ms) {
  uint64_t t0 = ts_now_ms();
  for (;;) {
    kvs_store_info_t in = ts_info(st);
    bool ok = in.reserved_bytes <= base->reserved_bytes && in.pins <= base->pins &&
              in.xfers <= base->xfers && in.objects_writing <= base->objects_writing &&
              (!coord || kvs_coord_connections(coord) <= conns);
    uint64_t dt = ts_now_ms() - t0;
    if (ok) return (int)dt;
    if (dt > (uint64_t)timeout_ms) return -ETIMEDOUT;
    usleep(2000);
  }
}

kvs_layout_t ts_chunk_layout(uint64_t rows, uint64_t cols) {
  kvs_layout_t l;
  memset(&l, 0, sizeof l);
  l.dtype = KVS_DTYPE_U8;
  l.ndim = 2;
  l.shape[0] = rows;
  l.shape[1] = cols;
  return l;
}

int ts_local_put(kvs_store_t *st, const kvs_key_t *keys, uint32_t n, const kvs_layout_t *layout) {
  uint8_t *outcomes = calloc(n, 1);
  kvs_extent_t *ext = calloc(n, sizeof *ext);
  if (!outcomes || !ext) ts_die("out of memory");
  kvs_xfer_t xfer = 0;
  int rc = kvs_store_reserve_write(st, KVS_OWNER_LOCAL, keys, n, layout, 0, outcomes, ext, &xfer);
  uint8_t *base = kvs_pool_base(kvs_store_pool(st));
  int kept = 0;
  for (uint32_t i = 0; rc >= 0 && i < n; i++) {
    if (outcomes[i] == KVS_RES_RESERVED) pat_fill(base + ext[i].offset, ext[i].length, keys[i]);
    if (outcomes[i] == KVS_RES_RESERVED || outcomes[i] == KVS_RES_PRESENT) kept++;
  }
  if (rc >= 0 && xfer) rc = kvs_store_commit(st, KVS_OWNER_LOCAL, xfer);
  free(outcomes);
  free(ext);
  return rc < 0 ? rc : kept;
}

int ts_local_count(kvs_store_t *st, const kvs_key_t *keys, uint32_t n) {
  return kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, n, false, NULL);
}

int ts_local_verify(kvs_store_t *st, const kvs_key_t *keys, uint32_t n) {
  kvs_xfer_t xfer = 0;
  int found = kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, n, true, &xfer);
  if (found <= 0) return found;
  kvs_object_view_t *v = calloc((size_t)found, sizeof *v);
  if (!v) ts_die("out of memory");
  int nv = kvs_store_read_pinned(st, KVS_OWNER_LOCAL, xfer, v, (size_t)found);
  const uint8_t *base = kvs_pool_base(kvs_store_pool(st));
  int rc = nv < 0 ? nv : found;
  for (int i = 0; rc > 0 && i < nv && i < found; i++)
    if (pat_check(base + v[i].extent.offset, v[i].extent.length, v[i].key) != 0) rc = -EILSEQ;
  kvs_store_release(st, KVS_OWNER_LOCAL, xfer);
  free(v);
  return rc;
}
