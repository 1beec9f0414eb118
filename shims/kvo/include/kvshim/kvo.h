/* kvo: the KV-offload hook ABI (kvshim design §10.1).
 *
 * An engine that wants its KV cache offloaded exposes three plain C functions from a shared
 * library it links (its "offload module"):
 *
 *     kvo_lookup       how many leading full chunks of a token sequence are cached
 *     kvo_load_chunk   copy cached chunk i into a host or device buffer
 *     kvo_store_chunk  offer chunk i, held in a host or device buffer, to the cache
 *
 * The engine's own module decides what "cached" means (nothing, a private CPU cache, ...).
 * kvshim, injected with LD_PRELOAD, defines the same three symbols; the dynamic linker then
 * binds the engine's calls to kvshim, which serves them from the node-wide cache and calls the
 * engine's own function (found with dlsym) on a miss or on any internal failure.
 *
 * Interposition rules for the offload module (what makes the calls reachable by LD_PRELOAD):
 *   - define the functions in a shared library, with default visibility (KVO_API below does
 *     this), under exactly these names;
 *   - the engine calls them through the PLT (ordinary dynamic linking) or through a pointer
 *     obtained with dlsym(RTLD_DEFAULT, ...) after start-up; never link the module with
 *     -Bsymbolic, never give the functions protected visibility, never call them through a
 *     hidden alias inside the module;
 *   - never link the module (or the engine) statically into one object with its caller when
 *     interposition is wanted.
 *
 * Chunks. A chunk is desc->chunk_tokens consecutive tokens; chunk i covers tokens
 * [i * chunk_tokens, (i + 1) * chunk_tokens). Only full chunks exist in this ABI: a partial tail
 * is never looked up, loaded or stored. The identity of chunk i is its descriptor namespace
 * (every field of kvo_desc_t except abi_version, size and chunk_bytes, which are checked, not
 * hashed) plus ALL tokens [0, (i + 1) * chunk_tokens): the same tokens after a different prefix
 * are a different chunk.
 *
 * Byte layout of one chunk buffer (layout == KVO_LAYOUT_LKTHD), row-major, contiguous:
 *
 *     [layers][2][chunk_tokens][kv_heads][head_dim] elements of dtype
 *
 * index [l][0] holds the keys of layer l, [l][1] its values; element (l, s, t, h, d) lives at
 * byte offset ((((l * 2 + s) * chunk_tokens + t) * kv_heads + h) * head_dim + d) * dtype_size,
 * and chunk_bytes == layers * 2 * chunk_tokens * kv_heads * head_dim * dtype_size.
 * Elements are little-endian in the dtype's IEEE/integer encoding. A cache never interprets
 * the bytes; the layout matters to tools that read chunks and to engines that share them, and
 * it is part of the namespace (chunks stored under one layout are never returned for another).
 *
 * Ownership. The caller owns desc, tokens and the buffer; an implementation reads/writes them
 * only during the call and keeps no pointer to them afterwards. Data handed to
 * kvo_store_chunk is copied before it returns.
 *
 * Threads. Every function may be called concurrently from any number of threads; an
 * implementation serialises internally as needed. A device buffer is a CUdeviceptr valid in
 * the CUDA context current on the calling thread; the implementation uses that context and
 * returns only after the copy has completed (synchronous semantics, as cuMemcpyHtoD/DtoH), so
 * the caller may reuse or free the buffer as soon as the call returns.
 *
 * Consistency. kvo_lookup pins nothing: a chunk it counted may be evicted before the matching
 * kvo_load_chunk, which then reports KVO_MISS. Callers treat any load result other than KVO_OK
 * as "compute this chunk".
 *
 * ABI stability. Names, argument lists, return codes, enum values and the offsets of existing
 * descriptor fields are frozen once released. The descriptor only grows by appending fields at
 * the end; callers set size = sizeof(kvo_desc_t) as they were compiled, implementations read
 * only the first min(size, their sizeof) bytes and treat missing fields as zero. An appended
 * field must keep zero meaning "behave as before" so that an older implementation ignoring it
 * stays correct; any change that cannot meet these rules bumps KVO_ABI_VERSION, and an
 * implementation refuses descriptors whose abi_version it does not implement (-EPROTO).
 *
 * C and C++ compatible; needs only <stdint.h>, <stddef.h> and <errno.h>. */
#ifndef KVSHIM_KVO_H
#define KVSHIM_KVO_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVO_ABI_VERSION 1u

#if defined(_WIN32)
#define KVO_API
#else
#define KVO_API __attribute__((visibility("default")))
#endif

