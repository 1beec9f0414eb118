/* shims/llama: the llama.cpp state API adapter (design §10.2).
 *
 * Hooked (KVS_LLAMA_HOOKS, exported from libkvshim.so):
 *   llama_state_seq_save_file   the state goes into the node cache: one store object
 *                               [header | tokens | in-memory state] (blob.h, kind SEQ) under
 *                               the keys  primary = name key of the canonical path,
 *                                         alias   = prefix key of all the tokens,
 *                               both inside the model's namespace. The real get_size gives the
 *                               size, the real get_data writes straight into the reserved
 *                               extent (zero copy), then commit and write-behind to a cache
 *                               peer; with KVSHIM_ONE_COPY=1 and `kvshim serve` connected, the
 *                               extent is a slot of serve's pool and nothing is kept here
 *                               (blob.h; the file is then written first, so the blob records
 *                               its identity). The real file is written too unless
 *                               KVSHIM_LLAMA_WRITE_THROUGH=0. Returns what the real function
 *                               returns (with write-through off: the byte count it would
 *                               have returned, kvs__llama_file_bytes).
 *   llama_state_seq_load_file   the blob is looked up by path, locally then at peers (a cache
 *                               peer's copy is checked and restored in place, under its pin,
 *                               with KVSHIM_ONE_COPY=1; another peer's copy is retrieved into
 *                               a local extent and kept); every check
 *                               of blob.h passes, the state file was not replaced
 *                               since (ll_stale), the tokens fit: the real set_data restores
 *                               the state straight from the pool, the tokens are copied out,
 *                               and the return value is the real function's (12 + 4n + body).
 *                               A miss or any failed check calls the real function.
 *   llama_model_load_from_file  fingerprints the model file (model.c) and records
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
 * Threads: calls arrive on any engine thread. The model table (model.c) has its own lock; the
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

#include "blob.h"
#include "blob_flow.h"
#include "cache.h"
#include "internal.h"
#include "keys.h"
#include "log.h"
#include "model.h"
#include "prefix.h"
#include "runtime.h"
#include "stats.h"

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

/* The tables of the family (runtime/family_tables.h): typed pointers kvs__llama_pfn_<name>,
 * getters ll_real_<name>() (the engine's function or NULL; misses are retried), the exported
 * wrapper declarations. Rows: hooks first, then the functions kvshim only uses. */
#define KVS_FAMILY_OF(X)                                                                      \
  X(kvs__family_llama, "llama.cpp", KVS_HOOK_LLAMA, "llama_", KVS_LLAMA_HOOKS, KVS_LLAMA_USES,  \
    kvs__llama_pfn_, ll_real_)
#include "family_tables.h"

/* ---- family state --------------------------------------------------------------------------- */

static __thread int ll_depth __attribute__((tls_model("initial-exec")));

/* A hook may do more than pass through: not re-entered, family enabled by configuration. */
static inline bool ll_observe(void) {
  return kvs__hook_depth == 0 && ll_depth == 0 && kvs__family_enabled(&kvs__family_llama);
}

/* ---- models ---------------------------------------------------------------------------------- */

/* The fingerprinted model of a context (false: unknown, not cached). */
static bool ll_ctx_model(struct llama_context *ctx, kvs__llama_model_t *out) {
  kvs__llama_pfn_llama_get_model get_model = ll_real_llama_get_model();
  if (!ctx || !get_model) return false;
  return kvs__llama_model_get(get_model(ctx), out);
}

/* ---- keys ------------------------------------------------------------------------------------ */

static int ll_path_key(const kvs__llama_model_t *m, const char *path, kvs_key_t *out) {
  char canon[PATH_MAX];
  int n = kvs__llama_canon_path(path, canon, sizeof canon);
  if (n < 0) return n;
  *out = kvs_keys_name(m->ns, canon, (size_t)n);
  return 0;
}

/* The prefix key of all n tokens: the chunk chain of design §6 over the full chunks, then the
 * partial tail chained the same way (a chunk-aligned n gives exactly the last chunk's key). */
