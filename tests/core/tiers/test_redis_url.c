/* core/tiers/redis without a server: URL parsing (good and bad, the password never in an error) and
 * key slots. Slot values are what `redis-cli CLUSTER KEYSLOT` answers on Redis 7.0 (the
 * cluster-roundtrip case of test_redis.py compares many more against a live server). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "redis.h"

static kvs_redis_url_t parse_ok(const char *s) {
  kvs_redis_url_t u;
  char err[256] = "";
  int rc = kvs_redis_url_parse(s, &u, err, sizeof err);
  cr_assert_eq(rc, 0, "%s: %d %s", s, rc, err);
  return u;
}

/* Bad input: -EINVAL, one line holding `word`, and never the secret. */
static void parse_bad(const char *s, const char *word) {
  kvs_redis_url_t u;
  memset(&u, 0x5a, sizeof u);
  kvs_redis_url_t before = u;
  char err[256] = "";
  int rc = kvs_redis_url_parse(s, &u, err, sizeof err);
  cr_assert_eq(rc, -EINVAL, "%s: rc %d", s, rc);
  cr_assert(strstr(err, word), "%s: error '%s' lacks '%s'", s, err, word);
  cr_assert_null(strchr(err, '\n'), "%s: error is not one line", s);
  cr_assert_null(strstr(err, "hunter2"), "%s: error shows the password: %s", s, err);
  cr_assert(!memcmp(&u, &before, sizeof u), "%s: output written on failure", s);
}

static void expect(const kvs_redis_url_t *u, int cluster, int n_seeds, int db, int i,
                   const char *host, unsigned port) {
  cr_assert_eq(u->cluster, cluster);
  cr_assert_eq(u->n_seeds, n_seeds);
  cr_assert_eq(u->db, db);
  cr_assert_str_eq(u->seeds[i].host, host);
  cr_assert_eq(u->seeds[i].port, port);
}

Test(redis_url, standalone) {
  kvs_redis_url_t u = parse_ok("redis://127.0.0.1:6380");
  expect(&u, 0, 1, 0, 0, "127.0.0.1", 6380);
  cr_assert_str_eq(u.user, "");
  cr_assert_str_eq(u.password, "");

  u = parse_ok("redis://cache-1.example.com:7000/5");
  expect(&u, 0, 1, 5, 0, "cache-1.example.com", 7000);

  u = parse_ok("redis://localhost");
  cr_assert_eq(u.seeds[0].port, 6379, "default port");
  u = parse_ok("redis://localhost:6379/");
  cr_assert_eq(u.db, 0);

  u = parse_ok("redis://[::1]:6390/2");
  expect(&u, 0, 1, 2, 0, "::1", 6390);
  u = parse_ok("redis://[fe80::1]");
  expect(&u, 0, 1, 0, 0, "fe80::1", 6379);
}

Test(redis_url, credentials) {
  kvs_redis_url_t u = parse_ok("redis://alice:hunter2@h:1");
  cr_assert_str_eq(u.user, "alice");
  cr_assert_str_eq(u.password, "hunter2");
  u = parse_ok("redis://:hunter2@h:1/3");
  cr_assert_str_eq(u.user, "");
  cr_assert_str_eq(u.password, "hunter2");
  cr_assert_eq(u.db, 3);
  u = parse_ok("redis://hunter2@h:1"); /* no colon: a password alone, as redis-cli -u reads it */
  cr_assert_str_eq(u.user, "");
  cr_assert_str_eq(u.password, "hunter2");
  u = parse_ok("redis://bob:p%40ss%3Aw%2Fd@h:1"); /* %-escapes: p@ss:w/d */
  cr_assert_str_eq(u.user, "bob");
  cr_assert_str_eq(u.password, "p@ss:w/d");
  u = parse_ok("redis://bob:a@b@h:1"); /* the last '@' ends the credentials */
  cr_assert_str_eq(u.password, "a@b");
  cr_assert_str_eq(u.seeds[0].host, "h");
}

Test(redis_url, cluster) {
  kvs_redis_url_t u = parse_ok("redis+cluster://10.0.0.1:7000,10.0.0.2:7001,[::1]:7002");
  expect(&u, 1, 3, 0, 1, "10.0.0.2", 7001);
  expect(&u, 1, 3, 0, 2, "::1", 7002);
  u = parse_ok("redis+cluster://:hunter2@n1:7000,n2:7000/0");
  cr_assert_str_eq(u.password, "hunter2");
  cr_assert_eq(u.n_seeds, 2);

  char many[1024] = "redis+cluster://";
  for (int i = 0; i < KVS_REDIS_MAX_SEEDS; i++)
    snprintf(many + strlen(many), sizeof many - strlen(many), "%sh%d:%d", i ? "," : "", i, 7000 + i);
  u = parse_ok(many);
  cr_assert_eq(u.n_seeds, KVS_REDIS_MAX_SEEDS);
  strcat(many, ",one-more:7100");
  parse_bad(many, "more than");
}

