/* kvshim pool: see pool.h (design §5).
 *
 * Allocator (one per arena of a created pool). The arena is npages pages of 1 << shift bytes.
 * Every page p of the arena has a side-array tag (kvs_ptag_t, kept outside the segment in a
 * lazily backed anonymous mapping, so a peer writing into the pool cannot corrupt it). The arena
 * is cut into extents, each free or allocated, and for an extent [p, p + n):
 *     tags[p].head     == n | (free ? PTAG_FREE : 0)      (the only non-zero head in the extent)
 *     tags[p + n - 1].tail == n                           (the only non-zero tail in the extent)
 *     every other head and tail inside the extent is 0
 * so the start of any extent, and the extent ending just before any page, are found in O(1), and
 * "off is the start of an allocated extent" is one load. Free extents also sit on one
 * doubly-linked list per size class (links in tags[p].next/prev, PTAG_NIL ends a list).
 *
 * Size classes are two-level (TLSF-style): fl = floor(log2 n) - SL_BITS + 1 and the next SL_BITS
 * bits of n give sl; sizes below SL_COUNT pages get one exact class each (fl 0). A bitmap of
 * non-empty first levels and one of non-empty second levels per first level make "smallest
 * non-empty class at or above c" two find-first-set operations.
 *
 * Invariants per arena (checked by arena_is_valid):
 *     alloc_pages + free_pages == npages
 *     extents tile [0, npages) exactly; no two free extents are adjacent
 *     a free extent is on exactly the list of its class; bitmaps == non-empty lists
 * Lock: arena.lock guards every field of the arena and its tags; alloc_pages and limit_pages
 * are also read without it (kvs_pool_room), so they are written with relaxed atomic stores. */
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "prim.h"

#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6u
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define SMALL_PAGE_SHIFT 12u
#define HUGE_PAGE_SHIFT 21u

#define SL_BITS 4u
#define SL_COUNT (1u << SL_BITS)
#define FL_COUNT 32u

#define PTAG_FREE 0x80000000u
#define PTAG_LEN 0x7fffffffu
#define PTAG_NIL UINT32_MAX
/* An arena holds at most PTAG_LEN pages (8 TiB with 4 KiB pages). */
#define ARENA_MAX_PAGES ((uint64_t)PTAG_LEN)

/* ASan: arenas up to this size have their free extents poisoned. Poisoning writes ASan's
 * shadow (1/8 of the range), so a default 4 GiB host arena would dirty 512 MiB per process;
 * larger arenas are left unpoisoned. */
#if defined(KVSHIM_ASAN) || defined(__SANITIZE_ADDRESS__)
#define KVS__POOL_POISONS 1
#else
#define KVS__POOL_POISONS 0
#endif
#define POISON_MAX_BYTES (256ull << 20)

/* Prefault works in pieces of this many bytes, checking for cancellation between them. */
#define PREFAULT_STEP (2ull << 20) /* small: each step's populate holds the mmap lock, and a
                                       thread mapping or unmapping waits behind it */

/* Debug builds validate the arena after each mutation; above this many extents only one
 * mutation in VALIDATE_SAMPLE is checked, so a validator of O(extents) stays affordable. */
#define VALIDATE_FULL_EXTENTS 4096u
#define VALIDATE_SAMPLE 256u
/* kvs__pool_is_valid also checks the interior tags (O(pages)) of arenas up to this size. */
#define VALIDATE_DEEP_PAGES 16384u

typedef struct kvs_ptag {
  uint32_t head; /* at an extent's first page: length | PTAG_FREE if free; else 0 */
  uint32_t tail; /* at an extent's last page: length; else 0 */
  uint32_t next; /* free extents only: size-class list links (page indices) */
  uint32_t prev;
} kvs_ptag_t;

typedef struct kvs_pool_arena {
  pthread_mutex_t lock;
  uint64_t off;           /* segment offset of page 0 (immutable) */
  uint32_t npages;        /* arena size in pages (immutable); 0 = no arena */
  uint32_t shift;         /* log2 page size (immutable) */
  bool poison;            /* ASan: free extents are poisoned (immutable) */
  kvs_ptag_t *tags;       /* npages entries, anonymous mapping of tags_bytes */
  size_t tags_bytes;
  uint64_t alloc_pages;   /* pages in allocated extents (written with relaxed atomic stores
                           * under lock: kvs_pool_room reads it without) */
  uint64_t alloc_extents; /* allocated extents */
  uint64_t free_extents;  /* free extents (== entries on all lists) */
  uint64_t mutations;     /* for sampled validation */
  uint32_t limit_pages;   /* usable pages (kvs_pool_set_limit); 0 = all (written like
                           * alloc_pages) */
  uint32_t fl_map;                    /* bit fl set <=> some list of first level fl non-empty */
  uint32_t sl_map[FL_COUNT];          /* bit sl set <=> heads[fl][sl] != PTAG_NIL */
  uint32_t heads[FL_COUNT][SL_COUNT]; /* first free extent of each class, or PTAG_NIL */
} pool_arena_t;

struct kvs_pool {
  int fd;             /* owned (attached pools own a dup of the caller's fd) */
  uint8_t *base;      /* mapping of the whole segment */
  uint64_t size;      /* segment bytes */
  uint32_t page_size; /* extent alignment */
  bool owner;         /* created here: the allocator lives here */
  bool writable;
  char *name;         /* shm_open name to unlink at destroy (owner, named pools), or NULL */
  atomic_int closing;     /* set by destroy: running prefaults stop */
  atomic_int prefaulting; /* prefault calls in progress */
  pool_arena_t arenas[2];
  /* Step-ahead prefault (kvs_pool_prefault_ahead): the cache arena's high-water mark (bytes
   * from its start to the end of the highest extent ever allocated), how far a step-ahead
   * prefault has faulted it in, and how far ahead of the mark it goes (0: none running). */
  _Atomic uint64_t hwm;
  _Atomic uint64_t pf_done;
  _Atomic uint64_t pf_ahead;
  pthread_mutex_t pf_lock; /* with pf_cond: wakes the step-ahead prefault */
  pthread_cond_t pf_cond;
};

