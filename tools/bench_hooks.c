/* kvshim-bench-hooks: what a hooked CUDA call costs over a direct call into the driver
 * (design §16: each figure next to its limit measured in the same run). Never run by ctest.
 *
 *   kvshim-bench-hooks [--pairs N] [--reps R] [--no-valgrind]
 *
 * Arms, each a child process of this program (the parent is never preloaded):
 *   direct     no preload: cuMemAlloc_v2 + cuMemFree_v2 bound straight to the (fake) driver
 *   off        LD_PRELOAD=libkvshim.so, KVSHIM_ENABLE=0: the wrappers pass straight through
 *   on         LD_PRELOAD=libkvshim.so, enabled: device allocations are forwarded and recorded
 *              (tensor registry + cuIpcGetMemHandle + the device UUID)
 *   host-drv   no preload: cuMemHostAlloc(2 MiB) + cuMemFreeHost by the driver itself
 *   host-pool  preloaded: the same pair served from kvshim's host arena (plus registration)
 * Time: the median (and min-max) over R repetitions of N pairs, in ns per pair. The fake
 * driver's own allocation is a memfd + mmap per call, so its noise hides a few ns; the
 * instruction counts, from valgrind --tool=callgrind run on the same binary and arms
 * (--toggle-collect on the timed loop, Ir / N), are exact. Without valgrind the command that
 * would have been run is printed and the instruction figures are null.
 * Output: a table, then one JSON line with every figure and ratio. Goal: the hooked
 * pass-through costs <= 20 ns and <= 50 instructions more than the direct call. */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KVSHIM_PRELOAD_LIB
#error "KVSHIM_PRELOAD_LIB must name libkvshim.so"
#endif

extern char **environ;

#define GOAL_NS 20.0
#define GOAL_IR 50.0

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "kvshim-bench-hooks: %s\n", what);
  exit(1);
}

/* ---- child: the timed loops ------------------------------------------------------------------ */

/* Kept out of line and named: callgrind collects only inside these (--toggle-collect). */
__attribute__((noinline)) void kvs_bench_device_loop(long n) {
  for (long i = 0; i < n; i++) {
    CUdeviceptr d;
    if (cuMemAlloc(&d, 4096) != CUDA_SUCCESS || cuMemFree(d) != CUDA_SUCCESS)
      die("device allocation failed");
  }
}
__attribute__((noinline)) void kvs_bench_host_loop(long n) {
  for (long i = 0; i < n; i++) {
    void *p;
    if (cuMemHostAlloc(&p, 2u << 20, 0) != CUDA_SUCCESS || cuMemFreeHost(p) != CUDA_SUCCESS)
      die("host allocation failed");
  }
}

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
/* The same pair through pointers to the driver's own functions. */
__attribute__((noinline)) void kvs_bench_device_loop_ptr(long n, alloc_fn a, free_fn f) {
  for (long i = 0; i < n; i++) {
    CUdeviceptr d;
    if (a(&d, 4096) != CUDA_SUCCESS || f(d) != CUDA_SUCCESS) die("device allocation failed");
  }
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* In one process, alternately: the pair through the exported names (kvshim's wrappers when
 * preloaded) and through the driver's own functions, fetched with cuGetProcAddress_v2 (which
 * kvshim leaves alone with KVSHIM_ENABLE=0). Prints medians and the per-repetition difference. */
