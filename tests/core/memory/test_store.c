/* Unit tests for core/memory/store (design §4): every state transition, leases, eviction, aliases,
 * bad input. Each test checks kvs__store_is_valid after every operation. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "pool.h"
#include "store.h"
#include "storefix.h"

#define T_TIMEOUT .timeout = 30

static kvs_pool_t *pool;
static kvs_store_t *st;
static kvs_stats_t stats;
static uint64_t PG;    /* pool page size */
static uint64_t ARENA; /* cache arena bytes */

#define VALID() cr_assert(kvs__store_is_valid(st), "store invariants broken")

static kvs_key_t K(uint64_t i) { return (kvs_key_t){i, 42}; }

static void setup_cfg(uint32_t pages, kvs_store_config_t *cfg) {
  kvs_pool_config_t pc = {0};
  pc.cache_size = (uint64_t)pages * 4096;
  cr_assert_eq(kvs_pool_create(&pc, &pool), 0);
  PG = kvs_pool_page_size(pool);
  kvs_stats_init(&stats);
  kvs_store_config_t c = {0};
  if (cfg) c = *cfg;
  c.pool = pool;
  c.stats = &stats;
  cr_assert_eq(kvs_store_create(&c, &st), 0);
  kvs_store_info_t in;
  kvs_store_info(st, &in);
  ARENA = in.arena_bytes;
  cr_assert_eq(ARENA, (uint64_t)pages * 4096);
  VALID();
}
static void setup(uint32_t pages) { setup_cfg(pages, NULL); }

static void teardown(void) { storefix_close(&st, &pool); }

static uint64_t pool_free(void) {
  kvs_pool_arena_stats_t a;
  cr_assert_eq(kvs_pool_arena_stats(pool, KVS_ARENA_CACHE, &a), 0);
  return a.free;
}
static kvs_store_info_t info(void) {
  kvs_store_info_t in;
  kvs_store_info(st, &in);
  return in;
}
static bool info_eq(kvs_store_info_t a, kvs_store_info_t b) {
  return a.arena_bytes == b.arena_bytes && a.used_bytes == b.used_bytes &&
         a.reserved_bytes == b.reserved_bytes && a.free_bytes == b.free_bytes &&
         a.objects_ready == b.objects_ready && a.objects_writing == b.objects_writing &&
         a.keys == b.keys && a.pins == b.pins && a.xfers == b.xfers && a.owners == b.owners;
}
static uint64_t stat(kvs_stat_id_t id) { return kvs_stats_get(&stats, id); }

/* Reserve `bytes` for owner: one object under the n keys (its aliases) when object, else one key
 * (n == 1) with kvs_store_reserve_write; asserts RESERVED; returns the transfer. */
static kvs_xfer_t reserve_keys(kvs_owner_t ow, const kvs_key_t *keys, size_t n, bool object,
                               uint64_t bytes, kvs_extent_t *ext) {
  kvs_layout_t l = kvs_layout_blob(bytes);
  uint8_t oc = 0xff;
  kvs_extent_t e;
  kvs_xfer_t x = 0;
  int r = object ? kvs_store_reserve_object(st, ow, keys, n, &l, 0, &oc, &e, &x)
                 : kvs_store_reserve_write(st, ow, keys, n, &l, 0, &oc, &e, &x);
  cr_assert_eq(r, 1, "reserve_%s of %zu keys returned %d", object ? "object" : "write", n, r);
  cr_assert_eq(oc, KVS_RES_RESERVED, "outcome %s", kvs_reserve_outcome_name(oc));
  cr_assert_neq(x, 0);
  cr_assert_eq(e.length, bytes);
  if (ext) *ext = e;
  VALID();
  return x;
}
/* Reserve one key of `bytes` for owner; asserts RESERVED; returns the transfer. */
static kvs_xfer_t reserve1(kvs_owner_t ow, kvs_key_t k, uint64_t bytes, kvs_extent_t *ext) {
  return reserve_keys(ow, &k, 1, false, bytes, ext);
}
/* Reserve n keys (n <= 8) of `bytes` each for the local owner in one kvs_store_reserve_write:
 * outcome i must be want[i]. Returns what the call returned (the keys reserved); the transfer
 * in *x. */
static int reserve_outcomes(const kvs_key_t *keys, size_t n, uint64_t bytes, const uint8_t *want,
                            kvs_xfer_t *x) {
  kvs_layout_t l = kvs_layout_blob(bytes);
  uint8_t oc[8];
  kvs_extent_t ex[8];
  cr_assert_leq(n, 8);
  int r = kvs_store_reserve_write(st, KVS_OWNER_LOCAL, keys, n, &l, 0, oc, ex, x);
  VALID();
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(oc[i], want[i], "key %zu: outcome %s, not %s", i, kvs_reserve_outcome_name(oc[i]),
                 kvs_reserve_outcome_name(want[i]));
  return r;
}
/* Reserve and commit one key. */
static void put1(kvs_key_t k, uint64_t bytes) {
  kvs_xfer_t x = reserve1(KVS_OWNER_LOCAL, k, bytes, NULL);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
  VALID();
}
/* Try to reserve one key; returns its outcome (and commits it when reserved and commit). */
static uint8_t try1(kvs_key_t k, uint64_t bytes, unsigned mode, bool commit) {
  kvs_layout_t l = kvs_layout_blob(bytes);
  uint8_t oc = 0xff;
  kvs_extent_t e;
  kvs_xfer_t x = 77;
  int r = kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &k, 1, &l, mode, &oc, &e, &x);
  cr_assert_geq(r, 0);
  cr_assert_eq(r, oc == KVS_RES_RESERVED);
  cr_assert_eq(x != 0, oc == KVS_RES_RESERVED);
  if (commit && x) cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
  VALID();
  return oc;
}
static bool ready(kvs_key_t k) {
  int r = kvs_store_lookup(st, KVS_OWNER_LOCAL, &k, 1, false, NULL);
  cr_assert_geq(r, 0);
  return r == 1;
}
/* Pin then release (touches the LRU). */
static void touch(kvs_key_t k) {
  kvs_xfer_t x;
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &k, 1, true, &x), 1);
  VALID();
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, x), 0);
  VALID();
}

TestSuite(store, .fini = teardown);

/* ---- pure helpers ---------------------------------------------------------------------- */

Test(store, outcome_names_and_dtypes, T_TIMEOUT) {
  cr_assert_str_eq(kvs_reserve_outcome_name(KVS_RES_RESERVED), "RESERVED");
  cr_assert_str_eq(kvs_reserve_outcome_name(KVS_RES_PRESENT), "PRESENT");
  cr_assert_str_eq(kvs_reserve_outcome_name(KVS_RES_BUSY), "BUSY");
  cr_assert_str_eq(kvs_reserve_outcome_name(KVS_RES_NO_SPACE), "NO_SPACE");
  cr_assert_str_eq(kvs_reserve_outcome_name(KVS_RES_TOO_LARGE), "TOO_LARGE");
  cr_assert_str_eq(kvs_reserve_outcome_name(KVS_RES_BAD_LAYOUT), "BAD_LAYOUT");
  cr_assert_str_eq(kvs_reserve_outcome_name((kvs_reserve_outcome_t)99), "?");
  cr_assert_eq(kvs_dtype_size(KVS_DTYPE_U8), 1);
  cr_assert_eq(kvs_dtype_size(KVS_DTYPE_F16), 2);
  cr_assert_eq(kvs_dtype_size(KVS_DTYPE_BF16), 2);
  cr_assert_eq(kvs_dtype_size(KVS_DTYPE_F32), 4);
  cr_assert_eq(kvs_dtype_size(KVS_DTYPE_F8E4M3), 1);
  cr_assert_eq(kvs_dtype_size(KVS_DTYPE_F8E5M2), 1);
  cr_assert_eq(kvs_dtype_size(KVS_DTYPE_I8), 1);
  cr_assert_eq(kvs_dtype_size(KVS_DTYPE_I32), 4);
  cr_assert_eq(kvs_dtype_size(KVS_DTYPE__COUNT), 0);
}

