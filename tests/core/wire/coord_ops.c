/* Coordinator integration tests: every opcode round trip through a real socket, both transfer
 * strategies (SHM and inline return the same bytes), the seed's flows (inline commit to an SHM
 * server naming a pending SHM transfer, duplicate prepares, foreign transfers), and the peer
 * client API on top. Each test starts its own server (pool + store + coordinator in a private
 * mkdtemp KVSHIM_RUN_DIR) and talks to it with the raw client of coord_client.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coord_client.h"
#include "internal.h"
#include "peer.h"
#include "registry.h" /* runtime/: EXPORT_TENSORS answers from the runtime's registry */
#include "tensor_fixture.h"

#define T_TIMEOUT .timeout = 60

static ts_server_t S;

/* The objects a storing test works on (start_objs): n keys tk(seed, i), each with a malloc'd
 * buffer of len bytes holding its pattern, all of layout blob(len). down() frees the buffers. */
#define OBJS_MAX 8
typedef struct objs {
  int n;
  kvs_layout_t l;
  kvs_key_t k[OBJS_MAX];
  void *bufs[OBJS_MAX];
} objs_t;
static objs_t O;

static void down(void) {
  for (int i = 0; i < O.n; i++) free(O.bufs[i]);
  O.n = 0;
  ts_server_reset(&S);
}

/* Start a server with cache_mb MiB of cache arena; tweak may change options first. */
static void start(uint64_t cache_mb, void (*tweak)(ts_server_t *)) {
  cr_assert_eq(ts_server_init(&S, cache_mb << 20), 0);
  if (tweak) tweak(&S);
  int rc = ts_server_start(&S);
  cr_assert_eq(rc, 0, "server start: %d", rc);
}

static void open_shm(cc_t *c) {
  cr_assert_eq(cc_open(c, S.path, KVS_PROTO_STRATEGY_AUTO), 0);
  cr_assert_eq(c->server.strategy_chosen, KVS_PROTO_STRATEGY_SHM);
  cr_assert_not_null(c->pool, "SHM connection without a mapped pool");
}

static kvs_layout_t blob(uint64_t n) { return kvs_layout_blob(n); }

/* A server with cache_mb MiB of cache arena (start) holding nothing yet, and O: n objects of len
 * bytes from seed, for the test to store. */
static const objs_t *start_objs(uint64_t cache_mb, int n, uint64_t seed, uint64_t len) {
  start(cache_mb, NULL);
  cr_assert_leq(n, OBJS_MAX);
  O.l = blob(len);
  for (O.n = 0; O.n < n; O.n++) {
    O.k[O.n] = tk(seed, (uint64_t)O.n);
    O.bufs[O.n] = malloc(len);
    cr_assert_not_null(O.bufs[O.n]);
    pat_fill(O.bufs[O.n], len, O.k[O.n]);
  }
  return &O;
}

/* Check object i of a retrieve reply against key k's pattern and expected length. */
static void check_obj(const cc_t *c, const cc_pretr_t *r, uint32_t i, kvs_key_t k, uint64_t len) {
  cr_assert_eq(r->objects[i].key_index, i);
  cr_assert_eq(r->objects[i].length, len);
  const uint8_t *b = cc_object_bytes(c, r, i);
  cr_assert_not_null(b);
  cr_assert_eq(pat_check(b, len, k), 0, "object %u bytes differ from its key's pattern", i);
}

TestSuite(ops, .fini = down);

Test(ops, hello_chooses_strategy_and_passes_the_pool, T_TIMEOUT) {
  start(8, NULL);
  cc_t a, b, c;
  open_shm(&a);
  cr_assert_eq(a.server.flags & KVS_PROTO_HELLO_POOL_FD, KVS_PROTO_HELLO_POOL_FD);
  cr_assert_eq(a.server.role, KVS_PROTO_ROLE_CACHE);
  cr_assert_eq(a.server.instance_id, S.instance_id);
  cr_assert_str_eq(a.server.group, "t");
  cr_assert_eq(a.server.pool_segment_size, kvs_pool_segment_size(S.pool));
  cr_assert_eq(a.server.pool_arena_size, 8u << 20);
  cr_assert_eq(a.server.max_frame, (uint32_t)S.opts.max_frame);
  cr_assert_eq(a.server.pid, (uint32_t)getpid());
  /* The mapped segment is the server's: same header, and an object the server holds is seen
   * at the same offset through the client's mapping. */
  cr_assert_eq(kvs_pool_header(a.pool)->instance_id, S.instance_id);
  cr_assert_eq(kvs_pool_segment_size(a.pool), kvs_pool_segment_size(S.pool));
  kvs_key_t k = tk(1, 1);
  kvs_layout_t l = kvs_layout_blob(5000);
  cr_assert_eq(ts_local_put(S.store, &k, 1, &l), 1);
  kvs_xfer_t x;
  kvs_object_view_t v;
  cr_assert_eq(kvs_store_lookup(S.store, KVS_OWNER_LOCAL, &k, 1, true, &x), 1);
  cr_assert_eq(kvs_store_read_pinned(S.store, KVS_OWNER_LOCAL, x, &v, 1), 1);
  cr_assert_eq(pat_check(kvs_pool_base(a.pool) + v.extent.offset, 5000, k), 0);
  cr_assert_eq(kvs_store_release(S.store, KVS_OWNER_LOCAL, x), 0);

  /* A client asking for inline gets inline and no fd. */
  cr_assert_eq(cc_open(&b, S.path, KVS_PROTO_STRATEGY_INLINE), 0);
  cr_assert_eq(b.server.strategy_chosen, KVS_PROTO_STRATEGY_INLINE);
  cr_assert_eq(b.server.flags & KVS_PROTO_HELLO_POOL_FD, 0);
  cr_assert_null(b.pool);
  /* A client without the SHM capability gets inline. */
  cr_assert_eq(cc_connect(&c, S.path), 0);
  cr_assert_eq(cc_hello(&c, KVS_PROTO_STRATEGY_AUTO, KVS_PROTO_CAP_INLINE, 0), 0);
  cr_assert_eq(c.server.strategy_chosen, KVS_PROTO_STRATEGY_INLINE);
  cr_assert_null(c.pool);
  cr_assert_eq(kvs_coord_connections(S.coord), 3);
  cc_close(&a);
  cc_close(&b);
  cc_close(&c);
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, S.coord, 0, 2000), 0, "connections not closed");
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_connections), 3);
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_errors), 0);
}

static void force_inline(ts_server_t *s) { s->opts.strategy = KVS_STRATEGY_INLINE; }

Test(ops, server_forcing_inline_wins, T_TIMEOUT) {
  start(4, force_inline);
  cc_t a;
  cr_assert_eq(cc_open(&a, S.path, KVS_PROTO_STRATEGY_SHM), 0);
  cr_assert_eq(a.server.strategy_chosen, KVS_PROTO_STRATEGY_INLINE);
  cr_assert_null(a.pool);
  /* SHM requests on an inline connection are refused, the connection stays. */
  kvs_key_t k = tk(1, 0);
  kvs_layout_t l = blob(4096);
  cc_pstore_t ps;
  cr_assert_eq(cc_prepare_store(&a, KVS_PROTO_STRATEGY_SHM, 0, &l, &k, 1, &ps), -EOPNOTSUPP);
  cc_pretr_t pr;
  cr_assert_eq(cc_prepare_retrieve(&a, KVS_PROTO_STRATEGY_SHM, &k, 1, &pr), -EOPNOTSUPP);
  cr_assert_eq(cc_ping(&a, 7, NULL, 0), 0);
  cr_assert_eq(ts_info(S.store).reserved_bytes, 0);
  cc_close(&a);
}

Test(ops, lookup_counts_the_leading_run_without_pinning, T_TIMEOUT) {
  start(4, NULL);
  kvs_key_t k[4] = {tk(2, 0), tk(2, 1), tk(2, 2), tk(2, 3)};
  kvs_layout_t l = blob(5000);
  cr_assert_eq(ts_local_put(S.store, &k[0], 2, &l), 2);
  cr_assert_eq(ts_local_put(S.store, &k[3], 1, &l), 1);
  cc_t a;
  open_shm(&a);
  uint32_t found = 99;
  cr_assert_eq(cc_lookup(&a, k, 4, &found), 0);
  cr_assert_eq(found, 2);
  cr_assert_eq(cc_lookup(&a, &k[2], 2, &found), 0);
  cr_assert_eq(found, 0);
  cr_assert_eq(cc_lookup(&a, &k[3], 1, &found), 0);
  cr_assert_eq(found, 1);
  cr_assert_eq(ts_info(S.store).pins, 0, "LOOKUP must not pin");
  cc_close(&a);
}

