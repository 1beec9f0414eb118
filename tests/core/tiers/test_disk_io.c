/* The disk tier's record versions and its I/O (core/tiers/disk.c, core/tiers/disk_format.c, design §18),
 * in process: a pool, a store and the tier on a directory under /var/tmp (TMPDIR if set), the
 * coordinator's hooks called directly.
 *
 *   v2_payload_aligned   what the tier writes is version 2: every payload starts at a multiple
 *                        of KVS_DISK_ALIGN in its segment (so O_DIRECT can move it), is the
 *                        object's bytes, and a fresh tier reads every object back whole
 *                        (sizes below, at and above a block, not multiples of it, aliases);
 *   read_method_choice, large_reads_by_both_methods, large_writes_by_both_methods
 *                        payloads of 1 MiB or more move by the method measured faster
 *                        (O_DIRECT or buffered), each probed, every byte the same either way;
 *   v1_still_read        a segment of version 1 records (payload right after the aliases, as
 *                        the tier wrote before) is scanned and served byte for byte;
 *   version_not_misread  a version 1 record whose version field says 2 (header hash not
 *                        fixed), and a record of an unknown version 3 (hash fixed), are bad:
 *                        counted, never served. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
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
#include "pool.h"
#include "store.h"

typedef struct rig {
  kvs_options_t o;
  kvs_stats_t stats;
  kvs_pool_t *pool;
  kvs_store_t *store;
  kvs_disk_t *disk;
} rig_t;

static char dir[256];

static void make_dir(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/kvshim-disk-io-XXXXXX", tmp && tmp[0] ? tmp : "/var/tmp");
  cr_assert_not_null(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
}

static void rm_dir(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

static int rig_sync = KVS_DISK_SYNC_BATCH; /* --disk-sync of the next rig_open */

static void rig_open(rig_t *r) {
  memset(r, 0, sizeof *r);
  kvs_options_defaults(&r->o);
  snprintf(r->o.disk, sizeof r->o.disk, "%s", dir);
  r->o.disk_size = 1ull << 30;
  r->o.disk_sync = rig_sync;
  kvs_stats_init(&r->stats);
  kvs_pool_config_t pc = {.cache_size = 64u << 20, .instance_id = 1};
  cr_assert_eq(kvs_pool_create(&pc, &r->pool), 0);
  kvs_store_config_t sc = {.pool = r->pool, .stats = &r->stats};
  cr_assert_eq(kvs_store_create(&sc, &r->store), 0);
  kvs_disk_config_t dc = {.opts = &r->o, .store = r->store, .stats = &r->stats};
  char err[512];
  cr_assert_eq(kvs_disk_create(&dc, &r->disk, err, sizeof err), 0, "disk tier: %s", err);
}

static void rig_close(rig_t *r) {
  rig_sync = KVS_DISK_SYNC_BATCH;
  kvs_disk_destroy(r->disk, 30000);
  kvs_store_destroy(r->store, true);
  kvs_pool_destroy(r->pool, true);
}

static uint64_t stat_of(rig_t *r, kvs_stat_id_t id) { return kvs_stats_get(&r->stats, id); }

static void wait_for(rig_t *r, kvs_stat_id_t a, kvs_stat_id_t b, uint64_t want) {
  struct timespec ts = {0, 2000000};
  for (int i = 0; i < 15000 && stat_of(r, a) + stat_of(r, b) < want; i++) nanosleep(&ts, NULL);
  cr_assert_geq(stat_of(r, a) + stat_of(r, b), want, "%s + %s stuck at %llu of %llu",
                kvs_stats_name(a), kvs_stats_name(b),
                (unsigned long long)(stat_of(r, a) + stat_of(r, b)), (unsigned long long)want);
}

static void fill(uint8_t *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(XXH64(&i, sizeof i, seed) >> 7);
}

/* The objects: sizes around the block size and a large one; the third has two aliases. */
#define N_OBJ 5
static const size_t sizes[N_OBJ] = {300, 512, 4096 + 1, 100000, (2u << 20) + 777};
/* The N_OBJ objects' bytes: object i is sizes[i] bytes of the pattern of seed + i (the caller
 * frees them with free_objects). */
