/* tests/fakes/llama: what the two test engines (fakehost.c, prefixhost.c) share: argument
 * parsing, token specs, mkmodel (fakegguf.h's writer), the file/timing commands, the command loop and the
 * scan of kvshim's pool for blobs to corrupt. Each host defines HOST_NAME (its die() prefix) and
 * SLOTS before including this header; everything here is static to that one program. */
#ifndef KVSHIM_TESTS_HOSTUTIL_H
#define KVSHIM_TESTS_HOSTUTIL_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blob.h"
#include "blobtest.h"
#include "fakegguf.h"
#include "poolscan.h"

#ifndef HOST_NAME
#error "define HOST_NAME (the host's name in its error messages) before including hostutil.h"
#endif
#define MAX_ARGS 10 /* a command's arguments after its name (prefixhost's ctx takes 10) */

static void die(const char *fmt, const char *arg) {
  fprintf(stderr, HOST_NAME ": ");
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

/* A growable token list; the host owns v (free it). */
typedef struct toks {
  int32_t *v;
  size_t n, cap;
} toks_t;

static void toks_push(toks_t *t, int32_t v) {
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 256;
    t->v = realloc(t->v, t->cap * sizeof *t->v);
    if (!t->v) die("%s", "out of memory");
  }
  t->v[t->n++] = v;
}

/* Token specs, joined with '+': A-B (inclusive), rN@S (N pseudo-random tokens of seed S), rN@S/K
 * (the same without its first K tokens). Every token is taken modulo vocab (the hosts' specs
 * name tokens below it, so the modulo only bounds the random ones). */
static void parse_spec(const char *spec, toks_t *out, int32_t vocab) {
  char buf[256];
  if (strlen(spec) >= sizeof buf) die("token spec too long: '%s'", spec);
  strcpy(buf, spec);
  out->n = 0;
  for (char *save = NULL, *part = strtok_r(buf, "+", &save); part;
       part = strtok_r(NULL, "+", &save)) {
    if (part[0] == 'r') {
      char *at = strchr(part, '@'), *from = strchr(part, '/');
      if (!at) die("bad token spec '%s'", spec);
      *at = '\0';
      long skip = 0;
      if (from) {
        *from = '\0';
        skip = num(from + 1);
      }
      long n = num(part + 1), seed = num(at + 1);
      uint64_t x = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
      for (long i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (i >= skip) toks_push(out, (int32_t)(x % (uint64_t)vocab));
      }
    } else {
      char *dash = strchr(part, '-');
      if (!dash) die("bad token spec '%s'", spec);
      *dash = '\0';
      long a = num(part), b = num(dash + 1);
      for (long i = a; i <= b; i++) toks_push(out, (int32_t)(i % vocab));
    }
  }
}

/* mkmodel PATH NAME NLAYER NEMBD WEIGHT_KB SEED [SWA] (SWA > 0: a sliding window of SWA tokens,
 * fakellama.attention.sliding_window, which llama_model_n_swa reports) */
static void mkmodel(char **a, int argn) {
  uint32_t swa = argn > 6 ? (uint32_t)num(a[6]) : 0;
  FILE *f = fopen(a[0], "wb");
  if (!f) die("cannot write '%s'", a[0]);
  fakegguf_write(f, a[1], (uint32_t)num(a[2]), (uint32_t)num(a[3]), num(a[4]),
                 (uint64_t)num(a[5]), swa);
  if (fclose(f) != 0) die("cannot write '%s'", a[0]);
  printf("mkmodel ok\n");
}

/* ---- commands ------------------------------------------------------------------------------ */

/* The commands both hosts understand: mkmodel, touch, waitfile, sleep. Returns whether v was one
 * of them (then it has run and printed its line). */
