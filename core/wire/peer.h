/* kvshim peer: the client side of the coordinator protocol (design §7), in four files:
 *   peer.c           the queries below: lookup, retrieve, fetch, store, watch, stats, ping;
 *   peer_conn.c      connections: framing, HELLO, the call deadline, back-off (peer_conn.h,
 *                    internal to these four files);
 *   peer_discover.c  discovery, the scan of the group directory (peer_discover.h);
 *   peer_xfer.c      transfers: the streaming copy, inline replies into the caller's buffers,
 *                    SHM and inline stores, write-behind, the cache peer's pool registration
 *                    (peer_xfer.h).
 *
 * The queries are pure: they ask the peers the table holds and never run a discovery or start a
 * thread. Whoever owns the client refreshes the table (kvs_peers_discover): in a process kvshim
 * is loaded into, the runtime's one discovery watcher (runtime/discovery.h, design §3.8); a tool
 * or a test calls it itself. One connection per peer, reused, each call bounded by
 * KVSHIM_RPC_TIMEOUT_MS. A failed or timed-out call closes that connection (the next discovery
 * reconnects) and is reported as a miss: nothing here ever makes a caller fail in a way it could
 * not ignore.
 *
 * SHM peers: the HELLO reply carries the peer's pool fd; we map it read-write and copy straight
 * out of (retrieve) or into (store) its extents. Peers we could not map are served inline.
 *
 * Threads: every function may be called from any thread. A table mutex guards the peer list;
 * a per-connection mutex serialises the calls on one connection. The only threads are
 * write-behind's (started by kvs_peers_create when the client pushes) and the pool
 * registration's (kvs_peers_pin_cache), both through core/prim.h. */
#ifndef KVSHIM_PEER_H
#define KVSHIM_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keys.h"
#include "options.h"
#include "stats.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_peers kvs_peers_t;

typedef struct kvs_peers_config {
  const kvs_options_t *opts; /* copied at create: run_dir, group, strategy, rpc_timeout_ms,
                                max_frame, push */
  uint64_t instance_id;      /* ours: our own socket is skipped (0 = none, a tool) */
  uint8_t role;              /* KVS_PROTO_ROLE_ENGINE, _CACHE or _TOOL */
  kvs_store_t *local;        /* borrowed, may be NULL: the source of write-behind pushes */
  kvs_stats_t *stats;        /* borrowed; NULL = kvs_stats_global() */
  uint32_t push_queue;       /* write-behind queue capacity in objects; 0 = 1024 */
  uint32_t flush_ms;         /* destroy flushes the queue this long at most; 0 = 2000 */
} kvs_peers_config_t;

int kvs_peers_create(const kvs_peers_config_t *cfg, kvs_peers_t **out);
/* Flush write-behind (bounded), close every connection, unmap peer pools. Accepts NULL. */
void kvs_peers_destroy(kvs_peers_t *p);

/* Ask every live peer for the leading run of keys it holds READY; *best gets the instance id of
 * the peer with the longest run (0 when none). Returns the run length (>= 0; errors are misses). */
int kvs_peers_lookup(kvs_peers_t *p, const kvs_key_t *keys, size_t n, uint64_t *best);

/* Receives one retrieved object: bytes are valid only during the retrieve (SHM: the peer's pool,
 * pinned until the transfer ends after the last delivery; inline: the reply, freed then), so
 * the bytes of every object of one retrieve may be used together in its last call. Return 0 to
 * go on, negative to stop (the rest are not delivered). */
typedef int (*kvs_peer_sink_fn)(void *ctx, size_t key_index, const kvs_layout_t *layout,
                                const void *bytes, uint64_t len);

/* Retrieve keys[0..n) from peer `instance` (0 = the best peer a lookup finds). Delivers the
 * leading run of found keys to sink in key order. Returns how many keys were delivered (>= 0),
 * or a negative errno: -ENOENT (no such live peer), -ETIMEDOUT, -ECONNRESET ... (a miss).
 * -ESTALE: the peer's pins expired while sink copied (COMMIT_RETRIEVE answered ENOENT), so the
 * extents may have been rewritten under the copy: whatever sink made of the bytes must be
 * thrown away (counted in peer_stale_reads). */
int kvs_peers_retrieve(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                       kvs_peer_sink_fn sink, void *ctx);

/* kvs_peers_retrieve straight into the caller's buffers: the object found under keys[i] (the
 * first key of each object; its aliases share it) lands in bufs[i], which holds caps[i] bytes,
 * and lens[i] gets its length (0 for keys not delivered and for aliases). SHM: copied out of the
 * pinned extents with kvs_peers_copy; inline: received from the socket straight into bufs[i]
 * (no reply buffer, no second copy). An object larger than its buffer ends the delivery there
 * (the rest of the reply is read and dropped). Returns the keys delivered, as
 * kvs_peers_retrieve. */
int kvs_peers_retrieve_into(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                            void *const *bufs, const uint64_t *caps, uint64_t *lens);

