/* kvshim peer client, internal: the connection table and the RPC layer shared by the peer
 * client's files (design §7): peer_conn.c (connections, framing, HELLO, back-off), peer_discover.c
 * (the scan of the group directory), peer_xfer.c (SHM and inline transfers, write-behind, the
 * pool-pinning thread, the streaming copy) and peer.c (the queries). Nothing outside them
 * includes this header.
 *
 * Locks: table_lock guards the table (conns, refs, listed, has_cache, last_discover_ms, the
 * penalties); discover_lock admits one scan at a time and is taken before table_lock; a
 * connection's lock serialises the calls on it and is never held while table_lock is taken. */
#ifndef KVSHIM_PEER_CONN_H
#define KVSHIM_PEER_CONN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "accel.h"
#include "peer.h"
#include "pool.h"
#include "proto.h"

#define MAX_REPLY_BYTES (2ull << 30)
#define PUSH_MAX_KEYS 256u
#define PENALTY_SLOTS 64
#define PENALTY_MIN_MS 1000u
#define PENALTY_MAX_MS 30000u

typedef struct pconn {
  struct pconn *next;
  pthread_mutex_t lock; /* serialises calls on fd */
  int fd;               /* -1 when dead */
  uint64_t next_rid;
  uint32_t peer_max_frame;
  uint32_t peer_caps;   /* the server's HELLO caps */
  kvs_peer_info_t info;
  kvs_pool_t *pool;     /* the peer's pool, mapped (SHM) or NULL (inline) */
  /* Which KVS__PEER_GRANULE granules of that mapping kvs__peer_place has populated: one bit
   * each, set once their page tables are filled, never cleared while the mapping lives (the
   * peer's pages stay: serve never punches its pool). NULL: nothing populated (no pool, or no
   * memory for the bits); populate_off: the kernel cannot (before 5.14). */
  _Atomic uint64_t *populated;
  _Atomic bool populate_off;
  bool remote;          /* its HELLO offered KVS_PROTO_CAP_REMOTE (a serve with a remote tier) */
  uint64_t unread_rid;  /* a request sent with rpc_post whose reply is still unread (0: none) */
  /* Bytes read from fd but not consumed yet: a reply's header and a small payload arrive with
   * one recvmsg (the rest of a large payload is read straight into its buffer). */
  uint32_t rx_pos, rx_len;
  uint8_t rx[4096];
  uint16_t unread_op;
  unsigned refs;        /* callers using it outside the table lock; guarded by table lock */
  bool listed;          /* still in the table */
  /* The pool mapping registered with the accelerator's driver (kvs__peer_pin_start): pin_started
   * under the table lock; pin_ops, pin_stats set before the thread starts; pinned written by
   * the thread and read after pthread_join (kvs__peer_conn_free). */
  bool pin_started;
  bool pinned;
  pthread_t pin_thread;
  const kvs_accel_ops_t *pin_ops;
  kvs_stats_t *pin_stats;
} pconn_t;

typedef struct push_item {
  struct push_item *next;
  uint32_t n;
  kvs_key_t keys[];
} push_item_t;

struct kvs_peers {
  kvs_options_t opts;
  char dir[4096];
  uint64_t instance_id;
  uint8_t role;
  kvs_store_t *local;
  kvs_stats_t *stats;
  pthread_mutex_t table_lock;   /* guards conns, refs, listed, has_cache, last_discover_ms */
  pthread_mutex_t discover_lock;/* one discovery at a time */
  pconn_t *conns;
  bool has_cache;
  uint64_t last_discover_ms;
  /* The group directory's modification time when the last scan began (discover_lock; zero
   * while that time was too recent to trust: peer_discover.c, settled_mtime): a
   * socket created or removed since changes it, and the next discovery then scans at once
   * instead of waiting out DISCOVER_INTERVAL_MS (a peer that starts just after a scan is found
   * by the next lookup, not up to 200 ms later). */
  struct timespec dir_mtime;
  /* Peers that failed recently are not re-dialled before retry_at (1 s, doubling to 30 s): a
   * stuck peer that still accepts connections would otherwise cost every discovery a whole
   * RPC deadline on the engine's thread. Guarded by table_lock. */
  struct { uint64_t id, retry_at_ms; uint32_t backoff_ms; } penalty[PENALTY_SLOTS];
  /* write-behind */
  pthread_mutex_t push_lock;    /* guards the queue fields below */
  pthread_cond_t push_cond;
  push_item_t *q_head, *q_tail;
  uint32_t q_len, q_cap;
  bool push_busy, push_stop, push_thread_started;
  pthread_t push_thread;
  kvs_owner_t push_owner;
  uint32_t flush_ms;
};

