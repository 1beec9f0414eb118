/* kvshim tensor: see tensor.h (the encoding is documented there, field by field). */
#include "tensor.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "log.h"

/* Body bytes before the shape array: dtype, ndim, storage_offset, device_uuid. */
#define BODY_FIXED (4u + 4u + 8u + KVS_TENSOR_UUID_SIZE)
#define HANDLE_CPU (8u * 3u)
#define HANDLE_IPC (KVS_TENSOR_IPC_HANDLE_SIZE + 8u * 2u)
#define HANDLE_VMM (4u + 8u * 3u)
#define HANDLE_IPC_GEN 8u /* the optional CUDA_IPC generation */
_Static_assert(BODY_FIXED == 32, "tensor encoding layout");
_Static_assert(KVS_TENSOR_ENC_MAX == KVS_TENSOR_ENC_HEADER + BODY_FIXED +
                                        16u * KVS_TENSOR_MAX_DIMS + HANDLE_IPC + HANDLE_IPC_GEN,
               "KVS_TENSOR_ENC_MAX is the largest encoding (CUDA_IPC, 8 dims)");
_Static_assert(KVS_TENSOR_ENC_MAX <= 0xffffu, "body_len is a u16");

/* ---- names and messages --------------------------------------------------------------- */

const char *kvs_tensor_kind_name(uint32_t kind) {
  switch (kind) {
#define KVS__TK_NAME(name, val, text) case val: return text;
    KVS_TENSOR_KINDS(KVS__TK_NAME)
#undef KVS__TK_NAME
  default: return "?";
  }
}

static bool kind_known(uint32_t kind) {
  switch (kind) {
#define KVS__TK_CASE(name, val, text) case val:
    KVS_TENSOR_KINDS(KVS__TK_CASE)
#undef KVS__TK_CASE
    return true;
  default: return false;
  }
}

static unsigned handle_size(uint32_t kind) {
  switch (kind) {
  case KVS_TENSOR_CPU_SHM: return HANDLE_CPU;
  case KVS_TENSOR_CUDA_IPC: return HANDLE_IPC;
  case KVS_TENSOR_CUDA_VMM_FD: return HANDLE_VMM;
  default: return 0;
  }
}

static unsigned body_size(uint32_t kind, uint32_t ndim) {
  return BODY_FIXED + 16u * ndim + handle_size(kind);
}

const char *kvs_tensor_strerror(int err) {
  switch (err) {
  case 0: return "ok";
  case -EBADMSG: return "tensor descriptor truncated";
  case -EPROTONOSUPPORT: return "unknown tensor kind";
  case -EPROTO: return "tensor encoding version not supported";
  case -EMSGSIZE: return "trailing bytes after tensor descriptor";
  case -EDOM: return "tensor ndim out of range";
  case -ENOTSUP: return "unknown tensor dtype";
  case -EINVAL: return "invalid tensor descriptor field";
  case -ERANGE: return "tensor extent outside its handle's region";
  case -ENOBUFS: return "buffer too small for the tensor descriptor";
  case -ESTALE: return "tensor descriptor names another pool instance";
  case -ENODEV: return "no local device with that UUID";
  default: return strerror(err < 0 ? -err : err);
  }
}

