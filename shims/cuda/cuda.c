/* shims/cuda: CUDA driver hooks (design §9.1-§9.5).
 *
 * Routes into the hooks (§9.1): the exported wrappers generated from KVS_CUDA_HOOKS (ELF
 * binding), the dlsym hook (preload/dlsym.c calls cu_dlsym_substitute for hooked names), and
 * cuGetProcAddress[_v2] (real resolver first, then the pointer it returned is matched against
 * the real pointers of the hooked rows: each variant has its own row and its own wrapper).
 *
 * What the hooks do (§9.4):
 *   host allocations >= KVSHIM_HOST_MIN  carved from the pool's host arena, registered with the
 *                                        real cuMemHostRegister_v2, recorded in the tensor
 *                                        registry as CPU_SHM (EXPORT_TENSORS hands them out);
 *                                        arena full or registration refused -> the real allocator
 *                                        (by default from 64 MiB pieces registered on demand,
 *                                        one per call: "pinning on demand, in pieces" below;
 *                                        KVSHIM_CUDA_PIN_ARENA=0: each buffer inline)
 *   cuMemFreeHost                        arena buffers: synchronise the context (the real
 *                                        call's guarantee), forget, return the buffer to its
 *                                        piece (or keep/unregister its own extent); everything
 *                                        else is forwarded
 *   device allocations                   forwarded, then recorded (with a CUDA IPC handle and
 *                                        a lease generation when the driver gives one); frees
 *                                        forget the record, then wait (bounded) for importers
 *                                        holding the lease (IPC leases, below)
 *   cuMemAllocAsync, managed memory      forwarded, then recorded as not exportable
 *                                        (cuda_device_unexportable)
 *   cuMemCreate (VMM)                    forwarded and counted (cuda_vmm_allocs, _bytes)
 *   async copies                         forwarded; bytes touching the host arena are counted
 *
 * Host allocations must behave as the driver's own pinned memory (design §9.6): that memory is
 * usable by kernels at its host address whatever the flags (cuda.h, "Automatic Mapping of Host
 * Allocated Host Memory", on unified addressing), while registered memory is only when
 * registered with DEVICEMAP on devices with CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM. So:
 *   - the arena serves host allocations only when every device has unified addressing and that
 *     attribute (checked once, at the first host allocation, when the driver works);
 *   - every pooled buffer is registered PORTABLE|DEVICEMAP whatever was asked, and used only
 *     when cuMemHostGetDevicePointer_v2 then answers its host address (else unregistered and
 *     the request forwarded);
 *   - cuMemHostGetFlags on a pooled buffer answers the flags the caller asked for (0 for
 *     cuMemAllocHost_v2). WRITECOMBINED has no register equivalent: the buffer is ordinary
 *     cached memory (WC only changes speed, not semantics).
 * Unknown flag bits are forwarded untouched so the driver reports them.
 *
 * Stream capture (§9.6): kvshim's own driver calls run in RELAXED capture mode (cu_relax), so
 * they never prohibit or invalidate an engine's capture, from any thread.
 *
 * Fail open (§9.5): every internal failure forwards the call to the real driver; only real
 * CUresult values are returned (a missing real function gives CUDA_ERROR_NOT_INITIALIZED when
 * no driver could be loaded, CUDA_ERROR_NOT_FOUND when the driver lacks the entry point; NULL is
 * never called); out-parameters are read only after the driver succeeded; the hot path has no
 * getenv, no stdio and no heap allocation (the registry and the pool are preallocated).
 *
 * Threads: the real-function table is filled once without holding a lock across dlopen/dlsym
 * (runtime/hooks.c: racing fills publish each row with a CAS; the first library state wins). g_ipc_lock guards the
 * table of opened IPC handles (held across cuIpcOpenMemHandle: opening one handle twice in a
 * process must be serialised). */
#include <cuda.h>
#undef cuGetProcAddress /* cuda.h renames it to cuGetProcAddress_v2: both are hooked rows */

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "accel.h"
#include "cuda_hooks.h"
#include "internal.h"
#include "log.h"
#include "pool.h"
#include "prim.h"
#include "registry.h"
#include "runtime.h"
#include "stats.h"
#include "tensor.h"

#define KVS__UNPAREN(...) __VA_ARGS__
#define KVS__XSTR(x) KVS__STR(x)
#define KVS__STR(x) #x

/* Largest range one cuMemHostRegister call gets (a single call of 512 GiB or more fails on
 * recent drivers: design §5). */
#define CU_REGISTER_PIECE (64ull << 30)
#define CU_IPC_MAX 256        /* IPC handles open at once in this process */
#define CU_BIG_PINS 16        /* kvs_accel pins larger than one piece, open at once */
#define CU_HOST_BUFS 4096     /* pooled host buffers alive at once (their asked flags) */
#define CU_HOSTALLOC_KNOWN \
  (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)

/* ---- typed real functions ------------------------------------------------------------------ */

/* The tables of the family (runtime/family_tables.h): kvs__cu_pfn_<name>, the wrapper
 * declarations, and g_real, whose fields are the typed real functions. The family opens the
 * driver itself (cu_open): the whole table is filled at once, so g_real.<name> of every row is
 * final once cu_real() returned. */
#define KVS_FAMILY_OF(X)                                                                      \
  X(kvs__family_cuda, "cuda", KVS_HOOK_CUDA, "cu", KVS_CUDA_HOOKS, KVS_CUDA_USES, kvs__cu_pfn_, \
    cu_real_)
#include "family_tables.h"
typedef kvs__family_real_t cu_real_t;

/* A row name must be the ELF name as written: a cuda.h macro renaming it would make the
 * wrapper, the table and the string disagree. */
#define CU_NOT_RENAMED(ret, name, params, args)                                               \
  _Static_assert(sizeof(#name) == sizeof(KVS__XSTR(name)), #name " is renamed by cuda.h");
KVS_CUDA_HOOKS(CU_NOT_RENAMED)
KVS_CUDA_USES(CU_NOT_RENAMED)
#undef CU_NOT_RENAMED

static void cu_open(const kvs__family_t *f) {
  void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  kvs__family_fill(f, h);
}

static inline const cu_real_t *cu_real(void) {
  if (kvs__unlikely(__atomic_load_n(&kvs__family_state.lib, __ATOMIC_ACQUIRE) == KVS__LIB_NONE))
    kvs__family_lib(&kvs__family_cuda);
  return &g_real;
}

/* The result of a hook whose real function is missing. */
static CUresult cu_missing(void) {
  return __atomic_load_n(&kvs__family_state.lib, __ATOMIC_ACQUIRE) == KVS__LIB_MISSING
             ? CUDA_ERROR_NOT_INITIALIZED
             : CUDA_ERROR_NOT_FOUND;
}

/* CUresult -> negative errno, for the kvs_accel interface (the one translation point). */
static int cu_errno(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS: return 0;
  case CUDA_ERROR_INVALID_VALUE: return -EINVAL;
  case CUDA_ERROR_OUT_OF_MEMORY: return -ENOMEM;
  case CUDA_ERROR_NOT_INITIALIZED:
  case CUDA_ERROR_DEINITIALIZED:
  case CUDA_ERROR_NO_DEVICE:
  case CUDA_ERROR_INVALID_DEVICE: return -ENODEV;
  case CUDA_ERROR_INVALID_CONTEXT: return -ENXIO;
  case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: return -EEXIST;
  case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: return -ENOENT;
  case CUDA_ERROR_NOT_SUPPORTED: return -ENOTSUP;
  case CUDA_ERROR_INVALID_HANDLE: return -EBADF;
  case CUDA_ERROR_NOT_FOUND: return -ENOSYS;
  default: return -EIO;
  }
}

/* ---- shim state ----------------------------------------------------------------------------- */

static atomic_bool g_accel_installed;  /* kvs_accel_set done */
static atomic_uint_fast64_t g_host_used; /* bytes of the host arena handed out */

static uint8_t g_uuid[KVS_TENSOR_MAX_DEVICES][KVS_TENSOR_UUID_SIZE];
static atomic_bool g_uuid_ok[KVS_TENSOR_MAX_DEVICES];

static const kvs_accel_ops_t g_cuda_ops; /* defined below */

/* Set in a fork child: the driver may not work there (CUDA keeps no state across fork; the
 * real driver refuses a child of a process that initialised it). Until cuInit succeeds in the
 * child, CUDA hooks build no runtime and pass every call through. */
static atomic_bool g_forked;
static __attribute__((noinline)) bool cu_driver_works_after_fork(void) {
  if (!g_real.cuInit || g_real.cuInit(0) != CUDA_SUCCESS) return false;
  atomic_store(&g_forked, false);
  return true;
}

/* The runtime for a hook that may start it, when the cuda family is on. Installs the accel
 * table on first use (the process uses CUDA from here on). */
static inline kvs__runtime_t *cu_rt(void) {
  if (kvs__unlikely(atomic_load_explicit(&g_forked, memory_order_relaxed)) &&
      !cu_driver_works_after_fork())
    return NULL;
  kvs__runtime_t *rt = kvs__runtime_get();
  if (!rt || !kvs__family_on(&kvs__family_cuda)) return NULL;
  if (kvs__unlikely(!atomic_load_explicit(&g_accel_installed, memory_order_relaxed))) {
    if (!atomic_exchange(&g_accel_installed, true)) kvs_accel_set(&g_cuda_ops, NULL);
  }
  return rt;
}
/* The runtime for a hook that only concerns memory kvshim handed out: never starts it. */
static inline kvs__runtime_t *cu_rt_if_active(void) {
  kvs__runtime_t *rt = kvs__runtime_active();
  return rt && kvs__family_on(&kvs__family_cuda) ? rt : NULL;
}
static inline bool cu_in_host_arena(const kvs__runtime_t *rt, const void *p) {
  uintptr_t a = (uintptr_t)p;
  return a >= rt->host_lo && a < rt->host_hi;
}

/* UUID of the device of the calling thread's current context. */
static int cu_current_uuid(uint8_t out[KVS_TENSOR_UUID_SIZE]) {
  CUdevice dev = 0;
  if (!g_real.cuCtxGetDevice || !g_real.cuDeviceGetUuid_v2) return -ENOSYS;
  CUresult r = g_real.cuCtxGetDevice(&dev);
  if (r != CUDA_SUCCESS) return cu_errno(r);
  if (dev < 0 || dev >= KVS_TENSOR_MAX_DEVICES) return -ERANGE;
  if (!atomic_load_explicit(&g_uuid_ok[dev], memory_order_acquire)) {
    CUuuid u;
    r = g_real.cuDeviceGetUuid_v2(&u, dev);
    if (r != CUDA_SUCCESS) return cu_errno(r);
    memcpy(g_uuid[dev], u.bytes, KVS_TENSOR_UUID_SIZE); /* same bytes if two threads race */
    atomic_store_explicit(&g_uuid_ok[dev], true, memory_order_release);
  }
  memcpy(out, g_uuid[dev], KVS_TENSOR_UUID_SIZE);
  return 0;
}

/* kvshim's own driver calls (registration, IPC handles, copies, pins) run in RELAXED stream
 * capture mode: in the default GLOBAL mode one of them, from any thread, while an engine
 * captures a stream in GLOBAL mode would fail and invalidate the engine's capture (cuda.h,
 * cuThreadExchangeStreamCaptureMode; design §9.6). The thread's own mode is restored after.
 * Before the driver is initialised there is no capture: nothing to exchange. */
typedef struct cu_relax {
  CUstreamCaptureMode prev;
  bool set;
} cu_relax_t;
static cu_relax_t cu_relax(void) {
  cu_relax_t x = {.prev = CU_STREAM_CAPTURE_MODE_RELAXED, .set = false};
  if (g_real.cuThreadExchangeStreamCaptureMode &&
      g_real.cuThreadExchangeStreamCaptureMode(&x.prev) == CUDA_SUCCESS)
    x.set = true;
  return x;
}
static void cu_unrelax(cu_relax_t x) {
  if (x.set) g_real.cuThreadExchangeStreamCaptureMode(&x.prev);
}

typedef struct cu_ctx_scope {
  bool pushed;       /* a context was pushed for the call */
  CUdevice retained; /* primary context retained for the call, or -1 */
} cu_ctx_scope_t;
static int cu_ctx_enter(const cu_real_t *R, const void *ptr, cu_ctx_scope_t *sc);
static void cu_ctx_leave(const cu_real_t *R, const cu_ctx_scope_t *sc);

/* ---- registration in pieces ------------------------------------------------------------------ */

static CUresult cu_register(void *p, uint64_t len, unsigned flags) {
  if (!g_real.cuMemHostRegister_v2 || !g_real.cuMemHostUnregister) return cu_missing();
  for (uint64_t done = 0; done < len; done += CU_REGISTER_PIECE) {
    uint64_t n = len - done < CU_REGISTER_PIECE ? len - done : CU_REGISTER_PIECE;
    CUresult r = g_real.cuMemHostRegister_v2((char *)p + done, (size_t)n, flags);
    if (r != CUDA_SUCCESS) {
      for (uint64_t undo = 0; undo < done; undo += CU_REGISTER_PIECE)
        g_real.cuMemHostUnregister((char *)p + undo);
      return r;
    }
  }
  return CUDA_SUCCESS;
}
static CUresult cu_unregister(void *p, uint64_t len) {
  CUresult first = CUDA_SUCCESS;
  if (!g_real.cuMemHostUnregister) return cu_missing();
  for (uint64_t done = 0; done < len; done += CU_REGISTER_PIECE) {
    CUresult r = g_real.cuMemHostUnregister((char *)p + done);
    if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) first = r;
  }
  return first;
}

