/* Store stress test (a plain program, so the TSan leg can run it without Criterion's runner).
 *
 * THREADS workers, each its own owner and its own deterministic PRNG, run a mix of reserve
 * (single keys, batches, objects with an alias), write, commit, abort, abandon, pinned lookup
 * + read + verify, release, remove, owner release and sweep over one shared key space on a
 * small pool, so BUSY, PRESENT, NO_SPACE and eviction all happen constantly.
 *
 * Every object's bytes are a pattern derived from its primary key, written by its writer
 * outside the store lock before commit. A reader verifies every word of every object it has
 * pinned, so an uncommitted, aborted, expired or recycled extent that became visible, or an
 * extent reused while pinned, shows up as a mismatch.
 *
 * Leases: lease_ms is long, so nothing expires by itself during the run. A "zombie" owner
 * takes leases before the workers start; one worker sweeps with a time that reaches exactly
 * those, mid-run, and checks the count. Each worker counts its own live leases, and
 * owner_release must end exactly that many. At the end a sweep past every deadline must end
 * exactly the leases the workers left, then every key is removed and the cache arena must be
 * entirely free with every invariant holding, and the gauges (moved by deltas from every
 * shard) equal kvs_store_info's totals. `--shards N` runs it on a store of N shards and
 * domains (design §4.4: aliases then live in other shards' buckets, transfers in the owners'
 * domains, evictions reach across shards). Exit 0 on success; non-zero with a message. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "pool.h"
#include "store.h"
#define STRESS_NAME "test_store_stress"
#include "../../lib/stress.h"
#include "store_stress.h"

#define THREADS 4
#define OPS_PER_THREAD 5000
#define KEYSPACE 64
#define POOL_PAGES 96
#define MAX_WORDS 2560 /* up to 10 KiB: objects of 1..3 pages */
#define MAX_BATCH 4
#define MAX_PENDING 6
#define ZOMBIE_LEASES 6
#define LEASE_MS 600000u
#define ALIAS_BIT (1ull << 63)
#define KEY_HI 0x5354524553535354ull

static kvs_pool_t *pool;
static kvs_store_t *st;
static uint8_t *pool_base;
static uint64_t zombie_created_ms;


static kvs_key_t key_of(uint32_t i) { return (kvs_key_t){i, KEY_HI}; }
static kvs_key_t alias_of(kvs_key_t k) { return (kvs_key_t){k.lo | ALIAS_BIT, k.hi}; }

static uint32_t pattern(kvs_key_t k, uint32_t j) {
  uint64_t h = ((k.lo & ~ALIAS_BIT) + 1) * 0x9e3779b97f4a7c15ull ^ k.hi ^ ((uint64_t)j << 32 | j);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  return (uint32_t)h;
}

static void write_pattern(kvs_key_t k, kvs_extent_t e) {
  CHECK(e.length % 4 == 0 && e.length > 0, "odd extent length %" PRIu64, e.length);
  CHECK(kvs_pool_arena_of(pool, e.offset, e.length) == KVS_ARENA_CACHE, "extent outside arena");
  uint32_t *w = (uint32_t *)(pool_base + e.offset);
  for (uint32_t j = 0; j < e.length / 4; j++) w[j] = pattern(k, j);
}

static void verify_view(const kvs_object_view_t *v, kvs_key_t asked) {
  CHECK(kvs_key_eq(v->key, asked), "view key is not the key looked up");
  CHECK(v->layout.dtype == KVS_DTYPE_F32 && v->layout.ndim == 1 &&
            v->layout.shape[0] * 4 == v->extent.length,
        "view layout does not match its extent");
  CHECK(kvs_pool_arena_of(pool, v->extent.offset, v->extent.length) == KVS_ARENA_CACHE,
        "view extent outside the cache arena");
  const uint32_t *w = (const uint32_t *)(pool_base + v->extent.offset);
  for (uint32_t j = 0; j < v->extent.length / 4; j++)
    CHECK(w[j] == pattern(asked, j),
          "key %" PRIx64 ": word %u is %08x, expected %08x (uncommitted or recycled bytes "
          "visible)", asked.lo, j, w[j], pattern(asked, j));
}

