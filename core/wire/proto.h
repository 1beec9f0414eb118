/* kvshim proto: the peer wire protocol codec (design §7, §7.1; docs/protocol.md is the
 * normative byte-level description and is kept in step with this header).
 *
 * A pure codec: it encodes messages into caller buffers and decodes untrusted bytes with every
 * read bounds-checked. No sockets, no allocation, no global state, no logging: every function
 * is thread-safe and deterministic. The coordinator and the peer client do the I/O.
 *
 * Frames. A frame is a 24-byte little-endian header followed by `length` payload bytes:
 *
 *     off size field                     off size field
 *       0    4 magic      KVS_PROTO_MAGIC  12    8 request_id
 *       4    2 version    KVS_PROTO_VERSION 20   4 length (payload bytes, <= max_frame)
 *       6    2 opcode     KVS_PROTO_OPCODES
 *       8    4 flags      KVS_PROTO_F_REPLY | KVS_PROTO_F_MORE, other bits zero
 *
 * A message is the concatenation of the payloads of one or more frames: every frame but the
 * last has F_MORE; all carry the same opcode, request id and F_REPLY bit, back to back on the
 * connection (kvs_proto_frame_continues checks a continuation; kvs_proto_frame_header
 * computes the headers for sending). Message decoders always run on a whole message.
 *
 * Requests and replies. A request (no F_REPLY, request_id != 0, chosen by the requester)
 * gets exactly one reply: a message with the same opcode and request id and F_REPLY, or an
 * ERROR (opcode 255, F_REPLY) with that request id. An ERROR with request_id 0 concerns the
 * connection, not a request (sent just before closing it for a malformed frame).
 *
 * Payloads are fixed-width little-endian fields and counted arrays; every variable-length
 * array of 8-byte-aligned elements starts at an offset that is a multiple of 8 (zero padding
 * where needed). Reserved fields and padding must be zero, booleans 0 or 1, enumerations in
 * range: the encoding is canonical, so decode followed by encode gives back the same bytes.
 *
 * Decoding (kvs_proto_<msg>_decode(payload, len, out)). Returns 0 and fills *out, or a negative
 * errno with *out (and any caller array) untouched:
 *     -EBADMSG  malformed: truncated, trailing bytes, a count over its limit or over what the
 *               payload holds, a non-zero reserved field, a value out of range
 *     -EINVAL   payload is NULL with len > 0, or not 8-byte aligned (see Lifetimes)
 *     -ENOBUFS  a caller array (objects, descs) has fewer than the needed entries
 * Decoding never reads outside [payload, payload + len) and never trusts a count.
 *
 * Lifetimes (zero copy). Pointers in a decoded struct (keys, entries, slots, outcomes, data,
 * message, text, echo, objects[i].data, descs[i].data) point INTO the payload buffer: they are
 * valid while that buffer is, and the buffer must not be changed meanwhile. Because keys,
 * entries and slots are read in place through typed pointers, the payload must be 8-byte
 * aligned (a malloc'd buffer is; so is the payload of a header+payload read into one malloc'd
 * buffer, the header being 24 bytes), and the host little-endian (asserted at compile time).
 * A pointer for an empty array may be NULL.
 *
 * Encoding (kvs_proto_<msg>_encode(msg, buf, cap, &len)). Writes the payload of a message
 * (not the frame header) into buf[0, cap) and sets *len to its exact size. With buf == NULL
 * nothing is written and only *len is computed (a size query). Returns 0, -ENOBUFS when cap is
 * too small (buf contents then unspecified, *len untouched), or -EINVAL when the message breaks
 * a rule its decoder enforces (an encoder never produces bytes its decoder rejects).
 * Messages with raw bytes (COMMIT_STORE inline, PREPARE_RETRIEVE reply inline, PING, STATS
 * reply, EXPORT_TENSORS reply) copy them from the pointers in the struct; where documented a
 * NULL data pointer leaves those bytes unwritten so the caller can fill them (or send them from
 * where they lie with writev): they are the last bytes of the payload.
 *
 * Negotiation helpers (kvs_proto_negotiate_version, kvs_proto_choose_strategy) implement the
 * HELLO rules of docs/protocol.md so both ends decide the same way. */
#ifndef KVSHIM_PROTO_H
#define KVSHIM_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keys.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvshim proto reads little-endian payloads in place: little-endian hosts only"
#endif

/* ---- constants (wire ABI: never change a value) ------------------------------------------ */

#define KVS_PROTO_MAGIC 0x4D53564Bu     /* bytes on the wire: 4B 56 53 4D = "KVSM" */
#define KVS_PROTO_VERSION 1u            /* the version this code speaks */
#define KVS_PROTO_VERSION_MIN 1u        /* oldest version accepted in a frame header */
#define KVS_PROTO_VERSION_MAX 1u        /* newest version accepted in a frame header */
#define KVS_PROTO_HEADER_SIZE 24u

#define KVS_PROTO_F_REPLY 0x1u          /* this frame belongs to a reply (or an ERROR) */
#define KVS_PROTO_F_MORE 0x2u           /* more frames of this message follow */
#define KVS_PROTO_F_ALL (KVS_PROTO_F_REPLY | KVS_PROTO_F_MORE)

/* Limits on max_frame (largest frame payload a receiver accepts; KVSHIM_MAX_FRAME). Before the
 * HELLO exchange completes both sides use KVS_PROTO_MIN_MAX_FRAME. */
#define KVS_PROTO_MIN_MAX_FRAME (64u << 10)
#define KVS_PROTO_DEFAULT_MAX_FRAME (64u << 20)
#define KVS_PROTO_MAX_MAX_FRAME (1u << 30)

