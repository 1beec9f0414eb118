/* tests/fakes/cuda: tests of the fake driver, through its public driver API only.
 *
 * A plain C program: each test runs in its own fork()ed child (fresh driver state, environment
 * set before the first call), and the program re-executes itself (/proc/self/exe --child MODE)
 * where a different process image is needed: IPC opens from another process and call logs of
 * independent runs. Exit status 0 when every test passed; each failure names its check. */
#include <cuda.h>
#include <cudaTypedefs.h>

#include "fakecuda_compat.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <regex.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* Legacy (pre-_v2) prototypes: cudaTypedefs.h declares them only for the driver's own build. */
typedef CUresult (*fk_v1_alloc_t)(unsigned int *dptr, unsigned int bytesize);
typedef CUresult (*fk_v1_free_t)(unsigned int dptr);
typedef CUresult (*fk_v1_htod_t)(unsigned int dst, const void *src, unsigned int n);
typedef CUresult (*fk_v1_dtoh_t)(void *dst, unsigned int src, unsigned int n);

static const char *test_name = "?";

#define FAIL_AT(what, ...)                                                                    \
  do {                                                                                        \
    fprintf(stderr, "FAIL [%s] %s:%d: %s", test_name, __FILE__, __LINE__, what);              \
    fprintf(stderr, __VA_ARGS__);                                                             \
    fputc('\n', stderr);                                                                      \
    fflush(NULL);                                                                             \
    _exit(1);                                                                                 \
  } while (0)
#define FAIL(...) FAIL_AT("", __VA_ARGS__)

#define CHECK(cond, ...)                                                                      \
  do {                                                                                        \
    if (!(cond)) FAIL_AT("CHECK(" #cond ") failed: ", __VA_ARGS__);                           \
  } while (0)

static const char *err_name(CUresult r) {
  const char *s = NULL;
  return cuGetErrorName(r, &s) == CUDA_SUCCESS && s ? s : "(not a CUresult)";
}

#define CHECK_CU(expr, want)                                                                  \
  do {                                                                                        \
    CUresult got_ = (expr);                                                                   \
    if (got_ != (want))                                                                       \
      FAIL("%s returned %d %s, expected %d %s", #expr, (int)got_, err_name(got_), (int)(want), \
           err_name(want));                                                                   \
  } while (0)

#define OK CUDA_SUCCESS

/* ---- helpers ------------------------------------------------------------------------------ */

static void *lib(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(h != NULL, "libcuda.so.1 is not loaded: %s", dlerror());
  return h;
}

static void *sym(const char *name) {
  void *p = dlsym(lib(), name);
  CHECK(p != NULL, "libcuda.so.1 does not export %s", name);
  return p;
}

/* cuInit + the primary context of device 0 made current on the calling thread. */
static CUcontext setup(void) {
  CUcontext c = NULL;
  CHECK_CU(cuInit(0), OK);
  CHECK_CU(cuDevicePrimaryCtxRetain(&c, 0), OK);
  CHECK_CU(cuCtxSetCurrent(c), OK);
  return c;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

static int is_filled(const unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(seed * 131u + i * 7u + (i >> 8))) return 0;
  return 1;
}

static void read_dev(CUdeviceptr d, void *out, size_t n) { CHECK_CU(cuMemcpyDtoH(out, d, n), OK); }

static void handle_hex(const CUipcMemHandle *h, char out[2 * CU_IPC_HANDLE_SIZE + 1]) {
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
    sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static int hex_handle(const char *s, CUipcMemHandle *h) {
  if (strlen(s) != 2 * CU_IPC_HANDLE_SIZE) return -1;
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
    h->reserved[i] = (char)v;
  }
  return 0;
}

/* Runs /proc/self/exe --child args... with extra environment; returns its exit status (or
 * 128+signal) and, when out != NULL, its stdout. */
static int run_self(const char *const *args, const char *const *env, char *out, size_t cap) {
  int pipefd[2];
  CHECK(pipe(pipefd) == 0, "pipe: %s", strerror(errno));
  pid_t pid = fork();
  CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    for (const char *const *e = env; e && *e; e++) putenv((char *)*e);
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    close(pipefd[1]);
    const char *argv[16] = {"test_fakecuda", "--child"};
    int n = 2;
    for (const char *const *a = args; *a && n < 15; a++) argv[n++] = *a;
    argv[n] = NULL;
    execv("/proc/self/exe", (char *const *)argv);
    _exit(127);
  }
  close(pipefd[1]);
  size_t len = 0;
  char sink[256];
  for (;;) {
    char *dst = out && len + 1 < cap ? out + len : sink;
    size_t room = out && len + 1 < cap ? cap - 1 - len : sizeof sink;
    ssize_t k = read(pipefd[0], dst, room);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    if (dst != sink) len += (size_t)k;
  }
  if (out) out[len] = '\0';
  close(pipefd[0]);
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL, "open %s: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  CHECK(buf != NULL, "malloc");
  size_t k;
  while ((k = fread(buf + n, 1, cap - n, f)) > 0) {
    n += k;
    if (n == cap) {
      cap *= 2;
      buf = realloc(buf, cap + 1);
      CHECK(buf != NULL, "realloc");
    }
  }
  fclose(f);
  buf[n] = '\0';
  *len = n;
  return buf;
}

static char tmpdir[256];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/test_fakecuda.XXXXXX");
  CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp: %s", strerror(errno));
}

