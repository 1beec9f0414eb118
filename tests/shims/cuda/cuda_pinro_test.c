/* tests/shims/cuda: kvs_accel pin_readonly (issue 14 item 7).
 *
 *   cuda_pinro_test
 *
 * Not preloaded: it links shims/cuda and uses the kvs_accel table. A peer's pool is mapped
 * read-only; kvshim pins such memory with CU_MEMHOSTREGISTER_READ_ONLY where the context's
 * device has READ_ONLY_HOST_REGISTER_SUPPORTED, and without the flag where it does not (the
 * fake refuses READ_ONLY there, as cuda.h says the real driver does, and refuses read-only
 * mappings without READ_ONLY: such a pin fails there and the caller copies instead). The fake's
 * call log shows the flags of every registration. */
#include <cuda.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "accel.h"
#include "preload_testutil.h"

const kvs_accel_ops_t *kvs__cuda_accel_ops(void);

#define N (1u << 20)

int main(void) {
  char tmp[256], log[512];
  pt_mkdtemp(tmp, sizeof tmp, "pinro");
  snprintf(log, sizeof log, "%s/fake.log", tmp);
  setenv("FAKECUDA_DEVICES", "2", 1);
  setenv("FAKECUDA_NO_READONLY_REGISTER", "2", 1); /* device 1 lacks the attribute */
  setenv("FAKECUDA_LOG", log, 1);
  const kvs_accel_ops_t *ops = kvs__cuda_accel_ops();
  PT_CHECK(ops->pin_readonly != NULL, "the CUDA table has no pin_readonly");
  void *ro = mmap(NULL, N, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  PT_CHECK(ro != MAP_FAILED, "mmap");
  PT_CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
  for (int dev = 0; dev < 2; dev++) {
    CUcontext c = NULL;
    PT_CHECK(cuDevicePrimaryCtxRetain(&c, dev) == CUDA_SUCCESS &&
                 cuCtxSetCurrent(c) == CUDA_SUCCESS,
             "device %d setup", dev);
    /* Device 1 cannot register read-only memory at all (cuda.h: READ_ONLY is required for it,
     * and unsupported there): the pin fails with an error and the caller copies instead. */
    int rc = ops->pin_readonly(ro, N);
    PT_CHECK(dev == 0 ? rc == 0 : rc < 0, "device %d: pin_readonly: %d", dev, rc);
    CUdeviceptr d = 0;
    PT_CHECK(cuMemAlloc(&d, N) == CUDA_SUCCESS, "device buffer");
    PT_CHECK(ops->copy((void *)(uintptr_t)d, ro, N, KVS_COPY_H2D) == 0, "device reads the pin");
    PT_CHECK(cuMemFree(d) == CUDA_SUCCESS, "free");
    if (rc == 0) PT_CHECK(ops->unpin(ro) == 0, "device %d: unpin", dev);
    PT_CHECK(cuCtxSetCurrent(NULL) == CUDA_SUCCESS &&
                 cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS,
             "device %d release", dev);
  }
  /* A writable buffer the device only reads pins on device 1 too, without READ_ONLY. */
  void *rw = aligned_alloc(4096, N);
  CUcontext c1 = NULL;
  PT_CHECK(rw && cuDevicePrimaryCtxRetain(&c1, 1) == CUDA_SUCCESS &&
               cuCtxSetCurrent(c1) == CUDA_SUCCESS,
           "device 1 again");
  PT_CHECK(ops->pin_readonly(rw, N) == 0 && ops->unpin(rw) == 0, "writable pin on device 1");
  free(rw);
  char *text = pt_read_file(log, NULL);
  PT_CHECK(text, "read %s", log);
  /* PORTABLE|READ_ONLY (0x9) on device 0 only, PORTABLE (0x1) on device 1; READ_ONLY never
   * tried where the device lacks it (801 = CUDA_ERROR_NOT_SUPPORTED). */
  PT_CHECK(pt_count(text, "cuMemHostRegister_v2 bytesize=1048576 flags=0x9 -> 0") == 1,
           "device 0: not registered READ_ONLY:\n%s", text);
  PT_CHECK(pt_count(text, "cuMemHostRegister_v2 bytesize=1048576 flags=0x1 -> 1") == 1,
           "device 1: the read-only mapping was not tried plainly:\n%s", text);
  PT_CHECK(pt_count(text, "cuMemHostRegister_v2 bytesize=1048576 flags=0x1 -> 0") == 1,
           "device 1: the writable buffer was not registered plainly:\n%s", text);
  PT_CHECK(pt_count(text, "-> 801") == 0, "READ_ONLY was tried where the device lacks it:\n%s",
           text);
  free(text);
  munmap(ro, N);
  pt_rm_rf(tmp);
  printf("PASS cuda_pinro\n");
  return 0;
}
