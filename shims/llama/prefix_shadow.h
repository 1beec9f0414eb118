/* shims/llama/prefix_shadow.c: the pure logic of the transparent prefix cache for llama.cpp
 * engines (design §10.3). Internal: nothing here is exported.
 *
 * prefix.c holds the hooks (the KVS_LLAMA_PREFIX_HOOKS family of llama_hooks.h) and talks to
 * the engine and the store; prefix_shadow.c holds everything that is pure logic, declared here
 * so the unit test (tests/shims/llama/test_llama_prefix.c) can drive it without an engine:
 * the shadow of each sequence, the batch rules, the restore plan and the index remap. The
 * blob format is blob.h's.
 *
 * ---- The shadow -------------------------------------------------------------------------------
 * Per context and sequence s, kvshim keeps what it knows of s's KV cells:
 *     CLEAN    s holds exactly tok[0, n) at positions 0..n-1, one cell each (a plain prefix);
 *     TAINTED  anything else (shifted, divided, a hole removed, loaded from a state kvshim did
 *              not see, a failed decode that kept some cells): s is neither restored into nor
 *              snapshotted until it is cleared (seq_rm of all of it, seq_keep of another
 *              sequence, memory_clear), which makes it CLEAN and empty.
 * Invariants (CLEAN):  canon <= n <= cap;  snap <= n;  snap % chunk == 0;
 *                      nkeys * chunk <= n  (keys[j] = h(j) of design §6 over tok, j < nkeys).
 *
 * ---- Why "canonical" ----------------------------------------------------------------------------
 * The KV bytes of a token are not a function of the tokens alone: they depend on the kernel path
 * of the ubatch that computed them. Measured on the pinned build (node-llama-cpp 3.21.1, CPU):
 * a prompt evaluated in ubatches of >= 64 rows gives byte-identical KV whatever the split, but a
 * token computed in a ubatch of fewer rows (a short batch, one generated token) differs from the
 * same token computed in a long one (ggml-cpu's flash attention takes its tiled path only for
 * >= GGML_FA_TILE_Q = 64 query rows; repacked quantized matmuls group rows by 4). So:
 *   canonical ubatch   rows >= rules.min_rows and first position % rules.align == 0;
 *   canon              the leading run of positions computed in canonical ubatches (or
 *                      restored from a blob, whose keyed tokens are canonical by construction);
 *   a snapshot keys only floor(min(n, canon) / chunk) chunks, and a restore decodes the rest of
 *   the batch only when every decoded token lands in a ubatch of the same kernel class as in the
 *   engine's own split (kvs__px_restore_ok).
 * CPU builds: align = min_rows = 64. Builds that can offload (llama_supports_gpu_offload) get
 * align = min_rows = n_ubatch: only whole, aligned ubatches count, so every decoded ubatch is
 * identical to one of the engine's own (GPU kernels are chosen by batch size at many thresholds).
 *
 * ---- Blob ---------------------------------------------------------------------------------------
 * One store object per snapshot, of kind KVS_LLAMA_BLOB_KIND_PREFIX (blob.h): the tokens of the
 * sequence and the state llama_state_seq_get_data returned, bound under the chunk keys
 * h(0) .. h(keyed/chunk - 1) (primary: the last one), so every chunk-aligned prefix it covers
 * finds it. */
#ifndef KVSHIM_LLAMA_PREFIX_SHADOW_H
#define KVSHIM_LLAMA_PREFIX_SHADOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keys.h"

/* ---- kvshim's declarations of the llama.h ABI the prefix cache touches ------------------------ */

struct llama_context;
struct llama_model;
struct llama_sampler;
struct llama_adapter_lora;
struct llama_memory_i;
typedef struct llama_memory_i *kvs__llama_memory_t; /* llama_memory_t */
struct ggml_tensor; /* ggml.h: only passed through (ggml_backend_tensor_set, direct loads) */

/* struct llama_batch (pinned llama.h; the same since the batch API exists). Passed by value. */
typedef struct kvs__llama_batch {
  int32_t n_tokens;
  int32_t *token;     /* llama_token[n_tokens], or NULL (embd) */
  float *embd;        /* n_tokens * n_embd, or NULL (token) */
  int32_t *pos;       /* llama_pos[n_tokens]; NULL: each sequence continues after its last cell */
  int32_t *n_seq_id;  /* [n_tokens]; NULL: one sequence each */
  int32_t **seq_id;   /* [n_tokens][n_seq_id[i]]; NULL: sequence 0 */
  int8_t *logits;     /* [n_tokens] output flags; NULL: the last token only (no embeddings) */
} kvs__llama_batch_t;
_Static_assert(sizeof(kvs__llama_batch_t) == 56 || sizeof(void *) != 8, "llama_batch ABI");