Test(store, layout_nbytes, T_TIMEOUT) {
  kvs_layout_t l = {KVS_DTYPE_BF16, 3, {2, 8, 128}};
  cr_assert_eq(kvs_layout_nbytes(&l), 2u * 2 * 8 * 128);
  l.ndim = 0;
  cr_assert_eq(kvs_layout_nbytes(&l), 0);
  l.ndim = 9;
  cr_assert_eq(kvs_layout_nbytes(&l), 0);
  l.ndim = 3;
  l.shape[1] = 0;
  cr_assert_eq(kvs_layout_nbytes(&l), 0, "zero dim");
  l.shape[1] = 8;
  l.dtype = 99;
  cr_assert_eq(kvs_layout_nbytes(&l), 0, "unknown dtype");
  kvs_layout_t big = {KVS_DTYPE_F32, 2, {1ull << 40, 1ull << 30}};
  cr_assert_eq(kvs_layout_nbytes(&big), 0, "overflow");
  kvs_layout_t edge = {KVS_DTYPE_F16, 1, {1ull << 62}};
  cr_assert_eq(kvs_layout_nbytes(&edge), 1ull << 63);
  edge.dtype = KVS_DTYPE_F32;
  cr_assert_eq(kvs_layout_nbytes(&edge), 0, "4 * 2^62 overflows");
  cr_assert_eq(kvs_layout_nbytes(NULL), 0);
  kvs_layout_t b = kvs_layout_blob(12345);
  cr_assert_eq(b.dtype, KVS_DTYPE_U8);
  cr_assert_eq(b.ndim, 1);
  cr_assert_eq(kvs_layout_nbytes(&b), 12345);
  b = kvs_layout_blob(0);
  cr_assert_eq(kvs_layout_nbytes(&b), 0);
}

/* ---- create / destroy ------------------------------------------------------------------ */

Test(store, create_bad_input, T_TIMEOUT) {
  kvs_store_t *s = (kvs_store_t *)0x1;
  cr_assert_eq(kvs_store_create(NULL, &s), -EINVAL);
  kvs_store_config_t c = {0};
  cr_assert_eq(kvs_store_create(&c, &s), -EINVAL, "no pool");
  cr_assert_eq(s, (kvs_store_t *)0x1, "out untouched on error");
  kvs_pool_config_t pc = {0};
  pc.cache_size = 16 * 4096;
  cr_assert_eq(kvs_pool_create(&pc, &pool), 0);
  c.pool = pool;
  c.max_xfers = KVS_STORE_MAX_SLOTS + 1;
  cr_assert_eq(kvs_store_create(&c, &s), -EINVAL, "xfer ids need slot < 2^24");
  c.max_xfers = 0;
  c.max_owners = KVS_STORE_MAX_SLOTS + 1;
  cr_assert_eq(kvs_store_create(&c, &s), -EINVAL);
  c.max_owners = 0;
  /* an arena that already has extents is not the store's */
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(pool, KVS_ARENA_CACHE, 4096, &off), 0);
  cr_assert_eq(kvs_store_create(&c, &s), -EBUSY);
  cr_assert_gt(kvs_pool_free(pool, KVS_ARENA_CACHE, off), 0);
  cr_assert_eq(kvs_store_create(&c, &s), 0);
  cr_assert_eq(kvs_store_pool(s), pool);
  cr_assert(kvs__store_is_valid(s));
  cr_assert_eq(kvs_store_destroy(s, false), 0);
  cr_assert_eq(kvs_store_destroy(NULL, false), 0, "destroy accepts NULL");
}

Test(store, destroy_busy_with_live_leases, T_TIMEOUT) {
  setup(64);
  kvs_xfer_t w = reserve1(KVS_OWNER_LOCAL, K(1), 4096, NULL);
  cr_assert_eq(kvs_store_destroy(st, false), -EBUSY);
  VALID(); /* kept, intact */
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, w), 0);
  kvs_xfer_t r;
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &(kvs_key_t){1, 42}, 1, true, &r), 1);
  cr_assert_eq(kvs_store_destroy(st, false), -EBUSY, "a read pin is a lease too");
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r), 0);
  /* no lease: destroy frees the READY object's extent (teardown destroys the pool, which
   * fails if any extent is left) */
  cr_assert_eq(kvs_store_destroy(st, false), 0);
  st = NULL;
  cr_assert_eq(pool_free(), 64 * 4096);
}

Test(store, destroy_force_ends_leases, T_TIMEOUT) {
  setup(64);
  kvs_owner_t peer;
  cr_assert_eq(kvs_store_owner_open(st, &peer), 0);
  reserve1(peer, K(1), 3 * 4096, NULL);
  put1(K(2), 4096);
  kvs_xfer_t r;
  cr_assert_eq(kvs_store_lookup(st, peer, &(kvs_key_t){2, 42}, 1, true, &r), 1);
  cr_assert_eq(kvs_store_destroy(st, true), 0);
  st = NULL;
  cr_assert_eq(pool_free(), 64 * 4096);
}

/* ---- write path ------------------------------------------------------------------------ */