#define KVS_PROTO_MAX_KEYS 4096u        /* keys, entries, outcomes, slots, objects per message */
#define KVS_PROTO_MAX_GROUP 64u         /* HELLO group name bytes */
#define KVS_PROTO_MAX_ERROR_MSG 256u    /* ERROR message bytes */
#define KVS_PROTO_MAX_DESCS 4096u       /* EXPORT_TENSORS reply descriptors */
#define KVS_PROTO_MAX_DESC_BYTES 4096u  /* bytes of one opaque tensor descriptor */
#define KVS_PROTO_MAX_WATCH_KEYS 16u    /* keys of one WATCH */
#define KVS_PROTO_MAX_WATCH_MS 60000u   /* the longest wait one WATCH may ask for */
#define KVS_PROTO_MAX_FDS 253u          /* SCM_RIGHTS fds announced by one EXPORT_TENSORS reply */

/* Opcodes: X(NAME, number, name string). Numbers are pinned forever and never reused; a new
 * opcode takes the next free number. */
#define KVS_PROTO_OPCODES(X)                                                                  \
  X(HELLO, 1, "HELLO")                                                                        \
  X(LOOKUP, 2, "LOOKUP")                                                                      \
  X(PREPARE_STORE, 3, "PREPARE_STORE")                                                        \
  X(COMMIT_STORE, 4, "COMMIT_STORE")                                                          \
  X(ABORT, 5, "ABORT")                                                                        \
  X(PREPARE_RETRIEVE, 6, "PREPARE_RETRIEVE")                                                  \
  X(COMMIT_RETRIEVE, 7, "COMMIT_RETRIEVE")                                                    \
  X(STATS, 8, "STATS")                                                                        \
  X(PING, 9, "PING")                                                                          \
  X(EXPORT_TENSORS, 10, "EXPORT_TENSORS")                                                     \
  X(REPORT_BAD, 11, "REPORT_BAD")                                                             \
  X(WATCH, 32, "WATCH")                                                                       \
  X(ERROR, 255, "ERROR")

typedef enum kvs_proto_opcode {
#define KVS__PROTO_OP_ENUM(name, num, str) KVS_OP_##name = num,
  KVS_PROTO_OPCODES(KVS__PROTO_OP_ENUM)
#undef KVS__PROTO_OP_ENUM
} kvs_proto_opcode_t;

/* "LOOKUP", or NULL for a number that is not an opcode. */
const char *kvs_proto_opcode_name(unsigned opcode);
bool kvs_proto_opcode_valid(unsigned opcode);

/* Error codes: X(NAME, wire value, description). The wire value is a negative Linux errno,
 * pinned here as a number (proto.c asserts it equals -E<NAME> of <errno.h>). The first five
 * are the codec's own verdicts on a frame; the rest are what a server sends in ERROR for
 * refused requests. An ERROR may carry any code in [-4095, -1]; these are the ones kvshim
 * sends and names. */
#define KVS_PROTO_ERRORS(X)                                                                   \
  X(EBADMSG, -74, "malformed frame or payload")                                              \
  X(EPROTONOSUPPORT, -93, "unsupported protocol version")                                    \
  X(EOPNOTSUPP, -95, "unknown opcode or unsupported request")                                \
  X(EMSGSIZE, -90, "frame or message larger than the receiver accepts")                      \
  X(EPROTO, -71, "protocol violation: frame out of sequence or split message mismatch")      \
  X(EPERM, -1, "transfer belongs to another connection")                                     \
  X(ENOENT, -2, "no such transfer (unknown, ended or expired)")                              \
  X(EIO, -5, "internal error on the server")                                                 \
  X(ENOMEM, -12, "out of memory")                                                            \
  X(EACCES, -13, "peer credentials refused")                                                 \
  X(EFAULT, -14, "slot outside the pool or outside the transfer")                            \
  X(EBUSY, -16, "resource busy")                                                             \
  X(EINVAL, -22, "invalid argument")                                                         \
  X(ENOSPC, -28, "server table full")                                                        \
  X(ENOBUFS, -105, "buffer too small")                                                       \
  X(ETIMEDOUT, -110, "timed out")                                                            \
  X(ECANCELED, -125, "server shutting down")

typedef enum kvs_proto_error_code {
#define KVS__PROTO_ERR_ENUM(name, val, desc) KVS_PROTO_##name = val,
  KVS_PROTO_ERRORS(KVS__PROTO_ERR_ENUM)
#undef KVS__PROTO_ERR_ENUM
} kvs_proto_error_code_t;

/* "EBADMSG" for -74; NULL for a code not in KVS_PROTO_ERRORS. */
const char *kvs_proto_error_name(int code);
/* Description of a negative errno ("malformed frame or payload"); codes not in the table get
 * "unknown error". Never NULL. */
const char *kvs_proto_strerror(int code);

/* HELLO values. */
#define KVS_PROTO_ROLE_ENGINE 1u        /* an engine process with libkvshim preloaded */
#define KVS_PROTO_ROLE_CACHE 2u         /* kvshim serve */
#define KVS_PROTO_ROLE_TOOL 3u          /* the kvshim CLI */
#define KVS_PROTO_CAP_SHM 0x1u          /* can map a peer pool and use SHM transfers */
#define KVS_PROTO_CAP_INLINE 0x2u       /* can use inline transfers (every peer should) */
/* Additions to version 1 (docs/protocol.md §5.1): a server uses one only with a client that
 * announced it, so a peer that predates it sees version 1 exactly as it was. */
#define KVS_PROTO_CAP_SKIPPED 0x4u      /* reads the SKIPPED reservation outcome (6) */
#define KVS_PROTO_CAP_MAX_MESSAGE 0x8u  /* reads max_message at the end of a HELLO reply */
#define KVS_PROTO_CAP_REPORT_BAD 0x10u  /* server: takes REPORT_BAD (a client sends it only then) */
#define KVS_PROTO_CAP_REMOTE 0x20u      /* server: a LOOKUP may ask it to consult its remote tier
                                           (remote_wait_ms); clients send 0 to others */
