/* kvshim-bench-disk: the disk tier of `kvshim serve` (core/tiers/disk, design §18), each figure
 * printed next to its limit measured in the same run on the same file system (design §16;
 * never run by ctest).
 *
 *   cold read    N objects of 2 MiB / 16 MiB on disk, their segment files dropped from the page
 *                cache (fdatasync, posix_fadvise DONTNEED), the pool empty; one fetch of all N
 *                keys through the tier's hooks, timed until every object is READY in the pool
 *                (header read, extent reserved, payload read straight into it with O_DIRECT
 *                (format version 2), XXH3 checked,
 *                committed). Limit: plain sequential pread, in chunks of the object size, of
 *                the same segment files (the same bytes), dropped from the page cache the same
 *                way, into a touched buffer.
 *   write-behind N objects committed to the store, handed to the tier as the coordinator does,
 *                timed until every one is written and synced (--disk-sync batch) and the
 *                writer has stopped. Limit: plain sequential write of the same bytes to one
 *                new file, then fdatasync; the files of both were removed REUSE_WAIT_S
 *                before (see plain_write).
 *                Tier and limit alternate which goes first (io_bench says why); the ratio is
 *                taken per repetition.
 *   scan         a directory of M 4 KiB objects (written through the record encoder into
 *                256 MiB segments), page cache warm: the tier's start-up scan (its own
 *                disk_scan_ms), per million objects. Limit: plain sequential read of the same
 *                files (64 KiB reads).
 * Every figure is repeated --reps times (default 6) and printed as median and min-max, with
 * the ratio tier / limit (throughput) or the time per million objects.
 *
 * usage: kvshim-bench-disk [--dir DIR] [--reps N] [--scan-objects M] [--quick] [--only WHAT]
 *   DIR (default /var/tmp/kvshim-bench-disk) is emptied and removed; WHAT (2m, 16m or scan)
 *   runs one part only. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "disk.h"
#include "disk_format.h"
#include "internal.h"
#include "log.h"
#include "pool.h"
#include "store.h"

#define MAX_REPS 51

static double now_s(void) { return (double)kvs__now_ns() / 1e9; }

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  double t[MAX_REPS];
  memcpy(t, v, (size_t)n * sizeof *t);
  qsort(t, (size_t)n, sizeof *t, cmp_d);
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}
static double vmin(const double *v, int n) {
  double m = v[0];
  for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
  return m;
}
static double vmax(const double *v, int n) {
  double m = v[0];
  for (int i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
  return m;
}

/* Call fn on the path of every file of dir (names starting with '.' skipped). */
static void each_file(const char *dir, void (*fn)(const char *path)) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *de;
  char p[4500];
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    fn(p);
  }
  closedir(d);
}

static void unlink_file(const char *path) { unlink(path); }
static void rm_rf(const char *dir) {
  each_file(dir, unlink_file);
  rmdir(dir);
}

/* fdatasync then drop from the page cache a file, or every file of a directory. */
static void drop_cache_file(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}
static void drop_cache_dir(const char *dir) { each_file(dir, drop_cache_file); }

typedef struct rig {
  kvs_options_t o;
  kvs_stats_t stats;
  kvs_pool_t *pool;
  kvs_store_t *store;
  kvs_disk_t *disk;
  const kvs_coord_remote_t *hooks;
} rig_t;

static int rig_open(rig_t *r, const char *dir, uint64_t pool_size) {
  memset(r, 0, sizeof *r);
  kvs_options_defaults(&r->o);
  snprintf(r->o.disk, sizeof r->o.disk, "%s", dir);
  r->o.disk_size = 1ull << 40;
  r->o.disk_sync = KVS_DISK_SYNC_BATCH;
  kvs_stats_init(&r->stats);
  kvs_pool_config_t pc = {.cache_size = pool_size, .instance_id = 1};
  if (kvs_pool_create(&pc, &r->pool) < 0) return -1;
  kvs_store_config_t sc = {.pool = r->pool, .stats = &r->stats};
  if (kvs_store_create(&sc, &r->store) < 0) return -1;
  kvs_disk_config_t dc = {.opts = &r->o, .store = r->store, .stats = &r->stats};
  char err[512];
  if (kvs_disk_create(&dc, &r->disk, err, sizeof err) < 0) {
    fprintf(stderr, "disk tier: %s\n", err);
    return -1;
  }
  r->hooks = kvs_disk_hooks(r->disk);
  return kvs_pool_prefault(r->pool) < 0 ? -1 : 0; /* as serve does, in the background */
}

