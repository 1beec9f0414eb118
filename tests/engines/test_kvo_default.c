/* libkvo_default: the engine-side kvo functions kvshim falls back to. Criterion runs every
 * test in its own process, so each starts with the module's default state (no cache). */
#include <criterion/criterion.h>
#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kvshim/kvo.h>

#include "refengine/kvo_default.h"

#define CT 4 /* chunk tokens */

static kvo_desc_t make_desc(const char *model) {
  kvo_desc_t d = {.abi_version = KVO_ABI_VERSION, .size = sizeof d, .dtype = KVO_DTYPE_F32,
                  .layers = 2, .kv_heads = 1, .head_dim = 2, .chunk_tokens = CT,
                  .world_size = 1, .layout = KVO_LAYOUT_LKTHD};
  strcpy(d.model_id, model);
  d.chunk_bytes = kvo_desc_chunk_bytes(&d); /* 2 layers * 2 * 4 tokens * 1 * 2 * 4 B = 128 */
  return d;
}

/* A chunk's bytes: a pattern named by `tag`. */
static void fill(unsigned char *buf, size_t len, unsigned tag) {
  for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(tag * 31u + i);
}

static uint64_t host(void *p) { return (uint64_t)(uintptr_t)p; }

static int store(const kvo_desc_t *d, const uint32_t *t, size_t chunk, unsigned tag) {
  unsigned char buf[128];
  fill(buf, sizeof buf, tag);
  return kvo_store_chunk(d, t, (chunk + 1) * CT, chunk, KVO_BUF_HOST, host(buf), sizeof buf);
}

/* Loads chunk and checks it holds pattern tag; returns the load result. */
static int load_expect(const kvo_desc_t *d, const uint32_t *t, size_t chunk, unsigned tag) {
  unsigned char buf[128], want[128];
  fill(want, sizeof want, tag);
  memset(buf, 0, sizeof buf);
  int rc = kvo_load_chunk(d, t, (chunk + 1) * CT, chunk, KVO_BUF_HOST, host(buf), sizeof buf);
  if (rc == KVO_OK) cr_assert_arr_eq(buf, want, sizeof buf, "chunk %zu bytes", chunk);
  return rc;
}

