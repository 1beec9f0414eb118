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

#endif
