/* shims/llama: the models both adapters cache states of (model.h): the model table, the model
 * file fingerprint and path canonicalisation. A leaf: no hooks, no store, no other llama file. */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "log.h"
#include "model.h"

/* ---- fingerprint ---------------------------------------------------------------------------- */

#define FP_BUF 16384
#define FP_TAG "kvshim.llama.fingerprint/1"
#define GGUF_MAGIC 0x46554747u /* "GGUF" */
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_KEY 65535u
#define GGUF_MAX_DEPTH 2 /* arrays of arrays, at most (the format allows it; no one nests deeper) */

/* A forward-only reader over a file with a fixed buffer (pread: no shared file offset). */
typedef struct rd {
  int fd;
  uint64_t size, off; /* file size; file offset of buf[0] + pos */
  uint8_t *buf;
  size_t len, pos;    /* bytes valid in buf; next unread */
  bool bad;           /* short read or I/O error: everything after reads as failed */
} rd_t;

static bool rd_fill(rd_t *r) {
  if (r->bad) return false;
  if (r->pos < r->len) return true;
  r->off += r->len;
  r->len = r->pos = 0;
  if (r->off >= r->size) return false;
  uint64_t want = r->size - r->off < FP_BUF ? r->size - r->off : FP_BUF;
  ssize_t n;
  do n = pread(r->fd, r->buf, (size_t)want, (off_t)r->off);
  while (n < 0 && errno == EINTR);
  if (n <= 0) {
    r->bad = true;
    return false;
  }
  r->len = (size_t)n;
  return true;
}

/* Read n bytes into out (NULL: skip), feeding them to st when not NULL. */
static bool rd_take(rd_t *r, void *out, uint64_t n, XXH3_state_t *st) {
  uint8_t *o = out;
  if (!st && !o) { /* pure skip: jump without reading */
    uint64_t in_buf = r->len - r->pos;
    if (n <= in_buf) {
      r->pos += (size_t)n;
      return true;
    }
    uint64_t target = r->off + r->pos + n;
    if (target > r->size) {
      r->bad = true;
      return false;
    }
    r->off = target;
    r->len = r->pos = 0;
    return true;
  }
  while (n > 0) {
    if (!rd_fill(r)) {
      r->bad = true;
      return false;
    }
    size_t k = r->len - r->pos;
    if (k > n) k = (size_t)n;
    if (o) {
      memcpy(o, r->buf + r->pos, k);
      o += k;
    }
    if (st) XXH3_128bits_update(st, r->buf + r->pos, k);
    r->pos += k;
    n -= k;
  }
  return true;
}

static bool rd_u32(rd_t *r, uint32_t *v, XXH3_state_t *st) { return rd_take(r, v, 4, st); }
static bool rd_u64(rd_t *r, uint64_t *v, XXH3_state_t *st) { return rd_take(r, v, 8, st); }

/* Bytes of one scalar of GGUF type t; 0 for strings, arrays and unknown types. */
static uint32_t gguf_scalar_size(uint32_t t) {
  static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return t < sizeof sz ? sz[t] : 0;
}
enum { GGUF_T_STRING = 8, GGUF_T_ARRAY = 9, GGUF_T_MAX = 12 };

/* One value of type t: hashed into st when st is not NULL, else skipped. */
static bool gguf_value(rd_t *r, uint32_t t, XXH3_state_t *st, int depth) {
  if (t > GGUF_T_MAX) return false;
  if (t == GGUF_T_STRING) {
    uint64_t n;
    if (!rd_u64(r, &n, st) || n > r->size) return false;
    return rd_take(r, NULL, n, st);
  }
  if (t == GGUF_T_ARRAY) {
    uint32_t et;
    uint64_t count;
    if (depth >= GGUF_MAX_DEPTH || !rd_u32(r, &et, st) || !rd_u64(r, &count, st)) return false;
    if (et > GGUF_T_MAX || count > r->size) return false;
    uint32_t es = gguf_scalar_size(et);
    if (es) return rd_take(r, NULL, count * es, st); /* count <= size: no overflow */
    for (uint64_t i = 0; i < count; i++)
      if (!gguf_value(r, et, st, depth + 1)) return false;
    return true;
  }
  return rd_take(r, NULL, gguf_scalar_size(t), st);
}

