/* core/memory/pool: segment layout and header, attach and its validation, the allocator against a
 * reference model, coalescing, bad frees, exhaustion, arenas, cross-process sharing over
 * SCM_RIGHTS, read-only mappings, destroy with live extents, huge pages, prefault, named pools. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "pool.h"
#include "residency.h"
#include "../../lib/fdpass.h"
#include "../../lib/logcapture.h"
#include "../../lib/threads.h"

#define PG 4096ull


static kvs_pool_t *make_pool(uint64_t cache, uint64_t host) {
  kvs_pool_config_t cfg = {.cache_size = cache, .host_size = host};
  kvs_pool_t *p = NULL;
  cr_assert_eq(kvs_pool_create(&cfg, &p), 0);
  cr_assert_not_null(p);
  return p;
}

static kvs_pool_arena_stats_t stats_of(kvs_pool_t *p, kvs_arena_t a) {
  kvs_pool_arena_stats_t s;
  cr_assert_eq(kvs_pool_arena_stats(p, a, &s), 0);
  return s;
}

/* Field by field: the struct has tail padding, so memcmp would compare garbage. */
static bool stats_eq(kvs_pool_arena_stats_t a, kvs_pool_arena_stats_t b) {
  return a.size == b.size && a.allocated == b.allocated && a.free == b.free &&
         a.largest_free == b.largest_free && a.extents == b.extents &&
         a.fragmentation_pct == b.fragmentation_pct;
}

/* ---- create / header ------------------------------------------------------------------- */

Test(pool, create_writes_the_header, .timeout = 30) {
  kvs_pool_t *p = make_pool(1u << 20 | 5u, 3u << 20); /* cache rounds up to 257 pages */
  const kvs_pool_header_t *h = kvs_pool_header(p);
  struct stat st;
  cr_assert_eq(fstat(kvs_pool_fd(p), &st), 0);
  cr_expect_eq(h->magic, KVS_POOL_MAGIC);
  cr_expect_eq(memcmp(&h->magic, "KSHMPOOL", 8), 0);
  cr_expect_eq(h->abi_version, KVS_POOL_ABI_VERSION);
  cr_expect_eq(h->header_size, KVS_POOL_HEADER_SIZE);
  cr_expect_eq(h->segment_size, (uint64_t)st.st_size);
  cr_expect_eq(h->segment_size, kvs_pool_segment_size(p));
  cr_expect_neq(h->instance_id, 0);
  cr_expect_eq(h->owner_pid, (uint32_t)getpid());
  cr_expect_eq(h->page_size, PG);
  cr_expect_eq(kvs_pool_page_size(p), PG);
  cr_expect_eq(h->cache_off, PG);
  cr_expect_eq(h->cache_size, 257 * PG);
  cr_expect_eq(h->host_off, h->cache_off + h->cache_size);
  cr_expect_eq(h->host_size, 3u << 20);
  cr_expect_eq(h->segment_size, PG + 257 * PG + (3u << 20));
  cr_expect_eq(h->flags, 0);
  cr_expect_eq(h->reserved0, 0);
  for (size_t i = 0; i < sizeof h->reserved; i++) cr_expect_eq(h->reserved[i], 0);
  cr_expect_eq((const uint8_t *)h, kvs_pool_base(p));
  cr_expect(kvs_pool_is_owner(p));
  cr_expect(kvs_pool_is_writable(p));
  cr_expect(fcntl(kvs_pool_fd(p), F_GETFD) & FD_CLOEXEC);
  int seals = fcntl(kvs_pool_fd(p), F_GET_SEALS);
  cr_expect_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
  cr_expect_neq(ftruncate(kvs_pool_fd(p), 0), 0, "sealed segment must not shrink");
  kvs_pool_arena_stats_t s = stats_of(p, KVS_ARENA_CACHE);
  cr_expect_eq(s.size, 257 * PG);
  cr_expect_eq(s.free, s.size);
  cr_expect_eq(s.largest_free, s.size);
  cr_expect_eq(s.allocated, 0);
  cr_expect_eq(s.extents, 0);
  cr_expect_eq(s.fragmentation_pct, 0);
  cr_expect(kvs__pool_is_valid(p));
  cr_expect_eq(kvs_pool_destroy(p, false), 0);

  /* an explicit instance id is kept; two random ones differ */
  kvs_pool_config_t cfg = {.cache_size = PG, .instance_id = 0x1234abcdull};
  kvs_pool_t *a = NULL, *b = NULL;
  cr_assert_eq(kvs_pool_create(&cfg, &a), 0);
  cr_expect_eq(kvs_pool_header(a)->instance_id, 0x1234abcdull);
  cr_expect_eq(kvs_pool_header(a)->host_size, 0);
  cfg.instance_id = 0;
  cr_assert_eq(kvs_pool_create(&cfg, &b), 0);
  kvs_pool_t *c = make_pool(PG, 0);
  cr_expect_neq(kvs_pool_header(b)->instance_id, kvs_pool_header(c)->instance_id);
  kvs_pool_destroy(a, false);
  kvs_pool_destroy(b, false);
  kvs_pool_destroy(c, false);
}

Test(pool, create_rejects_bad_config, .timeout = 30) {
  kvs_pool_t *sentinel = (kvs_pool_t *)0x1;
  kvs_pool_t *out = sentinel;
  kvs_pool_config_t cfg = {.cache_size = 0, .host_size = PG};
  cr_expect_eq(kvs_pool_create(&cfg, &out), -EINVAL);
  cr_expect_eq(kvs_pool_create(NULL, &out), -EINVAL);
  cfg.cache_size = PG;
  cr_expect_eq(kvs_pool_create(&cfg, NULL), -EINVAL);
  cfg.cache_size = 1ull << 62; /* more pages than an arena can index */
  cr_expect_eq(kvs_pool_create(&cfg, &out), -EINVAL);
  cr_expect_eq(out, sentinel, "out must be untouched on error");
  cr_expect_eq(kvs_pool_destroy(NULL, false), 0);
  cr_expect_eq(kvs_pool_destroy(NULL, true), 0);
}

