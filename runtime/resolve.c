/* runtime: finding real functions (design §9.2). The private real dlsym, a reader of loaded
 * objects' dynamic symbol tables, the RTLD_NEXT emulation the dlsym hook needs for hooked
 * names, and the engine-symbol resolver that also finds objects opened RTLD_LOCAL. */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "internal.h"
#include "resolve.h"
#include "runtime.h"

#if defined(__x86_64__)
#define KVS__GLIBC_BASE_VERSION "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define KVS__GLIBC_BASE_VERSION "GLIBC_2.17"
#else
#error "kvshim runtime: add this architecture's oldest glibc symbol version (and preload/dlsym.c's trampoline)"
#endif

/* ---- the private real dlsym ------------------------------------------------------------------ */

static _Atomic(kvs__dlsym_fn) g_real_dlsym;

KVS__DLSYM_PATH kvs__dlsym_fn kvs__real_dlsym_fn(void) {
  kvs__dlsym_fn fn = atomic_load_explicit(&g_real_dlsym, memory_order_acquire);
  if (kvs__likely(fn != NULL)) return fn;
  /* glibc >= 2.34 has dlsym in libc at GLIBC_2.34; older ones in libdl at the base version.
   * Racing first callers find the same function. */
  void *p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!p) p = dlvsym(RTLD_NEXT, "dlsym", KVS__GLIBC_BASE_VERSION);
  memcpy(&fn, &p, sizeof fn);
  if (fn) atomic_store_explicit(&g_real_dlsym, fn, memory_order_release);
  return fn;
}

void *kvs__real_dlsym(void *handle, const char *name) {
  kvs__dlsym_fn fn = kvs__real_dlsym_fn();
  return fn ? fn(handle, name) : NULL;
}

/* ---- dynamic symbol tables of loaded objects ------------------------------------------------- */

/* ld.so relocates most DT_* pointers in place; the vDSO's (read-only) dynamic section keeps
 * link-time values. An address below the load bias is a link-time one. */
static uintptr_t dyn_ptr(uintptr_t bias, uintptr_t p) { return p < bias ? p + bias : p; }

static uint32_t gnu_hash(const char *s) {
  uint32_t h = 5381;
  for (; *s; s++) h = h * 33u + (unsigned char)*s;
  return h;
}
static uint32_t sysv_hash(const char *s) {
  uint32_t h = 0;
  for (; *s; s++) {
    h = (h << 4) + (unsigned char)*s;
    uint32_t g = h & 0xf0000000u;
    if (g) h ^= g >> 24;
    h &= ~g;
  }
  return h;
}

typedef struct dynsym_view {
  const ElfW(Sym) *symtab;
  const char *strtab;
  size_t strsz;
  const uint32_t *gnu;
  const ElfW(Word) *sysv;
  const ElfW(Half) *versym;
} dynsym_view_t;

/* Accept a definition dlsym would return: defined, global/weak/unique, not TLS, not a hidden
 * (non-default) version. */
static bool sym_ok(const dynsym_view_t *v, uint32_t idx, const char *name) {
  const ElfW(Sym) *s = &v->symtab[idx];
  if (s->st_shndx == SHN_UNDEF || s->st_name >= v->strsz) return false;
  unsigned bind = ELF64_ST_BIND(s->st_info), type = ELF64_ST_TYPE(s->st_info);
  if (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) return false;
  if (type == STT_TLS || type == STT_SECTION || type == STT_FILE) return false;
  if (v->versym && (v->versym[idx] & 0x8000)) return false;
  return strcmp(v->strtab + s->st_name, name) == 0;
}

