/* tests/fakes/llama: see fakellama.h. Test code: plain malloc and stdio, one global lock. */
#include "fakellama.h"
#include "fakeggml.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define SEQ_MAGIC 0x67677371u     /* 'ggsq' */
#define SEQ_VERSION 3u
#define SESSION_MAGIC 0x6767736eu /* 'ggsn' */
#define SESSION_VERSION 10u
#define IO_MAGIC 0xaf143cd8u      /* in-memory sequence state */
#define CHAIN_SEED 0x9e3779b97f4a7c15ull
#define ARCH "fakellama"
#define MAX_PAYLOAD (1u << 20)
#define MAX_SEQ 64

struct llama_model {
  uint64_t id;
  uint32_t n_layer, n_embd;
  uint32_t n_swa; /* fakellama.attention.sliding_window (0: none) */
  char name[64];
};

typedef struct seq {
  uint8_t *cells; /* n_cells * cell_size bytes */
  uint32_t n_cells, cap;
} seq_t;

struct llama_context {
  struct llama_model *model;
  uint32_t n_seq, kv_type;
  uint32_t n_ctx, n_batch, n_ubatch; /* n_ctx: cells per sequence, or of all (unified) */
  /* kv_unified: one KV stream shared by every sequence (llama-context.cpp:291, n_ctx_seq =
   * n_ctx), else one stream per sequence. The cells of all sequences then count against one
   * n_ctx, and a sequence state carries the stream count (llama-kv-cache.cpp:2150-2154: a load
   * into a context with another count fails). */
  bool unified;
  uint64_t decoded; /* tokens llama_decode computed (fakellama_tokens_decoded) */
  bool embeddings;
  uint32_t v_trans; /* V stored transposed: !flash_attn (llama-model.cpp:2260) */
  seq_t seq[MAX_SEQ];
  /* outputs of the last llama_decode: rows[r] = n_vocab logits then n_embd embedding */
  float *rows;
  int32_t *out_ids; /* [n_out_ids]: batch index -> row, -1 without output */
  int32_t n_out_ids, n_outputs;
  int mem_tag;      /* llama_get_memory returns &mem_tag */
  uint64_t params_hash; /* XXH3 of the llama_context_params received */
  /* The KV cache's tensors a state load writes, as the pinned llama_kv_cache::state_read_data
   * writes layer.k_stream[strm] / v_stream[strm]: [st * n_layer + l] is stream st's layer l,
   * each of kv_size = kv_cells[st] cells, ggml_nbytes exactly that: K cell-major (cell i's
   * n_embd bytes at i * n_embd), V cell-major (cell i's FAKE_V_ROW bytes at i * FAKE_V_ROW) or,
   * v_trans, element-major (element j of cell i at (i + j * kv_size) * FAKE_V_EL). A load
   * writes a sequence's cells at [head, head + n) of its stream's tensors, then builds the
   * sequence's cells from those bytes (body_assemble). Both arrays hold n_stream * n_layer
   * entries, NULL and kv_cells[st] 0 until stream st's first load (stream_tensors). */
  struct ggml_tensor **k_tensor, **v_tensor;
  uint32_t kv_cells[MAX_SEQ];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t payload_size(const struct llama_model *m) {
  return (size_t)m->n_layer * m->n_embd;
}
static size_t cell_size(const struct llama_model *m) { return 4 + 8 + payload_size(m); }

/* KV streams: one when unified, else one per sequence (defined with the serialisation). */
static uint32_t n_stream(const struct llama_context *ctx);

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* ---- models ------------------------------------------------------------------------------- */

struct llama_model_params llama_model_default_params(void) {
  struct llama_model_params p;
  memset(&p, 0, sizeof p);
  p.n_gpu_layers = 999;
  p.use_mmap = true;
  p.sentinel = FAKELLAMA_PARAMS_SENTINEL;
  return p;
}

/* A minimal GGUF (v2/v3) metadata reader over the file bytes. */
typedef struct gr {
  const uint8_t *p;
  size_t n, off;
  int bad;
} gr_t;

static const uint8_t *gr_take(gr_t *g, size_t k) {
  if (g->bad || k > g->n - g->off) {
    g->bad = 1;
    return NULL;
  }
  const uint8_t *r = g->p + g->off;
  g->off += k;
  return r;
}
static uint64_t gr_u64(gr_t *g) {
  const uint8_t *p = gr_take(g, 8);
  uint64_t v = 0;
  if (p) memcpy(&v, p, 8);
  return v;
}
static uint32_t gr_u32(gr_t *g) {
  const uint8_t *p = gr_take(g, 4);
  return p ? get32(p) : 0;
}
static void gr_skip_value(gr_t *g, uint32_t t, int depth) {
  static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  if (t == 8) {
    uint64_t k = gr_u64(g);
    gr_take(g, k > g->n ? g->n + 1 : (size_t)k);
  } else if (t == 9 && depth < 2) {
    uint32_t et = gr_u32(g);
    uint64_t c = gr_u64(g);
    if (c > g->n) g->bad = 1;
    for (uint64_t i = 0; i < c && !g->bad; i++) gr_skip_value(g, et, depth + 1);
  } else if (t < sizeof sz && sz[t]) {
    gr_take(g, sz[t]);
  } else {
    g->bad = 1;
  }
}

struct llama_model *llama_model_load_from_file(const char *path, struct llama_model_params params) {
  if (!path || params.sentinel != FAKELLAMA_PARAMS_SENTINEL || params.n_gpu_layers != 999) {
    fprintf(stderr, "fakellama: model params arrived damaged\n");
    return NULL;
  }
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  struct stat sb;
  uint8_t *buf = NULL;
  struct llama_model *m = NULL;
  if (fstat(fileno(f), &sb) != 0 || sb.st_size < 24) goto out;
  buf = malloc((size_t)sb.st_size);
  if (!buf || fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) goto out;
  gr_t g = {buf, (size_t)sb.st_size, 0, 0};
  if (gr_u32(&g) != 0x46554747u) goto out;
  uint32_t ver = gr_u32(&g);
  if (ver < 2 || ver > 3) goto out;
  gr_u64(&g); /* n_tensors */
  uint64_t n_kv = gr_u64(&g);
  m = calloc(1, sizeof *m);
  if (!m) goto out;
  for (uint64_t i = 0; i < n_kv && !g.bad; i++) {
    uint64_t klen = gr_u64(&g);
    const uint8_t *key = gr_take(&g, klen > g.n ? g.n + 1 : (size_t)klen);
    uint32_t t = gr_u32(&g);
    if (g.bad) break;
    size_t kl = (size_t)klen;
#define KEY_IS(s) (kl == sizeof(s) - 1 && memcmp(key, s, kl) == 0)
    if (KEY_IS("fakellama.block_count") && t == 4) {
      m->n_layer = gr_u32(&g);
    } else if (KEY_IS("fakellama.embedding_length") && t == 4) {
      m->n_embd = gr_u32(&g);
    } else if (KEY_IS("fakellama.attention.sliding_window") && t == 4) {
      m->n_swa = gr_u32(&g);
    } else if (KEY_IS("general.name") && t == 8) {
      uint64_t sl = gr_u64(&g);
      const uint8_t *s = gr_take(&g, sl > g.n ? g.n + 1 : (size_t)sl);
      if (s) {
        size_t c = sl < sizeof m->name - 1 ? (size_t)sl : sizeof m->name - 1;
        memcpy(m->name, s, c);
      }
    } else {
      gr_skip_value(&g, t, 0);
    }
#undef KEY_IS
  }
  if (g.bad || !m->n_layer || !m->n_embd || payload_size(m) > MAX_PAYLOAD) {
    free(m);
    m = NULL;
    goto out;
  }
  m->id = XXH3_64bits(buf, (size_t)sb.st_size); /* the "weights" */
out:
  free(buf);
  fclose(f);
  return m;
}

void llama_model_free(struct llama_model *model) { free(model); }

/* llama.h: "Get the model's sliding window attention size (0 when the model has none)". The
 * fake KV itself keeps every cell (as llama.cpp does with swa_full). */
int32_t llama_model_n_swa(const struct llama_model *model) {
  return model ? (int32_t)model->n_swa : 0;
}

struct llama_context_params llama_context_default_params(void) {
  struct llama_context_params p;
  memset(&p, 0, sizeof p);
  p.n_ctx = 512;
  p.n_batch = 2048;
  p.n_ubatch = 512;
  p.n_seq_max = 1;
  p.n_outputs_max_per_seq = 1;
  p.n_threads = p.n_threads_batch = 4;
  p.rope_scaling_type = p.pooling_type = p.attention_type = p.flash_attn_type = -1;
  p.yarn_ext_factor = p.yarn_attn_factor = p.yarn_beta_fast = p.yarn_beta_slow = -1.0f;
  p.defrag_thold = -1.0f;
  p.type_k = p.type_v = 1;
  p.offload_kqv = p.no_perf = p.op_offload = p.swa_full = true;
  /* FAKELLAMA_DEFAULTS=unknown: a deliberately altered answer, standing for a llama.cpp release
   * kvshim does not know (its llama_context_default_params differs in one default). */
  const char *d = getenv("FAKELLAMA_DEFAULTS");
  if (d && strcmp(d, "unknown") == 0) p.defrag_thold = 0.1f;
  return p;
}

struct llama_context *llama_init_from_model(struct llama_model *model,
                                            struct llama_context_params params) {
  if (!model || params.n_seq_max == 0 || params.n_seq_max > MAX_SEQ || params.type_k < 0 ||
      params.ctx_other || params.n_samplers)
    return NULL;
  struct llama_context *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->model = model;
  c->n_seq = params.n_seq_max;
  c->kv_type = (uint32_t)params.type_k;
  c->n_ctx = params.n_ctx ? params.n_ctx : 4096;
  c->n_batch = params.n_batch ? params.n_batch : 2048;
  if (c->n_batch > c->n_ctx) c->n_batch = c->n_ctx;
  c->n_ubatch = params.n_ubatch && params.n_ubatch < c->n_batch ? params.n_ubatch : c->n_batch;
  c->embeddings = params.embeddings;
  c->unified = params.kv_unified;
  c->v_trans = params.flash_attn_type == 0; /* LLAMA_FLASH_ATTN_TYPE_DISABLED (llama.h:192) */
  c->params_hash = XXH3_64bits(&params, sizeof params);
  size_t slots = (size_t)n_stream(c) * model->n_layer;
  c->k_tensor = calloc(slots, sizeof *c->k_tensor);
  c->v_tensor = calloc(slots, sizeof *c->v_tensor);
  if (!c->k_tensor || !c->v_tensor) {
    llama_free(c);
    return NULL;
  }
  return c;
}

void llama_free(struct llama_context *ctx) {
  if (!ctx) return;
  for (uint32_t i = 0; i < ctx->n_seq; i++) free(ctx->seq[i].cells);
  size_t slots = (size_t)n_stream(ctx) * ctx->model->n_layer;
  for (size_t i = 0; i < slots; i++) {
    if (ctx->k_tensor) fakeggml_tensor_free(ctx->k_tensor[i]);
    if (ctx->v_tensor) fakeggml_tensor_free(ctx->v_tensor[i]);
  }
  free(ctx->k_tensor);
  free(ctx->v_tensor);
  free(ctx->rows);
  free(ctx->out_ids);
  free(ctx);
}

const struct llama_model *llama_get_model(const struct llama_context *ctx) {
  return ctx ? ctx->model : NULL;
}

/* ---- the fake KV -------------------------------------------------------------------------- */

static seq_t *seq_of(struct llama_context *ctx, llama_seq_id s) {
  return ctx && s >= 0 && (uint32_t)s < ctx->n_seq ? &ctx->seq[s] : NULL;
}

#define CLASS_FULL 3u /* a row of a long ubatch, not in its last partial group of 4 */

/* The cell after a cell whose chain is prev and payload hash is ph, for token t computed in
 * kernel class cls. */
static uint64_t chain_next(uint64_t prev, uint64_t ph, llama_token t, uint32_t cls) {
  uint32_t in[2] = {(uint32_t)t, cls};
  return XXH3_64bits_withSeed(in, sizeof in, prev ^ ph);
}

static void fill_cell(const struct llama_context *ctx, uint8_t *cell, int32_t pos, uint64_t chain) {
  memcpy(cell, &pos, 4);
  memcpy(cell + 4, &chain, 8);
  uint64_t seed[3] = {ctx->model->id, ctx->kv_type, chain};
  uint64_t x = XXH3_64bits_withSeed(seed, sizeof seed, (uint64_t)pos) | 1;
  uint8_t *p = cell + 12;
  for (size_t i = 0; i < payload_size(ctx->model); i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (uint8_t)(x >> 24);
  }
}

static int seq_reserve(seq_t *q, size_t csize, uint32_t n) {
  if (n <= q->cap) return 0;
  uint32_t cap = q->cap ? q->cap : 64;
  while (cap < n) cap *= 2;
  uint8_t *c = realloc(q->cells, (size_t)cap * csize);
  if (!c) return -1;
  q->cells = c;
  q->cap = cap;
  return 0;
}

static uint64_t last_chain(const seq_t *q, size_t csize) {
  uint64_t c = CHAIN_SEED;
  if (q->n_cells) memcpy(&c, q->cells + (size_t)(q->n_cells - 1) * csize + 4, 8);
  return c;
}

/* XXH3 of the payload of the last cell (0 for an empty sequence). */
static uint64_t last_payload_hash(const seq_t *q, size_t csize) {
  if (!q->n_cells) return 0;
  return XXH3_64bits(q->cells + (size_t)(q->n_cells - 1) * csize + 12, csize - 12);
}

int32_t fakellama_decode(struct llama_context *ctx, llama_seq_id s, const llama_token *tokens,
                         int32_t n) {
  pthread_mutex_lock(&g_lock);
  seq_t *q = seq_of(ctx, s);
  int32_t rc = -1;
  if (q && n >= 0 && (n == 0 || tokens)) {
    size_t cs = cell_size(ctx->model);
    if (seq_reserve(q, cs, q->n_cells + (uint32_t)n) == 0) {
      for (int32_t i = 0; i < n; i++) {
        uint64_t chain = chain_next(last_chain(q, cs), last_payload_hash(q, cs), tokens[i],
                                    CLASS_FULL);
        fill_cell(ctx, q->cells + (size_t)q->n_cells * cs, (int32_t)q->n_cells, chain);
        q->n_cells++;
      }
      rc = 0;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

void fakellama_seq_clear(struct llama_context *ctx, llama_seq_id s) {
  pthread_mutex_lock(&g_lock);
  seq_t *q = seq_of(ctx, s);
  if (q) q->n_cells = 0;
  pthread_mutex_unlock(&g_lock);
}

int32_t fakellama_seq_n_cells(struct llama_context *ctx, llama_seq_id s) {
  pthread_mutex_lock(&g_lock);
  seq_t *q = seq_of(ctx, s);
  int32_t n = q ? (int32_t)q->n_cells : -1;
  pthread_mutex_unlock(&g_lock);
  return n;
}

uint64_t fakellama_tokens_decoded(struct llama_context *ctx) {
  pthread_mutex_lock(&g_lock);
  uint64_t n = ctx ? ctx->decoded : 0;
  pthread_mutex_unlock(&g_lock);
  return n;
}

int fakellama_seq_check(struct llama_context *ctx, llama_seq_id s, const llama_token *tokens,
                        size_t n) {
  pthread_mutex_lock(&g_lock);
  seq_t *q = seq_of(ctx, s);
  int ok = q && q->n_cells == n;
  if (ok) {
    size_t cs = cell_size(ctx->model);
    uint8_t *want = malloc(cs);
    uint64_t chain = CHAIN_SEED, ph = 0;
    ok = want != NULL;
    for (size_t i = 0; ok && i < n; i++) {
      chain = chain_next(chain, ph, tokens[i], CLASS_FULL);
      fill_cell(ctx, want, (int32_t)i, chain);
      ok = memcmp(want, q->cells + i * cs, cs) == 0;
      ph = XXH3_64bits(want + 12, cs - 12);
    }
    free(want);
  }
  pthread_mutex_unlock(&g_lock);
  return ok;
}

/* ---- serialisation --------------------------------------------------------------------------- */

/* A sequence's body is the pinned llama.cpp's own layout (llama_kv_cache::state_write,
 * llama-kv-cache.cpp:2053-2330), so kvshim's splitter and assembler (shims/llama/chunks.c) are
 * tested on it:
 *     u32 n_stream, u32 cell_count per stream (only the sequence's stream, seq_to_stream:
 *     0 when unified else the sequence, llama-kv-cache.cpp:147-155, is non-zero), and when
 *     n > 0: n x (i32 pos, u32 n_seq_id 1, i32 seq_id), u32 v_trans, u32 n_layer,
 *     K: per layer i32 type, u64 row, n rows; V: per layer i32 type, u64 row, n rows, or
 *     (v_trans) i32 type, u32 el, u32 n_embd, then per element its n cells' el bytes.
 * A fake cell (pos, chain, payload) maps onto it: pos is the meta's pos, layer l's K row is
 * payload[l n_embd, (l + 1) n_embd) (type kv_type, 1-byte elements), layer l's V is 8 bytes,
 * chain ^ l * V_SALT, as 4 elements of 2 bytes (FAKE_V_EL) when transposed. v_trans is
 * !flash_attn (llama-model.cpp:2260), here flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED. */
#define FAKE_V_ROW 8u
#define FAKE_V_EL 2u
#define V_SALT 0x5bd1e9955bd1e995ull

static uint32_t n_stream(const struct llama_context *ctx) { return ctx->unified ? 1 : ctx->n_seq; }
static uint32_t seq_index(const struct llama_context *ctx, const seq_t *q) {
  return (uint32_t)(q - ctx->seq);
}
static uint32_t stream_of(const struct llama_context *ctx, const seq_t *q) {
  return ctx->unified ? 0 : seq_index(ctx, q);
}

/* Cells held by every sequence but except (a unified context's stream). */
static uint32_t cells_except(const struct llama_context *ctx, const seq_t *except) {
  uint32_t n = 0;
  for (uint32_t s = 0; s < ctx->n_seq; s++)
    if (&ctx->seq[s] != except) n += ctx->seq[s].n_cells;
  return n;
}

static size_t body_size(const struct llama_context *ctx, const seq_t *q) {
  size_t n = q->n_cells, L = ctx->model->n_layer;
  size_t b = 4 + 4 * (size_t)n_stream(ctx);
  if (n) b += 12 * n + 8 + L * (12 + n * ctx->model->n_embd) + L * (12 + n * FAKE_V_ROW);
  return b;
}

static uint64_t cell_chain(const uint8_t *cell) {
  uint64_t c;
  memcpy(&c, cell + 4, 8);
  return c;
}

static uint8_t *put32p(uint8_t *p, uint32_t v) {
  put32(p, v);
  return p + 4;
}

static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* The cells a body holds (its one non-zero stream count), or 0. */
static uint32_t body_cells(const uint8_t *src, size_t avail) {
  uint32_t ns = avail >= 4 ? get32(src) : 0, n = 0;
  for (uint32_t st = 0; st < ns && n == 0 && 4 + 4 * (size_t)(st + 1) <= avail; st++)
    n = get32(src + 4 + 4 * (size_t)st);
  return n;
}

/* ---- tensor data: the pinned llama.cpp's io objects ------------------------------------------ */

/* One tensor run of a state load or save. A load (src) writes the size bytes at src, inside
 * what the loader reads, to the tensor's bytes [offset, offset + size); a save (dst) copies
 * those tensor bytes to dst, inside the state being written. Exactly one of src, dst is set. */
typedef struct tensor_run {
  struct ggml_tensor *tensor;
  const uint8_t *src; /* load: ggml_backend_tensor_set's data */
  uint8_t *dst;       /* save: ggml_backend_tensor_get's data */
  size_t offset, size;
} tensor_run_t;

/* The tensor runs of one loader or saver call. The pinned llama.cpp moves a state through an io
 * object that copies the metadata as the parser or writer goes (read / write) but hands each
 * tensor run to the object (read_tensor / write_tensor):
 *   from memory (llama_state_seq_set_data[_ext], llama_state_set_data: llama_io_read_host,
 *   llama-context.cpp:2630-2680) read_tensor only records (tensor, pointer into the caller's
 *   buffer, offset, size), and the object's destructor, once the parse has ended, successful
 *   or not, writes every recorded run in record order with ggml_backend_tensor_set;
 *   from a file (llama_state_seq_load_file, llama_state_load_file: llama_io_read_file,
 *   2707-2727) read_tensor reads the run into a buffer and writes it at once;
 *   to memory (llama_state_seq_get_data[_ext], llama_state_get_data: llama_io_write_host,
 *   2577-2628) write_tensor only records (tensor, the current position in the caller's buffer,
 *   offset, size) and moves past the run (2598-2610); the destructor (2582-2587), once the
 *   writer has ended, reads every recorded run into its place with ggml_backend_tensor_get;
 *   to a file (llama_state_seq_save_file, llama_state_save_file: llama_io_write_file,
 *   2682-2705) write_tensor reads the run with ggml_backend_tensor_get into a buffer at once and
 *   writes that to the file (2691-2695).
 * The fake does the same; it reads a file whole first and builds a file in memory before
 * writing it, so a file run's bytes lie in that buffer at their place. via_ggml false moves
 * the bytes with a memcpy inside libfakellama instead, as a llama.cpp linked with a static ggml
 * would: the same bytes at the same time, no ggml call (loads: FAKELLAMA_TENSOR_MEMCPY[_AFTER];
 * saves: FAKELLAMA_TENSOR_GET_MEMCPY). Invariants: runs[0, n_runs) are recorded and not yet
 * done (n_runs is 0 unless deferred); a state's tensor bytes move between the state and the
 * fake's KV tensors only through run_do. */
typedef struct state_io {
  tensor_run_t *runs; /* [cap] */
  size_t n_runs, cap;
  bool deferred; /* memory: done by io_flush; file: done as recorded */
  bool via_ggml; /* ggml_backend_tensor_set / _get through the PLT, else memcpy */
} state_io_t;

static uint64_t g_state_loads; /* loader calls so far in this process; under g_lock */

static bool env_is_1(const char *name) {
  const char *e = getenv(name);
  return e && e[0] == '1';
}

/* One loader call's io object, under g_lock. Every call of llama_state_seq_set_data[_ext] (the
 * non-_ext one once: it calls the _ext one), llama_state_set_data and, once its file is read,
 * llama_state_seq_load_file and llama_state_load_file counts, whatever it returns. */
static void io_open_load(state_io_t *io, bool deferred) {
  uint64_t call = g_state_loads++;
  const char *after = getenv("FAKELLAMA_TENSOR_MEMCPY_AFTER");
  bool memcpy_now = after && *after && call >= strtoull(after, NULL, 10);
  memset(io, 0, sizeof *io);
  io->deferred = deferred;
  io->via_ggml = !env_is_1("FAKELLAMA_TENSOR_MEMCPY") && !memcpy_now;
}

/* One saver call's io object (get_data, the state files), under g_lock. */
static void io_open_save(state_io_t *io, bool deferred) {
  memset(io, 0, sizeof *io);
  io->deferred = deferred;
  io->via_ggml = !env_is_1("FAKELLAMA_TENSOR_GET_MEMCPY");
}

static void run_do(const state_io_t *io, const tensor_run_t *r) {
  if (r->dst) {
    if (io->via_ggml)
      ggml_backend_tensor_get(r->tensor, r->dst, r->offset, r->size); /* libfakeggml, PLT */
    else if (r->size)
      memcpy(r->dst, (const uint8_t *)r->tensor->data + r->offset, r->size);
  } else if (io->via_ggml) {
    ggml_backend_tensor_set(r->tensor, r->src, r->offset, r->size); /* libfakeggml, PLT */
  } else if (r->size) {
    memcpy((uint8_t *)r->tensor->data + r->offset, r->src, r->size);
  }
}

/* read_tensor / write_tensor: the run recorded (deferred) or done now. 0, or -1 when memory is
 * short (the call fails; the runs recorded before are still done, as the destructor still
 * runs). */
static int io_run(state_io_t *io, const tensor_run_t *r) {
  if (!io->deferred) {
    run_do(io, r);
    return 0;
  }
  if (io->n_runs == io->cap) {
    size_t cap = io->cap ? 2 * io->cap : 64;
    tensor_run_t *runs = realloc(io->runs, cap * sizeof *runs);
    if (!runs) return -1;
    io->runs = runs;
    io->cap = cap;
  }
  io->runs[io->n_runs++] = *r;
  return 0;
}

static int reader_tensor(state_io_t *io, struct ggml_tensor *t, const uint8_t *src,
                         size_t offset, size_t size) {
  tensor_run_t r = {t, src, NULL, offset, size};
  return io_run(io, &r);
}

static int writer_tensor(state_io_t *io, struct ggml_tensor *t, uint8_t *dst, size_t offset,
                         size_t size) {
  tensor_run_t r = {t, NULL, dst, offset, size};
  return io_run(io, &r);
}

/* The io object's destructor: the recorded runs done, in record order. */
static void io_flush(state_io_t *io) {
  for (size_t i = 0; i < io->n_runs; i++) run_do(io, &io->runs[i]);
  io->n_runs = 0;
}

/* Ends a call's io object: what is still recorded is done, the run list freed. */
static void io_close(state_io_t *io) {
  io_flush(io);
  free(io->runs);
  io->runs = NULL;
  io->cap = 0;
}

/* Makes stream st's tensors hold at least cells cells: kv_size (the real cells.size(),
 * llama-kv-cache.cpp:2662) is n_ctx, a stream's cells (one sequence's, or with kv_unified every
 * sequence's), or the cells of a larger state: the fake loads a sequence of more than n_ctx
 * cells into a context of one stream per sequence (its own check, kept: only decoding stops at
 * n_ctx). Each tensor's ggml_nbytes is exactly kv_size cells, so a write past the last cell
 * aborts in ggml_backend_tensor_set. The tensors are (re)made before a read records a run into
 * them, never after: a read's cells in a unified stream stay within n_ctx (body_parse's room
 * check), and another stream holds one sequence. 0, or -1 when memory is short. */
static int stream_tensors(struct llama_context *ctx, uint32_t st, uint32_t cells) {
  const struct llama_model *m = ctx->model;
  if (ctx->kv_cells[st] >= cells) return 0;
  uint32_t kv_size = cells > ctx->n_ctx ? cells : ctx->n_ctx;
  ctx->kv_cells[st] = 0;
  char name[48];
  for (uint32_t l = 0; l < m->n_layer; l++) {
    size_t i = (size_t)st * m->n_layer + l;
    fakeggml_tensor_free(ctx->k_tensor[i]);
    fakeggml_tensor_free(ctx->v_tensor[i]);
    snprintf(name, sizeof name, "cache_k_l%u (stream %u)", l, st);
    ctx->k_tensor[i] = fakeggml_tensor_new(name, (size_t)kv_size * m->n_embd);
    snprintf(name, sizeof name, "cache_v_l%u (stream %u)", l, st);
    ctx->v_tensor[i] = fakeggml_tensor_new(name, (size_t)kv_size * FAKE_V_ROW);
  }
  for (uint32_t l = 0; l < m->n_layer; l++) {
    size_t i = (size_t)st * m->n_layer + l;
    if (!ctx->k_tensor[i] || !ctx->v_tensor[i]) return -1;
  }
  ctx->kv_cells[st] = kv_size;
  return 0;
}

/* Parse a body from src[0, avail) as llama_kv_cache::state_read does (llama-kv-cache.cpp
 * 2123-2200, 2335-2450, 2508-2670), the sequence's n cells going to [head, head + n) of its
 * stream's tensors. The metadata is checked (every check the real reader makes, each cited
 * below) and copied as it is parsed (the cells' pos into q); each tensor run is only handed to
 * rd, in the real reader's order and at its offsets (state_read_data, 2508-2670, for one run
 * of cells): K, per layer one run of n rows at head * row; V, per layer one run of n rows at
 * head * FAKE_V_ROW or, v_trans, for each element j one run of the n cells' element j at
 * (head + j * kv_size) * FAKE_V_EL. Returns the bytes it consumed, q->n_cells = n (their
 * payload and chain are body_assemble's, once rd has written the runs); 0 when the body does
 * not fit this context, or (size_t)-1 when src is shorter than the body claims: q is empty
 * then, as llama.cpp empties the sequence on a failed restore (seq_rm, llama-kv-cache.cpp:2190),
 * and the runs recorded so far are still written. */
static size_t body_parse(struct llama_context *ctx, seq_t *q, const uint8_t *src, size_t avail,
                         state_io_t *rd, uint32_t head) {
  const struct llama_model *m = ctx->model;
  q->n_cells = 0;
  size_t off = 0;
#define NEED(k)                                                                                 \
  do {                                                                                          \
    if ((k) > avail - off) return (size_t)-1;                                                   \
  } while (0)
  NEED(4);
  if (get32(src) != n_stream(ctx)) return 0; /* 2150-2154 "n_stream mismatch" */
  off = 4;
  /* Stream counts up to the first non-empty one; its cells follow it (state_read_sinfo,
   * 2158-2200); the fake reads one non-empty stream, as a sequence state has. */
  uint32_t n = 0, st = 0;
  for (; st < n_stream(ctx) && n == 0; st++, off += 4) {
    NEED(4);
    n = get32(src + off);
  }
  if (n == 0) return off;
  size_t cs = cell_size(m);
  /* One sequence loads into the free cells of its stream after its own were removed
   * (llama-kv-cache.cpp:2341 seq_rm, 2418-2421 find_slot: "failed to find %d available cells"):
   * in a unified context the other sequences' cells take room. */
  if (ctx->unified && cells_except(ctx, q) + n > ctx->n_ctx) return 0;
  uint32_t strm = stream_of(ctx, q);
  if (seq_reserve(q, cs, n) != 0 || stream_tensors(ctx, strm, head + n) != 0) return 0;
  size_t kv_size = ctx->kv_cells[strm];
  struct ggml_tensor **k = ctx->k_tensor + (size_t)strm * m->n_layer;
  struct ggml_tensor **v = ctx->v_tensor + (size_t)strm * m->n_layer;
  uint8_t *cells = q->cells;
  NEED(12 * (size_t)n);
  for (uint32_t i = 0; i < n; i++, off += 12) {
    if (get32(src + off + 4) != 1) return 0; /* 2363-2366 "invalid seq_id-agnostic kv cell" */
    memcpy(cells + i * cs, src + off, 4);   /* pos; the seq id is read and discarded (2383) */
  }
  NEED(8);
  uint32_t v_trans = get32(src + off), n_layer = get32(src + off + 4);
  off += 8;
  if (n_layer != m->n_layer) return 0; /* 2557-2560 "mismatched layer count" */
  if (v_trans != ctx->v_trans) return 0; /* 2567-2570 "incompatible V transposition" */
  for (uint32_t l = 0; l < n_layer; l++) {
    NEED(12);
    /* 2580-2596 "mismatched key type", "mismatched key row size" */
    if (get32(src + off) != ctx->kv_type || get64(src + off + 4) != m->n_embd) return 0;
    off += 12;
    size_t rows = (size_t)n * m->n_embd;
    NEED(rows);
    if (reader_tensor(rd, k[l], src + off, (size_t)head * m->n_embd, rows) != 0) return 0;
    off += rows;
  }
  for (uint32_t l = 0; l < n_layer; l++) {
    NEED(12);
    if (get32(src + off) != ctx->kv_type) return 0; /* 2611-2617 / 2650 "mismatched value type" */
    if (v_trans ? get32(src + off + 4) != FAKE_V_EL || get32(src + off + 8) != FAKE_V_ROW / FAKE_V_EL
                : get64(src + off + 4) != FAKE_V_ROW)
      return 0; /* value row size / element size / GQA embedding size (2620-2670) */
    off += 12;
    if (v_trans) {
      for (uint32_t j = 0; j < FAKE_V_ROW / FAKE_V_EL; j++) {
        size_t els = (size_t)n * FAKE_V_EL;
        NEED(els);
        size_t at = ((size_t)head + (size_t)j * kv_size) * FAKE_V_EL;
        if (reader_tensor(rd, v[l], src + off, at, els) != 0) return 0;
        off += els;
      }
    } else {
      size_t rows = (size_t)n * FAKE_V_ROW;
      NEED(rows);
      if (reader_tensor(rd, v[l], src + off, (size_t)head * FAKE_V_ROW, rows) != 0) return 0;
      off += rows;
    }
  }
  for (; st < n_stream(ctx); st++, off += 4) {
    NEED(4);
    if (get32(src + off) != 0) return 0; /* a second non-empty stream */
  }
#undef NEED
  q->n_cells = n;
  return off;
}

/* q's cells [0, n_cells) from the bytes its stream's tensors hold at [head, head + n_cells)
 * (written by body_parse's runs; the pos is in place): the payload is the K rows, the chain
 * layer 0's V. Another layer's V that disagrees is damaged KV: the cell's chain is spoilt, so
 * every later output differs (as wrong V would). */
static void body_assemble(struct llama_context *ctx, seq_t *q, uint32_t head) {
  const struct llama_model *m = ctx->model;
  uint32_t strm = stream_of(ctx, q);
  size_t cs = cell_size(m), first = (size_t)strm * m->n_layer, kv_size = ctx->kv_cells[strm];
  for (uint32_t l = 0; l < m->n_layer; l++) {
    const uint8_t *k = ctx->k_tensor[first + l]->data, *v = ctx->v_tensor[first + l]->data;
    for (uint32_t i = 0; i < q->n_cells; i++) {
      uint8_t *cell = q->cells + (size_t)i * cs;
      size_t at = (size_t)head + i;
      memcpy(cell + 12 + (size_t)l * m->n_embd, k + at * m->n_embd, m->n_embd);
      uint64_t x = 0;
      if (ctx->v_trans)
        for (uint32_t j = 0; j < FAKE_V_ROW / FAKE_V_EL; j++)
          memcpy((uint8_t *)&x + j * FAKE_V_EL, v + (at + (size_t)j * kv_size) * FAKE_V_EL,
                 FAKE_V_EL);
      else
        memcpy(&x, v + at * FAKE_V_ROW, FAKE_V_ROW);
      x ^= l * V_SALT;
      if (l == 0) memcpy(cell + 4, &x, 8);
      else if (x != cell_chain(cell)) {
        uint64_t bad = cell_chain(cell) ^ 1;
        memcpy(cell + 4, &bad, 8);
      }
    }
  }
}

/* The fake's own bookkeeping before a save: the KV of the sequences qs[0, nq) (cells with
 * pos, chain and payload) put into their streams' tensors, sequence i at [head[i], head[i] +
 * n) of its stream (placed one after another per stream, as ctx_state_read places them), the
 * inverse of body_assemble: layer l's K row of cell c at c * n_embd, its V (chain ^ l * V_SALT)
 * at c * FAKE_V_ROW or, v_trans, element j at (c + j * kv_size) * FAKE_V_EL. The tensors are
 * sized as a load sizes them (stream_tensors), all before any is filled (a stream's tensors
 * are remade when they grow). head: out, nq entries. 0, or -1 when memory is short. */
static int kv_fill(struct llama_context *ctx, const seq_t *const *qs, uint32_t nq,
                   uint32_t *head) {
  const struct llama_model *m = ctx->model;
  uint32_t placed[MAX_SEQ] = {0};
  for (uint32_t i = 0; i < nq; i++) {
    uint32_t st = stream_of(ctx, qs[i]);
    head[i] = placed[st];
    placed[st] += qs[i]->n_cells;
  }
  for (uint32_t st = 0; st < n_stream(ctx); st++)
    if (placed[st] && stream_tensors(ctx, st, placed[st]) != 0) return -1;
  size_t cs = cell_size(m);
  for (uint32_t i = 0; i < nq; i++) {
    uint32_t strm = stream_of(ctx, qs[i]);
    size_t first = (size_t)strm * m->n_layer, kv_size = ctx->kv_cells[strm];
    for (uint32_t l = 0; l < m->n_layer && qs[i]->n_cells; l++) {
      uint8_t *k = ctx->k_tensor[first + l]->data, *v = ctx->v_tensor[first + l]->data;
      for (uint32_t c = 0; c < qs[i]->n_cells; c++) {
        const uint8_t *cell = qs[i]->cells + (size_t)c * cs;
        size_t at = (size_t)head[i] + c;
        memcpy(k + at * m->n_embd, cell + 12 + (size_t)l * m->n_embd, m->n_embd);
        uint64_t x = cell_chain(cell) ^ (l * V_SALT);
        if (ctx->v_trans)
          for (uint32_t j = 0; j < FAKE_V_ROW / FAKE_V_EL; j++)
            memcpy(v + (at + (size_t)j * kv_size) * FAKE_V_EL, (uint8_t *)&x + j * FAKE_V_EL,
                   FAKE_V_EL);
        else
          memcpy(v + at * FAKE_V_ROW, &x, FAKE_V_ROW);
      }
    }
  }
  return 0;
}

/* Write q's body (body_size bytes) to dst as llama_kv_cache::state_write does
 * (llama-kv-cache.cpp:2053-2119, state_write_data 2236-2330, one cell range [head, head + n) of
 * its stream, kv_fill'ed): the metadata written here as it goes, each tensor run handed to wr
 * at its place in dst, in the real writer's order and at its offsets: K, per layer one run of
 * n rows at head * row (2262-2267); V, per layer one run of n rows at head * FAKE_V_ROW
 * (2289-2294) or, v_trans, for each element j one run of the n cells' element j at
 * (head + j * kv_size) * FAKE_V_EL (2321-2329). The tensor bytes reach dst only through wr.
 * 0, or -1 when memory is short (wr's recorded runs are still done by its io_close). */
static int body_write(struct llama_context *ctx, const seq_t *q, uint8_t *dst, state_io_t *wr,
                      uint32_t head) {
  const struct llama_model *m = ctx->model;
  size_t cs = cell_size(m), n = q->n_cells;
  /* each stream's count, and right after a non-empty one its cells (state_write, 2061-2119) */
  uint8_t *o = put32p(dst, n_stream(ctx));
  uint32_t mine = stream_of(ctx, q);
  for (uint32_t st = 0; st <= mine; st++) o = put32p(o, st == mine ? q->n_cells : 0);
  uint8_t *tail = dst + body_size(ctx, q) - 4 * (size_t)(n_stream(ctx) - 1 - mine);
  for (uint32_t st = mine + 1; st < n_stream(ctx); st++) put32(tail + 4 * (st - mine - 1), 0);
  if (!n) return 0;
  for (size_t i = 0; i < n; i++) {
    memcpy(o, q->cells + i * cs, 4); /* pos */
    o = put32p(o + 4, 1);
    o = put32p(o, seq_index(ctx, q));
  }
  size_t kv_size = ctx->kv_cells[mine];
  struct ggml_tensor **k = ctx->k_tensor + (size_t)mine * m->n_layer;
  struct ggml_tensor **v = ctx->v_tensor + (size_t)mine * m->n_layer;
  o = put32p(o, ctx->v_trans);
  o = put32p(o, m->n_layer);
  for (uint32_t l = 0; l < m->n_layer; l++) {
    uint64_t row = m->n_embd;
    o = put32p(o, ctx->kv_type);
    memcpy(o, &row, 8);
    o += 8;
    if (writer_tensor(wr, k[l], o, (size_t)head * m->n_embd, n * m->n_embd) != 0) return -1;
    o += n * m->n_embd;
  }
  for (uint32_t l = 0; l < m->n_layer; l++) {
    o = put32p(o, ctx->kv_type);
    if (ctx->v_trans) {
      o = put32p(o, FAKE_V_EL);
      o = put32p(o, FAKE_V_ROW / FAKE_V_EL);
      for (uint32_t j = 0; j < FAKE_V_ROW / FAKE_V_EL; j++, o += n * FAKE_V_EL) {
        size_t at = ((size_t)head + (size_t)j * kv_size) * FAKE_V_EL;
        if (writer_tensor(wr, v[l], o, at, n * FAKE_V_EL) != 0) return -1;
      }
    } else {
      uint64_t row = FAKE_V_ROW;
      memcpy(o, &row, 8);
      o += 8;
      if (writer_tensor(wr, v[l], o, (size_t)head * FAKE_V_ROW, n * FAKE_V_ROW) != 0) return -1;
      o += n * FAKE_V_ROW;
    }
  }
  return 0;
}

/* One sequence's body saved alone at head 0 of its stream: kv_fill, then body_write. */
static int body_save(struct llama_context *ctx, const seq_t *q, uint8_t *dst, state_io_t *wr) {
  uint32_t head;
  if (kv_fill(ctx, &q, 1, &head) != 0) return -1;
  return body_write(ctx, q, dst, wr, head);
}

/* One sequence's body, loaded alone at head 0 of its stream: parsed (the runs recorded), the
 * reader's writes, then the cells built from the tensors. body_parse's return value. */
static size_t body_read(struct llama_context *ctx, seq_t *q, const uint8_t *src, size_t avail,
                        state_io_t *rd) {
  size_t r = body_parse(ctx, q, src, avail, rd, 0);
  io_flush(rd);
  if (q->n_cells) body_assemble(ctx, q, 0);
  return r;
}

static int get_data_fails(void) {
  const char *e = getenv("FAKELLAMA_GET_DATA_FAIL");
  return e && e[0] == '1';
}

size_t llama_state_seq_get_size_ext(struct llama_context *ctx, llama_seq_id s,
                                    llama_state_seq_flags flags) {
  (void)flags;
  pthread_mutex_lock(&g_lock);
  seq_t *q = seq_of(ctx, s);
  size_t n = q ? 8 + body_size(ctx, q) : 0;
  pthread_mutex_unlock(&g_lock);
  return n;
}

size_t llama_state_seq_get_data_ext(struct llama_context *ctx, uint8_t *dst, size_t size,
                                    llama_seq_id s, llama_state_seq_flags flags) {
  (void)flags;
  if (get_data_fails()) return 0;
  pthread_mutex_lock(&g_lock);
  seq_t *q = seq_of(ctx, s);
  size_t n = 0;
  if (q && dst && size >= 8 + body_size(ctx, q)) {
    state_io_t wr;
    io_open_save(&wr, true); /* llama_io_write_host */
    put32(dst, IO_MAGIC);
    memcpy(dst + 4, &s, 4);
    if (body_save(ctx, q, dst + 8, &wr) == 0) n = 8 + body_size(ctx, q);
    io_close(&wr);
  }
  pthread_mutex_unlock(&g_lock);
  return n;
}

/* FAKELLAMA_SET_DATA_FAIL_OVER=N: a state of more than N cells does not load (the engine's
 * failure: 0, the destination emptied). */
static bool set_data_fails(const uint8_t *src, size_t size) {
  const char *e = getenv("FAKELLAMA_SET_DATA_FAIL_OVER");
  return e && size >= 8 && body_cells(src + 8, size - 8) > strtoul(e, NULL, 10);
}

size_t llama_state_seq_set_data_ext(struct llama_context *ctx, const uint8_t *src, size_t size,
                                    llama_seq_id dest, llama_state_seq_flags flags) {
  (void)flags;
  pthread_mutex_lock(&g_lock);
  state_io_t rd;
  io_open_load(&rd, true); /* llama_io_read_host */
  seq_t *q = seq_of(ctx, dest);
  size_t n = 0;
  if (q && src && set_data_fails(src, size)) q->n_cells = 0;
  else if (q && src && size >= 8 && get32(src) == IO_MAGIC) {
    size_t b = body_read(ctx, q, src + 8, size - 8, &rd);
    n = b == 0 || b == (size_t)-1 ? 0 : 8 + b;
  }
  io_close(&rd);
  pthread_mutex_unlock(&g_lock);
  return n;
}

/* The non-_ext functions call the _ext ones through the PLT, as llama.cpp does. */
size_t llama_state_seq_get_size(struct llama_context *ctx, llama_seq_id s) {
  return llama_state_seq_get_size_ext(ctx, s, 0);
}
size_t llama_state_seq_get_data(struct llama_context *ctx, uint8_t *dst, size_t size,
                                llama_seq_id s) {
  return llama_state_seq_get_data_ext(ctx, dst, size, s, 0);
}
size_t llama_state_seq_set_data(struct llama_context *ctx, const uint8_t *src, size_t size,
                                llama_seq_id dest) {
  return llama_state_seq_set_data_ext(ctx, src, size, dest, 0);
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

/* The file's bytes, malloc'ed (NULL when it cannot be read). */
static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  struct stat sb;
  uint8_t *b = NULL;
  if (fstat(fileno(f), &sb) == 0) {
    b = malloc((size_t)sb.st_size + 1);
    if (b && fread(b, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
      free(b);
      b = NULL;
    }
    *len = (size_t)sb.st_size;
  }
  fclose(f);
  return b;
}

size_t llama_state_seq_save_file(struct llama_context *ctx, const char *path, llama_seq_id s,
                                 const llama_token *tokens, size_t n) {
  pthread_mutex_lock(&g_lock);
  seq_t *q = seq_of(ctx, s);
  size_t ret = 0;
  FILE *f = q && path ? fopen(path, "wb") : NULL;
  if (f) {
    size_t bs = body_size(ctx, q);
    uint8_t *body = malloc(bs);
    uint32_t h[3] = {SEQ_MAGIC, SEQ_VERSION, (uint32_t)n};
    state_io_t wr;
    io_open_save(&wr, false); /* llama_io_write_file */
    if (body && body_save(ctx, q, body, &wr) == 0 && write_all(f, h, sizeof h) == 0 &&
        write_all(f, tokens, 4 * n) == 0 && write_all(f, body, bs) == 0)
      ret = sizeof h + 4 * n + bs;
    io_close(&wr);
    free(body);
    if (fclose(f) != 0) ret = 0;
  }
  pthread_mutex_unlock(&g_lock);
  return ret;
}

size_t llama_state_seq_load_file(struct llama_context *ctx, const char *path, llama_seq_id dest,
                                 llama_token *tokens_out, size_t cap, size_t *n_out) {
  size_t len = 0;
  uint8_t *b = path ? read_file(path, &len) : NULL;
  if (!b) return 0;
  pthread_mutex_lock(&g_lock);
  state_io_t rd;
  io_open_load(&rd, false); /* llama_io_read_file */
  size_t ret = 0;
  seq_t *q = seq_of(ctx, dest);
  if (!q || len < 12 || get32(b) != SEQ_MAGIC || get32(b + 4) != SEQ_VERSION) goto out;
  uint32_t n = get32(b + 8);
  if (!tokens_out) {
    if (n > (len - 12) / 4) goto out;
    *n_out = n;
    ret = 12;
    goto out;
  }
  if (n > cap || n > (len - 12) / 4) goto out;
  memcpy(tokens_out, b + 12, 4 * (size_t)n);
  *n_out = n;
  size_t off = 12 + 4 * (size_t)n;
  size_t r = body_read(ctx, q, b + off, len - off, &rd);
  if (r == (size_t)-1) {
    /* The pinned llama.cpp dies here (GGML_ASSERT in state_seq_load_file). */
    fprintf(stderr, "fakellama: truncated sequence state file %s: aborting like llama.cpp\n",
            path);
    abort();
  }
  if (r) ret = off + r;
out:
  io_close(&rd);
  pthread_mutex_unlock(&g_lock);
  free(b);
  return ret;
}

/* ---- whole context --------------------------------------------------------------------------- */

/* u32 len + ARCH, u32 n_seq, then per sequence its body. */
static size_t ctx_state_size(const struct llama_context *ctx) {
  size_t n = 4 + (sizeof ARCH - 1) + 4;
  for (uint32_t i = 0; i < ctx->n_seq; i++) n += body_size(ctx, &ctx->seq[i]);
  return n;
}

/* The whole context's state, one io object for all of it (as llama_context::state_write_data
 * writes the whole KV through one): every sequence kv_fill'ed into its stream's tensors after
 * the ones before it, then written in order. 0, or -1 when memory is short. */
static int ctx_state_write(struct llama_context *ctx, uint8_t *p, state_io_t *wr) {
  const seq_t *qs[MAX_SEQ];
  uint32_t head[MAX_SEQ];
  for (uint32_t i = 0; i < ctx->n_seq; i++) qs[i] = &ctx->seq[i];
  if (kv_fill(ctx, qs, ctx->n_seq, head) != 0) return -1;
  put32(p, sizeof ARCH - 1);
  memcpy(p + 4, ARCH, sizeof ARCH - 1);
  p += 4 + sizeof ARCH - 1;
  put32(p, ctx->n_seq);
  p += 4;
  for (uint32_t i = 0; i < ctx->n_seq; i++) {
    if (body_write(ctx, qs[i], p, wr, head[i]) != 0) return -1;
    p += body_size(ctx, qs[i]);
  }
  return 0;
}

/* The whole context's state, one reader for all of it (as llama_context::state_read_data
 * reads the whole KV through one io object): every sequence parsed in order, each into its
 * stream's tensors after the cells earlier sequences of this read placed there; then the
 * reader's writes; then the parsed sequences' cells built. A sequence that does not load
 * ends the read (0): the ones before it are loaded, it is empty, the ones after it unchanged. */
static size_t ctx_state_read(struct llama_context *ctx, const uint8_t *p, size_t avail,
                             state_io_t *rd) {
  size_t hdr = 4 + (sizeof ARCH - 1) + 4;
  if (avail < hdr || get32(p) != sizeof ARCH - 1 || memcmp(p + 4, ARCH, sizeof ARCH - 1) != 0 ||
      get32(p + 4 + sizeof ARCH - 1) != ctx->n_seq)
    return 0;
  size_t off = hdr;
  uint32_t placed[MAX_SEQ] = {0}; /* per stream: cells of this read's sequences so far */
  uint32_t head[MAX_SEQ];         /* per sequence: its first cell in its stream's tensors */
  uint32_t parsed = 0;
  bool ok = true;
  for (; parsed < ctx->n_seq; parsed++) {
    seq_t *q = &ctx->seq[parsed];
    uint32_t st = stream_of(ctx, q);
    head[parsed] = placed[st];
    size_t r = body_parse(ctx, q, p + off, avail - off, rd, head[parsed]);
    if (r == 0 || r == (size_t)-1) {
      ok = false;
      break;
    }
    placed[st] += q->n_cells;
    off += r;
  }
  io_flush(rd);
  for (uint32_t i = 0; i < parsed; i++)
    if (ctx->seq[i].n_cells) body_assemble(ctx, &ctx->seq[i], head[i]);
  return ok ? off : 0;
}

size_t llama_state_get_size(struct llama_context *ctx) {
  pthread_mutex_lock(&g_lock);
  size_t n = ctx ? ctx_state_size(ctx) : 0;
  pthread_mutex_unlock(&g_lock);
  return n;
}

size_t llama_state_get_data(struct llama_context *ctx, uint8_t *dst, size_t size) {
  pthread_mutex_lock(&g_lock);
  size_t n = 0;
  if (ctx && dst && size >= ctx_state_size(ctx)) {
    state_io_t wr;
    io_open_save(&wr, true); /* llama_io_write_host */
    if (ctx_state_write(ctx, dst, &wr) == 0) n = ctx_state_size(ctx);
    io_close(&wr);
  }
  pthread_mutex_unlock(&g_lock);
  return n;
}

size_t llama_state_set_data(struct llama_context *ctx, const uint8_t *src, size_t size) {
  pthread_mutex_lock(&g_lock);
  state_io_t rd;
  io_open_load(&rd, true); /* llama_io_read_host */
  size_t n = ctx && src ? ctx_state_read(ctx, src, size, &rd) : 0;
  io_close(&rd);
  pthread_mutex_unlock(&g_lock);
  return n;
}

bool llama_state_save_file(struct llama_context *ctx, const char *path, const llama_token *tokens,
                           size_t n) {
  pthread_mutex_lock(&g_lock);
  bool ok = false;
  FILE *f = ctx && path ? fopen(path, "wb") : NULL;
  if (f) {
    size_t ss = ctx_state_size(ctx);
    uint8_t *st = malloc(ss);
    uint32_t h[3] = {SESSION_MAGIC, SESSION_VERSION, (uint32_t)n};
    state_io_t wr;
    io_open_save(&wr, false); /* llama_io_write_file */
    ok = st && ctx_state_write(ctx, st, &wr) == 0 && write_all(f, h, sizeof h) == 0 &&
         write_all(f, tokens, 4 * n) == 0 && write_all(f, st, ss) == 0;
    io_close(&wr);
    free(st);
    if (fclose(f) != 0) ok = false;
  }
  pthread_mutex_unlock(&g_lock);
  return ok;
}

bool llama_state_load_file(struct llama_context *ctx, const char *path, llama_token *tokens_out,
                           size_t cap, size_t *n_out) {
  size_t len = 0;
  uint8_t *b = path ? read_file(path, &len) : NULL;
  if (!b) return false;
  pthread_mutex_lock(&g_lock);
  state_io_t rd;
  io_open_load(&rd, false); /* llama_io_read_file */
  bool ok = false;
  if (ctx && len >= 12 && get32(b) == SESSION_MAGIC && get32(b + 4) == SESSION_VERSION) {
    uint32_t n = get32(b + 8);
    if (n <= cap && n <= (len - 12) / 4 && tokens_out && n_out) {
      memcpy(tokens_out, b + 12, 4 * (size_t)n);
      *n_out = n;
      size_t off = 12 + 4 * (size_t)n;
      ok = ctx_state_read(ctx, b + off, len - off, &rd) == len - off;
    }
  }
  io_close(&rd);
  pthread_mutex_unlock(&g_lock);
  free(b);
  return ok;
}

/* ---- decoding: batches, outputs, memory, sampler (fakellama.h) ------------------------------ */

#define N_EMBD_OUT 16 /* floats of a fake output embedding */

static int32_t cell_pos(const uint8_t *cell) {
  int32_t p;
  memcpy(&p, cell, 4);
  return p;
}

/* The largest (max) or smallest position held in q, -1 when it holds none. */
static int32_t pos_bound_l(const struct llama_context *ctx, const seq_t *q, bool max) {
  size_t cs = cell_size(ctx->model);
  int32_t m = -1;
  for (uint32_t i = 0; i < q->n_cells; i++) {
    int32_t p = cell_pos(q->cells + (size_t)i * cs);
    if (max ? p > m : m < 0 || p < m) m = p;
  }
  return m;
}

struct llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max) {
  struct llama_batch b;
  memset(&b, 0, sizeof b);
  if (n_tokens <= 0 || n_seq_max <= 0) return b;
  if (embd) b.embd = calloc((size_t)n_tokens * (size_t)embd, sizeof *b.embd);
  else b.token = calloc((size_t)n_tokens, sizeof *b.token);
  b.pos = calloc((size_t)n_tokens, sizeof *b.pos);
  b.n_seq_id = calloc((size_t)n_tokens, sizeof *b.n_seq_id);
  b.seq_id = calloc((size_t)n_tokens + 1, sizeof *b.seq_id);
  for (int32_t i = 0; b.seq_id && i < n_tokens; i++)
    b.seq_id[i] = calloc((size_t)n_seq_max, sizeof **b.seq_id);
  b.logits = calloc((size_t)n_tokens, sizeof *b.logits);
  return b;
}

void llama_batch_free(struct llama_batch b) {
  free(b.token);
  free(b.embd);
  free(b.pos);
  free(b.n_seq_id);
  for (int32_t i = 0; b.seq_id && b.seq_id[i]; i++) free(b.seq_id[i]);
  free(b.seq_id);
  free(b.logits);
}

struct llama_batch llama_batch_get_one(llama_token *tokens, int32_t n_tokens) {
  struct llama_batch b = {n_tokens, tokens, NULL, NULL, NULL, NULL, NULL};
  return b;
}

static int32_t b_nseq(const struct llama_batch *b, int32_t i) { return b->n_seq_id ? b->n_seq_id[i] : 1; }
static int32_t b_seq(const struct llama_batch *b, int32_t i, int32_t j) {
  return b->seq_id ? b->seq_id[i][j] : 0;
}

static void fill_row(const struct llama_context *ctx, float *logits, float *embd, uint64_t chain,
                     int32_t pos) {
  uint64_t seed[4] = {ctx->model->id, ctx->kv_type, chain, (uint64_t)(uint32_t)pos};
  uint64_t x = XXH3_64bits(seed, sizeof seed) | 1;
  for (int k = 0; k < FAKELLAMA_N_VOCAB + N_EMBD_OUT; k++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    float v = (float)((x >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
    if (k < FAKELLAMA_N_VOCAB) logits[k] = v;
    else embd[k - FAKELLAMA_N_VOCAB] = v;
  }
}

/* Test knobs FAKELLAMA_DECODE_TOUCH (a file created when a llama_decode call starts) and
 * FAKELLAMA_DECODE_DELAY_MS (then it sleeps that long, outside the lock): a slow engine another
 * process can catch in the middle of a prompt. */
static void decode_knobs(void) {
  const char *t = getenv("FAKELLAMA_DECODE_TOUCH");
  if (t && *t) {
    int fd = open(t, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
  }
  const char *d = getenv("FAKELLAMA_DECODE_DELAY_MS");
  long ms = d ? strtol(d, NULL, 10) : 0;
  if (ms > 0) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
}

int32_t llama_decode(struct llama_context *ctx, struct llama_batch b) {
  if (!ctx) return -1;
  decode_knobs();
  pthread_mutex_lock(&g_lock);
  int32_t rc = -1, m = b.n_tokens;
  int32_t *pos = NULL;
  if (m <= 0 || !b.token || (uint32_t)m > ctx->n_batch) goto out;
  for (int32_t i = 0; i < m; i++) {
    if (b.token[i] < 0 || b.token[i] >= FAKELLAMA_N_VOCAB) goto out;
    int32_t ns = b_nseq(&b, i);
    if (ns < 1 || (uint32_t)ns > ctx->n_seq) goto out;
    for (int32_t j = 0; j < ns; j++)
      if (b_seq(&b, i, j) < 0 || (uint32_t)b_seq(&b, i, j) >= ctx->n_seq) goto out;
  }
  pos = malloc((size_t)m * sizeof *pos);
  if (!pos) goto out;
  int32_t next[MAX_SEQ], last[MAX_SEQ], count[MAX_SEQ];
  for (uint32_t s = 0; s < ctx->n_seq; s++) {
    next[s] = pos_bound_l(ctx, &ctx->seq[s], true) + 1;
    last[s] = INT32_MIN;
    count[s] = 0;
  }
  for (int32_t i = 0; i < m; i++) {
    pos[i] = b.pos ? b.pos[i] : next[b_seq(&b, i, 0)];
    for (int32_t j = 0; j < b_nseq(&b, i); j++) {
      int32_t s = b_seq(&b, i, j);
      if (!b.pos) next[s] = pos[i] + 1;
      int32_t pmax = pos_bound_l(ctx, &ctx->seq[s], true);
      if (last[s] == INT32_MIN) {
        if (pmax >= 0 && pos[i] != pmax + 1) goto out; /* Y = X + 1 */
      } else if (pos[i] < last[s] || pos[i] > last[s] + 1) {
        goto out; /* decreasing or not continuous */
      }
      last[s] = pos[i];
      count[s]++;
    }
  }
  uint32_t all = 0;
  for (uint32_t s = 0; s < ctx->n_seq; s++) {
    all += ctx->seq[s].n_cells + (uint32_t)count[s];
    if (ctx->seq[s].n_cells + (uint32_t)count[s] > ctx->n_ctx || (ctx->unified && all > ctx->n_ctx)) {
      rc = 1; /* no KV slot: nothing changes */
      goto out;
    }
  }
  int32_t n_out = 0;
  for (int32_t i = 0; i < m; i++)
    n_out += ctx->embeddings ? 1 : b.logits ? b.logits[i] != 0 : i == m - 1;
  float *rows = calloc((size_t)(n_out ? n_out : 1), (FAKELLAMA_N_VOCAB + N_EMBD_OUT) * sizeof(float));
  int32_t *ids = malloc((size_t)m * sizeof *ids);
  size_t cs = cell_size(ctx->model);
  bool room = true;
  for (uint32_t s = 0; s < ctx->n_seq; s++)
    if (seq_reserve(&ctx->seq[s], cs, ctx->seq[s].n_cells + (uint32_t)count[s]) != 0) room = false;
  if (!rows || !ids || !room) {
    free(rows);
    free(ids);
    goto out;
  }
  free(ctx->rows);
  free(ctx->out_ids);
  ctx->rows = rows;
  ctx->out_ids = ids;
  ctx->n_out_ids = m;
  ctx->n_outputs = 0;
  for (int32_t u0 = 0; u0 < m; u0 += (int32_t)ctx->n_ubatch) {
    int32_t R = m - u0 < (int32_t)ctx->n_ubatch ? m - u0 : (int32_t)ctx->n_ubatch;
    for (int32_t r = 0; r < R; r++) {
      int32_t i = u0 + r;
      uint32_t cls = (R >= 64 ? 2u : 0u) | (r < R - R % 4 ? 1u : 0u) |
                     (R >= 64 && pos[u0] % 64 != 0 ? 4u : 0u);
      uint64_t out_chain = 0;
      for (int32_t j = 0; j < b_nseq(&b, i); j++) {
        seq_t *q = &ctx->seq[b_seq(&b, i, j)];
        uint64_t chain = chain_next(last_chain(q, cs), last_payload_hash(q, cs), b.token[i], cls);
        fill_cell(ctx, q->cells + (size_t)q->n_cells * cs, pos[i], chain);
        q->n_cells++;
        if (j == 0) out_chain = chain;
      }
      bool out = ctx->embeddings ? true : b.logits ? b.logits[i] != 0 : i == m - 1;
      ids[i] = out ? ctx->n_outputs : -1;
      if (out) {
        float *row = rows + (size_t)ctx->n_outputs * (FAKELLAMA_N_VOCAB + N_EMBD_OUT);
        fill_row(ctx, row, row + FAKELLAMA_N_VOCAB, out_chain, pos[i]);
        ctx->n_outputs++;
      }
    }
  }
  ctx->decoded += (uint64_t)m;
  rc = 0;
out:
  free(pos);
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* Row of output i (the real semantics), or -1 with a message. */
static int32_t out_row(struct llama_context *ctx, int32_t i, const char *what) {
  int32_t j = -1;
  if (!ctx || !ctx->rows) j = -1;
  else if (i < 0) j = ctx->n_outputs + i;
  else if (i < ctx->n_out_ids) j = ctx->out_ids[i];
  if (j < 0 || j >= (ctx ? ctx->n_outputs : 0)) {
    fprintf(stderr, "fakellama: invalid %s id %d\n", what, i);
    return -1;
  }
  return j;
}

float *llama_get_logits(struct llama_context *ctx) { return ctx ? ctx->rows : NULL; }

float *llama_get_logits_ith(struct llama_context *ctx, int32_t i) {
  pthread_mutex_lock(&g_lock);
  int32_t j = out_row(ctx, i, "logits");
  float *r = j < 0 ? NULL : ctx->rows + (size_t)j * (FAKELLAMA_N_VOCAB + N_EMBD_OUT);
  pthread_mutex_unlock(&g_lock);
  return r;
}

float *llama_get_embeddings_ith(struct llama_context *ctx, int32_t i) {
  pthread_mutex_lock(&g_lock);
  int32_t j = out_row(ctx, i, "embeddings");
  float *r =
      j < 0 ? NULL : ctx->rows + (size_t)j * (FAKELLAMA_N_VOCAB + N_EMBD_OUT) + FAKELLAMA_N_VOCAB;
  pthread_mutex_unlock(&g_lock);
  return r;
}

uint32_t llama_n_ctx(const struct llama_context *ctx) { return ctx ? ctx->n_ctx : 0; }
uint32_t llama_n_ctx_seq(const struct llama_context *ctx) { return ctx ? ctx->n_ctx : 0; }
uint32_t llama_n_batch(const struct llama_context *ctx) { return ctx ? ctx->n_batch : 0; }
uint32_t llama_n_ubatch(const struct llama_context *ctx) { return ctx ? ctx->n_ubatch : 0; }
uint32_t llama_n_seq_max(const struct llama_context *ctx) { return ctx ? ctx->n_seq : 0; }

bool llama_supports_gpu_offload(void) {
  const char *e = getenv("FAKELLAMA_GPU");
  return e && e[0] == '1';
}

void llama_set_embeddings(struct llama_context *ctx, bool embeddings) {
  if (ctx) ctx->embeddings = embeddings;
}

llama_memory_t llama_get_memory(const struct llama_context *ctx) {
  return ctx ? (llama_memory_t)(uintptr_t)&ctx->mem_tag : NULL;
}

static struct llama_context *ctx_of_mem(llama_memory_t mem) {
  return mem ? (struct llama_context *)(void *)((char *)mem - offsetof(struct llama_context, mem_tag))
             : NULL;
}

/* Keep the cells of q for which keep(pos) is true, in order. */
static void seq_filter(const struct llama_context *ctx, seq_t *q, int32_t p0, int32_t p1,
                       int remove_in_range) {
  size_t cs = cell_size(ctx->model);
  uint32_t w = 0;
  for (uint32_t r = 0; r < q->n_cells; r++) {
    int32_t p = cell_pos(q->cells + (size_t)r * cs);
    bool in = p >= p0 && (p1 < 0 || p < p1);
    if (remove_in_range ? in : p < 0) continue;
    if (w != r) memmove(q->cells + (size_t)w * cs, q->cells + (size_t)r * cs, cs);
    w++;
  }
  q->n_cells = w;
}

void llama_memory_clear(llama_memory_t mem, bool data) {
  (void)data;
  struct llama_context *ctx = ctx_of_mem(mem);
  if (!ctx) return;
  pthread_mutex_lock(&g_lock);
  for (uint32_t s = 0; s < ctx->n_seq; s++) ctx->seq[s].n_cells = 0;
  pthread_mutex_unlock(&g_lock);
}

bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq, int32_t p0, int32_t p1) {
  struct llama_context *ctx = ctx_of_mem(mem);
  if (!ctx) return false;
  if (p0 < 0) p0 = 0;
  pthread_mutex_lock(&g_lock);
  for (uint32_t s = 0; s < ctx->n_seq; s++)
    if (seq < 0 || (uint32_t)seq == s) seq_filter(ctx, &ctx->seq[s], p0, p1, 1);
  pthread_mutex_unlock(&g_lock);
  return true;
}

void llama_memory_seq_cp(llama_memory_t mem, llama_seq_id src, llama_seq_id dst, int32_t p0,
                         int32_t p1) {
  struct llama_context *ctx = ctx_of_mem(mem);
  seq_t *a = seq_of(ctx, src), *d = seq_of(ctx, dst);
  if (!a || !d || a == d) return;
  if (p0 < 0) p0 = 0;
  pthread_mutex_lock(&g_lock);
  size_t cs = cell_size(ctx->model);
  if (seq_reserve(d, cs, d->n_cells + a->n_cells) == 0) {
    for (uint32_t r = 0; r < a->n_cells; r++) {
      const uint8_t *cell = a->cells + (size_t)r * cs;
      int32_t p = cell_pos(cell);
      if (p < p0 || (p1 >= 0 && p >= p1)) continue;
      /* insert sorted by position (stable) */
      uint32_t at = d->n_cells;
      while (at > 0 && cell_pos(d->cells + (size_t)(at - 1) * cs) > p) at--;
      memmove(d->cells + (size_t)(at + 1) * cs, d->cells + (size_t)at * cs,
              (size_t)(d->n_cells - at) * cs);
      memcpy(d->cells + (size_t)at * cs, cell, cs);
      d->n_cells++;
    }
  }
  pthread_mutex_unlock(&g_lock);
}

void llama_memory_seq_keep(llama_memory_t mem, llama_seq_id seq) {
  struct llama_context *ctx = ctx_of_mem(mem);
  if (!ctx) return;
  pthread_mutex_lock(&g_lock);
  for (uint32_t s = 0; s < ctx->n_seq; s++)
    if (seq < 0 || (uint32_t)seq != s) ctx->seq[s].n_cells = 0;
  pthread_mutex_unlock(&g_lock);
}

static void seq_map_pos(llama_memory_t mem, llama_seq_id seq, int32_t p0, int32_t p1, int32_t add,
                        int div) {
  struct llama_context *ctx = ctx_of_mem(mem);
  if (!ctx) return;
  if (p0 < 0) p0 = 0;
  pthread_mutex_lock(&g_lock);
  size_t cs = cell_size(ctx->model);
  for (uint32_t s = 0; s < ctx->n_seq; s++) {
    if (seq >= 0 && (uint32_t)seq != s) continue;
    seq_t *q = &ctx->seq[s];
    for (uint32_t r = 0; r < q->n_cells; r++) {
      uint8_t *cell = q->cells + (size_t)r * cs;
      int32_t p = cell_pos(cell);
      if (p < p0 || (p1 >= 0 && p >= p1)) continue;
      p = div > 1 ? p / div : p + add;
      memcpy(cell, &p, 4);
    }
    seq_filter(ctx, q, 0, -1, 0); /* drop cells shifted below 0 */
  }
  pthread_mutex_unlock(&g_lock);
}

void llama_memory_seq_add(llama_memory_t mem, llama_seq_id seq, int32_t p0, int32_t p1,
                          int32_t delta) {
  seq_map_pos(mem, seq, p0, p1, delta, 0);
}

void llama_memory_seq_div(llama_memory_t mem, llama_seq_id seq, int32_t p0, int32_t p1, int d) {
  seq_map_pos(mem, seq, p0, p1, 0, d);
}

static int32_t seq_pos_bound(llama_memory_t mem, llama_seq_id seq, bool max) {
  struct llama_context *ctx = ctx_of_mem(mem);
  seq_t *q = seq_of(ctx, seq);
  if (!q) return -1;
  pthread_mutex_lock(&g_lock);
  int32_t r = pos_bound_l(ctx, q, max);
  pthread_mutex_unlock(&g_lock);
  return r;
}

int32_t llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq) {
  return seq_pos_bound(mem, seq, false);
}

int32_t llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq) {
  return seq_pos_bound(mem, seq, true);
}

struct llama_sampler {
  int greedy;
};

struct llama_sampler *llama_sampler_init_greedy(void) {
  struct llama_sampler *s = calloc(1, sizeof *s);
  if (s) s->greedy = 1;
  return s;
}

void llama_sampler_free(struct llama_sampler *smpl) { free(smpl); }

llama_token llama_sampler_sample(struct llama_sampler *smpl, struct llama_context *ctx,
                                 int32_t idx) {
  (void)smpl;
  const float *l = llama_get_logits_ith(ctx, idx); /* through the PLT, as libllama does */
  if (!l) return -1;
  llama_token best = 0;
  for (llama_token t = 1; t < FAKELLAMA_N_VOCAB; t++)
    if (l[t] > l[best]) best = t;
  return best;
}

uint64_t fakellama_ctx_params_hash(const struct llama_context *ctx) {
  return ctx ? ctx->params_hash : 0;
}