/* ---- peer_conn.c: connections and calls ---------------------------------------------------- */

/* Now plus KVSHIM_RPC_TIMEOUT_MS, in ns: the deadline of one call. */
uint64_t kvs__peer_deadline(const kvs_peers_t *p);
/* Read exactly len bytes of c's stream (c->lock held); fd_out (may be NULL) gets an fd passed
 * with them. 0 or a negative errno. */
int kvs__peer_rx_read(pconn_t *c, void *dst, size_t len, int *fd_out, uint64_t deadline);
/* Send request rid, split at the peer's max_frame. 0 or a transport errno. */
int kvs__peer_send_request(pconn_t *c, uint16_t op, uint64_t rid, const void *req,
                           size_t req_len, uint64_t deadline);
/* Read and drop the reply to a posted request (kvs__peer_rpc_post). 0 or a transport errno. */
int kvs__peer_drain(kvs_peers_t *p, pconn_t *c, uint64_t deadline);
/* With table_lock held: is id held off (a recent failure)? clear = true forgets it. */
bool kvs__peer_penalized(kvs_peers_t *p, uint64_t id, uint64_t now, bool clear);
/* Count, hold the peer off, close the connection; returns rc. */
int kvs__peer_conn_failed(kvs_peers_t *p, pconn_t *c, uint16_t op, int rc);
/* One request/response (c->lock held); *reply malloc'd. 0, the peer's ERROR code (connection
 * kept) or another negative errno (connection closed). */
int kvs__peer_rpc(kvs_peers_t *p, pconn_t *c, uint16_t op, const void *req, size_t req_len,
                  uint8_t **reply, size_t *reply_len, int *fd_out);
/* The most requests one kvs__peer_rpc_batch sends before it reads: their small requests and
 * replies (a few hundred bytes each) fit a socket's buffers together, so the peer never blocks
 * writing a reply we have not begun to read while we are still sending. */
#define KVS__PEER_BATCH_MAX 64
/* n requests of one opcode sent back to back (pipelining, docs/protocol.md 2.2), then their
 * replies read in order (c->lock held): one round trip for all. Only for small requests and
 * replies (above). 0 with replies[i] (malloc'd, the caller frees) and reply_lens[i], rcs[i] 0
 * or the peer's ERROR code for request i (replies[i] NULL); or a transport errno (connection
 * closed, replies all NULL). */
int kvs__peer_rpc_batch(kvs_peers_t *p, pconn_t *c, uint16_t op, uint8_t *const *reqs,
                        const size_t *req_lens, size_t n, uint8_t **replies, size_t *reply_lens,
                        int *rcs);
/* Send a request whose tiny reply the next call on c reads and drops. */
int kvs__peer_rpc_post(kvs_peers_t *p, pconn_t *c, uint16_t op, const void *req, size_t req_len);
/* Connect to path and HELLO: a new connection, not in the table, or NULL. */
pconn_t *kvs__peer_dial(kvs_peers_t *p, const char *path, uint64_t id);
/* Close, unpin, unmap and free a connection nobody references. */
void kvs__peer_conn_free(pconn_t *c);
/* Take a reference on the live connection to instance (0: the cache peer when prefer_cache,
 * else the first live one), or NULL; kvs__peer_unref gives it back. */
pconn_t *kvs__peer_grab(kvs_peers_t *p, uint64_t instance, bool prefer_cache);
void kvs__peer_unref(kvs_peers_t *p, pconn_t *c);
/* Take n more references on c (the caller holds one). */
void kvs__peer_ref(kvs_peers_t *p, pconn_t *c, unsigned n);
/* How long a server may wait before it replies: three quarters of our deadline. */
uint32_t kvs__peer_reply_wait_ms(const kvs_peers_t *p);
/* The one live peer without a remote tier, when there is exactly one live peer; else 0. */
uint64_t kvs__peer_sole(kvs_peers_t *p);