#define KVS_PROTO_CAP_AUTO_RELEASE 0x40u /* both: PREPARE_RETRIEVE flag AUTO_RELEASE (the pins end
                                            by themselves: no COMMIT_RETRIEVE needed); a client
                                            sets it only to a server that announced the bit */
#define KVS_PROTO_CAP_WATCH 0x80u      /* server: takes WATCH (a client sends it only then) */
#define KVS_PROTO_HELLO_POOL_FD 0x1u    /* HELLO flag: the pool memfd travels with this frame */
#define KVS_PROTO_HELLO_F_ALL KVS_PROTO_HELLO_POOL_FD

/* Strategies (same numbers as kvs_strategy_t / KVSHIM_STRATEGY). */
#define KVS_PROTO_STRATEGY_AUTO 0u
#define KVS_PROTO_STRATEGY_SHM 1u
#define KVS_PROTO_STRATEGY_INLINE 2u

/* PREPARE_STORE / COMMIT_STORE object kinds. */
#define KVS_PROTO_KIND_CHUNKS 0u        /* one object per key (kvs_store_reserve_write) */
#define KVS_PROTO_KIND_OBJECT 1u        /* one object under keys[0] + aliases (reserve_object) */

/* STATS formats. */
#define KVS_PROTO_STATS_INFO 0u
#define KVS_PROTO_STATS_JSON 1u

/* Reserve mode bits accepted on the wire (KVS_RESERVE_*). */
#define KVS_PROTO_MODE_ALL (KVS_RESERVE_ALL_OR_NOTHING | KVS_RESERVE_NO_EVICT)

/* ---- frame header ------------------------------------------------------------------------- */

typedef struct kvs_proto_header {
  uint32_t magic;      /* KVS_PROTO_MAGIC */
  uint16_t version;    /* KVS_PROTO_VERSION_MIN..MAX */
  uint16_t opcode;     /* kvs_proto_opcode_t */
  uint32_t flags;      /* KVS_PROTO_F_* */
  uint64_t request_id; /* != 0 in requests; echoed in the reply */
  uint32_t length;     /* payload bytes of this frame */
} kvs_proto_header_t;

/* Write h's 24 bytes (no validation: tests use it to build bad frames). */
void kvs_proto_header_encode(const kvs_proto_header_t *h, uint8_t out[KVS_PROTO_HEADER_SIZE]);
/* Read the fields of the first 24 bytes without judging them (the coordinator uses this to
 * echo a request id in an ERROR). -ENODATA when len < 24: on a stream, read more. */
int kvs_proto_header_parse(const void *buf, size_t len, kvs_proto_header_t *out);
/* Judge a parsed header, in this order:
 *     -EBADMSG          bad magic
 *     -EPROTONOSUPPORT  version outside KVS_PROTO_VERSION_MIN..MAX
 *     -EOPNOTSUPP       opcode not in KVS_PROTO_OPCODES
 *     -EBADMSG          reserved flag bits set; ERROR without F_REPLY; F_MORE on HELLO or
 *                       ERROR (they are always one frame); a request with request_id 0
 *     -EMSGSIZE         length > max_frame (0 means KVS_PROTO_MIN_MAX_FRAME)
 * Each of these closes the connection (docs/protocol.md "Closing"). */
int kvs_proto_header_validate(const kvs_proto_header_t *h, uint32_t max_frame);
/* parse + validate; *out written only when both succeed. */
int kvs_proto_header_decode(const void *buf, size_t len, uint32_t max_frame,
                            kvs_proto_header_t *out);

/* The header of the frame carrying payload bytes [offset, offset + n) of a message of `total`
 * bytes split at max_frame: n = min(max_frame, total - offset), F_MORE when bytes remain.
 * `flags` may hold F_REPLY only. Send offset = 0, n, 2n, ... until a header without F_MORE.
 * A message of 0 bytes is one frame. -EINVAL for offset >= total (unless both are 0), a bad
 * flag, or max_frame == 0; -EMSGSIZE when HELLO/ERROR would need more than one frame. */
int kvs_proto_frame_header(uint16_t opcode, uint32_t flags, uint64_t request_id,
                           uint64_t total, uint64_t offset, uint32_t max_frame,
                           kvs_proto_header_t *out);
/* 0 when `next` may follow `first` (the first frame of a message still open because the
 * previous frame had F_MORE): same opcode, request id and F_REPLY bit. -EPROTO otherwise. */
int kvs_proto_frame_continues(const kvs_proto_header_t *first, const kvs_proto_header_t *next);
/* 0 when the (first) header `reply` answers `request`: F_REPLY, same request id, and the same
 * opcode or ERROR. -EPROTO otherwise. */
int kvs_proto_reply_matches(const kvs_proto_header_t *request, const kvs_proto_header_t *reply);

/* ---- bounded reader and writer --------------------------------------------------------------
 * A cursor over a buffer with a sticky error: the first failure (-EBADMSG for a short buffer or
 * an overflowing count, -ENOBUFS for a full writer) is kept in err, and every later call does
 * nothing (reads return 0 / NULL). Check once at the end. */

typedef struct kvs_proto_reader {
  const uint8_t *buf;
  size_t len; /* bytes in buf */
  size_t pos; /* invariant: pos <= len */
  int err;    /* 0 or the first negative errno */
} kvs_proto_reader_t;

