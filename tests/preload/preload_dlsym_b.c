/* tests/preload: library B of preload_dlsym_test (the last definition of pt_probe). */
#include <dlfcn.h>
__attribute__((visibility("default"))) int pt_probe(void) { return 'B'; }
__attribute__((visibility("default"))) void *pt_b_next(const char *name) {
  return dlsym(RTLD_NEXT, name);
}
