/* core/wire/tensor: descriptor encoding (round trips, a hand-assembled golden encoding, every
 * rejection with its code and message), equality field by field, opening CPU_SHM in a child
 * that received the pool fd over SCM_RIGHTS, and the device-ordinal cache. The accelerator
 * interface is tests/core/test_accel.c's, the registry tests/runtime/test_registry.c's. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "pool.h"
#include "tensor.h"
#include "../../lib/fdpass.h"
#include "../../lib/logcapture.h"


/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rnd(void) { /* xorshift64*, fixed seed per test */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ull;
}
static uint64_t rnd_below(uint64_t n) { return rnd() % n; }

static const uint32_t kinds[] = {KVS_TENSOR_CPU_SHM, KVS_TENSOR_CUDA_IPC, KVS_TENSOR_CUDA_VMM_FD};

/* A random valid descriptor of kind: random dtype, ndim, shape, strides (contiguous, permuted,
 * broadcast or negative), storage offset, and a region just large enough plus some slack.
 * Unused shape/stride entries get garbage: they must not matter. */
static kvs_tensor_desc_t random_desc(uint32_t kind) {
  kvs_tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.kind = kind;
  d.dtype = (uint32_t)rnd_below(KVS_DTYPE__COUNT);
  d.ndim = 1 + (uint32_t)rnd_below(KVS_TENSOR_MAX_DIMS);
  int64_t contiguous = 1;
  uint64_t neg = 0;
  for (int k = (int)d.ndim - 1; k >= 0; k--) {
    d.shape[k] = 1 + rnd_below(6);
    switch (rnd_below(4)) {
    case 0: d.stride[k] = contiguous; break;
    case 1: d.stride[k] = (int64_t)rnd_below(1000); break; /* may be 0: broadcast */
    case 2: d.stride[k] = -(int64_t)(1 + rnd_below(100)); break;
    default: d.stride[k] = contiguous * (int64_t)(1 + rnd_below(3)); break;
    }
    if (d.stride[k] < 0) neg += (uint64_t)(-d.stride[k]) * (d.shape[k] - 1);
    contiguous *= (int64_t)d.shape[k];
  }
  for (uint32_t k = d.ndim; k < KVS_TENSOR_MAX_DIMS; k++) {
    d.shape[k] = rnd();
    d.stride[k] = (int64_t)rnd();
  }
  d.storage_offset = neg + rnd_below(64);
  uint64_t lo, hi;
  cr_assert_eq(kvs_tensor_byte_span(&d, &lo, &hi), 0);
  uint64_t slack = rnd_below(3) == 0 ? 0 : rnd_below(1 << 20);
  if (kind != KVS_TENSOR_CPU_SHM || rnd_below(2))
    for (int i = 0; i < KVS_TENSOR_UUID_SIZE; i++) d.device_uuid[i] = (uint8_t)rnd();
  if (kind != KVS_TENSOR_CPU_SHM) d.device_uuid[rnd_below(16)] |= 1; /* never all zero */
  switch (kind) {
  case KVS_TENSOR_CPU_SHM:
    d.cpu.instance_id = rnd() | 1;
    d.cpu.offset = rnd_below(1ull << 40);
    d.cpu.length = hi + slack;
    break;
  case KVS_TENSOR_CUDA_IPC:
    for (int i = 0; i < KVS_TENSOR_IPC_HANDLE_SIZE; i++) d.ipc.handle[i] = (uint8_t)rnd();
    d.ipc.offset = rnd_below(1ull << 34);
    d.ipc.alloc_len = d.ipc.offset + hi + slack;
    break;
  case KVS_TENSOR_CUDA_VMM_FD: {
    d.vmm.fd_index = (uint32_t)rnd_below(KVS_TENSOR_MAX_FDS);
    d.vmm.granularity = 1ull << (12 + rnd_below(10));
    d.vmm.offset = rnd_below(1ull << 32);
    uint64_t need = d.vmm.offset + hi + slack;
    d.vmm.size = (need + d.vmm.granularity - 1) / d.vmm.granularity * d.vmm.granularity;
    break;
  }
  }
  char msg[200] = "";
  cr_assert_eq(kvs_tensor_validate(&d, msg, sizeof msg), 0, "generator made an invalid desc: %s", msg);
  return d;
}

/* A simple valid descriptor of each kind: F16 [4, 8] contiguous, storage offset 8 elements. */
/* A contiguous 2-D descriptor: rows x cols of dtype, starting offset elements in. */
static kvs_tensor_desc_t desc_2d(uint32_t kind, uint32_t dtype, uint32_t rows, uint32_t cols,
                                 uint64_t offset) {
  kvs_tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.kind = kind;
  d.dtype = dtype;
  d.ndim = 2;
  d.shape[0] = rows, d.shape[1] = cols;
  d.stride[0] = cols, d.stride[1] = 1;
  d.storage_offset = offset;
  return d;
}

