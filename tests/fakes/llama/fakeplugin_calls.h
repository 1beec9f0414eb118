/* tests/fakes/llama: the fakeplugin_api_t table over libfakellama, written once for its two users.
 * The includer defines FP_CALL(name), how a libfakellama function is reached:
 *   fakeplugin.c  FP_CALL(n) n       a PLT call, where a preloaded libkvshim.so interposes
 *   fakehost.c    FP_CALL(n) ct_##n  a pointer from dlsym(handle), as ctypes engines call
 * and gets fp_api, a static table of static wrappers. */
#ifndef KVSHIM_TESTS_FAKEPLUGIN_CALLS_H
#define KVSHIM_TESTS_FAKEPLUGIN_CALLS_H

#include "fakellama.h"
#include "fakeplugin.h"

#ifndef FP_CALL
#error "define FP_CALL(name) before including fakeplugin_calls.h"
#endif

static void *fp_model_load(const char *path) {
  return FP_CALL(llama_model_load_from_file)(path, FP_CALL(llama_model_default_params)());
}
static void fp_model_free(void *m) { FP_CALL(llama_model_free)(m); }
static void *fp_ctx_new(void *model, uint32_t n_seq, uint32_t kv_type) {
  struct llama_context_params cp = FP_CALL(llama_context_default_params)();
  cp.n_seq_max = n_seq;
  cp.type_k = cp.type_v = (int32_t)kv_type;
  return FP_CALL(llama_init_from_model)(model, cp);
}
static void fp_ctx_free(void *ctx) { FP_CALL(llama_free)(ctx); }
static int32_t fp_decode(void *ctx, int32_t seq, const int32_t *tokens, int32_t n) {
  return FP_CALL(fakellama_decode)(ctx, seq, tokens, n);
}
static void fp_seq_clear(void *ctx, int32_t seq) { FP_CALL(fakellama_seq_clear)(ctx, seq); }
static int fp_seq_check(void *ctx, int32_t seq, const int32_t *tokens, size_t n) {
  return FP_CALL(fakellama_seq_check)(ctx, seq, tokens, n);
}
static size_t fp_seq_save_file(void *ctx, const char *path, int32_t seq, const int32_t *tokens,
                               size_t n) {
  return FP_CALL(llama_state_seq_save_file)(ctx, path, seq, tokens, n);
}
static size_t fp_seq_load_file(void *ctx, const char *path, int32_t seq, int32_t *tokens_out,
                               size_t cap, size_t *n_out) {
  return FP_CALL(llama_state_seq_load_file)(ctx, path, seq, tokens_out, cap, n_out);
}
static size_t fp_seq_get_size(void *ctx, int32_t seq, bool ext, uint32_t flags) {
  return ext ? FP_CALL(llama_state_seq_get_size_ext)(ctx, seq, flags)
             : FP_CALL(llama_state_seq_get_size)(ctx, seq);
}
static size_t fp_seq_get_data(void *ctx, uint8_t *dst, size_t size, int32_t seq, bool ext,
                              uint32_t flags) {
  return ext ? FP_CALL(llama_state_seq_get_data_ext)(ctx, dst, size, seq, flags)
             : FP_CALL(llama_state_seq_get_data)(ctx, dst, size, seq);
}
static size_t fp_seq_set_data(void *ctx, const uint8_t *src, size_t size, int32_t seq, bool ext,
                              uint32_t flags) {
  return ext ? FP_CALL(llama_state_seq_set_data_ext)(ctx, src, size, seq, flags)
             : FP_CALL(llama_state_seq_set_data)(ctx, src, size, seq);
}
static bool fp_state_save_file(void *ctx, const char *path, const int32_t *tokens, size_t n) {
  return FP_CALL(llama_state_save_file)(ctx, path, tokens, n);
}
static bool fp_state_load_file(void *ctx, const char *path, int32_t *tokens_out, size_t cap,
                               size_t *n_out) {
  return FP_CALL(llama_state_load_file)(ctx, path, tokens_out, cap, n_out);
}

static const fakeplugin_api_t fp_api = {
    .version = FAKEPLUGIN_API_VERSION,
    .model_load = fp_model_load,
    .model_free = fp_model_free,
    .ctx_new = fp_ctx_new,
    .ctx_free = fp_ctx_free,
    .decode = fp_decode,
    .seq_clear = fp_seq_clear,
    .seq_check = fp_seq_check,
    .seq_save_file = fp_seq_save_file,
    .seq_load_file = fp_seq_load_file,
    .seq_get_size = fp_seq_get_size,
    .seq_get_data = fp_seq_get_data,
    .seq_set_data = fp_seq_set_data,
    .state_save_file = fp_state_save_file,
    .state_load_file = fp_state_load_file,
};

#endif
