/* Fixture library: a trivial kvo offload module (all three hooks, default visibility). */
#include <kvshim/kvo.h>

#include "fx.h"

int kvo_lookup(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens) {
  (void)desc, (void)tokens;
  return (int)(n_tokens % 5) + 7;
}
int kvo_load_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens, size_t chunk,
                   int kind, uint64_t buf, size_t len) {
  (void)desc, (void)tokens, (void)n_tokens, (void)chunk, (void)kind, (void)buf, (void)len;
  return KVO_MISS;
}
int kvo_store_chunk(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens, size_t chunk,
                    int kind, uint64_t buf, size_t len) {
  (void)desc, (void)tokens, (void)n_tokens, (void)chunk, (void)kind, (void)buf, (void)len;
  return KVO_NOT_KEPT;
}
