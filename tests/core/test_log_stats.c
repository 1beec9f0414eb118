/* core/log and core/stats: format, levels, rate limit, cut lines; counters, INFO and JSON. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "stats.h"
#include "../lib/logcapture.h"
#include "../lib/threads.h"

Test(log, prefix_level_and_newline) {
  int fd = log_capture(-1);
  kvs_log_set_level(KVS_LOG_INFO);
  kvs_log_info("pool of %d MiB", 64);
  char want[128];
  snprintf(want, sizeof want, "kvshim[%ld]: info: pool of 64 MiB\n", (long)getpid());
  cr_expect_str_eq(log_text(fd), want);
}

Test(log, levels_filter_before_formatting) {
  int fd = log_capture(-1);
  kvs_log_set_level(KVS_LOG_WARN);
  kvs_log_debug("hidden %s", "debug");
  kvs_log_info("hidden info");
  kvs_log_warn("shown warn");
  kvs_log_error("shown error");
  const char *t = log_text(fd);
  cr_expect_eq(count_of(t, "hidden"), 0, "%s", t);
  cr_expect_eq(count_of(t, "shown"), 2, "%s", t);
  kvs_log_set_level(KVS_LOG_OFF);
  kvs_log_error("off means off");
  cr_expect_eq(count_of(log_text(fd), "off means off"), 0);
}

Test(log, errno_is_preserved) {
  log_capture(-1);
  kvs_log_set_level(KVS_LOG_WARN);
  errno = EAGAIN;
  kvs_log_warn("x");
  cr_expect_eq(errno, EAGAIN);
}

Test(log, long_lines_are_cut_and_marked) {
  int fd = log_capture(-1);
  kvs_log_set_level(KVS_LOG_WARN);
  char big[4000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  kvs_log_warn("%s", big);
  const char *t = log_text(fd);
  cr_expect_eq(strlen(t), KVS_LOG_LINE_MAX, "len %zu", strlen(t));
  cr_expect(strstr(t, "...\n") != NULL);
  cr_expect_eq(t[strlen(t) - 1], '\n');
}

Test(log, rate_limited_within_a_second) {
  int fd = log_capture(-1);
  kvs_log_set_level(KVS_LOG_WARN);
  unsigned long before = kvs_log_dropped();
  /* Spin until a fresh second starts, so the whole burst lands in one window. */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long start = ts.tv_sec;
  do clock_gettime(CLOCK_MONOTONIC, &ts); while (ts.tv_sec == start);
  for (int i = 0; i < 200; i++) kvs_log_warn("line %d", i);
  int lines = count_of(log_text(fd), "\n");
  cr_expect_leq(lines, KVS_LOG_BURST, "%d lines written", lines);
  cr_expect_geq(lines, KVS_LOG_BURST - 1);
  cr_expect_geq(kvs_log_dropped() - before, 200 - KVS_LOG_BURST);
  /* The next window reports how many were suppressed. */
  sleep(1);
  kvs_log_warn("after");
  cr_expect(strstr(log_text(fd), "lines suppressed") != NULL, "%s", log_text(fd) + strlen(log_text(fd)) - 80);
}

Test(stats, names_are_unique_and_found) {
  for (int i = 0; i < KVS_STAT__CORE; i++) {
    kvs_stat_id_t id;
    cr_assert_eq(kvs_stats_find(kvs_stats_name((kvs_stat_id_t)i), &id), 0);
    cr_expect_eq((int)id, i, "duplicate name %s", kvs_stats_name((kvs_stat_id_t)i));
    cr_expect_neq(kvs_stats_help((kvs_stat_id_t)i)[0], '\0');
  }
  kvs_stat_id_t id;
  cr_expect_eq(kvs_stats_find("no_such_counter", &id), -ENOENT);
  cr_expect(kvs_stats_is_gauge(KVS_STAT_store_used_bytes));
  cr_expect_not(kvs_stats_is_gauge(KVS_STAT_store_commits));
}