/* struct llama_context_params, passed by value to llama_init_from_model and forwarded as an
 * opaque block (see kvs__llama_model_params_t in llama.c for why a larger block is safe). It is
 * read only after the layout was recognised (prefix.c: px_layout_ok). */
#define KVS_PX_CPARAMS_MAX 256
typedef struct kvs__llama_ctx_params {
  uint64_t words[KVS_PX_CPARAMS_MAX / 8];
} kvs__llama_ctx_params_t;

#define KVS_PX_MAX_SEQ 256 /* LLAMA_MAX_SEQ */

/* ---- kernel-class rules ------------------------------------------------------------------------- */

typedef struct kvs__px_rules {
  uint32_t ubatch;   /* the context's n_ubatch (> 0) */
  uint32_t align;    /* a canonical ubatch starts at a position that is a multiple of this */
  uint32_t min_rows; /* ... and has at least this many tokens */
} kvs__px_rules_t;

/* Rows of the last ubatch when m tokens are split into ubatches of `ubatch` (m > 0). */
static inline uint32_t kvs__px_last_ubatch(uint32_t m, uint32_t ubatch) {
  return m - ubatch * ((m - 1) / ubatch);
}

/* May the first s = k - n tokens of a single-sequence batch of m tokens, extending a CLEAN
 * sequence of n tokens (canon of them canonical), whose first output is at batch index
 * first_out (m when none), be replaced by a restored prefix of k tokens (the restored state
 * trimmed to k with llama_memory_seq_rm; its first k tokens canonical)? True when:
 * k % align == 0 (any restore point the kernel classes allow, not only chunk boundaries),
 * k >= min_tokens, 0 < s <= min(first_out, m) (no output is skipped), canon == n, n a multiple
 * of align, ubatch >= min_rows with ubatch % align == 0 (or m <= ubatch: one ubatch in both
 * splits), and
 *   s == m (the whole batch lies in the cached prefix and asks no output: it is not decoded at
 *     all) when the engine's own last ubatch has >= min_rows tokens (then every token of the
 *     batch would have been computed in the canonical class, which the restored KV has), or
 *   s % ubatch == 0 (the decoded ubatches are the engine's own), or
 *   the last ubatches of both splits have >= min_rows tokens (every decoded token keeps its
 *     kernel class: ubatch starts stay aligned, and the partial row group of the last ubatch,
 *     which ends at n + m in both splits, is the same).
 * The restored tokens [n, k) are canonical in the engine's own split too: they lie in long
 * ubatches, before the last ubatch's partial row group (k is a multiple of 4). */
bool kvs__px_restore_ok(const kvs__px_rules_t *r, uint32_t min_tokens, uint32_t n,
                        uint32_t canon, uint32_t m, uint32_t first_out, uint32_t k);

/* The canonical positions after a successful single-sequence decode of m tokens at positions
 * n .. n+m-1 into a sequence with canon canonical positions out of n (returns canon unchanged
 * unless canon == n; then extends it over the leading canonical ubatches of the split). */
uint32_t kvs__px_canon_after(const kvs__px_rules_t *r, uint32_t n, uint32_t canon, uint32_t m);

/* ---- the shadow ------------------------------------------------------------------------------ */

typedef struct kvs__px_seq {
  uint32_t n;       /* CLEAN: tokens at positions [0, n) */
  uint32_t canon;   /* CLEAN: leading positions with canonical KV (<= n) */
  uint32_t snap;    /* CLEAN: chunk-aligned prefix known to be cached (restored or stored) */
  uint32_t nkeys;   /* CLEAN: keys[0, nkeys) are valid chunk keys of tok */
  uint32_t tainted; /* 1: TAINTED (the fields above are 0) */
} kvs__px_seq_t;

/* Owned by the caller (prefix.c maps it at context creation). tok of sequence s is
 * tok + s * cap; its keys are keys + s * kcap. */
typedef struct kvs__px_shadow {
  uint32_t n_seq;      /* sequences (<= KVS_PX_MAX_SEQ) */
  uint32_t cap;        /* tokens per sequence */
  uint32_t kcap;       /* keys per sequence (cap / chunk + 1) */
  uint32_t chunk;      /* tokens per chunk */
  kvs__px_seq_t *seq;  /* [n_seq] */
  int32_t *tok;        /* [n_seq * cap] */
  kvs_key_t *keys;     /* [n_seq * kcap] */
} kvs__px_shadow_t;