/* ---- host arena -------------------------------------------------------------------------- */

static void cu_host_gauge(int64_t delta) {
  uint64_t v = delta >= 0 ? atomic_fetch_add(&g_host_used, (uint64_t)delta) + (uint64_t)delta
                          : atomic_fetch_sub(&g_host_used, (uint64_t)-delta) - (uint64_t)-delta;
  kvs_stats_set(kvs_stats_global(), KVS_STAT_host_arena_used_bytes, v);
}

/* Bytes of the host arena registered with the driver now (pieces and own extents, kept ones
 * included): stat host_arena_pinned_bytes. */
static atomic_uint_fast64_t g_pinned; /* bytes of the host arena registered now */

static void cu_pinned_gauge(int64_t delta) {
  uint64_t v = delta >= 0 ? atomic_fetch_add(&g_pinned, (uint64_t)delta) + (uint64_t)delta
                          : atomic_fetch_sub(&g_pinned, (uint64_t)-delta) - (uint64_t)-delta;
  kvs_stats_set(kvs_stats_global(), KVS_STAT_host_arena_pinned_bytes, v);
}

/* Each live pooled buffer: the flags it was asked with (cuMemHostGetFlags answers them) and its
 * length in bytes (rounded to the pool page size). Open addressing by pointer, linear probing,
 * deletion by backward shift; g_host_flags_lock. */
static struct { uintptr_t p; uint64_t len; unsigned flags; } g_host_flags[CU_HOST_BUFS];
static pthread_mutex_t g_host_flags_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t cu_hf_slot(uintptr_t p) { return (size_t)((p >> 12) * 0x9E3779B97F4A7C15ull >> 52); }
_Static_assert(CU_HOST_BUFS == 1u << 12, "cu_hf_slot gives 12 bits");

/* -ENOSPC when the table is full (the request is then forwarded). */
static int cu_hf_put(uintptr_t p, uint64_t len, unsigned flags) {
  int rc = -ENOSPC;
  pthread_mutex_lock(&g_host_flags_lock);
  for (size_t n = 0, i = cu_hf_slot(p); n < CU_HOST_BUFS - 1; n++, i = (i + 1) % CU_HOST_BUFS)
    if (!g_host_flags[i].p) {
      g_host_flags[i].p = p;
      g_host_flags[i].len = len;
      g_host_flags[i].flags = flags;
      rc = 0;
      break;
    }
  pthread_mutex_unlock(&g_host_flags_lock);
  return rc;
}
/* The flags and length of buffer p (and forget them when drop): -ENOENT when p is no pooled
 * buffer. len may be NULL. */
static int cu_hf_get(uintptr_t p, unsigned *flags, uint64_t *len, bool drop) {
  int rc = -ENOENT;
  pthread_mutex_lock(&g_host_flags_lock);
  size_t i = cu_hf_slot(p);
  for (size_t n = 0; n < CU_HOST_BUFS && g_host_flags[i].p; n++, i = (i + 1) % CU_HOST_BUFS)
    if (g_host_flags[i].p == p) {
      *flags = g_host_flags[i].flags;
      if (len) *len = g_host_flags[i].len;
      rc = 0;
      break;
    }
  if (rc == 0 && drop) {
    /* Backward shift: move later entries of the run into the hole when their home allows. */
    size_t hole = i;
    for (size_t j = (i + 1) % CU_HOST_BUFS; g_host_flags[j].p; j = (j + 1) % CU_HOST_BUFS) {
      size_t home = cu_hf_slot(g_host_flags[j].p);
      if ((j - home) % CU_HOST_BUFS >= (j - hole) % CU_HOST_BUFS) {
        g_host_flags[hole] = g_host_flags[j];
        hole = j;
      }
    }
    g_host_flags[hole].p = 0;
  }
  pthread_mutex_unlock(&g_host_flags_lock);
  return rc;
}

/* Do pooled buffers reach every device at their host address? Every device must have unified
 * addressing and CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM (cuda.h, cuMemHostRegister: "If all
 * devices visible to the application have a non-zero value for the device attribute, the
 * device pointer returned by cuMemHostGetDevicePointer() will match the original pointer").
 * Asked once the driver answers; while it does not (not initialised), the answer is no and
 * asked again next time. */
static atomic_int g_host_devs; /* 0 not known, 1 yes, -1 no */
static bool cu_host_devices_ok(void) {
  int v = atomic_load_explicit(&g_host_devs, memory_order_acquire);
  if (v) return v > 0;
  int n = 0;
  if (!g_real.cuDeviceGetCount || !g_real.cuDeviceGetAttribute || !g_real.cuDeviceGet ||
      g_real.cuDeviceGetCount(&n) != CUDA_SUCCESS || n <= 0)
    return false;
  v = 1;
  for (int i = 0; i < n && v > 0; i++) {
    CUdevice d;
    int uva = 0, hp = 0;
    if (g_real.cuDeviceGet(&d, i) != CUDA_SUCCESS ||
        g_real.cuDeviceGetAttribute(&uva, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, d) !=
            CUDA_SUCCESS ||
        g_real.cuDeviceGetAttribute(
            &hp, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, d) != CUDA_SUCCESS)
      return false; /* not known yet */
    if (!uva || !hp) {
      kvs_log_info("device %d: unified addressing %d, host pointer for registered memory %d: "
                   "host allocations are left to the driver", i, uva, hp);
      v = -1;
    }
  }
  atomic_store_explicit(&g_host_devs, v, memory_order_release);
  return v > 0;
}

/* Freed pooled buffers stay registered (and allocated in the pool) for the next host
 * allocation that fits: pinning costs ~0.1 s/GB (design §9.6: keep extents registered across
 * free and alloc). At most CU_KEEP extents; a request takes the smallest kept extent of at
 * least its size and at most twice it; when the arena is full every kept extent is
 * unregistered and returned to the pool. Entries with len 0 are empty; g_keep_lock. */
#define CU_KEEP 16
static struct { uint64_t off, len; } g_keep[CU_KEEP];
static pthread_mutex_t g_keep_lock = PTHREAD_MUTEX_INITIALIZER;

static bool cu_keep_take(uint64_t need, uint64_t *off, uint64_t *len) {
  int best = -1;
  pthread_mutex_lock(&g_keep_lock);
  for (int i = 0; i < CU_KEEP; i++)
    if (g_keep[i].len >= need && g_keep[i].len / 2 <= need &&
        (best < 0 || g_keep[i].len < g_keep[best].len))
      best = i;
  if (best >= 0) {
    *off = g_keep[best].off;
    *len = g_keep[best].len;
    g_keep[best].len = 0;
  }
  pthread_mutex_unlock(&g_keep_lock);
  return best >= 0;
}
static bool cu_keep_put(uint64_t off, uint64_t len) {
  bool kept = false;
  pthread_mutex_lock(&g_keep_lock);
  for (int i = 0; i < CU_KEEP && !kept; i++)
    if (!g_keep[i].len) {
      g_keep[i].off = off;
      g_keep[i].len = len;
      kept = true;
    }
  pthread_mutex_unlock(&g_keep_lock);
  return kept;
}
/* Unregister a pooled extent (in a context of its device, from any thread) and return it. */
static void cu_host_release(kvs__runtime_t *rt, uint64_t off, uint64_t len) {
  void *p = kvs_pool_base(rt->pool) + off;
  cu_ctx_scope_t sc;
  cu_relax_t rx = cu_relax();
  CUresult u = cu_ctx_enter(&g_real, p, &sc) == 0 ? cu_unregister(p, len)
                                                  : CUDA_ERROR_INVALID_CONTEXT;
  cu_ctx_leave(&g_real, &sc);
  cu_unrelax(rx);
  if (u != CUDA_SUCCESS) kvs_log_debug("cuMemHostUnregister of a host-arena buffer: %d", (int)u);
  cu_pinned_gauge(-(int64_t)len);
  kvs_pool_free(rt->pool, KVS_ARENA_HOST, off);
}
/* Wait for the work queued on host-arena memory p (cuMemFreeHost's guarantee, below): a
 * synchronisation of the context that holds it (the thread's current one on p's device, else
 * the device's primary context while the engine holds it). */
static void cu_host_quiesce(void *p) {
  cu_ctx_scope_t sc;
  cu_relax_t rx = cu_relax();
  if (cu_ctx_enter(&g_real, p, &sc) == 0 && g_real.cuCtxSynchronize) {
    CUresult r = g_real.cuCtxSynchronize();
    if (r != CUDA_SUCCESS) kvs_log_debug("cuCtxSynchronize at a pooled cuMemFreeHost: %d", (int)r);
  }
  cu_ctx_leave(&g_real, &sc);
  cu_unrelax(rx);
}
/* Release every kept extent; true when there was one. */
static bool cu_keep_release_all(kvs__runtime_t *rt) {
  bool any = false;
  for (;;) {
    uint64_t off = 0, len = 0;
    pthread_mutex_lock(&g_keep_lock);
    for (int i = 0; i < CU_KEEP && !len; i++)
      if (g_keep[i].len) {
        off = g_keep[i].off;
        len = g_keep[i].len;
        g_keep[i].len = 0;
      }
    pthread_mutex_unlock(&g_keep_lock);
    if (!len) return any;
    cu_host_release(rt, off, len);
    any = true;
  }
}

/* Start fn(arg) on a detached thread with every signal blocked (kvshim's threads must not take
 * the engine's signals). 0 or a negative errno. */
static int cu_spawn(void *(*fn)(void *), void *arg) {
  pthread_attr_t at;
  pthread_t t;
  int rc = pthread_attr_init(&at);
  if (rc == 0) {
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    rc = kvs__prim_thread_start(&t, &at, fn, arg);
    pthread_attr_destroy(&at);
  } else {
    rc = -rc;
  }
  return rc;
}