Test(pool, attach_maps_the_same_bytes, .timeout = 30) {
  kvs_pool_t *p = make_pool(16 * PG, 4 * PG);
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 3 * PG, &off), 0);
  memset(kvs_pool_base(p) + off, 0x5a, 3 * PG);

  int fd = dup(kvs_pool_fd(p));
  kvs_pool_t *q = NULL;
  cr_assert_eq(kvs_pool_attach(fd, true, &q), 0);
  close(fd); /* borrowed: the mapping stays */
  cr_expect_neq(kvs_pool_base(q), kvs_pool_base(p));
  cr_expect_eq(memcmp(kvs_pool_header(q), kvs_pool_header(p), sizeof(kvs_pool_header_t)), 0);
  cr_expect_eq(kvs_pool_segment_size(q), kvs_pool_segment_size(p));
  cr_expect_eq(kvs_pool_page_size(q), PG);
  cr_expect_not(kvs_pool_is_owner(q));
  cr_expect(kvs_pool_is_writable(q));
  cr_expect_geq(kvs_pool_fd(q), 0);
  cr_expect_eq(kvs_pool_base(q)[off + 3 * PG - 1], 0x5a);
  kvs_pool_base(q)[off] = 0x11;
  cr_expect_eq(kvs_pool_base(p)[off], 0x11);

  uint64_t o2 = 777;
  cr_expect_eq(kvs_pool_alloc(q, KVS_ARENA_CACHE, PG, &o2), -EPERM);
  cr_expect_eq(o2, 777);
  cr_expect_eq(kvs_pool_free(q, KVS_ARENA_CACHE, off), -EPERM);
  cr_expect_eq(kvs_pool_arena_of(q, off, 3 * PG), KVS_ARENA_CACHE);
  cr_expect(kvs__pool_is_valid(q));
  cr_expect_eq(kvs_pool_destroy(q, false), 0); /* an attached pool has no extents to hold */
  /* the creator's extent is unaffected */
  cr_expect_eq(kvs_pool_extent_len(p, KVS_ARENA_CACHE, off), (int64_t)(3 * PG));
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off), (int64_t)(3 * PG));
  cr_expect_eq(kvs_pool_destroy(p, false), 0);
}

Test(pool, attach_rejects_bad_fd, .timeout = 30) {
  kvs_pool_t *out = NULL;
  cr_expect_eq(kvs_pool_attach(-1, true, &out), -EINVAL);
  int fd = memfd_create("empty", MFD_CLOEXEC);
  cr_assert_geq(fd, 0);
  int log = log_capture(KVS_LOG_WARN);
  cr_expect_eq(kvs_pool_attach(fd, true, &out), -EPROTO); /* empty file */
  cr_expect_null(out);
  cr_expect_not_null(strstr(log_text(log), "segment_size"));
  close(fd);
}

/* A copy of a real pool's header, corrupted by `corrupt`, in a fresh memfd of `size` bytes. */
static int corrupted_copy(kvs_pool_t *p, uint64_t size, void (*corrupt)(kvs_pool_header_t *)) {
  kvs_pool_header_t h = *kvs_pool_header(p);
  if (corrupt) corrupt(&h);
  int fd = memfd_create("bad-pool", MFD_CLOEXEC);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, (off_t)size), 0);
  cr_assert_eq(pwrite(fd, &h, sizeof h, 0), (ssize_t)sizeof h);
  return fd;
}
static void bad_magic(kvs_pool_header_t *h) { h->magic ^= 1; }
static void bad_abi(kvs_pool_header_t *h) { h->abi_version = KVS_POOL_ABI_VERSION + 1; }
static void bad_header_size(kvs_pool_header_t *h) { h->header_size = 128; }
static void bad_cache(kvs_pool_header_t *h) { h->cache_size = h->segment_size; }
static void bad_host(kvs_pool_header_t *h) { h->host_off = h->cache_off + 8; }
static void bad_page(kvs_pool_header_t *h) { h->page_size = 512; }

Test(pool, attach_refuses_a_mismatching_header, .timeout = 30) {
  kvs_pool_t *p = make_pool(8 * PG, 2 * PG);
  uint64_t seg = kvs_pool_segment_size(p);
  struct {
    void (*corrupt)(kvs_pool_header_t *);
    uint64_t size;
    const char *field;
  } cases[] = {
      {bad_magic, seg, "magic"},
      {bad_abi, seg, "abi_version"},
      {bad_header_size, seg, "header_size"},
      {NULL, seg + PG, "segment_size"}, /* header says seg, the file is larger */
      {NULL, seg - PG, "segment_size"},
      {bad_cache, seg, "cache_off"},
      {bad_host, seg, "host_off"},
      {bad_page, seg, "page_size"},
  };
  for (size_t i = 0; i < KVS__ARRAY_LEN(cases); i++) {
    int log = log_capture(KVS_LOG_WARN);
    int fd = corrupted_copy(p, cases[i].size, cases[i].corrupt);
    kvs_pool_t *q = NULL;
    cr_expect_eq(kvs_pool_attach(fd, false, &q), -EPROTO, "case %zu (%s)", i, cases[i].field);
    cr_expect_null(q);
    const char *text = log_text(log);
    cr_expect_not_null(strstr(text, cases[i].field), "case %zu: log names %s: %s", i,
                       cases[i].field, text);
    close(fd);
    close(log);
  }
  /* the unmodified copy is accepted: the corruptions above are what was refused */
  int fd = corrupted_copy(p, seg, NULL);
  kvs_pool_t *q = NULL;
  cr_expect_eq(kvs_pool_attach(fd, false, &q), 0);
  kvs_pool_destroy(q, false);
  close(fd);
  kvs_pool_destroy(p, false);
}

