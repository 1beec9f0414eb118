/* libkvo_default: the reference engine's own offload module.
 *
 * It defines the three kvo functions of <kvshim/kvo.h> the way an engine without kvshim would:
 * by default nothing is cached (kvo_lookup returns 0, kvo_load_chunk KVO_MISS, kvo_store_chunk
 * KVO_NOT_KEPT). After kvo_default_configure(bytes > 0) it keeps a private in-process LRU of at
 * most that many chunk bytes, like an engine's built-in CPU offload, so A/B runs can compare
 * kvshim (which interposes the kvo functions) against native offload.
 *
 * This module stands in for an engine's own code: it does not use kvshim in any way. */
#ifndef KVSHIM_REFENGINE_KVO_DEFAULT_H
#define KVSHIM_REFENGINE_KVO_DEFAULT_H

#include <stddef.h>

#include <kvshim/kvo.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Set the private cache's capacity in bytes of chunk data (0 = no cache, the default).
 * Shrinking evicts least recently used chunks until the cache fits; 0 frees every chunk.
 * Thread-safe. Returns 0 (it cannot fail today; the int is for future settings). */
KVO_API int kvo_default_configure(size_t native_cache_bytes);

#ifdef __cplusplus
}
#endif
#endif