/* ---- pinning on demand, in pieces (design §9.6; issue 23 items 1-3) --------------------------
 * KVSHIM_CUDA_PIN_ARENA=1 (the default). A buffer of at most one piece is carved from a piece:
 * an extent of the host arena of g_piece_len bytes (CU_PIN_PIECE, or the whole arena when it is
 * smaller), registered PORTABLE|DEVICEMAP by exactly one cuMemHostRegister call. So:
 *   - the first pinned allocation is served from a piece registered inside it (the engine
 *     waits for one piece, ~6 ms at 0.1 s/GB, never for the arena);
 *   - a buffer never straddles two pieces (two registrations are two driver allocations: a copy
 *     or kernel spanning both is refused, as the fake driver's span check enforces);
 *   - when less than half a piece is left free in the registered pieces, one background thread
 *     at nice 19 (kvs__prim_thread_background, never SCHED_IDLE: the driver pins under the
 *     mmap read lock, and an idle thread holding it stalls the engine's mmap/munmap) registers
 *     the next piece, one piece per call; the engine's call registers one itself only when
 *     the pieces ran out before that thread was done;
 *   - a piece whose buffers are all freed stays registered for reuse while it is the only free
 *     margin; beyond half a piece of other free room it is unregistered and returned.
 * Locked memory (stat host_arena_pinned_bytes) is therefore what the pieces hand out plus less
 * than one and a half pieces: after one 16 MiB allocation, one 64 MiB piece.
 * Within a piece, buffers are handed out by bumping: bump is the end of the highest buffer,
 * live the number of buffers alive; when live drops to 0, bump returns to 0 (the whole piece is
 * free again). Buffers larger than a piece (and every buffer with the option off) get their own
 * extent and registration, inline, as the driver's own cuMemHostAlloc would pin them.
 * Invariants (g_piece_lock): for every used slot, 0 <= bump <= g_piece_len and live == 0 =>
 * bump == 0; the buffers of a piece lie in [off, off + bump). */
#define CU_PIN_PIECE (64ull << 20)
#define CU_PIECES 4096 /* pieces registered at once (256 GiB of 64 MiB pieces) */
typedef struct cu_piece {
  uint64_t off;  /* segment offset of the piece's extent */
  uint64_t bump; /* bytes from off handed out (buffers and the holes freed among them) */
  uint32_t live; /* buffers alive in the piece */
  bool used;     /* slot holds a registered piece */
} cu_piece_t;
static cu_piece_t g_pieces[CU_PIECES];
static pthread_mutex_t g_piece_lock = PTHREAD_MUTEX_INITIALIZER;
/* Held by an engine thread registering a piece inline (never by the background thread, so an
 * engine never waits for a nice-19 thread): concurrent first calls register one piece, and
 * the others wait for it instead of registering one each or forwarding to the driver. */
static pthread_mutex_t g_piece_inline_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_piece_len;      /* bytes per piece, set at family init; 0: no pieces */
static atomic_bool g_ahead_busy;  /* the background thread is registering a piece */

/* Register [p, p + len) of the host arena from any thread, in a context of the device that
 * holds it (cu_ctx_enter), in relaxed capture mode. */
static CUresult cu_host_register(void *p, uint64_t len) {
  cu_ctx_scope_t sc;
  cu_relax_t rx = cu_relax();
  CUresult r = cu_ctx_enter(&g_real, p, &sc) == 0
                   ? cu_register(p, len, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)
                   : CUDA_ERROR_INVALID_CONTEXT;
  cu_ctx_leave(&g_real, &sc);
  cu_unrelax(rx);
  if (r == CUDA_SUCCESS) cu_pinned_gauge((int64_t)len);
  return r;
}

/* Caller holds g_piece_lock. Free bytes left in the registered pieces. */
static uint64_t cu_piece_room_locked(void) {
  uint64_t room = 0;
  for (int i = 0; i < CU_PIECES; i++)
    if (g_pieces[i].used) room += g_piece_len - g_pieces[i].bump;
  return room;
}
/* Caller holds g_piece_lock. Take len bytes from a piece: the fullest piece with room first,
 * so empty pieces stay empty (and can be given back). The buffer's offset, or 0 when none
 * has room. */
static uint64_t cu_piece_take_locked(uint64_t len) {
  int best = -1;
  for (int i = 0; i < CU_PIECES; i++)
    if (g_pieces[i].used && g_piece_len - g_pieces[i].bump >= len &&
        (best < 0 || g_pieces[i].bump > g_pieces[best].bump))
      best = i;
  if (best < 0) return 0;
  uint64_t off = g_pieces[best].off + g_pieces[best].bump;
  g_pieces[best].bump += len;
  g_pieces[best].live++;
  return off;
}
/* Caller holds g_piece_lock. Adds the registered piece at off; false when the table is full. */
static bool cu_piece_add_locked(uint64_t off) {
  for (int i = 0; i < CU_PIECES; i++)
    if (!g_pieces[i].used) {
      g_pieces[i] = (cu_piece_t){.off = off, .bump = 0, .live = 0, .used = true};
      return true;
    }
  return false;
}

/* Register one more piece (its extent taken from the pool) and add it: 0 or a negative errno
 * (-ENOSPC: no room in the arena or the table). */
static int cu_piece_new(kvs__runtime_t *rt) {
  uint64_t off;
  int rc = kvs_pool_alloc(rt->pool, KVS_ARENA_HOST, g_piece_len, &off);
  if (rc < 0) return rc;
  void *p = kvs_pool_base(rt->pool) + off;
  CUresult r = cu_host_register(p, g_piece_len);
  if (r != CUDA_SUCCESS) {
    kvs_pool_free(rt->pool, KVS_ARENA_HOST, off);
    kvs_log_debug("host-arena piece of %llu bytes not registered: %d",
                  (unsigned long long)g_piece_len, (int)r);
    return cu_errno(r);
  }
  pthread_mutex_lock(&g_piece_lock);
  bool added = cu_piece_add_locked(off);
  pthread_mutex_unlock(&g_piece_lock);
  if (!added) {
    cu_host_release(rt, off, g_piece_len);
    return -ENOSPC;
  }
  return 0;
}

static void *cu_piece_ahead_main(void *arg) {
  kvs__runtime_t *rt = arg;
  kvs__prim_thread_background();
  pthread_mutex_lock(&g_piece_lock);
  bool need = cu_piece_room_locked() < g_piece_len / 2;
  pthread_mutex_unlock(&g_piece_lock);
  if (need && cu_rt_if_active() == rt && cu_piece_new(rt) == 0)
    kvs_stats_inc(kvs_stats_global(), KVS_STAT_host_arena_pieces_ahead);
  atomic_store(&g_ahead_busy, false);
  return NULL;
}
/* After a piece handed out a buffer: start the background registration of the next piece when
 * less than half a piece is left and none is being registered. */
static void cu_piece_ahead(kvs__runtime_t *rt) {
  pthread_mutex_lock(&g_piece_lock);
  bool need = cu_piece_room_locked() < g_piece_len / 2;
  pthread_mutex_unlock(&g_piece_lock);
  if (!need || atomic_exchange(&g_ahead_busy, true)) return;
  if (cu_spawn(cu_piece_ahead_main, rt) != 0) atomic_store(&g_ahead_busy, false);
}

/* A buffer of len bytes (at most one piece) from the pieces, registering one inline when none
 * has room (one engine thread at a time: a thread that waited takes from the piece the other
 * registered): its offset, or 0 (the caller then gives the buffer an extent of its own). */
static uint64_t cu_piece_alloc(kvs__runtime_t *rt, uint64_t len) {
  pthread_mutex_lock(&g_piece_lock);
  uint64_t off = cu_piece_take_locked(len);
  pthread_mutex_unlock(&g_piece_lock);
  if (!off) {
    pthread_mutex_lock(&g_piece_inline_lock);
    pthread_mutex_lock(&g_piece_lock);
    off = cu_piece_take_locked(len);
    pthread_mutex_unlock(&g_piece_lock);
    if (!off && cu_piece_new(rt) == 0) {
      kvs_stats_inc(kvs_stats_global(), KVS_STAT_host_arena_inline_pins);
      pthread_mutex_lock(&g_piece_lock);
      off = cu_piece_take_locked(len);
      pthread_mutex_unlock(&g_piece_lock);
    }
    pthread_mutex_unlock(&g_piece_inline_lock);
  }
  if (off) cu_piece_ahead(rt);
  return off;
}

/* The buffer at off (len bytes) goes back to its piece; false when off lies in no piece. A
 * piece left empty is given back (unregistered, its extent freed) when the other pieces keep
 * at least half a piece free. */
static bool cu_piece_free(kvs__runtime_t *rt, uint64_t off) {
  int at = -1;
  bool give_back = false;
  pthread_mutex_lock(&g_piece_lock);
  for (int i = 0; i < CU_PIECES && at < 0; i++)
    if (g_pieces[i].used && off >= g_pieces[i].off && off < g_pieces[i].off + g_pieces[i].bump)
      at = i;
  uint64_t poff = at >= 0 ? g_pieces[at].off : 0;
  if (at >= 0 && --g_pieces[at].live == 0) {
    g_pieces[at].bump = 0;
    give_back = cu_piece_room_locked() - g_piece_len >= g_piece_len / 2;
    if (give_back) g_pieces[at].used = false;
  }
  pthread_mutex_unlock(&g_piece_lock);
  if (give_back) cu_host_release(rt, poff, g_piece_len);
  return at >= 0;
}

/* Give back every empty piece (the arena is full and a buffer larger than a piece needs
 * room); true when there was one. */
static bool cu_piece_release_empty(kvs__runtime_t *rt) {
  bool any = false;
  for (;;) {
    uint64_t off = 0;
    pthread_mutex_lock(&g_piece_lock);
    for (int i = 0; i < CU_PIECES && !off; i++)
      if (g_pieces[i].used && !g_pieces[i].live) {
        off = g_pieces[i].off;
        g_pieces[i].used = false;
      }
    pthread_mutex_unlock(&g_piece_lock);
    if (!off) return any;
    cu_host_release(rt, off, g_piece_len);
    any = true;
  }
}

static bool cu_pieces_on(const kvs__runtime_t *rt) {
  return rt->opts.cuda_pin_arena && g_piece_len;
}

/* Serve a host allocation from the arena. 0 with *pp set, or a negative errno (the caller then
 * forwards the request to the real allocator, untouched). asked: the caller's cuMemHostAlloc
 * flags (0 for cuMemAllocHost_v2), answered by cuMemHostGetFlags. */
