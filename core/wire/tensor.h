/* kvshim tensor: IPC-exportable tensor descriptors, their wire encoding and the device UUID ->
 * local ordinal map that opening one needs (design §8). The accelerator that opens and copies
 * them is core/accel.h's; the registry of exportable allocations, runtime/registry.h's.
 *
 * Descriptor. A tensor is a strided view of a storage region named by a kind-specific handle:
 *     CPU_SHM      bytes [cpu.offset, cpu.offset + cpu.length) of the pool whose header carries
 *                  cpu.instance_id (opened through the pool fd: kvs_tensor_open_cpu)
 *     CUDA_IPC     bytes [ipc.offset, ipc.alloc_len) of the device allocation exported by the
 *                  64-byte cuIpcGetMemHandle handle (it exports the whole allocation, so the
 *                  offset of the region inside it always travels with it)
 *     CUDA_VMM_FD  bytes [vmm.offset, vmm.size) of the cuMemCreate allocation whose shareable
 *                  handle is fd number vmm.fd_index of the SCM_RIGHTS array of the same message
 * Element [i0, .., i(ndim-1)] lies at byte
 *     (storage_offset + sum_k i_k * stride[k]) * dtype_size
 * of the region (shape and stride in elements, like torch). A descriptor is valid when
 *     kind is known, dtype < KVS_DTYPE__COUNT, 1 <= ndim <= KVS_TENSOR_MAX_DIMS,
 *     shape[k] > 0 for k < ndim,
 *     every element's byte range lies inside the region (lowest element byte >= 0,
 *     highest element end <= region length; no arithmetic overflow),
 *     CPU_SHM: instance_id != 0, length > 0, offset + length does not overflow;
 *     CUDA_*: device_uuid not all zero ("cpu" is all zero);
 *     CUDA_IPC: offset < alloc_len;
 *     CUDA_VMM_FD: fd_index < KVS_TENSOR_MAX_FDS, granularity a power of two,
 *                  size > 0 and size % granularity == 0, offset < size.
 * shape/stride entries at and beyond ndim and the handle fields of other kinds carry no
 * meaning: equality ignores them, decode zeroes them, encode does not read them.
 *
 * Encoding, version 1 (every integer little-endian, no padding, no optional field):
 *     u8 kind | u8 version (1) | u16 body_len
 *     body: u32 dtype | u32 ndim | u64 storage_offset | u8 device_uuid[16]
 *           | u64 shape[ndim] | i64 stride[ndim] | handle
 *     handle CPU_SHM:     u64 instance_id | u64 offset | u64 length              (24 bytes)
 *     handle CUDA_IPC:    u8 handle[64] | u64 offset | u64 alloc_len             (80 bytes)
 *                         [| u64 generation]                  (88 bytes; present iff != 0)
 *     handle CUDA_VMM_FD: u32 fd_index | u64 offset | u64 size | u64 granularity (28 bytes)
 *     body_len == 32 + 16 * ndim + handle size, so an encoding is at most KVS_TENSOR_ENC_MAX.
 *     The CUDA_IPC generation names the export's lease (shims/cuda: exporter pid << 32 | a
 *     per-process sequence number); a generation of 0 is never encoded (no field), so 8 zero
 *     bytes there are trailing bytes (-EMSGSIZE). Decoders that predate the field refuse any
 *     88-byte handle the same way.
 * The kind tag comes first (it replaces pickle's class identity); kind and version numbers are
 * pinned forever. The encoding is canonical: decode(b) succeeding implies encode gives b back.
 *
 * Decode errors (each one distinct; kvs_tensor_strerror gives the generic text,
 * kvs_tensor_decode_msg the specific one with the offending values):
 *     -EBADMSG          truncated: shorter than the header, than body_len, or than kind+ndim need
 *     -EPROTONOSUPPORT  unknown kind                      ("unknown tensor kind 7")
 *     -EPROTO           unknown encoding version          ("tensor encoding version 3 not
 *                                                           supported (this build reads 1)")
 *     -EMSGSIZE         trailing bytes: after the descriptor, or a body longer than kind+ndim need
 *     -EDOM             ndim outside [1, 8]
 *     -ENOTSUP          unknown dtype
 *     -EINVAL           a zero or malformed field (zero dim, zero length/size, instance id 0,
 *                       CUDA kind without a device UUID, bad granularity, fd index too large)
 *     -ERANGE           the strided extent does not fit the handle's region (or overflows)
 * encode and kvs_tensor_validate refuse an invalid descriptor with the same codes.
 *
 * Threads: descriptors are plain values. The device-ordinal cache takes its own lock (see
 * below). */
