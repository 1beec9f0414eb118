/* runtime/cache (design §3.7): the facade's tier order and fallbacks, against real in-process
 * coordinators (tests/core/wire/coord_client.h's ts_server): L is this process's own pool and
 * store (the runtime's), C a `kvshim serve` cache peer (role CACHE), O another engine (role
 * ENGINE), all three in one group. The runtime under test is built by hand around L, with its
 * own peer client, as runtime.c builds it around the engine's pool.
 *
 * What each case proves (a peer "asked" = a request reached its coordinator, coord_requests):
 *   local_hit_asks_no_peer       lookup and load of chunks held locally ask no peer at all
 *   miss_asks_cache_peer_only    one copy: a local miss asks the cache peer alone, loads copy
 *                                from its pool and keep nothing locally
 *   cache_peer_answer_is_final   one copy: what the cache peer lacks is not asked of others
 *   no_cache_peer_asks_others    one copy off: the other peers are asked; a load copies from
 *                                the peer the lookup found and the chunk is kept behind
 *   dead_cache_peer_falls_back   the cache peer gone: lookup and load are served by the others
 *   refused_load_leaves_buffer   a local object of another size, a copy that fails, no tier:
 *                                0, the caller's buffer untouched (the engine's path)
 *   save_tier_order              one copy: a save lands in the cache peer only; off: locally
 *   failed_save_publishes_nothing  a copy that fails publishes nothing anywhere
 *   object_flows                 reserve/commit/pin, fetch + keep, a fetch from the cache peer
 *                                staged only, marks
 *   watch                        a WATCH at a peer: held while keys[0] stays, gone once it goes;
 *                                no peer client: -ENOENT, nothing asked
 * The discovery watcher (runtime/discovery.c, design §3.8):
 *   discovery.cache_peer_event   a step that finds a cache peer adopts it (the own pool sized
 *                                lean); one that finds it gone drops it (full size again)
 *   discovery.watcher_first_scan the watcher's first scan finds the peers before
 *                                wait_watcher returns; stopped, nobody waits */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "coord_client.h"
#include "discovery.h"
#include "hooks.h"
#include "peer.h"
#include "runtime.h"

/* The assembly (preload/) lists the families; this runtime has none. */
const kvs__family_t *const kvs__families[] = {NULL};
const size_t kvs__n_families = 0;

#define T_TIMEOUT .timeout = 60
enum { N = 4 };

static ts_server_t L, C, O;
static kvs__runtime_t rt; /* static: the keep-behind thread reads it */

static kvs_layout_t chunk_layout(void) { return ts_chunk_layout(16, 1024); }
#define CHUNK (16u * 1024u)

static void server(ts_server_t *s, uint8_t role, const char *run_dir, uint64_t nr) {
  cr_assert_eq(ts_server_init(s, 16u << 20), 0);
  s->instance_id = tk((uint64_t)getpid(), nr).lo | 1; /* distinct within one millisecond */
  if (run_dir) snprintf(s->opts.run_dir, sizeof s->opts.run_dir, "%s", run_dir);
  s->role = role;
  cr_assert_eq(ts_server_start(s), 0);
}

/* L, C (unless !cache) and O, and the runtime around L with one-copy mode as given. */
static void start(bool cache, bool one_copy) {
  server(&L, KVS_PROTO_ROLE_ENGINE, NULL, 1);
  if (cache) server(&C, KVS_PROTO_ROLE_CACHE, L.opts.run_dir, 2);
  server(&O, KVS_PROTO_ROLE_ENGINE, L.opts.run_dir, 3);
  memset(&rt, 0, sizeof rt);
  kvs_config_defaults(&rt.opts);
  rt.opts.core = L.opts;
  rt.opts.one_copy = one_copy;
  rt.pool = L.pool;
  rt.store = L.store;
  rt.instance_id = L.instance_id;
  kvs_peers_config_t pc = {.opts = &rt.opts.core, .instance_id = L.instance_id,
                           .role = KVS_PROTO_ROLE_ENGINE, .local = L.store};
  cr_assert_eq(kvs_peers_create(&pc, &rt.peers), 0);
  cr_assert_eq(kvs_peers_discover(rt.peers, true), cache ? 2 : 1);
}

