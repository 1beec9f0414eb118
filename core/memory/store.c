/* kvshim store: see store.h (design §4, §4.4 for the shards).
 *
 * Tables. Every table is an array in one anonymous mapping made at create time (pages are
 * backed lazily, on first use); index 0 of each is the nil sentinel, so zero-filled memory is
 * an empty list everywhere. Free slots are kept on a stack per table part; slots never handed
 * out yet lie above the part's high-water mark (so a large, unused table costs no memory).
 * When the tables take LARGE_TABLES or more (the store is "large": its tables can outgrow the
 * caches), calls prefetch the records they will load (prefetch_keys, evict_one). When they
 * take HUGE_TABLES or more (a pool of 2.2 GiB and up in 4 KiB pages), the mapping asks for
 * transparent huge pages: a touched part of a table is then backed 2 MiB at a time, which
 * costs the whole bucket array at once (it is touched at random) and up to 2 MiB per other
 * table (a 4 GiB pool: 22 MiB, < 1% of it), and the zeroing of a whole huge page at first
 * touch. Not below: a default 1 GiB pool's store would pay 8-16 MiB and 1-50 ms more for
 * its first 100 objects (measured), for a gain that only shows at ~1M objects.
 *
 *   objs    one per WRITING or READY object
 *   kents   key entries: a key and its object. Bound entries are in the hash table; an alias of a
 *           WRITING object waits unbound in its object's key list until commit
 *   buckets chained hash table key -> bound key entry (power of two >= max_keys / 2); each
 *           bucket also holds its head key's fingerprint
 *   pins    one per (read transfer, looked-up key); obj->pins == entries naming obj
 *   xfers   live transfers; id = gen << 24 | slot (gen bumped at each reuse of a slot)
 *   owners  open owners; id = gen << 24 | slot; slot 1 is KVS_OWNER_LOCAL (gen 0, always open)
 *
 * Parts (design §4.4). The store is split into nparts (a power of two, 1..16) shards and as
 * many domains, each with its own mutex:
 *   shard s   the keys whose hash has s in its low bits: their buckets; the objects whose
 *             primary key is one of them (a slice of objs) and all their key entries (a slice of
 *             kents, aliases included, wherever the alias's bucket is); its LRU list; its byte
 *             and object counts.
 *   domain d  the owners whose slot has d in its low bits: their transfers (a slice of xfers)
 *             and their read pins (a slice of pins), the transfers' creation FIFO.
 * A key entry's bucket link (hnext, bound) is guarded by the shard of its bucket; every other
 * field of it by its object's shard. An alias bound in another shard makes its object
 * "foreign": deleting a READY foreign object takes every shard lock (all-locked mode), which is
 * also how any operation falls back when one shard's lock is not enough (an eviction that has
 * to look beyond its own shard, a key found as another shard's object's alias in remove). A
 * WRITING object's transfer links (xfer, xnext) are guarded by its transfer's domain.
 * Capacity stays exact: the pool's cache arena is the one account (an extent is granted under
 * its mutex or not at all), and used + reserved summed over the shards equals its allocated
 * bytes whenever every lock is held. Eviction order is per shard LRU: a reservation evicts
 * the least recently used object of its own key's shard while that shard alone can cover it,
 * otherwise it takes every shard and evicts shard heads round robin. A reservation that the
 * pool's room (kvs_pool_room, read without the arena mutex) cannot cover evicts without asking
 * the pool, and a victim's extent of the same length goes to the new object without a pool
 * call: a full cache of equal objects cycles without the mutex every shard shares. The room
 * read under one shard may be a moment old (another shard freed meanwhile, or the pool's limit
 * was raised): then one object more than needed is evicted; under every shard only a limit
 * change can make it old (only the store allocates and frees in the cache arena, each under a
 * shard lock).
 *
 * Sharing between threads. Besides the shards, what a call writes is its owner's record (one
 * per 128 bytes), its domain and the stats block (striped per thread, stats.h); what every
 * reserve reads in every domain (head_created) lies on lines of its own.
 *
 * Lists (all intrusive, by index):
 *   LRU:    per shard, its READY objects, least recently used at the head: every one with
 *           pins == 0, and pinned ones until an eviction meets them at the head (a pin writes
 *           only its object; the release moves it to the tail, where a pin-release right after
 *           a commit finds it already). lru_bytes = the extents of its READY objects with
 *           pins == 0. The head's lru_prev is stale (removing the head writes no neighbour:
 *           the next head's record is not written until it is evicted itself).
 *   FIFO:   per domain, its live transfers in creation order; created_ms is non-decreasing
 *           along it, and every lease has the same length, so the expired ones are a prefix.
 *   owner:  each owner's live transfers (owner release is O(its leases)).
 *   xfer:   a write transfer's objects (obj->xnext, newest first); a read transfer's pins in
 *           lookup order (doubly linked so release can walk it backwards).
 *   object: its key entries (kent->onext), primary first.
 *
 * Invariants (kvs__store_is_valid, every lock held):
 *   used + reserved + pool free == arena;  used = sum ext_len(READY), reserved = sum(WRITING)
 *   ext_len == kvs_pool_extent_len(off) for every object; 0 < nbytes(layout) <= ext_len
 *   a key maps to at most one entry; every bound entry's object is live; a READY object's
 *   entries are all bound; a WRITING object's primary is bound and its aliases are not
 *   an object lies in its primary key's shard, its entries in the object's shard's slice;
 *   obj->foreign <=> one of its bound entries is in another shard's bucket
 *   obj in its shard's LRU <=> READY && pins == 0;  obj->pins == pin entries naming it
 *   every WRITING object belongs to exactly one live write transfer, of its owner's domain
 *
 * Lock order: owner_lock, then domains in index order, then shards in index order, then the
 * pool's arena mutex (kvs_pool_alloc/free under a shard lock are bookkeeping only). A call
 * holds at most its owner's domain (owner open/release: owner_lock, then it); it takes one
 * shard at a time, or every shard at once.
 * Nothing under a store lock copies payload, allocates, sleeps or makes a syscall; a pool
 * error found under one is logged after unlocking. Counters read across shards (room checks,
 * info) are written with relaxed atomic stores under their shard's lock. */
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "log.h"
#include "prim.h"

#define NIL 0u
#define SLOT_BITS 24
#define SLOT_MASK ((uint64_t)KVS_STORE_MAX_SLOTS)
#define GEN_MASK ((UINT64_C(1) << (64 - SLOT_BITS)) - 1)
#define TABLE_MAX (1u << 30)
#define LOCAL_SLOT 1u
#define DEFAULT_LEASE_MS 30000u
#define DEFAULT_MAX_XFERS 65536u
#define DEFAULT_MAX_OWNERS 4096u
#define LARGE_TABLES ((size_t)64 << 20)  /* tables of ~150k objects and up */
#define HUGE_TABLES ((size_t)256 << 20)  /* tables of ~580k objects and up */
#define MAX_PARTS 16u
/* Automatic parts keep every table slice >= PART_MIN slots and every shard's share of the
 * arena >= PART_MIN_BYTES: a shard evicts its own LRU, so its share must hold many objects for
 * that order to stay close to the global one. Small stores (the unit tests' few pages, a
 * process's few-MiB pool, max_objects of a handful) stay one shard, with exact LRU order. */
#define PART_MIN 64u
#define PART_MIN_BYTES ((uint64_t)32 << 20)

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
/* x += d, x guarded by a lock the caller holds, read lock-free elsewhere. */
#define BUMP(x, d) STORE(x, (__typeof__(x))((x) + (d)))

/* Index lists (the LRUs, the lease FIFOs, a read transfer's pins): element i of table a is
 * linked through its fields prev and next to its neighbours' indices, NIL at the ends; head
 * and tail are the list's ends. */
#define LIST_PUSH_TAIL(a, i, prev, next, head, tail)                                          \
  do {                                                                                        \
    (a)[i].prev = (tail);                                                                     \
    (a)[i].next = NIL;                                                                        \
    if (tail) (a)[tail].next = (i);                                                           \
    else (head) = (i);                                                                        \
    (tail) = (i);                                                                             \
  } while (0)
#define LIST_REMOVE(a, i, prev, next, head, tail)                                             \
  do {                                                                                        \
    if ((a)[i].prev) (a)[(a)[i].prev].next = (a)[i].next;                                     \
    else (head) = (a)[i].next;                                                                \
    if ((a)[i].next) (a)[(a)[i].next].prev = (a)[i].prev;                                     \
    else (tail) = (a)[i].prev;                                                                \
  } while (0)

enum { OBJ_FREE = 0, OBJ_WRITING = 1, OBJ_READY = 2 };
enum { XF_FREE = 0, XF_WRITE = 1, XF_READ = 2 };

/* 128 bytes, and the table 128-byte aligned: a record is two whole cache lines, so writing one
 * object never writes a line of its neighbours (slots next to each other are usually other
 * threads' objects). Its layout bytes (what views report) are kvs_layout_nbytes(&layout). */
typedef struct obj {
  uint64_t off;      /* segment offset of the extent */
  uint64_t ext_len;  /* the extent's real, page-rounded length (what the accounting counts) */
  uint64_t epoch;    /* reserve call that found it PRESENT: that call may not evict it */
  uint32_t state;    /* OBJ_* */
  uint32_t pins;     /* pin entries naming this object */
  uint32_t keys;     /* head of its key entry list (primary first) */
  uint32_t lru_prev, lru_next;
  uint32_t xfer;     /* WRITING: slot of its write transfer */
  uint32_t xnext;    /* WRITING: next object of the same write transfer */
  uint16_t foreign;  /* READY: an alias is bound in another shard's bucket */
  uint16_t mark;     /* validator scratch */
  kvs_layout_t layout;
} obj_t;
_Static_assert(sizeof(obj_t) == 128, "an object record is two cache lines");

typedef struct kent {
  kvs_key_t key;
  uint32_t obj;      /* NIL when the entry is free */
  uint32_t hnext;    /* hash chain (guarded by the bucket's shard) */
  uint32_t onext;    /* next key of the same object */
  uint16_t bound;    /* in the hash table (guarded by the bucket's shard) */
  uint16_t mark;     /* validator scratch */
} kent_t;

typedef struct pin {
  kvs_key_t key;     /* the key it was looked up by */
  uint32_t obj;      /* NIL when the entry is free */
  uint32_t next, prev;
  uint32_t mark;     /* validator scratch */
} pin_t;

typedef struct xfer {
  uint64_t gen;         /* id = gen << SLOT_BITS | slot; bumped when the slot is handed out */
  uint64_t created_ms;  /* non-decreasing along its domain's FIFO */
  uint32_t kind;        /* XF_* */
  uint32_t owner;       /* owner slot */
  uint32_t fprev, fnext;
  uint32_t oprev, onext;
  uint32_t head, tail;  /* WRITE: objects (tail unused); READ: pins */
  uint32_t count;       /* objects or pins */
  uint32_t mark;        /* validator scratch */
} xfer_t;

/* One owner per 128 bytes (its own pair of cache lines): each call writes its owner's record,
 * and owners of different threads are usually neighbours in the table. */
typedef struct owner {
  uint64_t gen;      /* id = gen << SLOT_BITS | slot */
  uint32_t open;
  uint32_t xhead;    /* its live transfers */
  uint32_t nxfers;
} __attribute__((aligned(128))) owner_t;

/* A hash bucket: the head of its chain, and the head key's fingerprint with a bit saying
 * whether the chain holds more than the head, so that a key absent from a large table costs
 * one cache miss (the bucket) instead of two (the bucket, then the head's entry). */
typedef struct bucket {
  uint32_t head; /* first bound key entry, or NIL */
  uint32_t tag;  /* fingerprint(head key) << 1 | (head->hnext != NIL); 0 when empty */
} bucket_t;

/* Slot allocator over one slice of a table: slots base+1..base+cap; a stack of freed slots,
 * and those above base+hw never used. */
typedef struct slots {
  uint32_t base, cap, hw, nfree;
  uint32_t *stack;
} slots_t;

/* One shard (see the top of this file). Counters: written under lock with STORE/BUMP. The
 * order keeps what its calls write in its first two cache lines with a 40-byte mutex (glibc
 * x86-64): a shard used last by another thread costs two line moves, not three; only
 * skey.stack, never written, lies beyond. */
