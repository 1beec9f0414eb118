/* libFuzzer harness for core/wire/proto: the frame header and every message decoder.
 *
 * The input is tried as a frame (24-byte header + payload: the payload goes to every decoder)
 * and as a bare payload. Whatever decodes must re-encode to exactly the same bytes (the encoding
 * is canonical) and decode again to an equal message; any mismatch aborts. Seeds:
 * tests/fuzz/corpus/fuzz_proto/ (made by tests/fuzz/gen_corpus.c). */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "fuzz_proto: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);    \
      abort();                                                                                \
    }                                                                                         \
  } while (0)

static kvs_proto_object_t objs_a[KVS_PROTO_MAX_KEYS], objs_b[KVS_PROTO_MAX_KEYS];
static kvs_proto_blob_t descs_a[KVS_PROTO_MAX_DESCS], descs_b[KVS_PROTO_MAX_DESCS];

/* Same bytes behind two (pointer, length) views; NULL only for empty views. */
static bool same(const void *a, const void *b, size_t n) {
  if (n == 0) return true;
  return a && b && memcmp(a, b, n) == 0;
}

/* Re-encode into a fresh buffer: must succeed, have the original length and bytes. Returns the
 * buffer (8-aligned, caller frees) for the second decode. */
typedef int (*enc_fn)(const void *m, void *buf, size_t cap, size_t *len);
static uint8_t *reencode(enc_fn enc, const void *m, const uint8_t *orig, size_t n) {
  size_t need = 0, len = 0;
  CHECK(enc(m, NULL, 0, &need) == 0);
  CHECK(need == n);
  uint8_t *buf = malloc(need ? need : 1);
  CHECK(buf);
  CHECK(enc(m, buf, need, &len) == 0);
  CHECK(len == n);
  CHECK(same(buf, orig, n));
  return buf;
}
#define REENC(fn, m) reencode((enc_fn)(fn), (m), p, n)

/* Message m against the payload (p, n): where it decodes into a (kvs_proto_<m>_decode args_a,
 * its arguments in parentheses), it must re-encode to the same bytes and decode again into b
 * (args_b); then the statements that follow check a against b. ROUNDTRIP is the plain
 * decoder's (p, n, &a). */
