/* soak_client: an engine-like peer for scripts/soak. It stores, looks up and retrieves objects
 * in the group's `kvshim serve` (found by discovery: KVSHIM_RUN_DIR, KVSHIM_GROUP), through
 * kvshim's own peer client (core/wire/peer), until it is killed or --seconds runs out.
 *
 * Every object's size and bytes are a function of its key (pat_fill), so every retrieved byte
 * is checked (pat_check) without remembering what was stored: a byte that differs is a
 * corruption, reported on stdout and exit status 3 at once. Keys come from a small keyspace so
 * objects are found, evicted and stored again; some retrieves ask for runs of keys. One status
 * line per second on stdout:
 *   {"ops":N,"stores":N,"kept":N,"lookups":N,"retrieves":N,"objects":N,"verified_bytes":N,
 *    "misses":N,"errors":N,"bad":0}
 * usage: soak_client [--seed N] [--seconds N] [--keys N]
 *        soak_client --hold-pins BYTES   (fault tests: fill the group's cache peer with objects
 *        of 256 KiB, pin them all over SHM, print "held N" and wait to be killed: a pool that
 *        eviction cannot free) */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord_client.h"
#include "peer.h"

extern char **environ;

typedef struct soak {
  uint64_t ops, stores, kept, lookups, retrieves, objects, verified, misses, errors, bad;
} soak_t;

typedef struct rctx {
  soak_t *s;
  const kvs_key_t *keys;
} rctx_t;

static uint64_t rng_next(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

/* 4 KiB .. 256 KiB, a function of the key. */
static uint64_t size_of(kvs_key_t k) { return 4096u + (k.lo % 63u) * 4096u; }

static int verify_sink(void *ctx, size_t i, const kvs_layout_t *l, const void *b, uint64_t len) {
  rctx_t *r = ctx;
  kvs_key_t k = r->keys[i];
  if (len != size_of(k) || kvs_layout_nbytes(l) != len || pat_check(b, len, k)) {
    r->s->bad++;
    printf("{\"corrupt\":true,\"key\":\"%016" PRIx64 "%016" PRIx64 "\",\"len\":%" PRIu64 "}\n",
           k.hi, k.lo, len);
    fflush(stdout);
    _exit(3);
  }
  r->s->objects++;
  r->s->verified += len;
  return 0;
}

/* Store objects into the first peer found until it refuses one, pin them all, hold. */
static int hold_pins(uint64_t bytes) {
  const uint64_t LEN = 256u << 10;
  kvs_options_t o;
  kvs_options_load(&o, environ, 0);
  kvs_peers_config_t pc = {.opts = &o, .role = KVS_PROTO_ROLE_TOOL};
  kvs_peers_t *p = NULL;
  kvs_peer_info_t info;
  if (kvs_peers_create(&pc, &p) < 0 || kvs_peers_discover(p, true) < 1 ||
      kvs_peers_list(p, &info, 1) < 1)
    return 1;
  cc_t c;
  if (cc_open(&c, info.path, KVS_PROTO_STRATEGY_SHM) < 0) return 1;
  uint8_t *buf = malloc(LEN);
  kvs_layout_t l = kvs_layout_blob(LEN);
  uint32_t n = 0;
  for (; (uint64_t)n * LEN < bytes && n < CC_MAX; n++) {
    kvs_key_t k = tk(0xf111, n);
    pat_fill(buf, LEN, k);
    const void *bufs[1] = {buf};
    uint32_t committed = 0;
    if (cc_commit_inline(&c, 0, KVS_PROTO_KIND_CHUNKS, &l, &k, 1, bufs, &committed, NULL) < 0 ||
        committed != 1)
      break;
  }
  uint32_t held = 0;
  for (uint32_t i = 0; i < n; i++) {
    kvs_key_t k = tk(0xf111, i);
    static cc_pretr_t r; /* pins stay until the connection closes (the process is killed) */
    if (cc_prepare_retrieve(&c, KVS_PROTO_STRATEGY_SHM, &k, 1, &r) == 0 && r.n_found == 1) held++;
  }
  printf("held %u\n", held);
  fflush(stdout);
  for (;;) pause();
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--hold-pins")) return hold_pins(strtoull(argv[2], NULL, 0));
  uint64_t seed = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull, seconds = 0, nkeys = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 0) | 1;
    else if (!strcmp(argv[i], "--seconds")) seconds = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "--keys")) nkeys = strtoull(argv[i + 1], NULL, 0);
    else {
      fprintf(stderr, "usage: soak_client [--seed N] [--seconds N] [--keys N]\n");
      return 2;
    }
  }
  if (!seed) seed = 1;
  kvs_options_t o;
  kvs_options_load(&o, environ, 0);
  kvs_stats_t st;
  kvs_stats_init(&st);
  kvs_peers_config_t pc = {.opts = &o, .role = KVS_PROTO_ROLE_ENGINE, .stats = &st};
  kvs_peers_t *p = NULL;
  int rc = kvs_peers_create(&pc, &p);
  if (rc < 0) {
    fprintf(stderr, "soak_client: kvs_peers_create: %s\n", strerror(-rc));
    return 1;
  }
  soak_t s = {0};
  uint8_t *buf = malloc(size_of((kvs_key_t){62, 0}));
  uint64_t start = ts_now_ms(), last = start;
  enum { RUN = 8 };
  for (;;) {
    uint64_t now = ts_now_ms();
    if (seconds && now - start >= seconds * 1000) break;
    if (now - last >= 1000) {
      last = now;
      printf("{\"ops\":%" PRIu64 ",\"stores\":%" PRIu64 ",\"kept\":%" PRIu64 ",\"lookups\":%" PRIu64
             ",\"retrieves\":%" PRIu64 ",\"objects\":%" PRIu64 ",\"verified_bytes\":%" PRIu64
             ",\"misses\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"bad\":%" PRIu64 "}\n",
             s.ops, s.stores, s.kept, s.lookups, s.retrieves, s.objects, s.verified, s.misses,
             s.errors, s.bad);
      fflush(stdout);
      kvs_peers_discover(p, false);
    }
    kvs_key_t keys[RUN];
    uint64_t first = rng_next(&seed) % nkeys;
    for (int i = 0; i < RUN; i++) keys[i] = tk(0x50a4, (first + (uint64_t)i) % nkeys);
    unsigned op = (unsigned)(rng_next(&seed) % 10);
    s.ops++;
    if (op < 4) { /* store one object */
      uint64_t len = size_of(keys[0]);
      pat_fill(buf, len, keys[0]);
      kvs_layout_t l = kvs_layout_blob(len);
      const void *bufs[1] = {buf};
      rc = kvs_peers_store(p, 0, keys, 1, &l, false, bufs, NULL);
      s.stores++;
      if (rc > 0) s.kept++;
      else if (rc < 0) s.errors++;
    } else if (op < 6) {
      uint64_t best = 0;
      rc = kvs_peers_lookup(p, keys, RUN, &best);
      s.lookups++;
      if (rc < 0) s.errors++;
    } else { /* retrieve one key or a run */
      size_t n = op < 9 ? 1 : RUN;
      rctx_t r = {&s, keys};
      rc = kvs_peers_retrieve(p, 0, keys, n, verify_sink, &r);
      s.retrieves++;
      if (rc == 0) s.misses++;
      else if (rc < 0) s.errors++;
    }
  }
  free(buf);
  kvs_peers_destroy(p);
  return 0;
}
