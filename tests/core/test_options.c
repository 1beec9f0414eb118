/* core/options: every row, every type, bad values, bounds, "warn once, keep default". */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "options.h"
#include "../lib/logcapture.h"
#include "rows.h"

/* Every core row of got equals want's, walked through core's table (strings by content, the
 * rest by value): one expectation a row, named by its variable. */
static void expect_core_rows(const kvs_options_t *got, const kvs_options_t *want) {
  const kvs_option_table_t *t = &kvs_options_core;
  for (kvs_option_id_t i = 0; i < t->n; i++) {
    const kvs_option_row_t *r = &t->rows[i];
    const char *g = (const char *)got + r->offset, *w = (const char *)want + r->offset;
    char gs[KVS_OPT_STR_MAX], ws[KVS_OPT_STR_MAX];
    kvs_options_format_value(t, got, i, gs, sizeof gs);
    kvs_options_format_value(t, want, i, ws, sizeof ws);
    size_t n = r->type == KVS_OPTION_SIZE || r->type == KVS_OPTION_INT ? sizeof(uint64_t)
               : r->type == KVS_OPTION_STR || r->type == KVS_OPTION_NAME ||
                       r->type == KVS_OPTION_UIDS
                   ? KVS_OPT_STR_MAX
                   : sizeof(int);
    bool same = n == KVS_OPT_STR_MAX ? strcmp(g, w) == 0 : memcmp(g, w, n) == 0;
    cr_expect(same, "%s = %s, expected %s", r->env, gs, ws);
  }
}

Test(options, defaults_match_the_design_table) {
  kvs_config_t o;
  char *env[] = {NULL};
  cr_assert_eq(kvs_config_load(&o, env, 0), 0);
  cr_expect_eq(o.enable, 1);
  cr_expect_eq(o.hooks, KVS_HOOKS_AUTO);
  cr_expect_eq(o.host_pool_size, 4ull << 30);
  cr_expect_eq(o.host_min, 1ull << 20);
  /* Core's rows (zero and "" where not named). */
  kvs_options_t want = {.pool_size = 1ull << 30, .group = "default", .peers = 1,
                        .chunk_tokens = 256, .lease_ms = 30000, .rpc_timeout_ms = 2000,
                        .max_frame = 64ull << 20, .log = KVS_LOG_WARN,
                        .remote_ttl = 86400000, .remote_timeout_ms = 1000, .remote_threads = 2,
                        .remote_queue = 1024, .disk_size = 10ull << 30,
                        .disk_sync = KVS_DISK_SYNC_BATCH};
  snprintf(want.run_dir, sizeof want.run_dir, "/tmp/kvshim-%u", (unsigned)getuid());
  expect_core_rows(&o.core, &want);
  cr_expect_eq(o.llama_write_through, 1);
  cr_expect_eq(o.llama_prefix, 1);
  cr_expect_eq(o.llama_min_tokens, 256);
  cr_expect_str_eq(o.stats, "");
  for (int i = 0; i < KVS_OPT__COUNT; i++) cr_expect_eq(o.core.source[i], KVS_OPT_FROM_DEFAULT);
}

