/* shims/llama/blob_flow.c: the flows every blob (blob.h) goes through, over the runtime's cache
 * facade (runtime/cache.h, design §3.7), which owns where a blob lives (local store, cache peer,
 * other peers): the engine writes a blob into a cache slot, then commit (save); pin and unpin
 * (local restore); fetch from a peer into a local extent (peer restore). Internal. */
#ifndef KVSHIM_LLAMA_BLOB_FLOW_H
#define KVSHIM_LLAMA_BLOB_FLOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "blob.h"
#include "cache.h"
#include "keys.h"

/* ---- flows (the facade raises kvs__hook_depth around kvshim's own store and peer work only) - */

/* The cache a blob lives in: this process's runtime, whose facade (runtime/cache.h) runs the
 * tiers (local store, cache peer, other peers). */
typedef struct kvs__llama_blob_home {
  struct kvs__runtime *rt;
} kvs__llama_blob_home_t;

/* The home of this process's runtime. */
struct kvs__runtime;
kvs__llama_blob_home_t kvs__llama_blob_home(struct kvs__runtime *rt);

/* The cache peer (`kvshim serve`) a save goes straight into with KVSHIM_ONE_COPY=1, or 0 (none
 * connected, or one copy off: saves go into the own pool, as without a cache peer). Runs the
 * peer discovery (rate-limited) first. */
uint64_t kvs__llama_blob_cache(const kvs__llama_blob_home_t *home);

/* A save in progress: an extent the engine has written, not yet visible. */
typedef struct kvs__llama_blob_save {
  uint8_t *blob;   /* the extent in the pool (NULL when at_peer) */
  uint64_t len;    /* its bytes: header + 4 n + state */
  kvs__cache_ref_t xfer; /* the local write (kvs__cache_reserve) */
  bool at_peer;    /* published in the cache peer's pool by kvs__llama_blob_begin already */
} kvs__llama_blob_save_t;

/* Reserve one object under keys (keys[0] primary, the rest aliases; replace: a READY object
 * under keys[0] is removed first, a newer save of the same path) and have the engine's
 * get_data write sequence seq's state straight into it (zero copy), then copy the n tokens.
 * *hdr is the caller's template (kind, model_fp, ns, keyed/chunk/canon tokens); n_tokens,
 * state_size, saved_ns and the constant fields are filled here. Returns 0 with *s open (finish
 * with kvs__llama_blob_commit or _abort), or: -EEXIST (keys[0] already cached: nothing to do),
 * -ENODATA (the engine reported no state), -EIO (get_data did not write the announced state),
 * -ENOSPC / -EFBIG / -EBUSY (the store). */
int kvs__llama_blob_begin(const kvs__llama_blob_home_t *home, const kvs_key_t *keys, size_t nk,
                          bool replace, const kvs__llama_state_api_t *api,
                          struct llama_context *ctx, int32_t seq, const int32_t *tokens,
                          uint32_t n, kvs__llama_blob_hdr_t *hdr, kvs__llama_blob_save_t *s);
/* One copy per node: when kvs__llama_blob_cache names a cache peer, kvs__llama_blob_begin
 * writes the blob straight into a slot of that peer's pool instead (PREPARE_STORE, the engine's
 * get_data writing into the slot, tokens, header and checksum from *hdr as given, which must
 * therefore be complete, COMMIT_STORE: kvs__cache_save_at_peer) and returns 0 with s->at_peer set:
 * the blob is published, nothing is kept in the own pool (a READY local object under keys[0]
 * is removed when replace), commit only returns 0, and abort cannot take it back. A cache peer
 * that fails, refuses or already holds keys[0] while replace is set is counted
 * (cache_peer_fallbacks; not for a blob already there) and the save goes into the own pool as
 * above; a blob already there without replace is -EEXIST, as locally. On success
 * cache_peer_stores counts it. */
/* Seal (header and checksum written from *hdr) and commit; on success queue the object for
 * write-behind to the cache peer. 0 or the store's negative errno (the save is ended either
 * way). */
int kvs__llama_blob_commit(const kvs__llama_blob_home_t *home, const kvs_key_t *keys, size_t nk,
                           kvs__llama_blob_hdr_t *hdr, kvs__llama_blob_save_t *s);
void kvs__llama_blob_abort(const kvs__llama_blob_home_t *home, kvs__llama_blob_save_t *s);

/* An object of kvshim's own (a chunk frame or chunk object, chunks.h; design §10.4): len bytes
 * written by fill(arg, dst), under keys[0] and the aliases keys[1 .. nk) (an alias another
 * object holds is not bound: the store's rule), never replacing (-EEXIST when a READY object is
 * under keys[0]). With one copy per node (kvs__llama_blob_cache names a cache peer) straight
 * into a slot of that peer's pool (kvs__cache_save_at_peer), as kvs__llama_blob_begin does; a
 * cache peer that fails is counted and the object goes into the own pool instead: a reserved
 * extent, committed under the keys and pushed to the cache peer (write-behind,
 * kvs__cache_commit). fill returns 0 or a negative errno, which aborts the object and is
 * returned. 0, or -EEXIST / -ENOSPC / -EFBIG / -EBUSY. */
int kvs__llama_obj_store(const kvs__llama_blob_home_t *home, const kvs_key_t *keys, size_t nk,
                         uint64_t len,
                         int (*fill)(void *arg, uint8_t *dst), void *arg);

/* Pin the READY object under key in the local store. Returns true with *blob, *len (into the
 * pool, valid until kvs__llama_blob_unpin) and *xfer; false when it is not there. */
bool kvs__llama_blob_pin(const kvs__llama_blob_home_t *home, kvs_key_t key, const uint8_t **blob,
                         uint64_t *len, kvs__cache_ref_t *xfer);
/* Release a pin; drop: the blob failed a check, remove it (a reader's pin may keep it: fine). */
void kvs__llama_blob_unpin(const kvs__llama_blob_home_t *home, kvs_key_t key,
                           kvs__cache_ref_t xfer, bool drop);


/* ---- peer restore ----------------------------------------------------------------------------- */

/* The peer's copy of a blob, fetched into a local extent (kvs__cache_fetch). */
typedef struct kvs__llama_blob_fetch {
  const uint8_t *blob; /* COPIED: the local copy, being written (not yet visible) */
  uint64_t len;
  kvs__cache_ref_t xfer; /* COPIED: its local write, ended by kvs__llama_blob_keep */
  bool staged;         /* COPIED from the cache peer with one copy: keep drops it anyway */
} kvs__llama_blob_fetch_t;

/* Fetch the blob under key from peer instance (0: the best one) into a local object bound under
 * the keys keys_fn reads from the peer's bytes (see kvs__cache_keys_fn; it refuses a blob that
 * is not the one asked for). Returns KVS__CACHE_COPIED with *f filled (check the copy, then
 * kvs__llama_blob_keep), KVS__CACHE_LOCAL (it became local meanwhile: pin it) or
 * KVS__CACHE_MISS (errors are misses). */
int kvs__llama_blob_fetch(const kvs__llama_blob_home_t *home, uint64_t instance, kvs_key_t key,
                          kvs__cache_keys_fn keys_fn, void *ctx, kvs__llama_blob_fetch_t *f);
/* End a COPIED fetch: keep commits the local copy (it passed the checks), else it is dropped.
 * A copy fetched from the cache peer with one copy (f->staged) is only staging: dropped either
 * way, the cache peer keeps the node's copy. */
void kvs__llama_blob_keep(const kvs__llama_blob_home_t *home, const kvs__llama_blob_fetch_t *f,
                          bool keep);

#endif
