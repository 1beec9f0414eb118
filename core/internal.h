/* kvshim core: cross-file internals (the kvs__ tier), grouped by the file that defines them.
 * Nothing here is installed or exported. Public component APIs live in <component>.h. */
#ifndef KVSHIM_CORE_INTERNAL_H
#define KVSHIM_CORE_INTERNAL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define kvs__likely(x)   __builtin_expect(!!(x), 1)
#define kvs__unlikely(x) __builtin_expect(!!(x), 0)
#define KVS__ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define KVS__ALIGN_UP(x, a) (((x) + ((a) - 1)) & ~((__typeof__(x))(a) - 1))

/* Propagate a negative errno in one line: KVS_TRY(kvs_pool_alloc(...)); */
#define KVS_TRY(expr)                                                                         \
  do {                                                                                        \
    int kvs__rc_ = (expr);                                                                    \
    if (kvs__unlikely(kvs__rc_ < 0)) return kvs__rc_;                                         \
  } while (0)

/* ---- prim: time (CLOCK_MONOTONIC through the vDSO: no syscall on the hot path) ---------- */
static inline uint64_t kvs__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline uint64_t kvs__now_ms(void) { return kvs__now_ns() / 1000000ull; }
/* ms from now on CLOCK_REALTIME: the absolute deadline pthread_cond_timedwait takes. */
static inline struct timespec kvs__realtime_after_ms(uint64_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t ns = (uint64_t)ts.tv_nsec + ms * 1000000ull;
  ts.tv_sec += (time_t)(ns / 1000000000ull);
  ts.tv_nsec = (long)(ns % 1000000000ull);
  return ts;
}

/* ---- worker queues: a FIFO of structs linked through their `next` member, head to tail (both
 * NULL when empty), under the lock of the struct that holds it (held for each of these) ---- */
/* Append node. */
#define KVS__FIFO_PUSH(head, tail, node)                                                      \
  do {                                                                                        \
    (node)->next = NULL;                                                                      \
    if (tail) (tail)->next = (node);                                                          \
    else (head) = (node);                                                                     \
    (tail) = (node);                                                                          \
  } while (0)
/* Take the first node off: it, or NULL when the queue is empty. */
#define KVS__FIFO_POP(head, tail)                                                             \
  __extension__({                                                                             \
    __typeof__(head) kvs__node_ = (head);                                                     \
    if (kvs__node_ && !((head) = kvs__node_->next)) (tail) = NULL;                            \
    kvs__node_;                                                                               \
  })
/* A worker's wait: sleep on cond (lock held) until the queue has a node or stop is set, then
 * take the first node off: it, or NULL when stopped with nothing queued (the worker ends). */
#define KVS__FIFO_WAIT_POP(head, tail, stop, cond, lock)                                      \
  __extension__({                                                                             \
    while (!(stop) && !(head)) pthread_cond_wait((cond), (lock));                             \
    KVS__FIFO_POP(head, tail);                                                                \
  })

/* ---- ASan: poison free pool extents so stray accesses are caught (no-ops otherwise) ------ */
#if defined(KVSHIM_ASAN) || defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define kvs__poison(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define kvs__unpoison(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define kvs__poison(p, n)   ((void)(p), (void)(n))
#define kvs__unpoison(p, n) ((void)(p), (void)(n))
#endif

/* ---- debug builds: whole-structure validators run after each mutation ------------------- */
#ifdef KVSHIM_DEBUG
#define KVS__DEBUG_CHECK(cond) ((cond) ? (void)0 : kvs__debug_fail(#cond, __FILE__, __LINE__))
#else
#define KVS__DEBUG_CHECK(cond) ((void)0)
#endif
/* Free a destroyed struct of size bytes (its members already released); debug builds poison it
 * first (0xdd), so a use after destroy reads garbage, not plausible values. NULL: nothing. */
static inline void kvs__free_poisoned(void *p, size_t size) {
#ifdef KVSHIM_DEBUG
  if (p) memset(p, 0xdd, size);
#else
  (void)size;
#endif
  free(p);
}
/* log.c: reports a failed validator and aborts (debug builds only; never in release). */
_Noreturn void kvs__debug_fail(const char *what, const char *file, int line);

/* ---- options.c: parsers shared with tools (return 0 or -EINVAL, write *out on success) -- */
int kvs__parse_size(const char *s, uint64_t *out);
int kvs__parse_bool(const char *s, int *out);

/* Little-endian fixed-width fields of the on-disk and remote value formats (disk_format.c,
 * remote.c), byte by byte: no alignment, any host. */
static inline void kvs__put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static inline void kvs__put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvs__put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t kvs__get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t kvs__get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static inline uint64_t kvs__get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

#endif
