/* kvshim remote: see remote.h. */
#include "remote.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "internal.h"
#include "log.h"
#include "prim.h"
#include "redis.h"

#define WRITE_BATCH 32               /* objects per pipeline on the write path */
#define BREAKER_FAILS 3              /* failures in a row that open the breaker */
#define BREAKER_MIN_MS 500u
#define BREAKER_MAX_MS 30000u

_Static_assert(KVS_REMOTE_HDR_SIZE == 64 + 8 * KVS_LAYOUT_MAX_DIMS, "value header layout");

/* One unit of work, a WRITE or a FETCH by the queue it is on. WRITE: one object pinned by xfer,
 * found under keys[0] (its primary), with keys[1..n) its aliases (object) — or one chunk
 * (n == 1). FETCH: a deferred LOOKUP. */
typedef struct job {
  struct job *next;
  kvs_xfer_t xfer;      /* WRITE: the read pin on the object */
  uint64_t token;       /* FETCH */
  uint64_t deadline_ms; /* FETCH (kvs__now_ms clock) */
  uint32_t found, n;    /* FETCH: keys[found..n) are wanted */
  kvs_key_t keys[];
} job_t;

struct kvs_remote {
  kvs_store_t *store;
  kvs_stats_t *stats;
  kvs_owner_t owner;   /* pins of queued writes and reservations of fetches */
  uint64_t producer;
  int64_t ttl_ms;
  kvs_redis_config_t rcfg;
  char password[256];  /* from KVSHIM_REMOTE_PASSWORD_FILE; never logged */
  kvs_coord_remote_t hooks;
  /* queue: guarded by lock */
  pthread_mutex_t lock;
  pthread_cond_t cond, idle;
  job_t *fetch_head, *fetch_tail, *write_head, *write_tail;
  uint32_t n_writes, q_cap;
  unsigned busy;       /* threads working on a job */
  bool stop;
  kvs_coord_t *coord;  /* completions go there; guarded by lock */
  /* breaker: guarded by lock */
  unsigned fails;
  uint64_t open_until_ms;
  uint32_t backoff_ms;
  unsigned n_threads;
  pthread_t threads[64];
};

/* ---- value format --------------------------------------------------------------------------- */

void kvs_remote_key_name(kvs_key_t key, char *buf) {
  memcpy(buf, KVS_REMOTE_KEY_PREFIX, sizeof KVS_REMOTE_KEY_PREFIX - 1);
  kvs_key_format(key, buf + sizeof KVS_REMOTE_KEY_PREFIX - 1);
}

void kvs_remote_header(uint8_t h[KVS_REMOTE_HDR_SIZE], kvs_key_t key, unsigned kind,
                       const kvs_layout_t *layout, const void *payload, uint64_t len,
                       uint64_t producer, uint64_t created_ms) {
  memset(h, 0, KVS_REMOTE_HDR_SIZE);
  kvs__put32(h, KVS_REMOTE_MAGIC);
  kvs__put16(h + 4, KVS_REMOTE_VERSION);
  kvs__put16(h + 6, (uint16_t)kind);
  kvs__put64(h + 8, key.lo);
  kvs__put64(h + 16, key.hi);
  kvs__put64(h + 24, len);
  kvs__put64(h + 32, XXH3_64bits(payload, (size_t)len));
  kvs__put64(h + 40, producer);
  kvs__put64(h + 48, created_ms);
  if (layout) kvs__layout_put(h + 56, h + 64, layout);
}

/* Every check of a value of len bytes that its header alone allows (all but the hash): 0 and
 * its kind, layout and payload length, or -EBADMSG. */
static int check_header(const uint8_t *h, size_t len, kvs_key_t key, unsigned *kind,
                        kvs_layout_t *layout, uint64_t *payload_len) {
  if (!h || len < KVS_REMOTE_HDR_SIZE) return -EBADMSG;
  if (kvs__get32(h) != KVS_REMOTE_MAGIC || kvs__get16(h + 4) != KVS_REMOTE_VERSION) return -EBADMSG;
  unsigned k = kvs__get16(h + 6);
  if (k > KVS_REMOTE_KIND_ALIAS) return -EBADMSG;
  if (kvs__get64(h + 8) != key.lo || kvs__get64(h + 16) != key.hi) return -EBADMSG;
  uint64_t n = kvs__get64(h + 24);
  if (n != len - KVS_REMOTE_HDR_SIZE) return -EBADMSG;
  kvs_layout_t l;
  KVS_TRY(kvs__layout_get(h + 56, h + 64, &l));
  if (k == KVS_REMOTE_KIND_ALIAS ? (n != sizeof(kvs_key_t) || l.ndim != 0)
                                 : kvs_layout_nbytes(&l) != n)
    return -EBADMSG;
  *kind = k;
  *layout = l;
  *payload_len = n;
  return 0;
}

/* The payload hash a checked header names. */
static uint64_t header_hash(const uint8_t *h) { return kvs__get64(h + 32); }

int kvs_remote_check(const void *value, size_t len, kvs_key_t key, unsigned *kind,
                     kvs_layout_t *layout, const uint8_t **payload, uint64_t *payload_len) {
  const uint8_t *h = value;
  KVS_TRY(check_header(h, len, key, kind, layout, payload_len));
  const uint8_t *p = h + KVS_REMOTE_HDR_SIZE;
  if (XXH3_64bits(p, (size_t)*payload_len) != header_hash(h)) return -EBADMSG;
  *payload = p;
  return 0;
}

