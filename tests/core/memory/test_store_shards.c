/* The capacity account of a sharded store under concurrent inserts (a plain program, so the
 * TSan leg runs it; design §4.4: per-shard locks and LRU, one exact account).
 *
 * THREADS workers, each its own owner (so its own domain), reserve batches of new keys of
 * 1..6 pages (some as objects with aliases, which land in other shards), commit or abort
 * them, and pin and release what they find, on a small full pool of SHARDS shards: every
 * reservation evicts, within its shard or across shards.
 *
 * Over-commit shows as two live holders of one page. Every page of the segment has a writer
 * (the worker holding it in a WRITING extent, between reserve and commit/abort) and a reader
 * count (workers holding it pinned, between lookup and release). A worker claims its pages
 * right after the store hands them out and checks the other side after claiming (sequentially
 * consistent, so of two overlapping holders at least one sees the other): a reserved page
 * already written or pinned, or a pinned page being written, fails the test. The bytes held in
 * WRITING extents at once must never exceed the arena, and kvs_store_info's used + reserved +
 * free must always equal it. At the end every lease is over: the invariants hold, the gauges
 * equal info's totals, the pool's free bytes equal the store's, and removing every key leaves
 * the arena entirely free. Exit 0 on success; non-zero with a message. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool.h"
#include "store.h"
#define STRESS_NAME "test_store_shards"
#include "../../lib/stress.h"
#include "store_stress.h"

#define THREADS 4
#define SHARDS 8
#define OPS_PER_THREAD 4000
#define POOL_PAGES 128
#define KEYSPACE 1024
#define MAX_BATCH 3
#define MAX_PAGE_INDEX 65536 /* segment offset / page: the segment is well under 256 MiB */
#define PG 4096u
#define KEY_HI 0x5348415244ull
#define ALIAS_BIT (1ull << 62)

static kvs_pool_t *pool;
static kvs_store_t *st;
static uint64_t arena;
static uint32_t writer[MAX_PAGE_INDEX];  /* worker id + 1 holding the page in a WRITING extent */
static uint32_t readers[MAX_PAGE_INDEX]; /* workers holding the page pinned */
static uint64_t writing_bytes;           /* bytes of WRITING extents the workers hold now */

static kvs_key_t key_of(uint32_t i) { return (kvs_key_t){i, KEY_HI}; }

static uint32_t page_index(uint64_t off) {
  uint64_t p = off / PG;
  CHECK(p < MAX_PAGE_INDEX, "extent at %" PRIu64 " beyond the test's page map", off);
  return (uint32_t)p;
}

static uint64_t pages_of(kvs_extent_t e) { return (e.length + PG - 1) / PG; }

/* Take the pages of a freshly reserved extent: nobody may hold any of them. */
static void claim_write(int id, kvs_extent_t e) {
  CHECK(kvs_pool_arena_of(pool, e.offset, e.length) == KVS_ARENA_CACHE, "extent outside arena");
  uint64_t bytes = pages_of(e) * PG;
  uint64_t now = __atomic_add_fetch(&writing_bytes, bytes, __ATOMIC_SEQ_CST);
  CHECK(now <= arena, "WRITING extents hold %" PRIu64 " bytes, arena %" PRIu64, now, arena);
  for (uint64_t i = 0, p = page_index(e.offset); i < pages_of(e); i++, p++) {
    uint32_t old = __atomic_exchange_n(&writer[p], (uint32_t)id + 1, __ATOMIC_SEQ_CST);
    CHECK(old == 0, "page %" PRIu64 " reserved twice (worker %u still writes it)", p, old - 1);
    uint32_t r = __atomic_load_n(&readers[p], __ATOMIC_SEQ_CST);
    CHECK(r == 0, "page %" PRIu64 " reserved while %u reader(s) hold it pinned", p, r);
  }
}

static void drop_write(kvs_extent_t e) {
  for (uint64_t i = 0, p = page_index(e.offset); i < pages_of(e); i++, p++)
    __atomic_store_n(&writer[p], 0, __ATOMIC_SEQ_CST);
  __atomic_sub_fetch(&writing_bytes, pages_of(e) * PG, __ATOMIC_SEQ_CST);
}

