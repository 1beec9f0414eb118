/* kvshim coord: the coordinator thread that serves this process's store to peers (design §7).
 *
 * One thread, epoll, non-blocking sockets. It listens on $run_dir/<group>/<instance id>.sock
 * (the directories 0700, the socket 0600). Every accepted connection:
 *   1. SO_PEERCRED uid must be ours or listed in KVSHIM_ALLOW_UIDS, else it is refused (ERROR
 *      EACCES, closed, counted, logged);
 *   2. the first request must be HELLO; the reply chooses the strategy (SHM when the peer can
 *      map the pool and nobody forced inline) and carries the pool fd over SCM_RIGHTS for SHM;
 *   3. it becomes one store owner: every lease it takes ends when it closes.
 * Every request gets exactly one reply or an ERROR. A malformed frame gets an ERROR and the
 * connection is closed; every other connection goes on being served. A connection processes
 * one message at a time: while its reply has not been sent, no further request is read from it
 * (back-pressure without unbounded buffering).
 *
 * SHM transfers: PREPARE_STORE hands out slots (pool extents); COMMIT_STORE must name every
 * slot of that transfer exactly, each inside the pool and inside the transfer (else ERROR
 * EFAULT and the connection is closed: its reservations are aborted, never published).
 * Inline: COMMIT_STORE carries the bytes; a pending SHM reservation it names is aborted first
 * (the seed leaked it). PREPARE_RETRIEVE inline copies the bytes and releases the pins at once.
 *
 * Threads: the coordinator thread owns every connection; kvs_coord_start/stop are called from
 * one other thread. The store and the tensors' ctx are thread safe and borrowed. */
#ifndef KVSHIM_COORD_H
#define KVSHIM_COORD_H

#include <stddef.h>
#include <stdint.h>

#include "options.h"
#include "pool.h"
#include "stats.h"
#include "store.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_coord kvs_coord_t;

/* The remote tier as the coordinator sees it (`kvshim serve` with KVSHIM_REMOTE; design §17).
 * Both callbacks run on the coordinator thread and must not block (no network, no waiting on
 * the tier's threads): they take the store lock at most and hand work to the tier's threads.
 *   fetch      a LOOKUP with remote_wait_ms > 0 found only keys[0..found) in the pool: bring
 *              what the tier holds of keys[found..n) into the store (committed READY under the
 *              tier's own owner), then call kvs_coord_remote_done(coord, token) from any thread.
 *              keys is borrowed for the call only. Return 0 when started: the LOOKUP reply is
 *              deferred until done or deadline_ms (kvs__now_ms clock), whichever comes first,
 *              and the connection reads nothing meanwhile; a negative return answers at once.
 *   published  a peer's commit published objects: chunks (object false: one object per key) or
 *              one object under keys[0] with aliases keys[1..n). Queue them for write-behind. */
typedef struct kvs_coord_remote {
  void *ctx;
  int (*fetch)(void *ctx, const kvs_key_t *keys, size_t found, size_t n, uint64_t deadline_ms,
               uint64_t token);
  void (*published)(void *ctx, const kvs_key_t *keys, size_t n, bool object);
} kvs_coord_remote_t;

/* The exportable allocations as the coordinator sees them: what EXPORT_TENSORS
 * (docs/protocol.md 4.10) answers from (design §8). core owns only this interface; the
 * runtime's registry of intercepted allocations provides it (runtime/registry.h,
 * kvs_tensor_registry_coord).
 *   query  the descriptors covering [addr, addr + len) of the process's address space, in
 *          address order, one per overlapping exportable allocation, each restricted to the
 *          part of the allocation inside the range (a valid descriptor: kvs_tensor_validate).
 *          Writes up to cap of them to out (NULL when cap is 0) and returns how many there are
 *          (may exceed cap), or a negative errno: -EINVAL (len 0, addr + len overflows) is
 *          answered with an ERROR "bad address range". The coordinator calls it twice per
 *          request (count, then fill) and sends at most KVS_PROTO_MAX_DESCS. Runs on the
 *          coordinator thread, concurrently with the process's other threads: thread safe and
 *          never blocking beyond a short lock. ctx is borrowed: it outlives the coordinator. */
typedef struct kvs_coord_tensors {
  void *ctx;
  int (*query)(void *ctx, uint64_t addr, uint64_t len, kvs_tensor_desc_t *out, size_t cap);
} kvs_coord_tensors_t;

typedef struct kvs_coord_config {
  kvs_store_t *store;              /* borrowed, required */
  kvs_pool_t *pool;                /* borrowed: the store's pool, offered to SHM peers */
  const kvs_options_t *opts;       /* read at start: run_dir, group, strategy, max_frame,
                                      allow_uids (copied) */
  uint8_t role;                    /* KVS_PROTO_ROLE_ENGINE or KVS_PROTO_ROLE_CACHE */
  uint64_t instance_id;            /* non-zero; names the socket */
  const kvs_coord_tensors_t *tensors; /* copied; NULL = EXPORT_TENSORS answers none */
  kvs_stats_t *stats;              /* borrowed; NULL = kvs_stats_global() */
  const kvs_coord_remote_t *remote;/* copied; NULL = no remote tier (HELLO without CAP_REMOTE) */
} kvs_coord_config_t;

/* Create the run directory, bind the socket and start the thread. Errors: -EINVAL (config),
 * -ENAMETOOLONG (socket path over 107 bytes), -EPERM (run directory not ours or not private),
 * -EADDRINUSE (a live process already listens on that path), or the errno of a syscall. */
int kvs_coord_start(const kvs_coord_config_t *cfg, kvs_coord_t **out);
/* Stop: close the listening socket and remove its file, flush pending replies for at most
 * 200 ms, close every connection (ending its leases) and join the thread. Accepts NULL. */
void kvs_coord_stop(kvs_coord_t *coord);

const char *kvs_coord_socket_path(const kvs_coord_t *coord);
/* The remote tier finished the fetch started with `token` (any thread; never blocks; a token
 * whose LOOKUP was already answered or whose connection closed is ignored). */
void kvs_coord_remote_done(kvs_coord_t *coord, uint64_t token);
/* Connections currently open (for tests and `kvshim stats`). */
unsigned kvs_coord_connections(kvs_coord_t *coord);

/* Socket path for an instance in a group: "<run_dir>/<group>/<16 hex digits>.sock".
 * Returns 0 or -ENAMETOOLONG. */
int kvs_coord_socket_name(const char *run_dir, const char *group, uint64_t instance_id,
                          char *buf, size_t cap);
/* Render the STATS text (INFO or JSON) for a store: refreshes the store gauges first. */
size_t kvs_coord_render_stats(kvs_store_t *store, kvs_stats_t *stats, int json, char *buf,
                              size_t cap);

#ifdef __cplusplus
}
#endif
#endif
