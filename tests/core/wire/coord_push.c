/* Write-behind (design §7 "Roles"): an engine process commits objects to its local store and
 * pushes them to the group's `kvshim serve` cache peer; after the engine exits (its own pool
 * gone with it) a new process still gets them from the cache, through `kvshim get` and through
 * kvs_peers_retrieve. With a tiny queue and many pushes, drops are counted and no push blocks. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord_client.h"
#include "internal.h"
#include "peer.h"

#ifndef KVSHIM_BIN
#error "KVSHIM_BIN (path of the kvshim binary) must be defined by the build"
#endif

#define T_TIMEOUT .timeout = 90

static char ROOT[128], RUN[256];
static pid_t SERVE = -1;

static void down(void) {
  if (SERVE > 0) {
    kill(SERVE, SIGKILL);
    waitpid(SERVE, NULL, 0);
  }
  SERVE = -1;
  if (ROOT[0]) ts_rmtree(ROOT);
  ROOT[0] = '\0';
}

/* A peer set of role TOOL on the test's serve (run directory RUN, group t). */
static kvs_peers_t *tool_peers(void) {
  kvs_options_t o;
  kvs_options_defaults(&o);
  snprintf(o.run_dir, sizeof o.run_dir, "%s", RUN);
  snprintf(o.group, sizeof o.group, "t");
  kvs_peers_config_t pc = {.opts = &o, .role = KVS_PROTO_ROLE_TOOL};
  kvs_peers_t *p = NULL;
  cr_assert_eq(kvs_peers_create(&pc, &p), 0);
  return p;
}

/* kvshim serve in the background; returns once its socket answers. */
static void start_serve(void) {
  cr_assert_eq(ts_mkdtemp(ROOT, sizeof ROOT, "kvs-coordpush"), 0);
  snprintf(RUN, sizeof RUN, "%s/run", ROOT);
  char out[300];
  snprintf(out, sizeof out, "%s/serve.log", ROOT);
  fflush(NULL);
  SERVE = fork();
  cr_assert_geq(SERVE, 0);
  if (SERVE == 0) {
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
    execl(KVSHIM_BIN, "kvshim", "serve", "--run-dir", RUN, "--group", "t", "--pool-size", "64M",
          (char *)NULL);
    _exit(127);
  }
  kvs_peers_t *p = tool_peers();
  int live = 0;
  for (int i = 0; i < 500 && live == 0; i++) {
    live = kvs_peers_discover(p, true);
    if (!live) usleep(10000);
  }
  kvs_peers_destroy(p);
  cr_assert_eq(live, 1, "kvshim serve did not come up (see %s)", out);
}

/* The key `kvshim put/get NAME` uses (tools/kvshim.c blob_key, empty salt). */
static kvs_key_t blob_key(const char *name) {
  kvs_namespace_t ns;
  memset(&ns, 0, sizeof ns);
  snprintf(ns.engine, sizeof ns.engine, "blob");
  kvs_namespace_set_salt(&ns, "");
  return kvs_keys_name(kvs_keys_namespace(&ns), name, strlen(name));
}

static uint64_t obj_len(int i) { return 100000 + (uint64_t)i * 777; }

/* An "engine": local pool + store, peers with write-behind. */
typedef struct engine {
  kvs_options_t opts;
  kvs_pool_t *pool;
  kvs_store_t *store;
  kvs_peers_t *peers;
  kvs_stats_t stats;
} engine_t;

static int engine_open(engine_t *e, uint32_t queue, uint64_t cache) {
  memset(e, 0, sizeof *e);
  kvs_options_defaults(&e->opts);
  snprintf(e->opts.run_dir, sizeof e->opts.run_dir, "%s", RUN);
  snprintf(e->opts.group, sizeof e->opts.group, "t");
  kvs_stats_init(&e->stats);
  kvs_pool_config_t pc = {.cache_size = cache};
  KVS_TRY(kvs_pool_create(&pc, &e->pool));
  kvs_store_config_t sc = {.pool = e->pool, .stats = &e->stats};
  KVS_TRY(kvs_store_create(&sc, &e->store));
  kvs_peers_config_t pe = {.opts = &e->opts, .instance_id = 0x1234567ull, .role = KVS_PROTO_ROLE_ENGINE,
                           .local = e->store, .stats = &e->stats, .push_queue = queue,
                           .flush_ms = 10000};
  KVS_TRY(kvs_peers_create(&pe, &e->peers));
  return kvs_peers_discover(e->peers, true) == 1 ? 0 : -ENOENT;
}

