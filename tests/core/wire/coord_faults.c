/* Faults (design §14): a peer process SIGKILLed at each protocol step leaves nothing behind
 * (the server's reservations, pins and transfers return to their baseline within a bounded
 * wait) and nothing half-written ever becomes readable; a live but stuck peer loses its lease;
 * a server stopped in the middle of a call makes the client report a miss within
 * KVSHIM_RPC_TIMEOUT_MS (+ slack), a killed server makes calls fail fast, and its socket file,
 * like any stale one, is removed by discovery. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord_client.h"
#include "internal.h"
#include "peer.h"
#include "sock.h"
#include "../../lib/threads.h"

#define T_TIMEOUT .timeout = 60
#define RECOVER_MS 2000 /* bound on the server noticing a dead peer and ending its leases */

static ts_server_t S;
static pid_t KIDS[4]; /* children to SIGKILL at teardown (a failed test leaves them paused) */

static pid_t track(pid_t pid) {
  for (size_t i = 0; i < sizeof KIDS / sizeof KIDS[0]; i++)
    if (KIDS[i] == 0) {
      KIDS[i] = pid;
      break;
    }
  return pid;
}

static void down(void) {
  for (size_t i = 0; i < sizeof KIDS / sizeof KIDS[0]; i++)
    if (KIDS[i] > 0 && kill(KIDS[i], SIGKILL) == 0) waitpid(KIDS[i], NULL, 0);
  memset(KIDS, 0, sizeof KIDS);
  if (S.root[0]) {
    if (S.coord) ts_server_stop(&S, true);
    else ts_rmtree(S.root);
  }
  memset(&S, 0, sizeof S);
}

static void start_with(uint32_t lease_ms) {
  cr_assert_eq(ts_server_init(&S, 16u << 20), 0);
  if (lease_ms) S.opts.lease_ms = lease_ms;
  cr_assert_eq(ts_server_start(&S), 0);
}

/* ---- a peer killed at a protocol step ---------------------------------------------------- */

enum step {
  AFTER_PREPARE_STORE,    /* SHM slots reserved, nothing written */
  AFTER_HALF_SLOTS,       /* half of the slots written (the middle one half-way) */
  AFTER_ALL_SLOTS,        /* every slot written, COMMIT never sent */
  AFTER_PREPARE_RETRIEVE, /* objects pinned, never committed */
  IN_INLINE_COMMIT,       /* half of an inline COMMIT_STORE message sent */
  STUCK_AFTER_PREPARE,    /* alive but stuck after PREPARE_STORE; later tries to commit */
};

#define NK 6
#define OBJ (3 * 4096 + 10)

typedef struct child_arg {
  const char *path;
  enum step step;
  kvs_key_t keys[NK];
  int to_parent, from_parent; /* pipe ends */
} child_arg_t;

static void tell(int fd, char ch) {
  if (write(fd, &ch, 1) != 1) _exit(40);
}