void kvs_proto_reader_init(kvs_proto_reader_t *r, const void *buf, size_t len);
uint8_t kvs_proto_read_u8(kvs_proto_reader_t *r);
uint16_t kvs_proto_read_u16(kvs_proto_reader_t *r);
uint32_t kvs_proto_read_u32(kvs_proto_reader_t *r);
uint64_t kvs_proto_read_u64(kvs_proto_reader_t *r);
/* Pointer to the next n bytes, consumed; NULL (and -EBADMSG) when fewer remain. */
const void *kvs_proto_read_bytes(kvs_proto_reader_t *r, size_t n);
/* count * elem_size bytes (product checked for overflow), consumed. */
const void *kvs_proto_read_array(kvs_proto_reader_t *r, uint64_t count, size_t elem_size);
/* Skip to the next multiple of align (a power of two) from the start; the skipped bytes must
 * be zero (-EBADMSG otherwise). */
void kvs_proto_read_pad(kvs_proto_reader_t *r, size_t align);
/* Record a semantic failure (first one wins). */
void kvs_proto_reader_fail(kvs_proto_reader_t *r, int err);
size_t kvs_proto_reader_remaining(const kvs_proto_reader_t *r);
/* err, or -EBADMSG when unread bytes remain (trailing garbage), else 0. */
int kvs_proto_reader_end(const kvs_proto_reader_t *r);

typedef struct kvs_proto_writer {
  uint8_t *buf; /* NULL: count only */
  size_t cap;
  size_t len;   /* bytes written (or counted) so far */
  int err;
} kvs_proto_writer_t;

void kvs_proto_writer_init(kvs_proto_writer_t *w, void *buf, size_t cap);
void kvs_proto_write_u8(kvs_proto_writer_t *w, uint8_t v);
void kvs_proto_write_u16(kvs_proto_writer_t *w, uint16_t v);
void kvs_proto_write_u32(kvs_proto_writer_t *w, uint32_t v);
void kvs_proto_write_u64(kvs_proto_writer_t *w, uint64_t v);
/* Append n bytes from src; src NULL: reserve n bytes and leave them unwritten. */
void kvs_proto_write_bytes(kvs_proto_writer_t *w, const void *src, size_t n);
/* Zero bytes up to the next multiple of align (a power of two). */
void kvs_proto_write_pad(kvs_proto_writer_t *w, size_t align);
/* err, or 0 with *len = bytes written. */
int kvs_proto_writer_end(const kvs_proto_writer_t *w, size_t *len);

/* ---- wire records read in place (8-byte aligned in every payload) ---------------------------- */

/* kvs_key_t is read in place: 16 bytes, lo then hi, each little-endian u64. */

/* COMMIT_STORE inline chunk table entry: 24 bytes. */
typedef struct kvs_proto_entry {
  kvs_key_t key;
  uint64_t length; /* bytes of this entry's object in the data that follows the table */
} kvs_proto_entry_t;

/* PREPARE_STORE reply SHM slot: 24 bytes. The extent [offset, offset + length) of the server's
 * pool segment reserved for keys[key_index]; dtype/shape are the request's layout. */
typedef struct kvs_proto_slot {
  uint32_t key_index; /* index into the request's keys; strictly increasing in a reply */
  uint32_t reserved;  /* zero */
  uint64_t offset;    /* segment offset in bytes */
  uint64_t length;    /* bytes; offset + length does not overflow */
} kvs_proto_slot_t;

/* ---- messages --------------------------------------------------------------------------------
 * One struct per payload; the field comments give the rules the decoder enforces. See
 * docs/protocol.md for offsets and the flows. */

/* HELLO, request and reply (same body). Rules: 1 <= version_min <= version_max; role 1..3;
 * strategies 0..2; flags only KVS_PROTO_HELLO_F_ALL; POOL_FD implies pool_segment_size > 0;
 * KVS_PROTO_MIN_MAX_FRAME <= max_frame <= KVS_PROTO_MAX_MAX_FRAME; group <= 64 bytes, no NUL.
 * In a request strategy_chosen is AUTO; in a reply it is SHM or INLINE (the coordinator checks
 * these direction rules: kvs_proto_hello_check). max_message is 0 or >= max_frame. */
typedef struct kvs_proto_hello {
  uint16_t version_min, version_max; /* protocol versions the sender speaks */
  uint8_t role;                      /* KVS_PROTO_ROLE_* */
  uint8_t strategy_requested;        /* KVS_PROTO_STRATEGY_* (KVSHIM_STRATEGY) */
  uint8_t strategy_chosen;           /* reply: the connection's strategy; request: AUTO */
  uint8_t flags;                     /* KVS_PROTO_HELLO_POOL_FD */
  uint32_t pid;
  uint32_t caps;                     /* KVS_PROTO_CAP_*; unknown bits are kept and ignored */
  uint64_t instance_id;
  uint64_t pool_segment_size;        /* bytes of the pool segment offered (0 = none) */
  uint64_t pool_arena_size;          /* cache arena bytes (for `kvshim peers`) */
  uint64_t pool_arena_used;          /* cache arena bytes in use */
  uint32_t max_frame;                /* largest frame payload the sender accepts */
  char group[KVS_PROTO_MAX_GROUP + 1]; /* NUL-terminated copy (not a pointer) */
  /* Largest assembled message the sender accepts (0: not announced; then the HELLO ends after
   * the group). When set, the body goes on with zero padding to a multiple of 8 and this u64:
   * sent only in replies to a client with KVS_PROTO_CAP_MAX_MESSAGE. >= max_frame. */
  uint64_t max_message;
} kvs_proto_hello_t;

int kvs_proto_hello_encode(const kvs_proto_hello_t *m, void *buf, size_t cap, size_t *len);
int kvs_proto_hello_decode(const void *p, size_t len, kvs_proto_hello_t *out);
/* Direction rules on a decoded HELLO: a request has strategy_chosen AUTO, no POOL_FD and no
 * max_message; a reply has strategy_chosen SHM or INLINE, and POOL_FD only with SHM. 0 or
 * -EBADMSG (a field violation, like the decoder's). */
