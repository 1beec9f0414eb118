/* core/accel: the accelerator copy/pin interface. The default table copies with memcpy in
 * every direction, pins as a no-op and opens no IPC handle; a table swaps in and out
 * atomically (one refused when an operation is missing), also from racing threads. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "accel.h"
#include "tensor.h"
#include "wire/tensor_fixture.h"

static int fake_copies;
static int fake_copy(void *dst, const void *src, size_t len, kvs_copy_dir_t dir) {
  fake_copies++;
  memset(dst, 0xcd, len); /* distinguishable from memcpy */
  return 0;
}
static int fake_pin(void *p, size_t n) { return -EIO; }
static int fake_unpin(void *p) { return -EIO; }
static int fake_open(const struct kvs_tensor_desc *d, void **dev) {
  *dev = (void *)0xd00d;
  return 0;
}
static int fake_close(void *dev) { return 0; }
static const kvs_accel_ops_t fake_ops = {"fake",    fake_copy,  fake_pin, fake_unpin,
                                         fake_open, fake_close, NULL};

Test(tensor, accel_default_copies_and_swaps, .timeout = 30) {
  const kvs_accel_ops_t *a = kvs_accel_get();
  cr_assert_eq(a, kvs_accel_default());
  cr_assert_str_eq(a->name, "memcpy");
  uint8_t src[300], dst[300];
  for (int i = 0; i < 300; i++) src[i] = (uint8_t)(i * 7);
  for (int dir = KVS_COPY_H2H; dir <= KVS_COPY_D2D; dir++) {
    memset(dst, 0, sizeof dst);
    cr_assert_eq(a->copy(dst, src, sizeof src, (kvs_copy_dir_t)dir), 0);
    cr_assert_eq(memcmp(dst, src, sizeof src), 0, "direction %d", dir);
  }
  memset(dst, 0, sizeof dst);
  cr_assert_eq(a->copy(dst, src, sizeof src, (kvs_copy_dir_t)4), -EINVAL);
  cr_assert_eq(a->copy(NULL, src, 1, KVS_COPY_H2H), -EINVAL);
  cr_assert_eq(a->copy(NULL, NULL, 0, KVS_COPY_H2H), 0);
  cr_assert_eq(dst[0], 0);
  cr_assert_eq(a->pin(dst, sizeof dst), 0);
  cr_assert_eq(a->unpin(dst), 0);
  void *dev = (void *)0x1;
  kvs_tensor_desc_t g = tf_ipc_desc(0);
  cr_assert_eq(a->open_ipc(&g, &dev), -ENOTSUP);
  cr_assert_eq(dev, (void *)0x1);

  const kvs_accel_ops_t *prev = NULL;
  cr_assert_eq(kvs_accel_set(&fake_ops, &prev), 0);
  cr_assert_eq(prev, kvs_accel_default());
  cr_assert_eq(kvs_accel_get(), &fake_ops);
  cr_assert_eq(kvs_accel_get()->copy(dst, src, 10, KVS_COPY_H2D), 0);
  cr_assert_eq(fake_copies, 1);
  cr_assert_eq(dst[0], 0xcd);
  cr_assert_eq(kvs_accel_get()->pin(dst, 1), -EIO);
  cr_assert_eq(kvs_accel_get()->open_ipc(&g, &dev), 0);
  cr_assert_eq(dev, (void *)0xd00d);

  kvs_accel_ops_t broken = fake_ops;
  broken.close_ipc = NULL;
  cr_assert_eq(kvs_accel_set(&broken, &prev), -EINVAL);
  cr_assert_eq(kvs_accel_get(), &fake_ops, "a refused table must not be installed");
  cr_assert_eq(kvs_accel_set(NULL, &prev), 0);
  cr_assert_eq(prev, &fake_ops);
  cr_assert_eq(kvs_accel_get(), kvs_accel_default());
}

static void *swap_thread(void *arg) {
  for (int i = 0; i < 20000; i++) {
    kvs_accel_set((i & 1) ? &fake_ops : NULL, NULL);
    const kvs_accel_ops_t *a = kvs_accel_get();
    if (a != &fake_ops && a != kvs_accel_default()) return (void *)1;
  }
  return NULL;
}

Test(tensor, accel_swap_from_threads, .timeout = 30) {
  pthread_t t[4];
  for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&t[i], NULL, swap_thread, NULL), 0);
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(t[i], &r);
    cr_assert_null(r, "saw a table that was never installed");
  }
}
