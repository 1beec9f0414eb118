/* shims/cuda: the one list of CUDA driver entry points kvshim touches (style rule 5).
 *
 * KVS_CUDA_HOOKS: the hooked entry points, under their exact ELF names (cuda.h renames base
 * names by macro: cuMemAlloc is cuMemAlloc_v2 there; the legacy cuMemAlloc is another ABI and
 * is never hooked). Each row generates, in cuda.c:
 *     - the exported wrapper `CUresult <name> <params>` (and, from the rows, the version
 *       script preload/exports.map.c, the resolver table of runtime/family_tables.h and the
 *       hooks `kvshim inspect` checks, tools/inspect),
 *     - the typed pointer to the real function (kvs__cu_pfn_<name>),
 *     - the row of the substitution table used by dlsym and cuGetProcAddress[_v2]: a real
 *       pointer identifies exactly one row, so each variant (_v2, _ptsz, _ptds) gets its own
 *       wrapper and nothing is ever picked by base name.
 * KVS_CUDA_USES: driver functions kvshim calls itself (never hooked): typed pointers only.
 *
 * X(ret, name, params, args), ret always CUresult (the rows of every family have one shape,
 * runtime/family_tables.h). This header has no includes so the preprocessor can turn it into
 * the version script without cuda.h; the parameter types are those of cuda.h. */
#ifndef KVSHIM_CUDA_HOOKS_H
#define KVSHIM_CUDA_HOOKS_H

#define KVS_CUDA_HOOKS(X)                                                                     \
  X(CUresult, cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize), (dptr, bytesize))          \
  X(CUresult, cuMemAllocPitch_v2,                                                              \
    (CUdeviceptr * dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,                  \
     unsigned int ElementSizeBytes),                                                          \
    (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes))                                   \
  X(CUresult, cuMemFree_v2, (CUdeviceptr dptr), (dptr))                                        \
  X(CUresult, cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream),        \
    (dptr, bytesize, hStream))                                                                 \
  X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream),   \
    (dptr, bytesize, hStream))                                                                 \
  X(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream))           \
  X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream))      \
  X(CUresult, cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags),    \
    (dptr, bytesize, flags))                                                                   \
  X(CUresult, cuMemCreate,                                                                     \
    (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp *prop,     \
     unsigned long long flags),                                                               \
    (handle, size, prop, flags))                                                              \
  X(CUresult, cuMemAllocHost_v2, (void **pp, size_t bytesize), (pp, bytesize))                 \
  X(CUresult, cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags), (pp, bytesize, Flags)) \
  X(CUresult, cuMemFreeHost, (void *p), (p))                                                   \
  X(CUresult, cuMemHostGetDevicePointer_v2, (CUdeviceptr * pdptr, void *p, unsigned int Flags), \
    (pdptr, p, Flags))                                                                         \
  X(CUresult, cuMemHostGetFlags, (unsigned int *pFlags, void *p), (pFlags, p))                 \
  X(CUresult, cuMemcpyHtoDAsync_v2,                                                            \
    (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream),         \
    (dstDevice, srcHost, ByteCount, hStream))                                                 \
  X(CUresult, cuMemcpyHtoDAsync_v2_ptsz,                                                       \
    (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream),         \
    (dstDevice, srcHost, ByteCount, hStream))                                                 \
  X(CUresult, cuMemcpyDtoHAsync_v2,                                                            \
    (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),               \
    (dstHost, srcDevice, ByteCount, hStream))                                                 \
  X(CUresult, cuMemcpyDtoHAsync_v2_ptsz,                                                       \
    (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),               \
    (dstHost, srcDevice, ByteCount, hStream))                                                 \
  X(CUresult, cuGetProcAddress,                                                                \
    (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags),                       \
    (symbol, pfn, cudaVersion, flags))                                                        \
  X(CUresult, cuGetProcAddress_v2,                                                             \
    (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,                       \
     CUdriverProcAddressQueryResult *symbolStatus),                                           \
    (symbol, pfn, cudaVersion, flags, symbolStatus))

#define KVS_CUDA_USES(X)                                                                      \
  X(CUresult, cuInit, (unsigned int Flags), (Flags))                                           \
  X(CUresult, cuDriverGetVersion, (int *driverVersion), (driverVersion))                       \
  X(CUresult, cuCtxGetCurrent, (CUcontext * pctx), (pctx))                                     \
  X(CUresult, cuCtxGetDevice, (CUdevice * device), (device))                                   \
  X(CUresult, cuCtxPushCurrent_v2, (CUcontext ctx), (ctx))                                     \
  X(CUresult, cuCtxPopCurrent_v2, (CUcontext * pctx), (pctx))                                  \
  X(CUresult, cuDeviceGet, (CUdevice * device, int ordinal), (device, ordinal))                \
  X(CUresult, cuDeviceGetCount, (int *count), (count))                                         \
  X(CUresult, cuDeviceGetUuid_v2, (CUuuid * uuid, CUdevice dev), (uuid, dev))                  \
  X(CUresult, cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev),        \
    (pi, attrib, dev))                                                                         \
  X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev), (pctx, dev))         \
  X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev))                             \
  X(CUresult, cuDevicePrimaryCtxGetState, (CUdevice dev, unsigned int *flags, int *active),    \
    (dev, flags, active))                                                                      \
  X(CUresult, cuPointerGetAttribute, (void *data, CUpointer_attribute attribute, CUdeviceptr ptr), \
    (data, attribute, ptr))                                                                    \
  X(CUresult, cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int Flags), (p, bytesize, Flags)) \
  X(CUresult, cuMemHostUnregister, (void *p), (p))                                             \
  X(CUresult, cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode * mode), (mode))         \
  X(CUresult, cuIpcGetMemHandle, (CUipcMemHandle * pHandle, CUdeviceptr dptr), (pHandle, dptr)) \
  X(CUresult, cuIpcOpenMemHandle_v2, (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int Flags), \
    (pdptr, handle, Flags))                                                                   \
  X(CUresult, cuIpcCloseMemHandle, (CUdeviceptr dptr), (dptr))                                 \
  X(CUresult, cuMemcpyDtoDAsync_v2,                                                            \
    (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),       \
    (dstDevice, srcDevice, ByteCount, hStream))                                               \
  X(CUresult, cuCtxSynchronize, (void), ())                                                    \
  X(CUresult, cuStreamCreate, (CUstream * phStream, unsigned int Flags), (phStream, Flags))    \
  X(CUresult, cuStreamSynchronize, (CUstream hStream), (hStream))                              \
  X(CUresult, cuStreamDestroy_v2, (CUstream hStream), (hStream))

#endif