static uint64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- breaker ------------------------------------------------------------------------------- */

/* May a call go to the server now? (lock held) */
static bool breaker_allows(kvs_remote_t *r, uint64_t now) { return now >= r->open_until_ms; }

static void breaker_result(kvs_remote_t *r, bool ok) {
  pthread_mutex_lock(&r->lock);
  if (ok) {
    r->fails = 0;
    r->backoff_ms = BREAKER_MIN_MS;
  } else if (++r->fails >= BREAKER_FAILS && breaker_allows(r, kvs__now_ms())) {
    r->open_until_ms = kvs__now_ms() + r->backoff_ms;
    kvs_log_warn("remote tier: %u failures in a row: skipped for %u ms", r->fails, r->backoff_ms);
    r->backoff_ms = r->backoff_ms * 2 > BREAKER_MAX_MS ? BREAKER_MAX_MS : r->backoff_ms * 2;
    kvs_stats_inc(r->stats, KVS_STAT_remote_breaker_opens);
  }
  pthread_mutex_unlock(&r->lock);
}

static void count_failure(kvs_remote_t *r, int err) {
  kvs_stats_inc(r->stats, err == -ETIMEDOUT ? KVS_STAT_remote_timeouts : KVS_STAT_remote_errors);
}

/* ---- one I/O thread's connection ------------------------------------------------------------ */

typedef struct worker {
  kvs_remote_t *r;
  kvs_redis_t *redis; /* NULL until connected */
} worker_t;

static kvs_redis_t *conn_of(worker_t *w) {
  if (w->redis) return w->redis;
  char err[256] = "";
  int rc = kvs_redis_create(&w->r->rcfg, &w->redis, err, sizeof err);
  if (rc < 0) {
    w->redis = NULL;
    kvs_log_info("remote tier: %s", err);
    count_failure(w->r, rc);
    breaker_result(w->r, false);
  }
  return w->redis;
}

/* A pipeline failed as a whole or in part: count it, feed the breaker. */
static void exec_outcome(worker_t *w, int rc, const kvs_redis_result_t *res, size_t n) {
  int err = 0;
  if (rc < 0) err = rc;
  for (size_t i = 0; i < n && !err && res; i++)
    if (res[i].type == KVS_REDIS_FAILED) err = res[i].err ? res[i].err : -EIO;
  if (err) count_failure(w->r, err);
  breaker_result(w->r, err == 0);
}

static void del_key(worker_t *w, kvs_key_t key) {
  char name[KVS_REMOTE_KEY_LEN + 1];
  kvs_remote_key_name(key, name);
  const char *argv[2] = {"DEL", name};
  size_t lens[2] = {3, KVS_REMOTE_KEY_LEN};
  kvs_redis_cmd_t cmd = {.argc = 2, .argv = argv, .argvlen = lens, .key_arg = 1};
  kvs_redis_result_t res;
  if (w->redis) {
    kvs_redis_exec(w->redis, &cmd, 1, &res);
    kvs_redis_results_release(w->redis);
  }
}

/* ---- write path ---------------------------------------------------------------------------- */

/* One SET of a batch: its argv lives here until the pipeline ran. The value is argument 2,
 * given in two parts: the header (here) and the payload, straight from the pinned extent (an
 * alias's payload, the primary's key, lives here too). */
typedef struct set_cmd {
  char name[KVS_REMOTE_KEY_LEN + 1];
  char ttl[24];
  const char *argv[6];
  size_t lens[6];
  uint8_t hdr[KVS_REMOTE_HDR_SIZE];
  uint8_t prim[sizeof(kvs_key_t)];
  kvs_redis_part_t value[2];
  const kvs_redis_part_t *parts[6];
  int nparts[6];
  size_t job;       /* index of its job in the batch */
  size_t value_len; /* 0: not sent */
} set_cmd_t;

/* DEL the keys of a job whose pin did not hold through the send: what was SET may be torn
 * (its hash would reject it on read; this saves the reader the bad value). */
static void del_job_keys(worker_t *w, const job_t *jb) {
  for (uint32_t a = 0; a < jb->n; a++) del_key(w, jb->keys[a]);
}

