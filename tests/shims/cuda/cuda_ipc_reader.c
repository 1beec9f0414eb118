/* tests/shims/cuda: the second process of cuda_preload_test's device_ipc case.
 *
 *   cuda_ipc_reader <socket> <dptr hex> <pitch dptr hex> <pitch bytes>
 *   cuda_ipc_reader --hold <socket> <dptr hex> <exporter pid>
 *
 * Not preloaded: it links shims/cuda and the preload runtime objects directly and uses the
 * kvs_accel table shims/cuda installs (open_ipc, copy, close_ipc) on descriptors it gets from
 * the preloaded process's coordinator with EXPORT_TENSORS. It reads back the bytes the other
 * process wrote (pattern seed 3), opens one handle twice (one driver open, reference counted)
 * and closes it twice (one driver close); pins, unpins and copies in every direction through the
 * mapping. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "accel.h"
#include "preload_testutil.h"
#include "tensor.h"

const kvs_accel_ops_t *kvs__cuda_accel_ops(void);

static uint8_t pat(size_t i) { return (uint8_t)(i * 131u + 3); }

/* cuda_preload_test's ipc_free case (issue 14 item 3): the export carries a generation naming
 * the exporter; open the allocation and say "open"; read "hold" (the exporter is now inside
 * cuMemFree, which must wait for this lease), wait a little, close, say "closed"; read "freed",
 * then opening the same descriptor again must fail -ESTALE (the generation is stale). */
static int hold(const char *sock, uint64_t d, long exporter) {
  const kvs_accel_ops_t *ops = kvs__cuda_accel_ops();
  pt_peer_t peer;
  pt_peer_connect(&peer, sock);
  kvs_tensor_desc_t desc[2];
  PT_CHECK(pt_peer_export(&peer, d, 4096, desc, 2) == 1, "one descriptor");
  pt_peer_close(&peer);
  kvs_tensor_desc_t *x = &desc[0];
  PT_CHECK(x->ipc.generation >> 32 == (uint64_t)exporter && (uint32_t)x->ipc.generation != 0,
           "generation %llx does not name exporter %ld",
           (unsigned long long)x->ipc.generation, exporter);
  void *p = NULL;
  int rc = ops->open_ipc(x, &p);
  PT_CHECK(rc == 0, "open_ipc: %s", strerror(-rc));
  uint8_t b[16];
  PT_CHECK(ops->copy(b, p, sizeof b, KVS_COPY_D2H) == 0 && b[5] == pat(5), "read through it");
  char line[64];
  printf("open\n");
  fflush(stdout);
  PT_CHECK(fgets(line, sizeof line, stdin) && !strcmp(line, "hold\n"), "expected hold");
  struct timespec nap = {0, 200 * 1000 * 1000};
  nanosleep(&nap, NULL); /* the exporter's cuMemFree waits meanwhile */
  PT_CHECK(ops->close_ipc(p) == 0, "close");
  printf("closed\n");
  fflush(stdout);
  PT_CHECK(fgets(line, sizeof line, stdin) && !strcmp(line, "freed\n"), "expected freed");
  rc = ops->open_ipc(x, &p);
  PT_CHECK(rc == -ESTALE, "a freed export must be refused -ESTALE, got %d", rc);
  kvs_tensor_desc_t y = *x;
  y.ipc.generation = (uint64_t)getpid() << 32 | 1u; /* a process without a lease file */
  PT_CHECK(ops->open_ipc(&y, &p) == -ESTALE, "unknown exporter must be -ESTALE");
  printf("stale\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 5 && !strcmp(argv[1], "--hold"))
    return hold(argv[2], strtoull(argv[3], NULL, 16), strtol(argv[4], NULL, 10));
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
               memcmp(x->device_uuid, zero, sizeof zero) != 0 && x->ipc.generation != 0,
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
