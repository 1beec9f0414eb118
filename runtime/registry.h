/* runtime/registry: the registry of exportable allocations (design §8, §9.4).
 *
 * The allocation hooks (shims/cuda) record every intercepted allocation here; the coordinator
 * answers EXPORT_TENSORS from it through the interface core owns (kvs_coord_tensors_t,
 * core/wire/coord.h), which kvs_tensor_registry_coord adapts it to. The descriptors it holds
 * and produces are core/wire/tensor.h's.
 *
 * One record per intercepted allocation: [base, base + length) in the process's address space
 * (host or device), whether it can be exported, and a descriptor template naming its handle.
 * Invariant: records are kept sorted by base and never overlap:
 *     rec[i].base + rec[i].length <= rec[i+1].base
 * so lookup is a binary search, O(log n); add and remove move the (24-byte) index entries
 * after the insertion point, O(n) bytes moved. Storage is reserved at create (lazily backed
 * anonymous mappings): add never allocates, so allocation hooks can call it.
 * Threads: one rwlock guards everything; lookup/query/count take it shared.
 *
 * Template (only for exportable records): kind, device_uuid and the handle of the record's
 * first byte:
 *     CPU_SHM      cpu.instance_id, cpu.offset = pool offset of base (cpu.length ignored)
 *     CUDA_IPC     ipc.handle, ipc.offset = offset of base in the allocation (normally 0),
 *                  ipc.alloc_len (0 = ipc.offset + length), ipc.generation
 *     CUDA_VMM_FD  vmm.fd_index, vmm.offset of base, vmm.size (0 = vmm.offset + length),
 *                  vmm.granularity
 * dtype/ndim/shape/stride/storage_offset of the template are ignored. Descriptors produced
 * for a sub-range [a, b) of a record are 1-D byte views: dtype U8, ndim 1, shape {b - a},
 * stride {1}, storage_offset 0, with the handle offset advanced by a - base (and cpu.length
 * = b - a). */
#ifndef KVSHIM_RUNTIME_REGISTRY_H
#define KVSHIM_RUNTIME_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coord.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_tensor_registry kvs_tensor_registry_t;

typedef struct kvs_tensor_record {
  uint64_t base;           /* first byte (address) */
  uint64_t length;         /* bytes, > 0 */
  bool exportable;         /* false: cuMemCreate/cuMemAllocAsync/graph memory (listed only) */
  kvs_tensor_desc_t desc;  /* exportable: byte view of the whole record; else zeroed */
} kvs_tensor_record_t;

typedef struct kvs_tensor_query_info {
  uint32_t records;        /* records overlapping the range */
  uint32_t exported;       /* descriptors produced (== the return value) */
  uint32_t skipped;        /* overlapping records that are not exportable */
  uint64_t covered_bytes;  /* bytes of the range inside exportable records */
  uint64_t skipped_bytes;  /* bytes of the range inside records that are not exportable */
  uint64_t gap_bytes;      /* bytes of the range inside no record */
} kvs_tensor_query_info_t;

/* max_records: capacity (0 = 65536). Errors: -EINVAL (more than 2^22), -ENOMEM. */
int kvs_tensor_registry_create(uint32_t max_records, kvs_tensor_registry_t **out);
/* Accepts NULL. Debug builds poison the struct. */
void kvs_tensor_registry_destroy(kvs_tensor_registry_t *reg);

/* Record [base, base + length). tmpl is required (and must give a valid descriptor for the
 * whole record) when exportable, ignored otherwise. Errors: -EINVAL (length 0, base + length
 * overflows, missing template), a validation code for a bad template, -EEXIST (overlaps a
 * record: nothing changes), -ENOSPC (registry full). */
int kvs_tensor_registry_add(kvs_tensor_registry_t *reg, uint64_t base, uint64_t length,
                            const kvs_tensor_desc_t *tmpl, bool exportable);
/* Replace the template/exportability of the record starting at base (e.g. once its IPC handle
 * was fetched on demand). Same errors as add, -ENOENT when no record starts at base. */
int kvs_tensor_registry_update(kvs_tensor_registry_t *reg, uint64_t base,
                               const kvs_tensor_desc_t *tmpl, bool exportable);
/* Forget the record starting exactly at base; *out (may be NULL) gets it. -ENOENT otherwise. */
int kvs_tensor_registry_remove(kvs_tensor_registry_t *reg, uint64_t base,
                               kvs_tensor_record_t *out);
/* The record containing addr (base <= addr < base + length), or -ENOENT. */
int kvs_tensor_registry_lookup(kvs_tensor_registry_t *reg, uint64_t addr,
                               kvs_tensor_record_t *out);
/* Descriptors covering [addr, addr + len), in address order, one per overlapping exportable
 * record, each restricted to the part of the record inside the range. Up to cap are written
 * to out; returns how many there are (may exceed cap), or -EINVAL (len 0, addr + len
 * overflows, out NULL with cap > 0). info (may be NULL) gets the accounting. */
int kvs_tensor_registry_query(kvs_tensor_registry_t *reg, uint64_t addr, uint64_t len,
                              kvs_tensor_desc_t *out, size_t cap, kvs_tensor_query_info_t *info);
size_t kvs_tensor_registry_count(kvs_tensor_registry_t *reg);
/* Sorted, non-overlapping, index consistent with the records (O(n)). */
bool kvs__tensor_registry_is_valid(kvs_tensor_registry_t *reg);

/* The coordinator's view of reg (core/wire/coord.h): ctx = reg, and a query that is
 * kvs_tensor_registry_query without the accounting. Borrowed: reg must outlive every
 * coordinator given it (copy the result into kvs_coord_config_t.tensors). */
kvs_coord_tensors_t kvs_tensor_registry_coord(kvs_tensor_registry_t *reg);

#ifdef __cplusplus
}
#endif
#endif
