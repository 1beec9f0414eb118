/* shims/llama/blob_hash.c: XXH3-64 with a seed built for AVX2, the body hash of the blob
 * checksum (blob.h) where the CPU has AVX2; the dispatch (kvs__llama_hash) is in blob.c. Every
 * XXH3 build gives the same value (xxhash.h, XXH3 family: "all implementations generage exactly
 * the same hash value on all platforms"), so a blob sealed with one is checked with the other;
 * test_llama_hash compares it with the portable build. It cuts the checksum pass of a restore
 * (issue 15; docs/PERF.md section 6.3). Internal. */
#ifndef KVSHIM_LLAMA_BLOB_HASH_H
#define KVSHIM_LLAMA_BLOB_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The AVX2 build itself, exposed for the test: 1 in kvs__llama_hash_avx2_built where it is
 * built (x86-64, GCC or Clang); call it only then, and only where the CPU has AVX2 (every
 * instruction of it may be AVX2). */
extern const int kvs__llama_hash_avx2_built;
uint64_t kvs__llama_hash_avx2(const void *p, size_t n, uint64_t seed);
/* XXH3_64bits_update of an XXH3_state_t (kvs__llama_hasher_t's state), AVX2 build. */
void kvs__llama_hash_avx2_update(void *state, const void *p, size_t n);

#endif
