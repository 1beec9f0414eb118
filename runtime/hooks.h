/* kvshim runtime: the one hook-family machine (design §2, §9.1-§9.3; style rule 14).
 *
 * A hook family (cuda, llama, kvo...) is data: its rows X(ret, name, params, args) in
 * shims/<family>/<family>_hooks.h, the tables runtime/family_tables.h generates from them in
 * the family's .c file, and one kvs__family_t. Everything that walks a family is written once,
 * here: real-function resolution (slow path once per row, pointers published with a CAS),
 * the dlsym name match and substitution, init in the runtime, reset in a fork child, and
 * whether KVSHIM_HOOKS enables it. This file names no family; the assembly (preload/) lists
 * them in kvs__families.
 *
 * Rows: the family's hooks first (exported wrappers, [0, n_hooks)), then the functions it only
 * calls ([n_hooks, n_rows)). real[row] is NULL until found; it is written only through
 * kvs__family_real / kvs__family_fill (an atomic CAS: racing resolvers publish one value, and
 * a published pointer never changes for the life of the process, fork children included). */
#ifndef KVSHIM_RUNTIME_HOOKS_H
#define KVSHIM_RUNTIME_HOOKS_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*kvs__code_t)(void);

/* Where a family that opens its own library stands (kvs__family_t.open). */
enum { KVS__LIB_NONE = 0, KVS__LIB_OK = 1, KVS__LIB_MISSING = 2 };

/* The USES list of a family that calls nothing but its hooks (runtime/family_tables.h). */
#define KVS__NO_ROWS(X)

/* A family's init may answer this to stay off in this runtime (a feature switched off). */
#define KVS__FAMILY_OFF 1

/* The mutable part of a family. */
typedef struct kvs__family_state {
  int lib; /* atomic KVS__LIB_*: families with .open; real[] is complete once it is not NONE */
  int on;  /* atomic bool: init ran in this process's runtime; cleared in a fork child */
  int present; /* atomic bool, KVSHIM_HOOKS=auto: a loaded object defines one of its hooks */
  int enabled; /* atomic bool: kvs__family_enabled answered true (it never turns false) */
  unsigned long long scanned_adds; /* atomic: objects ever loaded (dlpi_adds) at the last scan
                                      that found it absent; no rescan until this changes */
} kvs__family_state_t;

typedef struct kvs__family {
  const char *name;             /* for log lines: "llama.cpp" */
  unsigned flag;                /* KVS_HOOK_* (rows.h) */
  const char *prefix;           /* every hooked name starts with it ("cu", "llama_", "kvo_") */
  const char *const *names;     /* [n_rows] ELF names */
  const kvs__code_t *wrappers;  /* [n_hooks] kvshim's exported wrappers */
  size_t n_hooks, n_rows;
  kvs__code_t *real;            /* [n_rows] the real functions (see above) */
  kvs__family_state_t *state;
  /* Where the real functions are. NULL: in the engine (kvs__resolve_engine_symbol, which also
   * finds objects opened RTLD_LOCAL), one row at a time, misses retried (a plugin may be
   * loaded later). Else a library the family opens itself: called while state->lib is NONE,
   * it must end with kvs__family_fill (its handle, or NULL when there is none). */
  void (*open)(const struct kvs__family *f);
  /* dlsym routing for hook `row` whose lookup found `found`. NULL: the generic rule
   * (kvs__family_substitute). May resolve real functions, never call into an engine or a
   * driver. */
  void *(*dlsym_substitute)(const struct kvs__family *f, size_t row, void *found);
  /* After the core runtime is built, with kvs__hook_depth raised: 0 (the family is on),
   * KVS__FAMILY_OFF, or a negative errno (the whole runtime is then FAILED). May be NULL. */
  int (*init)(kvs__runtime_t *rt);
  /* In a fork child, after the family was turned off: reset its own locks. Async-signal-safe
   * calls only. May be NULL. */
  void (*fork_child)(void);
} kvs__family_t;

/* Every family, defined by the assembly (preload/preload.c): the only list that names them. */
extern const kvs__family_t *const kvs__families[];
extern const size_t kvs__n_families;

