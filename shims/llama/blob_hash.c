/* shims/llama: the blob body hash with AVX2 (blob_hash.h). This file holds only the AVX2 build
 * of XXH3: every function in it is compiled for AVX2 (the pragma below), so nothing else may
 * live here; the dispatch is in blob.c. */
#include "blob_hash.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__AVX2__)
#define KVS__HASH_AVX2 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#include <immintrin.h> /* xxhash.h includes it only under __AVX2__ (Clang's pragma sets none) */
#undef XXH_VECTOR
#define XXH_VECTOR 2 /* XXH_AVX2 (xxhash.h, "Vectorization detection") */
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

uint64_t kvs__llama_hash_avx2(const void *p, size_t n, uint64_t seed) {
  return XXH3_64bits_withSeed(p, n, seed);
}

void kvs__llama_hash_avx2_update(void *state, const void *p, size_t n) {
  (void)XXH3_64bits_update((XXH3_state_t *)state, p, n);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else /* no separate AVX2 build: the portable one (which is AVX2 itself under -mavx2) */
uint64_t kvs__llama_hash_avx2(const void *p, size_t n, uint64_t seed) {
  (void)p;
  (void)n;
  (void)seed;
  return 0;
}

void kvs__llama_hash_avx2_update(void *state, const void *p, size_t n) {
  (void)state;
  (void)p;
  (void)n;
}
#endif

#ifdef KVS__HASH_AVX2
const int kvs__llama_hash_avx2_built = 1;
#else
const int kvs__llama_hash_avx2_built = 0;
#endif
