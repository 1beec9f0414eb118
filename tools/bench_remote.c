/* kvshim-bench-remote: the remote tier (core/tiers/remote, design §17) against a local Redis, each
 * figure printed next to its limit measured in the same run (design §16; never run by ctest).
 *
 *   object SET / GET   through the tier vs raw pipelined hiredis of the same sizes (256 KiB,
 *                      2 MiB, 16 MiB). Tier SET: objects committed to an in-process
 *                      `kvshim serve` (pool + store + coordinator + tier) are handed to the
 *                      write-behind as the coordinator does, timed until every SET answered.
 *                      Tier GET: the pool emptied, one LOOKUP (with remote_wait_ms, from a peer
 *                      client over the Unix socket) for all the keys, timed until its reply:
 *                      pipelined GETs received straight into reserved extents, checks.
 *                      Raw: N pipelined SET/GET of the bare bytes on one hiredis connection.
 *   prefix lookup      LOOKUP of a 16-chunk prefix through the tier, p50 (the keys absent from
 *                      Redis: one probe round trip; and present, 16 x 4 KiB: probe + GET),
 *                      vs one raw PING round trip p50.
 *   TTFT               (with --refengine) node B's time to first token with a 4k-token prefix
 *                      restored from Redis (node A computed it and exited with its serve) vs
 *                      recomputed without kvshim; the workload of PERF.md section 5.
 * Every figure is repeated --reps times (default 5), interleaved; medians and min-max are
 * printed, then one JSON line. --quick: 16 MiB per size, 3 reps, fewer latency samples.
 *
 * usage: kvshim-bench-remote --remote redis://127.0.0.1:PORT [--reps N] [--quick]
 *            [--refengine PATH --preload LIBKVSHIM --cli KVSHIM]
 * The server must be disposable: the bench runs FLUSHALL. */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord.h"
#include "internal.h"
#include "peer.h"
#include "pool.h"
#include "proto.h"
#include "redis.h"
#include "remote.h"
#include "store.h"

extern char **environ;

#define MAX_REPS 51
#define N_SIZES 3
static const uint64_t SIZES[N_SIZES] = {256u << 10, 2u << 20, 16u << 20};
static const char *const SIZE_NAMES[N_SIZES] = {"256k", "2m", "16m"};

typedef struct bench {
  kvs_options_t o;
  kvs_pool_t *pool;
  kvs_store_t *store;
  kvs_remote_t *remote;
  kvs_coord_t *coord;
  kvs_peers_t *peers;
  redisContext *raw;
  uint8_t *region; /* source bytes, N * size */
  char run_dir[64];
} bench_t;

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
static void spread(const double *v, int n, double *lo, double *hi) {
  *lo = *hi = v[0];
  for (int i = 1; i < n; i++) {
    if (v[i] < *lo) *lo = v[i];
    if (v[i] > *hi) *hi = v[i];
  }
}
static double now_s(void) { return (double)kvs__now_ns() / 1e9; }

static void die(const char *what) {
  fprintf(stderr, "kvshim-bench-remote: %s\n", what);
  exit(1);
}

static kvs_key_t bench_key(uint64_t size_idx, uint64_t i) {
  return (kvs_key_t){0x6b76736862656e63ull ^ (size_idx << 32) ^ i, 0x72656d6f74650000ull + i};
}

static void raw_cmd(bench_t *b, const char *cmd) {
  redisReply *r = redisCommand(b->raw, cmd);
  if (!r) die("raw connection failed");
  freeReplyObject(r);
}

/* ---- throughput ------------------------------------------------------------------------------ */

static double raw_set(bench_t *b, int si, size_t n) {
  uint64_t sz = SIZES[si];
  char names[64];
  double t0 = now_s();
  for (size_t i = 0; i < n; i++) {
    int l = snprintf(names, sizeof names, "raw:%s:%zu", SIZE_NAMES[si], i);
    const char *argv[3] = {"SET", names, (const char *)b->region + i * sz};
    size_t lens[3] = {3, (size_t)l, (size_t)sz};
    redisAppendCommandArgv(b->raw, 3, argv, lens);
  }
  for (size_t i = 0; i < n; i++) {
    void *r = NULL;
    if (redisGetReply(b->raw, &r) != REDIS_OK) die("raw SET failed");
    freeReplyObject(r);
  }
  return (double)(n * sz) / (now_s() - t0);
}