/* Hash every general.* entry of a GGUF file's metadata into st. Returns false when the file is
 * not GGUF (v2/v3) or an entry is malformed; *info gets what was walked. */
static bool gguf_general(rd_t *r, XXH3_state_t *st, kvs__llama_fp_info_t *info) {
  uint32_t magic, version;
  uint64_t n_tensors, n_kv;
  if (!rd_u32(r, &magic, NULL) || magic != GGUF_MAGIC) return false;
  if (!rd_u32(r, &version, NULL) || version < 2 || version > 3) return false;
  if (!rd_u64(r, &n_tensors, NULL) || !rd_u64(r, &n_kv, NULL) || n_kv > GGUF_MAX_KV) return false;
  static const char prefix[] = "general.";
  const size_t plen = sizeof prefix - 1;
  for (uint64_t i = 0; i < n_kv; i++) {
    uint64_t klen;
    char head[sizeof prefix];
    if (!rd_u64(r, &klen, NULL) || klen == 0 || klen > GGUF_MAX_KEY) return false;
    size_t h = klen < plen ? (size_t)klen : plen;
    if (!rd_take(r, head, h, NULL)) return false;
    bool general = h == plen && memcmp(head, prefix, plen) == 0;
    XXH3_state_t *hs = general ? st : NULL;
    if (general) {
      XXH3_128bits_update(st, &klen, sizeof klen);
      XXH3_128bits_update(st, head, h);
    }
    uint32_t t;
    if (!rd_take(r, NULL, klen - h, hs) || !rd_u32(r, &t, hs) || !gguf_value(r, t, hs, 0))
      return false;
    info->n_kv++;
    if (general) info->general_keys++;
  }
  info->gguf_version = version;
  return true;
}

static bool hash_range(int fd, uint64_t size, uint64_t off, uint64_t n, uint8_t *buf,
                       XXH3_state_t *st) {
  rd_t r = {.fd = fd, .size = size, .off = off, .buf = buf};
  return rd_take(&r, NULL, n, st) && !r.bad;
}

int kvs__llama_fingerprint(const char *path, uint8_t out[KVS_LLAMA_FP_SIZE],
                           kvs__llama_fp_info_t *info) {
  if (!path || !out) return -EINVAL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = 0;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    rc = -errno;
    goto out;
  }
  if (!S_ISREG(sb.st_mode)) {
    rc = -EINVAL;
    goto out;
  }
  uint8_t buf[FP_BUF];
  XXH3_state_t st, part;
  kvs__llama_fp_info_t fi;
  memset(&fi, 0, sizeof fi);
  fi.size = (uint64_t)sb.st_size;
  fi.mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;

  XXH3_INITSTATE(&st);
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, FP_TAG, sizeof FP_TAG);
  XXH3_128bits_update(&st, &fi.size, sizeof fi.size);
  XXH3_128bits_update(&st, &fi.mtime_ns, sizeof fi.mtime_ns);
  uint64_t edge = fi.size < KVS_LLAMA_FP_EDGE ? fi.size : KVS_LLAMA_FP_EDGE;
  for (int tail = 0; tail < 2; tail++) {
    XXH3_INITSTATE(&part);
    XXH3_128bits_reset(&part);
    if (!hash_range(fd, fi.size, tail ? fi.size - edge : 0, edge, buf, &part)) {
      rc = -EIO;
      goto out;
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&part));
    XXH3_128bits_update(&st, &c, sizeof c);
  }
  /* general.* metadata, hashed on its own so a walk that stops half way is still recorded
   * deterministically (its partial hash plus the "stopped" mark). */
  XXH3_INITSTATE(&part);
  XXH3_128bits_reset(&part);
  rd_t r = {.fd = fd, .size = fi.size, .buf = buf};
  uint8_t meta_ok = gguf_general(&r, &part, &fi) ? 1 : 0;
  if (!meta_ok) fi.gguf_version = 0;
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&part));
  XXH3_128bits_update(&st, &meta_ok, 1);
  XXH3_128bits_update(&st, &c, sizeof c);
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
  memcpy(out, c.digest, KVS_LLAMA_FP_SIZE);
  if (info) *info = fi;