static bool common_cmd(const char *v, char **x, int argn) {
  static const struct {
    const char *name;
    int need;
  } cmds[] = {{"mkmodel", 6}, {"touch", 1}, {"waitfile", 1}, {"sleep", 1}};
  size_t i = 0;
  while (i < sizeof cmds / sizeof cmds[0] && strcmp(v, cmds[i].name) != 0) i++;
  if (i == sizeof cmds / sizeof cmds[0]) return false;
  if (argn < cmds[i].need) die("missing arguments for '%s'", v);
  if (i == 0) {
    mkmodel(x, argn);
  } else if (i == 1) {
    int fd = open(x[0], O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
    printf("touch %s\n", fd >= 0 ? "ok" : "failed");
  } else if (i == 2) {
    long secs = argn > 1 ? num(x[1]) : 60;
    bool ok = false;
    for (long k = 0; k < secs * 100 && !(ok = access(x[0], F_OK) == 0); k++) usleep(10000);
    printf("waitfile %s\n", ok ? "ok" : "timeout");
  } else {
    usleep((useconds_t)num(x[0]) * 1000);
    printf("sleep ok\n");
  }
  return true;
}

/* A host's own commands: VERB ARGS... split on spaces (x[0..argn), at most MAX_ARGS). It
 * prints one line per command, or dies on a malformed one; NEED(k) checks the count. */
typedef void (*host_run_fn)(const char *v, char **x, int argn);
#define NEED(k)                                                                               \
  if (argn < (k)) die("missing arguments for '%s'", v)

/* Runs each command of cmds[0..n) in order: the common ones here, the rest by run. */
static void run_all(int n, char **cmds, host_run_fn run) {
  for (int i = 0; i < n; i++) {
    char *cmd = strdup(cmds[i]);
    if (!cmd) die("%s", "out of memory");
    char *a[MAX_ARGS + 1] = {0};
    int k = 0;
    for (char *save = NULL, *t = strtok_r(cmd, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
      if (k == MAX_ARGS + 1) die("too many arguments in '%s'", cmd);
      a[k++] = t;
    }
    if (k == 0) die("%s", "empty command");
    if (!common_cmd(a[0], a + 1, k - 1)) run(a[0], a + 1, k - 1);
    fflush(stdout);
    free(cmd);
  }
}

/* ---- corrupting our own pool ---------------------------------------------------------------- */

/* Changes one blob of the pool (header h, already copied out; blob_len bytes) by mode. Returns 0
 * when it did (the blob counts as a hit), nonzero when the blob is not one it changes. */
typedef int (*blob_corrupt_fn)(uint8_t *blob, kvs__llama_blob_hdr_t *h, uint64_t blob_len,
                               const char *mode);

/* Walks this process's writable kvshim pool mappings page by page: visit(p, hi, arg) for every
 * page start p with at least hdr bytes before the mapping's end hi; returns how many visits
 * returned 0 (the objects changed). Objects start on a page (the store's extents). */
typedef int (*pool_visit_fn)(uint8_t *p, uintptr_t hi, void *arg);
static int pool_walk(size_t hdr, pool_visit_fn visit, void *arg) {
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
    for (uintptr_t p = lo; p + hdr <= hi; p += (uintptr_t)page)
      if (visit((uint8_t *)p, hi, arg) == 0) hits++;
  }
  fclose(maps);
  return hits;
}

typedef struct corrupt_blobs {
  uint32_t kind;
  blob_corrupt_fn fn;
  const char *mode;
} corrupt_blobs_t;

static int corrupt_blob_at(uint8_t *p, uintptr_t hi, void *arg) {
  const corrupt_blobs_t *c = arg;
  kvs__llama_blob_hdr_t h;
  peek(&h, p, sizeof h);
  if (h.magic != KVS_LLAMA_BLOB_MAGIC || h.hdr_size != KVS_LLAMA_BLOB_HDR || h.kind != c->kind)
    return 1;
  uint64_t len = KVS_LLAMA_BLOB_HDR + 4 * (uint64_t)h.n_tokens + h.state_size;
  if ((uintptr_t)p + len > hi || in_free_extent((uintptr_t)p, len)) return 1;
  return c->fn(p, &h, len, c->mode);
}

/* Applies fn to every live blob of this kind in this process's pool; prints
 * "corrupt ok|notfound HITS". */
static void corrupt_pool(uint32_t kind, blob_corrupt_fn fn, const char *mode) {
  corrupt_blobs_t c = {kind, fn, mode};
  int hits = pool_walk(KVS_LLAMA_BLOB_HDR, corrupt_blob_at, &c);
  printf("corrupt %s %d\n", hits ? "ok" : "notfound", hits);
}

#endif
