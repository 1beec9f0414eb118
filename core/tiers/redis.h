/* kvshim redis: a small Redis client over hiredis (Debian libhiredis-dev 0.14, no cluster support
 * of its own), standalone or Redis Cluster, with millisecond deadlines and pipelining.
 * One kvs_redis_t is used by ONE thread at a time (each I/O thread owns its own). */
#ifndef KVSHIM_REDIS_H
#define KVSHIM_REDIS_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvs_redis kvs_redis_t;

/* A parsed KVSHIM_REMOTE URL: redis://[user:pass@]host:port[/db] or
 * redis+cluster://host:port[,host:port...]. Host may be a name, IPv4 or [IPv6]. */
#define KVS_REDIS_MAX_SEEDS 16
typedef struct kvs_redis_url {
  int cluster;                  /* 1 for redis+cluster:// */
  int db;                       /* 0..; always 0 for cluster */
  char user[64], password[128]; /* empty when absent */
  int n_seeds;                  /* 1 for redis:// */
  struct { char host[256]; uint16_t port; } seeds[KVS_REDIS_MAX_SEEDS];
} kvs_redis_url_t;

/* 0, or -EINVAL with a one-line reason in err (never containing the password). */
int kvs_redis_url_parse(const char *url, kvs_redis_url_t *out, char *err, size_t errlen);

typedef struct kvs_redis_config {
  kvs_redis_url_t url;
  const char *password;   /* when non-NULL, overrides url.password (KVSHIM_REMOTE_PASSWORD_FILE) */
  uint32_t timeout_ms;    /* deadline of connect and of each exec */
} kvs_redis_config_t;

/* Connect (AUTH, SELECT; CLUSTER SLOTS for a cluster). 0 or negative errno with a one-line
 * reason in err: -ECONNREFUSED, -ETIMEDOUT, -EACCES (auth refused), -EPROTO (not a Redis server,
 * or a reply of the wrong type), -EINVAL. The handle reconnects by itself on the next exec after
 * a connection error. */
int kvs_redis_create(const kvs_redis_config_t *cfg, kvs_redis_t **out, char *err, size_t errlen);
void kvs_redis_destroy(kvs_redis_t *r); /* accepts NULL */

/* One piece of an argument given in parts (see kvs_redis_cmd_t.parts). */
typedef struct kvs_redis_part {
  const void *base;
  size_t len;
} kvs_redis_part_t;

/* A bulk-string reply received straight into the caller's memory (kvs_redis_cmd_t.sink).
 * Once the reply is known to be a bulk string of len bytes and its first head_len =
 * min(head, len) bytes are in, dest(ctx, len, head_bytes, head_len) is called (at most once per
 * command and exec; head_bytes is valid during the call only) and returns where the other
 * len - head_len bytes go (room for all of them), or NULL to have them dropped. They are then
 * received into it from the socket (only bytes that came in with earlier data, at most the
 * line and a few dozen bytes, are copied), and the result is KVS_REDIS_STRING with that len and
 * str NULL. Any other reply (nil, error, ...) is returned as usual and dest is not called. A
 * result FAILED after dest was called means the destination may hold part of the bytes. */
typedef struct kvs_redis_sink {
  void *(*dest)(void *ctx, size_t len, const void *head, size_t head_len);
  void *ctx;
  size_t head; /* bytes shown to dest before it decides (e.g. a value header); <= 4096 */
} kvs_redis_sink_t;

/* One command: argv[0..argc) with lengths; key_arg is the index of the key argument used for
 * cluster routing (1 for GET/SET/DEL/...), or -1 for a keyless command (sent to any node).
 * Arguments are not copied beyond the call (hiredis formats them into its output buffer).
 * parts (optional, NULL for none): when parts[i] is non-NULL, argument i is the concatenation
 * of parts[i][0..nparts[i]) (argv[i] and argvlen[i] are then ignored): one RESP bulk string
 * whose length is the sum, each part of 4 KiB or more sent from the caller's memory, so e.g. a
 * value = small header + large payload needs no staging copy. The key argument cannot be given
 * in parts (-EINVAL). Parts must stay valid until exec returns. */
