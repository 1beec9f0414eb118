/* tests/shims/cuda: kvshim's own driver calls never break an engine's stream capture
 * (design §9.6; the fake driver models global capture: an unsafe call from another thread in
 * GLOBAL mode fails and invalidates the capture).
 *
 *   cuda_capture_test
 *
 * Not preloaded: it links shims/cuda and uses the kvs_accel table (pin, copy, unpin), the
 * calls kvshim makes from its own threads, from one thread while another thread captures a
 * stream in CU_STREAM_CAPTURE_MODE_GLOBAL, a non-blocking stream and then a blocking one. The
 * capture must end cleanly and the calling thread's capture mode must be what it was. */
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "accel.h"
#include "cuda_captureutil.h"
#include "preload_testutil.h"

const kvs_accel_ops_t *kvs__cuda_accel_ops(void);

/* One round: kvs_accel pin, copy both ways, unpin while another thread captures a stream in
 * global mode, blocking (flags 0) or not. kvshim's copies must not use the legacy stream: it
 * synchronises with every blocking stream, so using it invalidates a blocking capture even in
 * relaxed mode (the fake driver enforces it). */
static void round_trip(const kvs_accel_ops_t *ops, int blocking) {
  const size_t n = 1u << 20;
  CUdeviceptr d = 0;
  PT_CHECK(cuMemAlloc(&d, n) == CUDA_SUCCESS, "device buffer");
  uint8_t *hb = aligned_alloc(4096, n), *back = malloc(n);
  PT_CHECK(hb && back, "host buffers");
  memset(hb, 0x5a, n);

  cap_t c = {.blocking = blocking};
  PT_CHECK(cuCtxGetCurrent(&c.ctx) == CUDA_SUCCESS, "context");
  pthread_barrier_init(&c.bar, NULL, 2);
  pthread_t th;
  PT_CHECK(pthread_create(&th, NULL, capture_thread, &c) == 0, "pthread_create");
  pthread_barrier_wait(&c.bar); /* the other thread captures in global mode */
  int pin = ops->pin(hb, n);
  int h2d = ops->copy((void *)(uintptr_t)d, hb, n, KVS_COPY_H2D);
  int d2h = ops->copy(back, (void *)(uintptr_t)d, n, KVS_COPY_D2H);
  int unpin = pin == 0 ? ops->unpin(hb) : 0;
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  CUresult xr = cuThreadExchangeStreamCaptureMode(&m);
  pthread_barrier_wait(&c.bar);
  pthread_join(th, NULL);
  const char *kind = blocking ? "blocking" : "non-blocking";
  PT_CHECK(c.begin == CUDA_SUCCESS, "begin capture (%s): %d", kind, (int)c.begin);
  PT_CHECK(pin == 0 && h2d == 0 && d2h == 0 && unpin == 0,
           "kvs_accel during a %s capture: pin %d, H2D %d, D2H %d, unpin %d", kind, pin, h2d,
           d2h, unpin);
  PT_CHECK(memcmp(hb, back, n) == 0, "round trip lost data");
  PT_CHECK(c.end == CUDA_SUCCESS, "the %s capture was invalidated (end %d)", kind, (int)c.end);
  PT_CHECK(xr == CUDA_SUCCESS && m == CU_STREAM_CAPTURE_MODE_GLOBAL,
           "the calling thread's capture mode changed to %d", (int)m);
  PT_CHECK(cuThreadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS, "restore the mode");
  pthread_barrier_destroy(&c.bar);
  PT_CHECK(cuMemFree(d) == CUDA_SUCCESS, "free");
  free(hb);
  free(back);
}

int main(void) {
  const kvs_accel_ops_t *ops = kvs__cuda_accel_ops();
  pt_cuda_setup();
  round_trip(ops, 0);
  round_trip(ops, 1);
  printf("PASS capture\n");
  return 0;
}
