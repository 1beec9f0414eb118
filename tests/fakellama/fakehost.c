/* tests/fakellama: fakehost, the "engine" of the llama shim tests. It dlopen()s the plugin
 * RTLD_LOCAL (as Node loads an addon), then runs the commands given as arguments, in order, on
 * a worker thread (engines call the state API from worker threads), printing one line per
 * command. The test driver (tests/fakellama/llama_shim.py) runs the same commands with and
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

#include "poolscan.h"
#include "fakellama.h" /* types only: nothing of libfakellama is linked */
#include "fakeplugin.h"
#include "blob.h"

#define SLOTS 8
#define MAX_SEQ 8
#define MAX_ARGS 8

static const fakeplugin_api_t *P;
static void *g_model[SLOTS];
static void *g_ctx[SLOTS];
typedef struct toks {
  int32_t *v;
  size_t n, cap;
} toks_t;
static toks_t g_toks[SLOTS][MAX_SEQ];

static int g_argc;
static char **g_argv;
static int g_rc;

static void die(const char *fmt, const char *arg) {
  fprintf(stderr, "fakehost: ");
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  fflush(NULL);
  _exit(2);
}

static long num(const char *s) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (errno || end == s || *end) die("not a number: '%s'", s);
  return v;
}

static size_t slot(const char *s) {
  long v = num(s);
  if (v < 0 || v >= SLOTS) die("bad slot '%s'", s);
  return (size_t)v;
}

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

static void toks_push(toks_t *t, int32_t v) {
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 256;
    t->v = realloc(t->v, t->cap * sizeof *t->v);
    if (!t->v) die("%s", "out of memory");
  }
  t->v[t->n++] = v;
}

static void toks_set(toks_t *t, const int32_t *v, size_t n) {
  t->n = 0;
  for (size_t i = 0; i < n; i++) toks_push(t, v[i]);
}

static uint64_t toks_hash(const int32_t *v, size_t n) {
  return XXH3_64bits(v, n * sizeof *v);
}

/* SPEC: A-B or rN@S. */
static void parse_spec(const char *spec, toks_t *out) {
  out->n = 0;
  if (spec[0] == 'r') {
    char *at = strchr(spec, '@');
    if (!at) die("bad token spec '%s'", spec);
    *at = '\0';
    long n = num(spec + 1), seed = num(at + 1);
    uint64_t x = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
    for (long i = 0; i < n; i++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      toks_push(out, (int32_t)(x % 32000));
    }
    return;
  }
  char *dash = strchr(spec, '-');
  if (!dash) die("bad token spec '%s'", spec);
  *dash = '\0';
  long a = num(spec), b = num(dash + 1);
  for (long i = a; i <= b; i++) toks_push(out, (int32_t)i);
}

/* ---- files ------------------------------------------------------------------------------ */

static void put_str(FILE *f, const char *s) {
  uint64_t n = strlen(s);
  fwrite(&n, 8, 1, f);
  fwrite(s, 1, n, f);
}
static void put_kv_str(FILE *f, const char *k, const char *v) {
  uint32_t t = 8;
  put_str(f, k);
  fwrite(&t, 4, 1, f);
  put_str(f, v);
}
static void put_kv_u32(FILE *f, const char *k, uint32_t v) {
  uint32_t t = 4;
  put_str(f, k);
  fwrite(&t, 4, 1, f);
  fwrite(&v, 4, 1, f);
}

static void mkmodel(char **a) {
  FILE *f = fopen(a[0], "wb");
  if (!f) die("cannot write '%s'", a[0]);
  uint32_t magic = 0x46554747u, ver = 3;
  uint64_t n_tensors = 0, n_kv = 4;
  fwrite(&magic, 4, 1, f);
  fwrite(&ver, 4, 1, f);
  fwrite(&n_tensors, 8, 1, f);
  fwrite(&n_kv, 8, 1, f);
  put_kv_str(f, "general.architecture", "fakellama");
  put_kv_str(f, "general.name", a[1]);
  put_kv_u32(f, "fakellama.block_count", (uint32_t)num(a[2]));
  put_kv_u32(f, "fakellama.embedding_length", (uint32_t)num(a[3]));
  long kb = num(a[4]);
  uint64_t x = (uint64_t)num(a[5]) * 0x2545f4914f6cdd1dull + 7;
  uint8_t blk[1024];
  for (long i = 0; i < kb; i++) {
    for (size_t j = 0; j < sizeof blk; j++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      blk[j] = (uint8_t)(x >> 32);
    }
    fwrite(blk, 1, sizeof blk, f);
  }
  if (fclose(f) != 0) die("cannot write '%s'", a[0]);
  printf("mkmodel ok\n");
}

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

