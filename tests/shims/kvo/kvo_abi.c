/* kvo_abi: a tiny "engine" that calls the kvo ABI directly (linked against the reference
 * module libkvo_default.so, which caches nothing by default), run by kvo_test.py with
 * libkvshim.so preloaded or not.
 *
 * usage: kvo_abi on|off
 *   on   kvshim serves the calls (preloaded, KVSHIM_ENABLE=1, peers off): stores are kept
 *        although the module keeps nothing, and come back byte for byte
 *   off  the module's own answers (no preload, or KVSHIM_ENABLE=0)
 * Both modes check that invalid arguments get exactly the module's errors (kvshim passes them
 * through) and that an invalid call changes nothing. Prints "ok" and exits 0, or prints the
 * first failed check and exits 1. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvshim/kvo.h>

static int failures;

#define CHECK(cond, ...)                                                                      \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "kvo_abi:%d: check failed: %s: ", __LINE__, #cond);                    \
      fprintf(stderr, __VA_ARGS__);                                                           \
      fputc('\n', stderr);                                                                    \
      failures++;                                                                             \
    }                                                                                         \
  } while (0)

#define C 4u /* tokens per chunk */

static kvo_desc_t make_desc(const char *model, uint32_t chunk_tokens) {
  kvo_desc_t d;
  memset(&d, 0, sizeof d);
  d.abi_version = KVO_ABI_VERSION;
  d.size = sizeof d;
  snprintf(d.model_id, sizeof d.model_id, "%s", model);
  d.dtype = KVO_DTYPE_F32;
  d.layers = 2;
  d.kv_heads = 1;
  d.head_dim = 8;
  d.chunk_tokens = chunk_tokens;
  d.rank = 0;
  d.world_size = 1;
  d.layout = KVO_LAYOUT_LKTHD;
  d.chunk_bytes = kvo_desc_chunk_bytes(&d);
  return d;
}

/* Deterministic chunk bytes for (sequence seed, chunk index). */
static void fill(unsigned char *buf, size_t len, uint32_t seed, size_t chunk) {
  uint32_t x = seed * 2654435761u + (uint32_t)chunk * 40503u + 1;
  for (size_t i = 0; i < len; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    buf[i] = (unsigned char)x;
  }
}

static uint64_t host(void *p) { return (uint64_t)(uintptr_t)p; }

