/* Coordinator bad input and security (design §14, docs/protocol.md §2, §8): every malformed
 * frame gets an ERROR with the right code (or the connection just closes for a frame that
 * cannot be read), the connection is closed when the protocol says so, the counters move, its
 * leases end, and the coordinator keeps serving another connection. A connection from another
 * uid is refused; the socket directory is 0700 and the socket 0600. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coord_client.h"
#include "internal.h"

#define T_TIMEOUT .timeout = 60

static ts_server_t S;
static cc_t W; /* a well-behaved witness connection, open before the bad one */

static void down(void) {
  if (W.fd > 0) cc_close(&W);
  ts_server_reset(&S);
  memset(&W, 0, sizeof W);
}

static void start_with(void (*tweak)(ts_server_t *)) {
  cr_assert_eq(ts_server_init(&S, 8u << 20), 0);
  if (tweak) tweak(&S);
  cr_assert_eq(ts_server_start(&S), 0);
  cr_assert_eq(cc_open(&W, S.path, KVS_PROTO_STRATEGY_AUTO), 0);
}
static void start(void) { start_with(NULL); }

typedef struct counters {
  uint64_t bad, errors, requests;
} counters_t;
static counters_t counters(void) {
  return (counters_t){ts_stat(&S, KVS_STAT_coord_bad_frames), ts_stat(&S, KVS_STAT_coord_errors),
                      ts_stat(&S, KVS_STAT_coord_requests)};
}

/* The table case being run (one_bad_frame), named in expect_refused's failures; "" otherwise. */
static const char *g_case = "";

/* The server answered ERROR code (request id rid) and closed; the witness still PINGs; the
 * counters moved by bad/errors; only the witness is left connected. */
static void expect_refused(cc_t *c, int code, uint64_t rid, const counters_t *before,
                           uint64_t bad, uint64_t errors) {
  cc_msg_t m;
  int rc = cc_recv(c, &m, 3000);
  cr_assert_eq(rc, 0, "no ERROR reply before the close (rc %d)", rc);
  cr_assert_eq(m.h.opcode, KVS_OP_ERROR, "opcode %u", m.h.opcode);
  cr_assert(m.h.flags & KVS_PROTO_F_REPLY);
  char msg[300];
  int got = cc_error_code(&m, msg, sizeof msg);
  cr_assert_eq(got, code, "ERROR %d (%s), wanted %d %s", got, msg, code, g_case);
  cr_assert_eq(m.h.request_id, rid, "ERROR request id %llu, wanted %llu %s",
               (unsigned long long)m.h.request_id, (unsigned long long)rid, g_case);
  cc_msg_free(&m);
  cr_assert(cc_wait_closed(c, 3000), "connection not closed after a protocol error");
  cc_close(c);
  cr_assert_eq(cc_ping(&W, 77, "still here", 10), 0, "coordinator stopped serving others");
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, S.coord, 1, 3000), 0, "leases or conn left");
  counters_t now = counters();
  cr_assert_eq(now.bad, before->bad + bad, "coord_bad_frames %llu -> %llu",
               (unsigned long long)before->bad, (unsigned long long)now.bad);
  cr_assert_eq(now.errors, before->errors + errors, "coord_errors %llu -> %llu",
               (unsigned long long)before->errors, (unsigned long long)now.errors);
}

static kvs_proto_header_t hdr(uint16_t op, uint64_t rid, uint32_t len) {
  return (kvs_proto_header_t){KVS_PROTO_MAGIC, KVS_PROTO_VERSION, op, 0, rid, len};
}

static void open_bad(cc_t *c, bool hello) {
  if (hello) cr_assert_eq(cc_open(c, S.path, KVS_PROTO_STRATEGY_AUTO), 0);
  else cr_assert_eq(cc_connect(c, S.path), 0);
}

/* Every case opens the same way: the server (start), a connection c (after HELLO when hello)
 * and the counters before the bad input. */
static counters_t open_case(cc_t *c, bool hello) {
  start();
  open_bad(c, hello);
  return counters();
}

TestSuite(bad, .fini = down);

