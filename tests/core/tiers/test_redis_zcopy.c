/* test_redis_zcopy: arguments given in parts (kvs_redis_cmd_t.parts) against a real Redis
 * server whose URL is argv[1] (test_redis_zcopy.py starts it). Each case prints one line;
 * exit 0 when all pass, 1 otherwise.
 *
 *   parts-sizes    SET k <128-byte header + payload> for payloads around the 4 KiB boundary
 *                  (where core/tiers/redis switches from copying to sending from the caller's memory)
 *                  and 9 MiB, all in one pipeline: GET returns the concatenation byte for byte
 *   parts-many     one value in five parts (empty, small, large, small, large) and a plain
 *                  command in the same pipeline
 *   parts-bad      the key argument in parts, a negative part count, a part with bytes but no
 *                  base: that command fails with -EINVAL, the others of the pipeline run
 *   sink           GET replies received into the caller's buffer (kvs_redis_cmd_t.sink) for the
 *                  values above, one shorter than the head, in one pipeline with a miss, an
 *                  error reply, a declined 9 MiB value, a plain GET and a PING: each reply is
 *                  right and the connection stays in step
 *   broken-MODE    (argv[2]; a listener of the driver, not Redis) a sink's bulk reply broken
 *                  mid-body (reset, stall) or without its end (badend): FAILED with
 *                  -ECONNRESET / -ETIMEDOUT / -EPROTO */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

static int failures;

#define EXPECT(cond, ...)                                                                      \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                                              \
      printf(__VA_ARGS__);                                                                     \
      printf("\n");                                                                            \
      failures++;                                                                              \
    }                                                                                          \
  } while (0)

static void fill(char *p, size_t n, unsigned seed) {
  unsigned long long x = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (size_t i = 0; i < n; i++) {
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27; /* xorshift64 */
    p[i] = (char)((x * 0x2545F4914F6CDD1Dull) >> 56);
  }
}

/* GET key: compare with want[0..len). 1 when identical. */
static int get_equals(kvs_redis_t *h, const char *key, const char *want, size_t len) {
  const char *av[2] = {"GET", key};
  size_t lv[2] = {3, strlen(key)};
  kvs_redis_cmd_t c = {.argc = 2, .argv = av, .argvlen = lv, .key_arg = 1};
  kvs_redis_result_t res;
  int rc = kvs_redis_exec(h, &c, 1, &res);
  int ok = rc == 1 && res.type == KVS_REDIS_STRING && res.len == len &&
           (len == 0 || memcmp(res.str, want, len) == 0);
  if (!ok)
    printf("  GET %s: rc %d type %d len %zu (want %zu)\n", key, rc, res.type, res.len, len);
  kvs_redis_results_release(h);
  return ok;
}

/* One SET whose value is given in parts; its argv storage. */
typedef struct set {
  char key[32];
  const char *argv[3];
  size_t lens[3];
  const kvs_redis_part_t *parts[3];
  int nparts[3];
} set_t;

static kvs_redis_cmd_t set_cmd(set_t *s, const char *key, const kvs_redis_part_t *pt, int n) {
  snprintf(s->key, sizeof s->key, "%s", key);
  s->argv[0] = "SET", s->lens[0] = 3;
  s->argv[1] = s->key, s->lens[1] = strlen(s->key);
  s->argv[2] = "ignored", s->lens[2] = 7; /* parts win over argv */
  s->parts[0] = s->parts[1] = NULL;
  s->parts[2] = pt;
  s->nparts[0] = s->nparts[1] = 0;
  s->nparts[2] = n;
  return (kvs_redis_cmd_t){.argc = 3, .argv = s->argv, .argvlen = s->lens, .key_arg = 1,
                           .parts = s->parts, .nparts = s->nparts};
}