static int corrupt_blob(uint8_t *b, const char *mode) {
  kvs__llama_blob_hdr_t h;
  memcpy(&h, b, sizeof h);
  uint64_t len = KVS_LLAMA_BLOB_HDR + 4 * (uint64_t)h.n_tokens + h.state_size;
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
  if (fix) {
    uint64_t c = kvs__llama_blob_checksum(b, len);
    memcpy(b + offsetof(kvs__llama_blob_hdr_t, checksum), &c, sizeof c);
  }
  return 0;
}

static void corrupt(char **a) {
  FILE *maps = fopen("/proc/self/maps", "r");
  if (!maps) die("%s", "no /proc/self/maps");
  char line[512];
  int hits = 0;
  long page = sysconf(_SC_PAGESIZE);
  while (fgets(line, sizeof line, maps)) {
    if (!strstr(line, "memfd:kvshim-pool")) continue;
    uintptr_t lo, hi;
    char perms[8];
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s", &lo, &hi, perms) != 3 || perms[1] != 'w')
      continue;
    for (uintptr_t p = lo; p + KVS_LLAMA_BLOB_HDR <= hi; p += (uintptr_t)page) {
      kvs__llama_blob_hdr_t h;
      peek(&h, (void *)p, sizeof h);
      if (h.magic != KVS_LLAMA_BLOB_MAGIC || h.version != KVS_LLAMA_BLOB_VERSION ||
          h.hdr_size != KVS_LLAMA_BLOB_HDR || h.kind != KVS_LLAMA_BLOB_KIND_SEQ)
        continue;
      uint64_t len = KVS_LLAMA_BLOB_HDR + 4 * (uint64_t)h.n_tokens + h.state_size;
      if (p + len > hi || in_free_extent(p, len)) continue;
      if (corrupt_blob((uint8_t *)p, a[0]) == 0) hits++;
    }
  }
  fclose(maps);
  printf("corrupt %s %d\n", hits ? "ok" : "notfound", hits);
}

/* ---- commands -------------------------------------------------------------------------------- */