static void make_objects(uint8_t *bytes[N_OBJ], uint64_t seed) {
  for (int i = 0; i < N_OBJ; i++) {
    bytes[i] = malloc(sizes[i]);
    cr_assert_not_null(bytes[i]);
    fill(bytes[i], sizes[i], seed + (uint64_t)i);
  }
}
static void free_objects(uint8_t *bytes[N_OBJ]) {
  for (int i = 0; i < N_OBJ; i++) free(bytes[i]);
}
static kvs_key_t key_of(int i) { return (kvs_key_t){0x1000u + (uint64_t)i, 77}; }
static kvs_key_t alias_of(int i, int a) { return (kvs_key_t){0x2000u + (uint64_t)i, (uint64_t)a}; }

/* Commit an object of len bytes under keys[0 .. nk) and hand it to the tier. */
static void publish(rig_t *r, const kvs_key_t *keys, size_t nk, const uint8_t *bytes, size_t len) {
  kvs_layout_t l = kvs_layout_blob(len);
  uint8_t outcome;
  kvs_extent_t ext;
  kvs_xfer_t x;
  cr_assert_eq(kvs_store_reserve_object(r->store, KVS_OWNER_LOCAL, keys, nk, &l, 0, &outcome,
                                        &ext, &x), 1);
  memcpy((uint8_t *)kvs_pool_base(r->pool) + ext.offset, bytes, len);
  cr_assert_eq(kvs_store_commit(r->store, KVS_OWNER_LOCAL, x), 0);
  kvs_disk_hooks(r->disk)->published(kvs_disk_hooks(r->disk)->ctx, keys, nk, true);
}

/* Commit object i (its keys: primary, then 2 aliases for i == 2) and hand it to the tier. */
static void commit_and_publish(rig_t *r, int i, const uint8_t *bytes) {
  kvs_key_t keys[3] = {key_of(i), alias_of(i, 1), alias_of(i, 2)};
  publish(r, keys, i == 2 ? 3 : 1, bytes, sizes[i]);
}

/* Fetch key through the tier into the pool and compare its bytes with want (NULL: must miss). */
static void expect_served(rig_t *r, kvs_key_t key, const uint8_t *want, size_t len) {
  uint64_t before = stat_of(r, KVS_STAT_disk_hits) + stat_of(r, KVS_STAT_disk_misses);
  const kvs_coord_remote_t *h = kvs_disk_hooks(r->disk);
  cr_assert_eq(h->fetch(h->ctx, &key, 0, 1, kvs__now_ms() + 30000, 1), 0);
  wait_for(r, KVS_STAT_disk_hits, KVS_STAT_disk_misses, before + 1);
  kvs_xfer_t x = 0;
  int got = kvs_store_lookup(r->store, KVS_OWNER_LOCAL, &key, 1, true, &x);
  if (!want) {
    cr_assert_eq(got, 0, "a bad record was served");
    return;
  }
  cr_assert_eq(got, 1, "not served from disk");
  kvs_object_view_t v;
  cr_assert_eq(kvs_store_read_pinned(r->store, KVS_OWNER_LOCAL, x, &v, 1), 1);
  cr_assert_eq(v.extent.length, len);
  cr_assert_eq(memcmp((uint8_t *)kvs_pool_base(r->pool) + v.extent.offset, want, len), 0,
               "bytes differ");
  kvs_store_release(r->store, KVS_OWNER_LOCAL, x);
}

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s", path);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(*len ? *len : 1);
  cr_assert_eq(fread(b, 1, *len, f), *len);
  fclose(f);
  return b;
}

static void seg_path(uint64_t id, char *out, size_t cap) {
  char name[24];
  kvs_disk_segment_name(id, name);
  snprintf(out, cap, "%s/%s", dir, name);
}

/* Segment 1 holds exactly the records of bytes[0..n) (lens[i] bytes each) in write order, each
 * version 2 with its payload block-aligned, byte for byte, and zero padding. */