typedef struct shard {
  pthread_mutex_t lock;
  uint32_t lru_head, lru_tail;
  uint64_t lru_bytes;      /* extents of its LRU's unpinned objects */
  uint64_t used, reserved; /* extents of its READY / WRITING objects */
  uint32_t nready, nwriting, nkeys; /* nkeys: bound entries in its buckets */
  slots_t sobj, skey;
} __attribute__((aligned(128))) shard_t;

/* One domain (see the top of this file). head_created, which every reserve call reads in
 * every domain (sweep_all), sits on lines of its own: the rest is written at every call. */
typedef struct domain {
  pthread_mutex_t lock;
  slots_t sxfer, spin;
  uint32_t fifo_head, fifo_tail;
  uint64_t epoch;          /* its reserve calls so far */
  uint32_t npins;          /* its live pins (STORE) */
  uint64_t head_created __attribute__((aligned(128)));
                           /* <= created_ms of the FIFO head; UINT64_MAX only when empty
                            * (STORE; see fifo_pushed) */
} __attribute__((aligned(128))) domain_t;

struct kvs_store {
  /* set at create, read-only after */
  kvs_pool_t *pool;
  kvs_stats_t *stats;
  uint64_t arena_bytes;
  uint32_t page_size;
  bool large;             /* tables of LARGE_TABLES or more: prefetching */
  uint32_t lease_ms;
  uint32_t hmask;
  uint32_t nparts, pmask; /* shards == domains == nparts, a power of two */
  uint32_t obj_per, key_per, xfer_per, pin_per; /* slice sizes */
  void *map;
  size_t map_len;
  obj_t *objs;
  kent_t *kents;
  bucket_t *buckets;
  pin_t *pins;
  xfer_t *xfers;
  owner_t *owners;
  shard_t *shards;
  domain_t *doms;
  /* owner slot allocation (owners' fields are guarded by their domain) */
  pthread_mutex_t owner_lock;
  slots_t sowner;
  uint32_t evict_cursor;  /* all-locked mode: next shard to evict from */
  int pool_err;           /* unexpected pool error seen under a lock; logged after it (STORE) */
};

/* ---- small pure helpers --------------------------------------------------------------- */

static const char *const outcome_names[] = {
#define KVS__RES_NAME(name, val, help) [val] = #name,
    KVS_RESERVE_OUTCOMES(KVS__RES_NAME)
#undef KVS__RES_NAME
};
#define N_OUTCOMES KVS__ARRAY_LEN(outcome_names)

const char *kvs_reserve_outcome_name(kvs_reserve_outcome_t r) {
  return ((unsigned)r < N_OUTCOMES && outcome_names[r]) ? outcome_names[r] : "?";
}

size_t kvs_dtype_size(uint32_t dtype) {
  switch (dtype) {
  case KVS_DTYPE_U8: case KVS_DTYPE_I8: case KVS_DTYPE_F8E4M3: case KVS_DTYPE_F8E5M2: return 1;
  case KVS_DTYPE_F16: case KVS_DTYPE_BF16: return 2;
  case KVS_DTYPE_F32: case KVS_DTYPE_I32: return 4;
  default: return 0;
  }
}

uint64_t kvs_layout_nbytes(const kvs_layout_t *l) {
  if (!l || l->ndim < 1 || l->ndim > KVS_LAYOUT_MAX_DIMS) return 0;
  uint64_t n = kvs_dtype_size(l->dtype);
  if (n == 0) return 0;
  for (uint32_t i = 0; i < l->ndim; i++)
    if (l->shape[i] == 0 || __builtin_mul_overflow(n, l->shape[i], &n)) return 0;
  return n;
}

kvs_layout_t kvs_layout_blob(uint64_t nbytes) {
  kvs_layout_t l;
  memset(&l, 0, sizeof l);
  l.dtype = KVS_DTYPE_U8;
  l.ndim = 1;
  l.shape[0] = nbytes;
  return l;
}

void kvs__layout_put(uint8_t *p, uint8_t *dims, const kvs_layout_t *l) {
  kvs__put32(p, l->dtype);
  kvs__put32(p + 4, l->ndim);
  for (uint32_t i = 0; i < KVS_LAYOUT_MAX_DIMS; i++)
    kvs__put64(dims + 8 * i, i < l->ndim ? l->shape[i] : 0);
}

int kvs__layout_get(const uint8_t *p, const uint8_t *dims, kvs_layout_t *out) {
  kvs_layout_t l;
  memset(&l, 0, sizeof l);
  l.dtype = kvs__get32(p);
  l.ndim = kvs__get32(p + 4);
  if (l.ndim > KVS_LAYOUT_MAX_DIMS) return -EBADMSG;
  for (uint32_t i = 0; i < KVS_LAYOUT_MAX_DIMS; i++) {
    uint64_t d = kvs__get64(dims + 8 * i);
    if (i >= l.ndim && d) return -EBADMSG;
    if (i < l.ndim) l.shape[i] = d;
  }
  *out = l;
  return 0;
}

static inline uint32_t slot_of(uint64_t id) { return (uint32_t)(id & SLOT_MASK); }
static inline uint64_t gen_of(uint64_t id) { return id >> SLOT_BITS; }
static inline uint64_t make_id(uint64_t gen, uint32_t slot) {
  return (gen << SLOT_BITS) | slot;
}

static inline uint32_t slots_get(slots_t *sl) {
  if (sl->nfree) return sl->stack[--sl->nfree];
  if (sl->hw < sl->cap) return sl->base + ++sl->hw;
  return NIL;
}
static inline void slots_put(slots_t *sl, uint32_t i) { sl->stack[sl->nfree++] = i; }
static inline uint32_t slots_live(const slots_t *sl) { return sl->hw - sl->nfree; }

static inline void set_pool_err(kvs_store_t *s, int err) { STORE(s->pool_err, err); }

static inline uint32_t obj_shard(const kvs_store_t *s, uint32_t oi) {
  return (oi - 1) / s->obj_per;
}
static inline uint32_t xfer_dom(const kvs_store_t *s, uint32_t x) { return (x - 1) / s->xfer_per; }
static inline domain_t *owner_dom(const kvs_store_t *s, uint32_t o) {
  return &s->doms[o & s->pmask];
}

static void lock_all(kvs_store_t *s) {
  for (uint32_t i = 0; i < s->nparts; i++) pthread_mutex_lock(&s->shards[i].lock);
}
static void unlock_all(kvs_store_t *s) {
  for (uint32_t i = s->nparts; i-- > 0;) pthread_mutex_unlock(&s->shards[i].lock);
}

/* Sums over the shards (exact with every shard locked; a relaxed snapshot otherwise). */
static uint64_t sum_used_reserved(const kvs_store_t *s) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < s->nparts; i++)
    n += LOAD(s->shards[i].used) + LOAD(s->shards[i].reserved);
  return n;
}
static uint64_t sum_lru_bytes(const kvs_store_t *s) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < s->nparts; i++) n += LOAD(s->shards[i].lru_bytes);
  return n;
}
static inline uint64_t free_bytes(const kvs_store_t *s) {
  return s->arena_bytes - sum_used_reserved(s);
}

/* Gauges move by deltas, so that no call reads another shard to publish them. */
static inline void gauge(kvs_store_t *s, kvs_stat_id_t id, int64_t d) {
  if (d) kvs_stats_add(s->stats, id, (uint64_t)d);
}
static void acct_reserved(kvs_store_t *s, shard_t *sh, int64_t d) {
  BUMP(sh->reserved, d);
  gauge(s, KVS_STAT_store_reserved_bytes, d);
  gauge(s, KVS_STAT_store_free_bytes, -d);
}
static void acct_used(kvs_store_t *s, shard_t *sh, int64_t d) {
  BUMP(sh->used, d);
  gauge(s, KVS_STAT_store_used_bytes, d);
  gauge(s, KVS_STAT_store_free_bytes, -d);
}

/* ---- hash table ------------------------------------------------------------------------ */

static inline uint64_t key_hash(kvs_key_t k) {
  /* Keys are XXH3 outputs in production, but tests use small integers: mix anyway. */
  uint64_t h = k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  return h;
}
/* The bucket index takes the hash's low bits (its shard the lowest of them), the fingerprint
 * its high 31. */
static inline bucket_t *bucket_at(const kvs_store_t *s, uint64_t h) {
  return &s->buckets[(uint32_t)h & s->hmask];
}
static inline uint32_t hash_shard(const kvs_store_t *s, uint64_t h) { return (uint32_t)h & s->pmask; }
static inline uint32_t key_shard(const kvs_store_t *s, kvs_key_t k) {
  return hash_shard(s, key_hash(k));
}
static inline uint32_t fp_of(uint64_t h) { return (uint32_t)(h >> 33); }
/* A bucket's tag for a chain headed by entry `head` (NIL: 0). */
static inline uint32_t tag_of(const kvs_store_t *s, uint32_t head) {
  if (head == NIL) return 0;
  const kent_t *ke = &s->kents[head];
  return fp_of(key_hash(ke->key)) << 1 | (ke->hnext != NIL);
}

/* Warm the buckets of the first keys of a call before taking a lock: with a large table
 * the bucket load is the cycle's main cache miss (bench-core, 1M objects). buckets and hmask
 * are read-only after create; a prefetch has no effect on correctness. */
#define PREFETCH_KEYS 16u
static inline void prefetch_keys(const kvs_store_t *s, const kvs_key_t *keys, size_t n) {
  if (!s->large) return; /* small tables stay in the cache: a prefetch is pure cost there */
  for (size_t i = 0; i < n && i < PREFETCH_KEYS; i++)
    __builtin_prefetch(bucket_at(s, key_hash(keys[i])));
}

/* The bound entry of k, or NIL. Caller holds k's shard. */
static uint32_t key_find(const kvs_store_t *s, kvs_key_t k) {
  uint64_t h = key_hash(k);
  const bucket_t *b = bucket_at(s, h);
  uint32_t e = b->head;
  if (e == NIL) return NIL;
  if (b->tag >> 1 != fp_of(h)) { /* the head is another key */
    if (!(b->tag & 1)) return NIL; /* ... and alone: absent, without loading its entry */
    e = s->kents[e].hnext;
  }
  for (; e != NIL; e = s->kents[e].hnext)
    if (kvs_key_eq(s->kents[e].key, k)) return e;
  return NIL;
}

/* Caller holds the entry's key's shard (and its object's). */
static void key_bind(kvs_store_t *s, uint32_t e) {
  kent_t *ke = &s->kents[e];
  uint64_t h = key_hash(ke->key);
  bucket_t *b = bucket_at(s, h);
  ke->hnext = b->head;
  b->head = e;
  b->tag = fp_of(h) << 1 | (ke->hnext != NIL);
  ke->bound = 1;
  BUMP(s->shards[hash_shard(s, h)].nkeys, 1);
  gauge(s, KVS_STAT_store_keys, 1);
}

static void key_unbind(kvs_store_t *s, uint32_t e) {
  kent_t *ke = &s->kents[e];
  uint64_t h = key_hash(ke->key);
  bucket_t *b = bucket_at(s, h);
  if (b->head == e) {
    b->head = ke->hnext;
    b->tag = tag_of(s, b->head);
  } else {
    uint32_t *link = &s->kents[b->head].hnext;
    while (*link != e) link = &s->kents[*link].hnext;
    *link = ke->hnext;
    if (s->kents[b->head].hnext == NIL) b->tag &= ~1u; /* the head is alone now */
  }
  ke->hnext = NIL;
  ke->bound = 0;
  BUMP(s->shards[hash_shard(s, h)].nkeys, -1);
  gauge(s, KVS_STAT_store_keys, -1);
}

/* Free an entry of an object of shard sh (its slice). */
static void kent_free(shard_t *sh, kvs_store_t *s, uint32_t e) {
  memset(&s->kents[e], 0, sizeof s->kents[e]);
  slots_put(&sh->skey, e);
}

/* ---- LRU (per shard) ------------------------------------------------------------------- */

/* Whether READY object i is on shard sh's LRU (the head's lru_prev is stale). */
static inline bool lru_listed(const kvs_store_t *s, const shard_t *sh, uint32_t i) {
  return s->objs[i].lru_prev != NIL || sh->lru_head == i;
}

static void lru_link_tail(kvs_store_t *s, shard_t *sh, uint32_t i) {
  obj_t *o = &s->objs[i];
  o->lru_prev = sh->lru_tail;
  o->lru_next = NIL;
  if (sh->lru_tail) s->objs[sh->lru_tail].lru_next = i;
  else sh->lru_head = i;
  sh->lru_tail = i;
}

