/* shims/cuda: the option and stat rows of the CUDA driver family, which only its code reads and
 * counts (design §2: each layer owns its rows). X(field, ENV, TYPE, default, min, max,
 * choices, unit, help) as core/options.h's rows; X(name, kind, help) as core/stats.h's.
 * runtime/rows.h composes them after core's and the runtime's, in the order of
 * shims/families.h, into the process's configuration (kvs_config_t) and stats table. This
 * header has no includes: it is rows only. */
#ifndef KVSHIM_CUDA_ROWS_H
#define KVSHIM_CUDA_ROWS_H

#define KVS_CUDA_OPTIONS(X)                                                                   \
  X(host_min, "KVSHIM_HOST_MIN", SIZE, "1M", 0, 1ull << 40, "", "bytes",                      \
    "smallest host allocation redirected")                                                    \
  X(cuda_pin_arena, "KVSHIM_CUDA_PIN_ARENA", BOOL, "1", 0, 1, "", "",                         \
    "pin the CUDA host arena on demand in 64 MiB pieces (0: register each buffer inline)")

#define KVS_CUDA_STATS(X)                                                                     \
  X(host_arena_used_bytes, G, "bytes of the host arena handed out")                           \
  X(host_arena_allocs, C, "host allocations served from the pool")                            \
  X(host_arena_fallbacks, C, "host allocations passed to the real allocator")                 \
  X(cuda_device_allocs, C, "device allocations recorded in the tensor registry")              \
  X(cuda_device_exportable, C, "recorded device allocations given a CUDA IPC handle")         \
  X(cuda_device_unexportable, C,                                                              \
    "recorded device allocations that cannot be exported (cuMemAllocAsync, managed)")          \
  X(cuda_ipc_opens, C, "peer CUDA IPC handles opened in this process (first reference)")      \
  X(host_arena_h2d_bytes, C, "bytes copied host arena -> device by hooked async copies")      \
  X(host_arena_d2h_bytes, C, "bytes copied device -> host arena by hooked async copies")    \
  X(host_arena_inline_pins, C, "host-arena registrations made inside an engine's allocation")  \
  X(host_arena_pinned_bytes, G,                                                               \
    "bytes of the host arena registered with the CUDA driver now (pieces and own extents)")    \
  X(host_arena_pieces_ahead, C,                                                               \
    "host-arena pieces registered ahead of use by the background thread")                     \
  X(cuda_vmm_allocs, C, "VMM physical allocations (cuMemCreate) passed through, not exportable") \
  X(cuda_vmm_bytes, C, "bytes of VMM physical allocations (cuMemCreate) passed through")

#endif