static void engine_close(engine_t *e) {
  kvs_peers_destroy(e->peers);
  kvs_store_destroy(e->store, true);
  kvs_pool_destroy(e->pool, true);
}

#define N_PUSH 20

/* Child: commit N_PUSH named blobs locally, push each, exit (destroy flushes the queue). The
 * exit code says what went wrong, if anything. */
static int engine_child(void *arg) {
  (void)arg;
  engine_t e;
  if (engine_open(&e, 0, 16u << 20) < 0) return 10;
  for (int i = 0; i < N_PUSH; i++) {
    char name[32];
    snprintf(name, sizeof name, "obj-%d", i);
    kvs_key_t k = blob_key(name);
    kvs_layout_t l = kvs_layout_blob(obj_len(i));
    if (ts_local_put(e.store, &k, 1, &l) != 1) return 11;
    if (kvs_peers_push(e.peers, &k, 1) != 0) return 12;
  }
  engine_close(&e); /* flushes (bounded) */
  if (kvs_stats_get(&e.stats, KVS_STAT_push_queued) != N_PUSH) return 13;
  if (kvs_stats_get(&e.stats, KVS_STAT_push_sent) != N_PUSH) return 14;
  if (kvs_stats_get(&e.stats, KVS_STAT_push_dropped) != 0) return 15;
  return 0;
}

static int run_get(const char *name, const char *out) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    execl(KVSHIM_BIN, "kvshim", "get", name, out, "--run-dir", RUN, "--group", "t", (char *)NULL);
    _exit(127);
  }
  return ts_wait_child(pid, 20000);
}

static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)n + 1);
  *len = fread(b, 1, (size_t)n, f);
  fclose(f);
  return b;
}

typedef struct sink_ctx {
  const kvs_key_t *keys;
  int first, bad, got;
} sink_ctx_t;
static int sink(void *ctx, size_t i, const kvs_layout_t *l, const void *b, uint64_t len) {
  sink_ctx_t *s = ctx;
  (void)l;
  if (len != obj_len(s->first + (int)i) || pat_check(b, len, s->keys[i])) s->bad++;
  s->got++;
  return 0;
}

TestSuite(push, .fini = down);

Test(push, pushed_objects_outlive_the_engine, T_TIMEOUT) {
  start_serve();
  int rc = ts_wait_child(ts_fork(engine_child, NULL), 30000);
  cr_assert_eq(rc, 0, "engine child failed with %d", rc);
  /* The engine is gone (and its pool with it): kvshim get finds the bytes at the cache. */
  for (int i = 0; i < N_PUSH; i += 7) {
    char name[32], out[300];
    snprintf(name, sizeof name, "obj-%d", i);
    snprintf(out, sizeof out, "%s/got-%d", ROOT, i);
    cr_assert_eq(run_get(name, out), 0, "kvshim get %s", name);
    size_t len = 0;
    uint8_t *b = slurp(out, &len);
    cr_assert_not_null(b);
    cr_assert_eq(len, obj_len(i));
    cr_assert_eq(pat_check(b, len, blob_key(name)), 0, "%s: wrong bytes", name);
    free(b);
  }
  cr_assert_eq(run_get("obj-never-pushed", "-"), 1);
  /* And through the library, in one batch (a query never discovers: the client scans first). */
  kvs_peers_t *p = tool_peers();
  cr_assert_eq(kvs_peers_discover(p, true), 1);
  for (int i = 0; i < N_PUSH; i++) {
    char name[32];
    snprintf(name, sizeof name, "obj-%d", i);
    kvs_key_t k = blob_key(name);
    sink_ctx_t s = {&k, i, 0, 0};
    cr_assert_eq(kvs_peers_retrieve(p, 0, &k, 1, sink, &s), 1, "obj-%d not at the cache", i);
    cr_assert_eq(s.bad, 0);
  }
  kvs_peers_destroy(p);
}

