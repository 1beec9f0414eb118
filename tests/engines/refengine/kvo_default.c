/* libkvo_default: the reference engine's default offload module (see kvo_default.h).
 *
 * Keys. Chunk i of a token sequence is named by a 128-bit chained hash:
 *     k(-1) = H(namespace: every identity field of the descriptor)
 *     k(i)  = H(k(i-1) || tokens of chunk i as little-endian u32)
 * H is two independent 64-bit FNV-1a style lanes (different offset bases and multipliers),
 * each finished with a 64-bit avalanche mix. This is a private cache of one process, so the
 * hash only has to make accidental collisions negligible (2^-128 per pair), not resist attack.
 *
 * Cache. A hash table (separate chaining, power-of-two buckets, grown at load factor 1) over
 * entries that also sit on one LRU list, most recently used at the head. Invariant, under
 * cache.lock: used == sum of entry->len over all entries <= capacity.
 *
 * Threads. One mutex guards the whole cache. A store copies the caller's bytes into a new
 * entry before taking the lock; a load copies out while holding it (the entry must not be
 * evicted mid-copy). Good enough for an engine's simple built-in cache; kvshim's store is the
 * part built for concurrency. */
#include "kvo_default.h"

#include <cuda.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* --- keys --------------------------------------------------------------------------------- */

typedef struct chunk_key {
  uint64_t a, b;
} chunk_key_t;

typedef struct hasher {
  uint64_t a, b;
} hasher_t;

static hasher_t hasher_start(void) {
  return (hasher_t){.a = 0xcbf29ce484222325ull, .b = 0x6c62272e07bb0142ull};
}

static void hasher_feed(hasher_t *h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) {
    h->a = (h->a ^ p[i]) * 0x00000100000001b3ull; /* the FNV-1a 64-bit prime */
    h->b = (h->b ^ p[i]) * 0x9e3779b97f4a7c15ull; /* an odd constant unrelated to it */
  }
}

static void hasher_feed_u32(hasher_t *h, uint32_t v) {
  unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                         (unsigned char)(v >> 24)};
  hasher_feed(h, le, sizeof le);
}

static void hasher_feed_u64(hasher_t *h, uint64_t v) {
  hasher_feed_u32(h, (uint32_t)v);
  hasher_feed_u32(h, (uint32_t)(v >> 32));
}

static uint64_t avalanche(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

static chunk_key_t hasher_finish(const hasher_t *h) {
  return (chunk_key_t){.a = avalanche(h->a), .b = avalanche(h->b ^ 0x5851f42d4c957f2dull)};
}

/* k(-1): every descriptor field that makes the KV bytes meaningful. */
static chunk_key_t key_namespace(const kvo_desc_t *d) {
  hasher_t h = hasher_start();
  static const char tag[] = "kvo_default/1";
  hasher_feed(&h, tag, sizeof tag);
  size_t id_len = strnlen(d->model_id, KVO_MODEL_ID_MAX);
  hasher_feed_u32(&h, (uint32_t)id_len);
  hasher_feed(&h, d->model_id, id_len);
  const uint32_t fields[] = {d->dtype,        d->layers, d->kv_heads,   d->head_dim,
                             d->chunk_tokens, d->rank,   d->world_size, d->layout};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) hasher_feed_u32(&h, fields[i]);
  return hasher_finish(&h);
}

static chunk_key_t key_chain(chunk_key_t prev, const uint32_t *tokens, size_t n) {
  hasher_t h = hasher_start();
  hasher_feed_u64(&h, prev.a);
  hasher_feed_u64(&h, prev.b);
  for (size_t i = 0; i < n; i++) hasher_feed_u32(&h, tokens[i]);
  return hasher_finish(&h);
}

/* k(chunk_index): chains through every earlier chunk, O((chunk_index + 1) * chunk_tokens). */
static chunk_key_t key_of_chunk(const kvo_desc_t *d, const uint32_t *tokens, size_t chunk_index) {
  chunk_key_t k = key_namespace(d);
  for (size_t i = 0; i <= chunk_index; i++)
    k = key_chain(k, tokens + i * d->chunk_tokens, d->chunk_tokens);
  return k;
}

/* --- the LRU cache ------------------------------------------------------------------------ */

