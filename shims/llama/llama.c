/* shims/llama: the llama.cpp state API adapter (design §10.2).
 *
 * Hooked (KVS_LLAMA_HOOKS, exported from libkvshim.so):
 *   llama_state_seq_save_file   the state goes into the node cache: one store object
 *                               [header | tokens | in-memory state] (llama_internal.h) under
 *                               the keys  primary = name key of the canonical path,
 *                                         alias   = prefix key of all the tokens,
 *                               both inside the model's namespace. The real get_size gives the
 *                               size, the real get_data writes straight into the reserved
 *                               extent (zero copy), then commit and write-behind to a cache
 *                               peer. The real file is written too unless
 *                               KVSHIM_LLAMA_WRITE_THROUGH=0. Returns what the real function
 *                               returns (with write-through off: the byte count it would
 *                               have returned, kvs__llama_file_bytes).
 *   llama_state_seq_load_file   the blob is looked up by path, locally then at peers (a peer's
 *                               copy is retrieved into a local extent and kept); every check
 *                               of llama_internal.h passes, the state file was not replaced
 *                               since (ll_stale), the tokens fit: the real set_data restores
 *                               the state straight from the pool, the tokens are copied out,
 *                               and the return value is the real function's (12 + 4n + body).
 *                               A miss or any failed check calls the real function.
 *   llama_model_load_from_file  fingerprints the model file (format.c) and records
 *                               model -> (fingerprint, namespace key); llama_model_free forgets
 *                               it (a later model at the same address must not inherit it).
 *   the others                  pass through and are counted (hook_calls), so the family is
 *                               complete: get_size/get_data/set_data (+ _ext) and the
 *                               whole-context llama_state_save_file/_load_file.
 * A context's model comes from the engine's own llama_get_model (KVS_LLAMA_USES).
 * Routes in: the exported wrappers (PLT calls, also from plugins opened RTLD_LOCAL), and
 * dlsym(handle, "llama_...") of a hooked name, which returns the wrapper when the lookup found
 * the very function the wrapper calls (ctypes-style engines look every function up this way).
 *
 * The model namespace: engine "llama.cpp", the 16-byte model fingerprint, KVSHIM_CHUNK_TOKENS,
 * KVSHIM_SALT. KV layout fields are left 0: the fingerprint names the weights, and a context
 * whose KV layout differs (KV dtype, ...) is caught by the engine's own set_data, which then
 * fails and sends us to the real function.
 *
 * Fail open (§9.5, §14): the real functions are resolved where the engine loaded them, even in
 * a plugin opened RTLD_LOCAL (kvs__resolve_engine_symbol; dlsym(RTLD_NEXT) sees nothing there);
 * a missing one makes its hook return the engine's own failure value (0 / false / NULL), never
 * a call through NULL. A save the cache cannot keep is written by the real function even with
 * write-through off, so no state is ever lost. The engine never gets a blob that failed a
 * check, and never a truncated state file (the real engine aborts on one): kvshim writes no
 * state files of its own, and restores only through set_data, which reads from memory.
 *
 * Overwriting a path. A save to a path that is already cached replaces the local object. A
 * copy at a peer cannot be replaced, so a load checks the blob against the file on disk: a
 * blob saved with write-through records the identity of the file it wrote (device, inode,
 * size, mtime) and is refused when the file now differs; a blob saved without write-through
 * is refused when the file is newer than the save. With no file at all the blob is served.
 * Known limit: with write-through off and no file on disk, a path saved with different states
 * by two processes may be served from either copy (which one is newest is not tracked across
 * peers).
 *
 * Re-entry: ll_depth (thread local) makes a llama hook called from inside another one (the
 * engine's own get_size -> get_size_ext, our get_data call) pass straight through, so every
 * engine call is counted once. kvs__hook_depth is raised only around kvshim's own work, never
 * around calls into the engine, so the CUDA hooks keep seeing the engine's allocations.
 *
 * Threads: calls arrive on any engine thread. g_models_lock guards the model table; the
 * real-function table is atomics written once per row (racing resolvers store one value). */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "internal.h"
#include "keys.h"
#include "llama_internal.h"
#include "log.h"
#include "peer.h"
#include "pool.h"
#include "preload.h"
#include "stats.h"
#include "store.h"

/* ---- kvshim's declaration of the llama.h ABI it touches ----------------------------------- */

struct llama_context; /* opaque */
struct llama_model;   /* opaque */

/* struct llama_model_params, passed by value to llama_model_load_from_file. Its layout changes
 * between llama.cpp versions (80 bytes in the pinned one), and kvshim never reads it: it only
 * forwards it. Every such struct is larger than 16 bytes, so both supported ABIs pass it in
 * memory (x86-64: copied onto the stack; AArch64: a pointer to the caller's copy), and
 * forwarding a larger block than the caller passed copies the caller's bytes first, then some
 * of the caller's own stack, which the callee never reads. KVS_LLAMA_PARAMS_MAX must stay
 * above the engine's sizeof(struct llama_model_params). */
#define KVS_LLAMA_PARAMS_MAX 256
typedef struct kvs__llama_model_params {
  uint64_t words[KVS_LLAMA_PARAMS_MAX / 8];
} kvs__llama_model_params_t;

#include "llama_hooks.h"