static kvs_key_t ll_prefix_key(const kvs__llama_model_t *m, const int32_t *tokens, size_t n) {
  const kvs_config_t *o = kvs__runtime_options();
  size_t c = (size_t)o->core.chunk_tokens;
  kvs_key_t k = m->ns;
  const uint32_t *t = (const uint32_t *)(const void *)tokens;
  size_t i = 0;
  for (; i + c <= n; i += c) k = kvs_keys_chain(k, t + i, c);
  if (i < n) k = kvs_keys_chain(k, t + i, n - i);
  return k;
}

static inline int64_t ll_ns(struct timespec ts) {
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- the engine's sequence state functions ------------------------------------------------- */

#define LL_STATE_FN(field, name, a) (a)->field = ll_real_##name();
static bool ll_state_api(kvs__llama_state_api_t *a) {
  KVS_LLAMA_STATE_FNS(LL_STATE_FN, a)
  return kvs__llama_state_api_ok(a);
}
#undef LL_STATE_FN

/* ---- save ------------------------------------------------------------------------------------ */

typedef kvs__llama_pfn_llama_state_seq_save_file ll_save_fn;
typedef kvs__llama_pfn_llama_state_seq_load_file ll_load_fn;

static const char *ll_save_error(int rc) {
  switch (rc) {
  case -ENODATA: return "the engine reported no sequence state";
  case -EIO: return "llama_state_seq_get_data did not write the size get_size announced";
  case -ENOSPC: return "the pool is full";
  case -EFBIG: return "larger than the pool";
  default: return "the path is being written or read";
  }
}

/* Record the identity of the state file just written at path (write-through) in the header. */
static void ll_file_identity(kvs__llama_blob_hdr_t *h, const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) return;
  h->file_known = 1;
  h->file_dev = (uint64_t)sb.st_dev;
  h->file_ino = (uint64_t)sb.st_ino;
  h->file_size = (uint64_t)sb.st_size;
  h->file_mtime_ns = ll_ns(sb.st_mtim);
}

static size_t ll_seq_save(kvs__runtime_t *rt, ll_save_fn real, struct llama_context *ctx,
                          const char *path, int32_t seq_id, const int32_t *tokens, size_t n) {
  const bool wt = rt->opts.llama_write_through != 0;
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  kvs_stats_t *stats = kvs_stats_global();
  kvs__llama_state_api_t api;
  kvs__llama_model_t m;
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

  kvs__llama_blob_hdr_t h;
  memset(&h, 0, sizeof h);
  h.kind = KVS_LLAMA_BLOB_KIND_SEQ;
  memcpy(h.model_fp, m.fp, sizeof h.model_fp);
  h.ns_lo = m.ns.lo;
  h.ns_hi = m.ns.hi;
  kvs__llama_blob_save_t sv;
  /* One copy per node: the blob is published in the cache peer's pool by begin, so with
   * write-through the file is written first and its identity goes into the header. */
  bool written = false;
  size_t real_ret = 0;
  if (wt && kvs__llama_blob_cache(&home)) {
    size_t S = kvs__llama_state_size(&api, ctx, seq_id);
    size_t want = S >= KVS_LLAMA_STATE_HDR ? (size_t)kvs__llama_file_bytes(n, S) : 0;
    real_ret = real(ctx, path, seq_id, tokens, n);
    if (real_ret == 0 || real_ret != want) {
      if (real_ret != 0 && want != 0)
        kvs_log_warn("llama.cpp: %s: the engine wrote %zu bytes where its format gives %zu: "
                     "not cached", path, real_ret, want);
      kvs_stats_inc(stats, KVS_STAT_hook_store_failures);
      return real_ret;
    }
    written = true;
    ll_file_identity(&h, path);
  }
  int rc = kvs__llama_blob_begin(&home, keys, nk, true, &api, ctx, seq_id, tokens, (uint32_t)n,
                                 &h, &sv);
  if (rc < 0) {
    if (written) { /* the engine's file is there: the load falls back to it */
      kvs_stats_inc(stats, KVS_STAT_hook_store_failures);
      return real_ret;
    }
    why = ll_save_error(rc);
    goto uncached;
  }
  size_t ret = (size_t)kvs__llama_file_bytes(n, h.state_size);
  if (wt && !written) {
    real_ret = real(ctx, path, seq_id, tokens, n);
    if (real_ret != ret) {
      /* 0: the engine could not write its file, so nothing may look saved. Anything else: the
       * engine's file format is not the pinned one, and loads could not return its value. */
      kvs__llama_blob_abort(&home, &sv);
      if (real_ret != 0)
        kvs_log_warn("llama.cpp: %s: the engine wrote %zu bytes where its format gives %zu: "
                     "not cached", path, real_ret, ret);
      kvs_stats_inc(stats, KVS_STAT_hook_store_failures);
      return real_ret;
    }
    ll_file_identity(&h, path);
  }
  rc = kvs__llama_blob_commit(&home, keys, nk, &h, &sv);
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
  const kvs__llama_model_t *m;
  kvs__llama_state_api_t api;
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
  const kvs__llama_blob_want_t want = {KVS_LLAMA_BLOB_KIND_SEQ, 0, q->m->fp, q->m->ns};
  kvs__llama_blob_status_t st = kvs__llama_blob_check(blob, len, &want, &h);
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
  size_t r = kvs__llama_state_set(&q->api, q->ctx, state, (size_t)h.state_size, q->dest);
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
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  const uint8_t *blob;
  uint64_t len;
  kvs__cache_ref_t xfer;
  if (!kvs__llama_blob_pin(&home, key, &blob, &len, &xfer)) return LL_MISS;
  /* Restored straight from the pool while the pin keeps the extent. */
  ll_res_t res = ll_restore(q, blob, len, ret);
  kvs__llama_blob_unpin(&home, key, xfer, res == LL_BAD);
  return res;
}