Test(bad, hello_without_a_common_version, T_TIMEOUT) {
  cc_t c;
  counters_t b = open_case(&c, false);
  kvs_proto_hello_t me;
  memset(&me, 0, sizeof me);
  me.version_min = 2; /* a future client that no longer speaks version 1 */
  me.version_max = 3;
  me.role = KVS_PROTO_ROLE_TOOL;
  me.caps = KVS_PROTO_CAP_INLINE;
  me.max_frame = KVS_PROTO_MIN_MAX_FRAME;
  cr_assert_eq(cc_send_hello(&c, &me, 3), 0);
  expect_refused(&c, -EPROTONOSUPPORT, 3, &b, 1, 1);
}

/* One bad frame each: the header hdr(op, rid, len) changed as the row says, then len zero
 * bytes (payload) or nothing (a header alone: the server must not wait for the rest). The
 * server answers ERROR code with request id want_rid and closes; the witness is unaffected
 * (expect_refused). */
typedef struct frame_case {
  const char *name;
  bool hello;                /* sent after HELLO */
  uint16_t op;
  uint64_t rid;
  uint32_t len;              /* KVS_PROTO_MAX_FRAME_PLUS1: the server's max_frame + 1 */
  bool payload;              /* len (<= 16) zero bytes follow */
  uint32_t magic;            /* 0: KVS_PROTO_MAGIC */
  int version;               /* -1: KVS_PROTO_VERSION */
  uint16_t flags;
  int code;
  uint64_t want_rid;
} frame_case_t;
#define KVS_PROTO_MAX_FRAME_PLUS1 UINT32_MAX

