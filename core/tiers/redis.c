/* kvshim redis: a small Redis / Redis Cluster client (see redis.h).
 *
 * hiredis does the protocol parsing (its redisReader); the socket, the deadline and the output
 * are ours, because hiredis 0.14 has neither a deadline for a whole pipeline nor cluster
 * support. Every node is one non-blocking TCP connection:
 *
 *   out   the RESP bytes still to send, as segments: small pieces live in `hdr` (by offset, so
 *         hdr may grow), large arguments point straight at the caller's bytes (no copy; they
 *         are valid for the whole exec, and every segment is sent or dropped before it returns)
 *   q     one entry per reply still expected, in send order (Redis answers in order):
 *         a command of the current exec, a handshake step (AUTH, SELECT), an ASKING, or an
 *         internal call (PING, INFO, CLUSTER SLOTS)
 *
 * Invariant between calls: every node has no output and an empty q; a node whose connection
 * failed (error, timeout, protocol error) is closed, so a late reply can never be matched to
 * the wrong command; it reconnects the next time a command is routed to it.
 *
 * Cluster: slot -> node table from CLUSTER SLOTS (Redis Cluster spec, "Redirection and
 * resharding"): MOVED updates the slot, refreshes the whole table and retries the command once;
 * ASK sends ASKING + the command once to the named node without touching the table; a command
 * whose node refuses connections makes the table stale, it is refreshed from any other known
 * node (replicas included) and the command retried once within the same deadline. */
#include "redis.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <hiredis.h>

#include "internal.h"
#include "sock.h"

#define SLOTS 16384u
#define NO_NODE 0xFFFFu
#define MAX_NODES 1024u
#define BIG_ARG 4096u      /* arguments this long or longer are sent from the caller's memory */
#define RBUF_SIZE (256u << 10)
#define ERRSTR 512

enum { Q_CMD, Q_AUTH, Q_SELECT, Q_ASKING, Q_CALL };

typedef struct seg { const char *p; size_t off, len; } seg_t; /* p NULL: bytes at hdr + off */
typedef struct qent { uint32_t idx; uint8_t kind; } qent_t;

/* One server. Invariants: qhead <= qlen; seg_i <= nseg; rd != NULL iff fd >= 0; between calls
 * (node_is_idle) nseg == 0 and qhead == qlen == 0, and a closed node has neither. */
typedef struct node {
  char host[256];
  uint16_t port;
  int fd;                 /* -1: not connected */
  redisReader *rd;        /* non-NULL iff fd >= 0 */
  char *hdr; size_t hdr_len, hdr_cap;
  seg_t *seg; size_t nseg, seg_cap, seg_i, seg_done; /* seg_done: bytes of seg[seg_i] sent */
  qent_t *q; size_t qhead, qlen, qcap;               /* q[qhead .. qlen) pending */
  redisReply *call_reply; /* the reply of a Q_CALL */
  uint64_t failed_epoch;  /* exec epoch of the last failed connect: not retried in that exec */
  uint64_t down_ns;       /* CLOCK_MONOTONIC of the last failed connect (0: none since the last
                             success): map refreshes ask such nodes last */
  int err;                /* last error of this node (negative errno), 0 none */
  char errstr[ERRSTR];
  /* The reply at q[qhead] while it is received through its command's sink: sink_on, its
   * length, the bytes after the head still expected (sink_len) and received (sink_got), where
   * they go (NULL: dropped). Then its "\r\n" from the reader. */
  int sink_on;
  size_t sink_total, sink_len, sink_got;
  char *sink_dst;
} node_t;

/* Per-command state of one exec. */
typedef struct cst {
  uint16_t node;          /* where it was sent last */
  uint16_t ask_node;      /* NO_NODE, or where an ASK sent it */
  uint8_t moved, asked, rerouted, todo, unsent;
} cst_t;

/* The handle. Invariants: n_rep <= rep_cap, n_rep <= st_cap; res is non-NULL only inside exec
 * (rep[i] owns the memory results[i].str points into until the next exec or release); slot[s]
 * is NO_NODE or < n_nodes; nodes are never removed, so indexes stay valid. */
struct kvs_redis {
  kvs_redis_url_t url;
  char password[128];
  uint32_t timeout_ms;
  node_t **nodes; size_t n_nodes;
  uint16_t *slot;         /* cluster: SLOTS entries of node indexes (NO_NODE uncovered) */
  int map_stale;
  uint64_t epoch;         /* exec counter, for failed_epoch */
  size_t last_good;       /* the node that answered the last CLUSTER SLOTS: asked first next time */
  /* the current / last exec */
  const kvs_redis_cmd_t *cmds; /* non-NULL only inside exec, like res */
  kvs_redis_result_t *res;
  redisReply **rep; size_t rep_cap, n_rep;
  cst_t *st; size_t st_cap;
  int sent_any;
  char err[ERRSTR];
};

static void seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ---- URL ---------------------------------------------------------------------------------- */

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Percent-decode s[0..n) into out (cap bytes with the NUL). -1 bad escape, -2 too long. */
static int pct_decode(const char *s, size_t n, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    int c = (unsigned char)s[i];
    if (c == '%') {
      if (i + 2 >= n) return -1;
      int h = hexval((unsigned char)s[i + 1]), l = hexval((unsigned char)s[i + 2]);
      if (h < 0 || l < 0) return -1;
      c = h * 16 + l;
      i += 2;
    }
    if (c == 0) return -1;
    if (o + 1 >= cap) return -2;
    out[o++] = (char)c;
  }
  out[o] = 0;
  return 0;
}

static int parse_port(const char *s, size_t n, uint16_t *port) {
  if (n == 0 || n > 5) return -1;
  unsigned v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (unsigned)(s[i] - '0');
  }
  if (v == 0 || v > 65535) return -1;
  *port = (uint16_t)v;
  return 0;
}

/* One "host[:port]" or "[v6][:port]" of n bytes. */
static int parse_hostport(const char *s, size_t n, char *host, uint16_t *port, char *err,
                          size_t errlen) {
  const char *h = s, *p = NULL;
  size_t hn;
  if (n && s[0] == '[') {
    const char *close = memchr(s, ']', n);
    if (!close) { seterr(err, errlen, "redis URL: '[' without ']' in a host"); return -EINVAL; }
    h = s + 1;
    hn = (size_t)(close - h);
    size_t rest = n - (size_t)(close + 1 - s);
    if (rest) {
      if (close[1] != ':') { seterr(err, errlen, "redis URL: unexpected text after ']'"); return -EINVAL; }
      p = close + 2;
    }
    for (size_t i = 0; i < hn; i++)
      if (!(hexval((unsigned char)h[i]) >= 0 || h[i] == ':' || h[i] == '.')) {
        seterr(err, errlen, "redis URL: bad IPv6 address in brackets"); return -EINVAL;
      }
  } else {
    const char *colon = memchr(s, ':', n);
    if (colon && memchr(colon + 1, ':', n - (size_t)(colon + 1 - s))) {
      seterr(err, errlen, "redis URL: an IPv6 address must be written in brackets, [::1]:6379");
      return -EINVAL;
    }
    hn = colon ? (size_t)(colon - s) : n;
    if (colon) p = colon + 1;
    for (size_t i = 0; i < hn; i++) {
      char c = h[i];
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '.' || c == '-' || c == '_')) {
        seterr(err, errlen, "redis URL: bad character in host name '%.*s'", (int)(hn > 64 ? 64 : hn), h);
        return -EINVAL;
      }
    }
  }
  if (hn == 0) { seterr(err, errlen, "redis URL: empty host"); return -EINVAL; }
  if (hn > 255) { seterr(err, errlen, "redis URL: host name longer than 255 bytes"); return -EINVAL; }
  memcpy(host, h, hn);
  host[hn] = 0;
  *port = 6379;
  if (p) {
    size_t pn = n - (size_t)(p - s);
    if (parse_port(p, pn, port) < 0) {
      seterr(err, errlen, "redis URL: bad port '%.*s' for host %s (want 1..65535)",
             (int)(pn > 16 ? 16 : pn), p, host);
      return -EINVAL;
    }
  }
  return 0;
}

