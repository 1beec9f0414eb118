/* Fixture library: defines llama_decode with visibility FX_VIS ("default" unless set) and an
 * exported fx_run() that calls it from inside the library. Linked several ways by
 * CMakeLists.txt (plain, -Bsymbolic, -Bsymbolic-functions, hidden, protected). */
#include "fx.h"

#ifndef FX_VIS
#define FX_VIS "default"
#endif

volatile int fx_sink;

__attribute__((visibility(FX_VIS))) FX_KEEP int llama_decode(void *ctx, int n) {
  fx_sink += n;
  return ctx ? n : n + 1;
}

FX_EXPORT int fx_run(int n) { return llama_decode((void *)0, n) * 2; }
