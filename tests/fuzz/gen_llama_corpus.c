/* Writes the seed corpora of fuzz_llama_blob (SEQ and PREFIX blobs of shims/llama/blob.h, each
 * checked by kvs__llama_blob_check before it is written), fuzz_kvo_desc, fuzz_options,
 * fuzz_gguf and fuzz_llama_chunks: valid inputs (blobs with their checksums, a descriptor,
 * option values, a small GGUF file, llama.cpp sequence states and a frame with its chunks) the
 * fuzzers mutate from. Not part of the build; run by hand when a format changes,
 * after building build/ (for libkvshim_core.a):
 *
 *   cc -std=gnu11 -Icore -Icore/memory -Icore/wire -Ishims/llama -Iruntime \
 *      -Ishims/kvo/include -Itests/fakes/llama \
 *      tests/fuzz/gen_llama_corpus.c shims/llama/blob.c shims/llama/blob_hash.c \
 *      shims/llama/chunks.c \
 *      build/core/libkvshim_core.a \
 *      -lxxhash -lhiredis -lpthread -o /tmp/gen_llama_corpus && \
 *      /tmp/gen_llama_corpus tests/fuzz/corpus
 *
 * Deterministic: the same files every run. The constants match the harnesses'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "blob.h"
#include "blobtest.h"
#include "chunks.h"
#include "llama_harness.h"
#include "runtime.h"
#include "kvshim/kvo.h"

static const char *root;

static void put(const char *dir, const char *name, const void *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, dir);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/%s/%s", root, dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}


/* One blob of the one format (shims/llama/blob.h) of kind, refused unless kvs__llama_blob_check
 * accepts it as that kind with the harness's expectations. SEQ: keyed 0 (chunk 0); PREFIX:
 * keyed tokens in chunks of CHUNK. */
static void llama_blob(const char *name, uint32_t kind, uint32_t n_tokens, uint32_t keyed,
                       uint64_t body) {
  uint64_t state = KVS_LLAMA_STATE_HDR + body, len;
  kvs__llama_blob_hdr_t h;
  uint8_t *b = blob_new(&h, kind, n_tokens, state, FP, (kvs_key_t){.lo = NS_LO, .hi = NS_HI}, &len);
  if (!b) exit(1);
  h.keyed_tokens = keyed;
  h.chunk_tokens = kind == KVS_LLAMA_BLOB_KIND_PREFIX ? CHUNK : 0;
  h.saved_ns = 1700000000000000000ull;
  if (kind == KVS_LLAMA_BLOB_KIND_SEQ) {
    h.file_dev = 2049, h.file_ino = 42, h.file_mtime_ns = 1700000000000000000ll;
    h.file_size = kvs__llama_file_bytes(n_tokens, state);
    h.file_known = 1;
  }
  uint8_t *st = b + KVS_LLAMA_BLOB_HDR + 4ull * n_tokens;
  for (uint32_t i = 0; i < n_tokens; i++) memcpy(b + KVS_LLAMA_BLOB_HDR + 4 * i, &i, 4);
  uint32_t m = KVS_LLAMA_STATE_MAGIC;
  memcpy(st, &m, 4);
  for (uint64_t i = KVS_LLAMA_STATE_HDR; i < state; i++) st[i] = (uint8_t)i;
  blob_seal(b, &h, len);
  const kvs__llama_blob_want_t w = {
      .kind = kind, .chunk = CHUNK, .model_fp = FP, .ns = {.lo = NS_LO, .hi = NS_HI}};
  kvs__llama_blob_status_t rc = kvs__llama_blob_check(b, len, &w, NULL);
  if (rc != KVS_LLAMA_BLOB_OK) {
    fprintf(stderr, "gen_llama_corpus: %s refused: %s\n", name, kvs__llama_blob_status_name(rc));
    exit(1);
  }
  put("fuzz_llama_blob", name, b, len);
  free(b);
}

/* GGUF v3: magic, version, n_tensors, n_kv, then {u64 len, key, u32 type, value}. */
static size_t g_str(uint8_t *p, const char *s) {
  uint64_t n = strlen(s);
  memcpy(p, &n, 8);
  memcpy(p + 8, s, n);
  return 8 + n;
}
static size_t g_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); return 4; }
static size_t g_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); return 8; }

