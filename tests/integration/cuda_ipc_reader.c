/* tests/integration: the second process of cuda_preload_test's device_ipc case.
 *
 *   cuda_ipc_reader <socket> <dptr hex> <pitch dptr hex> <pitch bytes>
 *
 * Not preloaded: it links shims/cuda and the preload runtime objects directly and uses the
 * kvs_accel table shims/cuda installs (open_ipc, copy, close_ipc) on descriptors it gets from
 * the preloaded process's coordinator with EXPORT_TENSORS. It reads back the bytes the other
 * process wrote (pattern seed 3), opens one handle twice (one driver open, reference counted)
 * and closes it twice (one driver close); pins, unpins and copies in every direction through the
 * mapping. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "preload_testutil.h"
#include "tensor.h"

const kvs_accel_ops_t *kvs__cuda_accel_ops(void);

static uint8_t pat(size_t i) { return (uint8_t)(i * 131u + 3); }

int main(int argc, char **argv) {
  PT_CHECK(argc == 5, "usage: %s <socket> <dptr> <pitch dptr> <pitch bytes>", argv[0]);
  uint64_t d = strtoull(argv[2], NULL, 16), pd = strtoull(argv[3], NULL, 16);
  uint64_t plen = strtoull(argv[4], NULL, 10);
  const kvs_accel_ops_t *ops = kvs__cuda_accel_ops();
  PT_CHECK(strcmp(ops->name, "cuda") == 0, "not the cuda table");

  pt_peer_t peer;
  pt_peer_connect(&peer, argv[1]);
  kvs_tensor_desc_t desc[4];
  PT_CHECK(pt_peer_export(&peer, d + 4096, 8192, desc, 4) == 1, "one descriptor");
  kvs_tensor_desc_t *x = &desc[0];
  static const uint8_t zero[KVS_TENSOR_UUID_SIZE];
  PT_CHECK(x->kind == KVS_TENSOR_CUDA_IPC && x->ipc.offset == 4096 &&
               x->ipc.alloc_len == (1u << 20) && kvs_tensor_nbytes(x) == 8192 &&
               memcmp(x->device_uuid, zero, sizeof zero) != 0,
           "CUDA_IPC descriptor: kind %u offset %llu alloc_len %llu", x->kind,
           (unsigned long long)x->ipc.offset, (unsigned long long)x->ipc.alloc_len);

  void *p1 = NULL, *p2 = NULL;
  int rc = ops->open_ipc(x, &p1);
  PT_CHECK(rc == 0, "open_ipc: %s", strerror(-rc));
  rc = ops->open_ipc(x, &p2);
  PT_CHECK(rc == 0 && p2 == p1, "second open_ipc: %s", strerror(-rc));
  uint8_t buf[8192];
  rc = ops->copy(buf, p1, sizeof buf, KVS_COPY_D2H);
  PT_CHECK(rc == 0, "copy D2H: %s", strerror(-rc));
  for (size_t i = 0; i < sizeof buf; i++)
    PT_CHECK(buf[i] == pat(4096 + i), "byte %zu: %u, expected %u", i, buf[i], pat(4096 + i));

  /* pin/unpin and the other copy directions, through the opened mapping. */
  uint8_t *hb = aligned_alloc(4096, 1u << 20);
  PT_CHECK(hb, "aligned_alloc");
  memset(hb, 0xab, 1u << 20);
  rc = ops->pin(hb, 1u << 20);
  PT_CHECK(rc == 0, "pin: %s", strerror(-rc));
  PT_CHECK(ops->pin(hb, 1u << 20) == -EEXIST, "pinning twice must say EEXIST");
  rc = ops->copy(p1, hb, 4096, KVS_COPY_H2D);
  PT_CHECK(rc == 0, "copy H2D: %s", strerror(-rc));
  memset(buf, 0, sizeof buf);
  PT_CHECK(ops->copy(buf, p1, 4096, KVS_COPY_D2H) == 0 && buf[0] == 0xab && buf[4095] == 0xab &&
               buf[4096] == 0,
           "H2D then D2H through the IPC mapping");
  PT_CHECK(ops->copy((char *)p1 + 4096, p1, 4096, KVS_COPY_D2D) == 0, "copy D2D");
  PT_CHECK(ops->copy(buf, (char *)p1 + 4096, 4096, KVS_COPY_D2H) == 0 && buf[100] == 0xab,
           "D2D result");
  PT_CHECK(ops->copy(buf, hb, 16, KVS_COPY_H2H) == 0, "copy H2H");
  rc = ops->unpin(hb);
  PT_CHECK(rc == 0, "unpin: %s", strerror(-rc));
  PT_CHECK(ops->unpin(hb) == -ENOENT, "unpinning twice must say ENOENT");
  free(hb);

  PT_CHECK(pt_peer_export(&peer, pd, plen, desc, 4) == 1, "pitch allocation exported");
  PT_CHECK(desc[0].kind == KVS_TENSOR_CUDA_IPC && desc[0].ipc.alloc_len == plen,
           "pitch allocation length %llu", (unsigned long long)desc[0].ipc.alloc_len);

  PT_CHECK(ops->close_ipc(p1) == 0, "first close");
  PT_CHECK(ops->close_ipc(p2) == 0, "second close");
  PT_CHECK(ops->close_ipc(p2) == -ENOENT, "a third close must fail");
  /* A bad descriptor is refused before the driver sees it. */
  kvs_tensor_desc_t bad = *x;
  memset(bad.device_uuid, 0, sizeof bad.device_uuid);
  PT_CHECK(ops->open_ipc(&bad, &p1) == -EINVAL, "descriptor without a device");
  bad = *x;
  bad.device_uuid[0] ^= 0xff;
  PT_CHECK(ops->open_ipc(&bad, &p1) == -ENODEV, "descriptor of an unknown device");
  pt_peer_close(&peer);
  return 0;
}
