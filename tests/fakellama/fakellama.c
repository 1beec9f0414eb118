/* tests/fakellama: see fakellama.h. Test code: plain malloc and stdio, one global lock. */
#include "fakellama.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
  char name[64];
};

typedef struct seq {
  uint8_t *cells; /* n_cells * cell_size bytes */
  uint32_t n_cells, cap;
} seq_t;

struct llama_context {
  struct llama_model *model;
  uint32_t n_seq, kv_type;
  seq_t seq[MAX_SEQ];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t payload_size(const struct llama_model *m) {
  return (size_t)m->n_layer * m->n_embd;
}
static size_t cell_size(const struct llama_model *m) { return 4 + 8 + payload_size(m); }

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

struct llama_context_params llama_context_default_params(void) {
  struct llama_context_params p;
  memset(&p, 0, sizeof p);
  p.n_ctx = 4096;
  p.n_seq_max = 4;
  p.kv_type = 1;
  p.sentinel = FAKELLAMA_PARAMS_SENTINEL;
  return p;
}

struct llama_context *llama_init_from_model(struct llama_model *model,
                                            struct llama_context_params params) {
  if (!model || params.sentinel != FAKELLAMA_PARAMS_SENTINEL || params.n_seq_max == 0 ||
      params.n_seq_max > MAX_SEQ)
    return NULL;
  struct llama_context *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->model = model;
  c->n_seq = params.n_seq_max;
  c->kv_type = params.kv_type;
  return c;
}

void llama_free(struct llama_context *ctx) {
  if (!ctx) return;
  for (uint32_t i = 0; i < ctx->n_seq; i++) free(ctx->seq[i].cells);
  free(ctx);
}

const struct llama_model *llama_get_model(const struct llama_context *ctx) {
  return ctx ? ctx->model : NULL;
}

/* ---- the fake KV -------------------------------------------------------------------------- */

static seq_t *seq_of(struct llama_context *ctx, llama_seq_id s) {
  return ctx && s >= 0 && (uint32_t)s < ctx->n_seq ? &ctx->seq[s] : NULL;
}

static uint64_t chain_next(uint64_t prev, llama_token t) {
  return XXH3_64bits_withSeed(&t, sizeof t, prev);
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

int32_t fakellama_decode(struct llama_context *ctx, llama_seq_id s, const llama_token *tokens,
                         int32_t n) {
  pthread_mutex_lock(&g_lock);
  seq_t *q = seq_of(ctx, s);
  int32_t rc = -1;
  if (q && n >= 0 && (n == 0 || tokens)) {
    size_t cs = cell_size(ctx->model);
    if (seq_reserve(q, cs, q->n_cells + (uint32_t)n) == 0) {
      uint64_t chain = last_chain(q, cs);
      for (int32_t i = 0; i < n; i++) {
        chain = chain_next(chain, tokens[i]);
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

int fakellama_seq_check(struct llama_context *ctx, llama_seq_id s, const llama_token *tokens,
                        size_t n) {
  pthread_mutex_lock(&g_lock);
  seq_t *q = seq_of(ctx, s);
  int ok = q && q->n_cells == n;
  if (ok) {
    size_t cs = cell_size(ctx->model);
    uint8_t *want = malloc(cs);
    uint64_t chain = CHAIN_SEED;
    ok = want != NULL;
    for (size_t i = 0; ok && i < n; i++) {
      chain = chain_next(chain, tokens[i]);
      fill_cell(ctx, want, (int32_t)i, chain);
      ok = memcmp(want, q->cells + i * cs, cs) == 0;
    }
    free(want);
  }
  pthread_mutex_unlock(&g_lock);
  return ok;
}

/* ---- serialisation --------------------------------------------------------------------------- */

#define BODY_HDR 16u

static size_t body_size(const struct llama_context *ctx, const seq_t *q) {
  return BODY_HDR + (size_t)q->n_cells * cell_size(ctx->model);
}

static void body_write(const struct llama_context *ctx, const seq_t *q, uint8_t *dst) {
  put32(dst, ctx->model->n_layer);
  put32(dst + 4, ctx->model->n_embd);
  put32(dst + 8, ctx->kv_type);
  put32(dst + 12, q->n_cells);
  if (q->n_cells) memcpy(dst + BODY_HDR, q->cells, (size_t)q->n_cells * cell_size(ctx->model));
}

/* Parse a body from src[0, avail): the bytes it consumes, 0 when it does not fit this context
 * (shape or kv_type), or (size_t)-1 when src is shorter than the body claims. On 0 / -1 the
 * sequence is emptied, as llama.cpp does on a failed restore. */
static size_t body_read(struct llama_context *ctx, seq_t *q, const uint8_t *src, size_t avail) {
  q->n_cells = 0;
  if (avail < BODY_HDR) return (size_t)-1;
  if (get32(src) != ctx->model->n_layer || get32(src + 4) != ctx->model->n_embd ||
      get32(src + 8) != ctx->kv_type)
    return 0;
  uint32_t n = get32(src + 12);
  size_t cs = cell_size(ctx->model);
  if ((avail - BODY_HDR) / cs < n) return (size_t)-1;
  if (seq_reserve(q, cs, n) != 0) return 0;
  if (n) memcpy(q->cells, src + BODY_HDR, (size_t)n * cs);
  q->n_cells = n;
  return BODY_HDR + (size_t)n * cs;
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
    put32(dst, IO_MAGIC);
    memcpy(dst + 4, &s, 4);
    body_write(ctx, q, dst + 8);
    n = 8 + body_size(ctx, q);
  }
  pthread_mutex_unlock(&g_lock);
  return n;
}

size_t llama_state_seq_set_data_ext(struct llama_context *ctx, const uint8_t *src, size_t size,
                                    llama_seq_id dest, llama_state_seq_flags flags) {
  (void)flags;
  pthread_mutex_lock(&g_lock);
  seq_t *q = seq_of(ctx, dest);
  size_t n = 0;
  if (q && src && size >= 8 && get32(src) == IO_MAGIC) {
    size_t b = body_read(ctx, q, src + 8, size - 8);
    n = b == 0 || b == (size_t)-1 ? 0 : 8 + b;
  }
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
    if (body) {
      body_write(ctx, q, body);
      if (write_all(f, h, sizeof h) == 0 && write_all(f, tokens, 4 * n) == 0 &&
          write_all(f, body, bs) == 0)
        ret = sizeof h + 4 * n + bs;
    }
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
  size_t r = body_read(ctx, q, b + off, len - off);
  if (r == (size_t)-1) {
    /* The pinned llama.cpp dies here (GGML_ASSERT in state_seq_load_file). */
    fprintf(stderr, "fakellama: truncated sequence state file %s: aborting like llama.cpp\n",
            path);
    abort();
  }
  if (r) ret = off + r;
out:
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

static void ctx_state_write(const struct llama_context *ctx, uint8_t *p) {
  put32(p, sizeof ARCH - 1);
  memcpy(p + 4, ARCH, sizeof ARCH - 1);
  p += 4 + sizeof ARCH - 1;
  put32(p, ctx->n_seq);
  p += 4;
  for (uint32_t i = 0; i < ctx->n_seq; i++) {
    body_write(ctx, &ctx->seq[i], p);
    p += body_size(ctx, &ctx->seq[i]);
  }
}

static size_t ctx_state_read(struct llama_context *ctx, const uint8_t *p, size_t avail) {
  size_t hdr = 4 + (sizeof ARCH - 1) + 4;
  if (avail < hdr || get32(p) != sizeof ARCH - 1 || memcmp(p + 4, ARCH, sizeof ARCH - 1) != 0 ||
      get32(p + 4 + sizeof ARCH - 1) != ctx->n_seq)
    return 0;
  size_t off = hdr;
  for (uint32_t i = 0; i < ctx->n_seq; i++) {
    size_t r = body_read(ctx, &ctx->seq[i], p + off, avail - off);
    if (r == 0 || r == (size_t)-1) return 0;
    off += r;
  }
  return off;
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
    ctx_state_write(ctx, dst);
    n = ctx_state_size(ctx);
  }
  pthread_mutex_unlock(&g_lock);
  return n;
}

size_t llama_state_set_data(struct llama_context *ctx, const uint8_t *src, size_t size) {
  pthread_mutex_lock(&g_lock);
  size_t n = ctx && src ? ctx_state_read(ctx, src, size) : 0;
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
    if (st) {
      ctx_state_write(ctx, st);
      ok = write_all(f, h, sizeof h) == 0 && write_all(f, tokens, 4 * n) == 0 &&
           write_all(f, st, ss) == 0;
    }
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
  bool ok = false;
  if (ctx && len >= 12 && get32(b) == SESSION_MAGIC && get32(b + 4) == SESSION_VERSION) {
    uint32_t n = get32(b + 8);
    if (n <= cap && n <= (len - 12) / 4 && tokens_out && n_out) {
      memcpy(tokens_out, b + 12, 4 * (size_t)n);
      *n_out = n;
      size_t off = 12 + 4 * (size_t)n;
      ok = ctx_state_read(ctx, b + off, len - off) == len - off;
    }
  }
  pthread_mutex_unlock(&g_lock);
  free(b);
  return ok;
}