int kvs_redis_url_parse(const char *url, kvs_redis_url_t *out, char *err, size_t errlen) {
  static const char s_std[] = "redis://", s_cl[] = "redis+cluster://";
  if (!url || !out) { seterr(err, errlen, "redis URL: none given"); return -EINVAL; }
  kvs_redis_url_t u;
  memset(&u, 0, sizeof u);
  const char *s;
  if (!strncmp(url, s_std, sizeof s_std - 1)) s = url + sizeof s_std - 1;
  else if (!strncmp(url, s_cl, sizeof s_cl - 1)) { s = url + sizeof s_cl - 1; u.cluster = 1; }
  else {
    seterr(err, errlen, "redis URL: unknown scheme (want redis://host:port[/db] or "
           "redis+cluster://host:port[,host:port...])");
    return -EINVAL;
  }
  size_t alen = strcspn(s, "/?#");
  if (s[alen] == '?' || s[alen] == '#' || (s[alen] == '/' && strpbrk(s + alen, "?#"))) {
    seterr(err, errlen, "redis URL: query strings and fragments are not supported");
    return -EINVAL;
  }
  /* userinfo: everything before the last '@' of the authority; "user:pass" or "pass" alone
   * (as redis-cli -u reads it), percent-decoded. Never echoed in an error. */
  const char *hosts = s;
  for (size_t i = alen; i > 0; i--)
    if (s[i - 1] == '@') { hosts = s + i; break; }
  if (hosts != s) {
    size_t ulen = (size_t)(hosts - 1 - s);
    const char *colon = memchr(s, ':', ulen);
    int rc = 0;
    if (colon) {
      rc = pct_decode(s, (size_t)(colon - s), u.user, sizeof u.user);
      if (rc == 0) rc = pct_decode(colon + 1, ulen - (size_t)(colon + 1 - s), u.password, sizeof u.password);
    } else {
      rc = pct_decode(s, ulen, u.password, sizeof u.password);
    }
    if (rc == -1) { seterr(err, errlen, "redis URL: bad %%-escape in user or password"); return -EINVAL; }
    if (rc == -2) {
      seterr(err, errlen, "redis URL: user (max %zu bytes) or password (max %zu bytes) too long",
             sizeof u.user - 1, sizeof u.password - 1);
      return -EINVAL;
    }
  }
  size_t hlen = alen - (size_t)(hosts - s);
  if (hlen == 0) { seterr(err, errlen, "redis URL: no host"); return -EINVAL; }
  const char *h = hosts, *hend = hosts + hlen;
  while (h <= hend) {
    const char *comma = memchr(h, ',', (size_t)(hend - h));
    const char *e = comma ? comma : hend;
    if (!u.cluster && comma) {
      seterr(err, errlen, "redis URL: several hosts need redis+cluster://");
      return -EINVAL;
    }
    if (u.n_seeds == KVS_REDIS_MAX_SEEDS) {
      seterr(err, errlen, "redis URL: more than %d hosts", KVS_REDIS_MAX_SEEDS);
      return -EINVAL;
    }
    int rc = parse_hostport(h, (size_t)(e - h), u.seeds[u.n_seeds].host, &u.seeds[u.n_seeds].port,
                            err, errlen);
    if (rc < 0) return rc;
    u.n_seeds++;
    if (!comma) break;
    h = comma + 1;
  }
  const char *path = s + alen;
  if (*path == '/' && path[1]) {
    const char *d = path + 1;
    long v = 0;
    for (; *d; d++) {
      if (*d < '0' || *d > '9' || v > 100000000) {
        seterr(err, errlen, "redis URL: the path must be a database number, /0 .. /%d", 100000000);
        return -EINVAL;
      }
      v = v * 10 + (*d - '0');
    }
    if (v > 100000000) {
      seterr(err, errlen, "redis URL: the path must be a database number, /0 .. /%d", 100000000);
      return -EINVAL;
    }
    if (u.cluster && v != 0) {
      seterr(err, errlen, "redis URL: a Redis Cluster has only database 0");
      return -EINVAL;
    }
    u.db = (int)v;
  }
  *out = u;
  return 0;
}

int kvs_redis_url_format(const kvs_redis_url_t *u, char *buf, size_t len) {
  if (!u || !buf || !len) return -EINVAL;
  size_t o = 0;
  int w = snprintf(buf, len, "%s://%s%s%s", u->cluster ? "redis+cluster" : "redis", u->user,
                   u->password[0] ? (u->user[0] ? ":***" : "***") : "",
                   (u->user[0] || u->password[0]) ? "@" : "");
  if (w < 0 || (size_t)w >= len) return -ENOSPC;
  o = (size_t)w;
  for (int i = 0; i < u->n_seeds; i++) {
    int v6 = strchr(u->seeds[i].host, ':') != NULL;
    w = snprintf(buf + o, len - o, "%s%s%s%s:%u", i ? "," : "", v6 ? "[" : "", u->seeds[i].host,
                 v6 ? "]" : "", (unsigned)u->seeds[i].port);
    if (w < 0 || (size_t)w >= len - o) return -ENOSPC;
    o += (size_t)w;
  }
  if (u->db) {
    w = snprintf(buf + o, len - o, "/%d", u->db);
    if (w < 0 || (size_t)w >= len - o) return -ENOSPC;
  }
  return 0;
}

/* ---- key slots -------------------------------------------------------------------------- */

/* CRC16-CCITT (XMODEM: poly 0x1021, init 0, no reflection), as the Redis Cluster spec's
 * "Keys distribution model" appendix defines it. */
static uint16_t crc16(const unsigned char *p, size_t n) {
  uint16_t crc = 0;
  for (size_t i = 0; i < n; i++) {
    crc ^= (uint16_t)(p[i] << 8);
    for (int b = 0; b < 8; b++)
      crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
  }
  return crc;
}

/* Spec, "Hash tags": only what lies between the first '{' and the first '}' after it is
 * hashed, when that is not empty. */
