/* kvshim remote: the remote tier of `kvshim serve` (design §17) over core/tiers/redis.
 *
 * Only `kvshim serve` creates one; engines never talk to the network. It plugs into the
 * coordinator through kvs_coord_remote_t (coord.h):
 *   write path  every object a peer commits to serve is pinned (under the tier's own store
 *               owner) and queued; I/O threads write it behind with pipelined
 *               `SET kvshim:v1:<32 hex key> <value> NX PX <KVSHIM_REMOTE_TTL>`, the value given
 *               to core/tiers/redis in two parts (header from a small buffer, payload straight from
 *               the pinned extent: no staging copy), then unpin. A full queue
 *               (KVSHIM_REMOTE_QUEUE objects) drops and counts.
 *   read path   a LOOKUP with remote_wait_ms > 0 that the pool cannot answer whole is handed to
 *               an I/O thread, which GETs the missing keys (pipelined). Each reply is received
 *               through a kvs_redis_sink_t: once its header is in, the header is checked and
 *               an extent reserved, the payload goes from the socket straight into it (no
 *               copy), its hash is checked after and the extent committed (or aborted); then
 *               the coordinator is told (kvs_coord_remote_done). It never waits.
 *
 * Value (little-endian, KVS_REMOTE_HDR_SIZE bytes of header, then the payload):
 *     0 u32 magic "KVSR"   4 u16 version 1   6 u16 kind (0 object, 1 alias)
 *     8 key (lo u64, hi u64): the key the value is stored under
 *    24 u64 payload length  32 u64 XXH3-64 of the payload  40 u64 producer (serve instance id)
 *    48 u64 created (Unix ms)  56 u32 dtype  60 u32 ndim  64 u64[8] shape (unused dims 0)
 * An object's payload is its bytes (layout = dtype/shape, whose size must equal the payload
 * length). An alias's payload is the 16-byte key of its primary (dtype 0, ndim 0): an object
 * reachable under several keys is stored once, its aliases name it. A value that fails any
 * check (length, magic, version, kind, key, hash, layout) is a miss, is DELeted and counted
 * (remote_bad_values); none of its bytes reaches the pool.
 *
 * Faults: every call has the KVSHIM_REMOTE_TIMEOUT_MS deadline (core/tiers/redis). Three failures
 * in a row open a circuit breaker: for a back-off (500 ms doubling to 30 s) the tier is skipped
 * (lookups answered from the pool, writes dropped and counted), then one call probes it. Each
 * thread's connection is re-dialled only when the breaker lets a call through.
 *
 * Threads: create/attach/destroy from one thread (serve's main); the hooks run on the
 * coordinator thread; KVSHIM_REMOTE_THREADS I/O threads, each owning one kvs_redis_t. */
#ifndef KVSHIM_REMOTE_H
#define KVSHIM_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "coord.h"
#include "keys.h"
#include "options.h"
#include "redis.h"
#include "stats.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_REMOTE_MAGIC 0x5253564Bu /* "KVSR" little-endian */
#define KVS_REMOTE_VERSION 1u
#define KVS_REMOTE_HDR_SIZE 128u
#define KVS_REMOTE_KEY_PREFIX "kvshim:v1:"
#define KVS_REMOTE_KEY_LEN (sizeof KVS_REMOTE_KEY_PREFIX - 1 + KVS_KEY_HEX_LEN)
#define KVS_REMOTE_KIND_OBJECT 0u
#define KVS_REMOTE_KIND_ALIAS 1u

typedef struct kvs_remote kvs_remote_t;

typedef struct kvs_remote_config {
  const kvs_options_t *opts; /* read at create: remote, remote_password_file, remote_ttl,
                                remote_timeout_ms, remote_threads, remote_queue */
  kvs_store_t *store;        /* borrowed; must outlive the tier */
  uint64_t producer;         /* written into every value (serve's instance id) */
  kvs_stats_t *stats;        /* borrowed; NULL = kvs_stats_global() */
} kvs_remote_config_t;

/* Parse the URL, read the password file, try one connection and start the threads. A server
 * that cannot be reached now is not an error (the threads retry, behind the breaker): err then
 * holds a warning line and 0 is returned. Errors (tier off, err says why in one line, never
 * with the password): -EINVAL (URL, password file), -ENOMEM, or a pthread errno. */
int kvs_remote_create(const kvs_remote_config_t *cfg, kvs_remote_t **out, char *err,
                      size_t errlen);
/* The connection settings from the options: URL parsed, password read from
 * KVSHIM_REMOTE_PASSWORD_FILE into pw (which cfg->password then points at), timeout. 0, or
 * -EINVAL with one line in err (never the password): no URL, a URL that does not parse, an
 * unreadable or empty password file. Used by kvs_remote_create and `kvshim remote`. */
int kvs_remote_redis_config(const kvs_options_t *o, kvs_redis_config_t *cfg, char *pw,
                            size_t pw_cap, char *err, size_t errlen);
/* The hooks to put in kvs_coord_config_t.remote (valid while the tier lives). */
const kvs_coord_remote_t *kvs_remote_hooks(kvs_remote_t *r);
/* Set (or clear, NULL) the coordinator that fetch completions are reported to. Clear it before
 * kvs_coord_stop. */
void kvs_remote_attach(kvs_remote_t *r, kvs_coord_t *coord);
/* Write what is queued for at most flush_ms, stop the threads, unpin, free. Accepts NULL. */
void kvs_remote_destroy(kvs_remote_t *r, uint32_t flush_ms);

/* "kvshim:v1:" + 32 hex digits, NUL-terminated (buf >= KVS_REMOTE_KEY_LEN + 1). */
void kvs_remote_key_name(kvs_key_t key, char *buf);
/* Encode a value header for key (payload hash computed over payload[0..len)). */
void kvs_remote_header(uint8_t hdr[KVS_REMOTE_HDR_SIZE], kvs_key_t key, unsigned kind,
                       const kvs_layout_t *layout, const void *payload, uint64_t len,
                       uint64_t producer, uint64_t created_ms);
/* Check a whole value stored under key: 0 and its kind, layout and payload (into value), or
 * -EBADMSG. */
int kvs_remote_check(const void *value, size_t len, kvs_key_t key, unsigned *kind,
                     kvs_layout_t *layout, const uint8_t **payload, uint64_t *payload_len);

#ifdef __cplusplus
}
#endif
#endif
