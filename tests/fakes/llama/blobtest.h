/* tests/fakes/llama: building and resealing llama blobs (shims/llama/blob.h) in tests: the unit
 * tests make valid blobs and damage them, the hosts damage the pool's. */
#ifndef KVSHIM_TESTS_BLOBTEST_H
#define KVSHIM_TESTS_BLOBTEST_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"

/* Recompute the checksum of the blob b (len bytes) in place, after a change on purpose. */
static inline void blob_reseal(uint8_t *b, uint64_t len) {
  uint64_t c = kvs__llama_blob_checksum(b, len);
  memcpy(b + offsetof(kvs__llama_blob_hdr_t, checksum), &c, sizeof c);
}

/* A zeroed blob of n tokens and a state of state bytes (*len in all; NULL when out of memory,
 * the caller frees it) and its header *h with the fields every valid blob of kind has, of model
 * fp in namespace ns. The caller fills the rest, then blob_seal()s. */
static inline uint8_t *blob_new(kvs__llama_blob_hdr_t *h, uint32_t kind, uint32_t n,
                                uint64_t state, const uint8_t fp[KVS_LLAMA_FP_SIZE], kvs_key_t ns,
                                uint64_t *len) {
  *len = KVS_LLAMA_BLOB_HDR + 4ull * n + state;
  memset(h, 0, sizeof *h);
  h->magic = KVS_LLAMA_BLOB_MAGIC;
  h->version = KVS_LLAMA_BLOB_VERSION;
  h->hdr_size = (uint16_t)KVS_LLAMA_BLOB_HDR;
  h->kind = kind;
  h->n_tokens = n;
  h->state_size = state;
  memcpy(h->model_fp, fp, KVS_LLAMA_FP_SIZE);
  h->ns_lo = ns.lo;
  h->ns_hi = ns.hi;
  return calloc(1, (size_t)*len);
}

/* Write the header h into b with its checksum over the whole blob. */
static inline void blob_seal(uint8_t *b, kvs__llama_blob_hdr_t *h, uint64_t len) {
  memcpy(b, h, sizeof *h);
  h->checksum = kvs__llama_blob_checksum(b, len);
  memcpy(b, h, sizeof *h);
}

#endif
