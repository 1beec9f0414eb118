/* kvshim proto: see proto.h and docs/protocol.md (offsets of every field).
 *
 * Every decoder has the same shape: a reader over the payload, field reads that fail
 * stickily, rule checks that call kvs_proto_reader_fail, kvs_proto_reader_end (which also
 * rejects trailing bytes), and only then a copy into *out. Every encoder checks the rules its
 * decoder enforces before writing (the *_ok helpers are shared by both sides). */
#include "proto.h"

#include <errno.h>
#include <string.h>

#include "internal.h"
#include "options.h"

/* ---- ABI checks ------------------------------------------------------------------------------ */

_Static_assert(sizeof(kvs_key_t) == 16 && offsetof(kvs_key_t, lo) == 0 &&
                   offsetof(kvs_key_t, hi) == 8,
               "kvs_key_t is read in place: lo u64 then hi u64");
_Static_assert(sizeof(kvs_proto_entry_t) == 24 && offsetof(kvs_proto_entry_t, length) == 16,
               "chunk table entry is read in place");
_Static_assert(sizeof(kvs_proto_slot_t) == 24 && offsetof(kvs_proto_slot_t, offset) == 8 &&
                   offsetof(kvs_proto_slot_t, length) == 16,
               "slot is read in place");
_Static_assert(KVS_PROTO_STRATEGY_AUTO == KVS_STRATEGY_AUTO &&
                   KVS_PROTO_STRATEGY_SHM == KVS_STRATEGY_SHM &&
                   KVS_PROTO_STRATEGY_INLINE == KVS_STRATEGY_INLINE,
               "wire strategies are KVSHIM_STRATEGY's values");
_Static_assert(KVS_RES_RESERVED == 0 && KVS_RES_BAD_LAYOUT == 5, "outcomes are wire values");
_Static_assert(KVS_LAYOUT_MAX_DIMS == 8, "the wire allows ndim <= 8");
_Static_assert(KVS_PROTO_MAX_KEYS <= UINT32_MAX / 4, "counts fit u32 with room");

