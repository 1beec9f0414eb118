/* kvshim peer client: transfers (design §7, §3.5). The streaming copy out of a peer's pool,
 * write-behind (KVSHIM_PUSH=auto: objects queued with kvs_peers_push are copied from the local
 * store to a `kvshim serve` cache peer by one background thread, through a bounded queue; a full
 * queue drops and counts; kvs_peers_destroy flushes it for at most flush_ms), and the
 * registration of the cache peer's pool mapping with the accelerator. The SHM and inline
 * transfers of retrieve and store are internal (peer_conn.h). */
#ifndef KVSHIM_PEER_XFER_H
#define KVSHIM_PEER_XFER_H

#include <stddef.h>
#include <stdint.h>

#include "keys.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_peers kvs_peers_t;

/* Copy a retrieved object out of a peer's pool (what a sink does with its bytes): streaming
 * (non-temporal, cache-bypassing) stores from KVS_PEERS_COPY_NT_MIN bytes up when the CPU has
 * AVX2, memcpy below and elsewhere. Measured on the 2-vCPU machine of docs/PERF.md (source
 * outside the cache): streaming stores move 1.4-1.8x the bytes of memcpy from 256 KiB to
 * 16 MiB with a cold destination and about the same with a destination the cache still holds;
 * at 16 KiB into a cached destination they are half as fast. */
#define KVS_PEERS_COPY_NT_MIN (128u * 1024u)
void kvs_peers_copy(void *dst, const void *src, size_t n);
/* The streaming copy alone, at any size (memcpy without AVX2): for benchmarks and callers that
 * know their destination is not read back soon. */
void kvs_peers_copy_stream(void *dst, const void *src, size_t n);

/* Queue an object of the local store (found under keys[0]; keys[1..n) are its aliases to bind
 * at the cache peer too) for write-behind. Never blocks and never discovers: returns 0 when
 * queued, -ENOSPC when the queue is full (counted in push_dropped), -ENOTSUP when pushing is
 * off, there is no local store, or the last discovery found no cache peer. */
int kvs_peers_push(kvs_peers_t *p, const kvs_key_t *keys, size_t n);
/* Wait until the write-behind queue is empty or timeout_ms passed. Returns objects still queued. */
int kvs_peers_flush(kvs_peers_t *p, uint32_t timeout_ms);

/* Adopt the cache peer the last discovery found: register its pool mapping with the installed
 * accelerator, once per mapping, on a nice-19 thread started through prim (never the caller's
 * time). Returns 1 (registration started, now or before), 0 (no accelerator installed yet, or an
 * inline peer: nothing to register; call again later) or -ENOENT (no cache peer). */
int kvs_peers_pin_cache(kvs_peers_t *p);

#ifdef __cplusplus
}
#endif
#endif
