/* runtime/registry: the registry of exportable allocations (overlap, ranges across
 * allocations, non-exportable records, CPU_SHM and VMM views, capacity, a randomised run
 * against a reference model, concurrent use, the CUDA_IPC generation in its descriptors) and
 * its adapter to the coordinator's EXPORT_TENSORS interface. The test names are the ones these
 * cases had in tests/core/wire (suites tensor and tensor_gen). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "registry.h"
#include "tensor.h"
#include "tensor_fixture.h"
#include "../lib/threads.h"

static uint64_t rng_state;
static uint64_t rnd(void) { /* xorshift64* (test_tensor.c's), fixed seed per test */
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ull;
}
static uint64_t rnd_below(uint64_t n) { return rnd() % n; }

static kvs_tensor_desc_t ipc_tmpl(uint8_t tag) {
  kvs_tensor_desc_t t;
  memset(&t, 0, sizeof t);
  t.kind = KVS_TENSOR_CUDA_IPC;
  memset(t.device_uuid, 0x11, 16);
  memset(t.ipc.handle, tag, 64);
  return t; /* offset 0, alloc_len 0: the record is the whole allocation */
}

Test(tensor, registry_add_lookup_overlap_remove, .timeout = 30) {
  kvs_tensor_registry_t *r = NULL;
  cr_assert_eq(kvs_tensor_registry_create(0, &r), 0);
  kvs_tensor_desc_t a = ipc_tmpl(0xaa), b = ipc_tmpl(0xbb);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x10000, 0x1000, &a, true), 0);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x11000, 0x2000, &b, true), 0); /* adjacent: fine */
  /* overlaps, in every position */
  cr_assert_eq(kvs_tensor_registry_add(r, 0x10800, 0x100, &a, true), -EEXIST);
  cr_assert_eq(kvs_tensor_registry_add(r, 0xf000, 0x1001, &a, true), -EEXIST);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x12fff, 2, &a, true), -EEXIST);
  cr_assert_eq(kvs_tensor_registry_add(r, 0xf000, 0x10000, &a, true), -EEXIST);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x11000, 0x2000, NULL, false), -EEXIST);
  cr_assert_eq(kvs_tensor_registry_count(r), 2);
  /* bad arguments change nothing */
  cr_assert_eq(kvs_tensor_registry_add(r, 0x20000, 0, &a, true), -EINVAL);
  cr_assert_eq(kvs_tensor_registry_add(r, UINT64_MAX - 10, 100, &a, true), -EINVAL);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x20000, 0x1000, NULL, true), -EINVAL);
  kvs_tensor_desc_t bad = a;
  memset(bad.device_uuid, 0, 16);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x20000, 0x1000, &bad, true), -EINVAL);
  bad = a, bad.kind = 7;
  cr_assert_eq(kvs_tensor_registry_add(r, 0x20000, 0x1000, &bad, true), -EPROTONOSUPPORT);
  bad = a, bad.ipc.alloc_len = 0x800; /* allocation smaller than the record */
  cr_assert_eq(kvs_tensor_registry_add(r, 0x20000, 0x1000, &bad, true), -ERANGE);
  cr_assert_eq(kvs_tensor_registry_count(r), 2);
  cr_assert(kvs__tensor_registry_is_valid(r));

  kvs_tensor_record_t rec;
  cr_assert_eq(kvs_tensor_registry_lookup(r, 0x10000, &rec), 0);
  cr_assert_eq(rec.base, 0x10000);
  cr_assert_eq(rec.length, 0x1000);
  cr_assert(rec.exportable);
  cr_assert_eq(rec.desc.ipc.handle[5], 0xaa);
  cr_assert_eq(rec.desc.ipc.alloc_len, 0x1000);
  cr_assert_eq(kvs_tensor_registry_lookup(r, 0x10fff, &rec), 0);
  cr_assert_eq(rec.base, 0x10000);
  cr_assert_eq(kvs_tensor_registry_lookup(r, 0x11000, &rec), 0);
  cr_assert_eq(rec.base, 0x11000);
  cr_assert_eq(kvs_tensor_registry_lookup(r, 0x12fff, &rec), 0);
  cr_assert_eq(rec.base, 0x11000);
  cr_assert_eq(kvs_tensor_registry_lookup(r, 0x13000, &rec), -ENOENT);
  cr_assert_eq(kvs_tensor_registry_lookup(r, 0xffff, &rec), -ENOENT);
  cr_assert_eq(kvs_tensor_registry_lookup(r, 0, &rec), -ENOENT);

  cr_assert_eq(kvs_tensor_registry_remove(r, 0x11001, NULL), -ENOENT); /* not a base */
  cr_assert_eq(kvs_tensor_registry_remove(r, 0x11000, &rec), 0);
  cr_assert_eq(rec.length, 0x2000);
  cr_assert_eq(rec.desc.ipc.handle[0], 0xbb);
  cr_assert_eq(kvs_tensor_registry_remove(r, 0x11000, NULL), -ENOENT);
  cr_assert_eq(kvs_tensor_registry_lookup(r, 0x11800, &rec), -ENOENT);
  cr_assert_eq(kvs_tensor_registry_count(r), 1);
  /* the freed range can be registered again, differently */
  cr_assert_eq(kvs_tensor_registry_add(r, 0x10800 + 0x800, 0x800, NULL, false), 0);
  cr_assert(kvs__tensor_registry_is_valid(r));
  kvs_tensor_registry_destroy(r);
  kvs_tensor_registry_destroy(NULL);
}