static void lru_unlink(kvs_store_t *s, shard_t *sh, uint32_t i) {
  obj_t *o = &s->objs[i];
  if (sh->lru_head == i) {
    sh->lru_head = o->lru_next; /* the new head's lru_prev goes stale, unwritten */
    if (o->lru_next == NIL) sh->lru_tail = NIL;
  } else {
    s->objs[o->lru_prev].lru_next = o->lru_next;
    if (o->lru_next) s->objs[o->lru_next].lru_prev = o->lru_prev;
    else sh->lru_tail = o->lru_prev;
  }
  o->lru_prev = o->lru_next = NIL;
}

/* A new READY object, or an unpinned one (its last pin released): the most recently used. */
static void lru_push_tail(kvs_store_t *s, shard_t *sh, uint32_t i) {
  if (lru_listed(s, sh, i)) {
    if (sh->lru_tail != i) {
      lru_unlink(s, sh, i);
      lru_link_tail(s, sh, i);
    }
  } else {
    lru_link_tail(s, sh, i);
  }
  BUMP(sh->lru_bytes, s->objs[i].ext_len);
}

/* An unpinned READY object leaves the LRU (it is deleted). */
static void lru_remove(kvs_store_t *s, shard_t *sh, uint32_t i) {
  lru_unlink(s, sh, i);
  BUMP(sh->lru_bytes, -(int64_t)s->objs[i].ext_len);
}

/* The object's first pin: it stays listed (unlinked when an eviction meets it at the head,
 * moved to the tail at its release), its bytes are no longer evictable. */
static void lru_pinned(shard_t *sh, const obj_t *o) { BUMP(sh->lru_bytes, -(int64_t)o->ext_len); }

/* A used unpinned object goes to the tail. */
static void lru_touch(kvs_store_t *s, shard_t *sh, uint32_t i) {
  if (sh->lru_tail == i) return;
  lru_unlink(s, sh, i);
  lru_link_tail(s, sh, i);
}

/* ---- objects --------------------------------------------------------------------------- */

/* What an evicted object leaves to the reservation that evicted it (evict_one_for): its
 * extent, still allocated in the pool, and with slots its object slot and its primary key
 * entry's slot, off the free stacks. The reservation fills them at once: they are the lines
 * the eviction has just written, where slots popped from a stack are whatever the last
 * eviction in the shard (by any thread) freed. */
typedef struct reuse {
  uint64_t off;
  uint32_t obj, kent; /* NIL unless slots were asked for */
} reuse_t;

/* Delete a READY unpinned or a WRITING object: unbind all its keys, free its extent (or, with
 * r, leave it allocated in the pool for the caller, who accounts it at once; with slots too,
 * likewise its object slot and primary key entry, see reuse_t). Caller holds its shard, and
 * every shard when it is a READY foreign object. */
static void obj_delete_keep(kvs_store_t *s, uint32_t i, reuse_t *r, bool slots) {
  shard_t *sh = &s->shards[obj_shard(s, i)];
  obj_t *o = &s->objs[i];
  if (o->state == OBJ_READY) {
    lru_remove(s, sh, i); /* callers never delete a pinned object */
    acct_used(s, sh, -(int64_t)o->ext_len);
    BUMP(sh->nready, -1);
    gauge(s, KVS_STAT_store_objects, -1);
  } else {
    acct_reserved(s, sh, -(int64_t)o->ext_len);
    BUMP(sh->nwriting, -1);
  }
  slots = r && slots;
  if (r) r->obj = r->kent = NIL;
  for (uint32_t e = o->keys, next; e != NIL; e = next) {
    next = s->kents[e].onext;
    if (s->kents[e].bound) key_unbind(s, e);
    if (slots && e == o->keys) r->kent = e; /* the caller rewrites the whole entry */
    else kent_free(sh, s, e);
  }
  if (r) {
    r->off = o->off;
  } else {
    int64_t rc = kvs_pool_free(s->pool, KVS_ARENA_CACHE, o->off);
    if (rc != (int64_t)o->ext_len) set_pool_err(s, rc < 0 ? (int)rc : -EIO);
  }
  if (slots) { /* the caller rewrites the whole record */
    r->obj = i;
    return;
  }
  memset(o, 0, sizeof *o);
  slots_put(&sh->sobj, i);
}
static void obj_delete(kvs_store_t *s, uint32_t i) { obj_delete_keep(s, i, NULL, false); }

enum { EV_DONE = 0, EV_NONE = 1, EV_BLOCKED = 2, EV_KEPT = 3 /* done, extent kept */ };

/* Evict the least recently used READY unpinned object of shard si, unless it is protected by
 * the running reservation call `epoch` (then everything after it is too: protected objects
 * sit at the tail): EV_NONE. A foreign head needs every shard: EV_BLOCKED unless all. With
 * kept non-NULL and a victim extent of exactly want_len bytes, the extent stays allocated and
 * goes to the caller (kept->off), with its slots when slots (kept->obj, kept->kent; reuse_t):
 * a full cache of equal objects then makes no pool call to replace one (the pool's arena mutex
 * is shared by every shard). */
static int evict_one_for(kvs_store_t *s, uint32_t si, uint64_t epoch, bool all,
                         uint64_t want_len, reuse_t *kept, bool slots) {
  shard_t *sh = &s->shards[si];
  uint32_t i = sh->lru_head;
  for (; i != NIL && s->objs[i].pins; i = sh->lru_head) lru_unlink(s, sh, i); /* see LRU */
  if (i == NIL || s->objs[i].epoch == epoch) return EV_NONE;
  if (s->objs[i].foreign && !all) return EV_BLOCKED;
  /* A full cache evicts at (nearly) every reservation, walking the LRU from its head: warm
   * the next victims' records so that their dependent loads (object -> key entry -> bucket ->
   * the entry heading the bucket's chain, which the unbind walks) hit. Four stages, each
   * using what the previous eviction prefetched; only the stage-1 bucket is read (warm). */
  uint32_t n1 = s->large ? s->objs[i].lru_next : NIL; /* small tables: all in the cache */
  if (n1 != NIL) {
    const obj_t *o1 = &s->objs[n1];
    if (o1->keys != NIL) {
      const bucket_t *b = bucket_at(s, key_hash(s->kents[o1->keys].key));
      if (b->head != NIL && b->head != o1->keys) __builtin_prefetch(&s->kents[b->head]);
    }
    uint32_t n2 = o1->lru_next;
    if (n2 != NIL) {
      const obj_t *o2 = &s->objs[n2];
      if (o2->keys != NIL) __builtin_prefetch(bucket_at(s, key_hash(s->kents[o2->keys].key)));
      uint32_t n3 = o2->lru_next;
      if (n3 != NIL) {
        const obj_t *o3 = &s->objs[n3];
        if (o3->keys != NIL) __builtin_prefetch(&s->kents[o3->keys]);
        if (o3->lru_next != NIL) __builtin_prefetch(&s->objs[o3->lru_next]);
      }
    }
  }
  uint64_t bytes = s->objs[i].ext_len;
  bool keep = kept && bytes == want_len;
  obj_delete_keep(s, i, keep ? kept : NULL, slots);
  kvs_stats_inc(s->stats, KVS_STAT_store_evictions);
  kvs_stats_add(s->stats, KVS_STAT_store_evicted_bytes, bytes);
  return keep ? EV_KEPT : EV_DONE;
}
static int evict_one(kvs_store_t *s, uint32_t si, uint64_t epoch, bool all) {
  return evict_one_for(s, si, epoch, all, 0, NULL, false);
}

/* All-locked mode: evict one object from any shard, shard heads taken round robin (the
 * approximate LRU of design §4.4). False when no shard has an evictable head. */
static bool evict_any(kvs_store_t *s, uint64_t epoch) {
  for (uint32_t k = 0; k < s->nparts; k++) {
    uint32_t si = (s->evict_cursor + k) & s->pmask;
    if (evict_one(s, si, epoch, true) == EV_DONE) {
      s->evict_cursor = (si + 1) & s->pmask;
      return true;
    }
  }
  return false;
}

/* A slot of shard si's slice of a table, evicting that shard's objects while it is full
 * (only they free its slots). NIL when none; *blocked when a foreign head stopped it. */
static uint32_t slot_get_evicting(kvs_store_t *s, uint32_t si, slots_t *sl, unsigned mode,
                                  uint64_t epoch, bool all, bool *blocked) {
  for (;;) {
    uint32_t i = slots_get(sl);
    if (i != NIL) return i;
    if (mode & KVS_RESERVE_NO_EVICT) return NIL;
    int ev = evict_one(s, si, epoch, all);
    if (ev == EV_BLOCKED) *blocked = true;
    if (ev != EV_DONE) return NIL;
  }
}

/* An extent for a reservation in shard si. Not all: evict only from shard si, and only while
 * its own LRU can cover the request (then the cache as a whole can); -EAGAIN when the shard
 * alone cannot decide (the caller retakes it with every shard). All: evict shard heads round
 * robin, never when free + every LRU cannot cover the request (never empty the cache for a
 * request it cannot serve). */
static int alloc_extent(kvs_store_t *s, uint32_t si, uint64_t nbytes, uint64_t rounded,
                        unsigned mode, uint64_t epoch, bool all, uint64_t *off,
                        uint64_t *ext_len) {
  shard_t *sh = &s->shards[si];
  for (;;) {
    /* A full arena is seen without its mutex (kvs_pool_room): a full cache evicts at every
     * reservation, and would otherwise take the mutex every shard shares only to hear
     * -ENOSPC. A free made meanwhile by another shard's thread can cost one needless
     * eviction (approximate order, design §4.4), never an extent the pool did not grant. */
    int rc = -ENOSPC;
    if (kvs_pool_room(s->pool, KVS_ARENA_CACHE) >= rounded)
      rc = kvs_pool_alloc(s->pool, KVS_ARENA_CACHE, nbytes, off);
    if (rc == 0) {
      /* The pool hands out exactly the page-rounded length (pool.h); debug builds ask it. */
#ifdef KVSHIM_DEBUG
      int64_t len = kvs_pool_extent_len(s->pool, KVS_ARENA_CACHE, *off);
      if (kvs__unlikely(len != (int64_t)rounded)) {
        set_pool_err(s, len < 0 ? (int)len : -EIO);
        (void)kvs_pool_free(s->pool, KVS_ARENA_CACHE, *off);
        return -EIO;
      }
#endif
      *ext_len = rounded;
      return 0;
    }
    if (rc != -ENOSPC) {
      set_pool_err(s, rc);
      return rc;
    }
    if (mode & KVS_RESERVE_NO_EVICT) return rc;
    if (!all) {
      if (sh->lru_bytes < rounded) return -EAGAIN;
      reuse_t r;
      int ev = evict_one_for(s, si, epoch, false, rounded, &r, false);
      if (ev == EV_KEPT) {
        *off = r.off;
        *ext_len = rounded;
        return 0;
      }
      if (ev != EV_DONE) return -EAGAIN;
      continue;
    }
    if (free_bytes(s) + sum_lru_bytes(s) < rounded) return rc;
    if (!evict_any(s, epoch)) return rc;
  }
}

/* ---- transfers (caller holds the transfer's domain) ----------------------------------- */

/* head_created stays <= the FIFO head's creation (the FIFO is sorted, so removing the head
 * keeps it true) and is written only when a new lease is older than it, i.e. the first after a
 * sweep found the domain empty: a domain cycling leases does not write the line that every
 * other domain's reserve reads (sweep_all). */
static void fifo_pushed(domain_t *dm, uint64_t created_ms) {
  if (created_ms < dm->head_created) STORE(dm->head_created, created_ms);
}

static uint32_t xfer_new(kvs_store_t *s, domain_t *dm, uint32_t owner, uint32_t kind,
                         uint64_t now_ms) {
  uint32_t x = slots_get(&dm->sxfer);
  if (x == NIL) return NIL;
  xfer_t *xf = &s->xfers[x];
  uint64_t gen = (xf->gen + 1) & GEN_MASK;
  memset(xf, 0, sizeof *xf);
  xf->gen = gen;
  xf->kind = kind;
  xf->owner = owner;
  /* Keep the FIFO sorted by creation time even when a later clock reading won the lock. */
  uint64_t last = dm->fifo_tail ? s->xfers[dm->fifo_tail].created_ms : 0;
  xf->created_ms = now_ms > last ? now_ms : last;
  LIST_PUSH_TAIL(s->xfers, x, fprev, fnext, dm->fifo_head, dm->fifo_tail);
  fifo_pushed(dm, xf->created_ms);
  owner_t *ow = &s->owners[owner];
  xf->onext = ow->xhead;
  if (ow->xhead) s->xfers[ow->xhead].oprev = x;
  ow->xhead = x;
  ow->nxfers++;
  return x;
}

