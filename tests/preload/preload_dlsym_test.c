/* tests/preload: libkvshim.so exports dlsym; every lookup it passes through must give the
 * answer glibc gives without the preload, RTLD_NEXT and RTLD_DEFAULT included (they depend on
 * the calling object).
 *
 *   preload_dlsym_test            runs the transcript below without and with the preload and
 *                                 compares: identical, except that hooked CUDA names found in
 *                                 libcuda come back as kvshim's wrapper of the same variant
 *   preload_dlsym_test --child    prints the transcript
 *
 * Callers: the main program, library A (linked before B), library B, and a plugin opened
 * RTLD_LOCAL that depends on a library only it can see. A dlsym hook that called the real
 * dlsym itself would make libkvshim the caller: A's RTLD_NEXT would find A again instead of B,
 * and the plugin's lookups would miss its dependency. */
#include <cuda.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "preload_testutil.h"

void *pt_a_next(const char *name);
void *pt_a_default(const char *name);
void *pt_b_next(const char *name);

static void show(const char *who, const char *how, const char *name, void *p) {
  if (!p) {
    const char *e = dlerror();
    printf("%s %s %s -> NULL (%s)\n", who, how, name, e ? e : "no dlerror");
    return;
  }
  Dl_info di;
  const char *obj = "?", *sym = "?";
  if (dladdr(p, &di) && di.dli_fname) {
    const char *b = strrchr(di.dli_fname, '/');
    obj = b ? b + 1 : di.dli_fname;
    if (di.dli_sname && di.dli_saddr == p) sym = di.dli_sname;
  }
  printf("%s %s %s -> %s:%s\n", who, how, name, obj, sym);
}

#define Q(who, how, name, expr)                                                               \
  do {                                                                                        \
    dlerror();                                                                                \
    void *p_ = (expr);                                                                        \
    show(who, how, name, p_);                                                                 \
  } while (0)