/* ---- size classes ----------------------------------------------------------------------- */

static inline unsigned msb32(uint32_t x) { return 31u - (unsigned)__builtin_clz(x); }

/* Class holding extents of exactly n pages (n >= 1, n <= PTAG_LEN). */
static inline void class_of(uint32_t n, unsigned *fl, unsigned *sl) {
  if (n < SL_COUNT) {
    *fl = 0;
    *sl = n;
  } else {
    unsigned f = msb32(n);
    *fl = f - SL_BITS + 1u;
    *sl = (n >> (f - SL_BITS)) ^ SL_COUNT;
  }
}

/* Smallest class whose every extent has at least n pages (n <= PTAG_LEN, so no overflow). */
static inline void class_at_least(uint32_t n, unsigned *fl, unsigned *sl) {
  if (n >= SL_COUNT) n += (1u << (msb32(n) - SL_BITS)) - 1u;
  class_of(n, fl, sl);
}

static void list_push(pool_arena_t *a, uint32_t p) {
  unsigned fl, sl;
  class_of(a->tags[p].head & PTAG_LEN, &fl, &sl);
  uint32_t h = a->heads[fl][sl];
  a->tags[p].prev = PTAG_NIL;
  a->tags[p].next = h;
  if (h != PTAG_NIL) a->tags[h].prev = p;
  a->heads[fl][sl] = p;
  a->sl_map[fl] |= 1u << sl;
  a->fl_map |= 1u << fl;
  a->free_extents++;
}

static void list_remove(pool_arena_t *a, uint32_t p) {
  unsigned fl, sl;
  class_of(a->tags[p].head & PTAG_LEN, &fl, &sl);
  uint32_t nx = a->tags[p].next, pv = a->tags[p].prev;
  if (nx != PTAG_NIL) a->tags[nx].prev = pv;
  if (pv != PTAG_NIL) {
    a->tags[pv].next = nx;
  } else {
    a->heads[fl][sl] = nx;
    if (nx == PTAG_NIL) {
      a->sl_map[fl] &= ~(1u << sl);
      if (!a->sl_map[fl]) a->fl_map &= ~(1u << fl);
    }
  }
  a->tags[p].next = a->tags[p].prev = 0;
  a->free_extents--;
}

/* First extent of the smallest non-empty class at or above (fl, sl), or PTAG_NIL. */
static uint32_t find_class_at_or_above(const pool_arena_t *a, unsigned fl, unsigned sl) {
  if (fl >= FL_COUNT) return PTAG_NIL;
  uint32_t slm = sl < SL_COUNT ? a->sl_map[fl] & (~0u << sl) : 0;
  if (!slm) {
    uint32_t flm = fl + 1u < FL_COUNT ? a->fl_map & (~0u << (fl + 1u)) : 0;
    if (!flm) return PTAG_NIL;
    fl = (unsigned)__builtin_ctz(flm);
    slm = a->sl_map[fl];
  }
  return a->heads[fl][(unsigned)__builtin_ctz(slm)];
}

/* A free extent of at least n pages, or PTAG_NIL. Order: the head of n's own class when it
 * fits (reuses a hole of the same size: no split; O(1)), then the smallest class that surely
 * fits (O(1)), then, only when nothing larger exists, the rest of n's own class (the sole place
 * left where a fitting extent can be; O(extents in that class)). */
static uint32_t find_fit(const pool_arena_t *a, uint32_t n) {
  unsigned fl, sl;
  class_of(n, &fl, &sl);
  uint32_t p = a->heads[fl][sl];
  if (p != PTAG_NIL && (a->tags[p].head & PTAG_LEN) >= n) return p;
  unsigned gfl, gsl;
  class_at_least(n, &gfl, &gsl);
  uint32_t g = find_class_at_or_above(a, gfl, gsl);
  if (g != PTAG_NIL) return g;
  for (; p != PTAG_NIL; p = a->tags[p].next)
    if ((a->tags[p].head & PTAG_LEN) >= n) return p;
  return PTAG_NIL;
}

/* ---- arena ------------------------------------------------------------------------------ */

static int arena_init(pool_arena_t *a, uint64_t off, uint64_t npages, unsigned shift) {
  memset(a, 0, sizeof *a);
  a->off = off;
  a->shift = shift;
  for (unsigned i = 0; i < FL_COUNT; i++)
    for (unsigned j = 0; j < SL_COUNT; j++) a->heads[i][j] = PTAG_NIL;
  int rc = pthread_mutex_init(&a->lock, NULL);
  if (rc) return -rc;
  if (npages == 0) return 0;
  a->npages = (uint32_t)npages;
  a->tags_bytes = (size_t)npages * sizeof(kvs_ptag_t);
  void *t = NULL;
  rc = kvs__prim_alloc(a->tags_bytes, &t);
  if (rc < 0) {
    pthread_mutex_destroy(&a->lock);
    a->npages = 0;
    return rc;
  }
  a->tags = t;
  a->tags[0].head = a->npages | PTAG_FREE;
  a->tags[a->npages - 1].tail = a->npages;
  list_push(a, 0);
  return 0;
}

