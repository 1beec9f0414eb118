/* kvshim store: see store.h (design §4).
 *
 * Tables. Every table is an array in one anonymous mapping made at create time (pages are
 * backed lazily, on first use); index 0 of each is the nil sentinel, so zero-filled memory is
 * an empty list everywhere. Free slots are kept on a stack per table; slots never handed out
 * yet lie above the table's high-water mark (so a large, unused table costs no memory). When
 * the tables take LARGE_TABLES or more (the store is "large": its tables can outgrow the
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
 * Lists (all intrusive, by index, guarded by store->lock):
 *   LRU:    READY objects with pins == 0, least recently used at the head. lru_bytes = sum of
 *           their extents.
 *   FIFO:   live transfers in creation order; created_ms is non-decreasing along it, and every
 *           lease has the same length, so the expired ones are a prefix (sweep is O(expired)).
 *   owner:  each owner's live transfers (owner release is O(its leases)).
 *   xfer:   a write transfer's objects (obj->xnext, newest first); a read transfer's pins in
 *           lookup order (doubly linked so release can walk it backwards).
 *   object: its key entries (kent->onext), primary first.
 *
 * Invariants (kvs__store_is_valid):
 *   used + reserved + pool free == arena;  used = sum ext_len(READY), reserved = sum(WRITING)
 *   ext_len == kvs_pool_extent_len(off) for every object; len == kvs_layout_nbytes(layout)
 *   a key maps to at most one entry; every bound entry's object is live; a READY object's
 *   entries are all bound; a WRITING object's primary is bound and its aliases are not
 *   obj in LRU <=> READY && pins == 0;  obj->pins == pin entries naming it; pins => READY
 *   every WRITING object belongs to exactly one live write transfer
 *
 * Lock order: store->lock, then the pool's arena mutex (kvs_pool_alloc/free under the store
 * lock are bookkeeping only). Nothing under store->lock copies payload, allocates, sleeps or
 * makes a syscall; a pool error found under it is logged after unlocking. */
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

enum { OBJ_FREE = 0, OBJ_WRITING = 1, OBJ_READY = 2 };
enum { XF_FREE = 0, XF_WRITE = 1, XF_READ = 2 };

typedef struct obj {
  uint64_t off;      /* segment offset of the extent */
  uint64_t len;      /* layout bytes (what views report) */
  uint64_t ext_len;  /* the extent's real, page-rounded length (what the accounting counts) */
  uint64_t epoch;    /* reserve call that found it PRESENT: that call may not evict it */
  uint32_t state;    /* OBJ_* */
  uint32_t pins;     /* pin entries naming this object */
  uint32_t keys;     /* head of its key entry list (primary first) */
  uint32_t lru_prev, lru_next;
  uint32_t xfer;     /* WRITING: slot of its write transfer */
  uint32_t xnext;    /* WRITING: next object of the same write transfer */
  uint32_t mark;     /* validator scratch */
  kvs_layout_t layout;
} obj_t;

typedef struct kent {
  kvs_key_t key;
  uint32_t obj;      /* NIL when the entry is free */
  uint32_t hnext;    /* hash chain */
  uint32_t onext;    /* next key of the same object */
  uint16_t bound;    /* in the hash table */
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
  uint64_t created_ms;  /* non-decreasing along the FIFO */
  uint32_t kind;        /* XF_* */
  uint32_t owner;       /* owner slot */
  uint32_t fprev, fnext;
  uint32_t oprev, onext;
  uint32_t head, tail;  /* WRITE: objects (tail unused); READ: pins */
  uint32_t count;       /* objects or pins */
  uint32_t mark;        /* validator scratch */
} xfer_t;

typedef struct owner {
  uint64_t gen;      /* id = gen << SLOT_BITS | slot */
  uint32_t open;
  uint32_t xhead;    /* its live transfers */
  uint32_t nxfers;
} owner_t;

/* A hash bucket: the head of its chain, and the head key's fingerprint with a bit saying
 * whether the chain holds more than the head, so that a key absent from a large table costs
 * one cache miss (the bucket) instead of two (the bucket, then the head's entry). */
typedef struct bucket {
  uint32_t head; /* first bound key entry, or NIL */
  uint32_t tag;  /* fingerprint(head key) << 1 | (head->hnext != NIL); 0 when empty */
} bucket_t;

/* Slot allocator: slots 1..cap; a stack of freed slots, and those above hw never used. */
typedef struct slots {
  uint32_t cap, hw, nfree;
  uint32_t *stack;
} slots_t;