static void gguf(void) {
  uint8_t b[1024];
  size_t n = 0;
  n += g_u32(b + n, 0x46554747u); /* "GGUF" */
  n += g_u32(b + n, 3);
  n += g_u64(b + n, 0);
  n += g_u64(b + n, 5);
  n += g_str(b + n, "general.architecture"), n += g_u32(b + n, 8), n += g_str(b + n, "llama");
  n += g_str(b + n, "general.name"), n += g_u32(b + n, 8), n += g_str(b + n, "tiny");
  n += g_str(b + n, "llama.context_length"), n += g_u32(b + n, 4), n += g_u32(b + n, 2048);
  n += g_str(b + n, "general.tags"), n += g_u32(b + n, 9), n += g_u32(b + n, 8),
      n += g_u64(b + n, 2), n += g_str(b + n, "a"), n += g_str(b + n, "bc");
  n += g_str(b + n, "general.weights"), n += g_u32(b + n, 9), n += g_u32(b + n, 6),
      n += g_u64(b + n, 3), n += g_u32(b + n, 0x3f800000), n += g_u32(b + n, 0),
      n += g_u32(b + n, 0x40000000);
  put("fuzz_gguf", "v3_general", b, n);
  b[4] = 2;
  put("fuzz_gguf", "v2_general", b, n);
}

/* A sequence state in the pinned llama.cpp's layout (chunks.h): n_stream streams, sequence seq
 * holding n cells in its stream, 2 layers (K rows of 6 bytes, V rows of 4 bytes or, v_trans,
 * 2 elements of 2 bytes), ext cells when ext, sections 1 or 2 (an ISWA pair). Written with the
 * prefix byte of fuzz_llama_chunks' split mode (0), checked splittable first. */
static size_t llama_state(uint8_t *b, uint32_t n_stream, int32_t seq, uint32_t n,
                          uint32_t v_trans, int ext, uint32_t sections) {
  size_t o = 0;
  o += g_u32(b + o, KVS_LLAMA_STATE_MAGIC);
  o += g_u32(b + o, (uint32_t)seq);
  for (uint32_t sec = 0; sec < sections; sec++) {
    uint32_t mine = n_stream == 1 ? 0 : (uint32_t)seq;
    o += g_u32(b + o, n_stream);
    for (uint32_t st = 0; st <= mine; st++) o += g_u32(b + o, st == mine ? n : 0);
    for (uint32_t i = 0; i < n; i++) {
      o += g_u32(b + o, i), o += g_u32(b + o, 1);
      if (ext) o += g_u32(b + o, i), o += g_u32(b + o, 0), o += g_u32(b + o, 100 + i);
      o += g_u32(b + o, (uint32_t)seq);
    }
    o += g_u32(b + o, v_trans), o += g_u32(b + o, 2);
    for (uint32_t l = 0; l < 2; l++) {
      o += g_u32(b + o, 1), o += g_u64(b + o, 6);
      for (uint32_t i = 0; i < 6 * n; i++) b[o++] = (uint8_t)(i * 7 + l);
    }
    for (uint32_t l = 0; l < 2; l++) {
      o += g_u32(b + o, 1);
      if (v_trans) o += g_u32(b + o, 2), o += g_u32(b + o, 2);
      else o += g_u64(b + o, 4);
      for (uint32_t i = 0; i < 4 * n; i++) b[o++] = (uint8_t)(i * 13 + l);
    }
    for (uint32_t st = mine + 1; st < n_stream; st++) o += g_u32(b + o, 0);
  }
  return o;
}