#define LL_PFN(ret, name, params, args) typedef ret(*kvs__llama_pfn_##name) params;
KVS_LLAMA_HOOKS(LL_PFN)
KVS_LLAMA_USES(LL_PFN)
#undef LL_PFN

#define LL_WRAPPER_DECL(ret, name, params, args) \
  ret name params __attribute__((visibility("default")));
KVS_LLAMA_HOOKS(LL_WRAPPER_DECL)
#undef LL_WRAPPER_DECL

/* Rows: hooks first, then the functions kvshim only uses. */
enum ll_row {
#define LL_ROW_ENUM(ret, name, params, args) LL_##name,
  KVS_LLAMA_HOOKS(LL_ROW_ENUM) LL__NHOOKS,
  LL__USES_START = LL__NHOOKS - 1,
  KVS_LLAMA_USES(LL_ROW_ENUM) LL__NROWS
#undef LL_ROW_ENUM
};

static const char *const ll_names[LL__NROWS] = {
#define LL_ROW_NAME(ret, name, params, args) [LL_##name] = #name,
    KVS_LLAMA_HOOKS(LL_ROW_NAME) KVS_LLAMA_USES(LL_ROW_NAME)
#undef LL_ROW_NAME
};

typedef void (*ll_code_t)(void);
static const ll_code_t ll_wrappers[LL__NHOOKS] = {
#define LL_WRAPPER_PTR(ret, name, params, args) [LL_##name] = (ll_code_t)&name,
    KVS_LLAMA_HOOKS(LL_WRAPPER_PTR)
#undef LL_WRAPPER_PTR
};

/* ---- real functions ------------------------------------------------------------------------- */

static _Atomic(ll_code_t) g_real[LL__NROWS]; /* NULL until found; misses are retried */

static __attribute__((noinline)) ll_code_t ll_resolve_slow(enum ll_row row) {
  kvs__preload_options(); /* the log level, before the line below */
  kvs__hook_depth++;
  void *p = kvs__resolve_engine_symbol(ll_names[row]);
  if (p && kvs__addr_in_self(p)) p = NULL; /* never our own wrapper */
  ll_code_t fn = NULL;
  if (p) {
    memcpy(&fn, &p, sizeof fn);
    ll_code_t expected = NULL;
    if (atomic_compare_exchange_strong(&g_real[row], &expected, fn)) {
      /* Once per row: where the engine's function lives, and whether the loader's own
       * RTLD_NEXT search (what a plain interposer relies on) would have seen it. */
      Dl_info di;
      const char *where = dladdr(p, &di) && di.dli_fname ? di.dli_fname : "?";
      bool next = kvs__real_dlsym(RTLD_NEXT, ll_names[row]) != NULL;
      kvs_log_info("llama.cpp: %s resolved in %s%s", ll_names[row], where,
                   next ? ""
                        : " (not visible to dlsym(RTLD_NEXT): found by scanning loaded objects)");
    } else {
      fn = expected;
    }
  }
  kvs__hook_depth--;
  return fn;
}

static inline ll_code_t ll_resolve(enum ll_row row) {
  ll_code_t fn = atomic_load_explicit(&g_real[row], memory_order_acquire);
  return kvs__likely(fn != NULL) ? fn : ll_resolve_slow(row);
}

/* Typed getters: ll_real_<name>() is the engine's function or NULL. */
#define LL_GETTER(ret, name, params, args)                                                    \
  static inline kvs__llama_pfn_##name ll_real_##name(void) {                                  \
    return (kvs__llama_pfn_##name)ll_resolve(LL_##name);                                      \
  }
KVS_LLAMA_HOOKS(LL_GETTER)
KVS_LLAMA_USES(LL_GETTER)
#undef LL_GETTER

/* ---- family state --------------------------------------------------------------------------- */

static atomic_bool g_on; /* family initialised in this process's runtime */
static __thread int ll_depth __attribute__((tls_model("initial-exec")));

/* A hook may do more than pass through: not re-entered, family enabled by configuration. */
static inline bool ll_observe(void) {
  return kvs__hook_depth == 0 && ll_depth == 0 && kvs__preload_family_enabled(KVS_HOOK_LLAMA);
}

/* ---- models ---------------------------------------------------------------------------------- */

#define LL_MODELS_MAX 64

typedef struct ll_model {
  const struct llama_model *model;   /* identity only; never dereferenced */
  uint8_t fp[KVS_LLAMA_FP_SIZE];
  kvs_key_t ns;                      /* kvs_keys_namespace of the model namespace */
} ll_model_t;

/* Invariant: g_models[0, g_nmodels) hold distinct live models (g_models_lock). */
static ll_model_t g_models[LL_MODELS_MAX];
static size_t g_nmodels;
static pthread_mutex_t g_models_lock = PTHREAD_MUTEX_INITIALIZER;

static void models_put(const ll_model_t *m) {
  pthread_mutex_lock(&g_models_lock);
  size_t i = 0;
  while (i < g_nmodels && g_models[i].model != m->model) i++;
  bool fits = i < LL_MODELS_MAX;
  if (fits) {
    g_models[i] = *m;
    if (i == g_nmodels) g_nmodels++;
  }
  pthread_mutex_unlock(&g_models_lock);
  if (!fits)
    kvs_log_warn("llama.cpp: more than %d models loaded: states of the newest are not cached",
                 LL_MODELS_MAX);
}

