/* LD_PRELOAD probe for the inspect tests: defines one hook of each family used by the
 * fixtures and the reference engine. Each writes "probe:<name>" to stderr when called (the
 * empirical "was it interposed?"), then forwards to the next definition when there is one. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <kvshim/kvo.h>

#define PROBE_API __attribute__((visibility("default")))

static void hit(const char *name) {
  char line[96];
  size_t n = strlen(name);
  if (n > sizeof line - 8) n = sizeof line - 8;
  memcpy(line, "probe:", 6);
  memcpy(line + 6, name, n);
  line[6 + n] = '\n';
  ssize_t w = write(2, line, n + 7);
  (void)w;
}

static void *next(const char *name) { return dlsym(RTLD_NEXT, name); }

PROBE_API int llama_decode(void *ctx, int n) {
  hit("llama_decode");
  int (*real)(void *, int);
  *(void **)&real = next("llama_decode");
  return real ? real(ctx, n) : -1;
}

PROBE_API int llama_state_seq_save_file(void *ctx, int n) {
  hit("llama_state_seq_save_file");
  int (*real)(void *, int);
  *(void **)&real = next("llama_state_seq_save_file");
  return real ? real(ctx, n) : -1;
}

PROBE_API int kvo_lookup(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens) {
  hit("kvo_lookup");
  kvo_lookup_fn real;
  *(void **)&real = next("kvo_lookup");
  return real ? real(desc, tokens, n_tokens) : -ENOSYS;
}

typedef unsigned long long probe_devptr;
PROBE_API int cuMemAlloc_v2(probe_devptr *p, size_t bytes) {
  hit("cuMemAlloc_v2");
  int (*real)(probe_devptr *, size_t);
  *(void **)&real = next("cuMemAlloc_v2");
  return real ? real(p, bytes) : 2 /* CUDA_ERROR_OUT_OF_MEMORY */;
}
