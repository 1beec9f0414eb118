/* tests/fakes/llama: fakehost, the "engine" of the llama shim tests. It dlopen()s the plugin
 * RTLD_LOCAL (as Node loads an addon), then runs the commands given as arguments, in order, on
 * a worker thread (engines call the state API from worker threads), printing one line per
 * command. The test driver (tests/shims/llama/llama_shim.py) runs the same commands with and
 * without LD_PRELOAD=libkvshim.so and compares the lines.
 *
 * usage: fakehost PLUGIN 'CMD ARGS...' ...
 * PLUGIN may also be libfakellama.so itself: then every function is looked up with dlsym on
 * its handle and called through the pointer, as ctypes-based engines (llama-cpp-python) do.
 * Commands (numbers are slots: models 0..7, contexts 0..7; each context/sequence keeps the
 * tokens the host believes it holds, from decode and from successful loads):
 *   mkmodel PATH NAME NLAYER NEMBD WEIGHT_KB SEED   write a fake GGUF model
 *   copy SRC DST                  copy a file, keeping its mtime
 *   setmtime PATH SECONDS         set a file's mtime (seconds since the epoch)
 *   model M PATH | freemodel M    llama_model_load_from_file / llama_model_free
 *   ctx C M [NSEQ [KVTYPE]]       llama_init_from_model
 *   decode C SEQ SPEC             append tokens: SPEC = A-B (inclusive) or rN@S (N pseudo-random)
 *   clear C SEQ                   empty a sequence
 *   save C SEQ PATH               llama_state_seq_save_file with the sequence's tokens
 *   load C SEQ PATH [CAP]         llama_state_seq_load_file (prints ret, n, token hash, check)
 *   loadcount C SEQ PATH          the same with tokens_out = NULL
 *   size C SEQ [FLAGS]            llama_state_seq_get_size (with FLAGS: the _ext variant)
 *   copyseq C SEQ C2 SEQ2 [FLAGS] get_size + get_data from one sequence, set_data into another
 *   savectx C SEQ PATH            llama_state_save_file (the tokens of SEQ)
 *   loadctx C SEQ PATH [CAP]      llama_state_load_file (tokens become SEQ's)
 *   check C SEQ                   does SEQ hold the KV of the tokens the host believes?
 *   rm PATH | exists PATH | touch PATH | waitfile PATH [SECONDS] | sleep MS
 *   rtld NAME                     dlsym(RTLD_NEXT) and dlsym(RTLD_DEFAULT) of NAME from here
 *   corrupt MODE                  change every kvshim llama blob in this process's own pool
 *                                 (needs KVSHIM_PEERS=0: no peer pool mapped): body, tokens
 *                                 (checksum left stale), version, fp, statemagic, length
 *                                 (checksum recomputed, so only that check can refuse it)
 * Exit: 0, or 2 on a malformed command / unusable plugin. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "fakellama.h" /* types only: nothing of libfakellama is linked */
#include "fakeplugin.h"

#define HOST_NAME "fakehost"
#define SLOTS 8
#define MAX_SEQ 8
#include "hostutil.h"

static const fakeplugin_api_t *P;
static void *g_model[SLOTS];
static void *g_ctx[SLOTS];
static toks_t g_toks[SLOTS][MAX_SEQ];

static int g_argc;
static char **g_argv;
static int g_rc;

static void *ctx_of(const char *s) {
  void *c = g_ctx[slot(s)];
  if (!c) die("no context '%s'", s);
  return c;
}

static toks_t *toks_of(const char *c, const char *seq) {
  long s = num(seq);
  if (s < 0 || s >= MAX_SEQ) die("bad sequence '%s'", seq);
  return &g_toks[slot(c)][s];
}

static void toks_set(toks_t *t, const int32_t *v, size_t n) {
  t->n = 0;
  for (size_t i = 0; i < n; i++) toks_push(t, v[i]);
}

static uint64_t toks_hash(const int32_t *v, size_t n) {
  return XXH3_64bits(v, n * sizeof *v);
}

