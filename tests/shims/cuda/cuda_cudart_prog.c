/* tests/shims/cuda: a CUDA runtime program (built against the toolkit's libcudart, shared
 * and static), run with and without the preload by cuda_preload_test's cudart case and by
 * scripts/gpu-check. It prints results only (no addresses), so two runs can be compared. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1u << 20)

int main(void) {
  int n = -1;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    printf("init failed %d %s\n", (int)e, cudaGetErrorName(e));
    void *p = NULL;
    e = cudaMallocHost(&p, 4 * MiB);
    printf("mallochost %d\n", (int)e);
    return 0;
  }
  printf("init ok devices>0=%d\n", n > 0);
  void *h = NULL, *h2 = NULL, *d = NULL;
  e = cudaMallocHost(&h, 4 * MiB);
  printf("mallochost %d\n", (int)e);
  e = cudaHostAlloc(&h2, 4 * MiB, cudaHostAllocPortable | cudaHostAllocMapped);
  printf("hostalloc %d\n", (int)e);
  e = cudaMalloc(&d, MiB);
  printf("malloc %d\n", (int)e);
  if (!h || !h2 || !d) return 1;
  memset(h, 7, MiB);
  e = cudaMemcpy(d, h, MiB, cudaMemcpyHostToDevice);
  printf("memcpy h2d %d\n", (int)e);
  cudaStream_t s;
  e = cudaStreamCreate(&s);
  printf("stream %d\n", (int)e);
  e = cudaMemcpyAsync(h2, d, MiB, cudaMemcpyDeviceToHost, s);
  printf("memcpy d2h async %d\n", (int)e);
  e = cudaStreamSynchronize(s);
  printf("sync %d same=%d\n", (int)e, memcmp(h, h2, MiB) == 0);
  cudaStreamDestroy(s);
  printf("free %d freehost %d %d\n", (int)cudaFree(d), (int)cudaFreeHost(h), (int)cudaFreeHost(h2));
  return 0;
}
