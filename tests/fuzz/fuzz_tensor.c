/* libFuzzer harness for the tensor descriptor decoder (core/wire/tensor, design §8, §15).
 *
 * Properties checked on every input (abort() = a finding):
 *   - decode either succeeds or returns one of the documented codes with a message;
 *   - a decoded descriptor is valid, re-encodes to exactly the input bytes (the encoding is
 *     canonical), decodes again to an equal descriptor, and re-encodes byte-identically;
 *   - decode_prefix agrees with decode: it accepts the input's leading descriptor exactly when
 *     decode fails for trailing bytes only (or succeeds), and takes no more than the input.
 * Seeds: tests/fuzz/corpus/fuzz_tensor/ (regenerate with gen_tensor_corpus.py). */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

static int documented(int rc) {
  switch (rc) {
  case -EBADMSG: case -EPROTONOSUPPORT: case -EPROTO: case -EMSGSIZE:
  case -EDOM: case -ENOTSUP: case -EINVAL: case -ERANGE:
    return 1;
  default:
    return 0;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kvs_tensor_desc_t d, d2, p;
  char msg[256];
  msg[0] = '\0';
  int rc = kvs_tensor_decode_msg(data, size, &d, msg, sizeof msg);
  int pn = kvs_tensor_decode_prefix(data, size, &p, NULL, 0);
  if (rc != 0) {
    if (!documented(rc) || msg[0] == '\0' || kvs_tensor_strerror(rc)[0] == '\0') abort();
    if (pn > 0) {
      /* the leading descriptor is fine: only trailing bytes can have failed decode */
      if (rc != -EMSGSIZE || (size_t)pn >= size) abort();
      if (kvs_tensor_decode(data, (size_t)pn, &d2) != 0 || !kvs_tensor_equal(&p, &d2)) abort();
    } else if (pn != rc) {
      abort(); /* same bytes, same verdict */
    }
    return 0;
  }
  if (pn < 0 || (size_t)pn != size || !kvs_tensor_equal(&d, &p)) abort();
  if (kvs_tensor_validate(&d, NULL, 0) != 0) abort();

  uint8_t buf[KVS_TENSOR_ENC_MAX], buf2[KVS_TENSOR_ENC_MAX];
  int n = kvs_tensor_encode(&d, buf, sizeof buf);
  if (n <= 0 || (size_t)n != size || memcmp(buf, data, size) != 0) abort();
  if (kvs_tensor_decode(buf, (size_t)n, &d2) != 0 || !kvs_tensor_equal(&d, &d2) ||
      !kvs_tensor_equal(&d2, &d))
    abort();
  int n2 = kvs_tensor_encode(&d2, buf2, sizeof buf2);
  if (n2 != n || memcmp(buf, buf2, (size_t)n) != 0) abort();
  for (uint32_t k = d.ndim; k < KVS_TENSOR_MAX_DIMS; k++)
    if (d.shape[k] != 0 || d.stride[k] != 0) abort(); /* unused entries are zeroed */

  uint64_t lo, hi;
  if (kvs_tensor_byte_span(&d, &lo, &hi) != 0 || lo >= hi || kvs_tensor_nbytes(&d) == 0) abort();
  return 0;
}
