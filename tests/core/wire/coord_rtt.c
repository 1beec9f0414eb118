/* Round trips of a retrieve (issue 15, docs/protocol.md 4.7 and 6 "SHM retrieve"):
 * - with one peer to ask, kvs_peers_retrieve with no instance sends PREPARE_RETRIEVE straight
 *   away (its n_found is the lookup), not LOOKUP then PREPARE_RETRIEVE; with several peers it
 *   still asks each with a LOOKUP and retrieves from the longest run;
 * - AUTO_RELEASE (caps bit 6): the server ends the pins itself (pin_ms after the request, or at
 *   the client's next request), so a fast SHM copy sends no COMMIT_RETRIEVE; a client that did
 *   not announce the bit gets version 1 as it was (pins until COMMIT_RETRIEVE or the lease).
 * The server's coord_requests counter tells which requests reached it: a PING on the same
 * connection after the retrieve makes sure anything posted before it was served first
 * (requests are answered in order, 2.2). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "coord_client.h"
#include "peer.h"

#define T_TIMEOUT .timeout = 90

static ts_server_t S, S2;

static void down(void) {
  ts_server_reset(&S2);
  ts_server_reset(&S);
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
  /* PREPARE_RETRIEVE (AUTO_RELEASE: no COMMIT_RETRIEVE) + PING: no LOOKUP */
  cr_assert_eq(requests_for(&S, p, k, LEN, 1), 2);
  cr_assert_eq(ts_info(S.store).pins, 0, "the PING (the next request) ended the pins");
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
  /* at S2: LOOKUP + PREPARE_RETRIEVE + PING */
  cr_assert_eq(requests_for(&S2, p, k, LEN, 1), 3);
  /* at S: its LOOKUP when it was asked before S2 (a full run found first ends the search),
   * never a PREPARE_RETRIEVE */
  uint64_t at_s = ts_stat(&S, KVS_STAT_coord_requests) - s1;
  cr_assert_leq(at_s, 1, "requests at the peer without the key: %lu", (unsigned long)at_s);
  cr_assert_eq(ts_stat(&S, KVS_STAT_store_pins), 0);
  kvs_peers_destroy(p);
}

/* ---- AUTO_RELEASE on the wire (a raw client) ---------------------------------------------- */

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0) {
  }
}

/* PREPARE_RETRIEVE (shm) of one key with flags; the decoded reply head in *r. */
static void prepare(cc_t *c, kvs_key_t k, uint8_t flags, kvs_proto_prepare_retrieve_reply_t *r) {
  kvs_proto_prepare_retrieve_t m = {KVS_PROTO_STRATEGY_SHM, 1, &k, flags};
  uint8_t buf[64];
  size_t n = 0;
  cr_assert_eq(kvs_proto_prepare_retrieve_encode(&m, buf, sizeof buf, &n), 0);
  cc_msg_t rep;
  cr_assert_eq(cc_call(c, KVS_OP_PREPARE_RETRIEVE, buf, n, &rep), 0);
  static kvs_proto_object_t objs[4];
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_decode(rep.payload, rep.len, objs, 4, r), 0);
  cr_assert_eq(r->n_found, 1);
  cr_assert_neq(r->xfer, 0);
  cc_msg_free(&rep);
}

static void open_with_caps(cc_t *c, uint32_t caps) {
  cr_assert_eq(cc_connect(c, S.path), 0);
  cr_assert_eq(cc_hello(c, KVS_PROTO_STRATEGY_AUTO, caps, 0), 0);
  cr_assert_eq(c->server.strategy_chosen, KVS_PROTO_STRATEGY_SHM);
  cr_assert(c->server.caps & KVS_PROTO_CAP_AUTO_RELEASE, "the server announces AUTO_RELEASE");
}

static void put_one(kvs_key_t k) {
  kvs_layout_t l = kvs_layout_blob(8192);
  cr_assert_eq(ts_local_put(S.store, &k, 1, &l), 1);
}

/* The AUTO_RELEASE cases open the same way: S started (lease_ms 0: the default lease), one
 * object under k, a raw connection c with caps. */