static int cu_host_take(kvs__runtime_t *rt, void **pp, size_t bytesize, unsigned asked) {
  kvs_stats_t *st = kvs_stats_global();
  if (!cu_host_devices_ok()) {
    kvs_stats_inc(st, KVS_STAT_host_arena_fallbacks);
    return -ENOTSUP;
  }
  uint64_t off = 0, len = KVS__ALIGN_UP((uint64_t)bytesize, (uint64_t)kvs_pool_page_size(rt->pool));
  bool pieces = cu_pieces_on(rt);
  bool in_piece = pieces && len <= g_piece_len && (off = cu_piece_alloc(rt, len)) != 0;
  bool kept = !in_piece && !pieces && cu_keep_take(len, &off, &len);
  int rc = 0;
  if (!in_piece && !kept) {
    rc = kvs_pool_alloc(rt->pool, KVS_ARENA_HOST, bytesize, &off);
    if (rc < 0 && (pieces ? cu_piece_release_empty(rt) : cu_keep_release_all(rt)))
      rc = kvs_pool_alloc(rt->pool, KVS_ARENA_HOST, bytesize, &off);
  }
  if (rc < 0) {
    kvs_stats_inc(st, KVS_STAT_host_arena_fallbacks);
    return rc;
  }
  void *p = kvs_pool_base(rt->pool) + off;
  cu_relax_t rx = cu_relax();
  CUresult r = CUDA_SUCCESS;
  bool own = !in_piece && !kept; /* registered here for this buffer alone */
  if (own) {
    r = cu_register(p, len, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    kvs_stats_inc(st, KVS_STAT_host_arena_inline_pins);
    if (r == CUDA_SUCCESS) cu_pinned_gauge((int64_t)len);
  }
  if (r == CUDA_SUCCESS) {
    /* Usable only where the driver's own buffer would be: at its host address (a kept extent
     * or a piece too: its registration went away if the engine reset its device). */
    CUdeviceptr dp = 0;
    if (!g_real.cuMemHostGetDevicePointer_v2 ||
        g_real.cuMemHostGetDevicePointer_v2(&dp, p, 0) != CUDA_SUCCESS ||
        dp != (CUdeviceptr)(uintptr_t)p)
      r = CUDA_ERROR_NOT_SUPPORTED;
    else if (cu_hf_put((uintptr_t)p, len, asked) < 0)
      r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  cu_unrelax(rx);
  if (r != CUDA_SUCCESS) {
    /* Typically CUDA not initialised or no current context: the driver's own allocator will
     * report exactly that to the caller. */
    if (in_piece) {
      cu_piece_free(rt, off);
    } else if (own && r != CUDA_ERROR_NOT_SUPPORTED && r != CUDA_ERROR_OUT_OF_MEMORY) {
      kvs_pool_free(rt->pool, KVS_ARENA_HOST, off); /* the registration failed */
    } else {
      cu_host_release(rt, off, len);
    }
    kvs_stats_inc(st, KVS_STAT_host_arena_fallbacks);
    kvs_log_debug("host-arena buffer not usable (%d): forwarded", (int)r);
    return -EIO;
  }
  kvs_tensor_desc_t tmpl;
  memset(&tmpl, 0, sizeof tmpl);
  tmpl.kind = KVS_TENSOR_CPU_SHM;
  tmpl.cpu.instance_id = rt->instance_id;
  tmpl.cpu.offset = off;
  rc = kvs_tensor_registry_add(rt->tensors, (uint64_t)(uintptr_t)p, len, &tmpl, true);
  if (rc < 0) kvs_log_debug("host-arena buffer not recorded for export: %s", strerror(-rc));
  cu_host_gauge((int64_t)len);
  kvs_stats_inc(st, KVS_STAT_host_arena_allocs);
  *pp = p;
  return 0;
}

static bool cu_host_eligible(const kvs__runtime_t *rt, void **pp, size_t bytesize) {
  return pp && bytesize > 0 && rt->host_hi && bytesize >= rt->opts.host_min;
}

/* ---- IPC leases (issue 14 item 3, issue 23 item 5) ------------------------------------------
 * cuda.h (cuIpcOpenMemHandle): "Calling cuMemFree on an exported memory region before calling
 * cuIpcCloseMemHandle in the importing context will result in undefined behavior." So every
 * export carries a generation, pid << 32 | slot << 16 | tag, and the process keeps one lease
 * file, CU_LEASE_DIR/kvshim-ipc-<uid>-<pid> (mode 0600), of 2-byte cells: cell slot holds tag
 * (little-endian) while the export of that generation lives and 0 after its free. Slots are
 * reused (a freed one goes on g_lease_free; its next export gets the next tag, 1..65535), so the
 * file is at most 2 * CU_LEASE_SLOTS bytes (NCCL shares /dev/shm) and grows only with the
 * exports alive at once; with every slot live, a new allocation gets no generation. An importer
 * (open_ipc) opens the exporter's file, takes an open-file-description read lock on the cell and
 * reads it: a missing file or another tag is a stale generation (-ESTALE); it holds the lock
 * until close_ipc. The exporter's cuMemFree takes the write lock on the cell (waiting while an
 * importer holds it, at most CU_LEASE_WAIT_MS, then warns and frees anyway), writes 0, frees,
 * and the slot is free again. No file, no generation: the allocation is recorded as not
 * exportable. The file is removed at exit; when a process makes its file, it also removes the
 * files of this uid's processes that no longer exist (killed ones never ran their exit). */
#define CU_LEASE_DIR "/dev/shm"
#define CU_LEASE_PREFIX "kvshim-ipc-"
#define CU_LEASE_WAIT_MS 5000
#define CU_LEASE_SLOTS 16384 /* exports alive at once */
static int g_lease_fd = -1;
static uint16_t g_lease_tag[CU_LEASE_SLOTS];  /* tag of each slot's last export */
static uint16_t g_lease_free[CU_LEASE_SLOTS]; /* free slots below g_lease_high (a stack) */
static uint32_t g_lease_nfree, g_lease_high;
static pthread_mutex_t g_lease_lock = PTHREAD_MUTEX_INITIALIZER;

static void cu_lease_path(char *buf, size_t cap, uint32_t pid) {
  snprintf(buf, cap, CU_LEASE_DIR "/" CU_LEASE_PREFIX "%u-%u", (unsigned)getuid(), (unsigned)pid);
}
static void cu_lease_atexit(void) {
  char path[128];
  if (g_lease_fd < 0) return;
  cu_lease_path(path, sizeof path, (uint32_t)getpid());
  unlink(path);
}
static uint32_t cu_gen_slot(uint64_t gen) { return (uint32_t)(gen >> 16) & 0xffffu; }
static uint16_t cu_gen_tag(uint64_t gen) { return (uint16_t)gen; }

/* Remove the lease files of this uid's processes that no longer exist. Importers that still
 * hold one open keep their own inode; a new process with a dead one's pid unlinks it anyway. */
static void cu_lease_sweep(void) {
  char prefix[64];
  int n = snprintf(prefix, sizeof prefix, CU_LEASE_PREFIX "%u-", (unsigned)getuid());
  DIR *d = opendir(CU_LEASE_DIR);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, prefix, (size_t)n) != 0) continue;
    char *end;
    errno = 0;
    unsigned long pid = strtoul(e->d_name + n, &end, 10);
    if (errno || *end || pid == 0 || pid > INT32_MAX) continue;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
      if (unlinkat(dirfd(d), e->d_name, 0) == 0) kvs_log_debug("removed the IPC lease file of dead process %lu", pid);
    }
  }
  closedir(d);
}

/* A new generation with its cell set, or 0 when there is no lease file or no free slot. */
static uint64_t cu_lease_new(void) {
  static bool atexit_done;
  uint64_t gen = 0;
  uint32_t pid = (uint32_t)getpid();
  pthread_mutex_lock(&g_lease_lock);
  if (g_lease_fd < 0) {
    char path[128];
    cu_lease_sweep();
    cu_lease_path(path, sizeof path, pid);
    unlink(path); /* a dead process's with this pid: its importers keep their own inode */
    g_lease_fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (g_lease_fd < 0) kvs_log_debug("no IPC lease file %s: %s", path, strerror(errno));
    if (g_lease_fd >= 0 && !atexit_done) atexit_done = atexit(cu_lease_atexit) == 0;
  }
  uint32_t slot = UINT32_MAX;
  if (g_lease_fd >= 0 && g_lease_nfree) slot = g_lease_free[--g_lease_nfree];
  else if (g_lease_fd >= 0 && g_lease_high < CU_LEASE_SLOTS) slot = g_lease_high++;
  if (slot != UINT32_MAX) {
    uint16_t tag = (uint16_t)(g_lease_tag[slot] + 1u);
    if (!tag) tag = 1;
    uint8_t cell[2] = {(uint8_t)tag, (uint8_t)(tag >> 8)};
    if (pwrite(g_lease_fd, cell, 2, (off_t)slot * 2) == 2) {
      g_lease_tag[slot] = tag;
      gen = (uint64_t)pid << 32 | (uint64_t)slot << 16 | tag;
    } else {
      g_lease_free[g_lease_nfree++] = (uint16_t)slot;
    }
  }
  pthread_mutex_unlock(&g_lease_lock);
  return gen;
}

static int cu_lease_lock(int fd, uint64_t gen, short type) {
  struct flock fl = {.l_type = type, .l_whence = SEEK_SET,
                     .l_start = (off_t)cu_gen_slot(gen) * 2, .l_len = 2};
  return fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : -errno;
}

/* The export of gen ends: wait (bounded) until no importer holds it, then mark it stale and
 * free its slot. wait: false for an allocation already gone (freed behind kvshim's back). */
static void cu_lease_end(uint64_t gen, bool wait) {
  if (!gen || gen >> 32 != (uint32_t)getpid() || g_lease_fd < 0) return;
  struct timespec t0, now, nap = {0, 1000000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc;
  while ((rc = cu_lease_lock(g_lease_fd, gen, F_WRLCK)) == -EAGAIN && wait) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 >= CU_LEASE_WAIT_MS)
      break;
    nanosleep(&nap, NULL);
  }
  if (rc < 0 && wait)
    kvs_log_warn("freeing device memory another process still has open after %d ms (generation "
                 "%llx): %s", CU_LEASE_WAIT_MS, (unsigned long long)gen, strerror(-rc));
  uint32_t slot = cu_gen_slot(gen);
  if (pwrite(g_lease_fd, "\0\0", 2, (off_t)slot * 2) != 2)
    kvs_log_debug("IPC lease %llx not marked: %s", (unsigned long long)gen, strerror(errno));
  if (rc == 0) cu_lease_lock(g_lease_fd, gen, F_UNLCK);
  pthread_mutex_lock(&g_lease_lock);
  if (slot < g_lease_high && g_lease_tag[slot] == cu_gen_tag(gen) && g_lease_nfree < CU_LEASE_SLOTS)
    g_lease_free[g_lease_nfree++] = (uint16_t)slot;
  pthread_mutex_unlock(&g_lease_lock);
}

/* Importer: take the lease of d's generation into *fd (held until closed; -1 for a descriptor
 * without a generation). -ESTALE when the export is gone or being freed. */
static int cu_lease_take(const kvs_tensor_desc_t *d, int *fd) {
  uint64_t gen = d->ipc.generation;
  *fd = -1;
  if (!gen) return 0;
  char path[128];
  cu_lease_path(path, sizeof path, (uint32_t)(gen >> 32));
  int f = open(path, O_RDONLY | O_CLOEXEC);
  if (f < 0) return errno == ENOENT ? -ESTALE : -errno;
  uint8_t cell[2] = {0, 0};
  int rc = cu_lease_lock(f, gen, F_RDLCK); /* -EAGAIN: the exporter is freeing it now */
  if (rc == 0 && pread(f, cell, 2, (off_t)cu_gen_slot(gen) * 2) != 2) cell[0] = cell[1] = 0;
  if (rc < 0 || (uint16_t)(cell[0] | cell[1] << 8) != cu_gen_tag(gen) || !cu_gen_tag(gen)) {
    close(f);
    return -ESTALE;
  }
  *fd = f;
  return 0;
}

/* ---- device records -------------------------------------------------------------------------- */

/* Record a device allocation in the tensor registry; want_ipc: one cuIpcGetMemHandle can
 * export (cuMemAlloc memory), else it is listed as not exportable (design §9.4). */
