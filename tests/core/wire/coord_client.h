/* Shared helpers of the coordinator tests (tests/core/wire/coord_*.c).
 *
 * 1. A raw protocol client (cc_*): connect with kvs_sock_connect, HELLO with
 *    kvs_proto_hello_encode, send frames built with kvs_proto_frame_header /
 *    kvs_proto_header_encode (or any bytes at all, for bad-input tests), read whole replies
 *    (split messages reassembled, the pool fd collected) and map the server's pool. It does no
 *    more checking than a test wants: replies are returned as they came, an ERROR as its code.
 * 2. An in-process server (ts_server_*): pool + store + coordinator in a private temp
 *    KVSHIM_RUN_DIR (mkdtemp), with its own stats block.
 * 3. Small utilities: deterministic keys and byte patterns derived from a key, waiting for the
 *    store to return to a baseline, temp directories, children.
 *
 * Every cc_* function returns 0 (or a count), the negative code of an ERROR the server sent
 * (the connection is then still usable unless the server closed it), or another negative
 * errno for a transport failure. Nothing here calls exit() except ts_die (a test harness
 * failure that is not the behaviour under test). */
#ifndef KVSHIM_TESTS_COORD_CLIENT_H
#define KVSHIM_TESTS_COORD_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "coord.h"
#include "keys.h"
#include "options.h"
#include "pool.h"
#include "proto.h"
#include "sock.h"
#include "stats.h"
#include "store.h"
#include "tensor.h"

#define CC_MAX 512            /* keys / slots / objects the typed helpers handle per call */
#define CC_TIMEOUT_MS 5000    /* default receive deadline */

/* ---- raw client --------------------------------------------------------------------------- */

typedef struct cc {
  int fd;                    /* -1 when closed */
  uint64_t next_rid;
  uint32_t my_max_frame;     /* what we announced in HELLO */
  uint32_t peer_max_frame;   /* from the HELLO reply (KVS_PROTO_MIN_MAX_FRAME before) */
  bool helloed;
  kvs_proto_hello_t server;  /* the HELLO reply */
  kvs_pool_t *pool;          /* the server's pool, mapped read-write (SHM) or NULL */
} cc_t;

/* One received message: the first frame's header and the reassembled payload. */
typedef struct cc_msg {
  kvs_proto_header_t h;
  uint8_t *payload; /* malloc'd (8-byte aligned), never NULL after a successful receive */
  size_t len;
  int fd;           /* descriptor that came with the first frame, or -1 (owned) */
  uint32_t frames;  /* frames the message came in */
} cc_msg_t;

int cc_connect(cc_t *c, const char *path);
void cc_close(cc_t *c); /* closes the socket, unmaps the pool; accepts a closed cc */

/* HELLO request with strategy_requested, caps and max_frame (0 = 64 MiB); on a reply maps the
 * pool when an fd came. Returns 0, an ERROR code, or a transport errno. */
int cc_hello(cc_t *c, uint8_t strategy, uint32_t caps, uint32_t max_frame);
/* Connect + HELLO (strategy AUTO, SHM|INLINE caps): 0 or a negative errno. */
int cc_open(cc_t *c, const char *path, uint8_t strategy);

/* Send len raw bytes. */
int cc_send_raw(cc_t *c, const void *p, size_t len);
/* Send one frame with exactly this header (no validation) and payload. */
int cc_send_frame(cc_t *c, const kvs_proto_header_t *h, const void *payload);
/* Send *me, encoded as it is (no checking: a test's own HELLO), as a HELLO frame of request id
 * rid; reads no reply. */
int cc_send_hello(cc_t *c, const kvs_proto_hello_t *me, uint64_t rid);
/* Send a request message, split at the server's max_frame. *rid (may be NULL) gets its id. */
int cc_send(cc_t *c, uint16_t op, const void *p, size_t len, uint64_t *rid);
/* Receive one whole message within timeout_ms. -ECONNRESET when the server closed. */
int cc_recv(cc_t *c, cc_msg_t *m, int timeout_ms);
void cc_msg_free(cc_msg_t *m);
/* Send a request and receive its reply. Returns 0 for a reply with opcode op (in *reply), the
 * code of an ERROR (the ERROR message is in *reply too), -EPROTO for a reply that does not
 * match, or a transport errno (*reply then empty). */