static void models_forget(const struct llama_model *model) {
  pthread_mutex_lock(&g_models_lock);
  for (size_t i = 0; i < g_nmodels; i++)
    if (g_models[i].model == model) {
      g_models[i] = g_models[--g_nmodels];
      memset(&g_models[g_nmodels], 0, sizeof g_models[g_nmodels]);
      break;
    }
  pthread_mutex_unlock(&g_models_lock);
}

static bool models_get(const struct llama_model *model, ll_model_t *out) {
  bool found = false;
  pthread_mutex_lock(&g_models_lock);
  for (size_t i = 0; i < g_nmodels && !found; i++)
    if (g_models[i].model == model) {
      *out = g_models[i];
      found = true;
    }
  pthread_mutex_unlock(&g_models_lock);
  return found;
}

bool kvs__llama_model_fingerprint(const struct llama_model *model, uint8_t fp[KVS_LLAMA_FP_SIZE]) {
  ll_model_t m;
  if (!model || !models_get(model, &m)) return false;
  memcpy(fp, m.fp, KVS_LLAMA_FP_SIZE);
  return true;
}

/* The fingerprinted model of a context (false: unknown, not cached). */
static bool ll_ctx_model(struct llama_context *ctx, ll_model_t *out) {
  kvs__llama_pfn_llama_get_model get_model = ll_real_llama_get_model();
  if (!ctx || !get_model) return false;
  const struct llama_model *model = get_model(ctx);
  return model && models_get(model, out);
}

static void ll_fingerprint_model(const struct llama_model *model, const char *path) {
  ll_model_t m;
  memset(&m, 0, sizeof m);
  m.model = model;
  kvs__llama_fp_info_t fi;
  int rc = kvs__llama_fingerprint(path, m.fp, &fi);
  if (rc < 0) {
    kvs_log_warn("llama.cpp: cannot fingerprint model %s (%s): its states are not cached", path,
                 strerror(-rc));
    return;
  }
  const kvs_options_t *o = kvs__preload_options();
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
}

/* ---- keys ------------------------------------------------------------------------------------ */

static int ll_path_key(const ll_model_t *m, const char *path, kvs_key_t *out) {
  char canon[PATH_MAX];
  int n = kvs__llama_canon_path(path, canon, sizeof canon);
  if (n < 0) return n;
  *out = kvs_keys_name(m->ns, canon, (size_t)n);
  return 0;
}

/* The prefix key of all n tokens: the chunk chain of design §6 over the full chunks, then the
 * partial tail chained the same way (a chunk-aligned n gives exactly the last chunk's key). */
static kvs_key_t ll_prefix_key(const ll_model_t *m, const int32_t *tokens, size_t n) {
  const kvs_options_t *o = kvs__preload_options();
  size_t c = (size_t)o->chunk_tokens;
  kvs_key_t k = m->ns;
  const uint32_t *t = (const uint32_t *)(const void *)tokens;
  size_t i = 0;
  for (; i + c <= n; i += c) k = kvs_keys_chain(k, t + i, c);
  if (i < n) k = kvs_keys_chain(k, t + i, n - i);
  return k;
}

/* ---- store helpers (kvshim's own work: kvs__hook_depth raised by the callers) --------------- */

static int ll_outcome_errno(uint8_t oc) {
  switch (oc) {
  case KVS_RES_BUSY: return -EBUSY;
  case KVS_RES_NO_SPACE: return -ENOSPC;
  case KVS_RES_TOO_LARGE: return -EFBIG;
  case KVS_RES_PRESENT: return -EEXIST;
  default: return -EINVAL;
  }
}

/* Reserve one object under keys. replace: a READY object under keys[0] is removed first (a
 * newer save of the same path); a reader's pin can hold it briefly, so try a few times. */
static int ll_reserve(kvs_store_t *st, const kvs_key_t *keys, size_t nk, uint64_t len,
                      bool replace, kvs_extent_t *ext, kvs_xfer_t *xfer) {
  kvs_layout_t l = kvs_layout_blob(len);
  for (int attempt = 0; attempt < 4; attempt++) {
    uint8_t oc = 0;
    int rc = kvs_store_reserve_object(st, KVS_OWNER_LOCAL, keys, nk, &l, 0, &oc, ext, xfer);
    if (rc == 1) return 0;
    if (rc < 0) return rc;
    if (oc != KVS_RES_PRESENT || !replace) return ll_outcome_errno(oc);
    if (kvs_store_remove(st, &keys[0]) == -EBUSY) {
      struct timespec ts = {0, 1000000L << attempt};
      nanosleep(&ts, NULL);
    }
  }
  return -EBUSY;
}

static void ll_end(kvs_store_t *st, kvs_xfer_t xfer, bool commit) {
  kvs__hook_depth++;
  if (commit) kvs_store_commit(st, KVS_OWNER_LOCAL, xfer);
  else kvs_store_abort(st, KVS_OWNER_LOCAL, xfer);
  kvs__hook_depth--;
}