ParameterizedTestParameters(bad, one_bad_frame) {
  static frame_case_t cases[] = {
      /* magic wrong: the id cannot be trusted */
      {"bad_magic", true, KVS_OP_PING, 5, 0, false, 0xdeadbeef, -1, 0, -EBADMSG, 0},
      {"wrong_version", true, KVS_OP_PING, 6, 0, false, 0, 2, 0, -EPROTONOSUPPORT, 6},
      {"wrong_version_in_hello", false, KVS_OP_HELLO, 1, 0, false, 0, 0, 0, -EPROTONOSUPPORT, 1},
      {"unknown_opcode", true, 12, 9, 0, false, 0, -1, 0, -EOPNOTSUPP, 9},
      /* ERROR without REPLY */
      {"error_opcode_as_request", true, KVS_OP_ERROR, 10, 0, false, 0, -1, 0, -EBADMSG, 10},
      {"reserved_flag_bits", true, KVS_OP_PING, 12, 0, false, 0, -1, 0x100, -EBADMSG, 12},
      {"oversized_length_after_hello", true, KVS_OP_PING, 13, KVS_PROTO_MAX_FRAME_PLUS1, false, 0,
       -1, 0, -EMSGSIZE, 13},
      {"oversized_length_before_hello", false, KVS_OP_HELLO, 14, KVS_PROTO_MIN_MAX_FRAME + 1,
       false, 0, -1, 0, -EMSGSIZE, 14},
      {"request_before_hello", false, KVS_OP_PING, 15, 12, true, 0, -1, 0, -EPROTO, 15},
      /* docs/protocol.md §8: the magic was right */
      {"reply_flag_from_client", true, KVS_OP_PING, 16, 12, true, 0, -1, KVS_PROTO_F_REPLY,
       -EPROTO, 16},
      {"request_id_zero", true, KVS_OP_PING, 0, 12, true, 0, -1, 0, -EBADMSG, 0},
      /* LOOKUP with n_keys 0 */
      {"malformed_payload", true, KVS_OP_LOOKUP, 17, 8, true, 0, -1, 0, -EBADMSG, 17},
  };
  return cr_make_param_array(frame_case_t, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(frame_case_t *f, bad, one_bad_frame, T_TIMEOUT) {
  g_case = f->name;
  cc_t c;
  counters_t b = open_case(&c, f->hello);
  uint32_t len = f->len == KVS_PROTO_MAX_FRAME_PLUS1 ? (uint32_t)S.opts.max_frame + 1 : f->len;
  kvs_proto_header_t h = hdr(f->op, f->rid, len);
  if (f->magic) h.magic = f->magic;
  if (f->version >= 0) h.version = (uint16_t)f->version;
  h.flags = f->flags;
  static const uint8_t zeros[16];
  cr_assert(!f->payload || len <= sizeof zeros, "%s: payload too long", f->name);
  cr_assert_eq(cc_send_frame(&c, &h, f->payload ? zeros : NULL), 0, "%s", f->name);
  expect_refused(&c, f->code, f->want_rid, &b, 1, 1);
}

Test(bad, second_hello, T_TIMEOUT) {
  cc_t c;
  counters_t b = open_case(&c, true);
  cr_assert_eq(cc_hello(&c, KVS_PROTO_STRATEGY_AUTO, KVS_PROTO_CAP_INLINE, 0), -EPROTO);
  cr_assert(cc_wait_closed(&c, 3000));
  cc_close(&c);
  cr_assert_eq(cc_ping(&W, 1, NULL, 0), 0);
  counters_t a = counters();
  cr_assert_eq(a.bad, b.bad + 1);
  cr_assert_eq(a.errors, b.errors + 1);
}

Test(bad, split_message_mismatch, T_TIMEOUT) {
  cc_t c;
  counters_t b = open_case(&c, true);
  uint8_t p[16] = {0};
  kvs_proto_header_t h = hdr(KVS_OP_PING, 18, 8);
  h.flags = KVS_PROTO_F_MORE;
  cr_assert_eq(cc_send_frame(&c, &h, p), 0);
  h = hdr(KVS_OP_LOOKUP, 18, 8); /* continuation with another opcode */
  int src = cc_send_frame(&c, &h, p);
  cr_assert_eq(src, 0, "second frame: %d", src);
  expect_refused(&c, -EPROTO, 18, &b, 1, 1);
}

/* A truncated frame: half a header (or half a payload), then the peer closes. There is nobody
 * to answer; the connection's leases end and the frame is counted as malformed. */
static void truncated(bool in_payload) {
  start();
  cc_t c;
  open_bad(&c, true);
  kvs_key_t k[2] = {tk(30, 0), tk(30, 1)};
  kvs_layout_t l = kvs_layout_blob(4096);
  cc_pstore_t ps;
  cr_assert_eq(cc_prepare_store(&c, KVS_PROTO_STRATEGY_SHM, 0, &l, k, 2, &ps), 0);
  cr_assert_gt(ts_info(S.store).reserved_bytes, 0);
  counters_t b = counters();
  uint8_t hb[KVS_PROTO_HEADER_SIZE], pay[64] = {0};
  kvs_proto_header_t h = hdr(KVS_OP_PING, 20, 1000);
  kvs_proto_header_encode(&h, hb);
  if (in_payload) {
    cr_assert_eq(cc_send_raw(&c, hb, sizeof hb), 0);
    cr_assert_eq(cc_send_raw(&c, pay, sizeof pay), 0);
  } else {
    cr_assert_eq(cc_send_raw(&c, hb, 12), 0);
  }
  cc_close(&c);
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, S.coord, 1, 3000), 0, "reservation left");
  cr_assert_eq(ts_local_count(S.store, k, 2), 0);
  cr_assert_eq(cc_ping(&W, 2, NULL, 0), 0);
  counters_t a = counters();
  cr_assert_eq(a.bad, b.bad + 1, "a truncated frame is not counted");
  cr_assert_eq(a.errors, b.errors);
}

Test(bad, truncated_header, T_TIMEOUT) { truncated(false); }
Test(bad, truncated_payload, T_TIMEOUT) { truncated(true); }

/* SHM COMMIT_STORE naming slots outside the pool / outside the transfer: ERROR EFAULT, the
 * connection is closed (design §14), the reservation aborted and nothing published. */