static double raw_get(bench_t *b, int si, size_t n) {
  uint64_t sz = SIZES[si];
  char names[64];
  double t0 = now_s();
  for (size_t i = 0; i < n; i++) {
    snprintf(names, sizeof names, "raw:%s:%zu", SIZE_NAMES[si], i);
    redisAppendCommand(b->raw, "GET %s", names);
  }
  for (size_t i = 0; i < n; i++) {
    redisReply *r = NULL;
    if (redisGetReply(b->raw, (void **)&r) != REDIS_OK || !r || r->len != (size_t)sz)
      die("raw GET failed");
    freeReplyObject(r);
  }
  return (double)(n * sz) / (now_s() - t0);
}

static uint64_t stat_of(kvs_stat_id_t id) { return kvs_stats_get(kvs_stats_global(), id); }
/* Write-behind outcomes so far (each queued object ends as exactly one of them). */
static uint64_t writes_done(void) {
  return stat_of(KVS_STAT_remote_writes) + stat_of(KVS_STAT_remote_write_present) +
         stat_of(KVS_STAT_remote_queue_drops) + stat_of(KVS_STAT_remote_errors);
}

/* Put len bytes of src into the pool under key, READY (replacing what was there). */
static void commit_blob(bench_t *b, kvs_key_t key, const void *src, uint64_t len) {
  kvs_layout_t l = kvs_layout_blob(len);
  uint8_t outcome;
  kvs_extent_t ext;
  kvs_xfer_t x = 0;
  kvs_store_remove(b->store, &key);
  if (kvs_store_reserve_write(b->store, KVS_OWNER_LOCAL, &key, 1, &l, 0, &outcome, &ext, &x) != 1)
    die("cannot reserve in the pool (raise the pool size)");
  memcpy(kvs_pool_base(b->pool) + ext.offset, src, len);
  kvs_store_commit(b->store, KVS_OWNER_LOCAL, x);
}

/* Commit n objects of size si into the store (untimed), hand them to the write-behind, time
 * until every SET answered. */
static double tier_set(bench_t *b, int si, size_t n, kvs_key_t *keys) {
  uint64_t sz = SIZES[si];
  for (size_t i = 0; i < n; i++) {
    keys[i] = bench_key((uint64_t)si, i);
    commit_blob(b, keys[i], b->region + i * sz, sz);
  }
  uint64_t before = writes_done();
  const kvs_coord_remote_t *h = kvs_remote_hooks(b->remote);
  double t0 = now_s();
  h->published(h->ctx, keys, n, false);
  while (writes_done() < before + n) usleep(20);
  return (double)(n * sz) / (now_s() - t0);
}

static double tier_get(bench_t *b, int si, size_t n, const kvs_key_t *keys) {
  for (size_t i = 0; i < n; i++) kvs_store_remove(b->store, &keys[i]);
  uint64_t best = 0;
  double t0 = now_s();
  int got = kvs_peers_lookup(b->peers, keys, n, &best);
  double t = now_s() - t0;
  if (got != (int)n) {
    fprintf(stderr, "kvshim-bench-remote: tier GET found %d of %zu\n", got, n);
    exit(1);
  }
  return (double)(n * SIZES[si]) / t;
}

/* ---- latency --------------------------------------------------------------------------------- */

static double ping_p50(bench_t *b, int samples) {
  double *v = malloc(sizeof *v * (size_t)samples);
  for (int i = 0; i < samples; i++) {
    double t0 = now_s();
    raw_cmd(b, "PING");
    v[i] = (now_s() - t0) * 1e6;
  }
  double m = median(v, samples);
  free(v);
  return m;
}

