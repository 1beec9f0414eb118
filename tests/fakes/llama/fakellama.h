/* tests/fakes/llama: a libllama stand-in for the llama shim's tests (design §15).
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
 * Body: the pinned llama.cpp's own layout (llama_kv_cache::state_write: stream counts, cell
 * metadata, per-layer K rows, per-layer V rows or, flash_attn_type 0, V transposed), the cell's
 * payload as the K rows and its chain as the V (fakellama.c body_write), read back with the real
 * reader's checks (body_read), so kvshim's chunk codec is tested on it. A context's kv_type (its
 * type_k) stands for the KV dtype: a state saved under one kv_type does not fit a context of
 * another. chain_i also mixes in the previous cell's payload and the kernel class of the
 * ubatch that computed cell i, as a real backend's numerics depend on it (measured on the
 * pinned ggml-cpu): class = (ubatch rows >= 64: the tiled flash-attention path) and (row below
 * the ubatch's last multiple of 4: the 4-row GEMM of repacked weights) and, for a long ubatch,
 * whether its first position is a multiple of 64 (the tiled path cuts the ubatch's query rows
 * into tiles of GGML_FA_TILE_Q = 64 from its first row, ggml-cpu ops.cpp; kvshim's rules
 * (design §10.3) count only tiles aligned to positions as canonical, and the fake holds it to
 * that: a restore that moved a decoded ubatch's start off the 64-grid, or replaced a batch the
 * engine would have computed in another class, changes every later cell and output).
 * fakellama_decode and fakellama_seq_check use the full class (a long, aligned batch).
 *
 * Loading a state's tensor data follows the pinned llama.cpp's readers (fakellama.c
 * state_io_t): the body's metadata is parsed and checked as it is read, but its K and V
 * runs are only recorded against the context's fake KV tensors (per stream and layer a K and a
 * V tensor, fakeggml.h) and written afterwards, each with ggml_backend_tensor_set, a call into
 * libfakeggml.so (a NEEDED library) through libfakellama's PLT, so a preloaded library can
 * interpose it. From memory (set_data) every run is written once the parse has ended, in
 * record order, also after a parse that failed half-way (llama_io_read_host's destructor);
 * from a file (load_file) each run is written as it is read (llama_io_read_file). The fake's
 * KV is then built from the tensors' bytes only. ggml_backend_tensor_set aborts on a write out
 * of its tensor's bounds, as the real one does.
 * Saving one follows the pinned writers the same way: the fake first puts the sequences' KV
 * into the same tensors (sized as a load sizes them, a sequence at cell 0 of its stream), then
 * writes the metadata into the state as it goes and reads each K and V run, at the offsets
 * the loader writes it, with ggml_backend_tensor_get through the PLT: into memory
 * (get_data) every run once the writer has ended, in record order (llama_io_write_host's
 * destructor); into a file (save_file) each run as it comes (llama_io_write_file). The state's
 * tensor bytes are only what ggml_backend_tensor_get returned.
 *
 * llama_decode follows the pinned llama_batch_allocr: tokens < FAKELLAMA_N_VOCAB, sequence ids
 * < n_seq_max, pos NULL continues each sequence after its last cell, seq_id NULL means 0,
 * logits NULL outputs the last token (every token with embeddings), a sequence's batch
 * positions must start right after its last cell and be continuous; n_tokens <= n_batch; it
 * splits into ubatches of n_ubatch; a sequence that would exceed n_ctx cells returns 1 and
 * nothing changes. Outputs: n_vocab logits per output token, a function of the output cell
 * (chain, pos), the model and kv_type; llama_get_logits_ith(i) as the real one (negative i from
 * the last output, NULL and a message on stderr for an index without output).
 * llama_sampler_sample (greedy) reads the logits through llama_get_logits_ith via the PLT, as
 * the shipped libllama does. FAKELLAMA_GPU=1 makes llama_supports_gpu_offload return true.
 *
 * Test knobs (environment, read at each call): FAKELLAMA_GET_DATA_FAIL=1 makes
 * llama_state_seq_get_data[_ext] return 0 (an engine error); FAKELLAMA_SET_DATA_FAIL_OVER=N
 * makes llama_state_seq_set_data[_ext] refuse a state of more than N cells (0, destination
 * emptied); FAKELLAMA_DECODE_TOUCH=PATH creates PATH when a llama_decode call starts,
 * FAKELLAMA_DECODE_DELAY_MS=N then sleeps N ms (a slow engine, caught in the middle of a prompt
 * by another process). FAKELLAMA_TENSOR_MEMCPY=1 makes the state loaders write the tensor runs
 * with memcpy inside libfakellama, no ggml_backend_tensor_set call at all (a llama.cpp linked
 * with a static ggml: nothing to interpose); FAKELLAMA_TENSOR_MEMCPY_AFTER=N makes the first N
 * state loader calls of the process go through ggml_backend_tensor_set and the later ones use
 * memcpy (every call of llama_state_seq_set_data[_ext], llama_state_set_data and, once its file
 * is read, llama_state_seq_load_file and llama_state_load_file counts, whatever it returns). Both
 * load the same bytes: the outputs are identical. Neither changes the savers:
 * FAKELLAMA_TENSOR_GET_MEMCPY=1 makes the state savers (llama_state_seq_get_data[_ext],
 * llama_state_get_data, llama_state_seq_save_file, llama_state_save_file) copy the tensor runs
 * out with memcpy inside libfakellama, no ggml_backend_tensor_get call (a static ggml again):
 * the same state bytes. */
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