static void down(void) {
  if (rt.peers) kvs_peers_destroy(rt.peers);
  rt.peers = NULL;
  ts_server_t *all[] = {&L, &C, &O};
  for (size_t i = 0; i < 3; i++)
    if (all[i]->root[0]) ts_server_stop(all[i], true);
  memset(&L, 0, sizeof L);
  memset(&C, 0, sizeof C);
  memset(&O, 0, sizeof O);
}

static uint64_t asked(const ts_server_t *s) { return ts_stat(s, KVS_STAT_coord_requests); }
static uint64_t gstat(kvs_stat_id_t id) { return kvs_stats_get(kvs_stats_global(), id); }

static void keys(kvs_key_t *k, uint64_t seed) {
  for (int i = 0; i < N; i++) k[i] = tk(seed, (uint64_t)i);
}

static int copy_ok(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  (void)i;
  if (ctx) ++*(int *)ctx;
  memcpy(dst, src, len);
  return 0;
}
static int copy_fail(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  (void)ctx, (void)i, (void)dst, (void)src, (void)len;
  return -EIO;
}

/* Load every key into a fresh buffer and check its pattern; returns how many loaded. */
static int load_all(const kvs_key_t *k) {
  kvs_layout_t l = chunk_layout();
  static uint8_t buf[CHUNK];
  int loaded = 0;
  for (int i = 0; i < N; i++) {
    memset(buf, 0xa5, sizeof buf);
    if (kvs__cache_load(&rt, k[i], &l, buf, copy_ok, NULL) != 1) continue;
    cr_assert_eq(pat_check(buf, CHUNK, k[i]), 0, "chunk %d: wrong bytes", i);
    loaded++;
  }
  return loaded;
}

/* Release this thread's keep-behind chunks and wait (10 s at most) until the keep-behind thread
 * has them all in the local store; returns how many it holds. A test whose loads queued keeps
 * waits for them before its teardown destroys the store the thread commits into. */
static int wait_kept(const kvs_key_t *k);

static size_t lookup(const kvs_key_t *k) {
  kvs__cache_lookup_start();
  return kvs__cache_lookup(&rt, k, N);
}

static int local_count(const kvs_key_t *k) {
  int n = 0;
  for (int i = 0; i < N; i++) n += kvs__cache_has_local(&rt, k[i]);
  return n;
}

static int wait_kept(const kvs_key_t *k) {
  kvs__cache_lookup_start();
  uint64_t t0 = ts_now_ms();
  while (local_count(k) < N && ts_now_ms() - t0 < 10000) usleep(10000);
  return local_count(k);
}

/* Every case opens the same way: the servers and the runtime (start), keys k[N] of seed, and
 * the whole run of chunks put into each server of held (NULL-terminated; may be empty). */
static void open_case(bool cache, bool one_copy, uint64_t seed, kvs_key_t *k,
                      ts_server_t *const *held) {
  start(cache, one_copy);
  keys(k, seed);
  kvs_layout_t l = chunk_layout();
  for (; *held; held++) cr_assert_eq(ts_local_put((*held)->store, k, N, &l), N);
}
#define HELD(...) ((ts_server_t *const[]){__VA_ARGS__, NULL})
#define NOWHERE ((ts_server_t *const[]){NULL})

Test(cache, local_hit_asks_no_peer, T_TIMEOUT, .fini = down) {
  kvs_key_t k[N];
  open_case(true, true, 1, k, HELD(&L, &C, &O));
  uint64_t c0 = asked(&C), o0 = asked(&O);
  cr_assert_eq(lookup(k), N);
  cr_assert_eq(load_all(k), N);
  cr_assert_eq(asked(&C), c0, "the cache peer was asked for what is local");
  cr_assert_eq(asked(&O), o0, "another peer was asked for what is local");
}

Test(cache, miss_asks_cache_peer_only, T_TIMEOUT, .fini = down) {
  kvs_key_t k[N];
  open_case(true, true, 2, k, HELD(&C, &O));
  uint64_t c0 = asked(&C), o0 = asked(&O), loads0 = gstat(KVS_STAT_cache_peer_loads);
  cr_assert_eq(lookup(k), N);
  cr_assert_gt(asked(&C), c0, "the cache peer was not asked");
  cr_assert_eq(load_all(k), N);
  cr_assert_eq(asked(&O), o0, "another peer was asked while the cache peer answered");
  cr_assert_eq(gstat(KVS_STAT_cache_peer_loads) - loads0, N);
  cr_assert_eq(local_count(k), 0, "one copy per node: nothing is kept locally");
}