static void expect_segment(uint8_t *const *bytes, const size_t *lens, int n) {
  char path[400];
  seg_path(1, path, sizeof path);
  size_t flen;
  uint8_t *file = read_file(path, &flen);
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    kvs_disk_record_t rec;
    cr_assert_eq(kvs_disk_parse_header(file + off, flen - off, &rec), 0, "record %d", i);
    cr_assert_eq(kvs_disk_check_head(file + off, &rec), 0);
    cr_assert_eq(rec.version, KVS_DISK_VERSION);
    cr_assert_eq(KVS_DISK_VERSION, 2);
    cr_assert_eq((off + rec.payload_off) % KVS_DISK_ALIGN, 0, "payload %d not aligned", i);
    cr_assert_eq(rec.payload_len, lens[i]);
    cr_assert_eq(memcmp(file + off + rec.payload_off, bytes[i], lens[i]), 0, "payload %d", i);
    for (uint64_t p = off + rec.payload_off + lens[i]; p < off + rec.record_len; p++)
      cr_assert_eq(file[p], 0, "padding of record %d not zero", i);
    off += rec.record_len;
  }
  cr_assert_eq(off, flen);
  free(file);
}

Test(disk_io, v2_payload_aligned) {
  make_dir();
  uint8_t *bytes[N_OBJ];
  make_objects(bytes, 1);
  rig_t r;
  rig_open(&r);
  for (int i = 0; i < N_OBJ; i++) commit_and_publish(&r, i, bytes[i]);
  wait_for(&r, KVS_STAT_disk_writes, KVS_STAT_disk_write_drops, N_OBJ);
  cr_assert_eq(stat_of(&r, KVS_STAT_disk_writes), N_OBJ);
  rig_close(&r);

  expect_segment(bytes, sizes, N_OBJ);

  /* A fresh tier scans and serves every object and alias. */
  rig_open(&r);
  cr_assert_eq(stat_of(&r, KVS_STAT_disk_scan_objects), N_OBJ);
  for (int i = 0; i < N_OBJ; i++) expect_served(&r, key_of(i), bytes[i], sizes[i]);
  cr_assert_eq(kvs_store_remove(r.store, &(kvs_key_t){key_of(2).lo, key_of(2).hi}), 0);
  expect_served(&r, alias_of(2, 2), bytes[2], sizes[2]);
  cr_assert_eq(stat_of(&r, KVS_STAT_disk_bad), 0);
  rig_close(&r);
  free_objects(bytes);
  rm_dir();
}

/* The transfer method's choice (kvs_disk_pick_direct, design §18): O_DIRECT first, then one
 * buffered transfer, then the faster, the other one once in KVS_DISK_PROBE_EVERY x (slower /
 * faster, at most KVS_DISK_PROBE_SPREAD) transfers: probes of a method 2x or 100x slower are
 * 2x or KVS_DISK_PROBE_SPREAD x rarer. */
Test(disk_io, read_method_choice) {
  cr_assert(kvs_disk_pick_direct(0, 0, 0));
  cr_assert(kvs_disk_pick_direct(0, 500, 7), "O_DIRECT not measured yet: measure it");
  cr_assert_not(kvs_disk_pick_direct(900, 0, 1), "buffered not measured yet: measure it");
  const struct {
    uint64_t fast, slow;
    uint32_t period;
  } cases[] = {{400, 500, KVS_DISK_PROBE_EVERY},
               {400, 900, 2 * KVS_DISK_PROBE_EVERY},
               {400, 400000, KVS_DISK_PROBE_SPREAD * KVS_DISK_PROBE_EVERY},
               {400, UINT64_MAX, KVS_DISK_PROBE_SPREAD * KVS_DISK_PROBE_EVERY}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int faster_direct = 0; faster_direct < 2; faster_direct++) {
      uint64_t dns = faster_direct ? cases[c].fast : cases[c].slow;
      uint64_t bns = faster_direct ? cases[c].slow : cases[c].fast;
      uint32_t direct = 0, n = 4 * cases[c].period;
      for (uint32_t i = 0; i < n; i++) direct += kvs_disk_pick_direct(dns, bns, i);
      cr_assert_eq(direct, faster_direct ? n - 4 : 4, "%llu vs %llu: the faster, and 1 in %u "
                   "probes the other", (unsigned long long)dns, (unsigned long long)bns,
                   cases[c].period);
    }
}