/* The pinned llama.h's struct llama_context_params, field for field (160 bytes on LP64), and
 * llama_context_default_params returns the pinned defaults: kvshim's prefix cache reads this
 * struct only after recognising those defaults. The fake uses n_ctx (tokens per sequence;
 * with kv_unified, of all sequences together), n_batch, n_ubatch, n_seq_max (sequences
 * 0 .. n_seq_max-1), type_k (stands for the KV dtype: a state saved under one type_k does not
 * fit a context of another), embeddings and kv_unified (one KV stream: a sequence state saved
 * there carries n_stream 1 and loads only into a context with one stream, and only when the
 * other sequences leave room for its cells). */
struct llama_context_params {
  uint32_t n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, n_outputs_max, n_outputs_max_per_seq;
  int32_t n_threads, n_threads_batch;
  int32_t ctx_type, rope_scaling_type, pooling_type, attention_type, flash_attn_type;
  float rope_freq_base, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast,
      yarn_beta_slow;
  uint32_t yarn_orig_ctx;
  float defrag_thold;
  void *cb_eval, *cb_eval_user_data;
  int32_t type_k, type_v;
  void *abort_callback, *abort_callback_data;
  bool embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified;
  void *samplers;
  size_t n_samplers;
  void *ctx_other;
};

/* The pinned llama.h's struct llama_batch. */
typedef struct llama_batch {
  int32_t n_tokens;
  llama_token *token;
  float *embd;
  int32_t *pos;
  int32_t *n_seq_id;
  llama_seq_id **seq_id;
  int8_t *logits;
} llama_batch;

typedef struct llama_memory_i *llama_memory_t;
struct llama_sampler;

#define FAKELLAMA_N_VOCAB 1024 /* valid token ids for llama_decode: [0, 1024) */

FAKELLAMA_API struct llama_model_params llama_model_default_params(void);
FAKELLAMA_API struct llama_model *llama_model_load_from_file(const char *path_model,
                                                             struct llama_model_params params);
FAKELLAMA_API void llama_model_free(struct llama_model *model);
FAKELLAMA_API int32_t llama_model_n_swa(const struct llama_model *model);
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