/* Encode with a size query and call; rc gets 0 or a negative errno (a statement, ISO C). */
#define KVS__PEER_RPC(rc, p, c, op, encfn, msgp, reply, reply_len)                              \
  do {                                                                                        \
    size_t n_ = 0;                                                                            \
    int r_ = encfn((msgp), NULL, 0, &n_);                                                     \
    uint8_t *b_ = r_ == 0 ? malloc(n_ ? n_ : 1) : NULL;                                       \
    if (r_ == 0) r_ = b_ ? encfn((msgp), b_, n_, &n_) : -ENOMEM;                              \
    if (r_ == 0) r_ = kvs__peer_rpc((p), (c), (op), b_, n_, (reply), (reply_len), NULL);           \
    free(b_);                                                                                 \
    (rc) = r_;                                                                                \
  } while (0)

/* ---- peer_xfer.c: transfers ------------------------------------------------------------------ */

/* Destination buffers of an inline retrieve received straight from the socket. */
typedef struct kvs__peer_into {
  void *const *bufs;
  const uint64_t *caps;
  uint64_t *lens;
} kvs__peer_into_t;

/* PREPARE_RETRIEVE (inline) on c (c->lock held), objects received into into's buffers. */
int kvs__peer_retrieve_inline_into(kvs_peers_t *p, pconn_t *c,
                                   const kvs_proto_prepare_retrieve_t *m, kvs_proto_object_t *objs,
                                   size_t cap, const kvs__peer_into_t *into,
                                   kvs_proto_prepare_retrieve_reply_t *r, int *delivered);
/* kvs__peer_place remembers the parts of the peer's pool it populated in granules of 64 KiB
 * (one bit each: 2 KiB of bits for a 1 GiB pool), and leaves places under 64 KiB to their
 * faults (a few faults cost what one madvise does). */
#define KVS__PEER_GRANULE ((uint64_t)64 << 10)
#define KVS__PEER_POPULATE_MIN KVS__PEER_GRANULE
/* The len bytes at offset, a place the peer named in its pool (a PREPARE_STORE slot, a
 * PREPARE_RETRIEVE object), in c's mapping of that pool, or NULL when they do not lie inside
 * it (the peer's word is checked before a byte there is read or written) or without a mapping.
 * A place of KVS__PEER_POPULATE_MIN or more has its page tables filled first, one
 * MADV_POPULATE (write when the mapping is writable) per run of the granules it touches that
 * are not populated whole yet, instead of one fault per 4 KiB page on first touch
 * (docs/PERF.md 14.1): serve's pages exist, this process's page tables for them do not.
 * NULL too when the populate fails for real (ENOMEM, EFAULT, EHWPOISON): touching those pages
 * would kill the engine with SIGBUS; the caller's copy fails instead. */
uint8_t *kvs__peer_place(pconn_t *c, uint64_t offset, uint64_t len);
/* ABORT write transfer xfer on c (c->lock held); a failed abort only costs the peer a lease. */
void kvs__peer_abort(kvs_peers_t *p, pconn_t *c, uint64_t xfer);
/* After PREPARE_STORE's reply (rep freed here): the SHM copy and COMMIT_STORE (or ABORT). */
int kvs__peer_store_shm(kvs_peers_t *p, pconn_t *c, uint8_t *rep,
                        const kvs_proto_prepare_store_reply_t *rp, bool object,
                        const void *const *bufs, uint8_t *outcomes, kvs_peer_copy_fn copy,
                        void *cctx);
/* After PREPARE_STORE's reply (rep freed here): the inline COMMIT_STORE with the bytes. */
int kvs__peer_store_inline(kvs_peers_t *p, pconn_t *c, uint8_t *rep,
                           const kvs_proto_prepare_store_reply_t *rp, const kvs_key_t *keys,
                           size_t n, const kvs_layout_t *layout, bool object,
                           const void *const *bufs, uint8_t *outcomes);
/* Under table_lock: start registering cache peer c's pool mapping (once; needs an accelerator). */
void kvs__peer_pin_start(kvs_peers_t *p, pconn_t *c);
/* Join the registration thread and unregister (before the mapping goes). */
void kvs__peer_unpin(pconn_t *c);
/* Create's half of write-behind: start its thread (through prim) when this client pushes. */
void kvs__peer_push_start(kvs_peers_t *p);
/* Destroy's half of write-behind: flush (bounded), stop and join the thread, drop the rest. */
void kvs__peer_push_stop(kvs_peers_t *p);

#endif
