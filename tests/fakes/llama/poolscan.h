/* Test hosts scan kvshim's pool mapping for blobs to corrupt. The scan walks free extents too,
 * which kvshim poisons under ASan: read through peek() (uninstrumented), and skip candidates
 * in freed extents (stale copies, not the live object). */
#ifndef KVSHIM_TESTS_POOLSCAN_H
#define KVSHIM_TESTS_POOLSCAN_H

#include <stddef.h>

#if defined(KVSHIM_ASAN) || defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define in_free_extent(p, n) (__asan_region_is_poisoned((void *)(p), (n)) != NULL)
#else
#define in_free_extent(p, n) 0
#endif

__attribute__((no_sanitize("address"))) static inline void peek(void *dst, const void *src,
                                                                 size_t n) {
  volatile const unsigned char *s = src;
  unsigned char *d = dst;
  for (size_t i = 0; i < n; i++) d[i] = s[i];
}

#endif
