/* Coordinator stress test (a plain program, so the TSan leg runs it with ctest -L stress).
 *
 * One server (pool + store + coordinator) in this process; CHILDREN peer processes, forked
 * BEFORE the server starts its threads (TSan dislikes fork after threads), each run --ops
 * mixed operations chosen by their own seeded PRNG against one shared key space on a small
 * pool, so BUSY, PRESENT, NO_SPACE and eviction happen all the time:
 *   store through kvs_peers (SHM and inline), retrieve through kvs_peers (SHM and inline),
 *   lookups, raw SHM prepare + write + commit, raw prepare + half write + abort, raw prepare +
 *   inline commit naming the SHM transfer, raw pinned retrieve + verify + commit_retrieve, raw
 *   inline retrieve, raw prepare then hang up (the connection's close must end the lease).
 * Three children SIGKILL themselves midway: after PREPARE_RETRIEVE (pins held), after writing
 * half of their slots, after PREPARE_STORE.
 *
 * Every object's bytes are a pattern derived from its key, written before commit; every reader
 * checks every byte it receives, so an uncommitted, aborted or recycled extent that became
 * visible shows up as a mismatch. While the children run, the main thread checks
 * used + reserved + free == arena and the store's invariants. At the end (all peers gone):
 * reserved == 0, no pins, no transfers, no connections, a sweep far in the future finds no
 * lease, every READY object matches its key's pattern, and no frame was malformed.
 * Exit 0 on success; non-zero with a message. Options: --ops N (per child), --seed S. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord_client.h"
#include "internal.h"
#include "peer.h"
#define STRESS_NAME "coord_stress"
#include "../../lib/stress.h"

#define CHILDREN 8
#define KEYSPACE 384 /* 8 size classes x 48 keys */
#define CLASSES 8
#define PER_CLASS (KEYSPACE / CLASSES)
#define POOL_BYTES (6u << 20)
#define MAX_BATCH 4
#define DEADLINE_MS 300000

/* Children that kill themselves, and where. */
enum { KILL_AFTER_RETRIEVE = 5, KILL_AFTER_HALF_WRITE = 6, KILL_AFTER_PREPARE = 7 };

static ts_server_t S;
static uint64_t SEED = 20240601;
static int OPS = 20000;


static kvs_key_t key_of(int i) { return tk(SEED, (uint64_t)i); }
static uint64_t size_of_class(int c) { return 4096ull * (uint64_t)(1 + c) - 100ull * (uint64_t)(c % 3); }

/* ---- children ------------------------------------------------------------------------------ */

typedef struct child {
  int id;
  uint64_t rng;
  kvs_peers_t *p_shm, *p_inl;
  cc_t cc;
  int keys_idx[MAX_BATCH];
  kvs_key_t keys[MAX_BATCH];
  int n;
  uint64_t len;
  kvs_layout_t layout;
  void *bufs[MAX_BATCH];
  uint64_t verified;
} child_t;

/* A batch of 1..4 keys of one size class (one layout), consecutive in that class. */
static void pick_batch(child_t *c) {
  int cls = (int)(rnd(&c->rng) % CLASSES);
  int j0 = (int)(rnd(&c->rng) % PER_CLASS);
  c->n = 1 + (int)(rnd(&c->rng) % MAX_BATCH);
  for (int i = 0; i < c->n; i++) {
    c->keys_idx[i] = cls + CLASSES * ((j0 + i) % PER_CLASS);
    c->keys[i] = key_of(c->keys_idx[i]);
  }
  c->len = size_of_class(cls);
  c->layout = kvs_layout_blob(c->len);
}

static void fill_bufs(child_t *c) {
  for (int i = 0; i < c->n; i++) pat_fill(c->bufs[i], c->len, c->keys[i]);
}

static int sink(void *ctx, size_t i, const kvs_layout_t *l, const void *b, uint64_t len) {
  child_t *c = ctx;
  CHECK(i < (size_t)c->n, "sink index %zu", i);
  CHECK(len == c->len && kvs_layout_nbytes(l) == len, "object of key %d: %" PRIu64 " bytes, want %" PRIu64,
        c->keys_idx[i], len, c->len);
  uint64_t bad = pat_check(b, len, c->keys[i]);
  CHECK(bad == 0, "key %d: wrong byte near offset %" PRIu64 " (retrieved through kvs_peers)",
        c->keys_idx[i], bad - 1);
  c->verified++;
  return 0;
}

