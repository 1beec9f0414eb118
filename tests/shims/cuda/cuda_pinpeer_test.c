/* tests/shims/cuda: a cache peer's pool mapping registered with the driver (issue 14 item 7).
 *
 *   cuda_pinpeer_test KVSHIM_CLI
 *
 * Not preloaded: it links the runtime and shims/cuda, installs the CUDA kvs_accel table (as the
 * cuda hooks do at their first call) and holds device 0's primary context like an engine. A
 * `kvshim serve` in the same run directory is the cache peer; the engine maps its pool
 * writable. Checks, from the fake driver's call log:
 *   - the discovery watcher's step after the accelerator is installed adopts the cache peer
 *     (runtime/discovery.h): it starts the registration of the whole mapping, PORTABLE (0x1:
 *     writable, stores copy into it), on another thread than the caller's, counted in
 *     cache_peer_pool_pins; a query (kvs_peers_cache_peer, kvs_peers_lookup_at, a scan of the
 *     table alone, kvs_peers_discover) starts nothing;
 *   - serve killed: the connection is forgotten and the mapping unregistered, before it is
 *     unmapped (the fake aborts a process at its next cuMemHostRegister/Unregister, or at exit,
 *     when a registered range is no longer mapped);
 *   - no accelerator installed: nothing is registered. */
#include <cuda.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accel.h"
#include "discovery.h"
#include "peer.h"
#include "preload_testutil.h"
#include "runtime.h"
#include "stats.h"

const kvs_accel_ops_t *kvs__cuda_accel_ops(void);

static void nap_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The label (r<n>) of the one successful background registration of bytesize >= min. */
static int pool_label(const char *text, unsigned long long min, char *label, size_t cap) {
  int found = 0;
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    unsigned long long n = 0;
    char lb[32];
    if (sscanf(l, "cuMemHostRegister_v2 bytesize=%llu flags=0x1 -> 0 range=%31s", &n, lb) == 2 &&
        n >= min) {
      const char *eol = strchr(l, '\n');
      const char *other = strstr(l, "thread=other");
      PT_CHECK(other && (!eol || other < eol), "the pool was registered on the caller's thread");
      snprintf(label, cap, "%s", lb);
      found++;
    }
  }
  return found;
}