/* A: 3 full chunks + 2 tokens. B: A's chunk 0, then others. S: A's chunks 1 and 0 swapped. */
static const uint32_t A[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
static const uint32_t B[] = {1, 2, 3, 4, 9, 9, 9, 9, 9, 10, 11, 12};
static const uint32_t S[] = {5, 6, 7, 8, 1, 2, 3, 4, 9, 10, 11, 12};

Test(kvo_default, helpers_compute_sizes, .timeout = 30) {
  kvo_desc_t d = make_desc("m");
  cr_assert_eq(d.chunk_bytes, 128);
  cr_assert_eq(kvo_dtype_size(KVO_DTYPE_BF16), 2);
  cr_assert_eq(kvo_dtype_size(99), 0);
  d.layers = UINT32_MAX, d.kv_heads = UINT32_MAX, d.head_dim = UINT32_MAX;
  cr_assert_eq(kvo_desc_chunk_bytes(&d), 0, "overflow must give 0");
  cr_assert_eq(sizeof(kvo_desc_t), KVO_DESC_SIZE_V1);
}

Test(kvo_default, caches_nothing_by_default, .timeout = 30) {
  kvo_desc_t d = make_desc("m");
  cr_assert_eq(store(&d, A, 0, 1), KVO_NOT_KEPT);
  cr_assert_eq(kvo_lookup(&d, A, 14), 0);
  cr_assert_eq(load_expect(&d, A, 0, 1), KVO_MISS);
  cr_assert_eq(kvo_lookup(&d, NULL, 0), 0);
}

Test(kvo_default, store_lookup_load_round_trip, .timeout = 30) {
  kvo_desc_t d = make_desc("m");
  cr_assert_eq(kvo_default_configure(1 << 20), 0);
  for (size_t i = 0; i < 3; i++) cr_assert_eq(store(&d, A, i, (unsigned)i + 10), KVO_OK);
  cr_assert_eq(kvo_lookup(&d, A, 14), 3, "all full chunks of A");
  cr_assert_eq(kvo_lookup(&d, A, 11), 2, "a partial chunk is never counted");
  cr_assert_eq(kvo_lookup(&d, B, 12), 1, "B shares only chunk 0 with A");
  for (size_t i = 0; i < 3; i++) cr_assert_eq(load_expect(&d, A, i, (unsigned)i + 10), KVO_OK);
  /* Extra tokens after the chunk are ignored. */
  unsigned char buf[256];
  cr_assert_eq(kvo_load_chunk(&d, A, 14, 0, KVO_BUF_HOST, host(buf), sizeof buf), KVO_OK);
  /* The same tokens after a different prefix are a different chunk. */
  cr_assert_eq(kvo_lookup(&d, S, 12), 0);
  cr_assert_eq(load_expect(&d, S, 1, 10), KVO_MISS);
}

Test(kvo_default, namespace_fields_separate_chunks, .timeout = 30) {
  kvo_desc_t d = make_desc("m");
  d.world_size = 2;
  cr_assert_eq(kvo_default_configure(1 << 20), 0);
  cr_assert_eq(store(&d, A, 0, 1), KVO_OK);
  /* Each variant differs from d in one field only (chunk_bytes stays equal). */
  enum { N = 5 };
  kvo_desc_t other[N];
  for (int i = 0; i < N; i++) other[i] = d;
  strcpy(other[0].model_id, "m2");
  other[1].rank = 1;
  other[2].world_size = 4;
  other[3].dtype = KVO_DTYPE_I32;
  other[4].head_dim = 1, other[4].layers = 4; /* other shape, same bytes */
  for (int i = 0; i < N; i++) {
    cr_assert_eq(kvo_desc_check(&other[i]), 0, "descriptor %d is valid", i);
    cr_assert_eq(other[i].chunk_bytes, kvo_desc_chunk_bytes(&other[i]), "descriptor %d", i);
    cr_assert_eq(kvo_lookup(&other[i], A, 4), 0, "descriptor %d", i);
    cr_assert_eq(load_expect(&other[i], A, 0, 1), KVO_MISS, "descriptor %d", i);
  }
  cr_assert_eq(kvo_lookup(&d, A, 4), 1);
  /* Bytes after the model id's NUL are not part of it. */
  kvo_desc_t padded = d;
  padded.model_id[5] = 'z';
  cr_assert_eq(kvo_lookup(&padded, A, 4), 1);
}

Test(kvo_default, lru_evicts_least_recently_used, .timeout = 30) {
  kvo_desc_t d = make_desc("m");
  cr_assert_eq(kvo_default_configure(2 * 128), 0);
  cr_assert_eq(store(&d, A, 0, 1), KVO_OK);
  cr_assert_eq(store(&d, A, 1, 2), KVO_OK);
  cr_assert_eq(store(&d, B, 1, 3), KVO_OK); /* evicts A0, the oldest */
  cr_assert_eq(kvo_lookup(&d, A, 8), 0);
  cr_assert_eq(load_expect(&d, A, 1, 2), KVO_OK, "A1 survives, now most recent");
  cr_assert_eq(store(&d, S, 0, 4), KVO_OK); /* evicts B1 */
  cr_assert_eq(load_expect(&d, B, 1, 3), KVO_MISS);
  cr_assert_eq(load_expect(&d, A, 1, 2), KVO_OK);
  cr_assert_eq(load_expect(&d, S, 0, 4), KVO_OK);
}

Test(kvo_default, restore_of_present_chunk_keeps_first_bytes, .timeout = 30) {
  kvo_desc_t d = make_desc("m");
  cr_assert_eq(kvo_default_configure(128), 0);
  cr_assert_eq(store(&d, A, 0, 1), KVO_OK);
  cr_assert_eq(store(&d, A, 0, 1), KVO_OK, "already held: OK without a second copy");
  cr_assert_eq(load_expect(&d, A, 0, 1), KVO_OK);
}

Test(kvo_default, too_large_or_shrunk_cache, .timeout = 30) {
  kvo_desc_t d = make_desc("m");
  cr_assert_eq(kvo_default_configure(127), 0);
  cr_assert_eq(store(&d, A, 0, 1), KVO_NOT_KEPT, "a chunk larger than the cache");
  cr_assert_eq(kvo_default_configure(3 * 128), 0);
  for (size_t i = 0; i < 3; i++) cr_assert_eq(store(&d, A, i, (unsigned)i), KVO_OK);
  cr_assert_eq(kvo_default_configure(128), 0); /* keeps only A2, the most recent */
  cr_assert_eq(load_expect(&d, A, 2, 2), KVO_OK);
  cr_assert_eq(load_expect(&d, A, 0, 0), KVO_MISS);
  cr_assert_eq(kvo_default_configure(0), 0);
  cr_assert_eq(load_expect(&d, A, 2, 2), KVO_MISS);
  cr_assert_eq(store(&d, A, 2, 2), KVO_NOT_KEPT);
}

Test(kvo_default, bad_arguments_are_refused_and_change_nothing, .timeout = 30) {
  kvo_desc_t d = make_desc("m");
  cr_assert_eq(kvo_default_configure(1 << 20), 0);
  cr_assert_eq(store(&d, A, 0, 1), KVO_OK);
  unsigned char buf[128];
  fill(buf, sizeof buf, 99);

  kvo_desc_t bad[6];
  for (int i = 0; i < 6; i++) bad[i] = d;
  bad[0].abi_version = 2;
  bad[1].size = 8;
  bad[2].chunk_bytes = 64;
  bad[3].rank = 1;
  memset(bad[4].model_id, 'x', sizeof bad[4].model_id);
  bad[5].layout = 7;
  const int want[6] = {-EPROTO, -EINVAL, -EINVAL, -EINVAL, -EINVAL, -EINVAL};
  for (int i = 0; i < 6; i++) {
    cr_assert_eq(kvo_lookup(&bad[i], A, 4), want[i], "descriptor %d", i);
    cr_assert_eq(kvo_store_chunk(&bad[i], A, 4, 0, KVO_BUF_HOST, host(buf), 128), want[i]);
    cr_assert_eq(kvo_load_chunk(&bad[i], A, 4, 0, KVO_BUF_HOST, host(buf), 128), want[i]);
  }
  cr_assert_eq(kvo_lookup(NULL, A, 4), -EINVAL);
  cr_assert_eq(kvo_lookup(&d, NULL, 4), -EINVAL);
  cr_assert_eq(kvo_store_chunk(&d, A, 7, 1, KVO_BUF_HOST, host(buf), 128), -EINVAL,
               "tokens end inside chunk 1");
  cr_assert_eq(kvo_store_chunk(&d, NULL, 4, 0, KVO_BUF_HOST, host(buf), 128), -EINVAL);
  cr_assert_eq(kvo_store_chunk(&d, A, 4, 0, 7, host(buf), 128), -EINVAL, "unknown kind");
  cr_assert_eq(kvo_store_chunk(&d, A, 4, 0, KVO_BUF_HOST, 0, 128), -EINVAL, "NULL buffer");
  cr_assert_eq(kvo_store_chunk(&d, A, 4, 0, KVO_BUF_HOST, host(buf), 127), -ENOBUFS);
  cr_assert_eq(kvo_load_chunk(&d, A, 4, 0, KVO_BUF_HOST, host(buf), 127), -ENOBUFS);
  for (size_t i = 0; i < sizeof buf; i++) cr_assert_eq(buf[i], (unsigned char)(99 * 31 + i));

  cr_assert_eq(kvo_lookup(&d, A, 14), 1, "the cache is unchanged");
  cr_assert_eq(load_expect(&d, A, 0, 1), KVO_OK);
}

Test(kvo_default, device_buffers_go_through_the_driver, .timeout = 30) {
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr dptr;
  cr_assert_eq(cuInit(0), CUDA_SUCCESS);
  cr_assert_eq(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  cr_assert_eq(cuMemAlloc(&dptr, 128), CUDA_SUCCESS);

  kvo_desc_t d = make_desc("m");
  cr_assert_eq(kvo_default_configure(1 << 20), 0);
  unsigned char src[128], back[128];
  fill(src, sizeof src, 5);
  cr_assert_eq(cuMemcpyHtoD(dptr, src, sizeof src), CUDA_SUCCESS);
  cr_assert_eq(kvo_store_chunk(&d, A, 4, 0, KVO_BUF_DEVICE, dptr, 128), KVO_OK);
  cr_assert_eq(load_expect(&d, A, 0, 5), KVO_OK, "stored from device, loaded to host");

  cr_assert_eq(store(&d, A, 1, 6), KVO_OK);
  cr_assert_eq(kvo_load_chunk(&d, A, 8, 1, KVO_BUF_DEVICE, dptr, 128), KVO_OK);
  cr_assert_eq(cuMemcpyDtoH(back, dptr, sizeof back), CUDA_SUCCESS);
  fill(src, sizeof src, 6);
  cr_assert_arr_eq(back, src, sizeof back, "stored from host, loaded to device");

  cr_assert_eq(cuMemFree(dptr), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
}

/* Threads storing, looking up and loading at once, with evictions: every load that reports
 * KVO_OK returns exactly the bytes stored for that chunk. */
#define THREADS 4
#define ROUNDS 2000

static void *hammer(void *arg) {
  unsigned id = (unsigned)(uintptr_t)arg;
  kvo_desc_t d = make_desc("m");
  uint32_t seq[CT * 2];
  long bad = 0;
  for (unsigned round = 0; round < ROUNDS; round++) {
    unsigned key = (round * 7 + id) % 64; /* 64 sequences shared by all threads */
    for (size_t t = 0; t < CT * 2; t++) seq[t] = key * 100 + (uint32_t)t;
    if (store(&d, seq, 0, key) != KVO_OK) bad++;
    if (kvo_lookup(&d, seq, CT * 2) < 0) bad++;
    unsigned char got[128], want[128]; /* no cr_assert off the test's thread */
    fill(want, sizeof want, key);
    int rc = kvo_load_chunk(&d, seq, CT, 0, KVO_BUF_HOST, host(got), sizeof got);
    if (rc == KVO_OK ? memcmp(got, want, sizeof got) != 0 : rc != KVO_MISS) bad++;
  }
  return (void *)bad;
}

Test(kvo_default, concurrent_calls_keep_chunks_intact, .timeout = 60) {
  cr_assert_eq(kvo_default_configure(16 * 128), 0); /* room for 16 of the 64 sequences */
  pthread_t th[THREADS];
  for (unsigned i = 0; i < THREADS; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, hammer, (void *)(uintptr_t)i), 0);
  for (unsigned i = 0; i < THREADS; i++) {
    void *bad;
    cr_assert_eq(pthread_join(th[i], &bad), 0);
    cr_assert_eq((long)bad, 0, "thread %u saw an error", i);
  }
}