static void cu_record_device(kvs__runtime_t *rt, CUdeviceptr base, uint64_t len, bool want_ipc) {
  if (!len) return;
  kvs_tensor_desc_t tmpl;
  memset(&tmpl, 0, sizeof tmpl);
  tmpl.kind = KVS_TENSOR_CUDA_IPC;
  tmpl.ipc.offset = 0;
  tmpl.ipc.alloc_len = len;
  bool exportable = false;
  CUipcMemHandle h;
  cu_relax_t rx = cu_relax();
  if (want_ipc && cu_current_uuid(tmpl.device_uuid) == 0 && g_real.cuIpcGetMemHandle &&
      g_real.cuIpcGetMemHandle(&h, base) == CUDA_SUCCESS) {
    _Static_assert(sizeof h.reserved == KVS_TENSOR_IPC_HANDLE_SIZE, "IPC handle size");
    memcpy(tmpl.ipc.handle, h.reserved, KVS_TENSOR_IPC_HANDLE_SIZE);
    tmpl.ipc.generation = cu_lease_new();
    exportable = tmpl.ipc.generation != 0; /* no lease, no export (item 3) */
  }
  cu_unrelax(rx);
  int rc = kvs_tensor_registry_add(rt->tensors, (uint64_t)base, len, &tmpl, exportable);
  if (rc == -EEXIST) {
    /* Records of allocations freed behind our back (a destroyed context frees everything it
     * owned without cuMemFree): the driver just handed the range out again, so they are stale. */
    kvs_tensor_record_t old;
    while (kvs_tensor_registry_lookup(rt->tensors, (uint64_t)base, &old) == 0 ||
           kvs_tensor_registry_lookup(rt->tensors, (uint64_t)base + len - 1, &old) == 0) {
      kvs_tensor_registry_remove(rt->tensors, old.base, NULL);
      if (old.exportable) cu_lease_end(old.desc.ipc.generation, false);
    }
    rc = kvs_tensor_registry_add(rt->tensors, (uint64_t)base, len, &tmpl, exportable);
  }
  if (rc < 0) {
    kvs_log_debug("device allocation not recorded: %s", strerror(-rc));
    cu_lease_end(tmpl.ipc.generation, false);
    return;
  }
  kvs_stats_inc(kvs_stats_global(), KVS_STAT_cuda_device_allocs);
  if (exportable) kvs_stats_inc(kvs_stats_global(), KVS_STAT_cuda_device_exportable);
  if (!want_ipc) kvs_stats_inc(kvs_stats_global(), KVS_STAT_cuda_device_unexportable);
}

/* ---- substitution: real pointer -> wrapper of exactly that variant ------------------------- */

/* One debug line the first time each row is routed to kvshim by each route, so an operator
 * (and the cudart test) can see which hooks a program reaches. Never on a later call. */
enum { CU_ROUTE_DLSYM = 0, CU_ROUTE_GPA = 1 };
static atomic_bool g_routed[2][KVS__NHOOKS];
static void cu_note_route(int route, size_t row) {
  if (!atomic_load_explicit(&g_routed[route][row], memory_order_relaxed) &&
      !atomic_exchange(&g_routed[route][row], true))
    kvs_log_debug("%s: %s -> kvshim", route == CU_ROUTE_DLSYM ? "dlsym" : "cuGetProcAddress",
                  kvs__row_names[row]);
}

/* Interception proven at exit: when the resolver handed out kvshim's allocation wrappers (the
 * CUDA runtime fetches every entry point that way), the runtime initialised (a primary context
 * is active) and yet no allocation ever reached a hook, the process allocates through a route
 * kvshim does not see: warned once. */
static atomic_bool g_alloc_reached; /* an allocation hook body ran */
static inline void cu_alloc_seen(void) {
  if (!atomic_load_explicit(&g_alloc_reached, memory_order_relaxed))
    atomic_store_explicit(&g_alloc_reached, true, memory_order_relaxed);
}
static bool cu_is_alloc_row(size_t row) {
  return row == kvs__row_cuMemAlloc_v2 || row == kvs__row_cuMemAllocPitch_v2 ||
         row == kvs__row_cuMemAllocHost_v2 || row == kvs__row_cuMemHostAlloc ||
         row == kvs__row_cuMemAllocAsync || row == kvs__row_cuMemAllocAsync_ptsz ||
         row == kvs__row_cuMemAllocManaged || row == kvs__row_cuMemCreate;
}
__attribute__((destructor)) static void cu_check_interception(void) {
  bool handed = false;
  for (size_t i = 0; i < KVS__NHOOKS; i++)
    handed |= cu_is_alloc_row(i) && atomic_load(&g_routed[CU_ROUTE_GPA][i]);
  if (!handed || atomic_load(&g_alloc_reached) || !g_real.cuDeviceGetCount ||
      !g_real.cuDevicePrimaryCtxGetState)
    return;
  KVS__REENTRY_GUARD();
  int n = 0, active = 0;
  unsigned fl;
  if (g_real.cuDeviceGetCount(&n) == CUDA_SUCCESS)
    for (int d = 0; d < n && !active; d++)
      if (g_real.cuDevicePrimaryCtxGetState(d, &fl, &active) != CUDA_SUCCESS) active = 0;
  if (active)
    kvs_log_warn("the CUDA runtime was given kvshim's allocation entry points and initialised, "
                 "but no allocation reached kvshim: it allocates through a route kvshim does "
                 "not hook");
}

/* What the real resolver itself answers for each hooked row: the driver may hand out entry
 * points at other addresses than its exported symbols, and a wrapper chosen by dlsym's answer
 * alone would then never be substituted (interception silently lost). Learned once, the first
 * time an answer matches no dlsym pointer (cu_gpa_wrapper), by asking for each row's base name
 * with the default or per-thread flag (_ptsz/_ptds rows):
 *   - the newest hooked ABI of a base at the newest version both cuda.h (at build time) and
 *     the driver know (cuMemAlloc -> cuMemAlloc_v2): the resolver's answer there is the ABI
 *     cuda.h names, which is that row;
 *   - an older hooked ABI (cuGetProcAddress, v1, which libcudart asks for at 11030 before
 *     asking for cuGetProcAddress_v2 at 12000) by walking the versions engines ask down from
 *     there: the resolver answers ABIs newest first, so the k-th distinct answer is the k-th
 *     older ABI, learned only when every ABI between it and the newest is a hooked row (no
 *     unhooked ABI can be mistaken for it).
 * g_gpa_ptr is written before the release store of g_gpa_state. */
static void *g_gpa_ptr[KVS__NHOOKS];
static atomic_int g_gpa_state; /* 0 not learned, 1 learning, 2 learned */
static int g_gpa_version;      /* the version asked with (the newest) */
/* Versions engines ask at (tests/shims/cuda/cuda_facts.c lists who asks which), descending. */
static const int g_gpa_walk[] = {13000, 12080, 12020, 12000, 11030, 11020, 10020,
                                 7000,  6000,  4000,  3020,  2030,  2020,  2000};

/* Base name (into out) of an ELF name, whether it is a per-thread twin, and its ABI number
 * (1 for no _v suffix). */
static int cu_row_base(const char *name, char *out, size_t cap, bool *pt) {
  size_t n = strlen(name);
  *pt = n > 5 && (!strcmp(name + n - 5, "_ptsz") || !strcmp(name + n - 5, "_ptds"));
  if (*pt) n -= 5;
  int abi = 1;
  size_t d = n;
  while (d > 0 && name[d - 1] >= '0' && name[d - 1] <= '9') d--;
  if (d < n && d >= 2 && name[d - 1] == 'v' && name[d - 2] == '_') {
    abi = 0;
    for (size_t i = d; i < n; i++) abi = abi * 10 + (name[i] - '0');
    n = d - 2;
  }
  if (n >= cap) n = cap - 1;
  memcpy(out, name, n);
  out[n] = '\0';
  return abi;
}

/* Row i's place below the newest hooked ABI of its base and flavour: 0 for the newest, k when
 * k ABIs lie above it and all of them are hooked rows, -1 when one in between is not. */
static int cu_gpa_rank(size_t i) {
  char base[64], other[64];
  bool pt, opt;
  int abi = cu_row_base(kvs__row_names[i], base, sizeof base, &pt), newest = abi, have = 0;
  for (size_t j = 0; j < KVS__NHOOKS; j++) {
    int a = cu_row_base(kvs__row_names[j], other, sizeof other, &opt);
    if (opt != pt || strcmp(base, other) != 0 || a < abi) continue;
    if (a > newest) newest = a;
    have++; /* the rows from abi up, this one included */
  }
  return have == newest - abi + 1 ? newest - abi : -1;
}

static void cu_gpa_learn(void) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&g_gpa_state, &expected, 1)) {
    /* Another thread is asking the driver (a few dozen lookups, no lock held): wait for it. */
    while (atomic_load_explicit(&g_gpa_state, memory_order_acquire) == 1) sched_yield();
    return;
  }
  int ver = CUDA_VERSION;
  if (g_real.cuDriverGetVersion) {
    int dv = 0;
    if (g_real.cuDriverGetVersion(&dv) == CUDA_SUCCESS && dv > 0 && dv < ver) ver = dv;
  }
  g_gpa_version = ver;
  for (size_t i = 0; i < KVS__NHOOKS && g_real.cuGetProcAddress_v2; i++) {
    char base[64];
    bool pt;
    cu_row_base(kvs__row_names[i], base, sizeof base, &pt);
    int rank = cu_gpa_rank(i), seen = -1;
    if (rank < 0) continue;
    cuuint64_t fl =
        pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
    void *last = NULL;
    for (size_t k = 0; k <= sizeof g_gpa_walk / sizeof g_gpa_walk[0] && seen < rank; k++) {
      int v = k == 0 ? ver : g_gpa_walk[k - 1];
      if (k > 0 && v >= ver) continue;
      void *p = NULL;
      CUdriverProcAddressQueryResult qs;
      if (g_real.cuGetProcAddress_v2(base, &p, v, fl, &qs) != CUDA_SUCCESS || !p) break;
      if (p == last) continue;
      last = p;
      if (++seen == rank && p != kvs__family_peek(&kvs__family_cuda, i)) g_gpa_ptr[i] = p;
    }
  }
  atomic_store_explicit(&g_gpa_state, 2, memory_order_release);
}

/* The wrapper for a real pointer (dlsym's or the resolver's answer for a hooked row), or NULL
 * when it is no hooked variant. */
static void *cu_wrapper_for(void *real) {
  if (!real) return NULL;
  bool learned = atomic_load_explicit(&g_gpa_state, memory_order_acquire) == 2;
  for (size_t i = 0; i < KVS__NHOOKS; i++)
    if (kvs__family_peek(&kvs__family_cuda, i) == real || (learned && g_gpa_ptr[i] == real)) {
      cu_note_route(CU_ROUTE_GPA, i);
      return kvs__family_wrapper(&kvs__family_cuda, i);
    }
  return NULL;
}

/* Does a lookup name the base of a hooked row (with that row's stream flavour)? */
static bool cu_hooked_base(const char *symbol, cuuint64_t flags) {
  bool want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) &&
                 !(flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM);
  for (size_t i = 0; i < KVS__NHOOKS; i++) {
    char base[64];
    bool pt;
    cu_row_base(kvs__row_names[i], base, sizeof base, &pt);
    if (pt == want_pt && !strcmp(base, symbol)) return true;
  }
  return false;
}

/* The wrapper for the resolver's answer to a lookup. An answer matching no dlsym pointer for a
 * hooked base makes kvshim learn the resolver's own answers (once: a driver whose answers are
 * its exported symbols is never asked anything more). One still unknown at the version learned
 * with (or newer) bypasses kvshim: warned once. */
static atomic_bool g_gpa_warned;
static void *cu_gpa_wrapper(const char *symbol, void *found, int version, cuuint64_t flags) {
  void *w = cu_wrapper_for(found);
  if (w || !symbol || !cu_hooked_base(symbol, flags)) return w;
  cu_gpa_learn();
  w = cu_wrapper_for(found);
  if (!w && version >= g_gpa_version && !atomic_exchange(&g_gpa_warned, true))
    kvs_log_warn("cuGetProcAddress(%s, %d, 0x%llx) returned an entry point kvshim does not "
                 "know: calls through it bypass kvshim", symbol, version,
                 (unsigned long long)flags);
  return w;
}