Test(tensor, registry_query_spans_allocations_and_skips_unexportable, .timeout = 30) {
  kvs_tensor_registry_t *r = NULL;
  cr_assert_eq(kvs_tensor_registry_create(16, &r), 0);
  kvs_tensor_desc_t a = ipc_tmpl(0xaa), b = ipc_tmpl(0xbb);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x10000, 0x1000, &a, true), 0);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x11000, 0x2000, &b, true), 0);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x20000, 0x1000, NULL, false), 0); /* cuMemCreate */

  kvs_tensor_desc_t out[4];
  kvs_tensor_query_info_t qi;
  /* [0x10800, 0x11800): the second half of A and the first 0x800 bytes of B */
  cr_assert_eq(kvs_tensor_registry_query(r, 0x10800, 0x1000, out, 4, &qi), 2);
  cr_assert_eq(out[0].ipc.handle[0], 0xaa);
  cr_assert_eq(out[0].ipc.offset, 0x800);
  cr_assert_eq(out[0].ipc.alloc_len, 0x1000);
  cr_assert_eq(out[0].shape[0], 0x800);
  cr_assert_eq(out[0].dtype, KVS_DTYPE_U8);
  cr_assert_eq(out[1].ipc.handle[0], 0xbb);
  cr_assert_eq(out[1].ipc.offset, 0);
  cr_assert_eq(out[1].ipc.alloc_len, 0x2000);
  cr_assert_eq(out[1].shape[0], 0x800);
  for (int i = 0; i < 2; i++) {
    char msg[160] = "";
    cr_assert_eq(kvs_tensor_validate(&out[i], msg, sizeof msg), 0, "%s", msg);
  }
  cr_assert_eq(qi.records, 2);
  cr_assert_eq(qi.exported, 2);
  cr_assert_eq(qi.skipped, 0);
  cr_assert_eq(qi.covered_bytes, 0x1000);
  cr_assert_eq(qi.gap_bytes, 0);

  /* inside B only, starting in its middle */
  cr_assert_eq(kvs_tensor_registry_query(r, 0x11100, 0x10, out, 4, &qi), 1);
  cr_assert_eq(out[0].ipc.offset, 0x100);
  cr_assert_eq(out[0].shape[0], 0x10);

  /* [0x12000, 0x20800): the tail of B, a gap, half of the non-exportable record */
  cr_assert_eq(kvs_tensor_registry_query(r, 0x12000, 0xe800, out, 4, &qi), 1);
  cr_assert_eq(out[0].ipc.offset, 0x1000);
  cr_assert_eq(out[0].shape[0], 0x1000);
  cr_assert_eq(qi.records, 2);
  cr_assert_eq(qi.skipped, 1);
  cr_assert_eq(qi.skipped_bytes, 0x800);
  cr_assert_eq(qi.covered_bytes, 0x1000);
  cr_assert_eq(qi.gap_bytes, 0xe800 - 0x1000 - 0x800);

  /* only the non-exportable record: listed by lookup, no descriptor */
  kvs_tensor_record_t rec;
  cr_assert_eq(kvs_tensor_registry_lookup(r, 0x20010, &rec), 0);
  cr_assert_not(rec.exportable);
  cr_assert_eq(kvs_tensor_registry_query(r, 0x20000, 0x1000, out, 4, &qi), 0);
  cr_assert_eq(qi.skipped, 1);
  /* nothing there at all */
  cr_assert_eq(kvs_tensor_registry_query(r, 0x30000, 0x1000, out, 4, &qi), 0);
  cr_assert_eq(qi.records, 0);
  cr_assert_eq(qi.gap_bytes, 0x1000);

  /* cap smaller than the answer: the count is complete, only cap are written */
  memset(out, 0x5a, sizeof out);
  cr_assert_eq(kvs_tensor_registry_query(r, 0, 0x100000, out, 1, NULL), 2);
  cr_assert_eq(out[0].ipc.handle[0], 0xaa);
  cr_assert_eq(out[1].kind, 0x5a5a5a5a, "wrote past cap");
  cr_assert_eq(kvs_tensor_registry_query(r, 0, 0x100000, NULL, 0, NULL), 2);
  cr_assert_eq(kvs_tensor_registry_query(r, 0, 0, out, 4, NULL), -EINVAL);
  cr_assert_eq(kvs_tensor_registry_query(r, UINT64_MAX, 2, out, 4, NULL), -EINVAL);
  cr_assert_eq(kvs_tensor_registry_query(r, 0, 1, NULL, 4, NULL), -EINVAL);

  /* the handle of the cuMemCreate record becomes known: it is exported from then on */
  kvs_tensor_desc_t c = ipc_tmpl(0xcc);
  cr_assert_eq(kvs_tensor_registry_update(r, 0x20000, &c, true), 0);
  cr_assert_eq(kvs_tensor_registry_query(r, 0x20000, 0x1000, out, 4, &qi), 1);
  cr_assert_eq(out[0].ipc.handle[0], 0xcc);
  cr_assert_eq(kvs_tensor_registry_update(r, 0x20001, &c, true), -ENOENT);
  cr_assert_eq(kvs_tensor_registry_update(r, 0x20000, NULL, true), -EINVAL);
  cr_assert_eq(kvs_tensor_registry_query(r, 0x20000, 0x1000, out, 4, &qi), 1, "failed update changed it");
  cr_assert(kvs__tensor_registry_is_valid(r));
  kvs_tensor_registry_destroy(r);
}