Test(cache, cache_peer_answer_is_final, T_TIMEOUT, .fini = down) {
  kvs_key_t k[N];
  open_case(true, true, 3, k, HELD(&O));
  uint64_t o0 = asked(&O);
  cr_assert_eq(lookup(k), 0);
  cr_assert_eq(asked(&O), o0, "one copy: another peer was asked after the cache peer answered");
}

Test(cache, no_cache_peer_asks_others, T_TIMEOUT, .fini = down) {
  kvs_key_t k[N]; /* a cache peer is there, but one copy is off */
  open_case(true, false, 4, k, HELD(&O));
  uint64_t o0 = asked(&O);
  cr_assert_eq(lookup(k), N);
  cr_assert_gt(asked(&O), o0, "the peer holding the chunks was not asked");
  cr_assert_eq(load_all(k), N);
  /* Kept behind the engine: the keep-behind thread fetches them into the local store. */
  cr_assert_eq(wait_kept(k), N, "the chunks a peer served were not kept locally");
  uint64_t after = asked(&O);
  cr_assert_eq(lookup(k), N);
  cr_assert_eq(load_all(k), N);
  cr_assert_eq(asked(&O), after, "kept chunks are served locally");
}

Test(cache, dead_cache_peer_falls_back, T_TIMEOUT, .fini = down) {
  kvs_key_t k[N];
  open_case(true, true, 5, k, HELD(&C, &O));
  ts_server_stop(&C, true);
  memset(&C, 0, sizeof C);
  cr_assert_eq(lookup(k), N);
  cr_assert_eq(load_all(k), N);
  cr_assert_eq(wait_kept(k), N); /* served by O, so kept behind */
}

Test(cache, refused_load_leaves_buffer, T_TIMEOUT, .fini = down) {
  kvs_key_t k[N];
  open_case(false, true, 6, k, NOWHERE);
  kvs_layout_t small = chunk_layout();
  small.shape[0] = 8; /* another object under k[0]: half the size */
  cr_assert_eq(ts_local_put(L.store, k, 1, &small), 1);
  kvs_layout_t l = chunk_layout();
  cr_assert_eq(ts_local_put(L.store, k + 1, 1, &l), 1);
  static uint8_t buf[CHUNK], want[CHUNK];
  memset(buf, 0x5a, sizeof buf);
  memset(want, 0x5a, sizeof want);
  uint64_t fb0 = gstat(KVS_STAT_hook_fallbacks);
  cr_assert_eq(kvs__cache_load(&rt, k[0], &l, buf, copy_ok, NULL), 0);
  cr_assert_eq(kvs__cache_load(&rt, k[1], &l, buf, copy_fail, NULL), 0);
  cr_assert_eq(kvs__cache_load(&rt, k[2], &l, buf, copy_ok, NULL), 0); /* nowhere */
  cr_assert_eq(memcmp(buf, want, sizeof buf), 0, "a refused load wrote the caller's buffer");
  cr_assert_eq(gstat(KVS_STAT_hook_fallbacks) - fb0, 2);
  /* No peer client at all (KVSHIM_PEERS=0): local only. */
  kvs_peers_t *p = rt.peers;
  rt.peers = NULL;
  cr_assert_eq(kvs__cache_lookup(&rt, k + 1, 1), 1);
  cr_assert_eq(kvs__cache_load(&rt, k[2], &l, buf, copy_ok, NULL), 0);
  rt.peers = p;
}

Test(cache, save_tier_order, T_TIMEOUT, .fini = down) {
  kvs_key_t k[N];
  open_case(true, true, 7, k, NOWHERE);
  kvs_layout_t l = chunk_layout();
  static uint8_t src[CHUNK];
  pat_fill(src, CHUNK, k[0]);
  uint64_t st0 = gstat(KVS_STAT_cache_peer_stores);
  cr_assert_eq(kvs__cache_save(&rt, k[0], &l, src, copy_ok, NULL), 0);
  cr_assert_eq(gstat(KVS_STAT_cache_peer_stores) - st0, 1);
  cr_assert_eq(ts_local_verify(C.store, k, 1), 1, "the cache peer does not hold the save");
  cr_assert_eq(local_count(k), 0, "one copy: the save was kept locally too");
  rt.opts.one_copy = 0;
  pat_fill(src, CHUNK, k[1]);
  cr_assert_eq(kvs__cache_save(&rt, k[1], &l, src, copy_ok, NULL), 0);
  cr_assert_eq(ts_local_verify(L.store, k + 1, 1), 1, "one copy off: the save is not local");
  /* Already held: PRESENT is a success, the copy is not run again. */
  int copies = 0;
  cr_assert_eq(kvs__cache_save(&rt, k[1], &l, src, copy_ok, &copies), 0);
  cr_assert_eq(copies, 0);
}

