/* Benchmark (not a test): the engine-visible cost of large pinned host allocations, the
 * driver's own against kvshim's host arena (issue 14 item 6).
 *
 *   cuda_hostalloc_bench [--mib N] [--count K] [--gap-ms G] [--warm-ms W]
 *   cuda_hostalloc_bench --compare LIBKVSHIM [--mib N] [--count K] [--gap-ms G] [--warm-ms W]
 *                        [--max-ratio R]
 *
 * Allocates K buffers of N MiB with cuMemHostAlloc, idle G ms between them (an engine does
 * other work between allocations), then frees them; prints one JSON line with the median,
 * min and max time of the cuMemHostAlloc calls. --compare runs itself twice in the same
 * session, without LD_PRELOAD (the driver's pinned allocation: the physical reference) and
 * with LIBKVSHIM preloaded, and prints the ratio kvshim/driver of the medians with the spread
 * (min and max of the per-allocation ratios). On the fake driver the pinning cost is
 * FAKECUDA_REGISTER_NS_PER_MIB (default 1000 ns/MiB); on a real GPU it is the driver's.
 * --warm-ms W first allocates 1 MiB of device memory and a 2 MiB pinned buffer (freed), and
 * idles W ms, as an engine loads its weights and sets up before it allocates its large pinned
 * buffers (under kvshim that first host allocation registers the first 64 MiB piece of the
 * host arena, unless KVSHIM_CUDA_PIN_ARENA=0). --max-ratio R makes it a verdict (scripts/gpu-check
 * steps hostalloc and hostalloc-pin): a last line "verdict: ... PASS" and exit status 0 when
 * the ratio of the medians is at most R, "FAIL" and 1 otherwise. */
#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_benchutil.h"

#define MAX_K 64


static void sleep_ms(int ms) {
  struct timespec g = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&g, NULL);
}

static int run(size_t mib, int k, int gap_ms, int warm_ms, double *ms) {
  CUcontext c = NULL;
  if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) {
    fprintf(stderr, "no CUDA context\n");
    return 1;
  }
  CUdeviceptr w = 0;
  if (warm_ms > 0) {
    void *h = NULL;
    if (cuMemAlloc(&w, 1 << 20) != CUDA_SUCCESS || cuMemHostAlloc(&h, 2 << 20, 0) != CUDA_SUCCESS ||
        cuMemFreeHost(h) != CUDA_SUCCESS) {
      fprintf(stderr, "warm-up: cuMemAlloc 1 MiB or cuMemHostAlloc 2 MiB failed\n");
      return 1;
    }
    sleep_ms(warm_ms);
  }
  void *p[MAX_K] = {0};
  for (int i = 0; i < k; i++) {
    double t0 = now_s();
    CUresult r = cuMemHostAlloc(&p[i], mib << 20, 0);
    ms[i] = (now_s() - t0) * 1e3;
    if (r != CUDA_SUCCESS) {
      fprintf(stderr, "cuMemHostAlloc %zu MiB: %d\n", mib, (int)r);
      return 1;
    }
    sleep_ms(gap_ms);
  }
  for (int i = 0; i < k; i++) cuMemFreeHost(p[i]);
  if (w) cuMemFree(w);
  return 0;
}

/* Runs this program as a child (with or without LD_PRELOAD) and reads its K times. */
static int child(const char *self, const char *preload, char **args, double *ms, int k) {
  int fd[2];
  if (pipe(fd)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    if (preload) setenv("LD_PRELOAD", preload, 1);
    else unsetenv("LD_PRELOAD");
    execv(self, args);
    _exit(127);
  }
  close(fd[1]);
  FILE *f = fdopen(fd[0], "r");
  int n = 0;
  while (n < k && f && fscanf(f, "%lf", &ms[n]) == 1) n++;
  if (f) fclose(f);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 && n == k ? 0 : -1;
}