static void arena_fini(pool_arena_t *a) {
  kvs__prim_unmap(a->tags, a->tags_bytes);
  a->tags = NULL;
  pthread_mutex_destroy(&a->lock);
}

/* Called with a->lock held. */
static bool arena_is_valid_locked(const pool_arena_t *a, bool deep) {
  if (a->npages == 0) return a->alloc_pages == 0 && a->alloc_extents == 0 && !a->fl_map;
  uint64_t free_pages = 0, alloc_pages = 0, nfree = 0, nalloc = 0;
  bool prev_free = false;
  deep = deep && a->npages <= VALIDATE_DEEP_PAGES;
  for (uint32_t p = 0; p < a->npages;) {
    uint32_t h = a->tags[p].head, n = h & PTAG_LEN;
    if (n == 0 || n > a->npages - p) return false;
    if (a->tags[p + n - 1].tail != n) return false;
    if (deep)
      for (uint32_t i = p + 1; i < p + n; i++)
        if (a->tags[i].head || a->tags[i - 1].tail) return false;
    bool is_free = (h & PTAG_FREE) != 0;
    if (is_free) {
      if (prev_free) return false; /* adjacent free extents: a missed coalesce */
      free_pages += n;
      nfree++;
    } else {
      alloc_pages += n;
      nalloc++;
    }
    prev_free = is_free;
    p += n;
  }
  if (alloc_pages != a->alloc_pages || nalloc != a->alloc_extents) return false;
  if (alloc_pages + free_pages != a->npages || nfree != a->free_extents) return false;
  uint64_t listed = 0;
  for (unsigned fl = 0; fl < FL_COUNT; fl++) {
    if (((a->fl_map >> fl) & 1u) != (a->sl_map[fl] != 0)) return false;
    for (unsigned sl = 0; sl < SL_COUNT; sl++) {
      uint32_t p = a->heads[fl][sl];
      if (((a->sl_map[fl] >> sl) & 1u) != (p != PTAG_NIL)) return false;
      uint32_t prev = PTAG_NIL;
      for (; p != PTAG_NIL; prev = p, p = a->tags[p].next) {
        if (p >= a->npages || !(a->tags[p].head & PTAG_FREE)) return false;
        if (a->tags[p].prev != prev) return false;
        unsigned cfl, csl;
        class_of(a->tags[p].head & PTAG_LEN, &cfl, &csl);
        if (cfl != fl || csl != sl) return false;
        if (++listed > nfree) return false; /* also stops a cycle */
      }
    }
  }
  return listed == nfree;
}

static void arena_check(pool_arena_t *a) {
#ifdef KVSHIM_DEBUG
  a->mutations++;
  if (a->alloc_extents + a->free_extents <= VALIDATE_FULL_EXTENTS ||
      a->mutations % VALIDATE_SAMPLE == 0)
    KVS__DEBUG_CHECK(arena_is_valid_locked(a, false));
#else
  (void)a;
#endif
}

/* ---- small helpers ---------------------------------------------------------------------- */

static uint64_t random_id(void) {
  uint64_t id = 0;
  for (int tries = 0; tries < 8 && id == 0; tries++) {
    ssize_t n = getrandom(&id, sizeof id, GRND_NONBLOCK);
    if (n != (ssize_t)sizeof id) id = 0;
  }
  if (id == 0) { /* no entropy yet: mix clock and pid (only uniqueness matters) */
    id = kvs__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&id;
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    if (id == 0) id = 1;
  }
  return id;
}

static int round_pages(uint64_t bytes, unsigned shift, uint64_t *pages) {
  uint64_t n = (bytes >> shift) + ((bytes & ((1ull << shift) - 1)) != 0);
  if (n > ARENA_MAX_PAGES) return -EINVAL;
  *pages = n;
  return 0;
}

static void fill_header(kvs_pool_header_t *h, uint64_t seg, uint64_t id, unsigned shift,
                        uint64_t cache_pages, uint64_t host_pages) {
  memset(h, 0, sizeof *h);
  h->magic = KVS_POOL_MAGIC;
  h->abi_version = KVS_POOL_ABI_VERSION;
  h->header_size = KVS_POOL_HEADER_SIZE;
  h->segment_size = seg;
  h->instance_id = id;
  h->owner_pid = (uint32_t)getpid();
  h->page_size = 1u << shift;
  h->cache_off = 1ull << shift;
  h->cache_size = cache_pages << shift;
  h->host_off = h->cache_off + h->cache_size;
  h->host_size = host_pages << shift;
  h->flags = shift == HUGE_PAGE_SHIFT ? KVS_POOL_F_HUGEPAGES : 0;
}

/* Make the fd (memfd or shm) and map it. On failure nothing is left open. */
static int make_segment(const kvs_pool_config_t *cfg, bool huge, unsigned shift,
                        uint64_t seg, int *fd_out, uint8_t **base_out) {
  bool named = cfg->name && cfg->name[0];
  int fd = named ? kvs__prim_shm_create(cfg->name, seg)
                 : kvs__prim_memfd("kvshim-pool", seg, huge);
  if (fd < 0) return fd;
  void *m = NULL;
  int rc = kvs__prim_map_shared(fd, (size_t)seg, true, &m);
  if (rc < 0) {
    close(fd);
    if (named) kvs__prim_shm_unlink(cfg->name);
    return rc;
  }
  *fd_out = fd;
  *base_out = m;
  return 0;
}

static void pool_free_struct(kvs_pool_t *pool) {
  pthread_mutex_destroy(&pool->pf_lock);
  pthread_cond_destroy(&pool->pf_cond);
  free(pool->name);
  kvs__free_poisoned(pool, sizeof *pool);
}