/* Substitution happens while the family is enabled by configuration (the runtime may not be
 * built yet: wrappers handle that) and never for kvshim's own lookups. */
static inline bool cu_substituting(void) {
  return kvs__hook_depth == 0 && kvs__family_enabled(&kvs__family_cuda);
}

/* True when addr lies in an object whose file name starts with "libcuda.so". */
static bool cu_in_libcuda(void *addr, char *path, size_t cap) {
  Dl_info info;
  if (!dladdr(addr, &info) || !info.dli_fname) return false;
  const char *base = strrchr(info.dli_fname, '/');
  base = base ? base + 1 : info.dli_fname;
  if (strncmp(base, "libcuda.so", 10) != 0) return false;
  size_t n = strlen(info.dli_fname);
  if (n >= cap) return false;
  memcpy(path, info.dli_fname, n + 1);
  return true;
}

/* dlsym routing: the wrapper of exactly the variant `found` is, resolved from the very driver
 * object the caller looked into. */
static void *cu_dlsym_substitute(const kvs__family_t *f, size_t row, void *found) {
  if (!found || kvs__hook_depth) return found;
  if (__atomic_load_n(&kvs__family_state.lib, __ATOMIC_ACQUIRE) == KVS__LIB_NONE) {
    /* Resolve from the very driver object the caller looked into. */
    char path[4096];
    if (!cu_in_libcuda(found, path, sizeof path)) return found;
    void *h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return found;
    kvs__family_fill(f, h);
  }
  if (kvs__family_peek(f, row) != found) return found;
  cu_note_route(CU_ROUTE_DLSYM, row);
  return kvs__family_wrapper(f, row);
}

/* ---- the wrappers -------------------------------------------------------------------------
 * Generated: resolve the real function (typed), refuse to call NULL, pass straight through
 * (a tail call) when re-entered or when KVSHIM_ENABLE=0, else run the hook body
 * hk_<name>(real, args...). The pass-through is a dozen instructions: keep it that way
 * (kvshim-bench-hooks measures it). */
#define CU_WRAPPER(ret, name, params, args)                                                   \
  static CUresult hk_##name(kvs__cu_pfn_##name real, KVS__UNPAREN params)                    \
      __attribute__((noinline));                                                              \
  CUresult name params {                                                                      \
    kvs__cu_pfn_##name real = cu_real()->name;                                                \
    if (kvs__unlikely(!real)) return cu_missing();                                            \
    if (kvs__unlikely(kvs__hook_depth != 0) ||                                                \
        __atomic_load_n(&kvs__rt_state, __ATOMIC_RELAXED) == KVS__RT_DISABLED)                \
      return real args;                                                                       \
    return hk_##name(real, KVS__UNPAREN args);                                                \
  }
KVS_CUDA_HOOKS(CU_WRAPPER)
#undef CU_WRAPPER

/* The kvshim part of each hook runs with the re-entry guard raised. */

static CUresult hk_cuMemAlloc_v2(kvs__cu_pfn_cuMemAlloc_v2 real, CUdeviceptr *dptr,
                                 size_t bytesize) {
  cu_alloc_seen();
  kvs__runtime_t *rt = cu_rt();
  if (!rt) return real(dptr, bytesize);
  KVS__HOOK_ENTER();
  CUresult r = real(dptr, bytesize);
  if (r == CUDA_SUCCESS && dptr) cu_record_device(rt, *dptr, bytesize, true);
  return r;
}

static CUresult hk_cuMemAllocPitch_v2(kvs__cu_pfn_cuMemAllocPitch_v2 real, CUdeviceptr *dptr,
                                      size_t *pPitch, size_t WidthInBytes, size_t Height,
                                      unsigned int ElementSizeBytes) {
  cu_alloc_seen();
  kvs__runtime_t *rt = cu_rt();
  if (!rt) return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  KVS__HOOK_ENTER();
  CUresult r = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  if (r == CUDA_SUCCESS && dptr && pPitch) {
    uint64_t len;
    if (!__builtin_mul_overflow((uint64_t)*pPitch, (uint64_t)Height, &len))
      cu_record_device(rt, *dptr, len, true);
  }
  return r;
}

/* Forget first: EXPORT_TENSORS must not hand out an allocation that is going away; then wait
 * (bounded) for the importers that hold its lease (cu_lease_end). */
static inline void cu_forget_device(kvs__runtime_t *rt, CUdeviceptr dptr) {
  kvs_tensor_record_t old;
  if (dptr && kvs_tensor_registry_remove(rt->tensors, (uint64_t)dptr, &old) == 0 &&
      old.exportable && old.desc.kind == KVS_TENSOR_CUDA_IPC)
    cu_lease_end(old.desc.ipc.generation, true);
}

static CUresult hk_cuMemFree_v2(kvs__cu_pfn_cuMemFree_v2 real, CUdeviceptr dptr) {
  kvs__runtime_t *rt = cu_rt_if_active();
  if (!rt) return real(dptr);
  KVS__HOOK_ENTER();
  cu_forget_device(rt, dptr);
  CUresult r = real(dptr);
  return r;
}

/* Stream-ordered and managed allocations: forwarded, then recorded as not exportable (no
 * CUDA IPC handle exists for them), so the stats tell why they are never exported. Their
 * frees forget the record first, as cuMemFree_v2 does. One body each, generated. */
#define CU_HOOK_UNEXPORTABLE(name, params, args)                                              \
  static CUresult hk_##name(kvs__cu_pfn_##name real, KVS__UNPAREN params) {                   \
    cu_alloc_seen();                                                                          \
    kvs__runtime_t *rt = cu_rt();                                                             \
    if (!rt) return real args;                                                                \
    KVS__HOOK_ENTER();                                                                        \
    CUresult r = real args;                                                                   \
    if (r == CUDA_SUCCESS && dptr) cu_record_device(rt, *dptr, bytesize, false);              \
    return r;                                                                                 \
  }
#define CU_HOOK_FREE_ASYNC(name)                                                              \
  static CUresult hk_##name(kvs__cu_pfn_##name real, CUdeviceptr dptr, CUstream hStream) {   \
    kvs__runtime_t *rt = cu_rt_if_active();                                                   \
    if (!rt) return real(dptr, hStream);                                                      \
    KVS__HOOK_ENTER();                                                                        \
    cu_forget_device(rt, dptr);                                                               \
    CUresult r = real(dptr, hStream);                                                         \
    return r;                                                                                 \
  }
CU_HOOK_UNEXPORTABLE(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream),
                     (dptr, bytesize, hStream))
CU_HOOK_UNEXPORTABLE(cuMemAllocAsync_ptsz,
                     (CUdeviceptr * dptr, size_t bytesize, CUstream hStream),
                     (dptr, bytesize, hStream))
CU_HOOK_UNEXPORTABLE(cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags),
                     (dptr, bytesize, flags))
CU_HOOK_FREE_ASYNC(cuMemFreeAsync)
CU_HOOK_FREE_ASYNC(cuMemFreeAsync_ptsz)
#undef CU_HOOK_UNEXPORTABLE
#undef CU_HOOK_FREE_ASYNC

/* VMM physical allocations (cuMemCreate; llama.cpp's CUDA pool and PyTorch's expandable
 * segments map them with cuMemMap): forwarded and counted (cuda_vmm_allocs, cuda_vmm_bytes), so
 * an operator sees why such memory is never exported (a handle, not an address: no CUDA IPC
 * handle; design §9.4). */
static CUresult hk_cuMemCreate(kvs__cu_pfn_cuMemCreate real, CUmemGenericAllocationHandle *handle,
                               size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
  cu_alloc_seen();
  kvs__runtime_t *rt = cu_rt();
  CUresult r = real(handle, size, prop, flags);
  if (rt && r == CUDA_SUCCESS) {
    kvs_stats_inc(kvs_stats_global(), KVS_STAT_cuda_vmm_allocs);
    kvs_stats_add(kvs_stats_global(), KVS_STAT_cuda_vmm_bytes, size);
  }
  return r;
}

static CUresult hk_cuMemAllocHost_v2(kvs__cu_pfn_cuMemAllocHost_v2 real, void **pp,
                                     size_t bytesize) {
  cu_alloc_seen();
  kvs__runtime_t *rt = cu_rt();
  if (!rt) return real(pp, bytesize);
  KVS__HOOK_ENTER();
  CUresult r;
  if (cu_host_eligible(rt, pp, bytesize) && cu_host_take(rt, pp, bytesize, 0) == 0)
    r = CUDA_SUCCESS;
  else
    r = real(pp, bytesize);
  return r;
}

static CUresult hk_cuMemHostAlloc(kvs__cu_pfn_cuMemHostAlloc real, void **pp, size_t bytesize,
                                  unsigned int Flags) {
  cu_alloc_seen();
  kvs__runtime_t *rt = cu_rt();
  if (!rt) return real(pp, bytesize, Flags);
  KVS__HOOK_ENTER();
  CUresult r;
  if (!(Flags & ~(unsigned)CU_HOSTALLOC_KNOWN) && cu_host_eligible(rt, pp, bytesize) &&
      cu_host_take(rt, pp, bytesize, Flags) == 0)
    r = CUDA_SUCCESS;
  else
    r = real(pp, bytesize, Flags);
  return r;
}

static CUresult hk_cuMemFreeHost(kvs__cu_pfn_cuMemFreeHost real, void *p) {
  kvs__runtime_t *rt = cu_rt_if_active();
  if (!rt || !cu_in_host_arena(rt, p)) return real(p);
  KVS__HOOK_ENTER();
  uint64_t off = (uint64_t)((uintptr_t)p - rt->host_lo) + rt->host_off, len = 0;
  unsigned asked;
  /* Not the start of a buffer handed to the engine (an interior pointer, a double free): let
   * the driver judge it. */
  if (cu_hf_get((uintptr_t)p, &asked, &len, true) < 0) return real(p);
  /* The real call returns the memory only once the work queued on it is done (it synchronises
   * the device: PyTorch's CachingHostAllocator exists to avoid "device synchronizations due to
   * cudaFreeHost calls", ATen/cuda/CachingHostAllocator.h), so an engine may free a buffer right
   * after queueing a copy from it. The extent is handed out again by kvshim with no driver
   * call, so the same guarantee is kept here: a context synchronisation before the extent is
   * reused (the fake driver defers async copies under FAKECUDA_DEFER_ASYNC=1 and runs them
   * only at synchronisations, so a reuse before it shows). Without a context there is no
   * queued work. */
  cu_host_quiesce(p);
  /* Forget it, then: a piece's buffer goes back to its piece; an own extent is kept
   * registered for the next allocation that fits (option off) or unregistered before the
   * extent can be handed out again (cu_host_release: from a thread without a current context,
   * in one of the buffer's device while the engine still holds it; when it does not, the
   * driver dropped the registration with the context). */
  kvs_tensor_registry_remove(rt->tensors, (uint64_t)(uintptr_t)p, NULL);
  if (!cu_piece_free(rt, off) && (cu_pieces_on(rt) || !cu_keep_put(off, len)))
    cu_host_release(rt, off, len);
  cu_host_gauge(-(int64_t)len);
  return CUDA_SUCCESS;
}

static CUresult hk_cuMemHostGetDevicePointer_v2(kvs__cu_pfn_cuMemHostGetDevicePointer_v2 real,
                                                CUdeviceptr *pdptr, void *p, unsigned int Flags) {
  /* Arena buffers are registered host memory: the driver answers for them as for its own. */
  kvs__runtime_t *rt = cu_rt_if_active();
  if (rt && cu_in_host_arena(rt, p)) kvs__hook_count();
  return real(pdptr, p, Flags);
}