static kvs_tensor_desc_t simple_desc(uint32_t kind) {
  kvs_tensor_desc_t d = desc_2d(kind, KVS_DTYPE_F16, 4, 8, 8); /* bytes [16, 80) of the region */
  if (kind != KVS_TENSOR_CPU_SHM)
    for (int i = 0; i < 16; i++) d.device_uuid[i] = (uint8_t)(0xa0 + i);
  switch (kind) {
  case KVS_TENSOR_CPU_SHM:
    d.cpu.instance_id = 0x1122334455667788ull, d.cpu.offset = 4096, d.cpu.length = 80;
    break;
  case KVS_TENSOR_CUDA_IPC:
    for (int i = 0; i < 64; i++) d.ipc.handle[i] = (uint8_t)i;
    d.ipc.offset = 512, d.ipc.alloc_len = 4096;
    break;
  case KVS_TENSOR_CUDA_VMM_FD:
    d.vmm.fd_index = 2, d.vmm.offset = 1024, d.vmm.size = 1 << 21, d.vmm.granularity = 1 << 21;
    break;
  }
  return d;
}

static int encode(const kvs_tensor_desc_t *d, uint8_t *buf) {
  int n = kvs_tensor_encode(d, buf, KVS_TENSOR_ENC_MAX);
  cr_assert_gt(n, 0, "encode failed: %d (%s)", n, kvs_tensor_strerror(n));
  return n;
}

/* Decode must fail with code and message; the output must stay untouched. */
static void expect_reject(const uint8_t *buf, size_t len, int code, const char *text) {
  kvs_tensor_desc_t out, sentinel;
  memset(&out, 0x5a, sizeof out);
  sentinel = out;
  char msg[256] = "";
  int rc = kvs_tensor_decode_msg(buf, len, &out, msg, sizeof msg);
  cr_assert_eq(rc, code, "len %zu: got %d (%s), want %d; message: %s", len, rc,
               kvs_tensor_strerror(rc), code, msg);
  cr_assert(strstr(msg, text) != NULL, "message \"%s\" lacks \"%s\"", msg, text);
  cr_assert_eq(memcmp(&out, &sentinel, sizeof out), 0, "output written on failure");
  cr_assert_eq(kvs_tensor_decode(buf, len, &out), code);
}

static void put_le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Offsets inside an encoding (see tensor.h). */
#define AT_KIND 0
#define AT_VERSION 1
#define AT_BODYLEN 2
#define AT_DTYPE 4
#define AT_NDIM 8
#define AT_SHAPE 36
#define AT_HANDLE(ndim) (36 + 16 * (ndim))

/* ---- encoding ----------------------------------------------------------------------------- */

Test(tensor, round_trip_random_every_kind, .timeout = 60) {
  rng_state = 0x9e3779b97f4a7c15ull;
  for (size_t ki = 0; ki < 3; ki++) {
    for (int it = 0; it < 3000; it++) {
      kvs_tensor_desc_t d = random_desc(kinds[ki]);
      uint8_t buf[KVS_TENSOR_ENC_MAX], buf2[KVS_TENSOR_ENC_MAX];
      int n = encode(&d, buf);
      cr_assert_eq(n, kvs_tensor_encoded_size(&d));
      cr_assert_leq(n, (int)KVS_TENSOR_ENC_MAX);
      cr_assert_eq(buf[AT_KIND], kinds[ki]);
      cr_assert_eq(buf[AT_VERSION], 1);
      cr_assert_eq(buf[AT_BODYLEN] | buf[AT_BODYLEN + 1] << 8, n - 4);
      kvs_tensor_desc_t back;
      memset(&back, 0xee, sizeof back);
      cr_assert_eq(kvs_tensor_decode(buf, (size_t)n, &back), 0);
      cr_assert(kvs_tensor_equal(&d, &back), "kind %u iteration %d differs", kinds[ki], it);
      cr_assert(kvs_tensor_equal(&back, &d));
      for (uint32_t k = back.ndim; k < KVS_TENSOR_MAX_DIMS; k++)
        cr_assert(back.shape[k] == 0 && back.stride[k] == 0, "unused entry %u not zeroed", k);
      cr_assert_eq(kvs_tensor_nbytes(&back), kvs_tensor_nbytes(&d));
      cr_assert_eq(encode(&back, buf2), n);
      cr_assert_eq(memcmp(buf, buf2, (size_t)n), 0, "re-encoding differs");
      /* decode_prefix takes exactly the descriptor out of a longer buffer */
      uint8_t two[2 * KVS_TENSOR_ENC_MAX];
      memcpy(two, buf, (size_t)n);
      memcpy(two + n, buf, (size_t)n);
      cr_assert_eq(kvs_tensor_decode_prefix(two, 2 * (size_t)n, &back, NULL, 0), n);
      cr_assert_eq(kvs_tensor_decode_prefix(two + n, (size_t)n, &back, NULL, 0), n);
      cr_assert(kvs_tensor_equal(&d, &back));
    }
  }
}