static void chunk_seeds(void) {
  static uint8_t b[8192], in[8192];
  static const struct { const char *name; uint32_t ns; int32_t seq; uint32_t n, vt; int ext;
                        uint32_t sec; } st[] = {
      {"rows", 1, 0, 10, 0, 0, 1},     {"transposed", 1, 0, 9, 1, 0, 1},
      {"streams", 3, 2, 8, 1, 0, 1},   {"ext", 1, 0, 6, 0, 1, 1},
      {"iswa", 1, 0, 5, 1, 0, 2},
  };
  for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
    size_t n = llama_state(b, st[i].ns, st[i].seq, st[i].n, st[i].vt, st[i].ext, st[i].sec);
    kvs__llama_chunks_scan_t sc;
    kvs__llama_chunks_status_t rc = kvs__llama_chunks_scan(b, n, &sc);
    if (rc != KVS_LLAMA_CHUNKS_OK) {
      fprintf(stderr, "gen_llama_corpus: state %s: %s\n", st[i].name,
              kvs__llama_chunks_status_name(rc));
      exit(1);
    }
    in[0] = 0;
    memcpy(in + 1, b, n);
    put("fuzz_llama_chunks", st[i].name, in, n + 1);
    if (i != 1) continue;
    /* assembly mode (1): u32 frame length, frame, (u32 length, chunk)... of 4-token chunks */
    static const kvs_key_t ns = {NS_LO, NS_HI};
    size_t o = 0;
    in[o++] = 1;
    uint32_t fl = (uint32_t)sc.frame_size;
    memcpy(in + o, &fl, 4);
    const uint8_t *frame = in + o + 4;
    kvs__llama_chunks_frame(b, &sc, 4, ns, in + o + 4, fl);
    o += 4 + fl;
    int32_t tok[64] = {0};
    for (uint32_t c = 0; kvs__llama_chunk_size(&sc, 4, sc.n_cells, c); c++) {
      uint32_t cl = (uint32_t)kvs__llama_chunk_size(&sc, 4, sc.n_cells, c);
      memcpy(in + o, &cl, 4);
      kvs__llama_chunk_write(b, &sc, tok, 4, sc.n_cells, c, frame, ns, in + o + 4, cl);
      o += 4 + cl;
    }
    put("fuzz_llama_chunks", "assemble_transposed", in, o);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_llama_corpus DIR\n");
    return 2;
  }
  root = argv[1];
  llama_blob("seq_small", KVS_LLAMA_BLOB_KIND_SEQ, 4, 0, 24);
  llama_blob("seq_no_tokens", KVS_LLAMA_BLOB_KIND_SEQ, 0, 0, 0);
  llama_blob("seq_64", KVS_LLAMA_BLOB_KIND_SEQ, 64, 0, 200);
  llama_blob("px_small", KVS_LLAMA_BLOB_KIND_PREFIX, 16, 16, 32);
  llama_blob("px_two_chunks", KVS_LLAMA_BLOB_KIND_PREFIX, 40, 32, 100);
  kvo_desc_t d;
  memset(&d, 0, sizeof d);
  d.abi_version = KVO_ABI_VERSION;
  d.size = KVO_DESC_SIZE_V1;
  snprintf(d.model_id, sizeof d.model_id, "tiny-llama");
  d.dtype = KVO_DTYPE_F16;
  d.layout = KVO_LAYOUT_LKTHD;
  d.layers = 2, d.kv_heads = 4, d.head_dim = 64, d.chunk_tokens = 16;
  d.world_size = 2, d.rank = 1;
  d.chunk_bytes = kvo_desc_chunk_bytes(&d);
  put("fuzz_kvo_desc", "valid", &d, sizeof d);
  static const struct { const char *name; const char *v; } opts[] = {
      {"size_gib", "\x02" "4GiB"},       {"size_m", "\x02" "512M"},
      {"bool_on", "\x00" "on"},          {"flags", "\x01" "cuda|kvo"},
      {"enum", "\x07" "inline"},         {"uids", "\x11" "1000,1001"},
      {"int", "\x0c" "256"},             {"env", "\x00" "KVSHIM_POOL_SIZE=64M\nKVSHIM_HOOKS=llama\n"
                                                "KVSHIM_STRATEGY=shm\nKVSHIM_LEASE_MS=10"},
  };
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    put("fuzz_options", opts[i].name, opts[i].v, 1 + strlen(opts[i].v + 1));
  gguf();
  chunk_seeds();
  return 0;
}
