/* Fixture executable: calls fx_binding_run() of the binding it links (libfx_binding.so, which
 * never reaches its exported llama_decode through a relocation, or libfx_binding_plt.so, which
 * calls it through its PLT) and prints the result. */
#include <stdio.h>

int fx_binding_run(int n);

int main(void) {
  printf("result=%d\n", fx_binding_run(41));
  return 0;
}