unsigned kvs_redis_key_slot(const char *key, size_t len) {
  const unsigned char *k = (const unsigned char *)key;
  const unsigned char *open = len ? memchr(k, '{', len) : NULL;
  if (open) {
    size_t s = (size_t)(open - k) + 1;
    const unsigned char *close = memchr(k + s, '}', len - s);
    if (close && close > k + s) return crc16(k + s, (size_t)(close - (k + s))) & (SLOTS - 1);
  }
  return crc16(k, len) & (SLOTS - 1);
}

/* ---- nodes: connection, output, reply queue ---------------------------------------------- */

static void node_close(node_t *n) {
  if (n->fd >= 0) close(n->fd);
  n->fd = -1;
  if (n->rd) redisReaderFree(n->rd);
  n->rd = NULL;
  n->nseg = n->seg_i = n->seg_done = 0;
  n->hdr_len = 0;
  n->qhead = n->qlen = 0;
  n->sink_on = 0;
  n->sink_dst = NULL;
}

/* Debug builds: the between-calls invariants of one node. */
__attribute__((unused)) static inline int node_is_idle(const kvs_redis_t *r, const node_t *n) {
  (void)r;
  return n->nseg == 0 && n->seg_i == 0 && n->qhead == 0 && n->qlen == 0 && !n->call_reply &&
         !n->sink_on &&
         (n->fd >= 0) == (n->rd != NULL) && (!n->rd || n->rd->pos <= n->rd->len);
}

static void node_free(node_t *n) {
  if (!n) return;
  node_close(n);
  if (n->call_reply) freeReplyObject(n->call_reply);
  free(n->hdr);
  free(n->seg);
  free(n->q);
  free(n);
}

static int node_find(kvs_redis_t *r, const char *host, uint16_t port, int create) {
  for (size_t i = 0; i < r->n_nodes; i++)
    if (r->nodes[i]->port == port && !strcmp(r->nodes[i]->host, host)) return (int)i;
  if (!create) return -ENOENT;
  if (r->n_nodes >= MAX_NODES || strlen(host) >= sizeof r->nodes[0]->host) return -ENOSPC;
  if ((r->n_nodes & (r->n_nodes - 1)) == 0) { /* grow at powers of two */
    node_t **nn = realloc(r->nodes, (r->n_nodes ? r->n_nodes * 2 : 4) * sizeof *nn);
    if (!nn) return -ENOMEM;
    r->nodes = nn;
  }
  node_t *n = calloc(1, sizeof *n);
  if (!n) return -ENOMEM;
  snprintf(n->host, sizeof n->host, "%s", host);
  n->port = port;
  n->fd = -1;
  r->nodes[r->n_nodes] = n;
  return (int)r->n_nodes++;
}

/* Set n's error (closing it) and fail every command still queued on it. */
static void node_fail(kvs_redis_t *r, node_t *n, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void node_fail(kvs_redis_t *r, node_t *n, int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(n->errstr, sizeof n->errstr, fmt, ap);
  va_end(ap);
  n->err = err;
  snprintf(r->err, sizeof r->err, "%s", n->errstr);
  for (size_t i = n->qhead; i < n->qlen; i++)
    if (n->q[i].kind == Q_CMD && r->res) {
      kvs_redis_result_t *res = &r->res[n->q[i].idx];
      memset(res, 0, sizeof *res);
      res->type = KVS_REDIS_FAILED;
      res->err = err;
    }
  node_close(n);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 16;
  while (c < need) c *= 2;
  void *np = realloc(*p, c * elem);
  if (!np) return -ENOMEM;
  *p = np;
  *cap = c;
  return 0;
}

static int out_hdr(node_t *n, const char *b, size_t len) {
  KVS_TRY(grow((void **)&n->hdr, &n->hdr_cap, n->hdr_len + len, 1));
  if (n->nseg && !n->seg[n->nseg - 1].p && n->seg[n->nseg - 1].off + n->seg[n->nseg - 1].len == n->hdr_len) {
    n->seg[n->nseg - 1].len += len;
  } else {
    KVS_TRY(grow((void **)&n->seg, &n->seg_cap, n->nseg + 1, sizeof *n->seg));
    n->seg[n->nseg++] = (seg_t){NULL, n->hdr_len, len};
  }
  memcpy(n->hdr + n->hdr_len, b, len);
  n->hdr_len += len;
  return 0;
}

/* Queue len bytes of an argument: from the caller's memory when large, else into hdr. */
static int out_bytes(node_t *n, const char *p, size_t len) {
  if (len >= BIG_ARG) {
    KVS_TRY(grow((void **)&n->seg, &n->seg_cap, n->nseg + 1, sizeof *n->seg));
    n->seg[n->nseg++] = (seg_t){p, 0, len};
    return 0;
  }
  return len ? out_hdr(n, p, len) : 0;
}

/* Queue one command (RESP array of bulk strings) and the reply it expects. An argument given
 * in parts (parts && parts[i]) is one bulk string of their summed length. */
static int node_append(node_t *n, int argc, const char *const *argv, const size_t *argvlen,
                       const kvs_redis_part_t *const *parts, const int *nparts, uint8_t kind,
                       uint32_t idx) {
  char tmp[32];
  KVS_TRY(grow((void **)&n->q, &n->qcap, n->qlen + 1, sizeof *n->q));
  int w = snprintf(tmp, sizeof tmp, "*%d\r\n", argc);
  KVS_TRY(out_hdr(n, tmp, (size_t)w));
  for (int i = 0; i < argc; i++) {
    const kvs_redis_part_t *pt = parts ? parts[i] : NULL;
    size_t len = 0;
    if (pt)
      for (int k = 0; k < nparts[i]; k++) len += pt[k].len;
    else
      len = argvlen ? argvlen[i] : strlen(argv[i]);
    w = snprintf(tmp, sizeof tmp, "$%zu\r\n", len);
    KVS_TRY(out_hdr(n, tmp, (size_t)w));
    if (pt)
      for (int k = 0; k < nparts[i]; k++) KVS_TRY(out_bytes(n, pt[k].base, pt[k].len));
    else
      KVS_TRY(out_bytes(n, argv[i], len));
    KVS_TRY(out_hdr(n, "\r\n", 2));
  }
  n->q[n->qlen++] = (qent_t){idx, kind};
  return 0;
}

/* Send what the socket takes. 0 (done or would block) or a negative errno. */
static int node_flush(node_t *n) {
  while (n->seg_i < n->nseg) {
    struct iovec iov[64];
    int cnt = 0;
    for (size_t i = n->seg_i; i < n->nseg && cnt < 64; i++, cnt++) {
      const seg_t *sg = &n->seg[i];
      const char *base = sg->p ? sg->p : n->hdr + sg->off;
      size_t skip = i == n->seg_i ? n->seg_done : 0;
      iov[cnt].iov_base = (void *)(base + skip);
      iov[cnt].iov_len = sg->len - skip;
    }
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
    ssize_t w = sendmsg(n->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -errno;
    }
    size_t left = (size_t)w;
    while (left && n->seg_i < n->nseg) {
      size_t rem = n->seg[n->seg_i].len - n->seg_done;
      if (left >= rem) { left -= rem; n->seg_i++; n->seg_done = 0; }
      else { n->seg_done += left; left = 0; }
    }
  }
  n->nseg = n->seg_i = n->seg_done = 0;
  n->hdr_len = 0;
  return 0;
}

/* Non-blocking TCP connect to n within the deadline; queues AUTH and SELECT. */
static int node_connect(kvs_redis_t *r, node_t *n, uint64_t deadline) {
  if (n->fd >= 0 && n->qhead == n->qlen && n->nseg == 0) {
    /* Idle: anything readable now (EOF of a restarted server, or data nobody asked for) means
     * the connection is no longer usable; reconnect before sending rather than fail after. */
    struct pollfd p = {.fd = n->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) != 0) node_close(n);
  }
  if (n->fd >= 0) return 0;
  if (n->failed_epoch == r->epoch && n->err) return n->err; /* refused once in this exec */
  char port[8];
  snprintf(port, sizeof port, "%u", (unsigned)n->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  int grc = getaddrinfo(n->host, port, &hints, &ai);
  int rc = -EHOSTUNREACH;
  if (grc != 0) {
    n->err = rc;
    snprintf(n->errstr, sizeof n->errstr, "redis %s:%u: cannot resolve host: %s", n->host,
             (unsigned)n->port, gai_strerror(grc));
    goto fail;
  }
  for (struct addrinfo *a = ai; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) { rc = -errno; continue; }
    if (connect(fd, a->ai_addr, a->ai_addrlen) < 0) {
      if (errno != EINPROGRESS) { rc = -errno; close(fd); continue; }
      rc = kvs_sock_wait(fd, POLLOUT, deadline);
      if (rc == 0) {
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) soerr = errno;
        rc = -soerr;
      }
      if (rc < 0) { close(fd); if (rc == -ETIMEDOUT) break; continue; }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    n->fd = fd;
    rc = 0;
    break;
  }
  freeaddrinfo(ai);
  if (rc < 0) {
    n->err = rc;
    snprintf(n->errstr, sizeof n->errstr, "redis %s:%u: connect: %s", n->host, (unsigned)n->port,
             rc == -ETIMEDOUT ? "timed out" : strerror(-rc));
    goto fail;
  }
  n->rd = redisReaderCreate();
  if (!n->rd) { node_close(n); return -ENOMEM; }
  n->err = 0;
  n->errstr[0] = 0;
  n->down_ns = 0;
  /* Handshake, pipelined ahead of the first command. */
  if (r->password[0]) {
    const char *av[3] = {"AUTH", r->url.user, r->password};
    if (r->url.user[0]) rc = node_append(n, 3, av, NULL, NULL, NULL, Q_AUTH, 0);
    else { av[1] = r->password; rc = node_append(n, 2, av, NULL, NULL, NULL, Q_AUTH, 0); }
  }
  if (rc == 0 && !r->url.cluster && r->url.db) {
    char db[16];
    snprintf(db, sizeof db, "%d", r->url.db);
    const char *av[2] = {"SELECT", db};
    rc = node_append(n, 2, av, NULL, NULL, NULL, Q_SELECT, 0);
  }
  if (rc < 0) { node_close(n); return rc; }
  return 0;
fail:
  n->failed_epoch = r->epoch;
  n->down_ns = kvs__now_ns();
  snprintf(r->err, sizeof r->err, "%s", n->errstr);
  return rc;
}