/* snprintf into an optional message buffer, then return code. */
__attribute__((format(printf, 4, 5))) static int fail(int code, char *msg, size_t cap,
                                                      const char *fmt, ...) {
  if (msg && cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* ---- validation ----------------------------------------------------------------------- */

static bool uuid_is_zero(const uint8_t *u) {
  uint8_t acc = 0;
  for (size_t i = 0; i < KVS_TENSOR_UUID_SIZE; i++) acc |= u[i];
  return acc == 0;
}

/* Checks every rule but the byte-span one; the shared front half of validate and byte_span. */
static int check_shape(const kvs_tensor_desc_t *d, char *msg, size_t cap) {
  if (!kind_known(d->kind)) return fail(-EPROTONOSUPPORT, msg, cap, "unknown tensor kind %u", d->kind);
  if (kvs_dtype_size(d->dtype) == 0)
    return fail(-ENOTSUP, msg, cap, "unknown tensor dtype %u (this build knows 0..%d)", d->dtype,
                KVS_DTYPE__COUNT - 1);
  if (d->ndim < 1 || d->ndim > KVS_TENSOR_MAX_DIMS)
    return fail(-EDOM, msg, cap, "tensor ndim %u outside [1, %d]", d->ndim, KVS_TENSOR_MAX_DIMS);
  for (uint32_t k = 0; k < d->ndim; k++)
    if (d->shape[k] == 0) return fail(-EINVAL, msg, cap, "tensor dimension %u has size 0", k);
  return 0;
}

/* Element-index span of the view in bytes, [lo, hi), relative to the region start. */
static int span(const kvs_tensor_desc_t *d, uint64_t *lo, uint64_t *hi, char *msg, size_t cap) {
  uint64_t es = kvs_dtype_size(d->dtype);
  uint64_t pos = 0, neg = 0, count = 1;
  for (uint32_t k = 0; k < d->ndim; k++) {
    uint64_t n1 = d->shape[k] - 1, step, t;
    int64_t s = d->stride[k];
    if (__builtin_mul_overflow(count, d->shape[k], &count)) goto overflow;
    if (s >= 0) {
      step = (uint64_t)s;
      if (__builtin_mul_overflow(step, n1, &t) || __builtin_add_overflow(pos, t, &pos)) goto overflow;
    } else {
      step = (uint64_t)(-(s + 1)) + 1u; /* |s| without overflowing on INT64_MIN */
      if (__builtin_mul_overflow(step, n1, &t) || __builtin_add_overflow(neg, t, &neg)) goto overflow;
    }
  }
  if (__builtin_mul_overflow(count, es, &count)) goto overflow;
  if (neg > d->storage_offset)
    return fail(-ERANGE, msg, cap,
                "tensor reaches %llu elements before its region start (storage offset %llu)",
                (unsigned long long)(neg - d->storage_offset),
                (unsigned long long)d->storage_offset);
  uint64_t lo_el = d->storage_offset - neg, end_el, lo_b, hi_b;
  if (__builtin_add_overflow(d->storage_offset, pos, &end_el) ||
      __builtin_add_overflow(end_el, 1u, &end_el) || __builtin_mul_overflow(lo_el, es, &lo_b) ||
      __builtin_mul_overflow(end_el, es, &hi_b))
    goto overflow;
  *lo = lo_b;
  *hi = hi_b;
  return 0;
overflow:
  return fail(-ERANGE, msg, cap, "tensor shape/stride/storage offset overflow 64-bit byte offsets");
}

int kvs_tensor_byte_span(const kvs_tensor_desc_t *d, uint64_t *lo, uint64_t *hi) {
  if (!d || !lo || !hi) return -EINVAL;
  KVS_TRY(check_shape(d, NULL, 0));
  return span(d, lo, hi, NULL, 0);
}

uint64_t kvs_tensor_nbytes(const kvs_tensor_desc_t *d) {
  if (!d || d->ndim < 1 || d->ndim > KVS_TENSOR_MAX_DIMS) return 0;
  uint64_t n = kvs_dtype_size(d->dtype);
  for (uint32_t k = 0; k < d->ndim; k++)
    if (__builtin_mul_overflow(n, d->shape[k], &n)) return 0;
  return n;
}

int kvs_tensor_validate(const kvs_tensor_desc_t *d, char *msg, size_t cap) {
  if (!d) return fail(-EINVAL, msg, cap, "no tensor descriptor");
  KVS_TRY(check_shape(d, msg, cap));
  const char *kn = kvs_tensor_kind_name(d->kind);
  uint64_t region = 0;
  switch (d->kind) {
  case KVS_TENSOR_CPU_SHM:
    if (d->cpu.instance_id == 0) return fail(-EINVAL, msg, cap, "%s tensor has pool instance id 0", kn);
    if (d->cpu.length == 0) return fail(-EINVAL, msg, cap, "%s tensor has length 0", kn);
    if (d->cpu.offset + d->cpu.length < d->cpu.offset)
      return fail(-ERANGE, msg, cap, "%s tensor offset %llu + length %llu overflows", kn,
                  (unsigned long long)d->cpu.offset, (unsigned long long)d->cpu.length);
    region = d->cpu.length;
    break;
  case KVS_TENSOR_CUDA_IPC:
    if (d->ipc.alloc_len == 0) return fail(-EINVAL, msg, cap, "%s tensor has allocation length 0", kn);
    if (d->ipc.offset >= d->ipc.alloc_len)
      return fail(-ERANGE, msg, cap, "%s tensor offset %llu not inside its %llu-byte allocation",
                  kn, (unsigned long long)d->ipc.offset, (unsigned long long)d->ipc.alloc_len);
    region = d->ipc.alloc_len - d->ipc.offset;
    break;
  case KVS_TENSOR_CUDA_VMM_FD:
    if (d->vmm.fd_index >= KVS_TENSOR_MAX_FDS)
      return fail(-EINVAL, msg, cap, "%s tensor fd index %u beyond the %d fds a message carries",
                  kn, d->vmm.fd_index, KVS_TENSOR_MAX_FDS);
    if (d->vmm.size == 0) return fail(-EINVAL, msg, cap, "%s tensor has size 0", kn);
    if (d->vmm.granularity == 0 || (d->vmm.granularity & (d->vmm.granularity - 1)) != 0 ||
        d->vmm.size % d->vmm.granularity != 0)
      return fail(-EINVAL, msg, cap,
                  "%s tensor granularity %llu is not a power of two dividing size %llu", kn,
                  (unsigned long long)d->vmm.granularity, (unsigned long long)d->vmm.size);
    if (d->vmm.offset >= d->vmm.size)
      return fail(-ERANGE, msg, cap, "%s tensor offset %llu not inside its %llu-byte allocation",
                  kn, (unsigned long long)d->vmm.offset, (unsigned long long)d->vmm.size);
    region = d->vmm.size - d->vmm.offset;
    break;
  }
  if (d->kind != KVS_TENSOR_CPU_SHM && uuid_is_zero(d->device_uuid))
    return fail(-EINVAL, msg, cap, "%s tensor has no device UUID (all zero means cpu)", kn);
  uint64_t lo, hi;
  KVS_TRY(span(d, &lo, &hi, msg, cap));
  if (hi > region)
    return fail(-ERANGE, msg, cap, "tensor spans bytes [%llu, %llu) but its %s region has %llu",
                (unsigned long long)lo, (unsigned long long)hi, kn, (unsigned long long)region);
  return 0;
}

/* ---- encoding ------------------------------------------------------------------------- */

static uint8_t *put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
  return p + 2;
}
static uint8_t *put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
  return p + 4;
}
static uint8_t *put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
  return p + 8;
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