#ifndef KVSHIM_TENSOR_H
#define KVSHIM_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, wire value, text). Wire values are pinned forever and never reused. */
#define KVS_TENSOR_KINDS(X)                                                                   \
  X(CPU_SHM, 1, "cpu_shm")                                                                    \
  X(CUDA_IPC, 2, "cuda_ipc")                                                                  \
  X(CUDA_VMM_FD, 3, "cuda_vmm_fd")

typedef enum kvs_tensor_kind {
#define KVS__TK_ENUM(name, val, text) KVS_TENSOR_##name = val,
  KVS_TENSOR_KINDS(KVS__TK_ENUM)
#undef KVS__TK_ENUM
} kvs_tensor_kind_t;

#define KVS_TENSOR_MAX_DIMS 8
#define KVS_TENSOR_UUID_SIZE 16
#define KVS_TENSOR_IPC_HANDLE_SIZE 64 /* sizeof(CUipcMemHandle) */
#define KVS_TENSOR_MAX_FDS 253        /* SCM_MAX_FD: fds one sendmsg can carry */
#define KVS_TENSOR_ENC_VERSION 1u
#define KVS_TENSOR_ENC_HEADER 4u       /* u8 kind, u8 version, u16 body_len */
#define KVS_TENSOR_ENC_MAX (KVS_TENSOR_ENC_HEADER + 32u + 16u * KVS_TENSOR_MAX_DIMS + 88u) /* 252 */

typedef struct kvs_tensor_desc {
  uint32_t kind;    /* kvs_tensor_kind_t */
  uint32_t dtype;   /* kvs_dtype_t (store.h) */
  uint32_t ndim;    /* 1..KVS_TENSOR_MAX_DIMS */
  uint32_t pad0;    /* not encoded, not compared */
  uint64_t shape[KVS_TENSOR_MAX_DIMS];  /* elements per dimension */
  int64_t stride[KVS_TENSOR_MAX_DIMS];  /* elements between neighbours along a dimension */
  uint64_t storage_offset;              /* elements from the region start to element [0..0] */
  uint8_t device_uuid[KVS_TENSOR_UUID_SIZE]; /* cuDeviceGetUuid bytes; all zero = cpu */
  union {
    struct { uint64_t instance_id, offset, length; } cpu;   /* bytes in the pool segment */
    struct {
      uint8_t handle[KVS_TENSOR_IPC_HANDLE_SIZE]; /* opaque cuIpcGetMemHandle bytes */
      uint64_t offset;     /* bytes from the allocation base to the region */
      uint64_t alloc_len;  /* bytes of the whole allocation */
      uint64_t generation; /* the export's lease (0: none; see the encoding) */
    } ipc;
    struct {
      uint32_t fd_index;   /* index into the message's SCM_RIGHTS fd array */
      uint64_t offset;     /* bytes from the start of the allocation to the region */
      uint64_t size;       /* bytes of the allocation (a multiple of granularity) */
      uint64_t granularity;/* cuMemGetAllocationGranularity, bytes, power of two */
    } vmm;
  };
} kvs_tensor_desc_t;

/* "cpu_shm", "cuda_ipc", "cuda_vmm_fd", or "?" for an unknown kind. */
const char *kvs_tensor_kind_name(uint32_t kind);

/* Generic text for any error this header returns ("unknown tensor kind", ...); falls back to
 * strerror for other codes. Never NULL. */
const char *kvs_tensor_strerror(int err);

/* 0 when d is valid (rules above), else the negative code decode would give for its encoding.
 * msg (may be NULL) receives the specific text on failure, always NUL-terminated when cap > 0. */
int kvs_tensor_validate(const kvs_tensor_desc_t *d, char *msg, size_t cap);

