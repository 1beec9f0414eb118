/* tests/fakes/llama: prefixhost, the "engine" of the prefix-cache tests (design §10.3). It links
 * libfakellama.so and calls it through its PLT, as llama-server or node-llama-cpp's addon call
 * libllama, and runs the commands given as arguments in order, printing one line per command.
 * The test driver (tests/shims/llama/llama_prefix.py) runs the same commands with and without
 * LD_PRELOAD=libkvshim.so and compares the lines: every line is a function of what the engine
 * computed (output logits, sampled tokens, memory positions), never of kvshim.
 *
 * usage: prefixhost 'CMD ARGS...' ...
 * Token specs: A-B (inclusive), rN@S (N pseudo-random tokens of seed S), rN@S/K (the same
 * without its first K tokens), joined with '+': "r600@1+r200@2" is 600 tokens of seed 1 then
 * 200 of seed 2; "r600@1/512" the last 88 of those 600. Tokens are < FAKELLAMA_N_VOCAB.
 * Commands (models 0..7, contexts 0..7):
 *   mkmodel PATH NAME NLAYER NEMBD WEIGHT_KB SEED   write a fake GGUF model
 *   model M PATH                         llama_model_load_from_file
 *   ctx C M [NSEQ [KVTYPE [NCTX [NBATCH [NUBATCH [SWAFULL [UNIFIED [FLASH]]]]]]]]
 *                                        llama_init_from_model (prints whether the params
 *                                        arrived intact); UNIFIED 1: kv_unified (one KV
 *                                        stream: NCTX cells for all sequences together);
 *                                        FLASH: flash_attn_type (0: disabled, the state's V
 *                                        transposed; default -1, auto)
 *   prompt C SEQ SPEC [BS [OUTS]]        decode SPEC after the sequence's last cell in engine
 *                                        batches of BS tokens (default: the context's n_batch),
 *                                        explicit positions; OUTS: last (the last token of each
 *                                        call's last batch, default), all (every token), none,
 *                                        getone (llama_batch_get_one: pos, seq_id and logits
 *                                        NULL; SEQ must be 0). Prints a hash of every output's
 *                                        logits (llama_get_logits_ith by batch index) and of the
 *                                        last output's embedding.
 *   gen C SEQ N                          N greedy tokens (llama_sampler_sample on the last
 *                                        output's batch index, then a one-token batch)
 *   multi C S1 SPEC1 S2 SPEC2 [none]     one batch holding both sequences' tokens, interleaved
 *                                        (output: the last token, or none)
 *   shared C S1 S2 SPEC                  one batch whose tokens belong to both sequences
 *   rm C SEQ P0 P1 | cp C SRC DST P0 P1 | keep C SEQ | add C SEQ P0 P1 D | div C SEQ P0 P1 D
 *   clear C                              llama_memory_* (clear = llama_memory_clear)
 *   copyseq C SRC DST                    llama_state_seq_get_data + set_data (an engine state load)
 *   statehash C SEQ|all                  llama_state_seq_get_data of SEQ (all: llama_state_get_data,
 *                                        the whole context): its length and XXH3 of its bytes
 *   emb C 0|1                            llama_set_embeddings
 *   pos C SEQ                            llama_memory_seq_pos_min / pos_max
 *   decoded C                            tokens the engine's llama_decode computed on C (not a
 *                                        function of the outputs: the tests compare it apart)
 *   corrupt MODE                         change every prefix-cache blob in this process's own
 *                                        pool: body (checksum left stale), tokens (checksum
 *                                        recomputed: only the token check can refuse it), ns
 *                                        (another namespace, checksum recomputed)
 *   corruptchunk I                       flip a payload byte of every chunk object of index I
 *                                        in this process's own pool (chunk storage, chunks.h)
 *   memcpy BYTES REPS                    median ns of REPS copies of BYTES (benchmarks only: the
 *                                        line is a time, bench_chunks.py's limit)
 *   sleep MS | touch PATH | waitfile PATH [SECONDS]
 * Exit: 0, or 2 on a malformed command. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "fakellama.h"

#define HOST_NAME "prefixhost"
#define SLOTS 8
#include "hostutil.h"
#include "chunks.h"

static struct llama_model *g_model[SLOTS];
static struct llama_context *g_ctx[SLOTS];
static int32_t g_last_out[SLOTS]; /* batch index of the last output of the last batch, -1 none */
static struct llama_sampler *g_smpl;