int kvs_tensor_encoded_size(const kvs_tensor_desc_t *d) {
  KVS_TRY(kvs_tensor_validate(d, NULL, 0));
  bool gen = d->kind == KVS_TENSOR_CUDA_IPC && d->ipc.generation;
  return (int)(KVS_TENSOR_ENC_HEADER + body_size(d->kind, d->ndim) + (gen ? HANDLE_IPC_GEN : 0));
}

int kvs_tensor_encode(const kvs_tensor_desc_t *d, void *buf, size_t cap) {
  int n = kvs_tensor_encoded_size(d);
  if (n < 0) return n;
  if (!buf || cap < (size_t)n) return -ENOBUFS;
  uint8_t *p = buf;
  *p++ = (uint8_t)d->kind;
  *p++ = (uint8_t)KVS_TENSOR_ENC_VERSION;
  p = put16(p, (uint16_t)(n - KVS_TENSOR_ENC_HEADER));
  p = put32(p, d->dtype);
  p = put32(p, d->ndim);
  p = put64(p, d->storage_offset);
  memcpy(p, d->device_uuid, KVS_TENSOR_UUID_SIZE);
  p += KVS_TENSOR_UUID_SIZE;
  for (uint32_t k = 0; k < d->ndim; k++) p = put64(p, d->shape[k]);
  for (uint32_t k = 0; k < d->ndim; k++) p = put64(p, (uint64_t)d->stride[k]);
  switch (d->kind) {
  case KVS_TENSOR_CPU_SHM:
    p = put64(p, d->cpu.instance_id);
    p = put64(p, d->cpu.offset);
    p = put64(p, d->cpu.length);
    break;
  case KVS_TENSOR_CUDA_IPC:
    memcpy(p, d->ipc.handle, KVS_TENSOR_IPC_HANDLE_SIZE);
    p += KVS_TENSOR_IPC_HANDLE_SIZE;
    p = put64(p, d->ipc.offset);
    p = put64(p, d->ipc.alloc_len);
    if (d->ipc.generation) p = put64(p, d->ipc.generation);
    break;
  case KVS_TENSOR_CUDA_VMM_FD:
    p = put32(p, d->vmm.fd_index);
    p = put64(p, d->vmm.offset);
    p = put64(p, d->vmm.size);
    p = put64(p, d->vmm.granularity);
    break;
  }
  KVS__DEBUG_CHECK(p == (uint8_t *)buf + n);
  return n;
}