/* ---- the allocator against a reference model -------------------------------------------- */

typedef struct {
  uint64_t off, pages;
  uint8_t tag;
} model_ext_t;

static uint64_t rng_state;
static uint64_t rnd(void) { /* xorshift64*: fixed seed, reproducible */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

static int cmp_ext(const void *a, const void *b) {
  const model_ext_t *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Largest gap (pages) between the model's extents in an arena [base, base + npages). */
static uint64_t model_largest_gap(model_ext_t *m, size_t n, uint64_t base, uint64_t npages) {
  qsort(m, n, sizeof *m, cmp_ext);
  uint64_t cur = base, best = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t gap = (m[i].off - cur) / PG;
    if (gap > best) best = gap;
    cur = m[i].off + m[i].pages * PG;
  }
  uint64_t gap = (base + npages * PG - cur) / PG;
  return gap > best ? gap : best;
}

Test(pool, random_ops_match_a_reference_model, .timeout = 60) {
  const uint64_t npages = 300;
  kvs_pool_t *p = make_pool(npages * PG, 0);
  const kvs_pool_header_t *h = kvs_pool_header(p);
  uint8_t *base = kvs_pool_base(p);
  model_ext_t m[400];
  size_t n = 0;
  uint64_t used = 0, nospc = 0, allocs = 0, frees = 0, bad = 0;
  rng_state = 0x9e3779b97f4a7c15ull;
  for (int op = 0; op < 6000; op++) {
    uint64_t r = rnd() % 100;
    if (r < 52 || n == 0) { /* alloc: mostly small, some large, not always page multiples */
      uint64_t len = (rnd() % 100 < 85) ? 1 + rnd() % (8 * PG) : 1 + rnd() % (60 * PG);
      uint64_t need = (len + PG - 1) / PG, off = 0;
      uint64_t gap = model_largest_gap(m, n, h->cache_off, npages);
      int rc = kvs_pool_alloc(p, KVS_ARENA_CACHE, len, &off);
      if (rc == -ENOSPC) {
        cr_assert_lt(gap, need, "op %d: -ENOSPC for %llu pages with a %llu-page gap", op,
                     (unsigned long long)need, (unsigned long long)gap);
        nospc++;
      } else {
        cr_assert_eq(rc, 0, "op %d: alloc %llu -> %d", op, (unsigned long long)len, rc);
        cr_assert_geq(gap, need);
        cr_assert_eq(off % PG, 0);
        cr_assert_geq(off, h->cache_off);
        cr_assert_leq(off + need * PG, h->cache_off + h->cache_size);
        for (size_t i = 0; i < n; i++)
          cr_assert(off + need * PG <= m[i].off || m[i].off + m[i].pages * PG <= off,
                    "op %d: overlap", op);
        cr_assert_eq(kvs_pool_extent_len(p, KVS_ARENA_CACHE, off), (int64_t)(need * PG));
        cr_assert_lt(n, KVS__ARRAY_LEN(m));
        m[n] = (model_ext_t){off, need, (uint8_t)(op | 1)};
        memset(base + off, m[n].tag, need * PG); /* writable, and unpoisoned under ASan */
        n++;
        used += need;
        allocs++;
      }
    } else if (r < 95) { /* free a live extent */
      size_t i = rnd() % n;
      cr_assert_eq(base[m[i].off], m[i].tag, "op %d: extent contents clobbered", op);
      cr_assert_eq(base[m[i].off + m[i].pages * PG - 1], m[i].tag);
      cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, m[i].off), (int64_t)(m[i].pages * PG));
      used -= m[i].pages;
      m[i] = m[--n];
      frees++;
    } else { /* a bad free: inside a live extent, or a free page: nothing changes */
      kvs_pool_arena_stats_t before = stats_of(p, KVS_ARENA_CACHE);
      uint64_t off;
      size_t i = rnd() % n;
      if (m[i].pages > 1 && rnd() % 2)
        off = m[i].off + (1 + rnd() % (m[i].pages - 1)) * PG;
      else
        off = m[i].off + 1 + rnd() % (PG - 1); /* not page-aligned */
      cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off), -EINVAL, "op %d", op);
      kvs_pool_arena_stats_t after = stats_of(p, KVS_ARENA_CACHE);
      cr_assert(stats_eq(before, after));
      bad++;
    }
    kvs_pool_arena_stats_t s = stats_of(p, KVS_ARENA_CACHE);
    cr_assert_eq(s.allocated, used * PG, "op %d", op);
    cr_assert_eq(s.allocated + s.free, s.size);
    cr_assert_eq(s.extents, n);
    cr_assert_eq(s.largest_free, model_largest_gap(m, n, h->cache_off, npages) * PG, "op %d", op);
    cr_assert_eq(s.fragmentation_pct, s.free ? (s.free - s.largest_free) * 100 / s.free : 0);
    cr_assert(kvs__pool_is_valid(p), "op %d", op);
  }
  /* the run exercised every path */
  cr_expect_gt(nospc, 10);
  cr_expect_gt(allocs, 1000);
  cr_expect_gt(frees, 1000);
  cr_expect_gt(bad, 100);
  while (n) {
    cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, m[n - 1].off), (int64_t)(m[n - 1].pages * PG));
    n--;
  }
  kvs_pool_arena_stats_t s = stats_of(p, KVS_ARENA_CACHE);
  cr_expect_eq(s.free, s.size);
  cr_expect_eq(s.largest_free, s.size, "everything coalesced back into one range");
  cr_expect_eq(kvs_pool_destroy(p, false), 0);
}

