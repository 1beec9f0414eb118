/* Coordinator hardening (issue 17): file-descriptor exhaustion in the accept loop, the protocol
 * corners of docs/protocol.md (REPLY/ERROR frames from a client, HELLO field rules, the
 * ALL_OR_NOTHING outcome, aliases retrieved once, max_message in HELLO), the live-pins gauge
 * and the pool memfd's mode. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "coord_client.h"
#include "internal.h"
#include "log.h"
#include "peer.h"

#define T_TIMEOUT .timeout = 90

static ts_server_t S;
static cc_t W; /* a well-behaved witness connection */

static void down(void) {
  if (W.fd > 0) cc_close(&W);
  ts_server_reset(&S);
  memset(&W, 0, sizeof W);
}

static void start(void) {
  cr_assert_eq(ts_server_init(&S, 8u << 20), 0);
  cr_assert_eq(ts_server_start(&S), 0);
  cr_assert_eq(cc_open(&W, S.path, KVS_PROTO_STRATEGY_AUTO), 0);
}

static uint64_t stat_of(cc_t *c, const char *name) {
  static char text[32768];
  cr_assert_geq(cc_stats(c, KVS_PROTO_STATS_INFO, text, sizeof text), 0);
  char key[128];
  snprintf(key, sizeof key, "\n%s:", name);
  const char *p = strstr(text, key);
  cr_assert_not_null(p, "no %s in STATS", name);
  return strtoull(p + strlen(key), NULL, 10);
}

/* ---- fd exhaustion ------------------------------------------------------------------------- */

typedef struct fdsrv {
  int ready[2];  /* child -> parent: the socket path */
  int done[2];   /* parent closes its end: child stops */
  char log[160]; /* the child's log file */
} fdsrv_t;