static void case_sizes(kvs_redis_t *h) {
  static const size_t sizes[] = {0, 1, 3967, 3968, 3969, 4095, 4096, 4097, 8192, 65536,
                                 9u << 20};
  enum { N = sizeof sizes / sizeof sizes[0] };
  char hdr[128];
  fill(hdr, sizeof hdr, 999);
  char *payload[N], *whole[N];
  kvs_redis_part_t pt[N][2];
  set_t st[N];
  kvs_redis_cmd_t cmds[N];
  kvs_redis_result_t res[N];
  for (size_t i = 0; i < N; i++) {
    payload[i] = malloc(sizes[i] + 1);
    whole[i] = malloc(sizeof hdr + sizes[i]);
    if (!payload[i] || !whole[i]) { printf("FAIL out of memory\n"); exit(1); }
    fill(payload[i], sizes[i], (unsigned)i);
    memcpy(whole[i], hdr, sizeof hdr);
    memcpy(whole[i] + sizeof hdr, payload[i], sizes[i]);
    pt[i][0] = (kvs_redis_part_t){hdr, sizeof hdr};
    pt[i][1] = (kvs_redis_part_t){payload[i], sizes[i]};
    char key[32];
    snprintf(key, sizeof key, "zc:%zu", sizes[i]);
    cmds[i] = set_cmd(&st[i], key, pt[i], 2);
  }
  int rc = kvs_redis_exec(h, cmds, N, res);
  EXPECT(rc == N, "pipeline of %d SETs in parts: rc %d (%s)", N, rc, kvs_redis_last_error(h));
  for (size_t i = 0; i < N; i++)
    EXPECT(res[i].type == KVS_REDIS_STATUS, "SET of %zu: type %d", sizes[i], res[i].type);
  kvs_redis_results_release(h);
  for (size_t i = 0; i < N; i++) {
    EXPECT(get_equals(h, st[i].key, whole[i], sizeof hdr + sizes[i]),
           "value of header + %zu bytes read back different", sizes[i]);
    free(payload[i]);
    free(whole[i]);
  }
  printf("%s parts-sizes\n", failures ? "FAIL" : "ok");
}

static void case_many(kvs_redis_t *h) {
  int before = failures;
  size_t big1 = 5000, big2 = 1u << 20;
  char small1[7], small2[100];
  char *b1 = malloc(big1), *b2 = malloc(big2), *whole = malloc(big1 + big2 + 107);
  if (!b1 || !b2 || !whole) { printf("FAIL out of memory\n"); exit(1); }
  fill(small1, sizeof small1, 1), fill(small2, sizeof small2, 2);
  fill(b1, big1, 3), fill(b2, big2, 4);
  kvs_redis_part_t pt[5] = {{NULL, 0}, {small1, sizeof small1}, {b1, big1},
                            {small2, sizeof small2}, {b2, big2}};
  size_t o = 0;
  for (int i = 0; i < 5; i++) {
    if (pt[i].len) memcpy(whole + o, pt[i].base, pt[i].len);
    o += pt[i].len;
  }
  set_t s;
  kvs_redis_cmd_t cmds[3];
  cmds[0] = set_cmd(&s, "zc:many", pt, 5);
  const char *av[2] = {"STRLEN", "zc:many"};
  size_t lv[2] = {6, 7};
  cmds[1] = (kvs_redis_cmd_t){.argc = 2, .argv = av, .argvlen = lv, .key_arg = 1};
  const char *pv[1] = {"PING"};
  size_t pl[1] = {4};
  cmds[2] = (kvs_redis_cmd_t){.argc = 1, .argv = pv, .argvlen = pl, .key_arg = -1};
  kvs_redis_result_t res[3];
  int rc = kvs_redis_exec(h, cmds, 3, res);
  EXPECT(rc == 3, "pipeline rc %d (%s)", rc, kvs_redis_last_error(h));
  EXPECT(res[1].type == KVS_REDIS_INTEGER && res[1].integer == (long long)o,
         "STRLEN %lld, want %zu", res[1].integer, o);
  EXPECT(res[2].type == KVS_REDIS_STATUS && res[2].len == 4, "PING after it");
  kvs_redis_results_release(h);
  EXPECT(get_equals(h, "zc:many", whole, o), "five parts read back different");
  free(b1), free(b2), free(whole);
  printf("%s parts-many\n", failures > before ? "FAIL" : "ok");
}

