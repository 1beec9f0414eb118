/* kvshim accel: see accel.h. The default table: memcpy, no pinning, no IPC. */
#include "accel.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

static int mem_copy(void *dst, const void *src, size_t len, kvs_copy_dir_t dir) {
  if ((unsigned)dir > KVS_COPY_D2D) return -EINVAL;
  if (len == 0) return 0;
  if (!dst || !src) return -EINVAL;
  memcpy(dst, src, len);
  return 0;
}
static int mem_pin(void *ptr, size_t len) { return 0; }
static int mem_unpin(void *ptr) { return 0; }
static int mem_open_ipc(const struct kvs_tensor_desc *d, void **devptr) { return -ENOTSUP; }
static int mem_close_ipc(void *devptr) { return -ENOTSUP; }

static const kvs_accel_ops_t accel_memcpy = {
    .name = "memcpy", .copy = mem_copy, .pin = mem_pin, .unpin = mem_unpin,
    .open_ipc = mem_open_ipc, .close_ipc = mem_close_ipc, .pin_readonly = mem_pin};
static const kvs_accel_ops_t *_Atomic accel_cur = &accel_memcpy;

const kvs_accel_ops_t *kvs_accel_default(void) { return &accel_memcpy; }
const kvs_accel_ops_t *kvs_accel_get(void) {
  return atomic_load_explicit(&accel_cur, memory_order_acquire);
}
int kvs_accel_set(const kvs_accel_ops_t *ops, const kvs_accel_ops_t **prev) {
  if (!ops) ops = &accel_memcpy;
  if (!ops->copy || !ops->pin || !ops->unpin || !ops->open_ipc || !ops->close_ipc) return -EINVAL;
  const kvs_accel_ops_t *old = atomic_exchange_explicit(&accel_cur, ops, memory_order_acq_rel);
  if (prev) *prev = old;
  return 0;
}
