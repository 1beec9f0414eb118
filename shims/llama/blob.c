/* shims/llama: the one blob format of both llama adapters, its checker and its flows
 * (blob.h). */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "blob.h"
#include "blob_hash.h"
#include "pool.h"
#include "proto.h"
#include "runtime.h"
#include "stats.h"

/* ---- the checksum ----------------------------------------------------------------------------- */

uint64_t kvs__llama_hash(const void *p, size_t n, uint64_t seed) {
  /* 1: AVX2 build, 0: portable, -1: not asked yet (a race asks twice, same answer). */
  static int g_avx2 = -1;
  int use = __atomic_load_n(&g_avx2, __ATOMIC_RELAXED);
  if (use < 0) {
    int have = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    have = kvs__llama_hash_avx2_built && __builtin_cpu_supports("avx2");
#endif
    use = have;
    __atomic_store_n(&g_avx2, use, __ATOMIC_RELAXED);
  }
  if (use) return kvs__llama_hash_avx2(p, n, seed);
  return XXH3_64bits_withSeed(p, n, seed);
}

uint64_t kvs__llama_blob_checksum_fast(const uint8_t *blob, uint64_t blob_len) {
  uint64_t h = XXH3_64bits(blob, offsetof(kvs__llama_blob_hdr_t, checksum));
  return kvs__llama_hash(blob + KVS_LLAMA_BLOB_HDR, (size_t)(blob_len - KVS_LLAMA_BLOB_HDR), h);
}

/* ---- the checker ------------------------------------------------------------------------------ */

kvs__llama_blob_status_t kvs__llama_blob_check(const uint8_t *blob, uint64_t len,
                                               const kvs__llama_blob_want_t *want,
                                               kvs__llama_blob_hdr_t *hdr) {
  kvs__llama_blob_hdr_t h;
  if (!blob || len < KVS_LLAMA_BLOB_HDR) return KVS_LLAMA_BLOB_SHORT;
  memcpy(&h, blob, sizeof h);
  if (h.magic != KVS_LLAMA_BLOB_MAGIC || h.version != KVS_LLAMA_BLOB_VERSION ||
      h.hdr_size != KVS_LLAMA_BLOB_HDR || h.kind != want->kind)
    return KVS_LLAMA_BLOB_FOREIGN;
  /* n_tokens < 2^32 and state_size is checked against len first: no overflow below. */
  uint64_t rest = len - KVS_LLAMA_BLOB_HDR;
  uint64_t tok_bytes = 4 * (uint64_t)h.n_tokens;
  if (tok_bytes > rest || h.state_size != rest - tok_bytes) return KVS_LLAMA_BLOB_LENGTH;
  bool keyed_ok = h.kind == KVS_LLAMA_BLOB_KIND_PREFIX
                      ? h.chunk_tokens == want->chunk && want->chunk != 0 &&
                            h.keyed_tokens != 0 && h.keyed_tokens % want->chunk == 0 &&
                            h.keyed_tokens <= h.n_tokens &&
                            (h.canon_tokens == 0 || (h.canon_tokens >= h.keyed_tokens &&
                                                     h.canon_tokens <= h.n_tokens))
                      : h.keyed_tokens == 0 && h.chunk_tokens == 0 && h.canon_tokens == 0;
  if (!keyed_ok) return KVS_LLAMA_BLOB_KEYED;
  uint32_t state_magic = 0;
  if (h.state_size >= KVS_LLAMA_STATE_HDR)
    memcpy(&state_magic, blob + KVS_LLAMA_BLOB_HDR + tok_bytes, sizeof state_magic);
  if (state_magic != KVS_LLAMA_STATE_MAGIC) return KVS_LLAMA_BLOB_STATE;
  if (!want->model_fp || memcmp(h.model_fp, want->model_fp, KVS_LLAMA_FP_SIZE) != 0)
    return KVS_LLAMA_BLOB_MODEL;
  if (h.ns_lo != want->ns.lo || h.ns_hi != want->ns.hi) return KVS_LLAMA_BLOB_NAMESPACE;
  if (kvs__llama_blob_checksum_fast(blob, len) != h.checksum) return KVS_LLAMA_BLOB_CHECKSUM;
  if (hdr) *hdr = h;
  return KVS_LLAMA_BLOB_OK;
}

