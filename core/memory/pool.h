/* kvshim pool: one shared-memory segment per process (design §5).
 *
 * Layout of the segment (an ABI: peers map it):
 *
 *   [0, header_size)                         kvs_pool_header_t, then padding
 *   [cache_off, cache_off + cache_size)      cache arena: store objects
 *   [host_off,  host_off  + host_size)       host arena: buffers for CUDA host allocations
 *
 * Offsets are from the start of the segment and aligned to the pool's page size (4 KiB, or
 * 2 MiB with huge pages); the header area is one page, so cache_off == page_size and
 * host_off == cache_off + cache_size. The segment is a memfd (MFD_CLOEXEC, sealed against
 * shrinking and growing): no name in /dev/shm, so nothing is left behind when the process
 * dies. A named segment (shm_open, O_EXCL, 0600; never huge pages) is made instead only when
 * kvs_pool_config_t.name is set (kvshim serve); the creator unlinks the name at destroy.
 * Nothing is pre-faulted at create: pages are backed on first touch (kvs_pool_prefault).
 *
 * Allocator: each arena of a created pool hands out extents aligned to the page size. Free
 * ranges are coalesced with both neighbours on free. Segregated fit over two-level size
 * classes with bitmaps; boundary tags live in side arrays outside the segment (so a peer
 * writing into the pool cannot corrupt the allocator), lazily backed, 16 bytes per page.
 * free and extent_len are O(1); alloc is O(1), except when the only free ranges that can
 * satisfy a request share its own size class: then that one class list is scanned (so -ENOSPC
 * means no free range is large enough, never "not found quickly"). An arena holds at most
 * 2^31 - 1 pages. Invariant per arena, checked by kvs__pool_is_valid (and after every
 * alloc/free under KVSHIM_DEBUG):
 *     allocated_bytes + free_bytes == arena size, extents tile the arena without overlap,
 *     no two free ranges are adjacent (they would have been coalesced), every free range is
 *     on the list of its size class.
 * Under ASan, free extents are poisoned in the creating process (arenas up to 256 MiB: the
 * shadow of a larger one would cost 1/8 of its size in resident memory). Attached pools
 * never poison.
 *
 * Threads: alloc/free/extent_len/stats take a per-arena mutex; the mapping itself is not
 * guarded (extent ownership is the caller's business: the store's leases). kvs_pool_prefault
 * may run in another thread concurrently with all of them; destroy must not (except that a
 * prefault running when destroy starts is cancelled and waited for). */
#ifndef KVSHIM_POOL_H
#define KVSHIM_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_POOL_MAGIC 0x4c4f4f504d48534bull /* "KSHMPOOL" little-endian */
#define KVS_POOL_ABI_VERSION 1u
#define KVS_POOL_HEADER_SIZE 256u

/* At offset 0 of every segment. Fixed-width little-endian fields; never reorder. */
typedef struct kvs_pool_header {
  uint64_t magic;           /* KVS_POOL_MAGIC */
  uint32_t abi_version;     /* KVS_POOL_ABI_VERSION */
  uint32_t header_size;     /* KVS_POOL_HEADER_SIZE */
  uint64_t segment_size;    /* bytes, whole segment */
  uint64_t instance_id;     /* owner's instance id (random, non-zero) */
  uint32_t owner_pid;       /* pid of the creating process */
  uint32_t page_size;       /* extent alignment in bytes: 4096 or 2 MiB */
  uint64_t cache_off;       /* cache arena: offset and size in bytes */
  uint64_t cache_size;
  uint64_t host_off;        /* host arena: offset and size in bytes (size 0 = none) */
  uint64_t host_size;
  uint32_t flags;           /* KVS_POOL_F_* */
  uint32_t reserved0;
  uint8_t reserved[176];    /* zero */
} kvs_pool_header_t;
_Static_assert(sizeof(kvs_pool_header_t) == KVS_POOL_HEADER_SIZE, "pool header is an ABI");
_Static_assert(__builtin_offsetof(kvs_pool_header_t, segment_size) == 16, "pool header layout");
_Static_assert(__builtin_offsetof(kvs_pool_header_t, cache_off) == 40, "pool header layout");
_Static_assert(__builtin_offsetof(kvs_pool_header_t, flags) == 72, "pool header layout");

