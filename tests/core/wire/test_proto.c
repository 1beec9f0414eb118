/* Unit tests for core/wire/proto: the wire codec (docs/protocol.md). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

#define T(name) Test(proto, name, .timeout = 30)

/* ---- fixtures --------------------------------------------------------------------------------- */

static kvs_key_t key_n(uint64_t i) {
  return (kvs_key_t){.lo = 0x1000000000000000ull + i * 0x0101010101ull, .hi = ~i * 0x9e3779b97f4a7c15ull};
}

static kvs_layout_t layout_n(uint32_t ndim) {
  kvs_layout_t l;
  memset(&l, 0, sizeof(l));
  l.dtype = KVS_DTYPE_BF16;
  l.ndim = ndim; /* ndim > 8 (invalid) keeps 8 dims of shape */
  for (uint32_t i = 0; i < ndim && i < KVS_LAYOUT_MAX_DIMS; i++) l.shape[i] = 2 + i * 3;
  return l;
}

static kvs_layout_t blob_layout(uint64_t n) {
  kvs_layout_t l;
  memset(&l, 0, sizeof(l));
  l.dtype = KVS_DTYPE_U8;
  l.ndim = 1;
  l.shape[0] = n;
  return l;
}

/* An 8-byte aligned allocation of at least n bytes. */
static void *xalloc(size_t n) {
  void *p = aligned_alloc(8, (n + 8) & ~(size_t)7);
  cr_assert_not_null(p);
  return p;
}

/* An 8-byte aligned copy with room (decoders need alignment; tests append/patch bytes). */
static uint8_t *dup_aligned(const void *p, size_t len, size_t extra) {
  uint8_t *b = xalloc(len + extra);
  if (len) memcpy(b, p, len);
  return b;
}

/* Encode through a size query first, then into an exact buffer; the two sizes must agree and
 * an undersized buffer must give -ENOBUFS. */
typedef int (*enc_fn)(const void *m, void *buf, size_t cap, size_t *len);
static uint8_t *encode_with(enc_fn enc, const void *m, size_t *len_out) {
  size_t need = 12345;
  cr_assert_eq(enc(m, NULL, 0, &need), 0, "size query failed");
  uint8_t *buf = xalloc(need + 8);
  cr_assert_not_null(buf);
  size_t len = 0;
  if (need > 0) {
    size_t untouched = 777;
    cr_assert_eq(enc(m, buf, need - 1, &untouched), -ENOBUFS, "short buffer must be refused");
    cr_assert_eq(untouched, 777, "*len written on failure");
  }
  cr_assert_eq(enc(m, buf, need, &len), 0);
  cr_assert_eq(len, need, "size query %zu != encoded %zu", need, len);
  *len_out = len;
  return buf;
}
#define ENCODE(fn, msg, lenp) encode_with((enc_fn)(fn), (msg), (lenp))

/* A message of scalars only: ENCODE *msgp (its encoding must be want_len bytes) and decode it
 * back into *outp with decfn; the encoding is freed, so *outp may not point into it. */
