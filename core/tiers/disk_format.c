/* kvshim disk_format: see disk_format.h. */
#include "disk_format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "internal.h"

#define HASH_AT 56u
/* Bytes the walker reads at once: several small records, or the head of a large one. */
#define WALK_WINDOW (256u << 10)
_Static_assert(WALK_WINDOW >= KVS_DISK_HEAD_MAX, "a whole head fits in the walk window");
_Static_assert(KVS_DISK_HDR_SIZE == 64 + 8 * KVS_LAYOUT_MAX_DIMS, "record header layout");

uint64_t kvs_disk_payload_off(uint16_t version, uint32_t n_aliases) {
  uint64_t head = KVS_DISK_HDR_SIZE + 16ull * n_aliases;
  return version == KVS_DISK_VERSION_V1 ? head : KVS__ALIGN_UP(head, (uint64_t)KVS_DISK_ALIGN);
}

uint64_t kvs_disk_record_len(uint16_t version, uint32_t n_aliases, uint64_t payload_len) {
  return KVS__ALIGN_UP(kvs_disk_payload_off(version, n_aliases) + payload_len,
                       (uint64_t)KVS_DISK_ALIGN);
}

/* XXH3-64 of the head with the hash field read as zero. */
static uint64_t head_hash(const uint8_t *head, uint64_t head_len) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, head, HASH_AT);
  XXH3_64bits_update(&st, head + HASH_AT + 8, (size_t)(head_len - HASH_AT - 8));
  return XXH3_64bits_digest(&st);
}

void kvs_disk_encode_head(uint8_t *h, uint16_t version, kvs_key_t key,
                          const kvs_key_t *aliases, uint32_t n_aliases,
                          const kvs_layout_t *layout, uint64_t payload_len,
                          uint64_t payload_hash, uint64_t seq) {
  memset(h, 0, KVS_DISK_HDR_SIZE);
  kvs__put32(h, KVS_DISK_MAGIC);
  kvs__put16(h + 4, version);
  kvs__put16(h + 6, (uint16_t)n_aliases);
  kvs__put64(h + 8, key.lo);
  kvs__put64(h + 16, key.hi);
  kvs__put64(h + 24, payload_len);
  kvs__put64(h + 32, payload_hash);
  kvs__put64(h + 40, seq);
  kvs__layout_put(h + 48, h + 64, layout);
  for (uint32_t a = 0; a < n_aliases; a++) {
    kvs__put64(h + KVS_DISK_HDR_SIZE + 16 * a, aliases[a].lo);
    kvs__put64(h + KVS_DISK_HDR_SIZE + 16 * a + 8, aliases[a].hi);
  }
  kvs__put64(h + HASH_AT, head_hash(h, KVS_DISK_HDR_SIZE + 16ull * n_aliases));
}

int kvs_disk_parse_header(const uint8_t *h, size_t len, kvs_disk_record_t *rec) {
  if (len < KVS_DISK_HDR_SIZE) return -EAGAIN;
  uint16_t version = kvs__get16(h + 4);
  if (kvs__get32(h) != KVS_DISK_MAGIC ||
      (version != KVS_DISK_VERSION && version != KVS_DISK_VERSION_V1))
    return -EBADMSG;
  kvs_disk_record_t r;
  memset(&r, 0, sizeof r);
  r.version = version;
  r.n_aliases = kvs__get16(h + 6);
  if (r.n_aliases > KVS_DISK_MAX_ALIASES) return -EBADMSG;
  r.key = (kvs_key_t){kvs__get64(h + 8), kvs__get64(h + 16)};
  r.payload_len = kvs__get64(h + 24);
  r.payload_hash = kvs__get64(h + 32);
  r.seq = kvs__get64(h + 40);
  KVS_TRY(kvs__layout_get(h + 48, h + 64, &r.layout));
  /* the payload length must be the layout's, and small enough that the record length cannot
   * overflow */
  if (r.payload_len == 0 || r.payload_len > (1ull << 48) ||
      kvs_layout_nbytes(&r.layout) != r.payload_len)
    return -EBADMSG;
  r.head_len = KVS_DISK_HDR_SIZE + 16ull * r.n_aliases;
  r.payload_off = kvs_disk_payload_off(version, r.n_aliases);
  r.record_len = kvs_disk_record_len(version, r.n_aliases, r.payload_len);
  *rec = r;
  return 0;
}

int kvs_disk_check_head(const uint8_t *head, const kvs_disk_record_t *rec) {
  return head_hash(head, rec->head_len) == kvs__get64(head + HASH_AT) ? 0 : -EBADMSG;
}

kvs_key_t kvs_disk_alias(const uint8_t *head, uint32_t i) {
  const uint8_t *p = head + KVS_DISK_HDR_SIZE + 16ull * i;
  return (kvs_key_t){kvs__get64(p), kvs__get64(p + 8)};
}

int kvs_disk_walk(uint64_t size, kvs_disk_read_fn read_at, void *read_ctx,
                  kvs_disk_record_fn on_record, void *rec_ctx, uint64_t *bad, uint64_t *end) {
  uint8_t *win = malloc(WALK_WINDOW);
  if (!win) return -ENOMEM;
  uint64_t off = 0, win_off = 0, win_len = 0, good_end = 0, n_bad = 0;
  bool in_bad = false, stop = false;
  int rc = 0;
  while (!stop && size - off >= KVS_DISK_HDR_SIZE && off <= size) {
    /* The window holds [win_off, win_off + win_len): refill it at off when the header (then
     * the whole head) is not inside. */
    if (off < win_off || off + KVS_DISK_HDR_SIZE > win_off + win_len) {
      win_off = off;
      win_len = size - off < WALK_WINDOW ? size - off : WALK_WINDOW;
      if ((rc = read_at(read_ctx, win, (size_t)win_len, win_off)) < 0) break;
    }
    kvs_disk_record_t rec;
    bool ok = kvs_disk_parse_header(win + (off - win_off), (size_t)(win_off + win_len - off),
                                    &rec) == 0 &&
              rec.record_len <= size - off;
    if (ok && off + rec.head_len > win_off + win_len) {
      win_off = off;
      win_len = size - off < WALK_WINDOW ? size - off : WALK_WINDOW;
      if ((rc = read_at(read_ctx, win, (size_t)win_len, win_off)) < 0) break;
    }
    const uint8_t *head = win + (off - win_off);
    if (ok) ok = kvs_disk_check_head(head, &rec) == 0;
    if (!ok) {
      in_bad = true; /* resynchronise at the next aligned offset */
      off += KVS_DISK_ALIGN;
      continue;
    }
    if (in_bad) n_bad++, in_bad = false;
    if (on_record) stop = on_record(rec_ctx, &rec, head, off) != 0;
    off += rec.record_len;
    good_end = off;
  }
  if (rc == 0 && !stop && (in_bad || good_end < size)) n_bad++; /* a torn or garbled tail */
  free(win);
  if (rc < 0) return rc;
  if (bad) *bad += n_bad;
  if (end) *end = good_end;
  return 0;
}

void kvs_disk_segment_name(uint64_t id, char *buf) {
  snprintf(buf, 24, "%016" PRIx64 KVS_DISK_SEG_SUFFIX, id);
}

int kvs_disk_segment_id(const char *name, uint64_t *id) {
  size_t n = strlen(name);
  if (n != 16 + sizeof KVS_DISK_SEG_SUFFIX - 1 || strcmp(name + 16, KVS_DISK_SEG_SUFFIX) != 0)
    return -EINVAL;
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) {
    char c = name[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -EINVAL;
    v = v << 4 | (uint64_t)d;
  }
  *id = v;
  return 0;
}
