/* refengine: the kvshim reference engine.
 *
 * A small prefill-only engine that does real work, so that offloading can be measured:
 *
 *   - requests are token sequences, read from a JSONL file or generated from a seed with a
 *     shared-prefix pattern (prefix groups shared by every request and every --rank, a
 *     per-request suffix that differs by request and by --rank);
 *   - each request is split into chunks of --chunk-tokens tokens; for every chunk and layer the
 *     engine computes K = X Wk and V = X Wv (matrix products of the chunk's activations with
 *     fixed random weights), then X = softsign(X Wx) for the next layer. Embeddings are a
 *     deterministic function of (token id, position), the weights of (--model-id, tensor rank),
 *     so a chunk's KV depends only on its tokens and position, and every process computes the
 *     same bytes for the same chunk;
 *   - the request's KV lives in device memory (cuMemAlloc); a chunk is computed into pinned
 *     staging memory (cuMemHostAlloc) and copied to the device;
 *   - KV offload goes through the kvo ABI (<kvshim/kvo.h>), implemented by the engine's own
 *     module libkvo_default.so and interposable by kvshim: before computing, kvo_lookup says how
 *     many leading chunks are cached and kvo_load_chunk fills them; once the prefill is done
 *     (TTFT), kvo_store_chunk is offered every computed full chunk. By default the buffer
 *     passed is the chunk's DEVICE memory; --kvo-buffer host passes the pinned staging buffer
 *     instead (the engine copies between it and the device).
 *
 * Output (stdout): one JSON object per request, then one summary object. Errors go to stderr.
 * Exit status: 0 ok, 1 runtime failure (CUDA, memory, I/O), 2 usage or bad input,
 * 3 --verify found a loaded chunk whose bytes differ from the recomputed ones. */
#include <cuda.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvshim/kvo.h>

#include "kvo_default.h"

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_VERIFY = 3 };

/* ============================================================================================
 * Options
 * ============================================================================================ */

typedef struct options {
  size_t requests;         /* generated requests; with a file: the first N lines (0 = all) */
  bool requests_given;
  uint64_t seed;           /* workload seed */
  size_t prompt_tokens;    /* tokens per generated request */
  double shared_prefix;    /* fraction of prompt_tokens shared, when prefix_tokens is unset */
  size_t prefix_tokens;    /* shared tokens; SIZE_MAX = derive from shared_prefix */
  size_t prefix_groups;    /* distinct shared prefixes; request i uses prefix i % groups */
  uint32_t vocab;          /* generated token ids are < vocab */
  uint32_t rank;           /* process index in a multi-process run: changes the suffixes */
  const char *requests_file;
  uint32_t chunk_tokens, layers, kv_heads, head_dim, hidden;
  uint32_t dtype;          /* kvo_dtype_t */
  uint32_t tp_rank, tp_size;
  const char *model_id;
  int device;
  int kvo_buf;             /* kvo_buf_kind_t passed to load/store */
  uint64_t native_cache;   /* bytes for libkvo_default's private LRU; 0 = none */
  bool verify;
  bool dump_requests;      /* print the workload as JSONL and exit */
  uint64_t hold_ms;        /* stay alive this long after the summary (peers read our cache) */
} options_t;

#define DEFAULT_REQUESTS 16
#define DEFAULT_PROMPT_TOKENS 2048
#define DEFAULT_SHARED_PREFIX 0.5
#define DEFAULT_VOCAB 32000
#define DEFAULT_CHUNK_TOKENS 256
#define DEFAULT_LAYERS 8
#define DEFAULT_KV_HEADS 2
#define DEFAULT_HEAD_DIM 32
#define DEFAULT_HIDDEN 64
#define DEFAULT_MODEL_ID "refengine"

static void usage(FILE *f) {
  fprintf(f,
    "usage: refengine [OPTIONS]\n"
    "Reference prefill engine: computes per-chunk KV with real arithmetic, keeps it in CUDA\n"
    "device memory and offloads it through the kvo ABI (libkvo_default.so, or kvshim).\n"
    "\n"
    "Workload:\n"
    "  --requests N          requests to generate (default %d); with --requests-file, use\n"
    "                        only the first N lines\n"
    "  --requests-file FILE  JSONL, one request per line: {\"tokens\":[1,2,3]}\n"
    "  --seed S              workload seed (default 1)\n"
    "  --prompt-tokens T     tokens per generated request (default %d)\n"
    "  --shared-prefix F     fraction of each prompt shared between requests, 0..1 (default %.1f)\n"
    "  --prefix-tokens P     shared tokens per prompt (instead of --shared-prefix)\n"
    "  --prefix-groups G     distinct shared prefixes; request i uses prefix i %% G (default 1)\n"
    "  --vocab V             generated token ids are < V (default %d)\n"
    "  --rank R              process index in a multi-process run: every rank shares the\n"
    "                        prefixes, the suffixes differ per rank (default 0)\n"
    "  --dump-requests       print the workload as JSONL (the --requests-file format), exit\n"
    "Model:\n"
    "  --model-id STR        model identity: seeds the weights, passed to kvo (default %s)\n"
    "  --chunk-tokens C      tokens per chunk (default %d)\n"
    "  --layers L            layers (default %d)\n"
    "  --kv-heads H          KV heads (default %d)\n"
    "  --head-dim D          elements per head (default %d)\n"
    "  --hidden E            embedding width (default %d)\n"
    "  --dtype f32|f16|bf16  KV element type (default f32)\n"
    "  --tp-rank R           tensor-parallel rank of this process (default 0): changes the\n"
    "                        weights (each rank holds other heads) and the kvo descriptor\n"
    "  --tp-size W           tensor-parallel ranks (default 1)\n"
    "Offload and device:\n"
    "  --native-cache SIZE   private in-process LRU in libkvo_default of SIZE bytes\n"
    "                        (suffix K, M, G, T or KiB, MiB, GiB, TiB; default 0 = none)\n"
    "  --kvo-buffer device|host  buffer passed to kvo load/store (default device)\n"
    "  --device N            CUDA device ordinal (default 0)\n"
    "  --verify              recompute every loaded chunk and compare bytes (exit 3 on mismatch)\n"
    "  --hold-ms MS          after the summary, stay alive MS milliseconds before exiting (so\n"
    "                        other processes can read what this one offloaded; default 0)\n"
    "  -h, --help            this text\n"
    "\n"
    "Output: one JSON line per request (request, tokens, ttft_ms = lookup + loads + computes,\n"
    "chunks, computed, loaded, stored, load_ms, store_ms; stores run after the prefill), then\n"
    "a summary line (\"summary\":true) with totals, TTFT mean/p50/p90 and wall_ms.\n"
    "Exit status: 0 ok, 1 runtime failure, 2 usage error or bad input, 3 verify mismatch.\n",
    DEFAULT_REQUESTS, DEFAULT_PROMPT_TOKENS, DEFAULT_SHARED_PREFIX, DEFAULT_VOCAB,
    DEFAULT_MODEL_ID, DEFAULT_CHUNK_TOKENS, DEFAULT_LAYERS, DEFAULT_KV_HEADS, DEFAULT_HEAD_DIM,
    DEFAULT_HIDDEN);
}