Test(ops, store_shm_then_retrieve_shm_and_inline_identical, T_TIMEOUT) {
  enum { N = 4 };
  const uint64_t LEN = 3 * 4096 + 100;
  const objs_t *o = start_objs(8, N, 3, LEN);
  cc_t a, b;
  open_shm(&a);
  cr_assert_eq(cc_open(&b, S.path, KVS_PROTO_STRATEGY_INLINE), 0);

  cc_pstore_t ps;
  cr_assert_eq(
      cc_prepare_store(&a, KVS_PROTO_STRATEGY_SHM, KVS_PROTO_KIND_CHUNKS, &o->l, o->k, N, &ps), 0);
  cr_assert_neq(ps.xfer, 0);
  cr_assert_eq(ps.n_outcomes, N);
  cr_assert_eq(ps.n_slots, N);
  uint64_t seg = kvs_pool_segment_size(S.pool);
  for (uint32_t i = 0; i < N; i++) {
    cr_assert_eq(ps.outcomes[i], KVS_RES_RESERVED);
    cr_assert_eq(ps.slots[i].key_index, i);
    cr_assert_eq(ps.slots[i].length, LEN);
    cr_assert_leq(ps.slots[i].offset + LEN, seg);
    for (uint32_t j = 0; j < i; j++) cr_assert_neq(ps.slots[i].offset, ps.slots[j].offset);
  }
  kvs_store_info_t in = ts_info(S.store);
  cr_assert_geq(in.reserved_bytes, N * LEN);
  cr_assert_eq(in.objects_writing, N);
  /* Reserved but uncommitted: invisible to every reader. */
  uint32_t found = 99;
  cr_assert_eq(cc_lookup(&b, o->k, N, &found), 0);
  cr_assert_eq(found, 0);
  cc_pretr_t pr;
  cr_assert_eq(cc_prepare_retrieve(&b, KVS_PROTO_STRATEGY_INLINE, o->k, N, &pr), 0);
  cr_assert_eq(pr.n_found, 0);
  cc_pretr_free(&pr);

  cr_assert_eq(cc_write_and_commit(&a, &ps, o->k, KVS_PROTO_KIND_CHUNKS), N);
  in = ts_info(S.store);
  cr_assert_eq(in.reserved_bytes, 0);
  cr_assert_eq(in.objects_ready, N);
  cr_assert_eq(in.used_bytes + in.reserved_bytes + in.free_bytes, in.arena_bytes);
  cr_assert_eq(cc_lookup(&b, o->k, N, &found), 0);
  cr_assert_eq(found, N);

  /* Retrieve through SHM: pinned until COMMIT_RETRIEVE. */
  cc_pretr_t rs, ri;
  cr_assert_eq(cc_prepare_retrieve(&a, KVS_PROTO_STRATEGY_SHM, o->k, N, &rs), 0);
  cr_assert_eq(rs.n_found, N);
  cr_assert_eq(rs.n_objects, N);
  cr_assert(!rs.is_inline);
  cr_assert_neq(rs.xfer, 0);
  cr_assert_eq(ts_info(S.store).pins, N);
  for (uint32_t i = 0; i < N; i++) {
    check_obj(&a, &rs, i, o->k[i], LEN);
    cr_assert_eq(rs.objects[i].layout.ndim, 1);
    cr_assert_eq(rs.objects[i].layout.shape[0], LEN);
  }
  /* Retrieve inline on the other connection meanwhile: the pins end with the reply. */
  cr_assert_eq(cc_prepare_retrieve(&b, KVS_PROTO_STRATEGY_INLINE, o->k, N, &ri), 0);
  cr_assert_eq(ri.n_found, N);
  cr_assert(ri.is_inline);
  cr_assert_eq(ri.xfer, 0);
  cr_assert_eq(ts_info(S.store).pins, N, "inline retrieve left pins behind");
  for (uint32_t i = 0; i < N; i++) {
    check_obj(&b, &ri, i, o->k[i], LEN);
    cr_assert_eq(memcmp(cc_object_bytes(&a, &rs, i), cc_object_bytes(&b, &ri, i), LEN), 0,
                 "SHM and inline bytes differ for object %u", i);
  }
  cr_assert_eq(cc_commit_retrieve(&a, rs.xfer), 0);
  cr_assert_eq(ts_info(S.store).pins, 0);
  /* A committed read transfer is gone. */
  cr_assert_eq(cc_commit_retrieve(&a, rs.xfer), -ENOENT);
  cc_pretr_free(&rs);
  cc_pretr_free(&ri);
  /* The inline connection may also retrieve only part: a missing key in the middle. */
  kvs_key_t mixed[3] = {o->k[0], tk(3, 99), o->k[2]};
  cr_assert_eq(cc_prepare_retrieve(&b, KVS_PROTO_STRATEGY_INLINE, mixed, 3, &ri), 0);
  cr_assert_eq(ri.n_found, 1);
  cr_assert_eq(ri.n_objects, 1);
  check_obj(&b, &ri, 0, o->k[0], LEN);
  cc_pretr_free(&ri);
  cc_close(&a);
  cc_close(&b);
}

Test(ops, store_inline_then_retrieve_both_ways, T_TIMEOUT) {
  enum { N = 5 };
  const uint64_t LEN = 20000;
  const objs_t *o = start_objs(8, N, 4, LEN);
  cc_t a, b;
  cr_assert_eq(cc_open(&a, S.path, KVS_PROTO_STRATEGY_INLINE), 0);
  open_shm(&b);
  /* Inline prepare: an empty context (nothing reserved, no transfer). */
  cc_pstore_t ps;
  cr_assert_eq(cc_prepare_store(&a, KVS_PROTO_STRATEGY_INLINE, 0, &o->l, o->k, N, &ps), 0);
  cr_assert_eq(ps.xfer, 0);
  cr_assert_eq(ps.n_slots, 0);
  cr_assert_eq(ps.n_outcomes, N);
  for (int i = 0; i < N; i++) cr_assert_eq(ps.outcomes[i], KVS_RES_RESERVED);
  cr_assert_eq(ts_info(S.store).reserved_bytes, 0);
  uint32_t committed = 0;
  uint8_t outc[N];
  cr_assert_eq(cc_commit_inline(&a, 0, KVS_PROTO_KIND_CHUNKS, &o->l, o->k, N,
                                (const void *const *)o->bufs, &committed, outc), 0);
  cr_assert_eq(committed, N);
  for (int i = 0; i < N; i++) cr_assert_eq(outc[i], KVS_RES_RESERVED);
  kvs_store_info_t in = ts_info(S.store);
  cr_assert_eq(in.objects_ready, N);
  cr_assert_eq(in.reserved_bytes, 0);
  cr_assert_eq(ts_local_verify(S.store, o->k, N), N);
  /* Second time: PRESENT, nothing to send; a commit anyway keeps nothing new. */
  cr_assert_eq(cc_prepare_store(&a, KVS_PROTO_STRATEGY_INLINE, 0, &o->l, o->k, N, &ps), 0);
  for (int i = 0; i < N; i++) cr_assert_eq(ps.outcomes[i], KVS_RES_PRESENT);
  cr_assert_eq(cc_commit_inline(&a, 0, KVS_PROTO_KIND_CHUNKS, &o->l, o->k, 2,
                                (const void *const *)o->bufs, &committed, outc), 0);
  cr_assert_eq(committed, 0);
  cr_assert_eq(outc[0], KVS_RES_PRESENT);
  cr_assert_eq(ts_info(S.store).objects_ready, N);
  /* SHM prepare of present keys: PRESENT, no slots, no transfer. */
  cr_assert_eq(cc_prepare_store(&b, KVS_PROTO_STRATEGY_SHM, 0, &o->l, o->k, N, &ps), 0);
  cr_assert_eq(ps.xfer, 0);
  cr_assert_eq(ps.n_slots, 0);
  cr_assert_eq(ps.outcomes[N - 1], KVS_RES_PRESENT);

  cc_pretr_t rs, ri;
  cr_assert_eq(cc_prepare_retrieve(&b, KVS_PROTO_STRATEGY_SHM, o->k, N, &rs), 0);
  cr_assert_eq(cc_prepare_retrieve(&a, KVS_PROTO_STRATEGY_INLINE, o->k, N, &ri), 0);
  cr_assert_eq(rs.n_found, N);
  cr_assert_eq(ri.n_found, N);
  for (uint32_t i = 0; i < N; i++) {
    check_obj(&b, &rs, i, o->k[i], LEN);
    check_obj(&a, &ri, i, o->k[i], LEN);
    cr_assert_eq(memcmp(cc_object_bytes(&b, &rs, i), o->bufs[i], LEN), 0);
    cr_assert_eq(memcmp(cc_object_bytes(&a, &ri, i), o->bufs[i], LEN), 0);
  }
  cr_assert_eq(cc_commit_retrieve(&b, rs.xfer), 0);
  cc_pretr_free(&rs);
  cc_pretr_free(&ri);
  cc_close(&a);
  cc_close(&b);
}

