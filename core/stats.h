/* kvshim stats: every counter and gauge is declared once, as a row X(name, kind, help) in the
 * list of the layer that counts it, which generates the ids, the names and the help. Rendered as
 * INFO-style "key:value" text (the STATS opcode, `kvshim stats`) and as JSON (KVSHIM_STATS, the
 * A/B runner) from the same table.
 *
 * Each layer owns its rows (design §2, §13): KVS_CORE_STATS here holds those core's code counts;
 * the runtime's and each hook family's rows live with them, and runtime/rows.h composes the
 * process's table (core's rows first, so their ids are these) and installs it with
 * kvs_stats_use_table. Until then the table is core's rows alone.
 *
 * Counters only grow; gauges are set by their owner, or moved by deltas (the store moves its
 * byte and object gauges by each mutation's delta). All updates are relaxed atomics: a snapshot
 * is not a consistent cut across fields, only each field is exact.
 *
 * Stripes. A block holds KVS_STATS_STRIPES rows of every field; a thread adds to the row of its
 * stripe (picked round robin at its first update, kept for its life) and a read sums the rows,
 * so threads updating the same counters at once do not share a cache line (two threads cycling
 * on one store make ~20 updates a cycle each). A field's value is the sum of its row words,
 * modulo 2^64 (a gauge's row may hold a negative delta). Stripes are still updated atomically:
 * more threads than stripes share rows. A counter read is exact once its updates have returned,
 * and never goes backwards between two reads. A gauge read while deltas land on several rows
 * may be off by the deltas in flight, and is clamped at 0 (never a wrapped "negative" value).
 * The block lives in its process only: other processes see it rendered (STATS opcode,
 * `kvshim stats`, KVSHIM_STATS), through kvs_stats_get. */
#ifndef KVSHIM_STATS_H
#define KVSHIM_STATS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_STATS_VERSION 1

/* X(name, kind, help). kind: C = counter (monotonic), G = gauge. Append only within a list:
 * JSON consumers read by name, but the order is the rendering order. */