static int child_interleave(long pairs, int reps) {
  alloc_fn a = NULL;
  free_fn f = NULL;
  CUdriverProcAddressQueryResult st;
  if (cuGetProcAddress("cuMemAlloc", (void **)&a, 12000, 0, &st) ||
      cuGetProcAddress("cuMemFree", (void **)&f, 12000, 0, &st))
    die("cuGetProcAddress failed");
  kvs_bench_device_loop(pairs / 10 + 1);
  kvs_bench_device_loop_ptr(pairs / 10 + 1, a, f);
  double *td = calloc((size_t)reps, sizeof *td), *th = calloc((size_t)reps, sizeof *th);
  double *dd = calloc((size_t)reps, sizeof *dd);
  for (int r = 0; r < reps; r++) {
    uint64_t t0 = now_ns();
    kvs_bench_device_loop_ptr(pairs, a, f);
    uint64_t t1 = now_ns();
    kvs_bench_device_loop(pairs);
    uint64_t t2 = now_ns();
    td[r] = (double)(t1 - t0) / (double)pairs;
    th[r] = (double)(t2 - t1) / (double)pairs;
    dd[r] = th[r] - td[r];
  }
  qsort(td, (size_t)reps, sizeof *td, cmp_d);
  qsort(th, (size_t)reps, sizeof *th, cmp_d);
  qsort(dd, (size_t)reps, sizeof *dd, cmp_d);
  printf("%.2f %.2f %.2f %.2f %.2f %.2f %.2f\n", td[reps / 2], th[reps / 2], dd[reps / 2],
         dd[0], dd[reps - 1], dd[reps / 4], dd[(3 * reps) / 4]);
  free(td), free(th), free(dd);
  return 0;
}

static int child(const char *kind, long pairs, int reps) {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx))
    die("CUDA setup failed");
  if (strcmp(kind, "interleave") == 0) return child_interleave(pairs, reps);
  void (*loop)(long) = strcmp(kind, "host") == 0 ? kvs_bench_host_loop : kvs_bench_device_loop;
  /* kvshim's one-time init runs here, outside the loops callgrind counts. */
  CUdeviceptr d0;
  void *h0;
  if (cuMemAlloc(&d0, 4096) || cuMemFree(d0) || cuMemHostAlloc(&h0, 2u << 20, 0) ||
      cuMemFreeHost(h0))
    die("first calls failed");
  loop(pairs / 10 + 1); /* warm up: the driver's tables, the caches */
  double *t = calloc((size_t)reps, sizeof *t);
  for (int r = 0; r < reps; r++) {
    uint64_t t0 = now_ns();
    loop(pairs);
    t[r] = (double)(now_ns() - t0) / (double)pairs;
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_d);
  printf("%.2f %.2f %.2f\n", t[reps / 2], t[0], t[reps - 1]);
  free(t);
  return 0;
}

/* ---- parent ------------------------------------------------------------------------------------ */

typedef struct arm {
  const char *name;
  const char *kind;   /* device | host */
  bool preload;
  const char *enable; /* KVSHIM_ENABLE, or NULL */
  double med, min, max, ir;
} arm_t;

static char g_self[PATH_MAX], g_tmp[256];

/* environ without KVSHIM_* and LD_PRELOAD, plus the arm's settings. */
static char **arm_env(const arm_t *a) {
  size_t n = 0;
  for (char **v = environ; *v; v++) n++;
  char **e = calloc(n + 16, sizeof *e);
  size_t k = 0;
  for (char **v = environ; *v; v++)
    if (strncmp(*v, "KVSHIM_", 7) && strncmp(*v, "LD_PRELOAD=", 11) &&
        strncmp(*v, "LD_LIBRARY_PATH=", 16) && strncmp(*v, "FAKECUDA_", 9))
      e[k++] = *v;
  static char run[400], lib[PATH_MAX + 16], ldp[PATH_MAX + 32];
  snprintf(run, sizeof run, "KVSHIM_RUN_DIR=%s/run", g_tmp);
  snprintf(lib, sizeof lib, "LD_PRELOAD=%s", KVSHIM_PRELOAD_LIB);
  snprintf(ldp, sizeof ldp, "LD_LIBRARY_PATH=%s", KVSHIM_FAKECUDA_DIR);
  e[k++] = run;
  e[k++] = ldp;
  e[k++] = "KVSHIM_POOL_SIZE=8M";
  e[k++] = "KVSHIM_HOST_POOL_SIZE=64M";
  if (a->preload) e[k++] = lib;
  if (a->enable) e[k++] = strcmp(a->enable, "0") == 0 ? "KVSHIM_ENABLE=0" : "KVSHIM_ENABLE=1";
  e[k] = NULL;
  return e;
}