/* A server whose process may hold only 48 descriptors. */
static int fd_server(void *arg) {
  fdsrv_t *f = arg;
  close(f->ready[0]);
  close(f->done[1]);
  int lfd = open(f->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (lfd < 0) return 10;
  kvs_log_set_fd(lfd);
  kvs_log_set_level(KVS_LOG_WARN);
  ts_server_t s;
  if (ts_server_init(&s, 4u << 20) < 0 || ts_server_start(&s) < 0) return 11;
  struct rlimit rl = {48, 48};
  if (setrlimit(RLIMIT_NOFILE, &rl) < 0) return 12;
  char path[sizeof s.path];
  memcpy(path, s.path, sizeof path);
  if (write(f->ready[1], path, sizeof path) != (ssize_t)sizeof path) return 13;
  char b;
  while (read(f->done[0], &b, 1) > 0) {
  }
  ts_server_stop(&s, true);
  return 0;
}

/* utime + stime of a whole process (all threads), in clock ticks. */
static uint64_t cpu_ticks(pid_t pid) {
  char p[64], buf[1024];
  snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
  FILE *fp = fopen(p, "r");
  cr_assert_not_null(fp);
  size_t n = fread(buf, 1, sizeof buf - 1, fp);
  fclose(fp);
  buf[n] = 0;
  const char *s = strrchr(buf, ')'); /* comm may hold spaces */
  cr_assert_not_null(s);
  unsigned long ut = 0, st = 0;
  /* fields after comm: state(3) ... utime(14) stime(15) */
  cr_assert_eq(sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
  return ut + st;
}

static int raw_connect(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS) {
    close(fd);
    return -1; /* backlog full: fine, we only want the server out of descriptors */
  }
  return fd;
}

static int count_lines(const char *path, const char *needle) {
  FILE *fp = fopen(path, "r");
  if (!fp) return 0;
  char line[2048];
  int n = 0;
  while (fgets(line, sizeof line, fp))
    if (strstr(line, needle)) n++;
  fclose(fp);
  return n;
}

TestSuite(fd, .fini = down);

/* 200 clients against a server limited to 48 descriptors: the server pauses its listener (no
 * CPU spin: measured as the process's CPU time over an idle second), logs the episode once,
 * counts it, keeps serving the connection it has, and accepts again when descriptors free up. */
Test(fd, emfile_pauses_accept_without_spinning, T_TIMEOUT) {
  fdsrv_t f;
  char dir[128];
  cr_assert_eq(ts_mkdtemp(dir, sizeof dir, "kvs-emfile"), 0);
  snprintf(f.log, sizeof f.log, "%s/log", dir);
  cr_assert_eq(pipe(f.ready), 0);
  cr_assert_eq(pipe(f.done), 0);
  pid_t pid = ts_fork(fd_server, &f);
  close(f.ready[1]);
  close(f.done[0]);
  char path[KVS_SOCK_PATH_MAX + 1];
  cr_assert_eq(read(f.ready[0], path, sizeof path), (ssize_t)sizeof path, "server did not start");
  cc_t w;
  cr_assert_eq(cc_open(&w, path, KVS_PROTO_STRATEGY_INLINE), 0);

  enum { N = 200 };
  int fds[N];
  for (int i = 0; i < N; i++) fds[i] = raw_connect(path);
  /* Let the server run into the limit and settle. */
  for (int i = 0; i < 200 && stat_of(&w, "coord_accept_paused") == 0; i++) usleep(10000);
  cr_assert_geq(stat_of(&w, "coord_accept_paused"), 1, "no EMFILE episode counted");
  usleep(200000);

  uint64_t t0 = cpu_ticks(pid);
  usleep(1000000);
  uint64_t used = cpu_ticks(pid) - t0;
  long hz = sysconf(_SC_CLK_TCK);
  cr_assert_lt(used * 5, (uint64_t)hz, "idle server used %llu of %ld ticks in a second: spinning",
               (unsigned long long)used, hz);

  /* Existing connections are served; one episode, one line. */
  cr_assert_eq(cc_ping(&w, 1, "alive", 5), 0);
  cr_assert_eq(stat_of(&w, "coord_accept_paused"), 1);
  cr_assert_eq(count_lines(f.log, "cannot accept connections"), 1);

  /* Descriptors come free: new clients are served again. */
  for (int i = 0; i < N; i++)
    if (fds[i] >= 0) close(fds[i]);
  cc_t late;
  int rc = -1;
  for (int i = 0; i < 100 && rc != 0; i++) {
    rc = cc_open(&late, path, KVS_PROTO_STRATEGY_INLINE);
    if (rc != 0) {
      cc_close(&late);
      usleep(20000);
    }
  }
  cr_assert_eq(rc, 0, "no new client served after descriptors came free");
  cr_assert_eq(cc_ping(&late, 2, "late", 4), 0);
  cc_close(&late);
  cc_close(&w);
  close(f.done[1]);
  cr_assert_eq(ts_wait_child(pid, 10000), 0);
  close(f.ready[0]);
  ts_rmtree(dir);
}

/* ---- stale SHM reads ------------------------------------------------------------------------ */

typedef struct slow_sink {
  kvs_key_t key, other;
  uint64_t len;
  uint32_t sleep_ms;
  bool rewrite;   /* expire the pin and reuse the extent while "copying" */
  uint8_t *copy;
  int calls;
} slow_sink_t;

static int slow_sink(void *ctx, size_t i, const kvs_layout_t *l, const void *b, uint64_t len) {
  (void)i, (void)l;
  slow_sink_t *s = ctx;
  s->calls++;
  usleep(s->sleep_ms * 1000u);
  if (s->rewrite) {
    /* The server's sweep reclaims the expired pin; the object goes and another takes its
     * extent: exactly what a slow reader races against. */
    kvs_store_sweep(S.store, kvs__now_ms());
    cr_assert_eq(kvs_store_remove(S.store, &s->key), 0);
    kvs_layout_t bl = kvs_layout_blob(s->len);
    cr_assert_eq(ts_local_put(S.store, &s->other, 1, &bl), 1);
  }
  memcpy(s->copy, b, len);
  return 0;
}

static kvs_peers_t *peer_client(kvs_stats_t *st) {
  kvs_stats_init(st);
  kvs_peers_config_t pc = {.opts = &S.opts, .role = KVS_PROTO_ROLE_ENGINE, .stats = st};
  kvs_peers_t *p = NULL;
  cr_assert_eq(kvs_peers_create(&pc, &p), 0);
  cr_assert_eq(kvs_peers_discover(p, true), 1);
  return p;
}

TestSuite(stale, .fini = down);

enum { SLOW_LEN = 64u << 10 };

/* The stale-pin cases open the same way: a server (lease_ms 0: the default lease) holding one
 * SLOW_LEN object under s->key, and a peer client counting into st. */
static kvs_peers_t *slow_open(uint32_t lease_ms, const slow_sink_t *s, kvs_stats_t *st) {
  cr_assert_eq(ts_server_init(&S, 4u << 20), 0);
  if (lease_ms) S.opts.lease_ms = lease_ms;
  cr_assert_eq(ts_server_start(&S), 0);
  kvs_layout_t bl = kvs_layout_blob(SLOW_LEN);
  cr_assert_eq(ts_local_put(S.store, &s->key, 1, &bl), 1);
  return peer_client(st);
}

/* KVSHIM_LEASE_MS=20 and a reader that takes 100 ms: its pin expires, the extent is reused under
 * the copy, COMMIT_RETRIEVE answers ENOENT and kvs_peers_retrieve throws the copy away. */
Test(stale, expired_pin_throws_the_copy_away, T_TIMEOUT) {
  const uint64_t LEN = SLOW_LEN;
  slow_sink_t s = {tk(70, 1), tk(70, 2), LEN, 100, true, malloc(LEN), 0};
  kvs_stats_t st;
  kvs_peers_t *p = slow_open(20, &s, &st);
  int rc = kvs_peers_retrieve(p, S.instance_id, &s.key, 1, slow_sink, &s);
  cr_assert_eq(s.calls, 1);
  cr_assert_eq(rc, -ESTALE, "a copy made under an expired pin was delivered (rc %d)", rc);
  cr_assert_eq(kvs_stats_get(&st, KVS_STAT_peer_stale_reads), 1);
  cr_assert_eq(kvs_stats_get(&st, KVS_STAT_peer_hits), 0);
  /* The bytes really were rewritten: what the reader copied is not the object it asked for. */
  cr_assert_neq(pat_check(s.copy, LEN, s.key), 0);
  free(s.copy);
  kvs_peers_destroy(p);
}

/* The same slow reader with the default lease keeps its copy (the unpin is waited for). */
Test(stale, slow_copy_within_the_lease_is_kept, T_TIMEOUT) {
  const uint64_t LEN = SLOW_LEN;
  slow_sink_t s = {tk(71, 1), tk(71, 2), LEN, 30, false, malloc(LEN), 0};
  kvs_stats_t st;
  kvs_peers_t *p = slow_open(0, &s, &st);
  cr_assert_eq(kvs_peers_retrieve(p, S.instance_id, &s.key, 1, slow_sink, &s), 1);
  cr_assert_eq(pat_check(s.copy, LEN, s.key), 0);
  cr_assert_eq(kvs_stats_get(&st, KVS_STAT_peer_stale_reads), 0);
  free(s.copy);
  kvs_peers_destroy(p);
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, NULL, 0, 3000), 0, "pins left");
}