typedef struct lease {
  kvs_xfer_t x;
  int read;                 /* 1: read transfer (pins), 0: write transfer */
  size_t n;                 /* read: keys asked; write: keys reserved */
  kvs_key_t keys[MAX_BATCH];
} lease_t;

typedef struct worker {
  ss_worker_t base; /* first: ss_start sets it up */
  lease_t pending[MAX_PENDING];
  int npending;
  int abandoned;            /* live leases this worker no longer tracks */
  uint64_t reserved, present, busy, no_space, hits, verified, evicted_seen;
} worker_t;

static void check_pinned(worker_t *w, const lease_t *l) {
  kvs_object_view_t v[MAX_BATCH];
  int r = kvs_store_read_pinned(st, w->base.owner, l->x, v, MAX_BATCH);
  CHECK(r > 0 && (size_t)r <= l->n, "read_pinned returned %d for %zu keys", r, l->n);
  for (int i = 0; i < r; i++) verify_view(&v[i], l->keys[i]);
  w->verified += (uint64_t)r;
}

static void end_lease(worker_t *w, int idx, int how) {
  lease_t *l = &w->pending[idx];
  int rc;
  if (l->read) {
    check_pinned(w, l); /* still intact while pinned, however long it was held */
    rc = how ? kvs_store_release(st, w->base.owner, l->x) : kvs_store_abort(st, w->base.owner, l->x);
  } else {
    rc = how ? kvs_store_commit(st, w->base.owner, l->x) : kvs_store_abort(st, w->base.owner, l->x);
  }
  CHECK(rc == 0, "ending a lease the worker holds failed: %d", rc);
  w->pending[idx] = w->pending[--w->npending];
}

static void keep_or_end(worker_t *w, lease_t *l) {
  uint32_t c = below(&w->base.rng, 100);
  if (c < 6 && w->npending < MAX_PENDING) {
    w->pending[w->npending++] = *l; /* ended later */
  } else if (c < 8) {
    w->abandoned++; /* never ended by this worker: owner release or sweep must do it */
  } else {
    w->pending[w->npending++] = *l;
    end_lease(w, w->npending - 1, c >= 15); /* 7% abort, the rest commit / release */
  }
}