/* Assembled by hand from the layout in tensor.h, independently of tensor.c: pins the wire. */
Test(tensor, golden_encoding_cpu_shm, .timeout = 30) {
  kvs_tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.kind = KVS_TENSOR_CPU_SHM;
  d.dtype = KVS_DTYPE_F16;
  d.ndim = 1;
  d.shape[0] = 4;
  d.stride[0] = 1;
  d.storage_offset = 2;
  d.cpu.instance_id = 0x1122334455667788ull;
  d.cpu.offset = 4096;
  d.cpu.length = 12;
  static const uint8_t want[] = {
      1, 1, 72, 0,                                         /* kind, version, body_len 72 */
      1, 0, 0, 0, 1, 0, 0, 0,                              /* dtype F16, ndim 1 */
      2, 0, 0, 0, 0, 0, 0, 0,                              /* storage offset 2 */
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,      /* uuid: cpu */
      4, 0, 0, 0, 0, 0, 0, 0,                              /* shape */
      1, 0, 0, 0, 0, 0, 0, 0,                              /* stride */
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,      /* instance id */
      0, 0x10, 0, 0, 0, 0, 0, 0,                           /* offset 4096 */
      12, 0, 0, 0, 0, 0, 0, 0,                             /* length 12 */
  };
  uint8_t buf[KVS_TENSOR_ENC_MAX];
  int n = encode(&d, buf);
  cr_assert_eq(n, (int)sizeof want);
  cr_assert_eq(memcmp(buf, want, sizeof want), 0);

  /* A VMM descriptor with a negative stride: the i64 travels as two's complement. */
  kvs_tensor_desc_t v = simple_desc(KVS_TENSOR_CUDA_VMM_FD);
  v.stride[1] = -1;
  v.storage_offset = 7 + 8;
  n = encode(&v, buf);
  cr_assert_eq(n, 4 + 32 + 32 + 28);
  const uint8_t minus_one[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  cr_assert_eq(memcmp(buf + AT_SHAPE + 16 + 8, minus_one, 8), 0);
  const uint8_t *h = buf + AT_HANDLE(2);
  cr_assert_eq(h[0], 2); /* fd index */
  cr_assert_eq(h[4] | h[5] << 8, 1024); /* offset */
}

Test(tensor, encode_refuses_small_buffer_and_invalid_desc, .timeout = 30) {
  kvs_tensor_desc_t d = simple_desc(KVS_TENSOR_CUDA_IPC);
  int need = kvs_tensor_encoded_size(&d);
  cr_assert_eq(need, 4 + 32 + 32 + 80);
  uint8_t buf[KVS_TENSOR_ENC_MAX];
  memset(buf, 0x77, sizeof buf);
  cr_assert_eq(kvs_tensor_encode(&d, buf, (size_t)need - 1), -ENOBUFS);
  cr_assert_eq(kvs_tensor_encode(&d, NULL, 0), -ENOBUFS);
  for (size_t i = 0; i < sizeof buf; i++) cr_assert_eq(buf[i], 0x77, "byte %zu written", i);
  cr_assert_eq(kvs_tensor_encode(&d, buf, (size_t)need), need);

  kvs_tensor_desc_t bad = d;
  bad.kind = 9;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -EPROTONOSUPPORT);
  bad = d, bad.ndim = 9;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -EDOM);
  bad = d, bad.ndim = 0;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -EDOM);
  bad = d, bad.dtype = KVS_DTYPE__COUNT;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -ENOTSUP);
  bad = d, bad.shape[1] = 0;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -EINVAL);
  bad = d, memset(bad.device_uuid, 0, sizeof bad.device_uuid);
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -EINVAL);
  bad = d, bad.ipc.alloc_len = bad.ipc.offset + 79; /* one byte short of [16, 80) */
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -ERANGE);
  bad = d, bad.ipc.alloc_len = bad.ipc.offset + 80; /* exactly enough */
  cr_assert_gt(kvs_tensor_encode(&bad, buf, sizeof buf), 0);
  bad = d, bad.stride[1] = -1; /* reaches 7 elements back from storage offset 8: fine */
  cr_assert_gt(kvs_tensor_encode(&bad, buf, sizeof buf), 0);
  bad.storage_offset = 6; /* one element before the region start */
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -ERANGE);
  char why[200] = "";
  bad.dtype = KVS_DTYPE_U8; /* no byte-offset overflow to hide behind */
  cr_assert_eq(kvs_tensor_validate(&bad, why, sizeof why), -ERANGE);
  cr_assert_str_eq(why, "tensor reaches 1 elements before its region start (storage offset 6)");
  uint64_t lo = 1, hi = 1;
  cr_assert_eq(kvs_tensor_byte_span(&bad, &lo, &hi), -ERANGE);
  bad.storage_offset = 7;
  cr_assert_eq(kvs_tensor_byte_span(&bad, &lo, &hi), 0);
  cr_assert_eq(lo, 0);
  cr_assert_eq(hi, 7 + 24 + 1); /* elements [0, 32): last at 7 + 3 * 8 */
  bad = d, bad.stride[0] = INT64_MAX;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -ERANGE);
  bad = d, bad.shape[0] = 1ull << 62, bad.stride[0] = 0; /* nbytes overflows */
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -ERANGE);
  cr_assert_eq(kvs_tensor_nbytes(&bad), 0);
  cr_assert_eq(kvs_tensor_nbytes(&d), 64);

  kvs_tensor_desc_t c = simple_desc(KVS_TENSOR_CPU_SHM);
  bad = c, bad.cpu.instance_id = 0;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -EINVAL);
  bad = c, bad.cpu.length = 0;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -EINVAL);
  bad = c, bad.cpu.offset = UINT64_MAX - 10;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -ERANGE);

  kvs_tensor_desc_t v = simple_desc(KVS_TENSOR_CUDA_VMM_FD);
  bad = v, bad.vmm.granularity = 3 << 20;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -EINVAL);
  bad = v, bad.vmm.size = (1 << 21) + 4096;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -EINVAL);
  bad = v, bad.vmm.fd_index = KVS_TENSOR_MAX_FDS;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -EINVAL);
  bad = v, bad.vmm.offset = bad.vmm.size;
  cr_assert_eq(kvs_tensor_encode(&bad, buf, sizeof buf), -ERANGE);

  char msg[200];
  bad = d, bad.shape[1] = 0;
  cr_assert_eq(kvs_tensor_validate(&bad, msg, sizeof msg), -EINVAL);
  cr_assert_str_eq(msg, "tensor dimension 1 has size 0");
}