Test(store, reserve_commit_lookup_read_release, T_TIMEOUT) {
  setup(64);
  uint64_t base = pool_free();
  kvs_layout_t l = {KVS_DTYPE_F16, 2, {3, 1000}}; /* 6000 bytes: 2 pages */
  kvs_key_t keys[2] = {K(1), K(2)};
  uint8_t oc[2];
  kvs_extent_t ex[2];
  kvs_xfer_t x = 0;
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, keys, 2, &l, 0, oc, ex, &x), 2);
  VALID();
  cr_assert_eq(oc[0], KVS_RES_RESERVED);
  cr_assert_eq(oc[1], KVS_RES_RESERVED);
  cr_assert_eq(ex[0].length, 6000);
  cr_assert_eq(kvs_pool_arena_of(pool, ex[0].offset, ex[0].length), KVS_ARENA_CACHE);
  cr_assert_neq(ex[0].offset, ex[1].offset);
  kvs_store_info_t in = info();
  cr_assert_eq(in.objects_writing, 2);
  cr_assert_eq(in.objects_ready, 0);
  cr_assert_eq(in.reserved_bytes, 4 * PG, "reserved counts the page-rounded extents");
  cr_assert_eq(in.used_bytes, 0);
  cr_assert_eq(in.free_bytes, base - 4 * PG);
  cr_assert_eq(in.free_bytes, pool_free());
  cr_assert_eq(in.xfers, 1);
  cr_assert_eq(stat(KVS_STAT_store_reserved_bytes), 4 * PG);

  /* never readable before commit */
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 2, false, NULL), 0);
  kvs_xfer_t r = 5;
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 2, true, &r), 0);
  cr_assert_eq(r, 0, "empty run: no transfer");
  VALID();

  /* writer copies outside the lock, then commits */
  memset(kvs_pool_base(pool) + ex[0].offset, 0xab, ex[0].length);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
  VALID();
  in = info();
  cr_assert_eq(in.objects_ready, 2);
  cr_assert_eq(in.used_bytes, 4 * PG);
  cr_assert_eq(in.reserved_bytes, 0);
  cr_assert_eq(in.xfers, 0);
  cr_assert_eq(in.keys, 2);
  cr_assert_eq(stat(KVS_STAT_store_commits), 1);
  cr_assert_eq(stat(KVS_STAT_store_committed_objects), 2);
  cr_assert_eq(stat(KVS_STAT_store_objects), 2);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), -ENOENT, "transfer ended");

  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 2, false, NULL), 2);
  kvs_key_t three[3] = {K(1), K(9), K(2)};
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, three, 3, false, NULL), 1, "leading run");
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 2, true, &r), 2);
  VALID();
  cr_assert_eq(info().pins, 2);
  kvs_object_view_t v[2];
  cr_assert_eq(kvs_store_read_pinned(st, KVS_OWNER_LOCAL, r, v, 2), 2);
  cr_assert(kvs_key_eq(v[0].key, K(1)) && kvs_key_eq(v[1].key, K(2)), "lookup order");
  cr_assert_eq(v[0].extent.offset, ex[0].offset);
  cr_assert_eq(v[0].extent.length, 6000);
  cr_assert_eq(v[1].extent.offset, ex[1].offset);
  cr_assert_eq(v[0].layout.dtype, KVS_DTYPE_F16);
  cr_assert_eq(v[0].layout.shape[1], 1000);
  cr_assert_eq(kvs_pool_base(pool)[v[0].extent.offset + 5999], 0xab);
  cr_assert_eq(kvs_store_read_pinned(st, KVS_OWNER_LOCAL, r, v, 1), 2, "count may exceed cap");
  cr_assert_eq(kvs_store_read_pinned(st, KVS_OWNER_LOCAL, r, NULL, 0), 2);
  cr_assert_eq(kvs_store_read_pinned(st, KVS_OWNER_LOCAL, r, NULL, 1), -EINVAL);
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r), 0);
  VALID();
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r), -ENOENT);
  cr_assert_eq(kvs_store_read_pinned(st, KVS_OWNER_LOCAL, r, v, 2), -ENOENT);
  cr_assert_eq(info().pins, 0);
  cr_assert_eq(stat(KVS_STAT_store_lookups), 5);
  cr_assert_eq(stat(KVS_STAT_store_pins), 2);
  cr_assert_eq(stat(KVS_STAT_store_releases), 1);
  cr_assert_eq(stat(KVS_STAT_store_hits), 5);
  cr_assert_eq(stat(KVS_STAT_store_misses), 3);

  /* a READY key reserved again: PRESENT, nothing reserved, nothing allocated */
  uint64_t f = pool_free();
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, keys, 2, &l, 0, oc, ex, &x), 0);
  cr_assert_eq(oc[0], KVS_RES_PRESENT);
  cr_assert_eq(oc[1], KVS_RES_PRESENT);
  cr_assert_eq(x, 0);
  cr_assert_eq(pool_free(), f);
  cr_assert_eq(stat(KVS_STAT_store_present), 2);
  VALID();
}

Test(store, abort_frees_and_never_publishes, T_TIMEOUT) {
  setup(64);
  uint64_t base = pool_free();
  kvs_extent_t e;
  kvs_xfer_t x = reserve1(KVS_OWNER_LOCAL, K(7), 5 * 4096 + 1, &e);
  cr_assert_eq(pool_free(), base - 6 * PG);
  memset(kvs_pool_base(pool) + e.offset, 1, e.length); /* half-written bytes */
  cr_assert_eq(kvs_store_abort(st, KVS_OWNER_LOCAL, x), 0);
  VALID();
  cr_assert_eq(pool_free(), base);
  cr_assert_not(ready(K(7)));
  kvs_store_info_t in = info();
  cr_assert_eq(in.objects_writing + in.objects_ready + in.keys + in.xfers, 0);
  cr_assert_eq(stat(KVS_STAT_store_aborts), 1);
  cr_assert_eq(stat(KVS_STAT_store_aborted_objects), 1);
  cr_assert_eq(kvs_store_abort(st, KVS_OWNER_LOCAL, x), -ENOENT);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), -ENOENT, "aborted is never published");
  cr_assert_not(ready(K(7)));
  /* the key can be written again */
  put1(K(7), 4096);
  cr_assert(ready(K(7)));
}

Test(store, abort_of_read_transfer_releases_pins, T_TIMEOUT) {
  setup(64);
  put1(K(1), 4096);
  kvs_xfer_t r;
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &(kvs_key_t){1, 42}, 1, true, &r), 1);
  cr_assert_eq(kvs_store_remove(st, &(kvs_key_t){1, 42}), -EBUSY);
  cr_assert_eq(kvs_store_abort(st, KVS_OWNER_LOCAL, r), 0);
  VALID();
  cr_assert_eq(info().pins, 0);
  cr_assert(ready(K(1)), "releasing a pin does not delete");
  cr_assert_eq(kvs_store_remove(st, &(kvs_key_t){1, 42}), 0);
}

Test(store, busy_second_reservation_no_leak, T_TIMEOUT) {
  setup(64);
  kvs_owner_t peer;
  cr_assert_eq(kvs_store_owner_open(st, &peer), 0);
  kvs_extent_t e1;
  kvs_xfer_t x1 = reserve1(KVS_OWNER_LOCAL, K(5), 2 * 4096, &e1);
  uint64_t f = pool_free();
  kvs_store_info_t before = info();
  kvs_layout_t l = kvs_layout_blob(4096);
  uint8_t oc = 0xff;
  kvs_extent_t e2 = {123, 456};
  kvs_xfer_t x2 = 99;
  kvs_key_t k = K(5);
  /* another owner, then the same owner: both BUSY, nothing allocated, first reservation kept */
  cr_assert_eq(kvs_store_reserve_write(st, peer, &k, 1, &l, 0, &oc, &e2, &x2), 0);
  cr_assert_eq(oc, KVS_RES_BUSY);
  cr_assert_eq(x2, 0);
  VALID();
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &k, 1, &l, 0, &oc, &e2, &x2), 0);
  cr_assert_eq(oc, KVS_RES_BUSY);
  uint8_t o1;
  cr_assert_eq(kvs_store_reserve_object(st, peer, &k, 1, &l, 0, &o1, &e2, &x2), 0);
  cr_assert_eq(o1, KVS_RES_BUSY);
  VALID();
  cr_assert_eq(pool_free(), f, "BUSY allocates nothing");
  kvs_store_info_t after = info();
  cr_assert_eq(after.reserved_bytes, before.reserved_bytes);
  cr_assert_eq(after.xfers, 1);
  cr_assert_eq(stat(KVS_STAT_store_busy), 3);
  /* the first writer still owns its extent and publishes it */
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x1), 0);
  VALID();
  kvs_xfer_t r;
  kvs_object_view_t v;
  cr_assert_eq(kvs_store_lookup(st, peer, &k, 1, true, &r), 1);
  cr_assert_eq(kvs_store_read_pinned(st, peer, r, &v, 1), 1);
  cr_assert_eq(v.extent.offset, e1.offset);
  cr_assert_eq(v.extent.length, 2 * 4096);
  cr_assert_eq(kvs_store_release(st, peer, r), 0);
}

Test(store, duplicate_keys_in_one_call, T_TIMEOUT) {
  setup(64);
  kvs_key_t keys[4] = {K(1), K(2), K(1), K(2)};
  static const uint8_t want[4] = {KVS_RES_RESERVED, KVS_RES_RESERVED, KVS_RES_BUSY, KVS_RES_BUSY};
  kvs_xfer_t x;
  cr_assert_eq(reserve_outcomes(keys, 4, 100, want, &x), 2);
  cr_assert_eq(info().reserved_bytes, 2 * PG, "one extent per distinct key");
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
  VALID();
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 4, false, NULL), 4);
  cr_assert_eq(info().objects_ready, 2);
}