static void case_bad(kvs_redis_t *h) {
  int before = failures;
  char v[16] = "0123456789abcdef";
  kvs_redis_part_t pt[1] = {{v, sizeof v}}, nobase[1] = {{NULL, 5}};
  set_t s[4];
  kvs_redis_cmd_t cmds[4];
  cmds[0] = set_cmd(&s[0], "zc:bad0", pt, 1);
  s[0].parts[1] = pt; /* the key in parts: cannot be routed */
  s[0].nparts[1] = 1;
  cmds[1] = set_cmd(&s[1], "zc:bad1", pt, -1);
  cmds[2] = set_cmd(&s[2], "zc:bad2", nobase, 1);
  cmds[3] = set_cmd(&s[3], "zc:good", pt, 1);
  kvs_redis_result_t res[4];
  int rc = kvs_redis_exec(h, cmds, 4, res);
  EXPECT(rc == 1, "rc %d, want 1 (only the good command)", rc);
  for (int i = 0; i < 3; i++)
    EXPECT(res[i].type == KVS_REDIS_FAILED && res[i].err == -EINVAL,
           "bad command %d: type %d err %d", i, res[i].type, res[i].err);
  EXPECT(res[3].type == KVS_REDIS_STATUS, "good command after bad ones: type %d", res[3].type);
  EXPECT(strstr(kvs_redis_last_error(h), "malformed") != NULL, "error line: '%s'",
         kvs_redis_last_error(h));
  kvs_redis_results_release(h);
  EXPECT(get_equals(h, "zc:good", v, sizeof v), "good value");
  const char *av[4] = {"EXISTS", "zc:bad0", "zc:bad1", "zc:bad2"};
  size_t lv[4] = {6, 7, 7, 7};
  kvs_redis_cmd_t c = {.argc = 4, .argv = av, .argvlen = lv, .key_arg = -1};
  rc = kvs_redis_exec(h, &c, 1, res);
  EXPECT(rc == 1 && res[0].type == KVS_REDIS_INTEGER && res[0].integer == 0,
         "nothing of the bad commands reached the server (EXISTS %lld)", res[0].integer);
  kvs_redis_results_release(h);
  printf("%s parts-bad\n", failures > before ? "FAIL" : "ok");
}

/* A sink that keeps the head and takes the rest into its own buffer (or declines). */
typedef struct rcv {
  int calls, decline;
  size_t len, head_len;
  char head[128];
  char *body;
} rcv_t;

static void *rcv_dest(void *ctx, size_t len, const void *head, size_t head_len) {
  rcv_t *c = ctx;
  c->calls++;
  c->len = len;
  c->head_len = head_len;
  memcpy(c->head, head, head_len);
  if (c->decline) return NULL;
  c->body = malloc(len - head_len + 1);
  return c->body;
}

/* The received value equals want[0..len). */
static int rcv_equals(const rcv_t *c, const char *want, size_t len) {
  size_t h = c->head_len;
  return c->calls == 1 && c->len == len && h == (len < 128 ? len : 128) &&
         memcmp(c->head, want, h) == 0 && (len == h || memcmp(c->body, want + h, len - h) == 0);
}