Test(tensor, decode_rejects_unknown_kind, .timeout = 30) {
  uint8_t buf[KVS_TENSOR_ENC_MAX];
  kvs_tensor_desc_t d = simple_desc(KVS_TENSOR_CPU_SHM);
  int n = encode(&d, buf);
  buf[AT_KIND] = 7;
  expect_reject(buf, (size_t)n, -EPROTONOSUPPORT, "unknown tensor kind 7");
  char msg[64];
  kvs_tensor_desc_t out;
  kvs_tensor_decode_msg(buf, (size_t)n, &out, msg, sizeof msg);
  cr_assert_str_eq(msg, "unknown tensor kind 7");
  buf[AT_KIND] = 0;
  expect_reject(buf, (size_t)n, -EPROTONOSUPPORT, "unknown tensor kind 0");
  buf[AT_KIND] = 255;
  buf[AT_VERSION] = 9; /* the kind is reported first */
  expect_reject(buf, 4, -EPROTONOSUPPORT, "unknown tensor kind 255");
  cr_assert_str_eq(kvs_tensor_strerror(-EPROTONOSUPPORT), "unknown tensor kind");
}

Test(tensor, decode_rejects_unknown_version, .timeout = 30) {
  uint8_t buf[KVS_TENSOR_ENC_MAX];
  for (size_t ki = 0; ki < 3; ki++) {
    kvs_tensor_desc_t d = simple_desc(kinds[ki]);
    int n = encode(&d, buf);
    buf[AT_VERSION] = 3;
    expect_reject(buf, (size_t)n, -EPROTO,
                  "tensor encoding version 3 not supported (this build reads 1)");
    buf[AT_VERSION] = 0;
    expect_reject(buf, (size_t)n, -EPROTO, "version 0 not supported");
  }
}

Test(tensor, decode_rejects_every_truncation, .timeout = 30) {
  rng_state = 42;
  uint8_t buf[KVS_TENSOR_ENC_MAX];
  for (size_t ki = 0; ki < 3; ki++) {
    for (int it = 0; it < 8; it++) {
      kvs_tensor_desc_t d = random_desc(kinds[ki]);
      int n = encode(&d, buf);
      for (int len = 0; len < n; len++)
        expect_reject(buf, (size_t)len, -EBADMSG, "truncated");
    }
  }
  expect_reject(buf, 3, -EBADMSG, "3 bytes, the header needs 4");
  /* A body_len too small for kind + ndim (buffer consistent with it). */
  kvs_tensor_desc_t d = simple_desc(KVS_TENSOR_CPU_SHM);
  int n = encode(&d, buf);
  put_le(buf + AT_BODYLEN, (uint64_t)(n - 4 - 8), 2);
  expect_reject(buf, (size_t)n - 8, -EBADMSG, "cpu_shm tensor body truncated: 80 bytes, ndim 2 needs 88");
  put_le(buf + AT_BODYLEN, 4, 2);
  expect_reject(buf, 8, -EBADMSG, "dtype and ndim need 8");
  cr_assert_str_eq(kvs_tensor_strerror(-EBADMSG), "tensor descriptor truncated");
}