static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("refengine: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("\nusage: refengine [OPTIONS]  (refengine --help lists them)\n", stderr);
  va_end(ap);
  return EXIT_USAGE;
}

/* A whole-string unsigned decimal in [min, max]. */
static bool parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out) {
  if (s[0] < '0' || s[0] > '9') return false; /* no sign, no blanks */
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

/* Bytes with an optional binary suffix: 512, 64K, 1.5G, 256MiB. */
static bool parse_size(const char *s, uint64_t *out) {
  if (s[0] < '0' || s[0] > '9') return false;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s) return false;
  static const struct { const char *suffix; double mult; } units[] = {
      {"", 1},           {"B", 1},           {"K", 1024.0},      {"KiB", 1024.0},
      {"M", 1048576.0},  {"MiB", 1048576.0}, {"G", 1073741824.0}, {"GiB", 1073741824.0},
      {"T", 1099511627776.0}, {"TiB", 1099511627776.0},
  };
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(end, units[i].suffix) == 0) {
      double bytes = v * units[i].mult;
      if (!(bytes >= 0 && bytes < 18446744073709551616.0)) return false;
      *out = (uint64_t)bytes;
      return true;
    }
  }
  return false;
}

enum {
  OPT_REQUESTS = 256, OPT_REQUESTS_FILE, OPT_SEED, OPT_PROMPT_TOKENS, OPT_SHARED_PREFIX,
  OPT_PREFIX_TOKENS, OPT_PREFIX_GROUPS, OPT_VOCAB, OPT_RANK, OPT_MODEL_ID, OPT_CHUNK_TOKENS,
  OPT_LAYERS, OPT_KV_HEADS, OPT_HEAD_DIM, OPT_HIDDEN, OPT_DTYPE, OPT_TP_RANK, OPT_TP_SIZE,
  OPT_NATIVE_CACHE, OPT_KVO_BUFFER, OPT_DEVICE, OPT_VERIFY, OPT_DUMP_REQUESTS, OPT_HOLD_MS,
};