static inline int64_t ll_ns(struct timespec ts) {
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- the engine's sequence state functions ------------------------------------------------- */

/* With flags 0: the plain functions, else their _ext forms (in the pinned llama.cpp the plain
 * ones are the _ext ones with flags 0; older versions have only the plain ones). */
typedef struct ll_state_api {
  kvs__llama_pfn_llama_state_seq_get_size get_size;
  kvs__llama_pfn_llama_state_seq_get_size_ext get_size_ext;
  kvs__llama_pfn_llama_state_seq_get_data get_data;
  kvs__llama_pfn_llama_state_seq_get_data_ext get_data_ext;
  kvs__llama_pfn_llama_state_seq_set_data set_data;
  kvs__llama_pfn_llama_state_seq_set_data_ext set_data_ext;
} ll_state_api_t;

static bool ll_state_api(ll_state_api_t *a) {
  a->get_size = ll_real_llama_state_seq_get_size();
  a->get_size_ext = a->get_size ? NULL : ll_real_llama_state_seq_get_size_ext();
  a->get_data = ll_real_llama_state_seq_get_data();
  a->get_data_ext = a->get_data ? NULL : ll_real_llama_state_seq_get_data_ext();
  a->set_data = ll_real_llama_state_seq_set_data();
  a->set_data_ext = a->set_data ? NULL : ll_real_llama_state_seq_set_data_ext();
  return (a->get_size || a->get_size_ext) && (a->get_data || a->get_data_ext) &&
         (a->set_data || a->set_data_ext);
}
static size_t ll_get_size(const ll_state_api_t *a, struct llama_context *ctx, int32_t seq) {
  return a->get_size ? a->get_size(ctx, seq) : a->get_size_ext(ctx, seq, 0);
}
static size_t ll_get_data(const ll_state_api_t *a, struct llama_context *ctx, uint8_t *dst,
                          size_t size, int32_t seq) {
  return a->get_data ? a->get_data(ctx, dst, size, seq) : a->get_data_ext(ctx, dst, size, seq, 0);
}
static size_t ll_set_data(const ll_state_api_t *a, struct llama_context *ctx, const uint8_t *src,
                          size_t size, int32_t seq) {
  return a->set_data ? a->set_data(ctx, src, size, seq) : a->set_data_ext(ctx, src, size, seq, 0);
}

/* ---- save ------------------------------------------------------------------------------------ */

typedef kvs__llama_pfn_llama_state_seq_save_file ll_save_fn;
typedef kvs__llama_pfn_llama_state_seq_load_file ll_load_fn;

static size_t ll_seq_save(kvs__runtime_t *rt, ll_save_fn real, struct llama_context *ctx,
                          const char *path, int32_t seq_id, const int32_t *tokens, size_t n) {
  const bool wt = rt->opts.llama_write_through != 0;
  kvs_stats_t *stats = kvs_stats_global();
  ll_state_api_t api;
  ll_model_t m;
  kvs_key_t keys[2];
  size_t nk = 1;
  const char *why;
  if (n > UINT32_MAX || (n && !tokens)) {
    why = "unusual arguments";
    goto uncached;
  }
  if (!ll_state_api(&api)) {
    why = "the engine lacks llama_state_seq_get_size/get_data/set_data";
    goto uncached;
  }
  if (!ll_ctx_model(ctx, &m)) {
    why = "its model was not fingerprinted";
    goto uncached;
  }
  if (ll_path_key(&m, path, &keys[0]) < 0) {
    why = "path too long";
    goto uncached;
  }
  if (n) keys[nk++] = ll_prefix_key(&m, tokens, n);

  size_t S = ll_get_size(&api, ctx, seq_id);
  if (S < KVS_LLAMA_STATE_HDR || S > (1ull << 48)) {
    why = "the engine reported no sequence state";
    goto uncached;
  }
  uint64_t tok_bytes = 4 * (uint64_t)n;
  uint64_t total = KVS_LLAMA_BLOB_HDR + tok_bytes + S;
  kvs_extent_t ext;
  kvs_xfer_t xfer;
  kvs__hook_depth++;
  int rc = ll_reserve(rt->store, keys, nk, total, true, &ext, &xfer);
  kvs__hook_depth--;
  if (rc < 0) {
    why = rc == -ENOSPC ? "the pool is full" : rc == -EFBIG ? "larger than the pool"
                                              : "the path is being written or read";
    goto uncached;
  }
  uint8_t *blob = kvs_pool_base(rt->pool) + ext.offset;
  uint8_t *state = blob + KVS_LLAMA_BLOB_HDR + tok_bytes;
  /* Zero copy: the engine serialises the sequence straight into the pool. */
  size_t w = ll_get_data(&api, ctx, state, S, seq_id);
  uint32_t smagic = 0;
  if (w == S) memcpy(&smagic, state, sizeof smagic);
  if (w != S || smagic != KVS_LLAMA_STATE_MAGIC) {
    ll_end(rt->store, xfer, false);
    why = "llama_state_seq_get_data did not write the size get_size announced";
    goto uncached;
  }
  kvs__llama_blob_hdr_t h;
  memset(&h, 0, sizeof h);
  h.magic = KVS_LLAMA_BLOB_MAGIC;
  h.version = KVS_LLAMA_BLOB_VERSION;
  h.hdr_size = (uint16_t)KVS_LLAMA_BLOB_HDR;
  h.kind = KVS_LLAMA_BLOB_KIND_SEQ;
  h.n_tokens = (uint32_t)n;
  h.state_size = S;
  memcpy(h.model_fp, m.fp, sizeof h.model_fp);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME_COARSE, &now); /* the clock file mtimes come from */
  h.saved_ns = (uint64_t)ll_ns(now);
  size_t ret = (size_t)kvs__llama_file_bytes(n, S);
  if (wt) {
    size_t real_ret = real(ctx, path, seq_id, tokens, n);
    if (real_ret != ret) {
      /* 0: the engine could not write its file, so nothing may look saved. Anything else: the
       * engine's file format is not the pinned one, and loads could not return its value. */
      ll_end(rt->store, xfer, false);
      if (real_ret != 0)
        kvs_log_warn("llama.cpp: %s: the engine wrote %zu bytes where its format gives %zu: "
                     "not cached", path, real_ret, ret);
      kvs_stats_inc(stats, KVS_STAT_hook_store_failures);
      return real_ret;
    }
    struct stat sb;
    if (stat(path, &sb) == 0) {
      h.file_known = 1;
      h.file_dev = (uint64_t)sb.st_dev;
      h.file_ino = (uint64_t)sb.st_ino;
      h.file_size = (uint64_t)sb.st_size;
      h.file_mtime_ns = ll_ns(sb.st_mtim);
    }
  }
  if (tok_bytes) memcpy(blob + KVS_LLAMA_BLOB_HDR, tokens, (size_t)tok_bytes);
  memcpy(blob, &h, sizeof h);
  h.checksum = kvs__llama_blob_checksum(blob, total);
  memcpy(blob + offsetof(kvs__llama_blob_hdr_t, checksum), &h.checksum, sizeof h.checksum);
  kvs__hook_depth++;
  rc = kvs_store_commit(rt->store, KVS_OWNER_LOCAL, xfer);
  if (rc == 0 && rt->peers) kvs_peers_push(rt->peers, keys, nk); /* -ENOTSUP: no cache peer */
  kvs__hook_depth--;
  if (rc < 0) {
    kvs_log_warn("llama.cpp: %s: commit failed (%s)", path, strerror(-rc));
    kvs_stats_inc(stats, KVS_STAT_hook_store_failures);
    return wt ? ret : real(ctx, path, seq_id, tokens, n);
  }
  kvs_stats_inc(stats, KVS_STAT_hook_stores);
  return ret;

uncached:
  /* Nothing was kept: the engine writes its file, whatever write-through says. */
  kvs_stats_inc(stats, KVS_STAT_hook_store_failures);
  kvs_log_debug("llama.cpp: state of %s not cached: %s", path, why);
  return real(ctx, path, seq_id, tokens, n);
}

