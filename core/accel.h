/* kvshim accel: the accelerator copy/pin interface (design §2, §8, §9.4).
 *
 * core knows no accelerator: it reaches one only through this table of operations, which is
 * plain memcpy until a hook family installs its own (shims/cuda installs copies and
 * registrations through the real driver). The default table (no accelerator in the process)
 * copies with memcpy for every direction ("device" memory is then host memory), pins and
 * unpins as no-ops returning 0, and cannot open IPC handles (-ENOTSUP). Every operation
 * returns 0 or a negative errno.
 *
 * Part of core's base layer: the IPC operations name a tensor descriptor (core/wire/tensor.h)
 * by its struct tag only, so this header includes nothing of the layers above.
 *
 * Threads: kvs_accel_get and kvs_accel_set swap one atomic pointer; tables are immutable and
 * have static storage, so a caller may keep using a table it fetched before a swap. */
#ifndef KVSHIM_CORE_ACCEL_H
#define KVSHIM_CORE_ACCEL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kvs_tensor_desc; /* kvs_tensor_desc_t, core/wire/tensor.h */

typedef enum kvs_copy_dir {
  KVS_COPY_H2H = 0,
  KVS_COPY_H2D = 1,
  KVS_COPY_D2H = 2,
  KVS_COPY_D2D = 3,
} kvs_copy_dir_t;

typedef struct kvs_accel_ops {
  const char *name; /* for logs: "memcpy", "cuda" */
  int (*copy)(void *dst, const void *src, size_t len, kvs_copy_dir_t dir);
  int (*pin)(void *ptr, size_t len);    /* page-lock host memory for DMA */
  int (*unpin)(void *ptr);              /* ptr as given to a successful pin */
  /* CUDA_IPC / CUDA_VMM_FD descriptors: map the allocation, *devptr = its region's start */
  int (*open_ipc)(const struct kvs_tensor_desc *d, void **devptr);
  int (*close_ipc)(void *devptr);       /* devptr from a successful open_ipc */
  /* Optional (NULL: use pin): pin memory the device only reads, such as a peer's pool mapped
   * read-only (CUDA: CU_MEMHOSTREGISTER_READ_ONLY where the device supports it); unpin undoes
   * it. */
  int (*pin_readonly)(void *ptr, size_t len);
} kvs_accel_ops_t;

/* The built-in table (static storage). */
const kvs_accel_ops_t *kvs_accel_default(void);
/* The table in use now (an acquire load). Never NULL. */
const kvs_accel_ops_t *kvs_accel_get(void);
/* Install ops (NULL: the default) with one atomic exchange; *prev (may be NULL) gets the table
 * it replaced. ops is borrowed for ever: a thread that fetched it before the swap may still
 * call into it, so tables must have static storage. -EINVAL (nothing changes) when any function
 * pointer is NULL. */
int kvs_accel_set(const kvs_accel_ops_t *ops, const kvs_accel_ops_t **prev);

#ifdef __cplusplus
}
#endif
#endif