typedef struct kvs_redis_cmd {
  int argc;
  const char *const *argv;
  const size_t *argvlen;
  int key_arg;
  const kvs_redis_part_t *const *parts; /* NULL, or argc entries, each NULL or nparts[i] parts */
  const int *nparts;
  const kvs_redis_sink_t *sink;         /* NULL, or where a bulk reply goes (see above) */
} kvs_redis_cmd_t;

enum { KVS_REDIS_NIL = 0, KVS_REDIS_STRING, KVS_REDIS_STATUS, KVS_REDIS_INTEGER,
       KVS_REDIS_ERROR, KVS_REDIS_ARRAY, KVS_REDIS_FAILED /* no reply: timeout / conn error */ };

/* One reply. str/len point into memory owned by the handle, valid until the next exec or
 * kvs_redis_results_release on this handle. */
typedef struct kvs_redis_result {
  int type;            /* KVS_REDIS_* */
  const char *str;     /* STRING, STATUS, ERROR */
  size_t len;
  long long integer;   /* INTEGER; element count for ARRAY */
  int err;             /* FAILED: negative errno (-ETIMEDOUT, -ECONNRESET, ...) */
} kvs_redis_result_t;

/* Pipeline n commands (per node in cluster mode: MOVED refreshes the slot map and retries the
 * command once, ASK is followed once with ASKING), all within timeout_ms from the call.
 * Returns the number of results that are not FAILED (>= 0), or a negative errno when nothing
 * could be sent. results[i] answers cmds[i]. */
int kvs_redis_exec(kvs_redis_t *r, const kvs_redis_cmd_t *cmds, size_t n,
                   kvs_redis_result_t *results);
void kvs_redis_results_release(kvs_redis_t *r);

/* What `kvshim remote` prints. */
typedef struct kvs_redis_info {
  char version[32];      /* redis_version from INFO server */
  int cluster;           /* 0 standalone, 1 cluster */
  int n_nodes;           /* masters known (1 standalone) */
  int slots_covered;     /* 0..16384 (16384 standalone) */
  double rtt_us;         /* one PING round trip, median of a few */
} kvs_redis_info_t;
int kvs_redis_info(kvs_redis_t *r, kvs_redis_info_t *out);

/* CRC16 key slot as Redis Cluster computes it (hash tags honoured). */
unsigned kvs_redis_key_slot(const char *key, size_t len);

/* ---- additions beyond the first contract -------------------------------------------------- */

/* Notes on the functions above:
 * - timeout_ms 0 means 1000. Host names are resolved with getaddrinfo, which has no deadline
 *   (use addresses where that matters).
 * - exec reconnects a closed or failed connection at once (no back-off here: the caller's
 *   circuit breaker decides when to call). A connection whose server closed it while idle is
 *   noticed before sending, so a restarted server costs no failed command.
 * - A command that was sent and got no reply (timeout, reset) is FAILED and never resent (it
 *   may have run); only commands never sent (connection refused in a cluster) are re-routed
 *   after a slot map refresh. A timed-out connection is closed, so no late reply is ever
 *   matched to another command.
 * - Large arguments (>= 4 KiB), and large parts of an argument given in parts, are sent from
 *   the caller's memory (no copy). */

/* The last error of this handle as one line (no password), "" when the last call was clean. */
const char *kvs_redis_last_error(const kvs_redis_t *r);

/* The URL back as text with the password replaced by "***" (for logs and `kvshim remote`).
 * 0, -ENOSPC when buf is too small, -EINVAL. */
int kvs_redis_url_format(const kvs_redis_url_t *url, char *buf, size_t len);

#endif
