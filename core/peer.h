/* kvshim peer: the client side of the coordinator protocol (design §7).
 *
 * Discovery lists $run_dir/<group>/ and connects to every <instance>.sock but our own; a socket
 * that refuses connections is stale and removed. One connection per peer, reused, each call
 * bounded by KVSHIM_RPC_TIMEOUT_MS. A failed or timed-out call closes that connection (the next
 * discovery reconnects) and is reported as a miss: nothing here ever makes a caller fail in a
 * way it could not ignore.
 *
 * SHM peers: the HELLO reply carries the peer's pool fd; we map it read-write and copy straight
 * out of (retrieve) or into (store) its extents. Peers we could not map are served inline.
 *
 * Write-behind (KVSHIM_PUSH=auto): objects queued with kvs_peers_push are copied from the local
 * store to a `kvshim serve` cache peer by a background thread, through a bounded queue (a full
 * queue drops and counts). kvs_peers_destroy flushes it for at most flush_ms.
 *
 * Threads: every function may be called from any thread. A table mutex guards the peer list;
 * a per-connection mutex serialises the calls on one connection. */
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

typedef struct kvs_peer_info {
  uint64_t instance_id;
  uint32_t pid;
  uint8_t role;          /* KVS_PROTO_ROLE_* */
  uint8_t strategy;      /* KVS_PROTO_STRATEGY_SHM or _INLINE, as used for this peer */
  uint64_t pool_segment_size, arena_size, arena_used; /* from its HELLO */
  char path[128];
} kvs_peer_info_t;

int kvs_peers_create(const kvs_peers_config_t *cfg, kvs_peers_t **out);
/* Flush write-behind (bounded), close every connection, unmap peer pools. Accepts NULL. */
void kvs_peers_destroy(kvs_peers_t *p);

/* Refresh the peer list: connect to new sockets, forget dead peers, remove stale socket files.
 * Returns the number of live peers. Rate-limited to once per 200 ms unless force or the group
 * directory changed since the last scan (a socket came or went). Every call
 * (rate-limited or not) adopts a connected cache peer: with an accelerator installed, its pool
 * mapping is registered once, on an idle-priority thread (cache_peer_pool_pins). */
int kvs_peers_discover(kvs_peers_t *p, bool force);
/* Live peers (up to cap); returns how many there are. */
int kvs_peers_list(kvs_peers_t *p, kvs_peer_info_t *out, size_t cap);

/* Ask every live peer for the leading run of keys it holds READY; *best gets the instance id of
 * the peer with the longest run (0 when none). Returns the run length (>= 0; errors are misses). */
int kvs_peers_lookup(kvs_peers_t *p, const kvs_key_t *keys, size_t n, uint64_t *best);

/* Receives one retrieved object: bytes are valid only during the call (SHM: the peer's pool,
 * pinned; inline: the reply). Return 0 to go on, negative to stop (the rest are not delivered). */
typedef int (*kvs_peer_sink_fn)(void *ctx, size_t key_index, const kvs_layout_t *layout,
                                const void *bytes, uint64_t len);

/* Copy a retrieved object out of a peer's pool (what a sink does with its bytes): streaming
 * (non-temporal, cache-bypassing) stores from KVS_PEERS_COPY_NT_MIN bytes up when the CPU has
 * AVX2, memcpy below and elsewhere. Measured on the 2-vCPU machine of docs/PERF.md (source
 * outside the cache): streaming stores move 1.4-1.8x the bytes of memcpy from 256 KiB to
 * 16 MiB with a cold destination and about the same with a destination the cache still holds;
 * at 16 KiB into a cached destination they are half as fast. */
#define KVS_PEERS_COPY_NT_MIN (128u * 1024u)
void kvs_peers_copy(void *dst, const void *src, size_t n);
/* The streaming copy alone, at any size (memcpy without AVX2): for benchmarks and callers that
 * know their destination is not read back soon. */
void kvs_peers_copy_stream(void *dst, const void *src, size_t n);

/* Retrieve keys[0..n) from peer `instance` (0 = the best peer from a fresh lookup). Delivers the
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

/* Copy keys[0..n) from peer `instance` (0 = the best peer from a fresh lookup) into the local
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

/* Queue an object of the local store (found under keys[0]; keys[1..n) are its aliases to bind
 * at the cache peer too) for write-behind. Never blocks: returns 0 when queued, -ENOSPC when the
 * queue is full (counted in push_dropped), -ENOTSUP when pushing is off or there is no local
 * store. */
int kvs_peers_push(kvs_peers_t *p, const kvs_key_t *keys, size_t n);
/* Wait until the write-behind queue is empty or timeout_ms passed. Returns objects still queued. */
int kvs_peers_flush(kvs_peers_t *p, uint32_t timeout_ms);

/* ---- one copy per node (design §3.5): the engine side's helpers --------------------------- */

/* Instance id of a connected `kvshim serve` cache peer, or 0 (none known). No discovery, no I/O
 * and no side effect: one walk of the peer table. (Discovery adopts a cache peer: it starts the
 * registration of its pool mapping with the accelerator, kvs_peers_discover.) */
uint64_t kvs_peers_cache_peer(kvs_peers_t *p);

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

/* Retrieve keys[0..n) from peer `instance` (0 = the best peer from a fresh lookup) straight into
 * the caller's buffers: object i (exactly len bytes, else the delivery stops) is copied into
 * dsts[i] by copy (NULL = kvs_peers_copy) while the peer holds its pin, with no copy anywhere
 * else. Returns how many leading keys were copied (>= 0), or the retrieve's negative errno (a miss;
 * -ESTALE: the pins expired during the copy, so nothing copied may be used). */
int kvs_peers_retrieve_copy(kvs_peers_t *p, uint64_t instance, const kvs_key_t *keys, size_t n,
                            uint64_t len, void *const *dsts, kvs_peer_copy_fn copy, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