static void bad_slot(int how) {
  start();
  enum { N = 2 };
  kvs_key_t k[N] = {tk(31, 0), tk(31, 1)}, other = tk(31, 9);
  kvs_layout_t l = kvs_layout_blob(8192);
  cr_assert_eq(ts_local_put(S.store, &other, 1, &l), 1);
  kvs_store_info_t before = ts_info(S.store);
  cc_t c;
  open_bad(&c, true);
  cc_pstore_t ps;
  cr_assert_eq(cc_prepare_store(&c, KVS_PROTO_STRATEGY_SHM, 0, &l, k, N, &ps), 0);
  cr_assert_eq(ps.n_slots, N);
  uint8_t *base = kvs_pool_base(c.pool);
  for (uint32_t i = 0; i < N; i++) pat_fill(base + ps.slots[i].offset, 8192, k[i]);
  kvs_proto_slot_t slots[N];
  memcpy(slots, ps.slots, sizeof slots);
  uint64_t seg = kvs_pool_segment_size(S.pool);
  if (how == 0 || how == 5) slots[1].offset = seg + 4096; /* beyond the pool */
  else if (how == 1) slots[1].offset = seg - 4096;         /* straddles the pool's end */
  else if (how == 2) slots[1].offset = 0;                  /* the pool header */
  else slots[1].offset = slots[0].offset;                  /* another slot of the transfer */
  if (how == 4) {
    /* another object's extent, inside the pool but outside this transfer */
    kvs_xfer_t x;
    kvs_object_view_t v;
    cr_assert_eq(kvs_store_lookup(S.store, KVS_OWNER_LOCAL, &other, 1, true, &x), 1);
    cr_assert_eq(kvs_store_read_pinned(S.store, KVS_OWNER_LOCAL, x, &v, 1), 1);
    cr_assert_eq(kvs_store_release(S.store, KVS_OWNER_LOCAL, x), 0);
    slots[1].offset = v.extent.offset;
  }
  counters_t b = counters();
  uint64_t rid = c.next_rid + 1;
  kvs_proto_commit_store_t m;
  memset(&m, 0, sizeof m);
  m.xfer = how == 5 ? ps.xfer ^ 0x5555 : ps.xfer; /* 5: a transfer that does not exist */
  m.n_slots = N;
  m.slots = slots;
  uint8_t buf[256];
  size_t len = 0;
  cr_assert_eq(kvs_proto_commit_store_encode(&m, buf, sizeof buf, &len), 0);
  cr_assert_eq(cc_send(&c, KVS_OP_COMMIT_STORE, buf, len, NULL), 0);
  expect_refused(&c, -EFAULT, rid, &b, 1, 1);
  kvs_store_info_t after = ts_info(S.store);
  cr_assert_eq(after.reserved_bytes, before.reserved_bytes, "reservation not aborted");
  cr_assert_eq(after.objects_ready, before.objects_ready, "a bad commit published objects");
  cr_assert_eq(after.used_bytes, before.used_bytes);
  cr_assert_eq(ts_local_count(S.store, k, N), 0);
  cr_assert_eq(ts_local_verify(S.store, &other, 1), 1, "the other object was changed");
}

Test(bad, commit_slot_beyond_pool, T_TIMEOUT) { bad_slot(0); }
Test(bad, commit_slot_straddling_pool_end, T_TIMEOUT) { bad_slot(1); }
Test(bad, commit_slot_over_pool_header, T_TIMEOUT) { bad_slot(2); }
Test(bad, commit_slot_duplicated_in_transfer, T_TIMEOUT) { bad_slot(3); }
Test(bad, commit_slot_of_another_object, T_TIMEOUT) { bad_slot(4); }
Test(bad, commit_unknown_transfer_slot_beyond_pool, T_TIMEOUT) { bad_slot(5); }

Test(bad, commit_naming_only_some_slots, T_TIMEOUT) {
  start();
  kvs_key_t k[2] = {tk(32, 0), tk(32, 1)};
  kvs_layout_t l = kvs_layout_blob(4096);
  cc_t c;
  open_bad(&c, true);
  cc_pstore_t ps;
  cr_assert_eq(cc_prepare_store(&c, KVS_PROTO_STRATEGY_SHM, 0, &l, k, 2, &ps), 0);
  counters_t b = counters();
  /* A well-formed request that cannot be served: ERROR, the connection stays, the transfer
   * is aborted (never half published). */
  cr_assert_eq(cc_commit_shm(&c, ps.xfer, ps.slots, 1, NULL), -EINVAL);
  cr_assert_eq(cc_ping(&c, 3, NULL, 0), 0);
  cr_assert_eq(ts_info(S.store).reserved_bytes, 0);
  cr_assert_eq(ts_local_count(S.store, k, 2), 0);
  counters_t a = counters();
  cr_assert_eq(a.bad, b.bad);
  cr_assert_eq(a.errors, b.errors + 1);
  cc_close(&c);
}