static void rig_close(rig_t *r) {
  kvs_disk_destroy(r->disk, 60000);
  kvs_store_destroy(r->store, true);
  kvs_pool_destroy(r->pool, true);
}

/* Wait until the counters a + b reach want (60 s at most: then the bench stops). */
static void wait_stats(rig_t *r, kvs_stat_id_t a, kvs_stat_id_t b, uint64_t want) {
  struct timespec ts = {0, 1000000}; /* 1 ms: a tighter poll takes CPU from the tier */
  double deadline = now_s() + 60;
  while (kvs_stats_get(&r->stats, a) + kvs_stats_get(&r->stats, b) < want)
    if (now_s() > deadline) {
      fprintf(stderr, "kvshim-bench-disk: %s stuck at %" PRIu64 " of %" PRIu64 "\n",
              kvs_stats_name(a), kvs_stats_get(&r->stats, a), want);
      exit(1);
    } else {
      nanosleep(&ts, NULL);
    }
  if (kvs_stats_get(&r->stats, b)) {
    fprintf(stderr, "kvshim-bench-disk: %" PRIu64 " %s\n", kvs_stats_get(&r->stats, b),
            kvs_stats_name(b));
    exit(1);
  }
}

static kvs_key_t key_of(uint64_t i, uint64_t salt) { return (kvs_key_t){i + 1, salt}; }

/* Commit n objects of size bytes from src into the store (LOCAL owner). */
static int commit_objects(rig_t *r, const uint8_t *src, uint64_t size, int n, uint64_t salt) {
  kvs_layout_t l = kvs_layout_blob(size);
  uint8_t *base = kvs_pool_base(r->pool);
  for (int i = 0; i < n; i++) {
    kvs_key_t k = key_of((uint64_t)i, salt);
    uint8_t outcome;
    kvs_extent_t ext;
    kvs_xfer_t x;
    if (kvs_store_reserve_write(r->store, KVS_OWNER_LOCAL, &k, 1, &l, 0, &outcome, &ext, &x) != 1)
      return -1;
    memcpy(base + ext.offset, src + (size_t)i * size, size);
    if (kvs_store_commit(r->store, KVS_OWNER_LOCAL, x) < 0) return -1;
  }
  return 0;
}

/* Sequential write of n*size bytes to a new file at path, fdatasync: seconds. The old file
 * is removed REUSE_WAIT_S before (untimed), as the tier's segments of the repetition before
 * are: on a VM with free page reporting a page freed just now is cheap to reuse, one freed
 * seconds ago is back with the host and costs a host fault on first touch (docs/PERF.md
 * section 12), so an O_TRUNC rewrite that reuses its own file's pages would favour the limit. */
#define REUSE_WAIT_S 3
static double plain_write(const char *path, const uint8_t *src, uint64_t total) {
  unlink(path);
  sleep(REUSE_WAIT_S);
  double t0 = now_s();
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  for (uint64_t off = 0; off < total;) {
    uint64_t c = total - off < (8u << 20) ? total - off : (8u << 20);
    ssize_t w = write(fd, src + off, c);
    if (w <= 0) break;
    off += (uint64_t)w;
  }
  fdatasync(fd);
  close(fd);
  return now_s() - t0;
}

#define DST_BYTES (1ull << 30) /* the limit's read buffer (touched before timing) */