static void verify_reply(child_t *c, const cc_pretr_t *r) {
  CHECK(r->n_objects <= r->n_found && r->n_found <= (uint32_t)c->n, "retrieve counts");
  for (uint32_t i = 0; i < r->n_objects; i++) {
    CHECK(r->objects[i].key_index == i, "object order");
    CHECK(r->objects[i].length == c->len, "key %d: length %" PRIu64, c->keys_idx[i],
          r->objects[i].length);
    const uint8_t *b = cc_object_bytes(&c->cc, r, i);
    uint64_t bad = pat_check(b, c->len, c->keys[i]);
    CHECK(bad == 0, "key %d: wrong byte near offset %" PRIu64 " (%s retrieve)", c->keys_idx[i],
          bad - 1, r->is_inline ? "inline" : "SHM");
    c->verified++;
  }
}

static void reopen(child_t *c) {
  cc_close(&c->cc);
  int rc = cc_open(&c->cc, S.path, KVS_PROTO_STRATEGY_AUTO);
  CHECK(rc == 0 && c->cc.pool, "reconnect: %d", rc);
}

/* SHM prepare of the current batch: returns the reply (slots may be fewer than keys). */
static void raw_prepare(child_t *c, cc_pstore_t *ps) {
  int rc = cc_prepare_store(&c->cc, KVS_PROTO_STRATEGY_SHM, KVS_PROTO_KIND_CHUNKS, &c->layout,
                            c->keys, (uint32_t)c->n, ps);
  CHECK(rc == 0, "PREPARE_STORE: %d", rc);
  CHECK(ps->n_outcomes == (uint32_t)c->n, "outcomes");
  for (uint32_t i = 0; i < ps->n_slots; i++) CHECK(ps->slots[i].length == c->len, "slot length");
}

static void write_slots(child_t *c, const cc_pstore_t *ps, bool half) {
  uint8_t *base = kvs_pool_base(c->cc.pool);
  for (uint32_t i = 0; i < ps->n_slots; i++) {
    const kvs_proto_slot_t *s = &ps->slots[i];
    pat_fill(base + s->offset, half ? s->length / 2 : s->length, c->keys[s->key_index]);
  }
}

static _Noreturn void die_now(void) {
  kill(getpid(), SIGKILL);
  for (;;) pause();
}

static void kill_step(child_t *c) {
  cc_pstore_t ps;
  for (int tries = 0; tries < 1000; tries++) {
    pick_batch(c);
    if (c->id == KILL_AFTER_RETRIEVE) {
      cc_pretr_t r;
      CHECK(cc_prepare_retrieve(&c->cc, KVS_PROTO_STRATEGY_SHM, c->keys, (uint32_t)c->n, &r) == 0,
            "prepare_retrieve");
      if (r.n_objects > 0) die_now(); /* pins held */
      cc_pretr_free(&r);
    } else {
      raw_prepare(c, &ps);
      if (ps.n_slots > 0) {
        if (c->id == KILL_AFTER_HALF_WRITE) write_slots(c, &ps, true);
        die_now();
      }
    }
  }
  fail("child %d never reached its kill step", c->id);
}

static kvs_peers_t *peers(int strategy) {
  kvs_options_t o = S.opts;
  o.strategy = strategy;
  kvs_peers_config_t pc = {.opts = &o, .role = KVS_PROTO_ROLE_ENGINE};
  kvs_peers_t *p = NULL;
  CHECK(kvs_peers_create(&pc, &p) == 0, "kvs_peers_create");
  CHECK(kvs_peers_discover(p, true) == 1, "discovery found no server");
  return p;
}