Test(stats, counters_and_info_text) {
  kvs_stats_t st;
  kvs_stats_init(&st);
  cr_expect_eq(st.version, KVS_STATS_VERSION);
  cr_expect_eq(st.size, sizeof st);
  kvs_stats_inc(&st, KVS_STAT_store_commits);
  kvs_stats_add(&st, KVS_STAT_peer_bytes_in, 1234567);
  kvs_stats_set(&st, KVS_STAT_store_used_bytes, 42);
  kvs_stats_set(&st, KVS_STAT_store_used_bytes, 40);
  char buf[16384];
  size_t n = kvs_stats_render_info(&st, buf, sizeof buf);
  cr_assert_lt(n, sizeof buf);
  cr_expect_eq(strlen(buf), n);
  cr_expect(strncmp(buf, "# kvshim stats v1\r\n", 19) == 0);
  cr_expect(strstr(buf, "\r\nstore_commits:1\r\n") != NULL);
  cr_expect(strstr(buf, "\r\npeer_bytes_in:1234567\r\n") != NULL);
  cr_expect(strstr(buf, "\r\nstore_used_bytes:40\r\n") != NULL);
  cr_expect_eq(count_of(buf, "\r\n"), KVS_STAT__CORE + 1);
  char small[10];
  cr_expect_eq(kvs_stats_render_info(&st, small, sizeof small), n, "needed length reported");
  cr_expect_eq(strlen(small), sizeof small - 1);
}

/* The JSON rendering is checked by a real parser (python3's json), field by field. */
Test(stats, json_parses_and_matches) {
  kvs_stats_t st;
  kvs_stats_init(&st);
  for (int i = 0; i < KVS_STAT__CORE; i++) kvs_stats_add(&st, (kvs_stat_id_t)i, 1000u + i);
  char dir[] = "/tmp/kvs-stats-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/stats.json", dir);
  cr_assert_eq(kvs_stats_write_json(&st, path), 0);
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0);
  cr_expect_eq(sb.st_mode & 0777, 0600);
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import json,sys; d=json.load(open(\"%s\")); "
           "assert d[\"kvshim_stats_version\"]==1; "
           "v=[x for k,x in d.items() if k!=\"kvshim_stats_version\"]; "
           "assert v==list(range(1000,1000+len(v))), v; print(len(v))' > %s/n.txt",
           path, dir);
  cr_assert_eq(system(cmd), 0, "JSON did not parse or values differ");
  snprintf(path, sizeof path, "%s/n.txt", dir);
  FILE *f = fopen(path, "r");
  int fields = 0;
  cr_assert_eq(fscanf(f, "%d", &fields), 1);
  fclose(f);
  cr_expect_eq(fields, KVS_STAT__CORE);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_expect_eq(system(cmd), 0);
}

Test(stats, write_json_reports_errors) {
  kvs_stats_t st;
  kvs_stats_init(&st);
  cr_expect_eq(kvs_stats_write_json(&st, "/nonexistent-dir/x.json"), -ENOENT);
}

Test(stats, snapshot_copies_every_field) {
  kvs_stats_t st, snap;
  kvs_stats_init(&st);
  for (int i = 0; i < KVS_STAT__CORE; i++) kvs_stats_set(&st, (kvs_stat_id_t)i, 7u * i + 1);
  kvs_stats_snapshot(&st, &snap);
  cr_expect_eq(memcmp(&st, &snap, sizeof st), 0);
  kvs_stats_inc(kvs_stats_global(), KVS_STAT_store_commits);
  cr_expect_geq(kvs_stats_get(kvs_stats_global(), KVS_STAT_store_commits), 1);
}

/* Striped counters: threads updating the same fields at once each add to a row of their own,
 * and a read sums the rows exactly. */
#define STRIPE_THREADS 4
#define STRIPE_ADDS 200000u

/* One striper: STRIPE_ADDS updates of the stats t->obj once the barrier t->data lets every
 * thread go; returns the stripe its row is. */