static void write_batch(worker_t *w, job_t **jobs, size_t n_jobs) {
  kvs_remote_t *r = w->r;
  uint8_t *base = kvs_pool_base(kvs_store_pool(r->store));
  kvs_object_view_t views[WRITE_BATCH];
  bool ok[WRITE_BATCH];
  size_t n_cmds = 0;
  for (size_t j = 0; j < n_jobs; j++) {
    ok[j] = kvs_store_read_pinned(r->store, r->owner, jobs[j]->xfer, &views[j], 1) == 1;
    if (ok[j]) n_cmds += jobs[j]->n;
  }
  set_cmd_t *cmds = calloc(n_cmds ? n_cmds : 1, sizeof *cmds);
  kvs_redis_cmd_t *rcmds = calloc(n_cmds ? n_cmds : 1, sizeof *rcmds);
  kvs_redis_result_t *res = calloc(n_cmds ? n_cmds : 1, sizeof *res);
  bool mem = cmds && rcmds && res;
  size_t c = 0;
  uint64_t now = unix_ms();
  for (size_t j = 0; j < n_jobs; j++) {
    job_t *jb = jobs[j];
    if (!ok[j] || !mem) {
      kvs_store_release(r->store, r->owner, jb->xfer);
      kvs_stats_inc(r->stats, KVS_STAT_remote_queue_drops);
      ok[j] = false;
      continue;
    }
    /* The object: header, then its bytes, sent from the extent while the pin holds; its
     * aliases name it. */
    const uint8_t *payload = base + views[j].extent.offset;
    uint64_t len = views[j].extent.length;
    for (uint32_t a = 0; a < jb->n; a++, c++) {
      set_cmd_t *sc = &cmds[c];
      kvs__put64(sc->prim, jb->keys[0].lo);
      kvs__put64(sc->prim + 8, jb->keys[0].hi);
      const uint8_t *src = a ? sc->prim : payload;
      uint64_t n = a ? sizeof sc->prim : len;
      kvs_remote_header(sc->hdr, jb->keys[a], a ? KVS_REMOTE_KIND_ALIAS : KVS_REMOTE_KIND_OBJECT,
                        a ? NULL : &views[j].layout, src, n, r->producer, now);
      kvs_remote_key_name(jb->keys[a], sc->name);
      sc->value[0] = (kvs_redis_part_t){sc->hdr, KVS_REMOTE_HDR_SIZE};
      sc->value[1] = (kvs_redis_part_t){src, (size_t)n};
      sc->job = j;
      sc->value_len = KVS_REMOTE_HDR_SIZE + n;
    }
  }
  size_t m = 0;
  for (size_t i = 0; mem && i < c; i++) {
    set_cmd_t *s = &cmds[i];
    int tl = snprintf(s->ttl, sizeof s->ttl, "%lld", (long long)r->ttl_ms);
    s->argv[0] = "SET", s->lens[0] = 3;
    s->argv[1] = s->name, s->lens[1] = KVS_REMOTE_KEY_LEN;
    s->argv[2] = "", s->lens[2] = 0; /* given in parts */
    s->argv[3] = "NX", s->lens[3] = 2;
    s->argv[4] = "PX", s->lens[4] = 2;
    s->argv[5] = s->ttl, s->lens[5] = (size_t)tl;
    s->parts[2] = s->value;
    s->nparts[2] = 2;
    rcmds[m++] = (kvs_redis_cmd_t){.argc = 6, .argv = s->argv, .argvlen = s->lens, .key_arg = 1,
                                   .parts = s->parts, .nparts = s->nparts};
  }
  kvs_redis_t *redis = m ? conn_of(w) : NULL;
  if (m && !redis) kvs_stats_add(r->stats, KVS_STAT_remote_queue_drops, m);
  int rc = redis ? kvs_redis_exec(redis, rcmds, m, res) : -ENOTCONN;
  if (redis) exec_outcome(w, rc, rc < 0 ? NULL : res, m);
  for (size_t i = 0; redis && rc >= 0 && i < m; i++) {
    const kvs_redis_result_t *x = &res[i];
    if (x->type == KVS_REDIS_STATUS) {
      kvs_stats_inc(r->stats, KVS_STAT_remote_writes);
      kvs_stats_add(r->stats, KVS_STAT_remote_bytes_out, cmds[i].value_len);
    } else if (x->type == KVS_REDIS_NIL) {
      kvs_stats_inc(r->stats, KVS_STAT_remote_write_present);
    } else if (x->type == KVS_REDIS_ERROR) {
      kvs_stats_inc(r->stats, KVS_STAT_remote_errors);
      kvs_log_info("remote tier: SET refused: %.*s", (int)(x->len > 200 ? 200 : x->len), x->str);
    }
  }
  if (redis) kvs_redis_results_release(redis);
  /* Unpin now that every byte was sent or dropped. A pin still live now was live during the
   * send (a reclaimed lease never comes back under the same id), so what was sent is good;
   * otherwise the job's keys are deleted and it counts as a drop. */
  for (size_t j = 0; j < n_jobs; j++) {
    if (!ok[j]) continue;
    if (kvs_store_release(r->store, r->owner, jobs[j]->xfer) < 0) {
      if (redis) del_job_keys(w, jobs[j]);
      kvs_stats_inc(r->stats, KVS_STAT_remote_queue_drops);
    }
  }
  free(cmds);
  free(rcmds);
  free(res);
}

/* ---- read path ----------------------------------------------------------------------------- */

/* A GET whose value is received straight into a reserved extent (kvs_redis_sink_t): the
 * header is checked as soon as it is in, the extent reserved under keys[0] (+ aliases
 * keys[1..n)), the payload received into it, its hash checked after (obj_finish). */
enum { OS_NONE, OS_RESERVED, OS_PRESENT, OS_NOROOM, OS_ALIAS, OS_BAD };
typedef struct obj_sink {
  kvs_remote_t *r;
  const kvs_key_t *keys; /* keys[0]: the key read; keys[1..n): aliases to bind to it */
  size_t n;
  int state;             /* OS_* */
  uint64_t hash, plen;
  kvs_xfer_t xfer;       /* OS_RESERVED */
  uint8_t *dst;
} obj_sink_t;

/* Reserve an extent for an object under keys[0..n): OS_RESERVED (xfer, dst), OS_PRESENT
 * (already there with every key bound) or OS_NOROOM. A primary the pool already holds cannot
 * take new aliases (the store binds aliases only when it publishes), so the aliases then get
 * their own copy, primary keys[1]. */
