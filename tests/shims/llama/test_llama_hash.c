/* Unit test of the blob checksum's fast hash (shims/llama/blob_hash.c, the dispatch in blob.c):
 * the AVX2 build and the dispatched one give XXH3_64bits_withSeed's value (the portable build,
 * as blob.h's reference kvs__llama_blob_checksum and the tests compute it) for every length
 * class of XXH3 (0..16, 17..128, 129..240, long: stripes, blocks and a tail), unaligned
 * inputs and several seeds, so a blob sealed by one build is accepted by the other. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "runtime.h"
#include "blob_hash.h"

__thread int kvs__hook_depth; /* blob.c raises it around its store work (not exercised here) */
/* ... and ask the runtime for the cache peer (no flow runs here: none). */
uint64_t kvs__runtime_cache_peer(kvs__runtime_t *rt) {
  (void)rt;
  return 0;
}

static int have_avx2(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return kvs__llama_hash_avx2_built && __builtin_cpu_supports("avx2");
#else
  return 0;
#endif
}

static uint8_t *random_bytes(size_t n, unsigned seed) {
  uint8_t *b = malloc(n + 64);
  cr_assert_not_null(b);
  srand(seed);
  for (size_t i = 0; i < n + 64; i++) b[i] = (uint8_t)rand();
  return b;
}

Test(llama_hash, same_value_as_the_portable_build) {
  static const size_t lens[] = {0,    1,    3,    8,    16,   17,    64,    128,    129,
                                200,  240,  241,  255,  256,  1023,  1024,   1025,  4096,
                                8191, 8193, 65536 + 7, 1048576 + 12345, 8200220 - 120};
  uint8_t *b = random_bytes(8200220, 7);
  static const uint64_t seeds[] = {0, 1, 0x9e3779b97f4a7c15ull};
  int avx2 = have_avx2();
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
    for (size_t off = 0; off < 3; off++)
      for (size_t s = 0; s < 3; s++) {
        uint64_t want = XXH3_64bits_withSeed(b + off, lens[i], seeds[s]);
        cr_assert_eq(kvs__llama_hash(b + off, lens[i], seeds[s]), want,
                     "dispatched hash differs: len %zu offset %zu seed %zu", lens[i], off, s);
        if (avx2)
          cr_assert_eq(kvs__llama_hash_avx2(b + off, lens[i], seeds[s]), want,
                       "AVX2 hash differs: len %zu offset %zu seed %zu", lens[i], off, s);
      }
  free(b);
}

Test(llama_hash, blob_checksum_fast_is_the_reference) {
  uint8_t *b = random_bytes(KVS_LLAMA_BLOB_HDR + 4 * 500 + 8192, 11);
  for (uint64_t len = KVS_LLAMA_BLOB_HDR; len < KVS_LLAMA_BLOB_HDR + 4 * 500 + 8192; len += 997)
    cr_assert_eq(kvs__llama_blob_checksum_fast(b, len), kvs__llama_blob_checksum(b, len),
                 "blob length %llu", (unsigned long long)len);
  free(b);
}

/* On x86-64 with GCC or Clang the AVX2 build is there (the speed of a restore's check rests on
 * it, docs/PERF.md section 6); whether the CPU runs it is the dispatch's business. */
Test(llama_hash, avx2_build_present_on_x86_64) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__AVX2__)
  cr_assert_eq(kvs__llama_hash_avx2_built, 1);
#else
  cr_assert(1);
#endif
}

/* The streaming form (kvs__llama_hasher_*, what chunk assembly checks a chunk with while it
 * copies it): any split of a buffer into consecutive pieces, of every length class, gives
 * kvs__llama_hash's value of the whole, for several seeds; a changed byte changes it. */
Test(llama_hash, pieces_give_the_value_of_the_whole) {
  uint8_t *b = random_bytes(3 * 1048576, 11);
  static const size_t lens[] = {0, 5, 17, 200, 240, 241, 1024, 70000, 3 * 1048576};
  static const size_t pieces[] = {1, 3, 12, 64, 240, 1000, 262144};
  static const uint64_t seeds[] = {0, 1, 0x9e3779b97f4a7c15ull};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
    for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++)
      for (size_t s = 0; s < 3; s++) {
        if (lens[i] / pieces[p] > 20000) continue; /* keep it quick */
        kvs__llama_hasher_t h;
        kvs__llama_hasher_init(&h, seeds[s]);
        for (size_t o = 0; o < lens[i]; o += pieces[p])
          kvs__llama_hasher_update(&h, b + 1 + o,
                                   lens[i] - o < pieces[p] ? lens[i] - o : pieces[p]);
        cr_assert_eq(kvs__llama_hasher_digest(&h), XXH3_64bits_withSeed(b + 1, lens[i], seeds[s]),
                     "len %zu in pieces of %zu, seed %zu", lens[i], pieces[p], s);
      }
  kvs__llama_hasher_t h;
  kvs__llama_hasher_init(&h, 7);
  kvs__llama_hasher_update(&h, b, 5000);
  b[4999] ^= 1;
  cr_assert_neq(kvs__llama_hasher_digest(&h), XXH3_64bits_withSeed(b, 5000, 7));
  free(b);
}
