/* runtime: the one implementation of a hook family's machine (see hooks.h). */
#include "hooks.h"

#include <dlfcn.h>
#include <string.h>

#include "internal.h"
#include "log.h"
#include "resolve.h"

/* ---- names (on the path of every dlsym: no libc call, not instrumented) --------------------- */

KVS__DLSYM_PATH static bool str_eq(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return *a == *b;
}

KVS__DLSYM_PATH size_t kvs__family_row(const kvs__family_t *f, const char *name) {
  const char *p = f->prefix, *n = name;
  while (*p && *p == *n) p++, n++;
  if (*p) return f->n_hooks; /* not this family's prefix */
  for (size_t i = 0; i < f->n_hooks; i++)
    if (str_eq(f->names[i], name)) return i;
  return f->n_hooks;
}

KVS__DLSYM_PATH const kvs__family_t *kvs__family_for_name(const char *name, size_t *row) {
  for (size_t i = 0; i < kvs__n_families; i++) {
    size_t r = kvs__family_row(kvs__families[i], name);
    if (r < kvs__families[i]->n_hooks) {
      *row = r;
      return kvs__families[i];
    }
  }
  return NULL;
}

/* ---- real functions ------------------------------------------------------------------------- */

/* Publish p as row's real function unless another thread did; returns the published one. */
static kvs__code_t publish(const kvs__family_t *f, size_t row, kvs__code_t fn) {
  kvs__code_t expected = NULL;
  if (__atomic_compare_exchange_n(&f->real[row], &expected, fn, false, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE))
    return fn;
  return expected;
}

__attribute__((noinline)) kvs__code_t kvs__family_resolve_slow(const kvs__family_t *f,
                                                               size_t row) {
  if (f->open) {
    kvs__family_lib(f);
    return __atomic_load_n(&f->real[row], __ATOMIC_ACQUIRE);
  }
  kvs__runtime_options(); /* the log level, before the line below */
  KVS__REENTRY_GUARD();
  void *p = kvs__resolve_engine_symbol(f->names[row]);
  if (!p || kvs__addr_in_self(p)) return NULL; /* never our own wrapper */
  kvs__code_t fn;
  memcpy(&fn, &p, sizeof fn);
  kvs__code_t got = publish(f, row, fn);
  if (got == fn) {
    /* Once per row: where the engine's function lives, and whether the loader's own
     * RTLD_NEXT search (what a plain interposer relies on) would have seen it. */
    Dl_info di;
    const char *where = dladdr(p, &di) && di.dli_fname ? di.dli_fname : "?";
    bool next = kvs__real_dlsym(RTLD_NEXT, f->names[row]) != NULL;
    kvs_log_info("%s: %s resolved in %s%s", f->name, f->names[row], where,
                 next ? "" : " (not visible to dlsym(RTLD_NEXT): found by scanning loaded objects)");
  }
  return got;
}

void kvs__family_fill(const kvs__family_t *f, void *handle) {
  if (handle) {
    for (size_t i = 0; i < f->n_rows; i++) {
      void *p = kvs__real_dlsym(handle, f->names[i]);
      kvs__code_t fn;
      memcpy(&fn, &p, sizeof fn);
      if (fn) publish(f, i, fn);
    }
  }
  int expected = KVS__LIB_NONE;
  bool won = __atomic_compare_exchange_n(&f->state->lib, &expected,
                                         handle ? KVS__LIB_OK : KVS__LIB_MISSING, false,
                                         __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  /* The winner's handle keeps the library referenced for the life of the process. */
  if (!won && handle) dlclose(handle);
}

int kvs__family_lib(const kvs__family_t *f) {
  int s = __atomic_load_n(&f->state->lib, __ATOMIC_ACQUIRE);
  if (s == KVS__LIB_NONE && f->open) {
    f->open(f);
    s = __atomic_load_n(&f->state->lib, __ATOMIC_ACQUIRE);
  }
  return s;
}

void *kvs__family_substitute(const kvs__family_t *f, size_t row, void *found) {
  if (!found || kvs__hook_depth != 0 || row >= f->n_hooks) return found;
  kvs__code_t real = kvs__family_real(f, row);
  void *rp;
  memcpy(&rp, &real, sizeof rp);
  return rp == found ? kvs__family_wrapper(f, row) : found;
}

/* ---- configuration, init, fork ----------------------------------------------------------------- */

bool kvs__family_enabled(const kvs__family_t *f) {
  const kvs_options_t *o = kvs__runtime_options();
  return o->enable && ((o->hooks & KVS_HOOKS_AUTO) || (o->hooks & f->flag));
}

int kvs__families_init(kvs__runtime_t *rt) {
  for (size_t i = 0; i < kvs__n_families; i++) {
    const kvs__family_t *f = kvs__families[i];
    if (!kvs__family_enabled(f)) continue;
    int rc = f->init ? f->init(rt) : 0;
    if (rc < 0) {
      kvs_log_warn("%s hooks: init failed: %s", f->name, strerror(-rc));
      return rc;
    }
    if (rc != KVS__FAMILY_OFF) __atomic_store_n(&f->state->on, 1, __ATOMIC_RELEASE);
  }
  return 0;
}

void kvs__families_fork_child(void) {
  /* The child builds its own runtime (whose init turns the families on again); resolved
   * pointers stay valid (same mappings). */
  for (size_t i = 0; i < kvs__n_families; i++) {
    __atomic_store_n(&kvs__families[i]->state->on, 0, __ATOMIC_RELAXED);
    if (kvs__families[i]->fork_child) kvs__families[i]->fork_child();
  }
}
