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

static const char *const stat_names[] = {
#define KVS__STAT_NAME(name, kind, help) #name,
    KVS_STAT_FIELDS(KVS__STAT_NAME)
#undef KVS__STAT_NAME
};
static const char *const stat_help[] = {
#define KVS__STAT_HELP(name, kind, help) help,
    KVS_STAT_FIELDS(KVS__STAT_HELP)
#undef KVS__STAT_HELP
};
static const char stat_kinds[] = {
#define KVS__STAT_KIND(name, kind, help) #kind[0],
    KVS_STAT_FIELDS(KVS__STAT_KIND)
#undef KVS__STAT_KIND
};
_Static_assert(KVS__ARRAY_LEN(stat_names) == KVS_STAT__COUNT, "stat name table");

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
  if (stat_kinds[id] == 'G' && (int64_t)v < 0) return 0; /* deltas in flight (stats.h) */
  return v;
}

const char *kvs_stats_name(kvs_stat_id_t id) {
  return (unsigned)id < KVS_STAT__COUNT ? stat_names[id] : "?";
}
const char *kvs_stats_help(kvs_stat_id_t id) {
  return (unsigned)id < KVS_STAT__COUNT ? stat_help[id] : "?";
}
int kvs_stats_is_gauge(kvs_stat_id_t id) {
  return (unsigned)id < KVS_STAT__COUNT && stat_kinds[id] == 'G';
}
int kvs_stats_find(const char *name, kvs_stat_id_t *out) {
  for (unsigned i = 0; i < KVS_STAT__COUNT; i++)
    if (strcmp(stat_names[i], name) == 0) {
      *out = (kvs_stat_id_t)i;
      return 0;
    }
  return -ENOENT;
}
void kvs_stats_snapshot(const kvs_stats_t *src, kvs_stats_t *dst) {
  kvs_stats_init(dst);
  for (unsigned i = 0; i < KVS_STAT__COUNT; i++)
    dst->row[0][i] = kvs_stats_get(src, (kvs_stat_id_t)i);
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
  size_t len = 0;
  if (cap) buf[0] = '\0';
  put(buf, cap, &len, json ? "{\"kvshim_stats_version\":%u" : "# kvshim stats v%u\r\n",
      KVS_STATS_VERSION);
  for (unsigned i = 0; i < KVS_STAT__COUNT; i++)
    put(buf, cap, &len, json ? ",\"%s\":%llu" : "%s:%llu\r\n", stat_names[i],
        (unsigned long long)kvs_stats_get(st, (kvs_stat_id_t)i));
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