Test(ops, object_with_aliases_shm_and_inline, T_TIMEOUT) {
  const uint64_t LEN = 10000;
  const objs_t *o = start_objs(8, 3, 5, LEN);
  cc_t a;
  open_shm(&a);
  cc_pstore_t ps;
  cr_assert_eq(
      cc_prepare_store(&a, KVS_PROTO_STRATEGY_SHM, KVS_PROTO_KIND_OBJECT, &o->l, o->k, 3, &ps), 0);
  cr_assert_eq(ps.n_outcomes, 1);
  cr_assert_eq(ps.n_slots, 1);
  cr_assert_eq(ps.outcomes[0], KVS_RES_RESERVED);
  cr_assert_eq(cc_write_and_commit(&a, &ps, o->k, KVS_PROTO_KIND_OBJECT), 1);
  kvs_store_info_t in = ts_info(S.store);
  cr_assert_eq(in.objects_ready, 1);
  cr_assert_eq(in.keys, 3);
  /* Every alias answers, with the primary's bytes. */
  for (int i = 0; i < 3; i++) {
    cc_pretr_t r;
    cr_assert_eq(cc_prepare_retrieve(&a, KVS_PROTO_STRATEGY_SHM, &o->k[i], 1, &r), 0);
    cr_assert_eq(r.n_found, 1);
    check_obj(&a, &r, 0, o->k[0], LEN);
    cr_assert_eq(cc_commit_retrieve(&a, r.xfer), 0);
    cc_pretr_free(&r);
  }
  /* Inline object: entries[0] the object, entries[1..] aliases. */
  kvs_key_t kb[2] = {tk(5, 10), tk(5, 11)};
  void *buf = malloc(LEN);
  pat_fill(buf, LEN, kb[0]);
  const void *bufs[1] = {buf};
  uint32_t committed = 0;
  cr_assert_eq(
      cc_commit_inline(&a, 0, KVS_PROTO_KIND_OBJECT, &o->l, kb, 2, bufs, &committed, NULL), 0);
  cr_assert_eq(committed, 1);
  cc_pretr_t r;
  cr_assert_eq(cc_prepare_retrieve(&a, KVS_PROTO_STRATEGY_INLINE, &kb[1], 1, &r), 0);
  cr_assert_eq(r.n_found, 1);
  check_obj(&a, &r, 0, kb[0], LEN);
  cc_pretr_free(&r);
  free(buf);
  cc_close(&a);
}

Test(ops, inline_commit_naming_shm_transfer_aborts_its_reservation, T_TIMEOUT) {
  enum { N = 3 };
  const uint64_t LEN = 9000;
  const objs_t *o = start_objs(8, N, 6, LEN);
  cc_t a;
  open_shm(&a);
  kvs_store_info_t base = ts_info(S.store);
  uint64_t aborts0 = ts_stat(&S, KVS_STAT_store_aborted_objects);
  cc_pstore_t ps;
  cr_assert_eq(cc_prepare_store(&a, KVS_PROTO_STRATEGY_SHM, 0, &o->l, o->k, N, &ps), 0);
  cr_assert_eq(ps.n_slots, N);
  cr_assert_gt(ts_info(S.store).reserved_bytes, base.reserved_bytes);
  /* The seed's flow: the client decides to send the bytes inline after all. */
  uint32_t committed = 0;
  cr_assert_eq(cc_commit_inline(&a, ps.xfer, KVS_PROTO_KIND_CHUNKS, &o->l, o->k, N,
                                (const void *const *)o->bufs, &committed, NULL), 0);
  cr_assert_eq(committed, N);
  kvs_store_info_t in = ts_info(S.store);
  cr_assert_eq(in.reserved_bytes, base.reserved_bytes, "the SHM reservation leaked");
  cr_assert_eq(in.objects_writing, 0);
  cr_assert_eq(in.objects_ready, N);
  /* Exactly N objects' extents are used: nothing held twice. */
  uint64_t pg = kvs_pool_page_size(S.pool);
  cr_assert_eq(in.used_bytes, base.used_bytes + N * KVS__ALIGN_UP(LEN, pg));
  cr_assert_eq(in.used_bytes + in.free_bytes, in.arena_bytes);
  cr_assert_eq(ts_stat(&S, KVS_STAT_store_aborted_objects), aborts0 + N);
  cr_assert_eq(ts_local_verify(S.store, o->k, N), N);
  /* The replaced transfer no longer exists. */
  cr_assert_eq(cc_abort(&a, ps.xfer), -ENOENT);
  cr_assert_eq(cc_commit_shm(&a, ps.xfer, ps.slots, ps.n_slots, NULL), -ENOENT);
  cc_close(&a);
}

Test(ops, duplicate_prepare_is_busy_and_leaks_nothing, T_TIMEOUT) {
  const objs_t *o = start_objs(8, 3, 7, 4096);
  cc_t a, b;
  open_shm(&a);
  open_shm(&b);
  cc_pstore_t pa, pb;
  cr_assert_eq(cc_prepare_store(&a, KVS_PROTO_STRATEGY_SHM, 0, &o->l, o->k, 2, &pa), 0);
  cr_assert_eq(pa.n_slots, 2);
  uint64_t r1 = ts_info(S.store).reserved_bytes;
  cr_assert_gt(r1, 0);
  /* Another connection: BUSY, no slots, no transfer, nothing more reserved. */
  cr_assert_eq(cc_prepare_store(&b, KVS_PROTO_STRATEGY_SHM, 0, &o->l, o->k, 2, &pb), 0);
  cr_assert_eq(pb.outcomes[0], KVS_RES_BUSY);
  cr_assert_eq(pb.outcomes[1], KVS_RES_BUSY);
  cr_assert_eq(pb.n_slots, 0);
  cr_assert_eq(pb.xfer, 0);
  cr_assert_eq(ts_info(S.store).reserved_bytes, r1, "a duplicate prepare reserved bytes");
  /* The same connection again: BUSY too (the seed overwrote and leaked the first). */
  cr_assert_eq(cc_prepare_store(&a, KVS_PROTO_STRATEGY_SHM, 0, &o->l, o->k, 1, &pb), 0);
  cr_assert_eq(pb.outcomes[0], KVS_RES_BUSY);
  cr_assert_eq(ts_info(S.store).reserved_bytes, r1);
  /* A mix: the free key is reserved, the busy one is not. */
  cr_assert_eq(cc_prepare_store(&b, KVS_PROTO_STRATEGY_SHM, 0, &o->l, &o->k[1], 2, &pb), 0);
  cr_assert_eq(pb.outcomes[0], KVS_RES_BUSY);
  cr_assert_eq(pb.outcomes[1], KVS_RES_RESERVED);
  cr_assert_eq(pb.n_slots, 1);
  cr_assert_eq(pb.slots[0].key_index, 1);
  cr_assert_eq(cc_abort(&b, pb.xfer), 0);
  cr_assert_eq(ts_info(S.store).reserved_bytes, r1);
  /* An inline commit of a key being written elsewhere: BUSY outcome, nothing kept. */
  uint32_t committed = 9;
  uint8_t outc[1] = {0xff};
  cr_assert_eq(cc_commit_inline(&b, 0, 0, &o->l, o->k, 1, (const void *const *)o->bufs,
                                &committed, outc), 0);
  cr_assert_eq(committed, 0);
  cr_assert_eq(outc[0], KVS_RES_BUSY);
  cr_assert_eq(ts_info(S.store).reserved_bytes, r1);
  /* The owner commits; now everyone sees PRESENT. */
  cr_assert_eq(cc_write_and_commit(&a, &pa, o->k, 0), 2);
  cr_assert_eq(ts_info(S.store).reserved_bytes, 0);
  cr_assert_eq(cc_prepare_store(&b, KVS_PROTO_STRATEGY_SHM, 0, &o->l, o->k, 2, &pb), 0);
  cr_assert_eq(pb.outcomes[0], KVS_RES_PRESENT);
  cr_assert_eq(pb.outcomes[1], KVS_RES_PRESENT);
  cr_assert_eq(ts_local_verify(S.store, o->k, 2), 2);
  cc_close(&a);
  cc_close(&b);
}