#define ROUND_TRIP(encfn, decfn, msgp, want_len, outp)                                        \
  do {                                                                                        \
    size_t rt_len_;                                                                           \
    uint8_t *rt_b_ = ENCODE(encfn, msgp, &rt_len_);                                           \
    cr_assert_eq(rt_len_, (size_t)(want_len), #encfn ": %zu bytes", rt_len_);                 \
    cr_assert_eq(decfn(rt_b_, rt_len_, outp), 0, #decfn " failed");                           \
    free(rt_b_);                                                                              \
  } while (0)

/* Generic decode entry for table-driven tests: decode into scratch storage. */
typedef int (*dec_fn)(const void *p, size_t len);
static kvs_proto_object_t g_objs[KVS_PROTO_MAX_KEYS];
static kvs_proto_blob_t g_descs[KVS_PROTO_MAX_DESCS];
#define DEC_WRAP(name, type, call)                                                              \
  static int dec_##name(const void *p, size_t len) {                                           \
    type out;                                                                                  \
    memset(&out, 0xA5, sizeof(out));                                                           \
    type before = out;                                                                         \
    int rc = call;                                                                             \
    if (rc < 0) cr_assert(memcmp(&out, &before, sizeof(out)) == 0, #name ": out written on failure"); \
    return rc;                                                                                 \
  }
DEC_WRAP(hello, kvs_proto_hello_t, kvs_proto_hello_decode(p, len, &out))
DEC_WRAP(error, kvs_proto_error_t, kvs_proto_error_decode(p, len, &out))
DEC_WRAP(lookup, kvs_proto_lookup_t, kvs_proto_lookup_decode(p, len, &out))
DEC_WRAP(lookup_reply, kvs_proto_lookup_reply_t, kvs_proto_lookup_reply_decode(p, len, &out))
DEC_WRAP(prepare_store, kvs_proto_prepare_store_t, kvs_proto_prepare_store_decode(p, len, &out))
DEC_WRAP(prepare_store_reply, kvs_proto_prepare_store_reply_t,
         kvs_proto_prepare_store_reply_decode(p, len, &out))
DEC_WRAP(commit_store, kvs_proto_commit_store_t, kvs_proto_commit_store_decode(p, len, &out))
DEC_WRAP(commit_store_reply, kvs_proto_commit_store_reply_t,
         kvs_proto_commit_store_reply_decode(p, len, &out))
DEC_WRAP(xfer, kvs_proto_xfer_t, kvs_proto_xfer_decode(p, len, &out))
DEC_WRAP(prepare_retrieve, kvs_proto_prepare_retrieve_t,
         kvs_proto_prepare_retrieve_decode(p, len, &out))
DEC_WRAP(prepare_retrieve_reply, kvs_proto_prepare_retrieve_reply_t,
         kvs_proto_prepare_retrieve_reply_decode(p, len, g_objs, KVS_PROTO_MAX_KEYS, &out))
DEC_WRAP(stats, kvs_proto_stats_t, kvs_proto_stats_decode(p, len, &out))
DEC_WRAP(text, kvs_proto_text_t, kvs_proto_text_decode(p, len, &out))
DEC_WRAP(ping, kvs_proto_ping_t, kvs_proto_ping_decode(p, len, &out))
DEC_WRAP(export, kvs_proto_export_t, kvs_proto_export_decode(p, len, &out))
DEC_WRAP(export_reply, kvs_proto_export_reply_t,
         kvs_proto_export_reply_decode(p, len, g_descs, KVS_PROTO_MAX_DESCS, &out))

/* Sample messages, one or more per payload kind (also used for truncation sweeps). */
static kvs_key_t g_keys[8];
static uint8_t g_outcomes[5] = {KVS_RES_RESERVED, KVS_RES_PRESENT, KVS_RES_RESERVED,
                                KVS_RES_NO_SPACE, KVS_RES_BUSY};
static kvs_proto_slot_t g_slots[2] = {{.key_index = 0, .offset = 4096, .length = 960},
                                      {.key_index = 2, .offset = 8192, .length = 960}};
static uint8_t g_data[64];
static kvs_proto_entry_t g_entries[3];
static kvs_proto_object_t g_robjs[3];
static kvs_proto_blob_t g_blobs[2];

static void fill_globals(void) {
  for (unsigned i = 0; i < 8; i++) g_keys[i] = key_n(i);
  for (unsigned i = 0; i < sizeof(g_data); i++) g_data[i] = (uint8_t)(i * 7 + 3);
  g_entries[0] = (kvs_proto_entry_t){key_n(10), 16};
  g_entries[1] = (kvs_proto_entry_t){key_n(11), 0};
  g_entries[2] = (kvs_proto_entry_t){key_n(12), 24};
  g_robjs[0] = (kvs_proto_object_t){.key_index = 0, .offset = 0, .length = 10, .layout = layout_n(1), .data = g_data};
  g_robjs[1] = (kvs_proto_object_t){.key_index = 2, .offset = 0, .length = 0, .layout = layout_n(0), .data = NULL};
  g_robjs[2] = (kvs_proto_object_t){.key_index = 3, .offset = 0, .length = 7, .layout = layout_n(8), .data = g_data + 10};
  g_blobs[0] = (kvs_proto_blob_t){.len = 5, .data = g_data};
  g_blobs[1] = (kvs_proto_blob_t){.len = 1, .data = g_data + 40};
}

typedef struct sample {
  const char *name;
  uint8_t *buf;
  size_t len;
  dec_fn dec;
} sample_t;

static size_t build_samples(sample_t *s) {
  fill_globals();
  size_t n = 0;
#define ADD(nm, encf, msgp, decf) (s[n].name = nm, s[n].dec = decf, s[n].buf = ENCODE(encf, msgp, &s[n].len), n++)
  kvs_proto_hello_t h = {.version_min = 1, .version_max = 1, .role = KVS_PROTO_ROLE_ENGINE,
                         .strategy_requested = KVS_PROTO_STRATEGY_AUTO, .pid = 4242,
                         .caps = KVS_PROTO_CAP_SHM | KVS_PROTO_CAP_INLINE, .instance_id = 99,
                         .pool_segment_size = 1 << 30, .pool_arena_size = 1 << 29,
                         .pool_arena_used = 12345, .max_frame = 64 << 20, .group = "default"};
  ADD("hello", kvs_proto_hello_encode, &h, dec_hello);
  kvs_proto_hello_t h2 = h;
  h2.group[0] = 0;
  ADD("hello-nogroup", kvs_proto_hello_encode, &h2, dec_hello);
  kvs_proto_error_t e = {.code = -ENOENT, .message_len = 5, .message = "gone!"};
  ADD("error", kvs_proto_error_encode, &e, dec_error);
  kvs_proto_lookup_t lk = {.n_keys = 3, .keys = g_keys};
  ADD("lookup", kvs_proto_lookup_encode, &lk, dec_lookup);
  kvs_proto_lookup_reply_t lr = {.found = 2};
  ADD("lookup_reply", kvs_proto_lookup_reply_encode, &lr, dec_lookup_reply);
  kvs_proto_prepare_store_t ps = {.strategy = KVS_PROTO_STRATEGY_SHM, .kind = KVS_PROTO_KIND_CHUNKS,
                                  .mode = KVS_RESERVE_NO_EVICT, .layout = layout_n(3), .n_keys = 5, .keys = g_keys};
  ADD("prepare_store", kvs_proto_prepare_store_encode, &ps, dec_prepare_store);
  kvs_proto_prepare_store_reply_t psr = {.xfer = 77, .n_outcomes = 5, .n_slots = 2,
                                         .outcomes = g_outcomes, .slots = g_slots};
  ADD("prepare_store_reply", kvs_proto_prepare_store_reply_encode, &psr, dec_prepare_store_reply);
  kvs_proto_prepare_store_reply_t psr2 = {.xfer = 0, .n_outcomes = 3, .n_slots = 0, .outcomes = g_outcomes};
  ADD("prepare_store_reply-inline", kvs_proto_prepare_store_reply_encode, &psr2, dec_prepare_store_reply);
  kvs_proto_commit_store_t cs = {.xfer = 77, .n_slots = 2, .slots = g_slots};
  ADD("commit_store-shm", kvs_proto_commit_store_encode, &cs, dec_commit_store);
  kvs_proto_commit_store_t cs0 = {.xfer = 78};
  ADD("commit_store-shm-noslots", kvs_proto_commit_store_encode, &cs0, dec_commit_store);
  kvs_proto_commit_store_t ci = {.xfer = 0, .is_inline = 1, .kind = KVS_PROTO_KIND_CHUNKS,
                                 .layout = layout_n(2), .n_entries = 3, .entries = g_entries,
                                 .data = g_data, .data_len = 40};
  ADD("commit_store-inline", kvs_proto_commit_store_encode, &ci, dec_commit_store);
  kvs_proto_commit_store_reply_t csr = {.committed = 2, .n_outcomes = 3, .outcomes = g_outcomes};
  ADD("commit_store_reply", kvs_proto_commit_store_reply_encode, &csr, dec_commit_store_reply);
  kvs_proto_xfer_t x = {.xfer = 0xdeadbeefcafef00dull};
  ADD("xfer", kvs_proto_xfer_encode, &x, dec_xfer);
  kvs_proto_prepare_retrieve_t pr = {.strategy = KVS_PROTO_STRATEGY_INLINE, .n_keys = 4, .keys = g_keys};
  ADD("prepare_retrieve", kvs_proto_prepare_retrieve_encode, &pr, dec_prepare_retrieve);
  kvs_proto_prepare_retrieve_reply_t rr = {.xfer = 0, .n_found = 4, .n_objects = 3, .is_inline = 1, .objects = g_robjs};
  ADD("prepare_retrieve_reply-inline", kvs_proto_prepare_retrieve_reply_encode, &rr, dec_prepare_retrieve_reply);
  kvs_proto_object_t shm_objs[2] = {
      {.key_index = 0, .offset = 4096, .length = 100, .layout = layout_n(4)},
      {.key_index = 1, .offset = 8192, .length = 200, .layout = layout_n(4)}};
  kvs_proto_prepare_retrieve_reply_t rs = {.xfer = 5, .n_found = 2, .n_objects = 2, .is_inline = 0, .objects = shm_objs};
  ADD("prepare_retrieve_reply-shm", kvs_proto_prepare_retrieve_reply_encode, &rs, dec_prepare_retrieve_reply);
  kvs_proto_stats_t st = {.format = KVS_PROTO_STATS_JSON};
  ADD("stats", kvs_proto_stats_encode, &st, dec_stats);
  kvs_proto_text_t tx = {.len = 11, .text = "store_hits:"};
  ADD("text", kvs_proto_text_encode, &tx, dec_text);
  kvs_proto_ping_t pg = {.nonce = 31337, .echo_len = 9, .echo = g_data};
  ADD("ping", kvs_proto_ping_encode, &pg, dec_ping);
  kvs_proto_export_t ex = {.address = 0x7f0000000000ull, .length = 1 << 20};
  ADD("export", kvs_proto_export_encode, &ex, dec_export);
  kvs_proto_export_reply_t exr = {.n_descs = 2, .n_fds = 1, .descs = g_blobs};
  ADD("export_reply", kvs_proto_export_reply_encode, &exr, dec_export_reply);
#undef ADD
  return n;
}

static void free_samples(sample_t *s, size_t n) {
  for (size_t i = 0; i < n; i++) free(s[i].buf);
}

static bool layout_eq(const kvs_layout_t *a, const kvs_layout_t *b) {
  return memcmp(a, b, sizeof(*a)) == 0;
}

/* ---- pinned numbers (ABI) ------------------------------------------------------------------------ */

T(opcode_numbers_are_pinned) {
  cr_assert_eq(KVS_OP_HELLO, 1);
  cr_assert_eq(KVS_OP_LOOKUP, 2);
  cr_assert_eq(KVS_OP_PREPARE_STORE, 3);
  cr_assert_eq(KVS_OP_COMMIT_STORE, 4);
  cr_assert_eq(KVS_OP_ABORT, 5);
  cr_assert_eq(KVS_OP_PREPARE_RETRIEVE, 6);
  cr_assert_eq(KVS_OP_COMMIT_RETRIEVE, 7);
  cr_assert_eq(KVS_OP_STATS, 8);
  cr_assert_eq(KVS_OP_PING, 9);
  cr_assert_eq(KVS_OP_EXPORT_TENSORS, 10);
  cr_assert_eq(KVS_OP_REPORT_BAD, 11);
  cr_assert_eq(KVS_OP_WATCH, 32);
  cr_assert_eq(KVS_OP_ERROR, 255);
  cr_assert_str_eq(kvs_proto_opcode_name(2), "LOOKUP");
  cr_assert_str_eq(kvs_proto_opcode_name(255), "ERROR");
  unsigned valid = 0;
  for (unsigned op = 0; op < 65536; op++) valid += kvs_proto_opcode_valid(op);
  cr_assert_eq(valid, 13, "exactly the 13 pinned opcodes are valid, got %u", valid);
  cr_assert_str_eq(kvs_proto_opcode_name(32), "WATCH");
  cr_assert_null(kvs_proto_opcode_name(0));
  cr_assert_null(kvs_proto_opcode_name(12));
  cr_assert_null(kvs_proto_opcode_name(31));
  cr_assert_null(kvs_proto_opcode_name(33));
  cr_assert_null(kvs_proto_opcode_name(254));
}

T(constants_are_pinned) {
  cr_assert_eq(KVS_PROTO_MAGIC, 0x4D53564Bu);
  cr_assert_eq(KVS_PROTO_VERSION, 1);
  cr_assert_eq(KVS_PROTO_HEADER_SIZE, 24);
  cr_assert_eq(KVS_PROTO_F_REPLY, 1);
  cr_assert_eq(KVS_PROTO_F_MORE, 2);
  cr_assert_eq(KVS_PROTO_ROLE_ENGINE, 1);
  cr_assert_eq(KVS_PROTO_ROLE_CACHE, 2);
  cr_assert_eq(KVS_PROTO_ROLE_TOOL, 3);
  cr_assert_eq(KVS_PROTO_CAP_SHM, 1);
  cr_assert_eq(KVS_PROTO_CAP_INLINE, 2);
  cr_assert_eq(KVS_PROTO_STRATEGY_AUTO, 0);
  cr_assert_eq(KVS_PROTO_STRATEGY_SHM, 1);
  cr_assert_eq(KVS_PROTO_STRATEGY_INLINE, 2);
  cr_assert_eq(KVS_PROTO_KIND_CHUNKS, 0);
  cr_assert_eq(KVS_PROTO_KIND_OBJECT, 1);
  cr_assert_eq(KVS_PROTO_MAX_KEYS, 4096);
  cr_assert_eq(sizeof(kvs_proto_entry_t), 24);
  cr_assert_eq(sizeof(kvs_proto_slot_t), 24);
}

T(error_codes_are_pinned_and_named) {
  cr_assert_eq(KVS_PROTO_EBADMSG, -74);
  cr_assert_eq(KVS_PROTO_EPROTONOSUPPORT, -93);
  cr_assert_eq(KVS_PROTO_EOPNOTSUPP, -95);
  cr_assert_eq(KVS_PROTO_EMSGSIZE, -90);
  cr_assert_eq(KVS_PROTO_EPROTO, -71);
  cr_assert_eq(KVS_PROTO_ENOENT, -2);
  cr_assert_eq(KVS_PROTO_EPERM, -1);
  cr_assert_eq(KVS_PROTO_EFAULT, -14);
  cr_assert_eq(KVS_PROTO_EBADMSG, -EBADMSG);
  cr_assert_eq(KVS_PROTO_EMSGSIZE, -EMSGSIZE);
  cr_assert_str_eq(kvs_proto_error_name(-EBADMSG), "EBADMSG");
  cr_assert_str_eq(kvs_proto_error_name(-EPROTONOSUPPORT), "EPROTONOSUPPORT");
  cr_assert_str_eq(kvs_proto_error_name(-EOPNOTSUPP), "EOPNOTSUPP");
  cr_assert_str_eq(kvs_proto_error_name(-EMSGSIZE), "EMSGSIZE");
  cr_assert_null(kvs_proto_error_name(-4000));
  cr_assert_str_eq(kvs_proto_strerror(-EBADMSG), "malformed frame or payload");
  cr_assert_str_eq(kvs_proto_strerror(-4000), "unknown error");
  cr_assert_str_eq(kvs_proto_strerror(12), "unknown error");
  /* The codec's own verdicts are distinct from each other. */
  int v[] = {-EBADMSG, -EPROTONOSUPPORT, -EOPNOTSUPP, -EMSGSIZE, -ENODATA};
  for (unsigned i = 0; i < 5; i++)
    for (unsigned j = i + 1; j < 5; j++) cr_assert_neq(v[i], v[j]);
}

/* ---- frame header ------------------------------------------------------------------------------- */

T(header_bytes_are_little_endian) {
  kvs_proto_header_t h = {.magic = KVS_PROTO_MAGIC, .version = 1, .opcode = KVS_OP_LOOKUP,
                          .flags = KVS_PROTO_F_REPLY | KVS_PROTO_F_MORE,
                          .request_id = 0x0102030405060708ull, .length = 0x0A0B0C0D};
  static const uint8_t want[24] = {
      0x4B, 0x56, 0x53, 0x4D,                         /* magic "KVSM" */
      0x01, 0x00,                                     /* version 1 */
      0x02, 0x00,                                     /* opcode LOOKUP */
      0x03, 0x00, 0x00, 0x00,                         /* flags REPLY|MORE */
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* request id */
      0x0D, 0x0C, 0x0B, 0x0A,                         /* length */
  };
  uint8_t got[24];
  memset(got, 0xEE, sizeof(got));
  kvs_proto_header_encode(&h, got);
  for (unsigned i = 0; i < 24; i++)
    cr_assert_eq(got[i], want[i], "byte %u: got %02x want %02x", i, got[i], want[i]);
  kvs_proto_header_t back;
  cr_assert_eq(kvs_proto_header_parse(want, 24, &back), 0);
  cr_assert_eq(back.magic, h.magic);
  cr_assert_eq(back.version, h.version);
  cr_assert_eq(back.opcode, h.opcode);
  cr_assert_eq(back.flags, h.flags);
  cr_assert_eq(back.request_id, h.request_id);
  cr_assert_eq(back.length, h.length);
}

static kvs_proto_header_t good_header(void) {
  return (kvs_proto_header_t){.magic = KVS_PROTO_MAGIC, .version = KVS_PROTO_VERSION,
                              .opcode = KVS_OP_PING, .flags = 0, .request_id = 5, .length = 16};
}

static int decode_hdr(const kvs_proto_header_t *h, uint32_t max_frame, kvs_proto_header_t *out) {
  uint8_t b[24];
  kvs_proto_header_encode(h, b);
  return kvs_proto_header_decode(b, sizeof(b), max_frame, out);
}

T(header_validation) {
  kvs_proto_header_t h = good_header(), out, sentinel;
  memset(&sentinel, 0x5A, sizeof(sentinel));
  out = sentinel;
  cr_assert_eq(decode_hdr(&h, 0, &out), 0);
  cr_assert_eq(out.request_id, 5);

  /* truncated: every length below 24 */
  uint8_t b[24];
  kvs_proto_header_encode(&h, b);
  for (size_t n = 0; n < 24; n++) {
    out = sentinel;
    cr_assert_eq(kvs_proto_header_decode(b, n, 0, &out), -ENODATA, "len %zu", n);
    cr_assert(memcmp(&out, &sentinel, sizeof(out)) == 0);
  }

  /* one change each from a good header */
  struct {
    const char *what;
    uint32_t magic, flags, length;
    uint16_t version, opcode;
    uint64_t request_id;
    int want;
  } cases[] = {
      {"bad magic", 0x4B56534Du, 0, 16, 1, KVS_OP_PING, 5, -EBADMSG},
      {"zero magic", 0, 0, 16, 1, KVS_OP_PING, 5, -EBADMSG},
      {"version 0", KVS_PROTO_MAGIC, 0, 16, 0, KVS_OP_PING, 5, -EPROTONOSUPPORT},
      {"version 2", KVS_PROTO_MAGIC, 0, 16, 2, KVS_OP_PING, 5, -EPROTONOSUPPORT},
      {"opcode 0", KVS_PROTO_MAGIC, 0, 16, 1, 0, 5, -EOPNOTSUPP},
      {"opcode 12", KVS_PROTO_MAGIC, 0, 16, 1, 12, 5, -EOPNOTSUPP},
      {"opcode 254", KVS_PROTO_MAGIC, 0, 16, 1, 254, 5, -EOPNOTSUPP},
      {"opcode 0xffff", KVS_PROTO_MAGIC, 0, 16, 1, 0xffff, 5, -EOPNOTSUPP},
      {"oversize", KVS_PROTO_MAGIC, 0, KVS_PROTO_MIN_MAX_FRAME + 1, 1, KVS_OP_PING, 5, -EMSGSIZE},
      {"oversize max", KVS_PROTO_MAGIC, 0, UINT32_MAX, 1, KVS_OP_PING, 5, -EMSGSIZE},
      {"reserved flag", KVS_PROTO_MAGIC, 4, 16, 1, KVS_OP_PING, 5, -EBADMSG},
      {"high flag", KVS_PROTO_MAGIC, 0x80000001u, 16, 1, KVS_OP_PING, 5, -EBADMSG},
      {"request id 0", KVS_PROTO_MAGIC, 0, 16, 1, KVS_OP_PING, 0, -EBADMSG},
      {"error w/o reply", KVS_PROTO_MAGIC, 0, 16, 1, KVS_OP_ERROR, 5, -EBADMSG},
      {"error more", KVS_PROTO_MAGIC, 3, 16, 1, KVS_OP_ERROR, 5, -EBADMSG},
      {"hello more", KVS_PROTO_MAGIC, 2, 16, 1, KVS_OP_HELLO, 5, -EBADMSG},
  };
  for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    kvs_proto_header_t m = {.magic = cases[i].magic, .version = cases[i].version,
                            .opcode = cases[i].opcode, .flags = cases[i].flags,
                            .request_id = cases[i].request_id, .length = cases[i].length};
    out = sentinel;
    int rc = decode_hdr(&m, 0, &out);
    cr_assert_eq(rc, cases[i].want, "%s: got %d want %d", cases[i].what, rc, cases[i].want);
    cr_assert(memcmp(&out, &sentinel, sizeof(out)) == 0, "%s: out written", cases[i].what);
    /* parse alone accepts it (the coordinator echoes the request id in ERROR) */
    kvs_proto_header_encode(&m, b);
    cr_assert_eq(kvs_proto_header_parse(b, 24, &out), 0);
  }

  /* exactly max_frame is fine; replies may carry request id 0 (connection-level ERROR) */
  h.length = 1000;
  cr_assert_eq(decode_hdr(&h, 1000, &out), 0);
  h.length = 1001;
  cr_assert_eq(decode_hdr(&h, 1000, &out), -EMSGSIZE);
  kvs_proto_header_t er = good_header();
  er.opcode = KVS_OP_ERROR;
  er.flags = KVS_PROTO_F_REPLY;
  er.request_id = 0;
  cr_assert_eq(decode_hdr(&er, 0, &out), 0);
  /* magic is checked before version before opcode before length */
  kvs_proto_header_t all = good_header();
  all.magic = 1, all.version = 9, all.opcode = 99, all.length = UINT32_MAX;
  cr_assert_eq(decode_hdr(&all, 0, &out), -EBADMSG);
  all.magic = KVS_PROTO_MAGIC;
  cr_assert_eq(decode_hdr(&all, 0, &out), -EPROTONOSUPPORT);
  all.version = 1;
  cr_assert_eq(decode_hdr(&all, 0, &out), -EOPNOTSUPP);
  all.opcode = KVS_OP_LOOKUP;
  cr_assert_eq(decode_hdr(&all, 0, &out), -EMSGSIZE);
}

T(frame_split_and_continuation) {
  const uint32_t mf = 1000;
  uint64_t totals[] = {0, 1, 999, 1000, 1001, 2500, 3000};
  for (unsigned t = 0; t < sizeof(totals) / sizeof(totals[0]); t++) {
    uint64_t total = totals[t], off = 0, frames = 0;
    kvs_proto_header_t first = {0}, h;
    for (;;) {
      cr_assert_eq(kvs_proto_frame_header(KVS_OP_COMMIT_STORE, 0, 42, total, off, mf, &h), 0);
      cr_assert_eq(kvs_proto_header_validate(&h, mf), 0);
      if (frames == 0) first = h;
      else cr_assert_eq(kvs_proto_frame_continues(&first, &h), 0);
      cr_assert_leq(h.length, mf);
      off += h.length;
      frames++;
      if (!(h.flags & KVS_PROTO_F_MORE)) break;
      cr_assert_eq(h.length, mf, "only the last frame may be short");
    }
    cr_assert_eq(off, total);
    cr_assert_eq(frames, total == 0 ? 1 : (total + mf - 1) / mf, "total %lu", (unsigned long)total);
  }
  kvs_proto_header_t h;
  cr_assert_eq(kvs_proto_frame_header(KVS_OP_PING, 0, 1, 10, 10, mf, &h), -EINVAL);
  cr_assert_eq(kvs_proto_frame_header(KVS_OP_PING, KVS_PROTO_F_MORE, 1, 10, 0, mf, &h), -EINVAL);
  cr_assert_eq(kvs_proto_frame_header(KVS_OP_PING, 0, 1, 10, 0, 0, &h), -EINVAL);
  cr_assert_eq(kvs_proto_frame_header(KVS_OP_HELLO, 0, 1, 2000, 0, mf, &h), -EMSGSIZE);
  cr_assert_eq(kvs_proto_frame_header(KVS_OP_ERROR, KVS_PROTO_F_REPLY, 1, 2000, 0, mf, &h), -EMSGSIZE);
  cr_assert_eq(kvs_proto_frame_header(KVS_OP_PING, KVS_PROTO_F_REPLY, 1, 5, 0, mf, &h), 0);
  cr_assert_eq(h.flags, KVS_PROTO_F_REPLY);

  kvs_proto_header_t a = good_header(), b = a;
  a.flags = KVS_PROTO_F_MORE;
  b.opcode = KVS_OP_LOOKUP;
  cr_assert_eq(kvs_proto_frame_continues(&a, &b), -EPROTO);
  b = a, b.request_id = 6;
  cr_assert_eq(kvs_proto_frame_continues(&a, &b), -EPROTO);
  b = a, b.flags = KVS_PROTO_F_REPLY;
  cr_assert_eq(kvs_proto_frame_continues(&a, &b), -EPROTO);
  b = a, b.flags = 0, b.length = 3;
  cr_assert_eq(kvs_proto_frame_continues(&a, &b), 0);

  kvs_proto_header_t req = good_header(), rep = req;
  cr_assert_eq(kvs_proto_reply_matches(&req, &rep), -EPROTO, "reply without F_REPLY");
  rep.flags = KVS_PROTO_F_REPLY;
  cr_assert_eq(kvs_proto_reply_matches(&req, &rep), 0);
  rep.opcode = KVS_OP_ERROR;
  cr_assert_eq(kvs_proto_reply_matches(&req, &rep), 0);
  rep.opcode = KVS_OP_LOOKUP;
  cr_assert_eq(kvs_proto_reply_matches(&req, &rep), -EPROTO);
  rep.opcode = KVS_OP_PING, rep.request_id = 9;
  cr_assert_eq(kvs_proto_reply_matches(&req, &rep), -EPROTO);
}

/* The hex example of docs/protocol.md: a LOOKUP request for two keys, request id 7. */
T(doc_lookup_frame_example) {
  kvs_key_t keys[2] = {{.lo = 0x1111111111111111ull, .hi = 0x2222222222222222ull},
                       {.lo = 0x0123456789abcdefull, .hi = 0xfedcba9876543210ull}};
  kvs_proto_lookup_t m = {.n_keys = 2, .keys = keys};
  uint8_t frame[64];
  size_t len;
  cr_assert_eq(kvs_proto_lookup_encode(&m, frame + 24, sizeof(frame) - 24, &len), 0);
  kvs_proto_header_t h;
  cr_assert_eq(kvs_proto_frame_header(KVS_OP_LOOKUP, 0, 7, len, 0, KVS_PROTO_MIN_MAX_FRAME, &h), 0);
  kvs_proto_header_encode(&h, frame);
  static const uint8_t want[64] = {
      0x4b, 0x56, 0x53, 0x4d, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x28, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
      0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, 0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe,
  };
  cr_assert_eq(len, 40);
  for (unsigned i = 0; i < 64; i++)
    cr_assert_eq(frame[i], want[i], "byte %u: got %02x want %02x", i, frame[i], want[i]);

  /* and its reply: found 1 */
  kvs_proto_lookup_reply_t r = {.found = 1};
  cr_assert_eq(kvs_proto_lookup_reply_encode(&r, frame + 24, 40, &len), 0);
  kvs_proto_header_t rh;
  cr_assert_eq(kvs_proto_frame_header(KVS_OP_LOOKUP, KVS_PROTO_F_REPLY, 7, len, 0, KVS_PROTO_MIN_MAX_FRAME, &rh), 0);
  kvs_proto_header_encode(&rh, frame);
  static const uint8_t want_reply[32] = {
      0x4b, 0x56, 0x53, 0x4d, 0x01, 0x00, 0x02, 0x00, 0x01, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  };
  cr_assert(memcmp(frame, want_reply, 32) == 0);
  cr_assert_eq(kvs_proto_reply_matches(&h, &rh), 0);
}

/* ---- round trips ------------------------------------------------------------------------------- */

/* Every sample: decode succeeds, re-encoding gives the same bytes (canonical), decoding twice
 * gives the same result (deterministic). */
T(every_sample_round_trips_canonically) {
  sample_t s[32];
  size_t n = build_samples(s);
  cr_assert_geq(n, 20);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(s[i].dec(s[i].buf, s[i].len), 0, "%s does not decode", s[i].name);
    cr_assert_eq(s[i].dec(s[i].buf, s[i].len), 0, "%s second decode", s[i].name);
  }
  free_samples(s, n);
}