/* Element types. The values are the kvshim store's dtype codes (kvs_dtype_t) and are pinned. */
typedef enum kvo_dtype {
  KVO_DTYPE_U8 = 0,
  KVO_DTYPE_F16 = 1,     /* IEEE binary16 */
  KVO_DTYPE_BF16 = 2,    /* bfloat16 */
  KVO_DTYPE_F32 = 3,     /* IEEE binary32 */
  KVO_DTYPE_F8E4M3 = 4,
  KVO_DTYPE_F8E5M2 = 5,
  KVO_DTYPE_I8 = 6,
  KVO_DTYPE_I32 = 7
} kvo_dtype_t;

/* Byte layouts of a chunk buffer (see the top of this file). Values are pinned. */
typedef enum kvo_layout {
  KVO_LAYOUT_LKTHD = 0 /* [layers][K,V][chunk_tokens][kv_heads][head_dim] */
} kvo_layout_t;

/* Kinds of buffer a chunk is loaded into or stored from. Values are pinned. */
typedef enum kvo_buf_kind {
  KVO_BUF_HOST = 0,  /* buf is a host pointer, (uint64_t)(uintptr_t)ptr; pageable or pinned */
  KVO_BUF_DEVICE = 1 /* buf is a CUdeviceptr in the calling thread's current CUDA context */
} kvo_buf_kind_t;

/* Results. Values are pinned. Errors are negative errno values: those listed with each
 * function, and possibly others from an interposer; a caller treats any negative result of a
 * load like KVO_MISS and of a store like KVO_NOT_KEPT (it computes, or carries on). */
#define KVO_OK 0       /* load: chunk_bytes bytes written to the buffer; store: the cache holds
                          the chunk (stored now, or it was already there) */
#define KVO_MISS 1     /* load: the chunk is not cached; the buffer's contents are unspecified */
#define KVO_NOT_KEPT 2 /* store: declined (no cache, no space, being written elsewhere);
                          nothing was retained. Not an error: the caller carries on */

#define KVO_MODEL_ID_MAX 64

/* What every call passes: which model and KV layout the tokens are about. Zero-initialise,
 * fill every field, set chunk_bytes with kvo_desc_chunk_bytes(), then pass the same
 * descriptor on every call. All fields are fixed width, in host byte order; offsets are
 * pinned (static assertions below). */
typedef struct kvo_desc {
  uint32_t abi_version;                /* KVO_ABI_VERSION the caller was compiled with */
  uint32_t size;                       /* sizeof(kvo_desc_t) as the caller was compiled */
  char model_id[KVO_MODEL_ID_MAX];     /* identifies the weights: NUL-terminated (<= 63
                                          bytes; bytes after the first NUL are ignored); two
                                          models whose KV differs for the same tokens must use
                                          different ids */
  uint32_t dtype;                      /* kvo_dtype_t of every K and V element */
  uint32_t layers;                     /* layers holding KV (> 0) */
  uint32_t kv_heads;                   /* KV heads held by this rank (> 0) */
  uint32_t head_dim;                   /* elements per head (> 0) */
  uint32_t chunk_tokens;               /* tokens per chunk (> 0) */
  uint32_t rank;                       /* tensor-parallel rank, < world_size */
  uint32_t world_size;                 /* tensor-parallel ranks (>= 1); data-parallel replicas
                                          of one model each pass rank 0, world_size 1 */
  uint32_t layout;                     /* kvo_layout_t of the chunk buffer */
  uint64_t chunk_bytes;                /* bytes of one chunk, all layers, K and V:
                                          == kvo_desc_chunk_bytes(this) */
} kvo_desc_t;

/* Bytes of a version-1 descriptor: the least `size` an implementation accepts. */
#define KVO_DESC_SIZE_V1 112u

/* kvo_lookup: the number of leading full chunks of tokens[0, n_tokens) that are cached, i.e.
 * the largest r such that chunks 0..r-1 are all present; 0 <= r <= n_tokens / chunk_tokens.
 * tokens may be NULL when n_tokens == 0.
 * Returns r >= 0, or -EINVAL (NULL desc or tokens, invalid descriptor), -EPROTO (abi_version
 * not implemented), -EOVERFLOW (r would not fit an int). */
KVO_API int kvo_lookup(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens);

/* kvo_load_chunk: copy chunk chunk_index into buf (buf_kind: a kvo_buf_kind_t value).
 * Only tokens[0, (chunk_index + 1) * chunk_tokens) are used: the prefix up to and including
 * the chunk; n_tokens must be at least that and may be more (the rest is ignored).
 * buf_len >= desc->chunk_bytes; exactly chunk_bytes bytes are written, laid out as above.
 * Returns KVO_OK, KVO_MISS, or -EINVAL (bad desc, n_tokens too short, NULL buffer or tokens,
 * unknown buf_kind), -ENOBUFS (buf_len < chunk_bytes), -EPROTO, -EIO (the copy failed; the
 * buffer's contents are unspecified). */
