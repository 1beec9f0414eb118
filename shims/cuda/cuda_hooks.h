/* shims/cuda: the one list of CUDA driver entry points kvshim touches (style rule 5).
 *
 * KVS_CUDA_HOOKS: the hooked entry points, under their exact ELF names (cuda.h renames base
 * names by macro: cuMemAlloc is cuMemAlloc_v2 there; the legacy cuMemAlloc is another ABI and
 * is never hooked). Each row generates, in cuda.c:
 *     - the exported wrapper `CUresult <name> <params>` (and, from it, the version script
 *       preload/exports.map.c and the resolver table),
 *     - the typed pointer to the real function (kvs__cu_pfn_<name>),
 *     - the row of the substitution table used by dlsym and cuGetProcAddress[_v2]: a real
 *       pointer identifies exactly one row, so each variant (_v2, _ptsz, _ptds) gets its own
 *       wrapper and nothing is ever picked by base name.
 * KVS_CUDA_USES: driver functions kvshim calls itself (never hooked): typed pointers only.
 *
 * X(name, params, args). This header has no includes so the preprocessor can turn it into the
 * version script without cuda.h; the parameter types are those of cuda.h. */
#ifndef KVSHIM_CUDA_HOOKS_H
#define KVSHIM_CUDA_HOOKS_H

#define KVS_CUDA_HOOKS(X)                                                                     \
  X(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize), (dptr, bytesize))                   \
  X(cuMemAllocPitch_v2,                                                                       \
    (CUdeviceptr * dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,                  \
     unsigned int ElementSizeBytes),                                                          \
    (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes))                                   \
  X(cuMemFree_v2, (CUdeviceptr dptr), (dptr))                                                 \
  X(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream),                 \
    (dptr, bytesize, hStream))                                                                \
  X(cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream),            \
    (dptr, bytesize, hStream))                                                                \
  X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream))                    \
  X(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream))               \
  X(cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags),             \
    (dptr, bytesize, flags))                                                                  \
  X(cuMemAllocHost_v2, (void **pp, size_t bytesize), (pp, bytesize))                          \
  X(cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags), (pp, bytesize, Flags))  \
  X(cuMemFreeHost, (void *p), (p))                                                            \
  X(cuMemHostGetDevicePointer_v2, (CUdeviceptr * pdptr, void *p, unsigned int Flags),         \
    (pdptr, p, Flags))                                                                        \
  X(cuMemHostGetFlags, (unsigned int *pFlags, void *p), (pFlags, p))                          \
  X(cuMemcpyHtoDAsync_v2,                                                                     \
    (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream),         \
    (dstDevice, srcHost, ByteCount, hStream))                                                 \
  X(cuMemcpyHtoDAsync_v2_ptsz,                                                                \
    (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream),         \
    (dstDevice, srcHost, ByteCount, hStream))                                                 \
  X(cuMemcpyDtoHAsync_v2,                                                                     \
    (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),               \
    (dstHost, srcDevice, ByteCount, hStream))                                                 \
  X(cuMemcpyDtoHAsync_v2_ptsz,                                                                \
    (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),               \
    (dstHost, srcDevice, ByteCount, hStream))                                                 \
  X(cuGetProcAddress, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags),    \
    (symbol, pfn, cudaVersion, flags))                                                        \
  X(cuGetProcAddress_v2,                                                                      \
    (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,                       \
     CUdriverProcAddressQueryResult *symbolStatus),                                           \
    (symbol, pfn, cudaVersion, flags, symbolStatus))

#define KVS_CUDA_USES(X)                                                                      \
  X(cuInit, (unsigned int Flags), (Flags))                                                    \
  X(cuDriverGetVersion, (int *driverVersion), (driverVersion))                                \
  X(cuCtxGetCurrent, (CUcontext * pctx), (pctx))                                              \
  X(cuCtxGetDevice, (CUdevice * device), (device))                                            \
  X(cuCtxPushCurrent_v2, (CUcontext ctx), (ctx))                                              \
  X(cuCtxPopCurrent_v2, (CUcontext * pctx), (pctx))                                           \
  X(cuDeviceGet, (CUdevice * device, int ordinal), (device, ordinal))                         \
  X(cuDeviceGetCount, (int *count), (count))                                                  \
  X(cuDeviceGetUuid_v2, (CUuuid * uuid, CUdevice dev), (uuid, dev))                           \
  X(cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev),                \
    (pi, attrib, dev))                                                                        \
  X(cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev), (pctx, dev))                  \
  X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev))                                      \
  X(cuDevicePrimaryCtxGetState, (CUdevice dev, unsigned int *flags, int *active),             \
    (dev, flags, active))                                                                     \
  X(cuPointerGetAttribute, (void *data, CUpointer_attribute attribute, CUdeviceptr ptr),      \
    (data, attribute, ptr))                                                                   \
  X(cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int Flags), (p, bytesize, Flags)) \
  X(cuMemHostUnregister, (void *p), (p))                                                      \
  X(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode * mode), (mode))                 \
  X(cuIpcGetMemHandle, (CUipcMemHandle * pHandle, CUdeviceptr dptr), (pHandle, dptr))         \
  X(cuIpcOpenMemHandle_v2, (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int Flags),  \
    (pdptr, handle, Flags))                                                                   \
  X(cuIpcCloseMemHandle, (CUdeviceptr dptr), (dptr))                                          \
  X(cuMemcpyHtoD_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount),          \
    (dstDevice, srcHost, ByteCount))                                                          \
  X(cuMemcpyDtoH_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount),                \
    (dstHost, srcDevice, ByteCount))                                                          \
  X(cuMemcpyDtoD_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount),        \
    (dstDevice, srcDevice, ByteCount))

#endif