Test(tensor, registry_cpu_shm_and_vmm_views, .timeout = 30) {
  kvs_tensor_registry_t *r = NULL;
  cr_assert_eq(kvs_tensor_registry_create(8, &r), 0);
  kvs_tensor_desc_t t;
  memset(&t, 0, sizeof t);
  t.kind = KVS_TENSOR_CPU_SHM;
  t.cpu.instance_id = 77;
  t.cpu.offset = 0x200000; /* pool offset of the host buffer */
  cr_assert_eq(kvs_tensor_registry_add(r, 0x7f0000000000ull, 0x100000, &t, true), 0);
  kvs_tensor_desc_t v;
  memset(&v, 0, sizeof v);
  v.kind = KVS_TENSOR_CUDA_VMM_FD;
  memset(v.device_uuid, 3, 16);
  v.vmm.fd_index = 1;
  v.vmm.granularity = 1 << 21;
  v.vmm.size = 1 << 21;
  v.vmm.offset = 0x1000; /* the record starts 4 KiB into the allocation */
  cr_assert_eq(kvs_tensor_registry_add(r, 0x500000000ull, 0x10000, &v, true), 0);

  kvs_tensor_desc_t out[2];
  cr_assert_eq(kvs_tensor_registry_query(r, 0x7f0000000000ull + 0x3000, 0x2000, out, 2, NULL), 1);
  cr_assert_eq(out[0].kind, KVS_TENSOR_CPU_SHM);
  cr_assert_eq(out[0].cpu.instance_id, 77);
  cr_assert_eq(out[0].cpu.offset, 0x203000);
  cr_assert_eq(out[0].cpu.length, 0x2000);
  cr_assert_eq(kvs_tensor_validate(&out[0], NULL, 0), 0);
  cr_assert_eq(kvs_tensor_registry_query(r, 0x500000000ull + 0x100, 0x100000, out, 2, NULL), 1);
  cr_assert_eq(out[0].vmm.offset, 0x1100);
  cr_assert_eq(out[0].vmm.size, 1 << 21);
  cr_assert_eq(out[0].shape[0], 0x10000 - 0x100);
  cr_assert_eq(kvs_tensor_validate(&out[0], NULL, 0), 0);
  /* the query results travel: they encode and decode */
  uint8_t enc[KVS_TENSOR_ENC_MAX];
  kvs_tensor_desc_t back;
  int n = kvs_tensor_encode(&out[0], enc, sizeof enc);
  cr_assert_gt(n, 0, "encode failed: %d (%s)", n, kvs_tensor_strerror(n));
  cr_assert_eq(kvs_tensor_decode(enc, (size_t)n, &back), 0);
  cr_assert(kvs_tensor_equal(&back, &out[0]));
  kvs_tensor_registry_destroy(r);
}

