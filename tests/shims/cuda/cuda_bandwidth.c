/* tests/shims/cuda: host<->device copy bandwidth from a cuMemAllocHost_v2 buffer.
 *
 *   cuda_bandwidth [--mib N] [--reps R]
 *
 * Run without the preload, the buffer is the driver's own pinned allocation; with the preload
 * (and N MiB >= KVSHIM_HOST_MIN) it is carved from kvshim's host arena and registered with
 * cuMemHostRegister_v2. scripts/gpu-check compares the two on a real GPU; ctest runs a small
 * size on the fake driver to check that the data arrives intact. Prints one JSON line:
 * {"mib":N,"reps":R,"alloc_ms":..,"h2d_gbps":..,"d2h_gbps":..,"h2d_gbps_min":..,...}
 * (GB = 1e9 bytes;
 * median over the repetitions, each one async copy on a stream, then synchronised; alloc_ms:
 * the cuMemAllocHost_v2 call itself). */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_benchutil.h"

#define CK(call)                                                                              \
  do {                                                                                        \
    CUresult r_ = (call);                                                                     \
    if (r_ != CUDA_SUCCESS) {                                                                 \
      fprintf(stderr, "%s failed: %d\n", #call, (int)r_);                                     \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

int main(int argc, char **argv) {
  size_t mib = 256;
  int reps = 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--mib N] [--reps R]\n", argv[0]);
      return 2;
    }
  }
  if (!mib || reps < 1) return 2;
  size_t n = mib << 20;
  CUdevice dev;
  CUcontext ctx;
  CUstream s;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CK(cuStreamCreate(&s, 0));
  uint8_t *h = NULL;
  CUdeviceptr d;
  double ta = now_s();
  CK(cuMemAllocHost((void **)&h, n));
  double alloc_ms = (now_s() - ta) * 1e3;
  CK(cuMemAlloc(&d, n));
  for (size_t i = 0; i < n; i += 4096) h[i] = (uint8_t)(i >> 12);
  CK(cuMemcpyHtoDAsync(d, h, n, s)); /* warm up both directions */
  CK(cuStreamSynchronize(s));
  memset(h, 0, n);
  CK(cuMemcpyDtoHAsync(h, d, n, s));
  CK(cuStreamSynchronize(s));
  for (size_t i = 0; i < n; i += 4096)
    if (h[i] != (uint8_t)(i >> 12)) {
      fprintf(stderr, "data mismatch at byte %zu\n", i);
      return 1;
    }
  double *th = calloc((size_t)reps, sizeof *th), *td = calloc((size_t)reps, sizeof *td);
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    CK(cuMemcpyHtoDAsync(d, h, n, s));
    CK(cuStreamSynchronize(s));
    double t1 = now_s();
    CK(cuMemcpyDtoHAsync(h, d, n, s));
    CK(cuStreamSynchronize(s));
    double t2 = now_s();
    th[r] = (double)n / (t1 - t0) / 1e9;
    td[r] = (double)n / (t2 - t1) / 1e9;
  }
  qsort(th, (size_t)reps, sizeof *th, cmp_d);
  qsort(td, (size_t)reps, sizeof *td, cmp_d);
  printf("{\"mib\":%zu,\"reps\":%d,\"alloc_ms\":%.2f,\"h2d_gbps\":%.2f,\"h2d_gbps_min\":%.2f,"
         "\"h2d_gbps_max\":%.2f,"
         "\"d2h_gbps\":%.2f,\"d2h_gbps_min\":%.2f,\"d2h_gbps_max\":%.2f}\n",
         mib, reps, alloc_ms, th[reps / 2], th[0], th[reps - 1], td[reps / 2], td[0], td[reps - 1]);
  CK(cuMemFree(d));
  CK(cuMemFreeHost(h));
  CK(cuStreamDestroy(s));
  free(th);
  free(td);
  return 0;
}