static void op_reserve(worker_t *w) {
  uint32_t words = 1 + below(&w->base.rng, MAX_WORDS);
  kvs_layout_t lay = {KVS_DTYPE_F32, 1, {words}};
  lease_t l = {0};
  uint8_t oc[MAX_BATCH];
  kvs_extent_t ex[MAX_BATCH];
  if (below(&w->base.rng, 4) == 0) { /* an object with an alias */
    kvs_key_t k[2];
    k[0] = key_of(below(&w->base.rng, KEYSPACE));
    k[1] = alias_of(k[0]);
    int r = kvs_store_reserve_object(st, w->base.owner, k, 2, &lay, 0, oc, ex, &l.x);
    CHECK(r == 0 || r == 1, "reserve_object: %d", r);
    CHECK((r == 1) == (oc[0] == KVS_RES_RESERVED) && (r == 1) == (l.x != 0), "outcome/xfer");
    if (r == 1) {
      CHECK(ex[0].length == 4ull * words, "extent length");
      write_pattern(k[0], ex[0]);
      l.n = 1;
      l.keys[0] = k[0];
    }
    w->reserved += oc[0] == KVS_RES_RESERVED;
    w->present += oc[0] == KVS_RES_PRESENT;
    w->busy += oc[0] == KVS_RES_BUSY;
    w->no_space += oc[0] == KVS_RES_NO_SPACE;
  } else {
    size_t n = 1 + below(&w->base.rng, MAX_BATCH);
    uint32_t first = below(&w->base.rng, KEYSPACE);
    kvs_key_t k[MAX_BATCH];
    for (size_t i = 0; i < n; i++) k[i] = key_of((first + (uint32_t)i) % KEYSPACE);
    uint32_t m = below(&w->base.rng, 10);
    unsigned mode = m == 0 ? KVS_RESERVE_ALL_OR_NOTHING : m == 1 ? KVS_RESERVE_NO_EVICT : 0;
    int r = kvs_store_reserve_write(st, w->base.owner, k, n, &lay, mode, oc, ex, &l.x);
    CHECK(r >= 0 && (size_t)r <= n, "reserve_write: %d", r);
    CHECK((r > 0) == (l.x != 0), "xfer iff something reserved");
    int count = 0;
    for (size_t i = 0; i < n; i++) {
      CHECK(oc[i] <= KVS_RES_NO_SPACE || oc[i] == KVS_RES_SKIPPED, "unexpected outcome %u", oc[i]);
      if (oc[i] == KVS_RES_RESERVED) {
        CHECK(ex[i].length == 4ull * words, "extent length");
        write_pattern(k[i], ex[i]);
        l.keys[l.n++] = k[i];
        count++;
      }
      w->reserved += oc[i] == KVS_RES_RESERVED;
      w->present += oc[i] == KVS_RES_PRESENT;
      w->busy += oc[i] == KVS_RES_BUSY;
      w->no_space += oc[i] == KVS_RES_NO_SPACE;
    }
    CHECK(count == r, "return value %d != RESERVED outcomes %d", r, count);
    if (mode == KVS_RESERVE_ALL_OR_NOTHING && r > 0)
      for (size_t i = 0; i < n; i++)
        CHECK(oc[i] == KVS_RES_RESERVED || oc[i] == KVS_RES_PRESENT, "partial all-or-nothing");
  }
  if (l.x) keep_or_end(w, &l);
}

static void op_lookup(worker_t *w) {
  size_t n = 1 + below(&w->base.rng, MAX_BATCH);
  uint32_t first = below(&w->base.rng, KEYSPACE);
  lease_t l = {0};
  l.read = 1;
  l.n = n;
  for (size_t i = 0; i < n; i++) {
    l.keys[i] = key_of((first + (uint32_t)i) % KEYSPACE);
    if (below(&w->base.rng, 3) == 0) l.keys[i] = alias_of(l.keys[i]);
  }
  if (below(&w->base.rng, 5) == 0) {
    int r = kvs_store_lookup(st, w->base.owner, l.keys, n, false, NULL);
    CHECK(r >= 0 && (size_t)r <= n, "lookup: %d", r);
    return;
  }
  int r = kvs_store_lookup(st, w->base.owner, l.keys, n, true, &l.x);
  CHECK(r >= 0 && (size_t)r <= n, "lookup(pin): %d", r);
  CHECK((r > 0) == (l.x != 0), "pin transfer iff run > 0");
  if (r == 0) return;
  w->hits += (uint64_t)r;
  check_pinned(w, &l);
  keep_or_end(w, &l);
}

static void op_end_pending(worker_t *w) {
  if (w->npending == 0) return;
  end_lease(w, (int)below(&w->base.rng, (uint32_t)w->npending), below(&w->base.rng, 5) != 0);
}

static void op_remove(worker_t *w) {
  kvs_key_t k = key_of(below(&w->base.rng, KEYSPACE));
  if (below(&w->base.rng, 2)) k = alias_of(k);
  int rc = kvs_store_remove(st, &k);
  CHECK(rc == 0 || rc == -ENOENT || rc == -EBUSY, "remove: %d", rc);
}

