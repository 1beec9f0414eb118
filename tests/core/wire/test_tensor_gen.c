/* core/wire/tensor: the CUDA_IPC generation (issue 14 item 3): an optional u64 after alloc_len,
 * present exactly when non-zero; round trips, equality, and the refusal of a zero generation on
 * the wire (trailing bytes). The registry's descriptors carry it too:
 * tests/runtime/test_registry.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "tensor.h"
#include "tensor_fixture.h"

Test(tensor_gen, present_only_when_nonzero) {
  kvs_tensor_desc_t a = tf_ipc_desc(0), b = tf_ipc_desc(0x1234500000007ull), out;
  uint8_t ea[KVS_TENSOR_ENC_MAX], eb[KVS_TENSOR_ENC_MAX];
  int na = kvs_tensor_encode(&a, ea, sizeof ea), nb = kvs_tensor_encode(&b, eb, sizeof eb);
  cr_assert_eq(na, 4 + 32 + 16 + 80, "without a generation: the 80-byte handle (%d)", na);
  cr_assert_eq(nb, na + 8, "with one: 8 bytes more (%d)", nb);
  cr_assert_eq(nb, kvs_tensor_encoded_size(&b));
  cr_assert_eq(eb[2] | eb[3] << 8, nb - 4, "body_len counts the generation");
  cr_assert_eq(kvs_tensor_decode(eb, (size_t)nb, &out), 0);
  cr_assert_eq(out.ipc.generation, 0x1234500000007ull);
  cr_assert(kvs_tensor_equal(&out, &b));
  cr_assert_not(kvs_tensor_equal(&out, &a), "the generation takes part in equality");
  cr_assert_eq(kvs_tensor_decode(ea, (size_t)na, &out), 0);
  cr_assert_eq(out.ipc.generation, 0);
  /* little-endian u64 right after alloc_len */
  cr_assert_eq(eb[nb - 8], 0x07);
  cr_assert_eq(eb[nb - 2], 0x01);
}

Test(tensor_gen, zero_generation_is_trailing_bytes) {
  kvs_tensor_desc_t b = tf_ipc_desc(99), out;
  memset(&out, 0xee, sizeof out);
  kvs_tensor_desc_t before = out;
  uint8_t e[KVS_TENSOR_ENC_MAX + 8];
  int n = kvs_tensor_encode(&b, e, sizeof e);
  memset(e + n - 8, 0, 8);
  char msg[160];
  cr_assert_eq(kvs_tensor_decode_msg(e, (size_t)n, &out, msg, sizeof msg), -EMSGSIZE);
  cr_assert(strstr(msg, "8 trailing bytes"), "message: %s", msg);
  cr_assert_eq(memcmp(&out, &before, sizeof out), 0, "output untouched on failure");
  /* 16 extra bytes (a generation and more): still trailing bytes */
  n = kvs_tensor_encode(&b, e, sizeof e);
  memset(e + n, 1, 8);
  e[2] = (uint8_t)(n + 8 - 4);
  cr_assert_eq(kvs_tensor_decode(e, (size_t)n + 8, &out), -EMSGSIZE);
  /* another kind never carries one */
  kvs_tensor_desc_t c = tf_u8_vec(KVS_TENSOR_CPU_SHM, 16);
  c.cpu.instance_id = 5;
  c.cpu.length = 16;
  n = kvs_tensor_encode(&c, e, sizeof e);
  memset(e + n, 1, 8);
  e[2] = (uint8_t)(n + 8 - 4);
  cr_assert_eq(kvs_tensor_decode(e, (size_t)n + 8, &out), -EMSGSIZE);
}