static const struct option long_options[] = {
    {"requests", required_argument, NULL, OPT_REQUESTS},
    {"requests-file", required_argument, NULL, OPT_REQUESTS_FILE},
    {"seed", required_argument, NULL, OPT_SEED},
    {"prompt-tokens", required_argument, NULL, OPT_PROMPT_TOKENS},
    {"shared-prefix", required_argument, NULL, OPT_SHARED_PREFIX},
    {"prefix-tokens", required_argument, NULL, OPT_PREFIX_TOKENS},
    {"prefix-groups", required_argument, NULL, OPT_PREFIX_GROUPS},
    {"vocab", required_argument, NULL, OPT_VOCAB},
    {"rank", required_argument, NULL, OPT_RANK},
    {"model-id", required_argument, NULL, OPT_MODEL_ID},
    {"chunk-tokens", required_argument, NULL, OPT_CHUNK_TOKENS},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
    {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
    {"hidden", required_argument, NULL, OPT_HIDDEN},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"tp-rank", required_argument, NULL, OPT_TP_RANK},
    {"tp-size", required_argument, NULL, OPT_TP_SIZE},
    {"native-cache", required_argument, NULL, OPT_NATIVE_CACHE},
    {"kvo-buffer", required_argument, NULL, OPT_KVO_BUFFER},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"verify", no_argument, NULL, OPT_VERIFY},
    {"dump-requests", no_argument, NULL, OPT_DUMP_REQUESTS},
    {"hold-ms", required_argument, NULL, OPT_HOLD_MS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Option value parsers: each prints a usage error and returns false on a bad value. */
static bool arg_uint(const char *name, const char *arg, uint64_t min, uint64_t max,
                     uint64_t *out) {
  if (parse_uint(arg, min, max, out)) return true;
  usage_error("%s: expected an integer in [%" PRIu64 ", %" PRIu64 "], got '%s'", name, min, max,
              arg);
  return false;
}

static bool arg_u32(const char *name, const char *arg, uint32_t min, uint32_t max,
                    uint32_t *out) {
  uint64_t v;
  if (!arg_uint(name, arg, min, max, &v)) return false;
  *out = (uint32_t)v;
  return true;
}

static bool arg_size(const char *name, const char *arg, size_t min, size_t max, size_t *out) {
  uint64_t v;
  if (!arg_uint(name, arg, min, max, &v)) return false;
  *out = (size_t)v;
  return true;
}

static bool arg_choice(const char *name, const char *arg, const char *const *choices,
                       const int *values, size_t n, int *out) {
  for (size_t i = 0; i < n; i++) {
    if (strcmp(arg, choices[i]) == 0) {
      *out = values[i];
      return true;
    }
  }
  usage_error("%s: unknown value '%s'", name, arg);
  return false;
}

/* Fills o from argv. Returns 0, -1 after --help (exit 0), or EXIT_USAGE after a message. */
static int parse_options(int argc, char **argv, options_t *o) {
  static const char *const dtypes[] = {"f32", "f16", "bf16"};
  static const int dtype_values[] = {KVO_DTYPE_F32, KVO_DTYPE_F16, KVO_DTYPE_BF16};
  static const char *const buffers[] = {"device", "host"};
  static const int buffer_values[] = {KVO_BUF_DEVICE, KVO_BUF_HOST};
  *o = (options_t){
      .requests = DEFAULT_REQUESTS, .seed = 1, .prompt_tokens = DEFAULT_PROMPT_TOKENS,
      .shared_prefix = DEFAULT_SHARED_PREFIX, .prefix_tokens = SIZE_MAX, .prefix_groups = 1,
      .vocab = DEFAULT_VOCAB, .chunk_tokens = DEFAULT_CHUNK_TOKENS, .layers = DEFAULT_LAYERS,
      .kv_heads = DEFAULT_KV_HEADS, .head_dim = DEFAULT_HEAD_DIM, .hidden = DEFAULT_HIDDEN,
      .dtype = KVO_DTYPE_F32, .tp_size = 1, .model_id = DEFAULT_MODEL_ID,
      .kvo_buf = KVO_BUF_DEVICE,
  };
  bool fraction_given = false;
  opterr = 0; /* our own messages */
  int c, dtype;
  while ((c = getopt_long(argc, argv, ":h", long_options, NULL)) != -1) {
    const char *a = optarg;
    bool ok = true;
    switch (c) {
    case 'h': usage(stdout); return -1;
    case '?': return usage_error("unknown option '%s'", argv[optind - 1]);
    case ':': return usage_error("option '%s' needs a value", argv[optind - 1]);
    case OPT_REQUESTS:
      ok = arg_size("--requests", a, 1, 1u << 20, &o->requests);
      o->requests_given = true;
      break;
    case OPT_REQUESTS_FILE: o->requests_file = a; break;
    case OPT_SEED: ok = arg_uint("--seed", a, 0, UINT64_MAX, &o->seed); break;
    case OPT_PROMPT_TOKENS:
      ok = arg_size("--prompt-tokens", a, 1, 1u << 24, &o->prompt_tokens);
      break;
    case OPT_SHARED_PREFIX: {
      char *end;
      errno = 0;
      double f = strtod(a, &end);
      if (errno != 0 || end == a || *end != '\0' || !(f >= 0.0 && f <= 1.0))
        return usage_error("--shared-prefix: expected a fraction in [0, 1], got '%s'", a);
      o->shared_prefix = f;
      fraction_given = true;
      break;
    }
    case OPT_PREFIX_TOKENS:
      ok = arg_size("--prefix-tokens", a, 0, 1u << 24, &o->prefix_tokens);
      break;
    case OPT_PREFIX_GROUPS:
      ok = arg_size("--prefix-groups", a, 1, 1u << 20, &o->prefix_groups);
      break;
    case OPT_VOCAB: ok = arg_u32("--vocab", a, 1, UINT32_MAX, &o->vocab); break;
    case OPT_RANK: ok = arg_u32("--rank", a, 0, 65535, &o->rank); break;
    case OPT_MODEL_ID:
      if (a[0] == '\0' || strlen(a) >= KVO_MODEL_ID_MAX)
        return usage_error("--model-id: expected 1 to %d bytes", KVO_MODEL_ID_MAX - 1);
      o->model_id = a;
      break;
    case OPT_CHUNK_TOKENS: ok = arg_u32("--chunk-tokens", a, 1, 65536, &o->chunk_tokens); break;
    case OPT_LAYERS: ok = arg_u32("--layers", a, 1, 1024, &o->layers); break;
    case OPT_KV_HEADS: ok = arg_u32("--kv-heads", a, 1, 1024, &o->kv_heads); break;
    case OPT_HEAD_DIM: ok = arg_u32("--head-dim", a, 1, 4096, &o->head_dim); break;
    case OPT_HIDDEN: ok = arg_u32("--hidden", a, 1, 65536, &o->hidden); break;
    case OPT_DTYPE:
      ok = arg_choice("--dtype (f32, f16, bf16)", a, dtypes, dtype_values, 3, &dtype);
      if (ok) o->dtype = (uint32_t)dtype;
      break;
    case OPT_TP_RANK: ok = arg_u32("--tp-rank", a, 0, 65535, &o->tp_rank); break;
    case OPT_TP_SIZE: ok = arg_u32("--tp-size", a, 1, 65536, &o->tp_size); break;
    case OPT_NATIVE_CACHE:
      if (!parse_size(a, &o->native_cache))
        return usage_error("--native-cache: expected a size such as 512M or 2GiB, got '%s'", a);
      break;
    case OPT_KVO_BUFFER:
      ok = arg_choice("--kvo-buffer (device, host)", a, buffers, buffer_values, 2, &o->kvo_buf);
      break;
    case OPT_DEVICE: {
      uint32_t dev = 0;
      ok = arg_u32("--device", a, 0, 1023, &dev);
      o->device = (int)dev;
      break;
    }
    case OPT_VERIFY: o->verify = true; break;
    case OPT_DUMP_REQUESTS: o->dump_requests = true; break;
    case OPT_HOLD_MS: ok = arg_uint("--hold-ms", a, 0, 86400000, &o->hold_ms); break;
    default: return usage_error("unhandled option '%s'", argv[optind - 1]); /* a table bug */
    }
    if (!ok) return EXIT_USAGE;
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);

  if (fraction_given && o->prefix_tokens != SIZE_MAX)
    return usage_error("--shared-prefix and --prefix-tokens are exclusive");
  if (o->prefix_tokens == SIZE_MAX)
    o->prefix_tokens = (size_t)llround(o->shared_prefix * (double)o->prompt_tokens);
  if (o->prefix_tokens > o->prompt_tokens)
    return usage_error("--prefix-tokens (%zu) exceeds --prompt-tokens (%zu)", o->prefix_tokens,
                       o->prompt_tokens);
  if (o->tp_rank >= o->tp_size)
    return usage_error("--tp-rank (%u) must be below --tp-size (%u)", o->tp_rank, o->tp_size);
  return 0;
}

/* ============================================================================================
 * Deterministic randomness: splitmix64 streams named by (seed, tag, index)
 * ============================================================================================ */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t stream(uint64_t seed, uint64_t tag, uint64_t index) {
  uint64_t s = seed;
  s = splitmix64(&s) ^ tag;
  s = splitmix64(&s) ^ index;
  return splitmix64(&s);
}

/* Uniform in [-1, 1): 24 random bits, exact in a float. */
static float unit_float(uint64_t *state) {
  return (float)((int32_t)(splitmix64(state) >> 40) - (1 << 23)) / (float)(1 << 23);
}

enum {
  TAG_PREFIX = 1, TAG_SUFFIX, TAG_EMBED, TAG_POSITION, TAG_WK, TAG_WV, TAG_WX,
};

static uint64_t fnv1a64(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s != '\0'; s++) h = (h ^ (unsigned char)*s) * 0x00000100000001b3ull;
  return h;
}