static int child_main(void *arg) {
  child_t c;
  memset(&c, 0, sizeof c);
  c.id = (int)(intptr_t)((void **)arg)[0];
  int go = (int)(intptr_t)((void **)arg)[1];
  c.rng = SEED * 1000003ull + (uint64_t)c.id * 7919ull + 1;
  char ch;
  CHECK(read(go, &ch, 1) == 1, "no go signal");
  c.p_shm = peers(KVS_STRATEGY_AUTO);
  c.p_inl = peers(KVS_STRATEGY_INLINE);
  kvs_peer_info_t info;
  CHECK(kvs_peers_list(c.p_shm, &info, 1) == 1 && info.strategy == KVS_PROTO_STRATEGY_SHM,
        "kvs_peers did not map the server's pool");
  CHECK(cc_open(&c.cc, S.path, KVS_PROTO_STRATEGY_AUTO) == 0 && c.cc.pool, "raw connect");
  for (int i = 0; i < MAX_BATCH; i++) c.bufs[i] = malloc(size_of_class(CLASSES - 1));
  int kill_at = c.id >= KILL_AFTER_RETRIEVE ? OPS / 2 + c.id * 7 : -1;

  for (int op = 0; op < OPS; op++) {
    if (op == kill_at) kill_step(&c);
    pick_batch(&c);
    int r = (int)(rnd(&c.rng) % 100);
    int rc;
    cc_pstore_t ps;
    cc_pretr_t pr;
    uint8_t outc[MAX_BATCH];
    if (r < 28) { /* kvs_peers store, SHM (r < 18) or inline */
      fill_bufs(&c);
      rc = kvs_peers_store(r < 18 ? c.p_shm : c.p_inl, S.instance_id, c.keys, (size_t)c.n, &c.layout,
                           false, (const void *const *)c.bufs, outc);
      CHECK(rc >= 0 && rc <= c.n, "kvs_peers_store: %d", rc);
    } else if (r < 56) { /* kvs_peers retrieve, SHM (r < 46) or inline */
      rc = kvs_peers_retrieve(r < 46 ? c.p_shm : c.p_inl, S.instance_id, c.keys, (size_t)c.n,
                              sink, &c);
      CHECK(rc >= 0 && rc <= c.n, "kvs_peers_retrieve: %d", rc);
    } else if (r < 64) {
      rc = kvs_peers_lookup(c.p_shm, c.keys, (size_t)c.n, NULL);
      CHECK(rc >= 0 && rc <= c.n, "kvs_peers_lookup: %d", rc);
    } else if (r < 74) { /* raw SHM store */
      raw_prepare(&c, &ps);
      if (ps.xfer) {
        rc = cc_write_and_commit(&c.cc, &ps, c.keys, KVS_PROTO_KIND_CHUNKS);
        CHECK(rc == (int)ps.n_slots, "SHM commit: %d", rc);
      }
    } else if (r < 82) { /* half written, then aborted */
      raw_prepare(&c, &ps);
      if (ps.xfer) {
        write_slots(&c, &ps, true);
        CHECK(cc_abort(&c.cc, ps.xfer) == 0, "abort");
      }
    } else if (r < 87) { /* the seed's flow: SHM prepare, then the bytes inline */
      raw_prepare(&c, &ps);
      fill_bufs(&c);
      uint32_t committed = 0;
      uint8_t io[MAX_BATCH];
      rc = cc_commit_inline(&c.cc, ps.xfer, KVS_PROTO_KIND_CHUNKS, &c.layout, c.keys,
                            (uint32_t)c.n, (const void *const *)c.bufs, &committed, io);
      CHECK(rc == 0, "inline commit naming an SHM transfer: %d", rc);
      /* Our own SHM reservation was aborted first: never BUSY against ourselves. */
      for (int i = 0; i < c.n; i++)
        CHECK(ps.outcomes[i] != KVS_RES_RESERVED || io[i] != KVS_RES_BUSY,
              "key %d: inline commit found its own SHM reservation still held", c.keys_idx[i]);
    } else if (r < 95) { /* raw retrieve, SHM (pinned while verified) or inline */
      bool shm = r < 91;
      rc = cc_prepare_retrieve(&c.cc, shm ? KVS_PROTO_STRATEGY_SHM : KVS_PROTO_STRATEGY_INLINE,
                               c.keys, (uint32_t)c.n, &pr);
      CHECK(rc == 0, "PREPARE_RETRIEVE: %d", rc);
      verify_reply(&c, &pr);
      if (pr.xfer) CHECK(cc_commit_retrieve(&c.cc, pr.xfer) == 0, "COMMIT_RETRIEVE");
      cc_pretr_free(&pr);
    } else if (r < 97) { /* prepare, then hang up: the close ends the lease */
      raw_prepare(&c, &ps);
      if (ps.n_slots) write_slots(&c, &ps, false);
      reopen(&c);
    } else {
      uint32_t found;
      CHECK(cc_lookup(&c.cc, c.keys, (uint32_t)c.n, &found) == 0 && found <= (uint32_t)c.n, "LOOKUP");
      CHECK(cc_ping(&c.cc, (uint64_t)op, &op, sizeof op) == 0, "PING");
    }
  }
  cc_close(&c.cc);
  kvs_peers_destroy(c.p_shm);
  kvs_peers_destroy(c.p_inl);
  for (int i = 0; i < MAX_BATCH; i++) free(c.bufs[i]);
  fprintf(stderr, "coord_stress: child %d done, %" PRIu64 " objects verified\n", c.id, c.verified);
  return 0;
}

