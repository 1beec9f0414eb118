/* test_redis_probe: drives one kvs_redis_t handle from line commands on stdin, one JSON line
 * out per command, for tests/core/tiers/test_redis.py (which owns the servers).
 *
 *   create URL [TIMEOUT_MS [PASSWORD]]  kvs_redis_url_parse + kvs_redis_create (replaces handle)
 *   exec ARG... [| ARG...]...           one pipeline; key_arg 1, -1 for keyless commands
 *   fill N PREFIX SIZE                  SET PREFIX:i <value(i)> for i < N, one pipeline
 *   check N PREFIX SIZE                 GET them: counts of correct, nil, wrong, failed
 *   info | slot KEY | url URL | destroy
 *
 * Values are deterministic bytes of the key index, so a wrong byte is always seen. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "redis.h"

static kvs_redis_t *h;

static void put_json_str(const char *s, size_t n) {
  putchar('"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c < 0x20 || c >= 0x7f) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

static const char *type_name(int t) {
  static const char *const n[] = {"NIL", "STRING", "STATUS", "INTEGER", "ERROR", "ARRAY", "FAILED"};
  return t >= 0 && t <= KVS_REDIS_FAILED ? n[t] : "?";
}

static int keyless(const char *cmd) {
  static const char *const k[] = {"PING", "INFO", "DBSIZE", "FLUSHALL", "FLUSHDB", "CLIENT",
                                  "CLUSTER", "DEBUG", "TIME", NULL};
  for (int i = 0; k[i]; i++)
    if (!strcasecmp(cmd, k[i])) return 1;
  return 0;
}

static void value_of(size_t i, size_t size, char *out) {
  unsigned long long x = (i + 1) * 0x9E3779B97F4A7C15ull ^ size;
  for (size_t j = 0; j < size; j++) {
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27; /* xorshift64 */
    out[j] = (char)((x * 0x2545F4914F6CDD1Dull) >> 56);
  }
}

static void print_err(void) {
  printf(",\"err\":");
  const char *e = kvs_redis_last_error(h);
  put_json_str(e, strlen(e));
}

static void do_exec(char **tok, int ntok) {
  kvs_redis_cmd_t cmds[64];
  size_t lens[256];
  kvs_redis_result_t res[64];
  size_t n = 0;
  int start = 0, li = 0;
  for (int i = 0; i <= ntok && n < 64; i++) {
    if (i < ntok && strcmp(tok[i], "|")) continue;
    if (i > start) {
      for (int k = start; k < i; k++) lens[li + k - start] = strlen(tok[k]);
      cmds[n] = (kvs_redis_cmd_t){.argc = i - start, .argv = (const char *const *)&tok[start],
                                  .argvlen = &lens[li], .key_arg = (i - start >= 2 && !keyless(tok[start])) ? 1 : -1};
      li += i - start;
      n++;
    }
    start = i + 1;
  }
  int rc = kvs_redis_exec(h, cmds, n, res);
  printf("{\"rc\":%d,\"results\":[", rc);
  for (size_t i = 0; rc >= 0 && i < n; i++) {
    printf("%s{\"t\":\"%s\"", i ? "," : "", type_name(res[i].type));
    if (res[i].type == KVS_REDIS_STRING || res[i].type == KVS_REDIS_STATUS || res[i].type == KVS_REDIS_ERROR) {
      printf(",\"s\":");
      put_json_str(res[i].str, res[i].len);
    }
    if (res[i].type == KVS_REDIS_INTEGER || res[i].type == KVS_REDIS_ARRAY) printf(",\"i\":%lld", res[i].integer);
    if (res[i].type == KVS_REDIS_FAILED) printf(",\"e\":%d", res[i].err);
    printf("}");
  }
  printf("]");
  print_err();
  printf("}\n");
  kvs_redis_results_release(h);
}