/* ============================================================================================
 * Workload: requests as token sequences
 * ============================================================================================ */

typedef struct request {
  uint32_t *tokens;
  size_t n;
} request_t;

typedef struct workload {
  request_t *req;
  size_t n;
  size_t max_tokens; /* longest request */
} workload_t;

static void workload_free(workload_t *w) {
  for (size_t i = 0; i < w->n; i++) free(w->req[i].tokens);
  free(w->req);
  *w = (workload_t){0};
}

/* Generated: request i = prefix (i % groups) ++ suffix (rank, i). Returns 0 or -ENOMEM. */
static int workload_generate(const options_t *o, workload_t *w) {
  w->req = calloc(o->requests, sizeof *w->req);
  if (w->req == NULL) return -ENOMEM;
  for (size_t i = 0; i < o->requests; i++) {
    request_t *r = &w->req[w->n];
    r->tokens = malloc(o->prompt_tokens * sizeof *r->tokens);
    if (r->tokens == NULL) return -ENOMEM;
    r->n = o->prompt_tokens;
    w->n++;
    uint64_t s = stream(o->seed, TAG_PREFIX, i % o->prefix_groups);
    for (size_t t = 0; t < o->prefix_tokens; t++)
      r->tokens[t] = (uint32_t)(splitmix64(&s) % o->vocab);
    s = stream(o->seed, TAG_SUFFIX, ((uint64_t)o->rank << 32) | i);
    for (size_t t = o->prefix_tokens; t < r->n; t++)
      r->tokens[t] = (uint32_t)(splitmix64(&s) % o->vocab);
  }
  w->max_tokens = o->prompt_tokens;
  return 0;
}

static void workload_dump(const workload_t *w, FILE *f) {
  for (size_t i = 0; i < w->n; i++) {
    fputs("{\"tokens\":[", f);
    for (size_t t = 0; t < w->req[i].n; t++)
      fprintf(f, t ? ",%" PRIu32 : "%" PRIu32, w->req[i].tokens[t]);
    fputs("]}\n", f);
  }
}

/* --- JSONL reading: {"tokens":[...]} per line, other keys ignored ------------------------- */

typedef struct cursor {
  const char *p, *end;
} cursor_t;

typedef struct token_vec {
  uint32_t *v;
  size_t n, cap;
} token_vec_t;

static void skip_ws(cursor_t *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n'))
    c->p++;
}

static bool eat(cursor_t *c, char ch) {
  skip_ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return true;
  }
  return false;
}

/* A string; *raw and *len get its bytes between the quotes (escapes left as written). */
static const char *parse_string(cursor_t *c, const char **raw, size_t *len) {
  if (!eat(c, '"')) return "expected a string";
  const char *start = c->p;
  for (; c->p < c->end; c->p++) {
    if (*c->p == '\\') {
      if (++c->p == c->end) break;
    } else if (*c->p == '"') {
      *raw = start;
      *len = (size_t)(c->p - start);
      c->p++;
      return NULL;
    }
  }
  return "unterminated string";
}

static const char *skip_value(cursor_t *c, int depth) {
  const char *raw, *err;
  size_t len;
  if (depth > 32) return "nested too deeply";
  skip_ws(c);
  if (c->p == c->end) return "expected a value";
  switch (*c->p) {
  case '"': return parse_string(c, &raw, &len);
  case '{':
  case '[': {
    bool object = *c->p == '{';
    char close = object ? '}' : ']';
    c->p++;
    if (eat(c, close)) return NULL;
    do {
      if (object) {
        if ((err = parse_string(c, &raw, &len)) != NULL) return err;
        if (!eat(c, ':')) return "expected ':'";
      }
      if ((err = skip_value(c, depth + 1)) != NULL) return err;
    } while (eat(c, ','));
    return eat(c, close) ? NULL : "expected ',' or a closing bracket";
  }
  default: {
    static const char *const literals[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
      size_t n = strlen(literals[i]);
      if ((size_t)(c->end - c->p) >= n && memcmp(c->p, literals[i], n) == 0) {
        c->p += n;
        return NULL;
      }
    }
    const char *start = c->p;
    while (c->p < c->end && strchr("+-0123456789.eE", *c->p) != NULL) c->p++;
    return c->p > start ? NULL : "unexpected character";
  }
  }
}

static const char *parse_token_array(cursor_t *c, token_vec_t *out) {
  if (!eat(c, '[')) return "\"tokens\" must be an array";
  if (eat(c, ']')) return NULL;
  do {
    skip_ws(c);
    uint64_t v = 0;
    const char *start = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
      v = v * 10 + (uint64_t)(*c->p++ - '0');
      if (v > UINT32_MAX) return "token id above 4294967295";
    }
    if (c->p == start || (c->p < c->end && strchr(".eE-+", *c->p) != NULL))
      return "token ids must be non-negative integers";
    if (out->n == out->cap) {
      size_t cap = out->cap ? out->cap * 2 : 256;
      uint32_t *v2 = realloc(out->v, cap * sizeof *v2);
      if (v2 == NULL) return "out of memory";
      out->v = v2;
      out->cap = cap;
    }
    out->v[out->n++] = (uint32_t)v;
  } while (eat(c, ','));
  return eat(c, ']') ? NULL : "expected ',' or ']' in \"tokens\"";
}

/* One line: an object with exactly one "tokens" key holding a non-empty array. */
static const char *parse_request_line(const char *line, size_t len, token_vec_t *out) {
  cursor_t c = {line, line + len};
  const char *raw, *err;
  size_t klen;
  bool seen = false;
  if (!eat(&c, '{')) return "expected a JSON object";
  if (!eat(&c, '}')) {
    do {
      if ((err = parse_string(&c, &raw, &klen)) != NULL) return err;
      if (!eat(&c, ':')) return "expected ':'";
      if (klen == 6 && memcmp(raw, "tokens", 6) == 0) {
        if (seen) return "duplicate \"tokens\"";
        if ((err = parse_token_array(&c, out)) != NULL) return err;
        seen = true;
      } else if ((err = skip_value(&c, 1)) != NULL) {
        return err;
      }
    } while (eat(&c, ','));
    if (!eat(&c, '}')) return "expected ',' or '}'";
  }
  skip_ws(&c);
  if (c.p != c.end) return "trailing characters after the object";
  if (!seen) return "no \"tokens\" array";
  if (out->n == 0) return "\"tokens\" is empty";
  return NULL;
}

