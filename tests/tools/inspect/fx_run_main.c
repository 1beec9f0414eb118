/* Fixture executable: calls fx_run() of the library it links (one of the fx_llama_lib
 * variants) and prints the result; the LD_PRELOAD probe shows whether llama_decode was
 * interposed. With FX_ALSO_DIRECT it also calls llama_decode itself (a PLT import), so one
 * route is interposable and the one inside the library may not be. */
#include <stdio.h>

#include "fx.h"

int main(void) {
#ifdef FX_ALSO_DIRECT
  printf("result=%d direct=%d\n", fx_run(41), llama_decode((void *)0, 1));
#else
  printf("result=%d\n", fx_run(41));
#endif
  return 0;
}