static int child(void) {
  /* The main program is the caller. */
  Q("main", "next", "puts", dlsym(RTLD_NEXT, "puts"));
  Q("main", "next", "malloc", dlsym(RTLD_NEXT, "malloc"));
  Q("main", "next", "pt_probe", dlsym(RTLD_NEXT, "pt_probe"));
  Q("main", "next", "pt_nonexistent", dlsym(RTLD_NEXT, "pt_nonexistent"));
  Q("main", "default", "pt_probe", dlsym(RTLD_DEFAULT, "pt_probe"));
  Q("main", "next", "cuMemAlloc_v2", dlsym(RTLD_NEXT, "cuMemAlloc_v2"));
  Q("main", "next", "cuMemAlloc", dlsym(RTLD_NEXT, "cuMemAlloc"));
  /* Library A: RTLD_NEXT continues after A, so it finds B's definition. */
  Q("a", "next", "pt_probe", pt_a_next("pt_probe"));
  Q("a", "next", "puts", pt_a_next("puts"));
  Q("a", "default", "pt_probe", pt_a_default("pt_probe"));
  Q("a", "next", "cuMemAlloc_v2", pt_a_next("cuMemAlloc_v2"));
  Q("a", "next", "cuMemAlloc", pt_a_next("cuMemAlloc"));
  Q("a", "next", "cuInit", pt_a_next("cuInit"));
  /* Library B: nothing defines pt_probe after it. */
  Q("b", "next", "pt_probe", pt_b_next("pt_probe"));
  Q("b", "next", "puts", pt_b_next("puts"));
  /* A plugin opened RTLD_LOCAL: its scope has its dependency, the global scope has not. */
  void *plugin = dlopen(PT_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  PT_CHECK(plugin, "dlopen %s: %s", PT_PLUGIN_PATH, dlerror());
  void *(*p_next)(const char *) = (void *(*)(const char *))dlsym(plugin, "pt_plugin_next");
  void *(*p_default)(const char *) = (void *(*)(const char *))dlsym(plugin, "pt_plugin_default");
  PT_CHECK(p_next && p_default, "plugin entry points");
  Q("plugin", "next", "pt_probe", p_next("pt_probe"));
  Q("plugin", "next", "pt_dep_only", p_next("pt_dep_only"));
  Q("plugin", "default", "pt_dep_only", p_default("pt_dep_only"));
  Q("plugin", "default", "pt_probe", p_default("pt_probe"));
  Q("plugin", "next", "puts", p_next("puts"));
  Q("main", "default", "pt_dep_only", dlsym(RTLD_DEFAULT, "pt_dep_only"));
  /* Handles. */
  void *b = dlopen(PT_LIBB_PATH, RTLD_NOW | RTLD_NOLOAD);
  PT_CHECK(b, "dlopen B");
  Q("main", "handle-b", "pt_probe", dlsym(b, "pt_probe"));
  Q("main", "handle-b", "pt_nonexistent", dlsym(b, "pt_nonexistent"));
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  PT_CHECK(cu, "libcuda is linked");
  Q("main", "handle-cuda", "cuMemFreeHost", dlsym(cu, "cuMemFreeHost"));
  Q("main", "handle-cuda", "cuMemHostRegister_v2", dlsym(cu, "cuMemHostRegister_v2"));
  Q("main", "handle-cuda", "cuNoSuchEntryPoint", dlsym(cu, "cuNoSuchEntryPoint"));
  dlclose(b);
  dlclose(cu);
  return 0;
}

static bool hooked_line(const char *line) {
  return strstr(line, " cuMemAlloc_v2 -> ") || strstr(line, " cuMemFreeHost -> ");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 2 && !strcmp(argv[1], "--child")) return child();
  char tmp[256], out[320], err[320];
  pt_mkdtemp(tmp, sizeof tmp, "dlsym");
  char *argv_child[] = {(char *)pt_self_exe(), "--child", NULL};
  char *text[2];
  for (int preload = 0; preload < 2; preload++) {
    pt_env_t env;
    pt_env_init(&env, preload);
    pt_env_set(&env, "KVSHIM_RUN_DIR", "%s/run", tmp);
    snprintf(out, sizeof out, "%s/out-%d.txt", tmp, preload);
    snprintf(err, sizeof err, "%s/err-%d.txt", tmp, preload);
    int rc = pt_run(argv_child, &env, out, err, 60);
    char *e = pt_read_file(err, NULL);
    PT_CHECK(rc == 0, "child (preload=%d) failed: %s", preload, e ? e : "");
    free(e);
    text[preload] = pt_read_file(out, NULL);
    PT_CHECK(text[preload], "no transcript");
    pt_env_free(&env);
  }
  fputs(text[1], stdout);
  /* The plain run shows the caller-dependent answers this test is about. */
  PT_CHECK(strstr(text[0], "a next pt_probe -> libpreload_dlsym_b.so:pt_probe\n"), "A's next");
  PT_CHECK(strstr(text[0], "a default pt_probe -> libpreload_dlsym_a.so:pt_probe\n"), "A's default");
  PT_CHECK(strstr(text[0], "b next pt_probe -> NULL"), "B's next");
  PT_CHECK(strstr(text[0], "plugin next pt_dep_only -> libpreload_dlsym_dep.so:pt_dep_only\n"),
           "plugin's next");
  PT_CHECK(strstr(text[0], "plugin default pt_dep_only -> libpreload_dlsym_dep.so:pt_dep_only\n"),
           "plugin's default");
  PT_CHECK(strstr(text[0], "main default pt_dep_only -> NULL"), "main's default");
  int lines = 0, hooked = 0;
  char *s0, *s1;
  char *l0 = strtok_r(text[0], "\n", &s0), *l1 = strtok_r(text[1], "\n", &s1);
  for (; l0 || l1; l0 = strtok_r(NULL, "\n", &s0), l1 = strtok_r(NULL, "\n", &s1)) {
    PT_CHECK(l0 && l1, "transcripts differ in length");
    lines++;
    if (!hooked_line(l0)) {
      PT_CHECK(!strcmp(l0, l1), "without preload: '%s'\n     with preload: '%s'", l0, l1);
      continue;
    }
    /* A hooked name found in libcuda: the wrapper of the same variant. */
    hooked++;
    const char *a0 = strstr(l0, " -> "), *a1 = strstr(l1, " -> ");
    PT_CHECK(a0 && a1 && a0 - l0 == a1 - l1 && !strncmp(l0, l1, (size_t)(a0 - l0)), "'%s'", l1);
    PT_CHECK(!strncmp(a0, " -> libcuda.so.1:", 17), "plain: '%s'", l0);
    PT_CHECK(!strncmp(a1, " -> libkvshim.so:", 17) && !strcmp(a0 + 17, a1 + 17),
             "preloaded: '%s'", l1);
  }
  PT_CHECK(lines == 26 && hooked == 3, "%d lines, %d hooked", lines, hooked);
  free(text[0]);
  free(text[1]);
  pt_rm_rf(tmp);
  printf("PASS preload_dlsym\n");
  return 0;
}
