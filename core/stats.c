/* kvshim stats: see stats.h. */
#include "stats.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static const kvs_stat_row_t core_rows[KVS_STAT__CORE] = {KVS_CORE_STATS(KVS_STAT_ROW)};
static const kvs_stat_table_t core_table = {core_rows, KVS_STAT__CORE};
_Static_assert(KVS_STAT__CORE <= KVS_STATS_MAX, "core's stats fit a block");

/* The process's table: core's until kvs_stats_use_table. */
static const kvs_stat_table_t *g_table = &core_table;

static const kvs_stat_table_t *table(void) { return __atomic_load_n(&g_table, __ATOMIC_ACQUIRE); }

int kvs_stats_use_table(const kvs_stat_table_t *t) {
  if (!t || t->n < KVS_STAT__CORE || t->n > KVS_STATS_MAX) return -EINVAL;
  for (unsigned i = 0; i < KVS_STAT__CORE; i++)
    if (strcmp(t->rows[i].name, core_rows[i].name) != 0) return -EINVAL;
  __atomic_store_n(&g_table, t, __ATOMIC_RELEASE);
  return 0;
}

unsigned kvs_stats_count(void) { return table()->n; }

static int is_gauge(const kvs_stat_table_t *t, kvs_stat_id_t id) {
  return id < t->n && t->rows[id].kind == 'G';
}

static kvs_stats_t global_stats = {KVS_STATS_VERSION, sizeof(kvs_stats_t), {{0}}};

void kvs_stats_init(kvs_stats_t *st) {
  memset(st, 0, sizeof *st);
  st->version = KVS_STATS_VERSION;
  st->size = sizeof *st;
}
kvs_stats_t *kvs_stats_global(void) { return &global_stats; }

/* Stripes: threads take them round robin in the order of their first update, so the first
 * KVS_STATS_STRIPES threads that update stats each have rows of their own. */
__thread uint32_t kvs__stats_stripe_tls __attribute__((tls_model("initial-exec")));
static uint32_t next_stripe;

uint32_t kvs__stats_stripe_pick(void) {
  uint32_t s = __atomic_fetch_add(&next_stripe, 1, __ATOMIC_RELAXED) % KVS_STATS_STRIPES;
  kvs__stats_stripe_tls = s + 1;
  return s;
}

void kvs_stats_set(kvs_stats_t *st, kvs_stat_id_t id, uint64_t val) {
  for (unsigned k = 1; k < KVS_STATS_STRIPES; k++)
    __atomic_store_n(&st->row[k][id], 0, __ATOMIC_RELAXED);
  __atomic_store_n(&st->row[0][id], val, __ATOMIC_RELAXED);
}

uint64_t kvs_stats_get(const kvs_stats_t *st, kvs_stat_id_t id) {
  uint64_t v = 0;
  for (unsigned k = 0; k < KVS_STATS_STRIPES; k++)
    v += __atomic_load_n(&st->row[k][id], __ATOMIC_RELAXED);
  if ((int64_t)v < 0 && is_gauge(table(), id)) return 0; /* deltas in flight (stats.h) */
  return v;
}

const char *kvs_stats_name(kvs_stat_id_t id) {
  const kvs_stat_table_t *t = table();
  return id < t->n ? t->rows[id].name : "?";
}
const char *kvs_stats_help(kvs_stat_id_t id) {
  const kvs_stat_table_t *t = table();
  return id < t->n ? t->rows[id].help : "?";
}
int kvs_stats_is_gauge(kvs_stat_id_t id) { return is_gauge(table(), id); }
int kvs_stats_find(const char *name, kvs_stat_id_t *out) {
  const kvs_stat_table_t *t = table();
  for (unsigned i = 0; i < t->n; i++)
    if (strcmp(t->rows[i].name, name) == 0) {
      *out = i;
      return 0;
    }
  return -ENOENT;
}
void kvs_stats_snapshot(const kvs_stats_t *src, kvs_stats_t *dst) {
  kvs_stats_init(dst);
  for (unsigned i = 0; i < KVS_STATS_MAX; i++) dst->row[0][i] = kvs_stats_get(src, i);
}

/* Append with snprintf semantics: *len counts what the whole text needs. */
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = *len < cap ? cap - *len : 0;
  int n = vsnprintf(room ? buf + *len : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0) *len += (size_t)n;
}

/* INFO text (key:value lines) or JSON, both walking the one name table. */
static size_t render(const kvs_stats_t *st, char *buf, size_t cap, bool json) {
  const kvs_stat_table_t *t = table();
  size_t len = 0;
  if (cap) buf[0] = '\0';
  put(buf, cap, &len, json ? "{\"kvshim_stats_version\":%u" : "# kvshim stats v%u\r\n",
      KVS_STATS_VERSION);
  for (unsigned i = 0; i < t->n; i++)
    put(buf, cap, &len, json ? ",\"%s\":%llu" : "%s:%llu\r\n", t->rows[i].name,
        (unsigned long long)kvs_stats_get(st, i));
  if (json) put(buf, cap, &len, "}");
  return len;
}

size_t kvs_stats_render_info(const kvs_stats_t *st, char *buf, size_t cap) {
  return render(st, buf, cap, false);
}

size_t kvs_stats_render_json(const kvs_stats_t *st, char *buf, size_t cap) {
  return render(st, buf, cap, true);
}

int kvs_stats_write_json(const kvs_stats_t *st, const char *path) {
  return kvs_stats_write_json_extra(st, NULL, path);
}

int kvs_stats_write_json_extra(const kvs_stats_t *st, const char *extra, const char *path) {
  char text[8192];
  size_t n = kvs_stats_render_json(st, text, sizeof text - 1);
  if (n >= sizeof text - 1) return -ENOBUFS;
  if (extra && *extra) { /* ...,"last":N} -> ...,"last":N,<extra>} */
    int k = snprintf(text + n - 1, sizeof text - 1 - (n - 1), ",%s}", extra);
    if (k < 0 || (size_t)k >= sizeof text - 1 - (n - 1)) return -ENOBUFS;
    n += (size_t)k - 1;
  }
  text[n++] = '\n';
  char tmp[4096];
  int k = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  if (k < 0 || (size_t)k >= sizeof tmp) return -ENAMETOOLONG;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -errno;
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, text + off, n - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      int e = -errno;
      close(fd);
      unlink(tmp);
      return e;
    }
    off += (size_t)w;
  }
  if (close(fd) < 0 || rename(tmp, path) < 0) {
    int e = -errno;
    unlink(tmp);
    return e;
  }
  return 0;
}