static void run(char *cmd) {
  char *a[MAX_ARGS + 1] = {0};
  int n = 0;
  for (char *tok = strtok(cmd, " "); tok; tok = strtok(NULL, " ")) {
    if (n == MAX_ARGS + 1) die("too many arguments in '%s'", cmd);
    a[n++] = tok;
  }
  if (n == 0) die("%s", "empty command");
  const char *v = a[0];
  int argn = n - 1;
  char **x = a + 1;
#define NEED(k)                                                                               \
  if (argn < (k)) die("missing arguments for '%s'", v)
  if (strcmp(v, "mkmodel") == 0) {
    NEED(6);
    mkmodel(x);
  } else if (strcmp(v, "copy") == 0) {
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
    parse_spec(x[2], &add);
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
  } else if (strcmp(v, "touch") == 0) {
    NEED(1);
    int fd = open(x[0], O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
    printf("touch %s\n", fd >= 0 ? "ok" : "failed");
  } else if (strcmp(v, "waitfile") == 0) {
    NEED(1);
    long secs = argn > 1 ? num(x[1]) : 60;
    bool ok = false;
    for (long i = 0; i < secs * 100 && !(ok = access(x[0], F_OK) == 0); i++) usleep(10000);
    printf("waitfile %s\n", ok ? "ok" : "timeout");
  } else if (strcmp(v, "sleep") == 0) {
    NEED(1);
    usleep((useconds_t)num(x[0]) * 1000);
    printf("sleep ok\n");
  } else if (strcmp(v, "rtld") == 0) {
    NEED(1);
    printf("rtld %s next=%s default=%s\n", x[0], dlsym(RTLD_NEXT, x[0]) ? "found" : "null",
           dlsym(RTLD_DEFAULT, x[0]) ? "found" : "null");
  } else if (strcmp(v, "corrupt") == 0) {
    NEED(1);
    corrupt(x);
  } else {
    die("unknown command '%s'", v);
  }
#undef NEED
  fflush(stdout);
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

static void *c_model_load(const char *path) {
  return ct_llama_model_load_from_file(path, ct_llama_model_default_params());
}
static void c_model_free(void *m) { ct_llama_model_free(m); }
static void *c_ctx_new(void *model, uint32_t n_seq, uint32_t kv_type) {
  struct llama_context_params cp = ct_llama_context_default_params();
  cp.n_seq_max = n_seq;
  cp.type_k = cp.type_v = (int32_t)kv_type;
  return ct_llama_init_from_model(model, cp);
}
static void c_ctx_free(void *ctx) { ct_llama_free(ctx); }
static int32_t c_decode(void *ctx, int32_t seq, const int32_t *t, int32_t n) {
  return ct_fakellama_decode(ctx, seq, t, n);
}
static void c_seq_clear(void *ctx, int32_t seq) { ct_fakellama_seq_clear(ctx, seq); }
static int c_seq_check(void *ctx, int32_t seq, const int32_t *t, size_t n) {
  return ct_fakellama_seq_check(ctx, seq, t, n);
}
static size_t c_seq_save_file(void *ctx, const char *path, int32_t seq, const int32_t *t,
                              size_t n) {
  return ct_llama_state_seq_save_file(ctx, path, seq, t, n);
}
static size_t c_seq_load_file(void *ctx, const char *path, int32_t seq, int32_t *out, size_t cap,
                              size_t *n_out) {
  return ct_llama_state_seq_load_file(ctx, path, seq, out, cap, n_out);
}
static size_t c_seq_get_size(void *ctx, int32_t seq, bool ext, uint32_t fl) {
  return ext ? ct_llama_state_seq_get_size_ext(ctx, seq, fl)
             : ct_llama_state_seq_get_size(ctx, seq);
}
static size_t c_seq_get_data(void *ctx, uint8_t *dst, size_t size, int32_t seq, bool ext,
                             uint32_t fl) {
  return ext ? ct_llama_state_seq_get_data_ext(ctx, dst, size, seq, fl)
             : ct_llama_state_seq_get_data(ctx, dst, size, seq);
}
static size_t c_seq_set_data(void *ctx, const uint8_t *src, size_t size, int32_t seq, bool ext,
                             uint32_t fl) {
  return ext ? ct_llama_state_seq_set_data_ext(ctx, src, size, seq, fl)
             : ct_llama_state_seq_set_data(ctx, src, size, seq);
}
static bool c_state_save_file(void *ctx, const char *path, const int32_t *t, size_t n) {
  return ct_llama_state_save_file(ctx, path, t, n);
}
static bool c_state_load_file(void *ctx, const char *path, int32_t *out, size_t cap,
                              size_t *n_out) {
  return ct_llama_state_load_file(ctx, path, out, cap, n_out);
}

static const fakeplugin_api_t *ctypes_api(void *h) {
  static const fakeplugin_api_t api = {
      FAKEPLUGIN_API_VERSION, c_model_load, c_model_free, c_ctx_new, c_ctx_free, c_decode,
      c_seq_clear, c_seq_check, c_seq_save_file, c_seq_load_file, c_seq_get_size,
      c_seq_get_data, c_seq_set_data, c_state_save_file, c_state_load_file};
#define CT_RESOLVE(n)                                                                         \
  do {                                                                                        \
    void *p_ = dlsym(h, #n);                                                                  \
    if (!p_) die("the library has no %s", #n);                                                \
    memcpy(&ct_##n, &p_, sizeof p_);                                                          \
  } while (0);
  CT_FNS(CT_RESOLVE)
#undef CT_RESOLVE
  return &api;
}

static void *worker(void *arg) {
  (void)arg;
  for (int i = 0; i < g_argc; i++) {
    char *cmd = strdup(g_argv[i]);
    if (!cmd) die("%s", "out of memory");
    run(cmd);
    free(cmd);
  }
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
