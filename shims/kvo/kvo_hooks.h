/* shims/kvo: the one list of kvo entry points kvshim hooks (style rule 5).
 *
 * KVS_KVO_HOOKS: the functions of the kvo ABI (<kvshim/kvo.h>), exported from libkvshim.so
 * under these exact ELF names. Each row generates, in kvo.c, the name table, the slot of the
 * resolved real function and the dlsym substitution row, and (through preload/exports.map.c)
 * the version script line. The signatures are those of kvo.h (kvo_*_fn).
 *
 * X(name). This header has no includes so the preprocessor can turn it into the version
 * script. */
#ifndef KVSHIM_KVO_HOOKS_H
#define KVSHIM_KVO_HOOKS_H

#define KVS_KVO_HOOKS(X) X(kvo_lookup) X(kvo_load_chunk) X(kvo_store_chunk)

#endif
