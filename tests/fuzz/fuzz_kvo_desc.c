/* libFuzzer harness for the kvo descriptor check (shims/kvo/include/kvshim/kvo.h:
 * kvo_desc_check, the validity rule every kvo implementation and kvshim's hooks apply).
 *
 * The input is the descriptor's bytes (a short input is zero-padded, like a caller's struct).
 * Properties (abort() = a finding): the check returns 0, -EINVAL or -EPROTO; an accepted
 * descriptor has the ABI version and size, a NUL-terminated model id, rank < world_size and a
 * non-zero chunk_bytes equal to kvo_desc_chunk_bytes (dimensions times dtype size). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvshim/kvo.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kvo_desc_t d;
  memset(&d, 0, sizeof d);
  memcpy(&d, data, size < sizeof d ? size : sizeof d);
  int rc = kvo_desc_check(&d);
  if (rc != 0 && rc != -EINVAL && rc != -EPROTO) abort();
  if (rc == 0) {
    if (d.abi_version != KVO_ABI_VERSION || d.size < KVO_DESC_SIZE_V1) abort();
    if (!memchr(d.model_id, 0, KVO_MODEL_ID_MAX)) abort();
    if (d.world_size == 0 || d.rank >= d.world_size) abort();
    uint64_t n = kvo_desc_chunk_bytes(&d);
    if (n == 0 || n != d.chunk_bytes) abort();
  }
  return 0;
}