int kvs_proto_hello_check(const kvs_proto_hello_t *m, bool reply);
/* The version both speak: min(a.max, b.max) when >= max(a.min, b.min), else -EPROTONOSUPPORT. */
int kvs_proto_negotiate_version(const kvs_proto_hello_t *a, const kvs_proto_hello_t *b,
                                uint16_t *out);
/* Server side: the connection's strategy from the client's HELLO request and the server's own
 * KVSHIM_STRATEGY (`local`). INLINE when either side asks for INLINE, when the client lacks
 * CAP_SHM, or when the server cannot offer its pool (can_offer_shm false); else SHM. A forced
 * SHM that cannot be honoured degrades to INLINE (never a failure). Returns SHM or INLINE. */
uint8_t kvs_proto_choose_strategy(uint8_t local, const kvs_proto_hello_t *client,
                                  bool can_offer_shm);

/* ERROR {code i32 in [-4095, -1], message <= 256 bytes (any bytes, not NUL-terminated)}. */
typedef struct kvs_proto_error {
  int32_t code;
  uint16_t message_len;
  const char *message; /* into the payload (decode); may be NULL when message_len == 0 */
} kvs_proto_error_t;

/* Fill *m from a code and a C string, cut to KVS_PROTO_MAX_ERROR_MSG bytes (msg NULL: the
 * code's kvs_proto_strerror text). A code outside [-4095, -1] becomes -EIO. m->message points
 * at msg (or a static string): keep msg alive until encoded. */
void kvs_proto_error_init(kvs_proto_error_t *m, int code, const char *msg);

/* LOOKUP request: 1 <= n_keys <= KVS_PROTO_MAX_KEYS. Also the PREPARE_RETRIEVE key list. */
typedef struct kvs_proto_lookup {
  uint32_t n_keys;
  const kvs_key_t *keys;   /* into the payload */
  uint32_t remote_wait_ms; /* 0: the pool only (protocol v1 as first published); > 0: a server
                              that announced KVS_PROTO_CAP_REMOTE may fetch the keys it lacks
                              from its remote tier, replying within this many ms */
} kvs_proto_lookup_t;
/* LOOKUP reply: the leading run of READY keys (nothing is pinned). found <= MAX_KEYS. */
typedef struct kvs_proto_lookup_reply {
  uint32_t found;
} kvs_proto_lookup_reply_t;


/* PREPARE_STORE request. strategy SHM or INLINE; kind CHUNKS or OBJECT; mode only
 * KVS_PROTO_MODE_ALL bits; layout.ndim <= 8 (other layout rules are the store's: an invalid
 * layout is answered with BAD_LAYOUT outcomes, not a malformed frame); 1 <= n_keys <= MAX_KEYS.
 * CHUNKS: one object of `layout` per key. OBJECT: one object, keys[0] primary, rest aliases. */
typedef struct kvs_proto_prepare_store {
  uint8_t strategy;
  uint8_t kind;
  uint32_t mode;
  kvs_layout_t layout;   /* copied; shape[ndim..8) are zero after decode */
  uint32_t n_keys;
  const kvs_key_t *keys; /* into the payload */
} kvs_proto_prepare_store_t;

/* PREPARE_STORE reply. outcomes[i] is a kvs_reserve_outcome_t (<= BAD_LAYOUT) for keys[i]
 * (CHUNKS: n_outcomes = n_keys; OBJECT: 1, the object's). slots: SHM only, one per RESERVED
 * key, key_index strictly increasing, < n_outcomes and naming a RESERVED outcome. xfer names
 * the write transfer (0 when nothing was reserved and always for INLINE, which reserves
 * nothing: there RESERVED means "send these bytes in COMMIT_STORE", PRESENT "skip").
 * Rules: n_slots <= n_outcomes <= MAX_KEYS; n_slots > 0 implies xfer != 0. */
typedef struct kvs_proto_prepare_store_reply {
  uint64_t xfer;
  uint32_t n_outcomes;
  uint32_t n_slots;
  const uint8_t *outcomes;       /* into the payload */
  const kvs_proto_slot_t *slots; /* into the payload */
} kvs_proto_prepare_store_reply_t;


/* COMMIT_STORE request.
 * SHM (is_inline 0): commit write transfer xfer, naming the slots written (as received in the
 * PREPARE_STORE reply: the server checks each lies inside its pool and inside that transfer,
 * and that the transfer's slots are all named); kind, mode, n_entries 0; no layout, no data.
 * Slot rules: n_slots <= MAX_KEYS, key_index strictly increasing, reserved 0, offset + length
 * does not overflow.
 * Inline (is_inline 1): xfer is an SHM reservation to abort first, or 0. kind, mode and layout
 * as in PREPARE_STORE; 1 <= n_entries <= MAX_KEYS entries {key, length}; then the data: the
 * objects' bytes back to back in entry order, sum(length) == data_len exactly (the rest of the
 * payload). CHUNKS: one object per entry. OBJECT: entries[0] is the object (its length),
 * entries[1..] are aliases with length 0.
 * Encoding inline with data == NULL leaves the last data_len bytes unwritten (caller fills). */
typedef struct kvs_proto_commit_store {
  uint64_t xfer;
  uint8_t is_inline;
  uint8_t kind;
  uint32_t mode;
  kvs_layout_t layout;               /* inline only */
  uint32_t n_entries;
  const kvs_proto_entry_t *entries;  /* into the payload */
  const uint8_t *data;               /* into the payload; entry i at data + sum(len[0..i)) */
  uint64_t data_len;
  uint32_t n_slots;                  /* SHM only (0 when inline) */
  const kvs_proto_slot_t *slots;     /* SHM: into the payload */
} kvs_proto_commit_store_t;