static int reserve_keys(obj_sink_t *s, const kvs_layout_t *layout) {
  kvs_remote_t *r = s->r;
  const kvs_key_t *keys = s->keys;
  size_t n = s->n;
  for (int attempt = 0; attempt < 2 && n > 0; attempt++, keys++, n--) {
    uint8_t outcome = 0;
    kvs_extent_t ext;
    int rc = kvs_store_reserve_object(r->store, r->owner, keys, n, layout, 0, &outcome, &ext,
                                      &s->xfer);
    if (rc == 1) {
      s->dst = kvs_pool_base(kvs_store_pool(r->store)) + ext.offset;
      return OS_RESERVED;
    }
    if (outcome != KVS_RES_PRESENT) return OS_NOROOM;
    if (n == 1 || kvs_store_lookup(r->store, r->owner, keys + 1, n - 1, false, NULL) == (int)n - 1)
      return OS_PRESENT; /* every alias is bound already */
  }
  return OS_NOROOM;
}

static void *obj_dest(void *ctx, size_t len, const void *head, size_t head_len) {
  obj_sink_t *s = ctx;
  unsigned kind = 0;
  kvs_layout_t layout;
  if (head_len < KVS_REMOTE_HDR_SIZE ||
      check_header(head, len, s->keys[0], &kind, &layout, &s->plen) < 0) {
    s->state = OS_BAD;
    return NULL;
  }
  if (kind == KVS_REMOTE_KIND_ALIAS) {
    s->state = OS_ALIAS;
    return NULL;
  }
  s->hash = header_hash(head);
  s->state = reserve_keys(s, &layout);
  return s->state == OS_RESERVED ? s->dst : NULL;
}

/* The GET answered x: 1 the object is in the pool (received and its hash good: committed; or
 * present already), 0 not (reservation undone), -1 a bad value (undone). */
static int obj_finish(obj_sink_t *s, const kvs_redis_result_t *x) {
  int st = s->state;
  s->state = OS_NONE;
  if (st == OS_BAD) return -1;
  if (st == OS_PRESENT) return 1;
  if (st != OS_RESERVED) return 0;
  bool received = x->type == KVS_REDIS_STRING;
  if (received && XXH3_64bits(s->dst, (size_t)s->plen) == s->hash)
    return kvs_store_commit(s->r->store, s->r->owner, s->xfer) == 0 ? 1 : 0;
  kvs_store_abort(s->r->store, s->r->owner, s->xfer);
  return received ? -1 : 0;
}

/* Undo the reservations of sinks not finished (a run that ended before them). */
static void sinks_abort(obj_sink_t *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (s[i].state == OS_RESERVED) kvs_store_abort(s[i].r->store, s[i].r->owner, s[i].xfer);
    s[i].state = OS_NONE;
  }
}

/* Pipeline one command per key: argv {verb, name[, extra...]}. */
static int exec_per_key(worker_t *w, const char *verb, const kvs_key_t *keys, size_t n,
                        const char *a2, const char *a3, const kvs_redis_sink_t *sinks,
                        kvs_redis_result_t *res) {
  char (*names)[KVS_REMOTE_KEY_LEN + 1] = malloc(n * sizeof *names);
  const char **argv = malloc(n * 4 * sizeof *argv);
  size_t *lens = malloc(n * 4 * sizeof *lens);
  kvs_redis_cmd_t *cmds = malloc(n * sizeof *cmds);
  int rc = -ENOMEM;
  kvs_redis_t *redis = NULL;
  if (names && argv && lens && cmds && (redis = conn_of(w)) != NULL) {
    int argc = a2 ? 4 : 2;
    for (size_t i = 0; i < n; i++) {
      kvs_remote_key_name(keys[i], names[i]);
      const char **av = argv + 4 * i;
      size_t *lv = lens + 4 * i;
      av[0] = verb, lv[0] = strlen(verb);
      av[1] = names[i], lv[1] = KVS_REMOTE_KEY_LEN;
      if (a2) av[2] = a2, lv[2] = strlen(a2), av[3] = a3, lv[3] = strlen(a3);
      cmds[i] = (kvs_redis_cmd_t){.argc = argc, .argv = av, .argvlen = lv, .key_arg = 1,
                                  .sink = sinks ? &sinks[i] : NULL};
    }
    rc = kvs_redis_exec(redis, cmds, n, res);
    exec_outcome(w, rc, rc < 0 ? NULL : res, n);
  } else if (names && argv && lens && cmds) {
    rc = -ENOTCONN;
  }
  free(names);
  free(argv);
  free(lens);
  free(cmds);
  return rc;
}

/* A value that failed a check: a miss, deleted, counted. */
static void bad_value(worker_t *w, kvs_key_t key) {
  kvs_stats_inc(w->r->stats, KVS_STAT_remote_bad_values);
  char hex[KVS_KEY_HEX_LEN + 1];
  kvs_key_format(key, hex);
  kvs_log_warn("remote tier: value of %s failed its check: deleted", hex);
  del_key(w, key);
}

#define PROBE_BATCH 256                      /* header reads per pipeline */
#define PROBE_LAST (KVS_REMOTE_HDR_SIZE + 15) /* GETRANGE end: header + an alias's payload */
#define OBJECT_BATCH 16                      /* whole values per pipeline */

/* What phase 1 learnt of one key: the object it names (itself, or an alias's primary). */
typedef struct probe {
  kvs_key_t prim;
  bool done;
} probe_t;

