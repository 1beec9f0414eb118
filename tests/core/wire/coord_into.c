/* kvs_peers_retrieve_into (issue 15): a retrieve straight into the caller's buffers, inline
 * (the reply's bytes received from the socket into each buffer, frame by frame) and SHM (copied
 * out of the pinned extents). The bytes must be exactly the objects', a buffer too small ends
 * the delivery there and the connection stays usable, and a reply split into many frames (the
 * client's max_frame at its minimum, 64 KiB) arrives whole. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord_client.h"
#include "peer.h"

#define T_TIMEOUT .timeout = 90

static ts_server_t S;

static void down(void) {
  ts_server_reset(&S);
}

TestSuite(into, .fini = down);

enum { N = 4 };
static const uint64_t LENS[N] = {100, 5000, 300000, 3u << 20}; /* around the 4 KiB stash */

static kvs_peers_t *client(int strategy, uint64_t max_frame) {
  kvs_options_t o = S.opts;
  o.strategy = strategy;
  if (max_frame) o.max_frame = max_frame;
  kvs_peers_config_t pc = {.opts = &o, .role = KVS_PROTO_ROLE_TOOL};
  kvs_peers_t *p = NULL;
  cr_assert_eq(kvs_peers_create(&pc, &p), 0);
  cr_assert_eq(kvs_peers_discover(p, true), 1);
  return p;
}

static void put_all(kvs_key_t *k) {
  for (int i = 0; i < N; i++) {
    k[i] = tk(50, (uint64_t)i);
    kvs_layout_t l = kvs_layout_blob(LENS[i]);
    cr_assert_eq(ts_local_put(S.store, &k[i], 1, &l), 1);
  }
}

/* Retrieve all N into buffers of caps[i] bytes; check what came. Returns the delivered count. */
static int get_all(kvs_peers_t *p, const kvs_key_t *k, const uint64_t *caps) {
  void *bufs[N];
  uint64_t lens[N];
  for (int i = 0; i < N; i++) {
    bufs[i] = malloc(caps[i] ? caps[i] : 1);
    cr_assert_not_null(bufs[i]);
    memset(bufs[i], 0xee, caps[i]);
  }
  int got = kvs_peers_retrieve_into(p, S.instance_id, k, N, bufs, caps, lens);
  for (int i = 0; i < N; i++) {
    if (i < got) {
      cr_assert_eq(lens[i], LENS[i], "object %d length", i);
      cr_assert_eq(pat_check(bufs[i], LENS[i], k[i]), 0, "object %d bytes", i);
    } else {
      cr_assert_eq(lens[i], 0, "object %d was not delivered", i);
    }
    free(bufs[i]);
  }
  return got;
}

static void run(int strategy, uint64_t max_frame) {
  cr_assert_eq(ts_server_init(&S, 32u << 20), 0);
  cr_assert_eq(ts_server_start(&S), 0);
  kvs_key_t k[N];
  put_all(k);
  kvs_peers_t *p = client(strategy, max_frame);
  uint64_t fit[N], small[N];
  for (int i = 0; i < N; i++) fit[i] = small[i] = LENS[i];
  small[2] = LENS[2] - 1; /* object 2 does not fit: the run ends before it */
  cr_assert_eq(get_all(p, k, fit), N);
  cr_assert_eq(get_all(p, k, small), 2);
  cr_assert_eq(kvs_peers_ping(p, S.instance_id), 0, "the connection is still in step");
  cr_assert_eq(get_all(p, k, fit), N);
  /* a miss is 0 */
  kvs_key_t none = tk(50, 99);
  void *b = malloc(8);
  uint64_t cap = 8, len = 7;
  cr_assert_eq(kvs_peers_retrieve_into(p, S.instance_id, &none, 1, &b, &cap, &len), 0);
  cr_assert_eq(len, 0);
  free(b);
  kvs_peers_destroy(p);
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, NULL, 0, 5000), 0, "pins left");
}

Test(into, inline_into_caller_buffers, T_TIMEOUT) { run(KVS_STRATEGY_INLINE, 0); }
Test(into, inline_split_into_many_frames, T_TIMEOUT) { run(KVS_STRATEGY_INLINE, 64u << 10); }
Test(into, shm_into_caller_buffers, T_TIMEOUT) { run(KVS_STRATEGY_AUTO, 0); }

/* An inline reply sent straight from the pool holds its pins only until shortly before the
 * lease ends: a reader that stalls past that gets the connection closed (never bytes of an
 * extent the lease may have given away), and the pins end with it. */
Test(into, a_stalled_reader_loses_the_connection_before_the_lease_ends, T_TIMEOUT) {
  cr_assert_eq(ts_server_init(&S, 32u << 20), 0);
  S.opts.lease_ms = 2000; /* the shortest lease that still sends from the pool (coord.c) */
  cr_assert_eq(ts_server_start(&S), 0);
  kvs_key_t k = tk(51, 0);
  const uint64_t LEN = 8u << 20; /* far more than the socket buffers hold */
  kvs_layout_t l = kvs_layout_blob(LEN);
  cr_assert_eq(ts_local_put(S.store, &k, 1, &l), 1);
  cc_t c;
  cr_assert_eq(cc_open(&c, S.path, KVS_PROTO_STRATEGY_INLINE), 0);
  kvs_proto_prepare_retrieve_t m = {KVS_PROTO_STRATEGY_INLINE, 1, &k, 0};
  uint8_t q[64];
  size_t qn = 0;
  cr_assert_eq(kvs_proto_prepare_retrieve_encode(&m, q, sizeof q, &qn), 0);
  cr_assert_eq(cc_send(&c, KVS_OP_PREPARE_RETRIEVE, q, qn, NULL), 0);
  usleep(1500 * 1000); /* past lease - 1 s: the server must not send the rest */
  cc_msg_t r;
  cr_assert_lt(cc_recv(&c, &r, 5000), 0, "a reply stalled past the deadline was completed");
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, NULL, 0, 5000), 0, "pins left");
  cc_close(&c);
}
