/* shims/llama: the one list of llama.cpp entry points kvshim touches (style rule 5).
 *
 * KVS_LLAMA_HOOKS: the hooked entry points (exported from libkvshim.so under these exact ELF
 * names). Each row generates, in llama.c, the typed pointer to the real function
 * (kvs__llama_pfn_<name>), the row of the real-function table and of the dlsym substitution
 * table (runtime/family_tables.h), through preload/exports.map.c the version script line, and
 * through tools/inspect the hooks `kvshim inspect` checks (with KVS_LLAMA_PREFIX_HOOKS).
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

/* The transparent prefix cache (prefix.c, design §10.3): a second hook family with its own
 * lists, same X(ret, name, params, args) rows. Types are prefix.c's declarations of llama.h:
 * kvs__llama_batch_t (struct llama_batch by value), kvs__llama_ctx_params_t (struct
 * llama_context_params by value, forwarded like kvs__llama_model_params_t), kvs__llama_memory_t
 * (llama_memory_t), llama_pos = int32_t. KVS_LLAMA_PREFIX_HOOKS are exported; every function
 * that takes an engine batch index (_ith, llama_sampler_sample) is among them, so output indices
 * can be remapped when tokens were skipped. The last two rows are libggml-base's, which
 * libllama's state reader and writer call through the PLT: during kvshim's own direct loads and
 * snapshots they move the tensor runs from or into the chunks where they lie (prefix.c, design
 * §10.4); otherwise they pass straight through. */
#define KVS_LLAMA_PREFIX_HOOKS(X)                                                             \
  X(struct llama_context *, llama_init_from_model,                                            \
    (struct llama_model * model, kvs__llama_ctx_params_t params), (model, params))            \
  X(void, llama_free, (struct llama_context * ctx), (ctx))                                    \
  X(int32_t, llama_decode, (struct llama_context * ctx, kvs__llama_batch_t batch), (ctx, batch)) \
  X(float *, llama_get_logits_ith, (struct llama_context * ctx, int32_t i), (ctx, i))          \
  X(float *, llama_get_embeddings_ith, (struct llama_context * ctx, int32_t i), (ctx, i))      \
  X(int32_t, llama_get_sampled_token_ith, (struct llama_context * ctx, int32_t i), (ctx, i))   \
  X(float *, llama_get_sampled_probs_ith, (struct llama_context * ctx, int32_t i), (ctx, i))   \
  X(uint32_t, llama_get_sampled_probs_count_ith, (struct llama_context * ctx, int32_t i),      \
    (ctx, i))                                                                                 \
  X(float *, llama_get_sampled_logits_ith, (struct llama_context * ctx, int32_t i), (ctx, i))  \
  X(uint32_t, llama_get_sampled_logits_count_ith, (struct llama_context * ctx, int32_t i),     \
    (ctx, i))                                                                                 \
  X(int32_t *, llama_get_sampled_candidates_ith, (struct llama_context * ctx, int32_t i),      \
    (ctx, i))                                                                                 \
  X(uint32_t, llama_get_sampled_candidates_count_ith, (struct llama_context * ctx, int32_t i), \
    (ctx, i))                                                                                 \
  X(int32_t, llama_sampler_sample,                                                            \
    (struct llama_sampler * smpl, struct llama_context * ctx, int32_t idx), (smpl, ctx, idx))  \
  X(void, llama_memory_clear, (kvs__llama_memory_t mem, bool data), (mem, data))              \
  X(bool, llama_memory_seq_rm, (kvs__llama_memory_t mem, int32_t seq_id, int32_t p0, int32_t p1), \
    (mem, seq_id, p0, p1))                                                                    \
  X(void, llama_memory_seq_cp,                                                                \
    (kvs__llama_memory_t mem, int32_t src, int32_t dst, int32_t p0, int32_t p1),              \
    (mem, src, dst, p0, p1))                                                                  \
  X(void, llama_memory_seq_keep, (kvs__llama_memory_t mem, int32_t seq_id), (mem, seq_id))    \
  X(void, llama_memory_seq_add,                                                               \
    (kvs__llama_memory_t mem, int32_t seq_id, int32_t p0, int32_t p1, int32_t delta),         \
    (mem, seq_id, p0, p1, delta))                                                             \
  X(void, llama_memory_seq_div,                                                               \
    (kvs__llama_memory_t mem, int32_t seq_id, int32_t p0, int32_t p1, int d),                 \
    (mem, seq_id, p0, p1, d))                                                                 \
  X(void, llama_set_embeddings, (struct llama_context * ctx, bool on), (ctx, on))              \
  X(void, llama_set_causal_attn, (struct llama_context * ctx, bool on), (ctx, on))             \
  X(int32_t, llama_set_adapters_lora,                                                         \
    (struct llama_context * ctx, struct llama_adapter_lora * *adapters, size_t n,             \
     float *scales),                                                                          \
    (ctx, adapters, n, scales))                                                               \
  X(int32_t, llama_set_adapter_cvec,                                                          \
    (struct llama_context * ctx, const float *data, size_t len, int32_t n_embd,               \
     int32_t il_start, int32_t il_end),                                                       \
    (ctx, data, len, n_embd, il_start, il_end))                                               \
  X(bool, llama_set_sampler,                                                                  \
    (struct llama_context * ctx, int32_t seq_id, struct llama_sampler * smpl),                \
    (ctx, seq_id, smpl))                                                                      \
  X(size_t, llama_state_set_data, (struct llama_context * ctx, const uint8_t *src, size_t size), \
    (ctx, src, size))                                                                         \
  X(void, ggml_backend_tensor_set,                                                            \
    (struct ggml_tensor * tensor, const void *data, size_t offset, size_t size),              \
    (tensor, data, offset, size))                                                             \
  X(void, ggml_backend_tensor_get,                                                            \
    (const struct ggml_tensor *tensor, void *data, size_t offset, size_t size),               \
    (tensor, data, offset, size))