/* Run argv with the arm's environment; stdout into out (cap bytes). Returns the exit status. */
static int run_arm(const arm_t *a, char *const argv[], char *out, size_t cap) {
  int pfd[2];
  if (pipe(pfd) < 0) die("pipe");
  char **env = arm_env(a);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    dup2(pfd[1], 1);
    close(pfd[0]);
    int nul = open("/dev/null", O_WRONLY);
    if (nul >= 0) dup2(nul, 2); /* valgrind's chatter */
    execve(argv[0], argv, env);
    _exit(127);
  }
  close(pfd[1]);
  size_t n = 0;
  ssize_t r;
  while (n + 1 < cap && (r = read(pfd[0], out + n, cap - n - 1)) > 0) n += (size_t)r;
  out[n] = '\0';
  close(pfd[0]);
  int st;
  waitpid(pid, &st, 0);
  free(env);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void time_arm(arm_t *a, long pairs, int reps) {
  char np[32], nr[32], out[256];
  snprintf(np, sizeof np, "%ld", pairs);
  snprintf(nr, sizeof nr, "%d", reps);
  char *argv[] = {g_self, "--child", (char *)a->kind, np, nr, NULL};
  if (run_arm(a, argv, out, sizeof out) != 0 ||
      sscanf(out, "%lf %lf %lf", &a->med, &a->min, &a->max) != 3) {
    fprintf(stderr, "arm %s failed: %s\n", a->name, out);
    exit(1);
  }
}

static const char *find_valgrind(void) {
  static const char *const cands[] = {"/usr/bin/valgrind", "/usr/local/bin/valgrind"};
  for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++)
    if (access(cands[i], X_OK) == 0) return cands[i];
  return NULL;
}

/* Instructions per pair: callgrind collects only inside the loop; Ir total / pairs. */
static void count_arm(arm_t *a, const char *vg, long pairs) {
  char outfile[400], toggle[64], np[32], buf[256];
  snprintf(outfile, sizeof outfile, "--callgrind-out-file=%s/cg-%s.out", g_tmp, a->name);
  snprintf(toggle, sizeof toggle, "--toggle-collect=%s",
           strcmp(a->kind, "host") == 0 ? "kvs_bench_host_loop" : "kvs_bench_device_loop");
  snprintf(np, sizeof np, "%ld", pairs);
  char *argv[] = {(char *)vg, "--tool=callgrind", outfile, toggle, g_self, "--child",
                  (char *)a->kind, np, "1", NULL};
  a->ir = -1;
  if (run_arm(a, argv, buf, sizeof buf) != 0) return;
  char path[400];
  snprintf(path, sizeof path, "%s/cg-%s.out", g_tmp, a->name);
  FILE *f = fopen(path, "r");
  if (!f) return;
  char line[512];
  unsigned long long total = 0;
  bool found = false;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "totals: %llu", &total) == 1 || sscanf(line, "summary: %llu", &total) == 1)
      found = true;
  fclose(f);
  unlink(path);
  /* The warm-up runs inside the same function: pairs + pairs / 10 + 1 pairs in all. */
  if (found) a->ir = (double)total / (double)(pairs + pairs / 10 + 1);
}

static void rm_rf_run(void) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
}

static void jnum(const char *key, double v, bool comma) {
  if (v != v) printf("\"%s\":null%s", key, comma ? "," : "");
  else printf("\"%s\":%.2f%s", key, v, comma ? "," : "");
}

