/* kvshim-bench-peer: peer retrieve throughput and control-plane latency, each printed next to
 * its physical limit measured in the same run (design §16; never run by ctest).
 *
 * Two processes: a server (pool + store + coordinator, forked first so the client has no
 * thread at fork time) and this client. For each chunk size (256 KiB, 2 MiB, 16 MiB) the
 * server holds objects covering a region larger than the last-level cache (--region, default
 * max(256 MiB, 2 x LLC)), and every figure walks that region in the same rotating order, one
 * chunk per call, into a destination region of the same size (also larger than the LLC):
 *   memcpy        single-thread glibc memcpy from the server's pool mapping (the same pages)
 *   memcpy-nt     the same with non-temporal (cache-bypassing) stores
 *   shm           kvs_peers_retrieve over SHM (PREPARE_RETRIEVE + COMMIT_RETRIEVE), the sink
 *                 copying with memcpy; shm-nt: the sink copying with non-temporal stores;
 *                 shm-auto: the sink copying with kvs_peers_copy (the copy picked by size: what
 *                 a shim's sink uses; the SHM goal is set on it)
 *   inline        kvs_peers_retrieve inline (the bytes travel in the reply; the sink copies
 *                 them out of the reply buffer); inline-into: kvs_peers_retrieve_into, the
 *                 reply's bytes received straight into the destination (the inline goal is
 *                 set on it)
 *   socket        raw Unix stream socket bulk between the two processes: a 64-byte request,
 *                 then the chunk written straight from the object's pages into the client's
 *                 destination (no protocol, no extra copy): the limit inline is held to
 * Control plane: the retrieve of one cached key with no instance named (kvs_peers_retrieve, a
 * sink that copies nothing): with this one peer that is PREPARE_RETRIEVE (the lookup and the
 * pins in one round trip) and a posted COMMIT_RETRIEVE; and one PING, p50/p99, beside a raw
 * 64-byte socket round trip on the same kind of socket.
 * Coordinator throughput: 8 client threads, each with its own connection (its own
 * kvs_peers_t), doing 16-key LOOKUPs (all 16 keys held) back to back: total ops/s, beside 8
 * client threads doing raw 64-byte ping-pongs with one server thread that serves all 8 raw
 * sockets through epoll (the coordinator is one epoll thread too).
 * Every figure is repeated --reps times (default 5), interleaved; medians and min-max are
 * printed, then one JSON line with every figure and ratio. --quick: 64 MiB region (inside the
 * LLC: a smoke run, not a measurement), 3 reps. --rtt-only / --only METHOD: for profiling.
 * Build without KVSHIM_DEBUG (its validators dominate the control-plane figures). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord.h"
#include "internal.h"
#include "peer.h"
#include "pool.h"
#include "prim.h"
#include "proto.h"
#include "sock.h"
#include "store.h"

#define MAX_REPS 101
#define N_SIZES 3
#define RTT_SAMPLES 20000
#define MAX_OBJS 8192
#define TP_CLIENTS 8
#define TP_KEYS 16

static const uint64_t SIZES[N_SIZES] = {256u << 10, 2u << 20, 16u << 20};
static const char *const SIZE_NAMES[N_SIZES] = {"256k", "2m", "16m"};
static const char *const SIZE_LABELS[N_SIZES] = {"256 KiB", "2 MiB", "16 MiB"};

enum { M_MEMCPY, M_NT, M_SHM, M_SHM_NT, M_SHM_AUTO, M_INLINE, M_INLINE_INTO, M_SOCK, M__COUNT };
static const char *const M_NAMES[M__COUNT] = {"memcpy", "memcpy_nt", "shm", "shm_nt", "shm_auto",
                                              "inline", "inline_into", "socket"};
static const char *const M_LABELS[M__COUNT] = {
    "memcpy (limit for shm)", "memcpy, non-temporal stores", "SHM retrieve, memcpy sink",
    "SHM retrieve, non-temporal sink", "SHM retrieve, kvs_peers_copy sink", "inline retrieve",
    "inline retrieve into the destination", "raw socket bulk (limit for inline)"};

enum { R_RAW, R_CTL, R_PING, R__COUNT };
static const char *const R_NAMES[R__COUNT] = {"raw64_rtt", "control_rtt", "ping_rtt"};
static const char *const R_LABELS[R__COUNT] = {
    "raw 64-byte socket round trip", "retrieve of a cached chunk, control plane", "PING round trip"};

static double gbs[N_SIZES][M__COUNT][MAX_REPS];   /* GB/s */
static double cold[N_SIZES];                       /* GB/s, first SHM pass (mapping cold) */
static double p50[R__COUNT][MAX_REPS], p99[R__COUNT][MAX_REPS]; /* microseconds */
static double tp_raw[MAX_REPS], tp_lookup[MAX_REPS];               /* ops/s, 8 clients */