Test(ops, foreign_transfer_is_eperm_and_changes_nothing, T_TIMEOUT) {
  const uint64_t LEN = 8192;
  const objs_t *o = start_objs(8, 2, 8, LEN);
  cc_t a, b;
  open_shm(&a);
  open_shm(&b);
  uint64_t errs0 = ts_stat(&S, KVS_STAT_coord_errors);
  uint64_t bad0 = ts_stat(&S, KVS_STAT_store_bad_transfer);
  cc_pstore_t pa;
  cr_assert_eq(cc_prepare_store(&a, KVS_PROTO_STRATEGY_SHM, 0, &o->l, o->k, 2, &pa), 0);
  kvs_store_info_t mid = ts_info(S.store);
  uint8_t *base = kvs_pool_base(b.pool);
  for (uint32_t i = 0; i < pa.n_slots; i++) pat_fill(base + pa.slots[i].offset, LEN, o->k[i]);
  /* b names a's transfer with a's exact slots: refused, and the connection stays. */
  cr_assert_eq(cc_commit_shm(&b, pa.xfer, pa.slots, pa.n_slots, NULL), -EPERM);
  cr_assert_eq(cc_abort(&b, pa.xfer), -EPERM);
  cr_assert_eq(cc_ping(&b, 42, "x", 1), 0);
  kvs_store_info_t in = ts_info(S.store);
  cr_assert_eq(in.reserved_bytes, mid.reserved_bytes);
  cr_assert_eq(in.objects_ready, 0, "a foreign commit published objects");
  /* a's transfer is intact. */
  uint32_t committed = 0;
  cr_assert_eq(cc_commit_shm(&a, pa.xfer, pa.slots, pa.n_slots, &committed), 0);
  cr_assert_eq(committed, 2);
  /* Read transfers too. */
  cc_pretr_t r;
  cr_assert_eq(cc_prepare_retrieve(&a, KVS_PROTO_STRATEGY_SHM, o->k, 2, &r), 0);
  cr_assert_eq(cc_commit_retrieve(&b, r.xfer), -EPERM);
  cr_assert_eq(ts_info(S.store).pins, 2);
  cr_assert_eq(cc_commit_retrieve(&a, r.xfer), 0);
  cr_assert_eq(ts_info(S.store).pins, 0);
  cc_pretr_free(&r);
  /* A transfer that never existed. */
  cr_assert_eq(cc_commit_retrieve(&b, 0x123456789ull), -ENOENT);
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_errors), errs0 + 4);
  cr_assert_geq(ts_stat(&S, KVS_STAT_store_bad_transfer), bad0 + 3);
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_bad_frames), 0);
  cc_close(&a);
  cc_close(&b);
}

Test(ops, abort_and_commit_retrieve_noop, T_TIMEOUT) {
  const objs_t *o = start_objs(4, 2, 9, 4096);
  cc_t a;
  open_shm(&a);
  cc_pstore_t ps;
  cr_assert_eq(cc_prepare_store(&a, KVS_PROTO_STRATEGY_SHM, 0, &o->l, o->k, 2, &ps), 0);
  cr_assert_gt(ts_info(S.store).reserved_bytes, 0);
  cr_assert_eq(cc_abort(&a, ps.xfer), 0);
  kvs_store_info_t in = ts_info(S.store);
  cr_assert_eq(in.reserved_bytes, 0);
  cr_assert_eq(in.free_bytes, in.arena_bytes);
  uint32_t found = 9;
  cr_assert_eq(cc_lookup(&a, o->k, 2, &found), 0);
  cr_assert_eq(found, 0);
  cr_assert_eq(cc_abort(&a, ps.xfer), -ENOENT);
  cr_assert_eq(cc_commit_retrieve(&a, 0), 0, "COMMIT_RETRIEVE 0 is a no-op");
  /* ABORT of a read transfer releases its pins. */
  cr_assert_eq(ts_local_put(S.store, o->k, 2, &o->l), 2);
  cc_pretr_t r;
  cr_assert_eq(cc_prepare_retrieve(&a, KVS_PROTO_STRATEGY_SHM, o->k, 2, &r), 0);
  cr_assert_eq(ts_info(S.store).pins, 2);
  cr_assert_eq(cc_abort(&a, r.xfer), 0);
  cr_assert_eq(ts_info(S.store).pins, 0);
  cc_pretr_free(&r);
  cc_close(&a);
}

Test(ops, stats_info_and_json, T_TIMEOUT) {
  const objs_t *o = start_objs(4, 2, 10, 4096);
  cr_assert_eq(ts_local_put(S.store, o->k, 2, &o->l), 2);
  cc_t a;
  open_shm(&a);
  static char text[65536];
  int n = cc_stats(&a, KVS_PROTO_STATS_INFO, text, sizeof text);
  cr_assert_gt(n, 0);
  cr_assert_eq(strncmp(text, "# kvshim stats v1", 17), 0, "INFO text: %.60s", text);
  cr_assert_not_null(strstr(text, "\r\nstore_objects:2\r\n"), "%s", text);
  cr_assert_not_null(strstr(text, "\r\ncoord_requests:"));
  n = cc_stats(&a, KVS_PROTO_STATS_JSON, text, sizeof text);
  cr_assert_gt(n, 2);
  cr_assert_eq(text[0], '{');
  cr_assert_eq(text[n - 1] == '\n' ? text[n - 2] : text[n - 1], '}');
  cr_assert_not_null(strstr(text, "\"store_objects\":2"), "%s", text);
  cr_assert_not_null(strstr(text, "\"store_arena_bytes\":4194304"), "%s", text);
  cc_close(&a);
}

static void small_frames(ts_server_t *s) { s->opts.max_frame = KVS_PROTO_MIN_MAX_FRAME; }

Test(ops, ping_echo_and_split_messages, T_TIMEOUT) {
  start(8, small_frames);
  cc_t a;
  cr_assert_eq(cc_connect(&a, S.path), 0);
  cr_assert_eq(cc_hello(&a, KVS_PROTO_STRATEGY_INLINE, KVS_PROTO_CAP_INLINE,
                        KVS_PROTO_MIN_MAX_FRAME), 0);
  cr_assert_eq(a.peer_max_frame, KVS_PROTO_MIN_MAX_FRAME);
  cr_assert_eq(cc_ping(&a, 1, NULL, 0), 0);
  /* 300 KB each way: split into 64 KiB frames by both sides. */
  size_t n = 300000;
  uint8_t *echo = malloc(n);
  pat_fill(echo, n, tk(11, 0));
  cr_assert_eq(cc_ping(&a, 0xfeedull, echo, (uint32_t)n), 0);
  /* An inline retrieve of a 1 MiB object comes in many frames, intact. */
  const uint64_t LEN = 1 << 20;
  kvs_key_t k = tk(11, 1);
  kvs_layout_t l = blob(LEN);
  cr_assert_eq(ts_local_put(S.store, &k, 1, &l), 1);
  cc_pretr_t r;
  cr_assert_eq(cc_prepare_retrieve(&a, KVS_PROTO_STRATEGY_INLINE, &k, 1, &r), 0);
  cr_assert_gt(r.msg.frames, 16, "reply came in %u frames", r.msg.frames);
  check_obj(&a, &r, 0, k, LEN);
  cc_pretr_free(&r);
  /* And an inline store of 1 MiB is split on the way in. */
  kvs_key_t k2 = tk(11, 2);
  void *buf = malloc(LEN);
  pat_fill(buf, LEN, k2);
  const void *bufs[1] = {buf};
  uint32_t committed = 0;
  cr_assert_eq(cc_commit_inline(&a, 0, 0, &l, &k2, 1, bufs, &committed, NULL), 0);
  cr_assert_eq(committed, 1);
  cr_assert_eq(ts_local_verify(S.store, &k2, 1), 1);
  free(buf);
  free(echo);
  cc_close(&a);
}

