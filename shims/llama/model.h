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

/* ---- the llama.cpp releases kvshim knows ------------------------------------------------------ */

/* struct llama_context_params of the known releases (kvshim's own declaration of llama.h: the
 * prefix cache reads it; the state adapter never does). */
typedef struct kvs__llama_cparams {
  uint32_t n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, n_outputs_max, n_outputs_max_per_seq;
  int32_t n_threads, n_threads_batch;
  int32_t ctx_type, rope_scaling_type, pooling_type, attention_type, flash_attn_type;
  float rope_freq_base, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast,
      yarn_beta_slow;
  uint32_t yarn_orig_ctx;
  float defrag_thold;
  void *cb_eval, *cb_eval_user_data;
  int32_t type_k, type_v; /* enum ggml_type */
  void *abort_callback, *abort_callback_data;
  bool embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified;
  void *samplers;
  size_t n_samplers;
  void *ctx_other;
} kvs__llama_cparams_t;
_Static_assert(sizeof(kvs__llama_cparams_t) == 160 || sizeof(void *) != 8, "llama_context_params");
_Static_assert(offsetof(kvs__llama_cparams_t, cb_eval) == 88 || sizeof(void *) != 8, "layout");
_Static_assert(offsetof(kvs__llama_cparams_t, type_k) == 104 || sizeof(void *) != 8, "layout");
_Static_assert(offsetof(kvs__llama_cparams_t, embeddings) == 128 || sizeof(void *) != 8, "layout");
_Static_assert(offsetof(kvs__llama_cparams_t, ctx_other) == 152 || sizeof(void *) != 8, "layout");

/* Every release kvshim was checked against, written once: X(node-llama-cpp version, the
 * llama.cpp release it ships (its libllama is libllama.<release>.so), layout). Layout 1 is
 * kvs__llama_cparams_t with the defaults kvs__llama_release_layout checks (llama.cpp
 * src/llama-context.cpp, llama_context_default_params, identical in v0.4.0 and v0.5.0); a
 * release that changes the struct or its defaults gets a new layout number. README "Supported
 * engines" lists the same rows. */
#define KVS_LLAMA_RELEASES(X)  \
  X("3.21.1", "v0.4.0", 1)     \
  X("3.22.1", "v0.5.0", 1)

/* The layout of the release whose llama_context_default_params() answered d (thread counts
 * aside: every other field has a distinctive default, so a struct with fields added, moved or
 * removed reads differently), or 0: a release kvshim does not know. */
int kvs__llama_release_layout(const kvs__llama_cparams_t *d);
/* Logged once per process by the caller that decided: at info level the known releases of
 * layout (> 0), or for 0 the one warning that this release is unknown and the prefix cache
 * passes every call through (the state adapter does not depend on the layout). */
void kvs__llama_release_report(int layout);

#endif
