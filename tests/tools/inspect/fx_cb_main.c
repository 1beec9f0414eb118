/* Fixture executable that defines kvo_lookup itself; its library libfx_cb.so calls it.
 * The executable precedes LD_PRELOAD in the lookup order, so the call binds here. */
#include <stdio.h>

#include <kvshim/kvo.h>

#include "fx.h"

KVO_API FX_KEEP int kvo_lookup(const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens) {
  (void)desc, (void)tokens;
  return (int)n_tokens + 7;
}

int main(void) {
  printf("result=%d\n", fx_cb_run(3));
  return 0;
}