static void die(const char *what, int rc) {
  fprintf(stderr, "kvshim-bench-peer: %s failed: %d (%s)\n", what, rc, strerror(rc < 0 ? -rc : rc));
  exit(1);
}

/* ---- copies ------------------------------------------------------------------------------- */

static bool have_nt(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

/* Non-temporal copy: streaming stores that bypass the caches (kvs_peers_copy_stream). */
static void copy_nt(void *dst, const void *src, size_t n) { kvs_peers_copy_stream(dst, src, n); }

/* ---- the raw socket service (server side) ------------------------------------------------- */

typedef struct raw_req {
  uint32_t op;       /* RAW_* */
  uint32_t size_idx;
  uint64_t index;
  uint8_t pad[48];   /* the request is 64 bytes */
} raw_req_t;
_Static_assert(sizeof(raw_req_t) == 64, "raw request is 64 bytes");
enum { RAW_ECHO = 1, RAW_BULK = 2, RAW_QUIT = 3 };

static int read_full(int fd, void *buf, size_t n) {
  uint8_t *p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r == 0 ? -ECONNRESET : -errno;
    p += r, n -= (size_t)r;
  }
  return 0;
}
static int write_full(int fd, const void *buf, size_t n) {
  const uint8_t *p = buf;
  while (n) {
    ssize_t r = write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -errno;
    p += r, n -= (size_t)r;
  }
  return 0;
}

static kvs_key_t obj_key(int size_idx, uint64_t i) {
  return (kvs_key_t){(uint64_t)(size_idx + 1) << 48 | i, 0x706565722d62656eull};
}

typedef struct hello_msg {
  uint64_t instance_id;
  uint64_t n_objs[N_SIZES];
  uint64_t offsets[N_SIZES][MAX_OBJS];
} hello_msg_t;

/* The raw ping-pong server of the throughput figure: one thread, epoll over the clients'
 * sockets, a 64-byte echo per request. Ends when every client closed its end. */
typedef struct echo_srv {
  int fds[TP_CLIENTS];
} echo_srv_t;

static void *echo_main(void *arg) {
  echo_srv_t *e = arg;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) return NULL;
  for (int i = 0; i < TP_CLIENTS; i++) {
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = e->fds[i]};
    epoll_ctl(ep, EPOLL_CTL_ADD, e->fds[i], &ev);
  }
  int open_fds = TP_CLIENTS;
  while (open_fds > 0) {
    struct epoll_event evs[TP_CLIENTS];
    int n = epoll_wait(ep, evs, TP_CLIENTS, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (int i = 0; i < n; i++) {
      raw_req_t q;
      int fd = evs[i].data.fd;
      if (read_full(fd, &q, sizeof q) < 0 || write_full(fd, &q, sizeof q) < 0) {
        epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
        open_fds--;
      }
    }
  }
  close(ep);
  return NULL;
}