KVO_API int kvo_load_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                           size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len);

/* kvo_store_chunk: offer chunk chunk_index, whose chunk_bytes bytes are in buf, to the cache.
 * Same arguments and token rule as kvo_load_chunk; the buffer is only read.
 * Returns KVO_OK (the cache now holds the chunk), KVO_NOT_KEPT, or the errors of
 * kvo_load_chunk. A chunk is reported KVO_OK only when it was actually kept. */
KVO_API int kvo_store_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                            size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len);

/* Pointer types, for code that resolves the functions at run time (dlsym). */
typedef int (*kvo_lookup_fn)(const kvo_desc_t *, const uint32_t *, size_t);
typedef int (*kvo_load_chunk_fn)(const kvo_desc_t *, const uint32_t *, size_t, size_t, int,
                                 uint64_t, size_t);
typedef int (*kvo_store_chunk_fn)(const kvo_desc_t *, const uint32_t *, size_t, size_t, int,
                                  uint64_t, size_t);

/* --- helpers (static inline: they add no symbol to any library) --------------------------- */

/* Bytes per element of a dtype; 0 for an unknown dtype. */
static inline size_t kvo_dtype_size(uint32_t dtype) {
  switch (dtype) {
  case KVO_DTYPE_U8: case KVO_DTYPE_F8E4M3: case KVO_DTYPE_F8E5M2: case KVO_DTYPE_I8: return 1;
  case KVO_DTYPE_F16: case KVO_DTYPE_BF16: return 2;
  case KVO_DTYPE_F32: case KVO_DTYPE_I32: return 4;
  default: return 0;
  }
}

/* layers * 2 * chunk_tokens * kv_heads * head_dim * dtype size of d; 0 when a factor is zero,
 * the dtype is unknown or the product overflows 64 bits. */
static inline uint64_t kvo_desc_chunk_bytes(const kvo_desc_t *d) {
  const uint64_t f[6] = {d->layers, 2, d->chunk_tokens, d->kv_heads, d->head_dim,
                         (uint64_t)kvo_dtype_size(d->dtype)};
  uint64_t n = 1;
  for (int i = 0; i < 6; i++) {
    if (f[i] == 0 || n > UINT64_MAX / f[i]) return 0;
    n *= f[i];
  }
  return n;
}

/* The validity rule every implementation applies to a descriptor: 0 when d is usable,
 * -EINVAL when NULL, too small or inconsistent (unknown dtype or layout, a zero dimension,
 * rank >= world_size, model_id not NUL-terminated, chunk_bytes wrong), -EPROTO when
 * abi_version is not KVO_ABI_VERSION. */
static inline int kvo_desc_check(const kvo_desc_t *d) {
  if (d == NULL) return -EINVAL;
  if (d->abi_version != KVO_ABI_VERSION) return -EPROTO;
  if (d->size < KVO_DESC_SIZE_V1) return -EINVAL;
  int terminated = 0;
  for (size_t i = 0; i < KVO_MODEL_ID_MAX; i++) terminated |= d->model_id[i] == '\0';
  if (!terminated) return -EINVAL;
  if (d->layout != KVO_LAYOUT_LKTHD) return -EINVAL;
  if (d->world_size == 0 || d->rank >= d->world_size) return -EINVAL;
  uint64_t bytes = kvo_desc_chunk_bytes(d);
  if (bytes == 0 || bytes != d->chunk_bytes) return -EINVAL;
  return 0;
}

#ifdef __cplusplus
}
#endif

/* Pinned layout of version 1 (C11 or C++11). */
#if defined(__cplusplus)
static_assert(sizeof(kvo_desc_t) == KVO_DESC_SIZE_V1, "kvo_desc_t v1 size");
static_assert(offsetof(kvo_desc_t, dtype) == 72, "kvo_desc_t.dtype offset");
static_assert(offsetof(kvo_desc_t, layout) == 100, "kvo_desc_t.layout offset");
static_assert(offsetof(kvo_desc_t, chunk_bytes) == 104, "kvo_desc_t.chunk_bytes offset");
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(kvo_desc_t) == KVO_DESC_SIZE_V1, "kvo_desc_t v1 size");
_Static_assert(offsetof(kvo_desc_t, dtype) == 72, "kvo_desc_t.dtype offset");
_Static_assert(offsetof(kvo_desc_t, layout) == 100, "kvo_desc_t.layout offset");
_Static_assert(offsetof(kvo_desc_t, chunk_bytes) == 104, "kvo_desc_t.chunk_bytes offset");
#endif

#endif /* KVSHIM_KVO_H */