int kvs_tensor_decode_prefix(const void *buf, size_t len, kvs_tensor_desc_t *out, char *msg,
                             size_t cap) {
  const uint8_t *b = buf;
  if (!b && len) return fail(-EINVAL, msg, cap, "no buffer");
  if (!out) return fail(-EINVAL, msg, cap, "no output descriptor");
  if (len < KVS_TENSOR_ENC_HEADER)
    return fail(-EBADMSG, msg, cap, "tensor descriptor truncated: %zu bytes, the header needs %u",
                len, KVS_TENSOR_ENC_HEADER);
  uint32_t kind = b[0], version = b[1], body = get16(b + 2);
  if (!kind_known(kind)) return fail(-EPROTONOSUPPORT, msg, cap, "unknown tensor kind %u", kind);
  if (version != KVS_TENSOR_ENC_VERSION)
    return fail(-EPROTO, msg, cap, "tensor encoding version %u not supported (this build reads %u)",
                version, KVS_TENSOR_ENC_VERSION);
  if (len - KVS_TENSOR_ENC_HEADER < body)
    return fail(-EBADMSG, msg, cap,
                "tensor descriptor truncated: %zu bytes, its header announces %u + %u", len,
                KVS_TENSOR_ENC_HEADER, body);
  const uint8_t *p = b + KVS_TENSOR_ENC_HEADER;
  if (body < 8)
    return fail(-EBADMSG, msg, cap, "%s tensor body truncated: %u bytes, dtype and ndim need 8",
                kvs_tensor_kind_name(kind), body);
  uint32_t ndim = get32(p + 4);
  if (ndim < 1 || ndim > KVS_TENSOR_MAX_DIMS)
    return fail(-EDOM, msg, cap, "tensor ndim %u outside [1, %d]", ndim, KVS_TENSOR_MAX_DIMS);
  unsigned need = body_size(kind, ndim);
  if (body < need)
    return fail(-EBADMSG, msg, cap, "%s tensor body truncated: %u bytes, ndim %u needs %u",
                kvs_tensor_kind_name(kind), body, ndim, need);
  /* The CUDA_IPC generation: 8 more bytes, never 0 (else they are trailing bytes). */
  bool gen = kind == KVS_TENSOR_CUDA_IPC && body == need + HANDLE_IPC_GEN && get64(p + need);
  if (body > need && !gen)
    return fail(-EMSGSIZE, msg, cap, "%s tensor body has %u trailing bytes (%u bytes, ndim %u needs %u)",
                kvs_tensor_kind_name(kind), body - need, body, ndim, need);

  kvs_tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.kind = kind;
  d.dtype = get32(p);
  d.ndim = ndim;
  p += 8;
  d.storage_offset = get64(p);
  p += 8;
  memcpy(d.device_uuid, p, KVS_TENSOR_UUID_SIZE);
  p += KVS_TENSOR_UUID_SIZE;
  for (uint32_t k = 0; k < ndim; k++, p += 8) d.shape[k] = get64(p);
  for (uint32_t k = 0; k < ndim; k++, p += 8) d.stride[k] = (int64_t)get64(p);
  switch (kind) {
  case KVS_TENSOR_CPU_SHM:
    d.cpu.instance_id = get64(p);
    d.cpu.offset = get64(p + 8);
    d.cpu.length = get64(p + 16);
    break;
  case KVS_TENSOR_CUDA_IPC:
    memcpy(d.ipc.handle, p, KVS_TENSOR_IPC_HANDLE_SIZE);
    d.ipc.offset = get64(p + KVS_TENSOR_IPC_HANDLE_SIZE);
    d.ipc.alloc_len = get64(p + KVS_TENSOR_IPC_HANDLE_SIZE + 8);
    if (gen) d.ipc.generation = get64(p + KVS_TENSOR_IPC_HANDLE_SIZE + 16);
    break;
  case KVS_TENSOR_CUDA_VMM_FD:
    d.vmm.fd_index = get32(p);
    d.vmm.offset = get64(p + 4);
    d.vmm.size = get64(p + 12);
    d.vmm.granularity = get64(p + 20);
    break;
  }
  KVS_TRY(kvs_tensor_validate(&d, msg, cap));
  *out = d;
  return (int)(KVS_TENSOR_ENC_HEADER + body);
}