/* Invalid arguments: the module's errors, unchanged, in both modes. */
static void check_bad_input(void) {
  kvo_desc_t good = make_desc("abi", C);
  uint32_t tokens[4 * C];
  for (uint32_t i = 0; i < 4 * C; i++) tokens[i] = 100 + i;
  unsigned char buf[4096];
  fill(buf, good.chunk_bytes, 7, 0);

  kvo_desc_t d;
  CHECK(kvo_lookup(NULL, tokens, 8) == -EINVAL, "NULL desc");
  d = good, d.abi_version = 2;
  CHECK(kvo_lookup(&d, tokens, 8) == -EPROTO, "abi version 2");
  CHECK(kvo_store_chunk(&d, tokens, 8, 0, KVO_BUF_HOST, host(buf), sizeof buf) == -EPROTO,
        "store, abi version 2");
  d = good, d.size = KVO_DESC_SIZE_V1 - 8;
  CHECK(kvo_lookup(&d, tokens, 8) == -EINVAL, "short size");
  d = good, memset(d.model_id, 'x', sizeof d.model_id);
  CHECK(kvo_lookup(&d, tokens, 8) == -EINVAL, "model id without NUL");
  d = good, d.layout = 1;
  CHECK(kvo_lookup(&d, tokens, 8) == -EINVAL, "unknown layout");
  d = good, d.dtype = 99;
  CHECK(kvo_lookup(&d, tokens, 8) == -EINVAL, "unknown dtype");
  d = good, d.rank = 1;
  CHECK(kvo_lookup(&d, tokens, 8) == -EINVAL, "rank >= world size");
  d = good, d.chunk_bytes += 1;
  CHECK(kvo_lookup(&d, tokens, 8) == -EINVAL, "wrong chunk_bytes");
  CHECK(kvo_store_chunk(&d, tokens, 8, 0, KVO_BUF_HOST, host(buf), sizeof buf) == -EINVAL,
        "store, wrong chunk_bytes");
  d = good, d.head_dim = 0, d.chunk_bytes = 0;
  CHECK(kvo_lookup(&d, tokens, 8) == -EINVAL, "zero head_dim");
  CHECK(kvo_lookup(&good, NULL, 8) == -EINVAL, "NULL tokens");
  CHECK(kvo_lookup(&good, NULL, 0) == 0, "no tokens: 0 chunks, got %d", kvo_lookup(&good, NULL, 0));
  CHECK(kvo_lookup(&good, tokens, C - 1) == 0, "no full chunk");

  /* load and store argument rules */
  int (*const fns[2])(const kvo_desc_t *, const uint32_t *, size_t, size_t, int, uint64_t,
                      size_t) = {kvo_load_chunk, kvo_store_chunk};
  for (int f = 0; f < 2; f++) {
    const char *name = f ? "store" : "load";
    CHECK(fns[f](&good, tokens, 2 * C, 0, KVO_BUF_HOST, host(buf), good.chunk_bytes - 1) ==
              -ENOBUFS, "%s: short buffer", name);
    CHECK(fns[f](&good, tokens, 2 * C - 1, 1, KVO_BUF_HOST, host(buf), sizeof buf) == -EINVAL,
          "%s: chunk not full", name);
    CHECK(fns[f](&good, tokens, 2 * C, 5, KVO_BUF_HOST, host(buf), sizeof buf) == -EINVAL,
          "%s: chunk index past the tokens", name);
    CHECK(fns[f](&good, tokens, 2 * C, SIZE_MAX, KVO_BUF_HOST, host(buf), sizeof buf) ==
              -EINVAL, "%s: chunk index SIZE_MAX", name);
    CHECK(fns[f](&good, tokens, 2 * C, 0, 7, host(buf), sizeof buf) == -EINVAL,
          "%s: unknown buffer kind", name);
    CHECK(fns[f](&good, tokens, 2 * C, 0, KVO_BUF_HOST, 0, sizeof buf) == -EINVAL,
          "%s: NULL buffer", name);
    CHECK(fns[f](&good, NULL, 2 * C, 0, KVO_BUF_HOST, host(buf), sizeof buf) == -EINVAL,
          "%s: NULL tokens", name);
    CHECK(fns[f](NULL, tokens, 2 * C, 0, KVO_BUF_HOST, host(buf), sizeof buf) == -EINVAL,
          "%s: NULL desc", name);
  }
  /* Nothing of the above was kept. */
  CHECK(kvo_lookup(&good, tokens, 4 * C) == 0, "invalid calls stored something: %d",
        kvo_lookup(&good, tokens, 4 * C));
}

/* Chunks stored through kvshim come back byte for byte; other prefixes, models, ranks and
 * layouts are separate namespaces. */
