/* Unit tests of the llama shim's pure parts: the blob check (shims/llama/blob.c, for the state
 * adapter's kind; the prefix kind is tested in test_llama_prefix.c), the model fingerprint (file
 * identity + GGUF general.* metadata) and path canonicalisation (shims/llama/model.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blob.h"
#include "runtime.h"
#include "blobtest.h"
#include "model.h"

/* blob.c raises libkvshim's re-entry depth around its store work (not exercised here). */
__thread int kvs__hook_depth;
/* ... and ask the runtime for the cache peer (no flow runs here: none). */
uint64_t kvs__runtime_cache_peer(kvs__runtime_t *rt) {
  (void)rt;
  return 0;
}

/* ---- helpers ------------------------------------------------------------------------------- */

static char g_dir[64];

static void mkdir_tmp(void) {
  strcpy(g_dir, "/tmp/kvs-llamafmt-XXXXXX");
  cr_assert_not_null(mkdtemp(g_dir));
}

static void rm_tmp(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  cr_assert_eq(system(cmd), 0);
}

static const char *tpath(const char *name) {
  static char p[4][128];
  static int i;
  i = (i + 1) % 4;
  snprintf(p[i], sizeof p[i], "%s/%s", g_dir, name);
  return p[i];
}

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *src, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    b->p = realloc(b->p, b->cap);
    cr_assert_not_null(b->p);
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}
static void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }
static void put_gstr(buf_t *b, const char *s, size_t n) {
  put_u64(b, n);
  put(b, s, n);
}
static void kv_str(buf_t *b, const char *k, const char *v, size_t vn) {
  put_gstr(b, k, strlen(k));
  put_u32(b, 8);
  put_gstr(b, v, vn);
}
static void fill(buf_t *b, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)(i * 131u + seed);
    put(b, &c, 1);
  }
}

/* Write b to path and give it a fixed mtime (so only the bytes differ between two files). */
static void write_file(const char *path, const buf_t *b, time_t mtime) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(b->p, 1, b->n, f), b->n);
  cr_assert_eq(fclose(f), 0);
  struct timespec ts[2] = {{mtime, 0}, {mtime, 0}};
  cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
}

/* A GGUF v3 file: a big non-general entry first (pushes what follows past the head), then
 * general.name = name, then a tail of padding the same for every name. */
static void gguf_big(buf_t *b, const char *name, size_t name_len) {
  b->n = 0;
  put_u32(b, 0x46554747u);
  put_u32(b, 3);
  put_u64(b, 0);
  put_u64(b, 3);
  buf_t big = {0};
  fill(&big, 1536 * 1024, 7);
  kv_str(b, "tokenizer.blob", (const char *)big.p, big.n);
  free(big.p);
  kv_str(b, "general.name", name, name_len);
  put_gstr(b, "general.architecture", 20);
  put_u32(b, 8);
  put_gstr(b, "llama", 5);
  fill(b, 1536 * 1024, 9);
}

static void fp_of(const char *path, uint8_t out[KVS_LLAMA_FP_SIZE], kvs__llama_fp_info_t *fi) {
  int rc = kvs__llama_fingerprint(path, out, fi);
  cr_assert_eq(rc, 0, "fingerprint %s: %d", path, rc);
}

/* Write b as tpath(name) with that mtime and fingerprint it. */
static void fp_file(const char *name, const buf_t *b, time_t mtime, uint8_t out[KVS_LLAMA_FP_SIZE],
                    kvs__llama_fp_info_t *fi) {
  write_file(tpath(name), b, mtime);
  fp_of(tpath(name), out, fi);
}

TestSuite(llama_fp, .init = mkdir_tmp, .fini = rm_tmp, .timeout = 30);

Test(llama_fp, same_bytes_same_mtime_same_fingerprint_at_any_path) {
  buf_t b = {0};
  gguf_big(&b, "alpha", 5);
  uint8_t fa[16], fb[16];
  kvs__llama_fp_info_t ia, ib;
  fp_file("a.gguf", &b, 1000000, fa, &ia);
  fp_file("b.gguf", &b, 1000000, fb, &ib);
  cr_assert_arr_eq(fa, fb, 16);
  cr_assert_eq(ia.size, b.n);
  cr_assert_eq(ia.mtime_ns, 1000000ll * 1000000000ll);
  cr_assert_eq(ia.gguf_version, 3);
  cr_assert_eq(ia.n_kv, 3);
  cr_assert_eq(ia.general_keys, 2);
  free(b.p);
}

