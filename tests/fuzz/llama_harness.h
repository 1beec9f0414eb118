/* tests/fuzz: what the llama blob harnesses share. fuzz_llama_blob.c checks blobs that
 * gen_llama_corpus.c writes, so both take the expected fingerprint, namespace and chunk size from
 * here; each links shims/llama/blob.c without the runtime, so this header also defines the two
 * runtime symbols blob.c's flows reference (never called here). Included by exactly one file of
 * each executable. */
#ifndef KVSHIM_TESTS_FUZZ_LLAMA_HARNESS_H
#define KVSHIM_TESTS_FUZZ_LLAMA_HARNESS_H

#include <stdint.h>

#include "blob.h"
#include "runtime.h"

/* The seeds' model fingerprint, namespace and chunk tokens. */
static const uint8_t FP[KVS_LLAMA_FP_SIZE] = {1, 2,  3,  4,  5,  6,  7,  8,
                                              9, 10, 11, 12, 13, 14, 15, 16};
#define NS_LO 0x1111111111111111ull
#define NS_HI 0x2222222222222222ull
#define CHUNK 16u

/* blob.c's flows raise libkvshim's re-entry depth (runtime/runtime.c defines it) and ask the
 * runtime for the cache peer; no flow runs in a harness. */
__thread int kvs__hook_depth;
uint64_t kvs__runtime_cache_peer(kvs__runtime_t *rt) {
  (void)rt;
  return 0;
}

#endif