/* ---- create / attach / destroy ---------------------------------------------------------- */

int kvs_pool_create(const kvs_pool_config_t *cfg, kvs_pool_t **out) {
  if (!cfg || !out || cfg->cache_size == 0) return -EINVAL;
  bool named = cfg->name && cfg->name[0];
  bool huge = cfg->hugepages && !named;
  if (cfg->hugepages && named)
    kvs_log_warn("pool: huge pages are not available for a named pool (%s); using 4 KiB pages",
                 cfg->name);
  kvs_pool_t *pool = calloc(1, sizeof *pool);
  if (!pool) return -ENOMEM;
  if (named && !(pool->name = strdup(cfg->name))) {
    free(pool);
    return -ENOMEM;
  }
  int rc;
  unsigned shift;
  uint64_t cache_pages = 0, host_pages = 0, seg = 0;
  for (;;) {
    shift = huge ? HUGE_PAGE_SHIFT : SMALL_PAGE_SHIFT;
    if ((rc = round_pages(cfg->cache_size, shift, &cache_pages)) < 0 ||
        (rc = round_pages(cfg->host_size, shift, &host_pages)) < 0)
      goto fail_struct;
    seg = (1ull + cache_pages + host_pages) << shift;
    rc = make_segment(cfg, huge, shift, seg, &pool->fd, &pool->base);
    if (rc == 0) break;
    if (!huge) goto fail_struct;
    kvs_log_warn("pool: huge pages unavailable (%s); falling back to 4 KiB pages", strerror(-rc));
    huge = false;
  }
  pool->size = seg;
  pool->page_size = 1u << shift;
  pool->owner = true;
  pthread_mutex_init(&pool->pf_lock, NULL);
  pthread_cond_init(&pool->pf_cond, NULL);
  pool->writable = true;
  uint64_t id = cfg->instance_id ? cfg->instance_id : random_id();
  fill_header((kvs_pool_header_t *)pool->base, seg, id, shift, cache_pages, host_pages);
  const kvs_pool_header_t *h = (const kvs_pool_header_t *)pool->base;
  if ((rc = arena_init(&pool->arenas[KVS_ARENA_CACHE], h->cache_off, cache_pages, shift)) < 0)
    goto fail_map;
  if ((rc = arena_init(&pool->arenas[KVS_ARENA_HOST], h->host_off, host_pages, shift)) < 0) {
    arena_fini(&pool->arenas[KVS_ARENA_CACHE]);
    goto fail_map;
  }
  for (int i = 0; i < 2; i++) {
    pool_arena_t *a = &pool->arenas[i];
    a->poison = KVS__POOL_POISONS && a->npages &&
                ((uint64_t)a->npages << shift) <= POISON_MAX_BYTES;
    if (a->poison) kvs__poison(pool->base + a->off, (uint64_t)a->npages << shift);
  }
  *out = pool;
  return 0;
fail_map:
  kvs__prim_unmap(pool->base, (size_t)seg);
  close(pool->fd);
  kvs__prim_shm_unlink(pool->name);
fail_struct:
  free(pool->name);
  free(pool);
  return rc;
}

#define ATTACH_CHECK(cond, field, fmt, have, want)                                            \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      kvs_log_warn("pool attach: header field %s mismatch: segment has " fmt ", expected " fmt, \
                   field, have, want);                                                        \
      return -EPROTO;                                                                         \
    }                                                                                         \
  } while (0)

static bool arena_fits(uint64_t off, uint64_t size, uint64_t seg, uint32_t page) {
  return off % page == 0 && size % page == 0 && off >= page && off <= seg && size <= seg - off;
}

static int check_header(const kvs_pool_header_t *h, uint64_t file_size) {
  ATTACH_CHECK(h->magic == KVS_POOL_MAGIC, "magic", "0x%016" PRIx64, (uint64_t)h->magic,
               (uint64_t)KVS_POOL_MAGIC);
  ATTACH_CHECK(h->abi_version == KVS_POOL_ABI_VERSION, "abi_version", "%u",
               (unsigned)h->abi_version, (unsigned)KVS_POOL_ABI_VERSION);
  ATTACH_CHECK(h->header_size == KVS_POOL_HEADER_SIZE, "header_size", "%u",
               (unsigned)h->header_size, (unsigned)KVS_POOL_HEADER_SIZE);
  ATTACH_CHECK(h->segment_size == file_size, "segment_size", "%" PRIu64,
               (uint64_t)h->segment_size, file_size);
  ATTACH_CHECK(h->page_size == (1u << SMALL_PAGE_SHIFT) || h->page_size == (1u << HUGE_PAGE_SHIFT),
               "page_size", "%u", (unsigned)h->page_size, 1u << SMALL_PAGE_SHIFT);
  ATTACH_CHECK(h->segment_size % h->page_size == 0, "segment_size", "%" PRIu64,
               (uint64_t)h->segment_size, (uint64_t)KVS__ALIGN_UP(h->segment_size, h->page_size));
  ATTACH_CHECK(h->cache_size > 0 &&
                   arena_fits(h->cache_off, h->cache_size, h->segment_size, h->page_size),
               "cache_off", "%" PRIu64, (uint64_t)h->cache_off, (uint64_t)h->page_size);
  ATTACH_CHECK(arena_fits(h->host_off, h->host_size, h->segment_size, h->page_size), "host_off",
               "%" PRIu64, (uint64_t)h->host_off, (uint64_t)(h->cache_off + h->cache_size));
  bool disjoint = h->host_size == 0 || h->host_off >= h->cache_off + h->cache_size ||
                  h->cache_off >= h->host_off + h->host_size;
  ATTACH_CHECK(disjoint, "host_off", "%" PRIu64, (uint64_t)h->host_off,
               (uint64_t)(h->cache_off + h->cache_size));
  return 0;
}

