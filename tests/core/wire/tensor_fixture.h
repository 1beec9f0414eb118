/* Tensor descriptors the tests build (tests/core/wire's test_tensor_gen and coord_ops,
 * tests/core/test_accel, tests/runtime/test_registry): header-only, so a unit test needs no
 * helper library for it. */
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

/* A valid CUDA_IPC vector of 4096 bytes at the start of a 1 MiB allocation, with a patterned
 * handle and the given generation (0: none). */
static inline kvs_tensor_desc_t tf_ipc_desc(uint64_t gen) {
  kvs_tensor_desc_t d = tf_u8_vec(KVS_TENSOR_CUDA_IPC, 4096);
  d.device_uuid[0] = 0x42;
  for (int i = 0; i < KVS_TENSOR_IPC_HANDLE_SIZE; i++) d.ipc.handle[i] = (uint8_t)(i * 7 + 1);
  d.ipc.offset = 0;
  d.ipc.alloc_len = 1 << 20;
  d.ipc.generation = gen;
  return d;
}

#endif
