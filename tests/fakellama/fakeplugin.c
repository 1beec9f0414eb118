/* tests/fakellama: libfakeplugin.so (see fakeplugin.h). Every call below reaches libfakellama
 * through this library's PLT, where a preloaded libkvshim.so interposes the hooked ones. */
#include "fakeplugin.h"

#include "fakellama.h"

static void *p_model_load(const char *path) {
  return llama_model_load_from_file(path, llama_model_default_params());
}
static void p_model_free(void *m) { llama_model_free(m); }
static void *p_ctx_new(void *model, uint32_t n_seq, uint32_t kv_type) {
  struct llama_context_params cp = llama_context_default_params();
  cp.n_seq_max = n_seq;
  cp.type_k = cp.type_v = (int32_t)kv_type;
  return llama_init_from_model(model, cp);
}
static void p_ctx_free(void *ctx) { llama_free(ctx); }
static int32_t p_decode(void *ctx, int32_t seq, const int32_t *tokens, int32_t n) {
  return fakellama_decode(ctx, seq, tokens, n);
}
static void p_seq_clear(void *ctx, int32_t seq) { fakellama_seq_clear(ctx, seq); }
static int p_seq_check(void *ctx, int32_t seq, const int32_t *tokens, size_t n) {
  return fakellama_seq_check(ctx, seq, tokens, n);
}
static size_t p_seq_save_file(void *ctx, const char *path, int32_t seq, const int32_t *tokens,
                              size_t n) {
  return llama_state_seq_save_file(ctx, path, seq, tokens, n);
}
static size_t p_seq_load_file(void *ctx, const char *path, int32_t seq, int32_t *tokens_out,
                              size_t cap, size_t *n_out) {
  return llama_state_seq_load_file(ctx, path, seq, tokens_out, cap, n_out);
}
static size_t p_seq_get_size(void *ctx, int32_t seq, bool ext, uint32_t flags) {
  return ext ? llama_state_seq_get_size_ext(ctx, seq, flags) : llama_state_seq_get_size(ctx, seq);
}
static size_t p_seq_get_data(void *ctx, uint8_t *dst, size_t size, int32_t seq, bool ext,
                             uint32_t flags) {
  return ext ? llama_state_seq_get_data_ext(ctx, dst, size, seq, flags)
             : llama_state_seq_get_data(ctx, dst, size, seq);
}
static size_t p_seq_set_data(void *ctx, const uint8_t *src, size_t size, int32_t seq, bool ext,
                             uint32_t flags) {
  return ext ? llama_state_seq_set_data_ext(ctx, src, size, seq, flags)
             : llama_state_seq_set_data(ctx, src, size, seq);
}
static bool p_state_save_file(void *ctx, const char *path, const int32_t *tokens, size_t n) {
  return llama_state_save_file(ctx, path, tokens, n);
}
static bool p_state_load_file(void *ctx, const char *path, int32_t *tokens_out, size_t cap,
                              size_t *n_out) {
  return llama_state_load_file(ctx, path, tokens_out, cap, n_out);
}

static const fakeplugin_api_t api = {
    .version = FAKEPLUGIN_API_VERSION,
    .model_load = p_model_load,
    .model_free = p_model_free,
    .ctx_new = p_ctx_new,
    .ctx_free = p_ctx_free,
    .decode = p_decode,
    .seq_clear = p_seq_clear,
    .seq_check = p_seq_check,
    .seq_save_file = p_seq_save_file,
    .seq_load_file = p_seq_load_file,
    .seq_get_size = p_seq_get_size,
    .seq_get_data = p_seq_get_data,
    .seq_set_data = p_seq_set_data,
    .state_save_file = p_state_save_file,
    .state_load_file = p_state_load_file,
};

__attribute__((visibility("default"))) const fakeplugin_api_t *fakeplugin_api(void) {
  return &api;
}
