/* tests/fakellama: a libllama stand-in for the llama shim's tests (design §15).
 *
 * It exports the llama.cpp state API under the real names and prototypes (llama.h of the
 * pinned llama.cpp), with a deterministic fake state that follows the REAL formats:
 *   in-memory sequence state   u32 0xaf143cd8, i32 seq_id, body
 *   sequence state file        u32 'ggsq' 0x67677371, u32 3, u32 n_tokens, i32 tokens[n], body
 *   session file (whole ctx)   u32 'ggsn' 0x6767736e, u32 10, u32 n_tokens, i32 tokens[n], state
 * and the same return values and failure behaviour where the shim depends on them:
 *   save_file returns 12 + 4n + |body| (0 when the file cannot be written); load_file returns
 *   the bytes it consumed, 0 on a missing file, a foreign magic/version, too many tokens or a
 *   state that does not fit the context, and with tokens_out == NULL only reports the token
 *   count (returns 12); set_data returns 0 on a wrong magic or a state that does not fit, and
 *   empties the destination sequence then (as llama.cpp does). Like the pinned llama.cpp, it
 *   ABORTS on a sequence state file whose body is truncated, so a test passing proves kvshim
 *   never hands it one.
 *
 * The fake KV. A model is a GGUF file (general.name, fakellama.block_count = n_layer,
 * fakellama.embedding_length = n_embd, then "weights"); its id is the XXH3-64 of the whole file.
 * A sequence holds cells; cell i is
 *     i32 pos, u64 chain_i, payload[n_layer * n_embd]
 * with chain_i = H(chain_{i-1}, token_i) and payload = PRNG(model id, kv_type, chain_i, pos):
 * the KV depends on the weights and on every token before it, so restoring another model's
 * state (even of the same shape) or another prefix is detected by fakellama_seq_check.
 * Body: u32 n_layer, u32 n_embd, u32 kv_type, u32 n_cells, cells. A context's kv_type stands
 * for the KV dtype: a state saved under one kv_type does not fit a context of another.
 *
 * Test knobs (environment, read at each call): FAKELLAMA_GET_DATA_FAIL=1 makes
 * llama_state_seq_get_data[_ext] return 0 (an engine error). */
#ifndef KVSHIM_FAKELLAMA_H
#define KVSHIM_FAKELLAMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAKELLAMA_API __attribute__((visibility("default")))

typedef int32_t llama_token;
typedef int32_t llama_seq_id;
typedef uint32_t llama_state_seq_flags;
struct llama_model;
struct llama_context;

#define FAKELLAMA_PARAMS_SENTINEL 0x4d414c4c454b4146ull /* "FAKELLAM" */

/* The fake's own layout, 80 bytes like the pinned llama.cpp's, passed by value like it. A load
 * whose params do not end in the sentinel (or lost n_gpu_layers) fails: that is how the tests
 * see that kvshim forwards the struct intact. */
struct llama_model_params {
  int32_t n_gpu_layers; /* llama_model_default_params: 999 */
  int32_t split_mode;
  int32_t main_gpu;
  int32_t reserved0;
  const float *tensor_split;
  void *progress_callback;
  void *progress_callback_user_data;
  const void *kv_overrides;
  bool vocab_only, use_mmap, use_mlock, check_tensors;
  uint32_t reserved1;
  uint64_t reserved2[2];
  uint64_t sentinel; /* FAKELLAMA_PARAMS_SENTINEL */
};

struct llama_context_params {
  uint32_t n_ctx;
  uint32_t n_seq_max; /* sequences 0 .. n_seq_max-1 */
  uint32_t kv_type;   /* stands for the KV dtype */
  uint32_t reserved;
  uint64_t sentinel;  /* FAKELLAMA_PARAMS_SENTINEL */
};

FAKELLAMA_API struct llama_model_params llama_model_default_params(void);
FAKELLAMA_API struct llama_model *llama_model_load_from_file(const char *path_model,
                                                             struct llama_model_params params);
FAKELLAMA_API void llama_model_free(struct llama_model *model);
FAKELLAMA_API struct llama_context_params llama_context_default_params(void);
FAKELLAMA_API struct llama_context *llama_init_from_model(struct llama_model *model,
                                                          struct llama_context_params params);
FAKELLAMA_API void llama_free(struct llama_context *ctx);
FAKELLAMA_API const struct llama_model *llama_get_model(const struct llama_context *ctx);

FAKELLAMA_API size_t llama_state_get_size(struct llama_context *ctx);
FAKELLAMA_API size_t llama_state_get_data(struct llama_context *ctx, uint8_t *dst, size_t size);
FAKELLAMA_API size_t llama_state_set_data(struct llama_context *ctx, const uint8_t *src,
                                          size_t size);
FAKELLAMA_API bool llama_state_load_file(struct llama_context *ctx, const char *path_session,
                                         llama_token *tokens_out, size_t n_token_capacity,
                                         size_t *n_token_count_out);
FAKELLAMA_API bool llama_state_save_file(struct llama_context *ctx, const char *path_session,
                                         const llama_token *tokens, size_t n_token_count);
FAKELLAMA_API size_t llama_state_seq_get_size(struct llama_context *ctx, llama_seq_id seq_id);
FAKELLAMA_API size_t llama_state_seq_get_data(struct llama_context *ctx, uint8_t *dst,
                                              size_t size, llama_seq_id seq_id);
FAKELLAMA_API size_t llama_state_seq_set_data(struct llama_context *ctx, const uint8_t *src,
                                              size_t size, llama_seq_id dest_seq_id);
FAKELLAMA_API size_t llama_state_seq_save_file(struct llama_context *ctx, const char *filepath,
                                               llama_seq_id seq_id, const llama_token *tokens,
                                               size_t n_token_count);
FAKELLAMA_API size_t llama_state_seq_load_file(struct llama_context *ctx, const char *filepath,
                                               llama_seq_id dest_seq_id, llama_token *tokens_out,
                                               size_t n_token_capacity, size_t *n_token_count_out);
FAKELLAMA_API size_t llama_state_seq_get_size_ext(struct llama_context *ctx, llama_seq_id seq_id,
                                                  llama_state_seq_flags flags);
FAKELLAMA_API size_t llama_state_seq_get_data_ext(struct llama_context *ctx, uint8_t *dst,
                                                  size_t size, llama_seq_id seq_id,
                                                  llama_state_seq_flags flags);
FAKELLAMA_API size_t llama_state_seq_set_data_ext(struct llama_context *ctx, const uint8_t *src,
                                                  size_t size, llama_seq_id dest_seq_id,
                                                  llama_state_seq_flags flags);

/* ---- fake-only API --------------------------------------------------------------------------- */

/* "Decode": append n tokens to a sequence (its KV cells). 0, or -1 (bad seq, n < 0). */
FAKELLAMA_API int32_t fakellama_decode(struct llama_context *ctx, llama_seq_id seq,
                                       const llama_token *tokens, int32_t n);
/* Empty a sequence. */
FAKELLAMA_API void fakellama_seq_clear(struct llama_context *ctx, llama_seq_id seq);
/* Cells in a sequence (-1: bad seq). */
FAKELLAMA_API int32_t fakellama_seq_n_cells(struct llama_context *ctx, llama_seq_id seq);
/* 1 when the sequence holds exactly the KV that decoding tokens[0, n) with this context's
 * model and kv_type gives; 0 otherwise. */
FAKELLAMA_API int fakellama_seq_check(struct llama_context *ctx, llama_seq_id seq,
                                      const llama_token *tokens, size_t n);

#ifdef __cplusplus
}
#endif
#endif
