/* tests/shims/cuda: small helpers shared by the CUDA benchmark programs. */
#ifndef KVSHIM_TESTS_CUDA_BENCHUTIL_H
#define KVSHIM_TESTS_CUDA_BENCHUTIL_H

#include <time.h>

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
/* qsort comparator for doubles. */
static inline int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#endif