/* Phase 1: read the header (and an alias's payload) of keys[0..n) until the first key that is
 * missing or bad. Returns the run length; pr[i] filled for i < run. */
static size_t probe_run(worker_t *w, const kvs_key_t *keys, size_t n, probe_t *pr,
                        uint64_t deadline_ms) {
  kvs_remote_t *r = w->r;
  kvs_redis_result_t *res = malloc(PROBE_BATCH * sizeof *res);
  char last[16];
  snprintf(last, sizeof last, "%u", (unsigned)PROBE_LAST);
  size_t run = 0;
  while (res && run < n) {
    if (kvs__now_ms() >= deadline_ms) break;
    size_t b = n - run < PROBE_BATCH ? n - run : PROBE_BATCH;
    if (exec_per_key(w, "GETRANGE", keys + run, b, "0", last, NULL, res) < 0) break;
    size_t i = 0;
    for (; i < b; i++) {
      const kvs_redis_result_t *x = &res[i];
      kvs_key_t key = keys[run + i];
      if (x->type == KVS_REDIS_STRING && x->len == 0) { /* GETRANGE of a missing key */
        kvs_stats_inc(r->stats, KVS_STAT_remote_misses);
        break;
      }
      if (x->type != KVS_REDIS_STRING) {
        if (x->type != KVS_REDIS_FAILED) kvs_stats_inc(r->stats, KVS_STAT_remote_errors);
        break;
      }
      const uint8_t *h = (const uint8_t *)x->str;
      bool ok = x->len >= KVS_REMOTE_HDR_SIZE && kvs__get32(h) == KVS_REMOTE_MAGIC &&
                kvs__get16(h + 4) == KVS_REMOTE_VERSION && kvs__get64(h + 8) == key.lo &&
                kvs__get64(h + 16) == key.hi && kvs__get16(h + 6) <= KVS_REMOTE_KIND_ALIAS;
      unsigned kind = 0;
      kvs_layout_t layout;
      const uint8_t *payload = NULL;
      uint64_t plen = 0;
      if (ok && kvs__get16(h + 6) == KVS_REMOTE_KIND_ALIAS)
        ok = kvs_remote_check(x->str, x->len, key, &kind, &layout, &payload, &plen) == 0;
      else if (ok) /* an object: the probe holds min(value, PROBE_LAST + 1) bytes */
        ok = x->len == (kvs__get64(h + 24) + KVS_REMOTE_HDR_SIZE < PROBE_LAST + 1
                            ? kvs__get64(h + 24) + KVS_REMOTE_HDR_SIZE : PROBE_LAST + 1);
      if (!ok) {
        kvs_redis_results_release(w->redis);
        bad_value(w, key);
        free(res);
        return run + i;
      }
      kvs_stats_add(r->stats, KVS_STAT_remote_bytes_in, x->len);
      pr[run + i].prim = kind == KVS_REMOTE_KIND_ALIAS
                             ? (kvs_key_t){kvs__get64(payload), kvs__get64(payload + 8)} : key;
      pr[run + i].done = false;
    }
    kvs_redis_results_release(w->redis);
    run += i;
    if (i < b) break;
  }
  free(res);
  return run;
}

/* Fetch keys[found..n) in order until the first miss into the store; returns the keys stored. */
/* The common case, a run of plain objects (chunks): GET them whole, OBJECT_BATCH at a time,
 * and store each as it checks. Stops at the first key that is not a plain object. Returns the
 * keys stored; *alias_at gets the index of the first alias met (n when none), *end whether the
 * run ended (a miss, a bad value, a failure, the deadline). */
static size_t fetch_objects(worker_t *w, const kvs_key_t *keys, size_t n, uint64_t deadline_ms,
                            size_t *alias_at, bool *end) {
  kvs_remote_t *r = w->r;
  kvs_redis_result_t res[OBJECT_BATCH];
  size_t i = 0;
  *alias_at = n;
  *end = true;
  while (i < n) {
    if (kvs__now_ms() >= deadline_ms) {
      kvs_stats_inc(r->stats, KVS_STAT_remote_timeouts);
      return i;
    }
    size_t b = n - i < OBJECT_BATCH ? n - i : OBJECT_BATCH, j = 0;
    obj_sink_t os[OBJECT_BATCH];
    kvs_redis_sink_t sk[OBJECT_BATCH];
    for (size_t k = 0; k < b; k++) {
      os[k] = (obj_sink_t){.r = r, .keys = &keys[i + k], .n = 1};
      sk[k] = (kvs_redis_sink_t){obj_dest, &os[k], KVS_REMOTE_HDR_SIZE};
    }
    if (exec_per_key(w, "GET", keys + i, b, NULL, NULL, sk, res) < 0) {
      sinks_abort(os, b);
      return i;
    }
    bool stop = false;
    for (; j < b && !stop; j++) {
      const kvs_redis_result_t *x = &res[j];
      if (x->type == KVS_REDIS_NIL) {
        kvs_stats_inc(r->stats, KVS_STAT_remote_misses);
        break;
      }
      if (x->type != KVS_REDIS_STRING) {
        if (x->type != KVS_REDIS_FAILED) kvs_stats_inc(r->stats, KVS_STAT_remote_errors);
        break;
      }
      if (os[j].state == OS_ALIAS) { /* the grouping path takes it from here */
        *alias_at = i + j;
        *end = false;
        break;
      }
      int got = obj_finish(&os[j], x);
      if (got < 0) {
        sinks_abort(os, b);
        kvs_redis_results_release(w->redis);
        bad_value(w, keys[i + j]);
        return i + j;
      }
      kvs_stats_add(r->stats, KVS_STAT_remote_bytes_in, x->len);
      stop = got != 1;
      if (!stop) kvs_stats_inc(r->stats, KVS_STAT_remote_hits);
      else j--; /* not stored: the run ends before it */
    }
    sinks_abort(os, b);
    kvs_redis_results_release(w->redis);
    if (j < b || stop) return i + j;
    i += b;
  }
  return i;
}