struct kvs_store {
  pthread_mutex_t lock;
  /* set at create, read-only after */
  kvs_pool_t *pool;
  kvs_stats_t *stats;
  uint64_t arena_bytes;
  uint32_t page_size;
  bool large;             /* tables of LARGE_TABLES or more: prefetching */
  uint32_t lease_ms;
  uint32_t hmask;
  void *map;
  size_t map_len;
  obj_t *objs;
  kent_t *kents;
  bucket_t *buckets;
  pin_t *pins;
  xfer_t *xfers;
  owner_t *owners;
  /* guarded by lock */
  slots_t sobj, skey, spin, sxfer, sowner;
  uint64_t used, reserved; /* bytes: extents of READY / WRITING objects */
  uint64_t lru_bytes;      /* bytes: extents of objects in the LRU */
  uint64_t epoch;          /* reserve calls so far */
  uint32_t nready, nwriting, nkeys, npins;
  uint32_t lru_head, lru_tail;
  uint32_t fifo_head, fifo_tail;
  int pool_err;            /* unexpected pool error seen under the lock; logged after it */
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

static inline uint32_t slot_of(uint64_t id) { return (uint32_t)(id & SLOT_MASK); }
static inline uint64_t gen_of(uint64_t id) { return id >> SLOT_BITS; }
static inline uint64_t make_id(uint64_t gen, uint32_t slot) {
  return (gen << SLOT_BITS) | slot;
}

static inline uint32_t slots_get(slots_t *sl) {
  if (sl->nfree) return sl->stack[--sl->nfree];
  if (sl->hw < sl->cap) return ++sl->hw;
  return NIL;
}
static inline void slots_put(slots_t *sl, uint32_t i) { sl->stack[sl->nfree++] = i; }
static inline uint32_t slots_live(const slots_t *sl) { return sl->hw - sl->nfree; }

static inline uint64_t free_bytes(const kvs_store_t *s) {
  return s->arena_bytes - s->used - s->reserved;
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
/* The bucket index takes the hash's low bits, the fingerprint its high 31. */
static inline bucket_t *bucket_at(const kvs_store_t *s, uint64_t h) {
  return &s->buckets[(uint32_t)h & s->hmask];
}
static inline uint32_t fp_of(uint64_t h) { return (uint32_t)(h >> 33); }
/* A bucket's tag for a chain headed by entry `head` (NIL: 0). */
static inline uint32_t tag_of(const kvs_store_t *s, uint32_t head) {
  if (head == NIL) return 0;
  const kent_t *ke = &s->kents[head];
  return fp_of(key_hash(ke->key)) << 1 | (ke->hnext != NIL);
}

/* Warm the buckets of the first keys of a call before taking the lock: with a large table
 * the bucket load is the cycle's main cache miss (bench-core, 1M objects). buckets and hmask
 * are read-only after create; a prefetch has no effect on correctness. */
#define PREFETCH_KEYS 16u
static inline void prefetch_keys(const kvs_store_t *s, const kvs_key_t *keys, size_t n) {
  if (!s->large) return; /* small tables stay in the cache: a prefetch is pure cost there */
  for (size_t i = 0; i < n && i < PREFETCH_KEYS; i++)
    __builtin_prefetch(bucket_at(s, key_hash(keys[i])));
}

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

static void key_bind(kvs_store_t *s, uint32_t e) {
  kent_t *ke = &s->kents[e];
  uint64_t h = key_hash(ke->key);
  bucket_t *b = bucket_at(s, h);
  ke->hnext = b->head;
  b->head = e;
  b->tag = fp_of(h) << 1 | (ke->hnext != NIL);
  ke->bound = 1;
  s->nkeys++;
}

static void key_unbind(kvs_store_t *s, uint32_t e) {
  kent_t *ke = &s->kents[e];
  bucket_t *b = bucket_at(s, key_hash(ke->key));
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
  s->nkeys--;
}

static void kent_free(kvs_store_t *s, uint32_t e) {
  memset(&s->kents[e], 0, sizeof s->kents[e]);
  slots_put(&s->skey, e);
}

/* ---- LRU ------------------------------------------------------------------------------- */

static void lru_push_tail(kvs_store_t *s, uint32_t i) {
  obj_t *o = &s->objs[i];
  o->lru_prev = s->lru_tail;
  o->lru_next = NIL;
  if (s->lru_tail) s->objs[s->lru_tail].lru_next = i;
  else s->lru_head = i;
  s->lru_tail = i;
  s->lru_bytes += o->ext_len;
}

static void lru_remove(kvs_store_t *s, uint32_t i) {
  obj_t *o = &s->objs[i];
  if (o->lru_prev) s->objs[o->lru_prev].lru_next = o->lru_next;
  else s->lru_head = o->lru_next;
  if (o->lru_next) s->objs[o->lru_next].lru_prev = o->lru_prev;
  else s->lru_tail = o->lru_prev;
  o->lru_prev = o->lru_next = NIL;
  s->lru_bytes -= o->ext_len;
}

/* ---- objects --------------------------------------------------------------------------- */

/* Delete a READY unpinned or a WRITING object: unbind all its keys, free its extent. */
static void obj_delete(kvs_store_t *s, uint32_t i) {
  obj_t *o = &s->objs[i];
  if (o->state == OBJ_READY) {
    lru_remove(s, i); /* callers never delete a pinned object */
    s->used -= o->ext_len;
    s->nready--;
  } else {
    s->reserved -= o->ext_len;
    s->nwriting--;
  }
  for (uint32_t e = o->keys, next; e != NIL; e = next) {
    next = s->kents[e].onext;
    if (s->kents[e].bound) key_unbind(s, e);
    kent_free(s, e);
  }
  int64_t r = kvs_pool_free(s->pool, KVS_ARENA_CACHE, o->off);
  if (r != (int64_t)o->ext_len) s->pool_err = r < 0 ? (int)r : -EIO;
  memset(o, 0, sizeof *o);
  slots_put(&s->sobj, i);
}

/* Evict the least recently used READY unpinned object, unless it is protected by the running
 * reservation call (then everything after it is too: protected objects sit at the tail). */
static bool evict_one(kvs_store_t *s) {
  uint32_t i = s->lru_head;
  if (i == NIL || s->objs[i].epoch == s->epoch) return false;
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
  obj_delete(s, i);
  kvs_stats_inc(s->stats, KVS_STAT_store_evictions);
  kvs_stats_add(s->stats, KVS_STAT_store_evicted_bytes, bytes);
  return true;
}

static uint32_t slot_get_evicting(kvs_store_t *s, slots_t *sl, unsigned mode) {
  for (;;) {
    uint32_t i = slots_get(sl);
    if (i != NIL) return i;
    if ((mode & KVS_RESERVE_NO_EVICT) || !evict_one(s)) return NIL;
  }
}

static int alloc_extent(kvs_store_t *s, uint64_t nbytes, uint64_t rounded, unsigned mode,
                        uint64_t *off, uint64_t *ext_len) {
  (void)nbytes; /* checked against the pool in debug builds */
  for (;;) {
    int rc = kvs_pool_alloc(s->pool, KVS_ARENA_CACHE, nbytes, off);
    if (rc == 0) {
      /* The pool hands out exactly the page-rounded length (pool.h); debug builds ask it. */
#ifdef KVSHIM_DEBUG
      int64_t len = kvs_pool_extent_len(s->pool, KVS_ARENA_CACHE, *off);
      if (kvs__unlikely(len != (int64_t)rounded)) {
        s->pool_err = len < 0 ? (int)len : -EIO;
        (void)kvs_pool_free(s->pool, KVS_ARENA_CACHE, *off);
        return -EIO;
      }
#endif
      *ext_len = rounded;
      return 0;
    }
    if (rc != -ENOSPC) {
      s->pool_err = rc;
      return rc;
    }
    /* Evict only when it can help: never empty the cache for a request it cannot serve. */
    if ((mode & KVS_RESERVE_NO_EVICT) || free_bytes(s) + s->lru_bytes < rounded) return rc;
    if (!evict_one(s)) return rc;
  }
}

/* ---- transfers ------------------------------------------------------------------------- */

static uint32_t xfer_new(kvs_store_t *s, uint32_t owner, uint32_t kind, uint64_t now_ms) {
  uint32_t x = slots_get(&s->sxfer);
  if (x == NIL) return NIL;
  xfer_t *xf = &s->xfers[x];
  uint64_t gen = (xf->gen + 1) & GEN_MASK;
  memset(xf, 0, sizeof *xf);
  xf->gen = gen;
  xf->kind = kind;
  xf->owner = owner;
  /* Keep the FIFO sorted by creation time even when a later clock reading won the lock. */
  uint64_t last = s->fifo_tail ? s->xfers[s->fifo_tail].created_ms : 0;
  xf->created_ms = now_ms > last ? now_ms : last;
  xf->fprev = s->fifo_tail;
  if (s->fifo_tail) s->xfers[s->fifo_tail].fnext = x;
  else s->fifo_head = x;
  s->fifo_tail = x;
  owner_t *ow = &s->owners[owner];
  xf->onext = ow->xhead;
  if (ow->xhead) s->xfers[ow->xhead].oprev = x;
  ow->xhead = x;
  ow->nxfers++;
  return x;
}

/* Take a transfer off every list and free its slot (its objects/pins are already handled). */
static void xfer_unlink(kvs_store_t *s, uint32_t x) {
  xfer_t *xf = &s->xfers[x];
  if (xf->fprev) s->xfers[xf->fprev].fnext = xf->fnext;
  else s->fifo_head = xf->fnext;
  if (xf->fnext) s->xfers[xf->fnext].fprev = xf->fprev;
  else s->fifo_tail = xf->fprev;
  owner_t *ow = &s->owners[xf->owner];
  if (xf->oprev) s->xfers[xf->oprev].onext = xf->onext;
  else ow->xhead = xf->onext;
  if (xf->onext) s->xfers[xf->onext].oprev = xf->oprev;
  ow->nxfers--;
  uint64_t gen = xf->gen;
  memset(xf, 0, sizeof *xf);
  xf->gen = gen;
  slots_put(&s->sxfer, x);
}

static void xfer_add_object(kvs_store_t *s, uint32_t x, uint32_t oi) {
  s->objs[oi].xfer = x;
  s->objs[oi].xnext = s->xfers[x].head;
  s->xfers[x].head = oi;
  s->xfers[x].count++;
}

/* Free every object of a write transfer, unpublished. Returns how many. */
static uint32_t xfer_drop_objects(kvs_store_t *s, uint32_t x) {
  uint32_t n = 0;
  for (uint32_t oi = s->xfers[x].head, next; oi != NIL; oi = next) {
    next = s->objs[oi].xnext;
    obj_delete(s, oi);
    n++;
  }
  s->xfers[x].head = NIL;
  s->xfers[x].count = 0;
  return n;
}

/* Release every pin of a read transfer. Walks backwards so that the first key looked up ends
 * up the most recently used. */
static void xfer_unpin(kvs_store_t *s, uint32_t x) {
  for (uint32_t p = s->xfers[x].tail, prev; p != NIL; p = prev) {
    prev = s->pins[p].prev;
    uint32_t oi = s->pins[p].obj;
    if (--s->objs[oi].pins == 0) lru_push_tail(s, oi);
    memset(&s->pins[p], 0, sizeof s->pins[p]);
    slots_put(&s->spin, p);
    s->npins--;
  }
  s->xfers[x].head = s->xfers[x].tail = NIL;
  s->xfers[x].count = 0;
}

/* End a lease without its owner's consent (owner release, expiry, destroy). */
static void xfer_end(kvs_store_t *s, uint32_t x) {
  if (s->xfers[x].kind == XF_WRITE) {
    uint32_t n = xfer_drop_objects(s, x);
    kvs_stats_add(s->stats, KVS_STAT_store_aborted_objects, n);
  } else {
    xfer_unpin(s, x);
  }
  xfer_unlink(s, x);
}

static int sweep_locked(kvs_store_t *s, uint64_t now_ms) {
  int n = 0;
  while (s->fifo_head != NIL && s->xfers[s->fifo_head].created_ms + s->lease_ms <= now_ms) {
    xfer_end(s, s->fifo_head);
    n++;
  }
  if (n) kvs_stats_add(s->stats, KVS_STAT_store_lease_expired, (uint64_t)n);
  return n;
}

/* ---- id resolution --------------------------------------------------------------------- */

static int owner_resolve(const kvs_store_t *s, kvs_owner_t id, uint32_t *slot) {
  uint32_t o = slot_of(id);
  if (o == NIL || o > s->sowner.hw) return -ENOENT;
  const owner_t *ow = &s->owners[o];
  if (!ow->open || ow->gen != gen_of(id)) return -ENOENT;
  *slot = o;
  return 0;
}

/* A live transfer held by owner slot o; kind XF_FREE accepts either kind. */
static int xfer_resolve(kvs_store_t *s, uint32_t o, kvs_xfer_t id, uint32_t kind,
                        uint32_t *slot) {
  uint32_t x = slot_of(id);
  if (x == NIL || x > s->sxfer.hw) return -ENOENT;
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

/* ---- end of every mutation ------------------------------------------------------------- */

static bool valid_locked(kvs_store_t *s);

static void publish_gauges(kvs_store_t *s) {
  kvs_stats_set(s->stats, KVS_STAT_store_objects, s->nready);
  kvs_stats_set(s->stats, KVS_STAT_store_keys, s->nkeys);
  kvs_stats_set(s->stats, KVS_STAT_store_used_bytes, s->used);
  kvs_stats_set(s->stats, KVS_STAT_store_reserved_bytes, s->reserved);
  kvs_stats_set(s->stats, KVS_STAT_store_free_bytes, free_bytes(s));
  kvs_stats_set(s->stats, KVS_STAT_store_arena_bytes, s->arena_bytes);
  kvs_stats_set(s->stats, KVS_STAT_store_live_pins, s->npins);
}

/* Publish the gauges, check the whole store in debug builds, unlock, then report any pool
 * error found under the lock (logging is a syscall: never under the lock). */
static void finish(kvs_store_t *s) {
  publish_gauges(s);
  KVS__DEBUG_CHECK(valid_locked(s));
  int err = s->pool_err;
  s->pool_err = 0;
  pthread_mutex_unlock(&s->lock);
  if (kvs__unlikely(err)) kvs_log_error("store: cache arena bookkeeping error %d", err);
}

/* ---- create / destroy ------------------------------------------------------------------ */

static size_t table_bytes(size_t n, size_t each) { return KVS__ALIGN_UP(n * each, (size_t)64); }

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
  /* Buckets: a power of two >= max_keys / 2, 8 bytes each: the bytes of one 4-byte head per
   * key, as before buckets carried fingerprints. */
  uint64_t nb = 1;
  while (2 * nb < mk) nb <<= 1;

  size_t sz_obj = table_bytes(mo + 1, sizeof(obj_t));
  size_t sz_key = table_bytes(mk + 1, sizeof(kent_t));
  size_t sz_bkt = table_bytes(nb, sizeof(bucket_t));
  size_t sz_pin = table_bytes(mp + 1, sizeof(pin_t));
  size_t sz_xf = table_bytes(mx + 1, sizeof(xfer_t));
  size_t sz_ow = table_bytes(mw + 1, sizeof(owner_t));
  size_t sz_stk = table_bytes(mo + mk + mp + mx + mw, sizeof(uint32_t));
  size_t total = sz_obj + sz_key + sz_bkt + sz_pin + sz_xf + sz_ow + sz_stk;
  bool large = total >= LARGE_TABLES;

  kvs_store_t *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  void *map = NULL;
  int rc = kvs__prim_alloc(total, &map);
  if (rc < 0) {
    free(s);
    return rc;
  }
  /* Adaptive: a contended lock spins briefly before it sleeps. Every critical section is
   * short and makes no syscall (see "Threads" in store.h), so a waiter usually gets the lock
   * within the spin; a plain mutex parks it in the kernel, and with two threads cycling the
   * futex wake-ups cost more than the work (bench-core, 2 threads). */
  pthread_mutexattr_t ma;
  rc = pthread_mutexattr_init(&ma);
  if (rc == 0) {
    (void)pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
    rc = pthread_mutex_init(&s->lock, &ma);
    pthread_mutexattr_destroy(&ma);
  }
  if (rc) {
    kvs__prim_unmap(map, total);
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
  s->sobj = (slots_t){(uint32_t)mo, 0, 0, stk}, stk += mo;
  s->skey = (slots_t){(uint32_t)mk, 0, 0, stk}, stk += mk;
  s->spin = (slots_t){(uint32_t)mp, 0, 0, stk}, stk += mp;
  s->sxfer = (slots_t){(uint32_t)mx, 0, 0, stk}, stk += mx;
  s->sowner = (slots_t){(uint32_t)mw, 0, 0, stk};
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

  pthread_mutex_lock(&s->lock);
  finish(s);
  *out = s;
  return 0;
}

int kvs_store_destroy(kvs_store_t *s, bool force) {
  if (!s) return 0;
  pthread_mutex_lock(&s->lock);
  if (slots_live(&s->sxfer) && !force) {
    pthread_mutex_unlock(&s->lock);
    return -EBUSY;
  }
  while (s->fifo_head != NIL) xfer_end(s, s->fifo_head);
  while (s->lru_head != NIL) obj_delete(s, s->lru_head);
  finish(s);
  pthread_mutex_destroy(&s->lock);
  kvs__prim_unmap(s->map, s->map_len);
#ifdef KVSHIM_DEBUG
  memset(s, 0xdb, sizeof *s);
#endif
  free(s);
  return 0;
}

kvs_pool_t *kvs_store_pool(const kvs_store_t *s) { return s ? s->pool : NULL; }
uint32_t kvs_store_lease_ms(const kvs_store_t *s) { return s ? s->lease_ms : 0; }

/* ---- owners ---------------------------------------------------------------------------- */

int kvs_store_owner_open(kvs_store_t *s, kvs_owner_t *out) {
  if (!s || !out) return -EINVAL;
  pthread_mutex_lock(&s->lock);
  uint32_t o = slots_get(&s->sowner);
  if (o == NIL) {
    pthread_mutex_unlock(&s->lock);
    return -ENOSPC;
  }
  owner_t *ow = &s->owners[o];
  ow->gen = (ow->gen + 1) & GEN_MASK;
  if (ow->gen == 0) ow->gen = 1;
  ow->open = 1;
  ow->xhead = NIL;
  ow->nxfers = 0;
  *out = make_id(ow->gen, o);
  finish(s);
  return 0;
}

int kvs_store_owner_release(kvs_store_t *s, kvs_owner_t owner) {
  if (!s) return -EINVAL;
  pthread_mutex_lock(&s->lock);
  uint32_t o;
  int rc = owner_resolve(s, owner, &o);
  if (rc < 0) {
    pthread_mutex_unlock(&s->lock);
    return rc;
  }
  int n = 0;
  while (s->owners[o].xhead != NIL) {
    xfer_end(s, s->owners[o].xhead);
    n++;
  }
  if (o != LOCAL_SLOT) {
    s->owners[o].open = 0;
    slots_put(&s->sowner, o);
  }
  kvs_stats_inc(s->stats, KVS_STAT_store_owner_releases);
  finish(s);
  return n;
}

/* ---- reservations ---------------------------------------------------------------------- */

/* Reserve one object for key under write transfer x (primary key bound now). */
static uint8_t reserve_key(kvs_store_t *s, uint32_t x, kvs_key_t key, const kvs_layout_t *l,
                           uint64_t nbytes, uint64_t rounded, unsigned mode, uint32_t *oi_out,
                           kvs_extent_t *ext) {
  uint32_t e = key_find(s, key);
  if (e != NIL) {
    obj_t *o = &s->objs[s->kents[e].obj];
    if (o->state != OBJ_READY) return KVS_RES_BUSY;
    /* The caller is told "nothing to write": this call must not evict it. */
    o->epoch = s->epoch;
    if (o->pins == 0) {
      uint32_t oi = s->kents[e].obj;
      lru_remove(s, oi);
      lru_push_tail(s, oi);
    }
    return KVS_RES_PRESENT;
  }
  uint32_t oi = slot_get_evicting(s, &s->sobj, mode);
  if (oi == NIL) return KVS_RES_NO_SPACE;
  uint32_t ki = slot_get_evicting(s, &s->skey, mode);
  if (ki == NIL) {
    slots_put(&s->sobj, oi);
    return KVS_RES_NO_SPACE;
  }
  uint64_t off = 0, ext_len = 0;
  if (alloc_extent(s, nbytes, rounded, mode, &off, &ext_len) < 0) {
    slots_put(&s->skey, ki);
    slots_put(&s->sobj, oi);
    return KVS_RES_NO_SPACE;
  }
  obj_t *o = &s->objs[oi];
  memset(o, 0, sizeof *o);
  o->off = off;
  o->len = nbytes;
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
  s->reserved += ext_len;
  s->nwriting++;
  ext->offset = off;
  ext->length = nbytes;
  *oi_out = oi;
  return KVS_RES_RESERVED;
}

/* The outcome every key gets regardless of its state, or RESERVED when the layout is fine. */
static uint8_t layout_outcome(const kvs_store_t *s, const kvs_layout_t *l, uint64_t *nbytes,
                              uint64_t *rounded) {
  *nbytes = kvs_layout_nbytes(l);
  if (*nbytes == 0) return KVS_RES_BAD_LAYOUT;
  if (*nbytes > s->arena_bytes) return KVS_RES_TOO_LARGE;
  *rounded = KVS__ALIGN_UP(*nbytes, (uint64_t)s->page_size);
  if (*rounded > s->arena_bytes) return KVS_RES_TOO_LARGE;
  return KVS_RES_RESERVED;
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

/* ALL_OR_NOTHING pre-check, before anything is evicted: the first failing outcome, or
 * RESERVED when the request may succeed. */
static uint8_t all_or_nothing_precheck(kvs_store_t *s, const kvs_key_t *keys, size_t n,
                                       uint64_t rounded, unsigned mode) {
  uint64_t need = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t e = key_find(s, keys[i]);
    if (e == NIL) need += rounded;
    else if (s->objs[s->kents[e].obj].state != OBJ_READY) return KVS_RES_BUSY;
  }
  uint64_t room = free_bytes(s) + ((mode & KVS_RESERVE_NO_EVICT) ? 0 : s->lru_bytes);
  if (need > room) return KVS_RES_NO_SPACE;
  return KVS_RES_RESERVED;
}

static bool is_failure(uint8_t oc) { return oc != KVS_RES_RESERVED && oc != KVS_RES_PRESENT; }

int kvs_store_reserve_write(kvs_store_t *s, kvs_owner_t owner, const kvs_key_t *keys, size_t n,
                            const kvs_layout_t *layout, unsigned mode, uint8_t *outcomes,
                            kvs_extent_t *extents, kvs_xfer_t *xfer) {
  if (!s || !keys || n == 0 || !layout || !outcomes || !extents || !xfer) return -EINVAL;
  prefetch_keys(s, keys, n); /* first: the clock read below overlaps the misses */
  uint64_t now = kvs__now_ms();
  pthread_mutex_lock(&s->lock);
  sweep_locked(s, now);
  uint32_t o;
  int rc = owner_resolve(s, owner, &o);
  if (rc < 0) goto out;
  kvs_stats_inc(s->stats, KVS_STAT_store_reserve_calls);
  uint64_t nbytes = 0, rounded = 0;
  uint8_t fixed = layout_outcome(s, layout, &nbytes, &rounded);
  uint32_t x = NIL;
  if (fixed == KVS_RES_RESERVED) {
    x = xfer_new(s, o, XF_WRITE, now);
    if (x == NIL) {
      rc = -ENOSPC;
      goto out;
    }
  }
  s->epoch++;
  uint8_t fail = KVS_RES_RESERVED;
  if (fixed == KVS_RES_RESERVED && (mode & KVS_RESERVE_ALL_OR_NOTHING))
    fail = all_or_nothing_precheck(s, keys, n, rounded, mode);
  bool pre = fail != KVS_RES_RESERVED; /* failed before reserving anything */
  for (size_t i = 0; i < n; i++) {
    memset(&extents[i], 0, sizeof extents[i]);
    if (fixed != KVS_RES_RESERVED) {
      outcomes[i] = fixed;
      continue;
    }
    if (fail != KVS_RES_RESERVED) { /* pre-check failed: classify without reserving */
      uint32_t e = key_find(s, keys[i]);
      bool ready = e != NIL && s->objs[s->kents[e].obj].state == OBJ_READY;
      outcomes[i] = ready ? KVS_RES_PRESENT
                    : e != NIL ? KVS_RES_BUSY
                    : fail == KVS_RES_NO_SPACE && pre ? KVS_RES_NO_SPACE : KVS_RES_SKIPPED;
      continue;
    }
    uint32_t oi;
    outcomes[i] = reserve_key(s, x, keys[i], layout, nbytes, rounded, mode, &oi, &extents[i]);
    if ((mode & KVS_RESERVE_ALL_OR_NOTHING) && is_failure(outcomes[i])) fail = outcomes[i];
  }
  if (fail != KVS_RES_RESERVED && x != NIL && s->xfers[x].count) { /* roll back */
    xfer_drop_objects(s, x);
    for (size_t i = 0; i < n; i++)
      if (outcomes[i] == KVS_RES_RESERVED) {
        outcomes[i] = KVS_RES_SKIPPED;
        memset(&extents[i], 0, sizeof extents[i]);
      }
  }
  rc = 0;
  if (x != NIL) {
    rc = (int)s->xfers[x].count;
    if (rc == 0) xfer_unlink(s, x);
  }
  *xfer = rc ? make_id(s->xfers[x].gen, x) : 0;
  count_outcomes(s, outcomes, n);
out:
  finish(s);
  return rc;
}

int kvs_store_reserve_object(kvs_store_t *s, kvs_owner_t owner, const kvs_key_t *keys,
                             size_t n_keys, const kvs_layout_t *layout, unsigned mode,
                             uint8_t *outcome, kvs_extent_t *extent, kvs_xfer_t *xfer) {
  if (!s || !keys || n_keys == 0 || !layout || !outcome || !extent || !xfer) return -EINVAL;
  prefetch_keys(s, keys, n_keys);
  uint64_t now = kvs__now_ms();
  pthread_mutex_lock(&s->lock);
  sweep_locked(s, now);
  uint32_t o;
  int rc = owner_resolve(s, owner, &o);
  if (rc < 0) goto out;
  kvs_stats_inc(s->stats, KVS_STAT_store_reserve_calls);
  uint64_t nbytes = 0, rounded = 0;
  uint8_t oc = layout_outcome(s, layout, &nbytes, &rounded);
  kvs_extent_t ext = {0, 0};
  uint32_t x = NIL;
  if (oc == KVS_RES_RESERVED) {
    x = xfer_new(s, o, XF_WRITE, now);
    if (x == NIL) {
      rc = -ENOSPC;
      goto out;
    }
    s->epoch++;
    uint32_t oi;
    oc = reserve_key(s, x, keys[0], layout, nbytes, rounded, mode, &oi, &ext);
    if (oc == KVS_RES_RESERVED) {
      /* Aliases wait unbound behind the primary; commit binds those still free. */
      uint32_t tail = s->objs[oi].keys;
      uint64_t skipped = 0;
      for (size_t i = 1; i < n_keys; i++) {
        uint32_t ki = slot_get_evicting(s, &s->skey, mode);
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
      if (skipped) kvs_stats_add(s->stats, KVS_STAT_store_alias_skipped, skipped);
    } else {
      xfer_unlink(s, x);
      x = NIL;
    }
  }
  *outcome = oc;
  *extent = ext;
  *xfer = x != NIL ? make_id(s->xfers[x].gen, x) : 0;
  count_outcomes(s, outcome, 1);
  rc = x != NIL;
out:
  finish(s);
  return rc;
}

/* ---- commit / abort / release ---------------------------------------------------------- */

int kvs_store_commit(kvs_store_t *s, kvs_owner_t owner, kvs_xfer_t xfer) {
  if (!s) return -EINVAL;
  pthread_mutex_lock(&s->lock);
  uint32_t o, x;
  int rc = owner_resolve(s, owner, &o);
  if (rc == 0) rc = xfer_resolve(s, o, xfer, XF_WRITE, &x);
  if (rc < 0) {
    pthread_mutex_unlock(&s->lock);
    return rc;
  }
  uint64_t n = 0, skipped = 0;
  /* The list is newest first: the batch's first key is pushed to the LRU tail last. */
  for (uint32_t oi = s->xfers[x].head, next; oi != NIL; oi = next) {
    obj_t *ob = &s->objs[oi];
    next = ob->xnext;
    for (uint32_t *link = &s->kents[ob->keys].onext; *link != NIL;) {
      uint32_t e = *link;
      if (!s->kents[e].bound && key_find(s, s->kents[e].key) != NIL) {
        *link = s->kents[e].onext; /* alias taken meanwhile: skip it */
        kent_free(s, e);
        skipped++;
        continue;
      }
      if (!s->kents[e].bound) key_bind(s, e);
      link = &s->kents[e].onext;
    }
    ob->state = OBJ_READY;
    ob->xfer = ob->xnext = NIL;
    s->reserved -= ob->ext_len;
    s->used += ob->ext_len;
    s->nwriting--;
    s->nready++;
    lru_push_tail(s, oi);
    n++;
  }
  s->xfers[x].head = NIL;
  s->xfers[x].count = 0;
  xfer_unlink(s, x);
  kvs_stats_inc(s->stats, KVS_STAT_store_commits);
  kvs_stats_add(s->stats, KVS_STAT_store_committed_objects, n);
  if (skipped) kvs_stats_add(s->stats, KVS_STAT_store_alias_skipped, skipped);
  finish(s);
  return 0;
}

int kvs_store_abort(kvs_store_t *s, kvs_owner_t owner, kvs_xfer_t xfer) {
  if (!s) return -EINVAL;
  pthread_mutex_lock(&s->lock);
  uint32_t o, x;
  int rc = owner_resolve(s, owner, &o);
  if (rc == 0) rc = xfer_resolve(s, o, xfer, XF_FREE, &x);
  if (rc < 0) {
    pthread_mutex_unlock(&s->lock);
    return rc;
  }
  if (s->xfers[x].kind == XF_WRITE) {
    uint32_t n = xfer_drop_objects(s, x);
    kvs_stats_inc(s->stats, KVS_STAT_store_aborts);
    kvs_stats_add(s->stats, KVS_STAT_store_aborted_objects, n);
  } else {
    xfer_unpin(s, x);
    kvs_stats_inc(s->stats, KVS_STAT_store_releases);
  }
  xfer_unlink(s, x);
  finish(s);
  return 0;
}

int kvs_store_release(kvs_store_t *s, kvs_owner_t owner, kvs_xfer_t xfer) {
  if (!s) return -EINVAL;
  pthread_mutex_lock(&s->lock);
  uint32_t o, x;
  int rc = owner_resolve(s, owner, &o);
  if (rc == 0) rc = xfer_resolve(s, o, xfer, XF_READ, &x);
  if (rc < 0) {
    pthread_mutex_unlock(&s->lock);
    return rc;
  }
  xfer_unpin(s, x);
  xfer_unlink(s, x);
  kvs_stats_inc(s->stats, KVS_STAT_store_releases);
  finish(s);
  return 0;
}

/* ---- lookups --------------------------------------------------------------------------- */

int kvs_store_lookup(kvs_store_t *s, kvs_owner_t owner, const kvs_key_t *keys, size_t n,
                     bool pin, kvs_xfer_t *xfer) {
  if (!s || !keys || n == 0 || (pin && !xfer)) return -EINVAL;
  prefetch_keys(s, keys, n);
  uint64_t now = pin ? kvs__now_ms() : 0;
  pthread_mutex_lock(&s->lock);
  uint32_t o;
  int rc = owner_resolve(s, owner, &o);
  if (rc < 0) {
    pthread_mutex_unlock(&s->lock);
    return rc;
  }
  uint32_t x = NIL;
  if (pin && (x = xfer_new(s, o, XF_READ, now)) == NIL) {
    pthread_mutex_unlock(&s->lock);
    return -ENOSPC;
  }
  size_t run = 0;
  for (; run < n; run++) {
    uint32_t e = key_find(s, keys[run]);
    if (e == NIL) break;
    uint32_t oi = s->kents[e].obj;
    obj_t *ob = &s->objs[oi];
    if (ob->state != OBJ_READY) break;
    if (!pin) continue;
    uint32_t p = slots_get(&s->spin);
    if (p == NIL) break;
    xfer_t *xf = &s->xfers[x];
    pin_t *pe = &s->pins[p];
    pe->key = keys[run];
    pe->obj = oi;
    pe->next = NIL;
    pe->prev = xf->tail;
    if (xf->tail) s->pins[xf->tail].next = p;
    else xf->head = p;
    xf->tail = p;
    xf->count++;
    s->npins++;
    if (ob->pins++ == 0) lru_remove(s, oi);
  }
  if (pin) {
    if (run == 0) xfer_unlink(s, x);
    *xfer = run ? make_id(s->xfers[x].gen, x) : 0;
    if (run) kvs_stats_add(s->stats, KVS_STAT_store_pins, run);
  }
  kvs_stats_inc(s->stats, KVS_STAT_store_lookups);
  kvs_stats_add(s->stats, KVS_STAT_store_lookup_keys, n);
  if (run) kvs_stats_add(s->stats, KVS_STAT_store_hits, run);
  if (run < n) kvs_stats_inc(s->stats, KVS_STAT_store_misses);
  if (pin) finish(s);
  else pthread_mutex_unlock(&s->lock);
  return (int)(run > INT32_MAX ? INT32_MAX : run);
}

int kvs_store_read_pinned(kvs_store_t *s, kvs_owner_t owner, kvs_xfer_t xfer,
                          kvs_object_view_t *views, size_t cap) {
  if (!s || (!views && cap)) return -EINVAL;
  pthread_mutex_lock(&s->lock);
  uint32_t o, x;
  int rc = owner_resolve(s, owner, &o);
  if (rc == 0) rc = xfer_resolve(s, o, xfer, XF_READ, &x);
  if (rc < 0) {
    pthread_mutex_unlock(&s->lock);
    return rc;
  }
  size_t i = 0;
  for (uint32_t p = s->xfers[x].head; p != NIL && i < cap; p = s->pins[p].next, i++) {
    const obj_t *ob = &s->objs[s->pins[p].obj];
    views[i].key = s->pins[p].key;
    views[i].extent.offset = ob->off;
    views[i].extent.length = ob->len;
    views[i].layout = ob->layout;
  }
  rc = (int)s->xfers[x].count;
  pthread_mutex_unlock(&s->lock);
  return rc;
}

int kvs_store_remove(kvs_store_t *s, const kvs_key_t *key) {
  if (!s || !key) return -EINVAL;
  pthread_mutex_lock(&s->lock);
  uint32_t e = key_find(s, *key);
  int rc = 0;
  if (e == NIL) {
    rc = -ENOENT;
  } else {
    uint32_t oi = s->kents[e].obj;
    if (s->objs[oi].state != OBJ_READY || s->objs[oi].pins) {
      rc = -EBUSY;
    } else {
      obj_delete(s, oi);
      kvs_stats_inc(s->stats, KVS_STAT_store_removed);
    }
  }
  if (rc < 0) pthread_mutex_unlock(&s->lock);
  else finish(s);
  return rc;
}

int kvs_store_sweep(kvs_store_t *s, uint64_t now_ms) {
  if (!s) return -EINVAL;
  pthread_mutex_lock(&s->lock);
  int n = sweep_locked(s, now_ms);
  finish(s);
  return n;
}

void kvs_store_info(kvs_store_t *s, kvs_store_info_t *out) {
  if (!s || !out) return;
  kvs_pool_arena_stats_t st;
  memset(&st, 0, sizeof st);
  pthread_mutex_lock(&s->lock);
  (void)kvs_pool_arena_stats(s->pool, KVS_ARENA_CACHE, &st);
  out->arena_bytes = s->arena_bytes;
  out->used_bytes = s->used;
  out->reserved_bytes = s->reserved;
  out->free_bytes = free_bytes(s);
  out->objects_ready = s->nready;
  out->objects_writing = s->nwriting;
  out->keys = s->nkeys;
  out->pins = s->npins;
  out->xfers = slots_live(&s->sxfer);
  out->owners = slots_live(&s->sowner);
  out->fragmentation_pct = st.fragmentation_pct;
  pthread_mutex_unlock(&s->lock);
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

/* Check a slot table's free stack: entries in range, free, no duplicates (mark). */
#define V_SLOTS(sl, tbl, is_free)                                                             \
  do {                                                                                        \
    V((sl).nfree <= (sl).hw && (sl).hw <= (sl).cap);                                          \
    for (uint32_t i_ = 1; i_ <= (sl).hw; i_++) (tbl)[i_].mark = 0;                            \
    for (uint32_t k_ = 0; k_ < (sl).nfree; k_++) {                                            \
      uint32_t i_ = (sl).stack[k_];                                                           \
      V(i_ >= 1 && i_ <= (sl).hw);                                                            \
      V(is_free(&(tbl)[i_]));                                                                 \
      V((tbl)[i_].mark == 0);                                                                 \
      (tbl)[i_].mark = 1;                                                                     \
    }                                                                                         \
    uint32_t nf_ = 0;                                                                         \
    for (uint32_t i_ = 1; i_ <= (sl).hw; i_++) nf_ += is_free(&(tbl)[i_]);                    \
    V(nf_ == (sl).nfree);                                                                     \
  } while (0)

static inline bool obj_is_free(const obj_t *o) { return o->state == OBJ_FREE; }
static inline bool kent_is_free(const kent_t *k) { return k->obj == NIL; }
static inline bool pin_is_free(const pin_t *p) { return p->obj == NIL; }
static inline bool xfer_is_free(const xfer_t *x) { return x->kind == XF_FREE; }

static bool valid_locked(kvs_store_t *s) {
  V_SLOTS(s->sobj, s->objs, obj_is_free);
  V_SLOTS(s->skey, s->kents, kent_is_free);
  V_SLOTS(s->spin, s->pins, pin_is_free);
  V_SLOTS(s->sxfer, s->xfers, xfer_is_free);
  V(s->sowner.nfree <= s->sowner.hw && s->sowner.hw <= s->sowner.cap && s->sowner.hw >= 1);
  for (uint32_t k = 0; k < s->sowner.nfree; k++) {
    uint32_t o = s->sowner.stack[k];
    V(o > LOCAL_SLOT && o <= s->sowner.hw && !s->owners[o].open);
  }
  uint32_t nclosed = 0;
  for (uint32_t o = 1; o <= s->sowner.hw; o++) nclosed += !s->owners[o].open;
  V(nclosed == s->sowner.nfree);
  V(s->owners[LOCAL_SLOT].open && s->owners[LOCAL_SLOT].gen == 0);

  /* objects and their keys */
  uint64_t used = 0, reserved = 0, lru_expect = 0;
  uint32_t nready = 0, nwriting = 0, nbound = 0, nkent = 0;
  for (uint32_t i = 1; i <= s->sobj.hw; i++) {
    obj_t *o = &s->objs[i];
    o->mark = 0; /* from here on: pin entries naming it */
    if (o->state == OBJ_FREE) continue;
    V(o->state == OBJ_WRITING || o->state == OBJ_READY);
    V(o->len == kvs_layout_nbytes(&o->layout) && o->len > 0 && o->len <= o->ext_len);
    V((int64_t)o->ext_len == kvs_pool_extent_len(s->pool, KVS_ARENA_CACHE, o->off));
    V(kvs_pool_arena_of(s->pool, o->off, o->ext_len) == KVS_ARENA_CACHE);
    V(o->keys != NIL);
    bool primary = true;
    for (uint32_t e = o->keys, hops = 0; e != NIL; e = s->kents[e].onext, primary = false) {
      V(++hops <= s->skey.hw);
      const kent_t *ke = &s->kents[e];
      V(ke->obj == i);
      nkent++;
      if (o->state == OBJ_READY || primary) V(ke->bound);
      else V(!ke->bound);
      if (ke->bound) {
        V(key_find(s, ke->key) == e);
        nbound++;
      }
    }
    if (o->state == OBJ_READY) {
      used += o->ext_len;
      nready++;
      if (o->pins == 0) lru_expect++;
      V(o->xfer == NIL && o->xnext == NIL);
    } else {
      reserved += o->ext_len;
      nwriting++;
      V(o->pins == 0);
      V(o->xfer >= 1 && o->xfer <= s->sxfer.hw && s->xfers[o->xfer].kind == XF_WRITE);
    }
  }
  V(used == s->used && reserved == s->reserved);
  V(nready == s->nready && nwriting == s->nwriting);
  V(nready + nwriting == slots_live(&s->sobj));
  V(nkent == slots_live(&s->skey) && nbound == s->nkeys);
  for (uint32_t e = 1; e <= s->skey.hw; e++) {
    const kent_t *ke = &s->kents[e];
    if (ke->obj == NIL) V(!ke->bound);
    else if (!ke->bound) V(key_find(s, ke->key) != e);
    const bucket_t *b = bucket_at(s, key_hash(ke->key));
    if (ke->bound) V(b->head != NIL && s->kents[b->head].bound);
    if (ke->bound && b->head == e) V(b->tag == tag_of(s, e)); /* fingerprint, chain bit */
  }

  /* pool accounting: the invariant of store.h */
  kvs_pool_arena_stats_t st;
  V(kvs_pool_arena_stats(s->pool, KVS_ARENA_CACHE, &st) == 0);
  V(st.size == s->arena_bytes);
  V(s->used + s->reserved + st.free == s->arena_bytes);
  V(st.extents == (uint64_t)nready + nwriting);

  /* LRU: exactly the READY unpinned objects */
  uint64_t lru_n = 0, lru_bytes = 0;
  uint32_t prev = NIL;
  for (uint32_t i = s->lru_head; i != NIL; prev = i, i = s->objs[i].lru_next) {
    V(++lru_n <= s->sobj.hw);
    const obj_t *o = &s->objs[i];
    V(o->state == OBJ_READY && o->pins == 0 && o->lru_prev == prev);
    lru_bytes += o->ext_len;
  }
  V(prev == s->lru_tail && lru_n == lru_expect && lru_bytes == s->lru_bytes);

  /* transfers: FIFO order, owner lists, contents */
  uint64_t fifo_n = 0, last_created = 0, wobjs = 0, npins = 0;
  prev = NIL;
  for (uint32_t x = s->fifo_head; x != NIL; prev = x, x = s->xfers[x].fnext) {
    V(++fifo_n <= s->sxfer.hw);
    xfer_t *xf = &s->xfers[x];
    V(xf->kind == XF_WRITE || xf->kind == XF_READ);
    V(xf->fprev == prev && xf->created_ms >= last_created);
    last_created = xf->created_ms;
    V(xf->owner >= 1 && xf->owner <= s->sowner.hw && s->owners[xf->owner].open);
    uint32_t cnt = 0;
    if (xf->kind == XF_WRITE) {
      for (uint32_t oi = xf->head; oi != NIL; oi = s->objs[oi].xnext) {
        V(++cnt <= s->sobj.hw);
        V(s->objs[oi].state == OBJ_WRITING && s->objs[oi].xfer == x);
      }
      wobjs += cnt;
    } else {
      uint32_t pp = NIL;
      for (uint32_t p = xf->head; p != NIL; pp = p, p = s->pins[p].next) {
        V(++cnt <= s->spin.hw);
        V(s->pins[p].prev == pp && s->pins[p].obj != NIL);
        V(s->objs[s->pins[p].obj].state == OBJ_READY);
        s->objs[s->pins[p].obj].mark++;
      }
      V(pp == xf->tail);
      npins += cnt;
    }
    V(cnt == xf->count && cnt > 0);
  }
  V(prev == s->fifo_tail && fifo_n == slots_live(&s->sxfer));
  V(wobjs == nwriting && npins == s->npins && npins == slots_live(&s->spin));
  for (uint32_t i = 1; i <= s->sobj.hw; i++) V(s->objs[i].mark == s->objs[i].pins);

  uint64_t owned = 0;
  for (uint32_t o = 1; o <= s->sowner.hw; o++) {
    const owner_t *ow = &s->owners[o];
    if (!ow->open) {
      V(ow->xhead == NIL && ow->nxfers == 0);
      continue;
    }
    uint32_t cnt = 0, pp = NIL;
    for (uint32_t x = ow->xhead; x != NIL; pp = x, x = s->xfers[x].onext) {
      V(++cnt <= s->sxfer.hw);
      V(s->xfers[x].owner == o && s->xfers[x].oprev == pp);
    }
    V(cnt == ow->nxfers);
    owned += cnt;
  }
  V(owned == fifo_n);
  return true;
}

bool kvs__store_is_valid(kvs_store_t *s) {
  if (!s) return false;
  pthread_mutex_lock(&s->lock);
  bool ok = valid_locked(s);
  pthread_mutex_unlock(&s->lock);
  return ok;
}