const char *kvs__llama_blob_status_name(kvs__llama_blob_status_t s) {
  switch (s) {
  case KVS_LLAMA_BLOB_OK: return "ok";
  case KVS_LLAMA_BLOB_SHORT: return "shorter than its header";
  case KVS_LLAMA_BLOB_FOREIGN: return "foreign magic, version or kind";
  case KVS_LLAMA_BLOB_LENGTH: return "length does not match its header (truncated?)";
  case KVS_LLAMA_BLOB_KEYED: return "keyed tokens or chunk size inconsistent";
  case KVS_LLAMA_BLOB_STATE: return "not a llama.cpp sequence state";
  case KVS_LLAMA_BLOB_MODEL: return "saved by another model";
  case KVS_LLAMA_BLOB_NAMESPACE: return "saved by a context with other KV settings";
  case KVS_LLAMA_BLOB_CHECKSUM: return "checksum mismatch (corrupted)";
  }
  return "unknown";
}

/* ---- the engine's sequence state functions ---------------------------------------------------- */

bool kvs__llama_state_api_ok(const kvs__llama_state_api_t *a) {
  return (a->get_size || a->get_size_ext) && (a->get_data || a->get_data_ext) &&
         (a->set_data || a->set_data_ext);
}

size_t kvs__llama_state_size(const kvs__llama_state_api_t *a, struct llama_context *ctx,
                             int32_t seq) {
  if (a->get_size_ext) return a->get_size_ext(ctx, seq, 0);
  return a->get_size ? a->get_size(ctx, seq) : 0;
}

size_t kvs__llama_state_get(const kvs__llama_state_api_t *a, struct llama_context *ctx, uint8_t *dst,
                            size_t size, int32_t seq) {
  if (a->get_data_ext) return a->get_data_ext(ctx, dst, size, seq, 0);
  return a->get_data ? a->get_data(ctx, dst, size, seq) : 0;
}

size_t kvs__llama_state_set(const kvs__llama_state_api_t *a, struct llama_context *ctx,
                            const uint8_t *src, size_t size, int32_t seq) {
  if (a->set_data_ext) return a->set_data_ext(ctx, src, size, seq, 0);
  return a->set_data ? a->set_data(ctx, src, size, seq) : 0;
}

kvs__llama_blob_home_t kvs__llama_blob_home(struct kvs__runtime *rt) {
  kvs__llama_blob_home_t h = {rt->store, kvs_pool_base(rt->pool), rt->peers,
                              rt->opts.one_copy != 0, rt};
  return h;
}

uint64_t kvs__llama_blob_cache(const kvs__llama_blob_home_t *home) {
  if (!home->peers || !home->one_copy) return 0;
  KVS__REENTRY_GUARD();
  kvs_peers_discover(home->peers, false); /* rate-limited */
  return kvs__runtime_cache_peer(home->rt); /* and the own pool lean or full, as it finds */
}

/* ---- save ------------------------------------------------------------------------------------- */

static int outcome_errno(uint8_t oc) {
  switch (oc) {
  case KVS_RES_BUSY: return -EBUSY;
  case KVS_RES_NO_SPACE: return -ENOSPC;
  case KVS_RES_TOO_LARGE: return -EFBIG;
  case KVS_RES_PRESENT: return -EEXIST;
  default: return -EINVAL;
  }
}

/* Reserve one object under keys. replace: a READY object under keys[0] is removed first; a
 * reader's pin can hold it briefly, so try a few times. Caller raised kvs__hook_depth. */
static int reserve(kvs_store_t *st, const kvs_key_t *keys, size_t nk, uint64_t len, bool replace,
                   kvs_extent_t *ext, kvs_xfer_t *xfer) {
  kvs_layout_t l = kvs_layout_blob(len);
  for (int attempt = 0; attempt < 4; attempt++) {
    uint8_t oc = 0;
    int rc = kvs_store_reserve_object(st, KVS_OWNER_LOCAL, keys, nk, &l, 0, &oc, ext, xfer);
    if (rc == 1) return 0;
    if (rc < 0) return rc;
    if (oc != KVS_RES_PRESENT || !replace) return outcome_errno(oc);
    if (kvs_store_remove(st, &keys[0]) == -EBUSY) {
      struct timespec ts = {0, 1000000L << attempt};
      nanosleep(&ts, NULL);
    }
  }
  return -EBUSY;
}

