/* runtime/cache: the one facade the hook families reach the cache tiers through (design §3.7).
 *
 * A shim computes keys and copies bytes; everything about where an object lives is here:
 *     tier order   local store (the own pool) -> the cache peer (`kvshim serve`, one copy per
 *                  node, design §3.5) -> any other peer (the one a lookup found, else the best
 *                  one a fresh lookup finds); the remote and disk tiers sit behind `kvshim serve`
 *                  (design §17, §18), so an engine reaches them through its cache peer.
 *     one copy     KVSHIM_ONE_COPY=1 and a cache peer known: saves go straight into its pool and
 *                  loads come straight out of it; nothing is kept in the own pool. Any failure
 *                  there falls back to the own-copy path (counted in cache_peer_fallbacks).
 *     keep-behind  a chunk copied from another peer straight into the caller's buffer is queued
 *                  for the runtime's keep-behind thread (kvs__runtime_keep, design §21.9).
 *     discovery    rate-limited, run here before a lookup or load asks the peers, never on a
 *                  store path (a store pushes only to a cache peer some lookup already found).
 *     pool sizing  asking for the cache peer (kvs__runtime_cache_peer) sizes the own pool: lean
 *                  while one is known, full when none is (design §5).
 *
 * Failure rule: no function here makes the caller fail. A miss, a dead peer, a refused or
 * stale copy is reported as "not served" (0, a MISS status or a negative errno the caller only
 * compares with 0) and the caller takes the engine's own path. Nothing is published that was
 * not completely written.
 *
 * Threads: every function may be called from any thread and raises the re-entry guard itself
 * (KVS__REENTRY_GUARD) around kvshim's store and peer work, never around the caller's copy or
 * fill callbacks' own engine calls (a fill that calls the engine lowers the depth itself, as
 * blob_flow.c does). The peer hint of kvs__cache_lookup is per thread. No lock is held while a
 * callback runs except the peer client's connection lock (a peer's pin is held during a
 * copy: callbacks must not call back into this facade).
 *
 * Ownership: bytes handed to a callback (a peer's pool under its pin, the reply, the own pool)
 * are valid only during the call. A pin (kvs__cache_pin) or a write (kvs__cache_reserve, a
 * COPIED fetch) is a lease of the local store held by the caller until it ends it, once, with
 * the matching function. */
#ifndef KVSHIM_RUNTIME_CACHE_H
#define KVSHIM_RUNTIME_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keys.h"
#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A lease of the local store (a pin or a write) held by the caller; 0 is none. */
typedef uint64_t kvs__cache_ref_t;

/* Copies one object (len bytes) from src to dst; i is the key index (0 for an object). One of
 * src and dst is a pool (the own one or a peer's, under a pin), the other the caller's buffer
 * as given (which may be a device pointer). 0, or a negative errno to stop (nothing copied is
 * used or published). */
typedef int (*kvs__cache_copy_fn)(void *ctx, size_t i, void *dst, const void *src, size_t len);

/* Receives one object read in place (bytes valid only during the call). 0 to go on. */
typedef int (*kvs__cache_sink_fn)(void *ctx, size_t i, const kvs_layout_t *layout,
                                  const void *bytes, uint64_t len);

/* The keys to bind a fetched object under locally, read from its bytes (valid only during the
 * call): point *keys at the caller's array (keys[0] primary, the rest aliases) and return how
 * many (> 0), or a negative value to refuse the object (a MISS). */
typedef int (*kvs__cache_keys_fn)(void *ctx, size_t i, const void *bytes, uint64_t len,
                                  const kvs_key_t **keys);

/* ---- where an object is ------------------------------------------------------------------- */

/* The cache peer that holds the node's copy in one-copy mode, or 0 (none connected, one copy
 * off, no peers). Runs the discovery first (rate-limited) and sizes the own pool. */
uint64_t kvs__cache_peer(kvs__runtime_t *rt);

/* True when this process has a peer client (KVSHIM_PEERS is not 0): peers may hold objects. */
static inline bool kvs__cache_has_peers(const kvs__runtime_t *rt) { return rt->peers != 0; }

/* True when peer `instance` (0: the cache peer) keeps tiers below its pool (a serve with a
 * remote or disk tier): only a LOOKUP there brings what its pool lacks, so a key read there
 * must be looked up first (kvs_peers_has_tiers). No I/O. */
bool kvs__cache_peer_has_tiers(kvs__runtime_t *rt, uint64_t instance);

/* True when the local store holds key READY (no pin, no I/O). */
bool kvs__cache_has_local(kvs__runtime_t *rt, kvs_key_t key);

/* The leading run of keys[0..n) some peer (cache peer included) holds, in one LOOKUP per peer;
 * *where (may be NULL) gets the instance of the peer with the longest run (0: none). 0 without
 * peers; errors are misses. */
int kvs__cache_peers_run(kvs__runtime_t *rt, const kvs_key_t *keys, size_t n, uint64_t *where);