static int server_main(int sock, const kvs_options_t *o, uint64_t region, uint64_t instance,
                       echo_srv_t *echo) {
  uint64_t cache = 0;
  hello_msg_t *h = calloc(1, sizeof *h);
  if (!h) return 1;
  h->instance_id = instance;
  for (int s = 0; s < N_SIZES; s++) {
    h->n_objs[s] = region / SIZES[s];
    if (h->n_objs[s] > MAX_OBJS) h->n_objs[s] = MAX_OBJS;
    cache += h->n_objs[s] * SIZES[s];
  }
  kvs_pool_config_t pc = {.cache_size = cache + (64u << 20), .instance_id = instance};
  kvs_pool_t *pool;
  int rc = kvs_pool_create(&pc, &pool);
  if (rc < 0) die("server: kvs_pool_create", rc);
  kvs_pool_prefault(pool);
  kvs_store_config_t sc = {.pool = pool};
  kvs_store_t *store;
  rc = kvs_store_create(&sc, &store);
  if (rc < 0) die("server: kvs_store_create", rc);
  uint8_t *base = kvs_pool_base(pool);
  for (int s = 0; s < N_SIZES; s++) {
    kvs_layout_t l = kvs_layout_blob(SIZES[s]);
    for (uint64_t i = 0; i < h->n_objs[s]; i++) {
      kvs_key_t k = obj_key(s, i);
      uint8_t out;
      kvs_extent_t ext;
      kvs_xfer_t x;
      rc = kvs_store_reserve_write(store, KVS_OWNER_LOCAL, &k, 1, &l, KVS_RESERVE_NO_EVICT, &out,
                                   &ext, &x);
      if (rc != 1) {
        fprintf(stderr, "kvshim-bench-peer: server: object %" PRIu64 " of %s: outcome %s\n", i,
                SIZE_LABELS[s], kvs_reserve_outcome_name(out));
        die("server: reserve", rc < 0 ? rc : -ENOSPC);
      }
      uint8_t *p = base + ext.offset;
      memset(p, (int)(i * 31 + (uint64_t)s), SIZES[s]);
      memcpy(p, &k.lo, 8);
      memcpy(p + SIZES[s] - 8, &k.hi, 8);
      if ((rc = kvs_store_commit(store, KVS_OWNER_LOCAL, x)) < 0) die("server: commit", rc);
      h->offsets[s][i] = ext.offset;
    }
  }
  kvs_coord_config_t cc = {.store = store, .pool = pool, .opts = o, .role = KVS_PROTO_ROLE_CACHE,
                           .instance_id = instance};
  kvs_coord_t *coord;
  if ((rc = kvs_coord_start(&cc, &coord)) < 0) die("server: kvs_coord_start", rc);
  pthread_t echo_th;
  if (pthread_create(&echo_th, NULL, echo_main, echo)) die("server: echo thread", -EAGAIN);
  struct iovec iov = {h, sizeof *h};
  if ((rc = kvs_sock_send_all(sock, &iov, 1, kvs_pool_fd(pool), 0)) < 0) die("server: hello", rc);
  for (;;) {
    raw_req_t q;
    if (read_full(sock, &q, sizeof q) < 0 || q.op == RAW_QUIT) break;
    if (q.op == RAW_ECHO) {
      if (write_full(sock, &q, sizeof q) < 0) break;
    } else if (q.op == RAW_BULK && q.size_idx < N_SIZES && q.index < h->n_objs[q.size_idx]) {
      if (write_full(sock, base + h->offsets[q.size_idx][q.index], SIZES[q.size_idx]) < 0) break;
    } else {
      break;
    }
  }
  pthread_join(echo_th, NULL); /* the client closed its raw sockets before RAW_QUIT */
  kvs_coord_stop(coord);
  kvs_store_destroy(store, true);
  kvs_pool_destroy(pool, true);
  free(h);
  return 0;
}

/* ---- client -------------------------------------------------------------------------------- */

typedef struct sink_ctx {
  uint8_t *dst;
  kvs_key_t key;
  int method; /* M_SHM (memcpy), M_SHM_NT, M_SHM_AUTO; inline copies with memcpy */
  uint64_t got;
} sink_ctx_t;

static uint64_t bad_objects;

static void check_stamp(const uint8_t *p, uint64_t len, kvs_key_t k) {
  uint64_t lo, hi;
  memcpy(&lo, p, 8);
  memcpy(&hi, p + len - 8, 8);
  if (lo != k.lo || hi != k.hi) bad_objects++;
}

static int sink_copy(void *ctx, size_t i, const kvs_layout_t *l, const void *bytes, uint64_t len) {
  sink_ctx_t *s = ctx;
  (void)i, (void)l;
  if (s->method == M_SHM_NT) copy_nt(s->dst, bytes, len);
  else if (s->method == M_SHM_AUTO) kvs_peers_copy(s->dst, bytes, len);
  else memcpy(s->dst, bytes, len);
  s->got += len;
  return 0;
}
static int sink_none(void *ctx, size_t i, const kvs_layout_t *l, const void *bytes, uint64_t len) {
  (void)ctx, (void)i, (void)l, (void)bytes, (void)len;
  return 0;
}

typedef struct client {
  int sock;
  hello_msg_t *h;
  kvs_pool_t *pool; /* the server's pool, mapped here read-only (the memcpy source) */
  kvs_peers_t *p_shm, *p_inl;
  uint8_t *dst;     /* destination region */
  uint64_t region;
  uint64_t id;
} client_t;