#define KVS_POOL_F_HUGEPAGES 1u

typedef enum kvs_arena { KVS_ARENA_CACHE = 0, KVS_ARENA_HOST = 1 } kvs_arena_t;

typedef struct kvs_pool_config {
  uint64_t cache_size;  /* bytes; rounded up to the page size; > 0 */
  uint64_t host_size;   /* bytes; 0 = no host arena. Backed lazily (pages touched on use). */
  bool hugepages;       /* try MFD_HUGETLB (2 MiB); falls back to 4 KiB pages with a warning */
  uint64_t instance_id; /* 0 = choose a random one */
  const char *name;     /* NULL/empty: memfd. Else also shm_open(name) 0600 (kvshim serve). */
} kvs_pool_config_t;

typedef struct kvs_pool kvs_pool_t;

typedef struct kvs_pool_arena_stats {
  uint64_t size;          /* arena bytes */
  uint64_t allocated;     /* bytes in allocated extents (rounded to the page size) */
  uint64_t free;          /* size - allocated */
  uint64_t largest_free;  /* largest free extent */
  uint64_t extents;       /* allocated extents */
  uint32_t fragmentation_pct; /* 100 * (1 - largest_free / free); 0 when free == 0 */
} kvs_pool_arena_stats_t;

/* Create a segment and map it read-write. On success *out owns the fd and the mapping.
 * Errors: -EINVAL (bad config), -ENOMEM, or the errno of memfd_create/ftruncate/mmap. */
int kvs_pool_create(const kvs_pool_config_t *cfg, kvs_pool_t **out);

/* Map a segment received from a peer. fd is borrowed (the caller may close it after the call;
 * the pool keeps its own F_DUPFD_CLOEXEC copy, returned by kvs_pool_fd, and the mapping).
 * writable: map PROT_READ|PROT_WRITE, else PROT_READ (a write then faults). The header is
 * validated: bad magic, ABI version, header size, page size, a segment size that disagrees
 * with fstat, or arenas that are unaligned or outside the segment give -EPROTO and one warning
 * naming the field and both values. An attached pool cannot allocate: alloc, free, extent_len
 * and arena_stats return -EPERM. */
int kvs_pool_attach(int fd, bool writable, kvs_pool_t **out);

/* Unmap and close. Accepts NULL. Returns -EBUSY (and keeps the pool, fully usable) if extents
 * are still allocated in a created pool, unless force. Cancels a running kvs_pool_prefault and
 * waits for it to return. The owner of a named pool unlinks the name. Debug builds poison the
 * struct before free. */
int kvs_pool_destroy(kvs_pool_t *pool, bool force);

int kvs_pool_fd(const kvs_pool_t *pool);                     /* borrowed */
uint8_t *kvs_pool_base(const kvs_pool_t *pool);              /* start of the mapping */
uint64_t kvs_pool_segment_size(const kvs_pool_t *pool);
uint32_t kvs_pool_page_size(const kvs_pool_t *pool);
const kvs_pool_header_t *kvs_pool_header(const kvs_pool_t *pool);
bool kvs_pool_is_owner(const kvs_pool_t *pool);              /* created (not attached) */
bool kvs_pool_is_writable(const kvs_pool_t *pool);

/* Allocate an extent of at least len bytes (rounded up to the page size) in an arena; writes
 * its segment offset to *off. Errors: -EINVAL (len 0, no such arena, e.g. HOST when
 * host_size was 0), -ENOSPC (no free range large enough, or len larger than the arena: the
 * caller may evict and retry), -EPERM (attached pool). */
int kvs_pool_alloc(kvs_pool_t *pool, kvs_arena_t arena, uint64_t len, uint64_t *off);
/* Return an extent. off must be the start of an allocated extent: otherwise -EINVAL and
 * nothing changes. Returns the extent's length in bytes (>0) on success. */
int64_t kvs_pool_free(kvs_pool_t *pool, kvs_arena_t arena, uint64_t off);
/* Length of the allocated extent starting at off, or -EINVAL (-EPERM: attached pool). */
int64_t kvs_pool_extent_len(kvs_pool_t *pool, kvs_arena_t arena, uint64_t off);
/* Arena whose range contains [off, off+len), or -EINVAL (works on attached pools too). */
int kvs_pool_arena_of(const kvs_pool_t *pool, uint64_t off, uint64_t len);