/* ---- load ------------------------------------------------------------------------------------ */

typedef enum ll_res {
  LL_HIT = 0,    /* restored; *ret is the real function's return value */
  LL_MISS,       /* not cached here */
  LL_REFUSED,    /* found but not usable for this call: the real function decides */
  LL_BAD,        /* found and wrong (corrupt, foreign, stale): refused and dropped */
  LL_LOCAL_NOW,  /* a peer had it but meanwhile it became local: look again */
} ll_res_t;

typedef struct ll_load_req {
  struct llama_context *ctx;
  const char *path;
  int32_t dest;
  int32_t *tokens_out;
  size_t cap;
  size_t *n_out;
  const ll_model_t *m;
  ll_state_api_t api;
} ll_load_req_t;

/* The state file at path was replaced since the blob was saved (the file is the truth). */
static bool ll_stale(const kvs__llama_blob_hdr_t *h, const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) return false; /* no file: the blob is all there is */
  if (h->file_known)
    return (uint64_t)sb.st_dev != h->file_dev || (uint64_t)sb.st_ino != h->file_ino ||
           (uint64_t)sb.st_size != h->file_size || ll_ns(sb.st_mtim) != h->file_mtime_ns;
  return ll_ns(sb.st_mtim) >= (int64_t)h->saved_ns;
}

/* Check a blob and restore it into the caller's sequence. */
static ll_res_t ll_restore(const ll_load_req_t *q, const uint8_t *blob, uint64_t len,
                           size_t *ret) {
  kvs__llama_blob_hdr_t h;
  kvs__llama_blob_status_t st = kvs__llama_blob_check(blob, len, q->m->fp, &h);
  if (st != KVS_LLAMA_BLOB_OK) {
    kvs_log_warn("llama.cpp: cached state for %s refused: %s", q->path,
                 kvs__llama_blob_status_name(st));
    return LL_BAD;
  }
  if (ll_stale(&h, q->path)) {
    kvs_log_info("llama.cpp: %s changed on disk since it was cached: loading the file", q->path);
    return LL_BAD;
  }
  if (!q->tokens_out) { /* the engine's "how many tokens" query: no state is loaded */
    *q->n_out = h.n_tokens;
    *ret = KVS_LLAMA_SEQ_FILE_HDR;
    return LL_HIT;
  }
  if (h.n_tokens > q->cap) return LL_REFUSED; /* the engine reports this failure itself */
  const uint8_t *toks = blob + KVS_LLAMA_BLOB_HDR;
  const uint8_t *state = toks + 4 * (uint64_t)h.n_tokens;
  size_t r = ll_set_data(&q->api, q->ctx, state, (size_t)h.state_size, q->dest);
  if (r != h.state_size) {
    kvs_log_info("llama.cpp: restoring cached %s: set_data read %zu of %llu bytes: loading the "
                 "file", q->path, r, (unsigned long long)h.state_size);
    return LL_REFUSED;
  }
  memcpy(q->tokens_out, toks, 4 * (size_t)h.n_tokens);
  *q->n_out = h.n_tokens;
  *ret = (size_t)kvs__llama_file_bytes(h.n_tokens, h.state_size);
  return LL_HIT;
}

