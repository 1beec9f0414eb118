/* kvshim runtime: finding real functions (design §9.2). The library never calls the public
 * dlsym (it exports its own). The private real dlsym comes from dlvsym(RTLD_NEXT, "dlsym",
 * <newest glibc version, then the base one>). Engine symbols are found even in objects a
 * plugin loader opened RTLD_LOCAL (kvs__resolve_engine_symbol). No kvshim lock is held across
 * dlopen or dlsym. */
#ifndef KVSHIM_RUNTIME_RESOLVE_H
#define KVSHIM_RUNTIME_RESOLVE_H

#include <link.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
 * (the dlsym hook needs it for hooked names, see preload/dlsym.c): the first object after the
 * caller's, in load order, whose own dynamic symbol table defines name. Known difference from
 * glibc: an object dlopen'ed RTLD_LOCAL after the caller's object is searched too (glibc skips
 * it when it is not in the caller's scope). NULL when none. */
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

/* True when addr lies in a PT_LOAD segment of the object dl_iterate_phdr describes. */
bool kvs__addr_in_object(const struct dl_phdr_info *info, uintptr_t addr);

/* True when addr lies in the object holding the runtime (libkvshim.so itself). */
bool kvs__addr_in_self(const void *addr);

#ifdef __cplusplus
}
#endif
#endif