/* Take a transfer off every list and free its slot (its objects/pins are already handled). */
static void xfer_unlink(kvs_store_t *s, domain_t *dm, uint32_t x) {
  xfer_t *xf = &s->xfers[x];
  LIST_REMOVE(s->xfers, x, fprev, fnext, dm->fifo_head, dm->fifo_tail);
  owner_t *ow = &s->owners[xf->owner];
  if (xf->oprev) s->xfers[xf->oprev].onext = xf->onext;
  else ow->xhead = xf->onext;
  if (xf->onext) s->xfers[xf->onext].oprev = xf->oprev;
  ow->nxfers--;
  uint64_t gen = xf->gen;
  memset(xf, 0, sizeof *xf);
  xf->gen = gen;
  slots_put(&dm->sxfer, x);
}

/* Caller holds the object's shard. */
static void xfer_add_object(kvs_store_t *s, uint32_t x, uint32_t oi) {
  s->objs[oi].xfer = x;
  s->objs[oi].xnext = s->xfers[x].head;
  s->xfers[x].head = oi;
  s->xfers[x].count++;
}

/* Free every object of a write transfer, unpublished (each under its shard). Returns how
 * many. A WRITING object is never foreign: its aliases are unbound. */
static uint32_t xfer_drop_objects(kvs_store_t *s, uint32_t x) {
  uint32_t n = 0;
  for (uint32_t oi = s->xfers[x].head, next; oi != NIL; oi = next) {
    shard_t *sh = &s->shards[obj_shard(s, oi)];
    pthread_mutex_lock(&sh->lock);
    next = s->objs[oi].xnext;
    obj_delete(s, oi);
    pthread_mutex_unlock(&sh->lock);
    n++;
  }
  s->xfers[x].head = NIL;
  s->xfers[x].count = 0;
  return n;
}

/* Release every pin of a read transfer. Walks backwards so that the first key looked up ends
 * up the most recently used (of its shard). Runs of pins in one shard share one lock hold. */
static void xfer_unpin(kvs_store_t *s, domain_t *dm, uint32_t x) {
  shard_t *held = NULL;
  uint32_t n = 0;
  for (uint32_t p = s->xfers[x].tail, prev; p != NIL; p = prev) {
    prev = s->pins[p].prev;
    uint32_t oi = s->pins[p].obj;
    shard_t *sh = &s->shards[obj_shard(s, oi)];
    if (sh != held) {
      if (held) pthread_mutex_unlock(&held->lock);
      pthread_mutex_lock(&sh->lock);
      held = sh;
    }
    if (--s->objs[oi].pins == 0) lru_push_tail(s, sh, oi);
    memset(&s->pins[p], 0, sizeof s->pins[p]);
    slots_put(&dm->spin, p);
    n++;
  }
  if (held) pthread_mutex_unlock(&held->lock);
  BUMP(dm->npins, -(int64_t)n);
  gauge(s, KVS_STAT_store_live_pins, -(int64_t)n);
  s->xfers[x].head = s->xfers[x].tail = NIL;
  s->xfers[x].count = 0;
}

/* End a lease without its owner's consent (owner release, expiry, destroy). */
static void xfer_end(kvs_store_t *s, domain_t *dm, uint32_t x) {
  if (s->xfers[x].kind == XF_WRITE) {
    uint32_t n = xfer_drop_objects(s, x);
    kvs_stats_add(s->stats, KVS_STAT_store_aborted_objects, n);
  } else {
    xfer_unpin(s, dm, x);
  }
  xfer_unlink(s, dm, x);
}

/* Caller holds dm. */
static int sweep_dom(kvs_store_t *s, domain_t *dm, uint64_t now_ms) {
  int n = 0;
  while (dm->fifo_head != NIL && s->xfers[dm->fifo_head].created_ms + s->lease_ms <= now_ms) {
    xfer_end(s, dm, dm->fifo_head);
    n++;
  }
  STORE(dm->head_created, dm->fifo_head ? s->xfers[dm->fifo_head].created_ms : UINT64_MAX);
  return n;
}

/* Every domain in turn, one lock at a time; a domain whose oldest lease is not due costs
 * one relaxed load (a stale, older head_created costs one needless lock, then is exact).
 * Caller holds no store lock. */
static int sweep_all(kvs_store_t *s, uint64_t now_ms) {
  int n = 0;
  for (uint32_t d = 0; d < s->nparts; d++) {
    domain_t *dm = &s->doms[d];
    uint64_t c = LOAD(dm->head_created);
    if (c == UINT64_MAX || c + s->lease_ms > now_ms) continue;
    pthread_mutex_lock(&dm->lock);
    n += sweep_dom(s, dm, now_ms);
    pthread_mutex_unlock(&dm->lock);
  }
  if (n) kvs_stats_add(s->stats, KVS_STAT_store_lease_expired, (uint64_t)n);
  return n;
}

/* ---- id resolution --------------------------------------------------------------------- */

/* The domain guarding owner id's fields, or NULL for an id that names no slot. */
static domain_t *owner_domain(const kvs_store_t *s, kvs_owner_t id) {
  uint32_t o = slot_of(id);
  if (o == NIL || o > s->sowner.cap) return NULL;
  return owner_dom(s, o);
}

/* Caller holds owner_domain(id). */
static int owner_resolve(const kvs_store_t *s, kvs_owner_t id, uint32_t *slot) {
  uint32_t o = slot_of(id);
  const owner_t *ow = &s->owners[o];
  if (!ow->open || ow->gen != gen_of(id)) return -ENOENT;
  *slot = o;
  return 0;
}

#define XFER_ELSEWHERE 1 /* xfer_resolve: the id's slot lies in another domain */

/* A live transfer held by owner slot o (caller holds its domain d); kind XF_FREE accepts
 * either kind. XFER_ELSEWHERE: see xfer_foreign. */
static int xfer_resolve(kvs_store_t *s, uint32_t d, uint32_t o, kvs_xfer_t id, uint32_t kind,
                        uint32_t *slot) {
  uint32_t x = slot_of(id);
  if (x == NIL || x > s->nparts * s->xfer_per) return -ENOENT;
  if (xfer_dom(s, x) != d) return XFER_ELSEWHERE;
  const xfer_t *xf = &s->xfers[x];
  if (xf->kind == XF_FREE || xf->gen != gen_of(id)) return -ENOENT;
  if (xf->owner != o) {
    kvs_stats_inc(s->stats, KVS_STAT_store_bad_transfer);
    return -EPERM;
  }
  if (kind != XF_FREE && xf->kind != kind) {
    kvs_stats_inc(s->stats, KVS_STAT_store_bad_transfer);
    return -EINVAL;
  }
  *slot = x;
  return 0;
}

/* A transfer id of another domain (caller holds no store lock): another owner's live
 * transfer (-EPERM, counted) or none (-ENOENT). */
static int xfer_foreign(kvs_store_t *s, kvs_xfer_t id) {
  uint32_t x = slot_of(id);
  domain_t *dm = &s->doms[xfer_dom(s, x)];
  pthread_mutex_lock(&dm->lock);
  bool live = s->xfers[x].kind != XF_FREE && s->xfers[x].gen == gen_of(id);
  pthread_mutex_unlock(&dm->lock);
  if (!live) return -ENOENT;
  kvs_stats_inc(s->stats, KVS_STAT_store_bad_transfer);
  return -EPERM;
}

/* Lock owner's domain and resolve owner and transfer: 0 with the domain held, or a negative
 * errno with no lock held. */
static int begin_xfer(kvs_store_t *s, kvs_owner_t owner, kvs_xfer_t xfer, uint32_t kind,
                      domain_t **dm_out, uint32_t *x_out) {
  domain_t *dm = owner_domain(s, owner);
  if (!dm) return -ENOENT;
  pthread_mutex_lock(&dm->lock);
  uint32_t o;
  int rc = owner_resolve(s, owner, &o);
  if (rc == 0) rc = xfer_resolve(s, (uint32_t)(dm - s->doms), o, xfer, kind, x_out);
  if (rc == 0) {
    *dm_out = dm;
    return 0;
  }
  pthread_mutex_unlock(&dm->lock);
  return rc == XFER_ELSEWHERE ? xfer_foreign(s, xfer) : rc;
}

/* ---- end of every mutation ------------------------------------------------------------- */

static bool valid_locked(kvs_store_t *s);

/* Unlock the domain (if any), check the whole store in debug builds, then report any pool
 * error found under a lock (logging is a syscall: never under a lock). */
static void finish(kvs_store_t *s, domain_t *dm) {
  if (dm) pthread_mutex_unlock(&dm->lock);
  KVS__DEBUG_CHECK(kvs__store_is_valid(s));
  int err = LOAD(s->pool_err) ? __atomic_exchange_n(&s->pool_err, 0, __ATOMIC_RELAXED) : 0;
  if (kvs__unlikely(err)) kvs_log_error("store: cache arena bookkeeping error %d", err);
}

/* ---- create / destroy ------------------------------------------------------------------ */

/* Tables start 128-byte aligned in the mapping (owner_t's alignment). */
static size_t table_bytes(size_t n, size_t each) { return KVS__ALIGN_UP(n * each, (size_t)128); }

static int mutex_init_adaptive(pthread_mutex_t *m) {
  /* Adaptive: a contended lock spins briefly before it sleeps. Every critical section is
   * short and makes no syscall (see "Threads" in store.h), so a waiter usually gets the lock
   * within the spin; a plain mutex parks it in the kernel, and with two threads cycling the
   * futex wake-ups cost more than the work (bench-core, 2 threads). */
  pthread_mutexattr_t ma;
  int rc = pthread_mutexattr_init(&ma);
  if (rc == 0) {
    (void)pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
    rc = pthread_mutex_init(m, &ma);
    pthread_mutexattr_destroy(&ma);
  }
  return rc;
}

/* Parts: cfg->shards when set (a power of two <= MAX_PARTS, every slice >= 1 slot), else
 * the most (<= MAX_PARTS) that leave every slice >= PART_MIN and every shard >= PART_MIN_BYTES
 * of the arena. 0 when invalid. */
static uint32_t choose_parts(uint32_t want, uint64_t arena, uint64_t mo, uint64_t mk,
                             uint64_t mp, uint64_t mx) {
  uint64_t least = mo < mk ? mo : mk;
  if (mp < least) least = mp;
  if (mx < least) least = mx;
  if (want) {
    if (want > MAX_PARTS || (want & (want - 1)) || least < want) return 0;
    return want;
  }
  uint32_t p = 1;
  while (p < MAX_PARTS && least / (2 * p) >= PART_MIN && arena / (2 * p) >= PART_MIN_BYTES)
    p *= 2;
  return p;
}

