/* Fixture executable that defines llama_decode itself and calls it: built -static when the
 * C library has an archive (else as a plain executable), and as a dynamic executable. */
#include <stdio.h>

#include "fx.h"

volatile int fx_sink;

FX_KEEP int llama_decode(void *ctx, int n) {
  fx_sink += n;
  return ctx ? n : n + 1;
}

int main(void) {
  printf("result=%d\n", llama_decode((void *)0, 41) * 2);
  return 0;
}