Test(store, present_keys_are_not_evicted_by_the_same_call, T_TIMEOUT) {
  setup(8);
  put1(K(1), 4 * 4096); /* LRU head */
  put1(K(2), 4 * 4096);
  /* K(1) is PRESENT; K(3) needs 4 pages: only K(2) may be evicted for it */
  kvs_key_t keys[2] = {K(1), K(3)};
  static const uint8_t want[2] = {KVS_RES_PRESENT, KVS_RES_RESERVED};
  kvs_xfer_t x;
  cr_assert_eq(reserve_outcomes(keys, 2, 4 * 4096, want, &x), 1);
  cr_assert(ready(K(1)), "told PRESENT, so it must still be there");
  cr_assert_not(ready(K(2)));
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
  /* only PRESENT objects left to evict: the new key gets NO_SPACE and they survive */
  keys[1] = K(4);
  kvs_key_t k2[3] = {K(1), K(3), K(4)};
  static const uint8_t want3[3] = {KVS_RES_PRESENT, KVS_RES_PRESENT, KVS_RES_NO_SPACE};
  cr_assert_eq(reserve_outcomes(k2, 3, 4 * 4096, want3, &x), 0);
  cr_assert_eq(x, 0);
  cr_assert(ready(K(1)) && ready(K(3)));
  VALID();
}

/* ---- owners and leases ----------------------------------------------------------------- */

Test(store, owner_release_ends_every_lease, T_TIMEOUT) {
  setup(64);
  uint64_t base = pool_free();
  put1(K(1), 4096);
  put1(K(2), 4096);
  uint64_t after_puts = pool_free();
  kvs_owner_t peer;
  cr_assert_eq(kvs_store_owner_open(st, &peer), 0);
  cr_assert_neq(peer, 0);
  cr_assert_neq(peer, KVS_OWNER_LOCAL);
  cr_assert_eq(info().owners, 2);
  kvs_extent_t e;
  reserve1(peer, K(10), 3 * 4096, &e);
  reserve1(peer, K(11), 4096, NULL);
  memset(kvs_pool_base(pool) + e.offset, 0x5a, e.length);
  kvs_xfer_t r;
  kvs_key_t k12[2] = {K(1), K(2)};
  cr_assert_eq(kvs_store_lookup(st, peer, k12, 2, true, &r), 2);
  VALID();
  cr_assert_eq(kvs_store_remove(st, &k12[0]), -EBUSY);
  cr_assert_eq(kvs_store_owner_release(st, peer), 3, "two writes and one read");
  VALID();
  cr_assert_eq(pool_free(), after_puts, "written extents freed");
  cr_assert_not(ready(K(10)), "never published");
  cr_assert_not(ready(K(11)));
  kvs_store_info_t in = info();
  cr_assert_eq(in.pins, 0);
  cr_assert_eq(in.xfers, 0);
  cr_assert_eq(in.objects_writing, 0);
  cr_assert_eq(in.owners, 1);
  cr_assert_eq(stat(KVS_STAT_store_aborted_objects), 2);
  cr_assert_eq(stat(KVS_STAT_store_owner_releases), 1);
  /* the owner is closed: its id is stale */
  cr_assert_eq(kvs_store_owner_release(st, peer), -ENOENT);
  kvs_layout_t l = kvs_layout_blob(10);
  uint8_t oc;
  kvs_extent_t ex;
  kvs_xfer_t x;
  kvs_key_t k = K(20);
  cr_assert_eq(kvs_store_reserve_write(st, peer, &k, 1, &l, 0, &oc, &ex, &x), -ENOENT);
  cr_assert_eq(kvs_store_lookup(st, peer, &k, 1, false, NULL), -ENOENT);
  /* pins released: the objects are evictable/removable again */
  cr_assert_eq(kvs_store_remove(st, &k12[0]), 0);
  cr_assert_eq(kvs_store_remove(st, &k12[1]), 0);
  cr_assert_eq(pool_free(), base);
  VALID();
  /* a reopened slot gets a new id */
  kvs_owner_t again;
  cr_assert_eq(kvs_store_owner_open(st, &again), 0);
  cr_assert_neq(again, peer);
}

Test(store, local_owner_release_keeps_it_open, T_TIMEOUT) {
  setup(64);
  uint64_t base = pool_free();
  reserve1(KVS_OWNER_LOCAL, K(1), 4096, NULL);
  cr_assert_eq(kvs_store_owner_release(st, KVS_OWNER_LOCAL), 1);
  VALID();
  cr_assert_eq(pool_free(), base);
  cr_assert_eq(kvs_store_owner_release(st, KVS_OWNER_LOCAL), 0);
  put1(K(1), 4096); /* still usable */
  cr_assert(ready(K(1)));
  cr_assert_eq(kvs_store_owner_release(st, 0), -ENOENT);
  cr_assert_eq(kvs_store_owner_release(st, 12345), -ENOENT);
}

Test(store, owner_table_full, T_TIMEOUT) {
  kvs_store_config_t c = {0};
  c.max_owners = 3;
  setup_cfg(16, &c);
  kvs_owner_t a, b, d = 777;
  cr_assert_eq(kvs_store_owner_open(st, &a), 0);
  cr_assert_eq(kvs_store_owner_open(st, &b), 0);
  cr_assert_eq(kvs_store_owner_open(st, &d), -ENOSPC);
  cr_assert_eq(d, 777);
  cr_assert_eq(kvs_store_owner_release(st, a), 0);
  cr_assert_eq(kvs_store_owner_open(st, &d), 0);
  cr_assert_neq(d, a, "reused slot, new generation");
  cr_assert_eq(kvs_store_owner_release(st, a), -ENOENT);
  VALID();
}

Test(store, expired_write_lease_is_reclaimed_unpublished, T_TIMEOUT) {
  kvs_store_config_t c = {0};
  c.lease_ms = 1000;
  setup_cfg(64, &c);
  uint64_t base = pool_free();
  uint64_t t0 = kvs__now_ms();
  kvs_extent_t e;
  kvs_xfer_t x = reserve1(KVS_OWNER_LOCAL, K(1), 2 * 4096, &e);
  memset(kvs_pool_base(pool) + e.offset, 0x77, e.length);
  cr_assert_eq(kvs_store_sweep(st, t0), 0, "not yet due");
  VALID();
  cr_assert_eq(kvs_store_sweep(st, kvs__now_ms() + 1000), 1);
  VALID();
  cr_assert_eq(pool_free(), base);
  cr_assert_not(ready(K(1)));
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), -ENOENT, "expired: never published");
  cr_assert_not(ready(K(1)));
  cr_assert_eq(stat(KVS_STAT_store_lease_expired), 1);
  cr_assert_eq(stat(KVS_STAT_store_aborted_objects), 1);
  cr_assert_eq(info().xfers, 0);
}

Test(store, expired_pin_is_released, T_TIMEOUT) {
  kvs_store_config_t c = {0};
  c.lease_ms = 1000;
  setup_cfg(64, &c);
  put1(K(1), 4096);
  kvs_owner_t peer;
  cr_assert_eq(kvs_store_owner_open(st, &peer), 0);
  kvs_xfer_t r;
  kvs_key_t k = K(1);
  cr_assert_eq(kvs_store_lookup(st, peer, &k, 1, true, &r), 1);
  cr_assert_eq(kvs_store_remove(st, &k), -EBUSY);
  cr_assert_eq(kvs_store_sweep(st, kvs__now_ms() + 1000), 1);
  VALID();
  cr_assert_eq(info().pins, 0);
  cr_assert_eq(kvs_store_release(st, peer, r), -ENOENT);
  cr_assert(ready(K(1)), "an expired pin does not delete the object");
  cr_assert_eq(kvs_store_remove(st, &k), 0);
  VALID();
}