Test(llama_fp, general_metadata_outside_head_and_tail_separates_models) {
  /* Same size, same mtime, same first and last MiB: only general.name differs. */
  buf_t b = {0};
  uint8_t fa[16], fb[16];
  gguf_big(&b, "tune-A", 6);
  fp_file("a.gguf", &b, 1000000, fa, NULL);
  gguf_big(&b, "tune-B", 6);
  fp_file("b.gguf", &b, 1000000, fb, NULL);
  cr_assert(memcmp(fa, fb, 16) != 0, "general.name past the head must change the fingerprint");
  free(b.p);
}

Test(llama_fp, head_tail_size_and_mtime_each_change_it) {
  buf_t b = {0};
  gguf_big(&b, "alpha", 5);
  uint8_t base[16], f[16];
  fp_file("base", &b, 1000000, base, NULL);

  /* Each change alone (undone after): the mtime, a byte inside the big non-general value (only
   * the head hash sees it), a byte of the tail, the size. */
  const struct {
    const char *name, *what;
    time_t mtime;
    size_t flip; /* the byte flipped, SIZE_MAX none */
    size_t cut;  /* bytes cut off the end */
  } cases[] = {{"mtime", "mtime", 1000001, SIZE_MAX, 0},
               {"head", "head byte", 1000000, 100, 0},
               {"tail", "tail byte", 1000000, b.n - 10, 0},
               {"size", "size", 1000000, SIZE_MAX, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].flip != SIZE_MAX) b.p[cases[i].flip] ^= 1;
    b.n -= cases[i].cut;
    fp_file(cases[i].name, &b, cases[i].mtime, f, NULL);
    cr_assert(memcmp(base, f, 16) != 0, "%s", cases[i].what);
    if (cases[i].flip != SIZE_MAX) b.p[cases[i].flip] ^= 1;
    b.n += cases[i].cut;
  }
  free(b.p);
}

Test(llama_fp, malformed_or_foreign_files_still_fingerprint) {
  buf_t b = {0};
  gguf_big(&b, "alpha", 5);
  uint8_t f1[16], f2[16];
  kvs__llama_fp_info_t fi;
  /* Cut inside the big metadata value: the walk stops, the file is still identified. */
  size_t full = b.n;
  b.n = 1024 * 1024 + 77;
  fp_file("cut", &b, 1000000, f1, &fi);
  cr_assert_eq(fi.gguf_version, 0, "a walk that stopped is recorded as such");
  cr_assert_eq(fi.size, b.n);
  /* An absurd string length and an absurd entry count. */
  b.n = full;
  uint64_t huge = UINT64_MAX / 2;
  memcpy(b.p + 24, &huge, 8);
  fp_file("huge", &b, 1000000, f2, &fi);
  cr_assert_eq(fi.gguf_version, 0);
  cr_assert(memcmp(f1, f2, 16) != 0);
  uint64_t n_kv = UINT64_MAX;
  memcpy(b.p + 16, &n_kv, 8);
  fp_file("nkv", &b, 1000000, f2, &fi);
  cr_assert_eq(fi.gguf_version, 0);
  /* Not GGUF at all, and empty. */
  b.n = 0;
  fill(&b, 5000, 3);
  fp_file("text", &b, 1000000, f1, &fi);
  cr_assert_eq(fi.gguf_version, 0);
  cr_assert_eq(fi.n_kv, 0);
  b.n = 0;
  fp_file("empty", &b, 1000000, f2, &fi);
  cr_assert_eq(fi.size, 0);
  cr_assert(memcmp(f1, f2, 16) != 0);
  free(b.p);
}

Test(llama_fp, bad_input_is_a_clear_error) {
  uint8_t f[16] = {0}, zero[16] = {0};
  cr_assert_eq(kvs__llama_fingerprint(tpath("missing"), f, NULL), -ENOENT);
  cr_assert_eq(kvs__llama_fingerprint(g_dir, f, NULL), -EINVAL, "a directory");
  cr_assert_eq(kvs__llama_fingerprint(NULL, f, NULL), -EINVAL);
  cr_assert_eq(kvs__llama_fingerprint(tpath("missing"), NULL, NULL), -EINVAL);
  cr_assert_arr_eq(f, zero, 16, "out is written only on success");
}

/* ---- paths --------------------------------------------------------------------------------- */

static void canon_is(const char *in, const char *want) {
  char out[256];
  int n = kvs__llama_canon_path(in, out, sizeof out);
  cr_assert_eq(n, (int)strlen(want), "'%s': %d", in, n);
  cr_assert_str_eq(out, want, "'%s'", in);
}