static int peer_child(void *p) {
  child_arg_t *a = p;
  cc_t c;
  if (cc_open(&c, a->path, KVS_PROTO_STRATEGY_AUTO) < 0 || !c.pool) return 20;
  kvs_layout_t l = kvs_layout_blob(OBJ);
  cc_pstore_t ps;
  switch (a->step) {
    case AFTER_PREPARE_STORE:
    case AFTER_HALF_SLOTS:
    case AFTER_ALL_SLOTS:
    case STUCK_AFTER_PREPARE: {
      if (cc_prepare_store(&c, KVS_PROTO_STRATEGY_SHM, 0, &l, a->keys, NK, &ps) < 0) return 21;
      if (ps.n_slots != NK) return 22;
      uint8_t *base = kvs_pool_base(c.pool);
      uint32_t upto = a->step == AFTER_HALF_SLOTS ? NK / 2 : a->step == AFTER_ALL_SLOTS ? NK : 0;
      for (uint32_t i = 0; i < upto; i++) pat_fill(base + ps.slots[i].offset, OBJ, a->keys[i]);
      if (a->step == AFTER_HALF_SLOTS) pat_fill(base + ps.slots[upto].offset, OBJ / 2, a->keys[upto]);
      break;
    }
    case AFTER_PREPARE_RETRIEVE: {
      cc_pretr_t r;
      if (cc_prepare_retrieve(&c, KVS_PROTO_STRATEGY_SHM, a->keys, NK, &r) < 0) return 23;
      if (r.n_found != NK) return 24;
      break;
    }
    case IN_INLINE_COMMIT: {
      /* Build a full inline commit, send its header and half of its payload. */
      kvs_proto_entry_t e[NK];
      for (int i = 0; i < NK; i++) e[i] = (kvs_proto_entry_t){a->keys[i], OBJ};
      kvs_proto_commit_store_t m;
      memset(&m, 0, sizeof m);
      m.is_inline = 1;
      m.layout = l;
      m.n_entries = NK;
      m.entries = e;
      m.data_len = (uint64_t)OBJ * NK;
      size_t len = 0;
      if (kvs_proto_commit_store_encode(&m, NULL, 0, &len) < 0) return 25;
      uint8_t *buf = malloc(KVS_PROTO_HEADER_SIZE + len);
      if (!buf || kvs_proto_commit_store_encode(&m, buf + KVS_PROTO_HEADER_SIZE, len, &len) < 0)
        return 26;
      uint8_t *d = buf + KVS_PROTO_HEADER_SIZE + len - m.data_len;
      for (int i = 0; i < NK; i++) pat_fill(d + (size_t)i * OBJ, OBJ, a->keys[i]);
      kvs_proto_header_t h = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION, KVS_OP_COMMIT_STORE, 0, 99,
                              (uint32_t)len};
      kvs_proto_header_encode(&h, buf);
      if (cc_send_raw(&c, buf, KVS_PROTO_HEADER_SIZE + len / 2) < 0) return 27;
      break;
    }
  }
  tell(a->to_parent, 'R');
  if (a->step == STUCK_AFTER_PREPARE) {
    char ch;
    if (read(a->from_parent, &ch, 1) != 1) return 28;
    /* The lease is gone: a commit now must be refused (-ENOENT), nothing published. */
    int rc = cc_commit_shm(&c, ps.xfer, ps.slots, ps.n_slots, NULL);
    return rc == -ENOENT ? 0 : 29;
  }
  for (;;) pause(); /* wait for SIGKILL */
}

static void wait_ready(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  cr_assert_eq(poll(&p, 1, 10000), 1, "child never reached its step");
  char ch = 0;
  cr_assert_eq(read(fd, &ch, 1), 1, "child died before its step");
  cr_assert_eq(ch, 'R');
}

static void killed_at(enum step step) {
  start_with(0);
  child_arg_t a;
  memset(&a, 0, sizeof a);
  a.path = S.path;
  a.step = step;
  for (int i = 0; i < NK; i++) a.keys[i] = tk(40 + step, (uint64_t)i);
  kvs_layout_t l = kvs_layout_blob(OBJ);
  if (step == AFTER_PREPARE_RETRIEVE) cr_assert_eq(ts_local_put(S.store, a.keys, NK, &l), NK);
  kvs_store_info_t base = ts_info(S.store);
  uint64_t releases0 = ts_stat(&S, KVS_STAT_store_owner_releases);
  int up[2];
  cr_assert_eq(pipe(up), 0);
  a.to_parent = up[1];
  pid_t pid = track(ts_fork(peer_child, &a));
  close(up[1]);
  wait_ready(up[0]);

  /* Mid-step: the server holds what the peer took, and none of it is visible. */
  kvs_store_info_t mid = ts_info(S.store);
  if (step == AFTER_PREPARE_RETRIEVE) {
    cr_assert_eq(mid.pins, base.pins + NK, "pins %llu", (unsigned long long)mid.pins);
  } else if (step == IN_INLINE_COMMIT) {
    /* wait until the server has read what was sent (nothing is reserved for inline yet) */
    usleep(50000);
    cr_assert_eq(ts_info(S.store).reserved_bytes, base.reserved_bytes);
  } else {
    cr_assert_geq(mid.reserved_bytes, base.reserved_bytes + NK * (uint64_t)OBJ);
    cr_assert_eq(mid.objects_writing, base.objects_writing + NK);
  }
  if (step != AFTER_PREPARE_RETRIEVE) cr_assert_eq(ts_local_count(S.store, a.keys, NK), 0);

  cr_assert_eq(kill(pid, SIGKILL), 0);
  cr_assert_eq(ts_wait_child(pid, 5000), 128 + SIGKILL);
  int ms = ts_wait_baseline(S.store, &base, S.coord, 0, RECOVER_MS);
  cr_assert_geq(ms, 0, "server still holds the dead peer's leases after %d ms", RECOVER_MS);
  kvs_store_info_t after = ts_info(S.store);
  cr_assert_eq(after.reserved_bytes, base.reserved_bytes);
  cr_assert_eq(after.pins, base.pins);
  cr_assert_eq(after.used_bytes, base.used_bytes);
  cr_assert_eq(after.objects_ready, base.objects_ready);
  cr_assert_eq(after.used_bytes + after.reserved_bytes + after.free_bytes, after.arena_bytes);
  cr_assert(kvs__store_is_valid(S.store));
  if (step == AFTER_PREPARE_RETRIEVE) {
    /* The objects survive, unpinned (so evictable again) and intact. */
    cr_assert_eq(ts_local_verify(S.store, a.keys, NK), NK);
  } else {
    cr_assert_eq(ts_local_count(S.store, a.keys, NK), 0, "half-written objects became visible");
    /* ...and the keys are free again: a new writer gets RESERVED, not BUSY. */
    cr_assert_eq(ts_local_put(S.store, a.keys, NK, &l), NK);
    cr_assert_eq(ts_local_verify(S.store, a.keys, NK), NK);
  }
  cr_assert_eq(ts_stat(&S, KVS_STAT_store_owner_releases), releases0 + 1);
  cr_log_info("step %d: leases ended %d ms after the peer died", (int)step, ms);
  close(up[0]);
}

