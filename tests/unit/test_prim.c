/* Unit tests of core/prim (the platform layer for memory): each call's success and its
 * failure as a negative errno with nothing left behind. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prim.h"

Test(prim, alloc_is_zeroed_writable_and_unmapped, .timeout = 30) {
  void *p = NULL;
  cr_assert_eq(kvs__prim_alloc(1 << 20, &p), 0);
  cr_assert_not_null(p);
  unsigned char *b = p;
  cr_assert_eq(b[0], 0);
  cr_assert_eq(b[(1 << 20) - 1], 0);
  b[12345] = 7;
  cr_assert_eq(kvs__prim_populate(p, 1 << 20, true) == 0 ||
                   kvs__prim_populate(p, 1 << 20, true) == -EINVAL,
               1, "populate: 0, or -EINVAL before Linux 5.14");
  cr_assert_eq(b[12345], 7, "populate keeps the contents");
  kvs__prim_unmap(p, 1 << 20);
  kvs__prim_unmap(NULL, 4096); /* accepted */
  void *q = (void *)0x1;
  cr_assert_eq(kvs__prim_alloc((size_t)1 << 62, &q), -ENOMEM);
  cr_assert_eq(q, (void *)0x1, "out-parameter untouched on failure");
}

Test(prim, memfd_has_its_size_seals_and_maps_shared, .timeout = 30) {
  int fd = kvs__prim_memfd("kvshim-test", 3 * 4096, false);
  cr_assert_geq(fd, 0);
  struct stat st;
  cr_assert_eq(fstat(fd, &st), 0);
  cr_assert_eq(st.st_size, 3 * 4096);
  cr_assert_eq(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  int seals = fcntl(fd, F_GET_SEALS);
  cr_assert(seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW));
  void *w = NULL, *r = NULL;
  cr_assert_eq(kvs__prim_map_shared(fd, 3 * 4096, true, &w), 0);
  cr_assert_eq(kvs__prim_map_shared(fd, 3 * 4096, false, &r), 0);
  memcpy((char *)w + 8192, "kvshim", 7);
  cr_assert_str_eq((const char *)r + 8192, "kvshim", "one object, two mappings");
  kvs__prim_unmap(w, 3 * 4096);
  kvs__prim_unmap(r, 3 * 4096);
  close(fd);
  cr_assert_eq(kvs__prim_map_shared(-1, 4096, true, &w), -EBADF);
}

Test(prim, shm_create_is_exclusive_and_leaves_nothing_on_failure, .timeout = 30) {
  char name[64];
  snprintf(name, sizeof name, "/kvshim-prim-test-%d", (int)getpid());
  int fd = kvs__prim_shm_create(name, 8192);
  cr_assert_geq(fd, 0);
  struct stat st;
  cr_assert_eq(fstat(fd, &st), 0);
  cr_assert_eq(st.st_size, 8192);
  cr_assert_eq(kvs__prim_shm_create(name, 8192), -EEXIST);
  close(fd);
  kvs__prim_shm_unlink(name);
  kvs__prim_shm_unlink(NULL); /* accepted */
  /* Gone: the same name can be created again. */
  fd = kvs__prim_shm_create(name, 4096);
  cr_assert_geq(fd, 0);
  close(fd);
  kvs__prim_shm_unlink(name);
  cr_assert_eq(kvs__prim_shm_create("/no/such/dir/x", 4096), -EINVAL);
}