static void tmp_path(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", tmpdir, name);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void t_init_required(void) {
  CUdeviceptr d = 0xdeadbeef;
  CHECK_CU(cuMemAlloc(&d, 16), CUDA_ERROR_NOT_INITIALIZED);
  CHECK(d == 0xdeadbeef, "out-parameter written on failure");
  int n = -7;
  CHECK_CU(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  CHECK(n == -7, "out-parameter written on failure");
  CUcontext c = (CUcontext)0x1;
  CHECK_CU(cuDevicePrimaryCtxRetain(&c, 0), CUDA_ERROR_NOT_INITIALIZED);
  CHECK(c == (CUcontext)0x1, "out-parameter written on failure");

  int v = 0; /* no cuInit needed for the version */
  CHECK_CU(cuDriverGetVersion(&v), OK);
  CHECK(v == KVS_FK_DRIVER_VERSION, "driver version %d, expected %d", v, KVS_FK_DRIVER_VERSION);
  CHECK_CU(cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);

  CHECK_CU(cuInit(1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  CHECK_CU(cuInit(0), OK);
  CHECK_CU(cuInit(0), OK);
  CHECK_CU(cuDeviceGetCount(&n), OK);
  CHECK(n == 1, "default device count is %d, expected 1", n);
  char name[64];
  CHECK_CU(cuDeviceGetName(name, sizeof name, 0), OK);
  CHECK(strcmp(name, "kvshim fakecuda device 0") == 0,
        "device 0 is '%s': not the fake driver (LD_LIBRARY_PATH?)", name);
}

static void t_devices(void) {
  setenv("FAKECUDA_DEVICES", "3", 1);
  CHECK_CU(cuInit(0), OK);
  int n = 0;
  CHECK_CU(cuDeviceGetCount(&n), OK);
  CHECK(n == 3, "FAKECUDA_DEVICES=3 gave %d devices", n);
  PFN_cuDeviceGetUuid_v9020 uuid_v1 = (PFN_cuDeviceGetUuid_v9020)sym("cuDeviceGetUuid");
  CUuuid u[3];
  for (int i = 0; i < 3; i++) {
    CUdevice d = -1;
    CHECK_CU(cuDeviceGet(&d, i), OK);
    CHECK(d == i, "cuDeviceGet(%d) gave %d", i, d);
    char name[64], want[64];
    CHECK_CU(cuDeviceGetName(name, sizeof name, d), OK);
    snprintf(want, sizeof want, "kvshim fakecuda device %d", i);
    CHECK(strcmp(name, want) == 0, "device %d is named '%s'", i, name);
    CUuuid a, b;
    CHECK_CU(cuDeviceGetUuid(&u[i], d), OK); /* cuda.h: cuDeviceGetUuid_v2 */
    CHECK_CU(cuDeviceGetUuid(&a, d), OK);
    CHECK_CU(uuid_v1(&b, d), OK);
    CHECK(memcmp(&a, &u[i], 16) == 0, "UUID of device %d changed between calls", i);
    CHECK(memcmp(&b, &u[i], 16) == 0, "cuDeviceGetUuid and _v2 differ for device %d", i);
    static const CUuuid zero;
    CHECK(memcmp(&u[i], &zero, 16) != 0, "UUID of device %d is all zero (means cpu)", i);
  }
  for (int i = 0; i < 3; i++)
    for (int j = i + 1; j < 3; j++)
      for (int k = 0; k < 16; k++)
        CHECK(u[i].bytes[k] != u[j].bytes[k], "devices %d and %d share UUID byte %d", i, j, k);
  CUdevice d = 42;
  CHECK_CU(cuDeviceGet(&d, 3), CUDA_ERROR_INVALID_DEVICE);
  CHECK(d == 42, "out-parameter written on failure");
  CHECK_CU(cuDeviceGet(&d, -1), CUDA_ERROR_INVALID_DEVICE);
  char name[8] = "keep";
  CHECK_CU(cuDeviceGetName(name, sizeof name, 3), CUDA_ERROR_INVALID_DEVICE);
  CHECK(strcmp(name, "keep") == 0, "name written on failure");
  CHECK_CU(cuDeviceGetName(name, sizeof name, 1), OK); /* truncated, terminated */
  CHECK(strlen(name) == sizeof name - 1, "name not truncated to the buffer: '%s'", name);
  CUuuid keep = u[0];
  CHECK_CU(cuDeviceGetUuid(&keep, 7), CUDA_ERROR_INVALID_DEVICE);
  CHECK(memcmp(&keep, &u[0], 16) == 0, "UUID written on failure");
}

static void t_no_devices(void) {
  setenv("FAKECUDA_DEVICES", "0", 1);
  CHECK_CU(cuInit(0), CUDA_ERROR_NO_DEVICE);
  int n = -1;
  CHECK_CU(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  CHECK(n == -1, "out-parameter written on failure");
}

static void t_bad_env(void) {
  setenv("FAKECUDA_DEVICES", "many", 1);
  setenv("FAKECUDA_MEM_LIMIT", "lots", 1);
  setup();
  int n = 0;
  CHECK_CU(cuDeviceGetCount(&n), OK);
  CHECK(n == 1, "an invalid FAKECUDA_DEVICES must keep the default 1, got %d", n);
  size_t fr = 0, tot = 0;
  CHECK_CU(cuMemGetInfo(&fr, &tot), OK);
  CHECK(tot == (size_t)1 << 30, "an invalid FAKECUDA_MEM_LIMIT must keep 1 GiB, got %zu", tot);
}

struct thread_arg {
  CUcontext ctx;
  CUresult no_ctx, with_ctx;
};

static void *alloc_in_thread(void *p) {
  struct thread_arg *a = p;
  CUdeviceptr d = 0;
  a->no_ctx = cuMemAlloc(&d, 64);
  a->with_ctx = cuCtxSetCurrent(a->ctx);
  if (a->with_ctx == OK) a->with_ctx = cuMemAlloc(&d, 64);
  if (a->with_ctx == OK) a->with_ctx = cuMemFree(d);
  return NULL;
}

static void t_contexts(void) {
  CHECK_CU(cuInit(0), OK);
  CUdeviceptr d = 0x5a5a;
  CHECK_CU(cuMemAlloc(&d, 64), CUDA_ERROR_INVALID_CONTEXT);
  CHECK(d == 0x5a5a, "out-parameter written on failure");
  CUcontext cur = (CUcontext)0x1;
  CHECK_CU(cuCtxGetCurrent(&cur), OK);
  CHECK(cur == NULL, "a fresh thread has a current context");

  CUcontext p = NULL, p2 = NULL;
  CHECK_CU(cuDevicePrimaryCtxRetain(&p, 0), OK);
  CHECK_CU(cuDevicePrimaryCtxRetain(&p2, 0), OK);
  CHECK(p != NULL && p == p2, "the primary context handle is not stable");
  CHECK_CU(cuCtxSetCurrent(p), OK);
  CHECK_CU(cuCtxGetCurrent(&cur), OK);
  CHECK(cur == p, "cuCtxSetCurrent did not make the primary current");
  CUdevice dev = -1;
  CHECK_CU(cuCtxGetDevice(&dev), OK);
  CHECK(dev == 0, "current context on device %d", dev);
  CHECK_CU(cuCtxSynchronize(), OK);
  CHECK_CU(cuMemAlloc(&d, 64), OK);
  CHECK_CU(cuMemFree(d), OK);

  /* The current context is per thread. */
  struct thread_arg a = {.ctx = p};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, alloc_in_thread, &a) == 0, "pthread_create");
  pthread_join(th, NULL);
  CHECK(a.no_ctx == CUDA_ERROR_INVALID_CONTEXT, "thread without a context: %s", err_name(a.no_ctx));
  CHECK(a.with_ctx == OK, "thread with the primary current: %s", err_name(a.with_ctx));

  /* A created context is pushed, and popped back off by cuCtxDestroy. */
  CUcontext c = NULL;
  CHECK_CU(cuCtxCreate_v4(&c, NULL, 0, 0), OK); /* cuda.h 13: cuCtxCreate */
  CHECK(c != NULL && c != p, "cuCtxCreate returned %p", (void *)c);
  CHECK_CU(cuCtxGetCurrent(&cur), OK);
  CHECK(cur == c, "a created context must become current");
  CUcontext popped = NULL;
  CHECK_CU(cuCtxPopCurrent(&popped), OK);
  CHECK(popped == c, "popped the wrong context");
  CHECK_CU(cuCtxGetCurrent(&cur), OK);
  CHECK(cur == p, "after the pop the primary must be current again");
  CHECK_CU(cuCtxPushCurrent(c), OK);
  CHECK_CU(cuCtxGetDevice_v2(&dev, c), OK);
  CHECK_CU(cuCtxDestroy(c), OK);
  CHECK_CU(cuCtxGetCurrent(&cur), OK);
  CHECK(cur == p, "cuCtxDestroy of the current context must pop it");
  CHECK_CU(cuCtxDestroy(c), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_CU(cuCtxSetCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_CU(cuCtxDestroy(p), CUDA_ERROR_INVALID_CONTEXT); /* primaries are released, not destroyed */
  CHECK_CU(cuCtxSetCurrent((CUcontext)&a), CUDA_ERROR_INVALID_CONTEXT); /* not a context */

  /* A destroyed context still current underneath: CONTEXT_IS_DESTROYED. */
  CUcontext c2 = NULL;
  CHECK_CU(cuCtxCreate_v4(&c2, NULL, 0, 0), OK);
  CHECK_CU(cuCtxPushCurrent(p), OK);
  CHECK_CU(cuCtxDestroy(c2), OK); /* not on top: stays in the stack */
  CHECK_CU(cuCtxPopCurrent(NULL), OK);
  d = 0x5a5a;
  CHECK_CU(cuMemAlloc(&d, 64), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK(d == 0x5a5a, "out-parameter written on failure");
  CHECK_CU(cuCtxSetCurrent(NULL), OK); /* pops */
  CHECK_CU(cuCtxGetCurrent(&cur), OK);
  CHECK(cur == p, "cuCtxSetCurrent(NULL) must pop the top");

  /* cuCtxCreate_v4 parameters: exactly one of the two pointers. */
  CUctxCreateParams params = {0};
  CUcontext keep = (CUcontext)0x1;
  CHECK_CU(cuCtxCreate_v4(&keep, &params, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(keep == (CUcontext)0x1, "out-parameter written on failure");
  CHECK_CU(cuCtxCreate_v4(&keep, NULL, 0, 9), CUDA_ERROR_INVALID_DEVICE);
  CHECK_CU(cuCtxCreate_v4(&keep, NULL, 0x100, 0), CUDA_ERROR_INVALID_VALUE);

  /* A primary released to zero while current: CONTEXT_IS_DESTROYED until retained again. */
  CHECK_CU(cuDevicePrimaryCtxRelease(0), OK);
  CHECK_CU(cuMemAlloc(&d, 64), OK);
  CHECK_CU(cuMemFree(d), OK);
  CHECK_CU(cuDevicePrimaryCtxRelease(0), OK);
  CHECK_CU(cuMemAlloc(&d, 64), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK_CU(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_CU(cuDevicePrimaryCtxRetain(&p2, 0), OK);
  CHECK_CU(cuMemAlloc(&d, 64), OK);
  CHECK_CU(cuMemFree(d), OK);
}

static void t_alloc_roundtrip(void) {
  setup();
  size_t free0 = 0, total = 0;
  CHECK_CU(cuMemGetInfo(&free0, &total), OK);
  CHECK(free0 == total, "nothing allocated yet, free %zu of %zu", free0, total);

  const size_t n = 65536 + 3;
  CUdeviceptr d = 0, d2 = 0;
  CHECK_CU(cuMemAlloc(&d, n), OK);
  CHECK_CU(cuMemAlloc(&d2, n), OK);
  CHECK(d != 0 && d2 != 0 && d != d2, "allocations %llx %llx", (unsigned long long)d,
        (unsigned long long)d2);
  size_t fr = 0;
  CHECK_CU(cuMemGetInfo(&fr, &total), OK);
  CHECK(fr == free0 - 2 * n, "free %zu after allocating 2*%zu of %zu", fr, n, free0);

  unsigned char *src = malloc(n), *dst = malloc(n);
  CHECK(src && dst, "malloc");
  fill(src, n, 1);
  memset(dst, 0, n);
  CHECK_CU(cuMemcpyHtoD(d, src, n), OK);
  CHECK_CU(cuMemcpyDtoD(d2, d, n), OK);
  CHECK_CU(cuMemcpyDtoH(dst, d2, n), OK);
  CHECK(is_filled(dst, n, 1), "HtoD, DtoD, DtoH round trip lost data");
  /* a copy inside one allocation, into an interior pointer */
  CHECK_CU(cuMemcpyDtoD(d2 + 1000, d2, 100), OK);
  read_dev(d2 + 1000, dst, 100);
  CHECK(is_filled(dst, 100, 1), "DtoD within one allocation lost data");

  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_CU(cuMemGetAddressRange(&base, &size, d2 + 100), OK);
  CHECK(base == d2 && size == n, "range of d2+100 is %llx+%zu", (unsigned long long)base, size);
  CHECK_CU(cuMemGetAddressRange(NULL, &size, d2 + n - 1), OK); /* both out-params optional */
  unsigned int mt = 0;
  CHECK_CU(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 5), OK);
  CHECK(mt == CU_MEMORYTYPE_DEVICE, "memory type %u", mt);
  CUdeviceptr start = 0;
  CHECK_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 5), OK);
  CHECK(start == d, "range start %llx", (unsigned long long)start);
  unsigned long long id1 = 0, id2 = 0;
  CHECK_CU(cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, d), OK);
  CHECK_CU(cuPointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, d2), OK);
  CHECK(id1 != id2, "two allocations share buffer id %llu", id1);
  void *hp = (void *)0x1;
  CHECK_CU(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, d),
           CUDA_ERROR_INVALID_VALUE);
  CHECK(hp == (void *)0x1, "out-parameter written on failure");
  /* plain malloc memory is unknown to the driver */
  CHECK_CU(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 (CUdeviceptr)(uintptr_t)src),
           CUDA_ERROR_INVALID_VALUE);

  /* bad frees change nothing */
  CHECK_CU(cuMemFree(d + 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFree((CUdeviceptr)(uintptr_t)src), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFree(0), CUDA_ERROR_INVALID_VALUE);
  read_dev(d, dst, n);
  CHECK(is_filled(dst, n, 1), "a refused free damaged the allocation");
  CHECK_CU(cuMemFree(d), OK);
  CHECK_CU(cuMemFree(d), CUDA_ERROR_INVALID_VALUE); /* double free */
  base = 0x77;
  size = 0x77;
  CHECK_CU(cuMemGetAddressRange(&base, &size, d), CUDA_ERROR_NOT_FOUND);
  CHECK(base == 0x77 && size == 0x77, "out-parameters written on failure");
  CHECK_CU(cuMemcpyDtoH(dst, d, 16), CUDA_ERROR_INVALID_VALUE); /* freed */
  CHECK_CU(cuMemFree(d2), OK);
  CHECK_CU(cuMemGetInfo(&fr, &total), OK);
  CHECK(fr == free0, "free %zu after freeing everything, was %zu", fr, free0);

  CUdeviceptr keep = 0x99;
  CHECK_CU(cuMemAlloc(&keep, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(keep == 0x99, "out-parameter written on failure");
  CHECK_CU(cuMemAlloc(NULL, 16), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemGetInfo(NULL, &total), CUDA_ERROR_INVALID_VALUE);
  free(src);
  free(dst);
}

static void t_copy_bounds(void) {
  setup();
  const size_t n = 4096;
  CUdeviceptr d = 0, e = 0;
  CHECK_CU(cuMemAlloc(&d, n), OK);
  CHECK_CU(cuMemAlloc(&e, n / 2), OK);
  unsigned char *buf = malloc(2 * n), *back = malloc(2 * n);
  CHECK(buf && back, "malloc");
  fill(buf, n, 2);
  CHECK_CU(cuMemcpyHtoD(d, buf, n), OK);
  fill(buf, 2 * n, 3);

  CHECK_CU(cuMemcpyHtoD(d, buf, n + 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemcpyHtoD(d + 4000, buf, 200), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemcpyHtoD(d + n, buf, 1), CUDA_ERROR_INVALID_VALUE); /* one past the end */
  CHECK_CU(cuMemcpyDtoD(e, d, n), CUDA_ERROR_INVALID_VALUE);       /* e is smaller */
  CHECK_CU(cuMemcpy(d + n - 10, (CUdeviceptr)(uintptr_t)buf, 11), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)back, buf, 16), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemcpyHtoD(0, buf, 16), CUDA_ERROR_INVALID_VALUE);
  read_dev(d, back, n);
  CHECK(is_filled(back, n, 2), "a refused copy changed device memory");

  memset(back, 0xee, n);
  CHECK_CU(cuMemcpyDtoH(back, (CUdeviceptr)(uintptr_t)buf, 16), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemcpyDtoH(back, d + 1, n), CUDA_ERROR_INVALID_VALUE);
  for (size_t i = 0; i < n; i++) CHECK(back[i] == 0xee, "a refused copy wrote host byte %zu", i);

  CHECK_CU(cuMemcpyHtoD(d, buf, 0), OK); /* empty copies succeed */
  CHECK_CU(cuMemcpy((CUdeviceptr)(uintptr_t)back, d, n), OK); /* unified: device to host */
  CHECK(is_filled(back, n, 2), "cuMemcpy device to host lost data");
  CHECK_CU(cuMemcpy((CUdeviceptr)(uintptr_t)back, (CUdeviceptr)(uintptr_t)buf, n), OK);
  CHECK(is_filled(back, n, 3), "cuMemcpy host to host lost data");
  CHECK_CU(cuMemFree(d), OK);
  CHECK_CU(cuMemFree(e), OK);
  free(buf);
  free(back);
}

static void t_mem_limit(void) {
  setenv("FAKECUDA_MEM_LIMIT", "1M", 1);
  setup();
  size_t fr = 0, tot = 0;
  CHECK_CU(cuMemGetInfo(&fr, &tot), OK);
  CHECK(tot == 1u << 20 && fr == tot, "FAKECUDA_MEM_LIMIT=1M: free %zu total %zu", fr, tot);
  CUdeviceptr a = 0, b = 0x1234;
  CHECK_CU(cuMemAlloc(&b, (1u << 20) + 1), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(b == 0x1234, "out-parameter written on failure");
  CHECK_CU(cuMemAlloc(&a, 1u << 20), OK);
  CHECK_CU(cuMemAlloc(&b, 1), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(b == 0x1234, "out-parameter written on failure");
  CHECK_CU(cuMemGetInfo(&fr, &tot), OK);
  CHECK(fr == 0, "free %zu with the whole limit allocated", fr);
  size_t pitch = 7;
  CHECK_CU(cuMemAllocPitch(&b, &pitch, 16, 16, 4), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(pitch == 7 && b == 0x1234, "out-parameters written on failure");
  CHECK_CU(cuMemFree(a), OK);
  CHECK_CU(cuMemGetInfo(&fr, &tot), OK);
  CHECK(fr == tot, "free %zu of %zu after the free", fr, tot);
  CHECK_CU(cuMemAlloc(&a, 1u << 20), OK);
  CHECK_CU(cuMemFree(a), OK);
}

static void t_pitch(void) {
  setup();
  CUdeviceptr d = 0;
  size_t pitch = 0;
  CHECK_CU(cuMemAllocPitch(&d, &pitch, 1000, 7, 4), OK);
  CHECK(pitch >= 1000 && pitch % 4 == 0, "pitch %zu for rows of 1000 bytes", pitch);
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_CU(cuMemGetAddressRange(&base, &size, d), OK);
  CHECK(base == d && size == pitch * 7, "pitched allocation spans %zu bytes, pitch %zu", size,
        pitch);
  unsigned char row[1000], back[1000];
  fill(row, sizeof row, 9);
  CHECK_CU(cuMemcpyHtoD(d + 6 * pitch, row, sizeof row), OK); /* last row */
  read_dev(d + 6 * pitch, back, sizeof back);
  CHECK(is_filled(back, sizeof back, 9), "last row lost data");
  CUdeviceptr keep = 0x42;
  size_t keep_pitch = 0x42;
  CHECK_CU(cuMemAllocPitch(&keep, &keep_pitch, 1000, 7, 3), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemAllocPitch(&keep, &keep_pitch, 0, 7, 4), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemAllocPitch(&keep, NULL, 10, 7, 4), CUDA_ERROR_INVALID_VALUE);
  CHECK(keep == 0x42 && keep_pitch == 0x42, "out-parameters written on failure");
  CHECK_CU(cuMemFree(d), OK);
}

static void t_host_memory(void) {
  setup();
  const unsigned mapped = CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE;
  void *p = NULL, *q = NULL, *a = NULL;
  CHECK_CU(cuMemHostAlloc(&p, 10000, mapped), OK);
  CHECK(p != NULL, "cuMemHostAlloc gave NULL");
  memset(p, 0x11, 10000); /* writable host memory */
  CUdeviceptr dp = 0;
  CHECK_CU(cuMemHostGetDevicePointer(&dp, p, 0), OK);
  CHECK(dp == (CUdeviceptr)(uintptr_t)p, "mapped host memory has device pointer %llx != %p",
        (unsigned long long)dp, p);
  CHECK_CU(cuMemHostGetDevicePointer(&dp, (char *)p + 10, 0), OK);
  CHECK(dp == (CUdeviceptr)(uintptr_t)p + 10, "interior device pointer wrong");
  CHECK_CU(cuMemHostGetDevicePointer(&dp, p, 1), CUDA_ERROR_INVALID_VALUE); /* Flags must be 0 */
  unsigned flags = 0;
  CHECK_CU(cuMemHostGetFlags(&flags, p), OK);
  CHECK(flags == mapped, "recorded flags 0x%x, allocated with 0x%x", flags, mapped);
  unsigned mt = 0;
  CHECK_CU(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp), OK);
  CHECK(mt == CU_MEMORYTYPE_HOST, "memory type %u", mt);
  /* the device pointer of mapped host memory works in copies */
  unsigned char src[64], back[64];
  fill(src, sizeof src, 4);
  CHECK_CU(cuMemcpyHtoD(dp, src, sizeof src), OK);
  CHECK(is_filled((unsigned char *)p + 10, sizeof src, 4), "HtoD into mapped host memory");

  /* Driver-allocated pinned memory is device-accessible at its host address whatever the
   * flags (unified addressing: the default). */
  CHECK_CU(cuMemHostAlloc(&q, 100, 0), OK);
  CUdeviceptr keep = 0x31;
  CHECK_CU(cuMemHostGetDevicePointer(&keep, q, 0), OK);
  CHECK(keep == (CUdeviceptr)(uintptr_t)q, "pinned memory without DEVICEMAP: device pointer");
  CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)q, src, 16), OK);
  CHECK_CU(cuMemAllocHost(&a, 100), OK); /* cuda.h: cuMemAllocHost_v2, no flags */
  CHECK_CU(cuMemHostGetDevicePointer(&keep, a, 0), OK);
  CHECK(keep == (CUdeviceptr)(uintptr_t)a, "cuMemAllocHost memory: device pointer");
  keep = 0x31;
  CHECK_CU(cuMemHostGetFlags(&flags, a), OK);
  CHECK(flags == 0, "cuMemAllocHost recorded flags 0x%x", flags);
  void *keepp = (void *)0x1;
  CHECK_CU(cuMemHostAlloc(&keepp, 100, 0x80), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemHostAlloc(&keepp, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(keepp == (void *)0x1, "out-parameter written on failure");

  /* registration */
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *buf =
      mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(buf != MAP_FAILED, "mmap");
  CHECK_CU(cuMemHostRegister(buf, 2 * pg, CU_MEMHOSTREGISTER_DEVICEMAP), OK);
  CHECK_CU(cuMemHostGetDevicePointer(&dp, buf + 1, 0), OK);
  CHECK(dp == (CUdeviceptr)(uintptr_t)(buf + 1), "registered memory device pointer");
  CHECK_CU(cuMemHostGetFlags(&flags, buf), OK);
  CHECK(flags == CU_MEMHOSTREGISTER_DEVICEMAP, "registered flags 0x%x", flags);
  CHECK_CU(cuMemHostRegister(buf, 2 * pg, CU_MEMHOSTREGISTER_DEVICEMAP),
           CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CHECK_CU(cuMemHostRegister(buf + pg, 2 * pg, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CHECK_CU(cuMemHostRegister(p, 100, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CHECK_CU(cuMemHostRegister(buf + 2 * pg, pg, 0), OK); /* adjacent, not overlapping */
  /* Registered without DEVICEMAP: not device-accessible, unlike allocated pinned memory. */
  CHECK_CU(cuMemHostGetDevicePointer(&keep, buf + 2 * pg, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(keep == 0x31, "out-parameter written on failure");
  CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)(buf + 2 * pg), src, 16),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemHostRegister(buf + 3 * pg, pg, 0x40), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemHostRegister(buf + 3 * pg + 100, 100, 0), OK); /* unaligned is fine */
  CHECK_CU(cuMemHostRegister(buf + 3 * pg + 300, 100, 0), /* but pages are pinned whole */
           CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CHECK_CU(cuMemHostUnregister(buf + 3 * pg + 100), OK);
  CHECK_CU(cuMemHostRegister(NULL, pg, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemHostUnregister(buf + 1), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  CHECK_CU(cuMemHostUnregister(buf), OK);
  CHECK_CU(cuMemHostUnregister(buf), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  CHECK_CU(cuMemHostGetDevicePointer(&keep, buf, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemHostUnregister(buf + 2 * pg), OK);
  /* allocated, not registered */
  CHECK_CU(cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  munmap(buf, 4 * pg);
  CHECK_CU(cuMemHostRegister(buf, pg, 0), CUDA_ERROR_INVALID_VALUE); /* no longer mapped */

  CHECK_CU(cuMemFreeHost(back), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFreeHost((char *)p + 1), CUDA_ERROR_INVALID_VALUE);
  CHECK(((unsigned char *)p)[0] == 0x11, "a refused free damaged host memory");
  CHECK_CU(cuMemFreeHost(p), OK);
  CHECK_CU(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFreeHost(q), OK);
  CHECK_CU(cuMemFreeHost(a), OK);
}

/* FAKECUDA_NO_UVA / FAKECUDA_NO_HOSTPTR: the device attributes and what they change. */
static void t_host_attrs(void) {
  setenv("FAKECUDA_DEVICES", "2", 1);
  setenv("FAKECUDA_NO_HOSTPTR", "2", 1); /* device 1 lacks the attribute */
  setup();
  int v = -1;
  CHECK_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0), OK);
  CHECK(v == 1, "unified addressing %d", v);
  CHECK_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 0),
           OK);
  CHECK(v == 1, "device 0 host pointer attribute %d", v);
  CHECK_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 1),
           OK);
  CHECK(v == 0, "device 1 host pointer attribute %d", v);
  v = 7;
  CHECK_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 2),
           CUDA_ERROR_INVALID_DEVICE);
  CHECK_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(v == 7, "out-parameter written on failure");
  /* One device without the attribute: registered DEVICEMAP memory gets a device pointer that
   * is not its host address, and the host address is not usable on the device. */
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *buf = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(buf != MAP_FAILED, "mmap");
  CHECK_CU(cuMemHostRegister(buf, pg, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
           OK);
  CUdeviceptr dp = 0;
  CHECK_CU(cuMemHostGetDevicePointer(&dp, buf, 0), OK);
  CHECK(dp != (CUdeviceptr)(uintptr_t)buf, "device pointer equals the host pointer");
  unsigned char src[16] = {1};
  CHECK_CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)buf, src, 16), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemHostUnregister(buf), OK);
  munmap(buf, pg);
}

static void t_host_no_uva(void) {
  setenv("FAKECUDA_NO_UVA", "1", 1);
  setup();
  int v = -1;
  CHECK_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0), OK);
  CHECK(v == 0, "unified addressing %d", v);
  void *q = NULL;
  CUdeviceptr keep = 0x31;
  CHECK_CU(cuMemHostAlloc(&q, 100, 0), OK);
  CHECK_CU(cuMemHostGetDevicePointer(&keep, q, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(keep == 0x31, "out-parameter written on failure");
  CHECK_CU(cuMemFreeHost(q), OK);
}

/* Stream capture: a capture in another thread prohibits this thread's unsafe calls by mode. */
struct cap_arg {
  CUcontext ctx;
  CUstreamCaptureMode mode;
  pthread_barrier_t *bar;
  CUresult begin, end;
};
static void *capture_thread(void *p) {
  struct cap_arg *a = p;
  CUstream s = NULL;
  CUgraph g = NULL;
  a->begin = cuCtxSetCurrent(a->ctx);
  if (a->begin == OK) a->begin = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  if (a->begin == OK) a->begin = cuStreamBeginCapture(s, a->mode); /* cuda.h: _v2 */
  pthread_barrier_wait(a->bar); /* capturing */
  pthread_barrier_wait(a->bar); /* the other thread is done */
  a->end = a->begin == OK ? cuStreamEndCapture(s, &g) : a->begin;
  if (g) cuGraphDestroy(g);
  if (s) cuStreamDestroy(s);
  return NULL;
}
/* The other thread's unsafe call under my_mode, while a capture in mode cap runs: returns the
 * call's result and the capture's end result. */
static void capture_case(CUcontext ctx, CUstreamCaptureMode cap, CUstreamCaptureMode my_mode,
                         CUresult *call, CUresult *end) {
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  struct cap_arg a = {.ctx = ctx, .mode = cap, .bar = &bar};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, capture_thread, &a) == 0, "pthread_create");
  pthread_barrier_wait(&bar);
  CUstreamCaptureMode m = my_mode;
  CHECK_CU(cuThreadExchangeStreamCaptureMode(&m), OK);
  CUdeviceptr d = 0;
  *call = cuMemAlloc(&d, 4096);
  if (*call == OK) cuMemFree(d);
  CHECK_CU(cuThreadExchangeStreamCaptureMode(&m), OK); /* back */
  CHECK(m == my_mode, "exchange gave back mode %d, expected %d", (int)m, (int)my_mode);
  pthread_barrier_wait(&bar);
  pthread_join(th, NULL);
  pthread_barrier_destroy(&bar);
  CHECK(a.begin == OK, "begin capture: %s", err_name(a.begin));
  *end = a.end;
}

static void t_capture(void) {
  setup();
  CUcontext ctx = NULL;
  CHECK_CU(cuCtxGetCurrent(&ctx), OK);
  CUresult call, end;
  capture_case(ctx, CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL, &call, &end);
  CHECK(call == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED &&
            end == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        "global/global: call %s, end %s", err_name(call), err_name(end));
  capture_case(ctx, CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED, &call, &end);
  CHECK(call == OK && end == OK, "global/relaxed: call %s, end %s", err_name(call), err_name(end));
  capture_case(ctx, CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, &call,
               &end);
  CHECK(call == OK && end == OK, "global/thread-local: call %s, end %s", err_name(call),
        err_name(end));
  capture_case(ctx, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_GLOBAL, &call,
               &end);
  CHECK(call == OK && end == OK, "thread-local/global: call %s, end %s", err_name(call),
        err_name(end));
  /* The capturing thread itself; queries stay allowed. */
  CUstream s = NULL;
  CUgraph g = NULL;
  CUstreamCaptureStatus cs;
  CHECK_CU(cuStreamCreate(&s, 0), OK);
  CHECK_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), OK);
  CHECK_CU(cuStreamIsCapturing(s, &cs), OK);
  CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE, "status %d", (int)cs);
  int v;
  CHECK_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0), OK);
  CUdeviceptr d = 0;
  CHECK_CU(cuMemAlloc(&d, 64), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK_CU(cuStreamIsCapturing(s, &cs), OK);
  CHECK(cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED, "status %d", (int)cs);
  CHECK_CU(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), OK);
  CHECK_CU(cuStreamEndCapture(s, &g), OK);
  CHECK(g != NULL, "no graph");
  CHECK_CU(cuGraphDestroy(g), OK);
  CHECK_CU(cuStreamDestroy(s), OK);
}

