/* runtime: the one implementation of a hook family's machine (see hooks.h). */
#include "hooks.h"

#include <dlfcn.h>
#include <link.h>
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

/* ---- KVSHIM_HOOKS=auto: is the family's library in the process? ------------------------------ */

#define SCAN_HOOKS_MAX 64 /* hooks of one family counted by the scan */
#define SCAN_PATH_MAX 256

typedef struct scan {
  const kvs__family_t *f;
  uintptr_t self;                  /* an address inside libkvshim.so: never counted */
  unsigned long long adds;         /* dlpi_adds seen */
  bool seen[SCAN_HOOKS_MAX];       /* hook defined by some object */
  bool shared[SCAN_HOOKS_MAX];     /* ... by a shared object (not the executable) */
  unsigned best;                   /* most hooks one object defines */
  char definer[SCAN_PATH_MAX];     /* that object ("" for the executable) */
} scan_t;

static int adds_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds)
    *(unsigned long long *)arg = info->dlpi_adds;
  return 1; /* one object is enough: the counter is the process's */
}

static int scan_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  scan_t *sc = arg;
  adds_cb(info, size, &sc->adds);
  if (kvs__addr_in_object(info, sc->self)) return 0;
  /* The first object of the walk is the executable (dlpi_name ""), which precedes LD_PRELOAD
   * in the lookup order: what it defines is not interposable. */
  bool exe = !info->dlpi_name || !info->dlpi_name[0];
  unsigned here = 0;
  kvs__elf_sym_t sym;
  for (size_t i = 0; i < sc->f->n_hooks && i < SCAN_HOOKS_MAX; i++) {
    if (kvs__elf_lookup(info->dlpi_addr, info->dlpi_phdr, info->dlpi_phnum, sc->f->names[i],
                        &sym) != 0)
      continue;
    here++;
    sc->seen[i] = true;
    if (!exe) sc->shared[i] = true;
  }
  if (here > sc->best) {
    sc->best = here;
    const char *n = exe ? "" : info->dlpi_name;
    size_t len = strnlen(n, sizeof sc->definer - 1);
    memcpy(sc->definer, n, len);
    sc->definer[len] = '\0';
  }
  return 0;
}

static void present_log(const kvs__family_t *f, const scan_t *sc) {
  unsigned m = 0, n = 0;
  for (size_t i = 0; i < SCAN_HOOKS_MAX; i++) {
    m += sc->seen[i];
    n += sc->shared[i];
  }
  const char *base = strrchr(sc->definer, '/');
  base = base ? base + 1 : sc->definer[0] ? sc->definer : "the executable";
  kvs_log_info("%s: %s, %u/%u hooks interposable", f->name, base, n, m);
}

bool kvs__family_present(const kvs__family_t *f) {
  kvs__family_state_t *st = f->state;
  if (__builtin_expect(__atomic_load_n(&st->present, __ATOMIC_ACQUIRE), 1)) return true;
  unsigned long long adds = 0;
  dl_iterate_phdr(adds_cb, &adds);
  if (adds && adds == __atomic_load_n(&st->scanned_adds, __ATOMIC_RELAXED)) return false;
  scan_t sc;
  memset(&sc, 0, sizeof sc);
  sc.f = f;
  sc.self = (uintptr_t)&kvs__family_present;
  dl_iterate_phdr(scan_cb, &sc);
  if (sc.best == 0) {
    __atomic_store_n(&st->scanned_adds, sc.adds, __ATOMIC_RELAXED);
    return false;
  }
  int expected = 0;
  if (__atomic_compare_exchange_n(&st->present, &expected, 1, false, __ATOMIC_RELEASE,
                                  __ATOMIC_RELAXED))
    present_log(f, &sc);
  return true;
}

/* ---- configuration, init, fork ------------------------------------------------------------------ */

bool kvs__family_configured(const kvs__family_t *f) {
  const kvs_config_t *o = kvs__runtime_options();
  return o->enable && ((o->hooks & KVS_HOOKS_AUTO) || (o->hooks & f->flag));
}

bool kvs__family_enabled_slow(const kvs__family_t *f) {
  const kvs_config_t *o = kvs__runtime_options();
  bool on = o->enable && ((o->hooks & f->flag) ||
                          ((o->hooks & KVS_HOOKS_AUTO) && kvs__family_present(f)));
  /* The configuration never changes and presence is sticky: remember a yes. */
  if (on) __atomic_store_n(&f->state->enabled, 1, __ATOMIC_RELEASE);
  return on;
}

int kvs__families_init(kvs__runtime_t *rt) {
  const kvs_config_t *o = &rt->opts;
  for (size_t i = 0; i < kvs__n_families; i++) {
    const kvs__family_t *f = kvs__families[i];
    /* Every configured family is initialised, present or not: with KVSHIM_HOOKS=auto one
     * whose library is loaded later (a plugin) is enabled from then on. */
    if (!kvs__family_configured(f)) continue;
    if (o->hooks & f->flag)
      kvs_log_info("%s: enabled by KVSHIM_HOOKS", f->name);
    else if (!kvs__family_present(f))
      kvs_log_info("%s: not in the process: its hooks pass through until it is loaded", f->name);
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