int kvs__elf_lookup(uintptr_t bias, const ElfW(Phdr) *phdr, unsigned phnum, const char *name,
                    kvs__elf_sym_t *out) {
  const ElfW(Dyn) *dyn = NULL;
  for (unsigned i = 0; i < phnum; i++)
    if (phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(bias + phdr[i].p_vaddr);
  if (!dyn || !name) return -ENOEXEC;
  dynsym_view_t v = {0};
  for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
    switch (d->d_tag) {
    case DT_SYMTAB: v.symtab = (const ElfW(Sym) *)dyn_ptr(bias, d->d_un.d_ptr); break;
    case DT_STRTAB: v.strtab = (const char *)dyn_ptr(bias, d->d_un.d_ptr); break;
    case DT_STRSZ: v.strsz = d->d_un.d_val; break;
    case DT_GNU_HASH: v.gnu = (const uint32_t *)dyn_ptr(bias, d->d_un.d_ptr); break;
    case DT_HASH: v.sysv = (const ElfW(Word) *)dyn_ptr(bias, d->d_un.d_ptr); break;
    case DT_VERSYM: v.versym = (const ElfW(Half) *)dyn_ptr(bias, d->d_un.d_ptr); break;
    default: break;
    }
  }
  if (!v.symtab || !v.strtab || (!v.gnu && !v.sysv)) return -ENOEXEC;
  uint32_t found = 0;
  if (v.gnu) {
    uint32_t nbuckets = v.gnu[0], symoffset = v.gnu[1], bloom_size = v.gnu[2],
             bloom_shift = v.gnu[3];
    const ElfW(Addr) *bloom = (const ElfW(Addr) *)(const void *)&v.gnu[4];
    const uint32_t *buckets = (const uint32_t *)(const void *)&bloom[bloom_size];
    const uint32_t *chain = &buckets[nbuckets];
    if (!nbuckets || !bloom_size) return -ENOENT;
    const unsigned bits = sizeof(ElfW(Addr)) * 8;
    uint32_t h = gnu_hash(name);
    ElfW(Addr) word = bloom[(h / bits) % bloom_size];
    ElfW(Addr) mask = ((ElfW(Addr))1 << (h % bits)) | ((ElfW(Addr))1 << ((h >> bloom_shift) % bits));
    if ((word & mask) != mask) return -ENOENT;
    uint32_t idx = buckets[h % nbuckets];
    if (idx < symoffset) return -ENOENT;
    for (;; idx++) {
      uint32_t h2 = chain[idx - symoffset];
      if ((h | 1u) == (h2 | 1u) && sym_ok(&v, idx, name)) {
        found = idx;
        break;
      }
      if (h2 & 1u) break;
    }
  } else {
    uint32_t nbucket = v.sysv[0];
    const ElfW(Word) *bucket = &v.sysv[2], *chain = &bucket[nbucket];
    if (!nbucket) return -ENOENT;
    for (uint32_t idx = bucket[sysv_hash(name) % nbucket]; idx; idx = chain[idx])
      if (sym_ok(&v, idx, name)) {
        found = idx;
        break;
      }
  }
  if (!found) return -ENOENT;
  out->addr = bias + v.symtab[found].st_value;
  out->type = (unsigned char)ELF64_ST_TYPE(v.symtab[found].st_info);
  return 0;
}

bool kvs__addr_in_object(const struct dl_phdr_info *info, uintptr_t a) {
  for (unsigned i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *p = &info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + p->p_vaddr;
    if (p->p_type == PT_LOAD && a >= lo && a - lo < p->p_memsz) return true;
  }
  return false;
}

bool kvs__addr_in_self(const void *addr) {
  Dl_info a, b;
  if (!dladdr(addr, &a) || !dladdr((const void *)&g_real_dlsym, &b)) return false;
  return a.dli_fbase == b.dli_fbase;
}

/* ---- walks over loaded objects (dl_iterate_phdr: load order, loader lock held, so the
 * callbacks only read and copy; every dlopen happens after the walk) --------------------------- */

typedef struct walk {
  const char *name;
  uintptr_t after;      /* NEXT: start after the object containing this address (0: none) */
  uintptr_t skip;       /* engine: never the object containing this address */
  bool seen;
  bool found;
  kvs__elf_sym_t sym;
  char path[PATH_MAX];  /* object of the hit ("" = the main program) */
} walk_t;