int cc_call(cc_t *c, uint16_t op, const void *p, size_t len, cc_msg_t *reply);
/* Decode an ERROR message: its code (message copied into msg when not NULL). */
int cc_error_code(const cc_msg_t *m, char *msg, size_t cap);
/* True when the server closed the connection within timeout_ms (reads until EOF, discarding). */
bool cc_wait_closed(cc_t *c, int timeout_ms);

/* Typed requests. */
int cc_lookup(cc_t *c, const kvs_key_t *keys, uint32_t n, uint32_t *found);

typedef struct cc_pstore {
  uint64_t xfer;
  uint32_t n_outcomes, n_slots;
  uint8_t outcomes[CC_MAX];
  kvs_proto_slot_t slots[CC_MAX];
} cc_pstore_t;
int cc_prepare_store(cc_t *c, uint8_t strategy, uint8_t kind, const kvs_layout_t *layout,
                     const kvs_key_t *keys, uint32_t n, cc_pstore_t *out);
/* SHM commit naming slots[0..n). *committed (may be NULL) gets the reply's count. */
int cc_commit_shm(cc_t *c, uint64_t xfer, const kvs_proto_slot_t *slots, uint32_t n,
                  uint32_t *committed);
/* Inline commit of n objects of `layout`, bytes bufs[i] (kind CHUNKS), or one object under
 * keys[0] with aliases keys[1..n) (kind OBJECT, bufs[0]). xfer: an SHM reservation to abort
 * first, or 0. outcomes (may be NULL) get the reply's outcomes. */
int cc_commit_inline(cc_t *c, uint64_t xfer, uint8_t kind, const kvs_layout_t *layout,
                     const kvs_key_t *keys, uint32_t n, const void *const *bufs,
                     uint32_t *committed, uint8_t *outcomes);
/* Write every slot of a PREPARE_STORE reply with the pattern of its key (through the mapped
 * pool), then commit them all. keys are the request's keys. Returns the committed count. */
int cc_write_and_commit(cc_t *c, const cc_pstore_t *ps, const kvs_key_t *keys, uint8_t kind);
int cc_abort(cc_t *c, uint64_t xfer);
int cc_commit_retrieve(cc_t *c, uint64_t xfer);

typedef struct cc_pretr {
  uint64_t xfer;
  uint32_t n_found, n_objects;
  bool is_inline;
  kvs_proto_object_t objects[CC_MAX]; /* inline: data points into msg */
  cc_msg_t msg;                       /* keeps the inline bytes alive */
} cc_pretr_t;
int cc_prepare_retrieve(cc_t *c, uint8_t strategy, const kvs_key_t *keys, uint32_t n,
                        cc_pretr_t *out);
void cc_pretr_free(cc_pretr_t *r);
/* Bytes of object i of a retrieve reply: the inline data, or the mapped pool at its offset. */
const uint8_t *cc_object_bytes(const cc_t *c, const cc_pretr_t *r, uint32_t i);

/* STATS text into buf (NUL-terminated); returns its length. */
int cc_stats(cc_t *c, uint8_t format, char *buf, size_t cap);
/* PING with a nonce and echo bytes; checks the echo. Returns 0, -EPROTO on a wrong echo. */
int cc_ping(cc_t *c, uint64_t nonce, const void *echo, uint32_t echo_len);
/* EXPORT_TENSORS: decodes up to cap descriptors into descs; returns the count. */
int cc_export(cc_t *c, uint64_t addr, uint64_t len, kvs_tensor_desc_t *descs, size_t cap);

/* ---- in-process server -------------------------------------------------------------------- */