static kvs_tensor_registry_t *REG;
static void with_registry(ts_server_t *s) {
  cr_assert_eq(kvs_tensor_registry_create(16, &REG), 0);
  s->tensors = kvs_tensor_registry_coord(REG);
}

Test(ops, export_tensors_cpu_shm, T_TIMEOUT) {
  start(8, with_registry);
  /* A CPU_SHM record over an object of the pool, as the host-allocation hook would record. */
  const uint64_t LEN = 64 << 10;
  kvs_key_t k = tk(12, 0);
  kvs_layout_t l = blob(LEN);
  cr_assert_eq(ts_local_put(S.store, &k, 1, &l), 1);
  kvs_xfer_t x;
  kvs_object_view_t v;
  cr_assert_eq(kvs_store_lookup(S.store, KVS_OWNER_LOCAL, &k, 1, true, &x), 1);
  cr_assert_eq(kvs_store_read_pinned(S.store, KVS_OWNER_LOCAL, x, &v, 1), 1);
  const uint64_t VA = 0x7f0000000000ull;
  kvs_tensor_desc_t t = tf_u8_vec(KVS_TENSOR_CPU_SHM, LEN);
  t.cpu.instance_id = S.instance_id;
  t.cpu.offset = v.extent.offset;
  t.cpu.length = LEN;
  cr_assert_eq(kvs_tensor_registry_add(REG, VA, LEN, &t, true), 0);
  cr_assert_eq(kvs_tensor_registry_add(REG, VA + 2 * LEN, 4096, NULL, false), 0);

  cc_t a;
  open_shm(&a);
  kvs_tensor_desc_t d[4];
  int n = cc_export(&a, VA + 4096, 8192, d, 4);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].kind, KVS_TENSOR_CPU_SHM);
  cr_assert_eq(d[0].cpu.instance_id, S.instance_id);
  cr_assert_eq(d[0].cpu.offset, v.extent.offset + 4096);
  cr_assert_eq(d[0].cpu.length, 8192);
  cr_assert_eq(d[0].shape[0], 8192);
  /* Opened through the pool the client mapped: the server's bytes. */
  void *p = NULL;
  cr_assert_eq(kvs_tensor_open_cpu(&d[0], a.pool, &p), 0);
  uint8_t *want = malloc(LEN);
  pat_fill(want, LEN, k);
  cr_assert_eq(memcmp(p, want + 4096, 8192), 0);
  /* A range over the whole record and the non-exportable one: only the exportable part. */
  n = cc_export(&a, VA, 3 * LEN, d, 4);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].cpu.length, LEN);
  /* Nothing recorded there. */
  cr_assert_eq(cc_export(&a, 0x1000, 4096, d, 4), 0);
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_errors), 0);
  kvs_store_release(S.store, KVS_OWNER_LOCAL, x);
  free(want);
  cc_close(&a);
  ts_server_stop(&S, true);
  memset(&S, 0, sizeof S);
  kvs_tensor_registry_destroy(REG);
}

Test(ops, export_tensors_without_registry_answers_none, T_TIMEOUT) {
  start(4, NULL);
  cc_t a;
  open_shm(&a);
  kvs_tensor_desc_t d[1];
  cr_assert_eq(cc_export(&a, 0x7f0000000000ull, 4096, d, 1), 0);
  cc_close(&a);
}

/* ---- the peer client API on top ---------------------------------------------------------- */

typedef struct sink_ctx {
  const kvs_key_t *keys;
  uint64_t len;
  uint8_t *copy[16];
  int bad;
} sink_ctx_t;

static int sink(void *ctx, size_t i, const kvs_layout_t *layout, const void *bytes, uint64_t len) {
  sink_ctx_t *s = ctx;
  if (len != s->len || kvs_layout_nbytes(layout) != len || pat_check(bytes, len, s->keys[i]))
    s->bad++;
  s->copy[i] = malloc(len);
  memcpy(s->copy[i], bytes, len);
  return 0;
}

static kvs_peers_t *peers_for(int strategy) {
  kvs_options_t o = S.opts;
  o.strategy = strategy;
  kvs_peers_config_t pc = {.opts = &o, .role = KVS_PROTO_ROLE_TOOL};
  kvs_peers_t *p = NULL;
  cr_assert_eq(kvs_peers_create(&pc, &p), 0);
  cr_assert_eq(kvs_peers_discover(p, true), 1);
  return p;
}

Test(ops, peers_api_shm_and_inline_return_the_same_bytes, T_TIMEOUT) {
  enum { N = 8 };
  const uint64_t LEN = 100000;
  const objs_t *o = start_objs(16, N, 13, LEN);
  kvs_peers_t *ps = peers_for(KVS_STRATEGY_AUTO), *pi = peers_for(KVS_STRATEGY_INLINE);
  kvs_peer_info_t info[2];
  cr_assert_eq(kvs_peers_list(ps, info, 2), 1);
  cr_assert_eq(info[0].instance_id, S.instance_id);
  cr_assert_eq(info[0].strategy, KVS_PROTO_STRATEGY_SHM);
  cr_assert_eq(info[0].role, KVS_PROTO_ROLE_CACHE);
  cr_assert_eq(kvs_peers_list(pi, info, 2), 1);
  cr_assert_eq(info[0].strategy, KVS_PROTO_STRATEGY_INLINE);

  /* First half stored through SHM, second half inline. */
  uint8_t outc[N];
  cr_assert_eq(
      kvs_peers_store(ps, 0, o->k, N / 2, &o->l, false, (const void *const *)o->bufs, outc), N / 2);
  cr_assert_eq(outc[0], KVS_RES_RESERVED);
  cr_assert_eq(kvs_peers_store(pi, S.instance_id, &o->k[N / 2], N / 2, &o->l, false,
                               (const void *const *)&o->bufs[N / 2], outc), N / 2);
  cr_assert_eq(ts_local_verify(S.store, o->k, N), N);
  uint64_t best = 0;
  cr_assert_eq(kvs_peers_lookup(ps, o->k, N, &best), N);
  cr_assert_eq(best, S.instance_id);

  sink_ctx_t a = {o->k, LEN, {0}, 0}, b = {o->k, LEN, {0}, 0};
  cr_assert_eq(kvs_peers_retrieve(ps, 0, o->k, N, sink, &a), N);
  cr_assert_eq(kvs_peers_retrieve(pi, S.instance_id, o->k, N, sink, &b), N);
  cr_assert_eq(a.bad + b.bad, 0);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(memcmp(a.copy[i], b.copy[i], LEN), 0, "SHM and inline differ at %d", i);
    free(a.copy[i]);
    free(b.copy[i]);
  }
  /* A miss is 0, not an error. */
  kvs_key_t none = tk(13, 1000);
  cr_assert_eq(kvs_peers_retrieve(ps, 0, &none, 1, sink, &a), 0);
  cr_assert_eq(kvs_peers_ping(ps, S.instance_id), 0);
  static char text[65536];
  cr_assert_gt(kvs_peers_stats(pi, S.instance_id, false, text, sizeof text), 0);
  cr_assert_not_null(strstr(text, "store_objects:8"), "%s", text);
  cr_assert_eq(ts_info(S.store).pins, 0);
  kvs_peers_destroy(ps);
  kvs_peers_destroy(pi);
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, S.coord, 0, 2000), 0);
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_errors), 0);
}

/* The queries are pure (core/wire/peer.h, design §3.8): with a server listening but no discovery
 * run, lookup, retrieve and store find no peer, and none of them dials one (the table stays
 * empty). The first discovery then finds it, and the same calls reach it. */
Test(ops, peers_queries_never_discover, T_TIMEOUT) {
  const objs_t *o = start_objs(16, 1, 17, 4096);
  kvs_options_t opts = S.opts;
  kvs_peers_config_t pc = {.opts = &opts, .role = KVS_PROTO_ROLE_TOOL};
  kvs_peers_t *p = NULL;
  cr_assert_eq(kvs_peers_create(&pc, &p), 0);
  uint64_t best = 1;
  sink_ctx_t a = {o->k, 4096, {0}, 0};
  kvs_peer_info_t info[1];
  cr_assert_eq(kvs_peers_store(p, 0, o->k, 1, &o->l, false, (const void *const *)o->bufs, NULL),
               -ENOENT, "a store found a peer nobody discovered");
  cr_assert_eq(kvs_peers_lookup(p, o->k, 1, &best), 0);
  cr_assert_eq(best, 0);
  cr_assert_eq(kvs_peers_retrieve(p, 0, o->k, 1, sink, &a), 0);
  cr_assert_eq(kvs_peers_cache_peer(p), 0);
  cr_assert_eq(kvs_peers_list(p, info, 1), 0, "a query dialled the server");
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_connections), 0, "a query connected");
  cr_assert_eq(kvs_peers_discover(p, true), 1);
  cr_assert_eq(kvs_peers_store(p, 0, o->k, 1, &o->l, false, (const void *const *)o->bufs, NULL), 1);
  cr_assert_eq(kvs_peers_lookup(p, o->k, 1, &best), 1);
  cr_assert_eq(best, S.instance_id);
  cr_assert_eq(kvs_peers_retrieve(p, 0, o->k, 1, sink, &a), 1);
  cr_assert_eq(a.bad, 0);
  free(a.copy[0]);
  kvs_peers_destroy(p);
}