T(hello_round_trip) {
  kvs_proto_hello_t h = {.version_min = 1, .version_max = 3, .role = KVS_PROTO_ROLE_CACHE,
                         .strategy_requested = KVS_PROTO_STRATEGY_SHM,
                         .strategy_chosen = KVS_PROTO_STRATEGY_SHM, .flags = KVS_PROTO_HELLO_POOL_FD,
                         .pid = 0xfedcba98, .caps = 0x80000003u, .instance_id = 0x1122334455667788ull,
                         .pool_segment_size = 5ull << 30, .pool_arena_size = 4ull << 30,
                         .pool_arena_used = 77, .max_frame = KVS_PROTO_MAX_MAX_FRAME};
  memset(h.group, 'g', KVS_PROTO_MAX_GROUP);
  h.group[KVS_PROTO_MAX_GROUP] = 0;
  size_t len;
  uint8_t *b = ENCODE(kvs_proto_hello_encode, &h, &len);
  cr_assert_eq(len, 56 + KVS_PROTO_MAX_GROUP);
  kvs_proto_hello_t d;
  cr_assert_eq(kvs_proto_hello_decode(b, len, &d), 0);
  cr_assert(memcmp(&d, &h, offsetof(kvs_proto_hello_t, group)) == 0);
  cr_assert_str_eq(d.group, h.group);
  cr_assert_eq(kvs_proto_hello_check(&d, true), 0);
  cr_assert_eq(kvs_proto_hello_check(&d, false), -EBADMSG);
  free(b);
}