/* ---- files ------------------------------------------------------------------------------ */

static void copy_file(char **a) {
  FILE *in = fopen(a[0], "rb"), *out = in ? fopen(a[1], "wb") : NULL;
  if (!in || !out) die("cannot copy '%s'", a[0]);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
  fclose(in);
  if (fclose(out) != 0) die("cannot copy to '%s'", a[1]);
  struct stat sb;
  stat(a[0], &sb);
  struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
  utimensat(AT_FDCWD, a[1], ts, 0);
  printf("copy ok\n");
}

static void setmtime(char **a) {
  struct timespec ts[2] = {{num(a[1]), 0}, {num(a[1]), 0}};
  printf("setmtime %s\n", utimensat(AT_FDCWD, a[0], ts, 0) == 0 ? "ok" : "failed");
}

/* ---- corrupting our own pool ----------------------------------------------------------------- */

static int corrupt_blob(uint8_t *b, kvs__llama_blob_hdr_t *hp, uint64_t len, const char *mode) {
  kvs__llama_blob_hdr_t h = *hp;
  if (h.version != KVS_LLAMA_BLOB_VERSION) return -1;
  uint8_t *state = b + KVS_LLAMA_BLOB_HDR + 4 * (uint64_t)h.n_tokens;
  bool fix = true;
  if (strcmp(mode, "body") == 0) {
    state[h.state_size / 2] ^= 0x40;
    fix = false;
  } else if (strcmp(mode, "tokens") == 0) {
    if (!h.n_tokens) return -1;
    b[KVS_LLAMA_BLOB_HDR] ^= 1;
    fix = false;
  } else if (strcmp(mode, "version") == 0) {
    h.version = 99;
  } else if (strcmp(mode, "fp") == 0) {
    h.model_fp[3] ^= 0x10;
  } else if (strcmp(mode, "statemagic") == 0) {
    state[0] ^= 0xff;
  } else if (strcmp(mode, "length") == 0) {
    h.state_size -= 4; /* the object is longer than the header says: refused as truncated */
  } else {
    die("unknown corrupt mode '%s'", mode);
  }
  memcpy(b, &h, sizeof h);
  if (fix) blob_reseal(b, len);
  return 0;
}

/* ---- commands -------------------------------------------------------------------------------- */