Test(tensor, decode_rejects_trailing_bytes, .timeout = 30) {
  uint8_t buf[KVS_TENSOR_ENC_MAX + 16];
  for (size_t ki = 0; ki < 3; ki++) {
    kvs_tensor_desc_t d = simple_desc(kinds[ki]);
    int n = encode(&d, buf);
    memset(buf + n, 0, 16);
    for (int extra = 1; extra <= 16; extra++) {
      char want[80];
      snprintf(want, sizeof want, "%d trailing bytes after the %d-byte tensor descriptor", extra, n);
      expect_reject(buf, (size_t)(n + extra), -EMSGSIZE, want);
    }
    /* extra bytes inside the body that body_len claims */
    put_le(buf + AT_BODYLEN, (uint64_t)(n - 4 + 8), 2);
    expect_reject(buf, (size_t)n + 8, -EMSGSIZE, "body has 8 trailing bytes");
  }
  cr_assert_str_eq(kvs_tensor_strerror(-EMSGSIZE), "trailing bytes after tensor descriptor");
}

Test(tensor, decode_rejects_bad_ndim_dtype_and_fields, .timeout = 30) {
  uint8_t buf[KVS_TENSOR_ENC_MAX], b2[KVS_TENSOR_ENC_MAX];
  kvs_tensor_desc_t d = simple_desc(KVS_TENSOR_CPU_SHM);
  int n = encode(&d, buf);

  memcpy(b2, buf, (size_t)n);
  put_le(b2 + AT_NDIM, 9, 4);
  expect_reject(b2, (size_t)n, -EDOM, "tensor ndim 9 outside [1, 8]");
  put_le(b2 + AT_NDIM, 0, 4);
  expect_reject(b2, (size_t)n, -EDOM, "tensor ndim 0 outside [1, 8]");
  put_le(b2 + AT_NDIM, 0x80000001u, 4);
  expect_reject(b2, (size_t)n, -EDOM, "ndim 2147483649");

  memcpy(b2, buf, (size_t)n);
  put_le(b2 + AT_DTYPE, KVS_DTYPE__COUNT, 4);
  expect_reject(b2, (size_t)n, -ENOTSUP, "unknown tensor dtype 8 (this build knows 0..7)");
  put_le(b2 + AT_DTYPE, 0xffffffffu, 4);
  expect_reject(b2, (size_t)n, -ENOTSUP, "unknown tensor dtype 4294967295");

  memcpy(b2, buf, (size_t)n);
  put_le(b2 + AT_SHAPE + 8, 0, 8);
  expect_reject(b2, (size_t)n, -EINVAL, "tensor dimension 1 has size 0");

  memcpy(b2, buf, (size_t)n);
  put_le(b2 + AT_HANDLE(2), 0, 8);
  expect_reject(b2, (size_t)n, -EINVAL, "cpu_shm tensor has pool instance id 0");
  memcpy(b2, buf, (size_t)n);
  put_le(b2 + AT_HANDLE(2) + 16, 0, 8);
  expect_reject(b2, (size_t)n, -EINVAL, "cpu_shm tensor has length 0");
  memcpy(b2, buf, (size_t)n);
  put_le(b2 + AT_HANDLE(2) + 16, 79, 8); /* view needs [16, 80) */
  expect_reject(b2, (size_t)n, -ERANGE, "tensor spans bytes [16, 80) but its cpu_shm region has 79");

  kvs_tensor_desc_t g = simple_desc(KVS_TENSOR_CUDA_IPC);
  n = encode(&g, buf);
  memset(buf + 20, 0, 16);
  expect_reject(buf, (size_t)n, -EINVAL, "cuda_ipc tensor has no device UUID");
  g = simple_desc(KVS_TENSOR_CUDA_VMM_FD);
  n = encode(&g, buf);
  put_le(buf + AT_HANDLE(2) + 20, 3, 8);
  expect_reject(buf, (size_t)n, -EINVAL, "granularity 3 is not a power of two");

  /* every code has its own generic text */
  const int codes[] = {-EBADMSG, -EPROTONOSUPPORT, -EPROTO, -EMSGSIZE, -EDOM, -ENOTSUP, -EINVAL, -ERANGE};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    for (size_t j = i + 1; j < sizeof codes / sizeof codes[0]; j++)
      cr_assert_str_neq(kvs_tensor_strerror(codes[i]), kvs_tensor_strerror(codes[j]));
}

