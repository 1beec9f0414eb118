/* Unit tests for a "large" core/memory/store (tables of 64 MiB and more, core/memory/store.c): such a store
 * prefetches the next victims' records at each eviction (reading the next victim's bucket) and
 * the keys' buckets before taking the lock. Prefetching must not change what is evicted: these
 * tests run a full cache of such a store against a model of its LRU order (store.h:
 * "evicts READY unpinned objects in LRU order (least recently committed or looked up first)")
 * with aliases (a victim's keys all die with it) and pins (a pinned object leaves the LRU). */
#include <criterion/criterion.h>
#include <string.h>

#include "internal.h"
#include "pool.h"
#include "store.h"
#include "storefix.h"

#define T_TIMEOUT .timeout = 120
#define PAGES 2048u       /* cache arena of 8 MiB: 2048 objects of one page */
#define MAX_KEYS (1u << 21) /* 2M key entries of 32 bytes: tables of more than 64 MiB */
#define STEPS 6000u

static kvs_pool_t *pool;
static kvs_store_t *st;
static kvs_stats_t stats;

#define VALID() cr_assert(kvs__store_is_valid(st), "store invariants broken")

static kvs_key_t K(uint64_t i) { return (kvs_key_t){i, 0x1a76e}; }
static kvs_key_t ALIAS(uint64_t i) { return (kvs_key_t){i, 0xa11a5}; }

static void setup(void) {
  kvs_pool_config_t pc = {0};
  pc.cache_size = (uint64_t)PAGES * 4096;
  cr_assert_eq(kvs_pool_create(&pc, &pool), 0);
  cr_assert_eq(kvs_pool_page_size(pool), 4096);
  kvs_stats_init(&stats);
  kvs_store_config_t c = {0};
  c.pool = pool;
  c.stats = &stats;
  c.max_keys = MAX_KEYS;
  c.shards = 1; /* one LRU: the model's exact order (shards order per shard, design §4.4) */
  cr_assert_eq(kvs_store_create(&c, &st), 0);
}

static void teardown(void) { storefix_close(&st, &pool); }

static bool ready(kvs_key_t k) {
  int r = kvs_store_lookup(st, KVS_OWNER_LOCAL, &k, 1, false, NULL);
  cr_assert_geq(r, 0);
  return r == 1;
}

/* Put object i (one page): key K(i), and alias ALIAS(i) when i % 3 == 0. */
static void put(uint64_t i) {
  kvs_key_t keys[2] = {K(i), ALIAS(i)};
  kvs_layout_t l = kvs_layout_blob(4096);
  uint8_t oc = 0xff;
  kvs_extent_t e;
  kvs_xfer_t x = 0;
  int r = kvs_store_reserve_object(st, KVS_OWNER_LOCAL, keys, i % 3 == 0 ? 2 : 1, &l, 0, &oc,
                                   &e, &x);
  cr_assert_eq(r, 1, "object %llu: %d, outcome %s", (unsigned long long)i, r,
               kvs_reserve_outcome_name(oc));
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
}

/* The model: object numbers in LRU order, least recently used first. */
static uint64_t order[PAGES];

static void model_touch(uint32_t pos) {
  uint64_t v = order[pos];
  memmove(&order[pos], &order[pos + 1], (PAGES - 1 - pos) * sizeof order[0]);
  order[PAGES - 1] = v;
}

TestSuite(store_large, .init = setup, .fini = teardown);

Test(store_large, full_cache_evicts_in_lru_order, T_TIMEOUT) {
  for (uint64_t i = 0; i < PAGES; i++) {
    put(i);
    order[i] = i;
  }
  VALID();
  uint64_t next = PAGES, x = 0x2545f4914f6cdd1dull;
  for (uint32_t step = 0; step < STEPS; step++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    if (x % 4 == 0) { /* a use: pin (by the alias when it has one) and release -> LRU tail */
      uint32_t pos = (uint32_t)(x >> 8) % PAGES;
      uint64_t o = order[pos];
      kvs_key_t k = o % 3 == 0 && (x & 16) ? ALIAS(o) : K(o);
      kvs_xfer_t rx;
      cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &k, 1, true, &rx), 1);
      cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, rx), 0);
      model_touch(pos);
    } else { /* a new object: evicts the least recently used one, with all its keys */
      uint64_t victim = order[0], second = order[1];
      put(next);
      cr_assert(!ready(K(victim)), "step %u: object %llu should have been evicted", step,
                (unsigned long long)victim);
      if (victim % 3 == 0) cr_assert(!ready(ALIAS(victim)), "an alias outlived its object");
      cr_assert(ready(K(second)), "step %u: object %llu was evicted out of LRU order", step,
                (unsigned long long)second);
      memmove(&order[0], &order[1], (PAGES - 1) * sizeof order[0]);
      order[PAGES - 1] = next++;
    }
    if (step % 64 == 0) VALID();
  }
  for (uint32_t pos = 0; pos < PAGES; pos++) { /* every object of the model is there */
    cr_assert(ready(K(order[pos])));
    if (order[pos] % 3 == 0) cr_assert(ready(ALIAS(order[pos])));
  }
  cr_assert_eq(kvs_stats_get(&stats, KVS_STAT_store_evictions), next - PAGES);
}

Test(store_large, pinned_objects_are_skipped, T_TIMEOUT) {
  for (uint64_t i = 0; i < PAGES; i++) put(i);
  /* Pin the 8 least recently used objects: the next evictions must pass over them. */
  kvs_xfer_t rx[8];
  for (uint64_t i = 0; i < 8; i++) {
    kvs_key_t k = K(i);
    cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &k, 1, true, &rx[i]), 1);
  }
  for (uint64_t i = 0; i < 16; i++) put(PAGES + i); /* evicts objects 8..23 */
  for (uint64_t i = 0; i < 8; i++) cr_assert(ready(K(i)), "a pinned object was evicted");
  for (uint64_t i = 8; i < 24; i++) cr_assert(!ready(K(i)));
  cr_assert(ready(K(24)));
  VALID();
  for (uint64_t i = 0; i < 8; i++) cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, rx[i]), 0);
  VALID();
}
