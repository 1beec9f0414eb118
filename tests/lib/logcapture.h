/* tests/lib: core/log's output captured in a memfd (kvs_log_set_fd) for the tests that check
 * what is logged. Each test runs in its own process, so one capture per test. */
#ifndef KVSHIM_TESTS_LOGCAPTURE_H
#define KVSHIM_TESTS_LOGCAPTURE_H

#include <criterion/criterion.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"

/* Sends the log to a new memfd and returns it; level < 0 leaves the level as it is. */
static inline int log_capture(int level) {
  int fd = memfd_create("log", 0);
  cr_assert_geq(fd, 0);
  kvs_log_set_fd(fd);
  if (level >= 0) kvs_log_set_level((kvs_log_level_t)level);
  return fd;
}

/* Everything logged to fd so far (a static buffer, overwritten by the next call). */
static inline const char *log_text(int fd) {
  static char buf[1 << 17];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  buf[n > 0 ? n : 0] = '\0';
  return buf;
}

/* How many times needle occurs in s (not overlapping). */
static inline int count_of(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

#endif