/* The fields of a sealed blob's header that the save fills (the rest come from the caller). */
static void hdr_fill(kvs__llama_blob_hdr_t *hdr, uint32_t n, uint64_t S) {
  hdr->magic = KVS_LLAMA_BLOB_MAGIC;
  hdr->version = KVS_LLAMA_BLOB_VERSION;
  hdr->hdr_size = (uint16_t)KVS_LLAMA_BLOB_HDR;
  hdr->n_tokens = n;
  hdr->state_size = S;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME_COARSE, &now); /* the clock file mtimes come from */
  hdr->saved_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

/* The header (checksum 0), then its checksum over the whole blob. */
static void seal(uint8_t *blob, uint64_t len, kvs__llama_blob_hdr_t *hdr) {
  hdr->checksum = 0;
  memcpy(blob, hdr, sizeof *hdr);
  hdr->checksum = kvs__llama_blob_checksum_fast(blob, len);
  memcpy(blob + offsetof(kvs__llama_blob_hdr_t, checksum), &hdr->checksum,
         sizeof hdr->checksum);
}

/* The engine serialises sequence seq straight into state (S bytes): true when it wrote exactly
 * the state get_size announced. Called with kvs__hook_depth lowered to the engine's. */
static bool state_write(const kvs__llama_state_api_t *api, struct llama_context *ctx,
                        uint8_t *state, size_t S, int32_t seq) {
  size_t w = kvs__llama_state_get(api, ctx, state, S, seq);
  uint32_t smagic = 0;
  if (w == S) memcpy(&smagic, state, sizeof smagic);
  return w == S && smagic == KVS_LLAMA_STATE_MAGIC;
}

/* kvs_peer_copy_fn writing a whole blob into the cache peer's slot (dst, len bytes). */
typedef struct peer_fill {
  const kvs__llama_state_api_t *api;
  struct llama_context *ctx;
  int32_t seq;
  const int32_t *tokens;
  uint32_t n;
  size_t S;
  kvs__llama_blob_hdr_t *hdr;
  int rc; /* -EIO: the engine did not write the announced state */
} peer_fill_t;

static int peer_fill(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  (void)i;
  (void)src;
  peer_fill_t *f = ctx;
  uint64_t tok_bytes = 4 * (uint64_t)f->n;
  if (len != KVS_LLAMA_BLOB_HDR + tok_bytes + f->S) return f->rc = -EPROTO;
  uint8_t *blob = dst;
  /* The engine's own call: seen by the hooks below kvshim (e.g. a device copy), as locally. */
  int depth = kvs__hook_depth;
  kvs__hook_depth = 0;
  bool ok = state_write(f->api, f->ctx, blob + KVS_LLAMA_BLOB_HDR + tok_bytes, f->S, f->seq);
  kvs__hook_depth = depth;
  if (!ok) return f->rc = -EIO;
  if (tok_bytes) memcpy(blob + KVS_LLAMA_BLOB_HDR, f->tokens, (size_t)tok_bytes);
  hdr_fill(f->hdr, f->n, f->S);
  seal(blob, len, f->hdr);
  return 0;
}

/* One copy per node: the whole save straight into the cache peer's pool. 0 (published),
 * -EEXIST (there already, not replace), -EIO (the engine), or 1: save into the own pool. */
static int begin_at_peer(const kvs__llama_blob_home_t *home, uint64_t cache, const kvs_key_t *keys,
                         size_t nk, bool replace, const kvs__llama_state_api_t *api,
                         struct llama_context *ctx, int32_t seq, const int32_t *tokens,
                         uint32_t n, size_t S, kvs__llama_blob_hdr_t *hdr,
                         kvs__llama_blob_save_t *s) {
  uint64_t total = KVS_LLAMA_BLOB_HDR + 4 * (uint64_t)n + S;
  kvs_layout_t l = kvs_layout_blob(total);
  peer_fill_t f = {api, ctx, seq, tokens, n, S, hdr, 0};
  const void *buf = NULL;
  uint8_t oc[KVS_PROTO_MAX_KEYS] = {0}; /* 1 for an object; room for a peer that sends more */
  int r;
  {
    KVS__REENTRY_GUARD();
    r = kvs_peers_store_into(home->peers, cache, keys, nk, &l, true, &buf, oc, peer_fill, &f);
  }
  if (f.rc == -EIO) return -EIO;
  if (r == -ENOTSUP) return 1; /* served inline: own copy + write-behind, as before (kvo too) */
  if (r == 1 && oc[0] == KVS_RES_RESERVED) {
    KVS__REENTRY_GUARD();
    if (replace) kvs_store_remove(home->store, &keys[0]); /* an older own copy: -ENOENT, fine */
    kvs_stats_inc(kvs_stats_global(), KVS_STAT_cache_peer_stores);
    s->blob = NULL;
    s->len = total;
    s->xfer = 0;
    s->at_peer = true;
    return 0;
  }
  if (r == 1 && oc[0] == KVS_RES_PRESENT) return replace ? 1 : -EEXIST;
  kvs_stats_inc(kvs_stats_global(), KVS_STAT_cache_peer_fallbacks);
  return 1;
}

