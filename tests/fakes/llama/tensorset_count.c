/* tests/fakes/llama: libtensorset_count.so, built only for tensor_set.py. LD_PRELOADed into a
 * fake host, it interposes ggml_backend_tensor_set as kvshim will (libfakellama calls it through
 * its PLT: the preloaded definition comes first in the global scope, also when the host
 * dlopen()s libfakellama RTLD_LOCAL), counts the calls and their bytes, forwards each call to
 * the next definition (libfakeggml's), and at exit prints on stderr
 *     tensorset calls=C bytes=B
 * Test knobs: TENSORSET_PAST_END=1 forwards every write moved to end one byte past its tensor
 * (offset nbytes - size + 1), to see libfakeggml's bounds check abort; TENSORSET_FLIP_LAST=1
 * forwards a copy of the bytes with the last one inverted, to see that the engine's KV is what
 * the calls wrote, not what it read from the state on the side. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakeggml.h"

typedef void tensor_set_fn(struct ggml_tensor *, const void *, size_t, size_t);

/* The definition this one hides: the next in the global scope, or, when the host dlopen()ed
 * libfakellama RTLD_LOCAL (libfakeggml then is outside the global scope, as libggml-base is
 * when Node loads an addon), libfakeggml's own, found by its soname among the loaded objects. */
static tensor_set_fn *next_tensor_set(void) {
  void *f = dlsym(RTLD_NEXT, "ggml_backend_tensor_set");
  if (!f) {
    void *lib = dlopen("libfakeggml.so", RTLD_LAZY | RTLD_NOLOAD);
    if (lib) f = dlsym(lib, "ggml_backend_tensor_set");
  }
  return (tensor_set_fn *)f;
}

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long g_calls, g_bytes; /* under g_lock */

void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data, size_t offset,
                             size_t size) {
  static tensor_set_fn *next;
  pthread_mutex_lock(&g_lock);
  if (!next) next = next_tensor_set();
  g_calls++;
  g_bytes += size;
  tensor_set_fn *forward = next;
  pthread_mutex_unlock(&g_lock);
  if (!forward) {
    fprintf(stderr, "tensorset: no ggml_backend_tensor_set after this library\n");
    abort();
  }
  const char *past = getenv("TENSORSET_PAST_END"), *flip = getenv("TENSORSET_FLIP_LAST");
  if (past && past[0] == '1' && tensor && size <= tensor->nbytes)
    offset = tensor->nbytes - size + 1;
  unsigned char *copy = NULL;
  if (flip && flip[0] == '1' && size > 0 && (copy = malloc(size)) != NULL) {
    memcpy(copy, data, size);
    copy[size - 1] ^= 0xff;
    data = copy;
  }
  forward(tensor, data, offset, size);
  free(copy);
}

__attribute__((destructor)) static void report(void) {
  pthread_mutex_lock(&g_lock);
  fprintf(stderr, "tensorset calls=%llu bytes=%llu\n", g_calls, g_bytes);
  pthread_mutex_unlock(&g_lock);
}