static size_t fetch(worker_t *w, const job_t *jb) {
  kvs_remote_t *r = w->r;
  kvs_stats_inc(r->stats, KVS_STAT_remote_lookups);
  /* What the pool holds already (another lookup may have brought it) is not asked for. */
  size_t start = jb->found;
  int have = kvs_store_lookup(r->store, r->owner, &jb->keys[start], jb->n - start, false, NULL);
  if (have > 0) start += (size_t)have;
  if (start >= jb->n) return 0;
  size_t alias_at = 0;
  bool end = true;
  size_t direct = fetch_objects(w, &jb->keys[start], jb->n - start, jb->deadline_ms, &alias_at,
                                &end);
  if (end) return direct;
  /* Aliases: read every header of the rest of the run first, then each object once with every
   * key that names it (an alias is bound only when its object is published). */
  start += alias_at;
  size_t n = jb->n - start;
  const kvs_key_t *keys = &jb->keys[start];
  probe_t *pr = malloc(n * sizeof *pr);
  kvs_key_t *group = malloc((n + OBJECT_BATCH) * sizeof *group);
  kvs_redis_result_t res[OBJECT_BATCH];
  size_t got = 0, run = pr && group ? probe_run(w, keys, n, pr, jb->deadline_ms) : 0;
  /* Phase 2: each object of the run, once, with every key of the run that names it. */
  size_t next = 0;
  bool stop = false;
  while (!stop && next < run) {
    if (kvs__now_ms() >= jb->deadline_ms) {
      kvs_stats_inc(r->stats, KVS_STAT_remote_timeouts);
      break;
    }
    kvs_key_t prims[OBJECT_BATCH];
    size_t firsts[OBJECT_BATCH], m = 0;
    for (size_t i = next; i < run && m < OBJECT_BATCH; i++) {
      if (pr[i].done) continue;
      bool seen = false;
      for (size_t k = 0; k < m && !seen; k++) seen = kvs_key_eq(prims[k], pr[i].prim);
      if (!seen) firsts[m] = i, prims[m++] = pr[i].prim;
    }
    if (m == 0) break;
    /* Each object's keys: its primary, then the run's aliases naming it (disjoint groups). */
    obj_sink_t os[OBJECT_BATCH];
    kvs_redis_sink_t sk[OBJECT_BATCH];
    size_t o = 0;
    for (size_t g = 0; g < m; g++) {
      size_t first = o;
      group[o++] = prims[g];
      for (size_t i = firsts[g]; i < run; i++)
        if (!pr[i].done && kvs_key_eq(pr[i].prim, prims[g]) && !kvs_key_eq(keys[i], prims[g]))
          group[o++] = keys[i];
      os[g] = (obj_sink_t){.r = r, .keys = &group[first], .n = o - first};
      sk[g] = (kvs_redis_sink_t){obj_dest, &os[g], KVS_REMOTE_HDR_SIZE};
    }
    if (exec_per_key(w, "GET", prims, m, NULL, NULL, sk, res) < 0) {
      sinks_abort(os, m);
      break;
    }
    bool released = false;
    for (size_t g = 0; g < m && !stop; g++) {
      const kvs_redis_result_t *x = &res[g];
      bool bad = false, ok = x->type == KVS_REDIS_STRING;
      if (ok) {
        int fin = os[g].state == OS_ALIAS ? -1 : obj_finish(&os[g], x); /* an alias of an alias */
        bad = fin < 0;
        ok = fin == 1;
        if (!bad) kvs_stats_add(r->stats, KVS_STAT_remote_bytes_in, x->len);
      } else if (x->type == KVS_REDIS_NIL) {
        kvs_stats_inc(r->stats, KVS_STAT_remote_misses);
      } else if (x->type != KVS_REDIS_FAILED) {
        kvs_stats_inc(r->stats, KVS_STAT_remote_errors);
      }
      size_t nk = os[g].n;
      for (size_t i = firsts[g]; i < run; i++)
        if (!pr[i].done && kvs_key_eq(pr[i].prim, prims[g])) pr[i].done = true;
      if (ok) {
        /* every run key of the group is served: the primary itself only if it was asked */
        size_t served = nk - 1;
        for (size_t i = firsts[g]; i < run; i++)
          if (kvs_key_eq(keys[i], prims[g])) served++;
        kvs_stats_add(r->stats, KVS_STAT_remote_hits, served);
        got += served;
      } else {
        stop = true; /* the run ends at this object's first key */
        if (bad) {
          kvs_redis_results_release(w->redis);
          released = true;
          bad_value(w, prims[g]);
        }
      }
    }
    sinks_abort(os, m);
    if (!released) kvs_redis_results_release(w->redis);
    while (next < run && pr[next].done) next++;
  }
  free(pr);
  free(group);
  return direct + got;
}