static void case_sink(kvs_redis_t *h) {
  int before = failures;
  static const size_t sizes[] = {0, 1, 3967, 4096, 4097, 65536, 9u << 20};
  enum { N = sizeof sizes / sizeof sizes[0], M = N + 6 };
  char hdr[128], tiny[5] = "tiny!";
  fill(hdr, sizeof hdr, 999);
  /* what case_sizes stored: hdr + payload(i) (same seeds as there: index in its list) */
  static const size_t all[] = {0, 1, 3967, 3968, 3969, 4095, 4096, 4097, 8192, 65536, 9u << 20};
  char *whole[N];
  for (size_t i = 0; i < N; i++) {
    size_t k = 0;
    while (all[k] != sizes[i]) k++;
    whole[i] = malloc(sizeof hdr + sizes[i]);
    if (!whole[i]) { printf("FAIL out of memory\n"); exit(1); }
    memcpy(whole[i], hdr, sizeof hdr);
    fill(whole[i] + sizeof hdr, sizes[i], (unsigned)k);
  }
  { /* a value shorter than the head, and a hash (GET of it is an error reply) */
    const char *av[3] = {"SET", "zc:tiny", tiny};
    size_t lv[3] = {3, 7, sizeof tiny};
    const char *hv[4] = {"HSET", "zc:hash", "f", "v"};
    size_t hl[4] = {4, 7, 1, 1};
    kvs_redis_cmd_t c[2] = {{.argc = 3, .argv = av, .argvlen = lv, .key_arg = 1},
                            {.argc = 4, .argv = hv, .argvlen = hl, .key_arg = 1}};
    kvs_redis_result_t res[2];
    EXPECT(kvs_redis_exec(h, c, 2, res) == 2, "setup: %s", kvs_redis_last_error(h));
    kvs_redis_results_release(h);
  }
  /* One pipeline: every value through a sink, with a miss, an error reply, a declined 9 MiB
   * value, a plain GET and a PING among them. */
  char keys[M][32];
  const char *argv[M][2];
  size_t lens[M][2];
  rcv_t rc_[M];
  kvs_redis_sink_t sinks[M];
  kvs_redis_cmd_t cmds[M];
  kvs_redis_result_t res[M];
  memset(rc_, 0, sizeof rc_);
  for (size_t i = 0; i < M; i++) {
    if (i < N) snprintf(keys[i], sizeof keys[i], "zc:%zu", sizes[i]);
    else snprintf(keys[i], sizeof keys[i], "%s",
                  (const char *[]){"zc:tiny", "zc:missing", "zc:hash", "zc:9437184", "zc:4097",
                                   "PING"}[i - N]);
    argv[i][0] = "GET", lens[i][0] = 3;
    argv[i][1] = keys[i], lens[i][1] = strlen(keys[i]);
    sinks[i] = (kvs_redis_sink_t){.dest = rcv_dest, .ctx = &rc_[i], .head = 128};
    cmds[i] = (kvs_redis_cmd_t){.argc = 2, .argv = argv[i], .argvlen = lens[i], .key_arg = 1,
                                .sink = &sinks[i]};
  }
  rc_[N + 3].decline = 1;         /* 9 MiB: dropped */
  cmds[N + 4].sink = NULL;        /* a plain GET after it */
  cmds[M - 1] = (kvs_redis_cmd_t){.argc = 1, .argv = &argv[M - 1][1], .argvlen = &lens[M - 1][1],
                                  .key_arg = -1, .sink = &sinks[M - 1]}; /* PING: a status */
  int rc = kvs_redis_exec(h, cmds, M, res);
  EXPECT(rc == M, "pipeline rc %d (%s)", rc, kvs_redis_last_error(h));
  for (size_t i = 0; i < N; i++) {
    EXPECT(res[i].type == KVS_REDIS_STRING && res[i].str == NULL &&
           res[i].len == sizeof hdr + sizes[i], "sink GET of %zu: type %d len %zu", sizes[i],
           res[i].type, res[i].len);
    EXPECT(rcv_equals(&rc_[i], whole[i], sizeof hdr + sizes[i]),
           "value of header + %zu bytes received into the caller's buffer differs", sizes[i]);
  }
  EXPECT(res[N].type == KVS_REDIS_STRING && rcv_equals(&rc_[N], tiny, sizeof tiny),
         "value shorter than the head");
  EXPECT(res[N + 1].type == KVS_REDIS_NIL && rc_[N + 1].calls == 0, "miss: type %d calls %d",
         res[N + 1].type, rc_[N + 1].calls);
  EXPECT(res[N + 2].type == KVS_REDIS_ERROR && res[N + 2].len > 0 && rc_[N + 2].calls == 0,
         "error reply: type %d calls %d", res[N + 2].type, rc_[N + 2].calls);
  EXPECT(res[N + 3].type == KVS_REDIS_STRING && res[N + 3].len == sizeof hdr + (9u << 20) &&
         rc_[N + 3].calls == 1 && memcmp(rc_[N + 3].head, hdr, sizeof hdr) == 0,
         "declined value: type %d len %zu", res[N + 3].type, res[N + 3].len);
  EXPECT(res[N + 4].type == KVS_REDIS_STRING && res[N + 4].len == sizeof hdr + 4097 &&
         memcmp(res[N + 4].str, whole[4], sizeof hdr + 4097) == 0,
         "plain GET after a declined value");
  EXPECT(res[M - 1].type == KVS_REDIS_STATUS && rc_[M - 1].calls == 0, "PING with a sink");
  kvs_redis_results_release(h);
  /* the connection is in step after all that */
  EXPECT(get_equals(h, "zc:tiny", tiny, sizeof tiny), "GET after the sink pipeline");
  for (size_t i = 0; i < M; i++) free(rc_[i].body);
  for (size_t i = 0; i < N; i++) free(whole[i]);
  printf("%s sink\n", failures > before ? "FAIL" : "ok");
}

