/* Fixture host: dlopens the plugin named by argv[1] with RTLD_LOCAL and calls it. The host
 * itself links no hook family (static analysis of it cannot see the plugin's). */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*run_fn)(int);

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fx_host PLUGIN\n");
    return 2;
  }
  void *h = dlopen(argv[1], RTLD_LOCAL | RTLD_NOW);
  if (h == NULL) {
    fprintf(stderr, "fx_host: %s\n", dlerror());
    return 1;
  }
  run_fn run;
  *(void **)&run = dlsym(h, "fx_plugin_run");
  if (run == NULL) {
    fprintf(stderr, "fx_host: %s\n", dlerror());
    return 1;
  }
  printf("result=%d\n", run(41));
  dlclose(h);
  return 0;
}
