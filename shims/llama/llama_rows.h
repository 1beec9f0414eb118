/* shims/llama: the option and stat rows of the llama.cpp family, which only its code reads and
 * counts (design §2: each layer owns its rows). X(field, ENV, TYPE, default, min, max,
 * choices, unit, help) as core/options.h's rows; X(name, kind, help) as core/stats.h's.
 * runtime/rows.h composes them after core's and the runtime's, in the order of
 * shims/families.h, into the process's configuration (kvs_config_t) and stats table. This
 * header has no includes: it is rows only. */
#ifndef KVSHIM_LLAMA_ROWS_H
#define KVSHIM_LLAMA_ROWS_H

#define KVS_LLAMA_OPTIONS(X)                                                                  \
  X(llama_write_through, "KVSHIM_LLAMA_WRITE_THROUGH", BOOL, "1", 0, 1, "", "",               \
    "also write the engine's state files")                                                    \
  X(llama_prefix, "KVSHIM_LLAMA_PREFIX", BOOL, "1", 0, 1, "", "",                             \
    "transparent prefix cache for llama.cpp")                                                 \
  X(llama_min_tokens, "KVSHIM_LLAMA_MIN_TOKENS", INT, "256", 1, 1 << 24, "", "tokens",        \
    "smallest prefix worth restoring")                                                        \
  X(llama_chunks, "KVSHIM_LLAMA_CHUNKS", BOOL, "0", 0, 1, "", "",                             \
    "llama prefix cache: store states as one object per chunk, each chunk once (design 10.4)") \
  X(llama_direct, "KVSHIM_LLAMA_DIRECT", BOOL, "1", 0, 1, "", "",                             \
    "llama chunk storage: restores by assembly hand the engine's tensor uploads the chunks where they lie (design 10.4)") \
  X(llama_wait_ms, "KVSHIM_LLAMA_WAIT_MS", INT, "5000", 0, 600000, "", "ms",                  \
    "llama prefix cache: longest wait for another process computing the same prefix (0: never)")

/* The two groups most of the family's counters belong to, written once: each help string is
 * its group's prefix and its own words (one string literal after concatenation). */
#define KVS_LLAMA_PREFIX_GROUP "llama prefix cache: "
#define KVS_LLAMA_CHUNKS_GROUP "llama chunk storage: "