/* ---- writes held across the caller's own work (kvs_peers_reserve, core/wire/peer.h) ----------- */

/* Several object reservations at one peer in one round trip, held at once without the
 * connection's lock (the direct snapshots of design §10.4 hold one per chunk across the
 * engine's call): other calls on the same connection go on meanwhile, nothing is visible before
 * its publish, an unreserved one leaves nothing behind, a key being written or stored is not
 * reserved again (its outcome says why), and what is published is exactly the bytes written in
 * place, under its aliases too. */
Test(ops, peers_reservations_are_held_across_other_calls, T_TIMEOUT) {
  enum { N = 3 };
  const uint64_t LEN = 50000;
  const objs_t *o = start_objs(8, N, 31, LEN);
  kvs_peers_t *ps = peers_for(KVS_STRATEGY_AUTO), *pi = peers_for(KVS_STRATEGY_INLINE);
  kvs_store_info_t base = ts_info(S.store);
  const kvs_key_t keys0[2] = {o->k[0], tk(31, 100)}; /* object 0 with an alias */
  kvs_peer_resv_t r[N + 1], again = {.keys = &o->k[1], .n_keys = 1, .len = LEN};
  kvs_peer_resv_t *rp[N + 1];
  for (int i = 0; i < N; i++) {
    r[i] = (kvs_peer_resv_t){.keys = i ? &o->k[i] : keys0, .n_keys = i ? 1 : 2, .len = LEN};
    rp[i] = &r[i];
  }
  r[N] = (kvs_peer_resv_t){.keys = &o->k[1], .n_keys = 1, .len = LEN}; /* twice in one call */
  rp[N] = &r[N];
  cr_assert_eq(kvs_peers_reserve(ps, 0, rp, N + 1), N);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(r[i].outcome, KVS_RES_RESERVED);
    cr_assert_not_null(r[i].dst);
    cr_assert_not_null(r[i].conn);
  }
  cr_assert_eq(r[N].outcome, KVS_RES_BUSY, "the same key twice: the second is being written");
  cr_assert_null(r[N].conn);
  cr_assert_neq(r[0].dst, r[1].dst);
  /* held, not visible; the connection answers other calls meanwhile */
  uint64_t best = 0;
  cr_assert_eq(kvs_peers_lookup(ps, o->k, N, &best), 0);
  cr_assert_eq(kvs_peers_ping(ps, S.instance_id), 0);
  cr_assert_eq(ts_info(S.store).objects_writing, base.objects_writing + N);
  kvs_peer_resv_t *ap = &again;
  cr_assert_eq(kvs_peers_reserve(ps, 0, &ap, 1), 0);
  cr_assert_eq(again.outcome, KVS_RES_BUSY);
  cr_assert_eq(kvs_peers_reserve(pi, S.instance_id, &ap, 1), -ENOTSUP, "inline: no slot to hold");
  /* written in place and published, out of order, with one never reserved among them; the last
   * dropped */
  for (int i = 0; i < 2; i++) pat_fill(r[i].dst, LEN, o->k[i]);
  uint64_t stores0 = kvs_stats_get(kvs_stats_global(), KVS_STAT_peer_stores);
  kvs_peer_resv_t *pub[3] = {&r[1], &r[N], &r[0]};
  cr_assert_eq(kvs_peers_publish(ps, pub, 3), 2);
  cr_assert_eq(r[0].rc, 0);
  cr_assert_eq(r[1].rc, 0);
  cr_assert_eq(r[N].rc, -EINVAL, "never reserved: nothing to publish");
  cr_assert_null(r[0].conn, "a published reservation is ended");
  cr_assert_eq(kvs_peers_publish(ps, &pub[2], 1), 0, "published twice");
  kvs_peers_unreserve(ps, &r[2]);
  cr_assert_null(r[2].conn);
  cr_assert_eq(kvs_stats_get(kvs_stats_global(), KVS_STAT_peer_stores), stores0 + 2);
  cr_assert_eq(ts_local_verify(S.store, o->k, 2), 2);
  sink_ctx_t a = {o->k, LEN, {0}, 0}; /* checks delivery 0 against key 0's pattern */
  cr_assert_eq(kvs_peers_retrieve(ps, 0, &keys0[1], 1, sink, &a), 1);
  cr_assert_eq(a.bad, 0, "the alias answers with other bytes");
  free(a.copy[0]);
  cr_assert_eq(ts_local_count(S.store, &o->k[2], 1), 0, "an unreserved object was published");
  cr_assert_geq(ts_wait_baseline(S.store, &base, NULL, 0, 2000), 0, "a reservation leaked");
  /* stored now: PRESENT, nothing reserved */
  cr_assert_eq(kvs_peers_reserve(ps, 0, &ap, 1), 0);
  cr_assert_eq(again.outcome, KVS_RES_PRESENT);
  /* bad input: refused, nothing sent */
  kvs_peer_resv_t bad = {.keys = o->k, .n_keys = 1, .len = 0};
  kvs_peer_resv_t *bp = &bad;
  cr_assert_eq(kvs_peers_reserve(ps, 0, &bp, 1), -EINVAL, "an object of no bytes");
  bad = (kvs_peer_resv_t){.keys = o->k, .n_keys = 0, .len = LEN};
  cr_assert_eq(kvs_peers_reserve(ps, 0, &bp, 1), -EINVAL, "an object without keys");
  cr_assert_eq(kvs_peers_reserve(ps, 0, &bp, 0), -EINVAL, "no objects");
  cr_assert_eq(kvs_peers_reserve(ps, 0, &bp, KVS_PEERS_RESERVE_MAX + 1), -EINVAL);
  /* the peer goes away while a reservation is held: the bytes stay writable here (the
   * mapping is the connection's, kept by the reservation) and the publish fails */
  rp[0] = &r[2];
  cr_assert_eq(kvs_peers_reserve(ps, 0, rp, 1), 1);
  ts_server_stop(&S, false);
  pat_fill(r[2].dst, LEN, o->k[2]);
  cr_assert_eq(kvs_peers_publish(ps, rp, 1), 0);
  cr_assert_lt(r[2].rc, 0);
  cr_assert_null(r[2].conn);
  kvs_peers_destroy(ps);
  kvs_peers_destroy(pi);
}

/* A full batch (KVS_PEERS_RESERVE_MAX requests sent before the first reply is read) reserves
 * and publishes every object, one PREPARE_STORE and one COMMIT_STORE each, every byte as
 * written. */
Test(ops, peers_reservations_a_full_batch, T_TIMEOUT) {
  enum { N = KVS_PEERS_RESERVE_MAX };
  const uint64_t LEN = 8192;
  start(8, NULL);
  kvs_peers_t *ps = peers_for(KVS_STRATEGY_AUTO);
  static kvs_key_t k[N];
  static kvs_peer_resv_t r[N];
  kvs_peer_resv_t *rp[N];
  for (int i = 0; i < N; i++) {
    k[i] = tk(37, (uint64_t)i);
    r[i] = (kvs_peer_resv_t){.keys = &k[i], .n_keys = 1, .len = LEN};
    rp[i] = &r[i];
  }
  uint64_t reqs0 = ts_stat(&S, KVS_STAT_coord_requests);
  cr_assert_eq(kvs_peers_reserve(ps, 0, rp, N), N);
  for (int i = 0; i < N; i++) pat_fill(r[i].dst, LEN, k[i]);
  cr_assert_eq(kvs_peers_publish(ps, rp, N), N);
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_requests), reqs0 + 2 * N);
  cr_assert_eq(ts_local_verify(S.store, k, N), N);
  kvs_peers_destroy(ps);
}