Test(cache, failed_save_publishes_nothing, T_TIMEOUT, .fini = down) {
  kvs_key_t k[N];
  open_case(true, true, 8, k, NOWHERE);
  kvs_layout_t l = chunk_layout();
  static uint8_t src[CHUNK];
  kvs_store_info_t base = ts_info(L.store);
  cr_assert_eq(kvs__cache_save(&rt, k[0], &l, src, copy_fail, NULL), -EIO);
  cr_assert_eq(ts_local_count(C.store, k, 1), 0, "a failed copy was published at the cache peer");
  cr_assert_eq(local_count(k), 0, "a failed copy was published locally");
  cr_assert_geq(ts_wait_baseline(L.store, &base, NULL, 0, 5000), 0, "a reservation leaked");
}

static int keys_none(void *ctx, size_t i, const void *bytes, uint64_t len, const kvs_key_t **k) {
  (void)i, (void)bytes, (void)len;
  *k = ctx;
  return 1;
}

Test(cache, object_flows, T_TIMEOUT, .fini = down) {
  kvs_key_t k[N];
  open_case(true, true, 9, k, NOWHERE);
  /* Own pool: reserve (invisible until commit), commit, pin. */
  uint8_t *bytes = NULL;
  kvs__cache_ref_t ref = 0;
  cr_assert_eq(kvs__cache_reserve(&rt, k, 2, 4096, false, &bytes, &ref), 0);
  pat_fill(bytes, 4096, k[0]);
  cr_assert_not(kvs__cache_has_local(&rt, k[0]));
  cr_assert_eq(kvs__cache_commit(&rt, k, 2, ref), 0);
  cr_assert(kvs__cache_has_local(&rt, k[1]), "the alias is not bound");
  /* The commit queued a write-behind push to C, whose pin would make the drop below wait (a
   * remove that finds a reader is skipped): let it end first. */
  cr_assert_eq(kvs_peers_flush(rt.peers, 5000), 0);
  cr_assert_eq(kvs__cache_reserve(&rt, k, 1, 4096, false, &bytes, &ref), -EEXIST);
  const uint8_t *b;
  uint64_t len;
  cr_assert(kvs__cache_pin(&rt, k[1], &b, &len, &ref));
  cr_assert_eq(len, 4096);
  cr_assert_eq(pat_check(b, len, k[0]), 0);
  kvs__cache_unpin(&rt, k[1], ref, true); /* drop: the caller's check refused it */
  cr_assert_not(kvs__cache_has_local(&rt, k[0]));
  /* Fetch from another peer: kept when asked to. */
  kvs_layout_t l = kvs_layout_blob(4096);
  cr_assert_eq(ts_local_put(O.store, k + 2, 1, &l), 1);
  kvs__cache_fetch_t f;
  cr_assert_eq(kvs__cache_fetch(&rt, O.instance_id, k[2], keys_none, &k[2], &f),
               KVS__CACHE_COPIED);
  cr_assert_eq(pat_check(f.bytes, f.len, k[2]), 0);
  cr_assert_not(f.staged);
  kvs__cache_fetch_end(&rt, &f, true);
  cr_assert(kvs__cache_has_local(&rt, k[2]));
  cr_assert_eq(kvs__cache_fetch(&rt, O.instance_id, k[2], NULL, NULL, &f), KVS__CACHE_LOCAL);
  /* From the cache peer in one-copy mode: staging only, never kept. */
  cr_assert_eq(ts_local_put(C.store, k + 3, 1, &l), 1);
  cr_assert_eq(kvs__cache_peer(&rt), C.instance_id);
  cr_assert_eq(kvs__cache_fetch(&rt, C.instance_id, k[3], keys_none, &k[3], &f),
               KVS__CACHE_COPIED);
  cr_assert(f.staged);
  kvs__cache_fetch_end(&rt, &f, true);
  cr_assert_not(kvs__cache_has_local(&rt, k[3]));
  /* Marks: local objects a peer finds with a lookup. */
  kvs_key_t mark = tk(9, 100);
  cr_assert(kvs__cache_mark(&rt, mark, 42));
  cr_assert(kvs__cache_has_local(&rt, mark));
  kvs__cache_unmark(&rt, mark);
  cr_assert_not(kvs__cache_has_local(&rt, mark));
}