/* The keys of a peer's copy (kvs__cache_keys_fn): the path key asked for, and the prefix key
 * of the blob's own tokens. A blob that is plainly not ours is refused before the copy; the
 * full check runs on the copy. */
typedef struct ll_fetch_keys {
  const kvs__llama_model_t *m;
  kvs_key_t keys[2];
  int nk; /* keys bound: 2 when the peer's blob had tokens */
} ll_fetch_keys_t;

static int ll_fetch_keys(void *ctx, size_t key_index, const void *bytes, uint64_t len,
                         const kvs_key_t **keys) {
  ll_fetch_keys_t *k = ctx;
  kvs__llama_blob_hdr_t h;
  if (key_index != 0 || len < KVS_LLAMA_BLOB_HDR) return -1;
  memcpy(&h, bytes, sizeof h);
  if (h.magic != KVS_LLAMA_BLOB_MAGIC || h.kind != KVS_LLAMA_BLOB_KIND_SEQ ||
      4 * (uint64_t)h.n_tokens > len - KVS_LLAMA_BLOB_HDR ||
      memcmp(h.model_fp, k->m->fp, KVS_LLAMA_FP_SIZE) != 0)
    return -1;
  int nk = 1;
  if (h.n_tokens)
    k->keys[nk++] = ll_prefix_key(
        k->m, (const int32_t *)(const void *)((const uint8_t *)bytes + KVS_LLAMA_BLOB_HDR),
        h.n_tokens);
  *keys = k->keys;
  return k->nk = nk;
}

/* Restore in place (issue 15): the blob is checked and handed to the engine's set_data where
 * it lies in the cache peer's pool, under the peer's pin (peers of one uid are trusted, design
 * §14; the pin keeps the extent from being reused), with no copy into our own pool. */
typedef struct ll_inplace {
  const ll_load_req_t *q;
  size_t *ret;
  ll_res_t res;
} ll_inplace_t;

static int ll_inplace_sink(void *ctx, size_t i, const kvs_layout_t *layout, const void *bytes,
                           uint64_t len) {
  (void)i;
  (void)layout;
  ll_inplace_t *x = ctx;
  x->res = ll_restore(x->q, bytes, len, x->ret);
  return 0;
}

