/* tests/fakes/llama: libfakeplugin.so (see fakeplugin.h). Every call below reaches libfakellama
 * through this library's PLT, where a preloaded libkvshim.so interposes the hooked ones. */
#include "fakeplugin.h"

#define FP_CALL(name) name
#include "fakeplugin_calls.h"

__attribute__((visibility("default"))) const fakeplugin_api_t *fakeplugin_api(void) {
  return &fp_api;
}