int kvs_pool_attach(int fd, bool writable, kvs_pool_t **out) {
  if (fd < 0 || !out) return -EINVAL;
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  if (st.st_size < (off_t)sizeof(kvs_pool_header_t)) {
    kvs_log_warn("pool attach: header field segment_size mismatch: file has %lld bytes, "
                 "expected at least %u", (long long)st.st_size, KVS_POOL_HEADER_SIZE);
    return -EPROTO;
  }
  uint64_t file_size = (uint64_t)st.st_size;
  /* A hugetlbfs file is mapped (and must be unmapped) in whole huge pages: st_blksize. */
  struct statfs sfs;
  bool hugetlb = fstatfs(fd, &sfs) == 0 && (uint32_t)sfs.f_type == HUGETLBFS_MAGIC;
  long sys_page = sysconf(_SC_PAGESIZE);
  size_t hdr_map = hugetlb ? (size_t)st.st_blksize : sys_page > 0 ? (size_t)sys_page : 4096u;
  if (hdr_map > file_size) hdr_map = (size_t)file_size;
  void *hm = NULL;
  int rc = kvs__prim_map_shared(fd, hdr_map, false, &hm);
  if (rc < 0) return rc;
  kvs_pool_header_t h;
  memcpy(&h, hm, sizeof h);
  kvs__prim_unmap(hm, hdr_map);
  rc = check_header(&h, file_size);
  if (rc < 0) return rc;
  if (hugetlb && h.page_size != (uint64_t)st.st_blksize) {
    kvs_log_warn("pool attach: header field page_size mismatch: segment has %u, expected %lld "
                 "(hugetlbfs page)", (unsigned)h.page_size, (long long)st.st_blksize);
    return -EPROTO;
  }

  kvs_pool_t *pool = calloc(1, sizeof *pool);
  if (!pool) return -ENOMEM;
  pool->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (pool->fd < 0) {
    rc = -errno;
    free(pool);
    return rc;
  }
  void *m = NULL;
  rc = kvs__prim_map_shared(pool->fd, (size_t)h.segment_size, writable, &m);
  if (rc < 0) {
    close(pool->fd);
    free(pool);
    return rc;
  }
  pool->base = m;
  pool->size = h.segment_size;
  pool->page_size = h.page_size;
  pool->writable = writable;
  pthread_mutex_init(&pool->pf_lock, NULL);
  pthread_cond_init(&pool->pf_cond, NULL);
  *out = pool;
  return 0;
}

int kvs_pool_destroy(kvs_pool_t *pool, bool force) {
  if (!pool) return 0;
  if (pool->owner) {
    for (int i = 0; i < 2; i++) {
      pool_arena_t *a = &pool->arenas[i];
      pthread_mutex_lock(&a->lock);
      bool busy = a->alloc_extents != 0;
      pthread_mutex_unlock(&a->lock);
      if (busy && !force) return -EBUSY;
    }
  }
  /* Stop prefaults: a prefault either sees closing, or is counted before we look. */
  kvs_pool_cancel_prefault(pool);
  while (atomic_load(&pool->prefaulting) != 0) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  if (pool->owner) {
    kvs__unpoison(pool->base, pool->size); /* the address range may be reused */
    arena_fini(&pool->arenas[KVS_ARENA_CACHE]);
    arena_fini(&pool->arenas[KVS_ARENA_HOST]);
    kvs__prim_shm_unlink(pool->name);
  }
  kvs__prim_unmap(pool->base, (size_t)pool->size);
  close(pool->fd);
  pool_free_struct(pool);
  return 0;
}

/* ---- accessors -------------------------------------------------------------------------- */

int kvs_pool_fd(const kvs_pool_t *pool) { return pool->fd; }
uint8_t *kvs_pool_base(const kvs_pool_t *pool) { return pool->base; }
uint64_t kvs_pool_segment_size(const kvs_pool_t *pool) { return pool->size; }
uint32_t kvs_pool_page_size(const kvs_pool_t *pool) { return pool->page_size; }
const kvs_pool_header_t *kvs_pool_header(const kvs_pool_t *pool) {
  return (const kvs_pool_header_t *)pool->base;
}
bool kvs_pool_is_owner(const kvs_pool_t *pool) { return pool->owner; }
bool kvs_pool_is_writable(const kvs_pool_t *pool) { return pool->writable; }

/* ---- alloc / free ----------------------------------------------------------------------- */

/* The arena of a created pool, or NULL (no such arena). *err says why. */
static pool_arena_t *owned_arena(kvs_pool_t *pool, kvs_arena_t arena, int *err) {
  if (!pool) {
    *err = -EINVAL;
    return NULL;
  }
  if (!pool->owner) {
    *err = -EPERM;
    return NULL;
  }
  if ((unsigned)arena > KVS_ARENA_HOST || pool->arenas[arena].npages == 0) {
    *err = -EINVAL;
    return NULL;
  }
  return &pool->arenas[arena];
}

/* Page index of off in a, or PTAG_NIL when off is outside the arena or not page-aligned. */
static uint32_t page_of(const pool_arena_t *a, uint64_t off) {
  if (off < a->off) return PTAG_NIL;
  uint64_t rel = off - a->off;
  if (rel & ((1ull << a->shift) - 1)) return PTAG_NIL;
  uint64_t p = rel >> a->shift;
  return p < a->npages ? (uint32_t)p : PTAG_NIL;
}