int kvs_store_create(const kvs_store_config_t *cfg, kvs_store_t **out) {
  if (!cfg || !cfg->pool || !out) return -EINVAL;
  if (!kvs_pool_is_owner(cfg->pool)) return -EPERM;
  kvs_pool_arena_stats_t st;
  KVS_TRY(kvs_pool_arena_stats(cfg->pool, KVS_ARENA_CACHE, &st));
  if (st.size == 0) return -EINVAL;
  if (st.allocated != 0) return -EBUSY;
  uint32_t page = kvs_pool_page_size(cfg->pool);
  if (page == 0) return -EINVAL;

  uint64_t per_page = st.size / page;
  uint64_t mo = cfg->max_objects ? cfg->max_objects : (per_page < TABLE_MAX ? per_page : TABLE_MAX);
  if (mo == 0) mo = 1;
  uint64_t mk = cfg->max_keys ? cfg->max_keys : 4 * mo;
  uint64_t mp = cfg->max_pins ? cfg->max_pins : 4 * mo;
  if (!cfg->max_keys && mk > TABLE_MAX) mk = TABLE_MAX;
  if (!cfg->max_pins && mp > TABLE_MAX) mp = TABLE_MAX;
  uint64_t mx = cfg->max_xfers ? cfg->max_xfers : DEFAULT_MAX_XFERS;
  uint64_t mw = cfg->max_owners ? cfg->max_owners : DEFAULT_MAX_OWNERS;
  if (mo > TABLE_MAX || mk > TABLE_MAX || mp > TABLE_MAX || mx > KVS_STORE_MAX_SLOTS ||
      mw > KVS_STORE_MAX_SLOTS)
    return -EINVAL;
  uint32_t parts = choose_parts(cfg->shards, st.size, mo, mk, mp, mx);
  if (parts == 0) return -EINVAL;
  /* Slices. A limit the config sets is split evenly. A default one gets twice its share per
   * slice, so that keys spread unevenly over the shards do not fill one slice early: the
   * default object limit (one object per page) is the arena's own, which the pool enforces
   * exactly whatever the slices say; the tables are backed only where used. */
  uint64_t obj_per = (cfg->max_objects || parts == 1 ? mo : 2 * mo) / parts;
  uint64_t key_per = (cfg->max_keys || parts == 1 ? mk : 2 * mk) / parts;
  uint64_t pin_per = (cfg->max_pins || parts == 1 ? mp : 2 * mp) / parts;
  uint64_t xfer_per = (cfg->max_xfers || parts == 1 ? mx : 2 * mx) / parts;
  if (obj_per > TABLE_MAX / parts) obj_per = TABLE_MAX / parts;
  if (key_per > TABLE_MAX / parts) key_per = TABLE_MAX / parts;
  if (pin_per > TABLE_MAX / parts) pin_per = TABLE_MAX / parts;
  if (xfer_per > KVS_STORE_MAX_SLOTS / parts) xfer_per = KVS_STORE_MAX_SLOTS / parts;
  uint64_t no = obj_per * parts, nk = key_per * parts, np = pin_per * parts;
  uint64_t nx = xfer_per * parts;
  /* Buckets: a power of two >= max_keys / 2 (and >= parts), 8 bytes each: the bytes of one
   * 4-byte head per key, as before buckets carried fingerprints. */
  uint64_t nb = 1;
  while (2 * nb < mk || nb < parts) nb <<= 1;

  size_t sz_obj = table_bytes(no + 1, sizeof(obj_t));
  size_t sz_key = table_bytes(nk + 1, sizeof(kent_t));
  size_t sz_bkt = table_bytes(nb, sizeof(bucket_t));
  size_t sz_pin = table_bytes(np + 1, sizeof(pin_t));
  size_t sz_xf = table_bytes(nx + 1, sizeof(xfer_t));
  size_t sz_ow = table_bytes(mw + 1, sizeof(owner_t));
  size_t sz_stk = table_bytes(no + nk + np + nx + mw, sizeof(uint32_t));
  size_t total = sz_obj + sz_key + sz_bkt + sz_pin + sz_xf + sz_ow + sz_stk;
  bool large = total >= LARGE_TABLES;

  kvs_store_t *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->shards = aligned_alloc(128, parts * sizeof(shard_t));
  s->doms = aligned_alloc(128, parts * sizeof(domain_t));
  void *map = NULL;
  int rc = s->shards && s->doms ? kvs__prim_alloc(total, &map) : -ENOMEM;
  if (rc < 0) {
    free(s->shards);
    free(s->doms);
    free(s);
    return rc;
  }
  memset(s->shards, 0, parts * sizeof(shard_t));
  memset(s->doms, 0, parts * sizeof(domain_t));
  /* Locks: owner_lock, then the shards' and the domains'; on failure destroy those made. */
  uint32_t inited = 0;
  rc = pthread_mutex_init(&s->owner_lock, NULL);
  bool owner_ok = rc == 0;
  while (rc == 0 && inited < 2 * parts) {
    rc = mutex_init_adaptive(inited < parts ? &s->shards[inited].lock
                                            : &s->doms[inited - parts].lock);
    if (rc == 0) inited++;
  }
  if (rc) {
    if (owner_ok) pthread_mutex_destroy(&s->owner_lock);
    for (uint32_t i = 0; i < inited; i++)
      pthread_mutex_destroy(i < parts ? &s->shards[i].lock : &s->doms[i - parts].lock);
    kvs__prim_unmap(map, total);
    free(s->shards);
    free(s->doms);
    free(s);
    return -rc;
  }
  /* Huge tables in transparent huge pages: at 1M objects the cycle's loads land all over
   * 200 MiB of tables, and with 4 KiB pages (a KVM guest walks two page tables per TLB miss)
   * each miss cost ~1.5x a huge-page one (bench-core: the 1M cycle 80-90 ns faster in huge
   * pages; docs/PERF.md §11; huge pages on the bucket array alone, or only after the first
   * 1k-64k objects, gave nothing: every table must be in them from the start). */
  if (total >= HUGE_TABLES) kvs__prim_hugepage_hint(map, total);
  uint8_t *p = map;
  s->map = map;
  s->map_len = total;
  s->objs = (obj_t *)p, p += sz_obj;
  s->kents = (kent_t *)p, p += sz_key;
  s->buckets = (bucket_t *)p, p += sz_bkt;
  s->pins = (pin_t *)p, p += sz_pin;
  s->xfers = (xfer_t *)p, p += sz_xf;
  s->owners = (owner_t *)p, p += sz_ow;
  uint32_t *stk = (uint32_t *)p;
  s->nparts = parts;
  s->pmask = parts - 1;
  s->obj_per = (uint32_t)obj_per;
  s->key_per = (uint32_t)key_per;
  s->pin_per = (uint32_t)pin_per;
  s->xfer_per = (uint32_t)xfer_per;
  for (uint32_t i = 0; i < parts; i++) {
    shard_t *sh = &s->shards[i];
    sh->sobj = (slots_t){i * s->obj_per, s->obj_per, 0, 0, stk}, stk += s->obj_per;
    sh->skey = (slots_t){i * s->key_per, s->key_per, 0, 0, stk}, stk += s->key_per;
    domain_t *dm = &s->doms[i];
    dm->spin = (slots_t){i * s->pin_per, s->pin_per, 0, 0, stk}, stk += s->pin_per;
    dm->sxfer = (slots_t){i * s->xfer_per, s->xfer_per, 0, 0, stk}, stk += s->xfer_per;
    dm->head_created = UINT64_MAX;
  }
  s->sowner = (slots_t){0, (uint32_t)mw, 0, 0, stk};
  s->hmask = (uint32_t)(nb - 1);
  s->pool = cfg->pool;
  s->stats = cfg->stats ? cfg->stats : kvs_stats_global();
  s->arena_bytes = st.size;
  s->page_size = page;
  s->large = large;
  s->lease_ms = cfg->lease_ms ? cfg->lease_ms : DEFAULT_LEASE_MS;
  uint32_t local = slots_get(&s->sowner); /* slot 1, gen 0: id 1 == KVS_OWNER_LOCAL */
  s->owners[local].open = 1;
  _Static_assert(KVS_OWNER_LOCAL == LOCAL_SLOT, "the local owner is slot 1, generation 0");

  /* The gauges start here; every change after moves them by its delta. */
  kvs_stats_set(s->stats, KVS_STAT_store_objects, 0);
  kvs_stats_set(s->stats, KVS_STAT_store_keys, 0);
  kvs_stats_set(s->stats, KVS_STAT_store_used_bytes, 0);
  kvs_stats_set(s->stats, KVS_STAT_store_reserved_bytes, 0);
  kvs_stats_set(s->stats, KVS_STAT_store_free_bytes, s->arena_bytes);
  kvs_stats_set(s->stats, KVS_STAT_store_arena_bytes, s->arena_bytes);
  kvs_stats_set(s->stats, KVS_STAT_store_live_pins, 0);
  finish(s, NULL);
  *out = s;
  return 0;
}

int kvs_store_destroy(kvs_store_t *s, bool force) {
  if (!s) return 0;
  uint32_t live = 0;
  for (uint32_t d = 0; d < s->nparts; d++) {
    pthread_mutex_lock(&s->doms[d].lock);
    live += slots_live(&s->doms[d].sxfer);
    pthread_mutex_unlock(&s->doms[d].lock);
  }
  if (live && !force) return -EBUSY;
  /* No other thread may use the store from here on (the caller's contract). */
  for (uint32_t d = 0; d < s->nparts; d++) {
    domain_t *dm = &s->doms[d];
    pthread_mutex_lock(&dm->lock);
    while (dm->fifo_head != NIL) xfer_end(s, dm, dm->fifo_head);
    pthread_mutex_unlock(&dm->lock);
  }
  lock_all(s);
  for (uint32_t i = 0; i < s->nparts; i++)
    while (s->shards[i].lru_head != NIL) obj_delete(s, s->shards[i].lru_head);
  unlock_all(s);
  finish(s, NULL);
  for (uint32_t i = 0; i < s->nparts; i++) {
    pthread_mutex_destroy(&s->shards[i].lock);
    pthread_mutex_destroy(&s->doms[i].lock);
  }
  pthread_mutex_destroy(&s->owner_lock);
  kvs__prim_unmap(s->map, s->map_len);
  free(s->shards);
  free(s->doms);
#ifdef KVSHIM_DEBUG
  memset(s, 0xdb, sizeof *s);
#endif
  free(s);
  return 0;
}

kvs_pool_t *kvs_store_pool(const kvs_store_t *s) { return s ? s->pool : NULL; }
uint32_t kvs_store_lease_ms(const kvs_store_t *s) { return s ? s->lease_ms : 0; }

/* ---- owners ---------------------------------------------------------------------------- */

/* Both hold owner_lock around the owner's domain (lock order), so that an owner is open
 * exactly when its slot is off the free stack (the validator's view). Rare calls. */
int kvs_store_owner_open(kvs_store_t *s, kvs_owner_t *out) {
  if (!s || !out) return -EINVAL;
  pthread_mutex_lock(&s->owner_lock);
  uint32_t o = slots_get(&s->sowner);
  if (o == NIL) {
    pthread_mutex_unlock(&s->owner_lock);
    return -ENOSPC;
  }
  domain_t *dm = owner_dom(s, o);
  pthread_mutex_lock(&dm->lock);
  owner_t *ow = &s->owners[o];
  ow->gen = (ow->gen + 1) & GEN_MASK;
  if (ow->gen == 0) ow->gen = 1;
  ow->open = 1;
  ow->xhead = NIL;
  ow->nxfers = 0;
  *out = make_id(ow->gen, o);
  pthread_mutex_unlock(&dm->lock);
  pthread_mutex_unlock(&s->owner_lock);
  finish(s, NULL);
  return 0;
}

int kvs_store_owner_release(kvs_store_t *s, kvs_owner_t owner) {
  if (!s) return -EINVAL;
  domain_t *dm = owner_domain(s, owner);
  if (!dm) return -ENOENT;
  pthread_mutex_lock(&s->owner_lock);
  pthread_mutex_lock(&dm->lock);
  uint32_t o;
  int rc = owner_resolve(s, owner, &o);
  if (rc < 0) {
    pthread_mutex_unlock(&dm->lock);
    pthread_mutex_unlock(&s->owner_lock);
    return rc;
  }
  int n = 0;
  while (s->owners[o].xhead != NIL) {
    xfer_end(s, dm, s->owners[o].xhead);
    n++;
  }
  if (o != LOCAL_SLOT) {
    s->owners[o].open = 0;
    slots_put(&s->sowner, o);
  }
  kvs_stats_inc(s->stats, KVS_STAT_store_owner_releases);
  pthread_mutex_unlock(&dm->lock);
  pthread_mutex_unlock(&s->owner_lock);
  finish(s, NULL);
  return n;
}

/* ---- reservations ---------------------------------------------------------------------- */

#define RES_AGAIN 0xffu /* internal outcome: retake the key with every shard locked */

/* Reserve one object for key under write transfer x (caller holds x's domain, and the key's
 * shard si, or every shard when all). Primary key bound now. */