int kvs_tensor_decode_msg(const void *buf, size_t len, kvs_tensor_desc_t *out, char *msg,
                          size_t cap) {
  kvs_tensor_desc_t d;
  int n = kvs_tensor_decode_prefix(buf, len, &d, msg, cap);
  if (n < 0) return n;
  if ((size_t)n != len)
    return fail(-EMSGSIZE, msg, cap, "%zu trailing bytes after the %d-byte tensor descriptor",
                len - (size_t)n, n);
  if (!out) return fail(-EINVAL, msg, cap, "no output descriptor");
  *out = d;
  return 0;
}

int kvs_tensor_decode(const void *buf, size_t len, kvs_tensor_desc_t *out) {
  return kvs_tensor_decode_msg(buf, len, out, NULL, 0);
}

bool kvs_tensor_equal(const kvs_tensor_desc_t *a, const kvs_tensor_desc_t *b) {
  if (a->kind != b->kind || a->dtype != b->dtype || a->ndim != b->ndim ||
      a->storage_offset != b->storage_offset ||
      memcmp(a->device_uuid, b->device_uuid, KVS_TENSOR_UUID_SIZE) != 0)
    return false;
  uint32_t n = a->ndim <= KVS_TENSOR_MAX_DIMS ? a->ndim : KVS_TENSOR_MAX_DIMS;
  for (uint32_t k = 0; k < n; k++)
    if (a->shape[k] != b->shape[k] || a->stride[k] != b->stride[k]) return false;
  switch (a->kind) {
  case KVS_TENSOR_CPU_SHM:
    return a->cpu.instance_id == b->cpu.instance_id && a->cpu.offset == b->cpu.offset &&
           a->cpu.length == b->cpu.length;
  case KVS_TENSOR_CUDA_IPC:
    return memcmp(a->ipc.handle, b->ipc.handle, KVS_TENSOR_IPC_HANDLE_SIZE) == 0 &&
           a->ipc.offset == b->ipc.offset && a->ipc.alloc_len == b->ipc.alloc_len &&
           a->ipc.generation == b->ipc.generation;
  case KVS_TENSOR_CUDA_VMM_FD:
    return a->vmm.fd_index == b->vmm.fd_index && a->vmm.offset == b->vmm.offset &&
           a->vmm.size == b->vmm.size && a->vmm.granularity == b->vmm.granularity;
  default:
    return true; /* unknown kinds carry no handle we know how to compare */
  }
}