static void set_result(kvs_redis_result_t *res, const redisReply *rp) {
  memset(res, 0, sizeof *res);
  switch (rp->type) {
  case REDIS_REPLY_STRING: res->type = KVS_REDIS_STRING; break;
  case REDIS_REPLY_STATUS: res->type = KVS_REDIS_STATUS; break;
  case REDIS_REPLY_ERROR: res->type = KVS_REDIS_ERROR; break;
  case REDIS_REPLY_INTEGER: res->type = KVS_REDIS_INTEGER; res->integer = rp->integer; return;
  case REDIS_REPLY_ARRAY: res->type = KVS_REDIS_ARRAY; res->integer = (long long)rp->elements; return;
  default: res->type = KVS_REDIS_NIL; return;
  }
  res->str = rp->str;
  res->len = rp->len;
}

static int is_err(const redisReply *rp, const char *prefix) {
  size_t n = strlen(prefix);
  return rp->type == REDIS_REPLY_ERROR && rp->len >= n && !memcmp(rp->str, prefix, n);
}

/* One reply arrived on n: give it to the head of its queue. */
static void dispatch(kvs_redis_t *r, node_t *n, redisReply *rp) {
  qent_t e = n->q[n->qhead++];
  switch (e.kind) {
  case Q_CMD:
    if (r->rep[e.idx]) freeReplyObject(r->rep[e.idx]);
    r->rep[e.idx] = rp;
    set_result(&r->res[e.idx], rp);
    return;
  case Q_AUTH:
    if (rp->type == REDIS_REPLY_ERROR)
      node_fail(r, n, -EACCES, "redis %s:%u: authentication refused: %.*s", n->host,
                (unsigned)n->port, (int)(rp->len > 100 ? 100 : rp->len), rp->str);
    break;
  case Q_SELECT:
    if (rp->type == REDIS_REPLY_ERROR)
      node_fail(r, n, -EINVAL, "redis %s:%u: SELECT %d refused: %.*s", n->host,
                (unsigned)n->port, r->url.db, (int)(rp->len > 100 ? 100 : rp->len), rp->str);
    break;
  case Q_CALL:
    if (n->call_reply) freeReplyObject(n->call_reply);
    n->call_reply = rp;
    return;
  default: /* Q_ASKING: an error shows in the command's own reply */
    break;
  }
  freeReplyObject(rp);
}

/* The sink of the command whose reply is next on n, or NULL. */
static const kvs_redis_sink_t *head_sink(const kvs_redis_t *r, const node_t *n) {
  if (n->qhead >= n->qlen || !r->cmds) return NULL;
  const qent_t *e = &n->q[n->qhead];
  return e->kind == Q_CMD ? r->cmds[e->idx].sink : NULL;
}

/* Drop the consumed front of the reader's buffer (it must not grow by what a sink consumed). */
static void reader_compact(redisReader *rd) {
  if (rd->pos == rd->len) {
    sdsclear(rd->buf);
    rd->pos = rd->len = 0;
  } else if (rd->pos >= 1024) {
    sdsrange(rd->buf, (int)rd->pos, -1);
    rd->pos = 0;
    rd->len = sdslen(rd->buf);
  }
}

enum { SINK_NONE, SINK_WAIT, SINK_DONE, SINK_FAILED };

/* The reply at the head of n's queue, if its command has a sink and it is a bulk string: take
 * it over from hiredis (whose reader sits between replies), call dest once its head is in,
 * then move what the reader holds of the rest to the destination; node_read receives the
 * rest straight there. SINK_NONE: not a sink reply (hiredis parses it), SINK_WAIT: more bytes
 * needed, SINK_DONE: the reply is given to its command, SINK_FAILED: n failed. */