/* Pages of [p, p + len) that have a page table entry in this process (/proc/self/pagemap bit
 * 63: present), or -1 when pagemap cannot be read here. */
static long pages_present(const void *p, size_t len) {
  FILE *f = fopen("/proc/self/pagemap", "rb");
  if (!f) return -1;
  long page = sysconf(_SC_PAGESIZE), n = 0;
  uintptr_t a = (uintptr_t)p / (uintptr_t)page, b = ((uintptr_t)p + len - 1) / (uintptr_t)page;
  for (uintptr_t v = a; v <= b; v++) {
    uint64_t e = 0;
    if (fseeko(f, (off_t)(v * 8), SEEK_SET) != 0 || fread(&e, 8, 1, f) != 1) {
      fclose(f);
      return -1;
    }
    n += (long)(e >> 63 & 1);
  }
  fclose(f);
  return n;
}

/* A place handed out in the cache peer's pool has its page tables filled before the caller
 * writes there (kvs__peer_place: one populate per 2 MiB granule, not a fault per page); serve's
 * pool pages are not in this process's page tables otherwise. */
Test(ops, peers_places_in_the_pool_are_populated, T_TIMEOUT) {
  const uint64_t LEN = (5 << 20) + 4096; /* crosses granules */
  start(32, NULL);
  kvs_peers_t *ps = peers_for(KVS_STRATEGY_AUTO);
  kvs_key_t k = tk(41, 1);
  kvs_peer_resv_t r = {.keys = &k, .n_keys = 1, .len = LEN}, *rp = &r;
  cr_assert_eq(kvs_peers_reserve(ps, 0, &rp, 1), 1);
  long page = sysconf(_SC_PAGESIZE);
  long want = (long)(((uintptr_t)r.dst + LEN - 1) / (uintptr_t)page - (uintptr_t)r.dst /
                     (uintptr_t)page) + 1;
  long got = pages_present(r.dst, LEN);
  if (got >= 0)
    cr_assert_eq(got, want, "%ld of the %ld pages of the reserved place are mapped before the "
                 "first write", got, want);
  pat_fill(r.dst, LEN, k);
  cr_assert_eq(kvs_peers_publish(ps, &rp, 1), 1);
  cr_assert_eq(ts_local_verify(S.store, &k, 1), 1);
  kvs_peers_destroy(ps);
}

/* madvise for this executable (core is linked in statically, so kvs__prim_populate calls this
 * one): the kernel's, except that while populate_fails is set MADV_POPULATE_WRITE fails with
 * it, as it does for real when the pages cannot be backed (ENOMEM: a memory limit) or lie past
 * the end of the peer's file (EFAULT) (madvise(2)). */
static _Atomic int populate_fails;
int madvise(void *addr, size_t len, int advice) {
  int err = populate_fails;
  if (err && advice == MADV_POPULATE_WRITE) {
    errno = err;
    return -1;
  }
  return (int)syscall(SYS_madvise, addr, len, advice);
}

/* A place whose pages cannot be populated (kvs__peer_place) is refused, never handed out to be
 * touched (which would be SIGBUS): the reservation is aborted at the peer, nothing stays
 * reserved there, and the next one, with populating working again, stores. */
Test(ops, peers_place_refused_when_its_pages_cannot_be_backed, T_TIMEOUT) {
  const uint64_t LEN = (5 << 20) + 4096;
  start(32, NULL);
  kvs_peers_t *ps = peers_for(KVS_STRATEGY_AUTO);
  kvs_key_t k = tk(43, 1);
  const int errs[] = {ENOMEM, EFAULT};
  for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
    kvs_peer_resv_t r = {.keys = &k, .n_keys = 1, .len = LEN}, *rp = &r;
    populate_fails = errs[i];
    int got = kvs_peers_reserve(ps, 0, &rp, 1);
    populate_fails = 0;
    cr_assert_eq(got, 0, "a place that cannot be populated was handed out (%s)",
                 strerror(errs[i]));
    cr_assert_null(r.dst);
    cr_assert_eq(ts_stat(&S, KVS_STAT_store_reserved_bytes), 0, "the reservation stayed");
  }
  kvs_peer_resv_t r = {.keys = &k, .n_keys = 1, .len = LEN}, *rp = &r;
  cr_assert_eq(kvs_peers_reserve(ps, 0, &rp, 1), 1);
  pat_fill(r.dst, LEN, k);
  cr_assert_eq(kvs_peers_publish(ps, &rp, 1), 1);
  cr_assert_eq(ts_local_verify(S.store, &k, 1), 1);
  kvs_peers_destroy(ps);
}

/* A tier below the pool that holds nothing: every fetch answered at once (nothing brought). */
static int no_fetch(void *ctx, const kvs_key_t *keys, size_t found, size_t n,
                    uint64_t deadline_ms, uint64_t token) {
  (void)ctx, (void)keys, (void)found, (void)n, (void)deadline_ms, (void)token;
  return -ENOENT;
}
static void no_publish(void *ctx, const kvs_key_t *keys, size_t n, bool object) {
  (void)ctx, (void)keys, (void)n, (void)object;
}
static const kvs_coord_remote_t NO_TIER = {NULL, no_fetch, no_publish};
static void with_tier(ts_server_t *s) { s->remote = &NO_TIER; }

/* kvs_peers_has_tiers tells a peer whose HELLO offered CAP_REMOTE (a LOOKUP there may bring
 * what its pool lacks, so a key is looked up before it is read) from one without. */
Test(ops, peers_has_tiers_follows_the_hello, T_TIMEOUT) {
  start(8, NULL);
  kvs_peers_t *ps = peers_for(KVS_STRATEGY_AUTO);
  cr_assert_eq(kvs_peers_ping(ps, S.instance_id), 0);
  cr_assert(!kvs_peers_has_tiers(ps, S.instance_id), "a peer without CAP_REMOTE");
  cr_assert(!kvs_peers_has_tiers(ps, S.instance_id + 1), "no such peer");
  kvs_peers_destroy(ps);
  ts_server_reset(&S);
  start(8, with_tier);
  ps = peers_for(KVS_STRATEGY_AUTO);
  cr_assert_eq(kvs_peers_ping(ps, S.instance_id), 0);
  cr_assert(kvs_peers_has_tiers(ps, S.instance_id), "a peer whose HELLO offered CAP_REMOTE");
  cr_assert(kvs_peers_has_tiers(ps, 0), "instance 0: the cache peer, else the first live one");
  kvs_peers_destroy(ps);
}

/* ---- WATCH (docs/protocol.md 4.12) ----------------------------------------------------------- */

/* One WATCH on a raw connection: 0 and its state, or the ERROR code / transport errno. */
static int cc_watch(cc_t *c, const kvs_key_t *keys, uint32_t n, uint32_t wait_ms,
                    uint32_t *state) {
  kvs_proto_watch_t m = {.n_keys = n, .wait_ms = wait_ms, .keys = keys};
  uint8_t buf[8 + 16 * KVS_PROTO_MAX_WATCH_KEYS];
  size_t len = 0;
  int rc = kvs_proto_watch_encode(&m, buf, sizeof buf, &len);
  if (rc < 0) return rc;
  cc_msg_t r;
  rc = cc_call(c, KVS_OP_WATCH, buf, len, &r);
  if (rc == 0) {
    kvs_proto_watch_reply_t rep;
    rc = kvs_proto_watch_reply_decode(r.payload, r.len, &rep);
    if (rc == 0) *state = rep.state;
  }
  cc_msg_free(&r);
  return rc;
}

typedef struct {
  kvs_key_t key;
  bool put;       /* put key (else remove it) */
  int after_ms;
} change_t;

static void *change_later(void *arg) {
  change_t *ch = arg;
  usleep((useconds_t)ch->after_ms * 1000);
  kvs_layout_t l = kvs_layout_blob(64);
  if (ch->put)
    ts_local_put(S.store, &ch->key, 1, &l);
  else
    kvs_store_remove(S.store, &ch->key);
  return NULL;
}

