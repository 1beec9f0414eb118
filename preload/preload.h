/* kvshim preload: the runtime of the injected library libkvshim.so, shared by every hook family
 * (design §9.2, §9.3). Internal: nothing here is exported (the version script exports only the
 * hooks) and nothing is installed.
 *
 * Life of the process, as seen from here:
 *   load        the constructor records the pid and registers fork handlers; nothing else.
 *               Every child of the engine (shells, compilers, test forks) loads the library,
 *               and none of them may notice it until it calls a hook.
 *   config      the first hooked call of any kind reads the configuration snapshot once
 *               (kvs__preload_options). KVSHIM_ENABLE=0 stops here: every hook passes through.
 *   runtime     the first hooked call that needs the cache (an allocation hook, a kvo/llama
 *               hook) builds the runtime once with pthread_once (kvs__preload_ensure_init):
 *               pool, store, tensor registry, coordinator + peer client (unless
 *               KVSHIM_PEERS=0), then each hook family's init. Any failure leaves the state
 *               FAILED: hooks pass through and count hook_fallbacks; the process goes on.
 *   fork        the child forgets the parent's runtime (its pool pages stay mapped, so buffers
 *               the parent handed out stay valid, but the child never allocates from them),
 *               closes the inherited coordinator sockets at once, and builds its own runtime
 *               (own pool, own socket) on its first hooked call.
 *   exit        a destructor writes KVSHIM_STATS (when this process built or tried to build a
 *               runtime) and stops the coordinator (its socket file is removed). The pool and
 *               the store are left mapped: hooks called later in exit (atexit handlers freeing
 *               pinned buffers) keep working.
 *
 * Re-entry: kvs__hook_depth is a thread-local counter. A hook that finds it non-zero passes
 * straight through; the runtime init and every hook body run with it raised, so a driver that
 * calls back into an exported hook, or an allocation made while initialising, never re-enters
 * kvshim.
 *
 * Real functions: the library never calls the public dlsym (it exports its own). The private
 * real dlsym comes from dlvsym(RTLD_NEXT, "dlsym", <newest glibc version, then the base one>).
 * Engine symbols are found even in objects a plugin loader opened RTLD_LOCAL
 * (kvs__resolve_engine_symbol). No kvshim lock is held across dlopen or dlsym. */
#ifndef KVSHIM_PRELOAD_H
#define KVSHIM_PRELOAD_H

#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "coord.h"
#include "options.h"
#include "peer.h"
#include "pool.h"
#include "stats.h"
#include "store.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Functions on the path of every dlsym call. The ASan runtime resolves its interceptors with
 * dlsym(RTLD_NEXT, ...) before its shadow memory exists, so they must not be instrumented. */
#define KVS__DLSYM_PATH __attribute__((no_sanitize("address", "undefined")))

/* ---- runtime ------------------------------------------------------------------------------ */

/* Runtime states (kvs__rt_state). UNINIT -> ACTIVE | FAILED once per process image (reset to
 * UNINIT in a fork child unless DISABLED). DISABLED: KVSHIM_ENABLE=0. */
enum { KVS__RT_UNINIT = 0, KVS__RT_ACTIVE = 1, KVS__RT_FAILED = 2, KVS__RT_DISABLED = 3 };

/* Everything the hooks share. Written once by the init (before kvs__rt_state becomes ACTIVE,
 * with release ordering), read-only afterwards; the objects it points to are thread safe. */
typedef struct kvs__runtime {
  kvs_options_t opts;              /* the configuration snapshot */
  kvs_pool_t *pool;                /* owned; never destroyed (see exit above) */
  kvs_store_t *store;              /* owned */
  kvs_tensor_registry_t *tensors;  /* owned: every intercepted allocation */
  kvs_coord_t *coord;              /* owned; NULL with KVSHIM_PEERS=0 */
  kvs_peers_t *peers;              /* owned; NULL with KVSHIM_PEERS=0 */
  uint64_t instance_id;            /* the pool's, also the coordinator's socket name */
  uintptr_t host_lo, host_hi;      /* host arena mapping [host_lo, host_hi); both 0 when none */
  uint64_t host_off;               /* segment offset of host_lo */
  pid_t pid;                       /* the process that built it */
} kvs__runtime_t;

extern kvs__runtime_t kvs__rt;
extern int kvs__rt_state; /* atomic: KVS__RT_* */
extern __thread int kvs__hook_depth __attribute__((tls_model("initial-exec")));

/* The configuration snapshot, read from environ on the first call (log level and
 * KVSHIM_LOG_FILE applied; KVSHIM_LOG=debug prints the table). Never NULL. */
const kvs_options_t *kvs__preload_options(void);
/* KVSHIM_ENABLE and KVSHIM_HOOKS allow the family with this KVS_HOOK_* bit. */
bool kvs__preload_family_enabled(unsigned family_bit);

/* The runtime when it is ACTIVE, building it on the first call (concurrent first callers wait
 * for one init). NULL means "pass through": disabled, init failed, or called re-entrantly. */
kvs__runtime_t *kvs__preload_ensure_init(void);

/* The runtime if it is ACTIVE now, without ever starting the init (hooks that can only concern
 * kvshim's own memory: frees, copies). NULL otherwise or when re-entered. */