Test(tensor, registry_capacity_and_slot_reuse, .timeout = 30) {
  kvs_tensor_registry_t *r = NULL;
  cr_assert_eq(kvs_tensor_registry_create(1u << 23, &r), -EINVAL);
  cr_assert_eq(kvs_tensor_registry_create(4, &r), 0);
  for (uint64_t i = 0; i < 4; i++) {
    kvs_tensor_desc_t t = ipc_tmpl((uint8_t)i);
    cr_assert_eq(kvs_tensor_registry_add(r, (4 - i) * 0x1000, 0x1000, &t, true), 0);
  }
  kvs_tensor_desc_t t = ipc_tmpl(9);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x100000, 0x1000, &t, true), -ENOSPC);
  cr_assert_eq(kvs_tensor_registry_remove(r, 0x2000, NULL), 0);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x100000, 0x1000, &t, true), 0);
  kvs_tensor_record_t rec;
  cr_assert_eq(kvs_tensor_registry_lookup(r, 0x100800, &rec), 0);
  cr_assert_eq(rec.desc.ipc.handle[0], 9);
  for (uint64_t i = 0; i < 4; i++) {
    uint64_t base = (4 - i) * 0x1000;
    if (base == 0x2000) continue;
    cr_assert_eq(kvs_tensor_registry_lookup(r, base, &rec), 0);
    cr_assert_eq(rec.desc.ipc.handle[0], (uint8_t)i, "record at %#lx lost its template", (unsigned long)base);
  }
  cr_assert(kvs__tensor_registry_is_valid(r));
  kvs_tensor_registry_destroy(r);
}