out:
  close(fd);
  return rc;
}

/* ---- paths ----------------------------------------------------------------------------------- */

int kvs__llama_canon_path(const char *path, char *out, size_t cap) {
  if (!path || !out || cap < 2) return -EINVAL;
  size_t n;
  if (path[0] == '/') {
    out[0] = '/';
    n = 1;
  } else {
    if (!getcwd(out, cap)) return errno == ERANGE ? -ENAMETOOLONG : -ENOENT;
    if (out[0] != '/') return -ENOENT; /* "(unreachable)": the cwd is outside our root */
    n = strlen(out);
  }
  /* Invariant: out[0, n) is normalised, starts with '/' and has no trailing '/' unless n == 1. */
  for (const char *p = path; *p;) {
    while (*p == '/') p++;
    const char *s = p;
    while (*p && *p != '/') p++;
    size_t k = (size_t)(p - s);
    if (k == 0 || (k == 1 && s[0] == '.')) continue;
    if (k == 2 && s[0] == '.' && s[1] == '.') {
      while (n > 1 && out[n - 1] != '/') n--; /* drop the last component ... */
      if (n > 1) n--;                        /* ... and its slash, unless it is the root */
      continue;
    }
    if (n + (n > 1) + k >= cap) return -ENAMETOOLONG;
    if (n > 1) out[n++] = '/';
    memcpy(out + n, s, k);
    n += k;
  }
  out[n] = '\0';
  return (int)n;
}

/* ---- the model table -------------------------------------------------------------------------- */

#define MODELS_MAX 64

/* Invariant: g_models[0, g_nmodels) hold distinct live models (g_models_lock). */
static kvs__llama_model_t g_models[MODELS_MAX];
static size_t g_nmodels;
static pthread_mutex_t g_models_lock = PTHREAD_MUTEX_INITIALIZER;

static void models_put(const kvs__llama_model_t *m) {
  pthread_mutex_lock(&g_models_lock);
  size_t i = 0;
  while (i < g_nmodels && g_models[i].model != m->model) i++;
  bool fits = i < MODELS_MAX;
  if (fits) {
    g_models[i] = *m;
    if (i == g_nmodels) g_nmodels++;
  }
  pthread_mutex_unlock(&g_models_lock);
  if (!fits)
    kvs_log_warn("llama.cpp: more than %d models loaded: states of the newest are not cached",
                 MODELS_MAX);
}

void kvs__llama_model_forget(const struct llama_model *model) {
  pthread_mutex_lock(&g_models_lock);
  for (size_t i = 0; i < g_nmodels; i++)
    if (g_models[i].model == model) {
      g_models[i] = g_models[--g_nmodels];
      memset(&g_models[g_nmodels], 0, sizeof g_models[g_nmodels]);
      break;
    }
  pthread_mutex_unlock(&g_models_lock);
}

bool kvs__llama_model_get(const struct llama_model *model, kvs__llama_model_t *out) {
  bool found = false;
  if (!model) return false;
  pthread_mutex_lock(&g_models_lock);
  for (size_t i = 0; i < g_nmodels && !found; i++)
    if (g_models[i].model == model) {
      *out = g_models[i];
      found = true;
    }
  pthread_mutex_unlock(&g_models_lock);
  return found;
}