static int sink_step(kvs_redis_t *r, node_t *n) {
  redisReader *rd = n->rd;
  if (!n->sink_on) {
    const kvs_redis_sink_t *sk = head_sink(r, n);
    if (!sk || rd->ridx != -1) return SINK_NONE;
    if (rd->pos >= rd->len) return SINK_WAIT;
    if (rd->buf[rd->pos] != '$') return SINK_NONE;
    size_t p = rd->pos + 1, q = p;
    unsigned long long blen = 0;
    for (; q < rd->len && rd->buf[q] >= '0' && rd->buf[q] <= '9' && q - p < 12; q++)
      blen = blen * 10 + (unsigned)(rd->buf[q] - '0');
    if (q - p < 12 && q + 1 >= rd->len) return SINK_WAIT; /* the length line is not all in */
    if (q == p || rd->buf[q] != '\r' || rd->buf[q + 1] != '\n' || blen > (1ull << 40))
      return SINK_NONE; /* "$-1" (nil) or not a length: hiredis says what it is */
    size_t body = q + 2, head = sk->head < blen ? sk->head : (size_t)blen;
    if (rd->len - body < head) return SINK_WAIT;
    n->sink_dst = sk->dest(sk->ctx, (size_t)blen, rd->buf + body, head);
    n->sink_on = 1;
    n->sink_total = (size_t)blen;
    n->sink_len = (size_t)blen - head;
    n->sink_got = 0;
    rd->pos = body + head;
  }
  size_t avail = rd->len - rd->pos, take = n->sink_len - n->sink_got;
  if (take > avail) take = avail;
  if (take && n->sink_dst) memcpy(n->sink_dst + n->sink_got, rd->buf + rd->pos, take);
  rd->pos += take;
  n->sink_got += take;
  reader_compact(rd);
  if (n->sink_got < n->sink_len || rd->len - rd->pos < 2) return SINK_WAIT;
  if (rd->buf[rd->pos] != '\r' || rd->buf[rd->pos + 1] != '\n') {
    node_fail(r, n, -EPROTO, "redis %s:%u: not a Redis server? (bulk string without its end)",
              n->host, (unsigned)n->port);
    return SINK_FAILED;
  }
  rd->pos += 2;
  reader_compact(rd);
  n->sink_on = 0;
  n->sink_dst = NULL;
  qent_t e = n->q[n->qhead++];
  if (r->rep[e.idx]) freeReplyObject(r->rep[e.idx]);
  r->rep[e.idx] = NULL;
  kvs_redis_result_t *res = &r->res[e.idx];
  memset(res, 0, sizeof *res);
  res->type = KVS_REDIS_STRING;
  res->len = n->sink_total;
  return SINK_DONE;
}

/* Give the replies complete in n's reader to their queue entries. 0, or -1: n failed. Done
 * after every receive, so the reader's buffer holds little more than one reply (it moves what
 * follows a consumed reply to its front). */
static int drain(kvs_redis_t *r, node_t *n) {
  while (n->qhead < n->qlen) {
    int s = sink_step(r, n);
    if (s == SINK_WAIT) return 0;
    if (s == SINK_FAILED) return -1;
    if (s == SINK_DONE) continue;
    void *rp = NULL;
    if (redisReaderGetReply(n->rd, &rp) != REDIS_OK) {
      node_fail(r, n, -EPROTO, "redis %s:%u: not a Redis server? (%s)", n->host,
                (unsigned)n->port, n->rd->errstr);
      return -1;
    }
    if (!rp) return 0;
    dispatch(r, n, rp);
    if (n->fd < 0) return -1;
  }
  if (n->rd->len > n->rd->pos) {
    /* Bytes nobody asked for: this server does not follow the protocol, so none of what it
     * answered in this call is trusted. */
    node_fail(r, n, -EPROTO, "redis %s:%u: not a Redis server? (unexpected data)", n->host,
              (unsigned)n->port);
    for (size_t i = 0; r->res && i < r->n_rep; i++)
      if (r->st[i].node != NO_NODE && r->nodes[r->st[i].node] == n) {
        memset(&r->res[i], 0, sizeof r->res[i]);
        r->res[i].type = KVS_REDIS_FAILED;
        r->res[i].err = -EPROTO;
      }
    if (n->call_reply) {
      freeReplyObject(n->call_reply);
      n->call_reply = NULL;
    }
    return -1;
  }
  n->qhead = n->qlen = 0;
  return 0;
}

/* How many bytes to make room for before the next receive: when the reader sits at the start
 * of a top-level bulk string whose length line is in, the rest of it (so a large value is
 * received straight into one buffer of the right size), else RBUF_SIZE. The reader's fields are
 * public in hiredis 0.14 (read.h); its parser (redisReaderGetReply) only needs buf/len to be an
 * sds and its length, which node_read keeps. */
static size_t room_hint(const redisReader *rd) {
  size_t p = rd->pos;
  if (rd->ridx == -1 && p < rd->len && rd->buf[p] == '$') p++;
  else if (!(rd->ridx == 0 && rd->rstack[0].type == REDIS_REPLY_STRING)) return RBUF_SIZE;
  unsigned long long blen = 0;
  size_t q = p;
  for (; q < rd->len && rd->buf[q] >= '0' && rd->buf[q] <= '9' && q - p < 12; q++)
    blen = blen * 10 + (unsigned)(rd->buf[q] - '0');
  if (q == p || q + 1 >= rd->len || rd->buf[q] != '\r' || blen > (1ull << 30)) return RBUF_SIZE;
  size_t end = q + 2 + (size_t)blen + 2; /* where this reply ends in buf */
  return end > rd->len + RBUF_SIZE ? end - rd->len : RBUF_SIZE;
}

/* Between calls, a reader buffer grown for large values is given back. */
static void node_trim(node_t *n) {
  redisReader *rd = n->rd;
  if (rd && rd->len == rd->pos && sdsalloc(rd->buf) > 4 * RBUF_SIZE) {
    sds e = sdsempty();
    if (e) { sdsfree(rd->buf); rd->buf = e; rd->pos = rd->len = 0; }
  }
}

/* Receive what is there (until the socket would block) straight into the reader's buffer and
 * dispatch complete replies after every receive. */
static void node_read(kvs_redis_t *r, node_t *n) {
  for (;;) {
    redisReader *rd = n->rd;
    size_t room;
    char *dst;
    const kvs_redis_sink_t *sk = NULL;
    int direct = n->sink_on && n->sink_dst && n->sink_got < n->sink_len && rd->pos == rd->len;
    if (direct) { /* a sink's bytes, straight from the socket into the caller's memory */
      dst = n->sink_dst + n->sink_got;
      room = n->sink_len - n->sink_got;
    } else {
      if (n->sink_on) /* bytes dropped, or the "\r\n": no further than this reply's end */
        room = n->sink_len - n->sink_got + 2 < RBUF_SIZE ? n->sink_len - n->sink_got + 2 : RBUF_SIZE;
      else if ((sk = head_sink(r, n)) != NULL) /* its length line and head, hardly more */
        room = 32 + sk->head;
      else
        room = room_hint(rd);
      char *nb = sdsMakeRoomFor(rd->buf, room);
      if (!nb) {
        node_fail(r, n, -ENOMEM, "redis %s:%u: out of memory", n->host, (unsigned)n->port);
        return;
      }
      rd->buf = nb;
      dst = rd->buf + rd->len;
    }
    ssize_t got = recv(n->fd, dst, room, MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      int e = errno;
      node_fail(r, n, -e, "redis %s:%u: receive: %s", n->host, (unsigned)n->port, strerror(e));
      return;
    }
    if (got == 0) {
      node_fail(r, n, -ECONNRESET, "redis %s:%u: connection closed by the server", n->host,
                (unsigned)n->port);
      return;
    }
    if (direct) {
      n->sink_got += (size_t)got;
    } else {
      sdsIncrLen(rd->buf, (int)got);
      rd->len += (size_t)got;
    }
    if (drain(r, n) < 0) return;
    if ((size_t)got < room) return;
  }
}