/* The cache arena's high-water mark reaches end (bytes from the arena's start): wake a
 * step-ahead prefault when the mark came within its step of what it has faulted in. */
static void hwm_raise(kvs_pool_t *pool, uint64_t end) {
  uint64_t h = atomic_load_explicit(&pool->hwm, memory_order_relaxed);
  while (end > h &&
         !atomic_compare_exchange_weak_explicit(&pool->hwm, &h, end, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
  if (end <= h) return;
  uint64_t ahead = atomic_load_explicit(&pool->pf_ahead, memory_order_relaxed);
  if (ahead && end + ahead / 2 > atomic_load_explicit(&pool->pf_done, memory_order_relaxed)) {
    pthread_mutex_lock(&pool->pf_lock);
    pthread_cond_broadcast(&pool->pf_cond);
    pthread_mutex_unlock(&pool->pf_lock);
  }
}

int kvs_pool_alloc(kvs_pool_t *pool, kvs_arena_t arena, uint64_t len, uint64_t *off) {
  int err;
  pool_arena_t *a = owned_arena(pool, arena, &err);
  if (!a) return err;
  if (len == 0 || !off) return -EINVAL;
  uint64_t want = (len >> a->shift) + ((len & ((1ull << a->shift) - 1)) != 0);
  if (want > a->npages) return -ENOSPC;
  uint32_t n = (uint32_t)want;

  pthread_mutex_lock(&a->lock);
  uint32_t p = a->limit_pages && a->alloc_pages + n > a->limit_pages ? PTAG_NIL : find_fit(a, n);
  if (p == PTAG_NIL) {
    pthread_mutex_unlock(&a->lock);
    return -ENOSPC;
  }
  uint32_t have = a->tags[p].head & PTAG_LEN;
  list_remove(a, p);
  a->tags[p].head = n;
  if (have > n) { /* split: the tail end stays free */
    uint32_t r = p + n;
    a->tags[p + n - 1].tail = n;
    a->tags[r].head = (have - n) | PTAG_FREE;
    a->tags[p + have - 1].tail = have - n;
    list_push(a, r);
  }
  __atomic_store_n(&a->alloc_pages, a->alloc_pages + n, __ATOMIC_RELAXED);
  a->alloc_extents++;
  arena_check(a);
  pthread_mutex_unlock(&a->lock);

  uint64_t o = a->off + ((uint64_t)p << a->shift);
  if (a->poison) kvs__unpoison(pool->base + o, (uint64_t)n << a->shift);
  if (arena == KVS_ARENA_CACHE) hwm_raise(pool, (uint64_t)(p + n) << a->shift);
  *off = o;
  return 0;
}

/* The allocated extent that starts at off, its arena locked: 0 with *a_out (locked), its first
 * page *p_out and its pages *n_out; or owned_arena's error, or -EINVAL when off starts no
 * allocated extent (not a start, or already free), nothing held. */
static inline int lock_extent(kvs_pool_t *pool, kvs_arena_t arena, uint64_t off,
                              pool_arena_t **a_out, uint32_t *p_out, uint32_t *n_out) {
  int err;
  pool_arena_t *a = owned_arena(pool, arena, &err);
  if (!a) return err;
  uint32_t p = page_of(a, off);
  if (p == PTAG_NIL) return -EINVAL;
  pthread_mutex_lock(&a->lock);
  uint32_t h = a->tags[p].head;
  if (h == 0 || (h & PTAG_FREE)) {
    pthread_mutex_unlock(&a->lock);
    return -EINVAL;
  }
  *a_out = a;
  *p_out = p;
  *n_out = h;
  return 0;
}

int64_t kvs_pool_free(kvs_pool_t *pool, kvs_arena_t arena, uint64_t off) {
  pool_arena_t *a;
  uint32_t p, n;
  KVS_TRY(lock_extent(pool, arena, off, &a, &p, &n));
  /* Poison before the extent becomes allocatable again: after the unlock another thread may
   * allocate (and unpoison) it. */
  if (a->poison) kvs__poison(pool->base + off, (uint64_t)n << a->shift);
  __atomic_store_n(&a->alloc_pages, a->alloc_pages - n, __ATOMIC_RELAXED);
  a->alloc_extents--;
  uint32_t start = p, len = n;
  if (p > 0 && a->tags[p - 1].tail) { /* left neighbour */
    uint32_t ln = a->tags[p - 1].tail, lp = p - ln;
    if (a->tags[lp].head & PTAG_FREE) {
      list_remove(a, lp);
      a->tags[p - 1].tail = 0;
      a->tags[p].head = 0;
      start = lp;
      len += ln;
    }
  }
  uint32_t q = p + n;
  if (q < a->npages && (a->tags[q].head & PTAG_FREE)) { /* right neighbour */
    uint32_t rn = a->tags[q].head & PTAG_LEN;
    list_remove(a, q);
    a->tags[q - 1].tail = 0;
    a->tags[q].head = 0;
    len += rn;
  }
  a->tags[start].head = len | PTAG_FREE;
  a->tags[start + len - 1].tail = len;
  list_push(a, start);
  arena_check(a);
  pthread_mutex_unlock(&a->lock);
  return (int64_t)n << a->shift;
}

int64_t kvs_pool_extent_len(kvs_pool_t *pool, kvs_arena_t arena, uint64_t off) {
  pool_arena_t *a;
  uint32_t p, n;
  KVS_TRY(lock_extent(pool, arena, off, &a, &p, &n));
  pthread_mutex_unlock(&a->lock);
  return (int64_t)n << a->shift;
}

int kvs_pool_arena_of(const kvs_pool_t *pool, uint64_t off, uint64_t len) {
  if (!pool) return -EINVAL;
  const kvs_pool_header_t *h = kvs_pool_header(pool);
  const uint64_t offs[2] = {h->cache_off, h->host_off};
  const uint64_t sizes[2] = {h->cache_size, h->host_size};
  for (int i = 0; i < 2; i++) {
    if (sizes[i] == 0 || off < offs[i]) continue;
    uint64_t rel = off - offs[i];
    if (rel < sizes[i] && len <= sizes[i] - rel) return i;
  }
  return -EINVAL;
}

int kvs_pool_arena_stats(kvs_pool_t *pool, kvs_arena_t arena, kvs_pool_arena_stats_t *out) {
  int err;
  pool_arena_t *a = owned_arena(pool, arena, &err);
  if (!a) return err;
  if (!out) return -EINVAL;
  kvs_pool_arena_stats_t s = {0};
  pthread_mutex_lock(&a->lock);
  s.size = (uint64_t)a->npages << a->shift;
  s.allocated = a->alloc_pages << a->shift;
  s.free = s.size - s.allocated;
  s.extents = a->alloc_extents;
  uint64_t largest = 0;
  if (a->fl_map) { /* the largest extent is on the highest non-empty list */
    unsigned fl = msb32(a->fl_map), sl = msb32(a->sl_map[fl]);
    for (uint32_t p = a->heads[fl][sl]; p != PTAG_NIL; p = a->tags[p].next)
      if ((a->tags[p].head & PTAG_LEN) > largest) largest = a->tags[p].head & PTAG_LEN;
  }
  pthread_mutex_unlock(&a->lock);
  s.largest_free = largest << a->shift;
  s.fragmentation_pct = s.free ? (uint32_t)((s.free - s.largest_free) * 100u / s.free) : 0;
  *out = s;
  return 0;
}

/* ---- prefault --------------------------------------------------------------------------- */

/* Touch one byte per page without changing it: an atomic add of 0 is a write access (it
 * faults the page in writable) that cannot lose a concurrent writer's store. Not instrumented:
 * free extents are poisoned, and touching them is the point. */
__attribute__((no_sanitize("address", "thread"))) static void touch_pages(uint8_t *p, size_t n,
                                                                          size_t page,
                                                                          bool write) {
  for (size_t i = 0; i < n; i += page) {
    if (write)
      __atomic_fetch_add(p + i, 0, __ATOMIC_RELAXED);
    else
      (void)*(volatile uint8_t *)(p + i);
  }
}

/* How prefault_range works on this kernel and segment; each way found unsupported is dropped
 * for the rest of the prefault. */
typedef struct prefault_way {
  bool allocate; /* fallocate the step's pages in the segment file first */
  bool populate; /* MADV_POPULATE_*; false on a kernel before 5.14: touch each page instead */
} prefault_way_t;
#define PREFAULT_WAY_INIT {true, true}

/* Fault [from, to) of the cache arena in (bytes from its start). 0, -ECANCELED once destroy
 * has started, or the allocate/populate errno (reported, never a fault in the engine).
 *
 * Each step first allocates its pages in the segment file (kvs__prim_allocate: the zeroing and
 * allocation, most of the work, with no mmap lock and -ENOSPC instead of a SIGBUS), then maps
 * them by touching each page: a fault on an existing page, which recent kernels serve under the
 * mapping's own lock, not the process's mmap lock. Where the file cannot be allocated ahead
 * (or on an attached pool), MADV_POPULATE_* does both under the mmap lock (touching, on a
 * kernel before 5.14). Why it matters: prefault threads run at low priority, and a populate
 * preempted on a busy machine held the mmap lock for seconds, so the coordinator's mmap of a
 * peer's pool at HELLO waited behind it (kernel stacks: coordinator in vm_mmap_pgoff, prefault
 * runnable in faultin_page_range; HELLO timeouts in tests). */
static int prefault_range(kvs_pool_t *pool, uint64_t from, uint64_t to, prefault_way_t *way) {
  uint64_t cache_off = kvs_pool_header(pool)->cache_off;
  uint8_t *start = pool->base + cache_off;
  for (uint64_t done = from; done < to;) {
    if (atomic_load(&pool->closing)) return -ECANCELED;
    size_t step = (size_t)(to - done < PREFAULT_STEP ? to - done : PREFAULT_STEP);
    bool allocated = false;
    if (way->allocate && pool->writable) {
      int arc = kvs__prim_allocate(pool->fd, cache_off + done, step);
      if (arc == -EINTR) continue;
      if (arc == -EOPNOTSUPP || arc == -EINVAL || arc == -ENODEV || arc == -ENOSYS ||
          arc == -EPERM || arc == -EBADF)
        way->allocate = false; /* not this file system (or this fd): the populate does it all */
      else if (arc < 0)
        return arc; /* ENOSPC, ENOMEM: the pages do not exist; a fault would be SIGBUS */
      else
        allocated = true;
    }
    if (allocated) { /* the pages exist: map them by touching, one short fault each */
      touch_pages(start + done, step, pool->page_size, pool->writable);
      done += step;
      continue;
    }
    int prc = way->populate ? kvs__prim_populate(start + done, step, pool->writable) : 0;
    if (prc == -EINTR || prc == -EAGAIN) continue;
    if (prc < 0 && prc != -EINVAL) return prc; /* ENOMEM, EFAULT, EHWPOISON: report, never fault the engine */
    if (prc == -EINVAL) way->populate = false; /* kernel before 5.14 */
    if (!way->populate) touch_pages(start + done, step, pool->page_size, pool->writable);
    done += step;
  }
  return 0;
}

void kvs_pool_cancel_prefault(kvs_pool_t *pool) {
  if (!pool) return;
  atomic_store(&pool->closing, 1);
  pthread_mutex_lock(&pool->pf_lock);
  pthread_cond_broadcast(&pool->pf_cond);
  pthread_mutex_unlock(&pool->pf_lock);
}

int kvs_pool_prefault(kvs_pool_t *pool) {
  if (!pool) return -EINVAL;
  atomic_fetch_add(&pool->prefaulting, 1);
  prefault_way_t way = PREFAULT_WAY_INIT;
  int rc = atomic_load(&pool->closing)
               ? -ECANCELED
               : prefault_range(pool, 0, kvs_pool_header(pool)->cache_size, &way);
  atomic_fetch_sub(&pool->prefaulting, 1);
  return rc;
}

int kvs_pool_prefault_ahead(kvs_pool_t *pool, uint64_t ahead) {
  if (!pool || !pool->owner || ahead == 0) return -EINVAL;
  atomic_fetch_add(&pool->prefaulting, 1);
  uint64_t size = kvs_pool_header(pool)->cache_size;
  ahead = KVS__ALIGN_UP(ahead, pool->page_size);
  atomic_store(&pool->pf_ahead, ahead);
  prefault_way_t way = PREFAULT_WAY_INIT;
  int rc = 0;
  uint64_t done = atomic_load(&pool->pf_done);
  while (rc == 0 && done < size) {
    uint64_t h = atomic_load(&pool->hwm);
    /* nothing allocated yet: nothing to be ahead of (an engine whose cache peer holds the
     * node's copy may never allocate here) */
    uint64_t want = h == 0 ? 0 : h > size - ahead || size < ahead ? size : h + ahead;
    if (want > done) {
      rc = prefault_range(pool, done, want, &way);
      if (rc == 0) atomic_store(&pool->pf_done, done = want);
      continue;
    }
    /* Nothing to do until an allocation moves the mark (hwm_raise wakes us); the timeout only
     * bounds a missed wake-up. */
    pthread_mutex_lock(&pool->pf_lock);
    if (!atomic_load(&pool->closing) && atomic_load(&pool->hwm) == h) {
      struct timespec ts = kvs__realtime_after_ms(1000);
      pthread_cond_timedwait(&pool->pf_cond, &pool->pf_lock, &ts);
    }
    pthread_mutex_unlock(&pool->pf_lock);
    if (atomic_load(&pool->closing)) rc = -ECANCELED;
  }
  atomic_store(&pool->pf_ahead, 0);
  atomic_fetch_sub(&pool->prefaulting, 1);
  return rc;
}

void kvs_pool_prefault_hint(kvs_pool_t *pool, uint64_t bytes) {
  if (pool && pool->owner && bytes) hwm_raise(pool, KVS__ALIGN_UP(bytes, pool->page_size));
}

uint64_t kvs_pool_prefaulted(const kvs_pool_t *pool) {
  return atomic_load(&((kvs_pool_t *)pool)->pf_done);
}

int kvs_pool_set_limit(kvs_pool_t *pool, uint64_t bytes) {
  int err;
  pool_arena_t *a = owned_arena(pool, KVS_ARENA_CACHE, &err);
  if (!a) return err;
  uint64_t pages = (bytes >> a->shift) + ((bytes & ((1ull << a->shift) - 1)) != 0);
  pthread_mutex_lock(&a->lock);
  __atomic_store_n(&a->limit_pages, pages == 0 || pages >= a->npages ? 0 : (uint32_t)pages,
                   __ATOMIC_RELAXED);
  pthread_mutex_unlock(&a->lock);
  return 0;
}

uint64_t kvs_pool_room(kvs_pool_t *pool, kvs_arena_t arena) {
  int err;
  pool_arena_t *a = owned_arena(pool, arena, &err);
  if (!a) return 0;
  uint64_t usable = __atomic_load_n(&a->limit_pages, __ATOMIC_RELAXED);
  if (usable == 0) usable = a->npages;
  uint64_t used = __atomic_load_n(&a->alloc_pages, __ATOMIC_RELAXED);
  return used < usable ? (usable - used) << a->shift : 0;
}

uint64_t kvs_pool_limit(kvs_pool_t *pool) {
  int err;
  pool_arena_t *a = owned_arena(pool, KVS_ARENA_CACHE, &err);
  if (!a) return 0;
  pthread_mutex_lock(&a->lock);
  uint64_t l = (uint64_t)(a->limit_pages ? a->limit_pages : a->npages) << a->shift;
  pthread_mutex_unlock(&a->lock);
  return l;
}

/* ---- validation ------------------------------------------------------------------------- */

bool kvs__pool_is_valid(kvs_pool_t *pool) {
  if (!pool) return false;
  const kvs_pool_header_t *h = kvs_pool_header(pool);
  if (h->magic != KVS_POOL_MAGIC || h->segment_size != pool->size ||
      h->page_size != pool->page_size)
    return false;
  if (!pool->owner) return true;
  for (int i = 0; i < 2; i++) {
    pool_arena_t *a = &pool->arenas[i];
    uint64_t size = i == KVS_ARENA_CACHE ? h->cache_size : h->host_size;
    uint64_t off = i == KVS_ARENA_CACHE ? h->cache_off : h->host_off;
    if (((uint64_t)a->npages << a->shift) != size || (size && a->off != off)) return false;
    pthread_mutex_lock(&a->lock);
    bool ok = arena_is_valid_locked(a, true);
    pthread_mutex_unlock(&a->lock);
    if (!ok) return false;
  }
  return true;
}