Test(bad, inline_entry_length_disagrees_with_layout, T_TIMEOUT) {
  start();
  cc_t c;
  open_bad(&c, true);
  kvs_key_t k = tk(33, 0);
  kvs_layout_t l = kvs_layout_blob(4096);
  kvs_proto_entry_t e = {k, 100};
  kvs_proto_commit_store_t m;
  memset(&m, 0, sizeof m);
  m.is_inline = 1;
  m.layout = l;
  m.n_entries = 1;
  m.entries = &e;
  uint8_t data[100] = {0};
  m.data = data;
  m.data_len = sizeof data;
  uint8_t buf[512];
  size_t len = 0;
  cr_assert_eq(kvs_proto_commit_store_encode(&m, buf, sizeof buf, &len), 0);
  cc_msg_t r;
  cr_assert_eq(cc_call(&c, KVS_OP_COMMIT_STORE, buf, len, &r), -EINVAL);
  cc_msg_free(&r);
  cr_assert_eq(cc_ping(&c, 4, NULL, 0), 0);
  kvs_store_info_t in = ts_info(S.store);
  cr_assert_eq(in.reserved_bytes, 0);
  cr_assert_eq(in.objects_ready, 0);
  cc_close(&c);
}

Test(bad, garbage_stream, T_TIMEOUT) {
  start();
  for (int round = 0; round < 20; round++) {
    cc_t c;
    open_bad(&c, round % 2 == 0);
    uint8_t junk[300];
    pat_fill(junk, sizeof junk, tk(34, (uint64_t)round));
    cc_send_raw(&c, junk, sizeof junk); /* the server may close before all of it is sent */
    cr_assert(cc_wait_closed(&c, 3000), "garbage did not close the connection (round %d)", round);
    cc_close(&c);
  }
  cr_assert_eq(cc_ping(&W, 5, NULL, 0), 0);
  cr_assert_geq(ts_stat(&S, KVS_STAT_coord_bad_frames), 20);
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, S.coord, 1, 3000), 0);
}

/* ---- security ---------------------------------------------------------------------------- */

TestSuite(security, .fini = down);

