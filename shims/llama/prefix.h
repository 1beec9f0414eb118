/* shims/llama/prefix.c: what the transparent prefix cache (design §10.3) offers the other llama
 * file. Internal: nothing here is exported. */
#ifndef KVSHIM_LLAMA_PREFIX_H
#define KVSHIM_LLAMA_PREFIX_H

#include <stdint.h>

struct llama_context;

/* The engine is replacing the KV of sequence seq of ctx by a state load
 * (llama_state_seq_set_data[_ext], llama_state_seq_load_file; seq < 0: the whole context,
 * llama_state_load_file / llama_state_set_data). The prefix cache stops trusting what it knew of
 * it until it is cleared. Cheap when the prefix cache is off; safe from any thread. */
void kvs__llama_prefix_state_load(struct llama_context *ctx, int32_t seq);

/* After the engine's own state calls (llama.c), so the prefix cache knows a sequence's tokens
 * again after llama-server reloads it (design §10.3):
 *   saved   llama_state_seq_get_data[_ext] wrote len bytes of sequence seq's state: remembered
 *           (length, checksum, the sequence's tokens) while kvshim knows that sequence;
 *   loaded  llama_state_seq_set_data[_ext] loaded all len bytes of state into seq: when they are
 *           a remembered state, seq holds its tokens again (else it stays TAINTED);
 *   tokens  llama_state_seq_load_file loaded seq from a file whose tokens are tok[0, n): seq
 *           holds them (how their KV was computed is not known: a restore may replace it, it is
 *           never stored). */
void kvs__llama_prefix_state_saved(struct llama_context *ctx, int32_t seq, const uint8_t *state,
                                   size_t len);
void kvs__llama_prefix_state_loaded(struct llama_context *ctx, int32_t seq, const uint8_t *state,
                                    size_t len);
void kvs__llama_prefix_state_tokens(struct llama_context *ctx, int32_t seq, const int32_t *tok,
                                    size_t n);

#endif