int main(int argc, char **argv) {
  PT_CHECK(argc == 2, "usage: cuda_pinpeer_test KVSHIM_CLI");
  char tmp[256], log[512], run[512], line[512];
  pt_mkdtemp(tmp, sizeof tmp, "pinpeer");
  snprintf(log, sizeof log, "%s/fake.log", tmp);
  snprintf(run, sizeof run, "%s/run", tmp);
  pt_env_t env;
  pt_env_init(&env, false);
  pt_env_set(&env, "KVSHIM_RUN_DIR", "%s", run);
  char *serve_argv[] = {argv[1], "serve", "--pool-size", "16M", NULL};
  pt_proc_t serve;
  pt_spawn(&serve, serve_argv, &env, &(pt_spawn_opts_t){.pipes = true});
  pt_readline(&serve, line, sizeof line);
  PT_CHECK(strstr(line, "socket"), "serve banner: %s", line);

  setenv("KVSHIM_RUN_DIR", run, 1);
  setenv("KVSHIM_POOL_SIZE", "32M", 1);
  setenv("FAKECUDA_LOG", log, 1);
  pt_cuda_setup(); /* device 0's primary context retained and current, as an engine's */
  kvs__runtime_t *rt = kvs__runtime_get();
  PT_CHECK(rt && rt->peers, "no runtime with peers");
  uint64_t id = 0;
  for (int i = 0; i < 3000 && !id; i++) {
    id = kvs__runtime_cache_peer(rt);
    if (!id) nap_ms(10);
  }
  PT_CHECK(id != 0, "serve never became the cache peer");
  /* The watcher stopped: from here on this thread steps discovery (kvs__discovery_tick). */
  kvs__discovery_stop();
  /* The default accelerator table: the mapping is used, nothing registers it. */
  for (int i = 0; i < 20; i++) kvs__discovery_tick(rt, i == 0);
  PT_CHECK(kvs_stats_get(kvs_stats_global(), KVS_STAT_cache_peer_pool_pins) == 0,
           "pinned without an accelerator");

  PT_CHECK(kvs_accel_set(kvs__cuda_accel_ops(), NULL) == 0, "install the CUDA table");
  /* A query has no side effect, nor has a scan alone: the registration starts at the
   * watcher's adoption event. */
  kvs_key_t nokey;
  memset(&nokey, 0x5a, sizeof nokey);
  for (int i = 0; i < 20; i++) {
    PT_CHECK(kvs_peers_cache_peer(rt->peers) == id, "cache peer");
    PT_CHECK(kvs_peers_lookup_at(rt->peers, id, &nokey, 1) == 0, "lookup_at");
    PT_CHECK(kvs_peers_discover(rt->peers, i == 0) >= 1, "the cache peer is gone");
  }
  nap_ms(50);
  PT_CHECK(kvs_stats_get(kvs_stats_global(), KVS_STAT_cache_peer_pool_pins) == 0,
           "a query started the registration");
  char *before = pt_read_file(log, NULL);
  PT_CHECK(before && pt_count(before, "cuMemHostRegister_v2") == 0,
           "a query registered memory:\n%s", before ? before : "");
  free(before);
  PT_CHECK(kvs__discovery_tick(rt, false) >= 1, "the cache peer is gone");
  for (int i = 0; i < 6000; i++) { /* an idle-priority thread: bounded wait, not a timing */
    if (kvs_stats_get(kvs_stats_global(), KVS_STAT_cache_peer_pool_pins) > 0) break;
    nap_ms(10);
  }
  PT_CHECK(kvs_stats_get(kvs_stats_global(), KVS_STAT_cache_peer_pool_pins) == 1,
           "cache_peer_pool_pins %llu, expected 1",
           (unsigned long long)kvs_stats_get(kvs_stats_global(), KVS_STAT_cache_peer_pool_pins));
  for (int i = 0; i < 20; i++) kvs__discovery_tick(rt, false); /* once per mapping */
  char *text = pt_read_file(log, NULL);
  PT_CHECK(text, "read %s", log);
  char label[32] = "";
  PT_CHECK(pool_label(text, 16ull << 20, label, sizeof label) == 1,
           "not one background registration of serve's pool:\n%s", text);
  free(text);

  /* serve gone: the next call to it fails, and the connection is forgotten. */
  PT_CHECK(kill(serve.pid, SIGKILL) == 0, "kill serve");
  pt_wait(&serve, 30);
  kvs_key_t key;
  memset(&key, 0, sizeof key);
  PT_CHECK(kvs_peers_lookup_at(rt->peers, id, &key, 1) < 0, "a dead serve answered");
  kvs__discovery_tick(rt, true);
  PT_CHECK(kvs__runtime_cache_peer(rt) == 0, "the dead serve is still the cache peer");
  text = pt_read_file(log, NULL);
  PT_CHECK(text, "read %s", log);
  char want[64];
  snprintf(want, sizeof want, "cuMemHostUnregister p=%s -> 0", label);
  PT_CHECK(pt_count(text, want) == 1, "%s not unregistered:\n%s", label, text);
  free(text);
  /* The fake checks every registration it holds is still mapped (aborts otherwise). */
  static char probe[1 << 16] __attribute__((aligned(4096)));
  PT_CHECK(cuMemHostRegister(probe, sizeof probe, 0) == CUDA_SUCCESS &&
               cuMemHostUnregister(probe) == CUDA_SUCCESS,
           "probe registration");
  PT_CHECK(cuCtxSetCurrent(NULL) == CUDA_SUCCESS && cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS,
           "release");
  pt_env_free(&env);
  pt_rm_rf(tmp);
  printf("PASS cuda_pinpeer\n");
  return 0;
}