static void claim_read(kvs_extent_t e, int delta) {
  for (uint64_t i = 0, p = page_index(e.offset); i < pages_of(e); i++, p++) {
    __atomic_add_fetch(&readers[p], (uint32_t)delta, __ATOMIC_SEQ_CST);
    if (delta > 0) {
      uint32_t w = __atomic_load_n(&writer[p], __ATOMIC_SEQ_CST);
      CHECK(w == 0, "page %" PRIu64 " pinned while worker %u writes it", p, w - 1);
    }
  }
}

static void check_account(void) {
  kvs_store_info_t in;
  kvs_store_info(st, &in);
  CHECK(in.arena_bytes == arena, "arena changed");
  CHECK(in.used_bytes + in.reserved_bytes <= arena, "used %" PRIu64 " + reserved %" PRIu64
        " > arena %" PRIu64, in.used_bytes, in.reserved_bytes, arena);
  CHECK(in.used_bytes + in.reserved_bytes + in.free_bytes == arena, "used+reserved+free != arena");
}

typedef struct worker {
  ss_worker_t base; /* first: ss_start sets it up */
  uint64_t reserved, aliased, present, no_space, pinned;
} worker_t;

static void op_reserve(worker_t *w) {
  kvs_layout_t lay = kvs_layout_blob((uint64_t)(1 + below(&w->base.rng, 6)) * PG - below(&w->base.rng, 64));
  kvs_extent_t ex[MAX_BATCH];
  uint8_t oc[MAX_BATCH];
  kvs_xfer_t x = 0;
  size_t n;
  if (below(&w->base.rng, 4) == 0) { /* an object with aliases: other shards' buckets */
    kvs_key_t keys[3];
    uint32_t k = below(&w->base.rng, KEYSPACE);
    keys[0] = key_of(k);
    keys[1] = (kvs_key_t){k | ALIAS_BIT, KEY_HI};
    keys[2] = (kvs_key_t){k | ALIAS_BIT | (1ull << 61), KEY_HI};
    int r = kvs_store_reserve_object(st, w->base.owner, keys, 3, &lay, 0, &oc[0], &ex[0], &x);
    CHECK(r == 0 || r == 1, "reserve_object: %d", r);
    n = 1;
    w->aliased += (uint64_t)r;
  } else {
    kvs_key_t keys[MAX_BATCH];
    n = 1 + below(&w->base.rng, MAX_BATCH);
    for (size_t i = 0; i < n; i++) keys[i] = key_of(below(&w->base.rng, KEYSPACE));
    int r = kvs_store_reserve_write(st, w->base.owner, keys, n, &lay, 0, oc, ex, &x);
    CHECK(r >= 0, "reserve_write: %d", r);
  }
  for (size_t i = 0; i < n; i++) {
    if (oc[i] == KVS_RES_RESERVED) claim_write(w->base.id, ex[i]), w->reserved++;
    else if (oc[i] == KVS_RES_PRESENT) w->present++;
    else if (oc[i] == KVS_RES_NO_SPACE) w->no_space++;
    else CHECK(oc[i] == KVS_RES_BUSY, "outcome %s", kvs_reserve_outcome_name(oc[i]));
  }
  if (!x) return;
  check_account();
  for (size_t i = 0; i < n; i++)
    if (oc[i] == KVS_RES_RESERVED) drop_write(ex[i]);
  int rc = below(&w->base.rng, 8) == 0 ? kvs_store_abort(st, w->base.owner, x)
                                   : kvs_store_commit(st, w->base.owner, x);
  CHECK(rc == 0, "commit/abort: %d", rc);
}

