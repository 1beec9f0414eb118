/* kvshim disk_format: the on-disk record of the disk tier (design §18) and the segment walker
 * shared by serve's start-up scan, `kvshim disk` and the fuzz harness. No I/O of its own: the
 * walker reads through a callback.
 *
 * A directory holds append-only segment files "<16 hex digits>.kvseg" (the segment id, which
 * grows by one per new segment) and a lock file "lock". A segment is a sequence of records,
 * each starting at a multiple of KVS_DISK_ALIGN. Version 2 (written):
 *     header   KVS_DISK_HDR_SIZE bytes (below)
 *     aliases  n_aliases keys of 16 bytes (lo u64, hi u64): the other keys of the object
 *     padding  zeros up to the next multiple of KVS_DISK_ALIGN: the payload is block-aligned,
 *              so it can move between the device and a pool extent with O_DIRECT
 *     payload  payload_len bytes (the object's bytes, layout dtype/shape)
 *     padding  up to the next multiple of KVS_DISK_ALIGN (zeros)
 * Version 1 (read, never written): the same without the first padding (the payload follows
 * the aliases). The version is inside the hashed header bytes, so one is never read as the
 * other; any other version is a bad header.
 * Header (little-endian):
 *     0 u32 magic "KVSD"   4 u16 version (1 or 2)   6 u16 n_aliases (<= KVS_DISK_MAX_ALIASES)
 *     8 key (lo u64, hi u64): the object's primary key
 *    24 u64 payload length  32 u64 XXH3-64 of the payload  40 u64 sequence (generation: grows
 *       with every record the directory's serves write; the newest record of a key wins)
 *    48 u32 dtype  52 u32 ndim  56 u64 XXH3-64 of header bytes [0, 56) and [64, 128) followed
 *       by the aliases  64 u64[8] shape (unused dims 0)
 * A record whose header fails a check (magic, version, header hash, layout, length past the
 * end of the file) is bad: the walker counts it and resynchronises at the next multiple of
 * KVS_DISK_ALIGN holding a good header. The payload hash is checked when the payload is read
 * (serve: on every read into the pool; `kvshim disk`: always). */
#ifndef KVSHIM_DISK_FORMAT_H
#define KVSHIM_DISK_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keys.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_DISK_MAGIC 0x4453564Bu /* "KVSD" little-endian */
#define KVS_DISK_VERSION 2u    /* written */
#define KVS_DISK_VERSION_V1 1u /* still read: payload right after the aliases */
#define KVS_DISK_HDR_SIZE 128u
#define KVS_DISK_ALIGN 512u
#define KVS_DISK_MAX_ALIASES 4096u
/* Header and aliases of the largest record head. */
#define KVS_DISK_HEAD_MAX (KVS_DISK_HDR_SIZE + 16u * KVS_DISK_MAX_ALIASES)
#define KVS_DISK_SEG_SUFFIX ".kvseg"

/* One record's head, as parsed. */
typedef struct kvs_disk_record {
  kvs_key_t key;          /* primary */
  uint32_t n_aliases;
  uint64_t payload_len;
  uint64_t payload_hash;
  uint64_t seq;
  kvs_layout_t layout;
  uint16_t version;       /* KVS_DISK_VERSION or KVS_DISK_VERSION_V1 */
  uint64_t head_len;      /* header + aliases */
  uint64_t payload_off;   /* payload start from the record's (v2: a multiple of KVS_DISK_ALIGN) */
  uint64_t record_len;    /* payload_off + payload, rounded up to KVS_DISK_ALIGN */
} kvs_disk_record_t;

/* Where a record's payload starts (from the record's start), and the bytes a record of
 * n_aliases aliases and payload_len bytes takes, in a given version. */
uint64_t kvs_disk_payload_off(uint16_t version, uint32_t n_aliases);
uint64_t kvs_disk_record_len(uint16_t version, uint32_t n_aliases, uint64_t payload_len);
/* Write the header and aliases (KVS_DISK_HDR_SIZE + 16 * n_aliases bytes at head; the caller
 * zeroes the padding up to the payload) of a record for key with aliases[0..n_aliases). */
void kvs_disk_encode_head(uint8_t *head, uint16_t version, kvs_key_t key,
                          const kvs_key_t *aliases, uint32_t n_aliases,
                          const kvs_layout_t *layout, uint64_t payload_len,
                          uint64_t payload_hash, uint64_t seq);
/* Parse a header from buf[0..len): 0 and rec (head_len, record_len filled; aliases not read),
 * -EAGAIN when len < KVS_DISK_HDR_SIZE, -EBADMSG on any failed check of the header alone. */
int kvs_disk_parse_header(const uint8_t *buf, size_t len, kvs_disk_record_t *rec);
/* Check the header hash over header + aliases (buf holds rec->head_len bytes): 0 or -EBADMSG. */
int kvs_disk_check_head(const uint8_t *buf, const kvs_disk_record_t *rec);
/* The i-th alias of a checked head. */
kvs_key_t kvs_disk_alias(const uint8_t *head, uint32_t i);

/* Walk a segment of size bytes read through read_at (0 or a negative errno; it reads exactly
 * len bytes at off, both within the segment). on_record gets each good record (head holds
 * rec->head_len bytes; off its start); returning non-zero stops the walk. Bad stretches are
 * counted in *bad (records, or runs of bytes between good records). *end gets the end of the
 * last good record (where a torn tail starts). Returns 0, or a negative errno of read_at. */
typedef int (*kvs_disk_read_fn)(void *ctx, void *buf, size_t len, uint64_t off);
typedef int (*kvs_disk_record_fn)(void *ctx, const kvs_disk_record_t *rec, const uint8_t *head,
                                  uint64_t off);
int kvs_disk_walk(uint64_t size, kvs_disk_read_fn read_at, void *read_ctx,
                  kvs_disk_record_fn on_record, void *rec_ctx, uint64_t *bad, uint64_t *end);

/* "<16 hex>.kvseg" for a segment id (buf >= 24 bytes); parse one back: 0 and *id, or -EINVAL. */
void kvs_disk_segment_name(uint64_t id, char *buf);
int kvs_disk_segment_id(const char *name, uint64_t *id);

#ifdef __cplusplus
}
#endif
#endif