/* COMMIT_STORE reply: committed = objects published. Inline: n_outcomes per-entry outcomes
 * (CHUNKS: n_entries; OBJECT: 1), each <= BAD_LAYOUT. SHM: n_outcomes 0 (the SHM commit is
 * all-or-ERROR). Rules: committed <= MAX_KEYS, n_outcomes <= MAX_KEYS. */
typedef struct kvs_proto_commit_store_reply {
  uint32_t committed;
  uint32_t n_outcomes;
  const uint8_t *outcomes; /* into the payload */
} kvs_proto_commit_store_reply_t;

int kvs_proto_commit_store_encode(const kvs_proto_commit_store_t *m, void *buf, size_t cap,
                                  size_t *len);
int kvs_proto_commit_store_decode(const void *p, size_t len, kvs_proto_commit_store_t *out);

/* ABORT and COMMIT_RETRIEVE requests: a transfer id. Their replies are empty. COMMIT_RETRIEVE
 * with xfer 0 (after an inline retrieve) is a valid no-op. */
typedef struct kvs_proto_xfer {
  uint64_t xfer;
} kvs_proto_xfer_t;

/* Empty payloads (ABORT, COMMIT_RETRIEVE replies): 0 when len == 0, else -EBADMSG. */
int kvs_proto_empty_decode(const void *p, size_t len);

/* PREPARE_RETRIEVE request: strategy SHM or INLINE, 1 <= n_keys <= MAX_KEYS. flags: 0, or
 * KVS_PROTO_RETRIEVE_AUTO_RELEASE (docs/protocol.md 4.7; caps bit AUTO_RELEASE). */
#define KVS_PROTO_RETRIEVE_AUTO_RELEASE 0x1u
#define KVS_PROTO_RETRIEVE_F_ALL KVS_PROTO_RETRIEVE_AUTO_RELEASE
typedef struct kvs_proto_prepare_retrieve {
  uint8_t strategy;
  uint32_t n_keys;
  const kvs_key_t *keys; /* into the payload */
  uint8_t flags;         /* last: positional initialisers of the fields above stay valid */
} kvs_proto_prepare_retrieve_t;

/* One object of a PREPARE_RETRIEVE reply. */
typedef struct kvs_proto_object {
  uint32_t key_index;  /* index into the request's keys it was found under */
  uint64_t offset;     /* SHM: segment offset of the pinned extent; inline: 0 */
  uint64_t length;     /* bytes */
  kvs_layout_t layout; /* ndim <= 8; shape[ndim..8) zero */
  const uint8_t *data; /* inline: its bytes (into the payload); SHM: NULL */
} kvs_proto_object_t;

/* PREPARE_RETRIEVE reply. n_found: the leading run of READY keys; objects: the pinned objects
 * covering them in key order (several keys may share one object: aliases). SHM: xfer is the
 * read transfer holding the pins (COMMIT_RETRIEVE releases it; 0 when nothing was found).
 * Inline: xfer 0 (pins already released), offsets 0, and the objects' bytes follow the table
 * back to back: sum(length) == data_len exactly. Rules: n_objects <= n_found <= MAX_KEYS;
 * key_index strictly increasing and < n_found; offset + length does not overflow; n_objects
 * > 0 for SHM implies xfer != 0. Decoding fills the caller's objects[0, n_objects) (cap >=
 * n_objects, else -ENOBUFS; cap = KVS_PROTO_MAX_KEYS always suffices) and sets out->objects.
 * Encoding reads objects[0, n_objects); inline objects with data NULL leave their bytes
 * unwritten (they lie at the end of the payload, in object order). */
typedef struct kvs_proto_prepare_retrieve_reply {
  uint64_t xfer;
  uint32_t n_found;
  uint32_t n_objects;
  uint8_t is_inline;
  kvs_proto_object_t *objects; /* caller's array */
  const uint8_t *data;         /* decode: start of the inline bytes (NULL for SHM) */
  uint64_t data_len;           /* sum of the objects' lengths when inline, else 0 */
  uint32_t pin_ms;             /* AUTO_RELEASE honoured: the pins last at least this long from
                                  the server's reading of the request (4.7); else 0. Non-zero
                                  only with xfer != 0 */
} kvs_proto_prepare_retrieve_reply_t;

int kvs_proto_prepare_retrieve_reply_encode(const kvs_proto_prepare_retrieve_reply_t *m,
                                            void *buf, size_t cap, size_t *len);
int kvs_proto_prepare_retrieve_reply_decode(const void *p, size_t len,
                                            kvs_proto_object_t *objects, size_t cap,
                                            kvs_proto_prepare_retrieve_reply_t *out);
/* The head and object table of a PREPARE_RETRIEVE reply, for a receiver that reads the inline
 * bytes straight into their destinations: p holds exactly the head and the table (a receiver
 * learns the table's length from n_objects and each record's ndim). Same checks as the whole
 * decode except the data, whose length is out->data_len (the bytes that must follow the table
 * in the message, exactly; out->data stays NULL). -EBADMSG (also for bytes after the table),
 * -ENOBUFS. */
int kvs_proto_prepare_retrieve_reply_decode_table(const void *p, size_t len,
                                                  kvs_proto_object_t *objects, size_t cap,
                                                  kvs_proto_prepare_retrieve_reply_t *out);

/* STATS request: format INFO or JSON. Reply: text {u32 length, bytes} (not NUL-terminated). */
typedef struct kvs_proto_stats {
  uint8_t format;
} kvs_proto_stats_t;
typedef struct kvs_proto_text {
  uint32_t len;
  const char *text; /* into the payload */
} kvs_proto_text_t;


/* PING request and reply (the reply echoes nonce and bytes). */
typedef struct kvs_proto_ping {
  uint64_t nonce;
  uint32_t echo_len;
  const uint8_t *echo; /* into the payload */
} kvs_proto_ping_t;