typedef struct entry {
  chunk_key_t key;
  struct entry *hnext;       /* next entry in the same bucket */
  struct entry *prev, *next; /* LRU list; cache.lru is the sentinel */
  size_t len;                /* bytes in data (the descriptor's chunk_bytes) */
  unsigned char data[];
} entry_t;

#define INITIAL_BUCKETS 256

static struct {
  pthread_mutex_t lock;
  size_t capacity; /* bytes; 0 = no cache */
  size_t used;     /* bytes held by entries */
  size_t count;    /* entries */
  size_t n_buckets; /* power of two, or 0 before the first insert */
  entry_t **buckets;
  entry_t lru; /* sentinel: lru.next is the most recently used entry */
} cache = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .lru = {.prev = &cache.lru, .next = &cache.lru},
};

static size_t bucket_of(chunk_key_t k) { return (size_t)k.a & (cache.n_buckets - 1); }

static entry_t *find(chunk_key_t k) {
  if (cache.n_buckets == 0) return NULL;
  for (entry_t *e = cache.buckets[bucket_of(k)]; e != NULL; e = e->hnext)
    if (e->key.a == k.a && e->key.b == k.b) return e;
  return NULL;
}

static void lru_unlink(entry_t *e) {
  e->prev->next = e->next;
  e->next->prev = e->prev;
}

static void lru_push_front(entry_t *e) {
  e->prev = &cache.lru;
  e->next = cache.lru.next;
  cache.lru.next->prev = e;
  cache.lru.next = e;
}

static void touch(entry_t *e) {
  lru_unlink(e);
  lru_push_front(e);
}

static void remove_entry(entry_t *e) {
  entry_t **pp = &cache.buckets[bucket_of(e->key)];
  while (*pp != e) pp = &(*pp)->hnext;
  *pp = e->hnext;
  lru_unlink(e);
  cache.used -= e->len;
  cache.count--;
  free(e);
}

static void evict_until(size_t limit) {
  while (cache.used > limit) remove_entry(cache.lru.prev);
}

/* Doubles the table (or creates it). On allocation failure the old table stays: chains only
 * get longer, nothing is lost. */
static void grow(void) {
  size_t n = cache.n_buckets ? cache.n_buckets * 2 : INITIAL_BUCKETS;
  entry_t **b = calloc(n, sizeof *b);
  if (b == NULL) return;
  for (size_t i = 0; i < cache.n_buckets; i++) {
    for (entry_t *e = cache.buckets[i], *next; e != NULL; e = next) {
      next = e->hnext;
      size_t j = (size_t)e->key.a & (n - 1);
      e->hnext = b[j];
      b[j] = e;
    }
  }
  free(cache.buckets);
  cache.buckets = b;
  cache.n_buckets = n;
}

/* Inserts e (whose bytes are filled) or frees it; returns KVO_OK or KVO_NOT_KEPT. */
static int insert(entry_t *e) {
  entry_t *old = find(e->key);
  if (old != NULL) {
    touch(old);
    free(e);
    return KVO_OK;
  }
  if (e->len > cache.capacity) {
    free(e);
    return KVO_NOT_KEPT;
  }
  evict_until(cache.capacity - e->len);
  if (cache.count >= cache.n_buckets) grow();
  if (cache.n_buckets == 0) {
    free(e);
    return KVO_NOT_KEPT;
  }
  size_t j = bucket_of(e->key);
  e->hnext = cache.buckets[j];
  cache.buckets[j] = e;
  lru_push_front(e);
  cache.used += e->len;
  cache.count++;
  return KVO_OK;
}

int kvo_default_configure(size_t native_cache_bytes) {
  pthread_mutex_lock(&cache.lock);
  cache.capacity = native_cache_bytes;
  evict_until(native_cache_bytes);
  if (native_cache_bytes == 0) {
    free(cache.buckets);
    cache.buckets = NULL;
    cache.n_buckets = 0;
  }
  pthread_mutex_unlock(&cache.lock);
  return 0;
}

/* --- the kvo functions -------------------------------------------------------------------- */