static void check_roundtrip(bool on) {
  kvo_desc_t d = make_desc("abi", C);
  const size_t n_chunks = 4;
  uint32_t tokens[4 * C + 2], other[4 * C + 2];
  for (uint32_t i = 0; i < 4 * C + 2; i++) tokens[i] = 1000 + i * 7, other[i] = tokens[i];
  other[0] ^= 1; /* same later tokens after a different first chunk */
  unsigned char in[1024], out[1024];
  for (size_t i = 0; i < n_chunks; i++) {
    fill(in, d.chunk_bytes, 1, i);
    int rc = kvo_store_chunk(&d, tokens, 4 * C + 2, i, KVO_BUF_HOST, host(in), sizeof in);
    CHECK(rc == (on ? KVO_OK : KVO_NOT_KEPT), "store chunk %zu: %d", i, rc);
  }
  int run = kvo_lookup(&d, tokens, 4 * C + 2);
  CHECK(run == (on ? 4 : 0), "lookup after stores: %d", run);
  CHECK(kvo_lookup(&d, tokens, 3 * C + 1) == (on ? 3 : 0), "lookup of a shorter prefix");
  for (size_t i = 0; i < n_chunks; i++) {
    memset(out, 0xee, sizeof out);
    /* n_tokens may exceed the chunk's prefix: the rest is ignored */
    int rc = kvo_load_chunk(&d, tokens, (i + 1) * C + (i & 1), i, KVO_BUF_HOST, host(out),
                            sizeof out);
    CHECK(rc == (on ? KVO_OK : KVO_MISS), "load chunk %zu: %d", i, rc);
    fill(in, d.chunk_bytes, 1, i);
    if (on && rc == KVO_OK)
      CHECK(memcmp(in, out, d.chunk_bytes) == 0, "chunk %zu bytes differ", i);
    if (on) CHECK(out[d.chunk_bytes] == 0xee, "wrote past chunk_bytes");
  }
  /* Storing a chunk that is present is kept (nothing to write). */
  fill(in, d.chunk_bytes, 1, 0);
  CHECK(kvo_store_chunk(&d, tokens, C, 0, KVO_BUF_HOST, host(in), sizeof in) ==
            (on ? KVO_OK : KVO_NOT_KEPT), "store of a present chunk");

  CHECK(kvo_lookup(&d, other, 4 * C + 2) == 0, "another first chunk shares keys");
  CHECK(kvo_load_chunk(&d, other, 4 * C, 3, KVO_BUF_HOST, host(out), sizeof out) == KVO_MISS,
        "another prefix loads a chunk");
  kvo_desc_t m = make_desc("abi-2", C);
  CHECK(kvo_lookup(&m, tokens, 4 * C) == 0, "another model id shares keys");
  kvo_desc_t r = make_desc("abi", C);
  r.world_size = 2, r.rank = 1;
  CHECK(kvo_lookup(&r, tokens, 4 * C) == 0, "another rank shares keys");
  kvo_desc_t t = make_desc("abi", 2 * C);
  CHECK(kvo_lookup(&t, tokens, 4 * C) == 0, "another chunk size shares keys");
  kvo_desc_t h = make_desc("abi", C);
  h.dtype = KVO_DTYPE_F16, h.chunk_bytes = kvo_desc_chunk_bytes(&h);
  CHECK(kvo_lookup(&h, tokens, 4 * C) == 0, "another dtype shares keys");

  /* A device buffer while no accelerator copy is installed (this program never touches CUDA):
   * kvshim must not dereference it, only pass the call to the module. */
  uint64_t bogus_device = 0x1000;
  int rc = kvo_load_chunk(&d, tokens, 4 * C, 0, KVO_BUF_DEVICE, bogus_device, d.chunk_bytes);
  CHECK(rc == KVO_MISS, "device load without an accelerator: %d", rc);
  uint32_t fresh[C];
  for (uint32_t i = 0; i < C; i++) fresh[i] = 5000 + i;
  rc = kvo_store_chunk(&d, fresh, C, 0, KVO_BUF_DEVICE, bogus_device, d.chunk_bytes);
  CHECK(rc == KVO_NOT_KEPT, "device store without an accelerator: %d", rc);
  CHECK(kvo_lookup(&d, fresh, C) == 0, "device store was kept");
}

/* More chunks than one key batch of the shim (256): runs cross batch boundaries. */
static void check_long(bool on) {
  kvo_desc_t d = make_desc("abi-long", 1);
  enum { N = 600 };
  static uint32_t tokens[N];
  for (uint32_t i = 0; i < N; i++) tokens[i] = i * 31 + 3;
  unsigned char buf[256];
  for (size_t i = 0; i < 520; i++) {
    fill(buf, d.chunk_bytes, 3, i);
    int rc = kvo_store_chunk(&d, tokens, N, i, KVO_BUF_HOST, host(buf), sizeof buf);
    CHECK(rc == (on ? KVO_OK : KVO_NOT_KEPT), "long store %zu: %d", i, rc);
  }
  int run = kvo_lookup(&d, tokens, N);
  CHECK(run == (on ? 520 : 0), "long lookup: %d", run);
  if (on) {
    memset(buf, 0, sizeof buf);
    CHECK(kvo_load_chunk(&d, tokens, N, 519, KVO_BUF_HOST, host(buf), sizeof buf) == KVO_OK,
          "load of chunk 519");
    unsigned char want[256];
    fill(want, d.chunk_bytes, 3, 519);
    CHECK(memcmp(buf, want, d.chunk_bytes) == 0, "chunk 519 bytes");
  }
}