/* Sequential pread, in chunks of size, of every segment file of dir (dropped from the page
 * cache first) into dst: seconds; *bytes gets the bytes read. */
static uint8_t *pr_dst;
static uint64_t pr_chunk, pr_bytes;
static void plain_read_file(const char *path) {
  if (!strstr(path, KVS_DISK_SEG_SUFFIX)) return;
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) exit(1);
  for (uint64_t off = 0; off < (uint64_t)st.st_size;) {
    uint64_t c = (uint64_t)st.st_size - off < pr_chunk ? (uint64_t)st.st_size - off : pr_chunk;
    uint64_t at = pr_bytes + c <= DST_BYTES ? pr_bytes : 0; /* dst holds every bench's bytes */
    ssize_t r = pread(fd, pr_dst + at, c, (off_t)off);
    if (r <= 0) break;
    off += (uint64_t)r, pr_bytes += (uint64_t)r;
  }
  close(fd);
}
static double plain_read(const char *dir, uint8_t *dst, uint64_t chunk, uint64_t *bytes) {
  drop_cache_dir(dir);
  pr_dst = dst, pr_chunk = chunk, pr_bytes = 0;
  double t0 = now_s();
  each_file(dir, plain_read_file);
  double t = now_s() - t0;
  *bytes = pr_bytes;
  return t;
}

/* The tier's cold read of all n keys through the coordinator's fetch hook: seconds. */
static double tier_read(rig_t *r, const char *dir, const kvs_key_t *keys, int n) {
  drop_cache_dir(dir);
  double t0 = now_s();
  if (r->hooks->fetch(r->hooks->ctx, keys, 0, (size_t)n, kvs__now_ms() + 600000, 1) < 0) exit(1);
  wait_stats(r, KVS_STAT_disk_hits, KVS_STAT_disk_misses, (uint64_t)n);
  return now_s() - t0;
}

/* The write-behind of the n committed objects (a fresh tier on an empty dir): seconds. Then
 * the limit from the pool's memory (*from_pool): the same number of bytes written plainly from
 * the extents the objects occupy (the pool's low end, where they were allocated). */
static double tier_write(const char *dir, const uint8_t *src, uint64_t size, int n,
                         const kvs_key_t *keys, const char *plain, double *from_pool) {
  rm_rf(dir);
  rig_t r;
  uint64_t total = size * (uint64_t)n;
  sleep(REUSE_WAIT_S); /* the freed pages of the segments removed are as cold as the limit's */
  if (rig_open(&r, dir, 4 * total + (64u << 20)) < 0 || commit_objects(&r, src, size, n, 9) < 0) {
    fprintf(stderr, "bench setup failed\n");
    exit(1);
  }
  double t0 = now_s();
  r.hooks->published(r.hooks->ctx, keys, (size_t)n, false);
  wait_stats(&r, KVS_STAT_disk_writes, KVS_STAT_disk_write_drops, (uint64_t)n);
  kvs_disk_destroy(r.disk, 60000); /* joins the writer after its last fdatasync */
  double t = now_s() - t0;
  r.disk = NULL;
  *from_pool = plain_write(plain, kvs_pool_base(r.pool), total);
  rig_close(&r);
  return t;
}

static void print_pair(const char *what, const char *name, int n, double mb, const double *t,
                       const char *limit, double lmb, const double *l, int reps) {
  double ratio[MAX_REPS];
  for (int i = 0; i < reps; i++) ratio[i] = (mb / t[i]) / (lmb / l[i]);
  printf("%-12s %-4s x%-3d tier %5.0f MiB/s [%.0f-%.0f]  %-24s %5.0f MiB/s [%.0f-%.0f]  "
         "ratio %.2f [%.2f-%.2f]\n", what, name, n, mb / median((double *)t, reps),
         mb / vmax(t, reps), mb / vmin(t, reps), limit, lmb / median((double *)l, reps),
         lmb / vmax(l, reps), lmb / vmin(l, reps), median(ratio, reps), vmin(ratio, reps),
         vmax(ratio, reps));
}