Test(store, sweep_is_in_creation_order, T_TIMEOUT) {
  kvs_store_config_t c = {0};
  c.lease_ms = 1000;
  setup_cfg(64, &c);
  reserve1(KVS_OWNER_LOCAL, K(1), 4096, NULL);
  usleep(30 * 1000);
  uint64_t mid = kvs__now_ms();
  kvs_xfer_t x2 = reserve1(KVS_OWNER_LOCAL, K(2), 4096, NULL);
  /* at mid + 999 ms the first lease (created <= mid - 29) is due, the second is not */
  cr_assert_eq(kvs_store_sweep(st, mid + 999), 1);
  VALID();
  cr_assert_eq(info().objects_writing, 1);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x2), 0);
  cr_assert(ready(K(2)));
}

Test(store, reserve_sweeps_expired_leases, T_TIMEOUT) {
  kvs_store_config_t c = {0};
  c.lease_ms = 20;
  setup_cfg(64, &c);
  uint64_t base = pool_free();
  kvs_owner_t peer;
  cr_assert_eq(kvs_store_owner_open(st, &peer), 0);
  reserve1(peer, K(1), 4096, NULL); /* the peer goes quiet */
  usleep(80 * 1000);
  kvs_xfer_t x = reserve1(KVS_OWNER_LOCAL, K(2), 4096, NULL);
  cr_assert_eq(info().objects_writing, 1, "the stale lease was reclaimed by reserve");
  cr_assert_eq(stat(KVS_STAT_store_lease_expired), 1);
  cr_assert_eq(kvs_store_abort(st, KVS_OWNER_LOCAL, x), 0);
  cr_assert_eq(pool_free(), base);
}

/* ---- bad transfers --------------------------------------------------------------------- */

Test(store, foreign_transfer_is_eperm_and_changes_nothing, T_TIMEOUT) {
  setup(64);
  kvs_owner_t a, b;
  cr_assert_eq(kvs_store_owner_open(st, &a), 0);
  cr_assert_eq(kvs_store_owner_open(st, &b), 0);
  put1(K(9), 4096);
  kvs_xfer_t w = reserve1(a, K(1), 4096, NULL);
  kvs_xfer_t r;
  kvs_key_t k9 = K(9);
  cr_assert_eq(kvs_store_lookup(st, a, &k9, 1, true, &r), 1);
  uint64_t f = pool_free();
  kvs_store_info_t before = info();
  kvs_object_view_t v;
  cr_assert_eq(kvs_store_commit(st, b, w), -EPERM);
  cr_assert_eq(kvs_store_abort(st, b, w), -EPERM);
  cr_assert_eq(kvs_store_abort(st, b, r), -EPERM);
  cr_assert_eq(kvs_store_release(st, b, r), -EPERM);
  cr_assert_eq(kvs_store_read_pinned(st, b, r, &v, 1), -EPERM);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, w), -EPERM);
  VALID();
  cr_assert_eq(stat(KVS_STAT_store_bad_transfer), 6);
  kvs_store_info_t after = info();
  cr_assert(info_eq(before, after), "nothing changed");
  cr_assert_eq(pool_free(), f);
  cr_assert_not(ready(K(1)), "still not published");
  /* the real owner still holds both */
  cr_assert_eq(kvs_store_read_pinned(st, a, r, &v, 1), 1);
  cr_assert_eq(kvs_store_release(st, a, r), 0);
  cr_assert_eq(kvs_store_commit(st, a, w), 0);
  cr_assert(ready(K(1)));
}

Test(store, forged_and_stale_ids_are_enoent, T_TIMEOUT) {
  setup(64);
  kvs_xfer_t w = reserve1(KVS_OWNER_LOCAL, K(1), 4096, NULL);
  kvs_object_view_t v;
  kvs_xfer_t forged[] = {0, 1, w + 1, w ^ (1ull << 40), (w & 0xffffff) | (99ull << 24),
                         0xffffff, ~0ull};
  for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
    cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, forged[i]), -ENOENT, "id %zu", i);
    cr_assert_eq(kvs_store_abort(st, KVS_OWNER_LOCAL, forged[i]), -ENOENT);
    cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, forged[i]), -ENOENT);
    cr_assert_eq(kvs_store_read_pinned(st, KVS_OWNER_LOCAL, forged[i], &v, 1), -ENOENT);
  }
  cr_assert_eq(stat(KVS_STAT_store_bad_transfer), 0, "-ENOENT is not an ownership violation");
  /* a write transfer is not a read transfer and vice versa */
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, w), -EINVAL);
  cr_assert_eq(kvs_store_read_pinned(st, KVS_OWNER_LOCAL, w, &v, 1), -EINVAL);
  VALID();
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, w), 0);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, w), -ENOENT, "stale after commit");
  kvs_xfer_t r;
  kvs_key_t k = K(1);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &k, 1, true, &r), 1);
  cr_assert_neq(r, w, "a reused slot gets a new generation");
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, r), -EINVAL);
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r), 0);
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r), -ENOENT);
  /* unknown owners */
  cr_assert_eq(kvs_store_commit(st, 0, r), -ENOENT);
  cr_assert_eq(kvs_store_commit(st, 2, r), -ENOENT);
  cr_assert_eq(kvs_store_commit(st, (5ull << 24) | 1, r), -ENOENT);
  VALID();
}

Test(store, bad_arguments, T_TIMEOUT) {
  setup(16);
  kvs_key_t k = K(1);
  kvs_layout_t l = kvs_layout_blob(10);
  uint8_t oc = 0xee;
  kvs_extent_t e = {1, 2};
  kvs_xfer_t x = 3;
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, NULL, 1, &l, 0, &oc, &e, &x), -EINVAL);
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &k, 0, &l, 0, &oc, &e, &x), -EINVAL);
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &k, 1, NULL, 0, &oc, &e, &x), -EINVAL);
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &k, 1, &l, 0, NULL, &e, &x), -EINVAL);
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &k, 1, &l, 0, &oc, NULL, &x), -EINVAL);
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &k, 1, &l, 0, &oc, &e, NULL), -EINVAL);
  cr_assert_eq(kvs_store_reserve_write(NULL, KVS_OWNER_LOCAL, &k, 1, &l, 0, &oc, &e, &x), -EINVAL);
  cr_assert_eq(kvs_store_reserve_write(st, 99, &k, 1, &l, 0, &oc, &e, &x), -ENOENT);
  cr_assert_eq(kvs_store_reserve_object(st, KVS_OWNER_LOCAL, &k, 0, &l, 0, &oc, &e, &x), -EINVAL);
  cr_assert_eq(kvs_store_reserve_object(st, 99, &k, 1, &l, 0, &oc, &e, &x), -ENOENT);
  cr_assert_eq(oc, 0xee, "out-parameters untouched on error");
  cr_assert_eq(e.offset, 1);
  cr_assert_eq(x, 3);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, NULL, 1, false, NULL), -EINVAL);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &k, 0, false, NULL), -EINVAL);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &k, 1, true, NULL), -EINVAL);
  cr_assert_eq(kvs_store_remove(st, NULL), -EINVAL);
  cr_assert_eq(kvs_store_remove(st, &k), -ENOENT);
  cr_assert_eq(kvs_store_owner_open(st, NULL), -EINVAL);
  cr_assert_eq(info().xfers, 0);
  cr_assert_eq(pool_free(), 16 * 4096);
  VALID();
}

/* ---- capacity and eviction ------------------------------------------------------------- */