static inline kvs__runtime_t *kvs__preload_active(void) {
  if (__builtin_expect(kvs__hook_depth != 0, 0)) return 0;
  return __atomic_load_n(&kvs__rt_state, __ATOMIC_ACQUIRE) == KVS__RT_ACTIVE ? &kvs__rt : 0;
}

/* Count a hooked call that reached kvshim / one passed through because of an internal problem
 * (init failed, table full, ...). */
static inline void kvs__hook_count(void) { kvs_stats_inc(kvs_stats_global(), KVS_STAT_hook_calls); }
static inline void kvs__hook_fallback(void) {
  kvs_stats_inc(kvs_stats_global(), KVS_STAT_hook_fallbacks);
}

/* ---- real symbols (resolve.c) --------------------------------------------------------------- */

typedef void *(*kvs__dlsym_fn)(void *handle, const char *name);

/* glibc's dlsym, found once through dlvsym(RTLD_NEXT, "dlsym", ...). NULL only when the C
 * library has no dlsym at all. Lock-free and async-signal-unsafe like dlsym itself. */
kvs__dlsym_fn kvs__real_dlsym_fn(void);
/* kvs__real_dlsym_fn()(handle, name), or NULL when there is no real dlsym. */
void *kvs__real_dlsym(void *handle, const char *name);

/* A symbol's definition in one loaded object's dynamic symbol table (no dependency search).
 * Global or weak, defined, not a hidden version. */
typedef struct kvs__elf_sym {
  uintptr_t addr;     /* load bias + st_value (for STT_GNU_IFUNC: the resolver) */
  unsigned char type; /* STT_* */
} kvs__elf_sym_t;
/* Look name up in the object loaded at bias whose program headers are phdr[0, phnum).
 * Returns 0 and fills *out, -ENOENT, or -ENOEXEC (no usable dynamic section). */
int kvs__elf_lookup(uintptr_t bias, const ElfW(Phdr) *phdr, unsigned phnum, const char *name,
                    kvs__elf_sym_t *out);

/* What dlsym(RTLD_NEXT, name) called from `caller` would find, emulated for kvshim's own use
 * (the dlsym hook needs it for hooked names, see dlsym.c): the first object after the caller's,
 * in load order, whose own dynamic symbol table defines name. Known difference from glibc: an
 * object dlopen'ed RTLD_LOCAL after the caller's object is searched too (glibc skips it when it
 * is not in the caller's scope). NULL when none. */
void *kvs__next_symbol(const void *caller, const char *name);

/* Find an engine's real function even when the object defining it was opened RTLD_LOCAL by a
 * plugin loader: dlsym(RTLD_NEXT) first, then every loaded object but libkvshim in load order
 * (its dynamic symbol table), opened with dlopen(path, RTLD_NOLOAD) + the real dlsym. A hit is
 * cached for the life of the process and the object's reference is kept (so the pointer cannot
 * dangle); misses are not cached (the plugin may be loaded later). name must be a string with
 * static storage (the cache keeps the pointer). NULL when nothing defines it. */
void *kvs__resolve_engine_symbol(const char *name);
/* Forget the cache (tests; a fork child keeps it: the mappings are the same). */
void kvs__resolve_cache_reset(void);
/* Fork handlers of the resolver's lock: 0 prepare, 1 parent, 2 child. */
void kvs__resolve_atfork(int phase);

/* True when addr lies in libkvshim.so itself. */
bool kvs__addr_in_self(const void *addr);

/* ---- hook families -------------------------------------------------------------------------
 * A family is one group of hooks (cuda, kvo, llama). KVS_PRELOAD_FAMILIES in preload.c lists
 * them; a new family defines `const kvs__family_t kvs__family_<name>` and adds a row there.
 * Every callback may be NULL. */
typedef struct kvs__family {
  const char *name;
  unsigned flag; /* KVS_HOOK_* (options.h) */
  /* Does this family hook that exact ELF name? Asked from dlsym only for names starting with
   * the family's prefix (its row in preload.c's KVS_PRELOAD_FAMILIES). No locking, no
   * allocation; mark it KVS__DLSYM_PATH anyway (dlsym runs while the ASan runtime resolves
   * its interceptors, before its shadow memory exists). */
  bool (*hooks_name)(const char *name);
  /* dlsym routing: `found` is what the real lookup returned for a name hooks_name accepted.
   * Return the family's wrapper when found is the real function it wraps, else found. May
   * resolve the family's real functions (dlopen + private dlsym), never call into an engine
   * or a driver. */
  void *(*dlsym_substitute)(const char *name, void *found);
  /* After the core runtime is built, with kvs__hook_depth raised. A negative errno makes the
   * whole runtime FAILED. */
  int (*init)(kvs__runtime_t *rt);
  /* In a fork child, from the fork handler: reset locks and once-flags. Async-signal-safe
   * calls only. */
  void (*fork_child)(void);
} kvs__family_t;

/* dlsym routing helpers (dlsym.c uses them; families never need to). */
const kvs__family_t *kvs__family_for_name(const char *name);

#ifdef __cplusplus
}
#endif
#endif