static ll_res_t ll_load_local(kvs__runtime_t *rt, const ll_load_req_t *q, kvs_key_t key,
                              size_t *ret) {
  kvs_xfer_t xfer = 0;
  kvs_object_view_t v;
  kvs__hook_depth++;
  int found = kvs_store_lookup(rt->store, KVS_OWNER_LOCAL, &key, 1, true, &xfer);
  if (found == 1 && kvs_store_read_pinned(rt->store, KVS_OWNER_LOCAL, xfer, &v, 1) != 1) {
    kvs_store_release(rt->store, KVS_OWNER_LOCAL, xfer);
    found = 0;
  }
  kvs__hook_depth--;
  if (found != 1) return LL_MISS;
  /* Restored straight from the pool while the pin keeps the extent. */
  ll_res_t res = ll_restore(q, kvs_pool_base(rt->pool) + v.extent.offset, v.extent.length, ret);
  kvs__hook_depth++;
  kvs_store_release(rt->store, KVS_OWNER_LOCAL, xfer);
  if (res == LL_BAD) kvs_store_remove(rt->store, &key); /* -EBUSY: a reader has it; fine */
  kvs__hook_depth--;
  return res;
}

/* Receives a peer's copy: reserve a local object, copy into it (checked after the copy). */
typedef struct ll_sink {
  kvs_store_t *store;
  uint8_t *base;
  const ll_model_t *m;
  kvs_key_t keys[2];
  size_t nk;
  kvs_extent_t ext;
  kvs_xfer_t xfer;
  enum { SINK_NONE, SINK_COPIED, SINK_LOCAL, SINK_FAILED } state;
} ll_sink_t;

static int ll_sink(void *ctx, size_t key_index, const kvs_layout_t *layout, const void *bytes,
                   uint64_t len) {
  ll_sink_t *s = ctx;
  if (key_index != 0 || s->state != SINK_NONE) return -1;
  s->state = SINK_FAILED;
  kvs__llama_blob_hdr_t h;
  if (layout->dtype != KVS_DTYPE_U8 || layout->ndim != 1 || layout->shape[0] != len ||
      len < KVS_LLAMA_BLOB_HDR)
    return -1;
  memcpy(&h, bytes, sizeof h);
  if (h.magic != KVS_LLAMA_BLOB_MAGIC || 4 * (uint64_t)h.n_tokens > len - KVS_LLAMA_BLOB_HDR ||
      memcmp(h.model_fp, s->m->fp, KVS_LLAMA_FP_SIZE) != 0)
    return -1; /* the full check runs on our copy */
  if (h.n_tokens)
    s->keys[s->nk++] = ll_prefix_key(s->m, (const int32_t *)(const void *)((const uint8_t *)bytes +
                                                                           KVS_LLAMA_BLOB_HDR),
                                     h.n_tokens);
  int rc = ll_reserve(s->store, s->keys, s->nk, len, false, &s->ext, &s->xfer);
  if (rc == -EEXIST) {
    s->state = SINK_LOCAL;
    return 0;
  }
  if (rc < 0) return -1;
  memcpy(s->base + s->ext.offset, bytes, (size_t)len);
  s->state = SINK_COPIED;
  return 0;
}

static ll_res_t ll_load_peer(kvs__runtime_t *rt, const ll_load_req_t *q, kvs_key_t key,
                             size_t *ret) {
  ll_sink_t s;
  memset(&s, 0, sizeof s);
  s.store = rt->store;
  s.base = kvs_pool_base(rt->pool);
  s.m = q->m;
  s.keys[0] = key;
  s.nk = 1;
  kvs__hook_depth++;
  int got = kvs_peers_retrieve(rt->peers, 0, &key, 1, ll_sink, &s); /* errors are misses */
  kvs__hook_depth--;
  if (s.state == SINK_LOCAL) return LL_LOCAL_NOW;
  if (s.state != SINK_COPIED) return LL_MISS;
  if (got == -ESTALE) { /* the peer's pin expired under the copy: never use those bytes */
    ll_end(rt->store, s.xfer, false);
    return LL_MISS;
  }
  const uint8_t *blob = s.base + s.ext.offset;
  ll_res_t res = ll_restore(q, blob, s.ext.length, ret);
  /* The alias was computed from the peer's bytes: it must name the tokens we now hold, or the
   * copy is not kept (this call's result stands: the blob itself passed every check). */
  if (res != LL_BAD && s.nk == 2) {
    kvs__llama_blob_hdr_t h;
    memcpy(&h, blob, sizeof h);
    kvs_key_t k = ll_prefix_key(q->m, (const int32_t *)(const void *)(blob + KVS_LLAMA_BLOB_HDR),
                                h.n_tokens);
    if (!kvs_key_eq(k, s.keys[1])) {
      ll_end(rt->store, s.xfer, false);
      return res;
    }
  }
  /* Keep a good copy locally (also when only this call could not use it). */
  ll_end(rt->store, s.xfer, res != LL_BAD);
  return res;
}