/* ---- threads ------------------------------------------------------------------------------- */

static void finish_fetch(kvs_remote_t *r, uint64_t token) {
  pthread_mutex_lock(&r->lock);
  kvs_coord_t *coord = r->coord;
  if (coord) kvs_coord_remote_done(coord, token); /* never blocks */
  pthread_mutex_unlock(&r->lock);
}

static void *io_main(void *arg) {
  kvs_remote_t *r = arg;
  worker_t w = {r, NULL};
  pthread_mutex_lock(&r->lock);
  for (;;) {
    while (!r->stop && !r->fetch_head && !r->write_head) pthread_cond_wait(&r->cond, &r->lock);
    if (r->fetch_head) {
      job_t *jb = KVS__FIFO_POP(r->fetch_head, r->fetch_tail);
      bool allowed = breaker_allows(r, kvs__now_ms());
      r->busy++;
      pthread_mutex_unlock(&r->lock);
      if (allowed) fetch(&w, jb);
      finish_fetch(r, jb->token);
      free(jb);
      pthread_mutex_lock(&r->lock);
      r->busy--;
      pthread_cond_broadcast(&r->idle);
      continue;
    }
    if (r->write_head) {
      job_t *jobs[WRITE_BATCH];
      size_t n = 0;
      while (r->write_head && n < WRITE_BATCH) {
        jobs[n++] = r->write_head;
        r->write_head = r->write_head->next;
        r->n_writes--;
      }
      if (!r->write_head) r->write_tail = NULL;
      bool allowed = breaker_allows(r, kvs__now_ms());
      r->busy++;
      pthread_mutex_unlock(&r->lock);
      if (allowed) {
        write_batch(&w, jobs, n);
      } else { /* breaker open: drop, unpin */
        for (size_t i = 0; i < n; i++) kvs_store_release(r->store, r->owner, jobs[i]->xfer);
        kvs_stats_add(r->stats, KVS_STAT_remote_queue_drops, n);
      }
      for (size_t i = 0; i < n; i++) free(jobs[i]);
      pthread_mutex_lock(&r->lock);
      r->busy--;
      pthread_cond_broadcast(&r->idle);
      continue;
    }
    if (r->stop) break;
  }
  pthread_mutex_unlock(&r->lock);
  kvs_redis_destroy(w.redis);
  return NULL;
}

/* ---- coordinator hooks (coordinator thread: never block) ------------------------------------ */

static int hook_fetch(void *ctx, const kvs_key_t *keys, size_t found, size_t n,
                      uint64_t deadline_ms, uint64_t token) {
  kvs_remote_t *r = ctx;
  job_t *jb = malloc(sizeof *jb + n * sizeof(kvs_key_t));
  if (!jb) return -ENOMEM;
  memset(jb, 0, sizeof *jb);
  jb->token = token;
  jb->deadline_ms = deadline_ms;
  jb->found = (uint32_t)found;
  jb->n = (uint32_t)n;
  memcpy(jb->keys, keys, n * sizeof(kvs_key_t));
  pthread_mutex_lock(&r->lock);
  if (r->stop || !breaker_allows(r, kvs__now_ms())) {
    pthread_mutex_unlock(&r->lock);
    free(jb);
    return -EAGAIN; /* answered from the pool at once */
  }
  KVS__FIFO_PUSH(r->fetch_head, r->fetch_tail, jb);
  pthread_cond_signal(&r->cond);
  pthread_mutex_unlock(&r->lock);
  return 0;
}

static void queue_write(kvs_remote_t *r, const kvs_key_t *keys, size_t n) {
  kvs_xfer_t xfer = 0;
  /* Pin the object so its extent stays ours until an I/O thread has sent it. */
  if (kvs_store_lookup(r->store, r->owner, keys, 1, true, &xfer) != 1) {
    kvs_stats_inc(r->stats, KVS_STAT_remote_queue_drops);
    return;
  }
  job_t *jb = malloc(sizeof *jb + n * sizeof(kvs_key_t));
  pthread_mutex_lock(&r->lock);
  bool take = jb && !r->stop && r->n_writes < r->q_cap && breaker_allows(r, kvs__now_ms());
  if (take) {
    memset(jb, 0, sizeof *jb);
    jb->xfer = xfer;
    jb->n = (uint32_t)n;
    memcpy(jb->keys, keys, n * sizeof(kvs_key_t));
    KVS__FIFO_PUSH(r->write_head, r->write_tail, jb);
    r->n_writes++;
    pthread_cond_signal(&r->cond);
  }
  pthread_mutex_unlock(&r->lock);
  if (!take) {
    free(jb);
    kvs_store_release(r->store, r->owner, xfer);
    kvs_stats_inc(r->stats, KVS_STAT_remote_queue_drops);
  }
}

static void hook_published(void *ctx, const kvs_key_t *keys, size_t n, bool object) {
  kvs_remote_t *r = ctx;
  if (object) {
    queue_write(r, keys, n);
    return;
  }
  for (size_t i = 0; i < n; i++) queue_write(r, &keys[i], 1);
}

/* ---- create / destroy ---------------------------------------------------------------------- */

static int read_password(const char *path, char *out, size_t cap, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errlen, "cannot read KVSHIM_REMOTE_PASSWORD_FILE %s: %s", path, strerror(errno));
    return -EINVAL;
  }
  ssize_t n = read(fd, out, cap - 1);
  close(fd);
  if (n < 0) n = 0;
  out[n] = '\0';
  while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r')) out[--n] = '\0';
  if (n == 0) {
    snprintf(err, errlen, "KVSHIM_REMOTE_PASSWORD_FILE %s is empty", path);
    return -EINVAL;
  }
  return 0;
}