static void t_primary_reset(void) {
  CHECK_CU(cuInit(0), OK);
  unsigned fl = 0;
  int active = -1;
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &fl, &active), OK);
  CHECK(active == 0, "primary active before any retain");
  CUcontext p = NULL;
  CHECK_CU(cuDevicePrimaryCtxRetain(&p, 0), OK);
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &fl, &active), OK);
  CHECK(active == 1, "retained primary inactive");
  CHECK_CU(cuCtxSetCurrent(p), OK);
  CUdeviceptr d = 0;
  void *h = NULL;
  CHECK_CU(cuMemAlloc(&d, 4096), OK);
  CHECK_CU(cuMemAllocHost(&h, 4096), OK);
  CHECK_CU(cuDevicePrimaryCtxReset(0), OK); /* cuda.h: _v2 */
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &fl, &active), OK);
  CHECK(active == 0, "primary active after reset");
  CHECK_CU(cuMemAlloc(&d, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK_CU(cuDevicePrimaryCtxRetain(&p, 0), OK);
  CHECK_CU(cuMemFree(d), CUDA_ERROR_INVALID_VALUE); /* freed by the reset */
  CHECK_CU(cuMemAlloc(&d, 4096), OK);
  CHECK_CU(cuMemFree(d), OK);
}

/* A fork child of a process that initialised the driver cannot use it; one of a process that
 * had not can (every test of this runner is such a child). */
static void t_fork_child(void) {
  setup();
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    CUdeviceptr d = 0x77;
    int bad = cuInit(0) != CUDA_ERROR_NOT_INITIALIZED || cuMemAlloc(&d, 64) !=
                                                              CUDA_ERROR_NOT_INITIALIZED;
    _exit(bad || d != 0x77);
  }
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
        "the fork child could use CUDA (status 0x%x)", st);
  CUdeviceptr d = 0;
  CHECK_CU(cuMemAlloc(&d, 64), OK); /* the parent still can */
  CHECK_CU(cuMemFree(d), OK);
}