static inline int32_t *kvs__px_tok(const kvs__px_shadow_t *sh, uint32_t s) {
  return sh->tok + (size_t)s * sh->cap;
}
static inline kvs_key_t *kvs__px_keys(const kvs__px_shadow_t *sh, uint32_t s) {
  return sh->keys + (size_t)s * sh->kcap;
}

/* CLEAN and empty (s < 0: every sequence). Out-of-range s: nothing. */
void kvs__px_clear(kvs__px_shadow_t *sh, int32_t s);
/* TAINTED (s < 0: every sequence). */
void kvs__px_taint(kvs__px_shadow_t *sh, int32_t s);

/* The engine's memory calls, applied after they returned (rm only when it returned true),
 * with llama.h's conventions: s < 0 matches every sequence; p0 < 0 means 0, p1 < 0 means
 * infinity. rm of a tail truncates, of everything clears, of a hole taints; cp into an empty
 * CLEAN sequence from a CLEAN one copies a prefix, anything else taints the destination; keep
 * clears every other sequence; add (delta != 0) and div (d != 1) of a range holding cells
 * taint. */
void kvs__px_rm(kvs__px_shadow_t *sh, int32_t s, int32_t p0, int32_t p1);
void kvs__px_cp(kvs__px_shadow_t *sh, int32_t src, int32_t dst, int32_t p0, int32_t p1);
void kvs__px_keep(kvs__px_shadow_t *sh, int32_t s);
void kvs__px_add(kvs__px_shadow_t *sh, int32_t s, int32_t p0, int32_t p1, int32_t delta);
void kvs__px_div(kvs__px_shadow_t *sh, int32_t s, int32_t p0, int32_t p1, int d);

/* What a batch is (kvs__px_batch_scan). */
typedef struct kvs__px_batch_info {
  int valid;          /* 0: malformed for this context (n_tokens <= 0, seq id out of range,
                         n_seq_id out of [1, n_seq]): llama_decode rejects it, nothing changes */
  int has_tokens;     /* batch.token != NULL */
  int single;         /* every token belongs to exactly one sequence, the same one */
  int32_t seq;        /* that sequence when single */
  uint32_t first_out; /* index of the first token with an output (n_tokens when none) */
  int last_out;       /* the last token has an output */
} kvs__px_batch_info_t;

/* Scan a batch. embeddings: the context outputs embeddings (then logits == NULL means every
 * token is an output, as llama_batch_allocr decides). */
void kvs__px_batch_scan(const kvs__llama_batch_t *b, uint32_t n_seq, bool embeddings,
                        kvs__px_batch_info_t *out);

/* Apply a batch llama_decode accepted and decoded completely (it returned 0). p0[s] is where
 * sequence s continues when batch.pos is NULL (llama.cpp: its last position in memory + 1,
 * read before the decode), for every sequence of the batch. A token that does not land at its
 * CLEAN sequence's next position taints that sequence; so does a cell beyond cap or an
 * embeddings batch. Canonical positions advance only for a single-sequence batch. */
void kvs__px_batch_apply(kvs__px_shadow_t *sh, const kvs__llama_batch_t *b,
                         const kvs__px_batch_info_t *bi, const int32_t *p0,
                         const kvs__px_rules_t *rules);

/* Compute keys[j] for j in [from, upto) of sequence s from tok (tokens [0, upto * chunk) must
 * be valid there; keys[from - 1] must be valid when from > 0). Does not change nkeys. */
void kvs__px_keys_compute(kvs__px_shadow_t *sh, uint32_t s, kvs_key_t ns, uint32_t from,
                          uint32_t upto);

/* ---- output indices -------------------------------------------------------------------------- */

/* The index of the decoded batch for the engine's batch index i when the first skip tokens
 * were not decoded: i < 0 keeps its meaning (counted from the last output, and outputs are never
 * skipped); skipped tokens (0 <= i < skip) had no output and map to INT32_MAX, an index the
 * engine's function rejects exactly as it rejects any index without an output. skip ==
 * KVS_PX_SKIP_ALL: the batch was not decoded at all (it asked no output), every index, negative
 * ones included, maps to INT32_MAX (the engine's batch had no output either). */
#define KVS_PX_SKIP_ALL INT32_MAX /* the whole batch was skipped: no index has an output */
static inline int32_t kvs__px_map_index(int32_t skip, int32_t i) {
  if (skip == KVS_PX_SKIP_ALL) return INT32_MAX;
  if (i < 0 || skip <= 0) return i;
  return i < skip ? INT32_MAX : i - skip;
}

#endif
