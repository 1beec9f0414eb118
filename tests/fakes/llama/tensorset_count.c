/* tests/fakes/llama: libtensorset_count.so, built only for tensor_set.py. LD_PRELOADed into a
 * fake host, it interposes ggml_backend_tensor_set and ggml_backend_tensor_get as kvshim will
 * (libfakellama calls them through its PLT: the preloaded definitions come first in the global
 * scope, also when the host dlopen()s libfakellama RTLD_LOCAL), counts each one's calls and
 * bytes, forwards each call to the next definition (libfakeggml's), and at exit prints on
 * stderr
 *     tensorset calls=C bytes=B
 *     tensorget calls=C bytes=B
 * Test knobs: TENSORSET_PAST_END=1 forwards every write moved to end one byte past its tensor
 * (offset nbytes - size + 1), to see libfakeggml's bounds check abort; TENSORSET_FLIP_LAST=1
 * forwards a copy of the bytes with the last one inverted, to see that the engine's KV is what
 * the calls wrote, not what it read from the state on the side; TENSORGET_FLIP_LAST=1 inverts
 * the last byte each ggml_backend_tensor_get returned, to see that a saved state's tensor bytes
 * are what the calls read, not copied from the engine's KV on the side. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakeggml.h"

typedef void tensor_set_fn(struct ggml_tensor *, const void *, size_t, size_t);
typedef void tensor_get_fn(const struct ggml_tensor *, void *, size_t, size_t);

/* The definition of name this library hides: the next in the global scope, or, when the host
 * dlopen()ed libfakellama RTLD_LOCAL (libfakeggml then is outside the global scope, as
 * libggml-base is when Node loads an addon), libfakeggml's own, found by its soname among the
 * loaded objects. */
static void *next_def(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
  if (!f) {
    void *lib = dlopen("libfakeggml.so", RTLD_LAZY | RTLD_NOLOAD);
    if (lib) f = dlsym(lib, name);
  }
  if (!f) {
    fprintf(stderr, "tensorset: no %s after this library\n", name);
    abort();
  }
  return f;
}

/* One interposed entry point's counters: calls and bytes, under g_lock. */
typedef struct counter {
  const char *name;
  void *next; /* next_def(name), resolved at the first call */
  unsigned long long calls, bytes;
} counter_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static counter_t g_set = {"ggml_backend_tensor_set", NULL, 0, 0};
static counter_t g_get = {"ggml_backend_tensor_get", NULL, 0, 0};

/* Counts one call of size bytes; the definition to forward it to. */
static void *count(counter_t *c, size_t size) {
  pthread_mutex_lock(&g_lock);
  if (!c->next) c->next = next_def(c->name);
  c->calls++;
  c->bytes += size;
  void *next = c->next;
  pthread_mutex_unlock(&g_lock);
  return next;
}

static bool knob(const char *name) {
  const char *e = getenv(name);
  return e && e[0] == '1';
}

void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data, size_t offset,
                             size_t size) {
  tensor_set_fn *forward = (tensor_set_fn *)count(&g_set, size);
  if (knob("TENSORSET_PAST_END") && tensor && size <= tensor->nbytes)
    offset = tensor->nbytes - size + 1;
  unsigned char *copy = NULL;
  if (knob("TENSORSET_FLIP_LAST") && size > 0 && (copy = malloc(size)) != NULL) {
    memcpy(copy, data, size);
    copy[size - 1] ^= 0xff;
    data = copy;
  }
  forward(tensor, data, offset, size);
  free(copy);
}

void ggml_backend_tensor_get(const struct ggml_tensor *tensor, void *data, size_t offset,
                             size_t size) {
  tensor_get_fn *forward = (tensor_get_fn *)count(&g_get, size);
  forward(tensor, data, offset, size);
  if (knob("TENSORGET_FLIP_LAST") && size > 0) ((unsigned char *)data)[size - 1] ^= 0xff;
}

__attribute__((destructor)) static void report(void) {
  pthread_mutex_lock(&g_lock);
  fprintf(stderr, "tensorset calls=%llu bytes=%llu\n", g_set.calls, g_set.bytes);
  fprintf(stderr, "tensorget calls=%llu bytes=%llu\n", g_get.calls, g_get.bytes);
  pthread_mutex_unlock(&g_lock);
}