static int stripe_body(tt_thread_t *t) {
  kvs_stats_t *st = t->obj;
  pthread_barrier_wait((pthread_barrier_t *)t->data);
  for (uint32_t i = 0; i < STRIPE_ADDS; i++) {
    kvs_stats_inc(st, KVS_STAT_store_commits);
    kvs_stats_add(st, KVS_STAT_store_evicted_bytes, 4096);
    kvs_stats_add(st, KVS_STAT_store_used_bytes, 3);             /* a gauge up ... */
    kvs_stats_add(st, KVS_STAT_store_used_bytes, (uint64_t)-2);  /* ... and down */
  }
  return (int)kvs__stats_stripe();
}

Test(stats, striped_counters_sum_exactly_across_threads, .timeout = 60) {
  static kvs_stats_t st;
  kvs_stats_init(&st);
  kvs_stats_set(&st, KVS_STAT_store_used_bytes, 1000);
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, STRIPE_THREADS);
  tt_thread_t t[STRIPE_THREADS];
  for (int i = 0; i < STRIPE_THREADS; i++)
    cr_assert_eq(tt_start(&t[i], stripe_body, &st, &go, (uint64_t)i), 0);
  for (int i = 0; i < STRIPE_THREADS; i++) tt_join(&t[i]);
  pthread_barrier_destroy(&go);
  uint64_t n = (uint64_t)STRIPE_THREADS * STRIPE_ADDS;
  cr_expect_eq(kvs_stats_get(&st, KVS_STAT_store_commits), n);
  cr_expect_eq(kvs_stats_get(&st, KVS_STAT_store_evicted_bytes), 4096 * n);
  cr_expect_eq(kvs_stats_get(&st, KVS_STAT_store_used_bytes), 1000 + n);
  /* each thread had a stripe of its own (fewer threads than stripes), and its row holds
   * exactly its own additions */
  for (int i = 0; i < STRIPE_THREADS; i++) {
    cr_assert_geq(t[i].rc, 0);
    cr_assert_lt(t[i].rc, KVS_STATS_STRIPES);
    for (int j = 0; j < i; j++) cr_expect_neq(t[i].rc, t[j].rc, "threads %d, %d", i, j);
    cr_expect_eq(st.row[t[i].rc][KVS_STAT_store_commits], STRIPE_ADDS);
  }
  /* the text renders the sums */
  char buf[16384];
  cr_assert_lt(kvs_stats_render_info(&st, buf, sizeof buf), sizeof buf);
  char want[64];
  snprintf(want, sizeof want, "\r\nstore_commits:%llu\r\n", (unsigned long long)n);
  cr_expect_not_null(strstr(buf, want), "%s", want);
}

Test(stats, set_replaces_every_row_and_a_gauge_never_reads_negative) {
  static kvs_stats_t st;
  kvs_stats_init(&st);
  kvs_stats_add(&st, KVS_STAT_store_keys, 7);
  st.row[KVS_STATS_STRIPES - 1][KVS_STAT_store_keys] = 5; /* as another thread's row */
  cr_expect_eq(kvs_stats_get(&st, KVS_STAT_store_keys), 12);
  kvs_stats_set(&st, KVS_STAT_store_keys, 3);
  cr_expect_eq(kvs_stats_get(&st, KVS_STAT_store_keys), 3);
  kvs_stats_add(&st, KVS_STAT_store_keys, (uint64_t)-4); /* a delta ahead of its +1 */
  cr_expect_eq(kvs_stats_get(&st, KVS_STAT_store_keys), 0, "a gauge is clamped at 0");
  kvs_stats_inc(&st, KVS_STAT_store_keys);
  cr_expect_eq(kvs_stats_get(&st, KVS_STAT_store_keys), 0);
  kvs_stats_inc(&st, KVS_STAT_store_keys);
  cr_expect_eq(kvs_stats_get(&st, KVS_STAT_store_keys), 1);
  kvs_stats_add(&st, KVS_STAT_store_commits, (uint64_t)-1); /* a counter is never clamped */
  cr_expect_eq(kvs_stats_get(&st, KVS_STAT_store_commits), UINT64_MAX);
}