#define KVS__PROTO_ERR_CHECK(name, val, desc)                                                 \
  _Static_assert((val) == -name, "wire error " #name " must equal -" #name " of <errno.h>");
KVS_PROTO_ERRORS(KVS__PROTO_ERR_CHECK)
#undef KVS__PROTO_ERR_CHECK

#define OUTCOME_MAX ((uint8_t)KVS_RES_SKIPPED)
#define ERRNO_MAX 4095

/* ---- names ------------------------------------------------------------------------------------ */

const char *kvs_proto_opcode_name(unsigned opcode) {
  switch (opcode) {
#define KVS__PROTO_OP_NAME(name, num, str)                                                    \
  case num: return str;
    KVS_PROTO_OPCODES(KVS__PROTO_OP_NAME)
#undef KVS__PROTO_OP_NAME
    default: return NULL;
  }
}

bool kvs_proto_opcode_valid(unsigned opcode) { return kvs_proto_opcode_name(opcode) != NULL; }

const char *kvs_proto_error_name(int code) {
  switch (code) {
#define KVS__PROTO_ERR_NAME(name, val, desc)                                                  \
  case val: return #name;
    KVS_PROTO_ERRORS(KVS__PROTO_ERR_NAME)
#undef KVS__PROTO_ERR_NAME
    case -ENODATA: return "ENODATA";
    default: return NULL;
  }
}

const char *kvs_proto_strerror(int code) {
  switch (code) {
#define KVS__PROTO_ERR_DESC(name, val, desc)                                                  \
  case val: return desc;
    KVS_PROTO_ERRORS(KVS__PROTO_ERR_DESC)
#undef KVS__PROTO_ERR_DESC
    case -ENODATA: return "incomplete frame header (read more)";
    default: return "unknown error";
  }
}

/* ---- little-endian loads and stores (the host is little-endian: proto.h) ---------------------- */

static inline uint16_t ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void st16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* ---- frame header ----------------------------------------------------------------------------- */

void kvs_proto_header_encode(const kvs_proto_header_t *h, uint8_t out[KVS_PROTO_HEADER_SIZE]) {
  st32(out + 0, h->magic);
  st16(out + 4, h->version);
  st16(out + 6, h->opcode);
  st32(out + 8, h->flags);
  st64(out + 12, h->request_id);
  st32(out + 20, h->length);
}

int kvs_proto_header_parse(const void *buf, size_t len, kvs_proto_header_t *out) {
  if (len < KVS_PROTO_HEADER_SIZE) return -ENODATA;
  if (!buf) return -EINVAL;
  const uint8_t *p = buf;
  kvs_proto_header_t h = {
      .magic = ld32(p + 0),
      .version = ld16(p + 4),
      .opcode = ld16(p + 6),
      .flags = ld32(p + 8),
      .request_id = ld64(p + 12),
      .length = ld32(p + 20),
  };
  *out = h;
  return 0;
}

int kvs_proto_header_validate(const kvs_proto_header_t *h, uint32_t max_frame) {
  if (h->magic != KVS_PROTO_MAGIC) return -EBADMSG;
  if (h->version < KVS_PROTO_VERSION_MIN || h->version > KVS_PROTO_VERSION_MAX)
    return -EPROTONOSUPPORT;
  if (!kvs_proto_opcode_valid(h->opcode)) return -EOPNOTSUPP;
  if (h->flags & ~KVS_PROTO_F_ALL) return -EBADMSG;
  bool reply = h->flags & KVS_PROTO_F_REPLY;
  if (h->opcode == KVS_OP_ERROR && !reply) return -EBADMSG;
  if ((h->opcode == KVS_OP_ERROR || h->opcode == KVS_OP_HELLO) && (h->flags & KVS_PROTO_F_MORE))
    return -EBADMSG;
  if (!reply && h->request_id == 0) return -EBADMSG;
  if (max_frame == 0) max_frame = KVS_PROTO_MIN_MAX_FRAME;
  if (h->length > max_frame) return -EMSGSIZE;
  return 0;
}

int kvs_proto_header_decode(const void *buf, size_t len, uint32_t max_frame,
                            kvs_proto_header_t *out) {
  kvs_proto_header_t h;
  KVS_TRY(kvs_proto_header_parse(buf, len, &h));
  KVS_TRY(kvs_proto_header_validate(&h, max_frame));
  *out = h;
  return 0;
}

int kvs_proto_frame_header(uint16_t opcode, uint32_t flags, uint64_t request_id,
                           uint64_t total, uint64_t offset, uint32_t max_frame,
                           kvs_proto_header_t *out) {
  if (max_frame == 0 || (flags & ~KVS_PROTO_F_REPLY)) return -EINVAL;
  if (offset > total || (offset == total && total != 0)) return -EINVAL;
  uint64_t left = total - offset;
  uint32_t n = left > max_frame ? max_frame : (uint32_t)left;
  bool more = left > max_frame;
  if (more && (opcode == KVS_OP_HELLO || opcode == KVS_OP_ERROR)) return -EMSGSIZE;
  kvs_proto_header_t h = {
      .magic = KVS_PROTO_MAGIC,
      .version = KVS_PROTO_VERSION,
      .opcode = opcode,
      .flags = flags | (more ? KVS_PROTO_F_MORE : 0),
      .request_id = request_id,
      .length = n,
  };
  *out = h;
  return 0;
}

int kvs_proto_frame_continues(const kvs_proto_header_t *first, const kvs_proto_header_t *next) {
  if (next->opcode != first->opcode || next->request_id != first->request_id ||
      ((next->flags ^ first->flags) & KVS_PROTO_F_REPLY))
    return -EPROTO;
  return 0;
}

int kvs_proto_reply_matches(const kvs_proto_header_t *request, const kvs_proto_header_t *reply) {
  if (!(reply->flags & KVS_PROTO_F_REPLY) || reply->request_id != request->request_id)
    return -EPROTO;
  if (reply->opcode != request->opcode && reply->opcode != KVS_OP_ERROR) return -EPROTO;
  return 0;
}

/* ---- reader ----------------------------------------------------------------------------------- */

void kvs_proto_reader_init(kvs_proto_reader_t *r, const void *buf, size_t len) {
  r->buf = buf;
  r->len = buf ? len : 0;
  r->pos = 0;
  r->err = (!buf && len) ? -EINVAL : 0;
}

void kvs_proto_reader_fail(kvs_proto_reader_t *r, int err) {
  if (!r->err) r->err = err;
}

size_t kvs_proto_reader_remaining(const kvs_proto_reader_t *r) { return r->len - r->pos; }

/* The next n bytes, or NULL with the sticky error set. n == 0 gives the cursor (NULL for an
 * empty NULL buffer), never an error. */
static const uint8_t *take(kvs_proto_reader_t *r, size_t n) {
  if (r->err) return NULL;
  if (n > r->len - r->pos) {
    r->err = -EBADMSG;
    return NULL;
  }
  if (!r->buf) return NULL;
  const uint8_t *p = r->buf + r->pos;
  r->pos += n;
  return p;
}

uint8_t kvs_proto_read_u8(kvs_proto_reader_t *r) {
  const uint8_t *p = take(r, 1);
  return p ? p[0] : 0;
}
uint16_t kvs_proto_read_u16(kvs_proto_reader_t *r) {
  const uint8_t *p = take(r, 2);
  return p ? ld16(p) : 0;
}
uint32_t kvs_proto_read_u32(kvs_proto_reader_t *r) {
  const uint8_t *p = take(r, 4);
  return p ? ld32(p) : 0;
}
uint64_t kvs_proto_read_u64(kvs_proto_reader_t *r) {
  const uint8_t *p = take(r, 8);
  return p ? ld64(p) : 0;
}

const void *kvs_proto_read_bytes(kvs_proto_reader_t *r, size_t n) { return take(r, n); }

const void *kvs_proto_read_array(kvs_proto_reader_t *r, uint64_t count, size_t elem_size) {
  uint64_t bytes;
  if (__builtin_mul_overflow(count, (uint64_t)elem_size, &bytes) || bytes > SIZE_MAX) {
    kvs_proto_reader_fail(r, -EBADMSG);
    return NULL;
  }
  return take(r, (size_t)bytes);
}

void kvs_proto_read_pad(kvs_proto_reader_t *r, size_t align) {
  size_t n = KVS__ALIGN_UP(r->pos, align) - r->pos;
  const uint8_t *p = take(r, n);
  for (size_t i = 0; p && i < n; i++)
    if (p[i]) kvs_proto_reader_fail(r, -EBADMSG);
}

int kvs_proto_reader_end(const kvs_proto_reader_t *r) {
  if (r->err) return r->err;
  return r->pos == r->len ? 0 : -EBADMSG;
}

/* Reserved fields: read and require zero. */
static void zero8(kvs_proto_reader_t *r) { if (kvs_proto_read_u8(r)) kvs_proto_reader_fail(r, -EBADMSG); }
static void zero16(kvs_proto_reader_t *r) { if (kvs_proto_read_u16(r)) kvs_proto_reader_fail(r, -EBADMSG); }
static void zero32(kvs_proto_reader_t *r) { if (kvs_proto_read_u32(r)) kvs_proto_reader_fail(r, -EBADMSG); }
static void require(kvs_proto_reader_t *r, bool ok) { if (!ok) kvs_proto_reader_fail(r, -EBADMSG); }

/* ---- writer ----------------------------------------------------------------------------------- */

void kvs_proto_writer_init(kvs_proto_writer_t *w, void *buf, size_t cap) {
  w->buf = buf;
  w->cap = buf ? cap : 0;
  w->len = 0;
  w->err = 0;
}

/* Room for n more bytes: a pointer to them, or NULL when counting only or on error. */
static uint8_t *put(kvs_proto_writer_t *w, size_t n) {
  if (w->err) return NULL;
  if (n > SIZE_MAX - w->len) {
    w->err = -EINVAL;
    return NULL;
  }
  if (!w->buf) {
    w->len += n;
    return NULL;
  }
  if (n > w->cap - w->len) {
    w->err = -ENOBUFS;
    return NULL;
  }
  uint8_t *p = w->buf + w->len;
  w->len += n;
  return p;
}

void kvs_proto_write_u8(kvs_proto_writer_t *w, uint8_t v) {
  uint8_t *p = put(w, 1);
  if (p) p[0] = v;
}
void kvs_proto_write_u16(kvs_proto_writer_t *w, uint16_t v) {
  uint8_t *p = put(w, 2);
  if (p) st16(p, v);
}
void kvs_proto_write_u32(kvs_proto_writer_t *w, uint32_t v) {
  uint8_t *p = put(w, 4);
  if (p) st32(p, v);
}
void kvs_proto_write_u64(kvs_proto_writer_t *w, uint64_t v) {
  uint8_t *p = put(w, 8);
  if (p) st64(p, v);
}
void kvs_proto_write_bytes(kvs_proto_writer_t *w, const void *src, size_t n) {
  uint8_t *p = put(w, n);
  if (p && src && n) memcpy(p, src, n);
}
void kvs_proto_write_pad(kvs_proto_writer_t *w, size_t align) {
  size_t n = KVS__ALIGN_UP(w->len, align) - w->len;
  uint8_t *p = put(w, n);
  if (p && n) memset(p, 0, n);
}

int kvs_proto_writer_end(const kvs_proto_writer_t *w, size_t *len) {
  if (w->err) return w->err;
  *len = w->len;
  return 0;
}

/* ---- shared pieces ---------------------------------------------------------------------------- */

/* Decoders return typed pointers into the payload: it must be 8-byte aligned. */
static int payload_ok(const void *p, size_t len) {
  if (!p) return len ? -EINVAL : 0;
  return ((uintptr_t)p & 7u) ? -EINVAL : 0;
}

static bool strategy_explicit(uint8_t s) {
  return s == KVS_PROTO_STRATEGY_SHM || s == KVS_PROTO_STRATEGY_INLINE;
}
static bool keys_count_ok(uint32_t n) { return n >= 1 && n <= KVS_PROTO_MAX_KEYS; }

static bool outcomes_ok(const uint8_t *o, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    if (o[i] > OUTCOME_MAX) return false;
  return true;
}

/* Layout: dtype u32, ndim u32, shape u64[ndim]; ndim <= 8. Unused dims are zero after read. */
static void read_layout(kvs_proto_reader_t *r, kvs_layout_t *l) {
  memset(l, 0, sizeof(*l));
  l->dtype = kvs_proto_read_u32(r);
  l->ndim = kvs_proto_read_u32(r);
  if (l->ndim > KVS_LAYOUT_MAX_DIMS) {
    kvs_proto_reader_fail(r, -EBADMSG);
    l->ndim = 0;
    return;
  }
  for (uint32_t i = 0; i < l->ndim; i++) l->shape[i] = kvs_proto_read_u64(r);
}
static void write_layout(kvs_proto_writer_t *w, const kvs_layout_t *l) {
  kvs_proto_write_u32(w, l->dtype);
  kvs_proto_write_u32(w, l->ndim);
  for (uint32_t i = 0; i < l->ndim; i++) kvs_proto_write_u64(w, l->shape[i]);
}

/* Finish an encoder: rule violations were checked before writing. */
static int finish(const kvs_proto_writer_t *w, size_t *len) { return kvs_proto_writer_end(w, len); }

/* Open a decoder: the payload checked (payload_ok), *r over it, the message *m (size bytes)
 * zeroed. */
static int decode_open(kvs_proto_reader_t *r, const void *p, size_t len, void *m, size_t size) {
  KVS_TRY(payload_ok(p, len));
  kvs_proto_reader_init(r, p, len);
  memset(m, 0, size);
  return 0;
}

/* One field of a field list (proto.h KVS_PROTO_FIELDS_<payload>, KVS_PROTO_HEAD_<payload>):
 * KVS__PUT writes m->field with writer w, KVS__GET reads m.field with reader r. */
#define KVS__PUT(kind, field, count) KVS__PUT_##kind(field, count)
#define KVS__PUT_U8(field, count) kvs_proto_write_u8(&w, m->field);
#define KVS__PUT_U16(field, count) kvs_proto_write_u16(&w, m->field);
#define KVS__PUT_U32(field, count) kvs_proto_write_u32(&w, (uint32_t)m->field);
#define KVS__PUT_U64(field, count) kvs_proto_write_u64(&w, m->field);
#define KVS__PUT_ZERO8(field, count) kvs_proto_write_u8(&w, 0);
#define KVS__PUT_ZERO16(field, count) kvs_proto_write_u16(&w, 0);
#define KVS__PUT_ZERO32(field, count) kvs_proto_write_u32(&w, 0);
#define KVS__PUT_PAD8(field, count) kvs_proto_write_pad(&w, 8);
#define KVS__PUT_LAYOUT(field, count) write_layout(&w, &m->field);
#define KVS__PUT_ARRAY(field, count)                                                          \
  kvs_proto_write_bytes(&w, m->field, (size_t)m->count * sizeof *m->field);

#define KVS__GET(kind, field, count) KVS__GET_##kind(field, count)
#define KVS__GET_U8(field, count) m.field = kvs_proto_read_u8(&r);
#define KVS__GET_U16(field, count) m.field = kvs_proto_read_u16(&r);
#define KVS__GET_U32(field, count) m.field = kvs_proto_read_u32(&r);
#define KVS__GET_U64(field, count) m.field = kvs_proto_read_u64(&r);
#define KVS__GET_ZERO8(field, count) zero8(&r);
#define KVS__GET_ZERO16(field, count) zero16(&r);
#define KVS__GET_ZERO32(field, count) zero32(&r);
#define KVS__GET_PAD8(field, count) kvs_proto_read_pad(&r, 8);
#define KVS__GET_LAYOUT(field, count) read_layout(&r, &m.field);
#define KVS__GET_ARRAY(field, count) m.field = kvs_proto_read_array(&r, m.count, sizeof *m.field);

/* The opening of a hand-written codec (messages with a variable part): the writer w over
 * (buf, cap), or the reader r over (p, len) with the message m zeroed, then the message's
 * fixed head (its KVS_PROTO_HEAD_ row list) written or read. */
#define KVS__ENCODE_HEAD(msg)                                                                 \
  kvs_proto_writer_t w;                                                                       \
  kvs_proto_writer_init(&w, buf, cap);                                                        \
  KVS_PROTO_HEAD_##msg(KVS__PUT)
#define KVS__DECODE_HEAD(msg)                                                                 \
  kvs_proto_reader_t r;                                                                       \
  kvs_proto_##msg##_t m;                                                                      \
  KVS_TRY(decode_open(&r, p, len, &m, sizeof m));                                             \
  KVS_PROTO_HEAD_##msg(KVS__GET)

/* ---- HELLO ------------------------------------------------------------------------------------ */

static bool hello_ok(const kvs_proto_hello_t *m, size_t group_len) {
  return m->version_min >= 1 && m->version_min <= m->version_max && m->role >= 1 &&
         m->role <= KVS_PROTO_ROLE_TOOL && m->strategy_requested <= KVS_PROTO_STRATEGY_INLINE &&
         m->strategy_chosen <= KVS_PROTO_STRATEGY_INLINE &&
         !(m->flags & ~KVS_PROTO_HELLO_F_ALL) &&
         (!(m->flags & KVS_PROTO_HELLO_POOL_FD) || m->pool_segment_size > 0) &&
         m->max_frame >= KVS_PROTO_MIN_MAX_FRAME && m->max_frame <= KVS_PROTO_MAX_MAX_FRAME &&
         group_len <= KVS_PROTO_MAX_GROUP && (m->max_message == 0 || m->max_message >= m->max_frame);
}

int kvs_proto_hello_encode(const kvs_proto_hello_t *m, void *buf, size_t cap, size_t *len) {
  size_t glen = strnlen(m->group, sizeof(m->group));
  if (!hello_ok(m, glen)) return -EINVAL;
  KVS__ENCODE_HEAD(hello)
  kvs_proto_write_u16(&w, (uint16_t)glen);
  kvs_proto_write_u16(&w, 0);
  kvs_proto_write_bytes(&w, m->group, glen);
  if (m->max_message) { /* the version-1 addition: padding to 8, then max_message */
    kvs_proto_write_pad(&w, 8);
    kvs_proto_write_u64(&w, m->max_message);
  }
  return finish(&w, len);
}

int kvs_proto_hello_decode(const void *p, size_t len, kvs_proto_hello_t *out) {
  KVS__DECODE_HEAD(hello)
  uint16_t glen = kvs_proto_read_u16(&r);
  zero16(&r);
  require(&r, glen <= KVS_PROTO_MAX_GROUP);
  const uint8_t *g = kvs_proto_read_bytes(&r, r.err ? 0 : glen);
  if (!r.err && kvs_proto_reader_remaining(&r)) { /* max_message follows */
    kvs_proto_read_pad(&r, 8);
    m.max_message = kvs_proto_read_u64(&r);
    require(&r, m.max_message != 0);
  }
  KVS_TRY(kvs_proto_reader_end(&r));
  if (!hello_ok(&m, glen) || (glen && memchr(g, 0, glen))) return -EBADMSG;
  if (glen) memcpy(m.group, g, glen);
  *out = m;
  return 0;
}

int kvs_proto_hello_check(const kvs_proto_hello_t *m, bool reply) {
  if (!reply)
    return (m->strategy_chosen == KVS_PROTO_STRATEGY_AUTO &&
            !(m->flags & KVS_PROTO_HELLO_POOL_FD) && m->max_message == 0) ? 0 : -EBADMSG;
  if (!strategy_explicit(m->strategy_chosen)) return -EBADMSG;
  if ((m->flags & KVS_PROTO_HELLO_POOL_FD) && m->strategy_chosen != KVS_PROTO_STRATEGY_SHM)
    return -EBADMSG;
  return 0;
}

int kvs_proto_negotiate_version(const kvs_proto_hello_t *a, const kvs_proto_hello_t *b,
                                uint16_t *out) {
  uint16_t hi = a->version_max < b->version_max ? a->version_max : b->version_max;
  uint16_t lo = a->version_min > b->version_min ? a->version_min : b->version_min;
  if (hi < lo || hi == 0) return -EPROTONOSUPPORT;
  *out = hi;
  return 0;
}

uint8_t kvs_proto_choose_strategy(uint8_t local, const kvs_proto_hello_t *client,
                                  bool can_offer_shm) {
  if (local == KVS_PROTO_STRATEGY_INLINE || client->strategy_requested == KVS_PROTO_STRATEGY_INLINE)
    return KVS_PROTO_STRATEGY_INLINE;
  if (!can_offer_shm || !(client->caps & KVS_PROTO_CAP_SHM)) return KVS_PROTO_STRATEGY_INLINE;
  return KVS_PROTO_STRATEGY_SHM;
}

/* ---- ERROR ------------------------------------------------------------------------------------ */

static bool error_code_ok(int64_t code) { return code < 0 && code >= -ERRNO_MAX; }

static bool error_ok(const kvs_proto_error_t *m) {
  return error_code_ok(m->code) && m->message_len <= KVS_PROTO_MAX_ERROR_MSG &&
         (m->message_len == 0 || m->message);
}

void kvs_proto_error_init(kvs_proto_error_t *m, int code, const char *msg) {
  if (!error_code_ok(code)) code = -EIO;
  if (!msg) msg = kvs_proto_strerror(code);
  m->code = code;
  m->message = msg;
  m->message_len = (uint16_t)strnlen(msg, KVS_PROTO_MAX_ERROR_MSG);
}

/* ---- key lists (LOOKUP, PREPARE_RETRIEVE) ------------------------------------------------------ */

static bool lookup_ok(const kvs_proto_lookup_t *m) { return keys_count_ok(m->n_keys) && m->keys; }
static bool lookup_reply_ok(const kvs_proto_lookup_reply_t *m) {
  return m->found <= KVS_PROTO_MAX_KEYS;
}
static bool prepare_retrieve_ok(const kvs_proto_prepare_retrieve_t *m) {
  return strategy_explicit(m->strategy) && keys_count_ok(m->n_keys) && m->keys &&
         !(m->flags & ~KVS_PROTO_RETRIEVE_F_ALL);
}

/* ---- PREPARE_STORE ------------------------------------------------------------------------------ */

static bool mode_ok(uint32_t mode) { return !(mode & ~(uint32_t)KVS_PROTO_MODE_ALL); }
static bool kind_ok(uint8_t kind) { return kind <= KVS_PROTO_KIND_OBJECT; }

static bool prepare_store_ok(const kvs_proto_prepare_store_t *m) {
  return strategy_explicit(m->strategy) && kind_ok(m->kind) && mode_ok(m->mode) &&
         m->layout.ndim <= KVS_LAYOUT_MAX_DIMS && keys_count_ok(m->n_keys) && m->keys;
}

/* A slot list: key_index strictly increasing, reserved 0, offset + length does not overflow. */
static bool slot_list_ok(const kvs_proto_slot_t *s, uint32_t n_slots) {
  for (uint32_t i = 0; i < n_slots; i++) {
    uint64_t end;
    if (s[i].reserved != 0 || (i > 0 && s[i].key_index <= s[i - 1].key_index) ||
        __builtin_add_overflow(s[i].offset, s[i].length, &end))
      return false;
  }
  return true;
}

/* In a PREPARE_STORE reply, also: key_index < n_outcomes and naming a RESERVED outcome. */
static bool slots_ok(const kvs_proto_slot_t *s, uint32_t n_slots, const uint8_t *outcomes,
                     uint32_t n_outcomes) {
  if (!slot_list_ok(s, n_slots)) return false;
  for (uint32_t i = 0; i < n_slots; i++)
    if (s[i].key_index >= n_outcomes || outcomes[s[i].key_index] != KVS_RES_RESERVED) return false;
  return true;
}

static void write_slots(kvs_proto_writer_t *w, const kvs_proto_slot_t *s, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    kvs_proto_write_u32(w, s[i].key_index);
    kvs_proto_write_u32(w, 0);
    kvs_proto_write_u64(w, s[i].offset);
    kvs_proto_write_u64(w, s[i].length);
  }
}

