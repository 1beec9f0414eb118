/* shims/llama: the one list of llama.cpp entry points kvshim touches (style rule 5).
 *
 * KVS_LLAMA_HOOKS: the hooked entry points (exported from libkvshim.so under these exact ELF
 * names). Each row generates, in llama.c, the typed pointer to the real function
 * (kvs__llama_pfn_<name>), the row of the real-function table and of the dlsym substitution
 * table, and (through preload/exports.map.c) the version script line.
 * KVS_LLAMA_USES: functions of libllama kvshim calls itself (never hooked): typed pointers only.
 *
 * X(ret, name, params, args). The types are kvshim's own declarations of llama.h's ABI
 * (llama.c): opaque struct pointers, llama_token = llama_seq_id = int32_t,
 * llama_state_seq_flags = uint32_t, and struct llama_model_params passed by value as
 * kvs__llama_model_params_t (see llama.c for why that is safe). This header has no includes so
 * the preprocessor can turn it into the version script. */
#ifndef KVSHIM_LLAMA_HOOKS_H
#define KVSHIM_LLAMA_HOOKS_H

#define KVS_LLAMA_HOOKS(X)                                                                    \
  X(size_t, llama_state_seq_save_file,                                                        \
    (struct llama_context * ctx, const char *filepath, int32_t seq_id, const int32_t *tokens, \
     size_t n_token_count),                                                                   \
    (ctx, filepath, seq_id, tokens, n_token_count))                                           \
  X(size_t, llama_state_seq_load_file,                                                        \
    (struct llama_context * ctx, const char *filepath, int32_t dest_seq_id,                   \
     int32_t *tokens_out, size_t n_token_capacity, size_t *n_token_count_out),                \
    (ctx, filepath, dest_seq_id, tokens_out, n_token_capacity, n_token_count_out))            \
  X(size_t, llama_state_seq_get_size, (struct llama_context * ctx, int32_t seq_id),           \
    (ctx, seq_id))                                                                            \
  X(size_t, llama_state_seq_get_size_ext,                                                     \
    (struct llama_context * ctx, int32_t seq_id, uint32_t flags), (ctx, seq_id, flags))       \
  X(size_t, llama_state_seq_get_data,                                                         \
    (struct llama_context * ctx, uint8_t * dst, size_t size, int32_t seq_id),                 \
    (ctx, dst, size, seq_id))                                                                 \
  X(size_t, llama_state_seq_get_data_ext,                                                     \
    (struct llama_context * ctx, uint8_t * dst, size_t size, int32_t seq_id, uint32_t flags), \
    (ctx, dst, size, seq_id, flags))                                                          \
  X(size_t, llama_state_seq_set_data,                                                         \
    (struct llama_context * ctx, const uint8_t *src, size_t size, int32_t dest_seq_id),       \
    (ctx, src, size, dest_seq_id))                                                            \
  X(size_t, llama_state_seq_set_data_ext,                                                     \
    (struct llama_context * ctx, const uint8_t *src, size_t size, int32_t dest_seq_id,        \
     uint32_t flags),                                                                         \
    (ctx, src, size, dest_seq_id, flags))                                                     \
  X(bool, llama_state_save_file,                                                              \
    (struct llama_context * ctx, const char *path_session, const int32_t *tokens,             \
     size_t n_token_count),                                                                   \
    (ctx, path_session, tokens, n_token_count))                                               \
  X(bool, llama_state_load_file,                                                              \
    (struct llama_context * ctx, const char *path_session, int32_t *tokens_out,               \
     size_t n_token_capacity, size_t *n_token_count_out),                                     \
    (ctx, path_session, tokens_out, n_token_capacity, n_token_count_out))                     \
  X(struct llama_model *, llama_model_load_from_file,                                         \
    (const char *path_model, kvs__llama_model_params_t params), (path_model, params))         \
  X(void, llama_model_free, (struct llama_model * model), (model))

#define KVS_LLAMA_USES(X)                                                                     \
  X(const struct llama_model *, llama_get_model, (const struct llama_context *ctx), (ctx))

#endif
