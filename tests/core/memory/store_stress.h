/* store_stress.h: what the store stress programs (test_store_stress, test_store_shards) share:
 * the pool and store they run on, and the start of their worker threads. Plain C, no Criterion
 * (the TSan leg runs them): include after ../../lib/stress.h, whose CHECK ends the program. */
#ifndef KVSHIM_TESTS_STORE_STRESS_H
#define KVSHIM_TESTS_STORE_STRESS_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "pool.h"
#include "store.h"

/* A pool whose cache arena is cache_bytes and a store of `shards` shards over it (lease_ms and
 * shards 0: the defaults), counting into *stats. Returns the store's arena bytes. */
static uint64_t ss_open(uint64_t cache_bytes, uint32_t lease_ms, uint32_t shards,
                        kvs_stats_t *stats, kvs_pool_t **pool, kvs_store_t **st) {
  kvs_pool_config_t pc = {0};
  pc.cache_size = cache_bytes;
  CHECK(kvs_pool_create(&pc, pool) == 0, "pool_create");
  kvs_stats_init(stats);
  kvs_store_config_t cfg = {0};
  cfg.pool = *pool;
  cfg.lease_ms = lease_ms;
  cfg.stats = stats;
  cfg.shards = shards;
  CHECK(kvs_store_create(&cfg, st) == 0, "store_create");
  kvs_store_info_t in;
  kvs_store_info(*st, &in);
  return in.arena_bytes;
}

/* What every worker has, first in its struct: its index, its generator (a distinct non-zero
 * seed each) and its own owner of the store. */
typedef struct ss_worker {
  int id;
  uint64_t rng;
  kvs_owner_t owner;
} ss_worker_t;

/* Zeroes the n workers of `size` bytes each at `workers`, sets up each one's ss_worker_t (the
 * seeds differ with salt), then starts fn on each; the caller joins th[0 .. n). */
static void ss_start(kvs_store_t *st, void *workers, size_t size, int n, uint64_t salt,
                     void *(*fn)(void *), pthread_t *th) {
  for (int i = 0; i < n; i++) {
    ss_worker_t *w = (ss_worker_t *)((char *)workers + (size_t)i * size);
    memset(w, 0, size);
    w->id = i;
    w->rng = 0x9e3779b97f4a7c15ull * ((uint64_t)i + salt) ^ 0xd1b54a32d192ed03ull;
    CHECK(kvs_store_owner_open(st, &w->owner) == 0, "owner_open");
  }
  for (int i = 0; i < n; i++)
    CHECK(pthread_create(&th[i], NULL, fn, (char *)workers + (size_t)i * size) == 0,
          "pthread_create");
}

#endif
