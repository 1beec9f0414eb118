/* tests/integration: the driver facts kvshim depends on, as strict verdicts (scripts/gpu-check
 * step "facts"; on the fake driver in ctest).
 *
 *   cuda_facts
 *
 * Not preloaded. Prints one line per fact and exits 0 only when all hold:
 *   driver        cuDriverGetVersion, device count > 0
 *   device <i>    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING and
 *                 CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM are 1 (else kvshim leaves host
 *                 allocations to the driver: design §9.6); READ_ONLY_HOST_REGISTER_SUPPORTED
 *                 is printed (information)
 *   row <name>    for every hooked row that is the newest ABI of its base name, the pointer
 *                 dlsym(libcuda.so.1) gives equals the one cuGetProcAddress_v2 gives for the
 *                 base name (default flags, or per-thread flags for _ptsz/_ptds rows) at the
 *                 driver's version. When they differ kvshim learns the resolver's answers
 *                 (shims/cuda), but the fact is reported as a failure: the routing then rests on
 *                 that learning. */
#include <cuda.h>
#undef cuGetProcAddress
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cuda_hooks.h"

#define ROW_NAME(ret, name, params, args) #name,
static const char *const rows[] = {KVS_CUDA_HOOKS(ROW_NAME)};
#undef ROW_NAME
#define NROWS (sizeof rows / sizeof rows[0])

/* base name, per-thread flag and ABI number (1 without a _vN suffix) of an ELF name */
static int split(const char *name, char *base, size_t cap, bool *pt) {
  snprintf(base, cap, "%s", name);
  size_t n = strlen(base);
  *pt = n > 5 && (!strcmp(base + n - 5, "_ptsz") || !strcmp(base + n - 5, "_ptds"));
  if (*pt) base[n -= 5] = '\0';
  char *v = strrchr(base, '_');
  int abi = 1;
  if (v && v[1] == 'v' && v[2] >= '0' && v[2] <= '9' && sscanf(v + 2, "%d", &abi) == 1) *v = '\0';
  return abi;
}

int main(void) {
  int ver = 0, n = 0, bad = 0;
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDriverGetVersion(&ver);
  if (r == CUDA_SUCCESS) r = cuDeviceGetCount(&n);
  printf("driver version=%d devices=%d -> %s\n", ver, n, r == 0 && n > 0 ? "PASS" : "FAIL");
  if (r != CUDA_SUCCESS || n <= 0) return 1;
  for (int i = 0; i < n; i++) {
    CUdevice d;
    char name[128] = "?";
    int uva = -1, hp = -1, ro = -1;
    if (cuDeviceGet(&d, i) == 0) {
      cuDeviceGetName(name, sizeof name, d);
      cuDeviceGetAttribute(&uva, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, d);
      cuDeviceGetAttribute(&hp, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, d);
      cuDeviceGetAttribute(&ro, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, d);
    }
    bool ok = uva == 1 && hp == 1;
    bad += !ok;
    printf("device %d '%s' unified_addressing=%d host_pointer_for_registered=%d "
           "read_only_register=%d -> %s\n", i, name, uva, hp, ro, ok ? "PASS" : "FAIL");
  }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) {
    printf("libcuda.so.1 not loaded -> FAIL\n");
    return 1;
  }
  for (size_t i = 0; i < NROWS; i++) {
    char base[64], other[64];
    bool pt, opt;
    int abi = split(rows[i], base, sizeof base, &pt);
    bool newest = true;
    for (size_t j = 0; j < NROWS; j++)
      if (split(rows[j], other, sizeof other, &opt) > abi && opt == pt && !strcmp(base, other))
        newest = false;
    if (!newest) continue;
    void *a = dlsym(lib, rows[i]), *b = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult g = cuGetProcAddress_v2(base, &b, ver,
                                     pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                        : CU_GET_PROC_ADDRESS_DEFAULT,
                                     &st);
    bool ok = a && g == CUDA_SUCCESS && a == b;
    bad += !ok;
    printf("row %s: dlsym %s, cuGetProcAddress_v2(%s, %d, %s) %s -> %s\n", rows[i],
           a ? "found" : "missing", base, ver, pt ? "per-thread" : "default",
           g != CUDA_SUCCESS ? "failed" : a == b ? "same pointer" : "another pointer",
           ok ? "PASS" : "FAIL");
  }
  return bad ? 1 : 0;
}