static uint8_t reserve_key_locked(kvs_store_t *s, uint32_t si, uint32_t x, kvs_key_t key,
                                  const kvs_layout_t *l, uint64_t nbytes, uint64_t rounded,
                                  unsigned mode, uint64_t epoch, bool all, uint32_t *oi_out,
                                  kvs_extent_t *ext) {
  shard_t *sh = &s->shards[si];
  uint32_t e = key_find(s, key);
  if (e != NIL) {
    uint32_t oi = s->kents[e].obj, os = obj_shard(s, oi);
    if (os != si && !all) return RES_AGAIN; /* another shard's object's alias */
    obj_t *o = &s->objs[oi];
    if (o->state != OBJ_READY) return KVS_RES_BUSY;
    /* The caller is told "nothing to write": this call must not evict it. */
    o->epoch = epoch;
    if (o->pins == 0) lru_touch(s, &s->shards[os], oi); /* else its release does */
    return KVS_RES_PRESENT;
  }
  uint32_t oi = NIL, ki = NIL;
  uint64_t off = 0, ext_len = 0;
  /* A full arena and a shard head of the same length (a full cache of equal objects): the
   * head is the victim the general path below would pick; take its extent and its slots. */
  if (!all && !(mode & KVS_RESERVE_NO_EVICT) && sh->lru_head != NIL &&
      s->objs[sh->lru_head].ext_len == rounded &&
      kvs_pool_room(s->pool, KVS_ARENA_CACHE) < rounded) {
    reuse_t r;
    if (evict_one_for(s, si, epoch, false, rounded, &r, true) == EV_KEPT) {
      oi = r.obj;
      ki = r.kent;
      off = r.off;
      ext_len = rounded;
    }
  }
  if (oi == NIL) {
    bool blocked = false;
    oi = slot_get_evicting(s, si, &sh->sobj, mode, epoch, all, &blocked);
    if (oi == NIL) return blocked ? RES_AGAIN : KVS_RES_NO_SPACE;
    ki = slot_get_evicting(s, si, &sh->skey, mode, epoch, all, &blocked);
    if (ki == NIL) {
      slots_put(&sh->sobj, oi);
      return blocked ? RES_AGAIN : KVS_RES_NO_SPACE;
    }
    int rc = alloc_extent(s, si, nbytes, rounded, mode, epoch, all, &off, &ext_len);
    if (rc < 0) {
      slots_put(&sh->skey, ki);
      slots_put(&sh->sobj, oi);
      return rc == -EAGAIN ? RES_AGAIN : KVS_RES_NO_SPACE;
    }
  }
  obj_t *o = &s->objs[oi];
  memset(o, 0, sizeof *o);
  o->off = off;
  o->ext_len = ext_len;
  o->state = OBJ_WRITING;
  o->keys = ki;
  o->layout = *l;
  kent_t *ke = &s->kents[ki];
  memset(ke, 0, sizeof *ke);
  ke->key = key;
  ke->obj = oi;
  key_bind(s, ki);
  xfer_add_object(s, x, oi);
  acct_reserved(s, sh, (int64_t)ext_len);
  BUMP(sh->nwriting, 1);
  ext->offset = off;
  ext->length = nbytes;
  *oi_out = oi;
  return KVS_RES_RESERVED;
}

/* reserve_key_locked under the key's shard alone, else under every shard. */
static uint8_t reserve_key(kvs_store_t *s, uint32_t x, kvs_key_t key, const kvs_layout_t *l,
                           uint64_t nbytes, uint64_t rounded, unsigned mode, uint64_t epoch,
                           uint32_t *oi_out, kvs_extent_t *ext) {
  uint32_t si = key_shard(s, key);
  shard_t *sh = &s->shards[si];
  pthread_mutex_lock(&sh->lock);
  uint8_t oc = reserve_key_locked(s, si, x, key, l, nbytes, rounded, mode, epoch, false,
                                  oi_out, ext);
  pthread_mutex_unlock(&sh->lock);
  if (oc != RES_AGAIN) return oc;
  lock_all(s);
  oc = reserve_key_locked(s, si, x, key, l, nbytes, rounded, mode, epoch, true, oi_out, ext);
  unlock_all(s);
  return oc;
}

/* A layout judged for a reservation: outcome, the one every key gets regardless of its state
 * (BAD_LAYOUT, TOO_LARGE), or RESERVED when objects of it fit; nbytes its bytes (0 when bad),
 * rounded those rounded up to pages (0 unless it fits). */
typedef struct fit {
  uint8_t outcome;
  uint64_t nbytes, rounded;
} fit_t;

static fit_t layout_fit(const kvs_store_t *s, const kvs_layout_t *l) {
  fit_t f = {KVS_RES_BAD_LAYOUT, kvs_layout_nbytes(l), 0};
  if (f.nbytes == 0) return f;
  f.outcome = KVS_RES_TOO_LARGE;
  if (f.nbytes > s->arena_bytes) return f;
  f.rounded = KVS__ALIGN_UP(f.nbytes, (uint64_t)s->page_size);
  if (f.rounded <= s->arena_bytes) f.outcome = KVS_RES_RESERVED;
  return f;
}

static void count_outcomes(kvs_store_t *s, const uint8_t *outcomes, size_t n) {
  uint64_t c[N_OUTCOMES] = {0};
  for (size_t i = 0; i < n; i++) c[outcomes[i]]++;
  static const kvs_stat_id_t ids[N_OUTCOMES] = {
      [KVS_RES_RESERVED] = KVS_STAT_store_reserved,   [KVS_RES_PRESENT] = KVS_STAT_store_present,
      [KVS_RES_BUSY] = KVS_STAT_store_busy,           [KVS_RES_NO_SPACE] = KVS_STAT_store_no_space,
      [KVS_RES_TOO_LARGE] = KVS_STAT_store_too_large, [KVS_RES_BAD_LAYOUT] = KVS_STAT_store_bad_layout,
  };
  for (size_t k = 0; k < N_OUTCOMES; k++) /* SKIPPED is not counted: its blocker is */
    if (c[k] && k != KVS_RES_SKIPPED) kvs_stats_add(s->stats, ids[k], c[k]);
}

/* The state of key's object: OBJ_FREE when unbound. Caller holds every shard. */
static uint32_t key_state_all(const kvs_store_t *s, kvs_key_t k) {
  uint32_t e = key_find(s, k);
  return e == NIL ? OBJ_FREE : s->objs[s->kents[e].obj].state;
}

/* ALL_OR_NOTHING pre-check, before anything is evicted (caller holds every shard): the
 * first failing outcome, or RESERVED when the request may succeed. */
static uint8_t all_or_nothing_precheck(kvs_store_t *s, const kvs_key_t *keys, size_t n,
                                       uint64_t rounded, unsigned mode) {
  uint64_t need = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t state = key_state_all(s, keys[i]);
    if (state == OBJ_FREE) need += rounded;
    else if (state != OBJ_READY) return KVS_RES_BUSY;
  }
  uint64_t room = free_bytes(s) + ((mode & KVS_RESERVE_NO_EVICT) ? 0 : sum_lru_bytes(s));
  if (need > room) return KVS_RES_NO_SPACE;
  return KVS_RES_RESERVED;
}

static bool is_failure(uint8_t oc) { return oc != KVS_RES_RESERVED && oc != KVS_RES_PRESENT; }

/* The outcome of a key not reserved because an ALL_OR_NOTHING request failed with `fail`
 * (pre: in the pre-check). Caller holds every shard. */
static uint8_t classify_failed(const kvs_store_t *s, kvs_key_t k, uint8_t fail, bool pre) {
  uint32_t state = key_state_all(s, k);
  return state == OBJ_READY ? KVS_RES_PRESENT
         : state != OBJ_FREE ? KVS_RES_BUSY
         : fail == KVS_RES_NO_SPACE && pre ? KVS_RES_NO_SPACE : KVS_RES_SKIPPED;
}

/* Lock owner's domain and resolve owner: 0 with the domain held, or -ENOENT unlocked. */
static int begin_owner(kvs_store_t *s, kvs_owner_t owner, domain_t **dm_out, uint32_t *o) {
  domain_t *dm = owner_domain(s, owner);
  if (!dm) return -ENOENT;
  pthread_mutex_lock(&dm->lock);
  int rc = owner_resolve(s, owner, o);
  if (rc < 0) {
    pthread_mutex_unlock(&dm->lock);
    return rc;
  }
  *dm_out = dm;
  return 0;
}

/* A reservation call's epoch: unique across domains, never 0 (a fresh object's). */
static uint64_t next_epoch(kvs_store_t *s, domain_t *dm) {
  return ++dm->epoch * MAX_PARTS + (uint64_t)(dm - s->doms) + 1;
}

/* The opening of a reservation of keys[0, n) of `layout`: the keys prefetched, due leases
 * swept, the owner's domain locked (*dm_out), the call counted, the layout judged (*fit) and,
 * when it fits, a write transfer made (*x_out; else NIL). 0, or a negative errno with nothing
 * held (-ENOSPC: no transfer slot). */
static inline int begin_reserve(kvs_store_t *s, kvs_owner_t owner, const kvs_key_t *keys,
                                size_t n, const kvs_layout_t *layout, domain_t **dm_out,
                                uint32_t *x_out, fit_t *fit) {
  prefetch_keys(s, keys, n); /* first: the clock read below overlaps the misses */
  uint64_t now = kvs__now_ms();
  sweep_all(s, now);
  domain_t *dm;
  uint32_t o;
  int rc = begin_owner(s, owner, &dm, &o);
  if (rc < 0) return rc;
  kvs_stats_inc(s->stats, KVS_STAT_store_reserve_calls);
  *fit = layout_fit(s, layout);
  uint32_t x = NIL;
  if (fit->outcome == KVS_RES_RESERVED && (x = xfer_new(s, dm, o, XF_WRITE, now)) == NIL) {
    finish(s, dm);
    return -ENOSPC;
  }
  *dm_out = dm;
  *x_out = x;
  return 0;
}

int kvs_store_reserve_write(kvs_store_t *s, kvs_owner_t owner, const kvs_key_t *keys, size_t n,
                            const kvs_layout_t *layout, unsigned mode, uint8_t *outcomes,
                            kvs_extent_t *extents, kvs_xfer_t *xfer) {
  if (!s || !keys || n == 0 || !layout || !outcomes || !extents || !xfer) return -EINVAL;
  domain_t *dm;
  uint32_t x;
  fit_t fit;
  KVS_TRY(begin_reserve(s, owner, keys, n, layout, &dm, &x, &fit));
  uint64_t epoch = next_epoch(s, dm);
  uint8_t fail = KVS_RES_RESERVED;
  bool aon = mode & KVS_RESERVE_ALL_OR_NOTHING;
  if (fit.outcome == KVS_RES_RESERVED && aon) {
    lock_all(s);
    fail = all_or_nothing_precheck(s, keys, n, fit.rounded, mode);
    unlock_all(s);
  }
  bool pre = fail != KVS_RES_RESERVED; /* failed before reserving anything */
  for (size_t i = 0; i < n; i++) {
    memset(&extents[i], 0, sizeof extents[i]);
    if (fit.outcome != KVS_RES_RESERVED) {
      outcomes[i] = fit.outcome;
      continue;
    }
    if (fail != KVS_RES_RESERVED) { /* classify without reserving */
      lock_all(s);
      outcomes[i] = classify_failed(s, keys[i], fail, pre);
      unlock_all(s);
      continue;
    }
    uint32_t oi;
    outcomes[i] = reserve_key(s, x, keys[i], layout, fit.nbytes, fit.rounded, mode, epoch, &oi,
                              &extents[i]);
    if (aon && is_failure(outcomes[i])) fail = outcomes[i];
  }
  if (fail != KVS_RES_RESERVED && x != NIL && s->xfers[x].count) { /* roll back */
    xfer_drop_objects(s, x);
    for (size_t i = 0; i < n; i++)
      if (outcomes[i] == KVS_RES_RESERVED) {
        outcomes[i] = KVS_RES_SKIPPED;
        memset(&extents[i], 0, sizeof extents[i]);
      }
  }
  int rc = 0;
  if (x != NIL) {
    rc = (int)s->xfers[x].count;
    if (rc == 0) xfer_unlink(s, dm, x);
  }
  *xfer = rc ? make_id(s->xfers[x].gen, x) : 0;
  count_outcomes(s, outcomes, n);
  finish(s, dm);
  return rc;
}