/* Reads up to `limit` requests (0 = all). Returns 0, EXIT_USAGE (bad file, message printed)
 * or EXIT_RUNTIME. */
static int workload_read_file(const char *path, size_t limit, workload_t *w) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "refengine: %s: %s\n", path, strerror(errno));
    return EXIT_USAGE;
  }
  char *line = NULL;
  size_t cap = 0, w_cap = 0, lineno = 0;
  ssize_t len;
  int rc = 0;
  while ((limit == 0 || w->n < limit) && (len = getline(&line, &cap, f)) != -1) {
    lineno++;
    cursor_t blank = {line, line + len};
    skip_ws(&blank);
    if (blank.p == blank.end) continue;
    token_vec_t v = {0};
    const char *err = parse_request_line(line, (size_t)len, &v);
    if (err != NULL) {
      fprintf(stderr, "refengine: %s:%zu: %s\n", path, lineno, err);
      free(v.v);
      rc = EXIT_USAGE;
      break;
    }
    if (w->n == w_cap) {
      w_cap = w_cap ? w_cap * 2 : 64;
      request_t *r = realloc(w->req, w_cap * sizeof *r);
      if (r == NULL) {
        free(v.v);
        rc = EXIT_RUNTIME;
        break;
      }
      w->req = r;
    }
    w->req[w->n++] = (request_t){.tokens = v.v, .n = v.n};
    if (v.n > w->max_tokens) w->max_tokens = v.n;
  }
  if (rc == 0 && ferror(f)) {
    fprintf(stderr, "refengine: %s: read error\n", path);
    rc = EXIT_RUNTIME;
  }
  if (rc == 0 && w->n == 0) {
    fprintf(stderr, "refengine: %s: no requests\n", path);
    rc = EXIT_USAGE;
  }
  free(line);
  fclose(f);
  return rc;
}

/* ============================================================================================
 * Model: the arithmetic that produces one chunk's KV
 * ============================================================================================ */

typedef struct model {
  uint32_t layers, hidden, kv_dim, chunk_tokens; /* kv_dim = kv_heads * head_dim */
  uint64_t seed;    /* from the model id and tensor rank */
  float *wk, *wv;   /* per layer [hidden x kv_dim] */
  float *wx;        /* per layer [hidden x hidden]: activations of the next layer */
  float *x, *x_next; /* [chunk_tokens x hidden] */
  float *kv;        /* one chunk in f32, kvo layout: scratch for non-f32 dtypes */
} model_t;

static void model_free(model_t *m) {
  free(m->wk);
  free(m->wv);
  free(m->wx);
  free(m->x);
  free(m->x_next);
  free(m->kv);
  *m = (model_t){0};
}

static float *alloc_floats(size_t a, size_t b, size_t c) {
  if (b != 0 && a > SIZE_MAX / b) return NULL;
  if (c != 0 && a * b > SIZE_MAX / c / sizeof(float)) return NULL;
  return malloc(a * b * c * sizeof(float));
}

/* Uniform weights scaled to variance 1/hidden, so activations keep their magnitude. */
static void fill_weights(float *w, size_t n, uint64_t seed, uint64_t tag, uint32_t layer,
                         uint32_t hidden) {
  uint64_t s = stream(seed, tag, layer);
  float scale = sqrtf(3.0f / (float)hidden);
  for (size_t i = 0; i < n; i++) w[i] = unit_float(&s) * scale;
}

static int model_init(model_t *m, const options_t *o) {
  *m = (model_t){.layers = o->layers, .hidden = o->hidden, .kv_dim = o->kv_heads * o->head_dim,
                 .chunk_tokens = o->chunk_tokens};
  m->seed = fnv1a64(o->model_id) ^ stream(0, o->tp_rank, o->tp_size);
  size_t hk = (size_t)m->hidden * m->kv_dim, hh = (size_t)m->hidden * m->hidden;
  m->wk = alloc_floats(m->layers, m->hidden, m->kv_dim);
  m->wv = alloc_floats(m->layers, m->hidden, m->kv_dim);
  m->wx = alloc_floats(m->layers, m->hidden, m->hidden);
  m->x = alloc_floats(m->chunk_tokens, m->hidden, 1);
  m->x_next = alloc_floats(m->chunk_tokens, m->hidden, 1);
  m->kv = alloc_floats((size_t)m->layers * 2, m->chunk_tokens, m->kv_dim);
  if (!m->wk || !m->wv || !m->wx || !m->x || !m->x_next || !m->kv) {
    model_free(m);
    return -ENOMEM;
  }
  for (uint32_t l = 0; l < m->layers; l++) {
    fill_weights(m->wk + l * hk, hk, m->seed, TAG_WK, l, m->hidden);
    fill_weights(m->wv + l * hk, hk, m->seed, TAG_WV, l, m->hidden);
    fill_weights(m->wx + l * hh, hh, m->seed, TAG_WX, l, m->hidden);
  }
  return 0;
}

/* out[r][j] = sum_e x[r][e] * w[e][j] for r < rows: [rows x k] times [k x n]. The inner loop
 * runs along contiguous rows of w and out, so the compiler vectorises it. */
static void matmul(const float *restrict x, const float *restrict w, float *restrict out,
                   size_t rows, size_t k, size_t n) {
  for (size_t r = 0; r < rows; r++) {
    float *restrict o = out + r * n;
    memset(o, 0, n * sizeof *o);
    for (size_t e = 0; e < k; e++) {
      const float xe = x[r * k + e];
      const float *restrict we = w + e * n;
      for (size_t j = 0; j < n; j++) o[j] += xe * we[j];
    }
  }
}