Test(store, too_large_and_bad_layout, T_TIMEOUT) {
  setup(64);
  uint64_t base = pool_free();
  kvs_key_t keys[2] = {K(1), K(2)};
  uint8_t oc[2];
  kvs_extent_t ex[2];
  kvs_xfer_t x = 5;
  kvs_layout_t big = kvs_layout_blob(64 * 4096 + 1);
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, keys, 2, &big, 0, oc, ex, &x), 0);
  cr_assert_eq(oc[0], KVS_RES_TOO_LARGE);
  cr_assert_eq(oc[1], KVS_RES_TOO_LARGE);
  cr_assert_eq(x, 0);
  kvs_layout_t huge = {KVS_DTYPE_U8, 1, {~0ull}};
  cr_assert_eq(kvs_store_reserve_object(st, KVS_OWNER_LOCAL, keys, 1, &huge, 0, oc, ex, &x), 0);
  cr_assert_eq(oc[0], KVS_RES_TOO_LARGE);
  kvs_layout_t bad = {KVS_DTYPE_F16, 0, {0}};
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, keys, 2, &bad, 0, oc, ex, &x), 0);
  cr_assert_eq(oc[0], KVS_RES_BAD_LAYOUT);
  cr_assert_eq(oc[1], KVS_RES_BAD_LAYOUT);
  kvs_layout_t bad2 = {77, 1, {10}};
  cr_assert_eq(kvs_store_reserve_object(st, KVS_OWNER_LOCAL, keys, 2, &bad2, 0, oc, ex, &x), 0);
  cr_assert_eq(oc[0], KVS_RES_BAD_LAYOUT);
  cr_assert_eq(x, 0);
  VALID();
  cr_assert_eq(pool_free(), base);
  cr_assert_eq(info().xfers, 0);
  cr_assert_eq(stat(KVS_STAT_store_too_large), 3);
  cr_assert_eq(stat(KVS_STAT_store_bad_layout), 3);
  /* exactly the arena fits */
  cr_assert_eq(try1(K(3), 64 * 4096, 0, true), KVS_RES_RESERVED);
}

Test(store, full_pool_evicts_lru_order, T_TIMEOUT) {
  setup(64);
  for (uint64_t i = 0; i < 4; i++) put1(K(i), 16 * 4096); /* LRU: 0 1 2 3 */
  cr_assert_eq(pool_free(), 0);
  touch(K(0)); /* LRU: 1 2 3 0 */
  cr_assert_eq(try1(K(10), 16 * 4096, 0, true), KVS_RES_RESERVED); /* evicts 1 */
  cr_assert_not(ready(K(1)));
  cr_assert(ready(K(0)) && ready(K(2)) && ready(K(3)) && ready(K(10)));
  cr_assert_eq(stat(KVS_STAT_store_evictions), 1);
  cr_assert_eq(stat(KVS_STAT_store_evicted_bytes), 16 * PG);
  /* LRU: 2 3 0 10. 32 pages: evicts 2 and 3 */
  cr_assert_eq(try1(K(11), 32 * 4096, 0, true), KVS_RES_RESERVED);
  cr_assert_not(ready(K(2)));
  cr_assert_not(ready(K(3)));
  cr_assert(ready(K(0)) && ready(K(10)) && ready(K(11)));
  cr_assert_eq(stat(KVS_STAT_store_evictions), 3);
  kvs_store_info_t in = info();
  cr_assert_eq(in.used_bytes, 64 * PG);
  cr_assert_eq(in.objects_ready, 3);
  cr_assert_eq(in.keys, 3);
  VALID();
}

/* A pin leaves its object on the LRU (store.c, "LRU"): an eviction that meets it at the head
 * passes over it, and its release puts it at the tail, as if it had left the list at the pin. */
Test(store, pinned_objects_keep_their_lru_order, T_TIMEOUT) {
  setup(64);
  for (uint64_t i = 0; i < 4; i++) put1(K(i), 16 * 4096); /* LRU: 0 1 2 3 */
  kvs_xfer_t r0, r2;
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &(kvs_key_t){0, 42}, 1, true, &r0), 1);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &(kvs_key_t){2, 42}, 1, true, &r2), 1);
  VALID();
  /* 0 (the head) and 2 are pinned: the first eviction passes over 0 and takes 1 */
  cr_assert_eq(try1(K(10), 16 * 4096, 0, true), KVS_RES_RESERVED);
  cr_assert_not(ready(K(1)));
  cr_assert(ready(K(0)) && ready(K(2)) && ready(K(3)));
  /* releases: 2 then 0, so LRU: 3 10 2 0 */
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r2), 0);
  VALID();
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r0), 0);
  VALID();
  static const uint64_t victims[4] = {3, 10, 2, 0};
  for (uint64_t i = 0; i < 4; i++) {
    cr_assert_eq(try1(K(20 + i), 16 * 4096, 0, true), KVS_RES_RESERVED);
    cr_assert_not(ready(K(victims[i])), "eviction %llu: %llu should be gone",
                  (unsigned long long)i, (unsigned long long)victims[i]);
    for (uint64_t j = i + 1; j < 4; j++)
      cr_assert(ready(K(victims[j])), "eviction %llu took %llu out of LRU order",
                (unsigned long long)i, (unsigned long long)victims[j]);
  }
  cr_assert_eq(stat(KVS_STAT_store_evictions), 5);
  VALID();
}

/* A full cache of equal objects: a reservation takes its victim's extent (and its object and
 * key slots), never the pool's; the accounts stay exact. */
Test(store, full_cache_of_equal_objects_reuses_the_victims_extent, T_TIMEOUT) {
  setup(64);
  kvs_extent_t ex[4];
  for (uint64_t i = 0; i < 4; i++) {
    kvs_xfer_t x = reserve1(KVS_OWNER_LOCAL, K(i), 16 * 4096, &ex[i]);
    cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
  }
  for (uint64_t n = 0; n < 12; n++) {
    kvs_extent_t e;
    kvs_xfer_t x = reserve1(KVS_OWNER_LOCAL, K(100 + n), 16 * 4096, &e);
    cr_assert_eq(e.offset, ex[n % 4].offset, "reservation %llu: not the victim's extent",
                 (unsigned long long)n);
    cr_assert_not(ready(K(n < 4 ? n : 100 + n - 4)));
    cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
    VALID();
    kvs_store_info_t in = info();
    cr_assert_eq(in.used_bytes, 64 * PG);
    cr_assert_eq(in.objects_ready, 4);
    cr_assert_eq(in.keys, 4);
    cr_assert_eq(pool_free(), 0);
  }
  cr_assert_eq(stat(KVS_STAT_store_evictions), 12);
}

Test(store, batch_lru_order_keeps_the_prefix_head, T_TIMEOUT) {
  setup(8);
  kvs_key_t keys[4] = {K(0), K(1), K(2), K(3)};
  kvs_layout_t l = kvs_layout_blob(2 * 4096);
  uint8_t oc[4];
  kvs_extent_t ex[4];
  kvs_xfer_t x;
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, keys, 4, &l, 0, oc, ex, &x), 4);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
  /* the chain's last chunk is the least recently used one */
  cr_assert_eq(try1(K(9), 2 * 4096, 0, true), KVS_RES_RESERVED);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 4, false, NULL), 3);
  cr_assert_not(ready(K(3)));
  /* after a pinned read of [0, 1, 2], releasing touches 2, 1, 0: 2 goes next, not 0 */
  kvs_xfer_t r;
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 4, true, &r), 3);
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r), 0); /* LRU: 9 2 1 0 */
  cr_assert_eq(try1(K(20), 2 * 4096, 0, true), KVS_RES_RESERVED);
  cr_assert_not(ready(K(9)));
  cr_assert_eq(try1(K(21), 2 * 4096, 0, true), KVS_RES_RESERVED);
  cr_assert_not(ready(K(2)));
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 4, false, NULL), 2);
  VALID();
}