int kvs_remote_redis_config(const kvs_options_t *o, kvs_redis_config_t *cfg, char *pw,
                            size_t pw_cap, char *err, size_t errlen) {
  memset(cfg, 0, sizeof *cfg);
  if (!o->remote[0]) {
    snprintf(err, errlen, "no remote store configured (KVSHIM_REMOTE or --remote URL)");
    return -EINVAL;
  }
  int rc = kvs_redis_url_parse(o->remote, &cfg->url, err, errlen);
  if (rc < 0) return rc;
  pw[0] = '\0';
  if (o->remote_password_file[0])
    KVS_TRY(read_password(o->remote_password_file, pw, pw_cap, err, errlen));
  cfg->password = pw[0] ? pw : NULL;
  cfg->timeout_ms = (uint32_t)o->remote_timeout_ms;
  return 0;
}

int kvs_remote_create(const kvs_remote_config_t *cfg, kvs_remote_t **out, char *err,
                      size_t errlen) {
  if (errlen) err[0] = '\0';
  if (!cfg || !cfg->opts || !cfg->store || !out) return -EINVAL;
  const kvs_options_t *o = cfg->opts;
  kvs_remote_t *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  int rc = kvs_remote_redis_config(o, &r->rcfg, r->password, sizeof r->password, err, errlen);
  if (rc < 0) {
    memset(r, 0, sizeof *r);
    free(r);
    return rc;
  }
  r->store = cfg->store;
  r->stats = cfg->stats ? cfg->stats : kvs_stats_global();
  r->producer = cfg->producer;
  r->ttl_ms = o->remote_ttl;
  r->q_cap = (uint32_t)o->remote_queue;
  r->backoff_ms = BREAKER_MIN_MS;
  r->hooks = (kvs_coord_remote_t){r, hook_fetch, hook_published};
  rc = kvs_store_owner_open(r->store, &r->owner);
  if (rc < 0) {
    snprintf(err, errlen, "remote tier: no store owner: %s", strerror(-rc));
    free(r);
    return rc;
  }
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  pthread_cond_init(&r->idle, NULL);
  /* One probe now, so a wrong password or a server that is not Redis is said at start. */
  kvs_redis_t *probe = NULL;
  char perr[256] = "";
  rc = kvs_redis_create(&r->rcfg, &probe, perr, sizeof perr);
  if (rc < 0) {
    snprintf(err, errlen, "%s (the node tier goes on; retrying in the background)", perr);
    count_failure(r, rc);
    breaker_result(r, false);
  }
  kvs_redis_destroy(probe);
  /* The I/O threads must not take the signals serve waits for. */
  unsigned want = (unsigned)o->remote_threads;
  if (want > KVS__ARRAY_LEN(r->threads)) want = KVS__ARRAY_LEN(r->threads);
  for (; r->n_threads < want; r->n_threads++) {
    rc = kvs__prim_thread_start(&r->threads[r->n_threads], NULL, io_main, r);
    if (rc < 0) break;
  }
  if (r->n_threads == 0) {
    snprintf(err, errlen, "remote tier: cannot start a thread: %s", strerror(-rc));
    kvs_remote_destroy(r, 0);
    return rc;
  }
  *out = r;
  return 0;
}

const kvs_coord_remote_t *kvs_remote_hooks(kvs_remote_t *r) { return &r->hooks; }

void kvs_remote_attach(kvs_remote_t *r, kvs_coord_t *coord) {
  if (!r) return;
  pthread_mutex_lock(&r->lock);
  r->coord = coord;
  pthread_mutex_unlock(&r->lock);
}

void kvs_remote_destroy(kvs_remote_t *r, uint32_t flush_ms) {
  if (!r) return;
  pthread_mutex_lock(&r->lock);
  r->coord = NULL;
  /* Flush: let the threads drain the write queue, bounded. */
  uint64_t deadline = kvs__now_ms() + flush_ms;
  while ((r->write_head || r->busy) && kvs__now_ms() < deadline) {
    struct timespec ts = kvs__realtime_after_ms(20);
    pthread_cond_timedwait(&r->idle, &r->lock, &ts);
  }
  if (r->write_head)
    kvs_log_warn("remote tier: %u objects not written at exit (flush took over %u ms)",
                 r->n_writes, flush_ms);
  /* What is left is dropped (the pins end with the owner below). */
  for (job_t *jb; (jb = KVS__FIFO_POP(r->write_head, r->write_tail)); free(jb))
    kvs_stats_inc(r->stats, KVS_STAT_remote_queue_drops);
  for (job_t *jb; (jb = KVS__FIFO_POP(r->fetch_head, r->fetch_tail));) free(jb);
  r->n_writes = 0;
  r->stop = true;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  for (unsigned i = 0; i < r->n_threads; i++) pthread_join(r->threads[i], NULL);
  kvs_store_owner_release(r->store, r->owner);
  pthread_cond_destroy(&r->cond);
  pthread_cond_destroy(&r->idle);
  pthread_mutex_destroy(&r->lock);
  memset(r->password, 0, sizeof r->password);
  kvs__free_poisoned(r, sizeof *r);
}