/* LOOKUP of 16 keys through the tier: absent from Redis (present false), or 16 x 4 KiB
 * objects in Redis and not in the pool (each sample removes them from the pool first). */
static double lookup_p50(bench_t *b, int samples, bool present) {
  kvs_key_t keys[16];
  for (int i = 0; i < 16; i++) keys[i] = bench_key(present ? 90 : 91, (uint64_t)i);
  if (present) { /* write them once through the tier */
    for (int i = 0; i < 16; i++) commit_blob(b, keys[i], b->region + (size_t)i * 4096, 4096);
    uint64_t before = writes_done();
    const kvs_coord_remote_t *h = kvs_remote_hooks(b->remote);
    h->published(h->ctx, keys, 16, false);
    while (writes_done() < before + 16) usleep(100);
  }
  double *v = malloc(sizeof *v * (size_t)samples);
  for (int s = 0; s < samples; s++) {
    for (int i = 0; i < 16; i++) kvs_store_remove(b->store, &keys[i]);
    uint64_t best = 0;
    double t0 = now_s();
    int got = kvs_peers_lookup(b->peers, keys, 16, &best);
    v[s] = (now_s() - t0) * 1e6;
    if (got != (present ? 16 : 0)) die("prefix lookup returned a wrong count");
  }
  double m = median(v, samples);
  free(v);
  return m;
}

/* ---- TTFT: node A computes, node B restores from Redis -------------------------------------- */

typedef struct ttft_cfg {
  const char *refengine, *preload, *cli, *url;
  char tmp[64];
} ttft_cfg_t;

static char **env_with(const char *const *extra) {
  size_t n = 0, k = 0;
  while (environ[n]) n++;
  for (k = 0; extra[k]; k++) {}
  char **e = calloc(n + k + 1, sizeof *e);
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "KVSHIM_", 7) != 0 && strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
      e[m++] = environ[i];
  for (size_t i = 0; i < k; i++) e[m++] = (char *)extra[i];
  return e;
}

/* Start argv with env; its stdout on *out_fd (a pipe) when out_fd. Returns the pid. */
static pid_t spawn(char *const argv[], char **env, int *out_fd) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  int p[2] = {-1, -1};
  if (out_fd) {
    if (pipe(p) < 0) die("pipe");
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addclose(&fa, p[0]);
  }
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  if (posix_spawn(&pid, argv[0], &fa, NULL, argv, env) != 0) die("cannot start a process");
  posix_spawn_file_actions_destroy(&fa);
  if (out_fd) {
    close(p[1]);
    *out_fd = p[0];
  }
  return pid;
}

static size_t read_some(int fd, char *buf, size_t cap, bool line) {
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t r = read(fd, buf + n, line ? 1 : cap - 1 - n);
    if (r <= 0) break;
    n += (size_t)r;
    if (line && buf[n - 1] == '\n') break;
  }
  buf[n] = '\0';
  return n;
}

static pid_t start_serve(ttft_cfg_t *t, const char *node) {
  char rd[128], *env[4];
  snprintf(rd, sizeof rd, "KVSHIM_RUN_DIR=%s/%s", t->tmp, node);
  const char *extra[] = {rd, "KVSHIM_GROUP=bench", NULL};
  char **e = env_with(extra);
  char *argv[] = {(char *)t->cli, "serve", "--pool-size", "256M", "--remote", (char *)t->url,
                  NULL};
  int fd;
  pid_t pid = spawn(argv, e, &fd);
  char line[512];
  read_some(fd, line, sizeof line, true);
  close(fd);
  free(e);
  (void)env;
  if (!strstr(line, "remote tier on")) die("kvshim serve did not start with its remote tier");
  return pid;
}

static void stop(pid_t pid) {
  kill(pid, SIGTERM);
  int st;
  waitpid(pid, &st, 0);
}