/* ---- equality ----------------------------------------------------------------------------- */

typedef void (*mutator_t)(kvs_tensor_desc_t *d);
static void m_kind(kvs_tensor_desc_t *d) { d->kind = d->kind == 1 ? 2 : 1; }
static void m_dtype(kvs_tensor_desc_t *d) { d->dtype ^= 1; }
static void m_ndim(kvs_tensor_desc_t *d) { d->ndim = 1; }
static void m_shape0(kvs_tensor_desc_t *d) { d->shape[0]++; }
static void m_shape1(kvs_tensor_desc_t *d) { d->shape[1]--; }
static void m_stride0(kvs_tensor_desc_t *d) { d->stride[0]++; }
static void m_stride1(kvs_tensor_desc_t *d) { d->stride[1] = -d->stride[1]; }
static void m_soff(kvs_tensor_desc_t *d) { d->storage_offset++; }
static void m_uuid0(kvs_tensor_desc_t *d) { d->device_uuid[0] ^= 0x40; }
static void m_uuid15(kvs_tensor_desc_t *d) { d->device_uuid[15] ^= 1; }
static const mutator_t common_mutators[] = {m_kind, m_dtype, m_ndim, m_shape0, m_shape1,
                                            m_stride0, m_stride1, m_soff, m_uuid0, m_uuid15};
static void m_cpu_inst(kvs_tensor_desc_t *d) { d->cpu.instance_id ^= 1ull << 63; }
static void m_cpu_off(kvs_tensor_desc_t *d) { d->cpu.offset += 4096; }
static void m_cpu_len(kvs_tensor_desc_t *d) { d->cpu.length++; }
static void m_ipc_h0(kvs_tensor_desc_t *d) { d->ipc.handle[0] ^= 1; }
static void m_ipc_h63(kvs_tensor_desc_t *d) { d->ipc.handle[63] ^= 0x80; }
static void m_ipc_off(kvs_tensor_desc_t *d) { d->ipc.offset++; }
static void m_ipc_len(kvs_tensor_desc_t *d) { d->ipc.alloc_len++; }
static void m_vmm_fd(kvs_tensor_desc_t *d) { d->vmm.fd_index++; }
static void m_vmm_off(kvs_tensor_desc_t *d) { d->vmm.offset++; }
static void m_vmm_size(kvs_tensor_desc_t *d) { d->vmm.size *= 2; }
static void m_vmm_gran(kvs_tensor_desc_t *d) { d->vmm.granularity /= 2; }

static void expect_all_differ(const kvs_tensor_desc_t *base, const mutator_t *ms, size_t n) {
  for (size_t i = 0; i < n; i++) {
    kvs_tensor_desc_t m = *base;
    ms[i](&m);
    cr_assert_not(kvs_tensor_equal(base, &m), "kind %u mutator %zu: still equal", base->kind, i);
    cr_assert_not(kvs_tensor_equal(&m, base), "kind %u mutator %zu: not symmetric", base->kind, i);
  }
}

Test(tensor, equality_each_field, .timeout = 30) {
  static const mutator_t cpu_m[] = {m_cpu_inst, m_cpu_off, m_cpu_len};
  static const mutator_t ipc_m[] = {m_ipc_h0, m_ipc_h63, m_ipc_off, m_ipc_len};
  static const mutator_t vmm_m[] = {m_vmm_fd, m_vmm_off, m_vmm_size, m_vmm_gran};
  const mutator_t *per_kind[] = {cpu_m, ipc_m, vmm_m};
  const size_t per_kind_n[] = {3, 4, 4};
  for (size_t ki = 0; ki < 3; ki++) {
    kvs_tensor_desc_t d = simple_desc(kinds[ki]);
    kvs_tensor_desc_t same = d;
    cr_assert(kvs_tensor_equal(&d, &same));
    expect_all_differ(&d, common_mutators, sizeof common_mutators / sizeof common_mutators[0]);
    expect_all_differ(&d, per_kind[ki], per_kind_n[ki]);
    /* what carries no meaning does not count */
    same.shape[2] = 99, same.stride[7] = -5, same.pad0 = 1;
    cr_assert(kvs_tensor_equal(&d, &same));
  }
  /* a CPU_SHM descriptor ignores the bytes of the larger IPC handle beyond its own fields */
  kvs_tensor_desc_t c = simple_desc(KVS_TENSOR_CPU_SHM), c2 = c;
  c2.ipc.handle[40] ^= 0xff; /* past cpu.{instance_id, offset, length} (24 bytes) */
  cr_assert(kvs_tensor_equal(&c, &c2));
}