Test(llama_path, absolute_paths_are_normalised, .timeout = 30) {
  canon_is("/a/b/../c", "/a/c");
  canon_is("/a//b/./c/", "/a/b/c");
  canon_is("/..", "/");
  canon_is("/../../x", "/x");
  canon_is("/", "/");
  canon_is("/a/..", "/");
  canon_is("/a/b/c/../../d", "/a/d");
  canon_is("/.hidden/..x/...", "/.hidden/..x/...");
}

Test(llama_path, relative_paths_start_at_the_cwd, .timeout = 30) {
  char cwd[PATH_MAX], want[PATH_MAX + 16], out[PATH_MAX];
  cr_assert_not_null(getcwd(cwd, sizeof cwd));
  snprintf(want, sizeof want, "%s/x/y", strcmp(cwd, "/") ? cwd : "");
  int n = kvs__llama_canon_path("./x//y", out, sizeof out);
  cr_assert_eq(n, (int)strlen(want));
  cr_assert_str_eq(out, want);
  cr_assert_eq(chdir("/tmp"), 0);
  canon_is("state.bin", "/tmp/state.bin");
  canon_is("../tmp/./s", "/tmp/s");
}

Test(llama_path, too_long_is_refused, .timeout = 30) {
  char out[8];
  cr_assert_eq(kvs__llama_canon_path("/abcdefgh", out, sizeof out), -ENAMETOOLONG);
  cr_assert_eq(kvs__llama_canon_path("/abcdef", out, sizeof out), 7);
  cr_assert_eq(kvs__llama_canon_path(NULL, out, sizeof out), -EINVAL);
}

/* ---- blobs ---------------------------------------------------------------------------------- */

