/* tests/preload: a plugin preload_dlsym_test opens RTLD_LOCAL (like a Python extension or
 * a node addon); its dlsym calls see its own local scope (itself + preload_dlsym_dep). */
#include <dlfcn.h>
__attribute__((visibility("default"))) void *pt_plugin_next(const char *name) {
  return dlsym(RTLD_NEXT, name);
}
__attribute__((visibility("default"))) void *pt_plugin_default(const char *name) {
  return dlsym(RTLD_DEFAULT, name);
}
/* A real use of the dependency, so no --as-needed link drops it from DT_NEEDED. */
int pt_dep_only(void);
__attribute__((visibility("default"))) int pt_plugin_dep(void) { return pt_dep_only(); }