/* One copy per node: LL_HIT/LL_REFUSED/LL_BAD when the cache peer had the blob (LL_REFUSED
 * too when its pin lapsed while set_data read it: the real function loads the sequence again),
 * LL_MISS when there is none, it had not or it failed (counted by the facade: the other peers
 * are asked as before). */
static ll_res_t ll_load_cache_peer(kvs__runtime_t *rt, const ll_load_req_t *q, kvs_key_t key,
                                   size_t *ret) {
  ll_inplace_t x = {q, ret, LL_MISS};
  int r = kvs__cache_read_cache_peer(rt, &key, 1, ll_inplace_sink, &x);
  if (r == 1) {
    if (x.res == LL_HIT) kvs_stats_inc(kvs_stats_global(), KVS_STAT_cache_peer_loads);
    return x.res;
  }
  return r == -ESTALE ? LL_REFUSED : LL_MISS;
}

static ll_res_t ll_load_peer(kvs__runtime_t *rt, const ll_load_req_t *q, kvs_key_t key,
                             size_t *ret) {
  ll_res_t res = ll_load_cache_peer(rt, q, key, ret);
  if (res != LL_MISS) return res;
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  ll_fetch_keys_t k = {q->m, {key, {0, 0}}, 1};
  kvs__llama_blob_fetch_t f;
  int st = kvs__llama_blob_fetch(&home, 0, key, ll_fetch_keys, &k, &f);
  if (st == KVS__CACHE_LOCAL) return LL_LOCAL_NOW;
  if (st != KVS__CACHE_COPIED) return LL_MISS;
  res = ll_restore(q, f.blob, f.len, ret);
  /* The alias was computed from the peer's bytes: it must name the tokens we now hold, or the
   * copy is not kept (this call's result stands: the blob itself passed every check). Keep a
   * good copy locally (also when only this call could not use it). */
  bool keep = res != LL_BAD;
  if (keep) {
    kvs__llama_blob_hdr_t h;
    memcpy(&h, f.blob, sizeof h);
    keep = k.nk == 1 ||
           kvs_key_eq(ll_prefix_key(q->m, (const int32_t *)(const void *)(f.blob +
                                                                          KVS_LLAMA_BLOB_HDR),
                                    h.n_tokens),
                      k.keys[1]);
  }
  kvs__llama_blob_keep(&home, &f, keep);
  return res;
}