Test(redis_url, bad) {
  parse_bad("", "scheme");
  parse_bad("127.0.0.1:6379", "scheme");
  parse_bad("rediss://h:1", "scheme");
  parse_bad("http://h:1", "scheme");
  parse_bad("redis://", "no host");
  parse_bad("redis://:hunter2@", "no host");
  parse_bad("redis://:hunter2@/2", "no host");
  parse_bad("redis://h:0", "bad port");
  parse_bad("redis://h:65536", "bad port");
  parse_bad("redis://:hunter2@h:port", "bad port");
  parse_bad("redis://h:", "bad port");
  parse_bad("redis://h:-1", "bad port");
  parse_bad("redis://h:1/x", "database");
  parse_bad("redis://h:1/1/2", "database");
  parse_bad("redis://h:1/-1", "database");
  parse_bad("redis://h:1/99999999999", "database");
  parse_bad("redis://h:1?db=2", "query");
  parse_bad("redis://:hunter2@h:1/0#frag", "query");
  parse_bad("redis://a,b", "redis+cluster");
  parse_bad("redis+cluster://h:1/3", "only database 0");
  parse_bad("redis+cluster://h:1,,h2:2", "empty host");
  parse_bad("redis+cluster://h:1,", "empty host");
  parse_bad("redis://::1:6379", "brackets");
  parse_bad("redis://[::1:6379", "without ']'");
  parse_bad("redis://[::1]x", "after ']'");
  parse_bad("redis://[zz]:1", "IPv6");
  parse_bad("redis://h st:1", "bad character");
  parse_bad("redis://:hunter2%zz@h:1", "escape");
  parse_bad("redis://:hunter2%2@h:1", "escape");
  parse_bad("redis://:hunter2%00@h:1", "escape");
  char longpw[300] = "redis://:hunter2";
  memset(longpw + strlen(longpw), 'x', 200);
  strcat(longpw, "@h:1");
  parse_bad(longpw, "too long");
  char longhost[400] = "redis://";
  memset(longhost + 8, 'a', 300);
  parse_bad(longhost, "longer than 255");
  kvs_redis_url_t u;
  char err[64];
  cr_assert_eq(kvs_redis_url_parse(NULL, &u, err, sizeof err), -EINVAL);
  cr_assert_eq(kvs_redis_url_parse("redis://h", NULL, err, sizeof err), -EINVAL);
  cr_assert_eq(kvs_redis_url_parse("redis://h:0", &u, NULL, 0), -EINVAL, "no error buffer is fine");
}

Test(redis_url, format_hides_password) {
  char buf[512];
  kvs_redis_url_t u = parse_ok("redis://alice:hunter2@h:7000/4");
  cr_assert_eq(kvs_redis_url_format(&u, buf, sizeof buf), 0);
  cr_assert_str_eq(buf, "redis://alice:***@h:7000/4");
  u = parse_ok("redis+cluster://:hunter2@a:1,[::1]:2");
  cr_assert_eq(kvs_redis_url_format(&u, buf, sizeof buf), 0);
  cr_assert_str_eq(buf, "redis+cluster://***@a:1,[::1]:2");
  u = parse_ok("redis://h");
  cr_assert_eq(kvs_redis_url_format(&u, buf, sizeof buf), 0);
  cr_assert_str_eq(buf, "redis://h:6379");
  cr_assert_eq(kvs_redis_url_format(&u, buf, 5), -ENOSPC);
}

Test(redis_url, create_rejects_bad_config) {
  kvs_redis_t *r = (kvs_redis_t *)0x1;
  char err[128] = "";
  kvs_redis_config_t cfg = {.timeout_ms = 100}; /* no seeds */
  cr_assert_eq(kvs_redis_create(&cfg, &r, err, sizeof err), -EINVAL);
  cr_assert_eq(r, (kvs_redis_t *)0x1, "out written on failure");
  cr_assert(strlen(err) > 0);
  kvs_redis_destroy(NULL);
}

/* Slots as `redis-cli CLUSTER KEYSLOT` (Redis 7.0.15) answers; 12182 for "foo" and 12739 for
 * "123456789" (0x31C3, the CRC16-XMODEM check value) are also in the cluster spec. */
Test(redis_slot, known_values) {
  static const struct { const char *key; unsigned slot; } v[] = {
    {"foo", 12182}, {"bar", 5061}, {"123456789", 12739}, {"", 0},
    {"{user1000}.following", 3443}, {"{user1000}.followers", 3443}, {"user1000", 3443},
    {"foo{}{bar}", 8363}, {"foo{{bar}}zap", 4015}, {"foo{bar}{zap}", 5061}, {"{}", 15257},
    {"{", 4092}, {"}", 12090},
  };
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
    cr_assert_eq(kvs_redis_key_slot(v[i].key, strlen(v[i].key)), v[i].slot, "%s", v[i].key);
  cr_assert_eq(kvs_redis_key_slot("a\0b", 3), kvs_redis_key_slot("a\0b", 3));
  cr_assert_neq(kvs_redis_key_slot("a\0b", 3), kvs_redis_key_slot("a", 1), "length, not NUL");
}