int kvs__llama_blob_begin(const kvs__llama_blob_home_t *home, const kvs_key_t *keys, size_t nk,
                          bool replace, const kvs__llama_state_api_t *api,
                          struct llama_context *ctx, int32_t seq, const int32_t *tokens,
                          uint32_t n, kvs__llama_blob_hdr_t *hdr, kvs__llama_blob_save_t *s) {
  size_t S = kvs__llama_state_size(api, ctx, seq);
  if (S < KVS_LLAMA_STATE_HDR || S > (1ull << 48)) return -ENODATA;
  uint64_t tok_bytes = 4 * (uint64_t)n;
  uint64_t total = KVS_LLAMA_BLOB_HDR + tok_bytes + S;
  uint64_t cache = kvs__llama_blob_cache(home);
  if (cache) {
    int pr = begin_at_peer(home, cache, keys, nk, replace, api, ctx, seq, tokens, n, S, hdr, s);
    if (pr <= 0) return pr;
    /* Into the own pool instead: if the cache peer just failed and is gone, the pool is the
     * cache again (full size), not the lean staging area sized while it was there. */
    KVS__REENTRY_GUARD();
    (void)kvs__runtime_cache_peer(home->rt);
  }
  s->at_peer = false;
  kvs_extent_t ext;
  kvs_xfer_t xfer = 0;
  int rc;
  {
    KVS__REENTRY_GUARD();
    rc = reserve(home->store, keys, nk, total, replace, &ext, &xfer);
  }
  if (rc < 0) return rc;
  s->blob = home->base + ext.offset;
  s->len = total;
  s->xfer = xfer;
  uint8_t *state = s->blob + KVS_LLAMA_BLOB_HDR + tok_bytes;
  /* Zero copy: the engine serialises the sequence straight into the pool. */
  if (!state_write(api, ctx, state, S, seq)) {
    kvs__llama_blob_abort(home, s);
    return -EIO;
  }
  if (tok_bytes) memcpy(s->blob + KVS_LLAMA_BLOB_HDR, tokens, (size_t)tok_bytes);
  hdr_fill(hdr, n, S);
  return 0;
}

int kvs__llama_blob_commit(const kvs__llama_blob_home_t *home, const kvs_key_t *keys, size_t nk,
                           kvs__llama_blob_hdr_t *hdr, kvs__llama_blob_save_t *s) {
  if (s->at_peer) return 0; /* published by kvs__llama_blob_begin */
  seal(s->blob, s->len, hdr);
  int rc;
  {
    KVS__REENTRY_GUARD();
    rc = kvs_store_commit(home->store, KVS_OWNER_LOCAL, s->xfer);
    if (rc == 0 && home->peers) kvs_peers_push(home->peers, keys, nk); /* -ENOTSUP: no cache peer */
  }
  return rc;
}

void kvs__llama_blob_abort(const kvs__llama_blob_home_t *home, kvs__llama_blob_save_t *s) {
  if (s->at_peer) return; /* published: nothing local to end */
  KVS__REENTRY_GUARD();
  kvs_store_abort(home->store, KVS_OWNER_LOCAL, s->xfer);
}

/* kvs_peer_copy_fn over a kvs__llama_obj_store fill. */
typedef struct obj_fill {
  int (*fill)(void *arg, uint8_t *dst);
  void *arg;
  int rc;
} obj_fill_t;

static int obj_fill(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  (void)i;
  (void)src;
  (void)len;
  obj_fill_t *f = ctx;
  return f->rc = f->fill(f->arg, dst);
}

