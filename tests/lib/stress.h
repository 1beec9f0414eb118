/* stress.h: what the plain-program stress tests share (they run without Criterion so the TSan
 * leg can run them): fail() names the test and the process and ends the process at once, CHECK,
 * and a seeded xorshift64* generator (deterministic per seed, so a failing seed replays).
 * Define STRESS_NAME (a string) before including. */
#ifndef KVS_TESTS_STRESS_H
#define KVS_TESTS_STRESS_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#ifndef STRESS_NAME
#error "define STRESS_NAME before including stress.h"
#endif

__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s[%ld]: FAIL: ", STRESS_NAME, (long)getpid());
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  _exit(1);
}
#define CHECK(cond, ...)                                                                      \
  do {                                                                                        \
    if (!(cond)) fail(__VA_ARGS__);                                                           \
  } while (0)

static inline uint64_t rnd(uint64_t *s) { /* xorshift64*: *s must not be 0 */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}
static inline uint32_t below(uint64_t *s, uint32_t n) { return (uint32_t)(rnd(s) % n); }

#endif