Test(options, every_row_is_read_from_the_environment) {
  char *env[] = {
      "KVSHIM_ENABLE=off", "KVSHIM_HOOKS=cuda,kvo", "KVSHIM_POOL_SIZE=512MiB",
      "KVSHIM_HOST_POOL_SIZE=0", "KVSHIM_HOST_MIN=64K", "KVSHIM_HUGEPAGES=yes",
      "KVSHIM_POOL_NAME=/kvs-pool", "KVSHIM_STRATEGY=inline", "KVSHIM_GROUP=team.a-1",
      "KVSHIM_RUN_DIR=/run/x", "KVSHIM_PEERS=0", "KVSHIM_PUSH=off", "KVSHIM_CHUNK_TOKENS=16",
      "KVSHIM_SALT=s3cret", "KVSHIM_LEASE_MS=500", "KVSHIM_RPC_TIMEOUT_MS=75",
      "KVSHIM_MAX_FRAME=1GB", "KVSHIM_ALLOW_UIDS=1000,65534", "KVSHIM_LLAMA_WRITE_THROUGH=false",
      "KVSHIM_LLAMA_PREFIX=0", "KVSHIM_LLAMA_MIN_TOKENS=512", "KVSHIM_LLAMA_CHUNKS=1",
      "KVSHIM_LLAMA_DIRECT=0", "KVSHIM_LOG=debug",
      "KVSHIM_LOG_FILE=/tmp/kvs.log", "KVSHIM_STATS=/tmp/s.json",
      "KVSHIM_REMOTE=redis://h:6379/2", "KVSHIM_REMOTE_PASSWORD_FILE=/etc/kvs.pw",
      "KVSHIM_REMOTE_TTL=60000", "KVSHIM_REMOTE_TIMEOUT_MS=250", "KVSHIM_REMOTE_THREADS=3",
      "KVSHIM_REMOTE_QUEUE=64", "KVSHIM_CUDA_PIN_ARENA=1", "KVSHIM_ONE_COPY=0",
      "KVSHIM_POOL_LEAN_SIZE=8M", "KVSHIM_LLAMA_WAIT_MS=250", "KVSHIM_DISK=/var/lib/kvs",
      "KVSHIM_DISK_SIZE=2G", "KVSHIM_DISK_SYNC=always", NULL};
  kvs_config_t o;
  cr_assert_eq(kvs_config_load(&o, env, 0), 0, "no problems expected");
  cr_expect_eq(o.enable, 0);
  cr_expect_eq(o.hooks, KVS_HOOK_CUDA | KVS_HOOK_KVO);
  cr_expect_eq(o.host_pool_size, 0);
  cr_expect_eq(o.host_min, 64ull << 10);
  const kvs_options_t want = {
      .pool_size = 512ull << 20, .hugepages = 1, .pool_name = "/kvs-pool",
      .strategy = KVS_STRATEGY_INLINE, .group = "team.a-1", .run_dir = "/run/x", .peers = 0,
      .push = KVS_PUSH_OFF, .chunk_tokens = 16, .salt = "s3cret", .lease_ms = 500,
      .rpc_timeout_ms = 75, .max_frame = 1ull << 30, .allow_uids = "1000,65534",
      .log = KVS_LOG_DEBUG, .log_file = "/tmp/kvs.log", .remote = "redis://h:6379/2",
      .remote_password_file = "/etc/kvs.pw", .remote_ttl = 60000, .remote_timeout_ms = 250,
      .remote_threads = 3, .remote_queue = 64, .disk = "/var/lib/kvs", .disk_size = 2ull << 30,
      .disk_sync = KVS_DISK_SYNC_ALWAYS};
  expect_core_rows(&o.core, &want);
  cr_expect_eq(o.llama_write_through, 0);
  cr_expect_eq(o.cuda_pin_arena, 1);
  cr_expect_eq(o.one_copy, 0);
  cr_expect_eq(o.pool_lean_size, 8ull << 20);
  cr_expect_eq(o.llama_wait_ms, 250);
  cr_expect_eq(o.llama_prefix, 0);
  cr_expect_eq(o.llama_min_tokens, 512);
  cr_expect_eq(o.llama_chunks, 1);
  cr_expect_eq(o.llama_direct, 0);
  cr_expect_str_eq(o.stats, "/tmp/s.json");
  for (int i = 0; i < KVS_OPT__COUNT; i++)
    cr_expect_eq(o.core.source[i], KVS_OPT_FROM_ENV, "%s not marked as from env",
                 kvs_config_env_name((kvs_option_id_t)i));
}

Test(options, size_suffixes) {
  static const struct { const char *s; uint64_t v; } ok[] = {
      {"0", 0}, {"4096", 4096}, {"4K", 4096}, {"4k", 4096}, {"4KB", 4096}, {"4KiB", 4096},
      {"3M", 3ull << 20}, {"3MiB", 3ull << 20}, {"2G", 2ull << 30}, {"2GiB", 2ull << 30},
      {"1T", 1ull << 40}, {"1TiB", 1ull << 40}, {"7B", 7}, {"5 M", 5ull << 20}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    uint64_t v = 12345;
    cr_expect_eq(kvs__parse_size(ok[i].s, &v), 0, "'%s' rejected", ok[i].s);
    cr_expect_eq(v, ok[i].v, "'%s' -> %llu", ok[i].s, (unsigned long long)v);
  }
  static const char *bad[] = {"", "G", "-1", "1X", "1Gx", "1iB", "1.5G", "abc", "1KiX"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t v = 12345;
    cr_expect_lt(kvs__parse_size(bad[i], &v), 0, "'%s' accepted", bad[i]);
    cr_expect_eq(v, 12345, "out-parameter written on error for '%s'", bad[i]);
  }
  uint64_t v = 1;
  cr_expect_eq(kvs__parse_size("99999999999T", &v), -ERANGE, "overflow is a range error");
}

