/* Round trips of a retrieve (issue 15, docs/protocol.md 6 "SHM retrieve"): with one peer to
 * ask, kvs_peers_retrieve with no instance sends PREPARE_RETRIEVE straight away (its n_found is
 * the lookup), not LOOKUP then PREPARE_RETRIEVE; with several peers it still asks each with a
 * LOOKUP and retrieves from the longest run. The server's coord_requests counter tells which
 * requests reached it: a PING on the same connection after the retrieve makes sure the posted
 * COMMIT_RETRIEVE was served first (requests are answered in order, 2.2). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "coord_client.h"
#include "peer.h"

#define T_TIMEOUT .timeout = 90

static ts_server_t S, S2;

static void down(void) {
  if (S2.root[0]) ts_server_stop(&S2, true);
  if (S.root[0]) ts_server_stop(&S, true);
  memset(&S, 0, sizeof S);
  memset(&S2, 0, sizeof S2);
}

static void start(ts_server_t *s, const ts_server_t *same_dir) {
  cr_assert_eq(ts_server_init(s, 8u << 20), 0);
  if (same_dir) {
    memcpy(s->opts.run_dir, same_dir->opts.run_dir, sizeof s->opts.run_dir);
    s->instance_id = same_dir->instance_id + 1; /* ids are per process and time: make it differ */
  }
  cr_assert_eq(ts_server_start(s), 0);
}

static kvs_peers_t *peers(int expect) {
  kvs_peers_config_t pc = {.opts = &S.opts, .role = KVS_PROTO_ROLE_TOOL};
  kvs_peers_t *p = NULL;
  cr_assert_eq(kvs_peers_create(&pc, &p), 0);
  cr_assert_eq(kvs_peers_discover(p, true), expect);
  return p;
}

typedef struct got {
  kvs_key_t key;
  uint64_t len;
  int n, bad;
} got_t;

static int sink(void *ctx, size_t i, const kvs_layout_t *l, const void *bytes, uint64_t len) {
  got_t *g = ctx;
  (void)l;
  g->n++;
  if (i != 0 || len != g->len || pat_check(bytes, len, g->key) != 0) g->bad++;
  return 0;
}

/* Requests served by s during a retrieve of key with no instance named, then a PING of s. */
static uint64_t requests_for(ts_server_t *s, kvs_peers_t *p, kvs_key_t key, uint64_t len,
                             int want) {
  uint64_t before = ts_stat(s, KVS_STAT_coord_requests);
  got_t g = {key, len, 0, 0};
  cr_assert_eq(kvs_peers_retrieve(p, 0, &key, 1, sink, &g), want);
  cr_assert_eq(g.n, want);
  cr_assert_eq(g.bad, 0);
  cr_assert_eq(kvs_peers_ping(p, s->instance_id), 0);
  return ts_stat(s, KVS_STAT_coord_requests) - before;
}

TestSuite(rtt, .fini = down);

Test(rtt, one_peer_retrieve_is_one_prepare_without_lookup, T_TIMEOUT) {
  start(&S, NULL);
  const uint64_t LEN = 300000;
  kvs_key_t k = tk(41, 0);
  kvs_layout_t l = kvs_layout_blob(LEN);
  cr_assert_eq(ts_local_put(S.store, &k, 1, &l), 1);
  kvs_stats_t st;
  kvs_stats_init(&st);
  kvs_peers_config_t pc = {.opts = &S.opts, .role = KVS_PROTO_ROLE_TOOL, .stats = &st};
  kvs_peers_t *p = NULL;
  cr_assert_eq(kvs_peers_create(&pc, &p), 0);
  cr_assert_eq(kvs_peers_discover(p, true), 1);
  /* PREPARE_RETRIEVE + COMMIT_RETRIEVE + PING: no LOOKUP */
  cr_assert_eq(requests_for(&S, p, k, LEN, 1), 3);
  cr_assert_eq(kvs_stats_get(&st, KVS_STAT_peer_lookups), 1, "the prepare stands in for a lookup");
  cr_assert_eq(kvs_stats_get(&st, KVS_STAT_peer_hits), 1);
  /* a miss: one PREPARE_RETRIEVE that found nothing (no pin, so no COMMIT), + PING; counted as
   * a lookup miss, not as a failed retrieve */
  kvs_key_t none = tk(41, 1);
  cr_assert_eq(requests_for(&S, p, none, LEN, 0), 2);
  cr_assert_eq(kvs_stats_get(&st, KVS_STAT_peer_lookups), 2);
  cr_assert_eq(kvs_stats_get(&st, KVS_STAT_peer_misses), 0);
  kvs_peers_destroy(p);
}

Test(rtt, several_peers_are_asked_with_lookup_then_the_longest_run_is_retrieved, T_TIMEOUT) {
  start(&S, NULL);
  start(&S2, &S);
  const uint64_t LEN = 4096;
  kvs_key_t k = tk(42, 0);
  kvs_layout_t l = kvs_layout_blob(LEN);
  cr_assert_eq(ts_local_put(S2.store, &k, 1, &l), 1); /* only the second server holds it */
  kvs_peers_t *p = peers(2);
  uint64_t s1 = ts_stat(&S, KVS_STAT_coord_requests);
  /* at S2: LOOKUP + PREPARE_RETRIEVE + COMMIT_RETRIEVE + PING */
  cr_assert_eq(requests_for(&S2, p, k, LEN, 1), 4);
  /* at S: its LOOKUP when it was asked before S2 (a full run found first ends the search),
   * never a PREPARE_RETRIEVE */
  uint64_t at_s = ts_stat(&S, KVS_STAT_coord_requests) - s1;
  cr_assert_leq(at_s, 1, "requests at the peer without the key: %lu", (unsigned long)at_s);
  cr_assert_eq(ts_stat(&S, KVS_STAT_store_pins), 0);
  kvs_peers_destroy(p);
}