int kvs_store_reserve_object(kvs_store_t *s, kvs_owner_t owner, const kvs_key_t *keys,
                             size_t n_keys, const kvs_layout_t *layout, unsigned mode,
                             uint8_t *outcome, kvs_extent_t *extent, kvs_xfer_t *xfer) {
  if (!s || !keys || n_keys == 0 || !layout || !outcome || !extent || !xfer) return -EINVAL;
  domain_t *dm;
  uint32_t x;
  fit_t fit;
  KVS_TRY(begin_reserve(s, owner, keys, n_keys, layout, &dm, &x, &fit));
  uint8_t oc = fit.outcome;
  kvs_extent_t ext = {0, 0};
  if (oc == KVS_RES_RESERVED) {
    uint64_t epoch = next_epoch(s, dm);
    uint32_t oi;
    oc = reserve_key(s, x, keys[0], layout, fit.nbytes, fit.rounded, mode, epoch, &oi, &ext);
    if (oc == KVS_RES_RESERVED && n_keys > 1) {
      /* Aliases wait unbound behind the primary, in the object's shard's slice of entries;
       * commit binds those still free. Entry slots may evict: every shard, so that a foreign
       * head is no obstacle. */
      uint32_t si = obj_shard(s, oi);
      shard_t *sh = &s->shards[si];
      lock_all(s);
      uint32_t tail = s->objs[oi].keys;
      uint64_t skipped = 0;
      for (size_t i = 1; i < n_keys; i++) {
        bool blocked = false;
        uint32_t ki = slot_get_evicting(s, si, &sh->skey, mode, epoch, true, &blocked);
        if (ki == NIL) {
          skipped++;
          continue;
        }
        kent_t *ke = &s->kents[ki];
        memset(ke, 0, sizeof *ke);
        ke->key = keys[i];
        ke->obj = oi;
        s->kents[tail].onext = ki;
        tail = ki;
      }
      unlock_all(s);
      if (skipped) kvs_stats_add(s->stats, KVS_STAT_store_alias_skipped, skipped);
    }
    if (oc != KVS_RES_RESERVED) {
      xfer_unlink(s, dm, x);
      x = NIL;
    }
  }
  *outcome = oc;
  *extent = ext;
  *xfer = x != NIL ? make_id(s->xfers[x].gen, x) : 0;
  count_outcomes(s, outcome, 1);
  int rc = x != NIL;
  finish(s, dm);
  return rc;
}

/* ---- commit / abort / release ---------------------------------------------------------- */

/* WRITING -> READY for object oi of shard si: bind its aliases still free (caller holds si,
 * and every shard when the object has aliases), push it to its shard's LRU tail. Returns the
 * aliases skipped. */
static uint64_t publish_obj(kvs_store_t *s, uint32_t si, uint32_t oi) {
  shard_t *sh = &s->shards[si];
  obj_t *ob = &s->objs[oi];
  uint64_t skipped = 0;
  for (uint32_t *link = &s->kents[ob->keys].onext; *link != NIL;) {
    uint32_t e = *link;
    if (!s->kents[e].bound && key_find(s, s->kents[e].key) != NIL) {
      *link = s->kents[e].onext; /* alias taken meanwhile: skip it */
      kent_free(sh, s, e);
      skipped++;
      continue;
    }
    if (!s->kents[e].bound) key_bind(s, e);
    if (key_shard(s, s->kents[e].key) != si) ob->foreign = 1;
    link = &s->kents[e].onext;
  }
  ob->state = OBJ_READY;
  ob->xfer = ob->xnext = NIL;
  acct_reserved(s, sh, -(int64_t)ob->ext_len);
  acct_used(s, sh, (int64_t)ob->ext_len);
  BUMP(sh->nwriting, -1);
  BUMP(sh->nready, 1);
  gauge(s, KVS_STAT_store_objects, 1);
  lru_push_tail(s, sh, oi);
  return skipped;
}

int kvs_store_commit(kvs_store_t *s, kvs_owner_t owner, kvs_xfer_t xfer) {
  if (!s) return -EINVAL;
  domain_t *dm;
  uint32_t x;
  int rc = begin_xfer(s, owner, xfer, XF_WRITE, &dm, &x);
  if (rc < 0) return rc;
  uint64_t n = 0, skipped = 0;
  /* The list is newest first: the batch's first key is pushed to its LRU tail last. */
  for (uint32_t oi = s->xfers[x].head, next; oi != NIL; oi = next) {
    next = s->objs[oi].xnext;
    uint32_t si = obj_shard(s, oi);
    if (s->kents[s->objs[oi].keys].onext != NIL) { /* aliases: their buckets are anywhere */
      lock_all(s);
      skipped += publish_obj(s, si, oi);
      unlock_all(s);
    } else {
      pthread_mutex_lock(&s->shards[si].lock);
      skipped += publish_obj(s, si, oi);
      pthread_mutex_unlock(&s->shards[si].lock);
    }
    n++;
  }
  s->xfers[x].head = NIL;
  s->xfers[x].count = 0;
  xfer_unlink(s, dm, x);
  kvs_stats_inc(s->stats, KVS_STAT_store_commits);
  kvs_stats_add(s->stats, KVS_STAT_store_committed_objects, n);
  if (skipped) kvs_stats_add(s->stats, KVS_STAT_store_alias_skipped, skipped);
  finish(s, dm);
  return 0;
}

/* abort and release: the owner ends its transfer of `kind` (XF_FREE: either) as xfer_end
 * does, counted as an abort (a write) or a release (a read). */
static int end_own_xfer(kvs_store_t *s, kvs_owner_t owner, kvs_xfer_t xfer, uint32_t kind) {
  if (!s) return -EINVAL;
  domain_t *dm;
  uint32_t x;
  int rc = begin_xfer(s, owner, xfer, kind, &dm, &x);
  if (rc < 0) return rc;
  bool write = s->xfers[x].kind == XF_WRITE;
  xfer_end(s, dm, x);
  kvs_stats_inc(s->stats, write ? KVS_STAT_store_aborts : KVS_STAT_store_releases);
  finish(s, dm);
  return 0;
}

int kvs_store_abort(kvs_store_t *s, kvs_owner_t owner, kvs_xfer_t xfer) {
  return end_own_xfer(s, owner, xfer, XF_FREE);
}

int kvs_store_release(kvs_store_t *s, kvs_owner_t owner, kvs_xfer_t xfer) {
  return end_own_xfer(s, owner, xfer, XF_READ);
}

/* ---- lookups --------------------------------------------------------------------------- */

int kvs_store_lookup(kvs_store_t *s, kvs_owner_t owner, const kvs_key_t *keys, size_t n,
                     bool pin, kvs_xfer_t *xfer) {
  if (!s || !keys || n == 0 || (pin && !xfer)) return -EINVAL;
  prefetch_keys(s, keys, n);
  uint64_t now = pin ? kvs__now_ms() : 0;
  domain_t *dm;
  uint32_t o;
  int rc = begin_owner(s, owner, &dm, &o);
  if (rc < 0) return rc;
  uint32_t x = NIL;
  if (pin && (x = xfer_new(s, dm, o, XF_READ, now)) == NIL) {
    pthread_mutex_unlock(&dm->lock);
    return -ENOSPC;
  }
  shard_t *held = NULL; /* one shard at a time; kept across keys of the same shard */
  size_t run = 0;
  for (; run < n; run++) {
    shard_t *sh = &s->shards[key_shard(s, keys[run])];
    if (sh != held) {
      if (held) pthread_mutex_unlock(&held->lock);
      pthread_mutex_lock(&sh->lock);
      held = sh;
    }
    uint32_t e = key_find(s, keys[run]);
    if (e == NIL) break;
    uint32_t oi = s->kents[e].obj;
    shard_t *os = &s->shards[obj_shard(s, oi)];
    if (os != held) {
      /* An alias of another shard's object: its state and pins are that shard's. Entry e
       * is in that shard's slice, so under its lock e still naming oi by this key means
       * oi is live and reachable by it (or has become READY since: also a hit). */
      pthread_mutex_unlock(&held->lock);
      pthread_mutex_lock(&os->lock);
      held = os;
      if (s->kents[e].obj != oi || !kvs_key_eq(s->kents[e].key, keys[run])) break;
    }
    obj_t *ob = &s->objs[oi];
    if (ob->state != OBJ_READY) break;
    if (!pin) continue;
    uint32_t p = slots_get(&dm->spin);
    if (p == NIL) break;
    xfer_t *xf = &s->xfers[x];
    pin_t *pe = &s->pins[p];
    pe->key = keys[run];
    pe->obj = oi;
    LIST_PUSH_TAIL(s->pins, p, prev, next, xf->head, xf->tail);
    xf->count++;
    if (ob->pins++ == 0) lru_pinned(os, ob);
  }
  if (held) pthread_mutex_unlock(&held->lock);
  if (pin) {
    if (run == 0) xfer_unlink(s, dm, x);
    *xfer = run ? make_id(s->xfers[x].gen, x) : 0;
    if (run) {
      BUMP(dm->npins, run);
      gauge(s, KVS_STAT_store_live_pins, (int64_t)run);
      kvs_stats_add(s->stats, KVS_STAT_store_pins, run);
    }
  }
  kvs_stats_inc(s->stats, KVS_STAT_store_lookups);
  kvs_stats_add(s->stats, KVS_STAT_store_lookup_keys, n);
  if (run) kvs_stats_add(s->stats, KVS_STAT_store_hits, run);
  if (run < n) kvs_stats_inc(s->stats, KVS_STAT_store_misses);
  if (pin) finish(s, dm);
  else pthread_mutex_unlock(&dm->lock);
  return (int)(run > INT32_MAX ? INT32_MAX : run);
}

int kvs_store_read_pinned(kvs_store_t *s, kvs_owner_t owner, kvs_xfer_t xfer,
                          kvs_object_view_t *views, size_t cap) {
  if (!s || (!views && cap)) return -EINVAL;
  domain_t *dm;
  uint32_t x;
  int rc = begin_xfer(s, owner, xfer, XF_READ, &dm, &x);
  if (rc < 0) return rc;
  /* A pinned object's extent and layout do not change until its pin ends: no shard lock. */
  size_t i = 0;
  for (uint32_t p = s->xfers[x].head; p != NIL && i < cap; p = s->pins[p].next, i++) {
    const obj_t *ob = &s->objs[s->pins[p].obj];
    views[i].key = s->pins[p].key;
    views[i].extent.offset = ob->off;
    views[i].extent.length = kvs_layout_nbytes(&ob->layout);
    views[i].layout = ob->layout;
  }
  rc = (int)s->xfers[x].count;
  pthread_mutex_unlock(&dm->lock);
  return rc;
}

/* remove under the key's shard si alone (all false: -EAGAIN when that is not enough) or
 * under every shard. */
static int remove_locked(kvs_store_t *s, uint32_t si, const kvs_key_t *key, bool all) {
  uint32_t e = key_find(s, *key);
  if (e == NIL) return -ENOENT;
  uint32_t oi = s->kents[e].obj;
  if (!all && (obj_shard(s, oi) != si || s->objs[oi].foreign)) return -EAGAIN;
  if (s->objs[oi].state != OBJ_READY || s->objs[oi].pins) return -EBUSY;
  obj_delete(s, oi);
  kvs_stats_inc(s->stats, KVS_STAT_store_removed);
  return 0;
}

int kvs_store_remove(kvs_store_t *s, const kvs_key_t *key) {
  if (!s || !key) return -EINVAL;
  uint32_t si = key_shard(s, *key);
  pthread_mutex_lock(&s->shards[si].lock);
  int rc = remove_locked(s, si, key, false);
  pthread_mutex_unlock(&s->shards[si].lock);
  if (rc == -EAGAIN) {
    lock_all(s);
    rc = remove_locked(s, si, key, true);
    unlock_all(s);
  }
  if (rc == 0) finish(s, NULL);
  return rc;
}

int kvs_store_sweep(kvs_store_t *s, uint64_t now_ms) {
  if (!s) return -EINVAL;
  int n = sweep_all(s, now_ms);
  finish(s, NULL);
  return n;
}

/* Every lock, in order (info and the validator: a consistent snapshot). */
static void lock_everything(kvs_store_t *s) {
  pthread_mutex_lock(&s->owner_lock);
  for (uint32_t d = 0; d < s->nparts; d++) pthread_mutex_lock(&s->doms[d].lock);
  lock_all(s);
}
static void unlock_everything(kvs_store_t *s) {
  unlock_all(s);
  for (uint32_t d = s->nparts; d-- > 0;) pthread_mutex_unlock(&s->doms[d].lock);
  pthread_mutex_unlock(&s->owner_lock);
}

