/* Fixture "binding": llama.cpp linked into the binding itself, as @fugood/llama.node's
 * index.node links it statically. It exports the C API (llama_model_load_from_file,
 * llama_init_from_model, llama_decode: default visibility, as llama.h declares them), but its
 * own entry point fx_binding_run() calls the implementation directly, as the binding's C++ code
 * calls llama.cpp's internals (llama_context::decode): no relocation reaches the exported
 * symbols, so an LD_PRELOAD definition of llama_decode is never called. With FX_VIA_PLT it
 * calls the exported C API instead, through its PLT (interposable). */
#include "fx.h"

volatile int fx_sink;

static FX_KEEP int decode_impl(void *ctx, int n) {
  fx_sink += n;
  return ctx ? n : n + 1;
}
static FX_KEEP void *load_impl(const char *path) { return (void *)path; }
static FX_KEEP void *init_impl(void *model) { return model; }

FX_EXPORT FX_KEEP void *llama_model_load_from_file(const char *path, int params) {
  fx_sink += params;
  return load_impl(path);
}
FX_EXPORT FX_KEEP void *llama_init_from_model(void *model, int params) {
  fx_sink += params;
  return init_impl(model);
}
FX_EXPORT FX_KEEP int llama_decode(void *ctx, int n) { return decode_impl(ctx, n); }

FX_EXPORT int fx_binding_run(int n) {
#ifdef FX_VIA_PLT
  return llama_decode(llama_init_from_model(llama_model_load_from_file("m", 0), 0), n) * 2;
#else
  return decode_impl(init_impl(load_impl("m")), n) * 2;
#endif
}
