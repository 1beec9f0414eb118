/* kvshim keys: deterministic chunk keys (design §6).
 *
 *   h(-1) = XXH3_128(namespace record)
 *   h(i)  = XXH3_128(canonical(h(i-1)) || tokens of chunk i as little-endian u32)
 *
 * canonical() is XXH128_canonicalFromHash (16 bytes, big-endian high then low), so keys are the
 * same on every host and across restarts (the seed of XXH3 is always 0). Only full chunks are
 * keyed. The namespace record is a fixed, versioned serialisation of kvs_namespace_t
 * (see keys.c); changing any field changes h(-1) and therefore every key. */
#ifndef KVSHIM_KEYS_H
#define KVSHIM_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_key {
  uint64_t lo, hi; /* XXH128_hash_t's low64/high64 */
} kvs_key_t;

#define KVS_KEY_HEX_LEN 32 /* kvs_key_format writes 32 hex digits + NUL */
#define KVS_NS_STR_MAX 64  /* engine, model id and salt: bytes, not NUL-terminated if full */

/* Everything that makes KV bytes meaningful. Zero-initialise, then fill. */
typedef struct kvs_namespace {
  char engine[KVS_NS_STR_MAX];    /* engine family: "llama.cpp", "kvo", "blob" */
  uint8_t model[KVS_NS_STR_MAX];  /* model fingerprint or id (raw bytes) */
  uint32_t model_len;             /* bytes used in model */
  uint32_t dtype;                 /* KV element type code (engine-defined) */
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint32_t chunk_tokens;          /* tokens per chunk (> 0) */
  uint32_t rank, world_size;
  char salt[KVS_NS_STR_MAX];      /* KVSHIM_SALT */
} kvs_namespace_t;

/* Set ns->salt from a salt of any length: kept as is when it fits (< KVS_NS_STR_MAX bytes),
 * else replaced by "#" and the 32 hex digits of its XXH3-128, so every byte of a long salt
 * still separates tenants. */
void kvs_namespace_set_salt(kvs_namespace_t *ns, const char *salt);

/* h(-1) for a namespace. */
kvs_key_t kvs_keys_namespace(const kvs_namespace_t *ns);

/* Chain one chunk: XXH3_128(canonical(prev) || tokens[0..n) as LE u32). */
kvs_key_t kvs_keys_chain(kvs_key_t prev, const uint32_t *tokens, size_t n);

/* Key the full chunks of tokens[0..n_tokens): writes min(n_tokens / chunk_tokens, max_out)
 * keys to out (out[i] = h(i)) and returns that count. A partial last chunk gets no key. */
size_t kvs_keys_chunks(kvs_key_t ns_key, const uint32_t *tokens, size_t n_tokens,
                       uint32_t chunk_tokens, kvs_key_t *out, size_t max_out);

/* A key for a name (an engine state file path, a CLI blob name) inside a namespace:
 * XXH3_128(canonical(ns_key) || 'N' || name bytes). */
kvs_key_t kvs_keys_name(kvs_key_t ns_key, const char *name, size_t len);

static inline bool kvs_key_eq(kvs_key_t a, kvs_key_t b) { return a.lo == b.lo && a.hi == b.hi; }
static inline bool kvs_key_is_zero(kvs_key_t k) { return (k.lo | k.hi) == 0; }

/* 32 lowercase hex digits (hi then lo) + NUL into buf[KVS_KEY_HEX_LEN + 1]. */
void kvs_key_format(kvs_key_t k, char *buf);
/* Parse 32 hex digits; returns 0 or -EINVAL. */
int kvs_key_parse(const char *s, kvs_key_t *out);

/* XXH3-64 (seed 0) of n bytes: the content checksum of REPORT_BAD (docs/protocol.md 4.11). */
uint64_t kvs_checksum64(const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