static size_t ll_seq_load(kvs__runtime_t *rt, ll_load_fn real, struct llama_context *ctx,
                          const char *path, int32_t dest, int32_t *tokens_out, size_t cap,
                          size_t *n_out) {
  kvs_stats_t *stats = kvs_stats_global();
  ll_model_t m;
  kvs_key_t key;
  ll_load_req_t q = {ctx, path, dest, tokens_out, cap, n_out, &m, {0}};
  if (!n_out || !ll_state_api(&q.api) || !ll_ctx_model(ctx, &m) ||
      ll_path_key(&m, path, &key) < 0) {
    kvs_stats_inc(stats, KVS_STAT_hook_misses);
    return real(ctx, path, dest, tokens_out, cap, n_out);
  }
  size_t ret = 0;
  ll_res_t res = ll_load_local(rt, &q, key, &ret);
  if (res == LL_MISS && rt->peers) {
    res = ll_load_peer(rt, &q, key, &ret);
    if (res == LL_LOCAL_NOW) res = ll_load_local(rt, &q, key, &ret);
  }
  switch (res) {
  case LL_HIT: kvs_stats_inc(stats, KVS_STAT_hook_hits); return ret;
  case LL_MISS:
  case LL_LOCAL_NOW: kvs_stats_inc(stats, KVS_STAT_hook_misses); break;
  case LL_REFUSED:
  case LL_BAD: kvs_stats_inc(stats, KVS_STAT_hook_fallbacks); break;
  }
  return real(ctx, path, dest, tokens_out, cap, n_out);
}

/* ---- the wrappers ---------------------------------------------------------------------------- */

/* Pass-through hooks: counted once per engine call, nothing else. */
#define LL_PASSTHROUGH(ret, name, params, args, missing)                                      \
  ret name params {                                                                           \
    kvs__llama_pfn_##name real = ll_real_##name();                                            \
    if (kvs__unlikely(!real)) return missing;                                                 \
    if (!ll_observe()) return real args;                                                      \
    ll_depth++;                                                                               \
    kvs__hook_count();                                                                        \
    ret r_ = real args;                                                                       \
    ll_depth--;                                                                               \
    return r_;                                                                                \
  }

/* The same for hooks that replace a sequence's KV: the prefix cache (prefix.c) hears of it
 * first, whatever the hook then does. */
#define LL_PASSTHROUGH_LOAD(ret, name, params, args, missing, ctx_, seq_)                     \
  ret name params {                                                                           \
    kvs__llama_prefix_state_load(ctx_, seq_);                                                 \
    kvs__llama_pfn_##name real = ll_real_##name();                                            \
    if (kvs__unlikely(!real)) return missing;                                                 \
    if (!ll_observe()) return real args;                                                      \
    ll_depth++;                                                                               \
    kvs__hook_count();                                                                        \
    ret r_ = real args;                                                                       \
    ll_depth--;                                                                               \
    return r_;                                                                                \
  }

LL_PASSTHROUGH(size_t, llama_state_seq_get_size, (struct llama_context * ctx, int32_t seq_id),
               (ctx, seq_id), 0)
LL_PASSTHROUGH(size_t, llama_state_seq_get_size_ext,
               (struct llama_context * ctx, int32_t seq_id, uint32_t flags), (ctx, seq_id, flags),
               0)
LL_PASSTHROUGH(size_t, llama_state_seq_get_data,
               (struct llama_context * ctx, uint8_t *dst, size_t size, int32_t seq_id),
               (ctx, dst, size, seq_id), 0)
LL_PASSTHROUGH(size_t, llama_state_seq_get_data_ext,
               (struct llama_context * ctx, uint8_t *dst, size_t size, int32_t seq_id,
                uint32_t flags),
               (ctx, dst, size, seq_id, flags), 0)
LL_PASSTHROUGH_LOAD(size_t, llama_state_seq_set_data,
               (struct llama_context * ctx, const uint8_t *src, size_t size, int32_t dest_seq_id),
               (ctx, src, size, dest_seq_id), 0, ctx, dest_seq_id)
LL_PASSTHROUGH_LOAD(size_t, llama_state_seq_set_data_ext,
               (struct llama_context * ctx, const uint8_t *src, size_t size, int32_t dest_seq_id,
                uint32_t flags),
               (ctx, src, size, dest_seq_id, flags), 0, ctx, dest_seq_id)
LL_PASSTHROUGH(bool, llama_state_save_file,
               (struct llama_context * ctx, const char *path_session, const int32_t *tokens,
                size_t n_token_count),
               (ctx, path_session, tokens, n_token_count), false)
LL_PASSTHROUGH_LOAD(bool, llama_state_load_file,
               (struct llama_context * ctx, const char *path_session, int32_t *tokens_out,
                size_t n_token_capacity, size_t *n_token_count_out),
               (ctx, path_session, tokens_out, n_token_capacity, n_token_count_out), false, ctx, -1)
