/* shims/llama: the flows every blob goes through (blob_flow.h). Where a blob lives is the
 * runtime's cache facade's (runtime/cache.h); this file fills the bytes. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "blob_flow.h"
#include "runtime.h"

kvs__llama_blob_home_t kvs__llama_blob_home(struct kvs__runtime *rt) {
  kvs__llama_blob_home_t h = {rt};
  return h;
}

uint64_t kvs__llama_blob_cache(const kvs__llama_blob_home_t *home) {
  return kvs__cache_peer(home->rt);
}

/* ---- save ------------------------------------------------------------------------------------- */

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

/* kvs__cache_copy_fn writing a whole blob into the cache peer's slot (dst, len bytes: the
 * facade checked the slot's size). */
typedef struct peer_fill {
  const kvs__llama_state_api_t *api;
  struct llama_context *ctx;
  int32_t seq;
  const int32_t *tokens;
  uint32_t n;
  size_t S;
  kvs__llama_blob_hdr_t *hdr;
} peer_fill_t;

static int peer_fill(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  (void)i;
  (void)src;
  peer_fill_t *f = ctx;
  uint64_t tok_bytes = 4 * (uint64_t)f->n;
  uint8_t *blob = dst;
  /* The engine's own call: seen by the hooks below kvshim (e.g. a device copy), as locally. */
  int depth = kvs__hook_depth;
  kvs__hook_depth = 0;
  bool ok = state_write(f->api, f->ctx, blob + KVS_LLAMA_BLOB_HDR + tok_bytes, f->S, f->seq);
  kvs__hook_depth = depth;
  if (!ok) return -EIO;
  if (tok_bytes) memcpy(blob + KVS_LLAMA_BLOB_HDR, f->tokens, (size_t)tok_bytes);
  hdr_fill(f->hdr, f->n, f->S);
  seal(blob, len, f->hdr);
  return 0;
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
  if (cache) { /* one copy per node: the whole save straight into the cache peer's pool */
    peer_fill_t f = {api, ctx, seq, tokens, n, S, hdr};
    int pr = kvs__cache_save_at_peer(home->rt, cache, keys, nk, total, replace, peer_fill, &f);
    if (pr < 0) return pr; /* -EIO (the engine) or -EEXIST (there already, not replace) */
    if (pr == 0) {
      s->blob = NULL;
      s->len = total;
      s->xfer = 0;
      s->at_peer = true;
      return 0;
    }
    /* 1: into the own pool instead */
  }
  s->at_peer = false;
  uint8_t *blob;
  kvs__cache_ref_t ref = 0;
  int rc = kvs__cache_reserve(home->rt, keys, nk, total, replace, &blob, &ref);
  if (rc < 0) return rc;
  s->blob = blob;
  s->len = total;
  s->xfer = ref;
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
  return kvs__cache_commit(home->rt, keys, nk, s->xfer);
}

void kvs__llama_blob_abort(const kvs__llama_blob_home_t *home, kvs__llama_blob_save_t *s) {
  if (s->at_peer) return; /* published: nothing local to end */
  kvs__cache_abort(home->rt, s->xfer);
}

/* kvs__cache_copy_fn over a kvs__llama_obj_store fill (dst: the slot, len bytes: the facade
 * checked its size). */
typedef struct obj_fill {
  int (*fill)(void *arg, uint8_t *dst);
  void *arg;
} obj_fill_t;

static int obj_fill(void *ctx, size_t i, void *dst, const void *src, size_t len) {
  (void)i;
  (void)src;
  (void)len;
  const obj_fill_t *f = ctx;
  return f->fill(f->arg, dst);
}

int kvs__llama_obj_store(const kvs__llama_blob_home_t *home, const kvs_key_t *keys, size_t nk,
                         uint64_t len, int (*fill)(void *arg, uint8_t *dst), void *arg) {
  uint64_t cache = kvs__llama_blob_cache(home);
  if (cache) { /* one copy per node: straight into the cache peer's pool, as a blob save */
    obj_fill_t f = {fill, arg};
    int pr = kvs__cache_save_at_peer(home->rt, cache, keys, nk, len, false, obj_fill, &f);
    if (pr <= 0) return pr; /* published, -EEXIST (there already) or the fill's errno */
    /* 1: into the own pool instead */
  }
  uint8_t *dst;
  kvs__cache_ref_t ref = 0;
  int rc = kvs__cache_reserve(home->rt, keys, nk, len, false, &dst, &ref);
  if (rc < 0) return rc;
  rc = fill(arg, dst);
  if (rc != 0) {
    kvs__cache_abort(home->rt, ref);
    return rc;
  }
  return kvs__cache_commit(home->rt, keys, nk, ref);
}

/* ---- local restore ---------------------------------------------------------------------------- */

bool kvs__llama_blob_pin(const kvs__llama_blob_home_t *home, kvs_key_t key, const uint8_t **blob,
                         uint64_t *len, kvs__cache_ref_t *xfer) {
  return kvs__cache_pin(home->rt, key, blob, len, xfer);
}

void kvs__llama_blob_unpin(const kvs__llama_blob_home_t *home, kvs_key_t key,
                           kvs__cache_ref_t xfer, bool drop) {
  kvs__cache_unpin(home->rt, key, xfer, drop);
}

/* ---- peer restore ----------------------------------------------------------------------------- */

int kvs__llama_blob_fetch(const kvs__llama_blob_home_t *home, uint64_t instance, kvs_key_t key,
                          kvs__cache_keys_fn keys_fn, void *ctx, kvs__llama_blob_fetch_t *f) {
  kvs__cache_fetch_t out;
  int st = kvs__cache_fetch(home->rt, instance, key, keys_fn, ctx, &out);
  f->staged = false;
  if (st == KVS__CACHE_COPIED) {
    f->blob = out.bytes;
    f->len = out.len;
    f->xfer = out.ref;
    f->staged = out.staged;
  }
  return st;
}

void kvs__llama_blob_keep(const kvs__llama_blob_home_t *home, const kvs__llama_blob_fetch_t *f,
                          bool keep) {
  kvs__cache_fetch_t out = {f->blob, f->len, f->xfer, f->staged};
  kvs__cache_fetch_end(home->rt, &out, keep);
}