/* Each repetition measures the tier and two limits on the same bytes: the plain copy with a
 * malloc'd buffer (the limit) and the plain copy with the pool's own memory (the tier
 * reads into and writes from pool extents: on this VM a kernel copy to or from the pool's
 * shared mapping runs slower than one to or from a private buffer, docs/PERF.md section 12).
 * The three run in an order rotated every repetition: on a VM the host's cache makes a file's
 * first read after it was written slower than later ones, so a fixed order would favour
 * whichever goes later. Ratios are taken per repetition (median and spread over them). */
static void io_bench(const char *dir, int reps, uint64_t size, int n, const char *name) {
  uint64_t total = size * (uint64_t)n;
  uint8_t *src = malloc(total), *dst = malloc(DST_BYTES);
  for (uint64_t i = 0; i < total; i += 8) *(uint64_t *)(src + i) = XXH64(&i, sizeof i, 7);
  memset(dst, 1, DST_BYTES);
  char tdir[4096], plain[4200];
  snprintf(tdir, sizeof tdir, "%s/tier", dir);
  snprintf(plain, sizeof plain, "%s/plain", dir);
  double wt[MAX_REPS], wp[MAX_REPS], wpp[MAX_REPS], rt[MAX_REPS], rp[MAX_REPS], rpp[MAX_REPS];
  uint64_t plain_bytes = total;
  kvs_key_t *keys = malloc((size_t)n * sizeof *keys);
  for (int i = 0; i < n; i++) keys[i] = key_of((uint64_t)i, 9);
  for (int rep = 0; rep < reps; rep++) {
    /* write: the tier (with the from-pool limit right after it) and the malloc'd limit */
    if (rep % 2) wp[rep] = plain_write(plain, src, total);
    wt[rep] = tier_write(tdir, src, size, n, keys, plain, &wpp[rep]);
    if (rep % 2 == 0) wp[rep] = plain_write(plain, src, total);
    /* cold read: a fresh serve on the directory (its scan done), the files out of the page
     * cache; the limits read the same segment files, into dst or into the pool past the
     * extents the tier fills */
    rig_t r;
    if (rig_open(&r, tdir, 4 * total + (64u << 20)) < 0) exit(1);
    for (int k = 0; k < 3; k++) switch ((rep + k) % 3) {
      case 0: rt[rep] = tier_read(&r, tdir, keys, n); break;
      case 1: rp[rep] = plain_read(tdir, dst, size, &plain_bytes); break;
      default: rpp[rep] = plain_read(tdir, kvs_pool_base(r.pool) + 2 * total, size, &plain_bytes);
      }
    rig_close(&r);
  }
  free(keys);
  double mb = (double)total / 1048576.0, pmb = (double)plain_bytes / 1048576.0;
  print_pair("write-behind", name, n, mb, wt, "plain write+fdatasync", mb, wp, reps);
  print_pair("write-behind", name, n, mb, wt, "  the same from the pool", mb, wpp, reps);
  print_pair("cold read", name, n, mb, rt, "plain pread of its files", pmb, rp, reps);
  print_pair("cold read", name, n, mb, rt, "  the same into the pool", pmb, rpp, reps);
  fflush(stdout);
  rm_rf(tdir);
  unlink(plain);
  free(src);
  free(dst);
}