static struct llama_context *ctx_of(const char *s) {
  struct llama_context *c = g_ctx[slot(s)];
  if (!c) die("no context '%s'", s);
  return c;
}

/* Hash the outputs of the last decode: every output index in [0, n) plus the last embedding. */
static void hash_outputs(XXH3_state_t *h, struct llama_context *c, const int8_t *outs, int32_t n,
                         int *bad) {
  for (int32_t i = 0; i < n; i++) {
    if (!outs[i]) continue;
    const float *l = llama_get_logits_ith(c, i);
    if (!l) {
      (*bad)++;
      continue;
    }
    XXH3_64bits_update(h, l, FAKELLAMA_N_VOCAB * sizeof *l);
  }
  bool any = false;
  for (int32_t i = 0; i < n; i++) any |= outs[i] != 0;
  const float *e = any ? llama_get_embeddings_ith(c, -1) : NULL;
  if (e) XXH3_64bits_update(h, e, 16 * sizeof *e);
}

static void prompt(char **x, int argn) {
  size_t cs = slot(x[0]);
  struct llama_context *c = ctx_of(x[0]);
  int32_t seq = (int32_t)num(x[1]);
  toks_t t = {0};
  parse_spec(x[2], &t, FAKELLAMA_N_VOCAB);
  int32_t bs = argn > 3 ? (int32_t)num(x[3]) : (int32_t)llama_n_batch(c);
  const char *outs = argn > 4 ? x[4] : "last";
  bool getone = strcmp(outs, "getone") == 0;
  if (getone && seq != 0) die("%s", "getone needs sequence 0");
  XXH3_state_t *h = XXH3_createState();
  XXH3_64bits_reset(h);
  struct llama_batch b = llama_batch_init(bs, 0, 1);
  int32_t rc = 0, bad = 0;
  size_t done = 0;
  while (done < t.n && rc == 0) {
    int32_t n = t.n - done < (size_t)bs ? (int32_t)(t.n - done) : bs;
    bool last_batch = done + (size_t)n == t.n;
    int32_t p0 = llama_memory_seq_pos_max(llama_get_memory(c), seq) + 1;
    int8_t *flags = calloc((size_t)n, 1);
    for (int32_t i = 0; i < n; i++) {
      b.token[i] = t.v[done + (size_t)i];
      b.pos[i] = p0 + i;
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = seq;
      bool o = strcmp(outs, "all") == 0 ? true
               : strcmp(outs, "none") == 0 ? false
                                           : last_batch && i == n - 1;
      b.logits[i] = (int8_t)o;
      flags[i] = (int8_t)o;
    }
    b.n_tokens = n;
    if (getone) {
      struct llama_batch one = llama_batch_get_one(b.token, n);
      flags[n - 1] = 1; /* logits NULL: the last token */
      rc = llama_decode(c, one);
    } else {
      rc = llama_decode(c, b);
    }
    if (rc == 0) {
      hash_outputs(h, c, flags, n, &bad);
      g_last_out[cs] = -1;
      for (int32_t i = n - 1; i >= 0 && g_last_out[cs] < 0; i--)
        if (flags[i]) g_last_out[cs] = i;
    }
    free(flags);
    done += (size_t)n;
  }
  b.n_tokens = 0;
  llama_batch_free(b);
  printf("prompt %s %d rc=%d n=%zu pos=%d bad=%d out=%016" PRIx64 "\n", x[0], seq, rc, t.n,
         llama_memory_seq_pos_max(llama_get_memory(c), seq), bad, XXH3_64bits_digest(h));
  XXH3_freeState(h);
  free(t.v);
}