/* Run refengine on node (NULL: without kvshim); returns request 0's ttft_ms. */
static double run_engine(ttft_cfg_t *t, const char *node, int rank, bool verify) {
  char rd[128], pre[512], rk[16];
  snprintf(rd, sizeof rd, "KVSHIM_RUN_DIR=%s/%s", t->tmp, node ? node : "none");
  snprintf(pre, sizeof pre, "LD_PRELOAD=%s", t->preload);
  snprintf(rk, sizeof rk, "%d", rank);
  const char *with[] = {rd, "KVSHIM_GROUP=bench", pre, "KVSHIM_HOST_POOL_SIZE=64M", NULL};
  const char *without[] = {NULL};
  char **e = env_with(node ? with : without);
  char *argv[] = {(char *)t->refengine, "--requests", "1", "--prompt-tokens", "4352",
                  "--prefix-tokens", "4096", "--chunk-tokens", "256", "--hidden", "128",
                  "--kvo-buffer", "host", "--rank", rk, verify ? "--verify" : NULL, NULL};
  int fd;
  pid_t pid = spawn(argv, e, &fd);
  static char out[65536];
  read_some(fd, out, sizeof out, false);
  close(fd);
  int st;
  waitpid(pid, &st, 0);
  free(e);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("refengine failed");
  const char *p = strstr(out, "\"ttft_ms\":");
  if (!p) die("refengine printed no ttft_ms");
  if (verify && strstr(out, "\"verify\":\"ok\"") == NULL) die("refengine --verify failed");
  const char *ld = strstr(out, "\"loaded\":");
  if (node && verify && (!ld || atoi(ld + 9) != 16))
    fprintf(stderr, "kvshim-bench-remote: node B loaded %d of 16 prefix chunks (%.200s)\n",
            ld ? atoi(ld + 9) : -1, out);
  return strtod(p + 10, NULL);
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
  const char *url = NULL;
  ttft_cfg_t t = {0};
  int reps = 5, quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--remote") && i + 1 < argc) url = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = 1, reps = 3;
    else if (!strcmp(argv[i], "--refengine") && i + 1 < argc) t.refengine = argv[++i];
    else if (!strcmp(argv[i], "--preload") && i + 1 < argc) t.preload = argv[++i];
    else if (!strcmp(argv[i], "--cli") && i + 1 < argc) t.cli = argv[++i];
    else {
      fprintf(stderr, "usage: kvshim-bench-remote --remote redis://HOST:PORT [--reps N] [--quick]"
                      " [--refengine PATH --preload LIBKVSHIM --cli KVSHIM]\n");
      return 2;
    }
  }
  if (!url || reps < 1 || reps > MAX_REPS) die("--remote URL is required; --reps 1..51");
  signal(SIGPIPE, SIG_IGN);
  bench_t b;
  memset(&b, 0, sizeof b);
  kvs_options_defaults(&b.o);
  snprintf(b.run_dir, sizeof b.run_dir, "/tmp/kvs-benchr.XXXXXX");
  if (!mkdtemp(b.run_dir)) die("mkdtemp");
  snprintf(b.o.run_dir, sizeof b.o.run_dir, "%s", b.run_dir);
  snprintf(b.o.group, sizeof b.o.group, "bench");
  snprintf(b.o.remote, sizeof b.o.remote, "%s", url);
  b.o.rpc_timeout_ms = 60000;
  b.o.remote_timeout_ms = 30000;
  b.o.pool_size = 512ull << 20;
  kvs_redis_url_t u;
  char err[512];
  if (kvs_redis_url_parse(url, &u, err, sizeof err) < 0) die(err);
  b.raw = redisConnect(u.seeds[0].host, u.seeds[0].port);
  if (!b.raw || b.raw->err) die("cannot connect to Redis");
  raw_cmd(&b, "FLUSHALL");
  uint64_t id = 0x62656e6368ull;
  kvs_pool_config_t pc = {.cache_size = b.o.pool_size, .instance_id = id};
  if (kvs_pool_create(&pc, &b.pool) < 0) die("pool");
  kvs_store_config_t sc = {.pool = b.pool};
  if (kvs_store_create(&sc, &b.store) < 0) die("store");
  kvs_remote_config_t rc = {.opts = &b.o, .store = b.store, .producer = id};
  if (kvs_remote_create(&rc, &b.remote, err, sizeof err) < 0 || err[0]) die(err);
  kvs_coord_config_t cc = {.store = b.store, .pool = b.pool, .opts = &b.o,
                           .role = KVS_PROTO_ROLE_CACHE, .instance_id = id,
                           .remote = kvs_remote_hooks(b.remote)};
  if (kvs_coord_start(&cc, &b.coord) < 0) die("coordinator");
  kvs_remote_attach(b.remote, b.coord);
  kvs_peers_config_t pcfg = {.opts = &b.o, .role = KVS_PROTO_ROLE_ENGINE};
  if (kvs_peers_create(&pcfg, &b.peers) < 0 || kvs_peers_discover(b.peers, true) != 1)
    die("peer client");

  uint64_t total = quick ? 16u << 20 : 64u << 20;
  b.region = malloc(total);
  for (uint64_t i = 0; i < total; i++) b.region[i] = (uint8_t)(i * 2654435761u >> 13);
  kvs_key_t *keys = malloc(sizeof *keys * (total / SIZES[0]));
  double v[4][N_SIZES][MAX_REPS];
  printf("kvshim-bench-remote: %s, %d reps, %" PRIu64 " MiB per size and figure\n", url, reps,
         total >> 20);
  for (int r = 0; r < reps; r++)
    for (int si = 0; si < N_SIZES; si++) {
      size_t n = (size_t)(total / SIZES[si]);
      raw_cmd(&b, "FLUSHALL");
      v[0][si][r] = raw_set(&b, si, n);
      v[1][si][r] = raw_get(&b, si, n);
      raw_cmd(&b, "FLUSHALL");
      v[2][si][r] = tier_set(&b, si, n, keys);
      v[3][si][r] = tier_get(&b, si, n, keys);
      for (size_t i = 0; i < n; i++) kvs_store_remove(b.store, &keys[i]);
    }
  raw_cmd(&b, "FLUSHALL");
  printf("\n%-8s %-4s %22s %22s %22s\n", "size", "op", "tier GB/s", "raw hiredis GB/s",
         "tier / raw");
  char json[8192];
  int jl = snprintf(json, sizeof json, "{\"bench\":\"remote\",\"reps\":%d", reps);
  for (int si = 0; si < N_SIZES; si++)
    for (int op = 0; op < 2; op++) {
      double ratio[MAX_REPS], lo, hi, rlo, rhi, tlo, thi;
      for (int r = 0; r < reps; r++) ratio[r] = v[2 + op][si][r] / v[op][si][r];
      spread(v[2 + op][si], reps, &tlo, &thi);
      spread(v[op][si], reps, &rlo, &rhi);
      spread(ratio, reps, &lo, &hi);
      double tm = median(v[2 + op][si], reps) / 1e9, rm = median(v[op][si], reps) / 1e9,
             qm = median(ratio, reps);
      printf("%-8s %-4s %8.2f [%5.2f..%5.2f] %8.2f [%5.2f..%5.2f] %8.3f [%5.3f..%5.3f]\n",
             SIZE_NAMES[si], op ? "GET" : "SET", tm, tlo / 1e9, thi / 1e9, rm, rlo / 1e9,
             rhi / 1e9, qm, lo, hi);
      jl += snprintf(json + jl, sizeof json - (size_t)jl,
                     ",\"%s_%s_tier_gbs\":%.3f,\"%s_%s_raw_gbs\":%.3f,\"%s_%s_ratio\":%.3f",
                     op ? "get" : "set", SIZE_NAMES[si], tm, op ? "get" : "set", SIZE_NAMES[si],
                     rm, op ? "get" : "set", SIZE_NAMES[si], qm);
    }
  int samples = quick ? 200 : 1000;
  double lm[MAX_REPS], lh[MAX_REPS], pm[MAX_REPS], r1[MAX_REPS], r2[MAX_REPS];
  for (int r = 0; r < reps; r++) {
    pm[r] = ping_p50(&b, samples);
    lm[r] = lookup_p50(&b, samples, false);
    lh[r] = lookup_p50(&b, samples / 4, true);
    r1[r] = lm[r] / pm[r];
    r2[r] = lh[r] / pm[r];
  }
  double a, c;
  printf("\nlatency p50 (us), median [min..max] of %d reps\n", reps);
  spread(pm, reps, &a, &c);
  printf("  raw PING round trip                       %7.1f [%.1f..%.1f]\n", median(pm, reps), a, c);
  spread(lm, reps, &a, &c);
  double lmm = median(lm, reps), lhm = median(lh, reps);
  printf("  16-chunk lookup, absent from Redis        %7.1f [%.1f..%.1f]", lmm, a, c);
  spread(r1, reps, &a, &c);
  printf("  = %.2fx PING [%.2f..%.2f]\n", median(r1, reps), a, c);
  spread(lh, reps, &a, &c);
  printf("  16-chunk lookup, 16 x 4 KiB fetched       %7.1f [%.1f..%.1f]", lhm, a, c);
  spread(r2, reps, &a, &c);
  printf("  = %.2fx PING [%.2f..%.2f]\n", median(r2, reps), a, c);
  jl += snprintf(json + jl, sizeof json - (size_t)jl,
                 ",\"ping_p50_us\":%.1f,\"lookup16_miss_p50_us\":%.1f,\"lookup16_miss_ratio\":%.2f"
                 ",\"lookup16_fetch_p50_us\":%.1f,\"lookup16_fetch_ratio\":%.2f",
                 median(pm, reps), lmm, median(r1, reps), lhm, median(r2, reps));

  kvs_peers_destroy(b.peers);
  kvs_remote_attach(b.remote, NULL);
  kvs_coord_stop(b.coord);
  kvs_remote_destroy(b.remote, 1000);
  kvs_store_destroy(b.store, true);
  kvs_pool_destroy(b.pool, true);

  if (t.refengine && t.preload && t.cli) {
    t.url = url;
    snprintf(t.tmp, sizeof t.tmp, "%s", b.run_dir);
    double with[MAX_REPS], without[MAX_REPS], ratio[MAX_REPS];
    for (int r = 0; r < reps; r++) {
      raw_cmd(&b, "FLUSHALL");
      pid_t a_serve = start_serve(&t, "a");
      run_engine(&t, "a", 0, false);
      stop(a_serve); /* flushes A's write-behind into Redis */
      pid_t b_serve = start_serve(&t, "b");
      with[r] = run_engine(&t, "b", 1, true);
      stop(b_serve);
      without[r] = run_engine(&t, NULL, 1, false);
      ratio[r] = with[r] / without[r];
    }
    printf("\nnode B TTFT, 4k-token prefix (refengine, 16 x 1 MiB chunks), ms\n");
    spread(with, reps, &a, &c);
    double wm = median(with, reps), om;
    printf("  restored from Redis (A's serve gone)      %7.1f [%.1f..%.1f]\n", wm, a, c);
    spread(without, reps, &a, &c);
    om = median(without, reps);
    printf("  recomputed (no kvshim)                    %7.1f [%.1f..%.1f]\n", om, a, c);
    spread(ratio, reps, &a, &c);
    printf("  ratio                                     %7.3f [%.3f..%.3f]\n", median(ratio, reps),
           a, c);
    jl += snprintf(json + jl, sizeof json - (size_t)jl,
                   ",\"ttft_restored_ms\":%.1f,\"ttft_recomputed_ms\":%.1f,\"ttft_ratio\":%.3f", wm,
                   om, median(ratio, reps));
  }
  raw_cmd(&b, "FLUSHALL");
  redisFree(b.raw);
  printf("%s}\n", json);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", b.run_dir);
  if (system(cmd) != 0) fprintf(stderr, "kvshim-bench-remote: could not remove %s\n", b.run_dir);
  free(b.region);
  free(keys);
  return 0;
}