Test(security, socket_dir_0700_and_socket_0600, T_TIMEOUT) {
  start();
  struct stat st;
  cr_assert_eq(stat(S.opts.run_dir, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0700, "run dir mode %o", st.st_mode & 0777);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", S.opts.run_dir, S.opts.group);
  cr_assert_eq(stat(dir, &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 0777, 0700, "group dir mode %o", st.st_mode & 0777);
  cr_assert_eq(st.st_uid, geteuid());
  cr_assert_eq(lstat(S.path, &st), 0);
  cr_assert(S_ISSOCK(st.st_mode));
  cr_assert_eq(st.st_mode & 0777, 0600, "socket mode %o", st.st_mode & 0777);
}

Test(security, loose_run_dir_is_tightened, T_TIMEOUT) {
  cr_assert_eq(ts_server_init(&S, 4u << 20), 0);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", S.opts.run_dir, S.opts.group);
  cr_assert_eq(mkdir(S.opts.run_dir, 0777), 0);
  cr_assert_eq(mkdir(dir, 0777), 0);
  cr_assert_eq(chmod(dir, 0777), 0);
  cr_assert_eq(ts_server_start(&S), 0);
  struct stat st;
  cr_assert_eq(stat(dir, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0700, "group dir left at %o", st.st_mode & 0777);
}

Test(security, run_dir_of_another_user_is_refused, T_TIMEOUT) {
  if (geteuid() != 0) {
    cr_log_warn("not root: cannot chown a directory to another uid; test skipped");
    return;
  }
  cr_assert_eq(ts_server_init(&S, 4u << 20), 0);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", S.opts.run_dir, S.opts.group);
  cr_assert_eq(mkdir(S.opts.run_dir, 0700), 0);
  cr_assert_eq(mkdir(dir, 0700), 0);
  cr_assert_eq(chown(dir, 65534, 65534), 0);
  cr_assert_eq(ts_server_start(&S), -EPERM);
  struct stat st;
  char sock[1024];
  snprintf(sock, sizeof sock, "%s/%016llx.sock", dir, (unsigned long long)S.instance_id);
  cr_assert_neq(stat(sock, &st), 0, "a socket was created in a foreign directory");
  ts_server_stop(&S, true); /* the pool and store were created */
  memset(&S, 0, sizeof S);
}

typedef struct other_uid_arg {
  const char *path;
  int expect; /* 0: refused (ERROR EACCES or closed); 1: HELLO must succeed; 2: connect EACCES */
} other_uid_arg_t;

/* Runs in a child: drop to uid/gid 65534 and connect. Exit 0 when the expectation held. */
static int other_uid_child(void *p) {
  other_uid_arg_t *a = p;
  if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0) return 10;
  if (getuid() != 65534) return 11;
  cc_t c;
  int rc = cc_connect(&c, a->path);
  if (a->expect == 2) return rc == -EACCES ? 0 : 12;
  if (rc < 0) return 13;
  if (a->expect == 1) return cc_hello(&c, KVS_PROTO_STRATEGY_AUTO, KVS_PROTO_CAP_INLINE, 0) == 0 &&
                                     cc_ping(&c, 1, NULL, 0) == 0 ? 0 : 14;
  /* Refused: the first thing we hear is ERROR EACCES (id 0), then EOF; or just EOF. A HELLO
   * sent meanwhile must never be answered with HELLO. */
  cc_msg_t m;
  rc = cc_recv(&c, &m, 3000);
  if (rc == 0) {
    int code = cc_error_code(&m, NULL, 0);
    if (m.h.opcode != KVS_OP_ERROR || code != -EACCES || m.h.request_id != 0) return 15;
    cc_msg_free(&m);
  } else if (rc != -ECONNRESET && rc != -EPIPE) {
    return 16;
  }
  if (!cc_wait_closed(&c, 3000)) return 17;
  return 0;
}

static void open_path_to_everyone(void) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", S.opts.run_dir, S.opts.group);
  cr_assert_eq(chmod(S.root, 0711), 0);
  cr_assert_eq(chmod(S.opts.run_dir, 0711), 0);
  cr_assert_eq(chmod(dir, 0711), 0);
  cr_assert_eq(chmod(S.path, 0666), 0);
}

Test(security, other_uid_is_refused, T_TIMEOUT) {
  if (geteuid() != 0) {
    cr_log_warn("not root: cannot run a client under another uid; test skipped");
    return;
  }
  start();
  /* With the modes kvshim sets, another uid cannot even reach the socket. */
  other_uid_arg_t a = {S.path, 2};
  cr_assert_eq(ts_wait_child(ts_fork(other_uid_child, &a), 10000), 0,
               "uid 65534 could connect through the 0700 directory");
  /* Defence in depth: open the path to everyone; the credential check still refuses. */
  open_path_to_everyone();
  uint64_t refused0 = ts_stat(&S, KVS_STAT_coord_refused);
  a.expect = 0;
  int rc = ts_wait_child(ts_fork(other_uid_child, &a), 10000);
  cr_assert_eq(rc, 0, "other-uid child: %d", rc);
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_refused), refused0 + 1);
  cr_assert_eq(ts_stat(&S, KVS_STAT_store_owner_releases), 0, "a refused peer became an owner");
  cr_assert_eq(cc_ping(&W, 6, NULL, 0), 0);
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, S.coord, 1, 3000), 0);
}

static void allow_nobody(ts_server_t *s) {
  snprintf(s->opts.allow_uids, sizeof s->opts.allow_uids, "65534");
}

Test(security, allowed_uid_is_served, T_TIMEOUT) {
  if (geteuid() != 0) {
    cr_log_warn("not root: cannot run a client under another uid; test skipped");
    return;
  }
  start_with(allow_nobody);
  open_path_to_everyone();
  other_uid_arg_t a = {S.path, 1};
  cr_assert_eq(ts_wait_child(ts_fork(other_uid_child, &a), 10000), 0);
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_refused), 0);
}