/* ---- CPU_SHM through a pool fd ----------------------------------------------------------- */

static uint8_t pattern(uint64_t i) { return (uint8_t)(i * 131u + 7u); }

/* The child: attach the pool from the fd, decode the descriptor, open it, compare the bytes.
 * Each failure has its own exit code so the parent's assertion says which step failed. */
static int child_open(int sock) {
  uint8_t enc[KVS_TENSOR_ENC_MAX];
  size_t len = 0;
  int fd = -1;
  if (recv_fd(sock, &fd, enc, sizeof enc, &len) != 0) return 10;
  kvs_pool_t *pool = NULL;
  if (kvs_pool_attach(fd, false, &pool) != 0) return 11;
  close(fd); /* the mapping stays */
  kvs_tensor_desc_t d;
  if (kvs_tensor_decode(enc, len, &d) != 0) return 12;
  void *p = NULL;
  if (kvs_tensor_open_cpu(&d, pool, &p) != 0) return 13;
  const uint8_t *b = p;
  for (uint64_t i = 0; i < d.cpu.length; i++)
    if (b[i] != pattern(i)) return 14;
  /* element [1][2] of the F32 [16][64] view, storage offset 64 elements */
  const float *f = (const float *)p + d.storage_offset;
  float want;
  memcpy(&want, b + (64 + 1 * 64 + 2) * 4, 4);
  if (memcmp(&f[1 * d.stride[0] + 2 * d.stride[1]], &want, 4) != 0) return 15;
  kvs_tensor_desc_t wrong = d;
  wrong.cpu.instance_id ^= 1;
  if (kvs_tensor_open_cpu(&wrong, pool, &p) != -ESTALE) return 16;
  kvs_pool_destroy(pool, false);
  return 0;
}

static kvs_pool_t *make_pool(void) {
  kvs_pool_config_t cfg = {.cache_size = 1 << 20, .host_size = 1 << 20};
  kvs_pool_t *pool = NULL;
  int rc = kvs_pool_create(&cfg, &pool);
  cr_assert_eq(rc, 0, "kvs_pool_create: %d", rc);
  return pool;
}

static kvs_tensor_desc_t cpu_desc_for(kvs_pool_t *pool, uint64_t off, uint64_t len) {
  kvs_tensor_desc_t d = desc_2d(KVS_TENSOR_CPU_SHM, KVS_DTYPE_F32, 16, 64, 64); /* [256, 4352) */
  d.cpu.instance_id = kvs_pool_header(pool)->instance_id;
  d.cpu.offset = off;
  d.cpu.length = len;
  return d;
}

Test(tensor, open_cpu_shm_in_child_through_scm_rights, .timeout = 30) {
  kvs_pool_t *pool = make_pool();
  uint64_t off;
  cr_assert_eq(kvs_pool_alloc(pool, KVS_ARENA_CACHE, 8192, &off), 0);
  uint8_t *base = kvs_pool_base(pool);
  for (uint64_t i = 0; i < 8192; i++) base[off + i] = pattern(i);
  kvs_tensor_desc_t d = cpu_desc_for(pool, off, 8192);
  uint8_t enc[KVS_TENSOR_ENC_MAX];
  int n = encode(&d, enc);

  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    close(sv[0]);
    _exit(child_open(sv[1]));
  }
  close(sv[1]);
  cr_assert_eq(send_fd(sv[0], kvs_pool_fd(pool), enc, (size_t)n), 0);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "child died");
  cr_assert_eq(WEXITSTATUS(status), 0, "child failed at step %d", WEXITSTATUS(status));
  close(sv[0]);

  /* the owner itself opens it too, and sees the same pointer */
  void *p = NULL;
  cr_assert_eq(kvs_tensor_open_cpu(&d, pool, &p), 0);
  cr_assert_eq(p, base + off);
  cr_assert_gt(kvs_pool_free(pool, KVS_ARENA_CACHE, off), 0);
  cr_assert_eq(kvs_pool_destroy(pool, false), 0);
}