/* Random adds/removes/lookups/queries against a flat reference model. */
#define MODEL_SLOTS 512
Test(tensor, registry_matches_reference_model, .timeout = 60) {
  rng_state = 0xdeadbeefcafef00dull;
  /* the address space is 512 cells of 0x100; the model owns cell -> record base (or 0) */
  static uint64_t owner[MODEL_SLOTS];
  static uint8_t tag_of[MODEL_SLOTS];
  memset(owner, 0, sizeof owner);
  kvs_tensor_registry_t *r = NULL;
  cr_assert_eq(kvs_tensor_registry_create(256, &r), 0);
  size_t count = 0;
  for (int it = 0; it < 20000; it++) {
    uint64_t cell = rnd_below(MODEL_SLOTS), ncell = 1 + rnd_below(8);
    uint64_t base = 0x100000 + cell * 0x100, len = ncell * 0x100;
    switch (rnd_below(4)) {
    case 0: { /* add */
      if (cell + ncell > MODEL_SLOTS) break;
      bool free_range = true;
      for (uint64_t c = cell; free_range && c < cell + ncell; c++) free_range = owner[c] == 0;
      bool exp = rnd_below(3) != 0;
      uint8_t tag = (uint8_t)rnd();
      kvs_tensor_desc_t t = ipc_tmpl(tag);
      int rc = kvs_tensor_registry_add(r, base, len, &t, exp);
      cr_assert_eq(rc, free_range ? 0 : -EEXIST, "it %d add %#lx+%#lx", it, (unsigned long)base,
                   (unsigned long)len);
      if (rc == 0) {
        for (uint64_t c = cell; c < cell + ncell; c++) owner[c] = base;
        tag_of[cell] = exp ? tag : 0;
        count++;
      }
      break;
    }
    case 1: { /* remove by base (or a non-base address) */
      bool is_base = owner[cell] == base;
      int rc = kvs_tensor_registry_remove(r, base, NULL);
      cr_assert_eq(rc, is_base ? 0 : -ENOENT);
      if (is_base) {
        for (uint64_t c = cell; c < MODEL_SLOTS && owner[c] == base; c++) owner[c] = 0;
        count--;
      }
      break;
    }
    case 2: { /* lookup */
      uint64_t addr = base + rnd_below(0x100);
      kvs_tensor_record_t rec;
      int rc = kvs_tensor_registry_lookup(r, addr, &rec);
      cr_assert_eq(rc, owner[cell] ? 0 : -ENOENT);
      if (rc == 0) {
        cr_assert_eq(rec.base, owner[cell]);
        uint64_t oc = (rec.base - 0x100000) / 0x100;
        cr_assert_eq(rec.exportable ? rec.desc.ipc.handle[0] : 0, tag_of[oc]);
      }
      break;
    }
    default: { /* query: count distinct exportable owners in the range */
      if (cell + ncell > MODEL_SLOTS) break;
      int want = 0, skipped = 0;
      uint64_t covered = 0;
      for (uint64_t c = cell; c < cell + ncell; c++) {
        if (!owner[c]) continue;
        bool first = c == cell || owner[c - 1] != owner[c];
        kvs_tensor_record_t rec;
        cr_assert_eq(kvs_tensor_registry_lookup(r, owner[c], &rec), 0);
        if (rec.exportable) covered += 0x100;
        if (first && rec.exportable) want++;
        if (first && !rec.exportable) skipped++;
      }
      kvs_tensor_query_info_t qi;
      kvs_tensor_desc_t out[8];
      cr_assert_eq(kvs_tensor_registry_query(r, base, len, out, 8, &qi), want);
      cr_assert_eq(qi.skipped, (uint32_t)skipped);
      cr_assert_eq(qi.covered_bytes, covered);
      uint64_t sum = 0;
      for (int i = 0; i < want; i++) sum += out[i].shape[0];
      cr_assert_eq(sum, covered);
      break;
    }
    }
    cr_assert_eq(kvs_tensor_registry_count(r), count);
    if (it % 997 == 0) cr_assert(kvs__tensor_registry_is_valid(r));
  }
  cr_assert(kvs__tensor_registry_is_valid(r));
  kvs_tensor_registry_destroy(r);
}

