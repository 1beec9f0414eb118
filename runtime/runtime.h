/* kvshim runtime: the process runtime every hook family stands on (design §2, §9.2, §9.3).
 * It names no family: the families are data (runtime/hooks.h) listed by the assembly
 * (preload/). Internal: nothing here is exported and nothing is installed.
 *
 * Life of the process, as seen from here:
 *   load        the assembly's constructor records the pid (kvs__runtime_loaded) and registers
 *               the fork handlers; nothing else. Every child of the engine (shells, compilers,
 *               test forks) loads the library, and none of them may notice it until it calls
 *               a hook.
 *   config      the first hooked call of any kind reads the configuration snapshot once
 *               (kvs__runtime_options: every row of runtime/rows.h) and installs the stats
 *               table. KVSHIM_ENABLE=0 stops here: every hook passes through.
 *   runtime     the first hooked call that needs the cache (an allocation hook, a kvo/llama
 *               hook) builds the runtime once with pthread_once (kvs__runtime_get): pool,
 *               store, tensor registry, coordinator + peer client (unless KVSHIM_PEERS=0),
 *               then each hook family's init. Any failure leaves the state FAILED: hooks pass
 *               through and count hook_fallbacks; the process goes on.
 *   fork        the child forgets the parent's runtime (its pool pages stay mapped, so buffers
 *               the parent handed out stay valid, but the child never allocates from them),
 *               closes the inherited coordinator sockets at once, and builds its own runtime
 *               (own pool, own socket) on its first hooked call (kvs__runtime_fork).
 *   exit        kvs__runtime_exit writes KVSHIM_STATS (when this process called a hooked
 *               function, kvshim enabled or not, with "enabled") and stops the coordinator (its socket file is removed). The
 *               pool and the store are left mapped: hooks called later in exit (atexit
 *               handlers freeing pinned buffers) keep working.
 *
 * Re-entry: kvs__hook_depth is a thread-local counter. A hook that finds it non-zero passes
 * straight through; the runtime init and kvshim's own work inside every hook run with it
 * raised (KVS__REENTRY_GUARD), so a driver that calls back into an exported hook, or an
 * allocation made while initialising, never re-enters kvshim. */
#ifndef KVSHIM_RUNTIME_H
#define KVSHIM_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "coord.h"
#include "peer.h"
#include "pool.h"
#include "registry.h"
#include "rows.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Functions on the path of every dlsym call. The ASan runtime resolves its interceptors with
 * dlsym(RTLD_NEXT, ...) before its shadow memory exists, so they must not be instrumented. */
#define KVS__DLSYM_PATH __attribute__((no_sanitize("address", "undefined")))

/* Runtime states (kvs__rt_state). UNINIT -> ACTIVE | FAILED once per process image (reset to
 * UNINIT in a fork child unless DISABLED). DISABLED: KVSHIM_ENABLE=0. */
enum { KVS__RT_UNINIT = 0, KVS__RT_ACTIVE = 1, KVS__RT_FAILED = 2, KVS__RT_DISABLED = 3 };

/* Everything the hooks share. Written once by the init (before kvs__rt_state becomes ACTIVE,
 * with release ordering), read-only afterwards; the objects it points to are thread safe. */
typedef struct kvs__runtime {
  kvs_config_t opts;               /* the configuration snapshot (runtime/rows.h) */
  kvs_pool_t *pool;                /* owned; never destroyed (see exit above) */
  kvs_store_t *store;              /* owned */
  kvs_tensor_registry_t *tensors;  /* owned: every intercepted allocation (registry.h) */
  kvs_coord_t *coord;              /* owned; NULL with KVSHIM_PEERS=0 */
  kvs_peers_t *peers;              /* owned; NULL with KVSHIM_PEERS=0 */
  uint64_t instance_id;            /* the pool's, also the coordinator's socket name */
  uintptr_t host_lo, host_hi;      /* host arena mapping [host_lo, host_hi); both 0 when none */
  uint64_t host_off;               /* segment offset of host_lo */
  pid_t pid;                       /* the process that built it */
} kvs__runtime_t;

/* An engine's pool is prefaulted this far ahead of the highest extent it allocated. */
#define KVS__PREFAULT_AHEAD (32ull << 20)

/* The two below are the cache facade's (runtime/cache.c, design §3.7): no hook family calls them.
 *
 * One copy per node (design §3.5): the instance id of the connected `kvshim serve` cache peer
 * that holds the node's copy (KVSHIM_ONE_COPY=1), or 0 (none known, or KVSHIM_ONE_COPY=0: keep
 * an own copy). No I/O. Also sizes the own pool: KVSHIM_POOL_LEAN_SIZE usable while a cache
 * peer is known, KVSHIM_POOL_SIZE when none is. */