/* One pass over every object of a size with one method. Returns GB/s. */
static double pass(client_t *c, int s, int m) {
  uint64_t len = SIZES[s], n = c->h->n_objs[s], bytes = 0;
  const uint8_t *pbase = kvs_pool_base(c->pool);
  uint64_t t0 = kvs__now_ns();
  for (uint64_t i = 0; i < n; i++) {
    uint8_t *dst = c->dst + i * len;
    kvs_key_t k = obj_key(s, i);
    switch (m) {
      case M_MEMCPY:
      case M_NT: {
        const uint8_t *src = pbase + c->h->offsets[s][i];
        if (m == M_NT) copy_nt(dst, src, len);
        else memcpy(dst, src, len);
        bytes += len;
        break;
      }
      case M_SHM:
      case M_SHM_NT:
      case M_SHM_AUTO:
      case M_INLINE: {
        sink_ctx_t sc = {dst, k, m, 0};
        int rc = kvs_peers_retrieve(m == M_INLINE ? c->p_inl : c->p_shm, c->id, &k, 1, sink_copy, &sc);
        if (rc != 1) die("kvs_peers_retrieve", rc < 0 ? rc : -ENOENT);
        bytes += sc.got;
        break;
      }
      case M_INLINE_INTO: {
        void *bufs[1] = {dst};
        uint64_t caps[1] = {len}, lens[1] = {0};
        int rc = kvs_peers_retrieve_into(c->p_inl, c->id, &k, 1, bufs, caps, lens);
        if (rc != 1) die("kvs_peers_retrieve_into", rc < 0 ? rc : -ENOENT);
        bytes += lens[0];
        break;
      }
      case M_SOCK: {
        raw_req_t q = {RAW_BULK, (uint32_t)s, i, {0}};
        if (write_full(c->sock, &q, sizeof q) < 0 || read_full(c->sock, dst, len) < 0)
          die("raw socket bulk", -EIO);
        bytes += len;
        break;
      }
    }
    check_stamp(dst, len, k);
  }
  double sec = (double)(kvs__now_ns() - t0) / 1e9;
  return (double)bytes / sec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void rtt(client_t *c, int which, double *o50, double *o99) {
  static double us[RTT_SAMPLES];
  kvs_key_t k = obj_key(0, 0);
  for (int i = -100; i < RTT_SAMPLES; i++) { /* 100 warm-up round trips */
    uint64_t t0 = kvs__now_ns();
    int rc = 0;
    if (which == R_RAW) {
      raw_req_t q = {RAW_ECHO, 0, (uint64_t)i, {0}};
      if (write_full(c->sock, &q, sizeof q) < 0 || read_full(c->sock, &q, sizeof q) < 0) rc = -EIO;
    } else if (which == R_CTL) {
      rc = kvs_peers_retrieve(c->p_shm, 0, &k, 1, sink_none, NULL);
      rc = rc == 1 ? 0 : rc < 0 ? rc : -ENOENT;
    } else {
      rc = kvs_peers_ping(c->p_shm, c->id);
    }
    if (rc < 0) die(R_NAMES[which], rc);
    if (i >= 0) us[i] = (double)(kvs__now_ns() - t0) / 1e3;
  }
  qsort(us, RTT_SAMPLES, sizeof us[0], cmp_double);
  *o50 = us[RTT_SAMPLES / 2];
  *o99 = us[RTT_SAMPLES * 99 / 100];
}

/* ---- coordinator throughput -------------------------------------------------------------- */

typedef struct tp_worker {
  int raw_fd;          /* raw arm: this client's socket to the echo thread */
  kvs_peers_t *peers;  /* lookup arm: this client's own connection */
  uint64_t ops;
  pthread_barrier_t *start;
  int err;
} tp_worker_t;

static void *tp_raw_main(void *arg) {
  tp_worker_t *w = arg;
  pthread_barrier_wait(w->start);
  for (uint64_t i = 0; i < w->ops; i++) {
    raw_req_t q = {RAW_ECHO, 0, i, {0}};
    if (write_full(w->raw_fd, &q, sizeof q) < 0 || read_full(w->raw_fd, &q, sizeof q) < 0) {
      w->err = -EIO;
      break;
    }
  }
  return NULL;
}

static void *tp_lookup_main(void *arg) {
  tp_worker_t *w = arg;
  kvs_key_t keys[TP_KEYS];
  for (int i = 0; i < TP_KEYS; i++) keys[i] = obj_key(0, (uint64_t)i);
  pthread_barrier_wait(w->start);
  for (uint64_t i = 0; i < w->ops; i++) {
    uint64_t best = 0;
    int run = kvs_peers_lookup(w->peers, keys, TP_KEYS, &best);
    if (run != TP_KEYS) {
      w->err = run < 0 ? run : -ENOENT;
      break;
    }
  }
  return NULL;
}

/* 8 workers of one arm, ops each: total ops/s over the wall time of the slowest. */
static double tp_run(tp_worker_t *w, void *(*fn)(void *), uint64_t ops) {
  pthread_t th[TP_CLIENTS];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, TP_CLIENTS + 1);
  for (int i = 0; i < TP_CLIENTS; i++) {
    w[i].ops = ops;
    w[i].start = &bar;
    w[i].err = 0;
    if (pthread_create(&th[i], NULL, fn, &w[i])) die("pthread_create", -EAGAIN);
  }
  pthread_barrier_wait(&bar);
  uint64_t t0 = kvs__now_ns();
  for (int i = 0; i < TP_CLIENTS; i++) pthread_join(th[i], NULL);
  double sec = (double)(kvs__now_ns() - t0) / 1e9;
  pthread_barrier_destroy(&bar);
  for (int i = 0; i < TP_CLIENTS; i++)
    if (w[i].err) die(fn == tp_raw_main ? "throughput: raw ping-pong" : "throughput: LOOKUP", w[i].err);
  return (double)(ops * TP_CLIENTS) / sec;
}