Test(pool, exhaustion_then_free_makes_room, .timeout = 30) {
  kvs_pool_t *p = make_pool(64 * PG, 0);
  uint64_t offs[64];
  for (int i = 0; i < 64; i++) cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &offs[i]), 0);
  uint64_t off = 12345;
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 1, &off), -ENOSPC);
  cr_expect_eq(off, 12345);
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 65 * PG, &off), -ENOSPC);
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, UINT64_MAX, &off), -ENOSPC);
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 0, &off), -EINVAL);
  kvs_pool_arena_stats_t s = stats_of(p, KVS_ARENA_CACHE);
  cr_expect_eq(s.free, 0);
  cr_expect_eq(s.largest_free, 0);
  cr_expect_eq(s.fragmentation_pct, 0);
  /* free two non-adjacent pages: 2 pages free, but no 2-page range */
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, offs[10]), (int64_t)PG);
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, offs[20]), (int64_t)PG);
  s = stats_of(p, KVS_ARENA_CACHE);
  cr_expect_eq(s.free, 2 * PG);
  cr_expect_eq(s.largest_free, PG);
  cr_expect_eq(s.fragmentation_pct, 50);
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 2 * PG, &off), -ENOSPC);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &off), 0);
  cr_expect(off == offs[10] || off == offs[20]);
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, offs[11]), (int64_t)PG);
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off), (int64_t)PG); /* 10, 11, 20 free */
  cr_assert(kvs__pool_is_valid(p));
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 2 * PG, &off), 0); /* coalesced [10, 12) */
  cr_expect(kvs__pool_is_valid(p));
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
}

/* kvs_pool_room: usable less allocated, read without the mutex; exact with one thread, and a
 * request larger than it is refused. */
Test(pool, room_is_usable_less_allocated, .timeout = 30) {
  kvs_pool_t *p = make_pool(16 * PG, 4 * PG);
  cr_expect_eq(kvs_pool_room(p, KVS_ARENA_CACHE), 16 * PG);
  cr_expect_eq(kvs_pool_room(p, KVS_ARENA_HOST), 4 * PG);
  uint64_t a, b, h;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 3 * PG - 1, &a), 0); /* rounded: 3 pages */
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &b), 0);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_HOST, PG, &h), 0);
  cr_expect_eq(kvs_pool_room(p, KVS_ARENA_CACHE), 12 * PG);
  cr_expect_eq(kvs_pool_room(p, KVS_ARENA_HOST), 3 * PG);
  uint64_t off;
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 13 * PG, &off), -ENOSPC);
  /* the limit bounds it, and a limit below what is allocated leaves none */
  cr_assert_eq(kvs_pool_set_limit(p, 6 * PG), 0);
  cr_expect_eq(kvs_pool_room(p, KVS_ARENA_CACHE), 2 * PG);
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 3 * PG, &off), -ENOSPC);
  cr_assert_eq(kvs_pool_set_limit(p, 2 * PG), 0);
  cr_expect_eq(kvs_pool_room(p, KVS_ARENA_CACHE), 0);
  cr_assert_eq(kvs_pool_set_limit(p, 0), 0);
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, a), (int64_t)(3 * PG));
  cr_expect_eq(kvs_pool_room(p, KVS_ARENA_CACHE), 15 * PG);
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, b), (int64_t)PG);
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_HOST, h), (int64_t)PG);
  cr_expect_eq(kvs_pool_room(p, KVS_ARENA_CACHE), 16 * PG);
  cr_expect_eq(kvs_pool_room(NULL, KVS_ARENA_CACHE), 0);
  kvs_pool_t *q = NULL;
  cr_assert_eq(kvs_pool_attach(kvs_pool_fd(p), false, &q), 0);
  cr_expect_eq(kvs_pool_room(q, KVS_ARENA_CACHE), 0, "an attached pool allocates nothing");
  cr_expect_eq(kvs_pool_destroy(q, false), 0);
  cr_expect_eq(kvs_pool_destroy(p, false), 0);
}

Test(pool, coalescing_in_every_order, .timeout = 30) {
  static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  const uint64_t sizes[3] = {3, 1, 5}; /* pages */
  for (int o = 0; o < 6; o++) {
    kvs_pool_t *p = make_pool(9 * PG, 0); /* exactly the three extents */
    uint64_t off[3];
    for (int i = 0; i < 3; i++)
      cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, sizes[i] * PG, &off[i]), 0);
    cr_assert_eq(off[1], off[0] + 3 * PG);
    cr_assert_eq(off[2], off[1] + PG);
    uint64_t freed = 0;
    for (int k = 0; k < 3; k++) {
      int i = orders[o][k];
      cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off[i]), (int64_t)(sizes[i] * PG));
      freed += sizes[i];
      cr_assert(kvs__pool_is_valid(p), "order %d step %d", o, k);
      kvs_pool_arena_stats_t s = stats_of(p, KVS_ARENA_CACHE);
      cr_assert_eq(s.free, freed * PG);
    }
    kvs_pool_arena_stats_t s = stats_of(p, KVS_ARENA_CACHE);
    cr_expect_eq(s.largest_free, 9 * PG, "order %d: one range of the three sizes' sum", o);
    cr_expect_eq(s.fragmentation_pct, 0);
    uint64_t all;
    cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 9 * PG, &all), 0, "order %d", o);
    cr_expect_eq(all, off[0]);
    cr_expect_eq(kvs_pool_destroy(p, true), 0);
  }
  /* the same in the middle of an arena, with allocated neighbours on both sides */
  kvs_pool_t *p = make_pool(64 * PG, 0);
  uint64_t off[5];
  for (int i = 0; i < 5; i++) cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 7 * PG, &off[i]), 0);
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off[3]), (int64_t)(7 * PG));
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off[1]), (int64_t)(7 * PG));
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off[2]), (int64_t)(7 * PG));
  cr_assert(kvs__pool_is_valid(p));
  uint64_t big;
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 21 * PG, &big), 0);
  cr_expect_eq(big, off[1]);
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
}