void kvs_store_info(kvs_store_t *s, kvs_store_info_t *out) {
  if (!s || !out) return;
  kvs_pool_arena_stats_t st;
  memset(&st, 0, sizeof st);
  memset(out, 0, sizeof *out);
  lock_everything(s);
  (void)kvs_pool_arena_stats(s->pool, KVS_ARENA_CACHE, &st);
  out->arena_bytes = s->arena_bytes;
  for (uint32_t i = 0; i < s->nparts; i++) {
    const shard_t *sh = &s->shards[i];
    const domain_t *dm = &s->doms[i];
    out->used_bytes += sh->used;
    out->reserved_bytes += sh->reserved;
    out->objects_ready += sh->nready;
    out->objects_writing += sh->nwriting;
    out->keys += sh->nkeys;
    out->pins += dm->npins;
    out->xfers += slots_live(&dm->sxfer);
  }
  out->free_bytes = s->arena_bytes - out->used_bytes - out->reserved_bytes;
  out->owners = slots_live(&s->sowner);
  out->fragmentation_pct = st.fragmentation_pct;
  unlock_everything(s);
  kvs_stats_set(s->stats, KVS_STAT_pool_fragmentation_pct, st.fragmentation_pct);
}

/* ---- validator ------------------------------------------------------------------------- */

#define V(cond)                                                                               \
  do {                                                                                        \
    if (kvs__unlikely(!(cond))) {                                                             \
      kvs_log_error("store invalid: %s (store.c:%d)", #cond, __LINE__);                      \
      return false;                                                                           \
    }                                                                                         \
  } while (0)

/* Check a slot slice's free stack: entries in range, free, no duplicates (mark). */
#define V_SLOTS(sl, tbl, is_free)                                                             \
  do {                                                                                        \
    V((sl).nfree <= (sl).hw && (sl).hw <= (sl).cap);                                          \
    for (uint32_t i_ = (sl).base + 1; i_ <= (sl).base + (sl).hw; i_++) (tbl)[i_].mark = 0;    \
    for (uint32_t k_ = 0; k_ < (sl).nfree; k_++) {                                            \
      uint32_t i_ = (sl).stack[k_];                                                           \
      V(i_ >= (sl).base + 1 && i_ <= (sl).base + (sl).hw);                                    \
      V(is_free(&(tbl)[i_]));                                                                 \
      V((tbl)[i_].mark == 0);                                                                 \
      (tbl)[i_].mark = 1;                                                                     \
    }                                                                                         \
    uint32_t nf_ = 0;                                                                         \
    for (uint32_t i_ = (sl).base + 1; i_ <= (sl).base + (sl).hw; i_++)                        \
      nf_ += is_free(&(tbl)[i_]);                                                             \
    V(nf_ == (sl).nfree);                                                                     \
  } while (0)

static inline bool obj_is_free(const obj_t *o) { return o->state == OBJ_FREE; }
static inline bool kent_is_free(const kent_t *k) { return k->obj == NIL; }
static inline bool pin_is_free(const pin_t *p) { return p->obj == NIL; }
static inline bool xfer_is_free(const xfer_t *x) { return x->kind == XF_FREE; }

/* Caller holds every lock. */
static bool valid_locked(kvs_store_t *s) {
  for (uint32_t i = 0; i < s->nparts; i++) {
    V_SLOTS(s->shards[i].sobj, s->objs, obj_is_free);
    V_SLOTS(s->shards[i].skey, s->kents, kent_is_free);
    V_SLOTS(s->doms[i].spin, s->pins, pin_is_free);
    V_SLOTS(s->doms[i].sxfer, s->xfers, xfer_is_free);
  }
  V(s->sowner.nfree <= s->sowner.hw && s->sowner.hw <= s->sowner.cap && s->sowner.hw >= 1);
  for (uint32_t k = 0; k < s->sowner.nfree; k++) {
    uint32_t o = s->sowner.stack[k];
    V(o > LOCAL_SLOT && o <= s->sowner.hw && !s->owners[o].open);
  }
  uint32_t nclosed = 0;
  for (uint32_t o = 1; o <= s->sowner.hw; o++) nclosed += !s->owners[o].open;
  V(nclosed == s->sowner.nfree);
  V(s->owners[LOCAL_SLOT].open && s->owners[LOCAL_SLOT].gen == 0);

  /* objects and their keys, shard by shard */
  uint64_t used_all = 0, reserved_all = 0, nobj_all = 0, nxwrite = 0;
  uint32_t nbound_in[MAX_PARTS] = {0};
  for (uint32_t si = 0; si < s->nparts; si++) {
    shard_t *sh = &s->shards[si];
    uint64_t used = 0, reserved = 0, lru_expect = 0;
    uint32_t nready = 0, nwriting = 0, nkent = 0;
    for (uint32_t i = sh->sobj.base + 1; i <= sh->sobj.base + sh->sobj.hw; i++) {
      obj_t *o = &s->objs[i];
      o->mark = 0; /* from here on: pin entries naming it */
      if (o->state == OBJ_FREE) continue;
      V(o->state == OBJ_WRITING || o->state == OBJ_READY);
      uint64_t len = kvs_layout_nbytes(&o->layout);
      V(len > 0 && len <= o->ext_len);
      V((int64_t)o->ext_len == kvs_pool_extent_len(s->pool, KVS_ARENA_CACHE, o->off));
      V(kvs_pool_arena_of(s->pool, o->off, o->ext_len) == KVS_ARENA_CACHE);
      V(o->keys != NIL);
      V(key_shard(s, s->kents[o->keys].key) == si); /* in its primary key's shard */
      bool primary = true, foreign = false;
      for (uint32_t e = o->keys, hops = 0; e != NIL; e = s->kents[e].onext, primary = false) {
        V(++hops <= s->key_per);
        V(e >= sh->skey.base + 1 && e <= sh->skey.base + sh->skey.hw); /* its slice */
        const kent_t *ke = &s->kents[e];
        V(ke->obj == i);
        nkent++;
        if (o->state == OBJ_READY || primary) V(ke->bound);
        else V(!ke->bound);
        if (ke->bound) {
          V(key_find(s, ke->key) == e);
          uint32_t ks = key_shard(s, ke->key);
          nbound_in[ks]++;
          foreign |= ks != si;
        }
      }
      V(o->foreign == (o->state == OBJ_READY && foreign));
      if (o->state == OBJ_READY) {
        used += o->ext_len;
        nready++;
        if (o->pins == 0) lru_expect++;
        if (!lru_listed(s, sh, i)) V(o->pins && o->lru_next == NIL); /* see LRU */
        V(o->xfer == NIL && o->xnext == NIL);
      } else {
        reserved += o->ext_len;
        nwriting++;
        V(o->pins == 0);
        V(o->lru_prev == NIL && o->lru_next == NIL && sh->lru_head != i);
        V(o->xfer >= 1 && o->xfer <= s->nparts * s->xfer_per &&
          s->xfers[o->xfer].kind == XF_WRITE);
      }
    }
    V(used == sh->used && reserved == sh->reserved);
    V(nready == sh->nready && nwriting == sh->nwriting);
    V(nready + nwriting == slots_live(&sh->sobj));
    V(nkent == slots_live(&sh->skey));
    used_all += used;
    reserved_all += reserved;
    nobj_all += nready + nwriting;
    nxwrite += nwriting;
    for (uint32_t e = sh->skey.base + 1; e <= sh->skey.base + sh->skey.hw; e++) {
      const kent_t *ke = &s->kents[e];
      if (ke->obj == NIL) V(!ke->bound);
      else if (!ke->bound) V(key_find(s, ke->key) != e);
      if (ke->obj == NIL) continue;
      const bucket_t *b = bucket_at(s, key_hash(ke->key));
      if (ke->bound) V(b->head != NIL && s->kents[b->head].bound);
      if (ke->bound && b->head == e) V(b->tag == tag_of(s, e)); /* fingerprint, chain bit */
    }

    /* its LRU: exactly its READY unpinned objects */
    uint64_t lru_n = 0, lru_unpinned = 0, lru_bytes = 0;
    uint32_t prev = NIL;
    for (uint32_t i = sh->lru_head; i != NIL; prev = i, i = s->objs[i].lru_next) {
      V(++lru_n <= sh->sobj.hw);
      const obj_t *o = &s->objs[i];
      V(obj_shard(s, i) == si);
      V(o->state == OBJ_READY && (i == sh->lru_head || o->lru_prev == prev));
      V(lru_listed(s, sh, i));
      if (o->pins) continue;
      lru_unpinned++;
      lru_bytes += o->ext_len;
    }
    V(prev == sh->lru_tail && lru_unpinned == lru_expect && lru_bytes == sh->lru_bytes);
  }
  for (uint32_t si = 0; si < s->nparts; si++) V(nbound_in[si] == s->shards[si].nkeys);

  /* pool accounting: the invariant of store.h, across the shards */
  kvs_pool_arena_stats_t st;
  V(kvs_pool_arena_stats(s->pool, KVS_ARENA_CACHE, &st) == 0);
  V(st.size == s->arena_bytes);
  V(used_all + reserved_all + st.free == s->arena_bytes);
  V(st.extents == nobj_all);

  /* transfers: each domain's FIFO, owner lists, contents */
  uint64_t fifo_all = 0, wobjs = 0;
  for (uint32_t d = 0; d < s->nparts; d++) {
    domain_t *dm = &s->doms[d];
    uint64_t fifo_n = 0, last_created = 0, npins = 0;
    uint32_t prev = NIL;
    for (uint32_t x = dm->fifo_head; x != NIL; prev = x, x = s->xfers[x].fnext) {
      V(++fifo_n <= dm->sxfer.hw);
      V(xfer_dom(s, x) == d);
      xfer_t *xf = &s->xfers[x];
      V(xf->kind == XF_WRITE || xf->kind == XF_READ);
      V(xf->fprev == prev && xf->created_ms >= last_created);
      last_created = xf->created_ms;
      V(xf->owner >= 1 && xf->owner <= s->sowner.hw && s->owners[xf->owner].open);
      V((xf->owner & s->pmask) == d);
      uint32_t cnt = 0;
      if (xf->kind == XF_WRITE) {
        for (uint32_t oi = xf->head; oi != NIL; oi = s->objs[oi].xnext) {
          V(++cnt <= s->nparts * s->obj_per);
          V(s->objs[oi].state == OBJ_WRITING && s->objs[oi].xfer == x);
        }
        wobjs += cnt;
      } else {
        uint32_t pp = NIL;
        for (uint32_t p = xf->head; p != NIL; pp = p, p = s->pins[p].next) {
          V(++cnt <= dm->spin.hw);
          V(p >= dm->spin.base + 1 && p <= dm->spin.base + dm->spin.hw);
          V(s->pins[p].prev == pp && s->pins[p].obj != NIL);
          V(s->objs[s->pins[p].obj].state == OBJ_READY);
          s->objs[s->pins[p].obj].mark++;
        }
        V(pp == xf->tail);
        npins += cnt;
      }
      V(cnt == xf->count && cnt > 0);
    }
    V(prev == dm->fifo_tail && fifo_n == slots_live(&dm->sxfer));
    if (dm->fifo_head) V(dm->head_created <= s->xfers[dm->fifo_head].created_ms);
    V(npins == dm->npins && npins == slots_live(&dm->spin));
    fifo_all += fifo_n;
  }
  V(wobjs == nxwrite);
  for (uint32_t si = 0; si < s->nparts; si++) {
    const slots_t *sl = &s->shards[si].sobj;
    for (uint32_t i = sl->base + 1; i <= sl->base + sl->hw; i++)
      V(s->objs[i].mark == s->objs[i].pins);
  }

  uint64_t owned = 0;
  for (uint32_t o = 1; o <= s->sowner.hw; o++) {
    const owner_t *ow = &s->owners[o];
    if (!ow->open) {
      V(ow->xhead == NIL && ow->nxfers == 0);
      continue;
    }
    uint32_t cnt = 0, pp = NIL;
    for (uint32_t x = ow->xhead; x != NIL; pp = x, x = s->xfers[x].onext) {
      V(++cnt <= s->doms[o & s->pmask].sxfer.hw);
      V(s->xfers[x].owner == o && s->xfers[x].oprev == pp);
    }
    V(cnt == ow->nxfers);
    owned += cnt;
  }
  V(owned == fifo_all);
  return true;
}

uint32_t kvs__store_key_shard(const kvs_store_t *s, kvs_key_t key) { return key_shard(s, key); }

bool kvs__store_is_valid(kvs_store_t *s) {
  if (!s) return false;
  lock_everything(s);
  bool ok = valid_locked(s);
  unlock_everything(s);
  return ok;
}