/* Bytes the encoding of d takes (> 0), or a negative validation code. */
int kvs_tensor_encoded_size(const kvs_tensor_desc_t *d);

/* Encode d into buf. Returns the bytes written (<= KVS_TENSOR_ENC_MAX), -ENOBUFS when cap is
 * too small (nothing written), or a validation code (invalid descriptors are never encoded). */
int kvs_tensor_encode(const kvs_tensor_desc_t *d, void *buf, size_t cap);

/* Decode exactly one descriptor occupying all of buf[0, len). On success writes *out (unused
 * entries zeroed) and returns 0; on failure *out is untouched and the code is one listed above. */
int kvs_tensor_decode(const void *buf, size_t len, kvs_tensor_desc_t *out);
/* Same, and on failure writes the specific message into msg (NUL-terminated when cap > 0). */
int kvs_tensor_decode_msg(const void *buf, size_t len, kvs_tensor_desc_t *out, char *msg,
                          size_t cap);
/* Decode the descriptor at the start of buf, which may continue with other data (arrays of
 * descriptors in a frame). Returns the bytes it took (> 0) or a negative code; never -EMSGSIZE
 * for bytes after the descriptor. msg as above (may be NULL). */
int kvs_tensor_decode_prefix(const void *buf, size_t len, kvs_tensor_desc_t *out, char *msg,
                             size_t cap);

/* Kind and every meaningful field equal (entries beyond ndim and other kinds' handles ignored).
 * a and b must not be NULL. */
bool kvs_tensor_equal(const kvs_tensor_desc_t *a, const kvs_tensor_desc_t *b);

/* Logical bytes: dtype size * product(shape[0..ndim)); 0 when the dtype or ndim is invalid, a
 * dim is zero, or the product overflows. */
uint64_t kvs_tensor_nbytes(const kvs_tensor_desc_t *d);

/* Bytes of the region the strided view touches, relative to the region start:
 * [*lo, *hi) with hi - lo >= nbytes for non-overlapping views. Returns 0 or -EINVAL/-EDOM/
 * -ENOTSUP/-ERANGE (overflow, or an element before the region start). Does not check hi
 * against the handle's length (validate does). */
int kvs_tensor_byte_span(const kvs_tensor_desc_t *d, uint64_t *lo, uint64_t *hi);

/* Open a CPU_SHM descriptor through a pool mapped from the fd its owner sent
 * (kvs_pool_attach) or the pool itself. On success *ptr = pool base + cpu.offset, the start of
 * the region (element [0..0] lies at *ptr + storage_offset * dtype size); the pointer stays
 * valid while the pool stays mapped, and is writable only if the pool is. Errors: -EINVAL
 * (NULL argument, not a CPU_SHM descriptor, invalid descriptor: see validate), -ESTALE
 * (cpu.instance_id is not the pool's: the descriptor belongs to another pool), -ERANGE (the
 * region is not inside the segment's cache or host arena). */
int kvs_tensor_open_cpu(const kvs_tensor_desc_t *d, kvs_pool_t *pool, void **ptr);

/* ---- device UUID -> local ordinal (design §8) ----------------------------------------------
 * scan writes the UUID of ordinal i to uuids[i] for every device, up to cap, and returns the
 * device count (>= 0) or a negative errno; shims/cuda fills it with cuDeviceGetUuid_v2. The
 * first successful scan is cached for the life of the process (a failed one is not), so later
 * calls never scan again; a mutex guards the cache. */
#define KVS_TENSOR_MAX_DEVICES 64
typedef int (*kvs_device_scan_fn)(uint8_t (*uuids)[KVS_TENSOR_UUID_SIZE], int cap, void *ctx);
/* Ordinal (>= 0) of the device with this UUID. -EINVAL (NULL, or the all-zero "cpu" UUID),
 * -ENODEV (no such device), -ENOSYS (nothing cached and scan NULL), or scan's error. */
int kvs_tensor_device_ordinal(const uint8_t uuid[KVS_TENSOR_UUID_SIZE], kvs_device_scan_fn scan,
                              void *ctx);
/* Drop the cache (tests; a forked child that must rescan). */
void kvs_tensor_device_cache_reset(void);

#ifdef __cplusplus
}
#endif
#endif