Test(pool, full_arena_of_odd_size_can_be_allocated_whole, .timeout = 30) {
  /* 1000 pages is not a size-class boundary: the whole free range must still be found */
  kvs_pool_t *p = make_pool(1000 * PG, 0);
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 1000 * PG, &off), 0);
  cr_expect_eq(off, kvs_pool_header(p)->cache_off);
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off), (int64_t)(1000 * PG));
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 999 * PG + 1, &off), 0);
  cr_expect_eq(kvs_pool_extent_len(p, KVS_ARENA_CACHE, off), (int64_t)(1000 * PG));
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
}

Test(pool, a_fitting_range_behind_a_smaller_one_of_its_class_is_found, .timeout = 30) {
  /* 36 and 37 pages share a size class; the 36-page range is at the head of the list, the
   * 37-page one behind it, and nothing larger is free: a 37-page request must still succeed. */
  kvs_pool_t *p = make_pool(75 * PG, 0);
  uint64_t a, s1, b, s2;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 37 * PG, &a), 0);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &s1), 0);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 36 * PG, &b), 0);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &s2), 0);
  cr_assert_eq(stats_of(p, KVS_ARENA_CACHE).free, 0);
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, a), (int64_t)(37 * PG));
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, b), (int64_t)(36 * PG));
  uint64_t off;
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 38 * PG, &off), -ENOSPC);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 37 * PG, &off), 0);
  cr_expect_eq(off, a);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 36 * PG, &off), 0);
  cr_expect_eq(off, b);
  cr_expect(kvs__pool_is_valid(p));
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
}

Test(pool, bad_free_changes_nothing, .timeout = 30) {
  kvs_pool_t *p = make_pool(32 * PG, 8 * PG);
  uint64_t a, b;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 4 * PG, &a), 0);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 2 * PG, &b), 0);
  kvs_pool_arena_stats_t before = stats_of(p, KVS_ARENA_CACHE);
  const kvs_pool_header_t *h = kvs_pool_header(p);
  const uint64_t bad[] = {
      a + PG,                           /* inside an extent */
      a + 3 * PG,                       /* its last page */
      a + 1,                            /* not page-aligned */
      b + 2 * PG,                       /* the free range after b */
      0,                                /* the header */
      h->cache_off + h->cache_size,     /* past the arena (the host arena) */
      h->segment_size,                  /* past the segment */
      UINT64_MAX & ~(PG - 1),
  };
  for (size_t i = 0; i < KVS__ARRAY_LEN(bad); i++) {
    cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, bad[i]), -EINVAL, "case %zu", i);
    cr_expect_eq(kvs_pool_extent_len(p, KVS_ARENA_CACHE, bad[i]), -EINVAL, "case %zu", i);
  }
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_HOST, a), -EINVAL, "wrong arena");
  cr_expect_eq(kvs_pool_free(p, (kvs_arena_t)7, a), -EINVAL, "no such arena");
  kvs_pool_arena_stats_t after = stats_of(p, KVS_ARENA_CACHE);
  cr_expect(stats_eq(before, after));
  cr_expect(kvs__pool_is_valid(p));
  /* double free */
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, a), (int64_t)(4 * PG));
  before = stats_of(p, KVS_ARENA_CACHE);
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, a), -EINVAL);
  cr_expect_eq(kvs_pool_extent_len(p, KVS_ARENA_CACHE, a), -EINVAL);
  after = stats_of(p, KVS_ARENA_CACHE);
  cr_expect(stats_eq(before, after));
  /* b still intact and freeable */
  cr_expect_eq(kvs_pool_extent_len(p, KVS_ARENA_CACHE, b), (int64_t)(2 * PG));
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, b), (int64_t)(2 * PG));
  cr_expect(kvs__pool_is_valid(p));
  cr_expect_eq(kvs_pool_destroy(p, false), 0);
}

Test(pool, host_arena_is_independent, .timeout = 30) {
  kvs_pool_t *p = make_pool(16 * PG, 8 * PG);
  const kvs_pool_header_t *h = kvs_pool_header(p);
  uint64_t c, x;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 16 * PG, &c), 0); /* cache arena full */
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_HOST, 8 * PG, &x), 0);   /* host arena unaffected */
  cr_expect_eq(x, h->host_off);
  cr_expect_eq(kvs_pool_arena_of(p, c, 16 * PG), KVS_ARENA_CACHE);
  cr_expect_eq(kvs_pool_arena_of(p, x, 8 * PG), KVS_ARENA_HOST);
  cr_expect_eq(kvs_pool_arena_of(p, x + PG, 1), KVS_ARENA_HOST);
  cr_expect_eq(kvs_pool_arena_of(p, c, 17 * PG), -EINVAL, "straddles both arenas");
  cr_expect_eq(kvs_pool_arena_of(p, 0, 1), -EINVAL, "header");
  cr_expect_eq(kvs_pool_arena_of(p, h->segment_size, 0), -EINVAL);
  cr_expect_eq(kvs_pool_arena_of(p, UINT64_MAX, 2), -EINVAL);
  kvs_pool_arena_stats_t hs = stats_of(p, KVS_ARENA_HOST), cs = stats_of(p, KVS_ARENA_CACHE);
  cr_expect_eq(hs.size, 8 * PG);
  cr_expect_eq(hs.allocated, 8 * PG);
  cr_expect_eq(hs.extents, 1);
  cr_expect_eq(cs.allocated, 16 * PG);
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, x), -EINVAL, "host extent via cache arena");
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_HOST, c), -EINVAL, "cache extent via host arena");
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_HOST, x), (int64_t)(8 * PG));
  cs = stats_of(p, KVS_ARENA_CACHE);
  cr_expect_eq(cs.allocated, 16 * PG, "freeing host memory does not touch the cache arena");
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, c), (int64_t)(16 * PG));
  cr_expect(kvs__pool_is_valid(p));
  cr_expect_eq(kvs_pool_destroy(p, false), 0);
}