/* What became of one key in kvs_peers_fetch. */
typedef enum kvs_fetch_status {
  KVS_FETCH_MISS = 0, /* not delivered, refused by keys_fn, or not kept (the local store had no
                         room, or it is being written there) */
  KVS_FETCH_LOCAL,    /* the local store holds it READY (another thread fetched or stored it
                         meanwhile): read it there */
  KVS_FETCH_COPIED,   /* copied into a local extent that is being written: the caller verifies
                         the bytes, then kvs_store_commit (keep) or kvs_store_abort (drop) */
} kvs_fetch_status_t;

typedef struct kvs_fetch {
  kvs_fetch_status_t status;
  kvs_extent_t extent; /* COPIED: the local extent (offset in the local store's pool) */
  kvs_xfer_t xfer;     /* COPIED: the local write transfer (KVS_OWNER_LOCAL), the caller's to end */
} kvs_fetch_t;

/* The keys to bind a delivered object under locally, read from its bytes (valid only during
 * the call): point *keys at the caller's own array of them (keys[0] primary, the rest aliases;
 * valid until the call returns) and return how many (> 0), or return a negative value to refuse
 * the object (MISS; the rest are not delivered). */
typedef int (*kvs_fetch_keys_fn)(void *ctx, size_t key_index, const void *bytes, uint64_t len,
                                 const kvs_key_t **keys);

/* Copy keys[0..n) from peer `instance` (0 = the best peer a lookup finds) into the local
 * store (the kvs_peers_config_t local store), one local reservation per delivered object of the
 * leading run, in one PREPARE_RETRIEVE:
 *   layout != NULL  each object is a chunk of this layout (its length must be the layout's
 *                   bytes, else the delivery stops), bound under its own key;
 *   layout == NULL  each object is a blob (a 1-D u8 layout of its length), bound under the
 *                   keys keys_fn returns (NULL: its own key only).
 * Nothing is committed here: the caller checks each COPIED extent and commits or aborts it, in
 * one place per shim. out[0..n) get each key's status (MISS beyond the delivered run). Returns
 * how many keys the peer delivered (>= 0), or a negative errno: -ENOTSUP (no local store),
 * -EINVAL, or the retrieve's (a miss). */
int kvs_peers_fetch(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    const kvs_layout_t *layout, kvs_fetch_keys_fn keys_fn, void *ctx,
                    kvs_fetch_t *out);

/* Store into peer `instance` (0 = the cache peer if any, else the first live peer).
 * object false: one object of `layout` per key, bytes bufs[i]. object true: one object under
 * keys[0] (+ aliases keys[1..n)), bytes bufs[0]. outcomes (may be NULL; n entries, or 1 for an
 * object) get the kvs_reserve_outcome_t of each. Returns the number of objects the peer now
 * holds from this call (RESERVED and committed, or PRESENT), or a negative errno. */
int kvs_peers_store(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    const kvs_layout_t *layout, bool object, const void *const *bufs,
                    uint8_t *outcomes);

/* STATS of a peer (INFO or JSON text, NUL-terminated, cut to cap). Returns the text length. */
int kvs_peers_stats(kvs_peers_t *p, uint64_t instance, bool json, char *buf, size_t cap);
/* Round trip to a peer; 0 or a negative errno. */
int kvs_peers_ping(kvs_peers_t *p, uint64_t instance);
/* Tell peer `instance` that the object it delivered under key failed our format check: len and
 * checksum (kvs_checksum64) describe the object exactly as we read it. The peer drops it when
 * its own bytes are still those (docs/protocol.md 4.11). Returns 1 dropped, 0 kept (rewritten
 * since, pinned by a reader, or gone), -EOPNOTSUPP (the peer predates REPORT_BAD: nothing
 * sent), or another negative errno. Never call it from inside a retrieve's sink. */
int kvs_peers_report_bad(kvs_peers_t *p, uint64_t instance, kvs_key_t key, uint64_t len,
                         uint64_t checksum);

/* ---- one copy per node (design §3.5): the engine side's helpers --------------------------- */

/* Does peer `instance` (0: the cache peer, else the first live one) keep tiers below its pool
 * (its HELLO offered KVS_PROTO_CAP_REMOTE)? Only a LOOKUP asks such a peer to bring what its
 * pool lacks (docs/protocol.md 4.3): a key read there without one first is a miss. False when
 * no such live peer. */
bool kvs_peers_has_tiers(kvs_peers_t *p, uint64_t instance);

/* The leading run of keys[0..n) that peer `instance` holds READY, in one LOOKUP (no discovery).
 * Returns the run (>= 0), -ENOENT (no such live peer) or the call's negative errno. */
int kvs_peers_lookup_at(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n);