static void gen(char **x) {
  size_t cs = slot(x[0]);
  struct llama_context *c = ctx_of(x[0]);
  int32_t seq = (int32_t)num(x[1]);
  long n = num(x[2]);
  if (!g_smpl) g_smpl = llama_sampler_init_greedy();
  XXH3_state_t *h = XXH3_createState();
  XXH3_64bits_reset(h);
  int32_t rc = 0, tok = -1;
  struct llama_batch b = llama_batch_init(1, 0, 1);
  for (long i = 0; i < n && rc == 0; i++) {
    if (g_last_out[cs] < 0) {
      rc = -100;
      break;
    }
    tok = llama_sampler_sample(g_smpl, c, g_last_out[cs]);
    if (tok < 0) {
      rc = -101;
      break;
    }
    XXH3_64bits_update(h, &tok, sizeof tok);
    b.n_tokens = 1;
    b.token[0] = tok;
    b.pos[0] = llama_memory_seq_pos_max(llama_get_memory(c), seq) + 1;
    b.n_seq_id[0] = 1;
    b.seq_id[0][0] = seq;
    b.logits[0] = 1;
    rc = llama_decode(c, b);
    g_last_out[cs] = rc == 0 ? 0 : -1;
  }
  b.n_tokens = 0;
  llama_batch_free(b);
  printf("gen %s %d rc=%d toks=%016" PRIx64 " last=%d\n", x[0], seq, rc, XXH3_64bits_digest(h),
         tok);
  XXH3_freeState(h);
}

static void multi(char **x, int argn, bool shared) {
  bool none = !shared && argn > 5 && strcmp(x[5], "none") == 0;
  size_t cs = slot(x[0]);
  struct llama_context *c = ctx_of(x[0]);
  int32_t s1 = (int32_t)num(x[1]), s2 = (int32_t)num(shared ? x[2] : x[3]);
  toks_t a = {0}, bt = {0};
  parse_spec(shared ? x[3] : x[2], &a, FAKELLAMA_N_VOCAB);
  if (!shared) parse_spec(x[4], &bt, FAKELLAMA_N_VOCAB);
  int32_t n = (int32_t)(a.n + bt.n);
  struct llama_batch b = llama_batch_init(n, 0, 2);
  llama_memory_t mem = llama_get_memory(c);
  int32_t p1 = llama_memory_seq_pos_max(mem, s1) + 1, p2 = llama_memory_seq_pos_max(mem, s2) + 1;
  size_t i1 = 0, i2 = 0;
  for (int32_t i = 0; i < n; i++) {
    bool first = shared || (i1 < a.n && (i % 2 == 0 || i2 >= bt.n));
    b.token[i] = first ? a.v[i1] : bt.v[i2];
    b.pos[i] = first ? p1 + (int32_t)i1 : p2 + (int32_t)i2;
    b.n_seq_id[i] = shared ? 2 : 1;
    b.seq_id[i][0] = first ? s1 : s2;
    if (shared) b.seq_id[i][1] = s2;
    b.logits[i] = !none && i == n - 1;
    if (first) i1++;
    else i2++;
  }
  b.n_tokens = n;
  int32_t rc = llama_decode(c, b);
  XXH3_state_t *h = XXH3_createState();
  XXH3_64bits_reset(h);
  int bad = 0;
  if (rc == 0) {
    hash_outputs(h, c, b.logits, n, &bad);
    if (!none) g_last_out[cs] = n - 1;
  }
  printf("%s %s rc=%d bad=%d out=%016" PRIx64 "\n", shared ? "shared" : "multi", x[0], rc, bad,
         XXH3_64bits_digest(h));
  XXH3_freeState(h);
  b.n_tokens = 0;
  llama_batch_free(b);
  free(a.v);
  free(bt.v);
}

static int corrupt_blob(uint8_t *blob, kvs__llama_blob_hdr_t *h, uint64_t len, const char *mode) {
  bool fix = true;
  if (strcmp(mode, "body") == 0) {
    blob[len - h->state_size / 2] ^= 0x40;
    fix = false;
  } else if (strcmp(mode, "tokens") == 0) {
    blob[KVS_LLAMA_BLOB_HDR] ^= 1;
  } else if (strcmp(mode, "ns") == 0) {
    h->ns_lo ^= 1;
    memcpy(blob, h, sizeof *h);
  } else {
    die("unknown corrupt mode '%s'", mode);
  }
  if (fix) blob_reseal(blob, len);
  return 0;
}

/* Flip one payload byte of every chunk object of index idx (shims/llama/chunks.h) in this
 * process's own pool (checksum left stale: the assembler must refuse it). */
