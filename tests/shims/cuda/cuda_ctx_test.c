/* tests/shims/cuda: the contexts kvshim uses for its own driver calls (design §9.6).
 *
 *   cuda_ctx_test
 *
 * Not preloaded: it links shims/cuda and uses the kvs_accel table (copy, pin, unpin) from a
 * thread without a current context, in a process whose engine uses device 1 only (fake driver,
 * FAKECUDA_DEVICES=2). kvshim must use the context of the pointer's device (device 1's primary,
 * active because the engine holds it), never retain device 0's, and after the engine resets
 * its device (cudaDeviceReset) must neither use a stale context nor create one; once the
 * engine retains the device again, kvshim works again. The fake's call log shows every retain. */
#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "accel.h"
#include "preload_testutil.h"

const kvs_accel_ops_t *kvs__cuda_accel_ops(void);

#define N (1u << 20)

typedef struct job {
  CUdeviceptr d;
  uint8_t *hb, *back;
  int copy_d2h, copy_h2d, pin, unpin;
} job_t;

/* Everything kvshim does for a peer, from a thread that has no current context. */
static void *no_ctx_thread(void *p) {
  job_t *j = p;
  CUcontext cur = (CUcontext)1;
  PT_CHECK(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == NULL, "the thread has a context");
  const kvs_accel_ops_t *ops = kvs__cuda_accel_ops();
  if (j->d) {
    j->copy_h2d = ops->copy((void *)(uintptr_t)j->d, j->hb, N, KVS_COPY_H2D);
    j->copy_d2h = ops->copy(j->back, (void *)(uintptr_t)j->d, N, KVS_COPY_D2H);
  }
  j->pin = ops->pin(j->hb, N);
  j->unpin = j->pin == 0 ? ops->unpin(j->hb) : -1;
  PT_CHECK(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == NULL, "a context was left current");
  return NULL;
}
static void run_job(job_t *j) {
  pthread_t th;
  PT_CHECK(pthread_create(&th, NULL, no_ctx_thread, j) == 0, "pthread_create");
  pthread_join(th, NULL);
}

int main(void) {
  char tmp[256], log[512];
  pt_mkdtemp(tmp, sizeof tmp, "ctx");
  snprintf(log, sizeof log, "%s/fake.log", tmp);
  setenv("FAKECUDA_DEVICES", "2", 1);
  setenv("FAKECUDA_LOG", log, 1);
  CUcontext p1 = NULL;
  PT_CHECK(cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&p1, 1) == CUDA_SUCCESS &&
               cuCtxSetCurrent(p1) == CUDA_SUCCESS,
           "device 1 setup");
  job_t j = {0};
  j.hb = aligned_alloc(4096, N);
  j.back = malloc(N);
  PT_CHECK(j.hb && j.back, "host buffers");
  memset(j.hb, 0x3c, N);
  /* Before any allocation: a pin needs some context, and the only live one is device 1's. */
  run_job(&j);
  PT_CHECK(j.pin == 0 && j.unpin == 0, "pin %d unpin %d", j.pin, j.unpin);
  char *first = pt_read_file(log, NULL);
  PT_CHECK(first && pt_count(first, "cuDevicePrimaryCtxRetain dev=0") == 0,
           "kvshim retained device 0's primary context for a pin");
  free(first);
  PT_CHECK(cuMemAlloc(&j.d, N) == CUDA_SUCCESS, "device 1 buffer");

  run_job(&j);
  PT_CHECK(j.copy_h2d == 0 && j.copy_d2h == 0 && j.pin == 0 && j.unpin == 0,
           "kvs_accel without a current context: H2D %d D2H %d pin %d unpin %d", j.copy_h2d,
           j.copy_d2h, j.pin, j.unpin);
  PT_CHECK(memcmp(j.hb, j.back, N) == 0, "round trip lost data");

  /* The engine resets its device: its context is gone, kvshim must not bring one back. */
  PT_CHECK(cuDevicePrimaryCtxReset(1) == CUDA_SUCCESS, "reset");
  char *before = pt_read_file(log, NULL);
  PT_CHECK(before, "no call log");
  int retains_before = pt_count(before, "cuDevicePrimaryCtxRetain");
  job_t k = j;
  run_job(&k);
  PT_CHECK(k.pin < 0, "pinning without any live context succeeded");
  char *after = pt_read_file(log, NULL);
  PT_CHECK(after && pt_count(after, "cuDevicePrimaryCtxRetain dev=0") == 0,
           "kvshim retained device 0's primary context");
  PT_CHECK(pt_count(after, "cuDevicePrimaryCtxRetain") == retains_before,
           "kvshim created a context after the engine reset its device:\n%s",
           after + strlen(before));

  /* The engine uses the device again: so can kvshim. */
  PT_CHECK(cuDevicePrimaryCtxRetain(&p1, 1) == CUDA_SUCCESS &&
               cuCtxSetCurrent(p1) == CUDA_SUCCESS && cuMemAlloc(&k.d, N) == CUDA_SUCCESS,
           "device 1 again");
  memset(k.back, 0, N);
  run_job(&k);
  PT_CHECK(k.copy_h2d == 0 && k.copy_d2h == 0 && k.pin == 0 && k.unpin == 0,
           "after the engine's new retain: H2D %d D2H %d pin %d unpin %d", k.copy_h2d,
           k.copy_d2h, k.pin, k.unpin);
  PT_CHECK(memcmp(k.hb, k.back, N) == 0, "round trip lost data");
  free(after);
  after = pt_read_file(log, NULL);
  PT_CHECK(after && pt_count(after, "cuDevicePrimaryCtxRetain dev=0") == 0,
           "kvshim retained device 0's primary context");
  PT_CHECK(cuMemFree(k.d) == CUDA_SUCCESS, "free");
  free(before), free(after), free(j.hb), free(j.back);
  pt_rm_rf(tmp);
  printf("PASS ctx\n");
  return 0;
}