Test(pool, no_host_arena_when_host_size_is_zero, .timeout = 30) {
  kvs_pool_t *p = make_pool(4 * PG, 0);
  uint64_t off = 99;
  kvs_pool_arena_stats_t s;
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_HOST, PG, &off), -EINVAL);
  cr_expect_eq(off, 99);
  cr_expect_eq(kvs_pool_arena_stats(p, KVS_ARENA_HOST, &s), -EINVAL);
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_HOST, kvs_pool_header(p)->host_off), -EINVAL);
  cr_expect_eq(kvs_pool_header(p)->host_size, 0);
  cr_expect_eq(kvs_pool_segment_size(p), 5 * PG);
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &off), 0);
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
}

#if defined(KVSHIM_ASAN) || defined(__SANITIZE_ADDRESS__)
Test(pool, asan_poisons_free_extents, .timeout = 30) {
  kvs_pool_t *p = make_pool(8 * PG, 0);
  uint8_t *base = kvs_pool_base(p);
  const kvs_pool_header_t *h = kvs_pool_header(p);
  cr_expect(__asan_address_is_poisoned(base + h->cache_off));
  cr_expect_not(__asan_address_is_poisoned(base), "the header is never poisoned");
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 2 * PG, &off), 0);
  cr_expect_eq(__asan_region_is_poisoned(base + off, 2 * PG), NULL);
  cr_expect(__asan_address_is_poisoned(base + off + 2 * PG));
  cr_assert_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off), (int64_t)(2 * PG));
  cr_expect(__asan_address_is_poisoned(base + off));
  cr_expect(__asan_address_is_poisoned(base + off + 2 * PG - 1));
  int fd = kvs_pool_fd(p);
  kvs_pool_t *q = NULL;
  cr_assert_eq(kvs_pool_attach(fd, true, &q), 0);
  cr_expect_eq(__asan_region_is_poisoned(kvs_pool_base(q), kvs_pool_segment_size(q)), NULL,
               "attached pools never poison");
  kvs_pool_destroy(q, false);
  kvs_pool_destroy(p, false);

  /* a large arena is not poisoned (its shadow would cost 1/8 of it), and still allocates */
  kvs_pool_t *big = make_pool(8 * PG, 512u << 20);
  uint64_t hoff;
  cr_expect(__asan_address_is_poisoned(kvs_pool_base(big) + kvs_pool_header(big)->cache_off));
  cr_expect_not(__asan_address_is_poisoned(kvs_pool_base(big) + kvs_pool_header(big)->host_off));
  cr_assert_eq(kvs_pool_alloc(big, KVS_ARENA_HOST, PG, &hoff), 0);
  cr_expect_eq(kvs_pool_free(big, KVS_ARENA_HOST, hoff), (int64_t)PG);
  cr_expect_eq(kvs_pool_destroy(big, false), 0);
}
#endif

/* ---- threads --------------------------------------------------------------------------- */

/* t->obj: the pool; t->arg: the seed. Returns the failures seen. */
static int worker(tt_thread_t *t) {
  kvs_pool_t *pool = t->obj;
  const uint64_t seed = t->arg;
  int failures = 0;
  uint64_t live[32];
  int n = 0;
  uint64_t s = seed;
  uint8_t *base = kvs_pool_base(pool);
  for (int i = 0; i < 3000; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    if ((s >> 40) % 2 && n < 32) {
      uint64_t off;
      int rc = kvs_pool_alloc(pool, KVS_ARENA_CACHE, PG * (1 + (s >> 50) % 4), &off);
      if (rc == 0) {
        base[off] = (uint8_t)seed;
        live[n++] = off;
      } else if (rc != -ENOSPC) {
        failures++;
      }
    } else if (n) {
      uint64_t off = live[--n];
      if (base[off] != (uint8_t)seed) failures++; /* someone else got our extent */
      if (kvs_pool_free(pool, KVS_ARENA_CACHE, off) <= 0) failures++;
    }
  }
  while (n)
    if (kvs_pool_free(pool, KVS_ARENA_CACHE, live[--n]) <= 0) failures++;
  return failures;
}

Test(pool, concurrent_alloc_free, .timeout = 60) {
  kvs_pool_t *p = make_pool(128 * PG, 0);
  tt_thread_t t[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(tt_start(&t[i], worker, p, NULL, (uint64_t)(i + 1) * 0x1111), 0);
  for (int i = 0; i < 4; i++) {
    tt_join(&t[i]);
    cr_expect_eq(t[i].rc, 0, "worker %d", i);
  }
  kvs_pool_arena_stats_t s = stats_of(p, KVS_ARENA_CACHE);
  cr_expect_eq(s.allocated, 0);
  cr_expect_eq(s.largest_free, s.size);
  cr_expect(kvs__pool_is_valid(p));
  cr_expect_eq(kvs_pool_destroy(p, false), 0);
}

/* ---- another process ------------------------------------------------------------------- */

/* Child: attach the received fd read-write, check the parent's bytes, write its own. Exit code
 * says which step failed. */
static int child_main(int sock, uint64_t id, uint64_t off_in, uint64_t off_out) {
  char byte;
  size_t n;
  int fd = -1;
  if (recv_fd(sock, &fd, &byte, 1, &n) != 0) return 10;
  kvs_pool_t *q = NULL;
  if (kvs_pool_attach(fd, true, &q) != 0) return 11;
  close(fd);
  if (kvs_pool_header(q)->instance_id != id) return 12;
  const uint8_t *in = kvs_pool_base(q) + off_in;
  for (uint64_t i = 0; i < 2 * PG; i++)
    if (in[i] != (uint8_t)(i * 7)) return 13;
  memset(kvs_pool_base(q) + off_out, 0xc3, PG);
  uint64_t o;
  if (kvs_pool_alloc(q, KVS_ARENA_CACHE, PG, &o) != -EPERM) return 14;
  char ack = 'A';
  if (write(sock, &ack, 1) != 1) return 15;
  kvs_pool_destroy(q, false);
  return 0;
}

Test(pool, peer_process_shares_the_segment_over_scm_rights, .timeout = 30) {
  kvs_pool_t *p = make_pool(16 * PG, 0);
  uint64_t off_in, off_out;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 2 * PG, &off_in), 0);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &off_out), 0);
  uint8_t *base = kvs_pool_base(p);
  for (uint64_t i = 0; i < 2 * PG; i++) base[off_in + i] = (uint8_t)(i * 7);
  memset(base + off_out, 0, PG);
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  uint64_t id = kvs_pool_header(p)->instance_id;
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(sv[0]);
    _exit(child_main(sv[1], id, off_in, off_out));
  }
  close(sv[1]);
  cr_assert_eq(send_fd(sv[0], kvs_pool_fd(p), "F", 1), 0);
  char ack = 0;
  cr_expect_eq(read(sv[0], &ack, 1), 1);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "child died (status %d)", status);
  cr_assert_eq(WEXITSTATUS(status), 0, "child failed at step %d", WEXITSTATUS(status));
  for (uint64_t i = 0; i < PG; i++) cr_assert_eq(base[off_out + i], 0xc3, "byte %llu", (unsigned long long)i);
  close(sv[0]);
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
}