/* Wait at peer `instance` (one WATCH, no discovery) until keys[0] is no longer stored there, or
 * one of keys[1..n) is, or wait_ms passed (cut to three quarters of KVSHIM_RPC_TIMEOUT_MS, so
 * the reply comes within the call's deadline: call again to wait longer). 1 <= n <=
 * KVS_PROTO_MAX_WATCH_KEYS. Returns KVS_PROTO_WATCH_GONE, _PRESENT or _HELD (time passed),
 * -ENOENT (no such live peer), -ENOTSUP (the peer predates WATCH: poll it with LOOKUPs) or the
 * call's negative errno. The connection to that peer is busy while it waits. */
int kvs_peers_watch(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                    uint32_t wait_ms);

/* Copies one retrieved object (len bytes at src, the peer's pool under a pin, or the reply)
 * into its destination dst (the caller's buffer i). 0, or a negative errno to stop. */
typedef int (*kvs_peer_copy_fn)(void *ctx, size_t i, void *dst, const void *src, size_t len);

/* kvs_peers_store whose bytes are written into the peer's SHM slots by copy (dst: the slot in
 * the peer's pool, src: bufs[i] as given, e.g. a device pointer; i: the key index, 0 for an
 * object) between PREPARE_STORE and COMMIT_STORE: one copy, straight into the node's cache. A
 * copy that fails aborts the whole transfer (nothing published). -ENOTSUP for a peer served
 * inline (the caller keeps the object itself); otherwise as kvs_peers_store. */
int kvs_peers_store_into(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                         const kvs_layout_t *layout, bool object, const void *const *bufs,
                         uint8_t *outcomes, kvs_peer_copy_fn copy, void *ctx);

/* A write of one object reserved at a peer and held across the caller's own work (direct
 * snapshots with one copy per node, design §10.4): dst..dst+len is the object's slot in the
 * peer's pool, mapped here. Each reservation references the connection (never freed, its
 * mapping kept) until it is ended, once, by kvs_peers_publish or kvs_peers_unreserve; the
 * connection's lock is not held in between, so other calls go on. The peer ends it by itself if
 * this connection closes, or when its store's lease (KVSHIM_LEASE_MS) runs out: the publish
 * then fails and nothing is published. */
typedef struct kvs_peer_resv {
  /* the caller's: the object, len bytes (a 1-D u8 layout), under keys[0] and the aliases
   * keys[1..n_keys) */
  const kvs_key_t *keys;
  uint32_t n_keys;
  uint64_t len;
  /* kvs_peers_reserve's */
  uint8_t outcome;     /* the peer's kvs_reserve_outcome_t; 0 when it answered none */
  uint8_t *dst;        /* reserved: where to write the len bytes */
  uint64_t xfer;       /* the peer's write transfer */
  uint64_t offset;     /* the slot's offset in the peer's pool (its key index is 0) */
  struct pconn *conn;  /* referenced while reserved; NULL otherwise */
  /* kvs_peers_publish's: 0 published, or a negative errno */
  int rc;
} kvs_peer_resv_t;

/* The most objects one kvs_peers_reserve or kvs_peers_publish call takes. */
#define KVS_PEERS_RESERVE_MAX 64

/* Reserve *r[0..n) at peer `instance` over SHM, one PREPARE_STORE (kind object) each, sent back
 * to back (pipelined, docs/protocol.md 2.2): one round trip for all. Returns how many were
 * reserved (those have conn set; each other's outcome says why: PRESENT, BUSY, NO_SPACE, ...,
 * or 0 for a request the peer refused or answered with no valid slot, its transfer aborted),
 * or a negative errno and nothing reserved: -EINVAL (n is 0 or above KVS_PEERS_RESERVE_MAX, an
 * object without keys or bytes), -ENOTSUP (a peer served inline), -ENOENT (no such live peer)
 * or the call's. */
int kvs_peers_reserve(kvs_peers_t *p, uint64_t instance, kvs_peer_resv_t *const *r, size_t n);
/* Publish *r[0..n) (reserved, bytes written), one COMMIT_STORE each, pipelined per connection.
 * Returns how many were published; each r[i]->rc says 0 or why not (nothing of it published).
 * Every one is ended (conn NULL); one not reserved gets -EINVAL. */
int kvs_peers_publish(kvs_peers_t *p, kvs_peer_resv_t *const *r, size_t n);
/* End a reservation without publishing it (ABORT; a failed abort only costs the peer a lease).
 * Nothing to do when r holds none. */
void kvs_peers_unreserve(kvs_peers_t *p, kvs_peer_resv_t *r);

/* Retrieve keys[0..n) from peer `instance` (0 = the best peer a lookup finds) straight into
 * the caller's buffers: object i (exactly len bytes, else the delivery stops) is copied into
 * dsts[i] by copy (NULL = kvs_peers_copy) while the peer holds its pin, with no copy anywhere
 * else. Returns how many leading keys were copied (>= 0), or the retrieve's negative errno (a miss;
 * -ESTALE: the pins expired during the copy, so nothing copied may be used). */
int kvs_peers_retrieve_copy(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                            uint64_t len, void *const *dsts, kvs_peer_copy_fn copy, void *ctx);

#ifdef __cplusplus
}
#endif

#include "peer_discover.h"
#include "peer_xfer.h"

#endif