static bool prepare_store_reply_ok(const kvs_proto_prepare_store_reply_t *m) {
  return m->n_outcomes <= KVS_PROTO_MAX_KEYS && m->n_slots <= m->n_outcomes &&
         (m->n_slots == 0 || m->xfer != 0) && (m->n_outcomes == 0 || m->outcomes) &&
         (m->n_slots == 0 || m->slots) && outcomes_ok(m->outcomes, m->n_outcomes) &&
         slots_ok(m->slots, m->n_slots, m->outcomes, m->n_outcomes);
}

/* ---- COMMIT_STORE ------------------------------------------------------------------------------- */

/* Inline table: OBJECT aliases carry no bytes; *sum = total bytes without overflow. */
static bool entries_ok(const kvs_proto_entry_t *e, uint32_t n, uint8_t kind, uint64_t *sum) {
  uint64_t s = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (kind == KVS_PROTO_KIND_OBJECT && i > 0 && e[i].length != 0) return false;
    if (__builtin_add_overflow(s, e[i].length, &s)) return false;
  }
  *sum = s;
  return true;
}

static bool commit_store_head_ok(const kvs_proto_commit_store_t *m) {
  if (m->is_inline > 1) return false;
  if (!m->is_inline)
    return m->kind == 0 && m->mode == 0 && m->n_entries == 0 && m->n_slots <= KVS_PROTO_MAX_KEYS;
  return kind_ok(m->kind) && mode_ok(m->mode) && keys_count_ok(m->n_entries) && m->n_slots == 0;
}