/* ---- CPU_SHM open --------------------------------------------------------------------- */

int kvs_tensor_open_cpu(const kvs_tensor_desc_t *d, kvs_pool_t *pool, void **ptr) {
  if (!d || !pool || !ptr) return -EINVAL;
  char msg[160];
  if (d->kind != KVS_TENSOR_CPU_SHM) {
    kvs_log_warn("tensor: open_cpu given a %s descriptor", kvs_tensor_kind_name(d->kind));
    return -EINVAL;
  }
  int rc = kvs_tensor_validate(d, msg, sizeof msg);
  if (rc < 0) {
    kvs_log_warn("tensor: refusing to open: %s", msg);
    return -EINVAL;
  }
  const kvs_pool_header_t *h = kvs_pool_header(pool);
  if (h->instance_id != d->cpu.instance_id) {
    kvs_log_warn("tensor: descriptor names pool instance %016llx, this pool is %016llx",
                 (unsigned long long)d->cpu.instance_id, (unsigned long long)h->instance_id);
    return -ESTALE;
  }
  uint64_t seg = kvs_pool_segment_size(pool);
  if (d->cpu.offset > seg || d->cpu.length > seg - d->cpu.offset ||
      kvs_pool_arena_of(pool, d->cpu.offset, d->cpu.length) < 0) {
    kvs_log_warn("tensor: region [%llu, +%llu) is not inside an arena of the %llu-byte pool",
                 (unsigned long long)d->cpu.offset, (unsigned long long)d->cpu.length,
                 (unsigned long long)seg);
    return -ERANGE;
  }
  *ptr = kvs_pool_base(pool) + d->cpu.offset;
  return 0;
}

/* ---- device UUID -> ordinal ----------------------------------------------------------- */

/* dev_uuids/dev_count are written once, under dev_lock, before dev_cached is released; readers
 * that acquire dev_cached == true read them without the lock. */
static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool dev_cached;
static int dev_count;
static uint8_t dev_uuids[KVS_TENSOR_MAX_DEVICES][KVS_TENSOR_UUID_SIZE];

int kvs_tensor_device_ordinal(const uint8_t uuid[KVS_TENSOR_UUID_SIZE], kvs_device_scan_fn scan,
                              void *ctx) {
  if (!uuid || uuid_is_zero(uuid)) return -EINVAL;
  if (!atomic_load_explicit(&dev_cached, memory_order_acquire)) {
    if (!scan) return -ENOSYS;
    /* Scan outside the lock: the callback enters the driver, and holding a kvshim lock across
     * it invites lock-order trouble. Racing first callers may each scan; the first result wins. */
    uint8_t found[KVS_TENSOR_MAX_DEVICES][KVS_TENSOR_UUID_SIZE];
    memset(found, 0, sizeof found);
    int n = scan(found, KVS_TENSOR_MAX_DEVICES, ctx);
    if (n < 0) return n;
    if (n > KVS_TENSOR_MAX_DEVICES) n = KVS_TENSOR_MAX_DEVICES;
    pthread_mutex_lock(&dev_lock);
    if (!atomic_load_explicit(&dev_cached, memory_order_relaxed)) {
      memcpy(dev_uuids, found, sizeof found);
      dev_count = n;
      atomic_store_explicit(&dev_cached, true, memory_order_release);
    }
    pthread_mutex_unlock(&dev_lock);
  }
  for (int i = 0; i < dev_count; i++)
    if (memcmp(dev_uuids[i], uuid, KVS_TENSOR_UUID_SIZE) == 0) return i;
  return -ENODEV;
}

void kvs_tensor_device_cache_reset(void) {
  pthread_mutex_lock(&dev_lock);
  atomic_store_explicit(&dev_cached, false, memory_order_release);
  dev_count = 0;
  memset(dev_uuids, 0, sizeof dev_uuids);
  pthread_mutex_unlock(&dev_lock);
}