/* Whether dir takes O_DIRECT at KVS_DISK_ALIGN (else the tier writes and reads buffered). */
static bool dir_takes_direct(void) {
  char f[300];
  snprintf(f, sizeof f, "%s/direct-probe", dir);
  int fd = open(f, O_RDWR | O_CREAT | O_DIRECT, 0600);
  _Alignas(4096) static uint8_t block[KVS_DISK_ALIGN];
  bool ok = fd >= 0 && pwrite(fd, block, sizeof block, 0) == (ssize_t)sizeof block;
  if (fd >= 0) close(fd);
  unlink(f);
  return ok;
}

/* Large payloads are read by both methods while the tier measures them (the first O_DIRECT,
 * the second buffered), every one exact; small ones are not counted. */
Test(disk_io, large_reads_by_both_methods) {
  make_dir();
  if (!dir_takes_direct()) {
    rm_dir();
    cr_skip_test("%s refuses O_DIRECT: only buffered reads there", dir);
  }
  enum { N = 4 };
  const size_t len[N] = {(1u << 20) + 4096, (3u << 19) + 1, 100000, (2u << 20) - 9};
  uint8_t *bytes[N];
  kvs_key_t keys[N];
  rig_t r;
  rig_open(&r);
  for (int i = 0; i < N; i++) {
    bytes[i] = malloc(len[i]);
    fill(bytes[i], len[i], 40u + (uint64_t)i);
    keys[i] = (kvs_key_t){0x3000u + (uint64_t)i, 5};
    publish(&r, &keys[i], 1, bytes[i], len[i]);
  }
  wait_for(&r, KVS_STAT_disk_writes, KVS_STAT_disk_write_drops, N);
  rig_close(&r);
  rig_open(&r);
  for (int i = 0; i < N; i++) expect_served(&r, keys[i], bytes[i], len[i]);
  cr_assert_geq(stat_of(&r, KVS_STAT_disk_reads_direct), 1);
  cr_assert_geq(stat_of(&r, KVS_STAT_disk_reads_buffered), 1);
  cr_assert_eq(stat_of(&r, KVS_STAT_disk_reads_direct) +
                   stat_of(&r, KVS_STAT_disk_reads_buffered), 3, "the 3 large payloads");
  cr_assert_eq(stat_of(&r, KVS_STAT_disk_bad), 0);
  rig_close(&r);
  for (int i = 0; i < N; i++) free(bytes[i]);
  rm_dir();
}

/* Large payloads are written by both methods while the tier measures them (the first
 * O_DIRECT, then a buffered probe), under every --disk-sync: the records are byte for byte
 * what a buffered write makes (payload aligned, padding zero, small buffered records between
 * the direct ones in the same segment), and a fresh tier serves every one. */
Test(disk_io, large_writes_by_both_methods) {
  enum { N = 8 };
  const size_t len[N] = {(2u << 20) - 9, 300, (1u << 20) + 4096, (3u << 19) + 1, 100000,
                         (1u << 20), (2u << 20) + 511, 4097};
  const int modes[] = {KVS_DISK_SYNC_BATCH, KVS_DISK_SYNC_ALWAYS, KVS_DISK_SYNC_NONE};
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    make_dir();
    if (!dir_takes_direct()) {
      rm_dir();
      cr_skip_test("%s refuses O_DIRECT: only buffered writes there", dir);
    }
    uint8_t *bytes[N];
    kvs_key_t keys[N];
    size_t large = 0;
    rig_t r;
    rig_sync = modes[m];
    rig_open(&r);
    for (int i = 0; i < N; i++) {
      bytes[i] = malloc(len[i]);
      fill(bytes[i], len[i], 60u + (uint64_t)i + 10 * m);
      keys[i] = (kvs_key_t){0x4000u + (uint64_t)i, 9};
      large += len[i] >= KVS_DISK_MEASURED;
      publish(&r, &keys[i], 1, bytes[i], len[i]);
    }
    wait_for(&r, KVS_STAT_disk_writes, KVS_STAT_disk_write_drops, N);
    cr_assert_eq(stat_of(&r, KVS_STAT_disk_writes), N, "sync mode %d", modes[m]);
    cr_assert_geq(stat_of(&r, KVS_STAT_disk_writes_direct), 1, "sync mode %d", modes[m]);
    cr_assert_geq(stat_of(&r, KVS_STAT_disk_writes_buffered), 1, "sync mode %d", modes[m]);
    cr_assert_eq(stat_of(&r, KVS_STAT_disk_writes_direct) +
                     stat_of(&r, KVS_STAT_disk_writes_buffered), large, "the large payloads");
    rig_close(&r);

    expect_segment(bytes, len, N);

    rig_open(&r);
    for (int i = 0; i < N; i++) expect_served(&r, keys[i], bytes[i], len[i]);
    cr_assert_eq(stat_of(&r, KVS_STAT_disk_bad), 0);
    rig_close(&r);
    for (int i = 0; i < N; i++) free(bytes[i]);
    rm_dir();
  }
}

