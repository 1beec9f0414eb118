/* runtime/registry: see registry.h. */
#include "registry.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "prim.h"

#define REG_DEFAULT_CAP 65536u
#define REG_MAX_CAP (1u << 22)
#define SLOT_NONE UINT32_MAX

/* Index entry, sorted by base: what add/remove move around. */
typedef struct reg_entry {
  uint64_t base, end; /* [base, end) */
  uint32_t slot;      /* into slots[] */
  uint32_t pad;
} reg_entry_t;
_Static_assert(sizeof(reg_entry_t) == 24, "index entries are small on purpose");

typedef struct reg_slot {
  kvs_tensor_desc_t desc; /* exportable: byte view of the whole record; else zeroed */
  uint32_t next_free;     /* free list link while unused */
  bool exportable;
} reg_slot_t;

/* Invariants (lock held): index[0..n) sorted, index[i].base < index[i].end <= index[i+1].base;
 * each index entry names a distinct slot < hwm; the free list holds the other hwm - n slots;
 * n <= cap. The lock guards every field below it. */
struct kvs_tensor_registry {
  pthread_rwlock_t lock;
  uint32_t cap;
  uint32_t n;          /* records */
  uint32_t hwm;        /* slots [0, hwm) have been used at least once */
  uint32_t free_head;  /* first free slot below hwm, or SLOT_NONE */
  reg_entry_t *index;  /* cap entries (anonymous mapping) */
  reg_slot_t *slots;   /* cap slots (anonymous mapping) */
  size_t index_bytes, slots_bytes;
};

static void *map_table(size_t bytes) {
  void *p = NULL;
  return kvs__prim_alloc(bytes, &p) == 0 ? p : NULL;
}

int kvs_tensor_registry_create(uint32_t max_records, kvs_tensor_registry_t **out) {
  if (!out) return -EINVAL;
  if (max_records == 0) max_records = REG_DEFAULT_CAP;
  if (max_records > REG_MAX_CAP) return -EINVAL;
  kvs_tensor_registry_t *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  r->cap = max_records;
  r->free_head = SLOT_NONE;
  r->index_bytes = (size_t)max_records * sizeof(reg_entry_t);
  r->slots_bytes = (size_t)max_records * sizeof(reg_slot_t);
  r->index = map_table(r->index_bytes);
  r->slots = map_table(r->slots_bytes);
  int rc = pthread_rwlock_init(&r->lock, NULL);
  if (!r->index || !r->slots || rc != 0) {
    kvs__prim_unmap(r->index, r->index_bytes);
    kvs__prim_unmap(r->slots, r->slots_bytes);
    if (rc == 0) pthread_rwlock_destroy(&r->lock);
    free(r);
    return rc ? -rc : -ENOMEM;
  }
  *out = r;
  return 0;
}

void kvs_tensor_registry_destroy(kvs_tensor_registry_t *reg) {
  if (!reg) return;
  kvs__prim_unmap(reg->index, reg->index_bytes);
  kvs__prim_unmap(reg->slots, reg->slots_bytes);
  pthread_rwlock_destroy(&reg->lock);
#ifdef KVSHIM_DEBUG
  memset(reg, 0xa5, sizeof *reg);
#endif
  free(reg);
}