Test(pool, readonly_attach_faults_on_write, .signal = SIGSEGV, .timeout = 30) {
  kvs_pool_t *p = make_pool(4 * PG, 0);
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &off), 0);
  kvs_pool_base(p)[off] = 42;
  kvs_pool_t *q = NULL;
  cr_assert_eq(kvs_pool_attach(kvs_pool_fd(p), false, &q), 0);
  cr_assert_not(kvs_pool_is_writable(q));
  cr_assert_eq(kvs_pool_base(q)[off], 42, "reads work");
  /* Let the fault kill the process (ASan would otherwise turn it into a report and exit 1). */
  struct sigaction sa = {.sa_handler = SIG_DFL};
  sigaction(SIGSEGV, &sa, NULL);
  ((volatile uint8_t *)kvs_pool_base(q))[off] = 1;
  cr_assert_fail("a write to a read-only attached pool did not fault");
}

/* ---- destroy --------------------------------------------------------------------------- */

Test(pool, destroy_with_live_extents_is_busy, .timeout = 30) {
  kvs_pool_t *p = make_pool(8 * PG, 4 * PG);
  uint64_t c, h;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &c), 0);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_HOST, PG, &h), 0);
  cr_expect_eq(kvs_pool_destroy(p, false), -EBUSY);
  /* the pool is intact */
  cr_expect(kvs__pool_is_valid(p));
  kvs_pool_base(p)[c] = 1;
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, c), (int64_t)PG);
  cr_expect_eq(kvs_pool_destroy(p, false), -EBUSY, "host extent still live");
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_HOST, h), (int64_t)PG);
  cr_expect_eq(kvs_pool_destroy(p, false), 0);

  kvs_pool_t *q = make_pool(8 * PG, 0);
  cr_assert_eq(kvs_pool_alloc(q, KVS_ARENA_CACHE, PG, &c), 0);
  cr_expect_eq(kvs_pool_destroy(q, true), 0, "force");
}

/* ---- huge pages ------------------------------------------------------------------------ */

Test(pool, hugepages_or_fallback, .timeout = 30) {
  int log = log_capture(KVS_LOG_WARN);
  kvs_pool_config_t cfg = {.cache_size = 4u << 20, .host_size = 1, .hugepages = true};
  kvs_pool_t *p = NULL;
  cr_assert_eq(kvs_pool_create(&cfg, &p), 0);
  const kvs_pool_header_t *h = kvs_pool_header(p);
  uint64_t page = kvs_pool_page_size(p), off;
  if (h->flags & KVS_POOL_F_HUGEPAGES) {
    cr_expect_eq(page, 2u << 20);
    cr_expect_eq(h->host_size, 2u << 20, "rounded up to a huge page");
  } else {
    cr_expect_eq(page, PG);
    cr_expect_not_null(strstr(log_text(log), "huge pages unavailable"));
    cr_expect_eq(h->host_size, PG);
  }
  cr_expect_eq(h->page_size, page);
  cr_expect_eq(h->cache_off, page);
  cr_expect_eq(h->cache_size, 4u << 20);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 1, &off), 0);
  cr_expect_eq(off % page, 0);
  cr_expect_eq(kvs_pool_extent_len(p, KVS_ARENA_CACHE, off), (int64_t)page);
  memset(kvs_pool_base(p) + off, 0xab, page);
  cr_expect_eq(kvs_pool_prefault(p), 0);
  kvs_pool_t *q = NULL; /* a peer can map it whichever page size it got */
  cr_assert_eq(kvs_pool_attach(kvs_pool_fd(p), false, &q), 0);
  cr_expect_eq(kvs_pool_base(q)[off + page - 1], 0xab);
  kvs_pool_destroy(q, false);
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off), (int64_t)page);
  cr_expect(kvs__pool_is_valid(p));
  cr_expect_eq(kvs_pool_destroy(p, false), 0);
}

/* ---- prefault -------------------------------------------------------------------------- */