/* w->obj: the registry; w->arg: the worker's id, its lane. Returns the failures seen. */
static int reg_worker(tt_thread_t *w) {
  kvs_tensor_registry_t *r = w->obj;
  const uint8_t id = (uint8_t)w->arg;
  int failures = 0;
  kvs_tensor_desc_t t = ipc_tmpl(id);
  uint64_t lane = 0x1000000ull * (w->arg + 1);
  for (int i = 0; i < 5000; i++) {
    uint64_t base = lane + (uint64_t)(i % 64) * 0x1000;
    if (kvs_tensor_registry_add(r, base, 0x1000, &t, true) != 0) failures++;
    kvs_tensor_record_t rec;
    if (kvs_tensor_registry_lookup(r, base + 0x10, &rec) != 0 || rec.desc.ipc.handle[0] != id)
      failures++;
    if (kvs_tensor_registry_remove(r, base, NULL) != 0) failures++;
  }
  return failures;
}

Test(tensor, registry_concurrent_lanes, .timeout = 60) {
  kvs_tensor_registry_t *r = NULL;
  cr_assert_eq(kvs_tensor_registry_create(1024, &r), 0);
  kvs_tensor_desc_t t = ipc_tmpl(0xee);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x10, 0x10, &t, true), 0); /* stays throughout */
  tt_thread_t w[4];
  for (int i = 0; i < 4; i++) cr_assert_eq(tt_start(&w[i], reg_worker, r, NULL, (uint64_t)i), 0);
  for (int i = 0; i < 4; i++) {
    tt_join(&w[i]);
    cr_assert_eq(w[i].rc, 0, "worker %d", i);
  }
  cr_assert_eq(kvs_tensor_registry_count(r), 1);
  cr_assert(kvs__tensor_registry_is_valid(r));
  kvs_tensor_registry_destroy(r);
}

Test(tensor_gen, registry_descriptors_carry_it) {
  kvs_tensor_registry_t *r;
  cr_assert_eq(kvs_tensor_registry_create(16, &r), 0);
  kvs_tensor_desc_t t = tf_ipc_desc(0x777700000001ull);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x100000, 1 << 20, &t, true), 0);
  kvs_tensor_desc_t out[2];
  kvs_tensor_query_info_t qi;
  cr_assert_eq(kvs_tensor_registry_query(r, 0x100000 + 4096, 8192, out, 2, &qi), 1);
  cr_assert_eq(out[0].ipc.generation, 0x777700000001ull);
  cr_assert_eq(out[0].ipc.offset, 4096);
  kvs_tensor_record_t rec;
  cr_assert_eq(kvs_tensor_registry_remove(r, 0x100000, &rec), 0);
  cr_assert_eq(rec.desc.ipc.generation, 0x777700000001ull, "the free path reads it back");
  kvs_tensor_registry_destroy(r);
}

/* The coordinator's view (kvs_tensor_registry_coord): the registry's query, without the
 * accounting. */
Test(registry, coord_adapter_queries_the_registry, .timeout = 30) {
  kvs_tensor_registry_t *r = NULL;
  cr_assert_eq(kvs_tensor_registry_create(4, &r), 0);
  kvs_tensor_desc_t t = tf_ipc_desc(7);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x100000, 1 << 20, &t, true), 0);
  cr_assert_eq(kvs_tensor_registry_add(r, 0x300000, 4096, NULL, false), 0);
  kvs_coord_tensors_t ct = kvs_tensor_registry_coord(r);
  cr_assert_eq(ct.ctx, r);
  cr_assert_eq(ct.query(ct.ctx, 0x100000, 0x300000, NULL, 0), 1);
  kvs_tensor_desc_t out[2];
  cr_assert_eq(ct.query(ct.ctx, 0x100000 + 512, 0x300000, out, 2), 1);
  cr_assert_eq(out[0].ipc.offset, 512);
  cr_assert_eq(out[0].ipc.generation, 7);
  cr_assert_eq(ct.query(ct.ctx, 0, 0, out, 2), -EINVAL);
  kvs_tensor_registry_destroy(r);
}
