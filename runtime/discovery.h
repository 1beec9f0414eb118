/* runtime/discovery: the one discovery watcher of a process kvshim is loaded into (design §3.8).
 *
 * One thread, started through prim when the runtime is built with peers, owns the refresh of
 * the peer client's table: a forced scan at once (the cold start's dials run beside the
 * engine's own start, not inside its first lookup), then one rate-limited scan every
 * KVS__DISCOVERY_TICK_MS (a scan costs one stat() of the group directory unless a socket came or
 * went, or 200 ms passed). The queries of core/wire/peer.h and the cache facade never scan.
 *
 * Adopting a cache peer is one event, run after each scan on this thread: the own pool is
 * sized lean or full (kvs__runtime_cache_peer) and the cache peer's pool mapping is registered
 * with the installed accelerator (kvs_peers_pin_cache: once per mapping, on its own nice-19
 * thread; an accelerator installed later is seen at the next tick).
 *
 * Nothing outside this file calls kvs_peers_discover in shims/ or runtime/ (the layering test
 * checks it). Threads: start/stop/fork_child are the runtime's (rt_build, exit, the fork
 * handler); wait_first and tick may be called from any thread. */
#ifndef KVSHIM_RUNTIME_DISCOVERY_H
#define KVSHIM_RUNTIME_DISCOVERY_H

#include <stdbool.h>

#include "peer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvs__runtime;

#define KVS__DISCOVERY_TICK_MS 20u

/* Start the watcher for rt (rt->peers != NULL). 0 or a negative errno (no thread: then
 * wait_first returns at once and the table is refreshed by nobody; kvshim still serves its own
 * pool). */
int kvs__discovery_start(struct kvs__runtime *rt);
/* Stop and join the watcher (exit, before the peer client is destroyed). Idempotent. */
void kvs__discovery_stop(void);
/* Fork child: the parent's watcher is not ours; forget it (its lock may have been held). */
void kvs__discovery_fork_child(void);
/* Block until the watcher's first scan is done (at most KVS__DISCOVERY_FIRST_WAIT_MS; at once
 * when there is no watcher), then run the caller's own rate-limited scan (kvs_peers_discover,
 * not forced): a lookup made while the engine starts, or just after a peer started, sees the
 * peers that are there, as it did when every lookup scanned (design §3.8). */
#define KVS__DISCOVERY_FIRST_WAIT_MS 10000u
void kvs__discovery_wait_first(void);
/* Only the first half of wait_first: the watcher's first scan, no scan of the caller's own (which
 * may dial sockets). The save paths call it before deciding whether to write behind: a save made
 * while the watcher's first scan is still running would otherwise find no cache peer and keep
 * the chunk unpushed for good (llamacopy_fake_own_copy failed so under a parallel ctest). */
void kvs__discovery_wait_watcher(void);
/* One scan of rt->peers (force: not rate-limited) and the adoption event. Returns the live
 * peers. The watcher's step; tests call it to step discovery by hand. */
int kvs__discovery_tick(struct kvs__runtime *rt, bool force);
/* A scan of a private client's table (keep-behind's own connections): no adoption event. */
int kvs__discovery_scan(kvs_peers_t *peers);

#ifdef __cplusplus
}
#endif
#endif
