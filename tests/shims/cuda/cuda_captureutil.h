/* tests/shims/cuda: a thread that holds a global-mode stream capture while another thread
 * works, for the CUDA tests (the fake models global capture: an unsafe call from another thread
 * in GLOBAL mode fails and invalidates it).
 *
 * Use: set ctx (and blocking, to capture a blocking stream) and pthread_barrier_init(&bar, NULL, 2), start capture_thread, wait on bar (the
 * capture has begun), do the work, wait on bar again (the capture ends), join; then begin and
 * end must both be CUDA_SUCCESS. */
#ifndef KVSHIM_TESTS_CUDA_CAPTUREUTIL_H
#define KVSHIM_TESTS_CUDA_CAPTUREUTIL_H

#include <cuda.h>
#include <pthread.h>

typedef struct cap {
  CUcontext ctx;
  pthread_barrier_t bar;
  CUresult begin, end;
  int blocking; /* capture a blocking stream (flags 0), else a CU_STREAM_NON_BLOCKING one */
} cap_t;

static inline void *capture_thread(void *p) {
  cap_t *c = p;
  CUstream s = NULL;
  CUgraph g = NULL;
  c->begin = cuCtxSetCurrent(c->ctx);
  if (c->begin == CUDA_SUCCESS) c->begin = cuStreamCreate(&s, c->blocking ? 0u : CU_STREAM_NON_BLOCKING);
  if (c->begin == CUDA_SUCCESS) c->begin = cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  pthread_barrier_wait(&c->bar);
  pthread_barrier_wait(&c->bar);
  c->end = c->begin == CUDA_SUCCESS ? cuStreamEndCapture(s, &g) : c->begin;
  if (g) cuGraphDestroy(g);
  if (s) cuStreamDestroy(s);
  return NULL;
}

#endif