static void op_owner_release(worker_t *w) {
  int expect = w->npending + w->abandoned;
  for (int i = 0; i < w->npending; i++)
    if (w->pending[i].read) check_pinned(w, &w->pending[i]);
  int rc = kvs_store_owner_release(st, w->base.owner);
  CHECK(rc == expect, "owner_release ended %d leases, the worker held %d", rc, expect);
  w->npending = 0;
  w->abandoned = 0;
  CHECK(kvs_store_owner_release(st, w->base.owner) == -ENOENT, "released owner still open");
  CHECK(kvs_store_owner_open(st, &w->base.owner) == 0, "owner_open");
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  for (int op = 0; op < OPS_PER_THREAD; op++) {
    uint32_t c = below(&w->base.rng, 100);
    if (c < 36) op_reserve(w);
    else if (c < 72) op_lookup(w);
    else if (c < 88) op_end_pending(w);
    else if (c < 95) op_remove(w);
    else if (c < 97) op_owner_release(w);
    else {
      int n = kvs_store_sweep(st, kvs__now_ms());
      CHECK(n == 0, "sweep at the current time reclaimed %d leases (lease_ms is long)", n);
    }
    if (w->base.id == 0 && op == OPS_PER_THREAD / 2) {
      /* Every worker lease was created after zombie_created_ms: this reaches only zombies. */
      int n = kvs_store_sweep(st, zombie_created_ms + LEASE_MS);
      CHECK(n == ZOMBIE_LEASES, "mid-run sweep reclaimed %d leases, expected %d", n,
            ZOMBIE_LEASES);
    }
    if (op % 1000 == 999) CHECK(kvs__store_is_valid(st), "store invariants broken");
  }
  return NULL;
}

/* A peer that reserves and pins, then goes silent: its writes must never be published. */
static void make_zombie(void) {
  kvs_owner_t z;
  CHECK(kvs_store_owner_open(st, &z) == 0, "zombie owner");
  int leases = 0;
  for (uint32_t i = 0; i < ZOMBIE_LEASES / 2; i++) {
    kvs_key_t k = key_of(i * 7);
    kvs_layout_t lay = {KVS_DTYPE_F32, 1, {1024}};
    uint8_t oc;
    kvs_extent_t ex;
    kvs_xfer_t x;
    CHECK(kvs_store_reserve_write(st, z, &k, 1, &lay, 0, &oc, &ex, &x) == 1, "zombie write");
    memset(pool_base + ex.offset, 0xee, ex.length); /* garbage that must never be read */
    leases++;
  }
  for (uint32_t i = 0; i < ZOMBIE_LEASES / 2; i++) { /* pinned, so never evicted meanwhile */
    kvs_key_t k = key_of(40 + i);
    kvs_layout_t lay = {KVS_DTYPE_F32, 1, {512}};
    uint8_t oc;
    kvs_extent_t ex;
    kvs_xfer_t x;
    CHECK(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &k, 1, &lay, 0, &oc, &ex, &x) == 1,
          "seed write");
    write_pattern(k, ex);
    CHECK(kvs_store_commit(st, KVS_OWNER_LOCAL, x) == 0, "seed commit");
    CHECK(kvs_store_lookup(st, z, &k, 1, true, &x) == 1, "zombie pin");
    leases++;
  }
  CHECK(leases == ZOMBIE_LEASES, "zombie leases");
  zombie_created_ms = kvs__now_ms();
  while (kvs__now_ms() <= zombie_created_ms) usleep(200); /* workers start a ms later */
}