TestSuite(killed, .fini = down);

Test(killed, after_prepare_store, T_TIMEOUT) { killed_at(AFTER_PREPARE_STORE); }
Test(killed, after_half_of_the_slots, T_TIMEOUT) { killed_at(AFTER_HALF_SLOTS); }
Test(killed, after_all_slots_before_commit, T_TIMEOUT) { killed_at(AFTER_ALL_SLOTS); }
Test(killed, after_prepare_retrieve, T_TIMEOUT) { killed_at(AFTER_PREPARE_RETRIEVE); }
Test(killed, in_the_middle_of_an_inline_commit, T_TIMEOUT) { killed_at(IN_INLINE_COMMIT); }

Test(killed, stuck_peer_loses_its_lease, T_TIMEOUT) {
  start_with(300); /* KVSHIM_LEASE_MS backstop */
  child_arg_t a;
  memset(&a, 0, sizeof a);
  a.path = S.path;
  a.step = STUCK_AFTER_PREPARE;
  for (int i = 0; i < NK; i++) a.keys[i] = tk(49, (uint64_t)i);
  kvs_store_info_t base = ts_info(S.store);
  int up[2], dn[2];
  cr_assert_eq(pipe(up), 0);
  cr_assert_eq(pipe(dn), 0);
  a.to_parent = up[1];
  a.from_parent = dn[0];
  pid_t pid = track(ts_fork(peer_child, &a));
  wait_ready(up[0]);
  cr_assert_gt(ts_info(S.store).reserved_bytes, base.reserved_bytes);
  /* The peer is alive and connected; only the lease deadline (+ one sweep interval) ends it. */
  int ms = ts_wait_baseline(S.store, &base, NULL, 0, 300 + 500 + RECOVER_MS);
  cr_assert_geq(ms, 0, "an expired lease was not reclaimed");
  cr_assert_eq(kvs_coord_connections(S.coord), 1, "the stuck peer was disconnected");
  cr_assert_geq(ts_stat(&S, KVS_STAT_store_lease_expired), 1);
  tell(dn[1], 'G');
  cr_assert_eq(ts_wait_child(pid, 10000), 0, "late commit was not refused with ENOENT");
  cr_assert_eq(ts_local_count(S.store, a.keys, NK), 0);
  cr_assert_eq(ts_info(S.store).reserved_bytes, base.reserved_bytes);
}

/* ---- the server stopped / killed --------------------------------------------------------- */

static int server_child(void *p) {
  int fd = *(int *)p;
  if (ts_server_start(&S) < 0) return 30;
  tell(fd, 'R');
  for (;;) pause();
}

typedef struct sink_ctx {
  const kvs_key_t *keys;
  int bad;
} sink_ctx_t;
static int sink(void *ctx, size_t i, const kvs_layout_t *l, const void *b, uint64_t len) {
  sink_ctx_t *s = ctx;
  if (len != OBJ || kvs_layout_nbytes(l) != len || pat_check(b, len, s->keys[i])) s->bad++;
  return 0;
}

static pid_t server_in_child(char *sock, size_t cap) {
  cr_assert_eq(ts_server_init(&S, 16u << 20), 0);
  cr_assert_eq(kvs_coord_socket_name(S.opts.run_dir, S.opts.group, S.instance_id, sock, cap), 0);
  int up[2];
  cr_assert_eq(pipe(up), 0);
  pid_t pid = track(ts_fork(server_child, &up[1]));
  close(up[1]);
  wait_ready(up[0]);
  close(up[0]);
  return pid;
}

