/* libFuzzer harness for the prefix-cache blob check (shims/llama: kvs__px_blob_check, design
 * §10.3). The harness touches the code under test through ONE call, check() below, so it can
 * be repointed when the blob formats are unified (shims/llama/blob.c).
 *
 * Properties (abort() = a finding): no read outside the input (ASan; the input is copied into
 * an exactly-sized heap buffer); a known status; an accepted blob satisfies every invariant of
 * its header: length == header + 4 n_tokens + state_size, 0 < keyed_tokens <= n_tokens and a
 * multiple of the chunk asked for, reserved 0, state_size >= 8 and the state magic first, the
 * fingerprint and namespace asked for; the header copy equals the input's bytes.
 * Seeds: tests/fuzz/corpus/fuzz_prefix_blob/ (gen_llama_corpus.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "prefix.h"

static const uint8_t FP[KVS_PX_FP_SIZE] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const kvs_key_t NS = {0x1111111111111111ull, 0x2222222222222222ull};
#define CHUNK 16u

static int check(const uint8_t *b, uint64_t n, kvs__px_blob_hdr_t *h) {
  return (int)kvs__px_blob_check(b, n, FP, NS, CHUNK, h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *b = malloc(size ? size : 1);
  if (!b) return 0;
  memcpy(b, data, size);
  kvs__px_blob_hdr_t h;
  int st = check(b, size, &h);
  if (st < KVS_PX_BLOB_OK || st > KVS_PX_BLOB_CHECKSUM) abort();
  if (st == KVS_PX_BLOB_OK) {
    if (size < KVS_PX_BLOB_HDR || memcmp(&h, b, sizeof h) != 0) abort();
    if ((uint64_t)size != KVS_PX_BLOB_HDR + 4ull * h.n_tokens + h.state_size) abort();
    if (h.keyed_tokens == 0 || h.keyed_tokens > h.n_tokens || h.keyed_tokens % CHUNK) abort();
    if (h.reserved != 0 || h.chunk_tokens != CHUNK || h.state_size < KVS_PX_STATE_HDR) abort();
    uint32_t m;
    memcpy(&m, b + KVS_PX_BLOB_HDR + 4ull * h.n_tokens, 4);
    if (m != KVS_PX_STATE_MAGIC || memcmp(h.model_fp, FP, sizeof FP) != 0) abort();
    if (h.ns_lo != NS.lo || h.ns_hi != NS.hi) abort();
  }
  free(b);
  return 0;
}