int main(int argc, char **argv) {
  uint64_t t0 = kvs__now_ns();
  uint32_t shards = 0;
  if (argc == 3 && strcmp(argv[1], "--shards") == 0) shards = (uint32_t)atoi(argv[2]);
  else CHECK(argc == 1, "usage: test_store_stress [--shards N]");
  kvs_stats_t stats;
  const uint64_t arena = ss_open((uint64_t)POOL_PAGES * 4096, LEASE_MS, shards, &stats, &pool, &st);
  pool_base = kvs_pool_base(pool);
  kvs_store_info_t in;

  make_zombie();

  pthread_t th[THREADS];
  worker_t w[THREADS];
  ss_start(st, w, sizeof w[0], THREADS, 1, worker_main, th);
  int outstanding = 0;
  uint64_t reserved = 0, present = 0, busy = 0, no_space = 0, hits = 0, verified = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    outstanding += w[i].npending + w[i].abandoned;
    reserved += w[i].reserved, present += w[i].present, busy += w[i].busy;
    no_space += w[i].no_space, hits += w[i].hits, verified += w[i].verified;
  }
  CHECK(kvs__store_is_valid(st), "store invariants broken after the run");

  /* Every lease left behind ends at its deadline; none is published. */
  int n = kvs_store_sweep(st, kvs__now_ms() + LEASE_MS);
  CHECK(n == outstanding, "final sweep ended %d leases, workers left %d", n, outstanding);
  kvs_store_info(st, &in);
  CHECK(in.xfers == 0 && in.pins == 0 && in.objects_writing == 0 && in.reserved_bytes == 0,
        "leases left after the final sweep");
  /* Every READY object is intact: verify through a pinned read of each key, then remove. */
  kvs_owner_t me = KVS_OWNER_LOCAL;
  for (uint32_t i = 0; i < KEYSPACE; i++) {
    kvs_key_t k = key_of(i);
    kvs_xfer_t x;
    if (kvs_store_lookup(st, me, &k, 1, true, &x) == 1) {
      kvs_object_view_t v;
      CHECK(kvs_store_read_pinned(st, me, x, &v, 1) == 1, "read_pinned");
      verify_view(&v, k);
      CHECK(kvs_store_release(st, me, x) == 0, "release");
      CHECK(kvs_store_remove(st, &k) == 0, "remove READY key");
    }
    kvs_key_t a = alias_of(k);
    CHECK(kvs_store_lookup(st, me, &a, 1, false, NULL) == 0, "alias outlived its object");
  }
  kvs_store_info(st, &in);
  kvs_pool_arena_stats_t ps;
  CHECK(kvs_pool_arena_stats(pool, KVS_ARENA_CACHE, &ps) == 0, "arena stats");
  CHECK(in.used_bytes + in.reserved_bytes + in.free_bytes == arena, "used+reserved+free != arena");
  CHECK(in.free_bytes == arena && ps.free == arena, "free %" PRIu64 " (pool %" PRIu64
        ") != arena %" PRIu64, in.free_bytes, ps.free, arena);
  CHECK(in.objects_ready == 0 && in.keys == 0, "objects or keys left");
  static const kvs_stat_id_t gauges[] = {KVS_STAT_store_objects, KVS_STAT_store_keys,
                                         KVS_STAT_store_used_bytes, KVS_STAT_store_reserved_bytes,
                                         KVS_STAT_store_live_pins};
  for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++)
    CHECK(kvs_stats_get(&stats, gauges[i]) == 0, "gauge %zu is %" PRIu64 " with the store empty",
          i, kvs_stats_get(&stats, gauges[i]));
  CHECK(kvs_stats_get(&stats, KVS_STAT_store_free_bytes) == arena, "free gauge != arena");
  CHECK(kvs__store_is_valid(st), "store invariants broken at the end");
  CHECK(kvs_stats_get(&stats, KVS_STAT_store_evictions) > 0, "the pool never filled up");
  CHECK(reserved > 0 && present > 0 && busy > 0 && no_space > 0 && verified > 0,
        "the mix did not reach every outcome");
  CHECK(kvs_store_destroy(st, false) == 0, "store_destroy");
  CHECK(kvs_pool_destroy(pool, false) == 0, "pool_destroy");
  printf("test_store_stress: ok: %u shard(s), %d threads x %d ops in %.2f s; reserved %" PRIu64
         " present %" PRIu64 " busy %" PRIu64 " no_space %" PRIu64 " hits %" PRIu64
         " verified %" PRIu64 " evictions %" PRIu64 " expired %" PRIu64 "\n",
         shards ? shards : 1u, THREADS, OPS_PER_THREAD, (double)(kvs__now_ns() - t0) / 1e9, reserved, present, busy,
         no_space, hits, verified, kvs_stats_get(&stats, KVS_STAT_store_evictions),
         kvs_stats_get(&stats, KVS_STAT_store_lease_expired));
  return 0;
}