/* Token embedding plus a position term: a function of (model, token id, position) only. */
static void embed(const model_t *m, uint32_t token, uint64_t position, float *x) {
  uint64_t st = stream(m->seed, TAG_EMBED, token);
  uint64_t sp = stream(m->seed, TAG_POSITION, position);
  for (uint32_t e = 0; e < m->hidden; e++) x[e] = unit_float(&st) + 0.5f * unit_float(&sp);
}

/* KV of one chunk: tokens[0, n) at positions first_pos.., n <= chunk_tokens, written to kv in
 * the kvo layout [layers][K,V][chunk_tokens][kv_dim]; rows n.. of a partial chunk are zero. */
static void model_chunk_kv(model_t *m, const uint32_t *tokens, size_t n, uint64_t first_pos,
                           float *kv) {
  const size_t plane = (size_t)m->chunk_tokens * m->kv_dim; /* one K or V of one layer */
  const size_t hk = (size_t)m->hidden * m->kv_dim, hh = (size_t)m->hidden * m->hidden;
  if (n < m->chunk_tokens) memset(kv, 0, (size_t)m->layers * 2 * plane * sizeof *kv);
  for (size_t t = 0; t < n; t++) embed(m, tokens[t], first_pos + t, m->x + t * m->hidden);
  for (uint32_t l = 0; l < m->layers; l++) {
    matmul(m->x, m->wk + l * hk, kv + (2 * (size_t)l) * plane, n, m->hidden, m->kv_dim);
    matmul(m->x, m->wv + l * hk, kv + (2 * (size_t)l + 1) * plane, n, m->hidden, m->kv_dim);
    if (l + 1 == m->layers) break;
    matmul(m->x, m->wx + l * hh, m->x_next, n, m->hidden, m->hidden);
    for (size_t i = 0; i < n * m->hidden; i++) /* softsign: cheap, smooth, bounded */
      m->x_next[i] = m->x_next[i] / (1.0f + fabsf(m->x_next[i]));
    float *swap = m->x;
    m->x = m->x_next;
    m->x_next = swap;
  }
}

/* --- KV element encoding (round to nearest even) ------------------------------------------ */

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static uint16_t f32_to_f16(float f) {
  uint32_t x = float_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t exp = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
  if (exp == 0xffu) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0)); /* inf, NaN */
  int32_t e = (int32_t)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);                          /* overflow */
  uint32_t m24 = mant | (exp ? 0x800000u : 0), shift = e > 0 ? 13u : (uint32_t)(14 - e);
  if (shift > 24) return sign;                                              /* underflow */
  uint32_t h = m24 >> shift, rem = m24 & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) h++;
  if (e > 0) h = ((uint32_t)e << 10) + (h - 0x400u); /* carry may round up into the exponent */
  return (uint16_t)(sign | h);
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static void encode_kv(const float *kv, size_t n, uint32_t dtype, void *out) {
  uint16_t *o = out;
  switch (dtype) {
  case KVO_DTYPE_F16: for (size_t i = 0; i < n; i++) o[i] = f32_to_f16(kv[i]); break;
  case KVO_DTYPE_BF16: for (size_t i = 0; i < n; i++) o[i] = f32_to_bf16(kv[i]); break;
  default: memcpy(out, kv, n * sizeof *kv); break;
  }
}

/* ============================================================================================
 * The engine: CUDA buffers, the prefill loop, kvo calls
 * ============================================================================================ */

typedef struct engine {
  const options_t *opt;
  kvo_desc_t desc;
  model_t model;
  size_t chunk_bytes;
  size_t max_chunks;     /* chunks of the longest request */
  CUdevice dev;
  CUcontext ctx;         /* the device's primary context, current on this thread */
  CUdeviceptr kv;        /* max_chunks * chunk_bytes: the running request's KV */
  void *staging;         /* pinned, one chunk: computed chunks on their way to the device */
  unsigned char *check;  /* --verify: one recomputed chunk */
  size_t kvo_errors;     /* kvo calls that returned a negative errno */
} engine_t;

typedef struct request_stats {
  double ttft_ms;    /* lookup + loads + computes: the prefill */
  double compute_ms; /* compute + H2D copy of the computed chunks */
  double load_ms;    /* kvo_load_chunk calls (and their H2D copy with --kvo-buffer host) */
  double store_ms;   /* kvo_store_chunk calls, after the prefill */
  double verify_ms;
  size_t chunks, computed, loaded;
  size_t offered, stored; /* full chunks passed to kvo_store_chunk; those kept */
} request_stats_t;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Prints a failed driver call; returns whether r is CUDA_SUCCESS. */
static bool cu_ok(CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) return true;
  const char *name = NULL;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL) name = "unknown error";
  fprintf(stderr, "refengine: %s failed: %s (%d)\n", call, name, (int)r);
  return false;
}

static void kvo_error(engine_t *eng, const char *call, int rc) {
  if (eng->kvo_errors++ < 8)
    fprintf(stderr, "refengine: %s: %s (%d); computing instead\n", call, strerror(-rc), rc);
}

static int engine_init(engine_t *eng, const options_t *o, size_t max_tokens) {
  *eng = (engine_t){.opt = o};
  kvo_desc_t *d = &eng->desc;
  d->abi_version = KVO_ABI_VERSION;
  d->size = sizeof *d;
  snprintf(d->model_id, sizeof d->model_id, "%s", o->model_id);
  d->dtype = o->dtype;
  d->layers = o->layers;
  d->kv_heads = o->kv_heads;
  d->head_dim = o->head_dim;
  d->chunk_tokens = o->chunk_tokens;
  d->rank = o->tp_rank;
  d->world_size = o->tp_size;
  d->layout = KVO_LAYOUT_LKTHD;
  d->chunk_bytes = kvo_desc_chunk_bytes(d);
  eng->max_chunks = (max_tokens + o->chunk_tokens - 1) / o->chunk_tokens;
  if (d->chunk_bytes == 0 || d->chunk_bytes > SIZE_MAX / eng->max_chunks) {
    fprintf(stderr, "refengine: a chunk of these dimensions does not fit in memory\n");
    return EXIT_USAGE;
  }
  eng->chunk_bytes = (size_t)d->chunk_bytes;

  if (model_init(&eng->model, o) != 0) {
    fprintf(stderr, "refengine: out of memory for the model weights\n");
    return EXIT_RUNTIME;
  }
  if (o->verify && (eng->check = malloc(eng->chunk_bytes)) == NULL) {
    fprintf(stderr, "refengine: out of memory for the verify buffer\n");
    return EXIT_RUNTIME;
  }
  if (!cu_ok(cuInit(0), "cuInit") || !cu_ok(cuDeviceGet(&eng->dev, o->device), "cuDeviceGet") ||
      !cu_ok(cuDevicePrimaryCtxRetain(&eng->ctx, eng->dev), "cuDevicePrimaryCtxRetain"))
    return EXIT_RUNTIME;
  if (!cu_ok(cuCtxSetCurrent(eng->ctx), "cuCtxSetCurrent") ||
      !cu_ok(cuMemAlloc(&eng->kv, eng->max_chunks * eng->chunk_bytes), "cuMemAlloc") ||
      !cu_ok(cuMemHostAlloc(&eng->staging, eng->chunk_bytes, 0), "cuMemHostAlloc"))
    return EXIT_RUNTIME;
  if (o->native_cache > 0) kvo_default_configure((size_t)o->native_cache);
  return 0;
}