/* ---- live pins gauge ------------------------------------------------------------------------ */

static int pin_and_wait(void *arg) {
  const kvs_key_t *k = arg;
  cc_t c;
  if (cc_open(&c, S.path, KVS_PROTO_STRATEGY_AUTO) < 0) return 10;
  cc_pretr_t r;
  if (cc_prepare_retrieve(&c, KVS_PROTO_STRATEGY_SHM, k, 4, &r) < 0 || r.n_found != 4) return 11;
  printf("pinned\n");
  fflush(stdout);
  pause(); /* SIGKILLed here, holding its pins */
  return 0;
}

TestSuite(pins, .fini = down);

/* store_live_pins counts the pins held now: readers SIGKILLed while holding pins take it back to
 * 0 (store_pins - store_releases does not: an owner's release on close is counted elsewhere). */
Test(pins, live_pins_gauge_returns_to_zero_after_killed_readers, T_TIMEOUT) {
  start();
  kvs_key_t k[4];
  for (int i = 0; i < 4; i++) k[i] = tk(80, (uint64_t)i);
  kvs_layout_t bl = kvs_layout_blob(8192);
  cr_assert_eq(ts_local_put(S.store, k, 4, &bl), 4);
  pid_t kids[3];
  for (int i = 0; i < 3; i++) kids[i] = ts_fork(pin_and_wait, k);
  for (int t = 0; t < 500 && stat_of(&W, "store_live_pins") < 12; t++) usleep(10000);
  cr_assert_eq(stat_of(&W, "store_live_pins"), 12);
  for (int i = 0; i < 3; i++) {
    kill(kids[i], SIGKILL);
    ts_wait_child(kids[i], 5000);
  }
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, S.coord, 1, 5000), 0);
  cr_assert_eq(stat_of(&W, "store_live_pins"), 0);
  cr_assert_neq(stat_of(&W, "store_pins"), stat_of(&W, "store_releases"),
                "the old formula would do: this test no longer shows the gauge is needed");
}