Test(options, booleans) {
  static const char *yes[] = {"1", "true", "TRUE", "on", "yes"}, *no[] = {"0", "false", "Off", "no"};
  for (size_t i = 0; i < 5; i++) {
    int b = -1;
    cr_expect_eq(kvs__parse_bool(yes[i], &b), 0);
    cr_expect_eq(b, 1);
  }
  for (size_t i = 0; i < 4; i++) {
    int b = -1;
    cr_expect_eq(kvs__parse_bool(no[i], &b), 0);
    cr_expect_eq(b, 0);
  }
  int b = 7;
  cr_expect_eq(kvs__parse_bool("2", &b), -EINVAL);
  cr_expect_eq(kvs__parse_bool("", &b), -EINVAL);
  cr_expect_eq(b, 7);
}

/* Every invalid value warns exactly once, names the variable and keeps the default. */
Test(options, invalid_values_warn_once_and_keep_defaults) {
  int fd = log_capture(KVS_LOG_WARN);
  char *env[] = {"KVSHIM_ENABLE=maybe",           /* BOOL */
                 "KVSHIM_POOL_SIZE=12Q",          /* SIZE: malformed */
                 "KVSHIM_HOST_MIN=2T",            /* SIZE: above bound 1T */
                 "KVSHIM_MAX_FRAME=1K",           /* SIZE: below bound 64K */
                 "KVSHIM_CHUNK_TOKENS=0",         /* INT: below bound */
                 "KVSHIM_LEASE_MS=ten",           /* INT: malformed */
                 "KVSHIM_RPC_TIMEOUT_MS=9999999", /* INT: above bound */
                 "KVSHIM_STRATEGY=rdma",          /* ENUM */
                 "KVSHIM_HOOKS=cuda,tensorrt",    /* FLAGS */
                 "KVSHIM_GROUP=a/b",              /* NAME */
                 "KVSHIM_ALLOW_UIDS=1000,,2",     /* UIDS */
                 "KVSHIM_LOG=loud",               /* ENUM */
                 NULL};
  kvs_config_t o;
  int problems = kvs_config_load(&o, env, 0);
  const char *log = log_text(fd);
  cr_expect_eq(problems, 12, "problems=%d log:\n%s", problems, log);
  cr_expect_eq(count_of(log, "\n"), 12, "one line per problem:\n%s", log);
  static const char *vars[] = {"KVSHIM_ENABLE=", "KVSHIM_POOL_SIZE=", "KVSHIM_HOST_MIN=",
                               "KVSHIM_MAX_FRAME=", "KVSHIM_CHUNK_TOKENS=", "KVSHIM_LEASE_MS=",
                               "KVSHIM_RPC_TIMEOUT_MS=", "KVSHIM_STRATEGY=", "KVSHIM_HOOKS=",
                               "KVSHIM_GROUP=", "KVSHIM_ALLOW_UIDS=", "KVSHIM_LOG="};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    cr_expect_eq(count_of(log, vars[i]), 1, "%s warned %d times", vars[i],
                 count_of(log, vars[i]));
  cr_expect(strstr(log, "keeping default 1G") != NULL, "pool size default named:\n%s", log);
  cr_expect(strstr(log, "out of range") != NULL);
  kvs_config_t d;
  kvs_config_defaults(&d);
  cr_expect_eq(o.enable, d.enable);
  cr_expect_eq(o.core.pool_size, d.core.pool_size);
  cr_expect_eq(o.host_min, d.host_min);
  cr_expect_eq(o.core.max_frame, d.core.max_frame);
  cr_expect_eq(o.core.chunk_tokens, d.core.chunk_tokens);
  cr_expect_eq(o.core.lease_ms, d.core.lease_ms);
  cr_expect_eq(o.core.rpc_timeout_ms, d.core.rpc_timeout_ms);
  cr_expect_eq(o.core.strategy, d.core.strategy);
  cr_expect_eq(o.hooks, d.hooks);
  cr_expect_str_eq(o.core.group, d.core.group);
  cr_expect_str_eq(o.core.allow_uids, d.core.allow_uids);
  cr_expect_eq(o.core.log, d.core.log);
  cr_expect_eq(o.core.source[KVS_OPT_pool_size], KVS_OPT_INVALID);
}