#define KVS_LLAMA_STATS(X)                                                                     \
  X(llama_prefix_lookups, C, KVS_LLAMA_PREFIX_GROUP "batches that looked for a cached prefix") \
  X(llama_prefix_restores, C,                                                                  \
    KVS_LLAMA_PREFIX_GROUP "cached prefixes restored into a sequence")                         \
  X(llama_prefix_restored_tokens, C,                                                           \
    KVS_LLAMA_PREFIX_GROUP "batch tokens not decoded (restored)")                              \
  X(llama_prefix_restore_failures, C,                                                          \
    KVS_LLAMA_PREFIX_GROUP "restores undone (the engine's batch was decoded unchanged)")       \
  X(llama_prefix_peer_restores, C,                                                             \
    KVS_LLAMA_PREFIX_GROUP "restores of a state fetched from a peer")                          \
  X(llama_prefix_snapshots, C, KVS_LLAMA_PREFIX_GROUP "sequence states stored")                \
  X(llama_prefix_snapshot_bytes, C, KVS_LLAMA_PREFIX_GROUP "bytes of sequence states stored")  \
  X(llama_prefix_snapshot_ns, C,                                                               \
    KVS_LLAMA_PREFIX_GROUP "nanoseconds spent storing states on the decode path (all included)") \
  X(llama_prefix_restore_ns, C,                                                                \
    KVS_LLAMA_PREFIX_GROUP "nanoseconds spent looking up and restoring before decodes")        \
  X(llama_state_get_ns, C,                                                                     \
    "nanoseconds inside the engine's llama_state_seq_get_size/get_data called by kvshim")      \
  X(llama_state_set_ns, C,                                                                     \
    "nanoseconds inside the engine's llama_state_seq_set_data called by kvshim")               \
  X(llama_prefix_snapshot_failures, C,                                                         \
    KVS_LLAMA_PREFIX_GROUP "sequence states the cache could not keep")                         \
  X(llama_prefix_passthrough, C,                                                               \
    KVS_LLAMA_PREFIX_GROUP "batches passed through (several sequences, tainted, embeddings...)") \
  X(llama_prefix_bad_blobs, C, KVS_LLAMA_PREFIX_GROUP "cached states refused by a check")      \
  X(llama_prefix_claims, C,                                                                    \
    KVS_LLAMA_PREFIX_GROUP "batches computed while claimed for the node")                      \
  X(llama_prefix_waits, C,                                                                     \
    KVS_LLAMA_PREFIX_GROUP "batches that waited for another process's claim")                  \
  X(llama_prefix_shared_in_batch, C,                                                           \
    KVS_LLAMA_PREFIX_GROUP "sequences restored from a prefix another sequence of their batch computed once") \
  X(llama_prefix_prompt_tokens, C,                                                             \
    KVS_LLAMA_PREFIX_GROUP "tokens of decode batches of more than one token (prompt tokens seen)") \
  X(llama_prefix_refused_rules, C,                                                             \
    KVS_LLAMA_PREFIX_GROUP "batches that could not take a restore (too short, outputs, ubatch rules)") \
  X(llama_prefix_refused_unknown, C,                                                           \
    KVS_LLAMA_PREFIX_GROUP "prompt batches not restored into: the sequence's KV is not what kvshim knows") \
  X(llama_prefix_refused_several, C,                                                           \
    KVS_LLAMA_PREFIX_GROUP "prompt batches not restored into: several sequences in one batch") \
  X(llama_prefix_refused_disabled, C,                                                          \
    KVS_LLAMA_PREFIX_GROUP "prompt batches not restored into: the context is no longer cached") \
  X(llama_prefix_states_known, C,                                                              \
    KVS_LLAMA_PREFIX_GROUP "engine state loads whose tokens kvshim knew (a state it saw saved, a file)") \
  X(llama_chunks_stored, C, KVS_LLAMA_CHUNKS_GROUP "chunk objects stored")                     \
  X(llama_chunks_dedup, C,                                                                     \
    KVS_LLAMA_CHUNKS_GROUP "chunks of a snapshot found already stored (not stored again)")     \
  X(llama_chunks_saved_bytes, C,                                                               \
    KVS_LLAMA_CHUNKS_GROUP "bytes of chunks not stored again (dedup)")                         \
  X(llama_chunks_whole, C,                                                                     \
    KVS_LLAMA_CHUNKS_GROUP "states stored whole, not split (every reason: the three below)")   \
  X(llama_chunks_whole_window, C,                                                              \
    KVS_LLAMA_CHUNKS_GROUP "states stored whole: a sliding-window cache without swa_full")     \
  X(llama_chunks_whole_cells, C,                                                               \
    KVS_LLAMA_CHUNKS_GROUP "states stored whole: cells not the sequence at 0..n-1 in one stream") \
  X(llama_chunks_whole_layout, C,                                                              \
    KVS_LLAMA_CHUNKS_GROUP "states stored whole: a state layout not known (memory, release)")  \
  X(llama_chunks_assembled, C,                                                                 \
    KVS_LLAMA_CHUNKS_GROUP "states assembled from chunk objects for a restore")                \
  X(llama_chunks_assemble_ns, C, KVS_LLAMA_CHUNKS_GROUP "time spent assembling states, ns")    \
  X(llama_chunks_tails, C,                                                                     \
    KVS_LLAMA_CHUNKS_GROUP "short chunks stored of the canonical tokens past a snapshot's whole chunks") \
  X(llama_chunks_tail_tokens, C,                                                               \
    KVS_LLAMA_CHUNKS_GROUP "tokens restored from part of a continuation chunk (past a run's whole chunks)") \
  X(llama_chunks_reused, C,                                                                    \
    KVS_LLAMA_CHUNKS_GROUP "restores of the state last assembled in the context (same chunks: no copy)") \
  X(llama_chunks_direct, C,                                                                    \
    KVS_LLAMA_CHUNKS_GROUP "restores by assembly loaded from the chunks where they lie (design 10.4)") \
  X(llama_chunks_direct_bytes, C,                                                              \
    KVS_LLAMA_CHUNKS_GROUP "bytes those restores uploaded straight from the chunks (not copied)") \
  X(llama_chunks_direct_refused, C,                                                            \
    KVS_LLAMA_CHUNKS_GROUP "loads whose tensor data did not all pass through ggml_backend_tensor_set (direct loads off)") \
  X(llama_chunks_direct_stores, C,                                                             \
    KVS_LLAMA_CHUNKS_GROUP "snapshots whose chunks the engine wrote in place (design 10.4)")     \
  X(llama_chunks_direct_store_refused, C,                                                      \
    KVS_LLAMA_CHUNKS_GROUP "snapshots whose tensor data did not all pass through ggml_backend_tensor_get (direct snapshots off)")

#endif