static void engine_destroy(engine_t *eng) {
  if (eng->staging != NULL) cu_ok(cuMemFreeHost(eng->staging), "cuMemFreeHost");
  if (eng->kv != 0) cu_ok(cuMemFree(eng->kv), "cuMemFree");
  if (eng->ctx != NULL) cu_ok(cuDevicePrimaryCtxRelease(eng->dev), "cuDevicePrimaryCtxRelease");
  if (eng->opt != NULL && eng->opt->native_cache > 0) kvo_default_configure(0);
  model_free(&eng->model);
  free(eng->check);
  *eng = (engine_t){0};
}

/* Computes chunk i of r into out (chunk_bytes bytes, the desc's dtype). */
static void compute_chunk(engine_t *eng, const request_t *r, size_t i, void *out) {
  size_t first = i * eng->opt->chunk_tokens;
  size_t n = r->n - first < eng->opt->chunk_tokens ? r->n - first : eng->opt->chunk_tokens;
  if (eng->desc.dtype == KVO_DTYPE_F32) {
    model_chunk_kv(&eng->model, r->tokens + first, n, first, out);
  } else {
    model_chunk_kv(&eng->model, r->tokens + first, n, first, eng->model.kv);
    encode_kv(eng->model.kv, eng->chunk_bytes / kvo_dtype_size(eng->desc.dtype),
              eng->desc.dtype, out);
  }
}

/* kvo_load_chunk of chunk i into its device slot; true when loaded. */
static bool load_chunk(engine_t *eng, const request_t *r, size_t i, CUdeviceptr slot) {
  size_t prefix = (i + 1) * eng->opt->chunk_tokens;
  uint64_t buf = eng->opt->kvo_buf == KVO_BUF_DEVICE ? (uint64_t)slot
                                                       : (uint64_t)(uintptr_t)eng->staging;
  int rc = kvo_load_chunk(&eng->desc, r->tokens, prefix, i, eng->opt->kvo_buf, buf,
                          eng->chunk_bytes);
  if (rc < 0) kvo_error(eng, "kvo_load_chunk", rc);
  if (rc != KVO_OK) return false;
  if (eng->opt->kvo_buf == KVO_BUF_HOST)
    return cu_ok(cuMemcpyHtoD(slot, eng->staging, eng->chunk_bytes), "cuMemcpyHtoD");
  return true;
}

/* kvo_store_chunk of computed chunk i from its device slot (--kvo-buffer host: copied to
 * staging first). *kept tells whether the offload module kept it. Returns 0 or an exit status. */
static int store_chunk(engine_t *eng, const request_t *r, size_t i, CUdeviceptr slot,
                       bool *kept) {
  size_t prefix = (i + 1) * eng->opt->chunk_tokens;
  uint64_t buf = (uint64_t)slot;
  if (eng->opt->kvo_buf == KVO_BUF_HOST) {
    if (!cu_ok(cuMemcpyDtoH(eng->staging, slot, eng->chunk_bytes), "cuMemcpyDtoH"))
      return EXIT_RUNTIME;
    buf = (uint64_t)(uintptr_t)eng->staging;
  }
  int rc = kvo_store_chunk(&eng->desc, r->tokens, prefix, i, eng->opt->kvo_buf, buf,
                           eng->chunk_bytes);
  if (rc < 0) kvo_error(eng, "kvo_store_chunk", rc);
  *kept = rc == KVO_OK;
  return 0;
}

/* Recomputes loaded chunk i and compares it with the bytes in its device slot. */
static int verify_chunk(engine_t *eng, const request_t *r, size_t req_index, size_t i,
                        CUdeviceptr slot) {
  if (!cu_ok(cuMemcpyDtoH(eng->staging, slot, eng->chunk_bytes), "cuMemcpyDtoH"))
    return EXIT_RUNTIME;
  compute_chunk(eng, r, i, eng->check);
  const unsigned char *got = eng->staging;
  for (size_t b = 0; b < eng->chunk_bytes; b++) {
    if (got[b] != eng->check[b]) {
      fprintf(stderr,
              "refengine: verify: request %zu chunk %zu: loaded KV differs from the recomputed "
              "KV at byte %zu of %zu (loaded 0x%02x, computed 0x%02x)\n",
              req_index, i, b, eng->chunk_bytes, got[b], eng->check[b]);
      return EXIT_VERIFY;
    }
  }
  return 0;
}

/* Prefills one request: kvo_lookup, then chunk by chunk either kvo_load_chunk (while the
 * cached run lasts: KV is only usable as a prefix, so loading stops at the first chunk not
 * served) or compute. TTFT ends when every chunk's KV is on the device. Then the computed full
 * chunks are offered to kvo_store_chunk, off the TTFT path as engines offload after the
 * forward pass, and with --verify the loaded ones are recomputed and compared.
 * Returns 0 or an exit status. */
