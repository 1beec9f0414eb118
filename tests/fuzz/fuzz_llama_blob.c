/* libFuzzer harness for the one llama blob checker (shims/llama/blob.c: kvs__llama_blob_check,
 * design §10.2 and §10.3). Each input is checked as a SEQ blob (the state adapter) and as a
 * PREFIX blob (the prefix cache), through ONE call, check() below: first as it is, then with
 * its checksum field rewritten to the right value, so mutated headers get past the checksum
 * to the checks behind it.
 *
 * Properties (abort() = a finding): the check never reads outside the input (ASan; the input
 * is copied into an exactly-sized heap buffer) and returns a known status with a name; a
 * refusal leaves *hdr untouched; a right checksum is never refused as CHECKSUM; no input is
 * accepted as both kinds; an accepted blob satisfies every invariant its header promises
 * (blob.h):
 *     length == header + 4 n_tokens + state_size, state_size >= 8, the state magic first;
 *     magic, version, hdr_size ours and kind == the kind asked for;
 *     SEQ: keyed_tokens == chunk_tokens == canon_tokens == 0;
 *     PREFIX: chunk_tokens == ours, 0 < keyed_tokens <= n_tokens, keyed_tokens % chunk == 0,
 *             canon_tokens == 0 or keyed_tokens <= canon_tokens <= n_tokens;
 *     the fingerprint and namespace asked for; the checksum over the bytes;
 *     the header copy equals the input's bytes.
 * Seeds: tests/fuzz/corpus/fuzz_llama_blob/ (gen_llama_corpus.c: both kinds). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "llama_harness.h"
#include "runtime.h"


static int check(const uint8_t *b, uint64_t n, const kvs__llama_blob_want_t *w,
                 kvs__llama_blob_hdr_t *h) {
  return (int)kvs__llama_blob_check(b, n, w, h);
}

/* Check b as kind; abort on a broken property. Returns true when accepted. */
static bool one(const uint8_t *b, size_t size, uint32_t kind, bool sum_right) {
  const kvs__llama_blob_want_t w = {
      .kind = kind, .chunk = CHUNK, .model_fp = FP, .ns = {.lo = NS_LO, .hi = NS_HI}};
  kvs__llama_blob_hdr_t h, untouched;
  memset(&h, 0xa5, sizeof h);
  memcpy(&untouched, &h, sizeof h);
  int st = check(b, size, &w, &h);
  if (st < KVS_LLAMA_BLOB_OK || st > KVS_LLAMA_BLOB_CHECKSUM) abort();
  const char *name = kvs__llama_blob_status_name((kvs__llama_blob_status_t)st);
  if (!name || strcmp(name, "unknown") == 0) abort();
  if (st == KVS_LLAMA_BLOB_CHECKSUM && sum_right) abort();
  if (st != KVS_LLAMA_BLOB_OK) {
    if (memcmp(&h, &untouched, sizeof h) != 0) abort();
    return false;
  }
  if (size < KVS_LLAMA_BLOB_HDR || memcmp(&h, b, sizeof h) != 0) abort();
  if ((uint64_t)size != KVS_LLAMA_BLOB_HDR + 4ull * h.n_tokens + h.state_size) abort();
  if (h.magic != KVS_LLAMA_BLOB_MAGIC || h.version != KVS_LLAMA_BLOB_VERSION ||
      h.hdr_size != KVS_LLAMA_BLOB_HDR || h.kind != kind)
    abort();
  if (kind == KVS_LLAMA_BLOB_KIND_SEQ &&
      (h.keyed_tokens != 0 || h.chunk_tokens != 0 || h.canon_tokens != 0))
    abort();
  /* PREFIX: canon_tokens 0 (the keyed tokens, older blobs) or keyed <= canon <= n_tokens */
  if (kind == KVS_LLAMA_BLOB_KIND_PREFIX &&
      (h.chunk_tokens != CHUNK || h.keyed_tokens == 0 || h.keyed_tokens > h.n_tokens ||
       h.keyed_tokens % CHUNK != 0 ||
       (h.canon_tokens != 0 &&
        (h.canon_tokens < h.keyed_tokens || h.canon_tokens > h.n_tokens))))
    abort();
  if (h.state_size < KVS_LLAMA_STATE_HDR) abort();
  uint32_t m;
  memcpy(&m, b + KVS_LLAMA_BLOB_HDR + 4ull * h.n_tokens, 4);
  if (m != KVS_LLAMA_STATE_MAGIC || memcmp(h.model_fp, FP, sizeof FP) != 0) abort();
  if (h.ns_lo != NS_LO || h.ns_hi != NS_HI) abort();
  if (kvs__llama_blob_checksum(b, size) != h.checksum) abort();
  return true;
}

/* Both kinds; with_sum: the checksum field rewritten to the bytes' checksum first, so mutated
 * headers reach the checks behind the checksum (a blob whose checksum is right is never refused
 * as CHECKSUM: that property is checked in one()). */
static void both(uint8_t *b, size_t size, bool with_sum) {
  if (with_sum) {
    if (size < KVS_LLAMA_BLOB_HDR) return;
    uint64_t sum = kvs__llama_blob_checksum(b, size);
    memcpy(b + offsetof(kvs__llama_blob_hdr_t, checksum), &sum, sizeof sum);
  }
  bool seq = one(b, size, KVS_LLAMA_BLOB_KIND_SEQ, with_sum);
  bool prefix = one(b, size, KVS_LLAMA_BLOB_KIND_PREFIX, with_sum);
  if (seq && prefix) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *b = malloc(size ? size : 1);
  if (!b) return 0;
  memcpy(b, data, size);
  both(b, size, false);
  both(b, size, true);
  free(b);
  return 0;
}
