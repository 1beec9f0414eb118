/* kvshim pool: one shared-memory segment per process (design §5).
 *
 * Layout of the segment (an ABI: peers map it):
 *
 *   [0, header_size)                         kvs_pool_header_t, then padding
 *   [cache_off, cache_off + cache_size)      cache arena: store objects
 *   [host_off,  host_off  + host_size)       host arena: buffers for CUDA host allocations
 *
 * Offsets are from the start of the segment and aligned to the pool's page size (4 KiB, or
 * 2 MiB with huge pages). The segment is a memfd (MFD_CLOEXEC, sealed against shrinking): no
 * name in /dev/shm, so nothing is left behind when the process dies. A named segment
 * (shm_open, 0600) is made only when kvs_pool_config_t.name is set (kvshim serve).
 *
 * Allocator: each arena hands out extents aligned to the page size. Free ranges are coalesced
 * with their neighbours on free; alloc and free are O(1) (segregated fit over size classes,
 * boundary tags kept outside the segment, so a peer writing into the pool cannot corrupt the
 * allocator). Invariant per arena, checked by kvs__pool_is_valid under KVSHIM_DEBUG:
 *     allocated_bytes + free_bytes == arena size, no two extents overlap, no two free ranges
 *     are adjacent (they would have been coalesced).
 * Under ASan, free extents are poisoned in the creating process.
 *
 * Threads: alloc/free/stats take a per-arena mutex; the mapping itself is not guarded (extent
 * ownership is the caller's business: the store's leases). */
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
 * the mapping stays). writable: map PROT_READ|PROT_WRITE, else PROT_READ. The header is
 * validated: bad magic, ABI version, header size, or sizes that disagree with fstat give
 * -EPROTO and a log line saying which field mismatched. An attached pool cannot allocate
 * (-EPERM). */
int kvs_pool_attach(int fd, bool writable, kvs_pool_t **out);

/* Unmap and close. Accepts NULL. Returns -EBUSY (and keeps the pool) if extents are still
 * allocated in a created pool, unless force. Debug builds poison the struct before free. */
int kvs_pool_destroy(kvs_pool_t *pool, bool force);

int kvs_pool_fd(const kvs_pool_t *pool);                     /* borrowed */
uint8_t *kvs_pool_base(const kvs_pool_t *pool);              /* start of the mapping */
uint64_t kvs_pool_segment_size(const kvs_pool_t *pool);
uint32_t kvs_pool_page_size(const kvs_pool_t *pool);
const kvs_pool_header_t *kvs_pool_header(const kvs_pool_t *pool);
bool kvs_pool_is_owner(const kvs_pool_t *pool);              /* created (not attached) */
bool kvs_pool_is_writable(const kvs_pool_t *pool);

/* Allocate an extent of at least len bytes (rounded up to the page size) in an arena; writes
 * its segment offset to *off. Errors: -EINVAL (len 0, no such arena), -ENOSPC (no free range
 * large enough: the caller may evict and retry), -EPERM (attached pool). */
int kvs_pool_alloc(kvs_pool_t *pool, kvs_arena_t arena, uint64_t len, uint64_t *off);
/* Return an extent. off must be the start of an allocated extent: otherwise -EINVAL and
 * nothing changes. Returns the extent's length in bytes (>0) on success. */
int64_t kvs_pool_free(kvs_pool_t *pool, kvs_arena_t arena, uint64_t off);
/* Length of the allocated extent starting at off, or -EINVAL. */
int64_t kvs_pool_extent_len(kvs_pool_t *pool, kvs_arena_t arena, uint64_t off);
/* Arena whose range contains [off, off+len), or -EINVAL. */
int kvs_pool_arena_of(const kvs_pool_t *pool, uint64_t off, uint64_t len);

int kvs_pool_arena_stats(kvs_pool_t *pool, kvs_arena_t arena, kvs_pool_arena_stats_t *out);

/* Fault the cache arena in (MADV_POPULATE_WRITE, or touching each page), so first-touch cost
 * is paid here and not on the engine's path. Call from a background thread. Returns 0 or a
 * negative errno; cancelled early (returning -ECANCELED) if kvs_pool_destroy is running. */
int kvs_pool_prefault(kvs_pool_t *pool);

/* Whole-structure check (O(extents)); true when every invariant above holds. */
bool kvs__pool_is_valid(kvs_pool_t *pool);

#ifdef __cplusplus
}
#endif
#endif
