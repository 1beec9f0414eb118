/* test_redis_zcopy: arguments given in parts (kvs_redis_cmd_t.parts) against a real Redis
 * server whose URL is argv[1] (test_redis_zcopy.py starts it). Each case prints one line;
 * exit 0 when all pass, 1 otherwise.
 *
 *   parts-sizes    SET k <128-byte header + payload> for payloads around the 4 KiB boundary
 *                  (where core/redis switches from copying to sending from the caller's memory)
 *                  and 9 MiB, all in one pipeline: GET returns the concatenation byte for byte
 *   parts-many     one value in five parts (empty, small, large, small, large) and a plain
 *                  command in the same pipeline
 *   parts-bad      the key argument in parts, a negative part count, a part with bytes but no
 *                  base: that command fails with -EINVAL, the others of the pipeline run */
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

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_redis_zcopy REDIS_URL\n");
    return 2;
  }
  kvs_redis_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  char err[256] = "";
  if (kvs_redis_url_parse(argv[1], &cfg.url, err, sizeof err) < 0) {
    printf("FAIL url: %s\n", err);
    return 1;
  }
  cfg.timeout_ms = 10000;
  kvs_redis_t *h = NULL;
  if (kvs_redis_create(&cfg, &h, err, sizeof err) < 0) {
    printf("FAIL create: %s\n", err);
    return 1;
  }
  case_sizes(h);
  case_many(h);
  case_bad(h);
  kvs_redis_destroy(h);
  return failures ? 1 : 0;
}