/* Against test_redis_zcopy.py's broken listener: GET through a sink whose reply breaks inside
 * the bulk string (mode reset / stall / badend). The command fails with the errno of the mode,
 * and dest was called (reset, stall: the head was in) once at most. */
static void case_broken(kvs_redis_t *h, const char *mode) {
  int before = failures;
  int want = !strcmp(mode, "reset") ? -ECONNRESET : !strcmp(mode, "stall") ? -ETIMEDOUT : -EPROTO;
  rcv_t rc_;
  memset(&rc_, 0, sizeof rc_);
  kvs_redis_sink_t sk = {.dest = rcv_dest, .ctx = &rc_, .head = 128};
  const char *av[2] = {"GET", "k"};
  size_t lv[2] = {3, 1};
  kvs_redis_cmd_t c = {.argc = 2, .argv = av, .argvlen = lv, .key_arg = 1, .sink = &sk};
  kvs_redis_result_t res;
  int rc = kvs_redis_exec(h, &c, 1, &res);
  EXPECT(rc == 0 && res.type == KVS_REDIS_FAILED && res.err == want,
         "%s: rc %d type %d err %d (want %d): %s", mode, rc, res.type, res.err, want,
         kvs_redis_last_error(h));
  EXPECT(rc_.calls == 1 && rc_.head_len == 128, "%s: dest calls %d head %zu", mode, rc_.calls,
         rc_.head_len);
  kvs_redis_results_release(h);
  free(rc_.body);
  printf("%s broken-%s\n", failures > before ? "FAIL" : "ok", mode);
}

int main(int argc, char **argv) {
  if (argc != 2 && argc != 3) {
    fprintf(stderr, "usage: test_redis_zcopy REDIS_URL [reset|stall|badend]\n");
    return 2;
  }
  kvs_redis_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  char err[256] = "";
  if (kvs_redis_url_parse(argv[1], &cfg.url, err, sizeof err) < 0) {
    printf("FAIL url: %s\n", err);
    return 1;
  }
  cfg.timeout_ms = argc == 3 ? 300 : 10000;
  kvs_redis_t *h = NULL;
  if (kvs_redis_create(&cfg, &h, err, sizeof err) < 0) {
    printf("FAIL create: %s\n", err);
    return 1;
  }
  if (argc == 3) {
    case_broken(h, argv[2]);
    kvs_redis_destroy(h);
    return failures ? 1 : 0;
  }
  case_sizes(h);
  case_many(h);
  case_bad(h);
  case_sink(h);
  kvs_redis_destroy(h);
  return failures ? 1 : 0;
}