#undef LL_PASSTHROUGH
#undef LL_PASSTHROUGH_LOAD

/* The runtime for a caching hook (NULL: pass through; a FAILED runtime was counted). */
static kvs__runtime_t *ll_rt(void) {
  kvs__runtime_t *rt = kvs__preload_ensure_init();
  return rt && atomic_load_explicit(&g_on, memory_order_acquire) ? rt : NULL;
}

size_t llama_state_seq_save_file(struct llama_context *ctx, const char *filepath, int32_t seq_id,
                                 const int32_t *tokens, size_t n_token_count) {
  ll_save_fn real = ll_real_llama_state_seq_save_file();
  if (kvs__unlikely(!real)) return 0;
  if (!filepath || !ll_observe()) return real(ctx, filepath, seq_id, tokens, n_token_count);
  kvs__runtime_t *rt = ll_rt();
  if (!rt) return real(ctx, filepath, seq_id, tokens, n_token_count);
  ll_depth++;
  kvs__hook_count();
  size_t r = ll_seq_save(rt, real, ctx, filepath, seq_id, tokens, n_token_count);
  ll_depth--;
  return r;
}

size_t llama_state_seq_load_file(struct llama_context *ctx, const char *filepath,
                                 int32_t dest_seq_id, int32_t *tokens_out, size_t n_token_capacity,
                                 size_t *n_token_count_out) {
  kvs__llama_prefix_state_load(ctx, dest_seq_id);
  ll_load_fn real = ll_real_llama_state_seq_load_file();
  if (kvs__unlikely(!real)) return 0;
  if (!filepath || !ll_observe())
    return real(ctx, filepath, dest_seq_id, tokens_out, n_token_capacity, n_token_count_out);
  kvs__runtime_t *rt = ll_rt();
  if (!rt) return real(ctx, filepath, dest_seq_id, tokens_out, n_token_capacity, n_token_count_out);
  ll_depth++;
  kvs__hook_count();
  size_t r = ll_seq_load(rt, real, ctx, filepath, dest_seq_id, tokens_out, n_token_capacity,
                         n_token_count_out);
  ll_depth--;
  return r;
}

struct llama_model *llama_model_load_from_file(const char *path_model,
                                               kvs__llama_model_params_t params) {
  kvs__llama_pfn_llama_model_load_from_file real = ll_real_llama_model_load_from_file();
  if (kvs__unlikely(!real)) return NULL;
  if (!ll_observe()) return real(path_model, params);
  ll_depth++;
  kvs__hook_count();
  struct llama_model *model = real(path_model, params);
  if (model && path_model) {
    kvs__hook_depth++; /* file reads and hashing only: kvshim's own work */
    ll_fingerprint_model(model, path_model);
    kvs__hook_depth--;
  }
  ll_depth--;
  return model;
}

void llama_model_free(struct llama_model *model) {
  kvs__llama_pfn_llama_model_free real = ll_real_llama_model_free();
  /* Forget first, also when the hook is otherwise off: a model loaded at this address later
   * must never inherit this one's fingerprint. */
  if (model && kvs__hook_depth == 0) models_forget(model);
  if (kvs__unlikely(!real)) return;
  if (!ll_observe()) {
    real(model);
    return;
  }
  ll_depth++;
  kvs__hook_count();
  real(model);
  ll_depth--;
}

/* ---- family ---------------------------------------------------------------------------------- */

/* On the path of every dlsym of a "llama_" name: no libc call, not instrumented. */
KVS__DLSYM_PATH static bool ll_hooks_name(const char *name) {
  for (size_t i = 0; i < LL__NHOOKS; i++) {
    const char *a = ll_names[i], *b = name;
    while (*a && *a == *b) a++, b++;
    if (*a == *b) return true;
  }
  return false;
}

/* dlsym(handle, "llama_...") finding the engine's function (ctypes-style engines look their
 * functions up this way) gets the wrapper, so those calls are served too. A lookup that found
 * anything else (another copy of libllama, our own wrapper) is left alone. */
static void *ll_dlsym_substitute(const char *name, void *found) {
  if (!found || kvs__hook_depth) return found;
  for (size_t i = 0; i < LL__NHOOKS; i++) {
    if (strcmp(ll_names[i], name) != 0) continue;
    ll_code_t real = ll_resolve((enum ll_row)i);
    void *rp;
    memcpy(&rp, &real, sizeof rp);
    return rp == found ? (void *)ll_wrappers[i] : found;
  }
  return found;
}

static int ll_family_init(kvs__runtime_t *rt) {
  (void)rt;
  atomic_store_explicit(&g_on, true, memory_order_release);
  return 0;
}

static void ll_fork_child(void) {
  /* The child builds its own runtime (init sets g_on again). Models stay loaded in the child,
   * so the table stays valid; only its lock is reset. */
  atomic_store_explicit(&g_on, false, memory_order_relaxed);
  pthread_mutex_init(&g_models_lock, NULL);
}

const kvs__family_t kvs__family_llama = {
    .name = "llama.cpp",
    .flag = KVS_HOOK_LLAMA,
    .hooks_name = ll_hooks_name,
    .dlsym_substitute = ll_dlsym_substitute,
    .init = ll_family_init,
    .fork_child = ll_fork_child,
};
