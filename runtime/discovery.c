/* runtime/discovery: the discovery watcher (discovery.h; design §3.8). */
#include "discovery.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "log.h"
#include "prim.h"
#include "runtime.h"

/* g_lock guards every field below. g_first_done goes 0 -> 1 once per process image (the fork
 * child resets it); g_stop asks the thread to end; g_cond signals both. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static bool g_started, g_stop, g_first_done;
static pthread_t g_thread;
static uint64_t g_adopted; /* the cache peer adopted last (0: none); the watcher's own */
static kvs_peers_t *g_peers; /* the watched client while the watcher runs (atomic: queries read it) */

int kvs__discovery_scan(kvs_peers_t *peers) { return peers ? kvs_peers_discover(peers, false) : 0; }

int kvs__discovery_tick(kvs__runtime_t *rt, bool force) {
  if (!rt || !rt->peers) return 0;
  int live = kvs_peers_discover(rt->peers, force);
  /* The adoption event: the pool sized for the cache peer there is (or is not), then its
   * mapping registered (kvs_peers_pin_cache does nothing twice for one mapping). */
  (void)kvs__runtime_cache_peer(rt);
  uint64_t id = kvs_peers_cache_peer(rt->peers);
  if (id) (void)kvs_peers_pin_cache(rt->peers);
  if (id != __atomic_load_n(&g_adopted, __ATOMIC_RELAXED)) {
    __atomic_store_n(&g_adopted, id, __ATOMIC_RELAXED);
    kvs_log_debug("discovery: cache peer %016llx%s", (unsigned long long)id,
                  id ? " adopted" : " (none)");
  }
  return live;
}

static void *watch_main(void *arg) {
  kvs__runtime_t *rt = arg;
  KVS__REENTRY_GUARD(); /* hooks reached from here (a driver's) pass through */
  kvs__discovery_tick(rt, true);
  /* No cache peer: this engine keeps what it computes and loads in its own pool, so its first
   * step is faulted in now, before its first request needs it (design §5). With one, the pool
   * stays untouched until something is kept in it. */
  if (!kvs__runtime_cache_peer(rt)) kvs_pool_prefault_hint(rt->pool, kvs_pool_page_size(rt->pool));
  pthread_mutex_lock(&g_lock);
  __atomic_store_n(&g_first_done, true, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&g_cond);
  while (!g_stop) {
    struct timespec ts = kvs__realtime_after_ms(KVS__DISCOVERY_TICK_MS);
    pthread_cond_timedwait(&g_cond, &g_lock, &ts);
    if (g_stop) break;
    pthread_mutex_unlock(&g_lock);
    kvs__discovery_tick(rt, false);
    pthread_mutex_lock(&g_lock);
  }
  pthread_mutex_unlock(&g_lock);
  return NULL;
}

int kvs__discovery_start(kvs__runtime_t *rt) {
  if (!rt || !rt->peers) return -EINVAL;
  pthread_mutex_lock(&g_lock);
  int rc = 0;
  if (!g_started) {
    g_stop = false;
    __atomic_store_n(&g_first_done, false, __ATOMIC_RELEASE);
    rc = kvs__prim_thread_start(&g_thread, NULL, watch_main, rt);
    g_started = rc == 0;
    if (g_started) __atomic_store_n(&g_peers, rt->peers, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&g_lock);
  if (rc < 0) kvs_log_info("no discovery watcher (%s): peers are not looked for", strerror(-rc));
  return rc;
}

void kvs__discovery_stop(void) {
  pthread_mutex_lock(&g_lock);
  bool join = g_started;
  g_stop = true;
  g_started = false;
  __atomic_store_n(&g_peers, NULL, __ATOMIC_RELEASE);
  /* nobody waits for a scan that will not come */
  __atomic_store_n(&g_first_done, true, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&g_cond);
  pthread_mutex_unlock(&g_lock);
  if (join) pthread_join(g_thread, NULL);
}

void kvs__discovery_fork_child(void) {
  g_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
  g_cond = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
  g_started = g_stop = g_first_done = false;
  g_adopted = 0;
  g_peers = NULL;
}

void kvs__discovery_wait_watcher(void) {
  if (__atomic_load_n(&g_first_done, __ATOMIC_ACQUIRE)) return;
  struct timespec ts = kvs__realtime_after_ms(KVS__DISCOVERY_FIRST_WAIT_MS);
  pthread_mutex_lock(&g_lock);
  while (g_started && !g_first_done)
    if (pthread_cond_timedwait(&g_cond, &g_lock, &ts) == ETIMEDOUT) break;
  pthread_mutex_unlock(&g_lock);
}

void kvs__discovery_wait_first(void) {
  kvs__discovery_wait_watcher();
  /* The engine's own rate-limited scan (at most one per 200 ms unless the group directory
   * changed; waits for one the watcher is running): a peer that started just before this query
   * is seen even when the watcher's tick is behind. Without it llamaprefix_fake_flight's second
   * replica missed a claimant that had just started in 4 of 24 runs (design §3.8). */
  (void)kvs__discovery_scan(__atomic_load_n(&g_peers, __ATOMIC_ACQUIRE));
}
