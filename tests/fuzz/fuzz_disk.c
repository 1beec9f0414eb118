/* libFuzzer harness for the disk tier's record parser and segment walker (core/tiers/disk_format:
 * headers, aliases, resynchronisation after a bad stretch, torn tails; design §18).
 *
 * Input: a segment image. Properties (abort() = a finding):
 *   - kvs_disk_walk over the image returns 0 and calls back only with records that lie wholly
 *     inside the image, start at a multiple of KVS_DISK_ALIGN, do not overlap, whose header
 *     parses again to the same record and whose head checks;
 *   - every record's layout is valid and its bytes equal its payload length;
 *   - the end it reports is the end of the last record it called back with (0 when none);
 *   - re-encoding a record's head (key, aliases, layout, length, hashes, sequence) gives the
 *     same bytes (the encoder and the parser agree). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "disk_format.h"

typedef struct image {
  const uint8_t *data;
  size_t size;
  uint64_t last_end;
  uint8_t head[KVS_DISK_HEAD_MAX];
  kvs_key_t aliases[KVS_DISK_MAX_ALIASES];
} image_t;

static int read_at(void *ctx, void *buf, size_t len, uint64_t off) {
  image_t *im = ctx;
  if (off > im->size || len > im->size - off) abort();
  memcpy(buf, im->data + off, len);
  return 0;
}

static int on_record(void *ctx, const kvs_disk_record_t *rec, const uint8_t *head,
                     uint64_t off) {
  image_t *im = ctx;
  if (off % KVS_DISK_ALIGN || off < im->last_end || rec->record_len > im->size - off) abort();
  if (memcmp(head, im->data + off, (size_t)rec->head_len) != 0) abort();
  kvs_disk_record_t again;
  if (kvs_disk_parse_header(head, (size_t)rec->head_len, &again) < 0) abort();
  if (memcmp(&again, rec, sizeof again) != 0 || kvs_disk_check_head(head, rec) < 0) abort();
  if (kvs_layout_nbytes(&rec->layout) != rec->payload_len) abort();
  for (uint32_t a = 0; a < rec->n_aliases; a++) im->aliases[a] = kvs_disk_alias(head, a);
  kvs_disk_encode_head(im->head, rec->version, rec->key, im->aliases, rec->n_aliases,
                       &rec->layout, rec->payload_len, rec->payload_hash, rec->seq);
  if (memcmp(im->head, head, (size_t)rec->head_len) != 0) abort();
  im->last_end = off + rec->record_len;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static image_t im;
  im.data = data;
  im.size = size;
  im.last_end = 0;
  uint64_t bad = 0, end = ~0ull;
  if (kvs_disk_walk(size, read_at, &im, on_record, &im, &bad, &end) != 0) abort();
  if (end != im.last_end) abort();
  kvs_disk_record_t rec;
  (void)kvs_disk_parse_header(data, size, &rec);
  return 0;
}