/* Concurrent stores and loads of shared and private chunks. */
typedef struct worker {
  int id;
  bool on;
  int errors;
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  kvo_desc_t d = make_desc("abi-threads", C);
  uint32_t tokens[8 * C];
  unsigned char in[1024], out[1024];
  for (int iter = 0; iter < 50; iter++) {
    /* chunks 0..3 shared by every thread, 4..7 private to (thread, iteration). A shared
     * chunk another thread is writing right now may be declined (KVO_NOT_KEPT) or missed. */
    for (uint32_t i = 0; i < 8 * C; i++)
      tokens[i] = i < 4 * C ? i : 1000000u * (uint32_t)(w->id + 1) + (uint32_t)iter * 100 + i;
    for (size_t c = 0; c < 8; c++) {
      uint32_t seed = c < 4 ? 9 : (uint32_t)(w->id * 1000 + iter);
      fill(in, d.chunk_bytes, seed, c);
      int rc = kvo_store_chunk(&d, tokens, 8 * C, c, KVO_BUF_HOST, host(in), sizeof in);
      bool ok = w->on ? rc == KVO_OK || (c < 4 && rc == KVO_NOT_KEPT) : rc == KVO_NOT_KEPT;
      if (!ok) w->errors++;
    }
    int run = kvo_lookup(&d, tokens, 8 * C);
    if (run < 0 || run > 8 || (!w->on && run != 0)) w->errors++;
    for (size_t c = 0; w->on && c < 8; c++) {
      uint32_t seed = c < 4 ? 9 : (uint32_t)(w->id * 1000 + iter);
      fill(in, d.chunk_bytes, seed, c);
      int rc = kvo_load_chunk(&d, tokens, 8 * C, c, KVO_BUF_HOST, host(out), sizeof out);
      if (rc == KVO_OK ? memcmp(in, out, d.chunk_bytes) != 0 : (c >= 4 || rc != KVO_MISS))
        w->errors++;
    }
  }
  return NULL;
}

static void check_threads(bool on) {
  enum { T = 4 };
  pthread_t th[T];
  worker_t w[T];
  for (int i = 0; i < T; i++) {
    w[i] = (worker_t){.id = i, .on = on};
    CHECK(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    CHECK(w[i].errors == 0, "thread %d: %d wrong answers", i, w[i].errors);
  }
  /* Every store has finished: the shared prefix and thread 0's last private chunks. */
  kvo_desc_t d = make_desc("abi-threads", C);
  uint32_t tokens[8 * C];
  for (uint32_t i = 0; i < 8 * C; i++) tokens[i] = i < 4 * C ? i : 1000000u + 49 * 100 + i;
  int run = kvo_lookup(&d, tokens, 8 * C);
  CHECK(run == (on ? 8 : 0), "lookup after the threads: %d", run);
}

/* dlsym(module handle, "kvo_...") reaches kvshim when it is on, the module when it is off. */
static void check_dlsym(bool on) {
  void *h = dlopen("libkvo_default.so", RTLD_LAZY | RTLD_NOLOAD);
  CHECK(h != NULL, "libkvo_default.so is not loaded: %s", dlerror());
  if (!h) return;
  static const char *const names[] = {"kvo_lookup", "kvo_load_chunk", "kvo_store_chunk"};
  for (size_t i = 0; i < 3; i++) {
    void *p = dlsym(h, names[i]);
    Dl_info info;
    CHECK(p && dladdr(p, &info) && info.dli_fname, "dlsym(%s)", names[i]);
    if (!p || !dladdr(p, &info) || !info.dli_fname) continue;
    bool in_kvshim = strstr(info.dli_fname, "libkvshim") != NULL;
    CHECK(in_kvshim == on, "dlsym(module, %s) resolved into %s", names[i], info.dli_fname);
  }
  dlclose(h);
}

int main(int argc, char **argv) {
  if (argc != 2 || (strcmp(argv[1], "on") != 0 && strcmp(argv[1], "off") != 0)) {
    fprintf(stderr, "usage: kvo_abi on|off\n");
    return 2;
  }
  bool on = strcmp(argv[1], "on") == 0;
  check_bad_input();
  check_roundtrip(on);
  check_long(on);
  check_threads(on);
  check_dlsym(on);
  if (failures) {
    fprintf(stderr, "kvo_abi %s: %d checks failed\n", argv[1], failures);
    return 1;
  }
  puts("ok");
  return 0;
}