/* ---- protocol corners (docs/protocol.md) ---------------------------------------------------- */

static kvs_proto_header_t hdr(uint16_t op, uint64_t rid, uint32_t len) {
  return (kvs_proto_header_t){KVS_PROTO_MAGIC, KVS_PROTO_VERSION, op, 0, rid, len};
}

/* ERROR with code and request id, then the connection closes; the witness is still served. */
static void expect_closed_with(cc_t *c, int code, uint64_t rid) {
  cc_msg_t m;
  cr_assert_eq(cc_recv(c, &m, 3000), 0, "no ERROR before the close");
  cr_assert_eq(m.h.opcode, KVS_OP_ERROR);
  cr_assert_eq(cc_error_code(&m, NULL, 0), code);
  cr_assert_eq(m.h.request_id, rid, "ERROR request id %llu, wanted %llu",
               (unsigned long long)m.h.request_id, (unsigned long long)rid);
  cc_msg_free(&m);
  cr_assert(cc_wait_closed(c, 3000));
  cc_close(c);
  cr_assert_eq(cc_ping(&W, 5, "ok", 2), 0);
}

TestSuite(corners, .fini = down);

/* §8: an ERROR frame sent by a client (with REPLY, so the header itself is valid) is answered
 * with -EPROTO echoing its request id. */
Test(corners, error_frame_from_client_echoes_its_id, T_TIMEOUT) {
  start();
  cc_t c;
  cr_assert_eq(cc_open(&c, S.path, KVS_PROTO_STRATEGY_AUTO), 0);
  uint8_t p[64];
  size_t n = 0;
  kvs_proto_error_t e;
  kvs_proto_error_init(&e, -EIO, "from a client");
  cr_assert_eq(kvs_proto_error_encode(&e, p, sizeof p, &n), 0);
  kvs_proto_header_t h = hdr(KVS_OP_ERROR, 4242, (uint32_t)n);
  h.flags = KVS_PROTO_F_REPLY;
  cr_assert_eq(cc_send_frame(&c, &h, p), 0);
  expect_closed_with(&c, -EPROTO, 4242);
}

/* §5: a HELLO request with strategy_chosen set (or a pool fd flag) is a field violation. */
Test(corners, hello_request_with_strategy_chosen_is_ebadmsg, T_TIMEOUT) {
  start();
  cc_t c;
  cr_assert_eq(cc_connect(&c, S.path), 0);
  kvs_proto_hello_t me;
  memset(&me, 0, sizeof me);
  me.version_min = me.version_max = 1;
  me.role = KVS_PROTO_ROLE_TOOL;
  me.strategy_chosen = KVS_PROTO_STRATEGY_SHM;
  me.caps = KVS_PROTO_CAP_INLINE;
  me.max_frame = KVS_PROTO_MIN_MAX_FRAME;
  cr_assert_eq(cc_send_hello(&c, &me, 31), 0);
  expect_closed_with(&c, -EBADMSG, 31);
}

/* §4.5: an alias entry (kind OBJECT, entry > 0) that carries bytes is malformed: -EBADMSG and
 * the connection closes; nothing is stored. */
