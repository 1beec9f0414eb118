/* tests/preload: library A of preload_dlsym_test (linked before B). dlsym from here makes
 * this object the caller glibc sees. */
#include <dlfcn.h>
__attribute__((visibility("default"))) int pt_probe(void) { return 'A'; }
__attribute__((visibility("default"))) void *pt_a_next(const char *name) {
  return dlsym(RTLD_NEXT, name);
}
__attribute__((visibility("default"))) void *pt_a_default(const char *name) {
  return dlsym(RTLD_DEFAULT, name);
}
