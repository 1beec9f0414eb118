/* kvshim store: the storage manager (design §4).
 *
 * Objects. An object is one KV chunk or one engine state blob: its bytes live in a cache-arena
 * extent of the pool; it has a layout (dtype + shape), a state and pins.
 *     WRITING  reserved by one write transfer; invisible to lookups; never evicted
 *     READY    published by commit; readable; evictable when it has no pins
 *     (deleted) by abort, owner release, lease expiry (WRITING: never published) or eviction /
 *               removal (READY, unpinned)
 * An object is reachable under one or more keys: its primary key and aliases (an engine state
 * blob answers every chunk-aligned prefix of the tokens it holds). Aliases die with the object.
 * A key maps to at most one object.
 *
 * Owners and leases. Every write reservation and read pin is a lease held by an owner (the
 * local engine, KVS_OWNER_LOCAL, or one peer connection: kvs_store_owner_open). A transfer id,
 * chosen by the store, names one lease; commit/abort/release must come from the owner that
 * holds it, otherwise -EPERM (counted). kvs_store_owner_release ends every lease of an owner at
 * once (writes aborted, pins released). A lease not ended within lease_ms of its creation is
 * reclaimed by kvs_store_sweep the same way. Writers copy into their extents outside the store
 * lock; the lease is what keeps the extent theirs.
 *
 * Capacity. Invariant (checked after every mutation under KVSHIM_DEBUG):
 *     used_bytes + reserved_bytes + free_bytes == cache arena size
 * where used = extents of READY objects, reserved = extents of WRITING objects, free = free
 * bytes of the cache arena. A reservation that does not fit evicts READY unpinned objects in
 * LRU order (least recently committed or looked up first), O(1) each (amortised), until it
 * fits; if it still does not fit the key gets NO_SPACE. Pinned and WRITING objects are never
 * evicted.
 * The LRU order is per shard (design §4.4): exact for a one-shard store, approximate across
 * shards; the capacity account is exact either way.
 *
 * Threads. The store is split into shards (keys, objects, LRU) and domains (owners, transfers,
 * pins), each guarded by its own mutex (design §4.4, store.c). No memcpy of payload, syscall or
 * heap allocation happens under any of them: every table is allocated at create time (lazily
 * backed anonymous mappings). The store owns the pool's cache arena: nothing else allocates
 * from it. */
#ifndef KVSHIM_STORE_H
#define KVSHIM_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keys.h"
#include "pool.h"
#include "stats.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_store kvs_store_t;
typedef uint64_t kvs_owner_t; /* 0 is never a valid owner */
typedef uint64_t kvs_xfer_t;  /* 0 is never a valid transfer */

#define KVS_OWNER_LOCAL ((kvs_owner_t)1) /* the process's own engine; always open */
#define KVS_LAYOUT_MAX_DIMS 8

/* Per-key reservation outcomes (never silent: each one is counted). */
#define KVS_RESERVE_OUTCOMES(X)                                                               \
  X(RESERVED, 0, "reserved: write the extent, then commit")                                   \
  X(PRESENT, 1, "already READY: nothing to write")                                            \
  X(BUSY, 2, "another owner is writing this key")                                             \
  X(NO_SPACE, 3, "eviction could not make room")                                              \
  X(TOO_LARGE, 4, "larger than the cache arena")                                              \
  X(BAD_LAYOUT, 5, "invalid layout")                                                          \
  X(SKIPPED, 6, "not reserved: ALL_OR_NOTHING and another key failed")

typedef enum kvs_reserve_outcome {
#define KVS__RES_ENUM(name, val, help) KVS_RES_##name = val,
  KVS_RESERVE_OUTCOMES(KVS__RES_ENUM)
#undef KVS__RES_ENUM
} kvs_reserve_outcome_t;
const char *kvs_reserve_outcome_name(kvs_reserve_outcome_t r);

/* Element types (wire values; pinned). */
typedef enum kvs_dtype {
  KVS_DTYPE_U8 = 0, KVS_DTYPE_F16 = 1, KVS_DTYPE_BF16 = 2, KVS_DTYPE_F32 = 3,
  KVS_DTYPE_F8E4M3 = 4, KVS_DTYPE_F8E5M2 = 5, KVS_DTYPE_I8 = 6, KVS_DTYPE_I32 = 7,
  KVS_DTYPE__COUNT
} kvs_dtype_t;
size_t kvs_dtype_size(uint32_t dtype); /* 0 for an unknown dtype */

/* Layout of one object: nbytes = dtype size * product(shape). Valid when dtype is known,
 * 1 <= ndim <= 8, every dim > 0 and the product does not overflow. A blob is U8 [len]. */