#define KVS_CORE_STATS(X)                                                                     \
  X(store_reserve_calls, C, "reserve_write/reserve_object calls")                             \
  X(store_reserved, C, "keys reserved for writing")                                           \
  X(store_present, C, "keys already READY at reservation (nothing to write)")                 \
  X(store_busy, C, "keys refused because another owner is writing them")                      \
  X(store_no_space, C, "keys refused: eviction could not make room")                          \
  X(store_too_large, C, "keys refused: larger than the cache arena")                          \
  X(store_bad_layout, C, "keys refused: invalid layout")                                      \
  X(store_commits, C, "write transfers committed")                                            \
  X(store_committed_objects, C, "objects published READY")                                   \
  X(store_aborts, C, "write transfers aborted by their owner")                                \
  X(store_aborted_objects, C, "reserved objects freed without being published")              \
  X(store_alias_skipped, C, "alias keys not bound because the key was taken")                 \
  X(store_lookups, C, "lookup calls")                                                         \
  X(store_lookup_keys, C, "keys asked for in lookups")                                        \
  X(store_hits, C, "keys found READY by lookups")                                             \
  X(store_misses, C, "lookups that stopped before the last key")                              \
  X(store_pins, C, "read pins taken")                                                         \
  X(store_releases, C, "read transfers released")                                             \
  X(store_evictions, C, "objects evicted (LRU)")                                              \
  X(store_evicted_bytes, C, "bytes evicted")                                                  \
  X(store_removed, C, "objects removed explicitly")                                           \
  X(store_lease_expired, C, "leases reclaimed by the deadline sweep")                         \
  X(store_owner_releases, C, "owners released (all their leases ended at once)")              \
  X(store_bad_transfer, C, "commit/abort/release naming a transfer the owner does not hold")  \
  X(store_objects, G, "READY objects")                                                        \
  X(store_keys, G, "keys bound (primary and aliases)")                                        \
  X(store_used_bytes, G, "bytes held by READY objects")                                       \
  X(store_reserved_bytes, G, "bytes held by WRITING objects")                                 \
  X(store_free_bytes, G, "free bytes in the cache arena")                                     \
  X(store_arena_bytes, G, "cache arena size")                                                 \
  X(pool_fragmentation_pct, G, "100 * (1 - largest free extent / free bytes)")               \
  X(peer_lookups, C, "LOOKUPs sent to peers (or PREPARE_RETRIEVEs in their place)")           \
  X(peer_hits, C, "chunks retrieved from peers")                                              \
  X(peer_misses, C, "peer retrievals that found nothing")                                     \
  X(peer_errors, C, "peer calls that failed or timed out (served as misses)")                 \
  X(peer_bytes_in, C, "bytes retrieved from peers")                                           \
  X(peer_stores, C, "objects stored into peers")                                              \
  X(push_queued, C, "objects queued for write-behind to the cache peer")                      \
  X(push_sent, C, "objects pushed to the cache peer")                                         \
  X(push_dropped, C, "objects dropped: write-behind queue full or push failed")               \
  X(coord_connections, C, "connections accepted")                                             \
  X(coord_refused, C, "connections refused (uid or HELLO)")                                   \
  X(coord_requests, C, "requests served")                                                     \
  X(coord_errors, C, "requests answered with ERROR")                                          \
  X(coord_bad_frames, C, "malformed frames (connection closed)")                              \
  X(coord_bytes_out, C, "payload bytes sent inline")                                          \
  X(coord_accept_paused, C,                                                                   \
    "times the coordinator stopped accepting: out of file descriptors (EMFILE/ENFILE)")       \
  X(store_live_pins, G, "read pins held now (returns to 0 when every reader is gone)")        \
  X(peer_stale_reads, C, "peer SHM copies thrown away: the pin had expired (COMMIT_RETRIEVE ENOENT)") \
  X(peer_bad_reports, C, "REPORT_BAD sent: an object a peer delivered failed a format check")  \
  X(coord_bad_reports, C, "REPORT_BAD requests received")                                    \
  X(coord_bad_dropped, C, "objects dropped after a REPORT_BAD whose bytes matched ours")       \
  X(peer_watches, C, "WATCHes sent: waits on a peer's claim, answered when it changes")       \
  X(coord_watches, C, "WATCH requests received")                                              \
  X(remote_lookups, C, "remote tier: lookups that consulted the remote store")                 \
  X(remote_hits, C, "remote tier: keys fetched from the remote store into the pool")          \
  X(remote_misses, C, "remote tier: lookups that stopped at a key the remote store lacks")     \
  X(remote_bytes_in, C, "remote tier: value bytes read from the remote store")                \
  X(remote_bytes_out, C, "remote tier: value bytes written to the remote store")              \
  X(remote_writes, C, "remote tier: values written (SET NX accepted)")                        \
  X(remote_write_present, C, "remote tier: values already in the remote store (NX kept it)")  \
  X(remote_errors, C, "remote tier: calls that failed (connection, error reply, wrong type)") \
  X(remote_timeouts, C, "remote tier: calls or lookups that ran past their deadline")         \
  X(remote_breaker_opens, C, "remote tier: circuit breaker openings (tier skipped a while)")  \
  X(remote_queue_drops, C, "remote tier: writes dropped (queue full, breaker open, unpinned)") \
  X(remote_bad_values, C, "remote tier: values that failed a check (missed and deleted)")     \
  X(cache_peer_pool_pins, C,                                                                  \
    "one copy: cache peer pool mappings registered with the device driver in the background")  \
  X(disk_objects, G, "disk tier: objects on disk (in its index)")                             \
  X(disk_bytes, G, "disk tier: bytes of its segment files")                                   \
  X(disk_hits, C, "disk tier: keys read from disk into the pool")                             \
  X(disk_misses, C, "disk tier: lookups that stopped at a key the disk lacks or the pool could not take") \
  X(disk_bytes_read, C, "disk tier: payload bytes read from disk into the pool")              \
  X(disk_writes, C, "disk tier: objects written behind to disk")                              \
  X(disk_bytes_written, C, "disk tier: record bytes written to disk")                         \
  X(disk_write_drops, C,                                                                      \
    "disk tier: objects not written (queue full, writes paused by a fault, larger than the bound)") \
  X(disk_evictions, C, "disk tier: objects deleted with their segment to stay under KVSHIM_DISK_SIZE") \
  X(disk_bad, C, "disk tier: records that failed a check (torn, corrupt): dropped, never served") \
  X(disk_write_errors, C,                                                                     \
    "disk tier: write faults (no space, no inodes, I/O error, read-only or missing directory)") \
  X(disk_read_errors, C, "disk tier: read faults (I/O errors), served as misses")             \
  X(disk_scan_ms, G, "disk tier: time the start-up scan of the directory took, ms")           \
  X(disk_scan_objects, G, "disk tier: objects the start-up scan found")                       \
  X(disk_reads_direct, C, "disk tier: payloads of 1 MiB or more read with O_DIRECT (measured faster)") \
  X(disk_reads_buffered, C,                                                                   \
    "disk tier: payloads of 1 MiB or more read buffered (measured faster, or a probe)")      \
  X(disk_writes_direct, C, "disk tier: payloads of 1 MiB or more written with O_DIRECT (measured faster)") \
  X(disk_writes_buffered, C,                                                                  \
    "disk tier: payloads of 1 MiB or more written buffered (measured faster, or a probe)")

/* A stat's id is its row's index in the table; core's rows come first in every table, so
 * KVS_STAT_<name> of a core row is the same everywhere. */
typedef unsigned kvs_stat_id_t;
/* Generators for a layer's rows: the id and the table row. */
#define KVS_STAT_ENUM(name, kind, help) KVS_STAT_##name,
#define KVS__STAT_KIND_C 'C'
#define KVS__STAT_KIND_G 'G'
#define KVS_STAT_ROW(name, kind, help) {#name, KVS__STAT_KIND_##kind, help},
enum { KVS_CORE_STATS(KVS_STAT_ENUM) KVS_STAT__CORE };

