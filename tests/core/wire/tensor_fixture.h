/* Tensor descriptors the core/wire tests build (test_tensor_gen, coord_ops): header-only, so a
 * unit test needs no helper library for it. */
#ifndef KVSHIM_TESTS_TENSOR_FIXTURE_H
#define KVSHIM_TESTS_TENSOR_FIXTURE_H

#include <stdint.h>
#include <string.h>

#include "tensor.h"

/* A contiguous vector of n bytes of the given kind, every other field zero. */
static inline kvs_tensor_desc_t tf_u8_vec(uint32_t kind, uint64_t n) {
  kvs_tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.kind = kind;
  d.dtype = KVS_DTYPE_U8;
  d.ndim = 1;
  d.shape[0] = n;
  d.stride[0] = 1;
  return d;
}

#endif
