/* shims/llama/blob_hash.c: XXH3-64 with a seed, the body hash of the blob checksum (blob.h),
 * computed with AVX2 where the CPU has it. XXH3 gives the same value whatever vector unit
 * computes it (xxhash.h: "the result is the same on every platform"), so a blob sealed with one
 * is checked with the other; test_llama_hash compares it with the portable build byte for byte.
 * AVX2 halves the checksum pass of a restore (issue 15; docs/PERF.md section 6). Internal. */
#ifndef KVSHIM_LLAMA_BLOB_HASH_H
#define KVSHIM_LLAMA_BLOB_HASH_H

#include <stddef.h>
#include <stdint.h>

/* XXH3_64bits_withSeed(p, n, seed), through the AVX2 build when the CPU has AVX2 (checked
 * once), else the portable one (SSE2 on x86-64). */
uint64_t kvs__llama_hash(const void *p, size_t n, uint64_t seed);

/* The AVX2 build itself, exposed for the test: 1 in kvs__llama_hash_avx2_built where it is
 * built (x86-64, GCC or Clang); call it only then, and only where the CPU has AVX2 (every
 * instruction of it may be AVX2). */
extern const int kvs__llama_hash_avx2_built;
uint64_t kvs__llama_hash_avx2(const void *p, size_t n, uint64_t seed);

#endif