/* The argument rules shared by load and store (kvo.h). */
static int check_chunk_args(const kvo_desc_t *d, const uint32_t *tokens, size_t n_tokens,
                            size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  int rc = kvo_desc_check(d);
  if (rc != 0) return rc;
  if (d->chunk_bytes > SIZE_MAX) return -EINVAL;
  if (tokens == NULL || buf == 0) return -EINVAL;
  if (buf_kind != KVO_BUF_HOST && buf_kind != KVO_BUF_DEVICE) return -EINVAL;
  if (chunk_index >= n_tokens / d->chunk_tokens) return -EINVAL; /* chunk must be full */
  if (buf_len < d->chunk_bytes) return -ENOBUFS;
  return 0;
}

/* Copies between the caller's buffer and host memory; the device side uses the calling
 * thread's current context (a kvo.h rule). */
static int copy_out(int buf_kind, uint64_t buf, const void *src, size_t len) {
  if (buf_kind == KVO_BUF_HOST) {
    memcpy((void *)(uintptr_t)buf, src, len);
    return 0;
  }
  return cuMemcpyHtoD((CUdeviceptr)buf, src, len) == CUDA_SUCCESS ? 0 : -EIO;
}

static int copy_in(void *dst, int buf_kind, uint64_t buf, size_t len) {
  if (buf_kind == KVO_BUF_HOST) {
    memcpy(dst, (const void *)(uintptr_t)buf, len);
    return 0;
  }
  return cuMemcpyDtoH(dst, (CUdeviceptr)buf, len) == CUDA_SUCCESS ? 0 : -EIO;
}

KVO_API int kvo_lookup(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens) {
  int rc = kvo_desc_check(desc);
  if (rc != 0) return rc;
  if (tokens == NULL && n_tokens > 0) return -EINVAL;
  size_t full = n_tokens / desc->chunk_tokens;

  pthread_mutex_lock(&cache.lock);
  size_t hits = 0;
  if (cache.capacity > 0) {
    chunk_key_t k = key_namespace(desc);
    for (; hits < full; hits++) {
      k = key_chain(k, tokens + hits * desc->chunk_tokens, desc->chunk_tokens);
      entry_t *e = find(k);
      if (e == NULL) break;
      touch(e); /* about to be loaded */
    }
  }
  pthread_mutex_unlock(&cache.lock);
  return hits > INT_MAX ? -EOVERFLOW : (int)hits;
}

/* What kvo_load_chunk and kvo_store_chunk start with: the arguments checked (an error is returned
 * with no lock taken), then the cache lock taken and the chunk's entry in *e (NULL: not cached),
 * its key in *k_out (may be NULL). On 0 the caller holds cache.lock. */
static int lock_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                      size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len,
                      chunk_key_t *k_out, entry_t **e) {
  int rc = check_chunk_args(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len);
  if (rc != 0) return rc;
  chunk_key_t k = key_of_chunk(desc, tokens, chunk_index);
  if (k_out) *k_out = k;
  pthread_mutex_lock(&cache.lock);
  *e = find(k);
  return 0;
}

KVO_API int kvo_load_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                           size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  entry_t *e;
  int rc = lock_chunk(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len, NULL, &e);
  if (rc != 0) return rc;
  if (e == NULL || e->len != desc->chunk_bytes) {
    rc = KVO_MISS;
  } else {
    touch(e);
    rc = copy_out(buf_kind, buf, e->data, e->len);
  }
  pthread_mutex_unlock(&cache.lock);
  return rc;
}

KVO_API int kvo_store_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens,
                            size_t chunk_index, int buf_kind, uint64_t buf, size_t buf_len) {
  chunk_key_t k;
  entry_t *present;
  int rc = lock_chunk(desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len, &k, &present);
  if (rc != 0) return rc;
  if (present != NULL) touch(present);
  bool wanted = present == NULL && desc->chunk_bytes <= cache.capacity;
  pthread_mutex_unlock(&cache.lock);
  if (present != NULL) return KVO_OK; /* same key, same bytes: nothing to copy */
  if (!wanted) return KVO_NOT_KEPT;

  size_t len = (size_t)desc->chunk_bytes;
  entry_t *e = malloc(sizeof *e + len);
  if (e == NULL) return KVO_NOT_KEPT; /* a cache that cannot grow declines; not an error */
  e->key = k;
  e->len = len;
  rc = copy_in(e->data, buf_kind, buf, len);
  if (rc != 0) {
    free(e);
    return rc;
  }

  pthread_mutex_lock(&cache.lock);
  rc = insert(e);
  pthread_mutex_unlock(&cache.lock);
  return rc;
}
