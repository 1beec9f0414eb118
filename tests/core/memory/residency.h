/* Unit-test helper: how many 4 KiB pages of a mapping are resident (mincore), for the pool's
 * prefault tests (test_pool.c, test_pool_lean.c). */
#ifndef KVSHIM_TEST_RESIDENCY_H
#define KVSHIM_TEST_RESIDENCY_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#ifndef PG
#define PG 4096ull
#endif

static inline size_t resident_pages(const uint8_t *addr, size_t len) {
  size_t n = len / PG, count = 0;
  unsigned char *vec = malloc(n);
  cr_assert_not_null(vec);
  cr_assert_eq(mincore((void *)addr, len, vec), 0);
  for (size_t i = 0; i < n; i++) count += vec[i] & 1;
  free(vec);
  return count;
}

#endif