uint64_t kvs__runtime_cache_peer(kvs__runtime_t *rt);

/* Keep-behind (cold start, design §21.9): chunks a hook has
 * just copied from peer `instance`'s pool straight into the engine's buffer are queued here,
 * and one background thread (nice 19, with a peer client of its own, so the engine's calls
 * never wait on its connections) copies them from that peer into the local store
 * (kvs_peers_fetch, then commit), off the engine's path. keys[0..n) share layout. A chunk the
 * store cannot keep, or the peer no longer holds, is simply not kept. Drained (bounded) at
 * exit before KVSHIM_STATS is written. The thread starts on queued chunks only once they are
 * released (release, or kvs__runtime_keep_release: the caller's loads from that peer are done),
 * so it never competes with them for the peer's coordinator or the CPU. Returns 0 (queued),
 * -ENOSPC (queue full: not kept), -ENOTSUP (no peers) or -EINVAL. */
int kvs__runtime_keep(kvs__runtime_t *rt, uint64_t instance, const kvs_key_t *keys, size_t n,
                      const kvs_layout_t *layout, bool release);
/* Release every chunk queued for keep-behind (no-op when none is held). */
void kvs__runtime_keep_release(void);

extern kvs__runtime_t kvs__rt;
extern int kvs__rt_state; /* atomic: KVS__RT_* */
extern __thread int kvs__hook_depth __attribute__((tls_model("initial-exec")));

/* ---- re-entry guard --------------------------------------------------------------------------
 * KVS__REENTRY_GUARD(); raises kvs__hook_depth until the end of the enclosing block, whatever
 * way the block is left (return, break, goto). Use it around kvshim's own work inside a hook:
 *     { KVS__REENTRY_GUARD(); kvs_store_commit(...); } */
static inline int kvs__reentry_enter(void) { return kvs__hook_depth++; }
static inline void kvs__reentry_leave(int *unused) {
  (void)unused;
  kvs__hook_depth--;
}
#define KVS__GUARD_CAT2(a, b) a##b
#define KVS__GUARD_CAT(a, b) KVS__GUARD_CAT2(a, b)
#define KVS__REENTRY_GUARD()                                                                  \
  int KVS__GUARD_CAT(kvs__guard_, __LINE__)                                                   \
      __attribute__((cleanup(kvs__reentry_leave), unused)) = kvs__reentry_enter()

/* ---- the process runtime (runtime.c) ------------------------------------------------------- */

/* The configuration snapshot, read from environ on the first call (log level and
 * KVSHIM_LOG_FILE applied; KVSHIM_LOG=debug prints the table). Never NULL. */
const kvs_config_t *kvs__runtime_options(void);

/* The runtime when it is ACTIVE, building it on the first call (concurrent first callers wait
 * for one init). NULL means "pass through": disabled, init failed, or called re-entrantly. */
kvs__runtime_t *kvs__runtime_get(void);

/* The runtime if it is ACTIVE now, without ever starting the init (hooks that can only concern
 * kvshim's own memory: frees, copies). NULL otherwise or when re-entered. */
static inline kvs__runtime_t *kvs__runtime_active(void) {
  if (__builtin_expect(kvs__hook_depth != 0, 0)) return 0;
  return __atomic_load_n(&kvs__rt_state, __ATOMIC_ACQUIRE) == KVS__RT_ACTIVE ? &kvs__rt : 0;
}

/* Count a hooked call that reached kvshim / one passed through because of an internal problem
 * (init failed, table full, ...). */
static inline void kvs__hook_count(void) { kvs_stats_inc(kvs_stats_global(), KVS_STAT_hook_calls); }
/* A hook body kvshim serves: counted once, and everything from here to the end of the enclosing
 * block runs with the re-entry guard raised (KVS__REENTRY_GUARD). */
#define KVS__HOOK_ENTER()                                                                     \
  KVS__REENTRY_GUARD();                                                                       \
  kvs__hook_count()
static inline void kvs__hook_fallback(void) {
  kvs_stats_inc(kvs_stats_global(), KVS_STAT_hook_fallbacks);
}

/* For the assembly (preload/): the constructor calls kvs__runtime_loaded once; the destructor
 * kvs__runtime_exit; the fork handlers kvs__runtime_fork(0 prepare, 1 parent, 2 child). The
 * child phase is async-signal-safe and also resets every hook family (runtime/hooks.h). */
void kvs__runtime_loaded(void);
void kvs__runtime_exit(void);
void kvs__runtime_fork(int phase);

#ifdef __cplusplus
}
#endif
#endif