static void summary(const double *v, int reps, double *med, double *lo, double *hi) {
  double s[MAX_REPS];
  memcpy(s, v, sizeof(double) * (size_t)reps);
  qsort(s, (size_t)reps, sizeof s[0], cmp_double);
  *med = reps % 2 ? s[reps / 2] : (s[reps / 2 - 1] + s[reps / 2]) / 2;
  *lo = s[0];
  *hi = s[reps - 1];
}

static uint64_t llc_bytes(int *level_out) {
  uint64_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 8; i++) {
    char path[128], buf[64];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    FILE *f = fopen(path, "r");
    if (!f) break;
    int level = fgets(buf, sizeof buf, f) ? atoi(buf) : 0;
    fclose(f);
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    f = fopen(path, "r");
    if (!f) continue;
    uint64_t sz = 0;
    if (fgets(buf, sizeof buf, f)) {
      char *end;
      sz = strtoull(buf, &end, 10);
      if (*end == 'K') sz <<= 10;
      else if (*end == 'M') sz <<= 20;
    }
    fclose(f);
    if (level >= best_level && sz > 0) best = sz, best_level = level;
  }
  *level_out = best_level;
  return best;
}

static void usage(void) {
  fprintf(stderr, "usage: kvshim-bench-peer [--reps N (1..%d)] [--region MiB] [--quick]\n"
                  "         [--rtt-only | --only memcpy|memcpy_nt|shm|shm_nt|inline|socket]\n",
          MAX_REPS);
  exit(2);
}