/* Drive every node with something queued until all replies are in or the deadline passes. */
static void io_run(kvs_redis_t *r, uint64_t deadline) {
  struct pollfd pf[64];
  node_t *pn[64];
  for (;;) {
    size_t np = 0;
    for (size_t i = 0; i < r->n_nodes && np < 64; i++) {
      node_t *n = r->nodes[i];
      if (n->fd < 0 || n->qhead == n->qlen) continue;
      if (n->seg_i < n->nseg) {
        int rc = node_flush(n);
        if (rc < 0) {
          node_fail(r, n, rc, "redis %s:%u: send: %s", n->host, (unsigned)n->port, strerror(-rc));
          continue;
        }
      }
      pf[np] = (struct pollfd){.fd = n->fd, .events = (short)(POLLIN | (n->seg_i < n->nseg ? POLLOUT : 0))};
      pn[np++] = n;
    }
    if (!np) return;
    uint64_t now = kvs__now_ns();
    if (now >= deadline) {
      for (size_t i = 0; i < np; i++)
        node_fail(r, pn[i], -ETIMEDOUT, "redis %s:%u: no reply within %u ms", pn[i]->host,
                  (unsigned)pn[i]->port, r->timeout_ms);
      return;
    }
    int ms = (int)((deadline - now + 999999) / 1000000);
    int rc = poll(pf, np, ms);
    if (rc < 0 && errno != EINTR) {
      int e = errno;
      for (size_t i = 0; i < np; i++) node_fail(r, pn[i], -e, "redis: poll: %s", strerror(e));
      return;
    }
    for (size_t i = 0; rc > 0 && i < np; i++) {
      if (!pf[i].revents || pn[i]->fd < 0) continue;
      if (pf[i].revents & POLLOUT) {
        int frc = node_flush(pn[i]);
        if (frc < 0) {
          node_fail(r, pn[i], frc, "redis %s:%u: send: %s", pn[i]->host, (unsigned)pn[i]->port,
                    strerror(-frc));
          continue;
        }
      }
      if (pf[i].revents & (POLLIN | POLLERR | POLLHUP)) node_read(r, pn[i]);
    }
  }
}

/* One internal command on node ni; the reply (owned by the caller) or a negative errno. */
static int node_call(kvs_redis_t *r, node_t *n, int argc, const char *const *argv,
                     uint64_t deadline, redisReply **out) {
  KVS_TRY(node_connect(r, n, deadline));
  int rc = node_append(n, argc, argv, NULL, NULL, NULL, Q_CALL, 0);
  if (rc < 0) { node_close(n); return rc; }
  io_run(r, deadline);
  if (!n->call_reply || n->fd < 0) { /* no reply, or the node failed after it */
    if (n->call_reply) freeReplyObject(n->call_reply);
    n->call_reply = NULL;
    return n->err ? n->err : -EPROTO;
  }
  *out = n->call_reply;
  n->call_reply = NULL;
  if ((*out)->type == REDIS_REPLY_ERROR && is_err(*out, "NOAUTH")) {
    snprintf(r->err, sizeof r->err, "redis %s:%u: the server wants a password (none configured)",
             n->host, (unsigned)n->port);
    freeReplyObject(*out);
    *out = NULL;
    return -EACCES;
  }
  return 0;
}

/* ---- cluster slot map ------------------------------------------------------------------- */

/* CLUSTER SLOTS reply (Redis docs, CLUSTER SLOTS): an array of [start, end, master, replicas...]
 * where each node is [host, port, id, ...]; an empty host means "the node you asked". */
static int apply_slots(kvs_redis_t *r, node_t *asked, const redisReply *rp) {
  if (rp->type != REDIS_REPLY_ARRAY) return -EPROTO;
  uint16_t *map = malloc(SLOTS * sizeof *map);
  if (!map) return -ENOMEM;
  for (unsigned i = 0; i < SLOTS; i++) map[i] = NO_NODE;
  int rc = 0;
  for (size_t i = 0; i < rp->elements && rc == 0; i++) {
    const redisReply *e = rp->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER) { rc = -EPROTO; break; }
    long long lo = e->element[0]->integer, hi = e->element[1]->integer;
    if (lo < 0 || hi >= SLOTS || lo > hi) { rc = -EPROTO; break; }
    for (size_t k = 2; k < e->elements; k++) {
      const redisReply *nd = e->element[k];
      if (nd->type != REDIS_REPLY_ARRAY || nd->elements < 2 || nd->element[0]->type != REDIS_REPLY_STRING ||
          nd->element[1]->type != REDIS_REPLY_INTEGER || nd->element[1]->integer <= 0 ||
          nd->element[1]->integer > 65535) { rc = -EPROTO; break; }
      const char *host = nd->element[0]->str;
      if (!host[0] || !strcmp(host, "?")) host = asked->host;
      int ni = node_find(r, host, (uint16_t)nd->element[1]->integer, 1);
      if (ni < 0) { rc = ni; break; }
      if (k == 2)
        for (long long s = lo; s <= hi; s++) map[s] = (uint16_t)ni;
    }
  }
  if (rc == 0) {
    free(r->slot);
    r->slot = map;
    r->map_stale = 0;
  } else {
    free(map);
  }
  return rc;
}

/* Ask the known nodes for the slot map: the last one that answered first, then the others,
 * those whose last connect failed (a dead master, say) last; those that failed in this exec
 * not at all. */
static int refresh_slots(kvs_redis_t *r, uint64_t deadline) {
  static const char *const av[2] = {"CLUSTER", "SLOTS"};
  int rc = -EHOSTUNREACH;
  size_t n_known = r->n_nodes;
  for (int pass = 0; pass < 2; pass++)
    for (size_t k = 0; k < n_known && kvs__now_ns() < deadline; k++) {
      size_t i = (r->last_good + k) % n_known;
      node_t *n = r->nodes[i];
      if ((n->down_ns != 0) != (pass == 1)) continue;
      if (n->fd < 0 && n->failed_epoch == r->epoch && n->err) continue;
      redisReply *rp = NULL;
      rc = node_call(r, n, 2, av, deadline, &rp);
      if (rc < 0) continue;
      if (rp->type == REDIS_REPLY_ERROR) {
        snprintf(r->err, sizeof r->err, "redis %s:%u: CLUSTER SLOTS refused: %.*s (not a cluster node?)",
                 n->host, (unsigned)n->port, (int)(rp->len > 100 ? 100 : rp->len), rp->str);
        freeReplyObject(rp);
        rc = -EPROTO;
        continue;
      }
      rc = apply_slots(r, n, rp);
      freeReplyObject(rp);
      if (rc == -EPROTO)
        snprintf(r->err, sizeof r->err, "redis %s:%u: CLUSTER SLOTS reply of the wrong shape",
                 n->host, (unsigned)n->port);
      if (rc == 0) {
        r->last_good = i;
        return 0;
      }
    }
  return rc;
}

