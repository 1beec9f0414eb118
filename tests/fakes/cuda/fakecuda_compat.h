/* tests/fakes/cuda: what the CUDA 13 headers declare and older CUDA 12.x ones lack, so the fake
 * driver and its tests build with any 12.x or 13 cuda.h (a GPU machine's image may carry an
 * older toolkit) and export the same symbols (exports.txt) either way. Include after cuda.h.
 * Each block is guarded by the CUDA_VERSION that introduced the declarations (cuda.h of 13.0:
 * cuCtxCreate_v4 and CUctxCreateParams since 12.5; cuCtxGetDevice_v2 and cuCtxSynchronize_v2
 * since 13.0; the pointer attributes up to 21; four CUresult codes). Checked by building
 * `scripts/gpu-check --pack` with CUDA_HOME pointing at the headers of 12.6 (docs/gpu.md). */
#ifndef KVSHIM_FAKECUDA_COMPAT_H
#define KVSHIM_FAKECUDA_COMPAT_H

#if CUDA_VERSION < 12050
typedef struct CUctxCigParam_st {
  int sharedDataType; /* CUcigDataType */
  void *sharedData;
} CUctxCigParam;
typedef struct CUctxCreateParams_st {
  CUexecAffinityParam *execAffinityParams;
  int numExecAffinityParams;
  CUctxCigParam *cigParams;
} CUctxCreateParams;
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                        CUdevice dev);
#endif
/* The driver version the fake reports (cuDriverGetVersion) and resolves up to
 * (cuGetProcAddress): a 13.0 driver, whatever cuda.h the fake and its callers were built with
 * (a real 13.0 driver serves programs built with 12.x headers the same way). */
#define KVS_FK_DRIVER_VERSION 13000
/* The last CUpointer_attribute of cuda.h 13.0 (CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE,
 * 21), by value: older headers end earlier, the driver's answer must not depend on them. */
#define KVS_FK_POINTER_ATTRIBUTE_LAST 21
#if CUDA_VERSION < 13000
/* Error codes of cuda.h 13.0 (values from its CUresult enum) that 12.6 lacks; the fake's error
 * table names them. A later 12.x header that declares some of them as enumerators is fine: the
 * macro has the enumerator's value. */
#define CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER ((CUresult)36)
#define CUDA_ERROR_CONTAINED ((CUresult)226)
#define CUDA_ERROR_TENSOR_MEMORY_LEAK ((CUresult)721)
#define CUDA_ERROR_KEY_ROTATION ((CUresult)916)
CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx);
CUresult cuCtxSynchronize_v2(CUcontext ctx);
#endif

#endif