/* Decoding (the pinned llama.cpp's semantics, see fakellama.c): batches, outputs, memory. */
FAKELLAMA_API struct llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
FAKELLAMA_API void llama_batch_free(struct llama_batch batch);
FAKELLAMA_API struct llama_batch llama_batch_get_one(llama_token *tokens, int32_t n_tokens);
FAKELLAMA_API int32_t llama_decode(struct llama_context *ctx, struct llama_batch batch);
FAKELLAMA_API float *llama_get_logits(struct llama_context *ctx);
FAKELLAMA_API float *llama_get_logits_ith(struct llama_context *ctx, int32_t i);
FAKELLAMA_API float *llama_get_embeddings_ith(struct llama_context *ctx, int32_t i);
FAKELLAMA_API uint32_t llama_n_ctx(const struct llama_context *ctx);
FAKELLAMA_API uint32_t llama_n_ctx_seq(const struct llama_context *ctx);
FAKELLAMA_API uint32_t llama_n_batch(const struct llama_context *ctx);
FAKELLAMA_API uint32_t llama_n_ubatch(const struct llama_context *ctx);
FAKELLAMA_API uint32_t llama_n_seq_max(const struct llama_context *ctx);
FAKELLAMA_API bool llama_supports_gpu_offload(void);
FAKELLAMA_API void llama_set_embeddings(struct llama_context *ctx, bool embeddings);
FAKELLAMA_API llama_memory_t llama_get_memory(const struct llama_context *ctx);
FAKELLAMA_API void llama_memory_clear(llama_memory_t mem, bool data);
FAKELLAMA_API bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq, int32_t p0, int32_t p1);
FAKELLAMA_API void llama_memory_seq_cp(llama_memory_t mem, llama_seq_id src, llama_seq_id dst,
                                       int32_t p0, int32_t p1);
FAKELLAMA_API void llama_memory_seq_keep(llama_memory_t mem, llama_seq_id seq);
FAKELLAMA_API void llama_memory_seq_add(llama_memory_t mem, llama_seq_id seq, int32_t p0,
                                        int32_t p1, int32_t delta);
FAKELLAMA_API void llama_memory_seq_div(llama_memory_t mem, llama_seq_id seq, int32_t p0,
                                        int32_t p1, int d);
FAKELLAMA_API int32_t llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq);
FAKELLAMA_API int32_t llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq);
FAKELLAMA_API struct llama_sampler *llama_sampler_init_greedy(void);
FAKELLAMA_API void llama_sampler_free(struct llama_sampler *smpl);
FAKELLAMA_API llama_token llama_sampler_sample(struct llama_sampler *smpl, struct llama_context *ctx,
                                               int32_t idx);

/* ---- fake-only API --------------------------------------------------------------------------- */

/* XXH3-64 of the struct llama_context_params llama_init_from_model received (a host compares it
 * with what it passed: kvshim forwards the struct by value). */
FAKELLAMA_API uint64_t fakellama_ctx_params_hash(const struct llama_context *ctx);

/* "Decode": append n tokens to a sequence (its KV cells). 0, or -1 (bad seq, n < 0). */
FAKELLAMA_API int32_t fakellama_decode(struct llama_context *ctx, llama_seq_id seq,
                                       const llama_token *tokens, int32_t n);
/* Empty a sequence. */
FAKELLAMA_API void fakellama_seq_clear(struct llama_context *ctx, llama_seq_id seq);
/* Cells in a sequence (-1: bad seq). */
FAKELLAMA_API int32_t fakellama_seq_n_cells(struct llama_context *ctx, llama_seq_id seq);
/* Tokens llama_decode has computed on ctx (every accepted batch's n_tokens): how a test sees a
 * prefix computed once or twice. */
FAKELLAMA_API uint64_t fakellama_tokens_decoded(struct llama_context *ctx);
/* 1 when the sequence holds exactly the KV that decoding tokens[0, n) with this context's
 * model and kv_type gives; 0 otherwise. */
FAKELLAMA_API int fakellama_seq_check(struct llama_context *ctx, llama_seq_id seq,
                                      const llama_token *tokens, size_t n);

#ifdef __cplusplus
}
#endif
#endif