int kvs_proto_commit_store_encode(const kvs_proto_commit_store_t *m, void *buf, size_t cap,
                                  size_t *len) {
  uint64_t sum = 0;
  if (!commit_store_head_ok(m)) return -EINVAL;
  if (m->is_inline) {
    if (m->layout.ndim > KVS_LAYOUT_MAX_DIMS || !m->entries ||
        !entries_ok(m->entries, m->n_entries, m->kind, &sum) || sum != m->data_len ||
        sum > SIZE_MAX)
      return -EINVAL;
  } else if (m->data_len != 0 || (m->n_slots && !m->slots) ||
             !slot_list_ok(m->slots, m->n_slots)) {
    return -EINVAL;
  }
  KVS__ENCODE_HEAD(commit_store)
  kvs_proto_write_u32(&w, m->is_inline ? m->n_entries : m->n_slots);
  kvs_proto_write_u32(&w, 0);
  if (m->is_inline) {
    write_layout(&w, &m->layout);
    kvs_proto_write_bytes(&w, m->entries, (size_t)m->n_entries * sizeof(kvs_proto_entry_t));
    kvs_proto_write_bytes(&w, m->data, (size_t)m->data_len);
  } else {
    write_slots(&w, m->slots, m->n_slots);
  }
  return finish(&w, len);
}

