/* kvshim peer client: discovery (design §7, §3.8). A scan lists $run_dir/<group>/, connects to
 * every <instance>.sock but our own (HELLO, mapping an SHM peer's pool), forgets dead
 * connections and removes a socket file that refuses connections (stale). A peer that failed
 * lately is not dialled again before its back-off (1 s, doubling to 30 s) ends.
 *
 * Nothing else in the client scans: the queries (peer.h) ask the table as the last scan left
 * it. In a process kvshim is loaded into only the runtime's watcher calls kvs_peers_discover
 * (runtime/discovery.c; the layering test checks it); tools and tests call it themselves. */
#ifndef KVSHIM_PEER_DISCOVER_H
#define KVSHIM_PEER_DISCOVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_peers kvs_peers_t;

typedef struct kvs_peer_info {
  uint64_t instance_id;
  uint32_t pid;
  uint8_t role;          /* KVS_PROTO_ROLE_* */
  uint8_t strategy;      /* KVS_PROTO_STRATEGY_SHM or _INLINE, as used for this peer */
  uint64_t pool_segment_size, arena_size, arena_used; /* from its HELLO */
  char path[128];
} kvs_peer_info_t;

/* Refresh the peer list: connect to new sockets, forget dead peers, remove stale socket files.
 * Returns the number of live peers. Rate-limited to once per 200 ms unless force or the group
 * directory changed since the last scan (a socket came or went). Every call
 * (rate-limited or not) adopts a connected cache peer: with an accelerator installed, its pool
 * mapping is registered once, on an idle-priority thread (cache_peer_pool_pins). */
int kvs_peers_discover(kvs_peers_t *p, bool force);
/* Live peers (up to cap); returns how many there are. */
int kvs_peers_list(kvs_peers_t *p, kvs_peer_info_t *out, size_t cap);

/* Instance id of a connected `kvshim serve` cache peer, or 0 (none known). No discovery, no I/O
 * and no side effect: one walk of the peer table. (Adopting it, registering its pool mapping, is
 * kvs_peers_pin_cache, the runtime watcher's event.) */
uint64_t kvs_peers_cache_peer(kvs_peers_t *p);

#ifdef __cplusplus
}
#endif
#endif