Test(ops, watch_answers_at_once_when_nothing_is_held_and_held_after_wait, T_TIMEOUT) {
  start(4, NULL);
  cc_t a;
  open_shm(&a);
  cr_assert(a.server.caps & KVS_PROTO_CAP_WATCH, "the server does not announce WATCH");
  kvs_key_t k[2] = {tk(40, 0), tk(40, 1)};
  uint32_t st = 99;
  cr_assert_eq(cc_watch(&a, k, 2, 30000, &st), 0);
  cr_assert_eq(st, KVS_PROTO_WATCH_GONE, "an absent key is GONE at once");
  kvs_layout_t l = blob(64);
  cr_assert_eq(ts_local_put(S.store, &k[0], 1, &l), 1);
  cr_assert_eq(cc_watch(&a, k, 2, 0, &st), 0);
  cr_assert_eq(st, KVS_PROTO_WATCH_HELD, "wait 0: answered with the state now");
  uint64_t t0 = ts_now_ms();
  cr_assert_eq(cc_watch(&a, k, 2, 100, &st), 0);
  cr_assert_eq(st, KVS_PROTO_WATCH_HELD);
  cr_assert_geq(ts_now_ms() - t0, 100, "a HELD answer came before wait_ms");
  cr_assert_eq(ts_local_put(S.store, &k[1], 1, &l), 1);
  cr_assert_eq(cc_watch(&a, k, 2, 30000, &st), 0);
  cr_assert_eq(st, KVS_PROTO_WATCH_PRESENT, "keys[1] stored: PRESENT at once");
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_watches), 4);
  cc_close(&a);
}

Test(ops, watch_wakes_on_removal_and_arrival_before_its_deadline, T_TIMEOUT) {
  start(4, NULL);
  cc_t a;
  open_shm(&a);
  kvs_key_t k[2] = {tk(41, 0), tk(41, 1)};
  kvs_layout_t l = blob(64);
  cr_assert_eq(ts_local_put(S.store, &k[0], 1, &l), 1);
  /* The claim goes 50 ms in: answered GONE long before the 20 s asked for. */
  change_t gone = {k[0], false, 50};
  pthread_t t;
  pthread_create(&t, NULL, change_later, &gone);
  uint64_t t0 = ts_now_ms();
  uint32_t st = 99;
  cr_assert_eq(cc_watch(&a, k, 2, 20000, &st), 0);
  pthread_join(t, NULL);
  cr_assert_eq(st, KVS_PROTO_WATCH_GONE);
  cr_assert_lt(ts_now_ms() - t0, 10000, "the WATCH was answered at its deadline, not the change");
  /* keys[1] arrives while keys[0] stays: PRESENT. */
  cr_assert_eq(ts_local_put(S.store, &k[0], 1, &l), 1);
  change_t arrive = {k[1], true, 50};
  pthread_create(&t, NULL, change_later, &arrive);
  t0 = ts_now_ms();
  cr_assert_eq(cc_watch(&a, k, 2, 20000, &st), 0);
  pthread_join(t, NULL);
  cr_assert_eq(st, KVS_PROTO_WATCH_PRESENT);
  cr_assert_lt(ts_now_ms() - t0, 10000);
  cc_close(&a);
}

Test(ops, watch_keeps_requests_in_order_and_closing_cancels_it, T_TIMEOUT) {
  start(4, NULL);
  cc_t a;
  open_shm(&a);
  kvs_key_t k = tk(42, 0);
  kvs_layout_t l = blob(64);
  cr_assert_eq(ts_local_put(S.store, &k, 1, &l), 1);
  /* A WATCH of 200 ms, then a PING sent behind it: the PING's reply comes second. */
  kvs_proto_watch_t m = {.n_keys = 1, .wait_ms = 200, .keys = &k};
  uint8_t buf[64];
  size_t len = 0;
  cr_assert_eq(kvs_proto_watch_encode(&m, buf, sizeof buf, &len), 0);
  uint64_t rid_w = 0, rid_p = 0;
  cr_assert_eq(cc_send(&a, KVS_OP_WATCH, buf, len, &rid_w), 0);
  kvs_proto_ping_t ping = {.nonce = 7};
  uint8_t pb[64];
  size_t pl = 0;
  cr_assert_eq(kvs_proto_ping_encode(&ping, pb, sizeof pb, &pl), 0);
  cr_assert_eq(cc_send(&a, KVS_OP_PING, pb, pl, &rid_p), 0);
  cc_msg_t r1, r2;
  cr_assert_eq(cc_recv(&a, &r1, 5000), 0);
  cr_assert_eq(cc_recv(&a, &r2, 5000), 0);
  cr_assert_eq(r1.h.request_id, rid_w, "the WATCH must be answered first");
  cr_assert_eq(r2.h.request_id, rid_p);
  cc_msg_free(&r1);
  cc_msg_free(&r2);
  /* A client that closes while its WATCH waits: the server forgets it and goes on serving. */
  m.wait_ms = 30000;
  cr_assert_eq(kvs_proto_watch_encode(&m, buf, sizeof buf, &len), 0);
  cr_assert_eq(cc_send(&a, KVS_OP_WATCH, buf, len, NULL), 0);
  cc_close(&a);
  cc_t b;
  open_shm(&b);
  uint32_t found = 0;
  cr_assert_eq(cc_lookup(&b, &k, 1, &found), 0);
  cr_assert_eq(found, 1);
  cc_close(&b);
}

Test(ops, watch_bad_input_is_refused_and_nothing_changes, T_TIMEOUT) {
  start(4, NULL);
  kvs_key_t k[KVS_PROTO_MAX_WATCH_KEYS + 1];
  for (uint32_t i = 0; i <= KVS_PROTO_MAX_WATCH_KEYS; i++) k[i] = tk(43, i);
  kvs_layout_t l = blob(64);
  cr_assert_eq(ts_local_put(S.store, &k[0], 1, &l), 1);
  /* The encoder refuses what the decoder would. */
  kvs_proto_watch_t m = {.n_keys = 0, .wait_ms = 0, .keys = k};
  uint8_t buf[8 + 16 * (KVS_PROTO_MAX_WATCH_KEYS + 1)];
  size_t len = 0;
  cr_assert_eq(kvs_proto_watch_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.n_keys = KVS_PROTO_MAX_WATCH_KEYS + 1;
  cr_assert_eq(kvs_proto_watch_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.n_keys = 1, m.wait_ms = KVS_PROTO_MAX_WATCH_MS + 1;
  cr_assert_eq(kvs_proto_watch_encode(&m, buf, sizeof buf, &len), -EINVAL);
  /* Raw bytes on the wire: each is an ERROR EBADMSG and the connection closes. */
  struct { uint32_t n, wait; } bad[] = {{0, 0}, {KVS_PROTO_MAX_WATCH_KEYS + 1, 0},
                                       {1, KVS_PROTO_MAX_WATCH_MS + 1}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cc_t a;
    open_shm(&a);
    uint32_t n = bad[i].n;
    memcpy(buf, &n, 4);
    memcpy(buf + 4, &bad[i].wait, 4);
    memcpy(buf + 8, k, 16 * (size_t)(n ? n : 1));
    cc_msg_t r;
    int rc = cc_call(&a, KVS_OP_WATCH, buf, 8 + 16 * (size_t)n, &r);
    cr_assert_eq(rc, -EBADMSG, "case %zu: %d", i, rc);
    cc_msg_free(&r);
    cc_close(&a);
  }
  cr_assert_eq(ts_local_count(S.store, k, 1), 1, "a refused WATCH changed the store");
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_watches), 0);
}

Test(ops, peers_watch_waits_at_one_peer_in_one_call, T_TIMEOUT) {
  start(4, NULL);
  kvs_key_t k[2] = {tk(44, 0), tk(44, 1)};
  kvs_layout_t l = blob(64);
  cr_assert_eq(ts_local_put(S.store, &k[0], 1, &l), 1);
  kvs_peers_t *p = peers_for(KVS_STRATEGY_AUTO);
  cr_assert_eq(kvs_peers_watch(p, S.instance_id, k, 2, 0), (int)KVS_PROTO_WATCH_HELD);
  change_t gone = {k[0], false, 50};
  pthread_t t;
  pthread_create(&t, NULL, change_later, &gone);
  cr_assert_eq(kvs_peers_watch(p, S.instance_id, k, 2, 60000), (int)KVS_PROTO_WATCH_GONE);
  pthread_join(t, NULL);
  cr_assert_eq(kvs_peers_watch(p, 12345, k, 2, 10), -ENOENT, "no such peer");
  cr_assert_eq(kvs_peers_watch(p, S.instance_id, k, 0, 10), -EINVAL);
  cr_assert_eq(kvs_peers_watch(p, S.instance_id, k, KVS_PROTO_MAX_WATCH_KEYS + 1, 10), -EINVAL);
  kvs_peers_destroy(p);
}