/* SIGSTOP is asynchronous: wait until every thread of the server has stopped. */
static void stop_server(pid_t srv) {
  cr_assert_eq(kill(srv, SIGSTOP), 0);
  int st = 0;
  cr_assert_eq(waitpid(srv, &st, WUNTRACED), srv);
  cr_assert(WIFSTOPPED(st), "server not stopped");
}

static kvs_peers_t *client(uint32_t timeout_ms, kvs_stats_t *st) {
  kvs_options_t o = S.opts;
  o.rpc_timeout_ms = timeout_ms;
  kvs_stats_init(st);
  kvs_peers_config_t pc = {.opts = &o, .role = KVS_PROTO_ROLE_ENGINE, .stats = st};
  kvs_peers_t *p = NULL;
  cr_assert_eq(kvs_peers_create(&pc, &p), 0);
  cr_assert_eq(kvs_peers_discover(p, true), 1);
  return p;
}

static void store_some(kvs_peers_t *p, kvs_key_t *k, int n) {
  kvs_layout_t l = kvs_layout_blob(OBJ);
  void *bufs[NK];
  for (int i = 0; i < n; i++) {
    bufs[i] = malloc(OBJ);
    pat_fill(bufs[i], OBJ, k[i]);
  }
  cr_assert_eq(kvs_peers_store(p, 0, k, (size_t)n, &l, false, (const void *const *)bufs, NULL), n);
  for (int i = 0; i < n; i++) free(bufs[i]);
  sink_ctx_t sc = {k, 0};
  cr_assert_eq(kvs_peers_retrieve(p, 0, k, (size_t)n, sink, &sc), n);
  cr_assert_eq(sc.bad, 0);
}

TestSuite(server, .fini = down);

Test(server, stopped_mid_call_is_a_timely_miss_then_killed_fails_fast, T_TIMEOUT) {
  char sock[256];
  pid_t srv = server_in_child(sock, sizeof sock);
  const uint32_t TMO = 1000;
  kvs_stats_t st;
  kvs_peers_t *p = client(TMO, &st);
  kvs_key_t k[NK];
  for (int i = 0; i < NK; i++) k[i] = tk(50, (uint64_t)i);
  store_some(p, k, NK);

  stop_server(srv);
  uint64_t t0 = ts_now_ms();
  sink_ctx_t sc = {k, 0};
  int rc = kvs_peers_retrieve(p, S.instance_id, k, NK, sink, &sc);
  uint64_t dt = ts_now_ms() - t0;
  cr_assert_leq(rc, 0, "a stopped server delivered %d objects", rc);
  cr_assert_eq(rc, -ETIMEDOUT, "rc %d", rc);
  cr_assert_geq(dt, TMO - 50, "gave up after %llu ms, before the deadline", (unsigned long long)dt);
  cr_assert_leq(dt, TMO + 1000, "took %llu ms for a %u ms deadline", (unsigned long long)dt, TMO);
  cr_assert_geq(kvs_stats_get(&st, KVS_STAT_peer_errors), 1);
  /* A lookup while it is stopped is a miss at once: the peer that just timed out is held off
   * (backoff), so discovery neither re-dials it nor waits for its HELLO again. */
  t0 = ts_now_ms();
  cr_assert_eq(kvs_peers_discover(p, true), 0, "a peer that just timed out is held off");
  cr_assert_eq(kvs_peers_lookup(p, k, NK, NULL), 0);
  dt = ts_now_ms() - t0;
  cr_assert_leq(dt, TMO / 3, "lookup took %llu ms: a stuck peer was waited for again",
                (unsigned long long)dt);

  cr_assert_eq(kill(srv, SIGKILL), 0);
  cr_assert_eq(ts_wait_child(srv, 5000), 128 + SIGKILL);
  struct stat sb;
  cr_assert_eq(stat(sock, &sb), 0, "the killed server's socket file should still be there");
  t0 = ts_now_ms();
  cr_assert_eq(kvs_peers_discover(p, true), 0);
  rc = kvs_peers_retrieve(p, 0, k, NK, sink, &sc);
  dt = ts_now_ms() - t0;
  cr_assert_leq(rc, 0);
  cr_assert_leq(dt, TMO / 3, "calls to a dead server took %llu ms", (unsigned long long)dt);
  cr_assert_neq(stat(sock, &sb), 0, "stale socket not removed by discovery");
  cr_assert_eq(kvs_peers_ping(p, S.instance_id), -ENOENT);
  kvs_peers_destroy(p);
}