Test(store, pinned_and_writing_objects_survive_eviction, T_TIMEOUT) {
  setup(64);
  put1(K(0), 16 * 4096);
  put1(K(1), 16 * 4096);
  put1(K(2), 16 * 4096);
  kvs_xfer_t w = reserve1(KVS_OWNER_LOCAL, K(3), 16 * 4096, NULL); /* WRITING */
  kvs_xfer_t r;
  kvs_key_t k01[2] = {K(0), K(1)};
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, k01, 2, true, &r), 2);
  /* only K(2) is evictable */
  cr_assert_eq(try1(K(10), 16 * 4096, 0, true), KVS_RES_RESERVED);
  cr_assert_not(ready(K(2)));
  uint64_t ev = stat(KVS_STAT_store_evictions);
  cr_assert_eq(try1(K(11), 16 * 4096, 0, false), KVS_RES_RESERVED, "K(10) is evictable");
  cr_assert_not(ready(K(10)));
  /* now everything is pinned or WRITING: NO_SPACE, and nothing is lost */
  uint8_t oc = try1(K(12), 4096, 0, false);
  cr_assert_eq(oc, KVS_RES_NO_SPACE);
  cr_assert_eq(stat(KVS_STAT_store_no_space), 1);
  cr_assert_eq(stat(KVS_STAT_store_evictions), ev + 1);
  cr_assert(ready(K(0)) && ready(K(1)));
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, w), 0);
  cr_assert(ready(K(3)));
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r), 0);
  VALID();
}

Test(store, no_space_does_not_empty_the_cache, T_TIMEOUT) {
  setup(64);
  put1(K(0), 16 * 4096);
  put1(K(1), 16 * 4096);
  kvs_xfer_t w = reserve1(KVS_OWNER_LOCAL, K(2), 24 * 4096, NULL);
  /* 8 free + 32 evictable < 48: evicting could not help, so nothing is evicted */
  cr_assert_eq(try1(K(3), 48 * 4096, 0, false), KVS_RES_NO_SPACE);
  cr_assert(ready(K(0)) && ready(K(1)));
  cr_assert_eq(stat(KVS_STAT_store_evictions), 0);
  cr_assert_eq(kvs_store_abort(st, KVS_OWNER_LOCAL, w), 0);
  VALID();
}

Test(store, no_evict_mode, T_TIMEOUT) {
  setup(64);
  for (uint64_t i = 0; i < 4; i++) put1(K(i), 16 * 4096);
  cr_assert_eq(try1(K(10), 4096, KVS_RESERVE_NO_EVICT, false), KVS_RES_NO_SPACE);
  for (uint64_t i = 0; i < 4; i++) cr_assert(ready(K(i)));
  cr_assert_eq(stat(KVS_STAT_store_evictions), 0);
  cr_assert_eq(try1(K(10), 4096, 0, true), KVS_RES_RESERVED);
  cr_assert_not(ready(K(0)));
  cr_assert_eq(stat(KVS_STAT_store_evictions), 1);
  VALID();
}

Test(store, object_table_full_evicts_or_reports_no_space, T_TIMEOUT) {
  kvs_store_config_t c = {0};
  c.max_objects = 2;
  setup_cfg(64, &c);
  put1(K(0), 100);
  put1(K(1), 100);
  cr_assert_eq(try1(K(2), 100, KVS_RESERVE_NO_EVICT, false), KVS_RES_NO_SPACE);
  cr_assert_eq(try1(K(2), 100, 0, true), KVS_RES_RESERVED);
  cr_assert_not(ready(K(0)));
  cr_assert(ready(K(1)) && ready(K(2)));
  VALID();
}

Test(store, transfer_and_pin_tables_full, T_TIMEOUT) {
  kvs_store_config_t c = {0};
  c.max_xfers = 2;
  c.max_pins = 3;
  setup_cfg(64, &c);
  put1(K(0), 100);
  put1(K(1), 100);
  put1(K(2), 100);
  kvs_key_t keys[3] = {K(0), K(1), K(2)};
  kvs_xfer_t r1, r2, r3 = 9;
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 2, true, &r1), 2);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 3, true, &r2), 1, "pins run out");
  VALID();
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 3, true, &r3), -ENOSPC);
  cr_assert_eq(r3, 9);
  kvs_layout_t l = kvs_layout_blob(100);
  kvs_key_t k = K(7);
  uint8_t oc = 0xee;
  kvs_extent_t e;
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &k, 1, &l, 0, &oc, &e, &r3), -ENOSPC);
  cr_assert_eq(oc, 0xee);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 3, false, NULL), 3, "count needs no pin");
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r1), 0);
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r2), 0);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, keys, 3, true, &r3), 3);
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r3), 0);
  VALID();
}

Test(store, all_or_nothing, T_TIMEOUT) {
  setup(64);
  put1(K(0), 16 * 4096);
  kvs_xfer_t w = reserve1(KVS_OWNER_LOCAL, K(1), 16 * 4096, NULL);
  uint64_t f = pool_free();
  kvs_layout_t l = kvs_layout_blob(8 * 4096);
  kvs_key_t keys[3] = {K(0), K(5), K(1)}; /* PRESENT, new, BUSY */
  uint8_t oc[3];
  kvs_extent_t ex[3];
  kvs_xfer_t x = 7;
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, keys, 3, &l,
                                       KVS_RESERVE_ALL_OR_NOTHING, oc, ex, &x), 0);
  VALID();
  cr_assert_eq(x, 0);
  cr_assert_eq(oc[0], KVS_RES_PRESENT);
  cr_assert_eq(oc[1], KVS_RES_SKIPPED, "a key that did not block is SKIPPED");
  cr_assert_eq(oc[2], KVS_RES_BUSY, "the key that blocked says why");
  cr_assert_eq(pool_free(), f);
  cr_assert_not(ready(K(5)));
  cr_assert_eq(info().objects_writing, 1);

  /* does not fit even after evicting K(0): NO_SPACE for the new keys, K(0) not evicted */
  kvs_key_t big[4] = {K(10), K(11), K(12), K(13)};
  kvs_layout_t l16 = kvs_layout_blob(16 * 4096);
  uint8_t oc4[4];
  kvs_extent_t ex4[4];
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, big, 4, &l16,
                                       KVS_RESERVE_ALL_OR_NOTHING, oc4, ex4, &x), 0);
  for (int i = 0; i < 4; i++) cr_assert_eq(oc4[i], KVS_RES_NO_SPACE);
  cr_assert(ready(K(0)));
  cr_assert_eq(pool_free(), f);
  cr_assert_eq(stat(KVS_STAT_store_evictions), 0);

  /* a duplicate found mid-call rolls back what the call reserved */
  kvs_key_t dup[3] = {K(20), K(21), K(20)};
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, dup, 3, &l,
                                       KVS_RESERVE_ALL_OR_NOTHING, oc, ex, &x), 0);
  VALID();
  cr_assert_eq(oc[0], KVS_RES_SKIPPED);
  cr_assert_eq(oc[1], KVS_RES_SKIPPED);
  cr_assert_eq(oc[2], KVS_RES_BUSY, "the duplicate blocked the call");
  cr_assert_eq(x, 0);
  cr_assert_eq(pool_free(), f);
  cr_assert_eq(info().xfers, 1);

  /* fits (with eviction of K(0)): all reserved */
  kvs_key_t ok[3] = {K(30), K(31), K(32)};
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, ok, 3, &l16,
                                       KVS_RESERVE_ALL_OR_NOTHING, oc, ex, &x), 3);
  cr_assert_neq(x, 0);
  cr_assert_not(ready(K(0)));
  cr_assert_eq(pool_free(), 0);
  /* with NO_EVICT the pre-check counts only free bytes */
  kvs_key_t one = K(40);
  cr_assert_eq(kvs_store_reserve_write(st, KVS_OWNER_LOCAL, &one, 1, &l,
                                       KVS_RESERVE_ALL_OR_NOTHING | KVS_RESERVE_NO_EVICT, oc,
                                       ex, &x), 0);
  cr_assert_eq(oc[0], KVS_RES_NO_SPACE);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, w), 0);
  VALID();
}