#define ROUNDTRIP_ARGS(m, args_a, args_b, ...)                                                \
  do {                                                                                        \
    kvs_proto_##m##_t a, b;                                                                   \
    if (kvs_proto_##m##_decode args_a == 0) {                                                 \
      uint8_t *q = REENC(kvs_proto_##m##_encode, &a);                                         \
      CHECK(kvs_proto_##m##_decode args_b == 0);                                              \
      __VA_ARGS__;                                                                            \
      free(q);                                                                                \
    }                                                                                         \
  } while (0)
#define ROUNDTRIP(m, ...) ROUNDTRIP_ARGS(m, (p, n, &a), (q, n, &b), __VA_ARGS__)

static bool layout_eq(const kvs_layout_t *a, const kvs_layout_t *b) {
  return memcmp(a, b, sizeof(*a)) == 0;
}

static bool hello_eq(const kvs_proto_hello_t *a, const kvs_proto_hello_t *b) {
  return a->version_min == b->version_min && a->version_max == b->version_max &&
         a->role == b->role && a->strategy_requested == b->strategy_requested &&
         a->strategy_chosen == b->strategy_chosen && a->flags == b->flags && a->pid == b->pid &&
         a->caps == b->caps && a->instance_id == b->instance_id &&
         a->pool_segment_size == b->pool_segment_size &&
         a->pool_arena_size == b->pool_arena_size && a->pool_arena_used == b->pool_arena_used &&
         a->max_frame == b->max_frame && strcmp(a->group, b->group) == 0 &&
         a->max_message == b->max_message;
}

static void fuzz_payload(const uint8_t *p, size_t n) {
  ROUNDTRIP(hello, {
    CHECK(hello_eq(&a, &b));
    uint16_t v;
    (void)kvs_proto_negotiate_version(&a, &b, &v);
    (void)kvs_proto_hello_check(&a, true);
    (void)kvs_proto_choose_strategy(a.strategy_requested, &b, true);
  });
  ROUNDTRIP(error, {
    CHECK(a.code == b.code && a.message_len == b.message_len);
    CHECK(same(a.message, b.message, a.message_len));
    CHECK(kvs_proto_strerror(a.code) != NULL);
  });
  ROUNDTRIP(lookup, {
    CHECK(a.n_keys == b.n_keys && same(a.keys, b.keys, a.n_keys * sizeof(kvs_key_t)));
  });
  ROUNDTRIP(report, {
    CHECK(kvs_key_eq(a.key, b.key) && a.length == b.length && a.checksum == b.checksum);
  });
  ROUNDTRIP(report_reply, CHECK(a.dropped == b.dropped));
  ROUNDTRIP(watch, {
    CHECK(a.n_keys == b.n_keys && a.wait_ms == b.wait_ms &&
          same(a.keys, b.keys, a.n_keys * sizeof(kvs_key_t)));
    CHECK(a.n_keys >= 1 && a.n_keys <= KVS_PROTO_MAX_WATCH_KEYS &&
          a.wait_ms <= KVS_PROTO_MAX_WATCH_MS);
  });
  ROUNDTRIP(watch_reply, {
    CHECK(a.state == b.state);
    CHECK(a.state <= KVS_PROTO_WATCH_HELD);
  });
  ROUNDTRIP(lookup_reply, CHECK(a.found == b.found));
  ROUNDTRIP(prepare_store, {
    CHECK(a.strategy == b.strategy && a.kind == b.kind && a.mode == b.mode);
    CHECK(layout_eq(&a.layout, &b.layout) && a.layout.ndim <= KVS_LAYOUT_MAX_DIMS);
    CHECK(a.n_keys == b.n_keys && same(a.keys, b.keys, a.n_keys * sizeof(kvs_key_t)));
  });
  ROUNDTRIP(prepare_store_reply, {
    CHECK(a.xfer == b.xfer && a.n_outcomes == b.n_outcomes && a.n_slots == b.n_slots);
    CHECK(same(a.outcomes, b.outcomes, a.n_outcomes));
    CHECK(same(a.slots, b.slots, a.n_slots * sizeof(kvs_proto_slot_t)));
    for (uint32_t i = 0; i < a.n_slots; i++) CHECK(a.slots[i].key_index < a.n_outcomes);
  });
  ROUNDTRIP(commit_store, {
    CHECK(a.xfer == b.xfer && a.is_inline == b.is_inline && a.kind == b.kind &&
          a.mode == b.mode && layout_eq(&a.layout, &b.layout));
    CHECK(a.n_entries == b.n_entries &&
          same(a.entries, b.entries, a.n_entries * sizeof(kvs_proto_entry_t)));
    CHECK(a.data_len == b.data_len && same(a.data, b.data, a.data_len));
    CHECK(a.n_slots == b.n_slots && same(a.slots, b.slots, a.n_slots * sizeof(kvs_proto_slot_t)));
    CHECK(!a.is_inline || a.n_slots == 0);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < a.n_entries; i++) sum += a.entries[i].length;
    CHECK(sum == a.data_len);
    CHECK(a.data_len == 0 || (a.data >= p && a.data + a.data_len == p + n));
  });
  ROUNDTRIP(commit_store_reply, {
    CHECK(a.committed == b.committed && a.n_outcomes == b.n_outcomes);
    CHECK(same(a.outcomes, b.outcomes, a.n_outcomes));
  });
  ROUNDTRIP(xfer, CHECK(a.xfer == b.xfer));
  CHECK((kvs_proto_empty_decode(p, n) == 0) == (n == 0));
  ROUNDTRIP(prepare_retrieve, {
    CHECK(a.strategy == b.strategy && a.n_keys == b.n_keys && a.flags == b.flags &&
          same(a.keys, b.keys, a.n_keys * sizeof(kvs_key_t)));
  });
  {
    /* the head-and-table decode (data read elsewhere) never crashes and leaves data NULL */
    kvs_proto_prepare_retrieve_reply_t a;
    if (kvs_proto_prepare_retrieve_reply_decode_table(p, n, objs_a, KVS_PROTO_MAX_KEYS, &a) == 0)
      CHECK(a.data == NULL && (a.is_inline || a.data_len == 0));
  }
  ROUNDTRIP_ARGS(prepare_retrieve_reply, (p, n, objs_a, KVS_PROTO_MAX_KEYS, &a),
                 (q, n, objs_b, KVS_PROTO_MAX_KEYS, &b), {
    CHECK(a.xfer == b.xfer && a.n_found == b.n_found && a.n_objects == b.n_objects &&
          a.is_inline == b.is_inline && a.data_len == b.data_len && a.pin_ms == b.pin_ms);
    CHECK(same(a.data, b.data, a.data_len));
    for (uint32_t i = 0; i < a.n_objects; i++) {
      const kvs_proto_object_t *x = &a.objects[i], *y = &b.objects[i];
      CHECK(x->key_index == y->key_index && x->offset == y->offset && x->length == y->length);
      CHECK(layout_eq(&x->layout, &y->layout));
      CHECK(a.is_inline ? same(x->data, y->data, x->length) : (!x->data && !y->data));
      CHECK(x->key_index < a.n_found && (i == 0 || x->key_index > a.objects[i - 1].key_index));
    }
    if (a.n_objects > 0) { /* a caller array one short must be refused */
      kvs_proto_prepare_retrieve_reply_t c;
      CHECK(kvs_proto_prepare_retrieve_reply_decode(p, n, objs_b, a.n_objects - 1, &c) == -ENOBUFS);
    }
  });
  ROUNDTRIP(stats, CHECK(a.format == b.format));
  ROUNDTRIP(text, CHECK(a.len == b.len && same(a.text, b.text, a.len)));
  ROUNDTRIP(ping, {
    CHECK(a.nonce == b.nonce && a.echo_len == b.echo_len && same(a.echo, b.echo, a.echo_len));
  });
  ROUNDTRIP(export, CHECK(a.address == b.address && a.length == b.length));
  ROUNDTRIP_ARGS(export_reply, (p, n, descs_a, KVS_PROTO_MAX_DESCS, &a),
                 (q, n, descs_b, KVS_PROTO_MAX_DESCS, &b), {
    CHECK(a.n_descs == b.n_descs && a.n_fds == b.n_fds);
    for (uint32_t i = 0; i < a.n_descs; i++) {
      CHECK(a.descs[i].len == b.descs[i].len && a.descs[i].len >= 1 &&
            a.descs[i].len <= KVS_PROTO_MAX_DESC_BYTES);
      CHECK(same(a.descs[i].data, b.descs[i].data, a.descs[i].len));
    }
  });
}

static void fuzz_header(const uint8_t *p, size_t n) {
  kvs_proto_header_t h, h2;
  int rc = kvs_proto_header_parse(p, n, &h);
  CHECK((rc == 0) == (n >= KVS_PROTO_HEADER_SIZE));
  if (rc) return;
  uint8_t b[KVS_PROTO_HEADER_SIZE];
  kvs_proto_header_encode(&h, b);
  CHECK(memcmp(b, p, sizeof(b)) == 0);
  rc = kvs_proto_header_decode(p, n, KVS_PROTO_DEFAULT_MAX_FRAME, &h2);
  CHECK(rc == kvs_proto_header_validate(&h, KVS_PROTO_DEFAULT_MAX_FRAME));
  CHECK(rc == 0 || rc == -EBADMSG || rc == -EPROTONOSUPPORT || rc == -EOPNOTSUPP ||
        rc == -EMSGSIZE);
  if (rc == 0) {
    CHECK(h.magic == h2.magic && h.version == h2.version && h.opcode == h2.opcode &&
          h.flags == h2.flags && h.request_id == h2.request_id && h.length == h2.length);
    CHECK(kvs_proto_opcode_name(h.opcode) != NULL);
    /* The splitter reproduces a valid header for a message of that length. */
    kvs_proto_header_t s;
    uint32_t more_free = h.flags & KVS_PROTO_F_REPLY;
    CHECK(kvs_proto_frame_header(h.opcode, more_free, h.request_id, h.length, 0,
                                 KVS_PROTO_DEFAULT_MAX_FRAME, &s) == 0);
    CHECK(s.length == h.length && !(s.flags & KVS_PROTO_F_MORE));
    CHECK(kvs_proto_frame_continues(&h, &s) == 0);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  /* Decoders need an 8-aligned payload; malloc gives that and the header is 24 bytes. */
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return 0;
  if (n) memcpy(buf, d, n);
  fuzz_header(buf, n);
  if (n >= KVS_PROTO_HEADER_SIZE) fuzz_payload(buf + KVS_PROTO_HEADER_SIZE, n - KVS_PROTO_HEADER_SIZE);
  fuzz_payload(buf, n);
  free(buf);
  return 0;
}