int main(int argc, char **argv) {
  size_t mib = 256;
  int k = 4, gap_ms = 50, warm_ms = 0, raw = 0;
  double max_ratio = 0; /* 0: figures only */
  const char *lib = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--count") && i + 1 < argc) k = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--gap-ms") && i + 1 < argc) gap_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warm-ms") && i + 1 < argc) warm_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--compare") && i + 1 < argc) lib = argv[++i];
    else if (!strcmp(argv[i], "--raw")) raw = 1;
    else if (!strcmp(argv[i], "--max-ratio") && i + 1 < argc) max_ratio = strtod(argv[++i], NULL);
    else {
      fprintf(stderr,
              "usage: %s [--compare LIBKVSHIM] [--mib N] [--count K] [--gap-ms G] [--warm-ms W] "
              "[--max-ratio R]\n",
              argv[0]);
      return 2;
    }
  }
  if (k < 1 || k > MAX_K || mib == 0 || gap_ms < 0 || warm_ms < 0 || max_ratio < 0 ||
      (max_ratio > 0 && !lib)) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  double ms[MAX_K], s[MAX_K];
  if (!lib) {
    if (run(mib, k, gap_ms, warm_ms, ms)) return 1;
    if (raw) {
      for (int i = 0; i < k; i++) printf("%.6f\n", ms[i]);
      return 0;
    }
    memcpy(s, ms, sizeof(double) * (size_t)k);
    qsort(s, (size_t)k, sizeof s[0], cmp_d);
    printf("{\"mib\":%zu,\"count\":%d,\"alloc_ms_median\":%.3f,\"alloc_ms_min\":%.3f,"
           "\"alloc_ms_max\":%.3f}\n", mib, k, s[k / 2], s[0], s[k - 1]);
    return 0;
  }
  char nb[32], kb[32], gb[32], wb[32];
  snprintf(nb, sizeof nb, "%zu", mib);
  snprintf(kb, sizeof kb, "%d", k);
  snprintf(gb, sizeof gb, "%d", gap_ms);
  snprintf(wb, sizeof wb, "%d", warm_ms);
  char *args[] = {argv[0], "--mib", nb, "--count", kb, "--gap-ms", gb, "--warm-ms", wb, "--raw",
                  NULL};
  if (!getenv("KVSHIM_HOST_POOL_SIZE")) {
    char pool[48];
    snprintf(pool, sizeof pool, "%zuM", mib * (size_t)(k + 2));
    setenv("KVSHIM_HOST_POOL_SIZE", pool, 1);
  }
  double drv[MAX_K], kvs[MAX_K], ratio[MAX_K];
  if (child("/proc/self/exe", NULL, args, drv, k) ||
      child("/proc/self/exe", lib, args, kvs, k)) {
    fprintf(stderr, "a run failed\n");
    return 1;
  }
  for (int i = 0; i < k; i++) ratio[i] = drv[i] > 0 ? kvs[i] / drv[i] : 0;
  memcpy(s, drv, sizeof(double) * (size_t)k);
  qsort(s, (size_t)k, sizeof s[0], cmp_d);
  double dmed = s[k / 2];
  memcpy(s, kvs, sizeof(double) * (size_t)k);
  qsort(s, (size_t)k, sizeof s[0], cmp_d);
  double kmed = s[k / 2];
  qsort(ratio, (size_t)k, sizeof ratio[0], cmp_d);
  printf("{\"mib\":%zu,\"count\":%d,\"driver_alloc_ms_median\":%.3f,"
         "\"kvshim_alloc_ms_median\":%.3f,\"ratio_kvshim_over_driver\":%.3f,"
         "\"ratio_min\":%.3f,\"ratio_max\":%.3f,\"first_ms_driver\":%.3f,"
         "\"first_ms_kvshim\":%.3f}\n",
         mib, k, dmed, kmed, dmed > 0 ? kmed / dmed : 0, ratio[0], ratio[k - 1], drv[0], kvs[0]);
  if (max_ratio > 0) {
    bool ok = dmed > 0 && kmed / dmed <= max_ratio;
    printf("verdict: median cuMemHostAlloc(%zu MiB) under kvshim %.3fx the driver's (bound "
           "%.2fx) -> %s\n", mib, dmed > 0 ? kmed / dmed : 0, max_ratio, ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  }
  return 0;
}
