/* threads.h: a test body run on its own thread, for the Criterion tests that race a call against
 * the main thread (workers on a pool or a registry, a prefault, a call to a server being killed).
 * One tt_thread_t per thread: what the body works on, a per-thread number, what it returned and
 * when. Criterion asserts stay on the main thread: a body returns its result (0, a negative errno
 * or a failure count) and the test checks `rc` after tt_join. */
#ifndef KVS_TESTS_THREADS_H
#define KVS_TESTS_THREADS_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

typedef struct tt_thread tt_thread_t;
typedef int (*tt_body_fn)(tt_thread_t *t);

struct tt_thread {
  tt_body_fn body;
  void *obj;        /* what the body works on (a pool, a registry, peers); not owned */
  const void *data; /* more input for the body, or NULL; not owned */
  uint64_t arg;     /* a per-thread number: a seed, a worker id, a byte count */
  int rc;           /* 1 until the body returns, then what it returned (read it after tt_join,
                     * or atomically before) */
  uint64_t done_ms; /* CLOCK_MONOTONIC ms when the body returned */
  pthread_t th;
};

static void *tt_main(void *v) {
  tt_thread_t *t = v;
  __atomic_store_n(&t->rc, t->body(t), __ATOMIC_SEQ_CST);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  t->done_ms = (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
  return NULL;
}

/* Starts body(t) on a new thread; 0 or pthread_create's error. t must outlive tt_join. */
static inline int tt_start(tt_thread_t *t, tt_body_fn body, void *obj, const void *data,
                           uint64_t arg) {
  *t = (tt_thread_t){.body = body, .obj = obj, .data = data, .arg = arg, .rc = 1};
  return pthread_create(&t->th, NULL, tt_main, t);
}

/* Waits for the body to return; its result is then in t->rc. */
static inline void tt_join(tt_thread_t *t) { pthread_join(t->th, NULL); }

#endif