Test(push, tiny_queue_drops_and_never_blocks, T_TIMEOUT) {
  start_serve();
  engine_t e;
  cr_assert_eq(engine_open(&e, 2, 96u << 20), 0);
  enum { N = 64 };
  const uint64_t LEN = 1u << 20;
  kvs_key_t k[N];
  kvs_layout_t l = kvs_layout_blob(LEN);
  for (int i = 0; i < N; i++) k[i] = tk(60, (uint64_t)i);
  cr_assert_eq(ts_local_put(e.store, k, N, &l), N);
  /* Stop the cache peer: the write-behind thread gets stuck in its first store (for up to
   * KVSHIM_RPC_TIMEOUT_MS), so a push that waited for room would wait that long. */
  cr_assert_eq(kill(SERVE, SIGSTOP), 0);
  int wst = 0;
  cr_assert_eq(waitpid(SERVE, &wst, WUNTRACED), SERVE);
  cr_assert(WIFSTOPPED(wst));
  int queued = 0, full = 0;
  uint64_t worst_us = 0;
  for (int i = 0; i < N; i++) {
    uint64_t t0 = kvs__now_ns();
    int rc = kvs_peers_push(e.peers, &k[i], 1);
    uint64_t us = (kvs__now_ns() - t0) / 1000;
    if (us > worst_us) worst_us = us;
    if (rc == 0) queued++;
    else if (rc == -ENOSPC) full++;
    else cr_assert_fail("push returned %d", rc);
  }
  cr_assert_eq(kill(SERVE, SIGCONT), 0);
  cr_log_info("tiny queue: %d queued, %d refused, slowest push %llu us", queued, full,
              (unsigned long long)worst_us);
  cr_assert_gt(full, 0, "a queue of 2 took %d objects of 1 MiB without a drop", queued);
  cr_assert_geq(queued, 2);
  cr_assert_leq(queued, 3); /* 2 queued + at most 1 taken by the (stuck) thread */
  /* Scheduling noise on a loaded machine is a few ms; a push that waited would take the RPC
   * deadline (2 s). */
  cr_assert_lt(worst_us, 250000, "a push blocked for %llu us", (unsigned long long)worst_us);
  cr_assert_eq(kvs_stats_get(&e.stats, KVS_STAT_push_queued), (uint64_t)queued);
  cr_assert_geq(kvs_stats_get(&e.stats, KVS_STAT_push_dropped), (uint64_t)full);
  cr_assert_eq(kvs_peers_flush(e.peers, 10000), 0);
  /* Every object is accounted for: sent, or dropped and counted. */
  uint64_t sent = kvs_stats_get(&e.stats, KVS_STAT_push_sent);
  uint64_t dropped = kvs_stats_get(&e.stats, KVS_STAT_push_dropped);
  cr_assert_eq(sent + dropped, N, "sent %llu + dropped %llu != %d", (unsigned long long)sent,
               (unsigned long long)dropped, N);
  cr_assert_eq(sent, (uint64_t)queued);
  /* What was sent is at the cache, intact. */
  int at_cache = 0;
  for (int i = 0; i < N; i++) {
    int found = kvs_peers_lookup(e.peers, &k[i], 1, NULL);
    at_cache += found;
  }
  cr_assert_eq((uint64_t)at_cache, sent);
  engine_close(&e);
}

Test(push, no_cache_peer_means_no_push, T_TIMEOUT) {
  cr_assert_eq(ts_mkdtemp(ROOT, sizeof ROOT, "kvs-coordpush"), 0);
  snprintf(RUN, sizeof RUN, "%s/run", ROOT);
  engine_t e;
  cr_assert_eq(engine_open(&e, 4, 4u << 20), -ENOENT); /* nobody there */
  kvs_key_t k = tk(61, 0);
  kvs_layout_t l = kvs_layout_blob(4096);
  cr_assert_eq(ts_local_put(e.store, &k, 1, &l), 1);
  cr_assert_eq(kvs_peers_push(e.peers, &k, 1), -ENOTSUP);
  cr_assert_eq(kvs_stats_get(&e.stats, KVS_STAT_push_queued), 0);
  engine_close(&e);
}