T(error_round_trip_and_init) {
  kvs_proto_error_t e;
  kvs_proto_error_init(&e, -EFAULT, NULL);
  cr_assert_eq(e.code, -EFAULT);
  cr_assert_str_eq(e.message, kvs_proto_strerror(-EFAULT));
  size_t len;
  uint8_t *b = ENCODE(kvs_proto_error_encode, &e, &len);
  cr_assert_eq(len, 6 + strlen(kvs_proto_strerror(-EFAULT)));
  kvs_proto_error_t d;
  cr_assert_eq(kvs_proto_error_decode(b, len, &d), 0);
  cr_assert_eq(d.code, -EFAULT);
  cr_assert_eq(d.message_len, e.message_len);
  cr_assert(memcmp(d.message, e.message, e.message_len) == 0);
  cr_assert_eq((const uint8_t *)d.message, b + 6, "zero copy");
  free(b);

  char longmsg[600];
  memset(longmsg, 'x', sizeof(longmsg) - 1);
  longmsg[sizeof(longmsg) - 1] = 0;
  kvs_proto_error_init(&e, 5, longmsg); /* not negative: becomes -EIO; message cut */
  cr_assert_eq(e.code, -EIO);
  cr_assert_eq(e.message_len, KVS_PROTO_MAX_ERROR_MSG);
  b = ENCODE(kvs_proto_error_encode, &e, &len);
  cr_assert_eq(kvs_proto_error_decode(b, len, &d), 0);
  cr_assert_eq(d.message_len, 256);
  free(b);
}

T(lookup_round_trip_zero_copy) {
  kvs_key_t keys[KVS_PROTO_MAX_KEYS];
  for (unsigned i = 0; i < KVS_PROTO_MAX_KEYS; i++) keys[i] = key_n(i);
  kvs_proto_lookup_t m = {.n_keys = KVS_PROTO_MAX_KEYS, .keys = keys};
  size_t len;
  uint8_t *b = ENCODE(kvs_proto_lookup_encode, &m, &len);
  cr_assert_eq(len, 8 + 16 * KVS_PROTO_MAX_KEYS);
  kvs_proto_lookup_t d;
  cr_assert_eq(kvs_proto_lookup_decode(b, len, &d), 0);
  cr_assert_eq(d.n_keys, KVS_PROTO_MAX_KEYS);
  cr_assert_eq((const uint8_t *)d.keys, b + 8, "keys point into the payload");
  for (unsigned i = 0; i < KVS_PROTO_MAX_KEYS; i++) cr_assert(kvs_key_eq(d.keys[i], keys[i]));
  free(b);

  kvs_proto_lookup_reply_t r = {.found = 17}, rd;
  b = ENCODE(kvs_proto_lookup_reply_encode, &r, &len);
  cr_assert_eq(len, 8);
  cr_assert_eq(kvs_proto_lookup_reply_decode(b, len, &rd), 0);
  cr_assert_eq(rd.found, 17);
  free(b);
}

T(prepare_store_round_trip) {
  kvs_key_t keys[3] = {key_n(1), key_n(2), key_n(3)};
  for (uint32_t ndim = 0; ndim <= 8; ndim++) {
    kvs_proto_prepare_store_t m = {.strategy = KVS_PROTO_STRATEGY_INLINE, .kind = KVS_PROTO_KIND_OBJECT,
                                   .mode = KVS_PROTO_MODE_ALL, .layout = layout_n(ndim),
                                   .n_keys = 3, .keys = keys};
    size_t len;
    uint8_t *b = ENCODE(kvs_proto_prepare_store_encode, &m, &len);
    cr_assert_eq(len, 16 + 8 + 8 * ndim + 48);
    kvs_proto_prepare_store_t d;
    cr_assert_eq(kvs_proto_prepare_store_decode(b, len, &d), 0);
    cr_assert_eq(d.strategy, m.strategy);
    cr_assert_eq(d.kind, m.kind);
    cr_assert_eq(d.mode, m.mode);
    cr_assert(layout_eq(&d.layout, &m.layout), "ndim %u", ndim);
    cr_assert_eq(d.n_keys, 3);
    for (unsigned i = 0; i < 3; i++) cr_assert(kvs_key_eq(d.keys[i], keys[i]));
    free(b);
  }
}

T(prepare_store_reply_round_trip) {
  fill_globals();
  kvs_proto_prepare_store_reply_t m = {.xfer = 77, .n_outcomes = 5, .n_slots = 2,
                                       .outcomes = g_outcomes, .slots = g_slots};
  size_t len;
  uint8_t *b = ENCODE(kvs_proto_prepare_store_reply_encode, &m, &len);
  cr_assert_eq(len, 16 + 8 + 48, "5 outcomes padded to 8, then 2 slots");
  kvs_proto_prepare_store_reply_t d;
  cr_assert_eq(kvs_proto_prepare_store_reply_decode(b, len, &d), 0);
  cr_assert_eq(d.xfer, 77);
  cr_assert_eq(d.n_outcomes, 5);
  cr_assert_eq(d.n_slots, 2);
  cr_assert(memcmp(d.outcomes, g_outcomes, 5) == 0);
  for (unsigned i = 0; i < 2; i++) {
    cr_assert_eq(d.slots[i].key_index, g_slots[i].key_index);
    cr_assert_eq(d.slots[i].offset, g_slots[i].offset);
    cr_assert_eq(d.slots[i].length, g_slots[i].length);
  }
  free(b);
  /* outcome counts that are multiples of 8 get no padding */
  uint8_t oc[8] = {0};
  kvs_proto_prepare_store_reply_t m8 = {.xfer = 1, .n_outcomes = 8, .n_slots = 1, .outcomes = oc, .slots = g_slots};
  b = ENCODE(kvs_proto_prepare_store_reply_encode, &m8, &len);
  cr_assert_eq(len, 16 + 8 + 24);
  cr_assert_eq(kvs_proto_prepare_store_reply_decode(b, len, &d), 0);
  free(b);
}

T(commit_store_round_trip) {
  fill_globals();
  /* SHM: 24 bytes + the slots written */
  kvs_proto_commit_store_t s = {.xfer = 12, .n_slots = 2, .slots = g_slots};
  size_t len;
  uint8_t *b = ENCODE(kvs_proto_commit_store_encode, &s, &len);
  cr_assert_eq(len, 24 + 2 * 24);
  kvs_proto_commit_store_t d;
  cr_assert_eq(kvs_proto_commit_store_decode(b, len, &d), 0);
  cr_assert_eq(d.xfer, 12);
  cr_assert_eq(d.is_inline, 0);
  cr_assert_eq(d.n_entries, 0);
  cr_assert_null(d.entries);
  cr_assert_null(d.data);
  cr_assert_eq(d.n_slots, 2);
  cr_assert_eq((const uint8_t *)d.slots, b + 24, "slots read in place");
  for (unsigned i = 0; i < 2; i++) {
    cr_assert_eq(d.slots[i].key_index, g_slots[i].key_index);
    cr_assert_eq(d.slots[i].offset, g_slots[i].offset);
    cr_assert_eq(d.slots[i].length, g_slots[i].length);
  }
  free(b);
  s.n_slots = 0;
  b = ENCODE(kvs_proto_commit_store_encode, &s, &len);
  cr_assert_eq(len, 24);
  cr_assert_eq(kvs_proto_commit_store_decode(b, len, &d), 0);
  cr_assert_eq(d.n_slots, 0);
  free(b);

  /* inline chunks */
  kvs_proto_commit_store_t c = {.xfer = 3, .is_inline = 1, .kind = KVS_PROTO_KIND_CHUNKS,
                                .mode = KVS_RESERVE_ALL_OR_NOTHING, .layout = layout_n(2),
                                .n_entries = 3, .entries = g_entries, .data = g_data, .data_len = 40};
  b = ENCODE(kvs_proto_commit_store_encode, &c, &len);
  cr_assert_eq(len, 24 + 24 + 72 + 40);
  cr_assert_eq(kvs_proto_commit_store_decode(b, len, &d), 0);
  cr_assert_eq(d.xfer, 3);
  cr_assert_eq(d.is_inline, 1);
  cr_assert_eq(d.kind, KVS_PROTO_KIND_CHUNKS);
  cr_assert_eq(d.mode, KVS_RESERVE_ALL_OR_NOTHING);
  cr_assert(layout_eq(&d.layout, &c.layout));
  cr_assert_eq(d.n_entries, 3);
  for (unsigned i = 0; i < 3; i++) {
    cr_assert(kvs_key_eq(d.entries[i].key, g_entries[i].key));
    cr_assert_eq(d.entries[i].length, g_entries[i].length);
  }
  cr_assert_eq(d.data_len, 40);
  cr_assert_eq(d.data, b + len - 40, "data is the tail of the payload");
  cr_assert(memcmp(d.data, g_data, 40) == 0);
  free(b);

  /* inline object: primary carries the bytes, aliases length 0 */
  kvs_proto_entry_t oe[3] = {{key_n(1), 33}, {key_n(2), 0}, {key_n(3), 0}};
  kvs_proto_commit_store_t o = {.is_inline = 1, .kind = KVS_PROTO_KIND_OBJECT, .layout = blob_layout(33),
                                .n_entries = 3, .entries = oe, .data = g_data, .data_len = 33};
  b = ENCODE(kvs_proto_commit_store_encode, &o, &len);
  cr_assert_eq(kvs_proto_commit_store_decode(b, len, &d), 0);
  cr_assert_eq(d.kind, KVS_PROTO_KIND_OBJECT);
  cr_assert_eq(d.data_len, 33);
  cr_assert(memcmp(d.data, g_data, 33) == 0);
  free(b);

  kvs_proto_commit_store_reply_t r = {.committed = 2, .n_outcomes = 3, .outcomes = g_outcomes}, rd;
  b = ENCODE(kvs_proto_commit_store_reply_encode, &r, &len);
  cr_assert_eq(len, 11);
  cr_assert_eq(kvs_proto_commit_store_reply_decode(b, len, &rd), 0);
  cr_assert_eq(rd.committed, 2);
  cr_assert_eq(rd.n_outcomes, 3);
  cr_assert(memcmp(rd.outcomes, g_outcomes, 3) == 0);
  free(b);
}