static void run(const char *v, char **x, int argn) {
  if (strcmp(v, "copy") == 0) {
    NEED(2);
    copy_file(x);
  } else if (strcmp(v, "setmtime") == 0) {
    NEED(2);
    setmtime(x);
  } else if (strcmp(v, "model") == 0) {
    NEED(2);
    size_t m = slot(x[0]);
    g_model[m] = P->model_load(x[1]);
    printf("model %zu %s\n", m, g_model[m] ? "ok" : "null");
  } else if (strcmp(v, "freemodel") == 0) {
    NEED(1);
    size_t m = slot(x[0]);
    P->model_free(g_model[m]);
    g_model[m] = NULL;
    printf("freemodel %zu\n", m);
  } else if (strcmp(v, "ctx") == 0) {
    NEED(2);
    size_t c = slot(x[0]), m = slot(x[1]);
    uint32_t nseq = argn > 2 ? (uint32_t)num(x[2]) : 4, kv = argn > 3 ? (uint32_t)num(x[3]) : 1;
    g_ctx[c] = g_model[m] ? P->ctx_new(g_model[m], nseq, kv) : NULL;
    for (int s = 0; s < MAX_SEQ; s++) g_toks[c][s].n = 0;
    printf("ctx %zu %s\n", c, g_ctx[c] ? "ok" : "null");
  } else if (strcmp(v, "decode") == 0) {
    NEED(3);
    void *c = ctx_of(x[0]);
    toks_t *t = toks_of(x[0], x[1]), add = {0};
    parse_spec(x[2], &add, 32000);
    int32_t rc = P->decode(c, (int32_t)num(x[1]), add.v, (int32_t)add.n);
    if (rc == 0)
      for (size_t i = 0; i < add.n; i++) toks_push(t, add.v[i]);
    free(add.v);
    printf("decode rc=%d n=%zu\n", rc, t->n);
  } else if (strcmp(v, "clear") == 0) {
    NEED(2);
    P->seq_clear(ctx_of(x[0]), (int32_t)num(x[1]));
    toks_of(x[0], x[1])->n = 0;
    printf("clear ok\n");
  } else if (strcmp(v, "save") == 0) {
    NEED(3);
    toks_t *t = toks_of(x[0], x[1]);
    size_t r = P->seq_save_file(ctx_of(x[0]), x[2], (int32_t)num(x[1]), t->v, t->n);
    printf("save ret=%zu\n", r);
  } else if (strcmp(v, "load") == 0 || strcmp(v, "loadcount") == 0) {
    NEED(3);
    bool count = strcmp(v, "loadcount") == 0;
    void *c = ctx_of(x[0]);
    int32_t seq = (int32_t)num(x[1]);
    size_t cap = argn > 3 ? (size_t)num(x[3]) : 65536, got = 777777;
    int32_t *out = count ? NULL : calloc(cap ? cap : 1, sizeof *out);
    size_t r = P->seq_load_file(c, x[2], seq, out, cap, &got);
    if (count) {
      printf("loadcount ret=%zu n=%zu\n", r, got);
    } else {
      int chk = -1;
      uint64_t h = 0;
      if (r > 0 && got <= cap) {
        toks_set(toks_of(x[0], x[1]), out, got);
        chk = P->seq_check(c, seq, out, got);
        h = toks_hash(out, got);
      }
      printf("load ret=%zu n=%zu toks=%016" PRIx64 " check=%d\n", r, got, h, chk);
    }
    free(out);
  } else if (strcmp(v, "size") == 0) {
    NEED(2);
    bool ext = argn > 2;
    uint32_t fl = ext ? (uint32_t)num(x[2]) : 0;
    size_t r = P->seq_get_size(ctx_of(x[0]), (int32_t)num(x[1]), ext, fl);
    printf("size ret=%zu\n", r);
  } else if (strcmp(v, "copyseq") == 0) {
    NEED(4);
    void *c = ctx_of(x[0]), *c2 = ctx_of(x[2]);
    int32_t s = (int32_t)num(x[1]), s2 = (int32_t)num(x[3]);
    bool ext = argn > 4;
    uint32_t fl = ext ? (uint32_t)num(x[4]) : 0;
    size_t sz = P->seq_get_size(c, s, ext, fl);
    uint8_t *buf = malloc(sz ? sz : 1);
    size_t g = P->seq_get_data(c, buf, sz, s, ext, fl);
    size_t st = P->seq_set_data(c2, buf, g, s2, ext, fl);
    toks_t *from = toks_of(x[0], x[1]), *to = toks_of(x[2], x[3]);
    if (st) toks_set(to, from->v, from->n);
    printf("copyseq size=%zu get=%zu set=%zu check=%d\n", sz, g, st,
           st ? P->seq_check(c2, s2, to->v, to->n) : -1);
    free(buf);
  } else if (strcmp(v, "savectx") == 0) {
    NEED(3);
    toks_t *t = toks_of(x[0], x[1]);
    printf("savectx ret=%d\n", P->state_save_file(ctx_of(x[0]), x[2], t->v, t->n));
  } else if (strcmp(v, "loadctx") == 0) {
    NEED(3);
    void *c = ctx_of(x[0]);
    size_t cap = argn > 3 ? (size_t)num(x[3]) : 65536, got = 777777;
    int32_t *out = calloc(cap ? cap : 1, sizeof *out);
    bool ok = P->state_load_file(c, x[2], out, cap, &got);
    int chk = -1;
    if (ok) {
      toks_set(toks_of(x[0], x[1]), out, got);
      chk = P->seq_check(c, (int32_t)num(x[1]), out, got);
    }
    printf("loadctx ret=%d n=%zu check=%d\n", ok, got, chk);
    free(out);
  } else if (strcmp(v, "check") == 0) {
    NEED(2);
    toks_t *t = toks_of(x[0], x[1]);
    printf("check %d\n", P->seq_check(ctx_of(x[0]), (int32_t)num(x[1]), t->v, t->n));
  } else if (strcmp(v, "rm") == 0) {
    NEED(1);
    printf("rm %s\n", unlink(x[0]) == 0 ? "ok" : "missing");
  } else if (strcmp(v, "exists") == 0) {
    NEED(1);
    printf("exists %d\n", access(x[0], F_OK) == 0);
  } else if (strcmp(v, "rtld") == 0) {
    NEED(1);
    printf("rtld %s next=%s default=%s\n", x[0], dlsym(RTLD_NEXT, x[0]) ? "found" : "null",
           dlsym(RTLD_DEFAULT, x[0]) ? "found" : "null");
  } else if (strcmp(v, "corrupt") == 0) {
    NEED(1);
    corrupt_pool(KVS_LLAMA_BLOB_KIND_SEQ, corrupt_blob, x[0]);
  } else {
    die("unknown command '%s'", v);
  }
}