/* Errors: -EINVAL (no such arena), -EPERM (attached pool). O(1) plus the length of the
 * largest size class's list (for largest_free). */
int kvs_pool_arena_stats(kvs_pool_t *pool, kvs_arena_t arena, kvs_pool_arena_stats_t *out);

/* Fault the cache arena in (MADV_POPULATE_WRITE, or on kernels before 5.14 an atomic add of 0
 * to one byte per page, which cannot lose a concurrent writer's store; POPULATE_READ for a
 * read-only attached pool), so first-touch cost is paid here and not on the engine's path.
 * Contents are unchanged. Call from a background thread; safe while other threads alloc,
 * free and write. Works in 32 MiB pieces and returns -ECANCELED between pieces once
 * kvs_pool_destroy has started. Returns 0 or a negative errno (-ENOMEM when huge pages run
 * out). The host arena is never prefaulted. */
int kvs_pool_prefault(kvs_pool_t *pool);

/* Make every prefault of the pool, running or to come, return -ECANCELED (kvs_pool_destroy does
 * this first). The pool stays usable. A thread that prefaults a pool must have returned before
 * the pool is destroyed: cancel, join that thread, then destroy (a thread that had not yet
 * entered kvs_pool_prefault would otherwise find the pool freed). */
void kvs_pool_cancel_prefault(kvs_pool_t *pool);

/* Step-ahead prefault (an engine's pool, design §5): fault the cache arena in only `ahead`
 * bytes (rounded up to the page size) past the end of the highest extent ever allocated
 * (nothing before the first allocation), and
 * follow that mark as allocations raise it (kvs_pool_alloc wakes this call), so first-touch
 * cost stays off the allocating thread without committing the whole arena. Call from a
 * background thread of a created pool; returns 0 once the whole arena is faulted in,
 * -ECANCELED when kvs_pool_destroy starts, -EINVAL (attached pool, ahead 0), or a populate
 * errno. */
int kvs_pool_prefault_ahead(kvs_pool_t *pool, uint64_t ahead);
/* Raise the step-ahead mark to `bytes` of the cache arena as if that much had been allocated
 * (an engine that will keep its own copies: its first step is faulted in before its first
 * request). Owner only; never lowers the mark. */
void kvs_pool_prefault_hint(kvs_pool_t *pool, uint64_t bytes);
/* Bytes of the cache arena a step-ahead prefault has faulted in so far. */
uint64_t kvs_pool_prefaulted(const kvs_pool_t *pool);

/* The most bytes an allocation in the arena could get now: its usable bytes (the limit below)
 * less those allocated, read without the arena mutex (0: attached pool, no such arena). Exact
 * when no other thread allocates or frees in the arena meanwhile, a moment's value otherwise;
 * free ranges may still be too small for a request that fits it (fragmentation). A request
 * of more (page-rounded) bytes fails with -ENOSPC: a caller that evicts on -ENOSPC may evict
 * without taking the mutex to ask (the store, design §4.4). */
uint64_t kvs_pool_room(kvs_pool_t *pool, kvs_arena_t arena);

/* Usable bytes of the cache arena (rounded up to the page size; 0 or >= its size: all of it):
 * kvs_pool_alloc in the cache arena fails with -ENOSPC when the allocated bytes would pass it
 * (the store then evicts). Lowering it below what is allocated frees nothing: later allocations
 * fail until enough is freed. -EINVAL, -EPERM (attached pool). kvs_pool_limit returns the
 * usable bytes now (the arena size when unlimited; 0 for an attached pool). */
int kvs_pool_set_limit(kvs_pool_t *pool, uint64_t bytes);
uint64_t kvs_pool_limit(kvs_pool_t *pool);

/* Whole-structure check (O(extents); arenas of up to 16384 pages also have every page's tags
 * checked); true when every invariant above holds. Takes each arena's mutex in turn. For an
 * attached pool only the header is checked. */
bool kvs__pool_is_valid(kvs_pool_t *pool);

#ifdef __cplusplus
}
#endif
#endif