static void open_case(uint32_t lease_ms, kvs_key_t k, cc_t *c, uint32_t caps) {
  cr_assert_eq(ts_server_init(&S, 8u << 20), 0);
  if (lease_ms) S.opts.lease_ms = lease_ms;
  cr_assert_eq(ts_server_start(&S), 0);
  put_one(k);
  open_with_caps(c, caps);
}
#define CAPS_AUTO (KVS_PROTO_CAP_SHM | KVS_PROTO_CAP_INLINE | KVS_PROTO_CAP_AUTO_RELEASE)

/* open_case with CAPS_AUTO, then a PREPARE_RETRIEVE of k with AUTO_RELEASE (the reply in *r):
 * the server must grant pin_ms (why: the rule that gives it). */
static void open_auto_release(uint32_t lease_ms, kvs_key_t k, cc_t *c,
                              kvs_proto_prepare_retrieve_reply_t *r, uint32_t pin_ms,
                              const char *why) {
  open_case(lease_ms, k, c, CAPS_AUTO);
  prepare(c, k, KVS_PROTO_RETRIEVE_AUTO_RELEASE, r);
  cr_assert_eq(r->pin_ms, pin_ms, "pin_ms %u, not %u: %s", r->pin_ms, pin_ms, why);
}

Test(rtt, a_client_without_the_cap_keeps_its_pins_until_commit, T_TIMEOUT) {
  kvs_key_t k = tk(43, 0);
  cc_t c;
  open_case(0, k, &c, KVS_PROTO_CAP_SHM | KVS_PROTO_CAP_INLINE); /* no AUTO_RELEASE */
  kvs_proto_prepare_retrieve_reply_t r;
  prepare(&c, k, 0, &r);
  cr_assert_eq(r.pin_ms, 0);
  /* the flag from a client that did not announce the bit is ignored: version 1 pins */
  kvs_proto_prepare_retrieve_reply_t r2;
  prepare(&c, k, KVS_PROTO_RETRIEVE_AUTO_RELEASE, &r2);
  cr_assert_eq(r2.pin_ms, 0);
  sleep_ms(1300); /* longer than any AUTO_RELEASE pin lasts */
  cr_assert_eq(cc_ping(&c, 1, NULL, 0), 0); /* a next request does not end them either */
  cr_assert_eq(ts_info(S.store).pins, 2, "version-1 pins last until COMMIT_RETRIEVE");
  cr_assert_eq(cc_commit_retrieve(&c, r.xfer), 0);
  cr_assert_eq(cc_commit_retrieve(&c, r2.xfer), 0);
  cr_assert_eq(ts_info(S.store).pins, 0);
  cc_close(&c);
}

Test(rtt, auto_release_pins_end_at_the_next_request_or_after_pin_ms, T_TIMEOUT) {
  kvs_key_t k = tk(44, 0);
  cc_t c;
  kvs_proto_prepare_retrieve_reply_t r;
  /* ended by the next request */
  open_auto_release(0, k, &c, &r, 1000, "min(lease 30 s, 1 s)");
  cr_assert_eq(ts_info(S.store).pins, 1);
  cr_assert_eq(cc_ping(&c, 1, NULL, 0), 0);
  cr_assert_eq(ts_info(S.store).pins, 0);
  /* ended by time, with no request: then a late COMMIT_RETRIEVE learns it (a stale copy) */
  prepare(&c, k, KVS_PROTO_RETRIEVE_AUTO_RELEASE, &r);
  cr_assert_eq(ts_info(S.store).pins, 1);
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, NULL, 0, 5000), 0, "pins not ended by time");
  cr_assert_eq(cc_commit_retrieve(&c, r.xfer), -ENOENT);
  /* a COMMIT_RETRIEVE of the pending transfer itself (a slow copy asking) ends it normally */
  prepare(&c, k, KVS_PROTO_RETRIEVE_AUTO_RELEASE, &r);
  cr_assert_eq(cc_commit_retrieve(&c, r.xfer), 0);
  cr_assert_eq(ts_info(S.store).pins, 0);
  /* the flag never applies to an inline retrieve, nor changes what a plain one does */
  prepare(&c, k, 0, &r);
  cr_assert_eq(r.pin_ms, 0);
  cr_assert_eq(cc_ping(&c, 2, NULL, 0), 0);
  cr_assert_eq(ts_info(S.store).pins, 1);
  cr_assert_eq(cc_commit_retrieve(&c, r.xfer), 0);
  cc_close(&c);
}