typedef struct kvs_stat_row {
  const char *name;
  char kind; /* 'C' counter, 'G' gauge */
  const char *help;
} kvs_stat_row_t;
/* A table of rows: core's first, in their order, then any others (n <= KVS_STATS_MAX). */
typedef struct kvs_stat_table {
  const kvs_stat_row_t *rows;
  unsigned n;
} kvs_stat_table_t;

/* Fields a block holds: the most rows a table may have (runtime/rows.h asserts its count). */
#define KVS_STATS_MAX 192u

/* Make t the process's table: the names, kinds and help every block is read and rendered by.
 * Called once, before the threads that read stats start (the runtime's configuration, the
 * CLI's main). Returns -EINVAL (table unchanged) unless t starts with core's rows and has at
 * most KVS_STATS_MAX. */
int kvs_stats_use_table(const kvs_stat_table_t *t);
/* The rows of the process's table. */
unsigned kvs_stats_count(void);

#define KVS_STATS_STRIPES 16u
/* Words per stripe row: the fields rounded up to whole 64-byte lines, plus one line, so that no
 * cache line holds words of two rows whatever the block's alignment (the words past the fields
 * stay 0). */
#define KVS_STATS_ROW_WORDS (((KVS_STATS_MAX + 7u) / 8u + 1u) * 8u)

/* A stats block. Versioned so a reader can tell what it holds; zero-initialise, then set
 * version/size with kvs_stats_init. The process-wide block is kvs_stats_global(). Read fields
 * with kvs_stats_get, never row by row. */
typedef struct kvs_stats {
  uint32_t version;          /* KVS_STATS_VERSION */
  uint32_t size;             /* sizeof(kvs_stats_t) */
  uint64_t row[KVS_STATS_STRIPES][KVS_STATS_ROW_WORDS]; /* field = sum over rows (mod 2^64) */
} kvs_stats_t;

void kvs_stats_init(kvs_stats_t *st);
kvs_stats_t *kvs_stats_global(void);

/* The calling thread's stripe + 1, 0 until its first update (stats.c picks it). */
extern __thread uint32_t kvs__stats_stripe_tls __attribute__((tls_model("initial-exec")));
uint32_t kvs__stats_stripe_pick(void);
static inline uint32_t kvs__stats_stripe(void) {
  uint32_t s = kvs__stats_stripe_tls;
  return __builtin_expect(s != 0, 1) ? s - 1 : kvs__stats_stripe_pick();
}

static inline void kvs_stats_add(kvs_stats_t *st, kvs_stat_id_t id, uint64_t n) {
  __atomic_fetch_add(&st->row[kvs__stats_stripe()][id], n, __ATOMIC_RELAXED);
}
static inline void kvs_stats_inc(kvs_stats_t *st, kvs_stat_id_t id) { kvs_stats_add(st, id, 1); }
/* The field becomes val: every other row is zeroed, then row 0 written, so deltas added on other
 * rows while it runs count as after it. For gauges (a counter is only added to). */
void kvs_stats_set(kvs_stats_t *st, kvs_stat_id_t id, uint64_t val);
/* The field's value: its rows summed (relaxed loads); a gauge clamped at 0. */
uint64_t kvs_stats_get(const kvs_stats_t *st, kvs_stat_id_t id);

const char *kvs_stats_name(kvs_stat_id_t id);
const char *kvs_stats_help(kvs_stat_id_t id);
int kvs_stats_is_gauge(kvs_stat_id_t id);
/* Look a field up by name; returns -ENOENT when unknown. */
int kvs_stats_find(const char *name, kvs_stat_id_t *out);
/* Copy every field (kvs_stats_get) into dst, each in its row 0. */
void kvs_stats_snapshot(const kvs_stats_t *src, kvs_stats_t *dst);

/* Render into buf (always NUL-terminated when cap > 0). Return the length the full text needs
 * (like snprintf): a result >= cap means it was cut. Extra "key:value" lines may be appended by
 * the caller. INFO: "# kvshim stats v1\r\nkey:value\r\n"...  JSON: one object, one line. */
size_t kvs_stats_render_info(const kvs_stats_t *st, char *buf, size_t cap);
size_t kvs_stats_render_json(const kvs_stats_t *st, char *buf, size_t cap);
/* Write the JSON rendering to path (created 0600, replaced atomically via rename).
 * Returns 0 or a negative errno. */
int kvs_stats_write_json(const kvs_stats_t *st, const char *path);
/* The same with extra JSON members (text such as "\"enabled\":true", NULL: none) appended. */
int kvs_stats_write_json_extra(const kvs_stats_t *st, const char *extra, const char *path);

#ifdef __cplusplus
}
#endif
#endif