/* EXPORT_TENSORS request: the descriptors covering [address, address + length) (no overflow). */
typedef struct kvs_proto_export {
  uint64_t address;
  uint64_t length;
} kvs_proto_export_t;

/* One opaque tensor descriptor (core/wire/tensor's encoding), 1..KVS_PROTO_MAX_DESC_BYTES bytes.
 * Not aligned: read it with memcpy-based decoding. */
typedef struct kvs_proto_blob {
  uint32_t len;
  const uint8_t *data; /* into the payload */
} kvs_proto_blob_t;

/* EXPORT_TENSORS reply: n_descs <= KVS_PROTO_MAX_DESCS descriptors; n_fds <= MAX_FDS file
 * descriptors travel with the reply's first frame over SCM_RIGHTS (the descriptors refer to
 * them by index). Decoding fills descs[0, n_descs) (cap >= n_descs, else -ENOBUFS). */
typedef struct kvs_proto_export_reply {
  uint32_t n_descs;
  uint32_t n_fds;
  kvs_proto_blob_t *descs; /* caller's array */
} kvs_proto_export_reply_t;

int kvs_proto_export_reply_encode(const kvs_proto_export_reply_t *m, void *buf, size_t cap,
                                  size_t *len);
int kvs_proto_export_reply_decode(const void *p, size_t len, kvs_proto_blob_t *descs,
                                  size_t cap, kvs_proto_export_reply_t *out);

/* REPORT_BAD request: "the object I read under key failed my format check". length and
 * checksum (XXH3-64 of the object's bytes, seed 0) describe what the reporter read; the holder
 * drops the object only when its current bytes are exactly those (an object rewritten since is
 * left alone). Reply: dropped 0 or 1. reserved fields zero. */
typedef struct kvs_proto_report {
  kvs_key_t key;
  uint64_t length;
  uint64_t checksum;
} kvs_proto_report_t;
typedef struct kvs_proto_report_reply {
  uint32_t dropped; /* 0 or 1 */
} kvs_proto_report_reply_t;

/* WATCH request: "answer when keys[0] is no longer stored here, or when any of keys[1..n) is
 * stored here (READY), or after wait_ms, whichever comes first". 1 <= n_keys <=
 * KVS_PROTO_MAX_WATCH_KEYS, wait_ms <= KVS_PROTO_MAX_WATCH_MS. Reply: state (below). A waiter
 * sleeps on one reply instead of asking again and again (design §10.3, single flight). */
typedef struct kvs_proto_watch {
  uint32_t n_keys;
  uint32_t wait_ms;
  const kvs_key_t *keys; /* into the payload */
} kvs_proto_watch_t;
#define KVS_PROTO_WATCH_GONE 0u    /* keys[0] is not stored (now, or was never) */
#define KVS_PROTO_WATCH_PRESENT 1u /* keys[0] still stored, and one of keys[1..n) is READY */
#define KVS_PROTO_WATCH_HELD 2u    /* wait_ms passed: keys[0] still stored, none of the others */
typedef struct kvs_proto_watch_reply {
  uint32_t state; /* KVS_PROTO_WATCH_* */
} kvs_proto_watch_reply_t;

/* ---- the message schema ----------------------------------------------------------------------
 * docs/protocol.md section 4 is the contract for every payload; the docs contract test
 * (docs_fake_protocol) holds the tables below to it.
 *
 * KVS_PROTO_REQUESTS(X): X(OPCODE, handler, request): every request opcode, the name of its
 * handler and its request payload (kvs_proto_<request>_t, kvs_proto_<request>_decode). The
 * coordinator's dispatch and the opening of every handler (decode the payload; a malformed one
 * is answered ERROR with "bad <OPCODE>" and the connection is closed) are generated from it
 * (core/wire/coord.c); a handler starts with a decoded request. ERROR is a reply only.
 *
 * KVS_PROTO_FLAT(X): X(payload): the payloads whose bytes are a flat list of fields, each with
 * its field list KVS_PROTO_FIELDS_<payload>(F) in wire order. proto.c generates their encode
 * and decode from these lists (declared below); the other payloads (HELLO, COMMIT_STORE, the
 * PREPARE_RETRIEVE and EXPORT_TENSORS replies: optional tails, branches, nested tables) are
 * written by hand after their fixed head, the field list KVS_PROTO_HEAD_<payload>(F) that both
 * their encoder and decoder walk. A field is F(kind, field, count):
 *     U8 U16 U32 U64     the struct's field, fixed width
 *     ZERO8 ZERO16 ZERO32  reserved: written 0, must read 0 (field and count unused: _)
 *     PAD8               zeros up to the next multiple of 8 from the payload's start
 *     LAYOUT             a kvs_layout_t: dtype u32, ndim u32 (<= 8), shape u64[ndim]
 *     ARRAY              `count` elements of *field, read in place (count: a field before it)
 * The rules beyond the framing (limits, ranges, non-NULL arrays) are one predicate per payload
 * in proto.c, checked before encoding (-EINVAL) and after decoding (-EBADMSG). */
#define KVS_PROTO_REQUESTS(X)                                                                 \
  X(HELLO, hello, hello)                                                                      \
  X(LOOKUP, lookup, lookup)                                                                   \
  X(PREPARE_STORE, prepare_store, prepare_store)                                              \
  X(COMMIT_STORE, commit_store, commit_store)                                                 \
  X(ABORT, abort, xfer)                                                                       \
  X(PREPARE_RETRIEVE, prepare_retrieve, prepare_retrieve)                                     \
  X(COMMIT_RETRIEVE, commit_retrieve, xfer)                                                   \
  X(STATS, stats, stats)                                                                      \
  X(PING, ping, ping)                                                                         \
  X(EXPORT_TENSORS, export_tensors, export)                                                   \
  X(REPORT_BAD, report_bad, report)                                                           \
  X(WATCH, watch, watch)