static int walk_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  walk_t *w = arg;
  if (w->after && !w->seen) {
    if (kvs__addr_in_object(info, w->after)) w->seen = true;
    return 0;
  }
  if (w->skip && kvs__addr_in_object(info, w->skip)) return 0;
  if (kvs__elf_lookup(info->dlpi_addr, info->dlpi_phdr, info->dlpi_phnum, w->name, &w->sym) != 0)
    return 0;
  const char *p = info->dlpi_name ? info->dlpi_name : "";
  size_t n = strnlen(p, sizeof w->path - 1);
  memcpy(w->path, p, n);
  w->path[n] = '\0';
  w->found = true;
  return 1;
}

/* The address a hit stands for: for an indirect function (or anything unusual) ask the real
 * dlsym on that very object, which runs the resolver the way the loader would. */
static void *walk_result(walk_t *w, bool keep_ref) {
  if (!w->found) return NULL;
  if (w->sym.type == STT_FUNC || w->sym.type == STT_OBJECT || w->sym.type == STT_NOTYPE) {
    if (!keep_ref) return (void *)w->sym.addr;
  }
  void *h = dlopen(w->path[0] ? w->path : NULL, RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return NULL;
  void *p = kvs__real_dlsym(h, w->name);
  if (!keep_ref) dlclose(h);
  return p;
}

void *kvs__next_symbol(const void *caller, const char *name) {
  walk_t w;
  memset(&w, 0, sizeof w);
  w.name = name;
  w.after = (uintptr_t)caller;
  dl_iterate_phdr(walk_cb, &w);
  return walk_result(&w, false);
}

/* ---- engine symbols ---------------------------------------------------------------------------- */

#define RESOLVE_CACHE_MAX 64
static struct {
  const char *name;
  void *fn;
} g_cache[RESOLVE_CACHE_MAX];
static size_t g_cache_n;
static pthread_mutex_t g_cache_lock = PTHREAD_MUTEX_INITIALIZER;

static void *cache_get(const char *name) {
  void *fn = NULL;
  pthread_mutex_lock(&g_cache_lock);
  for (size_t i = 0; i < g_cache_n && !fn; i++)
    if (g_cache[i].name == name || strcmp(g_cache[i].name, name) == 0) fn = g_cache[i].fn;
  pthread_mutex_unlock(&g_cache_lock);
  return fn;
}

void *kvs__resolve_engine_symbol(const char *name) {
  if (!name) return NULL;
  void *fn = cache_get(name);
  if (fn) return fn;
  fn = kvs__real_dlsym(RTLD_NEXT, name);
  if (!fn) {
    walk_t w;
    memset(&w, 0, sizeof w);
    w.name = name;
    w.skip = (uintptr_t)&kvs__resolve_engine_symbol;
    dl_iterate_phdr(walk_cb, &w);
    fn = walk_result(&w, true); /* keep the reference: the pointer must not dangle */
  }
  if (!fn) return NULL;
  pthread_mutex_lock(&g_cache_lock);
  bool known = false;
  for (size_t i = 0; i < g_cache_n && !known; i++) known = strcmp(g_cache[i].name, name) == 0;
  if (!known && g_cache_n < RESOLVE_CACHE_MAX) {
    g_cache[g_cache_n].name = name;
    g_cache[g_cache_n].fn = fn;
    g_cache_n++;
  }
  pthread_mutex_unlock(&g_cache_lock);
  return fn;
}

void kvs__resolve_cache_reset(void) {
  pthread_mutex_lock(&g_cache_lock);
  g_cache_n = 0;
  memset(g_cache, 0, sizeof g_cache);
  pthread_mutex_unlock(&g_cache_lock);
}

void kvs__resolve_atfork(int phase) {
  if (phase == 0) pthread_mutex_lock(&g_cache_lock);
  else if (phase == 1) pthread_mutex_unlock(&g_cache_lock);
  else pthread_mutex_init(&g_cache_lock, NULL);
}
