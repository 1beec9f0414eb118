/* libFuzzer harness for the llama.cpp state-API blob check (shims/llama: kvs__llama_blob_check,
 * design §10.2). The harness touches the code under test through ONE call, check() below, so
 * it can be repointed when the blob formats are unified (shims/llama/blob.c).
 *
 * Properties (abort() = a finding): the check never reads outside the input (ASan) and returns
 * a known status with a name; an accepted blob satisfies every invariant its header promises:
 * length == header + 4 n_tokens + state_size, state_size >= 8, the state starts with the state
 * magic, the model fingerprint is the one asked for; the header copy equals the input's bytes.
 * The input is copied into an exactly-sized heap buffer so any overread is caught.
 * Seeds: tests/fuzz/corpus/fuzz_llama_blob/ (gen_llama_corpus.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llama_internal.h"

static const uint8_t FP[KVS_LLAMA_FP_SIZE] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static int check(const uint8_t *b, uint64_t n, kvs__llama_blob_hdr_t *h) {
  return (int)kvs__llama_blob_check(b, n, FP, h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *b = malloc(size ? size : 1);
  if (!b) return 0;
  memcpy(b, data, size);
  kvs__llama_blob_hdr_t h;
  int st = check(b, size, &h);
  if (st < KVS_LLAMA_BLOB_OK || st > KVS_LLAMA_BLOB_CHECKSUM) abort();
  if (st == KVS_LLAMA_BLOB_OK) {
    if (size < KVS_LLAMA_BLOB_HDR || memcmp(&h, b, sizeof h) != 0) abort();
    if ((uint64_t)size != KVS_LLAMA_BLOB_HDR + 4ull * h.n_tokens + h.state_size) abort();
    if (h.state_size < KVS_LLAMA_STATE_HDR) abort();
    uint32_t m;
    memcpy(&m, b + KVS_LLAMA_BLOB_HDR + 4ull * h.n_tokens, 4);
    if (m != KVS_LLAMA_STATE_MAGIC || memcmp(h.model_fp, FP, sizeof FP) != 0) abort();
  }
  free(b);
  return 0;
}
