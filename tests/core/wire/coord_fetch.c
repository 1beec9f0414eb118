/* kvs_peers_fetch (core/wire/peer.h): a peer's objects copied into local reservations, left for the
 * caller to verify and commit or abort. A server S holds the objects; a second in-process store
 * L is the fetching process's local store (the peers' config `local`). Both strategies. */
#include <criterion/criterion.h>
#include <unistd.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coord_client.h"
#include "internal.h"
#include "peer.h"

#define T_TIMEOUT .timeout = 60

static ts_server_t S, L;

static void down(void) {
  ts_server_reset(&S);
  ts_server_reset(&L);
}

static void start(void) {
  cr_assert_eq(ts_server_init(&S, 16u << 20), 0);
  cr_assert_eq(ts_server_start(&S), 0);
  cr_assert_eq(ts_server_init(&L, 16u << 20), 0);
  cr_assert_eq(ts_server_start(&L), 0);
}

/* Peers of S's group whose local store is L's (store NULL: none). */
static kvs_peers_t *peers(int strategy, kvs_store_t *local) {
  kvs_options_t o = S.opts;
  o.strategy = strategy;
  kvs_peers_config_t pc = {.opts = &o, .role = KVS_PROTO_ROLE_ENGINE, .local = local};
  kvs_peers_t *p = NULL;
  cr_assert_eq(kvs_peers_create(&pc, &p), 0);
  cr_assert_eq(kvs_peers_discover(p, true), 1);
  return p;
}

static kvs_layout_t chunk_layout(void) { return ts_chunk_layout(64, 1000); }

static const uint8_t *local_bytes(const kvs_fetch_t *f) {
  return kvs_pool_base(kvs_store_pool(L.store)) + f->extent.offset;
}

static void chunks_round_trip(int strategy) {
  start();
  enum { N = 6 };
  kvs_key_t k[N];
  for (int i = 0; i < N; i++) k[i] = tk(21, (uint64_t)i);
  kvs_layout_t l = chunk_layout();
  cr_assert_eq(ts_local_put(S.store, k, N - 1, &l), N - 1); /* the last one is not there */
  kvs_peers_t *p = peers(strategy, L.store);
  kvs_fetch_t f[N];
  cr_assert_eq(kvs_peers_fetch(p, S.instance_id, k, N, &l, NULL, NULL, f), N - 1);
  for (int i = 0; i < N - 1; i++) {
    cr_assert_eq(f[i].status, KVS_FETCH_COPIED, "key %d", i);
    cr_assert_eq(f[i].extent.length, kvs_layout_nbytes(&l));
    cr_assert_eq(pat_check(local_bytes(&f[i]), f[i].extent.length, k[i]), 0, "key %d", i);
  }
  cr_assert_eq(f[N - 1].status, KVS_FETCH_MISS);
  /* Nothing is visible before the caller commits. */
  cr_assert_eq(ts_local_count(L.store, k, N), 0);
  cr_assert_eq(ts_info(L.store).objects_writing, N - 1);
  for (int i = 0; i < N - 1; i++)
    if (i == 2) kvs_store_abort(L.store, KVS_OWNER_LOCAL, f[i].xfer);
    else cr_assert_eq(kvs_store_commit(L.store, KVS_OWNER_LOCAL, f[i].xfer), 0);
  cr_assert_eq(ts_local_count(L.store, k, N), 2);
  cr_assert_eq(ts_local_verify(L.store, k, 2), 2);
  /* Fetched again: the committed ones are LOCAL, the aborted one is copied again. */
  cr_assert_eq(kvs_peers_fetch(p, 0, k, N, &l, NULL, NULL, f), N - 1);
  cr_assert_eq(f[0].status, KVS_FETCH_LOCAL);
  cr_assert_eq(f[1].status, KVS_FETCH_LOCAL);
  cr_assert_eq(f[2].status, KVS_FETCH_COPIED);
  cr_assert_eq(f[3].status, KVS_FETCH_LOCAL);
  kvs_store_abort(L.store, KVS_OWNER_LOCAL, f[2].xfer);
  cr_assert_eq(ts_info(L.store).objects_writing, 0);
  /* The client posts COMMIT_RETRIEVE without waiting for its reply (docs/protocol.md 6): the
   * server unpins when it reads it, shortly after the fetch returned. */
  for (int i = 0; i < 5000 && ts_info(S.store).pins != 0; i++) usleep(1000);
  cr_assert_eq(ts_info(S.store).pins, 0);
  kvs_peers_destroy(p);
}