static void do_bulk(int check, size_t n, const char *prefix, size_t size) {
  kvs_redis_cmd_t *cmds = calloc(n, sizeof *cmds);
  kvs_redis_result_t *res = calloc(n, sizeof *res);
  char (*keys)[64] = calloc(n, sizeof *keys);
  const char **argv = calloc(n * 3, sizeof *argv);
  size_t *lens = calloc(n * 3, sizeof *lens);
  char *vals = malloc(n * size + 1), *want = malloc(size + 1);
  if (!cmds || !res || !keys || !argv || !lens || !vals || !want) { printf("{\"rc\":%d}\n", -ENOMEM); exit(1); }
  for (size_t i = 0; i < n; i++) {
    snprintf(keys[i], sizeof keys[i], "%s:%zu", prefix, i);
    argv[3 * i] = check ? "GET" : "SET";
    argv[3 * i + 1] = keys[i];
    lens[3 * i] = 3;
    lens[3 * i + 1] = strlen(keys[i]);
    if (!check) {
      value_of(i, size, vals + i * size);
      argv[3 * i + 2] = vals + i * size;
      lens[3 * i + 2] = size;
    }
    cmds[i] = (kvs_redis_cmd_t){.argc = check ? 2 : 3, .argv = &argv[3 * i], .argvlen = &lens[3 * i], .key_arg = 1};
  }
  int rc = kvs_redis_exec(h, cmds, n, res);
  size_t ok = 0, nil = 0, wrong = 0, failed = 0, other = 0;
  for (size_t i = 0; rc >= 0 && i < n; i++) {
    if (res[i].type == KVS_REDIS_FAILED) failed++;
    else if (res[i].type == KVS_REDIS_NIL) nil++;
    else if (!check) {
      if (res[i].type == KVS_REDIS_STATUS && res[i].len == 2 && !memcmp(res[i].str, "OK", 2)) ok++;
      else other++;
    } else if (res[i].type == KVS_REDIS_STRING) {
      value_of(i, size, want);
      if (res[i].len == size && !memcmp(res[i].str, want, size)) ok++;
      else wrong++;
    } else {
      other++;
    }
  }
  printf("{\"rc\":%d,\"ok\":%zu,\"nil\":%zu,\"wrong\":%zu,\"failed\":%zu,\"other\":%zu", rc, ok, nil,
         wrong, failed, other);
  print_err();
  printf("}\n");
  kvs_redis_results_release(h);
  free(cmds); free(res); free(keys); free(argv); free(lens); free(vals); free(want);
}

int main(void) {
  static char line[1 << 16];
  setvbuf(stdout, NULL, _IOLBF, 0);
  while (fgets(line, sizeof line, stdin)) {
    char *tok[256];
    int ntok = 0;
    for (char *save = NULL, *t = strtok_r(line, " \t\r\n", &save); t && ntok < 256;
         t = strtok_r(NULL, " \t\r\n", &save))
      tok[ntok++] = t;
    if (!ntok) continue;
    char err[256] = "";
    if (!strcmp(tok[0], "url") && ntok == 2) {
      kvs_redis_url_t u;
      int rc = kvs_redis_url_parse(tok[1], &u, err, sizeof err);
      printf("{\"rc\":%d,\"err\":", rc);
      put_json_str(err, strlen(err));
      printf("}\n");
    } else if (!strcmp(tok[0], "create") && ntok >= 2) {
      kvs_redis_destroy(h);
      h = NULL;
      kvs_redis_config_t cfg = {.timeout_ms = ntok >= 3 ? (uint32_t)atoi(tok[2]) : 1000,
                                .password = ntok >= 4 ? tok[3] : NULL};
      int rc = kvs_redis_url_parse(tok[1], &cfg.url, err, sizeof err);
      if (rc == 0) rc = kvs_redis_create(&cfg, &h, err, sizeof err);
      printf("{\"rc\":%d,\"err\":", rc);
      put_json_str(err, strlen(err));
      printf("}\n");
    } else if (!h) {
      printf("{\"rc\":%d,\"err\":\"no handle\"}\n", -ENOTCONN);
    } else if (!strcmp(tok[0], "exec") && ntok >= 2) {
      do_exec(tok + 1, ntok - 1);
    } else if ((!strcmp(tok[0], "fill") || !strcmp(tok[0], "check")) && ntok == 4) {
      do_bulk(tok[0][0] == 'c', (size_t)atol(tok[1]), tok[2], (size_t)atol(tok[3]));
    } else if (!strcmp(tok[0], "info")) {
      kvs_redis_info_t inf;
      int rc = kvs_redis_info(h, &inf);
      printf("{\"rc\":%d,\"version\":", rc);
      put_json_str(rc ? "" : inf.version, rc ? 0 : strlen(inf.version));
      printf(",\"cluster\":%d,\"nodes\":%d,\"slots\":%d,\"rtt_us\":%.1f", rc ? 0 : inf.cluster,
             rc ? 0 : inf.n_nodes, rc ? 0 : inf.slots_covered, rc ? 0.0 : inf.rtt_us);
      print_err();
      printf("}\n");
    } else if (!strcmp(tok[0], "slot") && ntok == 2) {
      printf("{\"slot\":%u}\n", kvs_redis_key_slot(tok[1], strlen(tok[1])));
    } else if (!strcmp(tok[0], "destroy")) {
      kvs_redis_destroy(h);
      h = NULL;
      printf("{\"rc\":0}\n");
    } else {
      printf("{\"rc\":%d,\"err\":\"unknown command\"}\n", -EINVAL);
    }
  }
  kvs_redis_destroy(h);
  return 0;
}