Test(tensor, open_cpu_refuses_wrong_instance_and_out_of_range, .timeout = 30) {
  kvs_pool_t *pool = make_pool();
  const kvs_pool_header_t *h = kvs_pool_header(pool);
  uint64_t seg = kvs_pool_segment_size(pool);
  int logfd = log_capture(KVS_LOG_WARN);
  void *p = (void *)0x1234;
  kvs_tensor_desc_t ok = cpu_desc_for(pool, h->cache_off, 8192);
  void *q = NULL;
  cr_assert_eq(kvs_tensor_open_cpu(&ok, pool, &q), 0);

  kvs_tensor_desc_t d = ok;
  d.cpu.instance_id = h->instance_id + 1;
  cr_assert_eq(kvs_tensor_open_cpu(&d, pool, &p), -ESTALE);
  char logbuf[4096] = "", want[160];
  cr_assert_gt(pread(logfd, logbuf, sizeof logbuf - 1, 0), 0);
  snprintf(want, sizeof want, "warn: tensor: descriptor names pool instance %016llx, this pool is %016llx",
           (unsigned long long)d.cpu.instance_id, (unsigned long long)h->instance_id);
  cr_assert(strstr(logbuf, want) != NULL, "log: %s", logbuf);
  d = ok, d.cpu.offset = seg - 4096; /* runs past the end of the segment */
  cr_assert_eq(kvs_tensor_open_cpu(&d, pool, &p), -ERANGE);
  d = ok, d.cpu.offset = seg;
  cr_assert_eq(kvs_tensor_open_cpu(&d, pool, &p), -ERANGE);
  d = ok, d.cpu.offset = UINT64_MAX - 9000;
  cr_assert_eq(kvs_tensor_open_cpu(&d, pool, &p), -ERANGE);
  d = ok, d.cpu.offset = 0; /* the pool header is not tensor memory */
  cr_assert_eq(kvs_tensor_open_cpu(&d, pool, &p), -ERANGE);
  d = ok, d.cpu.offset = h->cache_off + h->cache_size - 4096; /* straddles the arena end */
  cr_assert_eq(kvs_tensor_open_cpu(&d, pool, &p), -ERANGE);
  d = ok, d.kind = KVS_TENSOR_CUDA_IPC;
  cr_assert_eq(kvs_tensor_open_cpu(&d, pool, &p), -EINVAL);
  d = ok, d.cpu.length = 100; /* shorter than the view */
  cr_assert_eq(kvs_tensor_open_cpu(&d, pool, &p), -EINVAL);
  cr_assert_eq(kvs_tensor_open_cpu(NULL, pool, &p), -EINVAL);
  cr_assert_eq(p, (void *)0x1234, "pointer written on failure");
  if (h->host_size) { /* the host arena is tensor memory too */
    d = ok, d.cpu.offset = h->host_off;
    cr_assert_eq(kvs_tensor_open_cpu(&d, pool, &p), 0);
    cr_assert_eq(p, kvs_pool_base(pool) + h->host_off);
  }
  memset(logbuf, 0, sizeof logbuf);
  cr_assert_gt(pread(logfd, logbuf, sizeof logbuf - 1, 0), 0);
  cr_assert(strstr(logbuf, "is not inside an arena of the") != NULL, "log: %s", logbuf);
  cr_assert(strstr(logbuf, "refusing to open: tensor spans bytes [256, 4352) but its cpu_shm region has 100") != NULL,
            "log: %s", logbuf);
  kvs_log_set_fd(2);
  close(logfd);
  cr_assert_eq(kvs_pool_destroy(pool, false), 0);
}

/* ---- device ordinal cache ------------------------------------------------------------------ */

static int scans;
static int scan_fail;
static int fake_scan(uint8_t (*uuids)[KVS_TENSOR_UUID_SIZE], int cap, void *ctx) {
  scans++;
  if (scan_fail) return -EIO;
  int n = *(int *)ctx;
  for (int i = 0; i < n && i < cap; i++) memset(uuids[i], 0x10 + i, KVS_TENSOR_UUID_SIZE);
  return n;
}

Test(tensor, device_ordinal_scans_once, .timeout = 30) {
  int ndev = 3;
  uint8_t u[16];
  memset(u, 0x12, 16);
  cr_assert_eq(kvs_tensor_device_ordinal(u, NULL, NULL), -ENOSYS);
  scan_fail = 1;
  cr_assert_eq(kvs_tensor_device_ordinal(u, fake_scan, &ndev), -EIO);
  cr_assert_eq(scans, 1);
  scan_fail = 0;
  cr_assert_eq(kvs_tensor_device_ordinal(u, fake_scan, &ndev), 2, "a failed scan is not cached");
  cr_assert_eq(scans, 2);
  memset(u, 0x10, 16);
  cr_assert_eq(kvs_tensor_device_ordinal(u, fake_scan, &ndev), 0);
  cr_assert_eq(kvs_tensor_device_ordinal(u, NULL, NULL), 0);
  memset(u, 0x13, 16);
  cr_assert_eq(kvs_tensor_device_ordinal(u, fake_scan, &ndev), -ENODEV);
  cr_assert_eq(scans, 2, "scanned again");
  memset(u, 0, 16);
  cr_assert_eq(kvs_tensor_device_ordinal(u, fake_scan, &ndev), -EINVAL);
  kvs_tensor_device_cache_reset();
  ndev = 4;
  memset(u, 0x13, 16);
  cr_assert_eq(kvs_tensor_device_ordinal(u, fake_scan, &ndev), 3);
  cr_assert_eq(scans, 3);
}