#define KVS_PROTO_FLAT(X)                                                                     \
  X(error) X(lookup) X(lookup_reply) X(prepare_store) X(prepare_store_reply)                  \
  X(commit_store_reply) X(xfer) X(prepare_retrieve) X(stats) X(text) X(ping) X(export)        \
  X(report) X(report_reply) X(watch) X(watch_reply)

/* 4.2 ERROR */
#define KVS_PROTO_FIELDS_error(F)                                                             \
  F(U32, code, _) F(U16, message_len, _) F(ARRAY, message, message_len)
/* 4.3 LOOKUP request and reply */
#define KVS_PROTO_FIELDS_lookup(F)                                                            \
  F(U32, n_keys, _) F(U32, remote_wait_ms, _) F(ARRAY, keys, n_keys)
#define KVS_PROTO_FIELDS_lookup_reply(F) F(U32, found, _) F(ZERO32, _, _)
/* 4.4 PREPARE_STORE request and reply */
#define KVS_PROTO_FIELDS_prepare_store(F)                                                     \
  F(U8, strategy, _) F(U8, kind, _) F(ZERO16, _, _) F(U32, mode, _) F(U32, n_keys, _)         \
  F(ZERO32, _, _) F(LAYOUT, layout, _) F(ARRAY, keys, n_keys)
#define KVS_PROTO_FIELDS_prepare_store_reply(F)                                               \
  F(U64, xfer, _) F(U32, n_outcomes, _) F(U32, n_slots, _) F(ARRAY, outcomes, n_outcomes)     \
  F(PAD8, _, _) F(ARRAY, slots, n_slots)
/* 4.5 COMMIT_STORE reply */
#define KVS_PROTO_FIELDS_commit_store_reply(F)                                                \
  F(U32, committed, _) F(U32, n_outcomes, _) F(ARRAY, outcomes, n_outcomes)
/* 4.6 ABORT and COMMIT_RETRIEVE requests */
#define KVS_PROTO_FIELDS_xfer(F) F(U64, xfer, _)
/* 4.7 PREPARE_RETRIEVE request */
#define KVS_PROTO_FIELDS_prepare_retrieve(F)                                                  \
  F(U8, strategy, _) F(U8, flags, _) F(ZERO16, _, _) F(U32, n_keys, _) F(ARRAY, keys, n_keys)
/* 4.8 STATS request and reply */
#define KVS_PROTO_FIELDS_stats(F) F(U8, format, _)
#define KVS_PROTO_FIELDS_text(F) F(U32, len, _) F(ARRAY, text, len)
/* 4.9 PING request and reply */
#define KVS_PROTO_FIELDS_ping(F)                                                              \
  F(U64, nonce, _) F(U32, echo_len, _) F(ZERO32, _, _) F(ARRAY, echo, echo_len)
/* 4.10 EXPORT_TENSORS request */
#define KVS_PROTO_FIELDS_export(F) F(U64, address, _) F(U64, length, _)
/* 4.11 REPORT_BAD request and reply */
#define KVS_PROTO_FIELDS_report(F)                                                            \
  F(U64, key.lo, _) F(U64, key.hi, _) F(U64, length, _) F(U64, checksum, _)
#define KVS_PROTO_FIELDS_report_reply(F) F(U32, dropped, _) F(ZERO32, _, _)
/* 4.12 WATCH request and reply */
#define KVS_PROTO_FIELDS_watch(F) F(U32, n_keys, _) F(U32, wait_ms, _) F(ARRAY, keys, n_keys)
#define KVS_PROTO_FIELDS_watch_reply(F) F(U32, state, _) F(ZERO32, _, _)

/* The fixed heads of the hand-written payloads (what follows each is in proto.c). */
/* 4.1 HELLO: then group_len u16, reserved u16, the group, and the optional max_message */
#define KVS_PROTO_HEAD_hello(F)                                                               \
  F(U16, version_min, _) F(U16, version_max, _) F(U8, role, _) F(U8, strategy_requested, _)   \
  F(U8, strategy_chosen, _) F(U8, flags, _) F(U32, pid, _) F(U32, caps, _)                    \
  F(U64, instance_id, _) F(U64, pool_segment_size, _) F(U64, pool_arena_size, _)              \
  F(U64, pool_arena_used, _) F(U32, max_frame, _)
/* 4.5 COMMIT_STORE request: then the count of entries (inline) or slots (SHM), and its table */
#define KVS_PROTO_HEAD_commit_store(F)                                                        \
  F(U64, xfer, _) F(U8, is_inline, _) F(U8, kind, _) F(ZERO16, _, _) F(U32, mode, _)
/* 4.7 PREPARE_RETRIEVE reply: then the object records and the inline bytes */
#define KVS_PROTO_HEAD_prepare_retrieve_reply(F)                                              \
  F(U64, xfer, _) F(U32, n_found, _) F(U32, n_objects, _) F(U8, is_inline, _) F(ZERO8, _, _)  \
  F(ZERO16, _, _) F(U32, pin_ms, _)
/* 4.10 EXPORT_TENSORS reply: then the descriptors */
#define KVS_PROTO_HEAD_export_reply(F) F(U32, n_descs, _) F(U32, n_fds, _)

#define KVS__PROTO_FLAT_DECL(msg)                                                             \
  int kvs_proto_##msg##_encode(const kvs_proto_##msg##_t *m, void *buf, size_t cap,           \
                               size_t *len);                                                  \
  int kvs_proto_##msg##_decode(const void *p, size_t len, kvs_proto_##msg##_t *out);
KVS_PROTO_FLAT(KVS__PROTO_FLAT_DECL)
#undef KVS__PROTO_FLAT_DECL

#ifdef __cplusplus
}
#endif
#endif
