/* shims/llama/model.c: the models both llama adapters cache states of. A leaf of shims/llama:
 * it includes no other llama file, and both adapters (llama.c, prefix.c) and blob.c read it.
 *
 * The table maps a loaded model (llama_model_load_from_file, hooked in llama.c) to the
 * fingerprint of its file and the namespace key of the state adapter (design §6: engine
 * "llama.cpp", the 16-byte fingerprint, KVSHIM_CHUNK_TOKENS, KVSHIM_SALT). llama_model_free
 * forgets it: a later model at the same address must not inherit it.
 *
 * Threads: every function may be called from any thread (one mutex guards the table; the
 * child of a fork resets it with kvs__llama_model_fork_child). */
#ifndef KVSHIM_LLAMA_MODEL_H
#define KVSHIM_LLAMA_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keys.h"
#include "options.h"

#define KVS_LLAMA_FP_SIZE 16 /* model fingerprint bytes (XXH3-128, canonical) */

struct llama_model;

typedef struct kvs__llama_model {
  const struct llama_model *model; /* identity only; never dereferenced */
  uint8_t fp[KVS_LLAMA_FP_SIZE];
  kvs_key_t ns;                    /* kvs_keys_namespace of the state adapter's namespace */
} kvs__llama_model_t;

/* Fingerprint the model file at path and record model -> (fingerprint, namespace) under the
 * options' chunk size and salt. 0, or the fingerprint's negative errno (logged: the model's
 * states are then not cached). */
int kvs__llama_model_add(const struct llama_model *model, const char *path,
                         const kvs_options_t *o);
void kvs__llama_model_forget(const struct llama_model *model);
/* The entry of a model kvshim saw load and fingerprinted (false: unknown, *out untouched). */
bool kvs__llama_model_get(const struct llama_model *model, kvs__llama_model_t *out);
void kvs__llama_model_fork_child(void);

/* What went into a fingerprint (for logs and tests). */
typedef struct kvs__llama_fp_info {
  uint64_t size;      /* file bytes */
  int64_t mtime_ns;
  uint32_t gguf_version; /* 0 when the file is not GGUF or its metadata could not be read */
  uint32_t general_keys; /* general.* keys hashed */
  uint64_t n_kv;      /* metadata entries walked */
} kvs__llama_fp_info_t;

#define KVS_LLAMA_FP_EDGE (1u << 20) /* bytes hashed at the head and at the tail of the file */

/* Fingerprint a model file: XXH3-128 over a versioned record of its size, mtime, the XXH3-128
 * of its first and last KVS_LLAMA_FP_EDGE bytes and every GGUF general.* metadata entry (key,
 * type and value bytes; walking stops, and is recorded as stopped, at the first malformed
 * entry). Never the architecture's shape alone: two fine-tunes of one shape differ in their
 * bytes. No heap allocation (a stack buffer and pread). Returns 0 and fills out (and *info
 * when not NULL), or a negative errno: -EINVAL (NULL, not a regular file) or open/fstat/pread
 * errors. */
int kvs__llama_fingerprint(const char *path, uint8_t out[KVS_LLAMA_FP_SIZE],
                           kvs__llama_fp_info_t *info);

/* The absolute, lexically normalised form of path ("//" and "/./" collapsed, "/x/.." removed;
 * relative paths are taken from the current directory), so two processes naming one file
 * differently get one key. Symlinks are not resolved (the file may not exist yet). Returns the
 * length, or -ENAMETOOLONG / -ENOENT (cwd unavailable). */
int kvs__llama_canon_path(const char *path, char *out, size_t cap);

#endif
