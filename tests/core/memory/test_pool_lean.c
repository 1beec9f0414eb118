/* core/memory/pool: the lean engine pool (issue 13, design §5): the usable-size limit of the cache
 * arena (kvs_pool_set_limit) and the step-ahead prefault (kvs_pool_prefault_ahead). */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "pool.h"
#include "residency.h"
#include "../../lib/threads.h"

#define MIB (1ull << 20)

static kvs_pool_t *make_pool(uint64_t cache) {
  kvs_pool_config_t cfg = {.cache_size = cache};
  kvs_pool_t *p = NULL;
  cr_assert_eq(kvs_pool_create(&cfg, &p), 0);
  return p;
}


Test(pool_lean, limit_bounds_the_allocated_bytes) {
  kvs_pool_t *p = make_pool(16 * MIB);
  cr_expect_eq(kvs_pool_limit(p), 16 * MIB, "unlimited: the arena size");
  cr_assert_eq(kvs_pool_set_limit(p, MIB - 100), 0);
  cr_expect_eq(kvs_pool_limit(p), MIB, "rounded up to the page size");
  uint64_t a, b, c;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, MIB / 2, &a), 0);
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, MIB / 2, &b), 0);
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &c), -ENOSPC, "past the limit");
  cr_expect_eq(kvs_pool_free(p, KVS_ARENA_CACHE, a), (int64_t)(MIB / 2));
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &c), 0, "room again after a free");
  /* lowered below what is allocated: nothing is freed, later allocations wait for frees */
  cr_assert_eq(kvs_pool_set_limit(p, PG), 0);
  uint64_t d;
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, PG, &d), -ENOSPC);
  cr_expect_eq(kvs_pool_extent_len(p, KVS_ARENA_CACHE, b), (int64_t)(MIB / 2), "b is intact");
  /* 0 (or the arena size or more): the whole arena */
  cr_assert_eq(kvs_pool_set_limit(p, 0), 0);
  cr_expect_eq(kvs_pool_limit(p), 16 * MIB);
  cr_expect_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 8 * MIB, &d), 0);
  cr_expect(kvs__pool_is_valid(p));
  /* an attached pool has no allocator */
  kvs_pool_t *q = NULL;
  cr_assert_eq(kvs_pool_attach(kvs_pool_fd(p), true, &q), 0);
  cr_expect_eq(kvs_pool_set_limit(q, MIB), -EPERM);
  cr_expect_eq(kvs_pool_limit(q), 0);
  cr_expect_eq(kvs_pool_prefault_ahead(q, MIB), -EINVAL);
  kvs_pool_destroy(q, false);
  kvs_pool_destroy(p, true);
}

/* t->obj: the pool; t->arg: how far ahead (bytes). */
static int ahead_thread(tt_thread_t *t) { return kvs_pool_prefault_ahead(t->obj, t->arg); }

/* Polls (bounded) until the step-ahead prefault has faulted in `want` bytes. */
static void wait_prefaulted(kvs_pool_t *p, uint64_t want) {
  for (int i = 0; i < 20000 && kvs_pool_prefaulted(p) < want; i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  cr_assert_geq(kvs_pool_prefaulted(p), want, "prefaulted %llu, want %llu",
                (unsigned long long)kvs_pool_prefaulted(p), (unsigned long long)want);
}

Test(pool_lean, prefault_ahead_follows_the_high_water_mark, .timeout = 60) {
  kvs_pool_t *p = make_pool(64 * MIB);
  const kvs_pool_header_t *h = kvs_pool_header(p);
  uint8_t *cache = kvs_pool_base(p) + h->cache_off;
  tt_thread_t t;
  cr_assert_eq(tt_start(&t, ahead_thread, p, NULL, 4 * MIB), 0);
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, MIB, &off), 0);
  memset(kvs_pool_base(p) + off, 0x5a, MIB);
  wait_prefaulted(p, 5 * MIB);
  cr_expect_eq(kvs_pool_prefaulted(p), 5 * MIB, "one step past the mark, not more");
  /* the rest of the arena is left alone (not resident: nobody touched it) */
  size_t rest = resident_pages(cache + 8 * MIB, 56 * MIB);
  cr_expect_lt(rest, (56 * MIB / PG) / 8, "%zu pages past the step are resident", rest);
  /* the mark moves: so does the prefault */
  uint64_t off2;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 10 * MIB, &off2), 0);
  wait_prefaulted(p, 15 * MIB);
  cr_expect_eq(resident_pages(cache, 15 * MIB), 15 * MIB / PG);
  cr_expect_eq(kvs_pool_base(p)[off + 100], 0x5a, "contents kept");
  /* destroy cancels it */
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
  tt_join(&t);
  cr_expect_eq(t.rc, -ECANCELED);
}

Test(pool_lean, prefault_ahead_ends_at_the_arena_end, .timeout = 60) {
  kvs_pool_t *p = make_pool(8 * MIB);
  tt_thread_t t;
  cr_assert_eq(tt_start(&t, ahead_thread, p, NULL, 4 * MIB), 0);
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(p, KVS_ARENA_CACHE, 6 * MIB, &off), 0);
  tt_join(&t);
  cr_expect_eq(t.rc, 0, "the whole arena is faulted in: done");
  cr_expect_eq(kvs_pool_prefaulted(p), 8 * MIB);
  cr_expect_eq(kvs_pool_destroy(p, true), 0);
}