/* M records of 4 KiB written straight with the encoder into 256 MiB segments. */
static void make_scan_dir(const char *dir, uint64_t m) {
  mkdir(dir, 0700);
  uint8_t *buf = malloc(256u << 20);
  uint8_t payload[4096];
  memset(payload, 0x5a, sizeof payload);
  uint64_t hash = XXH3_64bits(payload, sizeof payload), seg = 1, used = 0;
  kvs_layout_t l = kvs_layout_blob(sizeof payload);
  uint64_t rec_len = kvs_disk_record_len(KVS_DISK_VERSION, 0, sizeof payload);
  for (uint64_t i = 0; i <= m; i++) {
    if (used + rec_len > (256u << 20) || (i == m && used)) {
      char name[24], path[4200];
      kvs_disk_segment_name(seg++, name);
      snprintf(path, sizeof path, "%s/%s", dir, name);
      int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (write(fd, buf, used) != (ssize_t)used) exit(1);
      close(fd);
      used = 0;
    }
    if (i == m) break;
    memset(buf + used, 0, rec_len);
    kvs_disk_encode_head(buf + used, KVS_DISK_VERSION, key_of(i, 3), NULL, 0, &l, sizeof payload,
                         hash, i + 1);
    memcpy(buf + used + kvs_disk_payload_off(KVS_DISK_VERSION, 0), payload, sizeof payload);
    used += rec_len;
  }
  free(buf);
}

static double read_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *de;
  static uint8_t buf[64 << 10];
  char p[4500];
  double t0 = now_s();
  while ((de = readdir(d)) != NULL) {
    if (!strstr(de->d_name, KVS_DISK_SEG_SUFFIX)) continue;
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    int fd = open(p, O_RDONLY);
    while (read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
  }
  closedir(d);
  return now_s() - t0;
}

static void scan_bench(const char *dir, int reps, uint64_t m) {
  char sdir[4096];
  snprintf(sdir, sizeof sdir, "%s/scan", dir);
  rm_rf(sdir);
  make_scan_dir(sdir, m);
  double ts[MAX_REPS], tr[MAX_REPS];
  uint64_t found = 0;
  for (int rep = 0; rep < reps; rep++) {
    tr[rep] = read_dir(sdir); /* also warms the page cache */
    rig_t r;
    if (rig_open(&r, sdir, 64u << 20) < 0) exit(1);
    uint64_t ms; /* the tier's own measure of its scan (disk_scan_ms) */
    kvs_disk_scan_result(r.disk, &found, &ms);
    ts[rep] = (double)ms / 1000.0;
    rig_close(&r);
  }
  double per = 1e6 / (double)m;
  printf("scan         %" PRIu64 " x 4 KiB objects (found %" PRIu64 "), warm: tier %.2f s per "
         "million [%.2f-%.2f]  plain read of the files %.2f s per million [%.2f-%.2f]  "
         "ratio %.2f\n", m, found, median(ts, reps) * per, vmin(ts, reps) * per,
         vmax(ts, reps) * per, median(tr, reps) * per, vmin(tr, reps) * per,
         vmax(tr, reps) * per, median(tr, reps) / median(ts, reps));
  rm_rf(sdir);
}

int main(int argc, char **argv) {
  const char *dir = "/var/tmp/kvshim-bench-disk";
  int reps = 6;
  uint64_t scan_m = 200000;
  bool quick = false;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) dir = argv[++i];
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--scan-objects") == 0 && i + 1 < argc)
      scan_m = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--quick") == 0) quick = true;
    else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else {
      fprintf(stderr, "usage: kvshim-bench-disk [--dir DIR] [--reps N] [--scan-objects M] "
              "[--quick] [--only 2m|16m|scan]\n");
      return 2;
    }
  }
  if (reps < 1 || reps > MAX_REPS) reps = 6;
  if (quick) reps = 4, scan_m = 50000;
  kvs_log_set_level(getenv("KVSHIM_BENCH_DEBUG") ? KVS_LOG_DEBUG : KVS_LOG_ERROR);
  mkdir(dir, 0700);
  printf("kvshim-bench-disk: %s, %d reps (median [min-max])\n", dir, reps);
  fflush(stdout);
  if (!only || strcmp(only, "2m") == 0) io_bench(dir, reps, 2u << 20, quick ? 16 : 64, "2m");
  if (!only || strcmp(only, "16m") == 0) io_bench(dir, reps, 16u << 20, quick ? 4 : 16, "16m");
  if (!only || strcmp(only, "scan") == 0) scan_bench(dir, reps, scan_m);
  rm_rf(dir);
  return 0;
}