/* ---- ctypes mode: every function through dlsym(handle, name) ------------------------------- */

#define CT_FNS(X)                                                                             \
  X(llama_model_default_params) X(llama_model_load_from_file) X(llama_model_free)             \
  X(llama_context_default_params) X(llama_init_from_model) X(llama_free) X(fakellama_decode) \
  X(fakellama_seq_clear) X(fakellama_seq_check) X(llama_state_seq_save_file)                 \
  X(llama_state_seq_load_file) X(llama_state_seq_get_size) X(llama_state_seq_get_size_ext)   \
  X(llama_state_seq_get_data) X(llama_state_seq_get_data_ext) X(llama_state_seq_set_data)    \
  X(llama_state_seq_set_data_ext) X(llama_state_save_file) X(llama_state_load_file)
#define CT_PTR(n) static __typeof__(&n) ct_##n;
CT_FNS(CT_PTR)
#undef CT_PTR

#define FP_CALL(name) ct_##name
#include "fakeplugin_calls.h"

static const fakeplugin_api_t *ctypes_api(void *h) {
#define CT_RESOLVE(n)                                                                         \
  do {                                                                                        \
    void *p_ = dlsym(h, #n);                                                                  \
    if (!p_) die("the library has no %s", #n);                                                \
    memcpy(&ct_##n, &p_, sizeof p_);                                                          \
  } while (0);
  CT_FNS(CT_RESOLVE)
#undef CT_RESOLVE
  return &fp_api;
}

static void *worker(void *arg) {
  (void)arg;
  run_all(g_argc, g_argv, run);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fakehost PLUGIN 'CMD ARGS...' ...\n");
    return 2;
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) die("cannot open the plugin: %s", dlerror());
  fakeplugin_api_fn entry = (fakeplugin_api_fn)(uintptr_t)dlsym(h, FAKEPLUGIN_ENTRY);
  P = entry ? entry() : dlsym(h, "llama_state_seq_save_file") ? ctypes_api(h) : NULL;
  if (!P || P->version != FAKEPLUGIN_API_VERSION) die("%s", "the plugin has no usable entry point");
  g_argc = argc - 2;
  g_argv = argv + 2;
  pthread_t t;
  if (pthread_create(&t, NULL, worker, NULL) != 0) die("%s", "pthread_create");
  pthread_join(t, NULL);
  for (int c = 0; c < SLOTS; c++) {
    if (g_ctx[c]) P->ctx_free(g_ctx[c]);
    for (int s = 0; s < MAX_SEQ; s++) free(g_toks[c][s].v);
  }
  for (int m = 0; m < SLOTS; m++)
    if (g_model[m]) P->model_free(g_model[m]);
  return g_rc;
}