static size_t ll_seq_load(kvs__runtime_t *rt, ll_load_fn real, struct llama_context *ctx,
                          const char *path, int32_t dest, int32_t *tokens_out, size_t cap,
                          size_t *n_out) {
  kvs_stats_t *stats = kvs_stats_global();
  kvs__llama_model_t m;
  kvs_key_t key;
  ll_load_req_t q = {ctx, path, dest, tokens_out, cap, n_out, &m, {0}};
  if (!n_out || !ll_state_api(&q.api) || !ll_ctx_model(ctx, &m) ||
      ll_path_key(&m, path, &key) < 0) {
    kvs_stats_inc(stats, KVS_STAT_hook_misses);
    return real(ctx, path, dest, tokens_out, cap, n_out);
  }
  size_t ret = 0;
  ll_res_t res = ll_load_local(rt, &q, key, &ret);
  if (res == LL_MISS && kvs__cache_has_peers(rt)) {
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

/* Pass-through hooks: `first` runs, then the engine's function (its result in r_), counted
 * once per engine call, then `then` (only when the call was observed). */
#define LL_PASSTHROUGH_AROUND(first, then, ret, name, params, args, missing)                   \
  ret name params {                                                                           \
    first;                                                                                    \
    kvs__llama_pfn_##name real = ll_real_##name();                                            \
    if (kvs__unlikely(!real)) return missing;                                                 \
    if (!ll_observe()) return real args;                                                      \
    ll_depth++;                                                                               \
    kvs__hook_count();                                                                        \
    ret r_ = real args;                                                                       \
    ll_depth--;                                                                               \
    then;                                                                                     \
    return r_;                                                                                \
  }
#define LL_PASSTHROUGH(ret, name, params, args, missing)                                      \
  LL_PASSTHROUGH_AROUND((void)0, (void)0, ret, name, params, args, missing)
/* Sequence state reads: the prefix cache remembers what the engine saved (prefix.h). */
#define LL_PASSTHROUGH_SAVE(ret, name, params, args, missing)                                 \
  LL_PASSTHROUGH_AROUND((void)0, if (r_ && r_ <= size) kvs__llama_prefix_state_saved(ctx, seq_id, dst, r_), \
                        ret, name, params, args, missing)
/* Hooks that replace a sequence's KV: the prefix cache (prefix.c) hears of it first, whatever
 * the hook then does, and of a state it knows after the engine loaded all of it. */
#define LL_PASSTHROUGH_LOAD(ret, name, params, args, missing, ctx_, seq_)                     \
  LL_PASSTHROUGH_AROUND(kvs__llama_prefix_state_load(ctx_, seq_),                             \
                        if (r_ == size) kvs__llama_prefix_state_loaded(ctx_, seq_, src, size), \
                        ret, name, params, args, missing)

LL_PASSTHROUGH(size_t, llama_state_seq_get_size, (struct llama_context * ctx, int32_t seq_id),
               (ctx, seq_id), 0)
LL_PASSTHROUGH(size_t, llama_state_seq_get_size_ext,
               (struct llama_context * ctx, int32_t seq_id, uint32_t flags), (ctx, seq_id, flags),
               0)
LL_PASSTHROUGH_SAVE(size_t, llama_state_seq_get_data,
               (struct llama_context * ctx, uint8_t *dst, size_t size, int32_t seq_id),
               (ctx, dst, size, seq_id), 0)
LL_PASSTHROUGH_SAVE(size_t, llama_state_seq_get_data_ext,
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
LL_PASSTHROUGH_AROUND(kvs__llama_prefix_state_load(ctx, -1), (void)0, bool, llama_state_load_file,
               (struct llama_context * ctx, const char *path_session, int32_t *tokens_out,
                size_t n_token_capacity, size_t *n_token_count_out),
               (ctx, path_session, tokens_out, n_token_capacity, n_token_count_out), false)
#undef LL_PASSTHROUGH
#undef LL_PASSTHROUGH_SAVE
#undef LL_PASSTHROUGH_LOAD
#undef LL_PASSTHROUGH_AROUND

/* The runtime for a caching hook (NULL: pass through; a FAILED runtime was counted). */
static kvs__runtime_t *ll_rt(void) {
  kvs__runtime_t *rt = kvs__runtime_get();
  return rt && kvs__family_on(&kvs__family_llama) ? rt : NULL;
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
  /* llama-server's /slots?action=restore: the file's tokens are the sequence's now */
  if (r && tokens_out && n_token_count_out && *n_token_count_out <= n_token_capacity)
    kvs__llama_prefix_state_tokens(ctx, dest_seq_id, tokens_out, *n_token_count_out);
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
    KVS__REENTRY_GUARD(); /* file reads and hashing only: kvshim's own work */
    kvs__llama_model_add(model, path_model, &kvs__runtime_options()->core);
  }
  ll_depth--;
  return model;
}

void llama_model_free(struct llama_model *model) {
  kvs__llama_pfn_llama_model_free real = ll_real_llama_model_free();
  /* Forget first, also when the hook is otherwise off: a model loaded at this address later
   * must never inherit this one's fingerprint. */
  if (model && kvs__hook_depth == 0) kvs__llama_model_forget(model);
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

static void ll_fork_child(void) {
  /* Models stay loaded in the child, so the table stays valid; only its lock is reset. */
  kvs__llama_model_fork_child();
}

/* dlsym(handle, "llama_...") finding the engine's function (ctypes-style engines look their
 * functions up this way) gets the wrapper, so those calls are served too: the generic rule. */
const kvs__family_t kvs__family_llama = {KVS__FAMILY_HEAD, .fork_child = ll_fork_child};