T(prepare_retrieve_round_trip) {
  fill_globals();
  kvs_proto_prepare_retrieve_t m = {.strategy = KVS_PROTO_STRATEGY_SHM, .n_keys = 8, .keys = g_keys};
  size_t len;
  uint8_t *b = ENCODE(kvs_proto_prepare_retrieve_encode, &m, &len);
  cr_assert_eq(len, 8 + 128);
  kvs_proto_prepare_retrieve_t d;
  cr_assert_eq(kvs_proto_prepare_retrieve_decode(b, len, &d), 0);
  cr_assert_eq(d.strategy, KVS_PROTO_STRATEGY_SHM);
  cr_assert_eq(d.n_keys, 8);
  for (unsigned i = 0; i < 8; i++) cr_assert(kvs_key_eq(d.keys[i], g_keys[i]));
  free(b);

  /* inline reply: table then the objects' bytes back to back */
  kvs_proto_prepare_retrieve_reply_t r = {.xfer = 0, .n_found = 4, .n_objects = 3, .is_inline = 1, .objects = g_robjs};
  b = ENCODE(kvs_proto_prepare_retrieve_reply_encode, &r, &len);
  cr_assert_eq(len, 24 + (32 + 8) + (32 + 0) + (32 + 64) + 17);
  kvs_proto_object_t objs[3];
  kvs_proto_prepare_retrieve_reply_t rd;
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_decode(b, len, objs, 3, &rd), 0);
  cr_assert_eq(rd.xfer, 0);
  cr_assert_eq(rd.n_found, 4);
  cr_assert_eq(rd.n_objects, 3);
  cr_assert_eq(rd.is_inline, 1);
  cr_assert_eq(rd.objects, objs);
  cr_assert_eq(rd.data_len, 17);
  cr_assert_eq(rd.data, b + len - 17);
  for (unsigned i = 0; i < 3; i++) {
    cr_assert_eq(objs[i].key_index, g_robjs[i].key_index);
    cr_assert_eq(objs[i].offset, 0);
    cr_assert_eq(objs[i].length, g_robjs[i].length);
    cr_assert(layout_eq(&objs[i].layout, &g_robjs[i].layout));
    if (g_robjs[i].length) cr_assert(memcmp(objs[i].data, g_robjs[i].data, g_robjs[i].length) == 0);
    else cr_assert_null(objs[i].data);
  }
  cr_assert_eq(objs[2].data, objs[0].data + 10, "objects are back to back");
  /* cap too small: -ENOBUFS, caller array untouched */
  kvs_proto_object_t small[2];
  memset(small, 0x3C, sizeof(small));
  uint8_t before[sizeof(small)];
  memcpy(before, small, sizeof(small));
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_decode(b, len, small, 2, &rd), -ENOBUFS);
  cr_assert(memcmp(small, before, sizeof(small)) == 0);
  free(b);

  /* SHM reply: offsets kept, no bytes */
  kvs_proto_object_t so[2] = {{.key_index = 0, .offset = 1 << 20, .length = 4096, .layout = layout_n(2)},
                              {.key_index = 3, .offset = 2 << 20, .length = 8192, .layout = layout_n(2)}};
  kvs_proto_prepare_retrieve_reply_t s = {.xfer = 9, .n_found = 5, .n_objects = 2, .objects = so};
  b = ENCODE(kvs_proto_prepare_retrieve_reply_encode, &s, &len);
  cr_assert_eq(len, 24 + 2 * (32 + 16), "object record: 32 bytes + 8 per dim");
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_decode(b, len, objs, 3, &rd), 0);
  cr_assert_eq(rd.xfer, 9);
  cr_assert_eq(rd.n_found, 5);
  cr_assert_eq(rd.is_inline, 0);
  cr_assert_null(rd.data);
  cr_assert_eq(rd.data_len, 0);
  for (unsigned i = 0; i < 2; i++) {
    cr_assert_eq(objs[i].key_index, so[i].key_index);
    cr_assert_eq(objs[i].offset, so[i].offset);
    cr_assert_eq(objs[i].length, so[i].length);
    cr_assert(layout_eq(&objs[i].layout, &so[i].layout));
    cr_assert_null(objs[i].data);
  }
  free(b);

  /* nothing found */
  kvs_proto_prepare_retrieve_reply_t z = {0};
  b = ENCODE(kvs_proto_prepare_retrieve_reply_encode, &z, &len);
  cr_assert_eq(len, 24);
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_decode(b, len, NULL, 0, &rd), 0);
  cr_assert_eq(rd.n_objects, 0);
  free(b);
}

T(small_messages_round_trip) {
  fill_globals();
  size_t len;
  uint8_t *b;
  kvs_proto_xfer_t x = {.xfer = UINT64_MAX}, xd;
  ROUND_TRIP(kvs_proto_xfer_encode, kvs_proto_xfer_decode, &x, 8, &xd);
  cr_assert_eq(xd.xfer, UINT64_MAX);

  cr_assert_eq(kvs_proto_empty_decode(NULL, 0), 0);
  uint8_t one[8] = {0};
  cr_assert_eq(kvs_proto_empty_decode(one, 1), -EBADMSG);

  for (uint8_t f = 0; f <= 1; f++) {
    kvs_proto_stats_t st = {.format = f}, sd;
    ROUND_TRIP(kvs_proto_stats_encode, kvs_proto_stats_decode, &st, 1, &sd);
    cr_assert_eq(sd.format, f);
  }
  kvs_proto_stats_t bad = {.format = 2};
  cr_assert_eq(kvs_proto_stats_encode(&bad, NULL, 0, &len), -EINVAL);

  const char *txt = "# kvshim stats v1\r\nstore_hits:3\r\n";
  kvs_proto_text_t t = {.len = (uint32_t)strlen(txt), .text = txt}, td;
  b = ENCODE(kvs_proto_text_encode, &t, &len);
  cr_assert_eq(len, 4 + strlen(txt));
  cr_assert_eq(kvs_proto_text_decode(b, len, &td), 0);
  cr_assert_eq(td.len, t.len);
  cr_assert(memcmp(td.text, txt, t.len) == 0);
  free(b);
  kvs_proto_text_t te = {0};
  b = ENCODE(kvs_proto_text_encode, &te, &len);
  cr_assert_eq(kvs_proto_text_decode(b, len, &td), 0);
  cr_assert_eq(td.len, 0);
  free(b);

  kvs_proto_ping_t p = {.nonce = 0x0123456789abcdefull, .echo_len = 64, .echo = g_data}, pd;
  b = ENCODE(kvs_proto_ping_encode, &p, &len);
  cr_assert_eq(len, 16 + 64);
  cr_assert_eq(kvs_proto_ping_decode(b, len, &pd), 0);
  cr_assert_eq(pd.nonce, p.nonce);
  cr_assert_eq(pd.echo_len, 64);
  cr_assert(memcmp(pd.echo, g_data, 64) == 0);
  free(b);

  kvs_proto_export_t e = {.address = 0x7f1234560000ull, .length = 0x10000}, ed;
  ROUND_TRIP(kvs_proto_export_encode, kvs_proto_export_decode, &e, 16, &ed);
  cr_assert_eq(ed.address, e.address);
  cr_assert_eq(ed.length, e.length);

  kvs_proto_export_reply_t r = {.n_descs = 2, .n_fds = 1, .descs = g_blobs}, rd;
  b = ENCODE(kvs_proto_export_reply_encode, &r, &len);
  cr_assert_eq(len, 8 + 4 + 5 + 4 + 1);
  kvs_proto_blob_t descs[2];
  cr_assert_eq(kvs_proto_export_reply_decode(b, len, descs, 2, &rd), 0);
  cr_assert_eq(rd.n_descs, 2);
  cr_assert_eq(rd.n_fds, 1);
  cr_assert_eq(rd.descs, descs);
  for (unsigned i = 0; i < 2; i++) {
    cr_assert_eq(descs[i].len, g_blobs[i].len);
    cr_assert(memcmp(descs[i].data, g_blobs[i].data, descs[i].len) == 0);
  }
  kvs_proto_blob_t one_desc[1];
  memset(one_desc, 0x77, sizeof(one_desc));
  cr_assert_eq(kvs_proto_export_reply_decode(b, len, one_desc, 1, &rd), -ENOBUFS);
  cr_assert_eq(one_desc[0].len, 0x77777777u, "caller array untouched on failure");
  free(b);
}

/* ---- malformed input ------------------------------------------------------------------------- */