/* ---- create / destroy ------------------------------------------------------------------- */

int kvs_redis_create(const kvs_redis_config_t *cfg, kvs_redis_t **out, char *err, size_t errlen) {
  if (!cfg || !out || cfg->url.n_seeds < 1 || cfg->url.n_seeds > KVS_REDIS_MAX_SEEDS) {
    seterr(err, errlen, "redis: bad configuration (no server)");
    return -EINVAL;
  }
  if (cfg->password && strlen(cfg->password) >= sizeof ((kvs_redis_t *)0)->password) {
    seterr(err, errlen, "redis: password longer than %zu bytes", sizeof ((kvs_redis_t *)0)->password - 1);
    return -EINVAL;
  }
  kvs_redis_t *r = calloc(1, sizeof *r);
  if (!r) {
    seterr(err, errlen, "redis: out of memory");
    return -ENOMEM;
  }
  r->url = cfg->url;
  snprintf(r->password, sizeof r->password, "%s", cfg->password ? cfg->password : cfg->url.password);
  memset(r->url.password, 0, sizeof r->url.password);
  r->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 1000;
  r->epoch = 1;
  int rc = 0;
  for (int i = 0; i < r->url.n_seeds && rc >= 0; i++)
    rc = node_find(r, r->url.seeds[i].host, r->url.seeds[i].port, 1);
  if (rc < 0) {
    seterr(err, errlen, "redis: out of memory");
    kvs_redis_destroy(r);
    return rc;
  }
  uint64_t deadline = kvs__now_ns() + (uint64_t)r->timeout_ms * 1000000u;
  if (r->url.cluster) {
    rc = refresh_slots(r, deadline);
  } else {
    static const char *const av[1] = {"PING"};
    redisReply *rp = NULL;
    rc = node_call(r, r->nodes[0], 1, av, deadline, &rp);
    if (rc == 0) {
      if (rp->type != REDIS_REPLY_STATUS || strcmp(rp->str, "PONG")) {
        snprintf(r->err, sizeof r->err, "redis %s:%u: not a Redis server? (PING answered %s%.*s)",
                 r->nodes[0]->host, (unsigned)r->nodes[0]->port,
                 rp->type == REDIS_REPLY_ERROR ? "an error: " : "something else than PONG",
                 rp->type == REDIS_REPLY_ERROR ? (int)(rp->len > 80 ? 80 : rp->len) : 0,
                 rp->type == REDIS_REPLY_ERROR ? rp->str : "");
        rc = -EPROTO;
      }
      freeReplyObject(rp);
    }
  }
  if (rc < 0) {
    seterr(err, errlen, "%s", r->err[0] ? r->err : "redis: connect failed");
    kvs_redis_destroy(r);
    return rc;
  }
  r->err[0] = 0;
  *out = r;
  return 0;
}

void kvs_redis_results_release(kvs_redis_t *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n_rep; i++)
    if (r->rep[i]) freeReplyObject(r->rep[i]);
  r->n_rep = 0;
}

void kvs_redis_destroy(kvs_redis_t *r) {
  if (!r) return;
  kvs_redis_results_release(r);
  for (size_t i = 0; i < r->n_nodes; i++) node_free(r->nodes[i]);
  free(r->nodes);
  free(r->slot);
  free(r->rep);
  free(r->st);
  explicit_bzero(r->password, sizeof r->password);
  free(r);
}

const char *kvs_redis_last_error(const kvs_redis_t *r) { return r ? r->err : ""; }

/* ---- exec ------------------------------------------------------------------------------- */