int main(int argc, char **argv) {
  int reps = -1;
  bool quick = false, rtt_only = false;
  const char *only = NULL; /* profiling: one throughput method only (its M_NAMES name) */
  uint64_t region_mib = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--region") == 0 && i + 1 < argc) region_mib = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--quick") == 0) quick = true;
    else if (strcmp(argv[i], "--rtt-only") == 0) rtt_only = true;
    else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else usage();
  }
  if (reps < 0) reps = quick ? 3 : 5;
  if (reps < 1 || reps > MAX_REPS) usage();
  int llc_level = 0;
  uint64_t llc = llc_bytes(&llc_level);
  uint64_t region = region_mib << 20;
  if (!region) {
    region = 2 * llc > (256ull << 20) ? 2 * llc : (256ull << 20);
    if (quick) region = 64ull << 20;
  }
  region = KVS__ALIGN_UP(region, SIZES[N_SIZES - 1]);
  bool nt = have_nt();

  char root[] = "/tmp/kvs-bench-peer-XXXXXX";
  if (!mkdtemp(root)) die("mkdtemp", -errno);
  kvs_options_t o;
  kvs_options_defaults(&o);
  snprintf(o.run_dir, sizeof o.run_dir, "%s/run", root);
  snprintf(o.group, sizeof o.group, "bench");
  o.rpc_timeout_ms = 60000;
  uint64_t instance = ((uint64_t)getpid() << 20) ^ kvs__now_ns() ^ 0x5eed000000000001ull;
  if (!instance) instance = 1;

  /* Fork the server before this process has any thread. */
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) die("socketpair", -errno);
  int tp_sp[TP_CLIENTS][2];
  echo_srv_t echo;
  for (int i = 0; i < TP_CLIENTS; i++) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, tp_sp[i]) < 0) die("socketpair", -errno);
    echo.fds[i] = tp_sp[i][1];
  }
  fflush(NULL);
  pid_t srv = fork();
  if (srv < 0) die("fork", -errno);
  if (srv == 0) {
    close(sp[0]);
    for (int i = 0; i < TP_CLIENTS; i++) close(tp_sp[i][0]);
    _exit(server_main(sp[1], &o, region, instance, &echo));
  }
  close(sp[1]);
  tp_worker_t tpw[TP_CLIENTS];
  memset(tpw, 0, sizeof tpw);
  for (int i = 0; i < TP_CLIENTS; i++) {
    close(tp_sp[i][1]);
    tpw[i].raw_fd = tp_sp[i][0];
  }
  client_t c = {.sock = sp[0], .region = region, .id = instance};
  c.h = calloc(1, sizeof *c.h);
  int pool_fd = -1;
  int rc = kvs_sock_recv_all(c.sock, c.h, sizeof *c.h, &pool_fd, 0);
  if (rc < 0 || pool_fd < 0) die("hello from the server", rc < 0 ? rc : -EPROTO);
  if ((rc = kvs_pool_attach(pool_fd, false, &c.pool)) < 0) die("kvs_pool_attach", rc);
  close(pool_fd);
  kvs_options_t oi = o;
  oi.strategy = KVS_STRATEGY_INLINE;
  kvs_peers_config_t pc = {.opts = &o, .role = KVS_PROTO_ROLE_TOOL};
  if ((rc = kvs_peers_create(&pc, &c.p_shm)) < 0) die("kvs_peers_create", rc);
  pc.opts = &oi;
  if ((rc = kvs_peers_create(&pc, &c.p_inl)) < 0) die("kvs_peers_create", rc);
  if (kvs_peers_discover(c.p_shm, true) != 1 || kvs_peers_discover(c.p_inl, true) != 1)
    die("discovery", -ENOENT);
  kvs_peer_info_t pi;
  kvs_peers_list(c.p_shm, &pi, 1);
  if (pi.strategy != KVS_PROTO_STRATEGY_SHM) die("SHM negotiation", -EPROTO);
  for (int i = 0; i < TP_CLIENTS; i++) {
    pc.opts = &o;
    if ((rc = kvs_peers_create(&pc, &tpw[i].peers)) < 0) die("kvs_peers_create", rc);
    if (kvs_peers_discover(tpw[i].peers, true) != 1) die("discovery", -ENOENT);
  }
  uint64_t tp_ops = quick ? 500 : 4000;
  tp_run(tpw, tp_raw_main, tp_ops / 10 + 1); /* warm up */
  tp_run(tpw, tp_lookup_main, tp_ops / 10 + 1);
  void *dst = NULL;
  if ((rc = kvs__prim_alloc(region, &dst)) < 0) die("mmap destination", rc);
  c.dst = dst;
  memset(c.dst, 1, region); /* fault the destination in: no first-touch cost in any figure */

  /* Warm-up pass per size and method; the first SHM pass maps the peer's pages (cold). */
  for (int s = 0; s < N_SIZES && !rtt_only; s++) {
    cold[s] = pass(&c, s, M_SHM);
    for (int m = 0; m < M__COUNT; m++)
      if ((nt || (m != M_NT && m != M_SHM_NT)) && (!only || strcmp(only, M_NAMES[m]) == 0))
        pass(&c, s, m);
  }
  for (int r = 0; r < reps; r++) {
    for (int s = 0; s < N_SIZES; s++)
      for (int m = 0; m < M__COUNT; m++)
        gbs[s][m][r] = rtt_only || (!nt && (m == M_NT || m == M_SHM_NT)) ||
                               (only && strcmp(only, M_NAMES[m]) != 0)
                           ? 0
                           : pass(&c, s, m);
    for (int w = 0; w < R__COUNT && !only; w++) rtt(&c, w, &p50[w][r], &p99[w][r]);
    if (!only) {
      /* alternate the order so that a drift in load does not favour one arm */
      if (r % 2) tp_lookup[r] = tp_run(tpw, tp_lookup_main, tp_ops);
      tp_raw[r] = tp_run(tpw, tp_raw_main, tp_ops);
      if (!(r % 2)) tp_lookup[r] = tp_run(tpw, tp_lookup_main, tp_ops);
    }
  }
  for (int i = 0; i < TP_CLIENTS; i++) {
    kvs_peers_destroy(tpw[i].peers);
    close(tpw[i].raw_fd);
  }
  raw_req_t q = {RAW_QUIT, 0, 0, {0}};
  write_full(c.sock, &q, sizeof q);
  kvs_peers_destroy(c.p_shm);
  kvs_peers_destroy(c.p_inl);
  int st = 0;
  waitpid(srv, &st, 0);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) fprintf(stderr, "kvshim-bench-peer: could not remove %s\n", root);
  if (bad_objects) {
    fprintf(stderr, "kvshim-bench-peer: %" PRIu64 " objects arrived with wrong bytes\n", bad_objects);
    return 1;
  }

  /* ---- report ---- */
  double med[N_SIZES][M__COUNT], lo[N_SIZES][M__COUNT], hi[N_SIZES][M__COUNT];
  double rmed[R__COUNT][2], rlo[R__COUNT][2], rhi[R__COUNT][2];
  for (int s = 0; s < N_SIZES; s++)
    for (int m = 0; m < M__COUNT; m++) summary(gbs[s][m], reps, &med[s][m], &lo[s][m], &hi[s][m]);
  for (int w = 0; w < R__COUNT; w++) {
    summary(p50[w], reps, &rmed[w][0], &rlo[w][0], &rhi[w][0]);
    summary(p99[w], reps, &rmed[w][1], &rlo[w][1], &rhi[w][1]);
  }
  printf("kvshim-bench-peer: %d reps; region %" PRIu64 " MiB per chunk size (L%d cache %" PRIu64
         " MiB), destination %" PRIu64 " MiB; one chunk per call; non-temporal copy %s\n",
         reps, region >> 20, llc_level, llc >> 20, region >> 20, nt ? "avx2" : "unavailable");