/* Stream-ordered and managed memory: usable, freed either way, no IPC handle. */
static void t_alloc_origins(void) {
  setup();
  CUdeviceptr a = 0, m = 0;
  CUipcMemHandle h;
  unsigned char src[64], back[64];
  fill(src, sizeof src, 21);
  CHECK_CU(cuMemAllocAsync(&a, 4096, NULL), OK); /* cuda.h: no rename without per-thread */
  CHECK_CU(cuMemcpyHtoD(a, src, sizeof src), OK);
  CHECK_CU(cuMemcpyDtoH(back, a, sizeof back), OK);
  CHECK(memcmp(src, back, sizeof src) == 0, "async memory round trip");
  CHECK_CU(cuIpcGetMemHandle(&h, a), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFreeAsync(a, NULL), OK);
  CHECK_CU(cuMemFreeAsync(a, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemAllocManaged(&m, 4096, 0), CUDA_ERROR_INVALID_VALUE); /* flags required */
  CHECK_CU(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL), OK);
  CHECK_CU(cuIpcGetMemHandle(&h, m), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFree(m), OK);
}

/* The one kernel the fake runs: kvs_touch adds 1 to every byte, where the device can reach. */
static void t_kernel(void) {
  setup();
  CUmodule mod = NULL;
  CUfunction fn = NULL;
  CHECK_CU(cuModuleLoadData(&mod, "// no kernel here\n"), CUDA_ERROR_INVALID_IMAGE);
  CHECK_CU(cuModuleLoadData(&mod, ".visible .entry kvs_touch(.param .u64 b, .param .u64 n)"), OK);
  CHECK_CU(cuModuleGetFunction(&fn, mod, "other"), CUDA_ERROR_NOT_FOUND);
  CHECK_CU(cuModuleGetFunction(&fn, mod, "kvs_touch"), OK);
  void *h = NULL;
  CHECK_CU(cuMemAllocHost(&h, 4096), OK);
  memset(h, 7, 4096);
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)h;
  uint64_t n = 4096;
  void *params[] = {&p, &n};
  CHECK_CU(cuLaunchKernel(fn, 16, 1, 1, 256, 1, 1, 0, NULL, params, NULL), OK);
  CHECK(((unsigned char *)h)[0] == 8 && ((unsigned char *)h)[4095] == 8,
        "the kernel did not add 1");
  /* registered without DEVICEMAP: the device cannot reach it at the host address */
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *buf = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(buf != MAP_FAILED, "mmap");
  CHECK_CU(cuMemHostRegister(buf, pg, CU_MEMHOSTREGISTER_PORTABLE), OK);
  p = (CUdeviceptr)(uintptr_t)buf;
  n = pg;
  CHECK_CU(cuLaunchKernel(fn, 1, 1, 1, (unsigned)pg, 1, 1, 0, NULL, params, NULL),
           CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(buf[0] == 0, "the kernel wrote memory it cannot reach");
  CHECK_CU(cuMemHostUnregister(buf), OK);
  munmap(buf, pg);
  CHECK_CU(cuMemFreeHost(h), OK);
  CHECK_CU(cuModuleUnload(mod), OK);
}

/* Freeing an exported allocation that another process still has open is undefined behaviour
 * on a real driver: the fake aborts the exporter. After the importer closed it, it is fine. */
static void t_ipc_free_open(void) {
  const char *held[] = {"ipc-free", "held", NULL}, *closed[] = {"ipc-free", "closed", NULL};
  int st = run_self(held, NULL, NULL, 0);
  CHECK(st == 128 + SIGABRT, "freeing memory open elsewhere did not abort (status %d)", st);
  st = run_self(closed, NULL, NULL, 0);
  CHECK(st == 0, "freeing after the importer closed it failed (status %d)", st);
}

/* One asynchronous round trip of n bytes of pattern seed through d: htod from src, dtoh into dst
 * (cleared first), both on stream s, then sync(s); what names the entry points. */
static void async_round_trip(const char *what, PFN_cuMemcpyHtoDAsync_v3020 htod,
                             PFN_cuMemcpyDtoHAsync_v3020 dtoh, PFN_cuStreamSynchronize_v2000 sync,
                             CUstream s, CUdeviceptr d, unsigned char *src, unsigned char *dst,
                             size_t n, unsigned seed) {
  fill(src, n, seed);
  CUresult rc = htod(d, src, n, s);
  CHECK(rc == OK, "%s: HtoD returned %s", what, err_name(rc));
  memset(dst, 0, n);
  rc = dtoh(dst, d, n, s);
  CHECK(rc == OK, "%s: DtoH returned %s", what, err_name(rc));
  rc = sync(s);
  CHECK(rc == OK, "%s: synchronize returned %s", what, err_name(rc));
  CHECK(is_filled(dst, n, seed), "%s round trip lost data", what);
}

