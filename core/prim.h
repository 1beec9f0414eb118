/* kvshim prim: the thin platform layer through which kvshim reaches the OS for memory (design
 * §2: "core reaches the OS through a thin platform layer", as mimalloc's src/prim does).
 * Every mmap, munmap, memfd_create, shm_open and madvise of the library is here; nothing else
 * includes <sys/mman.h>. So are the thread primitives every kvshim thread starts with (a full
 * signal mask, a background priority). Internal (the kvs__ tier); functions return 0 / a file descriptor or a
 * negative errno, and write out-parameters only on success. */
#ifndef KVSHIM_CORE_PRIM_H
#define KVSHIM_CORE_PRIM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* len bytes of private, zero-filled memory, backed lazily (no swap reservation: untouched
 * pages cost nothing). Released with kvs__prim_unmap. */
int kvs__prim_alloc(size_t len, void **out);
/* Ask for transparent huge pages (MADV_HUGEPAGE) over the 2 MiB-aligned part of [p, p + len):
 * a table read at random then costs one TLB entry per 2 MiB instead of per 4 KiB. Best effort
 * (a kernel without THP, or with THP off, ignores it); untouched memory still costs nothing,
 * touched memory is backed 2 MiB at a time. */
void kvs__prim_hugepage_hint(void *p, size_t len);
/* Map the first len bytes of fd shared, read-write or read-only. */
int kvs__prim_map_shared(int fd, size_t len, bool writable, void **out);
/* Unmap what kvs__prim_alloc or kvs__prim_map_shared returned (NULL or len 0: nothing). */
void kvs__prim_unmap(void *p, size_t len);

/* An anonymous memory file (memfd, close-on-exec) of size bytes, in 2 MiB huge pages when huge,
 * sealed against growing and shrinking when the kernel allows (best effort). Returns the fd. */
int kvs__prim_memfd(const char *name, uint64_t size, bool huge);
/* A new POSIX shared memory object /name (O_EXCL, mode 0600) of size bytes. Returns the fd; on
 * failure nothing is left behind. */
int kvs__prim_shm_create(const char *name, uint64_t size);
void kvs__prim_shm_unlink(const char *name);

/* Populate the page tables of [p, p + len) (MADV_POPULATE_WRITE when write, else _READ), as
 * the faults of touching each page would. -EINVAL: the kernel predates them (5.14); -EINTR and
 * -EAGAIN: retry; any other negative errno: a real failure. */
int kvs__prim_populate(void *p, size_t len, bool write);

/* Allocate the pages of [off, off + len) of a shared-memory file (fallocate mode 0: contents
 * kept, holes filled with zeroed pages) without mapping them: no page table and no mmap lock is
 * involved, and a full tmpfs or memory cgroup answers -ENOSPC / -ENOMEM instead of the SIGBUS a
 * fault would get. -EOPNOTSUPP (or -EINVAL for an unaligned hugetlbfs range): not supported
 * there; -EINTR: retry. */
int kvs__prim_allocate(int fd, uint64_t off, uint64_t len);

/* Lower the calling thread to nice 19 (SCHED_OTHER), for work that must yield to the
 * engine's threads (prefault, keep-behind). Not SCHED_IDLE: a SCHED_IDLE thread can wait for
 * seconds on a busy machine, and one that waits inside a lock (the mmap lock of a populate)
 * holds up every thread that needs it. Best effort: a failure leaves the priority as it was. */
void kvs__prim_thread_background(void);

/* The calling thread's kernel id (gettid), for kvs__prim_thread_set_nice from another thread. */
pid_t kvs__prim_thread_id(void);
/* The calling thread's nice value (Linux: per thread). 0 or a negative errno. */
int kvs__prim_thread_get_nice(int *out);
/* Set thread tid's nice value: raising a background thread for a bounded exit wait (lowering a
 * nice value needs CAP_SYS_NICE or RLIMIT_NICE: -EACCES / -EPERM without, nothing changed).
 * 0 or a negative errno. */
int kvs__prim_thread_set_nice(pid_t tid, int nice);

/* pthread_create(thread, attr, fn, arg) with every signal blocked while it starts, so the new
 * thread inherits a full mask: kvshim's threads never take the engine's (or serve's) signals.
 * The caller's mask is restored. 0 or a negative errno. */
int kvs__prim_thread_start(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *),
                           void *arg);

#endif