#ifdef KVSHIM_DEBUG
  printf("WARNING: built with KVSHIM_DEBUG: the store's whole-structure validators run after "
         "every mutation and dominate the control-plane figures; benchmark a build without it\n");
#endif
  printf("%-42s %8s %10s %10s %10s  %s\n", "figure", "chunk", "median", "min", "max", "unit");
  for (int s = 0; s < N_SIZES; s++) {
    for (int m = 0; m < M__COUNT; m++)
      printf("%-42s %8s %10.2f %10.2f %10.2f  GB/s\n", M_LABELS[m], SIZE_LABELS[s], med[s][m],
             lo[s][m], hi[s][m]);
    printf("%-42s %8s %10.2f %10s %10s  GB/s\n", "SHM retrieve, first pass (cold mapping)",
           SIZE_LABELS[s], cold[s], "-", "-");
  }
  for (int w = 0; w < R__COUNT; w++) {
    printf("%-42s %8s %10.1f %10.1f %10.1f  us\n", R_LABELS[w], "p50", rmed[w][0], rlo[w][0], rhi[w][0]);
    printf("%-42s %8s %10.1f %10.1f %10.1f  us\n", R_LABELS[w], "p99", rmed[w][1], rlo[w][1], rhi[w][1]);
  }
  printf("ratios (medians):\n");
  for (int s = 0; s < N_SIZES; s++)
    printf("  %-8s shm(kvs_peers_copy)/memcpy %.2f (goal >= %s)  shm(memcpy sink)/memcpy %.2f  "
           "shm_nt/memcpy %.2f  inline-into/socket %.2f (goal >= 0.85)  inline/socket %.2f\n",
           SIZE_LABELS[s], med[s][M_SHM_AUTO] / med[s][M_MEMCPY], s == 0 ? "0.9" : "0.95",
           med[s][M_SHM] / med[s][M_MEMCPY], med[s][M_SHM_NT] / med[s][M_MEMCPY],
           med[s][M_INLINE_INTO] / med[s][M_SOCK], med[s][M_INLINE] / med[s][M_SOCK]);
  double ctl_ratio = rmed[R_CTL][0] / rmed[R_RAW][0];
  /* The goal ratios again, taken inside each repetition (both figures of a ratio ran back to
   * back), median [min..max] over the repetitions: a load that drifts during the run moves
   * these less than the ratio of two medians. */
  printf("goal ratios per repetition, median [min..max]:\n");
  for (int s = 0; s < N_SIZES; s++) {
    double a[MAX_REPS], b[MAX_REPS], am, al, ah, bm, bl, bh;
    for (int r = 0; r < reps; r++) {
      a[r] = gbs[s][M_SHM_AUTO][r] / gbs[s][M_MEMCPY][r];
      b[r] = gbs[s][M_INLINE_INTO][r] / gbs[s][M_SOCK][r];
    }
    summary(a, reps, &am, &al, &ah);
    summary(b, reps, &bm, &bl, &bh);
    printf("  %-8s SHM (kvs_peers_copy) / memcpy %.2f [%.2f..%.2f] goal >= %s: %s;  inline into "
           "the destination / socket %.2f [%.2f..%.2f] goal >= 0.85: %s\n", SIZE_LABELS[s], am, al, ah,
           s == 0 ? "0.9" : "0.95", am >= (s == 0 ? 0.9 : 0.95) ? "met" : "NOT met", bm, bl, bh,
           bm >= 0.85 ? "met" : "NOT met");
  }
  {
    double a[MAX_REPS], am, al, ah;
    for (int r = 0; r < reps; r++) a[r] = p50[R_CTL][r] / p50[R_RAW][r];
    summary(a, reps, &am, &al, &ah);
    printf("  control-plane p50 / raw 64-byte p50 %.2f [%.2f..%.2f] goal <= 1.5: %s\n", am, al,
           ah, am <= 1.5 ? "met" : "NOT met");
  }
  double tpm[2], tpl[2], tph[2], tpr[MAX_REPS], tprm, tprl, tprh;
  summary(tp_lookup, reps, &tpm[0], &tpl[0], &tph[0]);
  summary(tp_raw, reps, &tpm[1], &tpl[1], &tph[1]);
  for (int r = 0; r < reps; r++) tpr[r] = tp_raw[r] > 0 ? tp_lookup[r] / tp_raw[r] : 0;
  summary(tpr, reps, &tprm, &tprl, &tprh);
  printf("coordinator throughput, %d clients, own connection each: %d-key LOOKUP %.0f ops/s "
         "[%.0f..%.0f], raw 64-byte ping-pong %.0f ops/s [%.0f..%.0f]\n", TP_CLIENTS, TP_KEYS,
         tpm[0], tpl[0], tph[0], tpm[1], tpl[1], tph[1]);
  printf("  LOOKUP ops/s / raw ping-pong ops/s %.2f [%.2f..%.2f] goal >= 0.5: %s\n", tprm, tprl,
         tprh, tprm >= 0.5 ? "met" : "NOT met");
  printf("  control-plane p50 / raw 64-byte p50 = %.2f (goal <= 1.5); PING p50 / raw = %.2f\n",
         ctl_ratio, rmed[R_PING][0] / rmed[R_RAW][0]);

  printf("{\"bench\":\"peer\",\"reps\":%d,\"region_bytes\":%" PRIu64 ",\"llc_bytes\":%" PRIu64
         ",\"nt_copy\":%s", reps, region, llc, nt ? "true" : "false");
  for (int s = 0; s < N_SIZES; s++) {
    for (int m = 0; m < M__COUNT; m++)
      printf(",\"%s_%s_gbs\":{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f}", M_NAMES[m],
             SIZE_NAMES[s], med[s][m], lo[s][m], hi[s][m]);
    printf(",\"shm_cold_%s_gbs\":%.3f", SIZE_NAMES[s], cold[s]);
    printf(",\"ratio_shm_memcpy_%s\":%.3f,\"ratio_shm_nt_memcpy_%s\":%.3f,"
           "\"ratio_shm_auto_memcpy_%s\":%.3f,\"ratio_inline_socket_%s\":%.3f,"
           "\"ratio_inline_into_socket_%s\":%.3f",
           SIZE_NAMES[s], med[s][M_SHM] / med[s][M_MEMCPY], SIZE_NAMES[s],
           med[s][M_SHM_NT] / med[s][M_MEMCPY], SIZE_NAMES[s],
           med[s][M_SHM_AUTO] / med[s][M_MEMCPY], SIZE_NAMES[s], med[s][M_INLINE] / med[s][M_SOCK],
           SIZE_NAMES[s], med[s][M_INLINE_INTO] / med[s][M_SOCK]);
  }
  for (int w = 0; w < R__COUNT; w++)
    printf(",\"%s_p50_us\":{\"median\":%.2f,\"min\":%.2f,\"max\":%.2f},"
           "\"%s_p99_us\":{\"median\":%.2f,\"min\":%.2f,\"max\":%.2f}",
           R_NAMES[w], rmed[w][0], rlo[w][0], rhi[w][0], R_NAMES[w], rmed[w][1], rlo[w][1],
           rhi[w][1]);
  printf(",\"ratio_control_raw_p50\":%.3f,\"ratio_ping_raw_p50\":%.3f", ctl_ratio,
         rmed[R_PING][0] / rmed[R_RAW][0]);
  printf(",\"lookup16_8c_ops\":{\"median\":%.1f,\"min\":%.1f,\"max\":%.1f},"
         "\"raw64_8c_ops\":{\"median\":%.1f,\"min\":%.1f,\"max\":%.1f},"
         "\"ratio_lookup_raw_8c\":{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f}}\n",
         tpm[0], tpl[0], tph[0], tpm[1], tpl[1], tph[1], tprm, tprl, tprh);
  return 0;
}