static void t_streams_async(void) {
  setup();
  const size_t n = 8192;
  CUdeviceptr d = 0;
  CHECK_CU(cuMemAlloc(&d, n), OK);
  unsigned char *src = malloc(n), *dst = malloc(n);
  CHECK(src && dst, "malloc");
  CUstream s = NULL, keep = (CUstream)0x77;
  CHECK_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), OK);
  CHECK(s != NULL, "no stream");
  CHECK_CU(cuStreamCreate(&keep, 0x10), CUDA_ERROR_INVALID_VALUE);
  CHECK(keep == (CUstream)0x77, "out-parameter written on failure");

  async_round_trip("async", cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuStreamSynchronize, s, d, src,
                   dst, n, 5);
  CHECK_CU(cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, d, n, NULL), OK);
  CHECK_CU(cuMemcpyDtoDAsync(d, d + n / 2, n / 2, CU_STREAM_LEGACY), OK);

  /* the per-thread-default-stream entry points, called directly */
  PFN_cuMemcpyHtoDAsync_v3020 htod_ptsz =
      (PFN_cuMemcpyHtoDAsync_v3020)sym("cuMemcpyHtoDAsync_v2_ptsz");
  PFN_cuMemcpyDtoHAsync_v3020 dtoh_ptsz =
      (PFN_cuMemcpyDtoHAsync_v3020)sym("cuMemcpyDtoHAsync_v2_ptsz");
  PFN_cuMemcpyAsync_v4000 async_ptsz = (PFN_cuMemcpyAsync_v4000)sym("cuMemcpyAsync_ptsz");
  PFN_cuMemcpy_v4000 memcpy_ptds = (PFN_cuMemcpy_v4000)sym("cuMemcpy_ptds");
  PFN_cuMemcpyHtoD_v3020 htod_ptds = (PFN_cuMemcpyHtoD_v3020)sym("cuMemcpyHtoD_v2_ptds");
  PFN_cuStreamSynchronize_v2000 sync_ptsz =
      (PFN_cuStreamSynchronize_v2000)sym("cuStreamSynchronize_ptsz");
  async_round_trip("_ptsz", htod_ptsz, dtoh_ptsz, sync_ptsz, CU_STREAM_PER_THREAD, d, src, dst, n,
                   6);
  fill(src, n, 7);
  CHECK_CU(htod_ptds(d, src, n), OK);
  memset(dst, 0, n);
  CHECK_CU(memcpy_ptds((CUdeviceptr)(uintptr_t)dst, d, n), OK);
  CHECK(is_filled(dst, n, 7), "_ptds round trip lost data");
  memset(dst, 0, n);
  CHECK_CU(async_ptsz((CUdeviceptr)(uintptr_t)dst, d, n, s), OK);
  CHECK(is_filled(dst, n, 7), "cuMemcpyAsync_ptsz lost data");
  CHECK_CU(htod_ptsz(d, src, n + 1, s), CUDA_ERROR_INVALID_VALUE);

  /* invalid streams */
  CUstream bogus = (CUstream)(uintptr_t)0x1234;
  CHECK_CU(cuMemcpyHtoDAsync(d, src, 16, bogus), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(cuStreamSynchronize(bogus), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(cuStreamDestroy(s), OK);
  memset(dst, 0xee, 16);
  CHECK_CU(cuMemcpyDtoHAsync(dst, d, 16, s), CUDA_ERROR_INVALID_HANDLE);
  for (int i = 0; i < 16; i++) CHECK(dst[i] == 0xee, "copy on a destroyed stream wrote data");
  CHECK_CU(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(cuMemFree(d), OK);
  free(src);
  free(dst);
}

static void t_legacy(void) {
  setup();
  fk_v1_alloc_t alloc1 = (fk_v1_alloc_t)sym("cuMemAlloc");
  fk_v1_free_t free1 = (fk_v1_free_t)sym("cuMemFree");
  fk_v1_htod_t htod1 = (fk_v1_htod_t)sym("cuMemcpyHtoD");
  fk_v1_dtoh_t dtoh1 = (fk_v1_dtoh_t)sym("cuMemcpyDtoH");
  unsigned int d = 0;
  CHECK_CU(alloc1(&d, 5000), OK);
  CHECK(d != 0, "legacy cuMemAlloc returned 0");
  unsigned char src[5000], dst[5000];
  fill(src, sizeof src, 8);
  CHECK_CU(htod1(d, src, sizeof src), OK);
  CHECK_CU(dtoh1(dst, d, sizeof dst), OK);
  CHECK(is_filled(dst, sizeof dst, 8), "legacy round trip lost data");
  memset(dst, 0, sizeof dst); /* the same memory through the _v2 entry points */
  CHECK_CU(cuMemcpyDtoH(dst, (CUdeviceptr)d, sizeof dst), OK);
  CHECK(is_filled(dst, sizeof dst, 8), "legacy allocation unreadable through _v2");
  CHECK_CU(htod1(d, src, sizeof src + 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(free1(d), OK);
  CHECK_CU(free1(d), CUDA_ERROR_INVALID_VALUE);

  void *h = NULL;
  CUresult (*alloc_host1)(void **, unsigned int) =
      (CUresult(*)(void **, unsigned int))sym("cuMemAllocHost");
  CHECK_CU(alloc_host1(&h, 100), OK);
  CHECK_CU(cuMemFreeHost(h), OK);
}

/* The resolver must return exactly the entry point that dlsym finds under the versioned ELF
 * name the real driver uses for (base name, version, flags). */
/* FAKECUDA_GPA_ALIAS=1: the resolver's entry points work but are not the exported symbols. */
static void t_gpa_alias(void) {
#if defined(__x86_64__)
  setenv("FAKECUDA_GPA_ALIAS", "1", 1);
  setup();
  void *fn = NULL, *pt = NULL;
  CHECK_CU(cuGetProcAddress("cuMemAlloc", &fn, 12000, 0, NULL), OK);
  CHECK(fn && fn != sym("cuMemAlloc_v2"), "cuMemAlloc: no alias");
  CHECK_CU(cuGetProcAddress("cuMemcpyHtoDAsync", &pt, 12000,
                            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL),
           OK);
  CHECK(pt && pt != sym("cuMemcpyHtoDAsync_v2_ptsz") && pt != sym("cuMemcpyHtoDAsync_v2"),
        "per-thread twin: no alias");
  CUdeviceptr d = 0;
  CHECK_CU(((PFN_cuMemAlloc_v3020)fn)(&d, 4096), OK);
  CHECK(d != 0, "the alias did not allocate");
  CHECK_CU(cuMemFree(d), OK);
#endif
}

static void t_resolver(void) {
  /* Works before cuInit: the CUDA runtime resolves cuInit itself this way. */
  static const struct {
    const char *base;
    int version;
    cuuint64_t flags;
    const char *want; /* NULL: not found */
    CUdriverProcAddressQueryResult status;
  } cases[] = {
      {"cuInit", 12000, 0, "cuInit", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemAlloc", 12000, 0, "cuMemAlloc_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemAlloc", 3010, 0, "cuMemAlloc", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemAlloc", 1000, 0, NULL, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT},
      {"cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAlloc_v2",
       CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemFree", 12000, 0, "cuMemFree_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemAllocHost", 12000, 0, "cuMemAllocHost_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemHostAlloc", 12000, 0, "cuMemHostAlloc", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemHostGetDevicePointer", 12000, 0, "cuMemHostGetDevicePointer_v2",
       CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemHostGetDevicePointer", 3000, 0, "cuMemHostGetDevicePointer",
       CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemAllocPitch", 12000, 0, "cuMemAllocPitch_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemHostRegister", 12000, 0, "cuMemHostRegister_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemHostRegister", 6000, 0, "cuMemHostRegister", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemcpyAsync", 12000, 0, "cuMemcpyAsync", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemcpyAsync", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemcpyAsync",
       CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemcpyAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuMemcpyAsync_ptsz", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemcpyHtoDAsync", 12000, 0, "cuMemcpyHtoDAsync_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemcpyHtoDAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuMemcpyHtoDAsync_v2_ptsz", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemcpyHtoDAsync", 6050, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuMemcpyHtoDAsync_v2", CU_GET_PROC_ADDRESS_SUCCESS}, /* before per-thread streams */
      {"cuMemcpyHtoDAsync", 2000, 0, "cuMemcpyHtoDAsync", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemcpyDtoHAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuMemcpyDtoHAsync_v2_ptsz", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemcpyHtoD", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuMemcpyHtoD_v2_ptds", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemcpyHtoD", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemcpyHtoD_v2",
       CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuMemcpy", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemcpy_ptds",
       CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuStreamSynchronize", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuStreamSynchronize_ptsz", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuCtxCreate", 13000, 0, "cuCtxCreate_v4", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuCtxCreate", 12000, 0, "cuCtxCreate_v3", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuCtxCreate", 11000, 0, "cuCtxCreate_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuCtxSynchronize", 12080, 0, "cuCtxSynchronize", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuDeviceGetUuid", 12000, 0, "cuDeviceGetUuid_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuDeviceGetUuid", 10000, 0, "cuDeviceGetUuid", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuDeviceGetUuid", 9000, 0, NULL, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT},
      {"cuIpcOpenMemHandle", 12000, 0, "cuIpcOpenMemHandle_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuDevicePrimaryCtxRelease", 12000, 0, "cuDevicePrimaryCtxRelease_v2",
       CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuGetProcAddress", 11030, 0, "cuGetProcAddress", CU_GET_PROC_ADDRESS_SUCCESS},
      {"cuNoSuchFunction", 12000, 0, NULL, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND},
      {"cuMemAlloc_v2", 12000, 0, NULL, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND}, /* base names only */
      {"", 12000, 0, NULL, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    void *fn = (void *)0x1;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)77;
    CUresult r = cuGetProcAddress(cases[i].base, &fn, cases[i].version, cases[i].flags, &st);
    const char *what = cases[i].base;
    if (cases[i].want) {
      CHECK(r == OK, "%s v%d flags %llu: %s", what, cases[i].version,
            (unsigned long long)cases[i].flags, err_name(r));
      CHECK(fn == sym(cases[i].want), "%s v%d flags %llu resolved to %p, not %s (%p)", what,
            cases[i].version, (unsigned long long)cases[i].flags, fn, cases[i].want,
            sym(cases[i].want));
    } else {
      CHECK(r == CUDA_ERROR_NOT_FOUND, "%s v%d: %s, expected CUDA_ERROR_NOT_FOUND", what,
            cases[i].version, err_name(r));
      CHECK(fn == NULL, "%s v%d: pfn must be NULL when not found", what, cases[i].version);
    }
    CHECK(st == cases[i].status, "%s v%d flags %llu: status %d, expected %d", what,
          cases[i].version, (unsigned long long)cases[i].flags, (int)st, (int)cases[i].status);
  }
  /* per-thread variants are distinct functions */
  void *legacy = NULL, *pt = NULL;
  CHECK_CU(cuGetProcAddress("cuMemcpyAsync", &legacy, 12000, 0, NULL), OK);
  CHECK_CU(cuGetProcAddress("cuMemcpyAsync", &pt, 12000,
                            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL), OK);
  CHECK(legacy && pt && legacy != pt, "cuMemcpyAsync: per-thread %p == legacy %p", pt, legacy);
  CHECK_CU(cuGetProcAddress("cuMemcpyHtoDAsync", &legacy, 12000, 0, NULL), OK);
  CHECK_CU(cuGetProcAddress("cuMemcpyHtoDAsync", &pt, 12000,
                            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL), OK);
  CHECK(legacy && pt && legacy != pt, "cuMemcpyHtoDAsync: per-thread == legacy");

  /* bad arguments */
  void *fn = (void *)0x1;
  CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)77;
  CHECK_CU(cuGetProcAddress("cuMemAlloc", &fn, KVS_FK_DRIVER_VERSION + 10, 0, &st),
           CUDA_ERROR_INVALID_VALUE); /* newer than the driver */
  CHECK_CU(cuGetProcAddress("cuMemAlloc", &fn, 12000, 0x4, &st), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuGetProcAddress(NULL, &fn, 12000, 0, &st), CUDA_ERROR_INVALID_VALUE);
  CHECK(fn == (void *)0x1 && st == (CUdriverProcAddressQueryResult)77,
        "out-parameters written on invalid arguments");
  CHECK_CU(cuGetProcAddress("cuMemAlloc", NULL, 12000, 0, &st), CUDA_ERROR_INVALID_VALUE);

  /* the old resolver (no status), and calling what was resolved */
  PFN_cuGetProcAddress_v11030 gpa1 = NULL;
  CHECK_CU(cuGetProcAddress("cuGetProcAddress", (void **)&gpa1, 11030, 0, NULL), OK);
  PFN_cuInit_v2000 init = NULL;
  CHECK_CU(gpa1("cuInit", (void **)&init, 12000, 0), OK);
  CHECK_CU(init(0), OK);
  fn = (void *)0x1;
  CHECK_CU(gpa1("cuNoSuchFunction", &fn, 12000, 0), CUDA_ERROR_NOT_FOUND);
  CHECK(fn == NULL, "old resolver: pfn must be NULL when not found");
  PFN_cuGetProcAddress_v12000 gpa2 = NULL;
  CHECK_CU(cuGetProcAddress("cuGetProcAddress", (void **)&gpa2, 12000, 0, NULL), OK);
  CHECK(gpa2 == (PFN_cuGetProcAddress_v12000)sym("cuGetProcAddress_v2"), "resolver of resolver");

  setup();
  PFN_cuMemAlloc_v3020 alloc = NULL;
  PFN_cuMemFree_v3020 mfree = NULL;
  PFN_cuMemcpyHtoDAsync_v3020 htod = NULL;
  PFN_cuMemcpyDtoH_v3020 dtoh = NULL;
  CHECK_CU(gpa2("cuMemAlloc", (void **)&alloc, 12000, 0, NULL), OK);
  CHECK_CU(gpa2("cuMemFree", (void **)&mfree, 12000, 0, NULL), OK);
  CHECK_CU(gpa2("cuMemcpyHtoDAsync", (void **)&htod, 12000,
                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL), OK);
  CHECK_CU(gpa2("cuMemcpyDtoH", (void **)&dtoh, 12000,
                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL), OK);
  CUdeviceptr d = 0;
  unsigned char src[256], dst[256];
  fill(src, sizeof src, 10);
  CHECK_CU(alloc(&d, sizeof src), OK);
  CHECK_CU(htod(d, src, sizeof src, CU_STREAM_PER_THREAD), OK);
  CHECK_CU(dtoh(dst, d, sizeof dst), OK);
  CHECK(is_filled(dst, sizeof dst, 10), "resolved entry points lost data");
  CHECK_CU(mfree(d), OK);
}

static void t_errors(void) {
#define CODE(c) {c, #c}
  static const struct {
    CUresult code;
    const char *name;
  } codes[] = {
      CODE(CUDA_SUCCESS), CODE(CUDA_ERROR_INVALID_VALUE), CODE(CUDA_ERROR_OUT_OF_MEMORY),
      CODE(CUDA_ERROR_NOT_INITIALIZED), CODE(CUDA_ERROR_NO_DEVICE),
      CODE(CUDA_ERROR_INVALID_DEVICE), CODE(CUDA_ERROR_INVALID_CONTEXT),
      CODE(CUDA_ERROR_CONTEXT_IS_DESTROYED), CODE(CUDA_ERROR_MAP_FAILED),
      CODE(CUDA_ERROR_INVALID_HANDLE), CODE(CUDA_ERROR_NOT_FOUND),
      CODE(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED),
      CODE(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED), CODE(CUDA_ERROR_NOT_SUPPORTED),
      CODE(CUDA_ERROR_ILLEGAL_ADDRESS), CODE(CUDA_ERROR_UNKNOWN),
  };
#undef CODE
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    const char *name = NULL, *text = NULL;
    CHECK_CU(cuGetErrorName(codes[i].code, &name), OK);
    CHECK(name && strcmp(name, codes[i].name) == 0, "name of %d is '%s', expected %s",
          (int)codes[i].code, name ? name : "(null)", codes[i].name);
    CHECK_CU(cuGetErrorString(codes[i].code, &text), OK);
    CHECK(text && *text, "no description for %s", codes[i].name);
  }
  const char *s = "unchanged";
  CHECK_CU(cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
  CHECK(s == NULL, "unknown code: *pStr must be NULL");
  s = "unchanged";
  CHECK_CU(cuGetErrorString((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
  CHECK(s == NULL, "unknown code: *pStr must be NULL");
  CHECK_CU(cuGetErrorName(CUDA_SUCCESS, NULL), CUDA_ERROR_INVALID_VALUE);
}

/* ---- IPC ---------------------------------------------------------------------------------- */

static void t_ipc(void) {
  setup();
  const size_t n = 3 * 4096 + 100;
  CUdeviceptr d = 0;
  CHECK_CU(cuMemAlloc(&d, n), OK);
  unsigned char *buf = malloc(n);
  CHECK(buf, "malloc");
  fill(buf, n, 11);
  CHECK_CU(cuMemcpyHtoD(d, buf, n), OK);

  CUipcMemHandle h, h_inner;
  CHECK_CU(cuIpcGetMemHandle(&h, d), OK);
  CHECK_CU(cuIpcGetMemHandle(&h_inner, d + 4096), OK); /* exports the whole allocation */
  CHECK(memcmp(&h, &h_inner, sizeof h) == 0, "interior pointer exported something else");

  /* own handle: refused as the driver does */
  CUdeviceptr keep = 0x66;
  CHECK_CU(cuIpcOpenMemHandle(&keep, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
           CUDA_ERROR_INVALID_CONTEXT);
  CHECK(keep == 0x66, "out-parameter written on failure");
  CUipcMemHandle bad = h;
  bad.reserved[0] ^= 0x5a;
  CHECK_CU(cuIpcOpenMemHandle(&keep, bad, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuIpcOpenMemHandle(&keep, h, 0x8), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuIpcCloseMemHandle(d), CUDA_ERROR_INVALID_VALUE); /* not an IPC mapping */
  void *hostp = NULL;
  CHECK_CU(cuMemHostAlloc(&hostp, 64, CU_MEMHOSTALLOC_DEVICEMAP), OK);
  CUipcMemHandle untouched;
  memset(&untouched, 0x3c, sizeof untouched);
  CUipcMemHandle probe = untouched;
  CHECK_CU(cuIpcGetMemHandle(&probe, (CUdeviceptr)(uintptr_t)hostp), CUDA_ERROR_INVALID_VALUE);
  CHECK(memcmp(&probe, &untouched, sizeof probe) == 0, "handle written on failure");

  /* another process opens it, checks the data, writes its own */
  char hex[2 * CU_IPC_HANDLE_SIZE + 1], size_arg[32];
  handle_hex(&h, hex);
  snprintf(size_arg, sizeof size_arg, "%zu", n);
  const char *open_args[] = {"ipc-open", hex, size_arg, NULL};
  int st = run_self(open_args, NULL, NULL, 0);
  CHECK(st == 0, "IPC child failed with status %d (see its message above)", st);
  memset(buf, 0, n);
  read_dev(d, buf, n);
  CHECK(is_filled(buf, n, 12), "the child's writes through the IPC mapping are not visible");

  /* a handle whose allocation was freed (its fd may now name another file) is refused */
  CUipcMemHandle h_old = h;
  CHECK_CU(cuMemFree(d), OK);
  CUdeviceptr d2 = 0;
  CHECK_CU(cuMemAlloc(&d2, n), OK); /* likely reuses the fd number */
  handle_hex(&h_old, hex);
  const char *stale_args[] = {"ipc-expect", hex, "invalid-handle", NULL};
  st = run_self(stale_args, NULL, NULL, 0);
  CHECK(st == 0, "stale-handle child failed with status %d", st);

  /* owner gone: another process (exec'd: CUDA does not work in a fork child of this one)
   * exports, prints the handle and exits; opening afterwards fails */
  char out[2 * CU_IPC_HANDLE_SIZE + 8] = "";
  const char *gone_args[] = {"ipc-export-exit", NULL};
  st = run_self(gone_args, NULL, out, sizeof out);
  out[strcspn(out, "\n")] = '\0';
  CUipcMemHandle gone;
  CHECK(st == 0 && hex_handle(out, &gone) == 0, "exporting child failed (status %d, '%s')", st,
        out);
  keep = 0x66;
  CHECK_CU(cuIpcOpenMemHandle(&keep, gone, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
           CUDA_ERROR_INVALID_HANDLE);
  CHECK(keep == 0x66, "out-parameter written on failure");
  CHECK_CU(cuMemFree(d2), OK);
  CHECK_CU(cuMemFreeHost(hostp), OK);
  free(buf);
}

struct opener {
  CUcontext ctx;
  CUipcMemHandle h;
  CUdeviceptr d;
  CUresult r;
};

static void *open_in_thread(void *p) {
  struct opener *o = p;
  o->r = cuCtxSetCurrent(o->ctx);
  if (o->r == OK) o->r = cuIpcOpenMemHandle(&o->d, o->h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  return NULL;
}

static int child_ipc_open(const char *hex, const char *size_arg) {
  test_name = "ipc-open child";
  CUipcMemHandle h;
  CHECK(hex_handle(hex, &h) == 0, "bad handle argument");
  size_t n = (size_t)strtoull(size_arg, NULL, 10);
  setup();
  CUdeviceptr d = 0, again = 0;
  CHECK_CU(cuIpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), OK);
  CHECK_CU(cuIpcOpenMemHandle(&again, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), OK);
  CHECK(again == d, "a second open of the same handle must return the same pointer");
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_CU(cuMemGetAddressRange(&base, &size, d + 1), OK);
  CHECK(base == d && size == n, "IPC mapping spans %zu bytes, exporter allocated %zu", size, n);
  unsigned char *buf = malloc(n);
  CHECK(buf, "malloc");
  read_dev(d, buf, n);
  CHECK(is_filled(buf, n, 11), "the exporter's data is not visible through the handle");
  fill(buf, n, 12);
  CHECK_CU(cuMemcpyHtoD(d, buf, n), OK);
  CHECK_CU(cuMemcpyHtoD(d, buf, n + 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFree(d), CUDA_ERROR_INVALID_VALUE); /* IPC mappings are closed, not freed */
  CHECK_CU(cuIpcGetMemHandle(&h, d), CUDA_ERROR_INVALID_VALUE); /* not re-exportable */
  CHECK_CU(cuIpcCloseMemHandle(d + 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuIpcCloseMemHandle(d), OK);
  CHECK_CU(cuMemcpyDtoH(buf, d, 16), OK); /* one reference left */
  CHECK_CU(cuIpcCloseMemHandle(d), OK);
  CHECK_CU(cuIpcCloseMemHandle(d), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemcpyDtoH(buf, d, 16), CUDA_ERROR_INVALID_VALUE); /* unmapped */

  /* threads opening the same handle at once share one mapping */
  enum { N = 4 };
  struct opener o[N];
  pthread_t th[N];
  CUcontext ctx = NULL;
  CHECK_CU(cuCtxGetCurrent(&ctx), OK);
  for (int i = 0; i < N; i++) {
    o[i] = (struct opener){.ctx = ctx, .h = h, .r = CUDA_ERROR_UNKNOWN};
    CHECK(pthread_create(&th[i], NULL, open_in_thread, &o[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) {
    CHECK(o[i].r == OK, "concurrent open %d: %s", i, err_name(o[i].r));
    CHECK(o[i].d == o[0].d, "concurrent opens returned different mappings");
  }
  read_dev(o[0].d, buf, n);
  CHECK(is_filled(buf, n, 12), "concurrently opened mapping shows other data");
  for (int i = 0; i < N; i++) CHECK_CU(cuIpcCloseMemHandle(o[0].d), OK);
  CHECK_CU(cuIpcCloseMemHandle(o[0].d), CUDA_ERROR_INVALID_VALUE);
  free(buf);
  return 0;
}

/* Opens the handle, says "open", holds it until its stdin closes, then closes it. */
static int child_ipc_hold(const char *hex) {
  test_name = "ipc-hold child";
  CUipcMemHandle h;
  CHECK(hex_handle(hex, &h) == 0, "bad handle argument");
  setup();
  CUdeviceptr d = 0;
  CHECK_CU(cuIpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), OK);
  printf("open\n");
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  CHECK_CU(cuIpcCloseMemHandle(d), OK);
  return 0;
}

/* A child's start: the fake set up, one 4 KiB allocation exported, its handle as hex. */
static CUdeviceptr child_export(const char *name, char hex[2 * CU_IPC_HANDLE_SIZE + 1]) {
  test_name = name;
  setup();
  CUdeviceptr d = 0;
  CUipcMemHandle h;
  CHECK_CU(cuMemAlloc(&d, 4096), OK);
  CHECK_CU(cuIpcGetMemHandle(&h, d), OK);
  handle_hex(&h, hex);
  return d;
}

/* Exports an allocation, lets an exec'd holder open it, then frees it: argv "held" frees while
 * the holder has it open (the fake must abort), "closed" after the holder closed it. */
static int child_ipc_free(const char *when) {
  char hex[2 * CU_IPC_HANDLE_SIZE + 1];
  CUdeviceptr d = child_export("ipc-free child", hex);
  int in[2], out[2];
  CHECK(pipe(in) == 0 && pipe(out) == 0, "pipe");
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[1]);
    close(out[0]);
    execl("/proc/self/exe", "test_fakecuda", "--child", "ipc-hold", hex, (char *)NULL);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  char buf[8] = "";
  CHECK(read(out[0], buf, 4) == 4 && !memcmp(buf, "open", 4), "the holder did not open");
  if (strcmp(when, "closed") == 0) {
    close(in[1]); /* the holder closes the handle and exits */
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "holder");
    CHECK_CU(cuMemFree(d), OK);
    return 0;
  }
  cuMemFree(d); /* the fake aborts here */
  close(in[1]);
  waitpid(pid, NULL, 0);
  return 0;
}

/* Allocates, prints the IPC handle of the allocation, exits without freeing. */
static int child_ipc_export_exit(void) {
  char hex[2 * CU_IPC_HANDLE_SIZE + 1];
  child_export("ipc-export-exit child", hex);
  printf("%s\n", hex);
  return 0;
}

static int child_ipc_expect(const char *hex, const char *what) {
  test_name = "ipc-expect child";
  CUipcMemHandle h;
  CHECK(hex_handle(hex, &h) == 0, "bad handle argument");
  CHECK(strcmp(what, "invalid-handle") == 0, "unknown expectation %s", what);
  setup();
  CUdeviceptr d = 0x66;
  CHECK_CU(cuIpcOpenMemHandle(&d, h, 0), CUDA_ERROR_INVALID_HANDLE);
  CHECK(d == 0x66, "out-parameter written on failure");
  return 0;
}

/* ---- call log ----------------------------------------------------------------------------- */

/* A fixed call sequence; prints how many driver calls it made. */
static int child_log_scenario(void) {
  test_name = "log-scenario child";
  int calls = 0;
#define S(expr) (calls++, (expr))
  CUcontext c = NULL;
  CHECK(S(cuInit(0)) == OK, "cuInit");
  CHECK(S(cuDevicePrimaryCtxRetain(&c, 0)) == OK, "retain");
  CHECK(S(cuCtxSetCurrent(c)) == OK, "set current");
  CUdeviceptr d = 0, e = 0;
  unsigned char buf[4096];
  fill(buf, sizeof buf, 13);
  CHECK(S(cuMemAlloc(&d, 4096)) == OK, "alloc");
  CHECK(S(cuMemAlloc(&e, 100)) == OK, "alloc");
  CHECK(S(cuMemcpyHtoD(d, buf, 4096)) == OK, "htod");
  CHECK(S(cuMemcpyDtoD(e, d + 8, 100)) == OK, "dtod");
  CHECK(S(cuMemcpyDtoH(buf, d, 5000)) == CUDA_ERROR_INVALID_VALUE, "dtoh out of range");
  CUstream s = NULL;
  CHECK(S(cuStreamCreate(&s, 0)) == OK, "stream");
  CHECK(S(cuMemcpyHtoDAsync(d, buf, 64, s)) == OK, "async");
  CHECK(S(cuStreamSynchronize(s)) == OK, "sync");
  void *h = NULL;
  CHECK(S(cuMemHostAlloc(&h, 100, CU_MEMHOSTALLOC_DEVICEMAP)) == OK, "host alloc");
  CUdeviceptr hd = 0;
  CHECK(S(cuMemHostGetDevicePointer(&hd, h, 0)) == OK, "host dev ptr");
  void *fn = NULL;
  CHECK(S(cuGetProcAddress("cuMemcpyAsync", &fn, 12000,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL)) == OK, "gpa");
  CUipcMemHandle ih;
  CHECK(S(cuIpcGetMemHandle(&ih, d)) == OK, "ipc");
  CHECK(S(cuMemFree(d)) == OK, "free");
  CHECK(S(cuMemFree(d)) == CUDA_ERROR_INVALID_VALUE, "double free");
  CHECK(S(cuMemFreeHost(h)) == OK, "free host");
  CHECK(S(cuStreamDestroy(s)) == OK, "stream destroy");
#undef S
  printf("%d\n", calls);
  return 0;
}

/* Many lines from several processes into one file. Prints its call count. */
static int child_log_spam(void) {
  test_name = "log-spam child";
  setup();
  int calls = 3;
  for (int i = 0; i < 200; i++) {
    CUdeviceptr d = 0;
    CHECK_CU(cuMemAlloc(&d, (size_t)4096 * (size_t)(i % 7 + 1)), OK);
    CHECK_CU(cuMemFree(d), OK);
    calls += 2;
  }
  printf("%d\n", calls);
  return 0;
}

static regex_t line_re;

static void check_lines(const char *log, size_t len, int want_lines, const char *what) {
  int lines = 0;
  const char *p = log;
  while (p < log + len) {
    const char *nl = memchr(p, '\n', (size_t)(log + len - p));
    CHECK(nl != NULL, "%s: last line not terminated", what);
    char line[600];
    size_t l = (size_t)(nl - p);
    CHECK(l < sizeof line, "%s: line %d too long", what, lines + 1);
    memcpy(line, p, l);
    line[l] = '\0';
    CHECK(regexec(&line_re, line, 0, NULL, 0) == 0, "%s: line %d malformed: '%s'", what,
          lines + 1, line);
    lines++;
    p = nl + 1;
  }
  CHECK(lines == want_lines, "%s: %d lines for %d driver calls", what, lines, want_lines);
}

/* FAKECUDA_REGISTER_NS_PER_MIB: cuMemHostRegister pays the pinning cost in proportion to its
 * size and logs what it charged and on which thread (design §9.6: ~0.1 s/GB on a real driver). */
static void *register_in_thread(void *p) {
  CUcontext *c = p;
  static char buf[1 << 20];
  CUresult r = cuCtxSetCurrent(*c);
  if (r == OK) r = cuMemHostRegister_v2(buf, sizeof buf, 0);
  if (r == OK) r = cuMemHostUnregister(buf);
  return (void *)(intptr_t)r;
}
/* FAKECUDA_LOG to a fresh file, path (cap 300) gets its name; ns: FAKECUDA_REGISTER_NS_PER_MIB. */
static void log_register_cost(char *path, const char *ns) {
  make_tmpdir();
  tmp_path(path, 300, "reg.log");
  setenv("FAKECUDA_LOG", path, 1);
  setenv("FAKECUDA_REGISTER_NS_PER_MIB", ns, 1);
}
static void t_register_cost(void) {
  char path[300];
  log_register_cost(path, "2000");
  CUcontext c = setup();
  size_t n = 3u << 20;
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED, "mmap");
  CHECK_CU(cuMemHostRegister_v2(p, n, 0), OK);
  CHECK_CU(cuMemHostUnregister(p), OK);
  pthread_t t;
  void *res = NULL;
  CHECK(pthread_create(&t, NULL, register_in_thread, &c) == 0, "pthread_create");
  pthread_join(t, &res);
  CHECK((intptr_t)res == OK, "register from another thread: %d", (int)(intptr_t)res);
  size_t len;
  char *log = read_file(path, &len);
  CHECK(strstr(log, "bytesize=3145728 flags=0x0 -> 0 range=r1 pin_ns=6000 thread=main\n"),
        "3 MiB at 2000 ns/MiB must cost 6000 ns on the main thread:\n%s", log);
  CHECK(strstr(log, "bytesize=1048576 flags=0x0 -> 0 range=r2 pin_ns=2000 thread=other\n"),
        "1 MiB from a second thread must cost 2000 ns there:\n%s", log);
  free(log);
  munmap(p, n);
}
static void t_register_cost_bad_env(void) {
  char path[300];
  log_register_cost(path, "-5");
  setup();
  static char buf[1 << 20];
  CHECK_CU(cuMemHostRegister_v2(buf, sizeof buf, 0), OK);
  size_t len;
  char *log = read_file(path, &len);
  CHECK(strstr(log, "pin_ns=1000 thread=main\n"), "an invalid value must keep 1000 ns/MiB:\n%s",
        log);
  free(log);
}

/* CU_MEMHOSTREGISTER_READ_ONLY: refused (NOT_SUPPORTED) in a context of a device without
 * READ_ONLY_HOST_REGISTER_SUPPORTED; where accepted, the device may read the range, not write. */
static void t_register_readonly(void) {
  setenv("FAKECUDA_DEVICES", "2", 1);
  setenv("FAKECUDA_NO_READONLY_REGISTER", "2", 1); /* device 1 lacks the attribute */
  CUcontext c0 = setup();
  int v0 = -1, v1 = -1;
  CHECK_CU(cuDeviceGetAttribute(&v0, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0), OK);
  CHECK_CU(cuDeviceGetAttribute(&v1, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 1), OK);
  CHECK(v0 == 1 && v1 == 0, "attribute: device 0 %d, device 1 %d", v0, v1);
  static unsigned char buf[1 << 16];
  fill(buf, sizeof buf, 5);
  const unsigned ro = CU_MEMHOSTREGISTER_READ_ONLY | CU_MEMHOSTREGISTER_DEVICEMAP;
  CHECK_CU(cuMemHostRegister_v2(buf, sizeof buf, ro), OK);
  CUdeviceptr d = 0;
  CHECK_CU(cuMemAlloc(&d, sizeof buf), OK);
  CHECK_CU(cuMemcpyHtoD(d, buf, sizeof buf), OK);                     /* device reads: fine */
  CHECK_CU(cuMemcpyDtoH(buf, d, 16), CUDA_ERROR_INVALID_VALUE);       /* device writes: no */
  CHECK(is_filled(buf, sizeof buf, 5), "a refused write changed the read-only range");
  CHECK_CU(cuMemHostUnregister(buf), OK);
  CHECK_CU(cuMemcpyDtoH(buf, d, 16), OK); /* plain host memory again */
  CHECK_CU(cuMemFree(d), OK);
  CUcontext c1 = NULL;
  CHECK_CU(cuDevicePrimaryCtxRetain(&c1, 1), OK);
  CHECK_CU(cuCtxSetCurrent(c1), OK);
  CHECK_CU(cuMemHostRegister_v2(buf, sizeof buf, ro), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_CU(cuMemHostRegister_v2(buf, sizeof buf, CU_MEMHOSTREGISTER_DEVICEMAP), OK);
  CHECK_CU(cuMemHostUnregister(buf), OK);
  /* Memory mapped read-only registers with READ_ONLY only (device 0 has the attribute). */
  void *m = mmap(NULL, 1 << 16, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(m != MAP_FAILED, "mmap");
  CHECK_CU(cuMemHostRegister_v2(m, 1 << 16, CU_MEMHOSTREGISTER_DEVICEMAP),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuCtxSetCurrent(c0), OK);
  CHECK_CU(cuMemHostRegister_v2(m, 1 << 16, CU_MEMHOSTREGISTER_DEVICEMAP),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemHostRegister_v2(m, 1 << 16, ro), OK);
  CHECK_CU(cuMemHostUnregister(m), OK);
  munmap(m, 1 << 16);
}

static void t_call_log(void) {
  CHECK(regcomp(&line_re,
                "^cu[A-Za-z0-9_]+( [a-z]+=[^ =]+)* -> -?[0-9]+( [a-z]+=[^ =]+)*$",
                REG_EXTENDED | REG_NOSUB) == 0,
        "regcomp");
  make_tmpdir();
  char path_a[300], path_b[300], env_a[320], env_b[320], out[64];
  tmp_path(path_a, sizeof path_a, "a.log");
  tmp_path(path_b, sizeof path_b, "b.log");
  snprintf(env_a, sizeof env_a, "FAKECUDA_LOG=%s", path_a);
  snprintf(env_b, sizeof env_b, "FAKECUDA_LOG=%s", path_b);
  const char *args[] = {"log-scenario", NULL};
  const char *ea[] = {env_a, NULL}, *eb[] = {env_b, NULL};
  CHECK(run_self(args, ea, out, sizeof out) == 0, "first scenario run failed");
  int calls = atoi(out);
  CHECK(calls > 10, "scenario reported %d calls", calls);
  CHECK(run_self(args, eb, out, sizeof out) == 0, "second scenario run failed");
  size_t la, lb;
  char *a = read_file(path_a, &la), *b = read_file(path_b, &lb);
  CHECK(la == lb && memcmp(a, b, la) == 0,
        "two identical runs wrote different logs:\n--- %s\n%s--- %s\n%s", path_a, a, path_b, b);
  check_lines(a, la, calls, "scenario log");
  static const char *const expect[] = {
      "cuInit flags=0 -> 0\n",
      "cuDevicePrimaryCtxRetain dev=0 -> 0 ctx=P0\n",
      "cuMemAlloc_v2 bytesize=4096 -> 0 dptr=d1\n",
      "cuMemcpyHtoD_v2 dst=d1 src=unknown bytes=4096 -> 0\n",
      "cuMemcpyDtoD_v2 dst=d2 src=d1+8 bytes=100 -> 0\n",
      "cuMemcpyDtoH_v2 dst=unknown src=d1 bytes=5000 -> 1\n",
      "cuStreamCreate flags=0x0 -> 0 stream=S1\n",
      "cuMemcpyHtoDAsync_v2 dst=d1 src=unknown bytes=64 stream=S1 -> 0\n",
      "cuMemHostAlloc bytesize=100 flags=0x2 -> 0 pp=h1\n",
      "cuMemHostGetDevicePointer_v2 p=h1 flags=0x0 -> 0 dptr=h1\n",
      ("cuGetProcAddress_v2 symbol=cuMemcpyAsync version=12000 flags=0x2 -> 0 status=0 "
       "fn=cuMemcpyAsync_ptsz\n"),
      "cuIpcGetMemHandle dptr=d1 -> 0\n",
      "cuMemFree_v2 dptr=d1 -> 0\n",
      "cuMemFree_v2 dptr=unknown -> 1\n",
  };
  for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
    CHECK(strstr(a, expect[i]) != NULL, "log lacks the line '%.*s':\n%s",
          (int)strlen(expect[i]) - 1, expect[i], a);
  CHECK(strncmp(a, expect[0], strlen(expect[0])) == 0, "first line is not cuInit:\n%s", a);

  /* several processes appending to one file: whole lines, none lost */
  char path_c[300], env_c[320];
  tmp_path(path_c, sizeof path_c, "c.log");
  snprintf(env_c, sizeof env_c, "FAKECUDA_LOG=%s", path_c);
  const char *spam[] = {"log-spam", NULL};
  const char *ec[] = {env_c, NULL};
  enum { NPROC = 4 };
  pid_t pids[NPROC];
  for (int i = 0; i < NPROC; i++) {
    pids[i] = fork();
    CHECK(pids[i] >= 0, "fork");
    if (pids[i] == 0) {
      char o[32];
      int rc = run_self(spam, ec, o, sizeof o);
      _exit(rc == 0 && atoi(o) == 403 ? 0 : 1);
    }
  }
  for (int i = 0; i < NPROC; i++) {
    int st = 0;
    waitpid(pids[i], &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "log-spam process %d failed", i);
  }
  size_t lc;
  char *c = read_file(path_c, &lc);
  check_lines(c, lc, NPROC * 403, "shared log");
  free(a);
  free(b);
  free(c);
  unlink(path_a);
  unlink(path_b);
  unlink(path_c);
  rmdir(tmpdir);
}

/* ---- threads ------------------------------------------------------------------------------ */

struct worker {
  CUcontext ctx;
  unsigned seed;
  int failed;
};

static void *worker_main(void *p) {
  struct worker *w = p;
  if (cuCtxSetCurrent(w->ctx) != OK) {
    w->failed = 1;
    return NULL;
  }
  unsigned char src[3000], dst[3000];
  for (int i = 0; i < 300 && !w->failed; i++) {
    size_t n = 1 + (size_t)((w->seed * 7919u + (unsigned)i * 104729u) % sizeof src);
    CUdeviceptr d = 0;
    fill(src, n, w->seed + (unsigned)i);
    memset(dst, 0, n);
    if (cuMemAlloc(&d, n) != OK || cuMemcpyHtoD(d, src, n) != OK ||
        cuMemcpyDtoH(dst, d, n) != OK || !is_filled(dst, n, w->seed + (unsigned)i) ||
        cuMemFree(d) != OK)
      w->failed = 1;
  }
  return NULL;
}

static void t_threads(void) {
  CUcontext c = setup();
  size_t free0 = 0, total = 0;
  CHECK_CU(cuMemGetInfo(&free0, &total), OK);
  enum { N = 6 };
  pthread_t th[N];
  struct worker w[N];
  for (int i = 0; i < N; i++) {
    w[i] = (struct worker){.ctx = c, .seed = (unsigned)i + 1};
    CHECK(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) CHECK(!w[i].failed, "worker %d saw a failed call or lost data", i);
  size_t fr = 0;
  CHECK_CU(cuMemGetInfo(&fr, &total), OK);
  CHECK(fr == free0, "free memory %zu after the workers, was %zu", fr, free0);
}

/* cuGetExportTable: the private tables libcudart asks for (fakecuda.c, "export tables"). */
static void t_export_tables(void) {
  static const CUuuid cudart = {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, (char)0x87,
                                 (char)0xd9, 0x39, 0x12, (char)0xfd, (char)0x9d, (char)0xf9}};
  static const CUuuid cls = {{(char)0xc6, (char)0x93, 0x33, 0x6e, 0x11, 0x21, (char)0xdf, 0x11,
                              (char)0xa8, (char)0xc3, 0x68, (char)0xf3, 0x55, (char)0xd8,
                              (char)0x95, (char)0x93}};
  static const CUuuid integ = {{(char)0xd4, 0x08, 0x20, 0x55, (char)0xbd, (char)0xe6, 0x70, 0x4b,
                                (char)0x8d, 0x34, (char)0xba, 0x12, 0x3c, 0x66, (char)0xe1,
                                (char)0xf2}};
  static const CUuuid unknown = {{(char)0xf8, (char)0xcf, (char)0xf9, 0x51, 0x21, 0x46,
                                  (char)0x8b, 0x4e, (char)0xb9, (char)0xe2, (char)0xfb, 0x46,
                                  (char)0x9e, 0x7c, 0x0d, (char)0xd9}};
  CHECK_CU(cuInit(0), OK);
  const void *t = NULL;
  CHECK_CU(cuGetExportTable(NULL, &cudart), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuGetExportTable(&t, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuGetExportTable(&t, &unknown), CUDA_ERROR_INVALID_VALUE); /* cudart: optional */
  CHECK(t == NULL, "a refused table was handed out");
  /* cudart_interface: its size first, [2] the device's primary context, retained. */
  CHECK_CU(cuGetExportTable(&t, &cudart), OK);
  const uintptr_t *ct = t;
  CHECK(ct[0] == 10 * sizeof(void *), "cudart_interface size %zu", (size_t)ct[0]);
  CUcontext p = NULL, q = NULL;
  CHECK_CU(((CUresult(*)(CUcontext *, CUdevice))ct[2])(&p, 0), OK);
  CHECK_CU(cuDevicePrimaryCtxRetain(&q, 0), OK);
  CHECK(p && p == q, "cudart_interface[2] is not device 0's primary context");
  unsigned fl;
  int active = 0;
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &fl, &active), OK);
  CHECK(active == 1, "the primary context handed out is not active");
  /* An entry the fake does not implement answers NOT_SUPPORTED (and is logged). */
  typedef CUresult (*stub_t)(uintptr_t, uintptr_t, uintptr_t, uintptr_t);
  CHECK_CU(((stub_t)ct[7])(0, 0, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_CU(((CUresult(*)(CUcontext *, CUdevice))ct[2])(&p, 7), CUDA_ERROR_INVALID_DEVICE);
  /* context_local_storage: put, get, delete (a null context is the current one). */
  CHECK_CU(cuGetExportTable(&t, &cls), OK);
  const uintptr_t *lt = t;
  int key = 0, val = 0;
  void *got = NULL;
  CHECK_CU(((CUresult(*)(void **, CUcontext, void *))lt[2])(&got, p, &key),
           CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(((CUresult(*)(CUcontext, void *, void *, void *))lt[0])(p, &key, &val, NULL), OK);
  CHECK_CU(((CUresult(*)(void **, CUcontext, void *))lt[2])(&got, p, &key), OK);
  CHECK(got == &val, "context-local value not kept");
  CHECK_CU(cuCtxSetCurrent(p), OK);
  got = NULL;
  CHECK_CU(((CUresult(*)(void **, CUcontext, void *))lt[2])(&got, NULL, &key), OK);
  CHECK(got == &val, "a null context is not the current one");
  CHECK_CU(((CUresult(*)(CUcontext, void *))lt[1])(p, &key), OK);
  CHECK_CU(((CUresult(*)(void **, CUcontext, void *))lt[2])(&got, p, &key),
           CUDA_ERROR_INVALID_HANDLE);
  /* integrity_check[1]: constant for versions ending in 0, a keyed hash of the seconds else. */
  CHECK_CU(cuGetExportTable(&t, &integ), OK);
  CUresult (*check)(uint32_t, uint64_t, uint64_t *) =
      (CUresult(*)(uint32_t, uint64_t, uint64_t *))((const uintptr_t *)t)[1];
  uint64_t a[2] = {0}, b[2] = {0}, c[2] = {0};
  CHECK_CU(check(13000, 1, a), OK);
  CHECK(a[0] == 0x3341181C03CB675Cull && a[1] == 0x8ED383AA1F4CD1E8ull, "version 13000 answer");
  CHECK_CU(check(13002, 1000, a), OK);
  CHECK_CU(check(13002, 1000, b), OK);
  CHECK_CU(check(13002, 1001, c), OK);
  CHECK(a[0] == b[0] && a[1] == b[1], "the hash is not a function of its inputs");
  CHECK(a[0] != c[0] || a[1] != c[1], "the hash ignores the seconds");
  CHECK_CU(check(13002, 1000, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuCtxSetCurrent(NULL), OK);
  CHECK_CU(cuDevicePrimaryCtxRelease(0), OK);
  CHECK_CU(cuDevicePrimaryCtxRelease(0), OK);
}

/* ---- runner ------------------------------------------------------------------------------- */

static const struct {
  const char *name;
  void (*fn)(void);
} tests[] = {
    {"init_required", t_init_required}, {"devices", t_devices},
    {"no_devices", t_no_devices},       {"bad_env", t_bad_env},
    {"contexts", t_contexts},           {"alloc_roundtrip", t_alloc_roundtrip},
    {"copy_bounds", t_copy_bounds},     {"mem_limit", t_mem_limit},
    {"pitch", t_pitch},                 {"host_memory", t_host_memory},
    {"streams_async", t_streams_async}, {"legacy", t_legacy},
    {"resolver", t_resolver},           {"errors", t_errors},
    {"ipc", t_ipc},                     {"call_log", t_call_log},
    {"threads", t_threads},
    {"host_attrs", t_host_attrs},       {"host_no_uva", t_host_no_uva},
    {"gpa_alias", t_gpa_alias},         {"capture", t_capture},
    {"primary_reset", t_primary_reset}, {"fork_child", t_fork_child},
    {"alloc_origins", t_alloc_origins}, {"kernel", t_kernel},
    {"ipc_free_open", t_ipc_free_open},
    {"export_tables", t_export_tables},
    {"register_cost", t_register_cost}, {"register_cost_bad_env", t_register_cost_bad_env},
    {"register_readonly", t_register_readonly},
};

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "--child") == 0) {
    if (strcmp(argv[2], "ipc-open") == 0 && argc == 5) return child_ipc_open(argv[3], argv[4]);
    if (strcmp(argv[2], "ipc-expect") == 0 && argc == 5) return child_ipc_expect(argv[3], argv[4]);
    if (strcmp(argv[2], "log-scenario") == 0) return child_log_scenario();
    if (strcmp(argv[2], "ipc-export-exit") == 0) return child_ipc_export_exit();
    if (strcmp(argv[2], "ipc-hold") == 0 && argc == 4) return child_ipc_hold(argv[3]);
    if (strcmp(argv[2], "ipc-free") == 0 && argc == 4) return child_ipc_free(argv[3]);
    if (strcmp(argv[2], "log-spam") == 0) return child_log_spam();
    fprintf(stderr, "test_fakecuda: unknown child mode %s\n", argv[2]);
    return 2;
  }
  /* The driver state must be fresh in every test: nothing here calls the driver. */
  unsetenv("FAKECUDA_LOG");
  unsetenv("FAKECUDA_DEVICES");
  unsetenv("FAKECUDA_MEM_LIMIT");
  unsetenv("FAKECUDA_NO_UVA");
  unsetenv("FAKECUDA_NO_HOSTPTR");
  unsetenv("FAKECUDA_GPA_ALIAS");
  unsetenv("FAKECUDA_REGISTER_NS_PER_MIB");
  unsetenv("FAKECUDA_NO_READONLY_REGISTER");
  const char *only = argc >= 2 ? argv[1] : NULL;
  int failed = 0, ran = 0;
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    if (only && strcmp(only, tests[i].name) != 0) continue;
    ran++;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) {
      test_name = tests[i].name;
      alarm(60);
      tests[i].fn();
      exit(0); /* not _exit: lets LeakSanitizer check the test in ASan builds */
    }
    int st = 0;
    waitpid(pid, &st, 0);
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!ok && WIFSIGNALED(st))
      fprintf(stderr, "FAIL [%s] killed by signal %d%s\n", tests[i].name, WTERMSIG(st),
              WTERMSIG(st) == SIGALRM ? " (timeout)" : "");
    printf("%-16s %s\n", tests[i].name, ok ? "ok" : "FAILED");
    failed += !ok;
  }
  if (ran == 0) {
    fprintf(stderr, "test_fakecuda: no test named %s\n", only);
    return 2;
  }
  printf("%d of %d tests passed\n", ran - failed, ran);
  return failed ? 1 : 0;
}