/* The chunked lookup (kvo): the leading run of keys[0..n) the tiers hold, in order: the local
 * store, then the cache peer alone when one is known (one copy: its answer is final unless it
 * failed), else the other peers. A run found at another peer is remembered for this thread's
 * kvs__cache_load calls (the loads copy from there). Call kvs__cache_lookup_start once before
 * the batches of one request. */
size_t kvs__cache_lookup(kvs__runtime_t *rt, const kvs_key_t *keys, size_t n);
/* A new request on this thread: the previous one's keep-behind chunks are released to the
 * keep-behind thread and the peer its lookup found is forgotten. */
void kvs__cache_lookup_start(void);

/* ---- chunks (kvo): load and save of fixed-layout objects ---------------------------------- */

/* Load chunk `key` of `layout` into dst through copy (src: a pool): the local store, else the
 * cache peer's pool under its pin, else the peer this thread's lookup found (its pool, under
 * its pin; the chunk is then kept behind the engine), else one fetch from the best peer into
 * the local store (copied out and kept). Returns 1 when dst holds the chunk, 0 otherwise. */
int kvs__cache_load(kvs__runtime_t *rt, kvs_key_t key, const kvs_layout_t *layout, void *dst,
                    kvs__cache_copy_fn copy, void *ctx);

/* Save chunk `key` of `layout` from src through copy (dst: a pool): straight into the cache
 * peer's pool in one-copy mode, else into the local store (then queued for write-behind to a
 * cache peer a lookup already found). 0 when the chunk is now held (PRESENT included), else a
 * negative errno (-ENOSPC, -EBUSY, the copy's): nothing was published. */
int kvs__cache_save(kvs__runtime_t *rt, kvs_key_t key, const kvs_layout_t *layout,
                    const void *src, kvs__cache_copy_fn copy, void *ctx);

/* ---- objects (llama blobs): one object under keys[0] and aliases keys[1..nk) --------------- */

/* One copy per node: write the object (len bytes) straight into a slot of cache peer `cache`
 * (from kvs__cache_peer) by fill (dst: the slot, exactly len bytes; src NULL) and publish it.
 * Returns 0 (published: a READY own copy under keys[0] is removed when replace), -EEXIST (the
 * cache peer holds keys[0] already and !replace), the fill's negative errno (the transfer is
 * aborted, nothing counted), or 1: save it in the own pool instead (the cache peer failed or
 * refused: counted in cache_peer_fallbacks; served inline; or it holds keys[0] and replace). */
int kvs__cache_save_at_peer(kvs__runtime_t *rt, uint64_t cache, const kvs_key_t *keys, size_t nk,
                            uint64_t len, bool replace, kvs__cache_copy_fn fill, void *ctx);

/* Reserve len bytes in the own pool under keys (replace: a READY object under keys[0] is
 * removed first, retried while a reader's pin holds it). 0 with *bytes (the extent, written by
 * the caller, invisible until commit) and *ref, or -EEXIST (present, !replace), -ENOSPC,
 * -EFBIG, -EBUSY, -EINVAL. Sizes the pool first when a cache peer was just lost. */
int kvs__cache_reserve(kvs__runtime_t *rt, const kvs_key_t *keys, size_t nk, uint64_t len,
                       bool replace, uint8_t **bytes, kvs__cache_ref_t *ref);
/* Publish a reservation and queue it for write-behind to the cache peer (-ENOTSUP there: none).
 * 0 or the store's negative errno; the reservation is ended either way. */
int kvs__cache_commit(kvs__runtime_t *rt, const kvs_key_t *keys, size_t nk, kvs__cache_ref_t ref);
/* Drop a reservation (nothing published). */
void kvs__cache_abort(kvs__runtime_t *rt, kvs__cache_ref_t ref);

/* A write of one object held by the caller across its own work, such as an engine call that
 * writes into it (direct snapshots, design §10.4): in the cache peer's pool in one-copy mode
 * (peer.conn set; no connection lock held meanwhile), else in the own pool (ref). Begun by
 * kvs__cache_writes_begin and ended once by kvs__cache_writes_publish or kvs__cache_write_drop. */
typedef struct kvs__cache_write {
  /* the caller's: the object, len bytes under keys[0] + aliases keys[1..nk) */
  const kvs_key_t *keys;
  uint32_t nk;
  uint64_t len;
  /* begin: 0 (begun: write the len bytes at bytes), -EEXIST (held already) or an errno;
   * publish: 0 (published) or an errno */
  int rc;
  uint8_t *bytes;
  kvs__cache_ref_t ref;  /* own pool: the store's write */
  kvs_peer_resv_t peer;  /* at the cache peer */
} kvs__cache_write_t;

/* Begin the writes w[0..n): in cache peer `cache`'s pool (from kvs__cache_peer; 0: none), all
 * in one round trip per KVS_PEERS_RESERVE_MAX; each it does not take there (none, one served
 * inline, or it failed or refused: counted in cache_peer_fallbacks) in the own pool as
 * kvs__cache_reserve without replace. Each w[i].rc: 0, -EEXIST (the cache peer or the own store
 * holds keys[0] already) or kvs__cache_reserve's negative errno. */