typedef struct ts_server {
  char root[128];        /* temp dir (mkdtemp); run_dir = root/run */
  kvs_options_t opts;    /* run_dir, group "t"; tests may change fields before start */
  kvs_stats_t stats;
  kvs_pool_t *pool;
  kvs_store_t *store;
  kvs_coord_t *coord;
  kvs_coord_tensors_t tensors;    /* EXPORT_TENSORS: may be set before start (query NULL:
                                     answers none) */
  uint64_t instance_id;
  uint8_t role;
  const kvs_coord_remote_t *remote; /* tiers below the pool (HELLO's CAP_REMOTE): may be set
                                     * before start; NULL: none */
  char path[KVS_SOCK_PATH_MAX + 1];
} ts_server_t;

/* Make a temp root and defaults (cache_bytes of cache arena). Does not start anything. */
int ts_server_init(ts_server_t *s, uint64_t cache_bytes);
/* Create pool, store and coordinator (opts as they are now). */
int ts_server_start(ts_server_t *s);
/* Stop the coordinator, destroy store and pool; remove the temp root when remove_root. */
void ts_server_stop(ts_server_t *s, bool remove_root);
/* What a test suite's .fini does: stop s and remove its root when it was initialised (its root
 * is set), then zero it. Accepts a zeroed s. */
void ts_server_reset(ts_server_t *s);
uint64_t ts_stat(const ts_server_t *s, kvs_stat_id_t id);

/* Store info snapshot. */
kvs_store_info_t ts_info(kvs_store_t *st);
/* Wait until the store has no more reservations, pins or transfers than base (and the
 * coordinator has no more than conns connections when coord is not NULL). Returns the
 * milliseconds it took, or -ETIMEDOUT. */
int ts_wait_baseline(kvs_store_t *st, const kvs_store_info_t *base, kvs_coord_t *coord,
                     unsigned conns, int timeout_ms);
/* The layout of a rows x cols chunk of bytes (u8, 2-D), as the chunk tests use. */
kvs_layout_t ts_chunk_layout(uint64_t rows, uint64_t cols);
/* Commit objects locally (owner LOCAL), each of `layout` filled with its key's pattern. */
int ts_local_put(kvs_store_t *st, const kvs_key_t *keys, uint32_t n, const kvs_layout_t *layout);
/* Leading run of READY keys in the store (no pin). */
int ts_local_count(kvs_store_t *st, const kvs_key_t *keys, uint32_t n);
/* Pin keys[0..n) locally and check each object's bytes against its key's pattern: returns the
 * number found and verified, or -EILSEQ on a mismatch. */
int ts_local_verify(kvs_store_t *st, const kvs_key_t *keys, uint32_t n);

/* ---- utilities ------------------------------------------------------------------------------ */

/* Deterministic distinct test keys: tk(seed, i). */
kvs_key_t tk(uint64_t seed, uint64_t i);
/* Pattern of a key: 64-bit words of a PRNG seeded by the key, little-endian, cut to len. */
void pat_fill(void *dst, uint64_t len, kvs_key_t key);
/* 0 when p[0..len) is key's pattern, else 1 + the offset of the first wrong byte's word. */
uint64_t pat_check(const void *p, uint64_t len, kvs_key_t key);

/* mkdtemp under /tmp with a prefix; rm -r. */
int ts_mkdtemp(char *buf, size_t cap, const char *prefix);
void ts_rmtree(const char *path);

/* Fork a child running fn(arg); the child _exits with fn's return value and is SIGKILLed if
 * the parent dies first. Returns the pid. */
pid_t ts_fork(int (*fn)(void *), void *arg);
/* Wait for a child at most timeout_ms (then SIGKILL it). Returns its exit code (0..255),
 * 128 + signal when killed by one, or -ETIMEDOUT. */
int ts_wait_child(pid_t pid, int timeout_ms);

uint64_t ts_now_ms(void);
_Noreturn void ts_die(const char *fmt, ...);

#endif