static void op_lookup(worker_t *w) {
  kvs_key_t keys[MAX_BATCH];
  size_t n = 1 + below(&w->base.rng, MAX_BATCH);
  for (size_t i = 0; i < n; i++) {
    uint32_t k = below(&w->base.rng, KEYSPACE);
    keys[i] = below(&w->base.rng, 3) ? key_of(k) : (kvs_key_t){k | ALIAS_BIT, KEY_HI};
  }
  kvs_xfer_t x = 0;
  int r = kvs_store_lookup(st, w->base.owner, keys, n, true, &x);
  CHECK(r >= 0 && (size_t)r <= n, "lookup: %d", r);
  if (r == 0) return;
  kvs_object_view_t v[MAX_BATCH];
  CHECK(kvs_store_read_pinned(st, w->base.owner, x, v, MAX_BATCH) == r, "read_pinned");
  for (int i = 0; i < r; i++) claim_read(v[i].extent, 1);
  w->pinned += (uint64_t)r;
  for (int i = 0; i < r; i++) claim_read(v[i].extent, -1);
  CHECK(kvs_store_release(st, w->base.owner, x) == 0, "release");
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  for (int op = 0; op < OPS_PER_THREAD; op++) {
    if (below(&w->base.rng, 100) < 60) op_reserve(w);
    else op_lookup(w);
  }
  return NULL;
}

int main(void) {
  kvs_stats_t stats;
  arena = ss_open((uint64_t)POOL_PAGES * PG, 0, SHARDS, &stats, &pool, &st);
  CHECK(kvs_pool_page_size(pool) == PG, "page size");
  kvs_store_info_t in;
  CHECK(arena == (uint64_t)POOL_PAGES * PG, "arena %" PRIu64, arena);

  pthread_t th[THREADS];
  worker_t w[THREADS];
  ss_start(st, w, sizeof w[0], THREADS, 7, worker_main, th);
  uint64_t reserved = 0, aliased = 0, present = 0, no_space = 0, pinned = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    reserved += w[i].reserved, aliased += w[i].aliased, present += w[i].present;
    no_space += w[i].no_space, pinned += w[i].pinned;
  }
  CHECK(kvs__store_is_valid(st), "store invariants broken after the run");
  kvs_store_info(st, &in);
  kvs_pool_arena_stats_t ps;
  CHECK(kvs_pool_arena_stats(pool, KVS_ARENA_CACHE, &ps) == 0, "arena stats");
  CHECK(in.reserved_bytes == 0 && in.pins == 0 && in.xfers == 0, "leases left");
  CHECK(in.free_bytes == ps.free, "store free %" PRIu64 " != pool free %" PRIu64, in.free_bytes,
        ps.free);
  CHECK(kvs_stats_get(&stats, KVS_STAT_store_used_bytes) == in.used_bytes &&
            kvs_stats_get(&stats, KVS_STAT_store_free_bytes) == in.free_bytes &&
            kvs_stats_get(&stats, KVS_STAT_store_reserved_bytes) == 0 &&
            kvs_stats_get(&stats, KVS_STAT_store_objects) == in.objects_ready &&
            kvs_stats_get(&stats, KVS_STAT_store_keys) == in.keys &&
            kvs_stats_get(&stats, KVS_STAT_store_live_pins) == 0,
        "gauges differ from info");
  uint64_t evictions = kvs_stats_get(&stats, KVS_STAT_store_evictions);
  CHECK(evictions > 0 && reserved > 0 && aliased > 0 && present > 0 && pinned > 0,
        "the mix did not fill the pool or reach every path");
  for (uint32_t i = 0; i < KEYSPACE; i++) {
    kvs_key_t k = key_of(i);
    int rc = kvs_store_remove(st, &k);
    CHECK(rc == 0 || rc == -ENOENT, "remove: %d", rc);
  }
  kvs_store_info(st, &in);
  CHECK(in.objects_ready == 0 && in.keys == 0 && in.free_bytes == arena, "objects left");
  CHECK(kvs__store_is_valid(st), "store invariants broken at the end");
  CHECK(kvs_store_destroy(st, false) == 0, "store_destroy");
  CHECK(kvs_pool_destroy(pool, false) == 0, "pool_destroy");
  printf("test_store_shards: ok: %d threads x %d ops on %d shards; reserved %" PRIu64
         " (objects with aliases %" PRIu64 ") present %" PRIu64 " no_space %" PRIu64
         " pinned %" PRIu64 " evictions %" PRIu64 "\n",
         THREADS, OPS_PER_THREAD, SHARDS, reserved, aliased, present, no_space, pinned,
         evictions);
  return 0;
}