typedef struct kvs_layout {
  uint32_t dtype;
  uint32_t ndim;
  uint64_t shape[KVS_LAYOUT_MAX_DIMS];
} kvs_layout_t;
/* Bytes of a layout, or 0 when it is invalid. */
uint64_t kvs_layout_nbytes(const kvs_layout_t *l);
kvs_layout_t kvs_layout_blob(uint64_t nbytes);
/* A layout in the tiers' value formats (disk_format.c records, remote.c values: one encoding,
 * byte-identical in both), little-endian: dtype u32 at p, ndim u32 at p + 4, and all
 * KVS_LAYOUT_MAX_DIMS dims u64 at dims, the unused ones zero. */
void kvs__layout_put(uint8_t *p, uint8_t *dims, const kvs_layout_t *l);
/* Read one back: 0 with *out (unused dims zero), or -EBADMSG for ndim > KVS_LAYOUT_MAX_DIMS or
 * a non-zero unused dim (*out untouched). Validity (kvs_layout_nbytes) is the caller's. */
int kvs__layout_get(const uint8_t *p, const uint8_t *dims, kvs_layout_t *out);

/* An object's extent in the pool (segment offset; length = layout bytes, not rounded). */
typedef struct kvs_extent {
  uint64_t offset;
  uint64_t length;
} kvs_extent_t;

/* What read_pinned returns per pinned object. */
typedef struct kvs_object_view {
  kvs_key_t key;       /* the key it was looked up by */
  kvs_extent_t extent;
  kvs_layout_t layout;
} kvs_object_view_t;

typedef struct kvs_store_config {
  kvs_pool_t *pool;      /* borrowed; must outlive the store; the store owns its cache arena */
  uint32_t lease_ms;     /* lease deadline; 0 = 30000 */
  uint32_t max_objects;  /* 0 = cache arena / page size (one object per page at most) */
  uint32_t max_keys;     /* 0 = 4 * max_objects (primary keys + aliases) */
  uint32_t max_xfers;    /* live transfers; 0 = 65536 */
  uint32_t max_pins;     /* live read pins; 0 = 4 * max_objects */
  kvs_stats_t *stats;    /* borrowed; NULL = kvs_stats_global() */
  uint32_t max_owners;   /* open owners including KVS_OWNER_LOCAL; 0 = 4096 */
  uint32_t shards;       /* shards and domains (design §4.4): a power of two <= 16, at most
                          * every table's size; 0 = the most that leave every table's slice
                          * >= 64 slots and every shard >= 32 MiB of the arena (1 for small
                          * stores: exact LRU order) */
} kvs_store_config_t;

/* Limits: max_xfers and max_owners <= KVS_STORE_MAX_SLOTS (ids are generation << 24 | slot);
 * max_objects, max_keys and max_pins <= 2^30. */
#define KVS_STORE_MAX_SLOTS ((1u << 24) - 1)

/* Mode flags for reservations. */
#define KVS_RESERVE_ALL_OR_NOTHING 1u /* if any key is not RESERVED or PRESENT, reserve none */
#define KVS_RESERVE_NO_EVICT       2u /* report NO_SPACE instead of evicting */
/* ALL_OR_NOTHING failures: PRESENT keys stay PRESENT, the key that blocked the request gets
 * its own outcome (BUSY for a key another owner is writing, NO_SPACE, ...), every other key
 * gets SKIPPED, and the call returns 0 with *xfer = 0. When the keys do not fit together (the
 * pre-check), no single key is to blame: each key not READY gets NO_SPACE. Keys that are already being written or cannot fit even after
 * evicting every unpinned READY object fail before anything is evicted; a failure found later
 * (a duplicate key in the call, fragmentation) may leave earlier evictions done.
 *
 * Eviction within one reservation call never evicts an object that the same call found PRESENT
 * (its caller was told "nothing to write"). LRU order within one batch: commit and release
 * touch keys from last to first, so the first key of a batch (a prefix chain's head, which
 * every longer prefix needs) is the most recently used of them. */

/* Create a store over pool's cache arena, which must be empty (-EBUSY otherwise); the pool must
 * be a created one (-EPERM for an attached pool). Errors: -EINVAL (NULL, limits out of range),
 * -ENOMEM, or the errno of mmap/pthread_mutex_init. */
int kvs_store_create(const kvs_store_config_t *cfg, kvs_store_t **out);
/* Free everything. Accepts NULL. -EBUSY (store kept) while any lease is live, unless force.
 * Debug builds poison the struct. */
int kvs_store_destroy(kvs_store_t *store, bool force);

/* Open a new owner (one per peer connection). Errors: -ENOSPC when the owner table is full. */
int kvs_store_owner_open(kvs_store_t *store, kvs_owner_t *out);
/* End every lease of owner (writes aborted, never published; pins released) and close it
 * (KVS_OWNER_LOCAL is emptied but stays open). Returns the number of leases ended, or -ENOENT. */
int kvs_store_owner_release(kvs_store_t *store, kvs_owner_t owner);

