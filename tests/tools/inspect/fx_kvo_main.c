/* Fixture executable: imports kvo_lookup (a PLT call into libfx_kvo.so, or through
 * libfx_mid.so when built with FX_VIA_MID). */
#include <stdio.h>

#include <kvshim/kvo.h>

#include "fx.h"

int main(void) {
#ifdef FX_VIA_MID
  printf("result=%d\n", fx_mid_run(3));
#else
  printf("result=%d\n", kvo_lookup(NULL, NULL, 3));
#endif
  return 0;
}