static CUresult hk_cuMemHostGetFlags(kvs__cu_pfn_cuMemHostGetFlags real, unsigned int *pFlags,
                                     void *p) {
  /* A pooled buffer answers what its caller asked for, not kvshim's registration flags. */
  kvs__runtime_t *rt = cu_rt_if_active();
  unsigned asked;
  if (!rt || !pFlags || !cu_in_host_arena(rt, p)) return real(pFlags, p);
  KVS__HOOK_ENTER();
  CUresult r = real(pFlags, p); /* the driver validates p (and the context) first */
  if (r == CUDA_SUCCESS) {
    kvs_tensor_record_t rec; /* an interior pointer: the buffer's start from its record */
    uintptr_t base = kvs_tensor_registry_lookup(rt->tensors, (uint64_t)(uintptr_t)p, &rec) == 0
                         ? (uintptr_t)rec.base
                         : (uintptr_t)p;
    if (cu_hf_get(base, &asked, NULL, false) == 0) *pFlags = asked;
  }
  return r;
}

static inline CUresult cu_copy_h2d(CUresult r, const void *src, size_t n) {
  kvs__runtime_t *rt;
  if (r == CUDA_SUCCESS && (rt = cu_rt_if_active()) && cu_in_host_arena(rt, src))
    kvs_stats_add(kvs_stats_global(), KVS_STAT_host_arena_h2d_bytes, n);
  return r;
}
static inline CUresult cu_copy_d2h(CUresult r, const void *dst, size_t n) {
  kvs__runtime_t *rt;
  if (r == CUDA_SUCCESS && (rt = cu_rt_if_active()) && cu_in_host_arena(rt, dst))
    kvs_stats_add(kvs_stats_global(), KVS_STAT_host_arena_d2h_bytes, n);
  return r;
}
static CUresult hk_cuMemcpyHtoDAsync_v2(kvs__cu_pfn_cuMemcpyHtoDAsync_v2 real, CUdeviceptr d,
                                        const void *s, size_t n, CUstream st) {
  return cu_copy_h2d(real(d, s, n, st), s, n);
}
static CUresult hk_cuMemcpyHtoDAsync_v2_ptsz(kvs__cu_pfn_cuMemcpyHtoDAsync_v2_ptsz real,
                                             CUdeviceptr d, const void *s, size_t n,
                                             CUstream st) {
  return cu_copy_h2d(real(d, s, n, st), s, n);
}
static CUresult hk_cuMemcpyDtoHAsync_v2(kvs__cu_pfn_cuMemcpyDtoHAsync_v2 real, void *d,
                                        CUdeviceptr s, size_t n, CUstream st) {
  return cu_copy_d2h(real(d, s, n, st), d, n);
}
static CUresult hk_cuMemcpyDtoHAsync_v2_ptsz(kvs__cu_pfn_cuMemcpyDtoHAsync_v2_ptsz real,
                                             void *d, CUdeviceptr s, size_t n, CUstream st) {
  return cu_copy_d2h(real(d, s, n, st), d, n);
}

/* cuGetProcAddress[_v2]: the real resolver decides; a pointer it returns that is the real
 * function of a hooked row (that exact variant: _v2, _ptsz, the resolver itself...) is
 * replaced by that row's wrapper. Nothing is read unless the driver succeeded. */
static CUresult hk_cuGetProcAddress(kvs__cu_pfn_cuGetProcAddress real, const char *symbol,
                                    void **pfn, int cudaVersion, cuuint64_t flags) {
  CUresult r = real(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS && pfn && *pfn && cu_substituting()) {
    KVS__REENTRY_GUARD();
    void *w = cu_gpa_wrapper(symbol, *pfn, cudaVersion, flags);
    if (w) *pfn = w;
  }
  return r;
}
static CUresult hk_cuGetProcAddress_v2(kvs__cu_pfn_cuGetProcAddress_v2 real, const char *symbol,
                                       void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
  CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (r == CUDA_SUCCESS && pfn && *pfn && cu_substituting()) {
    KVS__REENTRY_GUARD();
    void *w = cu_gpa_wrapper(symbol, *pfn, cudaVersion, flags);
    if (w) *pfn = w;
  }
  return r;
}

/* ---- kvs_accel: copies, pins, IPC ---------------------------------------------------------- */

/* The context for one of kvshim's own calls about ptr (device memory, registered host memory,
 * or NULL / memory the driver does not know):
 *   - the thread's current context, when it has one on ptr's device (any, for unknown ptr);
 *   - else the primary context of ptr's device (for unknown ptr: of the lowest device whose
 *     primary context is active), only while the engine holds it (active), retained for the
 *     call and released by cu_ctx_leave.
 * kvshim never creates a context, never picks device 0 by default and keeps no context handle
 * between calls (cudaDeviceReset destroys it). -ENODEV when there is no such context; sc is
 * always valid for cu_ctx_leave. */