Test(corners, alias_entry_with_bytes_is_ebadmsg, T_TIMEOUT) {
  start();
  cc_t c;
  cr_assert_eq(cc_open(&c, S.path, KVS_PROTO_STRATEGY_INLINE), 0);
  const uint64_t LEN = 4096;
  kvs_layout_t l = kvs_layout_blob(LEN);
  kvs_proto_entry_t ent[2] = {{tk(90, 0), LEN}, {tk(90, 1), LEN}};
  uint8_t *data = calloc(1, 2 * LEN);
  kvs_proto_commit_store_t m = {.is_inline = 1, .kind = KVS_PROTO_KIND_CHUNKS, .layout = l,
                                .n_entries = 2, .entries = ent, .data = data,
                                .data_len = 2 * LEN};
  size_t n = 0;
  cr_assert_eq(kvs_proto_commit_store_encode(&m, NULL, 0, &n), 0);
  uint8_t *p = malloc(n);
  cr_assert_eq(kvs_proto_commit_store_encode(&m, p, n, &n), 0);
  p[9] = KVS_PROTO_KIND_OBJECT; /* now entry 1 is an alias with 4096 bytes */
  kvs_proto_header_t h = hdr(KVS_OP_COMMIT_STORE, 55, (uint32_t)n);
  cr_assert_eq(cc_send_frame(&c, &h, p), 0);
  expect_closed_with(&c, -EBADMSG, 55);
  cr_assert_eq(ts_info(S.store).objects_ready, 0);
  free(p);
  free(data);
}

static int prepare_mode(cc_t *c, const kvs_key_t *keys, uint32_t n, uint32_t mode, uint64_t len,
                        uint8_t *oc, uint64_t *xfer) {
  kvs_proto_prepare_store_t m = {KVS_PROTO_STRATEGY_SHM, KVS_PROTO_KIND_CHUNKS, mode,
                                 kvs_layout_blob(len), n, keys};
  uint8_t buf[1024];
  size_t bn = 0;
  cr_assert_eq(kvs_proto_prepare_store_encode(&m, buf, sizeof buf, &bn), 0);
  cc_msg_t r;
  int rc = cc_call(c, KVS_OP_PREPARE_STORE, buf, bn, &r);
  if (rc < 0) return rc;
  kvs_proto_prepare_store_reply_t d;
  cr_assert_eq(kvs_proto_prepare_store_reply_decode(r.payload, r.len, &d), 0);
  memcpy(oc, d.outcomes, d.n_outcomes);
  *xfer = d.xfer;
  cc_msg_free(&r);
  return (int)d.n_outcomes;
}

/* §4.4: ALL_OR_NOTHING names the key that blocked it (BUSY: being written by another
 * connection) and SKIPPED for the others, to a client that announced CAP_SKIPPED; a client that
 * did not gets the blocker's outcome for every key, as before. Nothing is reserved. */
Test(corners, all_or_nothing_reports_the_blocking_key, T_TIMEOUT) {
  start();
  kvs_key_t k[3] = {tk(91, 0), tk(91, 1), tk(91, 2)};
  cc_t a, b, old;
  cr_assert_eq(cc_open(&a, S.path, KVS_PROTO_STRATEGY_AUTO), 0);
  uint8_t oc[4];
  uint64_t xa = 0, x = 0;
  cr_assert_eq(prepare_mode(&a, &k[2], 1, 0, 4096, oc, &xa), 1); /* a writes k2 */
  cr_assert_eq(oc[0], KVS_RES_RESERVED);
  cr_assert_eq(cc_connect(&b, S.path), 0);
  cr_assert_eq(cc_hello(&b, KVS_PROTO_STRATEGY_AUTO,
                        KVS_PROTO_CAP_SHM | KVS_PROTO_CAP_INLINE | KVS_PROTO_CAP_SKIPPED, 0), 0);
  cr_assert(b.server.caps & KVS_PROTO_CAP_SKIPPED, "the server does not announce SKIPPED");
  kvs_store_info_t before = ts_info(S.store);
  cr_assert_eq(prepare_mode(&b, k, 3, KVS_RESERVE_ALL_OR_NOTHING, 4096, oc, &x), 3);
  cr_assert_eq(x, 0);
  cr_assert_eq(oc[0], KVS_RES_SKIPPED, "k0 did not block: %u", oc[0]);
  cr_assert_eq(oc[1], KVS_RES_SKIPPED, "k1 did not block: %u", oc[1]);
  cr_assert_eq(oc[2], KVS_RES_BUSY, "k2 blocked: %u", oc[2]);
  cr_assert_eq(ts_info(S.store).reserved_bytes, before.reserved_bytes, "something was reserved");
  cr_assert_eq(cc_open(&old, S.path, KVS_PROTO_STRATEGY_AUTO), 0); /* no CAP_SKIPPED */
  cr_assert_eq(prepare_mode(&old, k, 3, KVS_RESERVE_ALL_OR_NOTHING, 4096, oc, &x), 3);
  for (int i = 0; i < 3; i++) cr_assert_eq(oc[i], KVS_RES_BUSY, "old client, key %d: %u", i, oc[i]);
  cc_close(&a), cc_close(&b), cc_close(&old);
}