/* The node a command goes to: its ASK target, its slot's owner, or (keyless) any master. */
static int route(kvs_redis_t *r, const kvs_redis_cmd_t *c, const cst_t *st) {
  if (!r->url.cluster) return 0;
  if (st->ask_node != NO_NODE) return st->ask_node;
  if (!r->slot) return -EHOSTUNREACH;
  if (c->key_arg < 0) {
    for (unsigned s = 0; s < SLOTS; s++)
      if (r->slot[s] != NO_NODE) return r->slot[s];
    return -EHOSTUNREACH;
  }
  unsigned s = kvs_redis_key_slot(c->argv[c->key_arg], c->argvlen[c->key_arg]);
  return r->slot[s] == NO_NODE ? -EHOSTUNREACH : r->slot[s];
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": the node named (created if new), the slot in *slot. */
static int redirect_node(kvs_redis_t *r, const redisReply *rp, const node_t *from, unsigned *slot) {
  char buf[320];
  if (rp->len >= sizeof buf) return -EPROTO;
  memcpy(buf, rp->str, rp->len);
  buf[rp->len] = 0;
  char *sp1 = strchr(buf, ' ');
  char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
  char *colon = sp2 ? strrchr(sp2 + 1, ':') : NULL;
  if (!colon) return -EPROTO;
  char *end;
  unsigned long s = strtoul(sp1 + 1, &end, 10);
  if (end != sp2 || s >= SLOTS) return -EPROTO;
  uint16_t port;
  if (parse_port(colon + 1, strlen(colon + 1), &port) < 0) return -EPROTO;
  *colon = 0;
  char *host = sp2 + 1;
  if (*host == '[' && colon > host + 1 && colon[-1] == ']') { host++; colon[-1] = 0; }
  if (!*host) host = (char *)from->host;
  *slot = (unsigned)s;
  return node_find(r, host, port, 1);
}

/* Arguments in parts: counts given, >= 0, each part with bytes has a base; not the key. */
static int parts_ok(const kvs_redis_cmd_t *c) {
  if (c->sink && (!c->sink->dest || c->sink->head > 4096)) return 0;
  if (!c->parts) return 1;
  if (!c->nparts || (c->key_arg >= 0 && c->parts[c->key_arg])) return 0;
  for (int i = 0; i < c->argc; i++) {
    if (!c->parts[i]) continue;
    if (c->nparts[i] < 0) return 0;
    for (int k = 0; k < c->nparts[i]; k++)
      if (c->parts[i][k].len && !c->parts[i][k].base) return 0;
  }
  return 1;
}

int kvs_redis_exec(kvs_redis_t *r, const kvs_redis_cmd_t *cmds, size_t n,
                   kvs_redis_result_t *results) {
  if (!r || (n && (!cmds || !results))) return -EINVAL;
  kvs_redis_results_release(r);
  if (n == 0) return 0;
  uint64_t deadline = kvs__now_ns() + (uint64_t)r->timeout_ms * 1000000u;
  if (grow((void **)&r->rep, &r->rep_cap, n, sizeof *r->rep) < 0 ||
      grow((void **)&r->st, &r->st_cap, n, sizeof *r->st) < 0)
    return -ENOMEM;
  r->epoch++;
  r->cmds = cmds;
  r->res = results;
  r->n_rep = n;
  r->sent_any = 0;
  r->err[0] = 0;
  int first_err = 0;
  for (size_t i = 0; i < n; i++) {
    r->rep[i] = NULL;
    memset(&results[i], 0, sizeof results[i]);
    results[i].type = KVS_REDIS_FAILED;
    results[i].err = -EAGAIN;
    r->st[i] = (cst_t){.node = NO_NODE, .ask_node = NO_NODE, .todo = 1};
    const kvs_redis_cmd_t *c = &cmds[i];
    if (c->argc < 1 || !c->argv || !c->argvlen || c->key_arg >= c->argc || !parts_ok(c)) {
      results[i].err = -EINVAL;
      r->st[i].todo = 0;
      snprintf(r->err, sizeof r->err, "redis: command %zu is malformed", i);
    }
  }
  if (r->url.cluster && (r->map_stale || !r->slot)) refresh_slots(r, deadline);
  for (int round = 0; round < 4; round++) {
    size_t todo = 0;
    for (size_t i = 0; i < n; i++) {
      cst_t *st = &r->st[i];
      if (!st->todo) continue;
      st->todo = 0;
      st->unsent = 0;
      if (r->rep[i]) { freeReplyObject(r->rep[i]); r->rep[i] = NULL; }
      memset(&results[i], 0, sizeof results[i]);
      results[i].type = KVS_REDIS_FAILED;
      results[i].err = -EAGAIN;
      const kvs_redis_cmd_t *c = &cmds[i];
      int ni = route(r, c, st);
      int rc = ni;
      if (ni >= 0) rc = node_connect(r, r->nodes[ni], deadline);
      if (ni >= 0 && rc == 0 && st->ask_node != NO_NODE) {
        static const char *const av[1] = {"ASKING"};
        rc = node_append(r->nodes[ni], 1, av, NULL, NULL, NULL, Q_ASKING, 0);
      }
      if (rc == 0) rc = node_append(r->nodes[ni], c->argc, c->argv, c->argvlen, c->parts, c->nparts, Q_CMD,
                                   (uint32_t)i);
      st->ask_node = NO_NODE;
      if (rc < 0) {
        results[i].err = rc;
        st->unsent = 1;
        if (rc == -EHOSTUNREACH && ni < 0)
          snprintf(r->err, sizeof r->err, "redis cluster: no node serves the slot of command %zu", i);
        if (!first_err) first_err = rc;
        if (ni >= 0 && rc == -ENOMEM)
          node_fail(r, r->nodes[ni], rc, "redis %s:%u: out of memory", r->nodes[ni]->host,
                    (unsigned)r->nodes[ni]->port);
        continue;
      }
      st->node = (uint16_t)ni;
      r->sent_any = 1;
      todo++;
    }
    if (todo) io_run(r, deadline);
    if (!r->url.cluster) break;
    /* Redirections and dead masters: at most one more try each, within the deadline. */
    size_t again = 0;
    for (size_t i = 0; i < n; i++) {
      cst_t *st = &r->st[i];
      kvs_redis_result_t *res = &results[i];
      const redisReply *rp = r->rep[i];
      if (res->type == KVS_REDIS_ERROR && rp && (is_err(rp, "MOVED ") || is_err(rp, "ASK "))) {
        int ask = rp->str[0] == 'A';
        if (ask ? st->asked : st->moved) continue;
        unsigned slot;
        int ni = redirect_node(r, rp, r->nodes[st->node], &slot);
        if (ni < 0) continue;
        if (ask) { st->asked = 1; st->ask_node = (uint16_t)ni; }
        else {
          st->moved = 1;
          if (r->slot) r->slot[slot] = (uint16_t)ni;
          r->map_stale = 1;
        }
        st->todo = 1;
        again++;
      } else if (res->type == KVS_REDIS_FAILED && st->unsent && !st->rerouted &&
                 res->err != -EINVAL && res->err != -ENOMEM) {
        st->rerouted = 1;
        st->todo = 1;
        r->map_stale = 1;
        again++;
      }
    }
    if (!again || kvs__now_ns() >= deadline) break;
    if (r->map_stale) refresh_slots(r, deadline);
  }
  r->res = NULL;
  r->cmds = NULL;
  for (size_t i = 0; i < r->n_nodes; i++) {
    node_trim(r->nodes[i]);
    KVS__DEBUG_CHECK(node_is_idle(r, r->nodes[i]));
  }
  int ok = 0;
  for (size_t i = 0; i < n; i++) {
    if (results[i].type != KVS_REDIS_FAILED) ok++;
    else if (!first_err) first_err = results[i].err;
  }
  if (ok == 0 && !r->sent_any) return first_err ? first_err : -EIO;
  return ok;
}

/* ---- info ------------------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int kvs_redis_info(kvs_redis_t *r, kvs_redis_info_t *out) {
  if (!r || !out) return -EINVAL;
  kvs_redis_info_t inf;
  memset(&inf, 0, sizeof inf);
  r->epoch++;
  uint64_t deadline = kvs__now_ns() + (uint64_t)r->timeout_ms * 1000000u;
  node_t *n = r->nodes[0];
  if (r->url.cluster) {
    if (refresh_slots(r, deadline) < 0) return -EHOSTUNREACH;
    char seen[MAX_NODES] = {0};
    for (unsigned s = 0; s < SLOTS; s++) {
      if (r->slot[s] == NO_NODE) continue;
      inf.slots_covered++;
      if (!seen[r->slot[s]]) { seen[r->slot[s]] = 1; inf.n_nodes++; }
    }
    int ni = route(r, &(kvs_redis_cmd_t){.key_arg = -1}, &(cst_t){.ask_node = NO_NODE});
    if (ni < 0) return ni;
    n = r->nodes[ni];
    inf.cluster = 1;
  } else {
    inf.n_nodes = 1;
    inf.slots_covered = (int)SLOTS;
  }
  static const char *const info_av[2] = {"INFO", "server"};
  redisReply *rp = NULL;
  KVS_TRY(node_call(r, n, 2, info_av, deadline, &rp));
  int rc = -EPROTO;
  if (rp->type == REDIS_REPLY_STRING) {
    const char *v = strstr(rp->str, "redis_version:");
    if (v) {
      v += strlen("redis_version:");
      size_t len = strcspn(v, "\r\n");
      if (len >= sizeof inf.version) len = sizeof inf.version - 1;
      memcpy(inf.version, v, len);
      rc = 0;
    }
  }
  if (rc < 0)
    snprintf(r->err, sizeof r->err, "redis %s:%u: INFO server has no redis_version", n->host,
             (unsigned)n->port);
  freeReplyObject(rp);
  if (rc < 0) return rc;
  static const char *const ping_av[1] = {"PING"};
  uint64_t rtt[5];
  for (int i = 0; i < 5; i++) {
    uint64_t t0 = kvs__now_ns();
    KVS_TRY(node_call(r, n, 1, ping_av, deadline, &rp));
    rtt[i] = kvs__now_ns() - t0;
    freeReplyObject(rp);
  }
  qsort(rtt, 5, sizeof rtt[0], cmp_u64);
  inf.rtt_us = (double)rtt[2] / 1000.0;
  *out = inf;
  return 0;
}