Test(pool, prefault_makes_the_cache_arena_resident, .timeout = 30) {
  kvs_pool_t *p = make_pool(8u << 20, 8u << 20);
  const kvs_pool_header_t *h = kvs_pool_header(p);
  uint8_t *cache = kvs_pool_base(p) + h->cache_off;
  size_t npages = h->cache_size / PG;
  size_t before = resident_pages(cache, h->cache_size);
  cr_expect_lt(before, npages / 2, "a fresh segment is not resident (%zu pages)", before);
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 3 * PG, &off), 0);
  memset(kvs_pool_base(p) + off, 0x77, 3 * PG);
  cr_expect_eq(kvs_pool_prefault(p), 0);
  cr_expect_eq(resident_pages(cache, h->cache_size), npages);
  cr_expect_eq(kvs_pool_base(p)[off + PG], 0x77, "prefault keeps contents");
  cr_expect_lt(resident_pages(kvs_pool_base(p) + h->host_off, h->host_size), h->host_size / PG / 2,
               "the host arena stays lazily backed");
  cr_expect(kvs__pool_is_valid(p));
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
}

/* kvs_pool_cancel_prefault: every prefault after it returns -ECANCELED and faults nothing in,
 * while the pool stays usable (kvshim serve cancels, joins its prefault thread, then destroys:
 * a thread that had not yet started must not find the pool freed). */
Test(pool, cancelled_prefault_does_nothing_and_the_pool_stays_usable, .timeout = 30) {
  kvs_pool_t *p = make_pool(8u << 20, 8u << 20);
  const kvs_pool_header_t *h = kvs_pool_header(p);
  uint8_t *cache = kvs_pool_base(p) + h->cache_off;
  kvs_pool_cancel_prefault(p);
  kvs_pool_cancel_prefault(p); /* twice: no harm */
  cr_expect_eq(kvs_pool_prefault(p), -ECANCELED);
  cr_expect_lt(resident_pages(cache, h->cache_size), h->cache_size / PG / 2,
               "a cancelled prefault faulted pages in");
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 2 * PG, &off), 0);
  memset(kvs_pool_base(p) + off, 0x5a, 2 * PG);
  cr_expect_eq(kvs_pool_base(p)[off + PG], 0x5a);
  cr_expect(kvs__pool_is_valid(p));
  kvs_pool_cancel_prefault(NULL); /* NULL: nothing */
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
}

static int prefault_thread(tt_thread_t *t) { return kvs_pool_prefault(t->obj); }

Test(pool, prefault_in_background_while_allocating, .timeout = 30) {
  kvs_pool_t *p = make_pool(64u << 20, 0);
  tt_thread_t t;
  cr_assert_eq(tt_start(&t, prefault_thread, p, NULL, 0), 0);
  uint8_t *base = kvs_pool_base(p);
  for (int i = 0; i < 200; i++) {
    uint64_t off;
    cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 64 * 1024, &off), 0);
    memset(base + off, (uint8_t)i, 64 * 1024);
    cr_assert_eq(base[off + 64 * 1024 - 1], (uint8_t)i);
    if (i % 2) cr_assert_gt(kvs_pool_free(p, KVS_ARENA_CACHE, off), 0);
  }
  tt_join(&t);
  cr_expect_eq(t.rc, 0);
  cr_expect(kvs__pool_is_valid(p));
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
}

Test(pool, destroy_cancels_a_running_prefault, .timeout = 30) {
  kvs_pool_t *p = make_pool(1u << 30, 0);
  const kvs_pool_header_t *h = kvs_pool_header(p);
  uint8_t *cache = kvs_pool_base(p) + h->cache_off;
  tt_thread_t t;
  cr_assert_eq(tt_start(&t, prefault_thread, p, NULL, 0), 0);
  /* wait until it is under way: its first piece is resident */
  for (int i = 0; i < 10000 && resident_pages(cache, 1u << 20) == 0; i++) usleep(100);
  cr_expect_eq(kvs_pool_destroy(p, false), 0); /* waits for the prefault to stop */
  /* destroy returned, so the prefault has returned its result */
  cr_expect_eq(__atomic_load_n(&t.rc, __ATOMIC_SEQ_CST), -ECANCELED);
  tt_join(&t);
  cr_expect_eq(t.rc, -ECANCELED);
}

/* ---- named pools ----------------------------------------------------------------------- */

Test(pool, named_pool_lives_in_dev_shm_until_destroy, .timeout = 30) {
  char name[64], path[96];
  snprintf(name, sizeof name, "/kvshim-test-pool-%ld", (long)getpid());
  snprintf(path, sizeof path, "/dev/shm%s", name);
  shm_unlink(name);
  kvs_pool_config_t cfg = {.cache_size = 8 * PG, .host_size = 2 * PG, .name = name};
  kvs_pool_t *p = NULL;
  cr_assert_eq(kvs_pool_create(&cfg, &p), 0);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0, "%s exists", path);
  cr_expect_eq(st.st_mode & 0777, 0600);
  cr_expect_eq((uint64_t)st.st_size, kvs_pool_segment_size(p));
  kvs_pool_t *dup_pool = NULL;
  cr_expect_eq(kvs_pool_create(&cfg, &dup_pool), -EEXIST, "the name is taken");
  cr_expect_null(dup_pool);
  cr_assert_eq(stat(path, &st), 0, "a failed create does not unlink the live pool's name");
  /* a tool attaches by name */
  int fd = shm_open(name, O_RDONLY, 0);
  cr_assert_geq(fd, 0);
  kvs_pool_t *q = NULL;
  cr_assert_eq(kvs_pool_attach(fd, false, &q), 0);
  close(fd);
  cr_expect_eq(kvs_pool_header(q)->instance_id, kvs_pool_header(p)->instance_id);
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &off), 0);
  kvs_pool_base(p)[off] = 9;
  cr_expect_eq(kvs_pool_base(q)[off], 9);
  cr_expect_eq(kvs_pool_destroy(q, false), 0);
  cr_expect_eq(kvs_pool_destroy(p, false), -EBUSY);
  cr_expect_eq(stat(path, &st), 0, "a busy destroy keeps the name");
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, off), (int64_t)PG);
  cr_expect_eq(kvs_pool_destroy(p, false), 0);
  cr_expect_eq(stat(path, &st), -1);
  cr_expect_eq(errno, ENOENT, "%s is gone after destroy", path);
}