static int corrupt_chunk_at(uint8_t *p, uintptr_t hi, void *arg) {
  uint32_t idx = *(const uint32_t *)arg;
  kvs__llama_chunk_hdr_t h;
  peek(&h, p, sizeof h);
  if (h.magic != KVS_LLAMA_CHUNK_MAGIC || h.hdr_size != sizeof h || h.index != idx) return 1;
  uint64_t len = sizeof h + 4ull * h.n_tokens + h.payload;
  if ((uintptr_t)p + len > hi || in_free_extent((uintptr_t)p, len)) return 1;
  p[len - h.payload / 2] ^= 0x40;
  return 0;
}

static void corrupt_chunk(uint32_t idx) {
  int hits = pool_walk(sizeof(kvs__llama_chunk_hdr_t), corrupt_chunk_at, &idx);
  printf("corruptchunk %s %d\n", hits ? "ok" : "notfound", hits);
}

/* The physical limit a restore of `bytes` of state is compared with (bench_chunks.py): the
 * median of reps copies of that many bytes between two buffers already touched. */
static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}
static void memcpy_limit(size_t bytes, int reps) {
  uint8_t *a = malloc(bytes ? bytes : 1), *b = malloc(bytes ? bytes : 1);
  uint64_t ns[64];
  if (!a || !b || reps < 1 || reps > 64) die("%s", "memcpy: bad size or count");
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  for (int i = 0; i < reps; i++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    memcpy(i % 2 ? a : b, i % 2 ? b : a, bytes);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ns[i] = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)t1.tv_nsec -
            (uint64_t)t0.tv_nsec;
  }
  qsort(ns, (size_t)reps, sizeof ns[0], cmp_u64);
  printf("memcpy %zu %" PRIu64 " %u\n", bytes, ns[reps / 2], a[bytes / 2] + b[bytes / 3]);
  free(a);
  free(b);
}

