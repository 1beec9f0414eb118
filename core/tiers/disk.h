/* kvshim disk: the disk tier of `kvshim serve` (design §18), below the pool and above the
 * remote tier: pool -> disk -> remote. The record layout is in disk_format.h.
 *
 * Only `kvshim serve` creates one. It plugs into the coordinator through kvs_coord_remote_t
 * (coord.h) and chains the tier below it (the remote tier, or none):
 *   write path  every object a peer commits to serve is pinned (under the tier's own store
 *               owner) and queued; the writer thread appends it to the active segment with one
 *               buffered pwritev (header and aliases from a small buffer, payload straight
 *               from the pinned extent: no staging copy), then unpins it and adds it to the
 *               index. The store lock is never held while writing. Then the tier below gets
 *               it too.
 *   read path   a LOOKUP the pool cannot answer whole is handed to the reader thread (never the
 *               writer's: a retrieve never waits for a write), which reads each missing key's
 *               head, reserves an extent, reads the payload straight into it (O_DIRECT for
 *               format version 2, the block-aligned payloads it writes), checks its hash
 *               and commits it; the first key the disk lacks (or the pool cannot take) ends the
 *               run, and what is left goes to the tier below with the same token.
 *   index       key -> (segment, offset) for primaries and aliases, in memory, rebuilt at
 *               create by walking every segment (time and count logged and in stats).
 *   bound       KVSHIM_DISK_SIZE: before a record would pass it, the oldest segments are
 *               deleted whole (their objects leave the index: one unlink per segment).
 *   faults      a write that fails (ENOSPC, EIO, EROFS, a missing directory, no free inodes,
 *               ...) is undone (the segment cut back to the record's start), logged once per
 *               kind, counted (disk_write_errors), and writes pause with a back-off (objects
 *               dropped and counted) while reads go on; a record failing a check when read is
 *               never served: it leaves the index and is counted (disk_bad).
 *   lock        DIR/lock is held with flock(LOCK_EX) for the tier's life: a second serve on DIR
 *               is refused (-EBUSY, the holder's pid in err).
 *
 * Threads: create/attach/destroy from one thread (serve's main); the hooks run on the
 * coordinator thread and never block on I/O; one writer and one reader thread. */
#ifndef KVSHIM_DISK_H
#define KVSHIM_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coord.h"
#include "options.h"
#include "stats.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_disk kvs_disk_t;

typedef struct kvs_disk_config {
  const kvs_options_t *opts;      /* read at create: disk, disk_size, disk_sync */
  kvs_store_t *store;             /* borrowed; must outlive the tier */
  kvs_stats_t *stats;             /* borrowed; NULL = kvs_stats_global() */
  const kvs_coord_remote_t *next; /* copied: the tier below (remote), NULL = none */
} kvs_disk_config_t;

/* How a large payload is read or written (design §18): O_DIRECT between the device and the
 * pool extent, or buffered (through the page cache), whichever measured faster here. Given the
 * moving averages of ns per MiB of each (0: not measured yet) and the count n of large
 * transfers before this one: true for O_DIRECT. Direct first, then one buffered, then the
 * faster, except that one transfer in KVS_DISK_PROBE_EVERY x (slower / faster, 1 to
 * KVS_DISK_PROBE_SPREAD) takes the other one, so a change in the storage below (a host cache
 * warming or going) is seen while the probes cost at most ~1/KVS_DISK_PROBE_EVERY of the
 * time. Pure: the tier's reader and writer call it, each with its own averages. */
#define KVS_DISK_PROBE_EVERY 16u
#define KVS_DISK_PROBE_SPREAD 8u
#define KVS_DISK_MEASURED (1u << 20) /* payloads from this size are timed and chosen */
bool kvs_disk_pick_direct(uint64_t direct_ns_mib, uint64_t buffered_ns_mib, uint32_t n);

/* Lock DIR (creating it when its parent exists), scan its segments into the index, start the
 * threads. A read-only DIR is not an error: the tier serves what is there and writes nothing
 * (err then holds a warning line and 0 is returned). Errors (tier off, err says why in one
 * line): -EBUSY (another serve holds DIR), -ENOENT/-EACCES/-ENOTDIR... (DIR unusable),
 * -ENOMEM, a pthread errno. */
int kvs_disk_create(const kvs_disk_config_t *cfg, kvs_disk_t **out, char *err, size_t errlen);
/* The hooks to put in kvs_coord_config_t.remote (valid while the tier lives): the disk tier
 * and the tier below it. */
const kvs_coord_remote_t *kvs_disk_hooks(kvs_disk_t *d);
/* Set (or clear, NULL) the coordinator fetch completions are reported to. Clear it before
 * kvs_coord_stop. */
void kvs_disk_attach(kvs_disk_t *d, kvs_coord_t *coord);
/* Write what is queued for at most flush_ms, sync, stop the threads, unpin, unlock, free.
 * Accepts NULL. */
void kvs_disk_destroy(kvs_disk_t *d, uint32_t flush_ms);
/* The scan's results (for serve's start line): objects indexed and milliseconds taken. */
void kvs_disk_scan_result(const kvs_disk_t *d, uint64_t *objects, uint64_t *ms);

/* What `kvshim disk DIR` reports: every segment walked and every payload hash checked. */
typedef struct kvs_disk_report {
  uint64_t segments, objects, keys, bytes, bad;
  bool in_use;      /* a serve holds DIR now (its newest segment may grow meanwhile) */
  long holder_pid;  /* that serve's pid, 0 unknown */
} kvs_disk_report_t;
/* Check DIR offline (read only; works beside a running serve). 0, or a negative errno with one
 * line in err (DIR missing or unreadable). */
int kvs_disk_check(const char *dir, kvs_disk_report_t *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