/* §4.7: retrieving a primary and its aliases in one request returns the object once. */
Test(corners, primary_and_aliases_retrieved_once, T_TIMEOUT) {
  start();
  const uint64_t LEN = 12288;
  kvs_layout_t l = kvs_layout_blob(LEN);
  kvs_key_t k[3] = {tk(92, 0), tk(92, 1), tk(92, 2)};
  uint8_t *buf = malloc(LEN);
  pat_fill(buf, LEN, k[0]);
  const void *bufs[1] = {buf};
  cc_t a;
  cr_assert_eq(cc_open(&a, S.path, KVS_PROTO_STRATEGY_AUTO), 0);
  uint32_t committed = 0;
  cr_assert_eq(cc_commit_inline(&a, 0, KVS_PROTO_KIND_OBJECT, &l, k, 3, bufs, &committed, NULL), 0);
  cr_assert_eq(committed, 1);
  for (int shm = 0; shm < 2; shm++) {
    cc_pretr_t r;
    cr_assert_eq(cc_prepare_retrieve(&a, shm ? KVS_PROTO_STRATEGY_SHM : KVS_PROTO_STRATEGY_INLINE,
                                     k, 3, &r), 0);
    cr_assert_eq(r.n_found, 3);
    cr_assert_eq(r.n_objects, 1, "%s: %u object records for one object", shm ? "shm" : "inline",
                 r.n_objects);
    cr_assert_eq(r.objects[0].key_index, 0);
    cr_assert_eq(r.objects[0].length, LEN);
    if (!shm) cr_assert_eq(r.msg.len, 24 + 32 + 8 + LEN, "inline bytes sent more than once");
    cr_assert_eq(pat_check(cc_object_bytes(&a, &r, 0), LEN, k[0]), 0);
    if (shm) cr_assert_eq(cc_commit_retrieve(&a, r.xfer), 0);
    cc_pretr_free(&r);
  }
  /* kvshim's own client delivers the leading run: all three keys, one sink call. */
  kvs_stats_t st;
  kvs_peers_t *p = peer_client(&st);
  slow_sink_t s = {k[0], k[0], LEN, 0, false, malloc(LEN), 0};
  cr_assert_eq(kvs_peers_retrieve(p, S.instance_id, k, 3, slow_sink, &s), 3);
  cr_assert_eq(s.calls, 1);
  cr_assert_eq(pat_check(s.copy, LEN, k[0]), 0);
  kvs_peers_destroy(p);
  free(s.copy);
  free(buf);
  cc_close(&a);
}

/* §5.1: HELLO announces max_message to a client that asks (CAP_MAX_MESSAGE); to one that does
 * not, the reply is the version-1 body byte for byte (an old decoder rejects trailing bytes). */