static int cu_ctx_enter(const cu_real_t *R, const void *ptr, cu_ctx_scope_t *sc) {
  sc->pushed = false;
  sc->retained = -1;
  if (!R->cuCtxGetCurrent || !R->cuCtxGetDevice || !R->cuCtxPushCurrent_v2 ||
      !R->cuCtxPopCurrent_v2 || !R->cuDeviceGet || !R->cuDevicePrimaryCtxGetState ||
      !R->cuDevicePrimaryCtxRetain || !R->cuDevicePrimaryCtxRelease_v2)
    return -ENOSYS;
  int want = -1;
  if (ptr && R->cuPointerGetAttribute &&
      R->cuPointerGetAttribute(&want, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                               (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
    want = -1;
  CUcontext cur = NULL;
  CUdevice cd;
  if (R->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur &&
      (want < 0 || (R->cuCtxGetDevice(&cd) == CUDA_SUCCESS && cd == want)))
    return 0;
  int n = want + 1;
  if (want < 0 && (!R->cuDeviceGetCount || R->cuDeviceGetCount(&n) != CUDA_SUCCESS)) n = 0;
  for (int i = want < 0 ? 0 : want; i < n; i++) {
    CUdevice dev;
    CUcontext c;
    unsigned fl;
    int active = 0;
    if (R->cuDeviceGet(&dev, i) != CUDA_SUCCESS ||
        R->cuDevicePrimaryCtxGetState(dev, &fl, &active) != CUDA_SUCCESS || !active ||
        R->cuDevicePrimaryCtxRetain(&c, dev) != CUDA_SUCCESS)
      continue;
    if (R->cuCtxPushCurrent_v2(c) != CUDA_SUCCESS) {
      R->cuDevicePrimaryCtxRelease_v2(dev);
      continue;
    }
    sc->pushed = true;
    sc->retained = dev;
    return 0;
  }
  return -ENODEV;
}
static void cu_ctx_leave(const cu_real_t *R, const cu_ctx_scope_t *sc) {
  CUcontext c;
  if (sc->pushed) R->cuCtxPopCurrent_v2(&c);
  if (sc->retained >= 0) R->cuDevicePrimaryCtxRelease_v2(sc->retained);
}

/* kvshim's own copies run on a non-blocking stream of kvshim's own, created for the copy and
 * destroyed after it (no handle is kept: cudaDeviceReset would invalidate it). Never on the
 * legacy stream (the synchronous cuMemcpy* use it): the legacy stream synchronises with every
 * blocking stream of its context, so using it while the engine captures a blocking stream is
 * an implicit dependency on the capture, which the driver refuses and which invalidates the
 * capture whatever the capture mode (CUDA C++ Programming Guide, "Prohibited and Unhandled
 * Operations": "it is also invalid to use the legacy stream when any stream in the same
 * context is being captured and was not created with cudaStreamNonBlocking"; the fake driver
 * enforces it). */
static int cu_accel_copy(void *dst, const void *src, size_t len, kvs_copy_dir_t dir) {
  if (dir == KVS_COPY_H2H) {
    memcpy(dst, src, len);
    return 0;
  }
  if (dir != KVS_COPY_H2D && dir != KVS_COPY_D2H && dir != KVS_COPY_D2D) return -EINVAL;
  const cu_real_t *R = cu_real();
  if (!R->cuStreamCreate || !R->cuStreamSynchronize || !R->cuStreamDestroy_v2 ||
      !R->cuMemcpyHtoDAsync_v2 || !R->cuMemcpyDtoHAsync_v2 || !R->cuMemcpyDtoDAsync_v2)
    return cu_errno(cu_missing());
  cu_ctx_scope_t sc;
  int rc = cu_ctx_enter(R, dir == KVS_COPY_D2H ? src : dst, &sc);
  if (rc < 0) return rc;
  cu_relax_t rx = cu_relax();
  CUstream s = NULL;
  CUresult r = R->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  if (r == CUDA_SUCCESS) {
    CUdeviceptr dd = (CUdeviceptr)(uintptr_t)dst, ds = (CUdeviceptr)(uintptr_t)src;
    r = dir == KVS_COPY_H2D   ? R->cuMemcpyHtoDAsync_v2(dd, src, len, s)
        : dir == KVS_COPY_D2H ? R->cuMemcpyDtoHAsync_v2(dst, ds, len, s)
                              : R->cuMemcpyDtoDAsync_v2(dd, ds, len, s);
    CUresult w = R->cuStreamSynchronize(s); /* the copy is done (or failed) when this returns */
    if (r == CUDA_SUCCESS) r = w;
    R->cuStreamDestroy_v2(s);
  }
  cu_unrelax(rx);
  cu_ctx_leave(R, &sc);
  return cu_errno(r);
}

/* Pins larger than one register piece, so unpin knows how many pieces to undo. */
static struct { void *ptr; uint64_t len; } g_big_pins[CU_BIG_PINS];
static pthread_mutex_t g_pin_lock = PTHREAD_MUTEX_INITIALIZER;

/* readonly: the device only reads ptr (a peer's pool mapped read-only). Registered READ_ONLY
 * where the context's device has READ_ONLY_HOST_REGISTER_SUPPORTED (cuda.h, cuMemHostRegister:
 * with the flag on a device without it, the call fails CUDA_ERROR_NOT_SUPPORTED; and on
 * platforms without PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES the flag is required to
 * register memory mapped read-only), plain elsewhere. */
static int cu_pin(void *ptr, size_t len, bool readonly) {
  const cu_real_t *R = cu_real();
  (void)R;
  if (!ptr || !len) return -EINVAL;
  int slot = -1;
  if (len > CU_REGISTER_PIECE) {
    pthread_mutex_lock(&g_pin_lock);
    for (int i = 0; i < CU_BIG_PINS && slot < 0; i++)
      if (!g_big_pins[i].ptr) {
        g_big_pins[i].ptr = ptr;
        g_big_pins[i].len = len;
        slot = i;
      }
    pthread_mutex_unlock(&g_pin_lock);
    if (slot < 0) return -ENOSPC;
  }
  cu_ctx_scope_t sc;
  int rc = cu_ctx_enter(&g_real, NULL, &sc);
  if (rc == 0) {
    cu_relax_t rx = cu_relax();
    unsigned flags = CU_MEMHOSTREGISTER_PORTABLE;
    CUdevice dev;
    int ro = 0;
    if (readonly && g_real.cuCtxGetDevice && g_real.cuDeviceGetAttribute &&
        g_real.cuCtxGetDevice(&dev) == CUDA_SUCCESS &&
        g_real.cuDeviceGetAttribute(&ro, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
                                    dev) == CUDA_SUCCESS &&
        ro)
      flags |= CU_MEMHOSTREGISTER_READ_ONLY;
    rc = cu_errno(cu_register(ptr, len, flags));
    cu_unrelax(rx);
  }
  cu_ctx_leave(&g_real, &sc);
  if (rc < 0 && slot >= 0) {
    pthread_mutex_lock(&g_pin_lock);
    g_big_pins[slot].ptr = NULL;
    pthread_mutex_unlock(&g_pin_lock);
  }
  return rc;
}

static int cu_accel_pin(void *ptr, size_t len) { return cu_pin(ptr, len, false); }
static int cu_accel_pin_readonly(void *ptr, size_t len) { return cu_pin(ptr, len, true); }

static int cu_accel_unpin(void *ptr) {
  const cu_real_t *R = cu_real();
  (void)R;
  uint64_t len = 1;
  pthread_mutex_lock(&g_pin_lock);
  for (int i = 0; i < CU_BIG_PINS; i++)
    if (g_big_pins[i].ptr == ptr) {
      len = g_big_pins[i].len;
      g_big_pins[i].ptr = NULL;
    }
  pthread_mutex_unlock(&g_pin_lock);
  cu_ctx_scope_t sc;
  int rc = cu_ctx_enter(&g_real, ptr, &sc);
  if (rc == 0) {
    cu_relax_t rx = cu_relax();
    rc = cu_errno(cu_unregister(ptr, len));
    cu_unrelax(rx);
  }
  cu_ctx_leave(&g_real, &sc);
  return rc;
}

/* kvs_tensor_device_ordinal's scan: UUIDs of every device, by ordinal. */
static int cu_scan(uint8_t (*uuids)[KVS_TENSOR_UUID_SIZE], int cap, void *ctx) {
  (void)ctx;
  const cu_real_t *R = cu_real();
  if (!R->cuInit || !R->cuDeviceGetCount || !R->cuDeviceGet || !R->cuDeviceGetUuid_v2)
    return -ENOSYS;
  CUresult r = R->cuInit(0);
  int n = 0;
  if (r == CUDA_SUCCESS) r = R->cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS) return cu_errno(r);
  for (int i = 0; i < n && i < cap; i++) {
    CUdevice d;
    CUuuid u;
    r = R->cuDeviceGet(&d, i);
    if (r == CUDA_SUCCESS) r = R->cuDeviceGetUuid_v2(&u, d);
    if (r != CUDA_SUCCESS) return cu_errno(r);
    memcpy(uuids[i], u.bytes, KVS_TENSOR_UUID_SIZE);
  }
  return n;
}

/* Handles opened in this process: one mapping per handle, reference counted. */
typedef struct cu_ipc_open {
  uint8_t handle[KVS_TENSOR_IPC_HANDLE_SIZE];
  CUdeviceptr base;    /* 0 = free slot */
  uint64_t alloc_len;
  uint32_t refs;
  CUcontext ctx;       /* context it was opened in (made current again to close it) */
  CUdevice retained;   /* primary context retained for it, or -1 */
  uint64_t generation; /* the descriptor's (0: none) */
  int lease_fd;        /* cu_lease_take's, held until the last close; -1: none */
} cu_ipc_open_t;
static cu_ipc_open_t g_ipc[CU_IPC_MAX];
static pthread_mutex_t g_ipc_lock = PTHREAD_MUTEX_INITIALIZER;

static int cu_accel_open_ipc(const kvs_tensor_desc_t *d, void **devptr) {
  if (!d || !devptr) return -EINVAL;
  if (d->kind != KVS_TENSOR_CUDA_IPC) return -ENOTSUP;
  int rc = kvs_tensor_validate(d, NULL, 0);
  if (rc < 0) return rc;
  const cu_real_t *R = cu_real();
  if (!R->cuIpcOpenMemHandle_v2 || !R->cuCtxGetCurrent || !R->cuCtxPushCurrent_v2 ||
      !R->cuCtxPopCurrent_v2 || !R->cuDeviceGet || !R->cuDevicePrimaryCtxRetain ||
      !R->cuDevicePrimaryCtxRelease_v2)
    return -ENOSYS;
  int ord = kvs_tensor_device_ordinal(d->device_uuid, cu_scan, NULL);
  if (ord < 0) return ord;
  int lease_fd;
  rc = cu_lease_take(d, &lease_fd); /* a stale generation is refused before the driver sees it */
  if (rc < 0) return rc;

  pthread_mutex_lock(&g_ipc_lock);
  cu_ipc_open_t *e = NULL, *free_slot = NULL;
  for (int i = 0; i < CU_IPC_MAX; i++) {
    if (!g_ipc[i].base) {
      if (!free_slot) free_slot = &g_ipc[i];
    } else if (memcmp(g_ipc[i].handle, d->ipc.handle, KVS_TENSOR_IPC_HANDLE_SIZE) == 0) {
      e = &g_ipc[i];
      break;
    }
  }
  if (lease_fd >= 0 && (e || !free_slot)) close(lease_fd); /* e holds its own lease */
  if (e) {
    rc = e->generation == d->ipc.generation ? 0 : -ESTALE;
    if (rc == 0) {
      e->refs++;
      *devptr = (void *)(uintptr_t)(e->base + d->ipc.offset);
    }
    pthread_mutex_unlock(&g_ipc_lock);
    return rc;
  }
  if (!free_slot) {
    pthread_mutex_unlock(&g_ipc_lock);
    return -ENOSPC;
  }
  /* Open in a context of the exporting device: the caller's when it is on that device, else
   * the device's primary context, retained until the last close (the import asks for it). */
  CUcontext cur = NULL, pctx = NULL;
  CUdevice dev = -1, retained = -1, cd;
  CUresult r = R->cuCtxGetCurrent(&cur);
  if (r == CUDA_SUCCESS && cur &&
      (!R->cuCtxGetDevice || R->cuCtxGetDevice(&cd) != CUDA_SUCCESS || cd != ord))
    cur = NULL;
  if (r == CUDA_SUCCESS && !cur) {
    r = R->cuDeviceGet(&dev, ord);
    if (r == CUDA_SUCCESS) r = R->cuDevicePrimaryCtxRetain(&pctx, dev);
    if (r == CUDA_SUCCESS) {
      retained = dev;
      r = R->cuCtxPushCurrent_v2(pctx);
      if (r != CUDA_SUCCESS) {
        R->cuDevicePrimaryCtxRelease_v2(dev);
        retained = -1;
      }
    }
  }
  CUdeviceptr base = 0;
  if (r == CUDA_SUCCESS) {
    CUipcMemHandle h;
    memcpy(h.reserved, d->ipc.handle, KVS_TENSOR_IPC_HANDLE_SIZE);
    cu_relax_t rx = cu_relax();
    r = R->cuIpcOpenMemHandle_v2(&base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    cu_unrelax(rx);
    if (pctx && retained >= 0) {
      CUcontext popped;
      R->cuCtxPopCurrent_v2(&popped);
    }
  }
  if (r == CUDA_SUCCESS) {
    memcpy(free_slot->handle, d->ipc.handle, KVS_TENSOR_IPC_HANDLE_SIZE);
    free_slot->base = base;
    free_slot->alloc_len = d->ipc.alloc_len;
    free_slot->refs = 1;
    free_slot->ctx = cur ? cur : pctx;
    free_slot->retained = retained;
    free_slot->generation = d->ipc.generation;
    free_slot->lease_fd = lease_fd;
    *devptr = (void *)(uintptr_t)(base + d->ipc.offset);
    kvs_stats_inc(kvs_stats_global(), KVS_STAT_cuda_ipc_opens);
  } else {
    if (retained >= 0) R->cuDevicePrimaryCtxRelease_v2(retained);
    if (lease_fd >= 0) close(lease_fd);
  }
  pthread_mutex_unlock(&g_ipc_lock);
  return cu_errno(r);
}

static int cu_accel_close_ipc(void *devptr) {
  const cu_real_t *R = cu_real();
  uintptr_t a = (uintptr_t)devptr;
  pthread_mutex_lock(&g_ipc_lock);
  cu_ipc_open_t *e = NULL;
  for (int i = 0; i < CU_IPC_MAX && !e; i++)
    if (g_ipc[i].base && a >= g_ipc[i].base && a - g_ipc[i].base < g_ipc[i].alloc_len)
      e = &g_ipc[i];
  if (!e) {
    pthread_mutex_unlock(&g_ipc_lock);
    return -ENOENT;
  }
  CUresult r = CUDA_SUCCESS;
  if (--e->refs == 0) {
    if (!R->cuIpcCloseMemHandle || !R->cuCtxPushCurrent_v2 || !R->cuCtxPopCurrent_v2) {
      r = cu_missing();
    } else {
      bool pushed = R->cuCtxPushCurrent_v2(e->ctx) == CUDA_SUCCESS;
      cu_relax_t rx = cu_relax();
      r = R->cuIpcCloseMemHandle(e->base);
      cu_unrelax(rx);
      if (pushed) {
        CUcontext popped;
        R->cuCtxPopCurrent_v2(&popped);
      }
    }
    if (e->retained >= 0 && R->cuDevicePrimaryCtxRelease_v2)
      R->cuDevicePrimaryCtxRelease_v2(e->retained);
    if (e->lease_fd >= 0) close(e->lease_fd); /* after the driver's close: the exporter may free */
    memset(e, 0, sizeof *e);
  }
  pthread_mutex_unlock(&g_ipc_lock);
  return cu_errno(r);
}

static const kvs_accel_ops_t g_cuda_ops = {
    .name = "cuda",
    .copy = cu_accel_copy,
    .pin = cu_accel_pin,
    .unpin = cu_accel_unpin,
    .open_ipc = cu_accel_open_ipc,
    .close_ipc = cu_accel_close_ipc,
    .pin_readonly = cu_accel_pin_readonly,
};

/* ---- family ------------------------------------------------------------------------------ */

static int cu_family_init(kvs__runtime_t *rt) {
  atomic_store(&g_host_used, 0);
  uint64_t arena = (uint64_t)(rt->host_hi - rt->host_lo), page = kvs_pool_page_size(rt->pool);
  g_piece_len = arena < CU_PIN_PIECE ? arena / page * page : CU_PIN_PIECE;
  return 0;
}

static void cu_fork_child(void) {
  /* The child's runtime starts afresh; handles the parent opened are the parent's business.
   * The resolved driver table stays valid (same mappings). */
  atomic_store(&g_forked, true);
  atomic_store(&g_ahead_busy, false); /* the parent's piece thread does not exist here */
  pthread_mutex_init(&g_piece_lock, NULL);
  pthread_mutex_init(&g_piece_inline_lock, NULL);
  memset(g_pieces, 0, sizeof g_pieces); /* registrations do not cross fork */
  atomic_store(&g_pinned, 0);
  pthread_mutex_init(&g_ipc_lock, NULL);
  pthread_mutex_init(&g_pin_lock, NULL);
  pthread_mutex_init(&g_host_flags_lock, NULL);
  memset(g_host_flags, 0, sizeof g_host_flags);
  pthread_mutex_init(&g_keep_lock, NULL);
  memset(g_keep, 0, sizeof g_keep); /* the parent's extents: not this process's pool */
  memset(g_ipc, 0, sizeof g_ipc); /* their lease fds stay open: the parent's locks */
  pthread_mutex_init(&g_lease_lock, NULL);
  if (g_lease_fd >= 0) close(g_lease_fd); /* the parent's file: the child makes its own */
  g_lease_fd = -1;
  g_lease_nfree = g_lease_high = 0;
  memset(g_big_pins, 0, sizeof g_big_pins);
}

const kvs__family_t kvs__family_cuda = {KVS__FAMILY_HEAD, .open = cu_open,
                                         .dlsym_substitute = cu_dlsym_substitute,
                                         .init = cu_family_init, .fork_child = cu_fork_child};

/* For tests that link the shim without preloading it (the IPC reader). */
const kvs_accel_ops_t *kvs__cuda_accel_ops(void) { return &g_cuda_ops; }