static int run_request(engine_t *eng, const request_t *r, size_t req_index, request_stats_t *st) {
  const size_t C = eng->opt->chunk_tokens;
  const size_t full = r->n / C;
  *st = (request_stats_t){.chunks = (r->n + C - 1) / C};

  double t0 = now_ms();
  int cached = kvo_lookup(&eng->desc, r->tokens, r->n);
  if (cached < 0) {
    kvo_error(eng, "kvo_lookup", cached);
    cached = 0;
  }
  size_t run = (size_t)cached < full ? (size_t)cached : full; /* chunks still to try loading */
  for (size_t i = 0; i < st->chunks; i++) {
    CUdeviceptr slot = eng->kv + i * eng->chunk_bytes;
    if (i < run) {
      double l0 = now_ms();
      bool loaded = load_chunk(eng, r, i, slot);
      st->load_ms += now_ms() - l0;
      if (loaded) {
        st->loaded++;
        continue;
      }
      run = i;
    }
    double c0 = now_ms();
    compute_chunk(eng, r, i, eng->staging);
    if (!cu_ok(cuMemcpyHtoD(slot, eng->staging, eng->chunk_bytes), "cuMemcpyHtoD"))
      return EXIT_RUNTIME;
    st->compute_ms += now_ms() - c0;
    st->computed++;
  }
  st->ttft_ms = now_ms() - t0;

  double s0 = now_ms();
  for (size_t i = st->loaded; i < full; i++) { /* chunks 0 .. loaded-1 were loaded */
    bool kept;
    int rc = store_chunk(eng, r, i, eng->kv + i * eng->chunk_bytes, &kept);
    if (rc != 0) return rc;
    st->offered++;
    st->stored += kept;
  }
  st->store_ms = now_ms() - s0;

  if (eng->opt->verify) {
    double v0 = now_ms();
    for (size_t i = 0; i < st->loaded; i++) {
      int rc = verify_chunk(eng, r, req_index, i, eng->kv + i * eng->chunk_bytes);
      if (rc != 0) return rc;
    }
    st->verify_ms = now_ms() - v0;
  }
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted values. */
static double percentile(const double *sorted, size_t n, double p) {
  size_t rank = (size_t)ceil(p * (double)n);
  return sorted[rank > 0 ? rank - 1 : 0];
}

static double per(double ms, size_t n) { return n ? ms / (double)n : 0.0; }

static int run_workload(engine_t *eng, const workload_t *w) {
  double *ttft = malloc(w->n * sizeof *ttft);
  if (ttft == NULL) {
    fprintf(stderr, "refengine: out of memory\n");
    return EXIT_RUNTIME;
  }
  request_stats_t sum = {0};
  size_t tokens = 0;
  double t0 = now_ms();
  for (size_t i = 0; i < w->n; i++) {
    request_stats_t st;
    int rc = run_request(eng, &w->req[i], i, &st);
    if (rc != 0) {
      free(ttft);
      return rc;
    }
    printf("{\"request\":%zu,\"tokens\":%zu,\"ttft_ms\":%.3f,\"chunks\":%zu,\"computed\":%zu,"
           "\"loaded\":%zu,\"stored\":%zu,\"load_ms\":%.3f,\"store_ms\":%.3f}\n",
           i, w->req[i].n, st.ttft_ms, st.chunks, st.computed, st.loaded, st.stored, st.load_ms,
           st.store_ms);
    fflush(stdout);
    ttft[i] = st.ttft_ms;
    tokens += w->req[i].n;
    sum.ttft_ms += st.ttft_ms;
    sum.compute_ms += st.compute_ms;
    sum.load_ms += st.load_ms;
    sum.store_ms += st.store_ms;
    sum.verify_ms += st.verify_ms;
    sum.chunks += st.chunks;
    sum.computed += st.computed;
    sum.loaded += st.loaded;
    sum.offered += st.offered;
    sum.stored += st.stored;
  }
  double wall_ms = now_ms() - t0 - sum.verify_ms;
  qsort(ttft, w->n, sizeof *ttft, cmp_double);
  printf("{\"summary\":true,\"requests\":%zu,\"tokens\":%zu,\"chunks\":%zu,"
         "\"chunks_computed\":%zu,\"chunks_loaded\":%zu,\"chunks_stored\":%zu,"
         "\"kvo_errors\":%zu,\"ttft_ms_mean\":%.3f,\"ttft_ms_p50\":%.3f,\"ttft_ms_p90\":%.3f,"
         "\"compute_ms_per_chunk\":%.3f,\"load_ms_per_chunk\":%.3f,"
         "\"store_ms_per_chunk\":%.3f,\"chunk_bytes\":%zu,\"wall_ms\":%.3f,\"verify\":\"%s\"}\n",
         w->n, tokens, sum.chunks, sum.computed, sum.loaded, sum.stored, eng->kvo_errors,
         sum.ttft_ms / (double)w->n, percentile(ttft, w->n, 0.5), percentile(ttft, w->n, 0.9),
         per(sum.compute_ms, sum.computed), per(sum.load_ms, sum.loaded),
         per(sum.store_ms, sum.offered), eng->chunk_bytes, wall_ms,
         eng->opt->verify ? "ok" : "off");
  fflush(stdout);
  free(ttft);
  return 0;
}

int main(int argc, char **argv) {
  options_t opt;
  int rc = parse_options(argc, argv, &opt);
  if (rc != 0) return rc < 0 ? 0 : rc;

  workload_t w = {0};
  if (opt.requests_file != NULL) {
    rc = workload_read_file(opt.requests_file, opt.requests_given ? opt.requests : 0, &w);
  } else if (workload_generate(&opt, &w) != 0) {
    fprintf(stderr, "refengine: out of memory for the requests\n");
    rc = EXIT_RUNTIME;
  }
  if (rc != 0) {
    workload_free(&w);
    return rc;
  }

  if (opt.dump_requests) {
    workload_dump(&w, stdout);
    workload_free(&w);
    return fflush(stdout) == 0 ? 0 : EXIT_RUNTIME;
  }

  engine_t eng;
  rc = engine_init(&eng, &opt, w.max_tokens);
  if (rc == 0) rc = run_workload(&eng, &w);
  if (rc == 0 && opt.hold_ms > 0) {
    struct timespec hold = {.tv_sec = (time_t)(opt.hold_ms / 1000),
                            .tv_nsec = (long)(opt.hold_ms % 1000) * 1000000L};
    while (nanosleep(&hold, &hold) != 0 && errno == EINTR) {
    }
  }
  engine_destroy(&eng);
  workload_free(&w);
  return rc;
}