Test(options, bounds_are_inclusive) {
  kvs_config_t o;
  char *env[] = {"KVSHIM_CHUNK_TOKENS=1", "KVSHIM_LEASE_MS=86400000", "KVSHIM_MAX_FRAME=64K",
                 "KVSHIM_POOL_SIZE=1M", NULL};
  cr_assert_eq(kvs_config_load(&o, env, 0), 0);
  cr_expect_eq(o.core.chunk_tokens, 1);
  cr_expect_eq(o.core.lease_ms, 86400000);
  cr_expect_eq(o.core.max_frame, 64 << 10);
  cr_expect_eq(o.core.pool_size, 1 << 20);
  char *env2[] = {"KVSHIM_POOL_SIZE=1023K", NULL};
  cr_expect_eq(kvs_config_load(&o, env2, 0), 1, "one below the minimum is refused");
  cr_expect_eq(o.core.pool_size, 1ull << 30);
}

Test(options, unknown_variables_are_reported) {
  int fd = log_capture(KVS_LOG_WARN);
  char *env[] = {"KVSHIM_POOLSIZE=2G", "HOME=/root", "KVSHIM_ENABLE=1", NULL};
  kvs_config_t o;
  cr_expect_eq(kvs_config_load(&o, env, 0), 1);
  cr_expect_eq(o.core.unknown_vars, 1);
  cr_expect(strstr(log_text(fd), "unknown variable KVSHIM_POOLSIZE") != NULL, "%s", log_text(fd));
}

Test(options, warnings_respect_the_configured_level) {
  int fd = log_capture(KVS_LOG_WARN);
  char *env[] = {"KVSHIM_LOG=error", "KVSHIM_POOL_SIZE=bad", NULL};
  kvs_config_t o;
  cr_expect_eq(kvs_config_load(&o, env, KVS_OPTIONS_APPLY_LOG), 1);
  cr_expect_str_eq(log_text(fd), "", "KVSHIM_LOG=error silences warnings");
  cr_expect_eq(kvs_log_get_level(), KVS_LOG_ERROR);
}

Test(options, run_dir_follows_xdg_runtime_dir) {
  kvs_config_t o;
  char *env[] = {"XDG_RUNTIME_DIR=/run/user/42", NULL};
  kvs_config_load(&o, env, 0);
  cr_expect_str_eq(o.core.run_dir, "/run/user/42/kvshim");
  char *env2[] = {"XDG_RUNTIME_DIR=relative", NULL};
  kvs_config_load(&o, env2, 0);
  char want[64];
  snprintf(want, sizeof want, "/tmp/kvshim-%u", (unsigned)getuid());
  cr_expect_str_eq(o.core.run_dir, want, "a relative XDG_RUNTIME_DIR is ignored");
}

Test(options, render_lists_every_row) {
  kvs_config_t o;
  char *env[] = {"KVSHIM_POOL_SIZE=3G", "KVSHIM_HOOKS=llama", "KVSHIM_STRATEGY=shm", NULL};
  kvs_config_load(&o, env, 0);
  char buf[8192];
  size_t n = kvs_config_render(&o, buf, sizeof buf);
  cr_assert_lt(n, sizeof buf);
  cr_expect_eq(count_of(buf, "\n"), KVS_OPT__COUNT);
  for (int i = 0; i < KVS_OPT__COUNT; i++) {
    char row[64];
    snprintf(row, sizeof row, "%s=", kvs_config_env_name((kvs_option_id_t)i));
    cr_expect(strstr(buf, row) != NULL, "%s missing", row);
  }
  cr_expect(strstr(buf, "KVSHIM_POOL_SIZE=3G (env)") != NULL, "%s", buf);
  cr_expect(strstr(buf, "KVSHIM_HOOKS=llama (env)") != NULL);
  cr_expect(strstr(buf, "KVSHIM_STRATEGY=shm (env)") != NULL);
  cr_expect(strstr(buf, "KVSHIM_ENABLE=1 (default)") != NULL);
  /* Cut output stays NUL-terminated and reports the full length. */
  char small[16];
  cr_expect_eq(kvs_config_render(&o, small, sizeof small), n);
  cr_expect_eq(strlen(small), sizeof small - 1);
}

