/* tests/preload: the preload runtime's resolvers, linked directly (no LD_PRELOAD).
 *
 * kvs__resolve_engine_symbol must find functions of an object a plugin loader opened
 * RTLD_LOCAL (invisible to dlsym(RTLD_DEFAULT/RTLD_NEXT)), keep that object loaded so the
 * pointer stays valid, and give the default version of versioned symbols; kvs__elf_lookup and
 * kvs__next_symbol read loaded objects' dynamic symbol tables the way the loader does. */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

#include "resolve.h"
#include "preload_testutil.h"

typedef void *(*lookup_fn)(const char *);

typedef struct find {
  const char *soname_part;
  const char *sym;
  int rc;
  kvs__elf_sym_t out;
} find_t;
static int find_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  find_t *f = arg;
  if (!info->dlpi_name || !strstr(info->dlpi_name, f->soname_part)) return 0;
  f->rc = kvs__elf_lookup(info->dlpi_addr, info->dlpi_phdr, info->dlpi_phnum, f->sym, &f->out);
  return 1;
}

int main(void) {
  /* Visible to nobody but its handle. */
  void *h = dlopen(PT_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  PT_CHECK(h, "dlopen plugin: %s", dlerror());
  void *want = dlsym(h, "pt_plugin_next"), *want_dep = dlsym(h, "pt_dep_only");
  PT_CHECK(want && want_dep, "plugin symbols");
  PT_CHECK(dlsym(RTLD_DEFAULT, "pt_plugin_next") == NULL, "the plugin is not global");
  PT_CHECK(kvs__real_dlsym(RTLD_NEXT, "pt_plugin_next") == NULL, "RTLD_NEXT cannot see it");

  void *got = kvs__resolve_engine_symbol("pt_plugin_next");
  PT_CHECK(got == want, "engine resolver: %p, expected %p", got, want);
  PT_CHECK(kvs__resolve_engine_symbol("pt_dep_only") == want_dep, "the plugin's dependency");
  PT_CHECK(kvs__resolve_engine_symbol("pt_plugin_next") == want, "cached answer");
  kvs__resolve_cache_reset();
  PT_CHECK(kvs__resolve_engine_symbol("pt_plugin_next") == want, "answer after a cache reset");
  PT_CHECK(kvs__resolve_engine_symbol("pt_no_such_symbol_anywhere") == NULL, "a miss");
  PT_CHECK(kvs__resolve_engine_symbol("puts") == dlsym(RTLD_DEFAULT, "puts"), "a global symbol");

  /* The resolver holds a reference: closing the loader's handle does not unload the plugin. */
  PT_CHECK(dlclose(h) == 0, "dlclose");
  Dl_info di;
  PT_CHECK(dladdr(got, &di) && strstr(di.dli_fname, "preload_dlsym_plugin"),
           "the plugin was unloaded under a cached pointer");
  PT_CHECK(((lookup_fn)got)("pt_dep_only") == want_dep, "calling through the cached pointer");

  /* Versioned symbols: the default version, as dlsym returns it (pthread_cond_wait has an old
   * GLIBC_2.2.5 definition and a default GLIBC_2.3.2 one at another address on x86-64). */
  find_t f = {"libc.so", "pthread_cond_wait", -1, {0, 0}};
  dl_iterate_phdr(find_cb, &f);
  PT_CHECK(f.rc == 0, "pthread_cond_wait not found in libc's dynamic symbols");
  void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  PT_CHECK(libc, "libc handle");
  void *def = dlsym(libc, "pthread_cond_wait");
  PT_CHECK((void *)f.out.addr == def, "elf lookup gave %p, dlsym %p", (void *)f.out.addr, def);
  f = (find_t){"libc.so", "pt_no_such_symbol_anywhere", -1, {0, 0}};
  dl_iterate_phdr(find_cb, &f);
  PT_CHECK(f.rc == -ENOENT, "missing symbol: %d", f.rc);

  /* RTLD_NEXT emulation from the main program: libc's puts. */
  PT_CHECK(kvs__next_symbol((const void *)&main, "puts") == dlsym(RTLD_NEXT, "puts"),
           "next symbol after main");
  PT_CHECK(kvs__next_symbol((const void *)&main, "pt_no_such_symbol_anywhere") == NULL,
           "next symbol miss");
  PT_CHECK(kvs__real_dlsym_fn() != NULL, "private dlsym");
  printf("PASS preload_resolve\n");
  return 0;
}
