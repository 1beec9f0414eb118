/* shims/kvo: the one list of kvo entry points kvshim hooks (style rule 5).
 *
 * KVS_KVO_HOOKS: the functions of the kvo ABI (<kvshim/kvo.h>), exported from libkvshim.so
 * under these exact ELF names. Each row generates, in kvo.c (runtime/family_tables.h), the
 * name table, the slot of the resolved real function and the dlsym substitution row; through
 * preload/exports.map.c the version script line; through tools/inspect the hooks `kvshim
 * inspect` checks.
 *
 * X(ret, name, params, args): the signatures of kvo.h (kvo_*_fn). This header has no includes
 * so the preprocessor can turn it into the version script. */
#ifndef KVSHIM_KVO_HOOKS_H
#define KVSHIM_KVO_HOOKS_H

#define KVS_KVO_HOOKS(X)                                                                      \
  X(int, kvo_lookup, (const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens),      \
    (desc, tokens, n_tokens))                                                                 \
  X(int, kvo_load_chunk,                                                                      \
    (const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens, size_t chunk_index,     \
     int buf_kind, uint64_t buf, size_t buf_len),                                             \
    (desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len))                            \
  X(int, kvo_store_chunk,                                                                     \
    (const kvo_desc_t *desc, const uint32_t *tokens, size_t n_tokens, size_t chunk_index,     \
     int buf_kind, uint64_t buf, size_t buf_len),                                             \
    (desc, tokens, n_tokens, chunk_index, buf_kind, buf, buf_len))

#endif