int kvs_proto_commit_store_decode(const void *p, size_t len, kvs_proto_commit_store_t *out) {
  KVS__DECODE_HEAD(commit_store)
  uint32_t count = kvs_proto_read_u32(&r); /* entries (inline) or slots (SHM) */
  zero32(&r);
  if (m.is_inline) m.n_entries = count;
  else m.n_slots = count;
  require(&r, commit_store_head_ok(&m));
  if (!m.is_inline && !r.err) {
    m.slots = kvs_proto_read_array(&r, m.n_slots, sizeof(kvs_proto_slot_t));
    require(&r, r.err || slot_list_ok(m.slots, m.n_slots));
  }
  if (m.is_inline && !r.err) {
    read_layout(&r, &m.layout);
    m.entries = kvs_proto_read_array(&r, m.n_entries, sizeof(kvs_proto_entry_t));
    uint64_t sum = 0;
    if (!r.err && !entries_ok(m.entries, m.n_entries, m.kind, &sum)) kvs_proto_reader_fail(&r, -EBADMSG);
    /* The table must describe exactly the bytes that remain: no more, no fewer. */
    require(&r, sum == kvs_proto_reader_remaining(&r));
    m.data_len = sum;
    m.data = kvs_proto_read_bytes(&r, r.err ? 0 : (size_t)sum);
  }
  KVS_TRY(kvs_proto_reader_end(&r));
  if (!m.data_len) m.data = NULL;
  if (!m.n_slots) m.slots = NULL;
  *out = m;
  return 0;
}