/* Functions of libllama the prefix cache calls itself (never hooked by it; the state functions
 * are hooked by the other family, and prefix.c calls their real definitions). */
#define KVS_LLAMA_PREFIX_USES(X)                                                              \
  X(kvs__llama_ctx_params_t, llama_context_default_params, (void), ())                        \
  X(kvs__llama_memory_t, llama_get_memory, (const struct llama_context *ctx), (ctx))          \
  X(uint32_t, llama_n_ctx_seq, (const struct llama_context *ctx), (ctx))                      \
  X(uint32_t, llama_n_seq_max, (const struct llama_context *ctx), (ctx))                      \
  X(uint32_t, llama_n_ubatch, (const struct llama_context *ctx), (ctx))                       \
  X(int32_t, llama_memory_seq_pos_min, (kvs__llama_memory_t mem, int32_t seq_id), (mem, seq_id)) \
  X(int32_t, llama_memory_seq_pos_max, (kvs__llama_memory_t mem, int32_t seq_id), (mem, seq_id)) \
  X(bool, llama_model_has_encoder, (const struct llama_model *model), (model))                \
  X(bool, llama_model_is_recurrent, (const struct llama_model *model), (model))               \
  X(bool, llama_model_is_hybrid, (const struct llama_model *model), (model))                  \
  X(bool, llama_model_is_diffusion, (const struct llama_model *model), (model))               \
  X(int32_t, llama_model_n_swa, (const struct llama_model *model), (model))                   \
  X(bool, llama_supports_gpu_offload, (void), ())                                             \
  X(size_t, llama_state_seq_get_size_ext, (struct llama_context * ctx, int32_t seq, uint32_t fl), \
    (ctx, seq, fl))                                                                           \
  X(size_t, llama_state_seq_get_data_ext,                                                     \
    (struct llama_context * ctx, uint8_t * dst, size_t size, int32_t seq, uint32_t fl),        \
    (ctx, dst, size, seq, fl))                                                                \
  X(size_t, llama_state_seq_set_data_ext,                                                     \
    (struct llama_context * ctx, const uint8_t *src, size_t size, int32_t seq, uint32_t fl),   \
    (ctx, src, size, seq, fl))                                                                \
  X(size_t, llama_state_seq_get_size, (struct llama_context * ctx, int32_t seq), (ctx, seq))   \
  X(size_t, llama_state_seq_get_data,                                                         \
    (struct llama_context * ctx, uint8_t * dst, size_t size, int32_t seq), (ctx, dst, size, seq)) \
  X(size_t, llama_state_seq_set_data,                                                         \
    (struct llama_context * ctx, const uint8_t *src, size_t size, int32_t seq),               \
    (ctx, src, size, seq))

#endif