/* Write records of a given version (header version field forced to field_version, hash
 * recomputed or not) into segment 1 of dir. */
static void write_segment(uint16_t version, uint16_t field_version, bool fix_hash,
                          uint8_t **bytes) {
  uint64_t total = 0;
  for (int i = 0; i < N_OBJ; i++) total += kvs_disk_record_len(version, 0, sizes[i]);
  uint8_t *img = calloc(1, total);
  uint64_t off = 0;
  for (int i = 0; i < N_OBJ; i++) {
    kvs_layout_t l = kvs_layout_blob(sizes[i]);
    kvs_disk_encode_head(img + off, fix_hash ? field_version : version, key_of(i), NULL, 0, &l,
                         sizes[i], XXH3_64bits(bytes[i], sizes[i]), (uint64_t)i + 1);
    img[off + 4] = (uint8_t)field_version; /* little-endian u16 at 4 */
    memcpy(img + off + kvs_disk_payload_off(version, 0), bytes[i], sizes[i]);
    off += kvs_disk_record_len(version, 0, sizes[i]);
  }
  char path[400];
  seg_path(1, path, sizeof path);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, img, total), (ssize_t)total);
  close(fd);
  free(img);
}

Test(disk_io, v1_still_read) {
  make_dir();
  uint8_t *bytes[N_OBJ];
  make_objects(bytes, 11);
  /* version 1: the payload right after the 128-byte header, not block-aligned */
  cr_assert_eq(kvs_disk_payload_off(KVS_DISK_VERSION_V1, 0), KVS_DISK_HDR_SIZE);
  write_segment(KVS_DISK_VERSION_V1, KVS_DISK_VERSION_V1, true, bytes);
  rig_t r;
  rig_open(&r);
  cr_assert_eq(stat_of(&r, KVS_STAT_disk_scan_objects), N_OBJ);
  cr_assert_eq(stat_of(&r, KVS_STAT_disk_bad), 0);
  for (int i = 0; i < N_OBJ; i++) expect_served(&r, key_of(i), bytes[i], sizes[i]);
  cr_assert_eq(stat_of(&r, KVS_STAT_disk_bad), 0);
  rig_close(&r);
  kvs_disk_report_t rep;
  char err[256];
  cr_assert_eq(kvs_disk_check(dir, &rep, err, sizeof err), 0, "%s", err);
  cr_assert_eq(rep.objects, N_OBJ);
  cr_assert_eq(rep.bad, 0);
  free_objects(bytes);
  rm_dir();
}

Test(disk_io, version_not_misread) {
  make_dir();
  uint8_t *bytes[N_OBJ];
  make_objects(bytes, 21);
  /* v1 records whose version field says 2: the header hash covers it, so they are bad */
  write_segment(KVS_DISK_VERSION_V1, KVS_DISK_VERSION, false, bytes);
  rig_t r;
  rig_open(&r);
  cr_assert_eq(stat_of(&r, KVS_STAT_disk_scan_objects), 0);
  cr_assert_gt(stat_of(&r, KVS_STAT_disk_bad), 0);
  expect_served(&r, key_of(3), NULL, 0);
  rig_close(&r);
  /* version 3 with a good header hash: an unknown version is bad, never guessed at */
  write_segment(KVS_DISK_VERSION, 3, true, bytes);
  rig_open(&r);
  cr_assert_eq(stat_of(&r, KVS_STAT_disk_scan_objects), 0);
  cr_assert_gt(stat_of(&r, KVS_STAT_disk_bad), 0);
  expect_served(&r, key_of(0), NULL, 0);
  rig_close(&r);
  free_objects(bytes);
  rm_dir();
}