static bool commit_store_reply_ok(const kvs_proto_commit_store_reply_t *m) {
  return m->committed <= KVS_PROTO_MAX_KEYS && m->n_outcomes <= KVS_PROTO_MAX_KEYS &&
         (m->n_outcomes == 0 || m->outcomes) && outcomes_ok(m->outcomes, m->n_outcomes);
}

/* ---- ABORT / COMMIT_RETRIEVE / empty ------------------------------------------------------------ */

static bool xfer_ok(const kvs_proto_xfer_t *m) {
  (void)m; /* any transfer id is well formed */
  return true;
}

int kvs_proto_empty_decode(const void *p, size_t len) {
  KVS_TRY(payload_ok(p, len));
  return len == 0 ? 0 : -EBADMSG;
}

/* ---- PREPARE_RETRIEVE reply --------------------------------------------------------------------- */

static bool retrieve_reply_head_ok(uint64_t xfer, uint32_t n_found, uint32_t n_objects,
                                   uint8_t is_inline) {
  return n_found <= KVS_PROTO_MAX_KEYS && n_objects <= n_found && is_inline <= 1 &&
         (is_inline ? xfer == 0 : (n_objects == 0 || xfer != 0));
}

/* One object record against the previous key index (-1 for the first). */
static bool object_ok(const kvs_proto_object_t *o, int64_t prev_index, uint32_t n_found,
                      uint8_t is_inline) {
  uint64_t end;
  return (int64_t)o->key_index > prev_index && o->key_index < n_found &&
         o->layout.ndim <= KVS_LAYOUT_MAX_DIMS && (!is_inline || o->offset == 0) &&
         !__builtin_add_overflow(o->offset, o->length, &end);
}