void kvs__cache_writes_begin(kvs__runtime_t *rt, uint64_t cache, kvs__cache_write_t *w, size_t n);
/* Publish the begun writes among w[0..n) (rc 0; the others are skipped), their bytes complete:
 * at the cache peer in one round trip per KVS_PEERS_RESERVE_MAX (counted in cache_peer_stores),
 * in the own pool by kvs__cache_commit. Returns how many were published; each w[i].rc says 0 or
 * why not (nothing of it published). Every one is ended. */
size_t kvs__cache_writes_publish(kvs__runtime_t *rt, kvs__cache_write_t *w, size_t n);
/* End a begun write (rc 0) without publishing it; nothing to do for one not begun. */
void kvs__cache_write_drop(kvs__runtime_t *rt, kvs__cache_write_t *w);

/* Pin the local READY object under key: true with *bytes, *len (the own pool, valid until
 * kvs__cache_unpin) and *ref; false when it is not there. */
bool kvs__cache_pin(kvs__runtime_t *rt, kvs_key_t key, const uint8_t **bytes, uint64_t *len,
                    kvs__cache_ref_t *ref);
/* End a pin; drop: the object failed the caller's check, remove it (a reader's pin may keep it
 * a while: fine). */
void kvs__cache_unpin(kvs__runtime_t *rt, kvs_key_t key, kvs__cache_ref_t ref, bool drop);

/* Read the objects under keys[0..n) where they lie in the cache peer's pool (one copy per
 * node), under its pins, through sink, in key order (the leading run it holds). The bytes of
 * every object delivered stay valid until the last sink call returns (one transfer: the pins
 * end after it; kvs_peers_retrieve), so the sink of the last key may use them all. The count
 * delivered (0: no cache peer or not there), -ESTALE the pins lapsed while sink read (whatever
 * sink made of the bytes must be thrown away), another negative errno the peer failed (counted
 * in cache_peer_fallbacks). */
int kvs__cache_read_cache_peer(kvs__runtime_t *rt, const kvs_key_t *keys, size_t n,
                               kvs__cache_sink_fn sink, void *ctx);

/* What became of a fetch (values pinned to core/wire/peer.h's kvs_fetch_status_t). */
enum { KVS__CACHE_MISS = 0, KVS__CACHE_LOCAL = 1, KVS__CACHE_COPIED = 2 };

/* A peer's object fetched into a local extent, written but not yet visible. */
typedef struct kvs__cache_fetch {
  const uint8_t *bytes; /* COPIED: the local copy */
  uint64_t len;
  kvs__cache_ref_t ref; /* COPIED: its write, ended by kvs__cache_fetch_end */
  bool staged;          /* fetched from the cache peer in one-copy mode: never kept */
} kvs__cache_fetch_t;

/* Fetch the object under key from peer `instance` (0: the best one a fresh lookup finds) into
 * the local store, bound under the keys keys_fn reads from its bytes (NULL: key only).
 * KVS__CACHE_COPIED with *f (check the bytes, then kvs__cache_fetch_end), KVS__CACHE_LOCAL (it
 * became local meanwhile: pin it) or KVS__CACHE_MISS. */
int kvs__cache_fetch(kvs__runtime_t *rt, uint64_t instance, kvs_key_t key,
                     kvs__cache_keys_fn keys_fn, void *ctx, kvs__cache_fetch_t *f);
/* End a COPIED fetch: keep publishes the local copy (unless staged), else it is dropped. */
void kvs__cache_fetch_end(kvs__runtime_t *rt, const kvs__cache_fetch_t *f, bool keep);

/* Tell peer `instance` that the object it delivered under key failed our check (len bytes,
 * checksum kvs_checksum64 of them as we read them): it drops its copy if still those bytes. */
void kvs__cache_report_bad(kvs__runtime_t *rt, uint64_t instance, kvs_key_t key, uint64_t len,
                           uint64_t checksum);

/* ---- marks: small local objects peers find with a lookup or wait on with a WATCH (the prefix
 * cache's claims) ------------------------------------------------------------------------------ */

/* Publish an 8-byte local object under key holding value, evicting nothing. true on success. */
bool kvs__cache_mark(kvs__runtime_t *rt, kvs_key_t key, uint64_t value);
/* Remove the local object under key (-ENOENT, -EBUSY: fine). */
void kvs__cache_unmark(kvs__runtime_t *rt, kvs_key_t key);
/* Wait at peer `instance` (one WATCH, no discovery) until keys[0] is no longer stored there or
 * one of keys[1..n) is, or about wait_ms passed (kvs_peers_watch: cut to fit the RPC deadline,
 * call again to wait longer). KVS_PROTO_WATCH_GONE, _PRESENT or _HELD, -ENOTSUP (the peer
 * predates WATCH: poll it with kvs__cache_peers_run), -ENOENT (no peers, or no such live peer)
 * or the call's negative errno. */
int kvs__cache_watch(kvs__runtime_t *rt, uint64_t instance, const kvs_key_t *keys, size_t n,
                     uint32_t wait_ms);

#ifdef __cplusplus
}
#endif
#endif
