/* Run-time family scan (kvs_elf_scan_process) in a real process: links libfx_kvo.so (the kvo
 * family, imported through the PLT), optionally defines kvo_lookup itself (FX_DEFINE_KVO,
 * exported), and dlopens a plugin RTLD_LOCAL when asked.
 *
 *   fx_rt_main [--self-kvo] [PLUGIN]
 *
 * Prints one line per present family ("family: <line>"), then "definition <hook> ok|bad"
 * for each hook the scan located, comparing with the address the loader itself gives
 * (dlsym on the defining object). --self-kvo passes an address inside libfx_kvo.so as
 * "self", as the preload passes its own: that object must then be ignored. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <kvshim/kvo.h>

#include "elfscan.h"

#ifdef FX_DEFINE_KVO
KVO_API int kvo_lookup(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens) {
  (void)desc, (void)tokens;
  return (int)n_tokens;
}
#endif

static int report(const char *when, const void *self, void *plugin) {
  kvs_elf_process_t p;
  memset(&p, 0x5a, sizeof p);
  if (kvs_elf_scan_process(self, &p) != 0) {
    printf("%s: scan failed\n", when);
    return 1;
  }
  printf("%s: objects=%u static=%d\n", when, p.n_objects, (int)p.static_process);
  for (unsigned f = 0; f < KVS_ELF_FAMILY_COUNT; f++) {
    char line[512];
    if (p.family[f].n_present == 0) continue;
    kvs_elf_process_line(&p, (kvs_elf_family_t)f, line, sizeof line);
    printf("%s: family %s: %s (definers=%u)\n", when, kvs_elf_family_name((kvs_elf_family_t)f),
           line, p.family[f].n_definers);
  }
  int bad = 0;
  for (unsigned h = 0; h < KVS_ELF_HOOK_COUNT; h++) {
    const char *name = kvs_elf_hook_name((kvs_elf_hook_t)h);
    /* the loader's own answer: the first definition in the global scope, else the plugin's;
     * none when it lies in self's object */
    void *want = dlsym(RTLD_DEFAULT, name);
    if (want == NULL && plugin) want = dlsym(plugin, name);
    Dl_info a, b;
    if (want && self && dladdr(want, &a) && dladdr(self, &b) && a.dli_fbase == b.dli_fbase)
      want = NULL;
    if (p.definition[h] == NULL && want == NULL) continue;
    printf("%s: definition %s %s\n", when, name, p.definition[h] == want ? "ok" : "bad");
    bad |= p.definition[h] != want;
  }
  return bad;
}

int main(int argc, char **argv) {
  const void *self = NULL;
  const char *plugin = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--self-kvo") == 0)
      self = dlsym(RTLD_DEFAULT, "kvo_store_chunk");
    else
      plugin = argv[i];
  }
  printf("call=%d %d\n", kvo_lookup(NULL, NULL, 2), kvo_store_chunk(NULL, NULL, 0, 0, 0, 0, 0));
  int rc = report("start", self, NULL);
  if (plugin != NULL) {
    void *h = dlopen(plugin, RTLD_LOCAL | RTLD_NOW);
    if (h == NULL) {
      printf("dlopen: %s\n", dlerror());
      return 1;
    }
    rc |= report("plugin", self, h);
    dlclose(h);
  }
  return rc;
}