int kvs_proto_prepare_retrieve_reply_encode(const kvs_proto_prepare_retrieve_reply_t *m,
                                            void *buf, size_t cap, size_t *len) {
  if (!retrieve_reply_head_ok(m->xfer, m->n_found, m->n_objects, m->is_inline) ||
      (m->n_objects && !m->objects) || (m->pin_ms && !m->xfer))
    return -EINVAL;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < m->n_objects; i++) {
    const kvs_proto_object_t *o = &m->objects[i];
    if (!object_ok(o, i ? (int64_t)m->objects[i - 1].key_index : -1, m->n_found, m->is_inline))
      return -EINVAL;
    if (m->is_inline && __builtin_add_overflow(sum, o->length, &sum)) return -EINVAL;
  }
  if (sum > SIZE_MAX) return -EINVAL;
  KVS__ENCODE_HEAD(prepare_retrieve_reply)
  for (uint32_t i = 0; i < m->n_objects; i++) {
    const kvs_proto_object_t *o = &m->objects[i];
    kvs_proto_write_u32(&w, o->key_index);
    kvs_proto_write_u32(&w, 0);
    kvs_proto_write_u64(&w, o->offset);
    kvs_proto_write_u64(&w, o->length);
    write_layout(&w, &o->layout);
  }
  if (m->is_inline)
    for (uint32_t i = 0; i < m->n_objects; i++)
      kvs_proto_write_bytes(&w, m->objects[i].data, (size_t)m->objects[i].length);
  return finish(&w, len);
}

/* Walk the object table; with objs, fill it (only called again after a clean first pass). */
static void read_objects(kvs_proto_reader_t *r, uint32_t n, uint32_t n_found, uint8_t is_inline,
                         kvs_proto_object_t *objs, uint64_t *sum) {
  int64_t prev = -1;
  uint64_t s = 0;
  for (uint32_t i = 0; i < n && !r->err; i++) {
    kvs_proto_object_t o;
    o.key_index = kvs_proto_read_u32(r);
    zero32(r);
    o.offset = kvs_proto_read_u64(r);
    o.length = kvs_proto_read_u64(r);
    read_layout(r, &o.layout);
    o.data = NULL;
    if (r->err) break;
    if (!object_ok(&o, prev, n_found, is_inline) ||
        (is_inline && __builtin_add_overflow(s, o.length, &s))) {
      kvs_proto_reader_fail(r, -EBADMSG);
      break;
    }
    prev = o.key_index;
    if (objs) objs[i] = o;
  }
  *sum = s;
}

/* The whole reply (with_data), or its head and table alone (the inline bytes elsewhere). */
static int decode_retrieve_reply(const void *p, size_t len, kvs_proto_object_t *objects,
                                 size_t cap, kvs_proto_prepare_retrieve_reply_t *out,
                                 bool with_data) {
  KVS__DECODE_HEAD(prepare_retrieve_reply)
  require(&r, retrieve_reply_head_ok(m.xfer, m.n_found, m.n_objects, m.is_inline) &&
                  (m.pin_ms == 0 || m.xfer != 0));
  size_t table = r.pos;
  uint64_t sum = 0;
  read_objects(&r, m.n_objects, m.n_found, m.is_inline, NULL, &sum);
  if (m.is_inline && with_data) require(&r, sum == kvs_proto_reader_remaining(&r));
  const uint8_t *data = with_data ? kvs_proto_read_bytes(&r, r.err ? 0 : (size_t)sum) : NULL;
  KVS_TRY(kvs_proto_reader_end(&r));
  if (m.n_objects > cap || (m.n_objects && !objects)) return -ENOBUFS;
  /* Second pass over the validated table, filling the caller's array. */
  r.pos = table;
  read_objects(&r, m.n_objects, m.n_found, m.is_inline, objects, &sum);
  if (m.is_inline) {
    uint64_t at = 0;
    for (uint32_t i = 0; i < m.n_objects && data; i++) {
      objects[i].data = objects[i].length ? data + at : NULL;
      at += objects[i].length;
    }
    m.data = sum ? data : NULL;
    m.data_len = sum;
  }
  m.objects = objects;
  *out = m;
  return 0;
}

int kvs_proto_prepare_retrieve_reply_decode(const void *p, size_t len,
                                            kvs_proto_object_t *objects, size_t cap,
                                            kvs_proto_prepare_retrieve_reply_t *out) {
  return decode_retrieve_reply(p, len, objects, cap, out, true);
}

int kvs_proto_prepare_retrieve_reply_decode_table(const void *p, size_t len,
                                                  kvs_proto_object_t *objects, size_t cap,
                                                  kvs_proto_prepare_retrieve_reply_t *out) {
  return decode_retrieve_reply(p, len, objects, cap, out, false);
}