/* ---- aliases --------------------------------------------------------------------------- */

Test(store, aliases, T_TIMEOUT) {
  setup(64);
  put1(K(102), 4096); /* this key is taken before the blob commits */
  kvs_key_t keys[4] = {K(100), K(101), K(102), K(103)};
  kvs_layout_t l = kvs_layout_blob(3 * 4096);
  uint8_t oc;
  kvs_extent_t e;
  kvs_xfer_t x;
  cr_assert_eq(kvs_store_reserve_object(st, KVS_OWNER_LOCAL, keys, 4, &l, 0, &oc, &e, &x), 1);
  VALID();
  cr_assert_eq(oc, KVS_RES_RESERVED);
  cr_assert_eq(e.length, 3 * 4096);
  cr_assert_eq(info().objects_writing, 1);
  cr_assert_eq(info().reserved_bytes, 3 * PG, "one extent for all keys");
  for (int i = 0; i < 4; i++)
    if (i != 2) cr_assert_not(ready(keys[i]), "nothing readable before commit");
  put1(K(103), 4096); /* taken while the blob is being written: its alias gets skipped */
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
  VALID();
  cr_assert_eq(stat(KVS_STAT_store_alias_skipped), 2);
  cr_assert_eq(info().keys, 4, "100, 101 (blob), 102, 103 (their own objects)");
  /* lookup by alias returns the object, keyed by the alias */
  kvs_xfer_t r;
  kvs_object_view_t v;
  kvs_key_t a = K(101);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &a, 1, true, &r), 1);
  cr_assert_eq(kvs_store_read_pinned(st, KVS_OWNER_LOCAL, r, &v, 1), 1);
  cr_assert(kvs_key_eq(v.key, K(101)));
  cr_assert_eq(v.extent.offset, e.offset);
  cr_assert_eq(v.extent.length, 3 * 4096);
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r), 0);
  /* the taken aliases still name their own objects */
  kvs_key_t t = K(102);
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &t, 1, true, &r), 1);
  cr_assert_eq(kvs_store_read_pinned(st, KVS_OWNER_LOCAL, r, &v, 1), 1);
  cr_assert_neq(v.extent.offset, e.offset);
  cr_assert_eq(v.extent.length, 4096);
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r), 0);
  /* reserving the primary again or an alias of it: PRESENT */
  cr_assert_eq(try1(K(101), 10, 0, false), KVS_RES_PRESENT);
  cr_assert_eq(kvs_store_reserve_object(st, KVS_OWNER_LOCAL, keys, 2, &l, 0, &oc, &e, &x), 0);
  cr_assert_eq(oc, KVS_RES_PRESENT);
  /* removing by the alias deletes the object and all its keys */
  uint64_t f = pool_free();
  cr_assert_eq(kvs_store_remove(st, &a), 0);
  VALID();
  cr_assert_not(ready(K(100)));
  cr_assert_not(ready(K(101)));
  cr_assert(ready(K(102)) && ready(K(103)));
  cr_assert_eq(pool_free(), f + 3 * PG);
  cr_assert_eq(info().keys, 2);
  cr_assert_eq(stat(KVS_STAT_store_removed), 1);
}

Test(store, aliases_die_with_the_object_on_eviction_and_abort, T_TIMEOUT) {
  setup(16);
  kvs_key_t keys[3] = {K(1), K(2), K(3)};
  /* abort: no key survives */
  kvs_xfer_t x = reserve_keys(KVS_OWNER_LOCAL, keys, 3, true, 8 * 4096, NULL);
  cr_assert_eq(kvs_store_abort(st, KVS_OWNER_LOCAL, x), 0);
  VALID();
  cr_assert_eq(info().keys, 0);
  cr_assert_eq(pool_free(), 16 * 4096);
  /* evicted: every alias goes */
  x = reserve_keys(KVS_OWNER_LOCAL, keys, 3, true, 8 * 4096, NULL);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
  cr_assert_eq(info().keys, 3);
  cr_assert(ready(K(3)));
  cr_assert_eq(try1(K(9), 12 * 4096, 0, true), KVS_RES_RESERVED);
  VALID();
  for (int i = 0; i < 3; i++) cr_assert_not(ready(keys[i]));
  cr_assert_eq(info().keys, 1);
  /* alias keys are free again for other objects */
  cr_assert_eq(kvs_store_remove(st, &(kvs_key_t){9, 42}), 0);
  cr_assert_eq(try1(K(2), 4096, 0, true), KVS_RES_RESERVED);
  VALID();
}

Test(store, alias_duplicates_and_self, T_TIMEOUT) {
  setup(16);
  kvs_key_t keys[4] = {K(1), K(1), K(2), K(2)};
  kvs_xfer_t x = reserve_keys(KVS_OWNER_LOCAL, keys, 4, true, 4096, NULL);
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, x), 0);
  VALID();
  cr_assert_eq(info().keys, 2);
  cr_assert_eq(stat(KVS_STAT_store_alias_skipped), 2);
  cr_assert_eq(kvs_store_remove(st, &keys[3]), 0);
  cr_assert_eq(info().keys, 0);
  VALID();
}

/* ---- remove ---------------------------------------------------------------------------- */

Test(store, remove, T_TIMEOUT) {
  setup(64);
  uint64_t base = pool_free();
  kvs_key_t k = K(1);
  cr_assert_eq(kvs_store_remove(st, &k), -ENOENT);
  kvs_xfer_t w = reserve1(KVS_OWNER_LOCAL, k, 4096, NULL);
  cr_assert_eq(kvs_store_remove(st, &k), -EBUSY, "WRITING");
  cr_assert_eq(kvs_store_commit(st, KVS_OWNER_LOCAL, w), 0);
  kvs_xfer_t r;
  cr_assert_eq(kvs_store_lookup(st, KVS_OWNER_LOCAL, &k, 1, true, &r), 1);
  cr_assert_eq(kvs_store_remove(st, &k), -EBUSY, "pinned");
  cr_assert(ready(k));
  cr_assert_eq(kvs_store_release(st, KVS_OWNER_LOCAL, r), 0);
  cr_assert_eq(kvs_store_remove(st, &k), 0);
  VALID();
  cr_assert_not(ready(k));
  cr_assert_eq(pool_free(), base);
  cr_assert_eq(kvs_store_remove(st, &k), -ENOENT);
  kvs_store_info_t in = info();
  cr_assert_eq(in.objects_ready + in.keys + in.used_bytes, 0);
}

Test(store, gauges_follow_info, T_TIMEOUT) {
  setup(64);
  put1(K(1), 3 * 4096);
  reserve1(KVS_OWNER_LOCAL, K(2), 4096, NULL);
  kvs_store_info_t in = info();
  cr_assert_eq(stat(KVS_STAT_store_objects), in.objects_ready);
  cr_assert_eq(stat(KVS_STAT_store_keys), in.keys);
  cr_assert_eq(stat(KVS_STAT_store_used_bytes), in.used_bytes);
  cr_assert_eq(stat(KVS_STAT_store_reserved_bytes), in.reserved_bytes);
  cr_assert_eq(stat(KVS_STAT_store_free_bytes), in.free_bytes);
  cr_assert_eq(stat(KVS_STAT_store_arena_bytes), ARENA);
  cr_assert_eq(in.used_bytes + in.reserved_bytes + in.free_bytes, in.arena_bytes);
  cr_assert_eq(stat(KVS_STAT_store_reserve_calls), 2);
  cr_assert_eq(stat(KVS_STAT_store_reserved), 2);
}