TestSuite(fetch, .fini = down);

Test(fetch, chunks_shm, T_TIMEOUT) { chunks_round_trip(KVS_STRATEGY_AUTO); }
Test(fetch, chunks_inline, T_TIMEOUT) { chunks_round_trip(KVS_STRATEGY_INLINE); }

Test(fetch, a_chunk_of_another_size_stops_the_delivery, T_TIMEOUT) {
  start();
  kvs_key_t k[2] = {tk(22, 0), tk(22, 1)};
  kvs_layout_t l = chunk_layout();
  cr_assert_eq(ts_local_put(S.store, k, 2, &l), 2);
  kvs_peers_t *p = peers(KVS_STRATEGY_AUTO, L.store);
  kvs_layout_t other = l;
  other.shape[1] = 999;
  kvs_fetch_t f[2];
  cr_assert_eq(kvs_peers_fetch(p, S.instance_id, k, 2, &other, NULL, NULL, f), 0);
  cr_assert_eq(f[0].status, KVS_FETCH_MISS);
  cr_assert_eq(f[1].status, KVS_FETCH_MISS);
  kvs_store_info_t i = ts_info(L.store);
  cr_assert_eq(i.objects_writing + i.objects_ready + i.reserved_bytes, 0, "nothing reserved");
  kvs_peers_destroy(p);
}

/* keys_fn: bind the blob under the key asked for plus an alias read from its first 16 bytes;
 * refuse it when refuse is set. */
typedef struct bind_ctx {
  kvs_key_t keys[2];
  int calls;
  bool refuse;
} bind_ctx_t;

static int bind_keys(void *ctx, size_t i, const void *bytes, uint64_t len,
                     const kvs_key_t **keys) {
  bind_ctx_t *b = ctx;
  b->calls++;
  if (b->refuse || i != 0 || len < sizeof(kvs_key_t)) return -1;
  memcpy(&b->keys[1], bytes, sizeof b->keys[1]);
  *keys = b->keys;
  return 2;
}

Test(fetch, a_blob_is_bound_under_the_keys_its_bytes_give, T_TIMEOUT) {
  start();
  kvs_key_t k = tk(23, 0);
  const uint64_t LEN = 50000;
  kvs_layout_t bl = kvs_layout_blob(LEN);
  cr_assert_eq(ts_local_put(S.store, &k, 1, &bl), 1);
  kvs_peers_t *p = peers(KVS_STRATEGY_AUTO, L.store);
  /* Refused: nothing reserved, a miss. */
  bind_ctx_t b = {{k, {0, 0}}, 0, true};
  kvs_fetch_t f;
  cr_assert_eq(kvs_peers_fetch(p, 0, &k, 1, NULL, bind_keys, &b, &f), 0);
  cr_assert_eq(b.calls, 1);
  cr_assert_eq(f.status, KVS_FETCH_MISS);
  cr_assert_eq(ts_info(L.store).objects_writing, 0);
  /* Accepted: copied, then reachable under the alias too once committed. */
  b.refuse = false;
  cr_assert_eq(kvs_peers_fetch(p, 0, &k, 1, NULL, bind_keys, &b, &f), 1);
  cr_assert_eq(f.status, KVS_FETCH_COPIED);
  cr_assert_eq(pat_check(local_bytes(&f), LEN, k), 0);
  cr_assert_eq(kvs_store_commit(L.store, KVS_OWNER_LOCAL, f.xfer), 0);
  cr_assert_eq(ts_local_count(L.store, &b.keys[1], 1), 1, "alias bound");
  cr_assert_eq(ts_local_verify(L.store, &k, 1), 1);
  kvs_peers_destroy(p);
}

Test(fetch, without_a_local_store_is_refused, T_TIMEOUT) {
  start();
  kvs_key_t k = tk(24, 0);
  kvs_peers_t *p = peers(KVS_STRATEGY_AUTO, NULL);
  kvs_fetch_t f;
  f.status = KVS_FETCH_COPIED;
  cr_assert_eq(kvs_peers_fetch(p, 0, &k, 1, NULL, NULL, NULL, &f), -ENOTSUP);
  cr_assert_eq(f.status, KVS_FETCH_MISS, "out is written even on an error");
  cr_assert_eq(kvs_peers_fetch(p, 0, &k, 0, NULL, NULL, NULL, &f), -EINVAL);
  kvs_peers_destroy(p);
}