/* Every decoder rejects every strictly shorter prefix of a valid payload, and trailing bytes. */
T(every_decoder_rejects_truncation_and_trailing_bytes) {
  sample_t s[32];
  size_t n = build_samples(s);
  for (size_t i = 0; i < n; i++) {
    for (size_t k = 0; k < s[i].len; k++) {
      uint8_t *t = dup_aligned(s[i].buf, k, 0);
      int rc = s[i].dec(t, k);
      cr_assert_eq(rc, -EBADMSG, "%s truncated to %zu of %zu: got %d", s[i].name, k, s[i].len, rc);
      free(t);
    }
    static const uint8_t tails[] = {0x00, 0xFF};
    for (unsigned j = 0; j < 2; j++) {
      for (size_t extra = 1; extra <= 9; extra += 8) {
        uint8_t *t = dup_aligned(s[i].buf, s[i].len, extra);
        memset(t + s[i].len, tails[j], extra);
        int rc = s[i].dec(t, s[i].len + extra);
        cr_assert_eq(rc, -EBADMSG, "%s + %zu trailing %02x: got %d", s[i].name, extra, tails[j], rc);
        free(t);
      }
    }
  }
  free_samples(s, n);
}

T(decoders_refuse_misaligned_or_null_payloads) {
  sample_t s[32];
  size_t n = build_samples(s);
  for (size_t i = 0; i < n; i++) {
    if (s[i].len == 0) continue;
    uint8_t *t = xalloc(s[i].len + 16);
    memcpy(t + 1, s[i].buf, s[i].len);
    cr_assert_eq(s[i].dec(t + 1, s[i].len), -EINVAL, "%s misaligned", s[i].name);
    cr_assert_eq(s[i].dec(NULL, s[i].len), -EINVAL, "%s NULL", s[i].name);
    free(t);
  }
  free_samples(s, n);
}

static inline void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

T(counts_over_payload_or_limit_are_rejected) {
  kvs_key_t keys[KVS_PROTO_MAX_KEYS + 1];
  for (unsigned i = 0; i <= KVS_PROTO_MAX_KEYS; i++) keys[i] = key_n(i);
  kvs_proto_lookup_t m = {.n_keys = 3, .keys = keys}, d;
  size_t len;
  uint8_t *b = ENCODE(kvs_proto_lookup_encode, &m, &len);
  put32(b, 4); /* says 4 keys, holds 3 */
  cr_assert_eq(kvs_proto_lookup_decode(b, len, &d), -EBADMSG);
  put32(b, 2); /* says 2 keys, holds 3: trailing key */
  cr_assert_eq(kvs_proto_lookup_decode(b, len, &d), -EBADMSG);
  put32(b, UINT32_MAX); /* huge count: no overflow, no read */
  cr_assert_eq(kvs_proto_lookup_decode(b, len, &d), -EBADMSG);
  put32(b, 0);
  cr_assert_eq(kvs_proto_lookup_decode(b, len, &d), -EBADMSG, "zero keys");
  free(b);

  /* over the limit even though the payload holds them all */
  m.n_keys = KVS_PROTO_MAX_KEYS + 1;
  cr_assert_eq(kvs_proto_lookup_encode(&m, NULL, 0, &len), -EINVAL);
  m.n_keys = KVS_PROTO_MAX_KEYS;
  b = ENCODE(kvs_proto_lookup_encode, &m, &len);
  uint8_t *big = dup_aligned(b, len, 16);
  memcpy(big + len, &keys[KVS_PROTO_MAX_KEYS], 16);
  put32(big, KVS_PROTO_MAX_KEYS + 1);
  cr_assert_eq(kvs_proto_lookup_decode(big, len + 16, &d), -EBADMSG);
  free(big);
  free(b);

  kvs_proto_prepare_store_t ps = {.strategy = 1, .layout = layout_n(1), .n_keys = KVS_PROTO_MAX_KEYS + 1, .keys = keys};
  cr_assert_eq(kvs_proto_prepare_store_encode(&ps, NULL, 0, &len), -EINVAL);
  kvs_proto_prepare_retrieve_t pr = {.strategy = 1, .n_keys = KVS_PROTO_MAX_KEYS + 1, .keys = keys};
  cr_assert_eq(kvs_proto_prepare_retrieve_encode(&pr, NULL, 0, &len), -EINVAL);
  pr.n_keys = 2;
  b = ENCODE(kvs_proto_prepare_retrieve_encode, &pr, &len);
  kvs_proto_prepare_retrieve_t prd;
  put32(b + 4, KVS_PROTO_MAX_KEYS + 1);
  cr_assert_eq(kvs_proto_prepare_retrieve_decode(b, len, &prd), -EBADMSG);
  free(b);

  /* export reply descriptor count larger than the descriptors present */
  fill_globals();
  kvs_proto_export_reply_t er = {.n_descs = 2, .descs = g_blobs};
  b = ENCODE(kvs_proto_export_reply_encode, &er, &len);
  kvs_proto_export_reply_t erd;
  kvs_proto_blob_t descs[4];
  put32(b, 3);
  cr_assert_eq(kvs_proto_export_reply_decode(b, len, descs, 4, &erd), -EBADMSG);
  put32(b, KVS_PROTO_MAX_DESCS + 1);
  cr_assert_eq(kvs_proto_export_reply_decode(b, len, descs, 4, &erd), -EBADMSG);
  put32(b, 2);
  put32(b + 8, 0x7fffffff); /* first descriptor length beyond the payload */
  cr_assert_eq(kvs_proto_export_reply_decode(b, len, descs, 4, &erd), -EBADMSG);
  put32(b + 8, 0); /* empty descriptor */
  cr_assert_eq(kvs_proto_export_reply_decode(b, len, descs, 4, &erd), -EBADMSG);
  free(b);
  kvs_proto_blob_t huge = {.len = KVS_PROTO_MAX_DESC_BYTES + 1, .data = g_data};
  kvs_proto_export_reply_t herr = {.n_descs = 1, .descs = &huge};
  cr_assert_eq(kvs_proto_export_reply_encode(&herr, NULL, 0, &len), -EINVAL);
}

T(ndim_over_8_is_rejected) {
  kvs_key_t keys[2] = {key_n(1), key_n(2)};
  kvs_proto_prepare_store_t m = {.strategy = 1, .layout = layout_n(8), .n_keys = 2, .keys = keys}, d;
  size_t len;
  uint8_t *b = ENCODE(kvs_proto_prepare_store_encode, &m, &len);
  cr_assert_eq(kvs_proto_prepare_store_decode(b, len, &d), 0);
  /* A well-formed 9-dim layout (ndim at offset 20, a 9th dim inserted before the keys): a
   * decoder that ignored the limit would accept it exactly. */
  const size_t keys_at = 16 + 8 + 8 * 8;
  uint8_t *big = dup_aligned(b, len, 8);
  memcpy(big, b, keys_at);
  put64(big + keys_at, 2); /* = n_keys: even a decoder overflowing shape[] into n_keys would accept */
  memcpy(big + keys_at + 8, b + keys_at, len - keys_at);
  put32(big + 20, 9);
  cr_assert_eq(kvs_proto_prepare_store_decode(big, len + 8, &d), -EBADMSG);
  put32(big + 20, UINT32_MAX);
  cr_assert_eq(kvs_proto_prepare_store_decode(big, len + 8, &d), -EBADMSG);
  free(big);
  free(b);
  m.layout.ndim = 9;
  cr_assert_eq(kvs_proto_prepare_store_encode(&m, NULL, 0, &len), -EINVAL);

  kvs_proto_object_t o = {.key_index = 0, .offset = 0, .length = 0, .layout = layout_n(1)};
  kvs_proto_prepare_retrieve_reply_t r = {.xfer = 1, .n_found = 1, .n_objects = 1, .objects = &o};
  b = ENCODE(kvs_proto_prepare_retrieve_reply_encode, &r, &len);
  cr_assert_eq(len, 24 + 32 + 8);
  big = dup_aligned(b, len, 64); /* same object with 9 dims: exactly 64 more bytes of shape */
  memset(big + len, 0, 64);
  put64(big + len, 3);
  put32(big + 24 + 28, 9); /* object 0 layout ndim */
  kvs_proto_object_t objs[1];
  kvs_proto_prepare_retrieve_reply_t rd;
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_decode(big, len + 64, objs, 1, &rd), -EBADMSG);
  free(big);
  free(b);
  o.layout.ndim = 9;
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_encode(&r, NULL, 0, &len), -EINVAL);

  fill_globals();
  kvs_proto_commit_store_t c = {.is_inline = 1, .layout = layout_n(9), .n_entries = 1,
                                .entries = g_entries, .data = g_data, .data_len = 16};
  cr_assert_eq(kvs_proto_commit_store_encode(&c, NULL, 0, &len), -EINVAL);
}

T(inline_commit_table_must_match_the_bytes) {
  fill_globals();
  kvs_proto_commit_store_t c = {.is_inline = 1, .layout = layout_n(1), .n_entries = 3,
                                .entries = g_entries, .data = g_data, .data_len = 40}, d;
  size_t len;
  uint8_t *b = ENCODE(kvs_proto_commit_store_encode, &c, &len);
  cr_assert_eq(kvs_proto_commit_store_decode(b, len, &d), 0);
  const size_t table = 24 + 16; /* header + layout with ndim 1 */
  uint8_t *t = dup_aligned(b, len, 0);
  /* entry 0 length +1: the table claims more bytes than follow */
  put64(t + table + 16, 17);
  cr_assert_eq(kvs_proto_commit_store_decode(t, len, &d), -EBADMSG);
  /* entry 0 length -1: one unclaimed byte at the end */
  put64(t + table + 16, 15);
  cr_assert_eq(kvs_proto_commit_store_decode(t, len, &d), -EBADMSG);
  /* lengths whose sum overflows u64 */
  put64(t + table + 16, UINT64_MAX);
  put64(t + table + 24 + 16, 41);
  cr_assert_eq(kvs_proto_commit_store_decode(t, len, &d), -EBADMSG);
  free(t);
  free(b);

  /* encoder refuses a data_len that differs from the table */
  c.data_len = 39;
  cr_assert_eq(kvs_proto_commit_store_encode(&c, NULL, 0, &len), -EINVAL);
  /* OBJECT aliases may not carry bytes */
  c.data_len = 40;
  c.kind = KVS_PROTO_KIND_OBJECT;
  cr_assert_eq(kvs_proto_commit_store_encode(&c, NULL, 0, &len), -EINVAL);
  /* inline commit naming slots */
  c.kind = KVS_PROTO_KIND_CHUNKS;
  c.n_slots = 1, c.slots = g_slots;
  cr_assert_eq(kvs_proto_commit_store_encode(&c, NULL, 0, &len), -EINVAL);
  /* SHM commit with a table or bytes, or bad slots */
  kvs_proto_commit_store_t s = {.xfer = 1, .n_entries = 1};
  cr_assert_eq(kvs_proto_commit_store_encode(&s, NULL, 0, &len), -EINVAL);
  s.n_entries = 0, s.data_len = 1;
  cr_assert_eq(kvs_proto_commit_store_encode(&s, NULL, 0, &len), -EINVAL);
  kvs_proto_slot_t dup[2] = {{.key_index = 1, .length = 1}, {.key_index = 1, .offset = 9, .length = 1}};
  s.data_len = 0, s.n_slots = 2, s.slots = dup;
  cr_assert_eq(kvs_proto_commit_store_encode(&s, NULL, 0, &len), -EINVAL, "slot key index repeated");
  s.n_slots = KVS_PROTO_MAX_KEYS + 1;
  cr_assert_eq(kvs_proto_commit_store_encode(&s, NULL, 0, &len), -EINVAL);
  s.n_slots = 0, s.slots = NULL;
  b = ENCODE(kvs_proto_commit_store_encode, &s, &len);
  b[12] = 1; /* mode on an SHM commit */
  cr_assert_eq(kvs_proto_commit_store_decode(b, len, &d), -EBADMSG);
  b[12] = 0;
  b[8] = 2; /* is_inline must be 0 or 1 */
  cr_assert_eq(kvs_proto_commit_store_decode(b, len, &d), -EBADMSG);
  free(b);
}