/* ---- main ------------------------------------------------------------------------------------ */

static void check_accounting(const char *when) {
  kvs_store_info_t in = ts_info(S.store);
  if (in.used_bytes + in.reserved_bytes + in.free_bytes != in.arena_bytes) {
    fprintf(stderr, "coord_stress: FAIL (%s): used %" PRIu64 " + reserved %" PRIu64 " + free %" PRIu64
            " != arena %" PRIu64 "\n", when, in.used_bytes, in.reserved_bytes, in.free_bytes,
            in.arena_bytes);
    exit(1);
  }
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--ops") == 0 && i + 1 < argc) OPS = atoi(argv[++i]);
    else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) SEED = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr, "usage: coord_stress [--ops N] [--seed S]\n");
      return 2;
    }
  }
  if (OPS < 100) OPS = 100;
  if (ts_server_init(&S, POOL_BYTES) < 0) return 1;
  if (kvs_coord_socket_name(S.opts.run_dir, S.opts.group, S.instance_id, S.path, sizeof S.path) < 0)
    return 1;
  uint64_t t0 = ts_now_ms();

  /* Fork every child before any thread exists; they wait for the go signal. */
  int go[2];
  if (pipe(go) < 0) return 1;
  pid_t pids[CHILDREN];
  for (int i = 0; i < CHILDREN; i++) {
    void *arg[2] = {(void *)(intptr_t)i, (void *)(intptr_t)go[0]};
    pids[i] = ts_fork(child_main, arg);
  }
  close(go[0]);
  int rc = ts_server_start(&S);
  if (rc < 0) {
    fprintf(stderr, "coord_stress: server start: %d\n", rc);
    for (int i = 0; i < CHILDREN; i++) kill(pids[i], SIGKILL);
    return 1;
  }
  char gos[CHILDREN];
  memset(gos, 'g', sizeof gos);
  if (write(go[1], gos, sizeof gos) != (ssize_t)sizeof gos) return 1;
  close(go[1]);

  /* Watch accounting while the children run. */
  int left = CHILDREN, failures = 0;
  uint64_t checks = 0, max_reserved = 0, max_pins = 0;
  while (left > 0) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      int id = -1;
      for (int i = 0; i < CHILDREN; i++)
        if (pids[i] == pid) id = i;
      left--;
      bool killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
      bool want_killed = id >= KILL_AFTER_RETRIEVE;
      bool ok = want_killed ? killed : (WIFEXITED(st) && WEXITSTATUS(st) == 0);
      if (!ok) {
        fprintf(stderr, "coord_stress: FAIL: child %d ended with %s %d\n", id,
                WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        failures++;
      }
      continue;
    }
    check_accounting("while running");
    kvs_store_info_t in = ts_info(S.store);
    if (in.reserved_bytes > max_reserved) max_reserved = in.reserved_bytes;
    if (in.pins > max_pins) max_pins = in.pins;
    if (++checks % 16 == 0 && !kvs__store_is_valid(S.store)) {
      fprintf(stderr, "coord_stress: FAIL: store invariants broken while running\n");
      exit(1);
    }
    if (ts_now_ms() - t0 > DEADLINE_MS) {
      fprintf(stderr, "coord_stress: FAIL: children still running after %d ms\n", DEADLINE_MS);
      for (int i = 0; i < CHILDREN; i++) kill(pids[i], SIGKILL);
      exit(1);
    }
    usleep(5000);
  }
  if (failures) return 1;

  /* Every peer is gone: every lease must end. */
  kvs_store_info_t zero = {0};
  int ms = ts_wait_baseline(S.store, &zero, S.coord, 0, 5000);
  kvs_store_info_t in = ts_info(S.store);
  CHECK(ms >= 0, "leases left after every peer exited: reserved %" PRIu64 ", pins %" PRIu64
        ", xfers %" PRIu64 ", writing %" PRIu64 ", connections %u", in.reserved_bytes, in.pins,
        in.xfers, in.objects_writing, kvs_coord_connections(S.coord));
  check_accounting("at the end");
  CHECK(in.reserved_bytes == 0 && in.pins == 0 && in.xfers == 0 && in.objects_writing == 0,
        "store not idle at the end");
  CHECK(kvs_store_sweep(S.store, ts_now_ms() + 100000000ull) == 0, "a lease outlived its owner");
  CHECK(kvs__store_is_valid(S.store) && kvs__pool_is_valid(S.pool), "invariants broken at the end");
  int ready = 0;
  for (int i = 0; i < KEYSPACE; i++) {
    kvs_key_t k = key_of(i);
    int n = ts_local_count(S.store, &k, 1);
    if (n == 1) {
      int v = ts_local_verify(S.store, &k, 1);
      CHECK(v == 1, "READY object of key %d does not match its pattern (%d)", i, v);
      ready++;
    }
  }
  CHECK((uint64_t)ready == in.objects_ready, "%d keys READY, store says %" PRIu64, ready, in.objects_ready);
  /* Each child holds at most one transfer at a time (a dead one's until the server notices). */
  CHECK(max_pins <= 2 * CHILDREN * MAX_BATCH, "pins piled up: %" PRIu64, max_pins);
  CHECK(max_reserved <= 3 * CHILDREN * MAX_BATCH * size_of_class(CLASSES - 1),
        "reservations piled up: %" PRIu64 " bytes", max_reserved);
  CHECK(ts_stat(&S, KVS_STAT_coord_bad_frames) == 0, "malformed frames: %" PRIu64,
        ts_stat(&S, KVS_STAT_coord_bad_frames));
  CHECK(ts_stat(&S, KVS_STAT_coord_errors) == 0, "ERROR replies: %" PRIu64,
        ts_stat(&S, KVS_STAT_coord_errors));
  CHECK(ts_stat(&S, KVS_STAT_store_evictions) > 0, "the pool never filled: no eviction tested");
  CHECK(ts_stat(&S, KVS_STAT_store_busy) > 0, "no contention: no BUSY outcome");
  printf("coord_stress: ok: %d children x %d ops in %" PRIu64 " ms; requests %" PRIu64
         ", commits %" PRIu64 ", aborted objects %" PRIu64 ", evictions %" PRIu64 ", busy %" PRIu64
         ", no_space %" PRIu64 ", owner releases %" PRIu64 ", max reserved %" PRIu64
         " B, max pins %" PRIu64 ", %d objects READY and verified at the end\n",
         CHILDREN, OPS, ts_now_ms() - t0, ts_stat(&S, KVS_STAT_coord_requests),
         ts_stat(&S, KVS_STAT_store_commits), ts_stat(&S, KVS_STAT_store_aborted_objects),
         ts_stat(&S, KVS_STAT_store_evictions), ts_stat(&S, KVS_STAT_store_busy),
         ts_stat(&S, KVS_STAT_store_no_space), ts_stat(&S, KVS_STAT_store_owner_releases),
         max_reserved, max_pins, ready);
  ts_server_stop(&S, true);
  return 0;
}
