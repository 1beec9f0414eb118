/* kvshim keys: see keys.h.
 *
 * Namespace record, version 1 (every integer little-endian, strings length-prefixed):
 *   "kvshim-ns" (9 bytes) | u8 version=1
 *   | u8 len | engine bytes | u8 len | model bytes
 *   | u32 dtype | u32 layers | u32 kv_heads | u32 head_dim | u32 chunk_tokens
 *   | u32 rank | u32 world_size | u8 len | salt bytes
 * Strings are cut at KVS_NS_STR_MAX bytes (engine and salt also at their first NUL).
 * Changing this record changes every key: bump the version and the known-answer tests. */
#include "keys.h"

#include <errno.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "internal.h"

#define NS_RECORD_VERSION 1u
#define CHAIN_BATCH_TOKENS 1024u /* tokens converted to LE per hashing step */

static size_t put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
  return 4;
}
static size_t put_bytes(uint8_t *p, const void *b, size_t n) {
  p[0] = (uint8_t)n;
  memcpy(p + 1, b, n);
  return 1 + n;
}

void kvs_namespace_set_salt(kvs_namespace_t *ns, const char *salt) {
  size_t n = strlen(salt);
  memset(ns->salt, 0, sizeof ns->salt);
  if (n < KVS_NS_STR_MAX) {
    memcpy(ns->salt, salt, n);
    return;
  }
  XXH128_hash_t h = XXH3_128bits(salt, n);
  ns->salt[0] = '#';
  kvs_key_format((kvs_key_t){h.low64, h.high64}, ns->salt + 1);
}

kvs_key_t kvs_keys_namespace(const kvs_namespace_t *ns) {
  uint8_t rec[16 + 3 * (1 + KVS_NS_STR_MAX) + 7 * 4];
  size_t n = 0;
  memcpy(rec, "kvshim-ns", 9);
  n = 9;
  rec[n++] = NS_RECORD_VERSION;
  n += put_bytes(rec + n, ns->engine, strnlen(ns->engine, KVS_NS_STR_MAX));
  n += put_bytes(rec + n, ns->model, ns->model_len < KVS_NS_STR_MAX ? ns->model_len : KVS_NS_STR_MAX);
  n += put_u32(rec + n, ns->dtype);
  n += put_u32(rec + n, ns->layers);
  n += put_u32(rec + n, ns->kv_heads);
  n += put_u32(rec + n, ns->head_dim);
  n += put_u32(rec + n, ns->chunk_tokens);
  n += put_u32(rec + n, ns->rank);
  n += put_u32(rec + n, ns->world_size);
  n += put_bytes(rec + n, ns->salt, strnlen(ns->salt, KVS_NS_STR_MAX));
  XXH128_hash_t h = XXH3_128bits(rec, n);
  return (kvs_key_t){h.low64, h.high64};
}

static XXH128_canonical_t canonical(kvs_key_t k) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, (XXH128_hash_t){k.lo, k.hi});
  return c;
}

kvs_key_t kvs_keys_chain(kvs_key_t prev, const uint32_t *tokens, size_t n) {
  XXH3_state_t st; /* on the stack: no allocation */
  XXH3_128bits_reset(&st);
  XXH128_canonical_t c = canonical(prev);
  XXH3_128bits_update(&st, &c, sizeof c);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  XXH3_128bits_update(&st, tokens, n * sizeof(uint32_t));
#else
  uint8_t le[CHAIN_BATCH_TOKENS * 4];
  for (size_t i = 0; i < n;) {
    size_t m = n - i < CHAIN_BATCH_TOKENS ? n - i : CHAIN_BATCH_TOKENS;
    for (size_t j = 0; j < m; j++) put_u32(le + 4 * j, tokens[i + j]);
    XXH3_128bits_update(&st, le, m * 4);
    i += m;
  }
#endif
  XXH128_hash_t h = XXH3_128bits_digest(&st);
  return (kvs_key_t){h.low64, h.high64};
}

size_t kvs_keys_chunks(kvs_key_t ns_key, const uint32_t *tokens, size_t n_tokens,
                       uint32_t chunk_tokens, kvs_key_t *out, size_t max_out) {
  if (chunk_tokens == 0) return 0;
  size_t full = n_tokens / chunk_tokens;
  if (full > max_out) full = max_out;
  kvs_key_t h = ns_key;
  for (size_t i = 0; i < full; i++) {
    h = kvs_keys_chain(h, tokens + i * chunk_tokens, chunk_tokens);
    out[i] = h;
  }
  return full;
}

kvs_key_t kvs_keys_name(kvs_key_t ns_key, const char *name, size_t len) {
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  XXH128_canonical_t c = canonical(ns_key);
  XXH3_128bits_update(&st, &c, sizeof c);
  XXH3_128bits_update(&st, "N", 1);
  XXH3_128bits_update(&st, name, len);
  XXH128_hash_t h = XXH3_128bits_digest(&st);
  return (kvs_key_t){h.low64, h.high64};
}

void kvs_key_format(kvs_key_t k, char *buf) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) buf[i] = hex[(k.hi >> (60 - 4 * i)) & 15];
  for (int i = 0; i < 16; i++) buf[16 + i] = hex[(k.lo >> (60 - 4 * i)) & 15];
  buf[KVS_KEY_HEX_LEN] = '\0';
}

int kvs_key_parse(const char *s, kvs_key_t *out) {
  uint64_t v[2] = {0, 0};
  for (int i = 0; i < KVS_KEY_HEX_LEN; i++) {
    char ch = s[i];
    unsigned d;
    if (ch >= '0' && ch <= '9') d = (unsigned)(ch - '0');
    else if (ch >= 'a' && ch <= 'f') d = (unsigned)(ch - 'a' + 10);
    else if (ch >= 'A' && ch <= 'F') d = (unsigned)(ch - 'A' + 10);
    else return -EINVAL;
    v[i / 16] = (v[i / 16] << 4) | d;
  }
  if (s[KVS_KEY_HEX_LEN] != '\0') return -EINVAL;
  *out = (kvs_key_t){v[1], v[0]};
  return 0;
}

uint64_t kvs_checksum64(const void *p, size_t n) { return XXH3_64bits(p, n); }