static const uint8_t FP[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const kvs_key_t NS = {0x1234, 0x5678};

/* The check as the state adapter runs it for a context of model fp (namespace NS). */
static kvs__llama_blob_status_t chk(const uint8_t *b, uint64_t len, const uint8_t *fp,
                                    kvs__llama_blob_hdr_t *h) {
  const kvs__llama_blob_want_t want = {KVS_LLAMA_BLOB_KIND_SEQ, 0, fp, NS};
  return kvs__llama_blob_check(b, len, &want, h);
}

/* A valid blob: n tokens, a state of s bytes (s >= 8). */
static uint8_t *make_blob(uint32_t n, uint64_t s, uint64_t *len) {
  kvs__llama_blob_hdr_t h;
  uint8_t *b = blob_new(&h, KVS_LLAMA_BLOB_KIND_SEQ, n, s, FP, NS, len);
  cr_assert_not_null(b);
  for (uint32_t i = 0; i < n; i++) {
    int32_t t = (int32_t)(i * 7);
    memcpy(b + KVS_LLAMA_BLOB_HDR + 4 * i, &t, 4);
  }
  uint8_t *state = b + KVS_LLAMA_BLOB_HDR + 4ull * n;
  uint32_t m = KVS_LLAMA_STATE_MAGIC;
  memcpy(state, &m, 4);
  for (uint64_t i = 8; i < s; i++) state[i] = (uint8_t)i;
  blob_seal(b, &h, *len);
  return b;
}

Test(llama_blob, a_valid_blob_passes_and_its_header_is_returned, .timeout = 30) {
  uint64_t len;
  uint8_t *b = make_blob(300, 5000, &len);
  kvs__llama_blob_hdr_t h;
  cr_assert_eq(chk(b, len, FP, &h), KVS_LLAMA_BLOB_OK);
  cr_assert_eq(h.n_tokens, 300);
  cr_assert_eq(h.state_size, 5000);
  free(b);
  b = make_blob(0, 8, &len); /* no tokens, an empty sequence */
  cr_assert_eq(chk(b, len, FP, NULL), KVS_LLAMA_BLOB_OK);
  free(b);
}

Test(llama_blob, every_check_refuses_on_its_own, .timeout = 30) {
  uint64_t len;
  uint8_t *b = make_blob(10, 100, &len);
  kvs__llama_blob_hdr_t h, out;
  memset(&out, 0xee, sizeof out);
  kvs__llama_blob_hdr_t keep = out;
#define MUTATE(stmt, want)                                                                    \
  do {                                                                                        \
    memcpy(&h, b, sizeof h);                                                                  \
    kvs__llama_blob_hdr_t saved = h;                                                          \
    stmt;                                                                                     \
    memcpy(b, &h, sizeof h);                                                                  \
    blob_reseal(b, len);                                                                           \
    cr_assert_eq(chk(b, len, FP, &out), want, #stmt);                       \
    cr_assert_arr_eq(&out, &keep, sizeof out, "header written on failure: " #stmt);           \
    memcpy(b, &saved, sizeof saved);                                                          \
    blob_reseal(b, len);                                                                           \
  } while (0)
  MUTATE(h.magic ^= 1, KVS_LLAMA_BLOB_FOREIGN);
  MUTATE(h.version = 1, KVS_LLAMA_BLOB_FOREIGN); /* 1: the 96-byte header of before */
  MUTATE(h.hdr_size = 96, KVS_LLAMA_BLOB_FOREIGN);
  MUTATE(h.kind = KVS_LLAMA_BLOB_KIND_PREFIX, KVS_LLAMA_BLOB_FOREIGN);
  MUTATE(h.keyed_tokens = 4, KVS_LLAMA_BLOB_KEYED);
  MUTATE(h.chunk_tokens = 4, KVS_LLAMA_BLOB_KEYED);
  MUTATE(h.canon_tokens = 1, KVS_LLAMA_BLOB_KEYED);
  MUTATE(h.ns_hi ^= 1, KVS_LLAMA_BLOB_NAMESPACE);
  MUTATE(h.state_size -= 1, KVS_LLAMA_BLOB_LENGTH);
  MUTATE(h.state_size += 1, KVS_LLAMA_BLOB_LENGTH);
  MUTATE(h.n_tokens += 1, KVS_LLAMA_BLOB_LENGTH);
  MUTATE(h.n_tokens = UINT32_MAX, KVS_LLAMA_BLOB_LENGTH);
  MUTATE(h.model_fp[15] ^= 1, KVS_LLAMA_BLOB_MODEL);
#undef MUTATE
  cr_assert_eq(chk(b, len, FP, NULL), KVS_LLAMA_BLOB_OK, "restored");
  /* state magic (resealed) */
  b[KVS_LLAMA_BLOB_HDR + 40] ^= 1;
  blob_reseal(b, len);
  cr_assert_eq(chk(b, len, FP, NULL), KVS_LLAMA_BLOB_STATE);
  b[KVS_LLAMA_BLOB_HDR + 40] ^= 1;
  blob_reseal(b, len);
  /* any byte changed without resealing */
  for (uint64_t i = 0; i < len; i += 7) {
    if (i >= offsetof(kvs__llama_blob_hdr_t, checksum) && i < KVS_LLAMA_BLOB_HDR) continue;
    b[i] ^= 0x20;
    cr_assert_neq(chk(b, len, FP, NULL), KVS_LLAMA_BLOB_OK, "byte %lu", i);
    b[i] ^= 0x20;
  }
  b[len - 1] ^= 1;
  cr_assert_eq(chk(b, len, FP, NULL), KVS_LLAMA_BLOB_CHECKSUM);
  b[len - 1] ^= 1;
  /* a truncated object and a short one */
  cr_assert_eq(chk(b, len - 1, FP, NULL), KVS_LLAMA_BLOB_LENGTH);
  cr_assert_eq(chk(b, KVS_LLAMA_BLOB_HDR - 1, FP, NULL), KVS_LLAMA_BLOB_SHORT);
  cr_assert_eq(chk(NULL, len, FP, NULL), KVS_LLAMA_BLOB_SHORT);
  /* another model */
  uint8_t other[16] = {0};
  cr_assert_eq(chk(b, len, other, NULL), KVS_LLAMA_BLOB_MODEL);
  cr_assert_eq(chk(b, len, FP, NULL), KVS_LLAMA_BLOB_OK, "unchanged");
  free(b);
}

Test(llama_blob, state_shorter_than_its_header_is_refused, .timeout = 30) {
  uint64_t len;
  uint8_t *b = make_blob(2, 8, &len);
  kvs__llama_blob_hdr_t h;
  memcpy(&h, b, sizeof h);
  h.state_size = 4;
  memcpy(b, &h, sizeof h);
  blob_reseal(b, len - 4);
  cr_assert_eq(chk(b, len - 4, FP, NULL), KVS_LLAMA_BLOB_STATE);
  free(b);
}

Test(llama_blob, file_bytes_follow_the_state_file_format, .timeout = 30) {
  /* ggsq file: 3 u32 + n tokens + (state - its 8-byte in-memory header). */
  cr_assert_eq(kvs__llama_file_bytes(0, 8), 12);
  cr_assert_eq(kvs__llama_file_bytes(300, 5000), 12 + 1200 + 4992);
  for (int i = 0; i <= KVS_LLAMA_BLOB_CHECKSUM; i++) {
    const char *a = kvs__llama_blob_status_name((kvs__llama_blob_status_t)i);
    cr_assert_str_neq(a, "unknown");
    for (int j = 0; j < i; j++)
      cr_assert_str_neq(a, kvs__llama_blob_status_name((kvs__llama_blob_status_t)j));
  }
}