Test(cache, watch, T_TIMEOUT, .fini = down) {
  kvs_key_t k[N];
  open_case(false, true, 10, k, NOWHERE);
  kvs_layout_t l = kvs_layout_blob(8);
  cr_assert_eq(ts_local_put(O.store, k, 1, &l), 1);
  kvs_key_t w[2] = {k[0], k[1]}; /* wait for k[0] to go or k[1] to come */
  cr_assert_eq(kvs__cache_watch(&rt, O.instance_id, w, 2, 50), (int)KVS_PROTO_WATCH_HELD);
  cr_assert_eq(kvs_store_remove(O.store, &k[0]), 0);
  cr_assert_eq(kvs__cache_watch(&rt, O.instance_id, w, 2, 2000), (int)KVS_PROTO_WATCH_GONE);
  kvs_peers_t *p = rt.peers;
  rt.peers = NULL;
  uint64_t o0 = asked(&O);
  cr_assert_eq(kvs__cache_watch(&rt, O.instance_id, w, 2, 50), -ENOENT);
  cr_assert_eq(asked(&O), o0);
  rt.peers = p;
}

/* One step of discovery (the watcher's tick, by hand) runs the adoption event: the pool is lean
 * exactly while a cache peer is in the group, and the facade's cache peer follows. */
Test(discovery, cache_peer_event, T_TIMEOUT, .fini = down) {
  start(false, true);
  uint64_t full = kvs_pool_limit(rt.pool);
  rt.opts.pool_lean_size = 1u << 20;
  cr_assert_gt(full, rt.opts.pool_lean_size);
  int live = kvs__discovery_tick(&rt, true);
  cr_assert_eq(live, 1, "live peers %d (O only)", live);
  cr_assert_eq(kvs__cache_peer(&rt), 0);
  cr_assert_eq(kvs_pool_limit(rt.pool), full);
  server(&C, KVS_PROTO_ROLE_CACHE, L.opts.run_dir, 2);
  cr_assert_eq(kvs__discovery_tick(&rt, true), 2);
  cr_assert_eq(kvs__cache_peer(&rt), C.instance_id);
  cr_assert_eq(kvs_pool_limit(rt.pool), rt.opts.pool_lean_size, "pool not lean: %llu",
               (unsigned long long)kvs_pool_limit(rt.pool));
  ts_server_stop(&C, true);
  memset(&C, 0, sizeof C);
  live = kvs__discovery_tick(&rt, true);
  cr_assert_eq(live, 1, "live peers %d after the cache peer stopped", live);
  cr_assert_eq(kvs__cache_peer(&rt), 0);
  cr_assert_eq(kvs_pool_limit(rt.pool), full);
}

/* The watcher's first scan is done (the peers known) when wait_watcher returns; once it is
 * stopped nobody waits for a scan that will not come; no scan at all without a peer client. */
Test(discovery, watcher_first_scan, T_TIMEOUT, .fini = down) {
  start(true, true);
  kvs_peers_t *mine = rt.peers; /* a fresh client: the watcher's scan must find the peers */
  kvs_peers_config_t pc = {.opts = &rt.opts.core, .instance_id = L.instance_id,
                           .role = KVS_PROTO_ROLE_ENGINE, .local = L.store};
  cr_assert_eq(kvs_peers_create(&pc, &rt.peers), 0);
  cr_assert_eq(kvs__cache_peer(&rt), 0, "a fresh client knows no cache peer before a scan");
  cr_assert_eq(kvs__discovery_start(&rt), 0);
  kvs__discovery_wait_watcher();
  cr_assert_eq(kvs__cache_peer(&rt), C.instance_id);
  kvs__discovery_stop();
  uint64_t t0 = ts_now_ms();
  kvs__discovery_wait_watcher();
  kvs__discovery_wait_first();
  cr_assert_lt(ts_now_ms() - t0, 1000);
  kvs_peers_destroy(rt.peers);
  rt.peers = mine;
  cr_assert_eq(kvs__discovery_scan(NULL), 0);
  cr_assert_eq(kvs__discovery_tick(&(kvs__runtime_t){0}, true), 0);
}