/* t->obj: the peers; t->data: the NK keys. */
static int call_thread(tt_thread_t *t) {
  const kvs_key_t *k = t->data;
  sink_ctx_t sc = {k, 0};
  return kvs_peers_retrieve(t->obj, S.instance_id, k, NK, sink, &sc);
}

Test(server, killed_during_a_call_fails_it_at_once, T_TIMEOUT) {
  char sock[256];
  pid_t srv = server_in_child(sock, sizeof sock);
  kvs_stats_t st;
  kvs_peers_t *p = client(5000, &st);
  kvs_key_t k[NK];
  for (int i = 0; i < NK; i++) k[i] = tk(51, (uint64_t)i);
  store_some(p, k, NK);
  stop_server(srv);
  tt_thread_t a;
  cr_assert_eq(tt_start(&a, call_thread, p, k, 0), 0);
  usleep(200000); /* the request is in the stopped server's socket */
  uint64_t t_kill = ts_now_ms();
  cr_assert_eq(kill(srv, SIGKILL), 0);
  tt_join(&a);
  cr_assert_leq(a.rc, 0);
  cr_assert_leq(a.done_ms - t_kill, 1000, "call ended %llu ms after the server died (deadline 5 s)",
                (unsigned long long)(a.done_ms - t_kill));
  cr_assert_eq(ts_wait_child(srv, 5000), 128 + SIGKILL);
  kvs_peers_destroy(p);
}

static int stale_child(void *p) {
  int fd;
  return kvs_sock_listen((const char *)p, 4, &fd) == 0 ? 0 : 31; /* exits without unlink */
}

Test(server, stale_socket_is_removed_by_discovery, T_TIMEOUT) {
  start_with(0);
  char dir[512], stale[700], other[700];
  snprintf(dir, sizeof dir, "%s/%s", S.opts.run_dir, S.opts.group);
  snprintf(stale, sizeof stale, "%s/00000000deadbeef.sock", dir);
  snprintf(other, sizeof other, "%s/notes.txt", dir);
  cr_assert_eq(ts_wait_child(ts_fork(stale_child, stale), 5000), 0);
  struct stat sb;
  cr_assert_eq(lstat(stale, &sb), 0);
  cr_assert(S_ISSOCK(sb.st_mode));
  FILE *f = fopen(other, "w");
  cr_assert_not_null(f);
  fclose(f);
  /* a starting process's socket: bound, not yet listening (refused too, but not stale) */
  char starting[700];
  snprintf(starting, sizeof starting, "%s/00000000feedbeef.sock", dir);
  int sfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  cr_assert_lt(strlen(starting), sizeof sa.sun_path);
  memcpy(sa.sun_path, starting, strlen(starting) + 1);
  cr_assert_eq(bind(sfd, (struct sockaddr *)&sa, sizeof sa), 0);
  kvs_stats_t st;
  kvs_peers_t *p = client(1000, &st); /* asserts exactly 1 live peer: the real server */
  cr_assert_neq(lstat(stale, &sb), 0, "stale socket left in place");
  cr_assert_eq(lstat(starting, &sb), 0, "discovery removed a bound socket before its listen");
  close(sfd);
  unlink(starting);
  cr_assert_eq(lstat(other, &sb), 0, "discovery removed a file that is not a socket of ours");
  cr_assert_eq(lstat(S.path, &sb), 0, "discovery removed the live server's socket");
  kvs_peers_destroy(p);
}

/* A peer that starts just after a scan is found by the next discovery at once: the group
 * directory's modification time changed, so the 200 ms rate limit does not apply. */
Test(server, a_new_socket_is_discovered_within_the_rate_limit, T_TIMEOUT) {
  cr_assert_eq(ts_server_init(&S, 16u << 20), 0);
  kvs_options_t o = S.opts;
  kvs_stats_t st;
  kvs_stats_init(&st);
  kvs_peers_config_t pc = {.opts = &o, .role = KVS_PROTO_ROLE_ENGINE, .stats = &st};
  kvs_peers_t *p = NULL;
  cr_assert_eq(kvs_peers_create(&pc, &p), 0);
  cr_assert_eq(kvs_peers_discover(p, true), 0, "no server yet");
  uint64_t t0 = kvs__now_ms();
  cr_assert_eq(ts_server_start(&S), 0);
  int n = kvs_peers_discover(p, false); /* not forced: within 200 ms of the last scan */
  uint64_t dt = kvs__now_ms() - t0;
  cr_assert_eq(n, 1, "the server started %llu ms after the last scan was not discovered",
               (unsigned long long)dt);
  kvs_peers_destroy(p);
}