Test(rtt, auto_release_pin_ms_is_never_longer_than_the_lease, T_TIMEOUT) {
  cc_t c;
  kvs_proto_prepare_retrieve_reply_t r;
  open_auto_release(200, tk(45, 0), &c, &r, 200, "min(lease 200 ms, 1 s)");
  cc_close(&c);
}

Test(rtt, the_codec_carries_the_flag_and_pin_ms, T_TIMEOUT) {
  kvs_key_t k = tk(46, 0);
  kvs_proto_prepare_retrieve_t m = {KVS_PROTO_STRATEGY_SHM, 1, &k, KVS_PROTO_RETRIEVE_AUTO_RELEASE};
  uint8_t buf[64] __attribute__((aligned(8)));
  size_t n = 0;
  cr_assert_eq(kvs_proto_prepare_retrieve_encode(&m, buf, sizeof buf, &n), 0);
  cr_assert_eq(buf[1], 1, "flags are byte 1");
  kvs_proto_prepare_retrieve_t d;
  cr_assert_eq(kvs_proto_prepare_retrieve_decode(buf, n, &d), 0);
  cr_assert_eq(d.flags, KVS_PROTO_RETRIEVE_AUTO_RELEASE);
  buf[1] = 0x2; /* an unknown flag: malformed */
  cr_assert_eq(kvs_proto_prepare_retrieve_decode(buf, n, &d), -EBADMSG);
  m.flags = 0x2;
  cr_assert_eq(kvs_proto_prepare_retrieve_encode(&m, buf, sizeof buf, &n), -EINVAL);
  /* pin_ms at reply offset 20, only with a transfer */
  kvs_proto_prepare_retrieve_reply_t r = {.xfer = 7, .pin_ms = 1000};
  uint8_t rb[64] __attribute__((aligned(8)));
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_encode(&r, rb, sizeof rb, &n), 0);
  cr_assert_eq(rb[20] | rb[21] << 8, 1000);
  kvs_proto_prepare_retrieve_reply_t rd;
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_decode(rb, n, NULL, 0, &rd), 0);
  cr_assert_eq(rd.pin_ms, 1000);
  rb[0] = 0; /* no transfer: pin_ms must be 0 */
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_decode(rb, n, NULL, 0, &rd), -EBADMSG);
  r.xfer = 0;
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_encode(&r, rb, sizeof rb, &n), -EINVAL);
}

/* Requests pipelined in one write reach the server in one recvmsg: each is answered, in order,
 * without waiting for another event (the coordinator serves what its stash holds first). */
Test(rtt, pipelined_requests_in_one_write_are_all_answered, T_TIMEOUT) {
  start(&S, NULL);
  cc_t c;
  cr_assert_eq(cc_open(&c, S.path, KVS_PROTO_STRATEGY_AUTO), 0);
  enum { N = 5 };
  uint8_t buf[N * 64];
  size_t at = 0;
  for (int i = 0; i < N; i++) {
    kvs_proto_ping_t m = {.nonce = 100u + (uint64_t)i};
    uint8_t pl[32];
    size_t pn = 0;
    cr_assert_eq(kvs_proto_ping_encode(&m, pl, sizeof pl, &pn), 0);
    kvs_proto_header_t h = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION, KVS_OP_PING, 0, 900u + (uint64_t)i,
                            (uint32_t)pn};
    kvs_proto_header_encode(&h, buf + at);
    memcpy(buf + at + KVS_PROTO_HEADER_SIZE, pl, pn);
    at += KVS_PROTO_HEADER_SIZE + pn;
  }
  cr_assert_eq(cc_send_raw(&c, buf, at), 0);
  for (int i = 0; i < N; i++) {
    cc_msg_t m;
    cr_assert_eq(cc_recv(&c, &m, 5000), 0, "reply %d never came", i);
    cr_assert_eq(m.h.request_id, 900u + (uint64_t)i);
    cr_assert_eq(m.h.opcode, KVS_OP_PING);
    cc_msg_free(&m);
  }
  cc_close(&c);
}
