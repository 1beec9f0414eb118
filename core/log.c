/* kvshim log: see log.h. */
#include "log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

int kvs__log_level = KVS_LOG_WARN;
static atomic_int log_fd = 2;

/* Rate limiter: the window is one second of CLOCK_MONOTONIC. Races between threads can let a
 * few extra lines through at a window edge; that is acceptable for a log. */
static atomic_ulong window_start_s;
static atomic_uint window_count;
static atomic_ulong dropped_total;
static atomic_ulong dropped_unreported;

static const char *const level_names[] = {"off", "error", "warn", "info", "debug", "trace"};

const char *kvs_log_level_name(kvs_log_level_t level) {
  return ((unsigned)level < KVS__ARRAY_LEN(level_names)) ? level_names[level] : "?";
}

void kvs_log_set_level(kvs_log_level_t level) {
  __atomic_store_n(&kvs__log_level, (int)level, __ATOMIC_RELAXED);
}
kvs_log_level_t kvs_log_get_level(void) {
  return (kvs_log_level_t)__atomic_load_n(&kvs__log_level, __ATOMIC_RELAXED);
}
void kvs_log_set_fd(int fd) { atomic_store(&log_fd, fd); }
int kvs_log_get_fd(void) { return atomic_load(&log_fd); }
unsigned long kvs_log_dropped(void) { return atomic_load(&dropped_total); }

static int rate_allows(void) {
  unsigned long now_s = (unsigned long)(kvs__now_ms() / 1000u);
  unsigned long start = atomic_load_explicit(&window_start_s, memory_order_relaxed);
  if (now_s != start &&
      atomic_compare_exchange_strong(&window_start_s, &start, now_s))
    atomic_store(&window_count, 0);
  if (atomic_fetch_add(&window_count, 1) < KVS_LOG_BURST) return 1;
  atomic_fetch_add(&dropped_total, 1);
  atomic_fetch_add(&dropped_unreported, 1);
  return 0;
}

void kvs__vlog(kvs_log_level_t level, const char *fmt, va_list ap) {
  if ((int)level > (int)kvs_log_get_level() || level == KVS_LOG_OFF) return;
  if (!rate_allows()) return;
  int saved_errno = errno;
  char buf[KVS_LOG_LINE_MAX];
  size_t cap = sizeof buf - 1; /* room for the final newline */
  int n = snprintf(buf, cap, "kvshim[%ld]: %s: ", (long)getpid(), kvs_log_level_name(level));
  size_t len = (n > 0 && (size_t)n < cap) ? (size_t)n : 0;
  int m = vsnprintf(buf + len, cap - len, fmt, ap);
  if (m < 0) m = 0;
  if ((size_t)m >= cap - len) { /* cut: mark it */
    len = cap;
    memcpy(buf + len - 3, "...", 3);
  } else {
    len += (size_t)m;
  }
  unsigned long missed = atomic_exchange(&dropped_unreported, 0);
  if (missed && len + 40 < cap) {
    int k = snprintf(buf + len, cap - len, " (%lu lines suppressed)", missed);
    if (k > 0 && (size_t)k < cap - len) len += (size_t)k;
  }
  buf[len++] = '\n';
  ssize_t w = write(atomic_load(&log_fd), buf, len);
  (void)w; /* nowhere left to report a failed log write */
  errno = saved_errno;
}

void kvs__log(kvs_log_level_t level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kvs__vlog(level, fmt, ap);
  va_end(ap);
}

_Noreturn void kvs__debug_fail(const char *what, const char *file, int line) {
  char buf[512];
  int n = snprintf(buf, sizeof buf, "kvshim[%ld]: fatal: validator failed: %s (%s:%d)\n",
                   (long)getpid(), what, file, line);
  if (n > 0) {
    ssize_t w = write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    (void)w;
  }
  abort();
}