/* The hook row of name in f, or f->n_hooks when f does not hook it. On the path of every
 * dlsym: no libc call, not instrumented. */
KVS__DLSYM_PATH size_t kvs__family_row(const kvs__family_t *f, const char *name);
/* The family hooking name (and its row), or NULL. Same constraints. */
KVS__DLSYM_PATH const kvs__family_t *kvs__family_for_name(const char *name, size_t *row);

/* The real function of a row, resolving it on first use; NULL when nothing defines it. */
kvs__code_t kvs__family_resolve_slow(const kvs__family_t *f, size_t row);
static inline kvs__code_t kvs__family_real(const kvs__family_t *f, size_t row) {
  kvs__code_t fn = __atomic_load_n(&f->real[row], __ATOMIC_ACQUIRE);
  return __builtin_expect(fn != NULL, 1) ? fn : kvs__family_resolve_slow(f, row);
}
/* The row as published now, never resolving. */
static inline void *kvs__family_peek(const kvs__family_t *f, size_t row) {
  kvs__code_t fn = __atomic_load_n(&f->real[row], __ATOMIC_ACQUIRE);
  void *p;
  __builtin_memcpy(&p, &fn, sizeof p);
  return p;
}

/* The exported wrapper of hook row, as a data pointer (what dlsym hands out). */
static inline void *kvs__family_wrapper(const kvs__family_t *f, size_t row) {
  void *p;
  __builtin_memcpy(&p, &f->wrappers[row], sizeof p);
  return p;
}

/* For families with .open: fill every row from handle (real dlsym) and publish the library
 * state (OK, or MISSING when handle is NULL). The first caller wins; a loser's handle is
 * closed, the winner's keeps the library loaded for the life of the process. */
void kvs__family_fill(const kvs__family_t *f, void *handle);
/* KVS__LIB_* of a family with .open (opening it when not tried yet). */
int kvs__family_lib(const kvs__family_t *f);

/* The generic dlsym rule: the wrapper of row when `found` is the row's real function, else
 * found (another definition the caller chose on purpose). */
void *kvs__family_substitute(const kvs__family_t *f, size_t row, void *found);

/* KVSHIM_ENABLE and KVSHIM_HOOKS allow the family: named in KVSHIM_HOOKS, or KVSHIM_HOOKS=auto
 * (the default) and the family's library is in the process (kvs__family_present). */
bool kvs__family_enabled_slow(const kvs__family_t *f);
static inline bool kvs__family_enabled(const kvs__family_t *f) {
  return __builtin_expect(__atomic_load_n(&f->state->enabled, __ATOMIC_ACQUIRE), 1) ||
         kvs__family_enabled_slow(f);
}
/* KVSHIM_ENABLE and KVSHIM_HOOKS let the family be enabled at all (named, or auto). */
bool kvs__family_configured(const kvs__family_t *f);
/* Whether a loaded object other than libkvshim.so defines one of the family's hooks in its
 * dynamic symbol table (dl_iterate_phdr, in memory: no libelf, no allocation). Once true it
 * stays true (objects defining hooks are not unloaded by the engines kvshim serves: even if
 * one were, its wrappers find no real function and report it); a negative answer is kept
 * until another object is loaded. The first positive answer logs the family's line (info):
 * "<family>: <object>, <n>/<m> hooks interposable" (m: hooks defined by some object, n: those
 * defined by a shared object, not by the executable, which precedes LD_PRELOAD). */
bool kvs__family_present(const kvs__family_t *f);
/* The family's init ran in this process's runtime and it is enabled. */
static inline bool kvs__family_on(const kvs__family_t *f) {
  return __atomic_load_n(&f->state->on, __ATOMIC_ACQUIRE) && kvs__family_enabled(f);
}

/* For the runtime: init every enabled family (first negative errno stops), and turn every
 * family off in a fork child. */
int kvs__families_init(kvs__runtime_t *rt);
void kvs__families_fork_child(void);

#ifdef __cplusplus
}
#endif
#endif