/* First index position whose base is > addr (0..n). */
static uint32_t upper_bound(const kvs_tensor_registry_t *r, uint64_t addr) {
  uint32_t lo = 0, hi = r->n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (r->index[mid].base <= addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Position of the record containing addr, or -1. */
static int64_t find_containing(const kvs_tensor_registry_t *r, uint64_t addr) {
  uint32_t i = upper_bound(r, addr);
  if (i > 0 && addr < r->index[i - 1].end) return (int64_t)i - 1;
  return -1;
}

static bool registry_valid_locked(const kvs_tensor_registry_t *r) {
  if (r->n > r->cap || r->hwm > r->cap || r->n > r->hwm) return false;
  for (uint32_t i = 0; i < r->n; i++) {
    const reg_entry_t *e = &r->index[i];
    if (e->base >= e->end || e->slot >= r->hwm) return false;
    if (i + 1 < r->n && e->end > r->index[i + 1].base) return false;
    const reg_slot_t *s = &r->slots[e->slot];
    if (s->exportable && (s->desc.shape[0] != e->end - e->base ||
                          kvs_tensor_validate(&s->desc, NULL, 0) != 0))
      return false;
  }
  uint32_t free_count = 0;
  for (uint32_t s = r->free_head; s != SLOT_NONE; s = r->slots[s].next_free)
    if (s >= r->hwm || ++free_count > r->hwm) return false;
  return free_count + r->n == r->hwm;
}

bool kvs__tensor_registry_is_valid(kvs_tensor_registry_t *reg) {
  pthread_rwlock_rdlock(&reg->lock);
  bool ok = registry_valid_locked(reg);
  pthread_rwlock_unlock(&reg->lock);
  return ok;
}

/* An allocation size *size left 0 becomes offset + length: 0, or -ERANGE on overflow. */
static int size_or_end(uint64_t *size, uint64_t offset, uint64_t length) {
  if (*size == 0 && __builtin_add_overflow(offset, length, size)) return -ERANGE;
  return 0;
}

/* The byte view of [base, base + length) from a template (see registry.h). */
static int make_view(const kvs_tensor_desc_t *t, uint64_t length, kvs_tensor_desc_t *d) {
  memset(d, 0, sizeof *d);
  d->kind = t->kind;
  d->dtype = KVS_DTYPE_U8;
  d->ndim = 1;
  d->shape[0] = length;
  d->stride[0] = 1;
  memcpy(d->device_uuid, t->device_uuid, KVS_TENSOR_UUID_SIZE);
  /* The template's region, the view's length; a device allocation of unknown size (0) is
   * taken to end where the view does. */
  switch (t->kind) {
  case KVS_TENSOR_CPU_SHM:
    d->cpu = t->cpu;
    d->cpu.length = length;
    break;
  case KVS_TENSOR_CUDA_IPC:
    d->ipc = t->ipc;
    KVS_TRY(size_or_end(&d->ipc.alloc_len, t->ipc.offset, length));
    break;
  case KVS_TENSOR_CUDA_VMM_FD:
    d->vmm = t->vmm;
    KVS_TRY(size_or_end(&d->vmm.size, t->vmm.offset, length));
    break;
  default:
    return -EPROTONOSUPPORT;
  }
  return kvs_tensor_validate(d, NULL, 0);
}

/* Check the arguments of add/update and build the slot contents outside the lock. */
static int prepare_slot(uint64_t base, uint64_t length, const kvs_tensor_desc_t *tmpl,
                        bool exportable, reg_slot_t *s) {
  if (length == 0 || base + length < base) return -EINVAL;
  memset(s, 0, sizeof *s);
  s->exportable = exportable;
  if (!exportable) return 0;
  if (!tmpl) return -EINVAL;
  return make_view(tmpl, length, &s->desc);
}

int kvs_tensor_registry_add(kvs_tensor_registry_t *reg, uint64_t base, uint64_t length,
                            const kvs_tensor_desc_t *tmpl, bool exportable) {
  if (!reg) return -EINVAL;
  reg_slot_t fresh;
  KVS_TRY(prepare_slot(base, length, tmpl, exportable, &fresh));
  uint64_t end = base + length;
  int rc = 0;
  pthread_rwlock_wrlock(&reg->lock);
  uint32_t pos = upper_bound(reg, base);
  if ((pos > 0 && reg->index[pos - 1].end > base) || (pos < reg->n && reg->index[pos].base < end)) {
    rc = -EEXIST;
  } else if (reg->n == reg->cap) {
    rc = -ENOSPC;
  } else {
    uint32_t slot;
    if (reg->free_head != SLOT_NONE) {
      slot = reg->free_head;
      reg->free_head = reg->slots[slot].next_free;
    } else {
      slot = reg->hwm++;
    }
    fresh.next_free = SLOT_NONE;
    reg->slots[slot] = fresh;
    memmove(&reg->index[pos + 1], &reg->index[pos], (size_t)(reg->n - pos) * sizeof(reg_entry_t));
    reg->index[pos] = (reg_entry_t){.base = base, .end = end, .slot = slot};
    reg->n++;
    KVS__DEBUG_CHECK(registry_valid_locked(reg));
  }
  pthread_rwlock_unlock(&reg->lock);
  return rc;
}

int kvs_tensor_registry_update(kvs_tensor_registry_t *reg, uint64_t base,
                               const kvs_tensor_desc_t *tmpl, bool exportable) {
  if (!reg) return -EINVAL;
  int rc = -ENOENT;
  pthread_rwlock_wrlock(&reg->lock);
  uint32_t pos = upper_bound(reg, base);
  if (pos > 0 && reg->index[pos - 1].base == base) {
    const reg_entry_t *e = &reg->index[pos - 1];
    reg_slot_t fresh;
    rc = prepare_slot(base, e->end - e->base, tmpl, exportable, &fresh);
    if (rc == 0) {
      fresh.next_free = SLOT_NONE;
      reg->slots[e->slot] = fresh;
      KVS__DEBUG_CHECK(registry_valid_locked(reg));
    }
  }
  pthread_rwlock_unlock(&reg->lock);
  return rc;
}

static void fill_record(const kvs_tensor_registry_t *r, uint32_t pos, kvs_tensor_record_t *out) {
  const reg_entry_t *e = &r->index[pos];
  const reg_slot_t *s = &r->slots[e->slot];
  out->base = e->base;
  out->length = e->end - e->base;
  out->exportable = s->exportable;
  out->desc = s->desc;
}

int kvs_tensor_registry_remove(kvs_tensor_registry_t *reg, uint64_t base,
                               kvs_tensor_record_t *out) {
  if (!reg) return -EINVAL;
  int rc = -ENOENT;
  pthread_rwlock_wrlock(&reg->lock);
  uint32_t pos = upper_bound(reg, base);
  if (pos > 0 && reg->index[--pos].base == base) {
    if (out) fill_record(reg, pos, out);
    uint32_t slot = reg->index[pos].slot;
    memset(&reg->slots[slot], 0, sizeof reg->slots[slot]);
    reg->slots[slot].next_free = reg->free_head;
    reg->free_head = slot;
    memmove(&reg->index[pos], &reg->index[pos + 1], (size_t)(reg->n - pos - 1) * sizeof(reg_entry_t));
    reg->n--;
    rc = 0;
    KVS__DEBUG_CHECK(registry_valid_locked(reg));
  }
  pthread_rwlock_unlock(&reg->lock);
  return rc;
}

int kvs_tensor_registry_lookup(kvs_tensor_registry_t *reg, uint64_t addr,
                               kvs_tensor_record_t *out) {
  if (!reg || !out) return -EINVAL;
  pthread_rwlock_rdlock(&reg->lock);
  int64_t pos = find_containing(reg, addr);
  if (pos >= 0) fill_record(reg, (uint32_t)pos, out);
  pthread_rwlock_unlock(&reg->lock);
  return pos >= 0 ? 0 : -ENOENT;
}

/* The view of [a, b) inside a record whose whole-record view is full and base is base. */
static void sub_view(const kvs_tensor_desc_t *full, uint64_t base, uint64_t a, uint64_t b,
                     kvs_tensor_desc_t *out) {
  uint64_t delta = a - base;
  *out = *full;
  out->shape[0] = b - a;
  switch (full->kind) {
  case KVS_TENSOR_CPU_SHM:
    out->cpu.offset += delta;
    out->cpu.length = b - a;
    break;
  case KVS_TENSOR_CUDA_IPC: out->ipc.offset += delta; break;
  case KVS_TENSOR_CUDA_VMM_FD: out->vmm.offset += delta; break;
  }
}

int kvs_tensor_registry_query(kvs_tensor_registry_t *reg, uint64_t addr, uint64_t len,
                              kvs_tensor_desc_t *out, size_t cap, kvs_tensor_query_info_t *info) {
  if (!reg || len == 0 || addr + len < addr || (!out && cap)) return -EINVAL;
  uint64_t end = addr + len;
  kvs_tensor_query_info_t qi;
  memset(&qi, 0, sizeof qi);
  pthread_rwlock_rdlock(&reg->lock);
  uint32_t i = upper_bound(reg, addr);
  if (i > 0 && reg->index[i - 1].end > addr) i--;
  for (; i < reg->n && reg->index[i].base < end; i++) {
    const reg_entry_t *e = &reg->index[i];
    const reg_slot_t *s = &reg->slots[e->slot];
    uint64_t a = e->base > addr ? e->base : addr;
    uint64_t b = e->end < end ? e->end : end;
    qi.records++;
    if (!s->exportable) {
      qi.skipped++;
      qi.skipped_bytes += b - a;
      continue;
    }
    if (qi.exported < cap) sub_view(&s->desc, e->base, a, b, &out[qi.exported]);
    qi.exported++;
    qi.covered_bytes += b - a;
  }
  pthread_rwlock_unlock(&reg->lock);
  qi.gap_bytes = len - qi.covered_bytes - qi.skipped_bytes;
  if (info) *info = qi;
  return (int)qi.exported;
}

size_t kvs_tensor_registry_count(kvs_tensor_registry_t *reg) {
  if (!reg) return 0;
  pthread_rwlock_rdlock(&reg->lock);
  size_t n = reg->n;
  pthread_rwlock_unlock(&reg->lock);
  return n;
}

static int coord_query(void *ctx, uint64_t addr, uint64_t len, kvs_tensor_desc_t *out,
                       size_t cap) {
  return kvs_tensor_registry_query(ctx, addr, len, out, cap, NULL);
}

kvs_coord_tensors_t kvs_tensor_registry_coord(kvs_tensor_registry_t *reg) {
  return (kvs_coord_tensors_t){.ctx = reg, .query = coord_query};
}