static void run(const char *v, char **x, int argn) {
#define IS(s) (strcmp(v, s) == 0)
  if (IS("model")) {
    NEED(2);
    size_t m = slot(x[0]);
    g_model[m] = llama_model_load_from_file(x[1], llama_model_default_params());
    printf("model %zu %s\n", m, g_model[m] ? "ok" : "null");
  } else if (IS("ctx")) {
    NEED(2);
    size_t c = slot(x[0]), m = slot(x[1]);
    struct llama_context_params cp = llama_context_default_params();
    if (argn > 2) cp.n_seq_max = (uint32_t)num(x[2]);
    if (argn > 3) cp.type_k = cp.type_v = (int32_t)num(x[3]);
    cp.n_ctx = argn > 4 ? (uint32_t)num(x[4]) : 4096;
    cp.n_batch = argn > 5 ? (uint32_t)num(x[5]) : 2048;
    cp.n_ubatch = argn > 6 ? (uint32_t)num(x[6]) : 512;
    if (argn > 7) cp.swa_full = num(x[7]) != 0;
    if (argn > 8) cp.kv_unified = num(x[8]) != 0;
    if (argn > 9) cp.flash_attn_type = (int32_t)num(x[9]);
    cp.n_threads = cp.n_threads_batch = 1;
    if (g_ctx[c]) llama_free(g_ctx[c]);
    g_ctx[c] = g_model[m] ? llama_init_from_model(g_model[m], cp) : NULL;
    g_last_out[c] = -1;
    bool intact = g_ctx[c] && fakellama_ctx_params_hash(g_ctx[c]) == XXH3_64bits(&cp, sizeof cp);
    printf("ctx %zu %s params=%s\n", c, g_ctx[c] ? "ok" : "null", intact ? "intact" : "damaged");
  } else if (IS("prompt")) {
    NEED(3);
    prompt(x, argn);
  } else if (IS("gen")) {
    NEED(3);
    gen(x);
  } else if (IS("multi")) {
    NEED(5);
    multi(x, argn, false);
  } else if (IS("shared")) {
    NEED(4);
    multi(x, argn, true);
  } else if (IS("rm")) {
    NEED(4);
    bool r = llama_memory_seq_rm(llama_get_memory(ctx_of(x[0])), (int32_t)num(x[1]),
                                 (int32_t)num(x[2]), (int32_t)num(x[3]));
    printf("rm %d\n", r);
  } else if (IS("cp")) {
    NEED(5);
    llama_memory_seq_cp(llama_get_memory(ctx_of(x[0])), (int32_t)num(x[1]), (int32_t)num(x[2]),
                        (int32_t)num(x[3]), (int32_t)num(x[4]));
    printf("cp ok\n");
  } else if (IS("keep")) {
    NEED(2);
    llama_memory_seq_keep(llama_get_memory(ctx_of(x[0])), (int32_t)num(x[1]));
    printf("keep ok\n");
  } else if (IS("add") || IS("div")) {
    NEED(5);
    llama_memory_t mem = llama_get_memory(ctx_of(x[0]));
    if (IS("add"))
      llama_memory_seq_add(mem, (int32_t)num(x[1]), (int32_t)num(x[2]), (int32_t)num(x[3]),
                           (int32_t)num(x[4]));
    else
      llama_memory_seq_div(mem, (int32_t)num(x[1]), (int32_t)num(x[2]), (int32_t)num(x[3]),
                           (int)num(x[4]));
    printf("%s ok\n", v);
  } else if (IS("clear")) {
    NEED(1);
    llama_memory_clear(llama_get_memory(ctx_of(x[0])), true);
    printf("clear ok\n");
  } else if (IS("copyseq")) {
    NEED(3);
    struct llama_context *c = ctx_of(x[0]);
    int32_t s = (int32_t)num(x[1]), d = (int32_t)num(x[2]);
    size_t sz = llama_state_seq_get_size(c, s);
    uint8_t *buf = malloc(sz ? sz : 1);
    size_t g = llama_state_seq_get_data(c, buf, sz, s);
    size_t st = llama_state_seq_set_data(c, buf, g, d);
    free(buf);
    printf("copyseq get=%zu set=%zu\n", g, st);
  } else if (IS("statehash")) {
    NEED(2);
    struct llama_context *c = ctx_of(x[0]);
    bool all = strcmp(x[1], "all") == 0;
    int32_t s = all ? 0 : (int32_t)num(x[1]);
    size_t sz = all ? llama_state_get_size(c) : llama_state_seq_get_size(c, s);
    uint8_t *buf = malloc(sz ? sz : 1);
    size_t g = all ? llama_state_get_data(c, buf, sz) : llama_state_seq_get_data(c, buf, sz, s);
    printf("statehash get=%zu xxh=%016" PRIx64 "\n", g, XXH3_64bits(buf, g));
    free(buf);
  } else if (IS("emb")) {
    NEED(2);
    llama_set_embeddings(ctx_of(x[0]), num(x[1]) != 0);
    printf("emb ok\n");
  } else if (IS("pos")) {
    NEED(2);
    llama_memory_t mem = llama_get_memory(ctx_of(x[0]));
    int32_t s = (int32_t)num(x[1]);
    printf("pos %d..%d\n", llama_memory_seq_pos_min(mem, s), llama_memory_seq_pos_max(mem, s));
  } else if (IS("memcpy")) {
    NEED(2);
    memcpy_limit((size_t)num(x[0]), (int)num(x[1]));
  } else if (IS("decoded")) {
    NEED(1);
    printf("decoded %" PRIu64 "\n", fakellama_tokens_decoded(ctx_of(x[0])));
  } else if (IS("corruptchunk")) {
    NEED(1);
    corrupt_chunk((uint32_t)num(x[0]));
  } else if (IS("corrupt")) {
    NEED(1);
    corrupt_pool(KVS_LLAMA_BLOB_KIND_PREFIX, corrupt_blob, x[0]);
  } else {
    die("unknown command '%s'", v);
  }
#undef IS
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: prefixhost 'CMD ARGS...' ...\n");
    return 2;
  }
  for (int i = 0; i < SLOTS; i++) g_last_out[i] = -1;
  run_all(argc - 1, argv + 1, run);
  for (int c = 0; c < SLOTS; c++)
    if (g_ctx[c]) llama_free(g_ctx[c]);
  for (int m = 0; m < SLOTS; m++)
    if (g_model[m]) llama_model_free(g_model[m]);
  llama_sampler_free(g_smpl);
  return 0;
}
