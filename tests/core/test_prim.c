/* Unit tests of core/prim (the platform layer for memory): each call's success and its
 * failure as a negative errno with nothing left behind. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "prim.h"

static void *background_probe(void *arg) {
  kvs__prim_thread_background();
  errno = 0;
  int nice = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
  *(int *)arg = errno ? -100 : nice;
  return NULL;
}

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

Test(prim, allocate_fills_the_file_without_a_mapping_and_keeps_contents, .timeout = 30) {
  int fd = kvs__prim_memfd("kvshim-test", 64 * 4096, false);
  cr_assert_geq(fd, 0);
  cr_assert_eq(pwrite(fd, "kvshim", 7, 4096), 7);
  struct stat st;
  cr_assert_eq(fstat(fd, &st), 0);
  blkcnt_t before = st.st_blocks;
  cr_assert_eq(kvs__prim_allocate(fd, 0, 64 * 4096), 0);
  cr_assert_eq(fstat(fd, &st), 0);
  cr_assert_geq(st.st_blocks * 512, before * 512 + 63 * 4096, "every page allocated");
  cr_assert_eq(st.st_size, 64 * 4096, "the size is unchanged");
  char b[7] = {0};
  cr_assert_eq(pread(fd, b, 7, 4096), 7);
  cr_assert_str_eq(b, "kvshim", "allocation keeps what was written");
  /* bad input: past the sealed size, a read-only descriptor, an overflowing range */
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals >= 0 && (seals & F_SEAL_GROW))
    cr_assert_eq(kvs__prim_allocate(fd, 64 * 4096, 4096), -EPERM);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int ro = open(path, O_RDONLY | O_CLOEXEC);
  cr_assert_geq(ro, 0);
  cr_assert_eq(kvs__prim_allocate(ro, 0, 4096), -EBADF);
  close(ro);
  cr_assert_eq(kvs__prim_allocate(fd, UINT64_MAX - 10, 4096), -EINVAL);
  close(fd);
}

Test(prim, thread_background_lowers_only_the_caller, .timeout = 30) {
  errno = 0;
  int was = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
  cr_assert_eq(errno, 0);
  pthread_t t;
  int seen = -100;
  cr_assert_eq(pthread_create(&t, NULL, background_probe, &seen), 0);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(seen, 19, "the thread runs at nice 19");
  cr_assert_eq(getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid)), was, "the caller keeps its nice");
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
