/* libFuzzer harness for the GGUF metadata reader behind model fingerprints (shims/llama/model.c:
 * kvs__llama_fingerprint, which walks the general.* entries of a model file with pread).
 *
 * The input is the file: written to a memfd and fingerprinted through /proc/self/fd/N (the one
 * call into the code under test is fingerprint() below). Properties (abort() = a finding): it
 * returns 0 for any regular file (the metadata walk stops at a malformed entry, it never fails
 * the fingerprint); the info says what was walked (gguf_version 0, 2 or 3; general_keys <=
 * n_kv; size == input size); the same bytes give the same fingerprint twice. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model.h"

static int fingerprint(const char *path, uint8_t fp[KVS_LLAMA_FP_SIZE], kvs__llama_fp_info_t *i) {
  return kvs__llama_fingerprint(path, fp, i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("fuzz-gguf", MFD_CLOEXEC);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
  uint8_t a[KVS_LLAMA_FP_SIZE], b[KVS_LLAMA_FP_SIZE];
  kvs__llama_fp_info_t ia, ib;
  if (fingerprint(path, a, &ia) != 0 || fingerprint(path, b, &ib) != 0) abort();
  if (memcmp(a, b, sizeof a) != 0 || ia.size != size) abort();
  if (ia.gguf_version != 0 && ia.gguf_version != 2 && ia.gguf_version != 3) abort();
  if (ia.general_keys > ia.n_kv) abort();
  return 0;
}
