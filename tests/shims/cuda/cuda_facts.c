/* tests/shims/cuda: the driver facts kvshim depends on, as strict verdicts (scripts/gpu-check
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
 *                 that learning.
 *   versions <base>  every hooked base name (and flavour) asked of both resolvers
 *                 (cuGetProcAddress, cuGetProcAddress_v2) at every version an engine asks, up
 *                 to the driver's: each found answer must be the dlsym pointer of a hooked row
 *                 of that base (kvshim substitutes it) or of an older ABI of the base that
 *                 kvshim leaves alone by design (the legacy 32-bit cuMemAlloc); an answer that
 *                 is neither (a newer ABI kvshim does not hook, or an unknown pointer) fails.
 *                 The versions: what libcudart 12/13 asks (each entry point at the version of
 *                 the ABI it was built against: 2000 ... 11030 for cuGetProcAddress, 12000 for
 *                 cuGetProcAddress_v2, seen in the fake's log of cuda_cudart_prog), NCCL's
 *                 src/misc/cudawrap.cc (cuMemCreate at 10020 through the v1 resolver), PyTorch's
 *                 c10/cuda/driver_api.h (12000, and 12080 for the optional rows), programs
 *                 asking at CUDART_VERSION (12020 ... 13000), and the driver's own version. */
#include <cuda.h>
#undef cuGetProcAddress
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
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

/* The versions engines ask at (see the header), ascending; those above the driver's are not
 * asked (cuda.h, cuGetProcAddress: "If the specified CUDA version is greater than the driver
 * version, the API will return CUDA_ERROR_INVALID_VALUE"). */
static const int versions[] = {2000,  2020,  2030,  3020,  4000,  6000,  7000,  10020,
                               11020, 11030, 12000, 12020, 12080, 13000, 13020};

typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);

/* The ELF name of p among the names of base: a hooked row (*hooked true, *abi its number) or
 * base, base_v2 ... base_v9, legacy or per-thread (a per-thread lookup answers the legacy
 * variant where the base has no per-thread one: cuda.h, cuGetProcAddress); NULL when none. */
static const char *name_of(void *lib, void *p, const char *base, bool *hooked, int *abi,
                           char *buf, size_t cap) {
  for (size_t i = 0; i < NROWS; i++) {
    char b[64];
    bool rpt;
    int a = split(rows[i], b, sizeof b, &rpt);
    if (!strcmp(b, base) && dlsym(lib, rows[i]) == p) {
      *hooked = true, *abi = a;
      return rows[i];
    }
  }
  static const char *const sfx[] = {"", "_ptsz", "_ptds"};
  for (int a = 1; a <= 9; a++)
    for (int k = 0; k < 3; k++) {
      char v[8] = "";
      if (a > 1) snprintf(v, sizeof v, "_v%d", a);
      snprintf(buf, cap, "%s%s%s", base, v, sfx[k]);
      if (dlsym(lib, buf) == p) {
        *hooked = false, *abi = a;
        return buf;
      }
    }
  return NULL;
}

static int check_versions(void *lib, int drv) {
  gpa_v1_t v1 = (gpa_v1_t)(uintptr_t)dlsym(lib, "cuGetProcAddress");
  int bad = 0;
  for (size_t i = 0; i < NROWS; i++) {
    char base[64], other[64];
    bool pt, opt, seen = false;
    int lowest = 1 << 30;
    split(rows[i], base, sizeof base, &pt);
    for (size_t j = 0; j < NROWS; j++) { /* once per base and flavour; its lowest hooked ABI */
      int a = split(rows[j], other, sizeof other, &opt);
      if (opt == pt && !strcmp(base, other)) {
        if (j < i) seen = true;
        if (a < lowest) lowest = a;
      }
    }
    if (seen) continue;
    char line[2048];
    size_t n = 0;
    int fails = 0;
    for (size_t k = 0; k < sizeof versions / sizeof versions[0] + 1; k++) {
      int v = k < sizeof versions / sizeof versions[0] ? versions[k] : drv;
      if (v > drv || (k < sizeof versions / sizeof versions[0] && v == drv)) continue;
      for (int r = 0; r < 2; r++) {
        void *p = NULL;
        cuuint64_t fl = pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                           : CU_GET_PROC_ADDRESS_DEFAULT;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
        CUresult g = r ? (v1 ? v1(base, &p, v, fl) : CUDA_ERROR_NOT_FOUND)
                       : cuGetProcAddress_v2(base, &p, v, fl, &st);
        if (g != CUDA_SUCCESS || !p || st != CU_GET_PROC_ADDRESS_SUCCESS) {
          if (r == 0 && n < sizeof line)
            n += (size_t)snprintf(line + n, sizeof line - n, " %d:none", v);
          continue;
        }
        char buf[96];
        bool hooked = false;
        int abi = 0;
        const char *nm = name_of(lib, p, base, &hooked, &abi, buf, sizeof buf);
        bool ok = nm && (hooked || abi < lowest);
        if (!ok) fails++;
        if (r == 0 && n < sizeof line)
          n += (size_t)snprintf(line + n, sizeof line - n, " %d:%s%s", v, nm ? nm : "unknown",
                                !nm ? "" : hooked ? "" : abi < lowest ? "(older,unhooked)"
                                                                       : "(NEWER,unhooked)");
        else if (!ok && n < sizeof line)
          n += (size_t)snprintf(line + n, sizeof line - n, " v1@%d:%s", v, nm ? nm : "unknown");
      }
    }
    bad += fails > 0;
    printf("versions %s (%s):%s -> %s\n", base, pt ? "per-thread" : "default", line,
           fails ? "FAIL" : "PASS");
  }
  return bad;
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
  bad += check_versions(lib, ver);
  return bad ? 1 : 0;
}
