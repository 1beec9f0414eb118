/* kvshim prim: memory from the OS (prim.h). Linux. */
#include "prim.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004u
#endif
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21u << 26)
#endif

int kvs__prim_alloc(size_t len, void **out) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return -errno;
  *out = p;
  return 0;
}

void kvs__prim_hugepage_hint(void *p, size_t len) {
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = (uintptr_t)2 << 20;
  uintptr_t from = ((uintptr_t)p + huge - 1) & ~(huge - 1);
  uintptr_t to = ((uintptr_t)p + len) & ~(huge - 1);
  if (to > from) (void)madvise((void *)from, to - from, MADV_HUGEPAGE);
#else
  (void)p;
  (void)len;
#endif
}

int kvs__prim_map_shared(int fd, size_t len, bool writable, void **out) {
  void *p = mmap(NULL, len, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -errno;
  *out = p;
  return 0;
}

void kvs__prim_unmap(void *p, size_t len) {
  if (p && len) munmap(p, len);
}

int kvs__prim_memfd(const char *name, uint64_t size, bool huge) {
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  if (huge) flags |= MFD_HUGETLB | MFD_HUGE_2MB;
  int fd = memfd_create(name, flags);
  if (fd < 0) return -errno;
  /* design §14: kvshim's segments are 0600 (a memfd is born 0777, and /proc/<pid>/fd shows it
   * so to anyone who can look). */
  if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)size) != 0) {
    int rc = -errno;
    close(fd);
    return rc;
  }
  /* Sealing is best effort: the size is an ABI, but a kernel may refuse seals. */
  (void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return fd;
}

int kvs__prim_shm_create(const char *name, uint64_t size) {
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return -errno;
  if (ftruncate(fd, (off_t)size) != 0) {
    int rc = -errno;
    close(fd);
    shm_unlink(name);
    return rc;
  }
  return fd;
}

void kvs__prim_shm_unlink(const char *name) {
  if (name) shm_unlink(name);
}

int kvs__prim_allocate(int fd, uint64_t off, uint64_t len) {
  if (off > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX - off) return -EINVAL;
  return fallocate(fd, 0, (off_t)off, (off_t)len) == 0 ? 0 : -errno;
}

void kvs__prim_thread_background(void) {
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19); /* this thread only (Linux) */
}

pid_t kvs__prim_thread_id(void) { return (pid_t)syscall(SYS_gettid); }

int kvs__prim_thread_get_nice(int *out) {
  errno = 0;
  int prio = getpriority(PRIO_PROCESS, 0); /* Linux: this thread's */
  if (prio == -1 && errno != 0) return -errno;
  *out = prio;
  return 0;
}

int kvs__prim_thread_set_nice(pid_t tid, int nice) {
  return setpriority(PRIO_PROCESS, (id_t)tid, nice) == 0 ? 0 : -errno;
}

int kvs__prim_thread_start(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *),
                           void *arg) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(thread, attr, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return -rc;
}

int kvs__prim_populate(void *p, size_t len, bool write) {
  return madvise(p, len, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0 ? 0 : -errno;
}