Test(corners, hello_announces_max_message, T_TIMEOUT) {
  start();
  cr_assert_eq(W.server.max_message, 0, "sent to a client that did not ask");
  cc_t c;
  cr_assert_eq(cc_connect(&c, S.path), 0);
  cr_assert_eq(cc_hello(&c, KVS_PROTO_STRATEGY_AUTO,
                        KVS_PROTO_CAP_SHM | KVS_PROTO_CAP_INLINE | KVS_PROTO_CAP_MAX_MESSAGE, 0), 0);
  uint64_t want = kvs_pool_header(S.pool)->cache_size + (1u << 20);
  if (want < S.opts.max_frame) want = S.opts.max_frame;
  cr_assert_eq(c.server.max_message, want, "max_message %llu, wanted %llu",
               (unsigned long long)c.server.max_message, (unsigned long long)want);
  cr_assert(c.server.caps & KVS_PROTO_CAP_MAX_MESSAGE);
  cc_close(&c);
}

/* design §14: the pool memfd is 0600 (memfd_create makes it 0777). */
Test(corners, pool_memfd_is_0600, T_TIMEOUT) {
  start();
  struct stat sb;
  cr_assert_eq(fstat(kvs_pool_fd(S.pool), &sb), 0);
  cr_assert_eq(sb.st_mode & 07777, 0600, "pool mode %o", sb.st_mode & 07777);
}

/* ---- REPORT_BAD (docs/protocol.md 4.11) ------------------------------------------------------ */

TestSuite(report, .fini = down);

/* A verified report drops the object; a report whose bytes are not the holder's (the object was
 * rewritten since the reporter read it) changes nothing; a peer that predates REPORT_BAD is
 * never sent one (its caps lack the bit). */
Test(report, verified_report_drops_a_rewritten_one_does_not, T_TIMEOUT) {
  start();
  const uint64_t LEN = 20000;
  kvs_layout_t bl = kvs_layout_blob(LEN);
  kvs_key_t k = tk(95, 1);
  cr_assert_eq(ts_local_put(S.store, &k, 1, &bl), 1);
  kvs_stats_t st;
  kvs_peers_t *p = peer_client(&st);
  uint8_t *mine = malloc(LEN);
  pat_fill(mine, LEN, k);
  /* The reporter read other bytes (the object was rewritten since): kept. */
  mine[7] ^= 1;
  cr_assert_eq(kvs_peers_report_bad(p, S.instance_id, k, LEN, kvs_checksum64(mine, LEN)), 0);
  cr_assert_eq(ts_local_count(S.store, &k, 1), 1, "dropped on an unverified report");
  cr_assert_eq(kvs_peers_report_bad(p, S.instance_id, k, LEN - 1, kvs_checksum64(mine, LEN - 1)), 0);
  cr_assert_eq(ts_local_count(S.store, &k, 1), 1);
  /* The reporter read exactly what the holder has: dropped. */
  mine[7] ^= 1;
  cr_assert_eq(kvs_peers_report_bad(p, S.instance_id, k, LEN, kvs_checksum64(mine, LEN)), 1);
  cr_assert_eq(ts_local_count(S.store, &k, 1), 0, "a verified report did not drop the object");
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_bad_reports), 3);
  cr_assert_eq(ts_stat(&S, KVS_STAT_coord_bad_dropped), 1);
  cr_assert_eq(kvs_stats_get(&st, KVS_STAT_peer_bad_reports), 3);
  /* Gone: a second report finds nothing. */
  cr_assert_eq(kvs_peers_report_bad(p, S.instance_id, k, LEN, kvs_checksum64(mine, LEN)), 0);
  kvs_store_info_t base = {0};
  cr_assert_geq(ts_wait_baseline(S.store, &base, NULL, 0, 3000), 0, "pins left");
  cr_assert(W.server.caps & KVS_PROTO_CAP_REPORT_BAD);
  free(mine);
  kvs_peers_destroy(p);
}

/* A malformed REPORT_BAD (length 0) is -EBADMSG and closes, like every malformed payload. */
Test(report, malformed_report_is_ebadmsg, T_TIMEOUT) {
  start();
  cc_t c;
  cr_assert_eq(cc_open(&c, S.path, KVS_PROTO_STRATEGY_AUTO), 0);
  uint8_t pl[32] = {0};
  kvs_proto_header_t h = hdr(KVS_OP_REPORT_BAD, 61, sizeof pl);
  cr_assert_eq(cc_send_frame(&c, &h, pl), 0);
  expect_closed_with(&c, -EBADMSG, 61);
}