int kvs__llama_model_add(const struct llama_model *model, const char *path,
                         const kvs_options_t *o) {
  kvs__llama_model_t m;
  memset(&m, 0, sizeof m);
  m.model = model;
  kvs__llama_fp_info_t fi;
  int rc = kvs__llama_fingerprint(path, m.fp, &fi);
  if (rc < 0) {
    kvs_log_warn("llama.cpp: cannot fingerprint model %s (%s): its states are not cached", path,
                 strerror(-rc));
    return rc;
  }
  kvs_namespace_t ns;
  memset(&ns, 0, sizeof ns);
  memcpy(ns.engine, "llama.cpp", sizeof "llama.cpp");
  memcpy(ns.model, m.fp, KVS_LLAMA_FP_SIZE);
  ns.model_len = KVS_LLAMA_FP_SIZE;
  ns.chunk_tokens = (uint32_t)o->chunk_tokens;
  ns.world_size = 1;
  kvs_namespace_set_salt(&ns, o->salt);
  m.ns = kvs_keys_namespace(&ns);
  models_put(&m);
  char hex[KVS_KEY_HEX_LEN + 1];
  kvs_key_format(m.ns, hex);
  kvs_log_info("llama.cpp: model %s: %llu bytes, GGUF v%u, %u general.* keys, namespace %s",
               path, (unsigned long long)fi.size, fi.gguf_version, fi.general_keys, hex);
  return 0;
}

/* ---- the llama.cpp releases kvshim knows ------------------------------------------------------ */

typedef struct release {
  const char *nlc, *llama;
  int layout;
} release_t;

#define RELEASE_ROW(nlc, llama, layout) {nlc, llama, layout},
static const release_t g_releases[] = {KVS_LLAMA_RELEASES(RELEASE_ROW)};
#undef RELEASE_ROW

/* llama_context_default_params() of layout 1 (model.h): the pinned llama.cpp's
 * src/llama-context.cpp; threads (GGML_DEFAULT_N_THREADS) are not compared. */
static bool layout1(const kvs__llama_cparams_t *p) {
  return p->n_ctx == 512 && p->n_batch == 2048 && p->n_ubatch == 512 && p->n_seq_max == 1 &&
         p->n_rs_seq == 0 && p->n_outputs_max == 0 && p->n_outputs_max_per_seq == 1 &&
         p->ctx_type == 0 && p->rope_scaling_type == -1 && p->pooling_type == -1 &&
         p->attention_type == -1 && p->flash_attn_type == -1 && p->rope_freq_base == 0.0f &&
         p->rope_freq_scale == 0.0f && p->yarn_ext_factor == -1.0f &&
         p->yarn_attn_factor == -1.0f && p->yarn_beta_fast == -1.0f &&
         p->yarn_beta_slow == -1.0f && p->yarn_orig_ctx == 0 && p->defrag_thold == -1.0f &&
         !p->cb_eval && !p->cb_eval_user_data && p->type_k == 1 && p->type_v == 1 &&
         !p->abort_callback && !p->abort_callback_data && !p->embeddings && p->offload_kqv &&
         p->no_perf && p->op_offload && p->swa_full && !p->kv_unified && !p->samplers &&
         p->n_samplers == 0 && !p->ctx_other;
}

int kvs__llama_release_layout(const kvs__llama_cparams_t *d) { return d && layout1(d) ? 1 : 0; }

/* "node-llama-cpp 3.21.1 (llama.cpp v0.4.0), ..." for the rows of layout (0: every row). */
static void release_names(int layout, char *out, size_t cap) {
  size_t n = 0;
  out[0] = '\0';
  for (size_t i = 0; i < sizeof g_releases / sizeof g_releases[0]; i++) {
    const release_t *r = &g_releases[i];
    if (layout && r->layout != layout) continue;
    int k = snprintf(out + n, cap - n, "%snode-llama-cpp %s (llama.cpp %s)", n ? ", " : "", r->nlc,
                     r->llama);
    if (k < 0 || (size_t)k >= cap - n) break;
    n += (size_t)k;
  }
}

void kvs__llama_release_report(int layout) {
  char names[256];
  release_names(layout, names, sizeof names);
  if (layout > 0)
    kvs_log_info("llama.cpp: struct llama_context_params of a known release: %s", names);
  else
    kvs_log_warn("llama.cpp: unknown llama.cpp release (llama_context_default_params() is none "
                 "of the known releases: %s): the prefix cache passes every call through; "
                 "state files are still cached", names);
}

void kvs__llama_model_fork_child(void) { pthread_mutex_init(&g_models_lock, NULL); }