/* Flip each reserved / padding / enum byte of a sample and expect -EBADMSG. */
static void expect_bad_patch(const sample_t *s, size_t off, uint8_t val) {
  uint8_t *t = dup_aligned(s->buf, s->len, 0);
  cr_assert_lt(off, s->len);
  t[off] = val;
  int rc = s->dec(t, s->len);
  cr_assert_eq(rc, -EBADMSG, "%s: byte %zu = %02x accepted (rc %d)", s->name, off, val, rc);
  free(t);
}

static const sample_t *find_sample(const sample_t *s, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(s[i].name, name) == 0) return &s[i];
  cr_assert_fail("no sample %s", name);
  return NULL;
}

T(reserved_fields_and_ranges_are_checked) {
  sample_t s[32];
  size_t n = build_samples(s);
  const sample_t *h = find_sample(s, n, "hello");
  expect_bad_patch(h, 4, 0);     /* role 0 */
  expect_bad_patch(h, 4, 4);     /* role 4 */
  expect_bad_patch(h, 5, 3);     /* strategy requested */
  expect_bad_patch(h, 6, 3);     /* strategy chosen */
  expect_bad_patch(h, 7, 2);     /* unknown hello flag */
  expect_bad_patch(h, 54, 1);    /* reserved */
  expect_bad_patch(h, 56, 0);    /* NUL inside the group name */
  expect_bad_patch(h, 0, 2);     /* version_min 2 > version_max 1 */
  expect_bad_patch(h, 51, 0);    /* max_frame 64 MiB (00 00 00 04) -> 0: < 64 KiB */
  const sample_t *hn = find_sample(s, n, "hello-nogroup");
  expect_bad_patch(hn, 52, 65);  /* group length 65 (and missing bytes) */
  const sample_t *e = find_sample(s, n, "error");
  expect_bad_patch(e, 3, 0);     /* code becomes positive */
  const sample_t *lk = find_sample(s, n, "lookup");
  (void)lk; /* LOOKUP byte 4 is remote_wait_ms now (lookup_remote_wait_round_trips) */
  const sample_t *lr = find_sample(s, n, "lookup_reply");
  expect_bad_patch(lr, 7, 1);
  expect_bad_patch(lr, 1, 0x10); /* found 4098 > limit */
  const sample_t *ps = find_sample(s, n, "prepare_store");
  expect_bad_patch(ps, 0, 0);    /* strategy AUTO not allowed */
  expect_bad_patch(ps, 0, 3);
  expect_bad_patch(ps, 1, 2);    /* kind */
  expect_bad_patch(ps, 2, 1);    /* reserved */
  expect_bad_patch(ps, 4, 4);    /* unknown mode bit */
  expect_bad_patch(ps, 12, 1);   /* reserved */
  const sample_t *psr = find_sample(s, n, "prepare_store_reply");
  expect_bad_patch(psr, 16 + 1, 7);        /* outcome out of range (6 is SKIPPED) */
  expect_bad_patch(psr, 16 + 5, 1);        /* padding after outcomes */
  expect_bad_patch(psr, 24 + 4, 1);        /* slot reserved */
  expect_bad_patch(psr, 24, 5);            /* slot key index >= n_outcomes */
  expect_bad_patch(psr, 24, 1);            /* slot names a PRESENT outcome */
  expect_bad_patch(psr, 24 + 24, 0);       /* slot 1 key index not increasing */
  expect_bad_patch(psr, 12, 6);            /* n_slots 6 > n_outcomes 5 */
  expect_bad_patch(psr, 0, 0);             /* xfer 77 -> 0 while slots exist */
  const sample_t *rr = find_sample(s, n, "prepare_retrieve_reply-inline");
  expect_bad_patch(rr, 0, 1);              /* inline with a transfer id */
  expect_bad_patch(rr, 16, 2);             /* is_inline 2 */
  expect_bad_patch(rr, 17, 1);             /* reserved */
  expect_bad_patch(rr, 20, 1);             /* reserved */
  expect_bad_patch(rr, 12, 5);             /* n_objects 5 > n_found 4 */
  expect_bad_patch(rr, 24 + 8, 1);         /* inline object with an offset */
  expect_bad_patch(rr, 24 + 4, 1);         /* object reserved */
  expect_bad_patch(rr, 24 + 40, 0);        /* object 1 key index 2 -> 0: not increasing */
  const sample_t *rs = find_sample(s, n, "prepare_retrieve_reply-shm");
  expect_bad_patch(rs, 0, 0);              /* SHM objects without a transfer (xfer 5 -> 0) */
  expect_bad_patch(rs, 24, 2);             /* key index 2 >= n_found 2 */
  const sample_t *cshm = find_sample(s, n, "commit_store-shm");
  expect_bad_patch(cshm, 16, 3);           /* 3 slots, 2 present */
  expect_bad_patch(cshm, 16, 1);           /* 1 slot, 1 trailing */
  expect_bad_patch(cshm, 24 + 4, 1);       /* slot reserved */
  expect_bad_patch(cshm, 24 + 24, 0);      /* slot key index 2 -> 0: not increasing */
  uint8_t *cs_t = dup_aligned(cshm->buf, cshm->len, 0);
  put64(cs_t + 24 + 8, UINT64_MAX);        /* slot 0 offset + length overflows */
  cr_assert_eq(cshm->dec(cs_t, cshm->len), -EBADMSG);
  free(cs_t);
  expect_bad_patch(cshm, 9, 1);            /* kind on an SHM commit */
  const sample_t *pr = find_sample(s, n, "prepare_retrieve");
  expect_bad_patch(pr, 0, 0);
  expect_bad_patch(pr, 1, 2);              /* unknown flag (bit 0 is AUTO_RELEASE, 4.7) */
  expect_bad_patch(pr, 2, 1);              /* reserved */
  const sample_t *pg = find_sample(s, n, "ping");
  expect_bad_patch(pg, 12, 1);
  const sample_t *csr = find_sample(s, n, "commit_store_reply");
  expect_bad_patch(csr, 8, 9);             /* outcome out of range */
  const sample_t *ex = find_sample(s, n, "export");
  uint8_t *t = dup_aligned(ex->buf, ex->len, 0);
  memset(t, 0xff, 8); /* address UINT64_MAX: address + length overflows */
  cr_assert_eq(ex->dec(t, ex->len), -EBADMSG);
  free(t);
  const sample_t *exr = find_sample(s, n, "export_reply");
  expect_bad_patch(exr, 5, 1);             /* n_fds 257 > 253 */
  free_samples(s, n);
}

T(encoders_refuse_what_decoders_reject) {
  fill_globals();
  size_t len = 4242;
  kvs_proto_hello_t h = {.version_min = 1, .version_max = 1, .role = 1, .max_frame = KVS_PROTO_MIN_MAX_FRAME};
  cr_assert_eq(kvs_proto_hello_encode(&h, NULL, 0, &len), 0);
  kvs_proto_hello_t bad = h;
  memset(bad.group, 'a', sizeof(bad.group)); /* 65 bytes, no NUL */
  cr_assert_eq(kvs_proto_hello_encode(&bad, NULL, 0, &len), -EINVAL);
  bad = h, bad.role = 0;
  cr_assert_eq(kvs_proto_hello_encode(&bad, NULL, 0, &len), -EINVAL);
  bad = h, bad.max_frame = KVS_PROTO_MIN_MAX_FRAME - 1;
  cr_assert_eq(kvs_proto_hello_encode(&bad, NULL, 0, &len), -EINVAL);
  bad = h, bad.flags = KVS_PROTO_HELLO_POOL_FD; /* fd without a segment size */
  cr_assert_eq(kvs_proto_hello_encode(&bad, NULL, 0, &len), -EINVAL);
  bad = h, bad.version_min = 2;
  cr_assert_eq(kvs_proto_hello_encode(&bad, NULL, 0, &len), -EINVAL);

  kvs_proto_error_t e = {.code = 0};
  cr_assert_eq(kvs_proto_error_encode(&e, NULL, 0, &len), -EINVAL);
  e.code = -4096;
  cr_assert_eq(kvs_proto_error_encode(&e, NULL, 0, &len), -EINVAL);
  e.code = -1, e.message_len = 257, e.message = (const char *)g_data;
  cr_assert_eq(kvs_proto_error_encode(&e, NULL, 0, &len), -EINVAL);

  uint8_t oc[2] = {KVS_RES_PRESENT, KVS_RES_RESERVED};
  kvs_proto_slot_t sl = {.key_index = 0, .offset = 0, .length = 1};
  kvs_proto_prepare_store_reply_t r = {.xfer = 1, .n_outcomes = 2, .n_slots = 1, .outcomes = oc, .slots = &sl};
  cr_assert_eq(kvs_proto_prepare_store_reply_encode(&r, NULL, 0, &len), -EINVAL, "slot for a PRESENT key");
  sl.key_index = 1;
  cr_assert_eq(kvs_proto_prepare_store_reply_encode(&r, NULL, 0, &len), 0);
  sl.offset = UINT64_MAX;
  cr_assert_eq(kvs_proto_prepare_store_reply_encode(&r, NULL, 0, &len), -EINVAL, "offset + length overflows");
  sl.offset = 0, r.xfer = 0;
  cr_assert_eq(kvs_proto_prepare_store_reply_encode(&r, NULL, 0, &len), -EINVAL, "slots without a transfer");

  kvs_proto_export_t ex = {.address = UINT64_MAX, .length = 1};
  len = 4242;
  cr_assert_eq(kvs_proto_export_encode(&ex, NULL, 0, &len), -EINVAL);
  cr_assert_eq(len, 4242, "len untouched by failures");
}