/* Reserve one object per key, each of `layout`. outcomes[i] gets a kvs_reserve_outcome_t;
 * extents[i] is written for RESERVED keys (the caller writes there, then commits) and is {0, 0}
 * for the others. On return *xfer names the write transfer holding every RESERVED key, or 0
 * when none was reserved.
 * Duplicate keys in one call: the later ones get BUSY. Returns the number RESERVED (>= 0), or
 * -EINVAL (NULL arrays, n == 0), -ENOENT (unknown owner), -ENOSPC (transfer table full). */
int kvs_store_reserve_write(kvs_store_t *store, kvs_owner_t owner, const kvs_key_t *keys,
                            size_t n, const kvs_layout_t *layout, unsigned mode,
                            uint8_t *outcomes, kvs_extent_t *extents, kvs_xfer_t *xfer);

/* Reserve one object reachable under several keys: keys[0] is primary (its outcome is the
 * object's: PRESENT when keys[0] is READY, BUSY when WRITING), keys[1..n) are aliases bound at
 * commit when free (taken aliases are skipped and counted). Returns 1 when reserved, 0 when not
 * (see *outcome), or a negative errno as above. */
int kvs_store_reserve_object(kvs_store_t *store, kvs_owner_t owner, const kvs_key_t *keys,
                             size_t n_keys, const kvs_layout_t *layout, unsigned mode,
                             uint8_t *outcome, kvs_extent_t *extent, kvs_xfer_t *xfer);

/* Publish every object of a write transfer (WRITING -> READY) and end the lease.
 * -ENOENT: unknown owner, or no such live transfer (never existed, already ended, or expired);
 * -EPERM: the transfer belongs to another owner (counted; nothing changes);
 * -EINVAL: xfer is a read transfer (counted as a bad transfer; nothing changes). */
int kvs_store_commit(kvs_store_t *store, kvs_owner_t owner, kvs_xfer_t xfer);
/* Free every object of a write transfer without publishing it, or release a read transfer.
 * Same errors as commit. */
int kvs_store_abort(kvs_store_t *store, kvs_owner_t owner, kvs_xfer_t xfer);

/* Count the leading run of READY keys. With pin, pin those objects under a new read transfer
 * (*xfer; 0 when the run is empty) and move them to the LRU tail (a pinned object is not
 * evictable; its release puts it back at the tail). Returns the run length (>= 0)
 * or -ENOENT (owner), -EINVAL (NULL keys, n == 0, pin without xfer), -ENOSPC (pin and the
 * transfer table is full). A pin table that fills up shortens the run (never an error).
 * Without pin the LRU is not touched (a count is not a use). */
int kvs_store_lookup(kvs_store_t *store, kvs_owner_t owner, const kvs_key_t *keys, size_t n,
                     bool pin, kvs_xfer_t *xfer);
/* The pinned objects of a read transfer, in lookup order: up to cap views. Returns the number
 * pinned by the transfer (may exceed cap), or -ENOENT / -EPERM, -EINVAL (a write transfer, or
 * views NULL with cap > 0). */
int kvs_store_read_pinned(kvs_store_t *store, kvs_owner_t owner, kvs_xfer_t xfer,
                          kvs_object_view_t *views, size_t cap);
/* Unpin a read transfer and end it. -ENOENT / -EPERM as for commit; -EINVAL for a write
 * transfer (use abort). */
int kvs_store_release(kvs_store_t *store, kvs_owner_t owner, kvs_xfer_t xfer);

/* Delete the READY object bound to key (with all its keys) if it has no pins: 0, -ENOENT (no
 * READY object under key) or -EBUSY (pinned or WRITING). */
int kvs_store_remove(kvs_store_t *store, const kvs_key_t *key);

/* Reclaim every lease whose deadline (creation + lease_ms) is <= now_ms, domain by domain
 * (design §4.4), each in creation order, O(expired + domains). Returns how many. Reserve calls
 * also run it with the current time. Creation times are kvs__now_ms() values, made
 * non-decreasing in creation order within a domain. */
int kvs_store_sweep(kvs_store_t *store, uint64_t now_ms);

typedef struct kvs_store_info {
  uint64_t arena_bytes, used_bytes, reserved_bytes, free_bytes;
  uint64_t objects_ready, objects_writing, keys, pins, xfers, owners;
  uint32_t fragmentation_pct;
} kvs_store_info_t;
void kvs_store_info(kvs_store_t *store, kvs_store_info_t *out);

kvs_pool_t *kvs_store_pool(const kvs_store_t *store);
/* The lease length of every reservation and pin (the config's lease_ms, or its default). */
uint32_t kvs_store_lease_ms(const kvs_store_t *store);
/* Every invariant in this header, checked in O(objects + keys + transfers). */
bool kvs__store_is_valid(kvs_store_t *store);
/* The shard of key (design §4.4): for tests and benchmarks that place keys in given shards. */
uint32_t kvs__store_key_shard(const kvs_store_t *store, kvs_key_t key);

#ifdef __cplusplus
}
#endif
#endif