int main(int argc, char **argv) {
  if (argc >= 5 && strcmp(argv[1], "--child") == 0)
    return child(argv[2], atol(argv[3]), atoi(argv[4]));
  long pairs = 20000, vg_pairs = 2000;
  int reps = 15;
  bool use_vg = true;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--pairs") && i + 1 < argc) pairs = atol(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-valgrind")) use_vg = false;
    else {
      fprintf(stderr, "usage: %s [--pairs N] [--reps R] [--no-valgrind]\n", argv[0]);
      return 2;
    }
  }
  if (pairs < 10 || reps < 1) die("--pairs >= 10, --reps >= 1");
  ssize_t n = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
  if (n <= 0) die("readlink /proc/self/exe");
  g_self[n] = '\0';
  const char *t = getenv("TMPDIR");
  snprintf(g_tmp, sizeof g_tmp, "%s/kvshim-bench-hooks-XXXXXX", t && *t ? t : "/tmp");
  if (!mkdtemp(g_tmp)) die("mkdtemp");

  arm_t arms[] = {
      {"direct", "device", false, NULL, 0, 0, 0, -1},
      {"off", "device", true, "0", 0, 0, 0, -1},
      {"on", "device", true, "1", 0, 0, 0, -1},
      {"host-drv", "host", false, NULL, 0, 0, 0, -1},
      {"host-pool", "host", true, "1", 0, 0, 0, -1},
  };
  const size_t na = sizeof arms / sizeof arms[0];
  long host_pairs = pairs / 10 > 100 ? pairs / 10 : 100;
  for (size_t i = 0; i < na; i++)
    time_arm(&arms[i], strcmp(arms[i].kind, "host") == 0 ? host_pairs : pairs, reps);

  /* The pass-through pair against the driver's own functions in the same process. */
  double il[7] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN};
  int il_reps = reps * 2 + 1;
  {
    arm_t a = {"off-interleaved", "interleave", true, "0", 0, 0, 0, -1};
    char np[32], nr[32], out[256];
    snprintf(np, sizeof np, "%ld", pairs);
    snprintf(nr, sizeof nr, "%d", il_reps);
    char *av[] = {g_self, "--child", "interleave", np, nr, NULL};
    if (run_arm(&a, av, out, sizeof out) != 0 ||
        sscanf(out, "%lf %lf %lf %lf %lf %lf %lf", &il[0], &il[1], &il[2], &il[3], &il[4],
               &il[5], &il[6]) != 7)
      fprintf(stderr, "interleaved arm failed: %s\n", out);
  }

  const char *vg = use_vg ? find_valgrind() : NULL;
  if (vg) {
    for (size_t i = 0; i < na; i++)
      count_arm(&arms[i], vg, strcmp(arms[i].kind, "host") == 0 ? vg_pairs / 10 : vg_pairs);
  } else {
    printf("valgrind not used: instruction counts need\n  LD_PRELOAD=%s KVSHIM_ENABLE=0 "
           "valgrind --tool=callgrind --toggle-collect=kvs_bench_device_loop %s --child device "
           "%ld 1\n(and the same without LD_PRELOAD); Ir / %ld is the figure per pair\n\n",
           KVSHIM_PRELOAD_LIB, g_self, vg_pairs, vg_pairs + vg_pairs / 10 + 1);
  }

  const arm_t *d = &arms[0], *off = &arms[1], *on = &arms[2], *hd = &arms[3], *hp = &arms[4];
  printf("kvshim-bench-hooks: %ld device pairs (host: %ld) x %d repetitions, median [min-max]\n",
         pairs, host_pairs, reps);
  printf("%-11s %-44s %12s %22s %12s %10s %10s\n", "arm", "what", "ns/pair", "[min-max]",
         "Ir/pair", "+ns", "+Ir");
  const char *what[] = {"cuMemAlloc_v2+cuMemFree_v2, direct (fake)",
                        "same, preloaded, KVSHIM_ENABLE=0",
                        "same, preloaded, enabled (recorded)",
                        "cuMemHostAlloc 2M+cuMemFreeHost, driver",
                        "same, preloaded: host arena + register"};
  for (size_t i = 0; i < na; i++) {
    const arm_t *a = &arms[i], *base = strcmp(a->kind, "host") == 0 ? hd : d;
    char range[48];
    snprintf(range, sizeof range, "[%.1f-%.1f]", a->min, a->max);
    printf("%-11s %-44s %12.1f %22s", a->name, what[i], a->med, range);
    if (a->ir >= 0) printf(" %12.1f", a->ir);
    else printf(" %12s", "-");
    if (a == base) printf(" %10s %10s\n", "(base)", "(base)");
    else if (a->ir >= 0 && base->ir >= 0) printf(" %10.1f %10.1f\n", a->med - base->med, a->ir - base->ir);
    else printf(" %10.1f %10s\n", a->med - base->med, "-");
  }
  printf("%-11s %-44s %12.1f %22s %12s %10.1f %10s\n", "off-inter", "off, same process, "
         "interleaved with direct calls", il[1], "", "", il[2], "");
  printf("            (direct %.1f ns/pair in that process; per-repetition difference "
         "median %.1f [%.1f..%.1f] ns)\n", il[0], il[2], il[3], il[4]);
  double off_ns = il[2] == il[2] ? il[2] : off->med - d->med, on_ns = on->med - d->med;
  /* How finely the median difference is known: the spread of the per-repetition differences
   * (interquartile range, normal-equivalent sigma) over sqrt(repetitions). */
  double resolution = (il[6] - il[5]) / 1.349 / sqrt((double)il_reps);
  bool ns_resolved = resolution == resolution && resolution <= GOAL_NS;
  printf("            the median difference is known to +-%.1f ns (1 sigma): the goal's ns part "
         "is %s\n", resolution, ns_resolved ? "resolvable" : "NOT resolvable against the "
         "driver's own variation");
  double off_ir = off->ir >= 0 && d->ir >= 0 ? off->ir - d->ir : NAN;
  double on_ir = on->ir >= 0 && d->ir >= 0 ? on->ir - d->ir : NAN;
  printf("goal: hooked pass-through <= %.0f ns and <= %.0f instructions over the direct pair\n"
         "      instructions: %+.1f -> %s\n      time: %+.1f ns (+-%.1f) -> %s\n",
         GOAL_NS, GOAL_IR, off_ir, off_ir == off_ir ? (off_ir <= GOAL_IR ? "met" : "not met")
                                                    : "not measured (no valgrind)",
         off_ns, resolution,
         !ns_resolved ? "not resolvable here" : off_ns <= GOAL_NS ? "met" : "not met");

  printf("{\"bench\":\"hooks\",\"pairs\":%ld,\"host_pairs\":%ld,\"reps\":%d,\"valgrind\":%s,",
         pairs, host_pairs, reps, vg ? "true" : "false");
  for (size_t i = 0; i < na; i++) {
    const arm_t *a = &arms[i];
    printf("\"%s\":{", a->name);
    jnum("ns", a->med, true);
    jnum("ns_min", a->min, true);
    jnum("ns_max", a->max, true);
    jnum("ir", a->ir >= 0 ? a->ir : NAN, false);
    printf("},");
  }
  jnum("off_over_direct_ns", off_ns, true);
  jnum("off_over_direct_ns_across_processes", off->med - d->med, true);
  jnum("interleaved_direct_ns", il[0], true);
  jnum("interleaved_off_ns", il[1], true);
  jnum("interleaved_diff_ns_min", il[3], true);
  jnum("interleaved_diff_ns_max", il[4], true);
  jnum("on_over_direct_ns", on_ns, true);
  jnum("off_over_direct_ir", off_ir, true);
  jnum("on_over_direct_ir", on_ir, true);
  jnum("off_ratio", off->med / d->med, true);
  jnum("on_ratio", on->med / d->med, true);
  jnum("host_pool_over_driver_ns", hp->med - hd->med, true);
  jnum("host_pool_ratio", hp->med / hd->med, true);
  jnum("host_pool_over_driver_ir",
       hp->ir >= 0 && hd->ir >= 0 ? hp->ir - hd->ir : NAN, true);
  jnum("off_over_direct_ns_resolution", resolution, true);
  printf("\"goal_ns\":%.0f,\"goal_ir\":%.0f,\"goal_ir_met\":%s,\"goal_ns_met\":%s}\n",
         GOAL_NS, GOAL_IR, off_ir == off_ir ? (off_ir <= GOAL_IR ? "true" : "false") : "null",
         !ns_resolved ? "null" : off_ns <= GOAL_NS ? "true" : "false");
  rm_rf_run();
  return 0;
}