/* ---- STATS -------------------------------------------------------------------------------------- */

static bool stats_ok(const kvs_proto_stats_t *m) { return m->format <= KVS_PROTO_STATS_JSON; }
static bool text_ok(const kvs_proto_text_t *m) { return m->len == 0 || m->text; }

/* ---- PING --------------------------------------------------------------------------------------- */

static bool ping_ok(const kvs_proto_ping_t *m) { return m->echo_len == 0 || m->echo; }

/* ---- EXPORT_TENSORS ----------------------------------------------------------------------------- */

static bool export_ok(const kvs_proto_export_t *m) {
  uint64_t end;
  return !__builtin_add_overflow(m->address, m->length, &end);
}

static bool blob_len_ok(uint32_t n) { return n >= 1 && n <= KVS_PROTO_MAX_DESC_BYTES; }

int kvs_proto_export_reply_encode(const kvs_proto_export_reply_t *m, void *buf, size_t cap,
                                  size_t *len) {
  if (m->n_descs > KVS_PROTO_MAX_DESCS || m->n_fds > KVS_PROTO_MAX_FDS ||
      (m->n_descs && !m->descs))
    return -EINVAL;
  for (uint32_t i = 0; i < m->n_descs; i++)
    if (!blob_len_ok(m->descs[i].len) || !m->descs[i].data) return -EINVAL;
  KVS__ENCODE_HEAD(export_reply)
  for (uint32_t i = 0; i < m->n_descs; i++) {
    kvs_proto_write_u32(&w, m->descs[i].len);
    kvs_proto_write_bytes(&w, m->descs[i].data, m->descs[i].len);
  }
  return finish(&w, len);
}

/* Walk the descriptors; with descs, fill them (only after a clean first pass). */
static void read_blobs(kvs_proto_reader_t *r, uint32_t n, kvs_proto_blob_t *descs) {
  for (uint32_t i = 0; i < n && !r->err; i++) {
    uint32_t l = kvs_proto_read_u32(r);
    require(r, blob_len_ok(l));
    const uint8_t *d = kvs_proto_read_bytes(r, r->err ? 0 : l);
    if (descs && !r->err) descs[i] = (kvs_proto_blob_t){.len = l, .data = d};
  }
}

int kvs_proto_export_reply_decode(const void *p, size_t len, kvs_proto_blob_t *descs,
                                  size_t cap, kvs_proto_export_reply_t *out) {
  KVS__DECODE_HEAD(export_reply)
  require(&r, m.n_descs <= KVS_PROTO_MAX_DESCS && m.n_fds <= KVS_PROTO_MAX_FDS);
  size_t table = r.pos;
  read_blobs(&r, m.n_descs, NULL);
  KVS_TRY(kvs_proto_reader_end(&r));
  if (m.n_descs > cap || (m.n_descs && !descs)) return -ENOBUFS;
  r.pos = table;
  read_blobs(&r, m.n_descs, descs);
  m.descs = descs;
  *out = m;
  return 0;
}

/* ---- REPORT_BAD ---------------------------------------------------------------------------- */

static bool report_ok(const kvs_proto_report_t *m) { return m->length != 0; }
static bool report_reply_ok(const kvs_proto_report_reply_t *m) { return m->dropped <= 1; }

/* ---- WATCH --------------------------------------------------------------------------------- */

static bool watch_ok(const kvs_proto_watch_t *m) {
  return m->n_keys >= 1 && m->n_keys <= KVS_PROTO_MAX_WATCH_KEYS && m->keys &&
         m->wait_ms <= KVS_PROTO_MAX_WATCH_MS;
}
static bool watch_reply_ok(const kvs_proto_watch_reply_t *m) {
  return m->state <= KVS_PROTO_WATCH_HELD;
}

/* ---- the flat payloads (proto.h KVS_PROTO_FLAT): encode and decode from their field lists ---
 * Each payload's field list is walked once to write (after <payload>_ok: -EINVAL) and once to
 * read (then <payload>_ok: -EBADMSG); the reader's sticky error makes a short payload, a
 * non-zero reserved field or an overflowing count fail the decode before the rule is judged,
 * and *out is written only on success. */

#define KVS__PROTO_FLAT_CODEC(msg)                                                            \
  int kvs_proto_##msg##_encode(const kvs_proto_##msg##_t *m, void *buf, size_t cap,           \
                               size_t *len) {                                                 \
    if (!msg##_ok(m)) return -EINVAL;                                                         \
    kvs_proto_writer_t w;                                                                     \
    kvs_proto_writer_init(&w, buf, cap);                                                      \
    KVS_PROTO_FIELDS_##msg(KVS__PUT) return finish(&w, len);                                  \
  }                                                                                           \
  int kvs_proto_##msg##_decode(const void *p, size_t len, kvs_proto_##msg##_t *out) {         \
    kvs_proto_reader_t r;                                                                     \
    kvs_proto_##msg##_t m;                                                                    \
    KVS_TRY(decode_open(&r, p, len, &m, sizeof m));                                           \
    KVS_PROTO_FIELDS_##msg(KVS__GET) KVS_TRY(kvs_proto_reader_end(&r));                       \
    if (!msg##_ok(&m)) return -EBADMSG;                                                       \
    *out = m;                                                                                 \
    return 0;                                                                                 \
  }
KVS_PROTO_FLAT(KVS__PROTO_FLAT_CODEC)