int kvs__llama_obj_store(const kvs__llama_blob_home_t *home, kvs_key_t key, uint64_t len,
                         int (*fill)(void *arg, uint8_t *dst), void *arg) {
  uint64_t cache = kvs__llama_blob_cache(home);
  if (cache) { /* one copy per node: straight into the cache peer's pool, as a blob save */
    kvs_layout_t l = kvs_layout_blob(len);
    obj_fill_t f = {fill, arg, 0};
    const void *buf = NULL;
    uint8_t oc[KVS_PROTO_MAX_KEYS] = {0};
    int r;
    {
      KVS__REENTRY_GUARD();
      r = kvs_peers_store_into(home->peers, cache, &key, 1, &l, true, &buf, oc, obj_fill, &f);
    }
    if (f.rc) return f.rc;
    if (r == 1 && oc[0] == KVS_RES_RESERVED) {
      kvs_stats_inc(kvs_stats_global(), KVS_STAT_cache_peer_stores);
      return 0;
    }
    if (r == 1 && oc[0] == KVS_RES_PRESENT) return -EEXIST;
    if (r != -ENOTSUP) kvs_stats_inc(kvs_stats_global(), KVS_STAT_cache_peer_fallbacks);
    KVS__REENTRY_GUARD();
    (void)kvs__runtime_cache_peer(home->rt); /* the own pool is the cache again if it is gone */
  }
  kvs_extent_t ext;
  kvs_xfer_t xfer = 0;
  int rc;
  {
    KVS__REENTRY_GUARD();
    rc = reserve(home->store, &key, 1, len, false, &ext, &xfer);
  }
  if (rc < 0) return rc;
  rc = fill(arg, home->base + ext.offset);
  KVS__REENTRY_GUARD();
  if (rc != 0) {
    kvs_store_abort(home->store, KVS_OWNER_LOCAL, xfer);
    return rc;
  }
  rc = kvs_store_commit(home->store, KVS_OWNER_LOCAL, xfer);
  if (rc == 0 && home->peers) kvs_peers_push(home->peers, &key, 1); /* -ENOTSUP: no cache peer */
  return rc;
}

/* ---- local restore ---------------------------------------------------------------------------- */

bool kvs__llama_blob_pin(const kvs__llama_blob_home_t *home, kvs_key_t key, const uint8_t **blob,
                         uint64_t *len, kvs_xfer_t *xfer) {
  kvs_xfer_t x = 0;
  kvs_object_view_t v;
  int found;
  {
    KVS__REENTRY_GUARD();
    found = kvs_store_lookup(home->store, KVS_OWNER_LOCAL, &key, 1, true, &x);
    if (found == 1 && kvs_store_read_pinned(home->store, KVS_OWNER_LOCAL, x, &v, 1) != 1) {
      kvs_store_release(home->store, KVS_OWNER_LOCAL, x);
      found = 0;
    }
  }
  if (found != 1) return false;
  *blob = home->base + v.extent.offset;
  *len = v.extent.length;
  *xfer = x;
  return true;
}

void kvs__llama_blob_unpin(const kvs__llama_blob_home_t *home, kvs_key_t key, kvs_xfer_t xfer,
                           bool drop) {
  KVS__REENTRY_GUARD();
  kvs_store_release(home->store, KVS_OWNER_LOCAL, xfer);
  if (drop) kvs_store_remove(home->store, &key); /* -EBUSY: a reader has it; fine */
}

/* ---- peer restore ----------------------------------------------------------------------------- */

int kvs__llama_blob_fetch(const kvs__llama_blob_home_t *home, uint64_t instance, kvs_key_t key,
                          kvs_fetch_keys_fn keys_fn, void *ctx, kvs__llama_blob_fetch_t *f) {
  kvs_fetch_t out;
  f->staged = false;
  {
    KVS__REENTRY_GUARD();
    kvs_peers_fetch(home->peers, instance, &key, 1, NULL, keys_fn, ctx, &out); /* errors: misses */
  }
  if (out.status == KVS_FETCH_COPIED) {
    f->blob = home->base + out.extent.offset;
    f->len = out.extent.length;
    f->xfer = out.xfer;
    /* One copy per node: a blob the cache peer holds stays there only. */
    uint64_t cache = home->one_copy ? kvs__runtime_cache_peer(home->rt) : 0;
    f->staged = cache != 0 && instance == cache;
  }
  return out.status;
}

void kvs__llama_blob_keep(const kvs__llama_blob_home_t *home, const kvs__llama_blob_fetch_t *f,
                          bool keep) {
  KVS__REENTRY_GUARD();
  if (keep && !f->staged) kvs_store_commit(home->store, KVS_OWNER_LOCAL, f->xfer);
  else kvs_store_abort(home->store, KVS_OWNER_LOCAL, f->xfer);
}
