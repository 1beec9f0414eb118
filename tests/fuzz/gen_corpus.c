/* Writes the seed corpus of fuzz_proto: one valid frame (24-byte header + payload) per message
 * kind, each a few hundred bytes at most. Not part of the build; run by hand when the protocol
 * changes:
 *
 *   cc -std=c11 -D_GNU_SOURCE -Icore tests/fuzz/gen_corpus.c core/wire/proto.c -o /tmp/gen_corpus
 *   /tmp/gen_corpus tests/fuzz/corpus/fuzz_proto
 *
 * Deterministic: the same files every run. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

static const char *dir;
static uint64_t next_id = 1;

typedef int (*enc_fn)(const void *m, void *buf, size_t cap, size_t *len);

static void emit(const char *name, uint16_t opcode, uint32_t flags, enc_fn enc, const void *m) {
  _Alignas(8) uint8_t frame[1024];
  size_t len;
  int rc = enc(m, frame + KVS_PROTO_HEADER_SIZE, sizeof(frame) - KVS_PROTO_HEADER_SIZE, &len);
  kvs_proto_header_t h;
  if (rc == 0)
    rc = kvs_proto_frame_header(opcode, flags, flags ? 0x100 + next_id : next_id, len, 0,
                                KVS_PROTO_MIN_MAX_FRAME, &h);
  if (rc != 0) {
    fprintf(stderr, "gen_corpus: %s: %s\n", name, kvs_proto_strerror(rc));
    exit(1);
  }
  next_id++;
  kvs_proto_header_encode(&h, frame);
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(frame, 1, KVS_PROTO_HEADER_SIZE + len, f) != KVS_PROTO_HEADER_SIZE + len ||
      fclose(f) != 0) {
    fprintf(stderr, "gen_corpus: cannot write %s\n", path);
    exit(1);
  }
}
#define EMIT(name, op, flags, fn, m) emit(name, op, flags, (enc_fn)(fn), m)

static kvs_key_t key(unsigned i) {
  return (kvs_key_t){.lo = 0x0123456789abcdefull * (i + 1), .hi = 0xfedcba9876543210ull ^ i};
}

static kvs_layout_t layout(uint32_t ndim) {
  kvs_layout_t l;
  memset(&l, 0, sizeof(l));
  l.dtype = KVS_DTYPE_F16;
  l.ndim = ndim;
  for (uint32_t i = 0; i < ndim; i++) l.shape[i] = 4 << i;
  return l;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  dir = argv[1];
  const uint32_t R = KVS_PROTO_F_REPLY;
  kvs_key_t keys[4] = {key(0), key(1), key(2), key(3)};
  uint8_t bytes[96];
  for (unsigned i = 0; i < sizeof(bytes); i++) bytes[i] = (uint8_t)(i * 37 + 11);

  kvs_proto_hello_t hello = {.version_min = 1, .version_max = 1, .role = KVS_PROTO_ROLE_ENGINE,
                             .strategy_requested = KVS_PROTO_STRATEGY_AUTO, .pid = 1234,
                             .caps = KVS_PROTO_CAP_SHM | KVS_PROTO_CAP_INLINE,
                             .instance_id = 0xa1b2c3d4e5f60718ull,
                             .pool_segment_size = 1ull << 30, .pool_arena_size = 1ull << 29,
                             .pool_arena_used = 1ull << 20, .max_frame = 64u << 20,
                             .group = "default"};
  EMIT("hello_req", KVS_OP_HELLO, 0, kvs_proto_hello_encode, &hello);
  hello.role = KVS_PROTO_ROLE_CACHE;
  hello.strategy_chosen = KVS_PROTO_STRATEGY_SHM;
  hello.flags = KVS_PROTO_HELLO_POOL_FD;
  EMIT("hello_rep", KVS_OP_HELLO, R, kvs_proto_hello_encode, &hello);

  kvs_proto_error_t err;
  kvs_proto_error_init(&err, -EBADMSG, "malformed frame: bad magic");
  EMIT("error", KVS_OP_ERROR, R, kvs_proto_error_encode, &err);

  kvs_proto_lookup_t lk = {.n_keys = 4, .keys = keys};
  EMIT("lookup_req", KVS_OP_LOOKUP, 0, kvs_proto_lookup_encode, &lk);
  kvs_proto_lookup_reply_t lr = {.found = 3};
  EMIT("lookup_rep", KVS_OP_LOOKUP, R, kvs_proto_lookup_reply_encode, &lr);

  kvs_proto_prepare_store_t ps = {.strategy = KVS_PROTO_STRATEGY_SHM, .kind = KVS_PROTO_KIND_CHUNKS,
                                  .mode = KVS_RESERVE_ALL_OR_NOTHING, .layout = layout(3),
                                  .n_keys = 3, .keys = keys};
  EMIT("prepare_store_req", KVS_OP_PREPARE_STORE, 0, kvs_proto_prepare_store_encode, &ps);
  uint8_t outcomes[3] = {KVS_RES_RESERVED, KVS_RES_PRESENT, KVS_RES_RESERVED};
  kvs_proto_slot_t slots[2] = {{.key_index = 0, .offset = 1 << 16, .length = 512},
                               {.key_index = 2, .offset = 1 << 17, .length = 512}};
  kvs_proto_prepare_store_reply_t psr = {.xfer = 41, .n_outcomes = 3, .n_slots = 2,
                                         .outcomes = outcomes, .slots = slots};
  EMIT("prepare_store_rep", KVS_OP_PREPARE_STORE, R, kvs_proto_prepare_store_reply_encode, &psr);

  kvs_proto_commit_store_t cs = {.xfer = 41, .n_slots = 2, .slots = slots};
  EMIT("commit_store_shm", KVS_OP_COMMIT_STORE, 0, kvs_proto_commit_store_encode, &cs);
  kvs_proto_entry_t entries[3] = {{key(0), 32}, {key(1), 0}, {key(2), 48}};
  kvs_proto_commit_store_t ci = {.is_inline = 1, .kind = KVS_PROTO_KIND_CHUNKS,
                                 .layout = layout(2), .n_entries = 3, .entries = entries,
                                 .data = bytes, .data_len = 80};
  EMIT("commit_store_inline", KVS_OP_COMMIT_STORE, 0, kvs_proto_commit_store_encode, &ci);
  kvs_proto_commit_store_reply_t csr = {.committed = 2, .n_outcomes = 3, .outcomes = outcomes};
  EMIT("commit_store_rep", KVS_OP_COMMIT_STORE, R, kvs_proto_commit_store_reply_encode, &csr);

  kvs_proto_xfer_t x = {.xfer = 41};
  EMIT("abort_req", KVS_OP_ABORT, 0, kvs_proto_xfer_encode, &x);

  kvs_proto_prepare_retrieve_t pr = {.strategy = KVS_PROTO_STRATEGY_INLINE, .n_keys = 3, .keys = keys};
  EMIT("prepare_retrieve_req", KVS_OP_PREPARE_RETRIEVE, 0, kvs_proto_prepare_retrieve_encode, &pr);
  kvs_proto_object_t objs[2] = {
      {.key_index = 0, .length = 40, .layout = layout(1), .data = bytes},
      {.key_index = 1, .length = 24, .layout = layout(2), .data = bytes + 40}};
  kvs_proto_prepare_retrieve_reply_t rri = {.n_found = 2, .n_objects = 2, .is_inline = 1, .objects = objs};
  EMIT("prepare_retrieve_rep_inline", KVS_OP_PREPARE_RETRIEVE, R,
       kvs_proto_prepare_retrieve_reply_encode, &rri);
  objs[0].offset = 1 << 20, objs[0].data = NULL;
  objs[1].offset = 2 << 20, objs[1].data = NULL;
  kvs_proto_prepare_retrieve_reply_t rrs = {.xfer = 42, .n_found = 3, .n_objects = 2, .objects = objs};
  EMIT("prepare_retrieve_rep_shm", KVS_OP_PREPARE_RETRIEVE, R,
       kvs_proto_prepare_retrieve_reply_encode, &rrs);
  EMIT("commit_retrieve_req", KVS_OP_COMMIT_RETRIEVE, 0, kvs_proto_xfer_encode, &x);
  /* AUTO_RELEASE (caps bit 6): the request flag and the reply's pin_ms */
  kvs_proto_prepare_retrieve_t pra = {.strategy = KVS_PROTO_STRATEGY_SHM, .n_keys = 3, .keys = keys,
                                      .flags = KVS_PROTO_RETRIEVE_AUTO_RELEASE};
  EMIT("prepare_retrieve_req_auto", KVS_OP_PREPARE_RETRIEVE, 0, kvs_proto_prepare_retrieve_encode,
       &pra);
  rrs.pin_ms = 1000;
  EMIT("prepare_retrieve_rep_shm_auto", KVS_OP_PREPARE_RETRIEVE, R,
       kvs_proto_prepare_retrieve_reply_encode, &rrs);

  kvs_proto_stats_t st = {.format = KVS_PROTO_STATS_INFO};
  EMIT("stats_req", KVS_OP_STATS, 0, kvs_proto_stats_encode, &st);
  const char *txt = "# kvshim stats v1\r\nstore_hits:7\r\n";
  kvs_proto_text_t tx = {.len = (uint32_t)strlen(txt), .text = txt};
  EMIT("stats_rep", KVS_OP_STATS, R, kvs_proto_text_encode, &tx);

  kvs_proto_ping_t pg = {.nonce = 0x5eed, .echo_len = 8, .echo = bytes};
  EMIT("ping", KVS_OP_PING, 0, kvs_proto_ping_encode, &pg);

  kvs_proto_export_t ex = {.address = 0x7f0000100000ull, .length = 1 << 20};
  EMIT("export_req", KVS_OP_EXPORT_TENSORS, 0, kvs_proto_export_encode, &ex);
  kvs_proto_blob_t descs[2] = {{.len = 40, .data = bytes}, {.len = 12, .data = bytes + 50}};
  kvs_proto_export_reply_t exr = {.n_descs = 2, .n_fds = 1, .descs = descs};
  EMIT("export_rep", KVS_OP_EXPORT_TENSORS, R, kvs_proto_export_reply_encode, &exr);
  kvs_proto_report_t rb = {{0x1111111111111111ull, 0x2222222222222222ull}, 4096,
                           0xdeadbeefcafef00dull};
  EMIT("report_bad_req", KVS_OP_REPORT_BAD, 0, kvs_proto_report_encode, &rb);
  kvs_proto_report_reply_t rbr = {1};
  EMIT("report_bad_rep", KVS_OP_REPORT_BAD, R, kvs_proto_report_reply_encode, &rbr);
  kvs_key_t wk[2] = {{0x1111111111111111ull, 0x2222222222222222ull}, {3, 4}};
  kvs_proto_watch_t wt = {.n_keys = 2, .wait_ms = 750, .keys = wk};
  EMIT("watch_req", KVS_OP_WATCH, 0, kvs_proto_watch_encode, &wt);
  kvs_proto_watch_reply_t wtr = {KVS_PROTO_WATCH_PRESENT};
  EMIT("watch_rep", KVS_OP_WATCH, R, kvs_proto_watch_reply_encode, &wtr);
  return 0;
}