T(null_data_leaves_the_bytes_for_the_caller) {
  fill_globals();
  kvs_proto_commit_store_t full = {.is_inline = 1, .layout = layout_n(1), .n_entries = 3,
                                   .entries = g_entries, .data = g_data, .data_len = 40};
  kvs_proto_commit_store_t head = full;
  head.data = NULL;
  size_t lf, lh;
  uint8_t *bf = ENCODE(kvs_proto_commit_store_encode, &full, &lf);
  uint8_t *bh = xalloc(lf + 8);
  memset(bh, 0xEE, lf);
  cr_assert_eq(kvs_proto_commit_store_encode(&head, bh, lf, &lh), 0);
  cr_assert_eq(lh, lf, "*len is always the whole payload");
  cr_assert(memcmp(bh, bf, lf - 40) == 0, "head identical");
  for (size_t i = lf - 40; i < lf; i++) cr_assert_eq(bh[i], 0xEE, "byte %zu written", i);
  memcpy(bh + lf - 40, g_data, 40); /* the caller fills them */
  cr_assert(memcmp(bh, bf, lf) == 0);
  free(bh);
  free(bf);

  kvs_proto_object_t objs[3];
  memcpy(objs, g_robjs, sizeof(objs));
  objs[2].data = NULL;
  kvs_proto_prepare_retrieve_reply_t r = {.n_found = 4, .n_objects = 3, .is_inline = 1, .objects = objs};
  size_t l;
  uint8_t *b = xalloc(512);
  memset(b, 0xEE, 512);
  cr_assert_eq(kvs_proto_prepare_retrieve_reply_encode(&r, b, 512, &l), 0);
  for (size_t i = l - 7; i < l; i++) cr_assert_eq(b[i], 0xEE);
  cr_assert(memcmp(b + l - 17, g_data, 10) == 0);
  free(b);
}

/* ---- reader / writer ------------------------------------------------------------------------- */

T(reader_is_bounded_and_sticky) {
  _Alignas(8) uint8_t buf[16] = {1, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 9, 9};
  kvs_proto_reader_t r;
  kvs_proto_reader_init(&r, buf, sizeof(buf));
  cr_assert_eq(kvs_proto_read_u16(&r), 1);
  cr_assert_eq(kvs_proto_read_u32(&r), 2);
  cr_assert_eq(kvs_proto_read_u64(&r), 3);
  cr_assert_eq(kvs_proto_reader_remaining(&r), 2);
  cr_assert_eq(kvs_proto_reader_end(&r), -EBADMSG, "2 bytes left");
  cr_assert_null(kvs_proto_read_bytes(&r, 3));
  cr_assert_eq(r.err, -EBADMSG);
  cr_assert_eq(r.pos, 14, "a failed read consumes nothing");
  cr_assert_eq(kvs_proto_read_u8(&r), 0, "sticky: later reads return 0");
  cr_assert_eq(r.pos, 14);

  kvs_proto_reader_init(&r, buf, sizeof(buf));
  cr_assert_null(kvs_proto_read_array(&r, UINT64_MAX / 2 + 1, 2), "count * size overflows");
  cr_assert_eq(r.err, -EBADMSG);
  kvs_proto_reader_init(&r, buf, sizeof(buf));
  cr_assert_null(kvs_proto_read_array(&r, 1ull << 62, 16));
  cr_assert_eq(r.err, -EBADMSG);
  kvs_proto_reader_init(&r, buf, sizeof(buf));
  cr_assert_eq(kvs_proto_read_array(&r, 2, 8), buf);
  cr_assert_eq(kvs_proto_reader_end(&r), 0);

  kvs_proto_reader_init(&r, buf, sizeof(buf));
  (void)kvs_proto_read_u8(&r);
  kvs_proto_read_pad(&r, 8); /* bytes 1..7: 0,2,0,0,0,3,0 -> not zero */
  cr_assert_eq(r.err, -EBADMSG);
  _Alignas(8) uint8_t z[8] = {5, 0, 0, 0, 0, 0, 0, 0};
  kvs_proto_reader_init(&r, z, 8);
  (void)kvs_proto_read_u8(&r);
  kvs_proto_read_pad(&r, 8);
  cr_assert_eq(kvs_proto_reader_end(&r), 0);

  kvs_proto_reader_init(&r, NULL, 4);
  cr_assert_eq(kvs_proto_reader_end(&r), -EINVAL);
  kvs_proto_reader_init(&r, buf, 4);
  kvs_proto_reader_fail(&r, -EPROTO);
  kvs_proto_reader_fail(&r, -EBADMSG);
  cr_assert_eq(kvs_proto_reader_end(&r), -EPROTO, "first failure wins");
}

T(writer_counts_and_refuses_overflow) {
  kvs_proto_writer_t w;
  size_t len = 0;
  kvs_proto_writer_init(&w, NULL, 0);
  kvs_proto_write_u8(&w, 1);
  kvs_proto_write_pad(&w, 8);
  kvs_proto_write_u64(&w, 2);
  kvs_proto_write_bytes(&w, NULL, 5);
  cr_assert_eq(kvs_proto_writer_end(&w, &len), 0);
  cr_assert_eq(len, 21);

  uint8_t buf[21];
  memset(buf, 0xEE, sizeof(buf));
  kvs_proto_writer_init(&w, buf, sizeof(buf));
  kvs_proto_write_u8(&w, 1);
  kvs_proto_write_pad(&w, 8);
  kvs_proto_write_u64(&w, 0x0807060504030201ull);
  kvs_proto_write_bytes(&w, NULL, 5);
  cr_assert_eq(kvs_proto_writer_end(&w, &len), 0);
  static const uint8_t want[16] = {1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  cr_assert(memcmp(buf, want, 16) == 0);
  for (unsigned i = 16; i < 21; i++) cr_assert_eq(buf[i], 0xEE, "reserved bytes left unwritten");

  kvs_proto_writer_init(&w, buf, 7);
  kvs_proto_write_u32(&w, 1);
  kvs_proto_write_u32(&w, 2);
  kvs_proto_write_u8(&w, 3);
  len = 99;
  cr_assert_eq(kvs_proto_writer_end(&w, &len), -ENOBUFS);
  cr_assert_eq(len, 99);
  cr_assert_eq(w.len, 4, "sticky after the first failure");
}

/* ---- negotiation ---------------------------------------------------------------------------- */

T(hello_negotiation_helpers) {
  kvs_proto_hello_t a = {.version_min = 1, .version_max = 3}, b = {.version_min = 2, .version_max = 5};
  uint16_t v = 0;
  cr_assert_eq(kvs_proto_negotiate_version(&a, &b, &v), 0);
  cr_assert_eq(v, 3);
  cr_assert_eq(kvs_proto_negotiate_version(&b, &a, &v), 0);
  cr_assert_eq(v, 3);
  b.version_min = 4;
  v = 0;
  cr_assert_eq(kvs_proto_negotiate_version(&a, &b, &v), -EPROTONOSUPPORT);
  cr_assert_eq(v, 0);

  kvs_proto_hello_t c = {.caps = KVS_PROTO_CAP_SHM | KVS_PROTO_CAP_INLINE, .strategy_requested = KVS_PROTO_STRATEGY_AUTO};
  cr_assert_eq(kvs_proto_choose_strategy(KVS_PROTO_STRATEGY_AUTO, &c, true), KVS_PROTO_STRATEGY_SHM);
  cr_assert_eq(kvs_proto_choose_strategy(KVS_PROTO_STRATEGY_SHM, &c, true), KVS_PROTO_STRATEGY_SHM);
  cr_assert_eq(kvs_proto_choose_strategy(KVS_PROTO_STRATEGY_INLINE, &c, true), KVS_PROTO_STRATEGY_INLINE);
  cr_assert_eq(kvs_proto_choose_strategy(KVS_PROTO_STRATEGY_AUTO, &c, false), KVS_PROTO_STRATEGY_INLINE);
  cr_assert_eq(kvs_proto_choose_strategy(KVS_PROTO_STRATEGY_SHM, &c, false), KVS_PROTO_STRATEGY_INLINE,
               "forced SHM that cannot be offered degrades");
  c.strategy_requested = KVS_PROTO_STRATEGY_INLINE;
  cr_assert_eq(kvs_proto_choose_strategy(KVS_PROTO_STRATEGY_SHM, &c, true), KVS_PROTO_STRATEGY_INLINE);
  c.strategy_requested = KVS_PROTO_STRATEGY_SHM;
  c.caps = KVS_PROTO_CAP_INLINE;
  cr_assert_eq(kvs_proto_choose_strategy(KVS_PROTO_STRATEGY_AUTO, &c, true), KVS_PROTO_STRATEGY_INLINE);

  kvs_proto_hello_t req = {.strategy_chosen = KVS_PROTO_STRATEGY_AUTO};
  cr_assert_eq(kvs_proto_hello_check(&req, false), 0);
  cr_assert_eq(kvs_proto_hello_check(&req, true), -EBADMSG, "a reply must choose");
  req.flags = KVS_PROTO_HELLO_POOL_FD;
  cr_assert_eq(kvs_proto_hello_check(&req, false), -EBADMSG, "requests carry no pool fd");
  kvs_proto_hello_t rep = {.strategy_chosen = KVS_PROTO_STRATEGY_INLINE, .flags = KVS_PROTO_HELLO_POOL_FD};
  cr_assert_eq(kvs_proto_hello_check(&rep, true), -EBADMSG, "pool fd only with SHM");
  rep.strategy_chosen = KVS_PROTO_STRATEGY_SHM;
  cr_assert_eq(kvs_proto_hello_check(&rep, true), 0);
}

/* LOOKUP offset 4: remote_wait_ms (docs/protocol.md 4.3): 0 is the first v1 form byte for byte;
 * any other value round-trips. */
T(lookup_remote_wait_round_trips) {
  kvs_key_t keys[2] = {key_n(1), key_n(2)};
  kvs_proto_lookup_t m = {.n_keys = 2, .keys = keys, .remote_wait_ms = 1500}, d;
  size_t len;
  uint8_t *b = ENCODE(kvs_proto_lookup_encode, &m, &len);
  cr_assert_eq(len, 8 + 32);
  uint32_t w;
  memcpy(&w, b + 4, 4);
  cr_assert_eq(w, 1500u);
  cr_assert_eq(kvs_proto_lookup_decode(b, len, &d), 0);
  cr_assert_eq(d.remote_wait_ms, 1500u);
  cr_assert_eq(d.n_keys, 2u);
  free(b);
  m.remote_wait_ms = 0;
  b = ENCODE(kvs_proto_lookup_encode, &m, &len);
  memcpy(&w, b + 4, 4);
  cr_assert_eq(w, 0u, "a client without a remote peer sends what v1 always sent");
  free(b);
}