/* Every row's rendered value parses back to the same value (format and parse agree). */
Test(options, format_parses_back) {
  kvs_config_t o, back;
  char *env[] = {"KVSHIM_POOL_SIZE=1536M", "KVSHIM_HOOKS=cuda,llama,kvo", "KVSHIM_SALT=x", NULL};
  kvs_config_load(&o, env, 0);
  kvs_config_defaults(&back);
  for (int i = 0; i < KVS_OPT__COUNT; i++) {
    char v[KVS_OPT_STR_MAX + 8];
    kvs_config_format_value(&o, (kvs_option_id_t)i, v, sizeof v);
    if (i == KVS_OPT_run_dir || v[0] || i == KVS_OPT_pool_name || i == KVS_OPT_allow_uids ||
        i == KVS_OPT_log_file || i == KVS_OPT_stats || i == KVS_OPT_salt)
      cr_expect_eq(kvs_config_set(&back, (kvs_option_id_t)i, v), 0, "row %d value '%s'", i, v);
  }
  memcpy(back.core.source, o.core.source, sizeof o.core.source);
  back.core.unknown_vars = o.core.unknown_vars;
  cr_expect_eq(memcmp(&o, &back, sizeof o), 0);
}

Test(options, set_and_find_for_the_cli) {
  kvs_option_id_t id;
  cr_assert_eq(kvs_config_find("KVSHIM_POOL_SIZE", &id), 0);
  cr_expect_eq(id, KVS_OPT_pool_size);
  cr_assert_eq(kvs_config_find("lease_ms", &id), 0);
  cr_expect_eq(id, KVS_OPT_lease_ms);
  cr_expect_eq(kvs_config_find("KVSHIM_NOPE", &id), -ENOENT);
  kvs_config_t o;
  kvs_config_defaults(&o);
  cr_expect_eq(kvs_config_set(&o, KVS_OPT_lease_ms, "5"), -ERANGE);
  cr_expect_eq(o.core.lease_ms, 30000, "unchanged after a refused set");
  cr_expect_eq(kvs_config_set(&o, KVS_OPT_lease_ms, "50"), 0);
  cr_expect_eq(o.core.lease_ms, 50);
}

/* What the CLI prints for a refused flag value: what the row takes, as the warnings say it. */
Test(options, refused_values_are_described) {
  char buf[192];
  kvs_config_t o;
  kvs_config_defaults(&o);
  const kvs_option_table_t *t = kvs_config_rows();
  int rc = kvs_config_set(&o, KVS_OPT_disk_sync, "sometimes");
  cr_assert_eq(rc, -EINVAL);
  cr_expect_str_eq(kvs_options_describe_bad(t, KVS_OPT_disk_sync, rc, buf, sizeof buf),
                   "is not one of none|batch|always");
  rc = kvs_config_set(&o, KVS_OPT_lease_ms, "5");
  cr_assert_eq(rc, -ERANGE);
  cr_expect_str_eq(kvs_options_describe_bad(t, KVS_OPT_lease_ms, rc, buf, sizeof buf),
                   "is out of range [10, 86400000] ms");
  rc = kvs_config_set(&o, KVS_OPT_pool_size, "12Q");
  cr_assert_eq(rc, -EINVAL);
  cr_expect_str_eq(kvs_options_describe_bad(t, KVS_OPT_pool_size, rc, buf, sizeof buf),
                   "is not a size in bytes (suffix K/M/G/T, KiB/MiB/GiB/TiB)");
  cr_expect_str_eq(kvs_options_describe_bad(t, (kvs_option_id_t)t->n, -EINVAL, buf, sizeof buf),
                   "is not valid");
}

Test(options, allowed_uids) {
  kvs_config_t o;
  char *env[] = {"KVSHIM_ALLOW_UIDS=1000,65534", NULL};
  kvs_config_load(&o, env, 0);
  cr_expect(kvs_options_uid_allowed(&o.core, getuid()));
  cr_expect(kvs_options_uid_allowed(&o.core, 1000));
  cr_expect(kvs_options_uid_allowed(&o.core, 65534));
  cr_expect_not(kvs_options_uid_allowed(&o.core, 1001) && getuid() != 1001);
  cr_expect_not(kvs_options_uid_allowed(&o.core, 100) && getuid() != 100);
}

Test(options, long_strings_are_refused) {
  char big[KVS_OPT_STR_MAX + 32] = "KVSHIM_SALT=";
  memset(big + 12, 'a', KVS_OPT_STR_MAX + 5);
  big[12 + KVS_OPT_STR_MAX + 5] = '\0';
  char *env[] = {big, NULL};
  kvs_config_t o;
  int fd = log_capture(KVS_LOG_WARN);
  cr_expect_eq(kvs_config_load(&o, env, 0), 1);
  cr_expect_str_eq(o.core.salt, "");
  cr_expect(strstr(log_text(fd), "KVSHIM_SALT") != NULL);
}
