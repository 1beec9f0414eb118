/* shims/llama: the transparent prefix cache for llama.cpp engines (design §10.3; the model of
 * sequences and batches is in prefix_shadow.h, the blob format in blob.h).
 *
 * Hooked (KVS_LLAMA_PREFIX_HOOKS, exported from libkvshim.so), all passing through to the
 * engine's function:
 *   llama_init_from_model   registers the context when it can be cached: the layout of
 *                           struct llama_context_params is a known release's (px_layout_ok), the
 *                           model was fingerprinted (llama.c), no embeddings, no backend
 *                           samplers, no shared context, no encoder / recurrent / hybrid /
 *                           diffusion model. A unified KV cache (kv_unified: llama-server's
 *                           default, -np auto) is cached like a per-sequence one: a sequence
 *                           state load there removes the destination's cells and puts the
 *                           state's cells into free cells of the one stream
 *                           (llama-kv-cache.cpp:2341, 2418), and its state carries n_stream 1,
 *                           so it loads only where the namespace's n_stream is 1 too. The namespace (design §6) is the model fingerprint plus the KV
 *                           settings: K/V types, flash attention, whether the build can offload
 *                           (then also n_ubatch: see prefix_shadow.h), RoPE/YaRN parameters.
 *   llama_free              forgets it.
 *   llama_decode            keeps the shadow (prefix_shadow.h) from every batch; for a batch of one
 *                           sequence extending a CLEAN sequence: restore, decode the rest,
 *                           snapshot (below). Anything else passes through untouched.
 *   llama_memory_*          (clear, seq_rm/cp/keep/add/div) keep the shadow (prefix_shadow.h); a
 *                           TAINTED sequence that seq_rm left empty in memory is CLEAN again.
 *   *_ith, llama_sampler_sample
 *                           map the engine's batch index to the decoded batch's
 *                           (kvs__px_map_index). The sampler's own call to llama_get_logits_ith
 *                           (through libllama's PLT in the shipped build) then passes through,
 *                           so the index is mapped exactly once whether libllama binds that call
 *                           inside itself or not.
 *   llama_set_embeddings(true), llama_set_causal_attn(false), llama_set_adapters_lora (n > 0),
 *   llama_set_adapter_cvec (data), llama_set_sampler (smpl)
 *                           the context's KV no longer depends on the tokens alone, or outputs
 *                           are read through paths not covered: it is never restored into or
 *                           snapshotted again.
 *   llama_state_set_data    (whole context) every sequence is TAINTED. The sequence state loads
 *                           hooked by llama.c tell us through kvs__llama_prefix_state_load.
 *
 * Restore. A single-sequence batch of m tokens extending CLEAN sequence S (n tokens): the blob
 * under the longest cached chunk key h(j - 1) of the prompt so far with j * chunk > n (local
 * store, probed key by key from the longest; else the peers' longest run, which includes the
 * cache peer) is checked (kvs__llama_blob_check, and its first j * chunk tokens must be the
 * sequence's); the restore point k is the largest multiple of the row alignment that
 * kvs__px_restore_ok allows, within the tokens the blob shares with the prompt and within its
 * canonical tokens (canon_tokens: a restore point need not be a chunk boundary). The blob is
 * fed to the engine's llama_state_seq_set_data[_ext] straight from the pool (pinned; a peer's
 * copy is first copied into a local object bound under every chunk key it covers, and kept
 * when it passed the checks), trimmed to k with llama_memory_seq_rm and verified (memory
 * positions exactly 0..k-1); then the batch minus its first k - n tokens is decoded and the
 * index remap is set; when k == n + m (a batch asking no output, wholly in the cached prefix)
 * nothing is decoded and every index maps to "no output". Any failure after the engine was
 * touched: S is cleared (the engine's llama_state_seq_set_data replaced it), its n old tokens
 * are decoded again in canonical pieces (so their KV is byte-identical to before), and the
 * original batch is decoded unchanged. A rest-batch the engine refuses (1: no KV slot, -1) is
 * undone the same way (trim back to n) and the original batch decoded.
 *
 * Batches of several sequences (px_mixed): skipped whole when they ask no output and every
 * sequence's part is a whole restore; else (px_multi) each part of two or more tokens restores
 * its cached prefix up to its first output and the rest of every sequence is decoded in one
 * batch, indices remapped through an index table.
 *
 * Single flight (px_flight): a batch that finds nothing is claimed for the node, and a process
 * finding a peer's claim waits for it (KVSHIM_LLAMA_WAIT_MS) and restores what it stored. In one
 * process (px_share): sequences of one batch that share an uncached prefix compute it once (one
 * decodes and stores it, the others restore it before the batch's rest is decoded).
 *
 * Sliding-window models without swa_full (c->swa): states are stored only when they end on a
 * chunk boundary with every token canonical, under their own key, and restored only whole.
 *
 * Chunk storage (KVSHIM_LLAMA_CHUNKS=1, not for window caches; design §10.4; its own
 * namespace): a snapshot is split (chunks.c) into a frame, stored under a key of its id, and
 * one object per whole chunk under that chunk's key; a chunk already cached here or at a peer
 * is not stored again. A state that cannot be split is stored as a whole blob (counted). A
 * restore pins the longest local run of chunk objects, fetches the rest of the run from the
 * best peer, assembles the state into a scratch blob and restores it as any blob
 * (px_restore_chunks). Direct loads (KVSHIM_LLAMA_DIRECT, px_direct_*): the assembly writes only
 * what is not per-token payload, and the engine's own load, which hands each tensor run to
 * ggml_backend_tensor_set, is served those runs from the chunks where they lie (hooked below).
 *
 * Snapshot. After a successful single-sequence decode whose last token has an output, when
 * floor(min(n, canon) / chunk) chunks >= min tokens and >= the last snapshot + one chunk: unless
 * the longest key is already cached here or at a peer, the engine's get_size/get_data write the
 * state straight into a reserved pool extent, committed under all those chunk keys (one object,
 * many keys), then pushed to the cache peer (write-behind).
 *
 * Threads and locks: each registered context has a mutex held by the decode and memory hooks
 * for the whole operation, engine calls included (the engine serialises its calls on one
 * context anyway); g_table_lock guards slot allocation. Index remaps read an atomic without
 * locking. px_depth (thread local) makes every hook called from inside one of ours (libllama's
 * PLT calls: the sampler's llama_get_logits_ith, plain set_data -> set_data_ext) pass straight
 * through. kvs__hook_depth is raised only around kvshim's own store and peer work. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "blob.h"
#include "blob_flow.h"
#include "cache.h"
#include "chunks.h"
#include "internal.h"
#include "keys.h"
#include "log.h"
#include "model.h"
#include "prefix.h"
#include "prefix_shadow.h"
#include "runtime.h"
#include "prim.h"
#include "proto.h"
#include "stats.h"

#include "llama_hooks.h"

/* The tables of the family (runtime/family_tables.h): typed pointers kvs__px_pfn_<name>,
 * getters px_real_<name>(), the exported wrapper declarations. */
#define KVS_FAMILY_OF(X)                                                                      \
  X(kvs__family_llama_prefix, "llama.cpp prefix cache", KVS_HOOK_LLAMA, "llama_",             \
    KVS_LLAMA_PREFIX_HOOKS, KVS_LLAMA_PREFIX_USES, kvs__px_pfn_, px_real_)
#include "family_tables.h"

/* ---- family state ----------------------------------------------------------------------------- */

static __thread int px_depth __attribute__((tls_model("initial-exec")));

static inline bool px_observe(void) {
  return kvs__hook_depth == 0 && px_depth == 0 && kvs__family_on(&kvs__family_llama_prefix);
}

/* ---- struct llama_context_params of the known releases (model.h) ------------------------------ */

typedef kvs__llama_cparams_t px_cparams_t;
_Static_assert(sizeof(px_cparams_t) <= KVS_PX_CPARAMS_MAX, "forwarded block too small");

/* Is the engine's struct llama_context_params the one px_cparams_t declares? Its defaults must
 * be those of a known release (model.h, KVS_LLAMA_RELEASES); an unknown one is reported once.
 * 1 yes, 0 no, -1 not decided yet (the function is not loaded). */
static int px_layout_ok(void) {
  static atomic_int verdict = -1;
  int v = atomic_load_explicit(&verdict, memory_order_acquire);
  if (v >= 0) return v;
  kvs__px_pfn_llama_context_default_params defaults = px_real_llama_context_default_params();
  if (!defaults) return -1;
  /* Declared larger than the engine's struct: the callee fills its own 160 bytes of our
   * return buffer (returned in memory on both supported ABIs); the rest is never read. */
  kvs__llama_ctx_params_t raw = defaults();
  px_cparams_t p;
  memcpy(&p, &raw, sizeof p);
  int layout = kvs__llama_release_layout(&p);
  v = layout == 1 ? 1 : 0; /* the layout px_cparams_t declares */
  int expected = -1;
  if (atomic_compare_exchange_strong(&verdict, &expected, v)) kvs__llama_release_report(layout);
  return atomic_load(&verdict);
}

/* ---- contexts ---------------------------------------------------------------------------------- */

#define PX_CTX_MAX 64

/* A sequence state the engine saved itself (llama_state_seq_get_data: llama-server's
 * --cache-ram prompt cache, server-context.cpp:304-317) while kvshim knew the sequence: when the
 * engine loads the same bytes back into a sequence (server-task.cpp:1832), kvshim knows its
 * tokens again. The bytes are known by their length and checksum; the tokens are a copy
 * (kvs__prim_alloc, cap tokens; owned by the entry). */
#define PX_MEMO_MAX 16
typedef struct px_memo {
  uint64_t len, sum;   /* len 0: free */
  uint32_t n, canon;   /* the shadow's n and canon at the save */
  void *tok;           /* n tokens (int32_t) */
  size_t tok_cap;      /* bytes mapped at tok */
} px_memo_t;
/* ggml-cpu: GGML_FA_TILE_Q, and a multiple of every row group (prefix_shadow.h) */
#define PX_CPU_CLASS 64

/* A context's one lazily backed mapping (kvs__prim_alloc, owned by its px_ctx_t, unmapped at
 * px_forget) and the arrays carved from it besides the shadow's (sh.seq, sh.tok, sh.keys). */
typedef struct px_work {
  void *map;
  size_t len;
  kvs_key_t *keys;        /* sh.kcap keys: one reservation's key list */
  int32_t *pos, *nseq;    /* re-decode batch: rules.ubatch entries each */
  int32_t **seq;
  int8_t *logits;
} px_work_t;

/* A direct load (design §10.4, px_direct_*): the state handed to the engine, whose runs[i]
 * (sorted, disjoint: the assembler's) lie in the chunks, not in it; served[i] counts the bytes
 * of runs[i] the engine has uploaded through ggml_backend_tensor_set. */
typedef struct px_direct {
  uint8_t *base;
  uint64_t len;
  const kvs__llama_run_t *runs;
  uint64_t *served;
  uint32_t n;
  bool get; /* a direct snapshot (ggml_backend_tensor_get), else a direct load (_set) */
} px_direct_t;

typedef struct px_ctx {
  _Atomic(struct llama_context *) ctx; /* NULL: free slot; published last (release) */
  pthread_mutex_t lock;                /* guards every field below except skip */
  kvs__llama_memory_t mem;
  bool disabled;          /* never restored into or snapshotted again */
  bool swa;               /* sliding-window attention without swa_full: whole states only */
  uint8_t fp[KVS_LLAMA_FP_SIZE];
  kvs_key_t ns;           /* namespace key (model + KV settings) */
  kvs__px_rules_t rules;
  uint32_t chunk, min_tokens;
  kvs__px_shadow_t sh;
  px_work_t work;
  int32_t rseqval;
  /* Single flight (px_flight). A claimant keeps its claim on the batch it computed until its
   * next batch of that sequence has claimed (or not) the next key, so a process following it
   * never sees a gap between two claims and starts computing the same batch. A follower
   * remembers whose claim it waited on, to wait across that step too. */
  bool held_on;           /* held: a claim kept after its batch was computed and stored */
  int32_t held_seq;
  kvs_key_t held;
  uint64_t follow_id;     /* the claimant this context last waited on (0: none) */
  int32_t follow_seq;
  kvs_key_t follow_key;   /* its claim then */
  _Atomic int32_t skip;   /* tokens not decoded at the front of the last batch (remap) */
  /* A used sequence's state before a restore that replaces it (px_restore, rebase): its cells
   * cannot be decoded again byte-identically, so an undo loads this copy back. Owned here
   * (kvs__prim_alloc, saved_cap bytes); saved_len 0: none for the current batch. */
  void *saved;
  size_t saved_len, saved_cap;
  /* A batch of several sequences with restored parts (px_multi): the decoded batch's arrays
   * and the engine's index -> decoded index map (skip == PX_SKIP_MAP). One mapping of
   * multi_cap tokens (kvs__prim_alloc), owned here. */
  void *multi;
  size_t multi_len;
  uint32_t multi_cap, imap_n;
  int32_t *imap, *mtok, *mpos, *mnseq;
  int32_t **mseq;
  int8_t *mlogits;
  px_memo_t memo[PX_MEMO_MAX]; /* states the engine saved itself (px_memo_*) */
  /* Chunk storage (px_snapshot_chunks, px_restore_chunks): chunks set at registration; cbuf
   * holds a state being split or a blob being assembled, cpin the pieces of a restore (both
   * kvs__prim_alloc, owned here). */
  bool chunks;
  bool chunks_window; /* chunk storage asked for, but a window cache: every state stored whole */
  void *cbuf, *cpin;
  size_t cbuf_cap, cpin_cap;
  /* What cbuf holds when asm_id != 0: the state px_assemble wrote (asm_got bytes) from the
   * objects and parameters asm_id hashes (px_assembly_id, never 0). Set to 0 before anything
   * else writes cbuf (a snapshot's state, a failed assembly), so a restore of the same run loads
   * it again without assembling it again. */
  uint64_t asm_id;
  size_t asm_got;
  /* Direct loads: druns holds the runs an assembly left in the chunks (kvs__prim_alloc, owned
   * here); dl, while not NULL, the load px_load is to make from them; direct_id the identity of
   * the last assembly loaded directly (the same run again is assembled in full and then reused,
   * px_assemble). */
  void *druns;
  size_t druns_cap;
  px_direct_t direct, *dl;
  uint64_t direct_id;
  /* Direct snapshots (px_snapshot_direct): sframe holds the frame of the context's last state
   * split (sframe_len bytes; 0: none yet), splan the plan of one snapshot (both
   * kvs__prim_alloc, owned here). */
  void *sframe, *splan;
  size_t sframe_cap, splan_cap;
  uint64_t sframe_len;
  bool direct_refused; /* the last px_load was a direct load the engine did not serve in full */
  uint32_t memo_next;
} px_ctx_t;

static px_ctx_t g_ctx[PX_CTX_MAX];
static pthread_mutex_t g_table_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_nctx;  /* registered contexts (fast exit for the memory hooks) */
static atomic_int g_nskip; /* contexts with skip != 0 (fast exit for the index hooks) */

static px_ctx_t *px_find(const struct llama_context *ctx) {
  if (!ctx || atomic_load_explicit(&g_nctx, memory_order_relaxed) == 0) return NULL;
  for (size_t i = 0; i < PX_CTX_MAX; i++)
    if (atomic_load_explicit(&g_ctx[i].ctx, memory_order_acquire) == ctx) return &g_ctx[i];
  return NULL;
}

static void px_set_skip(px_ctx_t *c, int32_t s) {
  int32_t old = atomic_exchange_explicit(&c->skip, s, memory_order_release);
  if (!old && s) atomic_fetch_add(&g_nskip, 1);
  else if (old && !s) atomic_fetch_sub(&g_nskip, 1);
}

/* skip value: the last batch's indices map through c->imap (px_multi) */
#define PX_SKIP_MAP INT32_MIN

static int32_t px_map(const struct llama_context *ctx, int32_t i) {
  if (i < 0 || atomic_load_explicit(&g_nskip, memory_order_acquire) == 0) return i;
  px_ctx_t *c = px_find(ctx);
  if (!c) return i;
  int32_t skip = atomic_load_explicit(&c->skip, memory_order_acquire);
  if (skip == PX_SKIP_MAP) return (uint32_t)i < c->imap_n ? c->imap[i] : INT32_MAX;
  return kvs__px_map_index(skip, i);
}

/* The engine's sequence state functions (blob.h: the _ext forms with flags 0 when present). */
#define PX_STATE_FN(field, name, a) (a)->field = px_real_##name();
static bool px_state_api(kvs__llama_state_api_t *a) {
  KVS_LLAMA_STATE_FNS(PX_STATE_FN, a)
  return kvs__llama_state_api_ok(a);
}
#undef PX_STATE_FN

static bool px_model_flag(kvs__px_pfn_llama_model_has_encoder fn, const struct llama_model *m) {
  return fn ? fn(m) : false; /* older libllama: the concept did not exist */
}

/* Everything that makes a context's KV bytes mean something besides the tokens (design §6). */
typedef struct __attribute__((packed)) px_sig {
  uint8_t version, gpu, offload_kqv, swa_full;
  int32_t flash_attn_type, rope_scaling_type;
  float rope_freq_base, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast,
      yarn_beta_slow;
  uint32_t yarn_orig_ctx, ubatch_if_gpu;
  uint32_t n_stream; /* KV streams: a sequence state carries the count and loads only into a
                      * context with as many (1, or n_seq_max without kv_unified) */
} px_sig_t;
_Static_assert(sizeof(px_sig_t) + KVS_LLAMA_FP_SIZE <= KVS_NS_STR_MAX, "namespace model field");

static size_t px_align16(size_t x) { return (x + 15) & ~(size_t)15; }

/* Why ctx is not cached (NULL: it is), and its settings in *c (not yet published). */
static const char *px_setup(px_ctx_t *c, struct llama_context *ctx, struct llama_model *model,
                            const px_cparams_t *p) {
  if (p->embeddings) return "it outputs embeddings";
  if (p->samplers || p->n_samplers) return "it samples on the backend";
  if (p->ctx_other) return "it shares another context's state";
  if (p->ctx_type != 0) return "it is not a default context";
  kvs__llama_model_t mm;
  if (!kvs__llama_model_get(model, &mm)) return "its model was not fingerprinted";
  memcpy(c->fp, mm.fp, sizeof c->fp);
  if (px_model_flag(px_real_llama_model_has_encoder(), model) ||
      px_model_flag(px_real_llama_model_is_recurrent(), model) ||
      px_model_flag(px_real_llama_model_is_hybrid(), model) ||
      px_model_flag(px_real_llama_model_is_diffusion(), model))
    return "the model is not a plain decoder with a KV cache";
  /* Sliding-window attention without swa_full: the engine's window cache drops the cells that
   * left the window, so a stored state can never be trimmed to a restore point, and the
   * sequence's memory no longer starts at position 0. Such a context stores only states that
   * end on a chunk boundary with every token canonical (whole-state restore points), under
   * their own chunk key only, and restores a state only whole, untrimmed (px_restore_point). */
  kvs__px_pfn_llama_model_n_swa n_swa = px_real_llama_model_n_swa();
  c->swa = n_swa && n_swa(model) > 0 && !p->swa_full;
  kvs__px_pfn_llama_get_memory get_memory = px_real_llama_get_memory();
  kvs__px_pfn_llama_n_ctx_seq n_ctx_seq = px_real_llama_n_ctx_seq();
  kvs__px_pfn_llama_n_seq_max n_seq_max = px_real_llama_n_seq_max();
  kvs__px_pfn_llama_n_ubatch n_ubatch = px_real_llama_n_ubatch();
  kvs__llama_state_api_t api;
  if (!get_memory || !n_ctx_seq || !n_seq_max || !n_ubatch || !px_real_llama_memory_seq_rm() ||
      !px_real_llama_memory_seq_pos_min() || !px_real_llama_memory_seq_pos_max() ||
      !px_state_api(&api))
    return "the engine lacks a function the prefix cache needs";
  c->mem = get_memory(ctx);
  uint32_t n_seq = n_seq_max(ctx), cap = n_ctx_seq(ctx), ub = n_ubatch(ctx);
  if (!c->mem || n_seq == 0 || n_seq > KVS_PX_MAX_SEQ || cap == 0 || ub == 0)
    return "unusual context sizes";
  const kvs_config_t *o = kvs__runtime_options();
  c->chunk = (uint32_t)o->core.chunk_tokens;
  c->min_tokens = (uint32_t)o->llama_min_tokens;
  c->chunks = o->llama_chunks && !c->swa; /* a window cache's states do not split */
  c->chunks_window = o->llama_chunks && c->swa;
  if (c->chunks_window)
    kvs_log_info("llama.cpp prefix cache: chunk storage off for this context: a sliding-window "
                 "cache without swa_full keeps only the window's cells; states stored whole "
                 "(llama_chunks_whole_window)");
  kvs__px_pfn_llama_supports_gpu_offload gpu_fn = px_real_llama_supports_gpu_offload();
  bool gpu = gpu_fn ? gpu_fn() : true; /* unknown: the strict rules */
  c->rules.ubatch = ub;
  c->rules.align = c->rules.min_rows = gpu ? ub : PX_CPU_CLASS;

  px_sig_t sig;
  memset(&sig, 0, sizeof sig);
  sig.version = c->chunks ? 3 : 2; /* chunk objects and whole blobs never share a namespace */
  sig.gpu = gpu;
  sig.offload_kqv = p->offload_kqv;
  sig.swa_full = p->swa_full;
  sig.flash_attn_type = p->flash_attn_type;
  sig.rope_scaling_type = p->rope_scaling_type;
  sig.rope_freq_base = p->rope_freq_base;
  sig.rope_freq_scale = p->rope_freq_scale;
  sig.yarn_ext_factor = p->yarn_ext_factor;
  sig.yarn_attn_factor = p->yarn_attn_factor;
  sig.yarn_beta_fast = p->yarn_beta_fast;
  sig.yarn_beta_slow = p->yarn_beta_slow;
  sig.yarn_orig_ctx = p->yarn_orig_ctx;
  sig.ubatch_if_gpu = gpu ? ub : 0;
  sig.n_stream = p->kv_unified ? 1 : n_seq;
  kvs_namespace_t ns;
  memset(&ns, 0, sizeof ns);
  memcpy(ns.engine, "llama.cpp/prefix", sizeof "llama.cpp/prefix");
  memcpy(ns.model, c->fp, KVS_LLAMA_FP_SIZE);
  memcpy(ns.model + KVS_LLAMA_FP_SIZE, &sig, sizeof sig);
  ns.model_len = (uint32_t)(KVS_LLAMA_FP_SIZE + sizeof sig);
  ns.dtype = ((uint32_t)p->type_k & 0xffffu) | ((uint32_t)p->type_v << 16);
  ns.chunk_tokens = c->chunk;
  ns.world_size = 1;
  kvs_namespace_set_salt(&ns, o->core.salt);
  c->ns = kvs_keys_namespace(&ns);

  /* The shadow, the key scratch and the re-decode batch: one lazily backed mapping. */
  uint32_t kcap = cap / c->chunk + 1;
  size_t off_seq = 0;
  size_t off_tok = px_align16(off_seq + (size_t)n_seq * sizeof(kvs__px_seq_t));
  size_t off_keys = px_align16(off_tok + (size_t)n_seq * cap * sizeof(int32_t));
  size_t off_ks = px_align16(off_keys + (size_t)n_seq * kcap * sizeof(kvs_key_t));
  size_t off_rpos = px_align16(off_ks + (size_t)kcap * sizeof(kvs_key_t));
  size_t off_rnseq = px_align16(off_rpos + (size_t)ub * sizeof(int32_t));
  size_t off_rseq = px_align16(off_rnseq + (size_t)ub * sizeof(int32_t));
  size_t off_rlog = px_align16(off_rseq + (size_t)ub * sizeof(int32_t *));
  size_t len = px_align16(off_rlog + (size_t)ub);
  void *map = NULL;
  int rc;
  {
    KVS__REENTRY_GUARD();
    map = NULL;
    rc = kvs__prim_alloc(len, &map);
  }
  if (rc < 0) return "no memory for its shadow";
  uint8_t *b = map;
  c->work.map = map;
  c->work.len = len;
  c->sh.n_seq = n_seq;
  c->sh.cap = cap;
  c->sh.kcap = kcap;
  c->sh.chunk = c->chunk;
  c->sh.seq = (kvs__px_seq_t *)(void *)(b + off_seq);
  c->sh.tok = (int32_t *)(void *)(b + off_tok);
  c->sh.keys = (kvs_key_t *)(void *)(b + off_keys);
  c->work.keys = (kvs_key_t *)(void *)(b + off_ks);
  c->work.pos = (int32_t *)(void *)(b + off_rpos);
  c->work.nseq = (int32_t *)(void *)(b + off_rnseq);
  c->work.seq = (int32_t **)(void *)(b + off_rseq);
  c->work.logits = (int8_t *)(b + off_rlog);
  c->disabled = false;
  atomic_store(&c->skip, 0);
  return NULL;
}

static void px_forget(struct llama_context *ctx);

static void px_register(struct llama_context *ctx, struct llama_model *model,
                        const kvs__llama_ctx_params_t *raw) {
  px_forget(ctx); /* a context at this address whose llama_free kvshim did not see */
  if (px_layout_ok() != 1) return;
  px_cparams_t p;
  memcpy(&p, raw, sizeof p);
  px_ctx_t tmp;
  memset(&tmp, 0, sizeof tmp);
  const char *why = px_setup(&tmp, ctx, model, &p);
  if (why) {
    kvs_log_info("llama.cpp prefix cache: context %p not cached: %s", (void *)ctx, why);
    return;
  }
  pthread_mutex_lock(&g_table_lock);
  px_ctx_t *slot = NULL;
  for (size_t i = 0; i < PX_CTX_MAX && !slot; i++)
    if (!atomic_load_explicit(&g_ctx[i].ctx, memory_order_relaxed)) slot = &g_ctx[i];
  if (slot) {
    atomic_store_explicit(&slot->ctx, NULL, memory_order_relaxed);
    slot->mem = tmp.mem;
    slot->disabled = false;
    slot->swa = tmp.swa;
    slot->chunks = tmp.chunks;
    slot->chunks_window = tmp.chunks_window;
    slot->cbuf = slot->cpin = NULL;
    slot->cbuf_cap = slot->cpin_cap = 0;
    slot->asm_id = 0;
    memcpy(slot->fp, tmp.fp, sizeof slot->fp);
    slot->ns = tmp.ns;
    slot->rules = tmp.rules;
    slot->chunk = tmp.chunk;
    slot->min_tokens = tmp.min_tokens;
    slot->sh = tmp.sh;
    slot->work = tmp.work;
    atomic_store(&slot->skip, 0);
    pthread_mutex_init(&slot->lock, NULL);
    atomic_fetch_add(&g_nctx, 1);
    atomic_store_explicit(&slot->ctx, ctx, memory_order_release);
  }
  pthread_mutex_unlock(&g_table_lock);
  if (!slot) {
    kvs__prim_unmap(tmp.work.map, tmp.work.len);
    kvs_log_warn("llama.cpp prefix cache: more than %d contexts: context %p not cached",
                 PX_CTX_MAX, (void *)ctx);
    return;
  }
  char hex[KVS_KEY_HEX_LEN + 1];
  kvs_key_format(tmp.ns, hex);
  kvs_log_info("llama.cpp prefix cache: context %p: %u sequences x %u tokens, n_ubatch %u, "
               "K/V types %d/%d, %s rules, namespace %s",
               (void *)ctx, tmp.sh.n_seq, tmp.sh.cap, tmp.rules.ubatch, p.type_k, p.type_v,
               tmp.rules.align == PX_CPU_CLASS ? "CPU" : "offload", hex);
}

static void px_drop_held(px_ctx_t *c, kvs__runtime_t *rt, const kvs_key_t *key);

static void px_forget(struct llama_context *ctx) {
  if (!ctx) return;
  void *map = NULL;
  size_t len = 0;
  pthread_mutex_lock(&g_table_lock);
  px_ctx_t *c = px_find(ctx);
  if (c) {
    px_set_skip(c, 0);
    px_drop_held(c, kvs__runtime_get(), NULL);
    c->follow_id = 0;
    atomic_store_explicit(&c->ctx, NULL, memory_order_release);
    atomic_fetch_sub(&g_nctx, 1);
    map = c->work.map;
    len = c->work.len;
    c->work.map = NULL;
    kvs__prim_unmap(c->saved, c->saved_cap);
    c->saved = NULL;
    kvs__prim_unmap(c->multi, c->multi_len);
    c->multi = NULL;
    kvs__prim_unmap(c->cbuf, c->cbuf_cap);
    kvs__prim_unmap(c->cpin, c->cpin_cap);
    kvs__prim_unmap(c->druns, c->druns_cap);
    kvs__prim_unmap(c->sframe, c->sframe_cap);
    kvs__prim_unmap(c->splan, c->splan_cap);
    c->cbuf = c->cpin = c->druns = c->sframe = c->splan = NULL;
    c->cbuf_cap = c->cpin_cap = c->druns_cap = c->sframe_cap = c->splan_cap = 0;
    c->sframe_len = 0;
    c->asm_id = c->direct_id = 0;
    c->dl = NULL;
    c->multi_len = c->multi_cap = c->imap_n = 0;
    c->saved_len = c->saved_cap = 0;
    for (size_t i = 0; i < PX_MEMO_MAX; i++) {
      kvs__prim_unmap(c->memo[i].tok, c->memo[i].tok_cap);
      memset(&c->memo[i], 0, sizeof c->memo[i]);
    }
    c->memo_next = 0;
    pthread_mutex_destroy(&c->lock);
  }
  pthread_mutex_unlock(&g_table_lock);
  kvs__prim_unmap(map, len);
}

/* Every registered context using mem (normally one), locked, applies op. */
typedef void (*px_mem_op)(px_ctx_t *c, const int32_t a[4]);

static void px_on_mem(kvs__llama_memory_t mem, px_mem_op op, const int32_t a[4], const char *name) {
  if (!mem || atomic_load_explicit(&g_nctx, memory_order_relaxed) == 0) return;
  kvs_log_trace("llama.cpp prefix cache: %s(%d, %d, %d, %d)", name, a[0], a[1], a[2], a[3]);
  for (size_t i = 0; i < PX_CTX_MAX; i++) {
    px_ctx_t *c = &g_ctx[i];
    if (!atomic_load_explicit(&c->ctx, memory_order_acquire) || c->mem != mem) continue;
    pthread_mutex_lock(&c->lock);
    op(c, a);
    pthread_mutex_unlock(&c->lock);
  }
}

static void op_clear(px_ctx_t *c, const int32_t *a) {
  (void)a;
  kvs__px_clear(&c->sh, -1);
}
/* A TAINTED sequence whose cells are all gone is CLEAN again, however they went (the engine
 * may remove [0, n) with an explicit end kvshim cannot compare with a length it does not know). */
static void px_untaint_empty(px_ctx_t *c, int32_t s) {
  kvs__px_pfn_llama_memory_seq_pos_max pos_max = px_real_llama_memory_seq_pos_max();
  for (uint32_t i = 0; i < c->sh.n_seq; i++) {
    if ((s >= 0 && i != (uint32_t)s) || !c->sh.seq[i].tainted) continue;
    if (pos_max && pos_max(c->mem, (int32_t)i) == -1) kvs__px_clear(&c->sh, (int32_t)i);
  }
}

static void op_rm(px_ctx_t *c, const int32_t *a) {
  kvs__px_rm(&c->sh, a[0], a[1], a[2]);
  px_untaint_empty(c, a[0]);
}
static void op_cp(px_ctx_t *c, const int32_t *a) { kvs__px_cp(&c->sh, a[0], a[1], a[2], a[3]); }
static void op_keep(px_ctx_t *c, const int32_t *a) { kvs__px_keep(&c->sh, a[0]); }
static void op_add(px_ctx_t *c, const int32_t *a) { kvs__px_add(&c->sh, a[0], a[1], a[2], a[3]); }
static void op_div(px_ctx_t *c, const int32_t *a) { kvs__px_div(&c->sh, a[0], a[1], a[2], a[3]); }

/* A context whose KV stops depending on the tokens alone. */
static void px_disable(struct llama_context *ctx, const char *why) {
  px_ctx_t *c = px_find(ctx);
  if (!c) return;
  pthread_mutex_lock(&c->lock);
  bool was = c->disabled;
  c->disabled = true;
  pthread_mutex_unlock(&c->lock);
  if (!was)
    kvs_log_info("llama.cpp prefix cache: context %p is no longer cached: %s", (void *)ctx, why);
}

void kvs__llama_prefix_state_load(struct llama_context *ctx, int32_t seq) {
  if (px_depth || !kvs__family_on(&kvs__family_llama_prefix)) return;
  px_ctx_t *c = px_find(ctx);
  if (!c) return;
  pthread_mutex_lock(&c->lock);
  kvs__px_taint(&c->sh, seq < 0 ? -1 : seq);
  pthread_mutex_unlock(&c->lock);
}

static kvs_stats_t *px_stats(void) { return kvs_stats_global(); }

/* Make the mapping *buf (kvs__prim_alloc, *cap bytes, owned by the caller's context) hold at
 * least need bytes; its contents are not kept. huge: in huge pages where the kernel gives them
 * on request (for a buffer written whole: one page fault per 2 MiB instead of per 4 KiB; a
 * buffer written only here and there would have every 2 MiB page it touches zeroed whole).
 * False: no memory, *buf unchanged. */
static bool px_grow_as(void **buf, size_t *cap, size_t need, bool huge) {
  if (need <= *cap) return true;
  void *p = NULL;
  int rc;
  {
    KVS__REENTRY_GUARD();
    rc = kvs__prim_alloc(need, &p);
  }
  if (rc < 0) return false;
  if (huge) kvs__prim_hugepage_hint(p, need);
  kvs__prim_unmap(*buf, *cap);
  *buf = p;
  *cap = need;
  return true;
}

static bool px_grow(void **buf, size_t *cap, size_t need) {
  return px_grow_as(buf, cap, need, true);
}

/* px_grow of a context's state buffer (cbuf). With direct loads and snapshots (the default) it
 * is written only here and there: the state's metadata, a few bytes between the runs that come
 * from or go to the chunks (design §10.4); huge pages then made a process's first restore by
 * assembly zero the whole state's worth of them (docs/PERF.md 14.2). Only a context that copies
 * every byte (KVSHIM_LLAMA_DIRECT=0) gets them. */
static bool px_grow_state(px_ctx_t *c, size_t need) {
  return px_grow_as(&c->cbuf, &c->cbuf_cap, need, !kvs__runtime_options()->llama_direct);
}

/* The engine's memory of sequence s is now tok[0, n) at positions 0..n-1 (a state load whose
 * tokens kvshim knows), canon of them computed in canonical ubatches. Caller holds c->lock.
 * px_decode's check of memory positions still taints s if the memory disagrees. */
static void px_learn(px_ctx_t *c, int32_t s, const int32_t *tok, uint32_t n, uint32_t canon) {
  kvs__px_clear(&c->sh, s);
  if (n == 0 || n > c->sh.cap) return;
  kvs__px_seq_t *q = &c->sh.seq[s];
  memcpy(kvs__px_tok(&c->sh, (uint32_t)s), tok, (size_t)n * 4);
  q->n = n;
  q->canon = canon < n ? canon : n;
  kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_states_known);
}

static px_ctx_t *px_state_ctx(struct llama_context *ctx, int32_t seq) {
  if (px_depth || !kvs__family_on(&kvs__family_llama_prefix)) return NULL;
  px_ctx_t *c = px_find(ctx);
  return c && seq >= 0 && (uint32_t)seq < c->sh.n_seq ? c : NULL;
}

void kvs__llama_prefix_state_saved(struct llama_context *ctx, int32_t seq, const uint8_t *state,
                                   size_t len) {
  px_ctx_t *c = px_state_ctx(ctx, seq);
  if (!c || !state || !len) return;
  pthread_mutex_lock(&c->lock);
  const kvs__px_seq_t *q = &c->sh.seq[seq];
  if (!q->tainted && q->n && !c->disabled) {
    uint64_t sum = kvs_checksum64(state, len);
    px_memo_t *e = NULL;
    for (size_t i = 0; i < PX_MEMO_MAX && !e; i++)
      if (c->memo[i].len == len && c->memo[i].sum == sum) e = &c->memo[i];
    if (!e) e = &c->memo[c->memo_next++ % PX_MEMO_MAX];
    size_t need = (size_t)q->n * 4;
    bool room = px_grow(&e->tok, &e->tok_cap, need);
    e->len = room ? len : 0;
    e->sum = sum;
    e->n = q->n;
    e->canon = q->canon;
    if (room) memcpy(e->tok, kvs__px_tok(&c->sh, (uint32_t)seq), need);
  }
  pthread_mutex_unlock(&c->lock);
}

void kvs__llama_prefix_state_loaded(struct llama_context *ctx, int32_t seq, const uint8_t *state,
                                    size_t len) {
  px_ctx_t *c = px_state_ctx(ctx, seq);
  if (!c || !state || !len) return;
  pthread_mutex_lock(&c->lock);
  uint64_t sum = 0;
  for (size_t i = 0; i < PX_MEMO_MAX; i++) {
    const px_memo_t *e = &c->memo[i];
    if (e->len != len) continue;
    if (!sum) sum = kvs_checksum64(state, len);
    if (e->sum == sum) {
      px_learn(c, seq, e->tok, e->n, e->canon);
      break;
    }
  }
  pthread_mutex_unlock(&c->lock);
}

void kvs__llama_prefix_state_tokens(struct llama_context *ctx, int32_t seq, const int32_t *tok,
                                    size_t n) {
  px_ctx_t *c = px_state_ctx(ctx, seq);
  if (!c || !tok || n > UINT32_MAX) return;
  pthread_mutex_lock(&c->lock);
  px_learn(c, seq, tok, (uint32_t)n, 0); /* how its cells were computed is not known */
  pthread_mutex_unlock(&c->lock);
}

/* ---- restore ----------------------------------------------------------------------------------- */

typedef enum px_res {
  PX_OK = 0,     /* restored: the sequence holds exactly k tokens */
  PX_SKIP,       /* nothing usable; the engine was not touched */
  PX_NONE,       /* a good blob, but no restore point beyond n: the engine was not touched */
  PX_BAD,        /* the blob failed a check; the engine was not touched */
  PX_ENGINE,     /* the engine refused it; the sequence is back to its n tokens (or TAINTED) */
} px_res_t;

/* A batch of len tokens of one sequence (*seq) at positions from..from+len-1, no outputs, in the
 * caller's arrays (len entries each). */
static kvs__llama_batch_t px_seq_batch(const int32_t *tok, uint32_t from, uint32_t len,
                                       int32_t *pos, int32_t *nseq, int32_t **seqs, int8_t *logits,
                                       int32_t *seq) {
  for (uint32_t i = 0; i < len; i++) {
    pos[i] = (int32_t)(from + i);
    nseq[i] = 1;
    seqs[i] = seq;
    logits[i] = 0;
  }
  return (kvs__llama_batch_t){(int32_t)len, (int32_t *)(uintptr_t)tok, NULL, pos, nseq, seqs,
                              logits};
}

/* Decode the sequence's first n shadow tokens again into the (empty) sequence, in canonical
 * pieces (n and n_ubatch are multiples of rules.align == rules.min_rows, see prefix_shadow.h), so
 * their KV is byte-identical to what the engine had. */
static bool px_redecode(px_ctx_t *c, struct llama_context *ctx, int32_t s, uint32_t n) {
  kvs__px_pfn_llama_decode decode = px_real_llama_decode();
  if (!decode) return false;
  const int32_t *tok = kvs__px_tok(&c->sh, (uint32_t)s);
  c->rseqval = s;
  for (uint32_t off = 0; off < n;) {
    uint32_t len = n - off < c->rules.ubatch ? n - off : c->rules.ubatch;
    px_work_t *w = &c->work;
    kvs__llama_batch_t b =
        px_seq_batch(tok + off, off, len, w->pos, w->nseq, w->seq, w->logits, &c->rseqval);
    if (decode(ctx, b) != 0) return false;
    off += len;
  }
  return true;
}

/* Keep a copy of sequence s's state (c->saved) before a restore replaces it. */
static bool px_save_seq(px_ctx_t *c, struct llama_context *ctx, int32_t s) {
  kvs__llama_state_api_t api;
  px_state_api(&api);
  c->saved_len = 0;
  size_t need = kvs__llama_state_size(&api, ctx, s);
  if (!need || !px_grow(&c->saved, &c->saved_cap, need)) return false;
  if (kvs__llama_state_get(&api, ctx, c->saved, need, s) != need) return false;
  c->saved_len = need;
  return true;
}

/* Undo a restore that touched the engine: sequence s back to its n old tokens (the copy kept
 * before a restore that replaced the sequence, else decoded again). */
static void px_undo(px_ctx_t *c, struct llama_context *ctx, int32_t s, uint32_t n) {
  kvs__px_pfn_llama_memory_seq_rm rm = px_real_llama_memory_seq_rm();
  if (rm) rm(c->mem, s, -1, -1);
  if (n == 0) return; /* it was empty, and is again */
  if (c->saved_len) {
    kvs__llama_state_api_t api;
    px_state_api(&api);
    if (kvs__llama_state_set(&api, ctx, c->saved, c->saved_len, s) == c->saved_len) return;
    if (rm) rm(c->mem, s, -1, -1);
    kvs__px_clear(&c->sh, s);
    kvs_log_warn("llama.cpp prefix cache: could not load the %u tokens of sequence %d back after "
                 "a failed restore: the sequence is empty", n, s);
    return;
  }
  if (!px_redecode(c, ctx, s, n)) {
    if (rm) rm(c->mem, s, -1, -1);
    kvs__px_clear(&c->sh, s); /* the engine's batch will now fail on its positions */
    kvs_log_warn("llama.cpp prefix cache: could not decode the %u tokens of sequence %d again "
                 "after a failed restore: the sequence is empty", n, s);
  }
}

/* What a restore into sequence s (n tokens, a batch of m more, first output at first_out) may
 * use: tokens[0, n + m) are the prompt so far (the shadow's tokens, the batch's after them). */
typedef struct px_plan {
  int32_t s;
  uint32_t n, m, first_out;
  uint32_t keyed; /* the chunk key the blob was found under covers this many tokens */
  bool whole;     /* only k == n + m will do (a batch of several sequences, skipped whole) */
  bool rebase;    /* a used sequence (its n tokens not a canonical, aligned prefix): the load
                   * replaces it, and the batch is judged as the engine would compute the
                   * whole prompt in a fresh sequence (n 0, m n + m) */
  bool part_of_many; /* the part of one sequence in a batch of several (px_multi): the engine
                      * splits such a batch across sequences, so no kernel-class rule can hold;
                      * any k up to the first output will do */
} px_plan_t;

/* What px_restore is asked for. */
enum { PX_PART = 0, PX_WHOLE = 1, PX_PART_OF_MANY = 2 };

/* May the restore of pl stop at k (kvs__px_restore_ok, for a rebase as a fresh sequence)? */
static bool px_point_ok(const px_ctx_t *c, const px_plan_t *pl, uint32_t k) {
  if (pl->part_of_many)
    return k > pl->n && k - pl->n <= pl->first_out && k - pl->n <= pl->m && k >= c->min_tokens;
  if (pl->rebase)
    return k > pl->n && kvs__px_restore_ok(&c->rules, c->min_tokens, 0, 0, pl->n + pl->m,
                                           pl->n + pl->first_out, k);
  return kvs__px_restore_ok(&c->rules, c->min_tokens, pl->n, c->sh.seq[pl->s].canon, pl->m,
                            pl->first_out, k);
}

/* The restore point for a checked blob: the largest k the kernel-class rules allow
 * (kvs__px_restore_ok), at most the blob's canonical tokens and the tokens it shares with the
 * prompt. 0: none beyond n. */
static uint32_t px_restore_point(const px_ctx_t *c, const px_plan_t *pl,
                                 const kvs__llama_blob_hdr_t *h, const int32_t *btok) {
  uint32_t lim = h->canon_tokens ? h->canon_tokens : h->keyed_tokens;
  if (lim > pl->n + pl->m) lim = pl->n + pl->m;
  const int32_t *tok = kvs__px_tok(&c->sh, (uint32_t)pl->s);
  uint32_t same = pl->keyed; /* checked equal by the caller */
  while (same < lim && memcmp(btok + same, tok + same, 4) == 0) same++;
  const uint32_t al = c->rules.align;
  if (c->swa) /* a window state is restored whole, untrimmed, or not at all */
    return h->n_tokens == h->keyed_tokens && same == h->n_tokens &&
                   (!pl->whole || same == pl->n + pl->m) && px_point_ok(c, pl, same)
               ? same
               : 0;
  if (pl->whole) return same == pl->n + pl->m && px_point_ok(c, pl, same) ? same : 0;
  if (pl->part_of_many) {
    uint32_t k = pl->first_out < pl->m ? pl->n + pl->first_out : pl->n + pl->m;
    if (same < k) k = same;
    return px_point_ok(c, pl, k) ? k : 0;
  }
  for (uint32_t k = same / al * al; k > pl->n; k -= al)
    if (px_point_ok(c, pl, k)) return k;
  return 0;
}

/* ---- direct loads (design §10.4) ------------------------------------------------------------ */

/* The engine's llama_state_seq_set_data reads a state's metadata itself but hands every tensor
 * run (a layer's K or V rows of a cell range; one element of every cell of a transposed V) to
 * ggml_backend_tensor_set with a pointer into the state: llama_io_read_host records the runs and
 * flushes them when the reader ends, still inside the call (llama-context.cpp:2630-2680 of the
 * pinned release; libllama imports the function from libggml-base, so LD_PRELOAD interposes it).
 * A direct load hands the engine an assembly whose long payload runs were not copied (they were
 * hashed and recorded, kvs__llama_defer_t) and serves each upload of such a run from the chunk
 * where it lies: the state is not copied. Every direct load is checked afterwards to have served
 * every run in full; one that did not (an engine that reads the tensor bytes itself: llama.cpp
 * linked statically, another release) read bytes never written: it is undone, direct loads go
 * off for the process, and the same run is assembled whole and loaded again (px_assemble_load).
 * So the first restore by assembly of a process finds out, at the cost of one load at most. */

/* Runs shorter than this are copied (a call per run costs more than their copy). */
#define PX_DIRECT_MIN_RUN 4096u
/* Runs recorded at most per assembly; the rest are copied. */
#define PX_DIRECT_MAX_RUNS 65536u

/* Does the engine upload a state's tensors through ggml_backend_tensor_set? -1 not known yet,
 * 0 no (direct loads off for the process), 1 yes. */
static atomic_int px_direct_verdict = -1;

/* The direct load in progress on this thread (set only around the engine's set_data call). */
static __thread px_direct_t *px_direct_now __attribute__((tls_model("initial-exec")));

/* Move bytes [a, a + size) of d's state between tensor (at offset) and memory: a load uploads
 * them (set), a snapshot downloads them (get); the runs' bytes from or into their chunks, the
 * bytes between runs from or into the state; each run's share counted. A snapshot's run with no
 * chunk (of a chunk held already) is not downloaded at all: nobody reads those bytes. */
static void px_direct_serve(px_direct_t *d, kvs__px_pfn_ggml_backend_tensor_set set,
                            kvs__px_pfn_ggml_backend_tensor_get get, struct ggml_tensor *tensor,
                            uint64_t a, size_t offset, size_t size) {
  const uint64_t a0 = a, e = a + size;
  uint32_t lo = 0, hi = d->n; /* the first run that ends after a */
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (d->runs[mid].off + d->runs[mid].len <= a) lo = mid + 1;
    else hi = mid;
  }
  for (uint32_t i = lo; a < e;) {
    const kvs__llama_run_t *r = i < d->n ? &d->runs[i] : NULL;
    uint8_t *src = d->base + a;
    uint64_t end;
    if (r && r->off <= a) { /* in run i */
      end = r->off + r->len < e ? r->off + r->len : e;
      src = r->chunk ? r->chunk + (a - r->off) : NULL;
      d->served[i++] += end - a;
    } else { /* bytes the assembly wrote, up to the next run */
      end = r && r->off < e ? r->off : e;
    }
    if (!src) { /* a run nobody needs (get only: an assembly records none) */
      a = end;
      continue;
    }
    if (set) set(tensor, src, offset + (size_t)(a - a0), (size_t)(end - a));
    else get(tensor, src, offset + (size_t)(a - a0), (size_t)(end - a));
    a = end;
  }
}

/* The direct load or snapshot of this thread that [data, data + size) falls in (get: which),
 * else NULL; *a its offset in the state. */
static px_direct_t *px_direct_for(const void *data, size_t size, bool get, uint64_t *a) {
  px_direct_t *d = px_direct_now;
  uintptr_t p = (uintptr_t)data, b = d ? (uintptr_t)d->base : 0;
  if (kvs__likely(!d) || d->get != get || size == 0 || p < b || p - b >= d->len ||
      size > d->len - (p - b))
    return NULL;
  *a = p - b;
  return d;
}

void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data, size_t offset,
                             size_t size) {
  kvs__px_pfn_ggml_backend_tensor_set real = px_real_ggml_backend_tensor_set();
  if (kvs__unlikely(!real)) return;
  uint64_t a = 0;
  px_direct_t *d = px_direct_for(data, size, false, &a);
  if (kvs__likely(!d)) real(tensor, data, offset, size);
  else px_direct_serve(d, real, NULL, tensor, a, offset, size);
}

void ggml_backend_tensor_get(const struct ggml_tensor *tensor, void *data, size_t offset,
                             size_t size) {
  kvs__px_pfn_ggml_backend_tensor_get real = px_real_ggml_backend_tensor_get();
  if (kvs__unlikely(!real)) return;
  uint64_t a = 0;
  px_direct_t *d = px_direct_for(data, size, true, &a);
  if (kvs__likely(!d)) real(tensor, data, offset, size);
  else px_direct_serve(d, NULL, real, (struct ggml_tensor *)(uintptr_t)tensor, a, offset, size);
}

/* Did the engine move every run of d in full through the hook? */
static bool px_direct_whole(const px_direct_t *d) {
  for (uint32_t i = 0; i < d->n; i++)
    if (d->served[i] != d->runs[i].len) return false;
  return true;
}

/* After the engine loaded d's state: were all its runs uploaded through the hook? A run not
 * served means the engine read bytes that were never written: false (the load must be undone),
 * and direct loads go off for the process. */
static bool px_direct_judge(const px_direct_t *d) {
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < d->n; i++) bytes += d->runs[i].len;
  if (px_direct_whole(d)) {
    if (atomic_exchange(&px_direct_verdict, 1) != 1)
      kvs_log_info("llama.cpp prefix cache: the engine uploads a state's tensors through "
                   "ggml_backend_tensor_set: restores by assembly load the chunks where they lie");
    kvs_stats_inc(px_stats(), KVS_STAT_llama_chunks_direct);
    kvs_stats_add(px_stats(), KVS_STAT_llama_chunks_direct_bytes, bytes);
    return true;
  }
  kvs_stats_inc(px_stats(), KVS_STAT_llama_chunks_direct_refused);
  if (atomic_exchange(&px_direct_verdict, 0) != 0)
    kvs_log_info("llama.cpp prefix cache: the engine did not upload every tensor run of a state "
                 "through ggml_backend_tensor_set (llama.cpp linked statically, or another "
                 "release?): restores by assembly copy the state from now on");
  return false;
}

/* The one layout of a direct load's or snapshot's runs: in a grown buffer, `head` bytes of the
 * caller's, then cap runs (a kvs__llama_defer_t of PX_DIRECT_MIN_RUN), then one served counter
 * per run (px_served: the counters of d). px_runs_room grows the buffer and sets *d on it;
 * false: no memory. */
static uint64_t *px_served(const kvs__llama_defer_t *d) {
  return (uint64_t *)(void *)(d->runs + d->cap);
}

static bool px_runs_room(void **buf, size_t *bufcap, size_t head, uint64_t cap,
                         kvs__llama_defer_t *d) {
  if (!px_grow(buf, bufcap, head + (size_t)cap * (sizeof(kvs__llama_run_t) + sizeof(uint64_t))))
    return false;
  *d = (kvs__llama_defer_t){.runs = (kvs__llama_run_t *)(void *)((uint8_t *)*buf + head),
                            .cap = (uint32_t)cap, .min = PX_DIRECT_MIN_RUN};
  return true;
}

/* The runs an assembly of identity id (nch chunks in frame f) may leave in the chunks, in *d:
 * NULL (copy every byte) when direct loads are off or known not to work here, or when the same
 * run was loaded directly just before (copied whole this time, its next restores reuse it:
 * px_assemble). */
static kvs__llama_defer_t *px_defer_for(px_ctx_t *c, const uint8_t *f, size_t flen,
                                        uint32_t nch, uint64_t id, kvs__llama_defer_t *d) {
  int v = atomic_load_explicit(&px_direct_verdict, memory_order_relaxed);
  if (!kvs__runtime_options()->llama_direct || v == 0 || !id ||
      flen < sizeof(kvs__llama_frame_hdr_t) || (v == 1 && id == c->direct_id))
    return NULL;
  kvs__llama_frame_hdr_t fh; /* checked by the assembler; here only a bound */
  memcpy(&fh, f, sizeof fh);
  uint64_t cap = (uint64_t)nch * (2ull * fh.n_layers + 2);
  if (cap > PX_DIRECT_MAX_RUNS) cap = PX_DIRECT_MAX_RUNS;
  return px_runs_room(&c->druns, &c->druns_cap, 0, cap, d) ? d : NULL;
}

static px_res_t px_load(px_ctx_t *c, struct llama_context *ctx, const px_plan_t *pl,
                        const kvs__llama_blob_hdr_t *hp, const int32_t *btok,
                        const uint8_t *state, uint32_t *k_out);

/* Is the object under a chunk key a chunk object (chunk storage, design §10.4) rather than a
 * state blob? A context storing chunks that finds no usable chunk run (its frame out of reach,
 * say) looks for a state stored whole under the same keys, where its own chunk objects lie:
 * they are not damaged blobs, never counted, reported or dropped. (Whole-blob contexts never
 * meet them: the namespaces differ, px_setup's sig.version.) */
static bool px_chunk_object(const void *bytes, uint64_t len) {
  uint32_t magic = 0;
  if (len >= sizeof magic) memcpy(&magic, bytes, sizeof magic);
  return magic == KVS_LLAMA_CHUNK_MAGIC;
}

/* Check blob (found under the key of pl->keyed tokens), choose the restore point *k and restore
 * it into the sequence (llama_state_seq_set_data, then llama_memory_seq_rm of [k, end)). */
static px_res_t px_restore_blob(px_ctx_t *c, struct llama_context *ctx, const px_plan_t *pl,
                                const uint8_t *blob, uint64_t len, uint32_t *k_out) {
  if (px_chunk_object(blob, len))
    return PX_SKIP; /* chunk storage's (px_restore_chunks), not a damaged blob: never dropped */
  kvs__llama_blob_hdr_t h;
  const kvs__llama_blob_want_t want = {KVS_LLAMA_BLOB_KIND_PREFIX, c->chunk, c->fp, c->ns};
  kvs__llama_blob_status_t st = kvs__llama_blob_check(blob, len, &want, &h);
  if (st != KVS_LLAMA_BLOB_OK) {
    kvs_log_warn("llama.cpp prefix cache: cached state refused: %s",
                 kvs__llama_blob_status_name(st));
    kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_bad_blobs);
    return PX_BAD;
  }
  const int32_t *tok = kvs__px_tok(&c->sh, (uint32_t)pl->s);
  if (h.keyed_tokens < pl->keyed ||
      memcmp(blob + KVS_LLAMA_BLOB_HDR, tok, (size_t)pl->keyed * 4) != 0) {
    kvs_log_warn("llama.cpp prefix cache: cached state refused: its tokens are not the prompt's");
    kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_bad_blobs);
    return PX_BAD;
  }
  if (h.n_tokens > c->sh.cap) return PX_SKIP; /* more cells than the sequence may hold */
  return px_load(c, ctx, pl, &h, (const int32_t *)(const void *)(blob + KVS_LLAMA_BLOB_HDR),
                 blob + KVS_LLAMA_BLOB_HDR + 4 * (uint64_t)h.n_tokens, k_out);
}

/* Restore a checked state (h: its n_tokens, keyed_tokens, canon_tokens, state_size; btok its
 * n_tokens tokens, the first pl->keyed checked equal to the prompt's; state its state_size
 * bytes, a llama_state_seq_get_data output) into sequence pl->s up to the restore point
 * px_restore_point chooses (llama_state_seq_set_data, then llama_memory_seq_rm of [k, end)).
 * Shared by whole blobs (px_restore_blob) and assembled states (px_restore_chunks). */
static px_res_t px_load(px_ctx_t *c, struct llama_context *ctx, const px_plan_t *pl,
                        const kvs__llama_blob_hdr_t *hp, const int32_t *btok,
                        const uint8_t *state, uint32_t *k_out) {
  const kvs__llama_blob_hdr_t h = *hp;
  int32_t s = pl->s;
  uint32_t n = pl->n;
  uint32_t k = px_restore_point(c, pl, &h, btok);
  if (!k) return PX_NONE;
  const char *why = NULL;
  if (pl->rebase && !c->saved_len && !px_save_seq(c, ctx, s)) return PX_SKIP;
  kvs__llama_state_api_t api;
  px_state_api(&api);
  px_direct_t *d = c->dl; /* a direct load of this very state (px_assemble), once */
  c->dl = NULL;
  c->direct_refused = false;
  if (d && (d->base != state || d->len != h.state_size)) d = NULL;
  px_direct_now = d;
  size_t rd = kvs__llama_state_set(&api, ctx, state, (size_t)h.state_size, s);
  px_direct_now = NULL;
  if (rd != h.state_size) why = "llama_state_seq_set_data refused it";
  else if (d && !px_direct_judge(d)) {
    why = "its tensor data did not all pass through ggml_backend_tensor_set";
    c->direct_refused = true;
  }
  if (!why && h.n_tokens > k && !px_real_llama_memory_seq_rm()(c->mem, s, (int32_t)k, -1))
    why = "llama_memory_seq_rm could not trim it";
  if (!why) {
    int32_t lo = px_real_llama_memory_seq_pos_min()(c->mem, s);
    int32_t hi = px_real_llama_memory_seq_pos_max()(c->mem, s);
    if ((c->swa ? lo < 0 : lo != 0) || hi != (int32_t)k - 1)
      why = "the restored cells are not positions 0..k-1";
  }
  if (!why) {
    *k_out = k;
    return PX_OK;
  }
  kvs_log_info("llama.cpp prefix cache: restore of %u tokens into sequence %d failed (%s): "
               "decoding the batch unchanged", k, s, why);
  px_undo(c, ctx, s, n);
  return PX_ENGINE;
}

static px_res_t px_restore_local(px_ctx_t *c, kvs__runtime_t *rt, struct llama_context *ctx,
                                 const px_plan_t *pl, uint32_t *k) {
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  kvs_key_t key = kvs__px_keys(&c->sh, (uint32_t)pl->s)[pl->keyed / c->chunk - 1];
  const uint8_t *blob;
  uint64_t len;
  kvs__cache_ref_t xfer;
  if (!kvs__llama_blob_pin(&home, key, &blob, &len, &xfer)) return PX_SKIP;
  px_res_t res = px_restore_blob(c, ctx, pl, blob, len, k);
  kvs__llama_blob_unpin(&home, key, xfer, res == PX_BAD);
  return res;
}

/* The keys of a peer's copy (kvs__cache_keys_fn): every chunk key of the tokens it covers, as
 * at its producer (computed from its tokens; the one asked for must be among them), in
 * work.keys: [h(J-1), h(0) .. h(J-2)]. The full check, tokens included, runs on the copy before
 * it is kept. */
typedef struct px_fetch_keys {
  px_ctx_t *c;
  kvs_key_t want;            /* the key asked for: h(j - 1) */
  uint32_t j;                /* its chunk count */
  uint64_t bad_len, bad_sum; /* a delivered object that failed a check (REPORT_BAD) */
} px_fetch_keys_t;

static int px_fetch_keys(void *ctx, size_t key_index, const void *bytes, uint64_t len,
                         const kvs_key_t **keys) {
  px_fetch_keys_t *k = ctx;
  const px_ctx_t *c = k->c;
  kvs__llama_blob_hdr_t h;
  if (key_index != 0) return -1;
  if (px_chunk_object(bytes, len)) return -1; /* not a blob, and not a bad one */
  if (len < KVS_LLAMA_BLOB_HDR) goto bad;
  memcpy(&h, bytes, sizeof h);
  if (h.magic != KVS_LLAMA_BLOB_MAGIC || h.kind != KVS_LLAMA_BLOB_KIND_PREFIX ||
      h.ns_lo != c->ns.lo || h.ns_hi != c->ns.hi || h.chunk_tokens != c->chunk ||
      h.keyed_tokens % c->chunk != 0 || h.keyed_tokens > h.n_tokens ||
      h.keyed_tokens > c->sh.cap || h.keyed_tokens < k->j * c->chunk ||
      4 * (uint64_t)h.n_tokens > len - KVS_LLAMA_BLOB_HDR)
    goto bad;
  uint32_t J = h.keyed_tokens / c->chunk;
  const uint32_t *tok =
      (const uint32_t *)(const void *)((const uint8_t *)bytes + KVS_LLAMA_BLOB_HDR);
  kvs_key_t prev = c->ns;
  for (uint32_t i = 0; i < J; i++) {
    prev = kvs_keys_chain(prev, tok + (size_t)i * c->chunk, c->chunk);
    if (i + 1 == k->j && !kvs_key_eq(prev, k->want)) goto bad; /* not the state asked for */
    c->work.keys[i + 1 < J ? i + 1 : 0] = prev;
  }
  *keys = c->work.keys;
  return c->swa ? 1 : (int)J; /* a window state: its own chunk key only */
bad: /* delivered under our key but not a state we can use: the peer is told (REPORT_BAD) */
  k->bad_len = len;
  k->bad_sum = kvs_checksum64(bytes, (size_t)len);
  return -1;
}

/* A peer delivered a cached state that failed a check: a bad blob, not a plain miss. Tell the
 * peer (REPORT_BAD), which drops it if it still holds exactly those bytes. */
static void px_report_bad(kvs__runtime_t *rt, uint64_t instance, kvs_key_t key, uint64_t len,
                          uint64_t sum, bool counted) {
  KVS__REENTRY_GUARD();
  if (!counted) {
    kvs_log_warn("llama.cpp prefix cache: a peer's cached state refused: malformed header");
    kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_bad_blobs);
  }
  kvs__cache_report_bad(rt, instance, key, len, sum);
}

/* Restore in place from the cache peer (one copy per node), as the state adapter does
 * (llama.c): the blob is checked and handed to llama_state_seq_set_data where it lies in the
 * peer's pool, under its pin, with no copy into our own memory first (the copy and its page
 * faults were most of a restore's time: docs/PERF.md 13). */
typedef struct px_inplace {
  px_ctx_t *c;
  struct llama_context *ctx;
  const px_plan_t *pl;
  uint32_t *k;
  px_res_t res;
  uint64_t bad_len, bad_sum; /* a blob that failed a check (REPORT_BAD) */
} px_inplace_t;

static int px_inplace_sink(void *ctx, size_t i, const kvs_layout_t *layout, const void *bytes,
                           uint64_t len) {
  (void)i;
  (void)layout;
  px_inplace_t *x = ctx;
  x->res = px_restore_blob(x->c, x->ctx, x->pl, bytes, len, x->k);
  if (x->res == PX_BAD) x->bad_len = len, x->bad_sum = kvs_checksum64(bytes, (size_t)len);
  return 0;
}

/* 1: the cache peer had the state (*res says what came of it), 0: ask the peers as before. */
static int px_restore_in_place(px_ctx_t *c, kvs__runtime_t *rt, struct llama_context *ctx,
                               const px_plan_t *pl, kvs_key_t key, uint32_t *k, px_res_t *res) {
  px_inplace_t x = {c, ctx, pl, k, PX_SKIP, 0, 0};
  int r = kvs__cache_read_cache_peer(rt, &key, 1, px_inplace_sink, &x);
  if (r == -ESTALE && x.res == PX_OK) {
    /* the pin lapsed while the engine read the bytes: they may have changed under it */
    px_undo(c, ctx, pl->s, pl->n);
    *res = PX_ENGINE;
    return 1;
  }
  if (r != 1) return 0;
  if (x.res == PX_BAD) px_report_bad(rt, kvs__cache_peer(rt), key, x.bad_len, x.bad_sum, true);
  if (x.res == PX_OK) {
    kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_peer_restores);
    kvs_stats_inc(px_stats(), KVS_STAT_cache_peer_loads);
  }
  *res = x.res;
  return 1;
}

static px_res_t px_restore_peer(px_ctx_t *c, kvs__runtime_t *rt, struct llama_context *ctx,
                                const px_plan_t *pl, uint64_t instance, uint32_t *k) {
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  uint32_t j = pl->keyed / c->chunk;
  px_fetch_keys_t fk = {c, kvs__px_keys(&c->sh, (uint32_t)pl->s)[j - 1], j, 0, 0};
  px_res_t inplace;
  if (px_restore_in_place(c, rt, ctx, pl, fk.want, k, &inplace)) return inplace;
  kvs__llama_blob_fetch_t f;
  int st = kvs__llama_blob_fetch(&home, instance, fk.want, px_fetch_keys, &fk, &f);
  if (st == KVS__CACHE_LOCAL) return px_restore_local(c, rt, ctx, pl, k);
  if (st != KVS__CACHE_COPIED) {
    if (fk.bad_len) px_report_bad(rt, instance, fk.want, fk.bad_len, fk.bad_sum, false);
    return PX_SKIP;
  }
  px_res_t res = px_restore_blob(c, ctx, pl, f.blob, f.len, k);
  if (res == PX_BAD)
    px_report_bad(rt, instance, fk.want, f.len, kvs_checksum64(f.blob, (size_t)f.len), true);
  kvs__llama_blob_keep(&home, &f, res != PX_BAD); /* a good copy is kept */
  if (res == PX_OK) kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_peer_restores);
  return res;
}

/* ---- chunk storage (design §10.4) -------------------------------------------------------------- */

/* The key of the frame whose id is id: a chain from the namespace over words no token chain
 * holds (the frame magic, above any vocabulary). */
static kvs_key_t px_frame_key(const px_ctx_t *c, uint64_t id) {
  uint32_t w[3] = {KVS_LLAMA_FRAME_MAGIC, (uint32_t)id, (uint32_t)(id >> 32)};
  return kvs_keys_chain(c->ns, w, 3);
}

/* The frame of this namespace: an alias bound to the first frame stored in it (every state of
 * one context layout has the same frame), so a restore can ask the cache peer for the frame and
 * the chunks in one transfer before it has read a chunk's frame id (px_chunks_in_place; a chunk
 * of another frame is then refused by the assembler and the copy path runs). */
static kvs_key_t px_frame_ns_key(const px_ctx_t *c) {
  uint32_t w = KVS_LLAMA_FRAME_MAGIC;
  return kvs_keys_chain(c->ns, &w, 1);
}

/* The continuation key after prev (a chunk key of the prompt, whose chunks [0, i) it closes):
 * bound to the first chunk object stored with index i after that prefix, whatever its tokens
 * (an alias of a whole chunk, or the only key of a short one of a state's canonical tokens past
 * its last whole chunk). A restore whose run of chunk keys ends at i finds there a chunk that
 * may share some of its next tokens with the prompt (design §10.4). A chain from prev over a
 * word no token chain holds (the chunk magic, above any vocabulary). */
static kvs_key_t px_next_key(kvs_key_t prev) {
  uint32_t w = KVS_LLAMA_CHUNK_MAGIC;
  return kvs_keys_chain(prev, &w, 1);
}

/* What a chunk or frame object is written from (kvs__llama_obj_store's fill). */
typedef struct px_fill {
  const uint8_t *state, *frame;
  const kvs__llama_chunks_scan_t *sc;
  const int32_t *tok;
  uint32_t T, upto, index;
  uint64_t flen;
  kvs_key_t ns;
} px_fill_t;

static int px_fill_frame(void *arg, uint8_t *dst) {
  const px_fill_t *f = arg;
  memcpy(dst, f->frame, (size_t)f->flen);
  return 0;
}

static int px_fill_chunk(void *arg, uint8_t *dst) {
  const px_fill_t *f = arg;
  uint64_t len = kvs__llama_chunk_size(f->sc, f->T, f->upto, f->index);
  return kvs__llama_chunk_write(f->state, f->sc, f->tok, f->T, f->upto, f->index, f->frame,
                                f->ns, dst, (size_t)len) == KVS_LLAMA_CHUNKS_OK
             ? 0
             : -EIO;
}

/* ---- direct snapshots (design §10.4) ----------------------------------------------------------- */

/* The mirror of direct loads: the engine's llama_state_seq_get_data writes a state's metadata
 * itself and hands every tensor run to ggml_backend_tensor_get with a pointer into the buffer
 * (llama_io_write_host, llama-context.cpp:2577-2628 of the pinned release: flushed when the
 * writer ends, inside the call). With the context's frame known from an earlier split (the
 * frame names no token count) the state's layout is known before the call: each chunk to store
 * is reserved first (kvs__cache_write_begin: in the cache peer's pool with one copy per node, each
 * reservation held there without the connection's lock, else in the own pool), its long runs
 * planned (kvs__llama_chunk_plan), and the hook sends each run the engine downloads straight into
 * its chunk; the state buffer receives the metadata and the runs of chunks not stored (dedup).
 * Then each chunk's header, tokens and short runs are written and its checksum computed
 * (kvs__llama_chunk_finish), and it is published: no copy of the state. Checked as a direct load
 * is: a run not moved through the hook in full, or a state
 * whose layout is not the one planned, aborts every reservation and the copy path runs (the
 * former also turns direct snapshots off for the process). */

/* Does the engine download a state's tensors through ggml_backend_tensor_get? As
 * px_direct_verdict. */
static atomic_int px_store_verdict = -1;

/* One object of a direct snapshot (the chunks to store, then the frame): its keys and chunk
 * index. Its write (kvs__cache_write_t, in the cache peer's pool or the own one) lies at the same
 * index of the array after the nmax of these. */
typedef struct px_planned {
  kvs_key_t keys[2];
  uint32_t index;
} px_planned_t;

/* Runs of chunks held already shorter than this are downloaded into the state buffer anyway
 * (above a cell's ext record, which the engine writes itself, not through ggml). */
#define PX_DROP_MIN_RUN 64u

/* The runs of chunks [first, first + n) of a direct snapshot (held already: nobody reads
 * them) into d with no destination, so the engine's downloads of them are dropped. Best
 * effort: without room they are downloaded into the state buffer as before. */
static void px_plan_drop(const uint8_t *frame, uint64_t N, int32_t s, uint32_t C, uint32_t first,
                         uint32_t n, const uint8_t *state, kvs__llama_defer_t *d) {
  if (!n) return;
  const uint64_t min = d->min;
  d->min = PX_DROP_MIN_RUN;
  (void)kvs__llama_plan_drop(frame, N, s, (uint64_t)first * C, (uint64_t)n * C, state, d);
  d->min = min;
}

/* Move planned object `from` (and its write) down to slot `to`: the write's keys are the slot's
 * own, and `from` no longer holds a begun write. */
static void px_planned_move(px_planned_t *pp, kvs__cache_write_t *w, uint32_t to, uint32_t from) {
  pp[to] = pp[from];
  w[to] = w[from];
  w[to].keys = pp[to].keys;
  w[from].rc = 1;
}

static void px_planned_abort(kvs__runtime_t *rt, kvs__cache_write_t *w, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) kvs__cache_write_drop(rt, &w[i]);
}

/* px_snapshot_chunks' work with the engine writing the chunks in place (above), for a state of S
 * bytes whose buffer (cbuf) is grown. 1: not done, nothing stored or left reserved (the caller
 * takes the copy path); else as px_snapshot_chunks. */
static int px_snapshot_direct(px_ctx_t *c, kvs__runtime_t *rt, struct llama_context *ctx,
                              int32_t s, const kvs_key_t *keys, uint32_t J, uint32_t cov,
                              int prun, size_t S, uint64_t *bytes) {
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  if (!kvs__runtime_options()->llama_direct || !c->sframe_len ||
      atomic_load_explicit(&px_store_verdict, memory_order_relaxed) == 0)
    return 1;
  const uint64_t cache = kvs__llama_blob_cache(&home); /* one copy per node: write there */
  const uint8_t *frame = c->sframe;
  kvs__llama_frame_hdr_t fh;
  memcpy(&fh, frame, sizeof fh);
  const uint64_t N = kvs__llama_chunks_state_tokens(frame, S); /* the layout to plan */
  const uint32_t C = c->chunk;
  if (!N || N < (uint64_t)J * C) return 1;
  if (cov > N) cov = (uint32_t)N;
  const uint32_t nmax = J + 2; /* the frame, chunks 0..J */
  /* room for every long run of the chunks stored, and (best effort) the runs of the chunks
   * held already, whose downloads are dropped */
  if ((uint64_t)nmax * (2ull * fh.n_layers + 2) > PX_DIRECT_MAX_RUNS) return 1;
  kvs__llama_defer_t d;
  if (!px_runs_room(&c->splan, &c->splan_cap,
                    nmax * (sizeof(px_planned_t) + sizeof(kvs__cache_write_t)),
                    PX_DIRECT_MAX_RUNS, &d))
    return 1;
  px_planned_t *pp = c->splan;
  kvs__cache_write_t *w = (kvs__cache_write_t *)(void *)(pp + nmax);
  uint64_t *served = px_served(&d);
  uint8_t *state = c->cbuf;
  /* every chunk not held already (the tail, J, under its continuation key alone), then the
   * frame (the context's: the check below finds the state's the same). At the cache peer all
   * are begun at once, after one look at what it holds (as px_snapshot_chunks stores there); in
   * the own pool each is begun right after its own look, so a chunk a reservation evicts is
   * still found missing and stored (as px_snapshot_chunks does). */
  uint32_t np = 0, dedup = 0, held = 0; /* held: the run of held chunks before chunk i */
  uint64_t saved = 0;
  for (uint32_t i = 0; i <= J; i++) {
    uint64_t len = kvs__llama_frame_chunk_size(frame, N, C, cov, i);
    if (!len || (i == J && !J)) {
      px_plan_drop(frame, N, s, C, i - held, held, state, &d);
      break;
    }
    if (i < J && ((int)i < prun || kvs__cache_has_local(rt, keys[i]))) {
      dedup++, saved += len, held++;
      continue;
    }
    px_plan_drop(frame, N, s, C, i - held, held, state, &d);
    held = 0;
    px_planned_t *p = &pp[np];
    p->index = i;
    p->keys[0] = i < J ? keys[i] : px_next_key(keys[J - 1]);
    p->keys[1] = i ? px_next_key(keys[i - 1]) : keys[i];
    w[np] = (kvs__cache_write_t){.keys = p->keys, .nk = i < J && i ? 2 : 1, .len = len};
    if (!cache) kvs__cache_writes_begin(rt, 0, &w[np], 1);
    np++;
  }
  pp[np] = (px_planned_t){{px_frame_key(c, fh.checksum), px_frame_ns_key(c)}, 0};
  w[np] = (kvs__cache_write_t){.keys = pp[np].keys, .nk = 2, .len = c->sframe_len};
  if (cache) kvs__cache_writes_begin(rt, cache, w, np + 1);
  else kvs__cache_writes_begin(rt, 0, &w[np], 1);
  /* keep the begun chunks and plan their long runs; then the frame (held already is fine) */
  uint32_t m = 0;
  bool ok = w[np].rc == 0 || w[np].rc == -EEXIST;
  for (uint32_t k = 0; ok && k < np; k++) {
    if (w[k].rc == -EEXIST) { /* stored meanwhile by another process: its runs dropped too */
      if (pp[k].index < J) {
        dedup++, saved += w[k].len;
        px_plan_drop(frame, N, s, C, pp[k].index, 1, state, &d);
      }
      continue;
    }
    ok = w[k].rc == 0 &&
         kvs__llama_chunk_plan(frame, N, s, C, cov, pp[k].index, state, w[k].bytes,
                               (size_t)w[k].len, &d) == KVS_LLAMA_CHUNKS_OK;
    if (ok && m != k) px_planned_move(pp, w, m, k);
    m += ok;
  }
  if (!ok || !d.n) {
    px_planned_abort(rt, w, np + 1);
    return 1;
  }
  if (m != np) px_planned_move(pp, w, m, np); /* the frame after the kept chunks */
  np = m; /* chunks; the frame is w[np] */
  if (w[np].rc == 0) memcpy(w[np].bytes, frame, (size_t)c->sframe_len);
  kvs__llama_runs_sort(&d);
  memset(served, 0, (size_t)d.n * sizeof *served);
  px_direct_t dw = {state, S, d.runs, served, d.n, true};
  kvs__llama_state_api_t api;
  px_state_api(&api);
  px_direct_now = &dw;
  size_t got = kvs__llama_state_get(&api, ctx, state, S, s);
  px_direct_now = NULL;
  kvs__llama_chunks_scan_t sc;
  bool whole = got == S && px_direct_whole(&dw);
  if (got == S && !whole) {
    kvs_stats_inc(px_stats(), KVS_STAT_llama_chunks_direct_store_refused);
    if (atomic_exchange(&px_store_verdict, 0) != 0)
      kvs_log_info("llama.cpp prefix cache: the engine did not download every tensor run of a "
                   "state through ggml_backend_tensor_get: snapshots copy the state from now on");
  }
  /* the layout planned must be the one written: same token count, same frame */
  uint8_t *fnow = state + S;
  if (!whole || kvs__llama_chunks_scan(state, S, &sc) != KVS_LLAMA_CHUNKS_OK || sc.n_cells != N ||
      sc.frame_size != c->sframe_len ||
      kvs__llama_chunks_frame(state, &sc, C, c->ns, fnow, (size_t)sc.frame_size) != fh.checksum) {
    px_planned_abort(rt, w, np + 1);
    return 1;
  }
  if (atomic_exchange(&px_store_verdict, 1) != 1)
    kvs_log_info("llama.cpp prefix cache: the engine downloads a state's tensors through "
                 "ggml_backend_tensor_get: snapshots write the chunks in place");
  const int32_t *tok = kvs__px_tok(&c->sh, (uint32_t)s);
  for (uint32_t k = 0; k < np; k++)
    if (kvs__llama_chunk_finish(state, &sc, tok, C, cov, pp[k].index, frame, c->ns, w[k].bytes,
                                (size_t)w[k].len, PX_DIRECT_MIN_RUN) != KVS_LLAMA_CHUNKS_OK) {
      px_planned_abort(rt, w, np + 1);
      return -EIO;
    }
  /* published together; a chunk that fails leaves the others (a later restore uses the run
   * they make) */
  kvs__cache_writes_publish(rt, w, np + 1);
  kvs_stats_t *st = px_stats();
  uint64_t wrote = 0;
  int rc = w[np].rc == -EEXIST ? 0 : w[np].rc;
  for (uint32_t k = 0; k < np; k++) {
    if (w[k].rc != 0) {
      rc = rc ? rc : w[k].rc;
      continue;
    }
    kvs_stats_inc(st, pp[k].index < J ? KVS_STAT_llama_chunks_stored
                                      : KVS_STAT_llama_chunks_tails);
    wrote += w[k].len;
  }
  kvs_stats_add(st, KVS_STAT_llama_chunks_dedup, dedup);
  kvs_stats_add(st, KVS_STAT_llama_chunks_saved_bytes, saved);
  if (rc < 0) return rc;
  kvs_stats_inc(st, KVS_STAT_llama_chunks_direct_stores);
  *bytes = wrote + sc.frame_size;
  return 0;
}

/* Store sequence s's state as a frame and its first J chunks (chunk i > 0 also under the
 * continuation key after chunk i - 1), each chunk already cached here or at a peer (keys[0,
 * prun): the leading run the caller's look found at the peers) counted and not stored again,
 * then the canonical tokens past them up to cov (< J + 1 chunks) as a short
 * chunk under the continuation key after chunk J - 1 alone. 0 (stored; *bytes what was
 * written), 1 (the state cannot be split: store it whole), or a negative errno. */
static int px_snapshot_chunks(px_ctx_t *c, kvs__runtime_t *rt, struct llama_context *ctx,
                              int32_t s, const kvs_key_t *keys, uint32_t J, uint32_t cov,
                              int prun, uint64_t *bytes) {
  kvs_stats_t *st = px_stats();
  kvs__llama_state_api_t api;
  px_state_api(&api);
  size_t S = kvs__llama_state_size(&api, ctx, s);
  if (S < KVS_LLAMA_STATE_HDR) return -ENODATA;
  /* the state, then its frame (px_grow keeps no contents: sized once for both) */
  const size_t fmax = sizeof(kvs__llama_frame_hdr_t) +
                      KVS_LLAMA_CHUNKS_MAX_SECTIONS * (sizeof(kvs__llama_frame_sec_t) +
                      KVS_LLAMA_CHUNKS_MAX_LAYERS * sizeof(kvs__llama_frame_layer_t));
  c->asm_id = 0; /* the state written below replaces any assembly */
  if (!px_grow_state(c, S + fmax)) return -ENOMEM;
  int dr = px_snapshot_direct(c, rt, ctx, s, keys, J, cov, prun, S, bytes);
  if (dr != 1) return dr;
  if (kvs__llama_state_get(&api, ctx, c->cbuf, S, s) != S) return -EIO;
  kvs__llama_chunks_scan_t sc;
  kvs__llama_chunks_status_t r = kvs__llama_chunks_scan(c->cbuf, S, &sc);
  if (r != KVS_LLAMA_CHUNKS_OK || sc.n_cells < J * c->chunk) {
    kvs_stats_inc(st, KVS_STAT_llama_chunks_whole);
    kvs_stats_inc(st, r == KVS_LLAMA_CHUNKS_OK || r == KVS_LLAMA_CHUNKS_CELLS
                          ? KVS_STAT_llama_chunks_whole_cells
                          : KVS_STAT_llama_chunks_whole_layout);
    kvs_log_info("llama.cpp prefix cache: state of sequence %d stored whole: %s", s,
                 r != KVS_LLAMA_CHUNKS_OK ? kvs__llama_chunks_status_name(r)
                                          : "fewer cells than tokens");
    return 1;
  }
  const uint8_t *state = c->cbuf;
  uint8_t *frame = (uint8_t *)c->cbuf + S;
  uint64_t id = kvs__llama_chunks_frame(state, &sc, c->chunk, c->ns, frame, (size_t)sc.frame_size);
  if (!id) return -EIO;
  /* the context's frame, for its next snapshots' plans (px_snapshot_direct) */
  if (px_grow(&c->sframe, &c->sframe_cap, (size_t)sc.frame_size)) {
    memcpy(c->sframe, frame, (size_t)sc.frame_size);
    c->sframe_len = sc.frame_size;
  }
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  if (cov > sc.n_cells) cov = sc.n_cells;
  px_fill_t f = {state, frame, &sc, kvs__px_tok(&c->sh, (uint32_t)s), c->chunk, cov, 0,
                 sc.frame_size, c->ns};
  const kvs_key_t fkeys[2] = {px_frame_key(c, id), px_frame_ns_key(c)};
  int rc = kvs__llama_obj_store(&home, fkeys, 2, sc.frame_size, px_fill_frame, &f);
  if (rc < 0 && rc != -EEXIST) return rc;
  uint64_t wrote = 0;
  for (uint32_t i = 0; i < J; i++) {
    uint64_t len = kvs__llama_chunk_size(&sc, c->chunk, cov, i);
    if ((int)i < prun || kvs__cache_has_local(rt, keys[i])) {
      kvs_stats_inc(st, KVS_STAT_llama_chunks_dedup);
      kvs_stats_add(st, KVS_STAT_llama_chunks_saved_bytes, len);
      continue;
    }
    f.index = i;
    const kvs_key_t ck[2] = {keys[i], i ? px_next_key(keys[i - 1]) : keys[i]};
    rc = kvs__llama_obj_store(&home, ck, i ? 2 : 1, len, px_fill_chunk, &f);
    if (rc == -EEXIST) { /* stored meanwhile by another process */
      kvs_stats_inc(st, KVS_STAT_llama_chunks_dedup);
      kvs_stats_add(st, KVS_STAT_llama_chunks_saved_bytes, len);
      continue;
    }
    if (rc < 0) return rc; /* the chunks before it stay: a later restore uses their run */
    kvs_stats_inc(st, KVS_STAT_llama_chunks_stored);
    wrote += len;
  }
  /* The tail: a short chunk J of the canonical tokens past the whole chunks, found by a restore
   * through its continuation key only. Another continuation there already (a chunk stored after
   * the same J chunks by an earlier prompt) keeps the key: -EEXIST, nothing stored. */
  uint64_t tlen = kvs__llama_chunk_size(&sc, c->chunk, cov, J);
  if (tlen && J) {
    const kvs_key_t tkey = px_next_key(keys[J - 1]);
    f.index = J;
    rc = kvs__llama_obj_store(&home, &tkey, 1, tlen, px_fill_chunk, &f);
    if (rc == 0) {
      kvs_stats_inc(st, KVS_STAT_llama_chunks_tails);
      wrote += tlen;
    } else if (rc != -EEXIST) {
      kvs_log_debug("llama.cpp prefix cache: tail of sequence %d (%u tokens) not stored: %s", s,
                    cov - J * c->chunk, strerror(-rc));
    }
  }
  *bytes = wrote + sc.frame_size;
  return 0;
}

/* One object of a restore by assembly: pinned in the local run (ref, ended by
 * kvs__llama_blob_unpin), or a peer's copy being written locally (f, ended by
 * kvs__llama_blob_keep). */
typedef struct px_piece {
  const uint8_t *p;
  size_t len;
  bool fetched;
  kvs__cache_ref_t ref;
  kvs__llama_blob_fetch_t f;
} px_piece_t;

/* kvs__cache_keys_fn for one chunk or frame object: bound under the key asked for only. */
typedef struct px_one_key {
  kvs_key_t key;
  uint32_t magic;
} px_one_key_t;

static int px_one_key(void *ctx, size_t key_index, const void *bytes, uint64_t len,
                      const kvs_key_t **keys) {
  const px_one_key_t *o = ctx;
  if (key_index != 0 || len < 4 || memcmp(bytes, &o->magic, 4) != 0) return -1;
  *keys = &o->key;
  return 1;
}

/* A peer's copy of the object under key (its magic) into *pc: true when copied. */
static bool px_fetch_piece(kvs__runtime_t *rt, uint64_t instance, kvs_key_t key, uint32_t magic,
                           px_piece_t *pc) {
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  px_one_key_t ok = {key, magic};
  if (kvs__llama_blob_fetch(&home, instance, key, px_one_key, &ok, &pc->f) != KVS__CACHE_COPIED)
    return false;
  pc->p = pc->f.blob;
  pc->len = (size_t)pc->f.len;
  pc->fetched = true;
  return true;
}

/* How many of the chunk objects p[0..n) (the prompt's chunks 0, 1, .. in order) hold the
 * prompt's tokens: the run stops at the first that does not. */
static uint32_t px_chunks_matching(const px_ctx_t *c, const int32_t *tok, const uint8_t *const *p,
                                   const size_t *len, uint32_t n) {
  const uint32_t C = c->chunk;
  uint32_t good = 0;
  while (good < n && len[good] >= sizeof(kvs__llama_chunk_hdr_t) + 4ull * C &&
         memcmp(p[good] + sizeof(kvs__llama_chunk_hdr_t), tok + (size_t)good * C, 4ull * C) == 0)
    good++;
  return good;
}

/* How many of the first tokens of a continuation chunk (p, len: claimed to be chunk index
 * `good`) are the prompt's next ones. Its header is read only to compare tokens: the assembler
 * checks every field and its checksum. */
static uint32_t px_take(const px_ctx_t *c, const px_plan_t *pl, uint32_t good, const uint8_t *p,
                        size_t len) {
  kvs__llama_chunk_hdr_t h;
  uint32_t take = 0;
  if (len < sizeof h) return 0;
  memcpy(&h, p, sizeof h);
  const int32_t *tok = kvs__px_tok(&c->sh, (uint32_t)pl->s);
  const uint32_t left = pl->n + pl->m - good * c->chunk;
  if (h.magic == KVS_LLAMA_CHUNK_MAGIC && h.index == good && h.n_tokens >= 1 &&
      h.n_tokens <= c->chunk && len >= sizeof h + 4ull * h.n_tokens)
    while (take < h.n_tokens && take < left &&
           memcmp(p + sizeof h + 4ull * take, tok + (size_t)good * c->chunk + take, 4) == 0)
      take++;
  return take;
}

/* The identity of an assembly's output: the frame's id and every chunk's checksum (each covers
 * the header fields before it and the payload), the tokens taken of the last, the
 * sequence and the state's size. The assembler is a function of exactly these, so two
 * assemblies of one identity write the same bytes. 0: a piece too short to say (assemble). */
static uint64_t px_assembly_id(const px_ctx_t *c, const px_plan_t *pl, const uint8_t *f,
                               size_t flen, const uint8_t *const *ch, const size_t *lens,
                               uint32_t nch, uint32_t take, uint64_t S) {
  if (flen < sizeof(kvs__llama_frame_hdr_t)) return 0;
  XXH3_state_t h;
  XXH3_64bits_reset(&h);
  XXH3_64bits_update(&h, f + offsetof(kvs__llama_frame_hdr_t, checksum), 8);
  for (uint32_t i = 0; i < nch; i++) {
    if (lens[i] < sizeof(kvs__llama_chunk_hdr_t)) return 0;
    XXH3_64bits_update(&h, ch[i] + offsetof(kvs__llama_chunk_hdr_t, checksum), 8);
  }
  const uint64_t tail[5] = {nch, take, (uint64_t)pl->s, S, c->chunk};
  XXH3_64bits_update(&h, tail, sizeof tail);
  uint64_t id = XXH3_64bits_digest(&h);
  return id ? id : 1;
}

/* kvs__llama_chunks_assemble into cbuf (S bytes, grown by the caller) of good whole chunks and
 * take tokens of the next, for sequence pl->s; a success timed in llama_chunks_assemble_ns and
 * counted in llama_chunks_assembled. When cbuf already holds that assembly (the context's last,
 * nothing written over it since) it is used as it is: counted in llama_chunks_reused. A restore
 * of a popular prefix into the slots of one replica copies it once, not per restore (design
 * §10.4). Such a reuse does not read the chunks' payloads again: a chunk damaged since the
 * assembly is found at the next assembly that reads it (the state loaded is the one checked).
 * With direct loads (px_defer_for) the long runs are hashed but left in the chunks, and c->dl
 * tells px_load to serve them from there: the chunks must stay pinned until that load. A run
 * loaded directly and restored again at once is assembled whole the second time (then reused). */
static kvs__llama_chunks_status_t px_assemble(px_ctx_t *c, const px_plan_t *pl, const uint8_t *f,
                                              size_t flen, const uint8_t *const *ch,
                                              const size_t *lens, uint32_t good, uint32_t take,
                                              uint64_t S, size_t *got) {
  const uint32_t nch = good + (take ? 1 : 0);
  uint64_t id = px_assembly_id(c, pl, f, flen, ch, lens, nch, take, S);
  c->dl = NULL;
  if (id && c->asm_id == id) {
    *got = c->asm_got;
    kvs_stats_inc(px_stats(), KVS_STAT_llama_chunks_reused);
    return KVS_LLAMA_CHUNKS_OK;
  }
  c->asm_id = 0;
  kvs__llama_defer_t defer, *dp = px_defer_for(c, f, flen, nch, id, &defer);
  uint64_t t0 = kvs__now_ns();
  kvs__llama_chunks_status_t r = kvs__llama_chunks_assemble(
      f, flen, c->chunk, c->ns, ch, lens, nch, take, pl->s, c->cbuf, (size_t)S, got, dp);
  if (r != KVS_LLAMA_CHUNKS_OK) return r;
  kvs_stats_add(px_stats(), KVS_STAT_llama_chunks_assemble_ns, kvs__now_ns() - t0);
  kvs_stats_inc(px_stats(), KVS_STAT_llama_chunks_assembled);
  if (dp && dp->n) { /* px_load loads it directly; cbuf is not the whole state: no reuse */
    px_direct_t *d = &c->direct;
    *d = (px_direct_t){c->cbuf, *got, dp->runs, px_served(dp), dp->n, false};
    memset(d->served, 0, (size_t)dp->n * sizeof *d->served);
    c->dl = d;
    c->direct_id = id;
  } else {
    c->asm_id = id;
    c->asm_got = *got;
  }
  return r;
}

/* Load the state assembled in cbuf (got bytes: good whole chunks and take tokens of the next,
 * the prompt's tokens) with px_load; the tokens restored past the whole chunks are counted. */
static px_res_t px_load_assembled(px_ctx_t *c, struct llama_context *ctx, px_plan_t *pl,
                                  uint32_t good, uint32_t take, size_t got, uint32_t *k) {
  const uint32_t N = good * c->chunk + take;
  kvs__llama_blob_hdr_t bh;
  memset(&bh, 0, sizeof bh);
  bh.n_tokens = bh.keyed_tokens = bh.canon_tokens = N;
  bh.state_size = got;
  pl->keyed = N;
  px_res_t res = px_load(c, ctx, pl, &bh, kvs__px_tok(&c->sh, (uint32_t)pl->s), c->cbuf, k);
  if (res == PX_OK && *k > good * c->chunk)
    kvs_stats_add(px_stats(), KVS_STAT_llama_chunks_tail_tokens, *k - good * c->chunk);
  return res;
}

/* px_assemble into cbuf (S bytes, grown by the caller), then px_load_assembled: directly when
 * px_assemble made it a direct load. A direct load the engine did not serve in full was undone
 * and turned direct loads off: the run is then assembled whole and loaded again (the first
 * restore by assembly of a process on such an engine). The chunks must stay pinned throughout.
 * OK: *res says how the load went; else the assembler's refusal, nothing loaded. */
static kvs__llama_chunks_status_t px_assemble_load(px_ctx_t *c, struct llama_context *ctx,
                                                   px_plan_t *pl, const uint8_t *f, size_t flen,
                                                   const uint8_t *const *ch, const size_t *lens,
                                                   uint32_t good, uint32_t take, uint64_t S,
                                                   uint32_t *k, px_res_t *res) {
  size_t got = 0;
  kvs__llama_chunks_status_t r = px_assemble(c, pl, f, flen, ch, lens, good, take, S, &got);
  if (r != KVS_LLAMA_CHUNKS_OK) return r;
  *res = px_load_assembled(c, ctx, pl, good, take, got, k);
  if (!c->direct_refused) return r;
  c->direct_refused = false;
  r = px_assemble(c, pl, f, flen, ch, lens, good, take, S, &got); /* whole: direct loads off */
  if (r == KVS_LLAMA_CHUNKS_OK) *res = px_load_assembled(c, ctx, pl, good, take, got, k);
  return r;
}

/* px_chunks_in_place's transfer: the frame (key 0), the run's chunks, the continuation chunk
 * (when asked for); the assembly and the load run in the last delivery, while every object is
 * pinned (a direct load reads the chunks where they lie). */
typedef struct px_inplace_chunks {
  px_ctx_t *c;
  px_plan_t *pl;
  const uint8_t **ptr;
  size_t *lens;
  uint32_t nk, prun;
  bool cont;
  uint32_t good, take;
  kvs__llama_chunks_status_t st; /* OK: assembled and loaded, res says how */
  struct llama_context *ctx;
  uint32_t *k;
  px_res_t res;
} px_inplace_chunks_t;

static int px_inplace_chunks_sink(void *ctx, size_t i, const kvs_layout_t *layout,
                                  const void *bytes, uint64_t len) {
  (void)layout;
  px_inplace_chunks_t *x = ctx;
  if (i >= x->nk) return -1;
  x->ptr[i] = bytes;
  x->lens[i] = (size_t)len;
  if (i + 1 < x->nk) return 0;
  for (uint32_t j = 0; j < x->nk; j++)
    if (!x->ptr[j]) return -1; /* an object under two of the keys: not this path's case */
  px_ctx_t *c = x->c;
  const uint32_t C = c->chunk;
  const int32_t *tok = kvs__px_tok(&c->sh, (uint32_t)x->pl->s);
  x->good = px_chunks_matching(c, tok, x->ptr + 1, x->lens + 1, x->prun);
  /* a chunk under the prompt's key with other tokens is damaged (its key is the chain hash of
   * its tokens): the copy path finds and drops it */
  if (x->good < x->prun) return 0;
  /* the whole run matched: the continuation chunk, the last key, lies at ptr[good + 1] */
  if (x->cont)
    x->take = px_take(c, x->pl, x->good, x->ptr[x->nk - 1], x->lens[x->nk - 1]);
  uint64_t N = (uint64_t)x->good * C + x->take;
  if (!x->good || N <= x->pl->n || N > c->sh.cap || x->lens[0] < sizeof(kvs__llama_frame_hdr_t))
    return 0;
  uint64_t S = kvs__llama_chunks_state_size(x->ptr[0], N);
  if (!S || !px_grow_state(c, (size_t)S)) return 0;
  x->st = px_assemble_load(c, x->ctx, x->pl, x->ptr[0], x->lens[0], x->ptr + 1, x->lens + 1,
                           x->good, x->take, S, x->k, &x->res);
  return 0;
}

/* One copy per node, nothing of the run here: the frame, the run's prun chunks and the
 * continuation chunk read in place in the cache peer's pool, in one transfer, and assembled
 * under its pins straight into cbuf (no copy into the own pool first); the engine then loads
 * cbuf. 1: done (*res says what came of it), 0: use the copy path (px_restore_chunks), which
 * also finds and drops a damaged object. */
static int px_chunks_in_place(px_ctx_t *c, kvs__runtime_t *rt, struct llama_context *ctx,
                              px_plan_t *pl, const kvs_key_t *keys, uint32_t prun,
                              uint64_t cache, uint32_t *k, px_res_t *res) {
  const uint32_t C = c->chunk;
  uint32_t nk = 1 + prun;
  /* the frame and the continuation chunk are read with the run, so they are looked up first
   * in one LOOKUP (the frame, else nothing to assemble; then the continuation chunk when the
   * prompt goes on past the run): the continuation may not be there, and only a LOOKUP asks a
   * serve with tiers below its pool to bring what the pool lacks (docs/protocol.md 4.3; the
   * run's LOOKUP named neither). Without such tiers and no continuation wanted, the read
   * itself finds the frame or not: no round trip more. */
  const kvs_key_t look[2] = {px_frame_ns_key(c), px_next_key(keys[prun - 1])};
  bool want_cont = (uint64_t)prun * C < (uint64_t)pl->n + pl->m;
  uint64_t at = cache;
  int found = want_cont || kvs__cache_peer_has_tiers(rt, cache)
                  ? kvs__cache_peers_run(rt, look, want_cont ? 2 : 1, &at)
                  : 1;
  if (found < 1 || at != cache) return 0;
  kvs_key_t tkey = look[1];
  bool cont = want_cont && found == 2;
  nk += cont;
  if (nk > KVS_PROTO_MAX_KEYS) return 0;
  size_t need = (size_t)nk * (sizeof(kvs_key_t) + sizeof(const uint8_t *) + sizeof(size_t));
  if (!px_grow(&c->cpin, &c->cpin_cap, need)) return 0;
  kvs_key_t *ik = c->cpin;
  const uint8_t **ptr = (const uint8_t **)(void *)(ik + nk);
  size_t *lens = (size_t *)(void *)(ptr + nk);
  ik[0] = px_frame_ns_key(c);
  memcpy(ik + 1, keys, (size_t)prun * sizeof *ik);
  if (cont) ik[nk - 1] = tkey;
  memset(ptr, 0, (size_t)nk * sizeof *ptr);
  px_inplace_chunks_t x = {.c = c, .pl = pl, .ptr = ptr, .lens = lens, .nk = nk, .prun = prun,
                           .cont = cont, .st = KVS_LLAMA_CHUNKS_FIELD, .ctx = ctx, .k = k};
  int r = kvs__cache_read_cache_peer(rt, ik, nk, px_inplace_chunks_sink, &x);
  if (r != (int)nk || x.st != KVS_LLAMA_CHUNKS_OK) { /* -ESTALE too: cbuf thrown away */
    c->asm_id = 0;
    /* the pins expired while it was read: what was loaded may be another object's bytes */
    if (x.st == KVS_LLAMA_CHUNKS_OK && x.res == PX_OK) px_undo(c, ctx, pl->s, pl->n);
    return 0;
  }
  *res = x.res;
  if (*res == PX_OK) {
    kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_peer_restores);
    kvs_stats_inc(px_stats(), KVS_STAT_cache_peer_loads);
  }
  return 1;
}

/* The continuation chunk after a run of `good` whole chunks (px_next_key): pinned here, else a
 * peer's copy, into *tp (*pinned: which), and how many of its first tokens are the prompt's
 * next ones (0: none usable; *tp then holds nothing). Its header is read only to compare
 * tokens: the assembler checks every field and its checksum. */
static uint32_t px_continuation(px_ctx_t *c, kvs__runtime_t *rt, const px_plan_t *pl,
                                uint32_t good, kvs_key_t tkey, px_piece_t *tp, bool *pinned,
                                uint64_t *at) {
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  uint64_t plen = 0;
  *pinned = kvs__llama_blob_pin(&home, tkey, &tp->p, &plen, &tp->ref);
  tp->len = (size_t)plen;
  *at = 0;
  if (!*pinned) {
    if (!kvs__cache_has_peers(rt) || kvs__cache_peers_run(rt, &tkey, 1, at) != 1 || !*at ||
        !px_fetch_piece(rt, *at, tkey, KVS_LLAMA_CHUNK_MAGIC, tp))
      return 0;
  }
  uint32_t take = px_take(c, pl, good, tp->p, tp->len);
  if (take == 0) {
    if (*pinned) kvs__llama_blob_unpin(&home, tkey, tp->ref, false);
    else kvs__llama_blob_keep(&home, &tp->f, true);
    *pinned = false;
    tp->fetched = false;
  }
  return take;
}

/* The first damaged object of chunks ptr[from, to) (at their indices in the state) of frame fr:
 * its index, or `to` when each passes its check (checksum included); *frame_bad, and `to`, when
 * the frame itself fails its check (then no chunk is looked at). */
static uint32_t px_first_damaged(const px_ctx_t *c, const px_piece_t *fr,
                                 const uint8_t *const *ptr, const size_t *lens, uint32_t from,
                                 uint32_t to, bool *frame_bad) {
  kvs__llama_frame_hdr_t fh;
  if (kvs__llama_frame_check(fr->p, fr->len, c->chunk, c->ns, &fh) != KVS_LLAMA_CHUNKS_OK) {
    *frame_bad = true;
    return to;
  }
  for (uint32_t i = from; i < to; i++)
    if (kvs__llama_chunk_check(ptr[i], lens[i], &fh, i, NULL) != KVS_LLAMA_CHUNKS_OK) return i;
  return to;
}

/* Restore sequence pl->s from the longest run of chunk objects of the prompt (jmax chunks at
 * most): the local run, then the best peer's run after it (nothing local and the run at the
 * cache peer: read there in place, px_chunks_in_place); the first chunks' tokens must be
 * the prompt's; then the part of the continuation chunk after the run that is the prompt's too
 * (px_continuation: the tail of an earlier snapshot, or a chunk of a prompt that went on
 * differently); every object is checked by the assembler; the state is assembled into cbuf and
 * restored by px_load. A damaged chunk is counted, dropped (locally; a peer is told) and ends
 * the run. PX_SKIP: no chunk run. */
static px_res_t px_restore_chunks(px_ctx_t *c, kvs__runtime_t *rt, struct llama_context *ctx,
                                  px_plan_t *pl, uint32_t jmax, uint32_t *k) {
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  const kvs_key_t *keys = kvs__px_keys(&c->sh, (uint32_t)pl->s);
  const uint32_t C = c->chunk;
  size_t need = (size_t)(jmax + 1) * (sizeof(px_piece_t) + sizeof(const uint8_t *) +
                                      sizeof(size_t));
  if (!px_grow(&c->cpin, &c->cpin_cap, need)) return PX_SKIP;
  px_piece_t *pc = c->cpin;
  const uint8_t **ptr = (const uint8_t **)(void *)(pc + jmax + 1);
  size_t *lens = (size_t *)(void *)(ptr + jmax + 1);
  /* the local run: each chunk pinned (unpinned at out) */
  uint32_t run = 0;
  while (run < jmax) {
    uint64_t plen = 0;
    if (!kvs__llama_blob_pin(&home, keys[run], &pc[run].p, &plen, &pc[run].ref)) break;
    pc[run].len = (size_t)plen;
    pc[run].fetched = false;
    run++;
  }
  uint32_t n = run;
  uint64_t best = 0;
  if (n < jmax && kvs__cache_has_peers(rt)) {
    int prun = kvs__cache_peers_run(rt, keys + n, jmax - n, &best);
    px_res_t ipr;
    if (run == 0 && prun > 0 && best && best == kvs__cache_peer(rt) &&
        px_chunks_in_place(c, rt, ctx, pl, keys, (uint32_t)prun, best, k, &ipr))
      return ipr;
    for (int i = 0; i < prun && best; i++, n++)
      if (!px_fetch_piece(rt, best, keys[n], KVS_LLAMA_CHUNK_MAGIC, &pc[n])) break;
  }
  px_res_t res = PX_SKIP;
  bool bad[1] = {false}; /* a damaged chunk (bad_i): dropped locally, reported to a peer */
  uint32_t bad_i = 0;
  px_piece_t tp = {NULL, 0, false, 0, {0}}; /* the continuation chunk (take tokens of it) */
  bool tpinned = false;
  uint32_t take = 0, good = 0; /* good: the run's chunks holding the prompt's tokens */
  uint64_t tat = 0;
  kvs_key_t tkey = {0, 0};
  kvs__llama_chunk_hdr_t h0;
  px_piece_t fr = {NULL, 0, false, 0, {0}};
  kvs__cache_ref_t fxfer = 0;
  kvs_key_t fkey = {0, 0};
  bool fpinned = false, fbad = false; /* fbad: the frame failed its check (dropped, told) */
  uint64_t fat = 0;                   /* the peer the frame was fetched from */
  /* the first piece must be a chunk object (a whole blob under this key: the blob path); a run
   * and a continuation chunk could reach past the sequence's n */
  if (n == 0 || (uint64_t)(n + 1) * C <= pl->n || pc[0].len < sizeof h0 ||
      (memcpy(&h0, pc[0].p, sizeof h0), h0.magic != KVS_LLAMA_CHUNK_MAGIC))
    goto out;
  /* its frame: local, else at a peer */
  fkey = px_frame_key(c, h0.frame_id);
  uint64_t flen64 = 0;
  fpinned = kvs__llama_blob_pin(&home, fkey, &fr.p, &flen64, &fxfer);
  fr.len = (size_t)flen64;
  /* from the peer of the run; looked up first where that peer keeps tiers below its pool
   * (only a LOOKUP brings the frame from them), which also names the peer holding it */
  fat = best;
  if (!fpinned &&
      !(kvs__cache_has_peers(rt) &&
        (!kvs__cache_peer_has_tiers(rt, best) ||
         (kvs__cache_peers_run(rt, &fkey, 1, &fat) == 1 && fat)) &&
        px_fetch_piece(rt, fat, fkey, KVS_LLAMA_FRAME_MAGIC, &fr)))
    goto out;
  /* the chunks' tokens must be the prompt's: the run stops at the first that differs */
  const int32_t *tok = kvs__px_tok(&c->sh, (uint32_t)pl->s);
  for (uint32_t i = 0; i < n; i++) {
    ptr[i] = pc[i].p;
    lens[i] = pc[i].len;
  }
  good = px_chunks_matching(c, tok, ptr, lens, n);
  if (good < n) {
    /* Chunk `good` lies under the prompt's key but holds other tokens. Its key is the chain
     * hash of exactly its tokens, so it is damaged (its checksum says so): counted and dropped
     * (told), or it would end every restore of this prefix and every snapshot would find it
     * held. The run before it is still assembled, without a continuation. */
    bool frame_bad = false; /* left to the assembly below, which drops it */
    if (px_first_damaged(c, &fr, ptr, lens, good, good + 1, &frame_bad) == good) {
      kvs_log_warn("llama.cpp prefix cache: chunk object refused: chunk %u holds other tokens "
                   "than its key's and fails its checksum", good);
      kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_bad_blobs);
      bad[0] = true;
      bad_i = good;
    }
  }
  if (!bad[0] && good && (uint64_t)good * C < (uint64_t)pl->n + pl->m) {
    tkey = px_next_key(keys[good - 1]);
    take = px_continuation(c, rt, pl, good, tkey, &tp, &tpinned, &tat);
  }
  if ((uint64_t)good * C + take <= pl->n) goto out;
  const uint32_t nch = good + (take ? 1 : 0);
  if (take) {
    ptr[good] = tp.p;
    lens[good] = tp.len;
  }
  uint64_t N = (uint64_t)good * C + take;
  uint64_t S = kvs__llama_chunks_state_size(fr.p, N);
  if (fr.len < sizeof(kvs__llama_frame_hdr_t) || !S || N > c->sh.cap) goto out;
  /* the state straight into cbuf (reused: grown, never shrunk), each chunk checked (its
   * checksum: one pass) and its long runs left where they are for a direct load (else copied
   * once); handed to llama_state_seq_set_data from there with the prompt's tokens (the run's,
   * checked equal above): no blob is sealed or checked again */
  if (!px_grow_state(c, (size_t)S)) goto out;
  kvs__llama_chunks_status_t r =
      px_assemble_load(c, ctx, pl, fr.p, fr.len, ptr, lens, good, take, S, k, &res);
  if (r != KVS_LLAMA_CHUNKS_OK) {
    kvs_log_warn("llama.cpp prefix cache: chunk objects refused: %s",
                 kvs__llama_chunks_status_name(r));
    kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_bad_blobs);
    /* the frame (the next snapshot stores it again) or the first damaged chunk: dropped below */
    bad_i = px_first_damaged(c, &fr, ptr, lens, 0, nch, &fbad);
    bad[0] = bad_i < nch;
    res = PX_BAD;
    goto out;
  }
  if (res == PX_OK && (n > run || (take && !tpinned)))
    kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_peer_restores);
out:
  if (take) { /* the continuation chunk: dropped (told) when damaged, else kept */
    bool drop = bad[0] && bad_i == good;
    if (tpinned) {
      kvs__llama_blob_unpin(&home, tkey, tp.ref, drop);
    } else {
      if (drop) kvs__cache_report_bad(rt, tat, tkey, tp.len, kvs_checksum64(tp.p, tp.len));
      kvs__llama_blob_keep(&home, &tp.f, !drop);
    }
  }
  if (fpinned) {
    kvs__llama_blob_unpin(&home, fkey, fxfer, fbad);
  } else if (fr.fetched) {
    if (fbad) kvs__cache_report_bad(rt, fat, fkey, fr.len, kvs_checksum64(fr.p, fr.len));
    kvs__llama_blob_keep(&home, &fr.f, !fbad);
  }
  for (uint32_t i = run; i < n; i++) { /* peer copies: kept unless damaged */
    /* bad_i == good is the continuation's when one was taken */
    bool drop = bad[0] && i == bad_i && (i < good || !take);
    if (drop)
      kvs__cache_report_bad(rt, best, keys[i], pc[i].len, kvs_checksum64(pc[i].p, pc[i].len));
    kvs__llama_blob_keep(&home, &pc[i].f, !drop);
  }
  for (uint32_t i = 0; i < run; i++) /* local pins: a damaged chunk is dropped */
    kvs__llama_blob_unpin(&home, keys[i], pc[i].ref,
                          bad[0] && i == bad_i && (i < good || !take));
  return res;
}

/* Find and restore the longest usable cached prefix k of sequence s, whose m batch tokens are
 * already in the shadow after its n (positions beyond n become real only if the decode
 * succeeds): the blob under the longest cached chunk key of the prompt so far (local store,
 * probed key by key from the longest; else the peers' longest run), restored up to the restore
 * point px_restore_point chooses, which may lie beyond its keyed chunks (whole: exactly n + m).
 * Returns k (0: nothing restored; the engine is as it was). */
static uint32_t px_restore_timed(px_ctx_t *c, struct llama_context *ctx, int32_t s, uint32_t m,
                                 uint32_t first_out, int mode, bool *possible) {
  bool whole = mode == PX_WHOLE;
  kvs__px_seq_t *q = &c->sh.seq[s];
  uint32_t n = q->n, C = c->chunk, al = c->rules.align;
  if (possible) *possible = false;
  if ((uint64_t)n + m > c->sh.cap) return 0;
  /* Is any restore point possible at all (at most n + m)? A used sequence holding fewer tokens
   * than one row group (llama-server keeps the common start of a slot's older prompt: BOS when
   * the prompts are unrelated) can still take a longer cached prefix: the load replaces it
   * (rebase), and the outputs are those of the prompt in a fresh sequence. A longer kept prefix
   * that is not canonical and aligned is left to the engine (bit-identical outputs). */
  px_plan_t pl = {s, n, m, first_out, 0, whole, false, mode == PX_PART_OF_MANY};
  bool any = false;
  for (int pass = 0; pass < 2 && !any; pass++) {
    pl.rebase = pass == 1;
    if (pl.rebase && (mode != PX_PART || n == 0 || n >= al || c->swa)) break;
    if (pl.part_of_many)
      any = px_point_ok(c, &pl, n + (first_out < m ? first_out : m));
    for (uint32_t k = (n + m) / al * al; k > n && !any; k -= al)
      any = (!whole || k == n + m) && px_point_ok(c, &pl, k);
  }
  uint32_t jmax = (n + m) / C;
  if (!any || !jmax) {
    if (mode == PX_PART && m > 1) kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_refused_rules);
    return 0;
  }
  kvs__runtime_t *rt = kvs__runtime_get();
  if (!rt) return 0;
  kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_lookups);
  {
    KVS__REENTRY_GUARD();
    kvs__px_keys_compute(&c->sh, (uint32_t)s, c->ns, q->nkeys, jmax);
  }
  if (possible) *possible = true;
  const kvs_key_t *keys = kvs__px_keys(&c->sh, (uint32_t)s);
  uint32_t k = 0;
  if (c->chunks) {
    px_res_t r = px_restore_chunks(c, rt, ctx, &pl, jmax, &k);
    if (r == PX_BAD) /* its first damaged chunk was dropped: the run before it */
      r = px_restore_chunks(c, rt, ctx, &pl, jmax, &k);
    if (r == PX_OK) return k;
    if (r == PX_ENGINE || r == PX_NONE) return 0;
    /* no chunk run: a state stored whole (it could not be split) may be there */
  }
  for (uint32_t j = jmax; j * C > n; j--) { /* a state keyed within n rarely reaches beyond */
    if (!kvs__cache_has_local(rt, keys[j - 1])) continue;
    pl.keyed = j * C;
    px_res_t r = px_restore_local(c, rt, ctx, &pl, &k);
    if (r == PX_OK) return k;
    if (r == PX_ENGINE) return 0;
    if (r == PX_NONE) break; /* shorter keys find the same or an older, shorter state */
  }
  if (!kvs__cache_has_peers(rt)) return 0;
  uint64_t best = 0;
  int run = 0;
  if (c->swa) { /* window states are bound under their own key only: probe key by key */
    for (uint32_t j = jmax; j * C > n && !run; j--)
      if (kvs__cache_peers_run(rt, &keys[j - 1], 1, &best) == 1) run = (int)j;
  } else {
    run = kvs__cache_peers_run(rt, keys, jmax, &best);
  }
  if (run <= 0 || !best || (uint32_t)run * C <= n) return 0;
  pl.keyed = (uint32_t)run * C;
  px_res_t r = px_restore_peer(c, rt, ctx, &pl, best, &k);
  return r == PX_OK ? k : 0;
}

/* This thread's CPU time, ns (the debug lines' second figure: on a machine shared with other
 * work, wall time counts the time the thread waited for a CPU). */
static uint64_t px_cpu_ns(void) {
  struct timespec t;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return 0;
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* px_restore_timed, its time in llama_prefix_restore_ns. */
static uint32_t px_restore(px_ctx_t *c, struct llama_context *ctx, int32_t s, uint32_t m,
                           uint32_t first_out, int mode, bool *possible) {
  uint64_t t0 = kvs__now_ns(), c0 = px_cpu_ns();
  uint32_t k = px_restore_timed(c, ctx, s, m, first_out, mode, possible);
  uint64_t dt = kvs__now_ns() - t0;
  kvs_stats_add(px_stats(), KVS_STAT_llama_prefix_restore_ns, dt);
  if (k) /* one line per restore: bench_chunks.py --timing takes the median of these */
    kvs_log_debug("llama.cpp prefix cache: sequence %d: %u tokens restored in %llu ns "
                  "(%llu ns on CPU)", s, k, (unsigned long long)dt,
                  (unsigned long long)(px_cpu_ns() - c0));
  return k;
}

/* ---- snapshot ---------------------------------------------------------------------------------- */

static bool px_snapshot_timed(px_ctx_t *c, struct llama_context *ctx, int32_t s) {
  kvs__px_seq_t *q = &c->sh.seq[s];
  if (q->tainted) return false;
  uint32_t C = c->chunk, N = q->n, cov = N < q->canon ? N : q->canon, J = cov / C;
  if (J == 0 || J * C < c->min_tokens) return false;
  /* known cached up to here (restored or stored; after a failure too, which is not retried) */
  if (J * C < q->snap + C) return true;
  if (c->swa && (N != J * C || cov != N)) return false; /* only restorable trimmed: never */
  kvs__runtime_t *rt = kvs__runtime_get();
  if (!rt) return false;
  kvs_stats_t *st = px_stats();
  const kvs_key_t *keys;
  bool cached;
  int prun = 0; /* chunks: the leading run of keys some peer holds, when asked */
  {
    KVS__REENTRY_GUARD();
    kvs__px_keys_compute(&c->sh, (uint32_t)s, c->ns, q->nkeys, J);
    q->nkeys = J;
    keys = kvs__px_keys(&c->sh, (uint32_t)s);
    if (c->chunks) { /* every chunk there (a dropped or evicted middle one is stored again) */
      uint32_t here = 0;
      while (here < J && kvs__cache_has_local(rt, keys[here])) here++;
      if (here < J) prun = kvs__cache_peers_run(rt, keys, J, NULL);
      cached = here == J || prun == (int)J;
    } else {
      cached = kvs__cache_has_local(rt, keys[J - 1]) ||
               kvs__cache_peers_run(rt, &keys[J - 1], 1, NULL) == 1;
    }
  }
  if (cached) {
    q->snap = J * C;
    return true;
  }
  if (c->chunks) {
    uint64_t wrote = 0;
    int cr = px_snapshot_chunks(c, rt, ctx, s, keys, J, cov, prun, &wrote);
    if (cr == 0) {
      q->snap = J * C;
      kvs_stats_inc(st, KVS_STAT_llama_prefix_snapshots);
      kvs_stats_add(st, KVS_STAT_llama_prefix_snapshot_bytes, wrote);
      return true;
    }
    if (cr < 0) {
      q->snap = J * C;
      kvs_stats_inc(st, KVS_STAT_llama_prefix_snapshot_failures);
      kvs_log_info("llama.cpp prefix cache: chunks of sequence %d (%u tokens) not stored: %s", s,
                   N, strerror(-cr));
      return false;
    }
  }
  if (c->chunks_window) { /* (the other reasons are counted by px_snapshot_chunks) */
    kvs_stats_inc(st, KVS_STAT_llama_chunks_whole);
    kvs_stats_inc(st, KVS_STAT_llama_chunks_whole_window);
  }
  const kvs__llama_blob_home_t home = kvs__llama_blob_home(rt);
  kvs__llama_state_api_t api;
  px_state_api(&api);
  c->work.keys[0] = keys[J - 1];
  for (uint32_t i = 0; i + 1 < J; i++) c->work.keys[i + 1] = keys[i];
  kvs__llama_blob_hdr_t h;
  memset(&h, 0, sizeof h);
  h.kind = KVS_LLAMA_BLOB_KIND_PREFIX;
  h.keyed_tokens = J * C;
  h.chunk_tokens = C;
  memcpy(h.model_fp, c->fp, sizeof h.model_fp);
  h.ns_lo = c->ns.lo;
  h.ns_hi = c->ns.hi;
  /* a restore may stop anywhere the rules allow up to here; set before begin, which seals
   * the blob at once when it goes straight into a cache peer's pool (one copy per node) */
  h.canon_tokens = cov;
  kvs__llama_blob_save_t sv;
  const char *why = NULL;
  int rc = kvs__llama_blob_begin(&home, c->work.keys, c->swa ? 1 : J, false, &api, ctx, s,
                                 kvs__px_tok(&c->sh, (uint32_t)s), N, &h, &sv);
  if (rc == -EEXIST) {
    q->snap = J * C;
    return true;
  }
  if (rc == 0 && kvs__llama_blob_commit(&home, c->work.keys, c->swa ? 1 : J, &h, &sv) < 0)
    rc = -EPIPE;
  if (rc < 0) {
    why = rc == -ENODATA ? "the engine reported no sequence state"
          : rc == -EIO   ? "llama_state_seq_get_data did not write the size get_size announced"
          : rc == -EPIPE ? "commit failed"
                         : strerror(-rc);
    goto failed;
  }
  uint64_t total = sv.len;
  q->snap = J * C;
  kvs_stats_inc(st, KVS_STAT_llama_prefix_snapshots);
  kvs_stats_add(st, KVS_STAT_llama_prefix_snapshot_bytes, total);
  kvs_log_debug("llama.cpp prefix cache: sequence %d: %u tokens stored (%u keyed, %llu bytes)", s,
                N, J * C, (unsigned long long)total);
  return true;
failed:
  q->snap = J * C; /* do not retry until it grows by another chunk */
  kvs_stats_inc(st, KVS_STAT_llama_prefix_snapshot_failures);
  kvs_log_info("llama.cpp prefix cache: state of sequence %d (%u tokens) not stored: %s", s, N,
               why);
  return false;
}

/* px_snapshot_timed, its time in llama_prefix_snapshot_ns (the producer's cost: docs/PERF.md 13). */
static bool px_snapshot(px_ctx_t *c, struct llama_context *ctx, int32_t s) {
  uint64_t t0 = kvs__now_ns(), c0 = px_cpu_ns();
  uint64_t b0 = kvs_stats_get(px_stats(), KVS_STAT_llama_prefix_snapshot_bytes);
  bool ok = px_snapshot_timed(c, ctx, s);
  uint64_t dt = kvs__now_ns() - t0;
  kvs_stats_add(px_stats(), KVS_STAT_llama_prefix_snapshot_ns, dt);
  uint64_t b = kvs_stats_get(px_stats(), KVS_STAT_llama_prefix_snapshot_bytes) - b0;
  if (b) /* one line per store that wrote (other threads' bytes too when they store at once) */
    kvs_log_debug("llama.cpp prefix cache: sequence %d: %llu bytes stored in %llu ns "
                  "(%llu ns on CPU)", s, (unsigned long long)b, (unsigned long long)dt,
                  (unsigned long long)(px_cpu_ns() - c0));
  return ok;
}

/* ---- decode ------------------------------------------------------------------------------------ */

/* Mark the sequences of a batch (bit s of in[s / 64]). */
static void px_batch_seqs(const kvs__llama_batch_t *b, uint64_t in[KVS_PX_MAX_SEQ / 64]) {
  memset(in, 0, KVS_PX_MAX_SEQ / 8);
  for (int32_t i = 0; i < b->n_tokens; i++) {
    int32_t ns = b->n_seq_id ? b->n_seq_id[i] : 1;
    for (int32_t j = 0; j < ns; j++) {
      int32_t id = b->seq_id ? b->seq_id[i][j] : 0;
      in[id / 64] |= 1ull << (id % 64);
    }
  }
}

/* After the engine's llama_decode of b returned r (b as the engine gave it, nothing skipped). */
static void px_after(px_ctx_t *c, const kvs__llama_batch_t *b, const kvs__px_batch_info_t *bi,
                     const int32_t *p0, const uint64_t *in, int32_t r) {
  if (r == 0) {
    kvs__px_batch_apply(&c->sh, b, bi, p0, &c->rules);
  } else if (r != 1 && r != -1) {
    /* aborted or fatal: the ubatches already processed stay in memory */
    for (uint32_t s = 0; s < c->sh.n_seq; s++)
      if (in[s / 64] >> (s % 64) & 1) kvs__px_taint(&c->sh, (int32_t)s);
  }
}

/* ---- single flight -------------------------------------------------------------------------------

 * When a batch of one sequence finds nothing to restore, the process claims it for the node: a
 * tiny object in its own pool under the claim key of the batch's longest chunk prefix,
 * h(jmax - 1) chained with one marker word (never a chunk key: those chain whole chunks). A
 * process whose batch finds nothing but a peer's claim on the same key waits (up to
 * KVSHIM_LLAMA_WAIT_MS) until the claim is gone, then looks up again and restores what the
 * claimant stored. The claimant stores its state after every claimed batch (progress, not only
 * when the prompt is finished) and removes its claim after it. Two processes that claim at once:
 * the one that sees a peer's claim of a lower instance id withdraws and waits (a race can still
 * leave two computing, never none). A claimant that dies leaves a claim its peers stop seeing
 * with its coordinator; one that hangs is waited for until the deadline. Claims are store
 * objects found with LOOKUP; a waiter sleeps on one WATCH at the claimant (docs/protocol.md 4.12)
 * answered when the claim goes or the claimant marks its progress stored (the progress mark, a
 * second tiny object beside the claim), and polls with LOOKUPs only a peer without WATCH. */
#define PX_CLAIM_MARK 0xffffffffu
#define PX_STORED_MARK 0xfffffffeu

static kvs_key_t px_claim_key(const px_ctx_t *c, int32_t s, uint32_t j) {
  const uint32_t mark = PX_CLAIM_MARK;
  return kvs_keys_chain(kvs__px_keys(&c->sh, (uint32_t)s)[j - 1], &mark, 1);
}

/* The progress mark of claim key: present while the claimant holds the claim and has stored
 * the state of the batch it claimed. */
static kvs_key_t px_stored_key(const kvs_key_t *claim) {
  const uint32_t mark = PX_STORED_MARK;
  return kvs_keys_chain(*claim, &mark, 1);
}

/* The instance id of a peer holding key (0: none). */
static uint64_t px_peer_holding(kvs__runtime_t *rt, const kvs_key_t *key) {
  uint64_t best = 0;
  return kvs__cache_peers_run(rt, key, 1, &best) == 1 ? best : 0;
}

static void px_unclaim(kvs__runtime_t *rt, const kvs_key_t *key) {
  kvs__cache_unmark(rt, px_stored_key(key)); /* first: a mark never outlives its claim */
  kvs__cache_unmark(rt, *key);
}

/* A tiny object (the instance id) under key in this process's own pool. */
static bool px_put_mark(kvs__runtime_t *rt, const kvs_key_t *key) {
  return kvs__cache_mark(rt, *key, rt->instance_id);
}

static bool px_claim(kvs__runtime_t *rt, const kvs_key_t *key) { return px_put_mark(rt, key); }

/* The state of the claimed batch is stored: wake the processes waiting on the claim. */
static void px_mark_stored(kvs__runtime_t *rt, const kvs_key_t *claim) {
  kvs_key_t stored = px_stored_key(claim);
  (void)px_put_mark(rt, &stored);
}

static void px_nap(void) {
  struct timespec ts = {0, 2 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

/* Wait at peer holder with WATCHes (w: the key watched, then the one whose arrival also ends
 * the wait) until it answers or the deadline: true when it answered (or is gone: look up
 * again), false when the deadline passed or it predates WATCH (the caller polls). */
static bool px_watch(kvs__runtime_t *rt, uint64_t holder, const kvs_key_t w[2],
                     uint64_t deadline) {
  for (uint64_t now = kvs__now_ms(); now < deadline; now = kvs__now_ms()) {
    int r = kvs__cache_watch(rt, holder, w, 2, (uint32_t)(deadline - now));
    if (r == (int)KVS_PROTO_WATCH_HELD) continue;
    return r != -ENOTSUP;
  }
  return false;
}

/* Wait until no peer holds the claim key or the claimant's progress (its state under done, the
 * batch's longest chunk key) can be found, or the deadline (ms, the epoch of kvs__now_ms). */
static void px_wait_claim(kvs__runtime_t *rt, uint64_t holder, const kvs_key_t *key,
                          const kvs_key_t *done, uint64_t deadline) {
  kvs_key_t w[2] = {*key, px_stored_key(key)};
  if (px_watch(rt, holder, w, deadline)) return; /* gone, stored, or the claimant is gone */
  while (px_peer_holding(rt, key) && !px_peer_holding(rt, done) && kvs__now_ms() < deadline)
    px_nap();
}

/* The claimant it followed on its previous batch still holds that claim: it has not reached its
 * next batch yet. Wait until it claims key (returns the holder), drops the old claim (0), or
 * the deadline (0). The claimant claims key before it drops the old claim (px_flight, then
 * px_drop_held), but the two lookups here are not one: it can do both between them. So once
 * the old claim is seen gone, key is asked again: a claim of key made before the drop is seen
 * (without this the follower computed the batch beside its claimant). */
static uint64_t px_wait_follow(px_ctx_t *c, kvs__runtime_t *rt, int32_t s, const kvs_key_t *key,
                               uint64_t deadline) {
  if (!c->follow_id || c->follow_seq != s) return 0;
  uint64_t holder = 0;
  /* One WATCH at the claimant: answered when the old claim goes or it claims key. */
  kvs_key_t w[2] = {c->follow_key, *key};
  if (px_watch(rt, c->follow_id, w, deadline)) return px_peer_holding(rt, key);
  while (!(holder = px_peer_holding(rt, key))) {
    if (px_peer_holding(rt, &c->follow_key) != c->follow_id) return px_peer_holding(rt, key);
    if (kvs__now_ms() >= deadline) break;
    px_nap();
  }
  return holder;
}

/* The claim kept after the last computed batch (held) goes, unless it is key (claimed again). */
static void px_drop_held(px_ctx_t *c, kvs__runtime_t *rt, const kvs_key_t *key) {
  if (!c->held_on) return;
  if (rt && (!key || !kvs_key_eq(c->held, *key))) px_unclaim(rt, &c->held);
  c->held_on = false;
}

/* Batch of m tokens of sequence s found nothing to restore (possible: a restore was possible,
 * and the keys up to jmax are computed). Waits for a peer's claim and restores after it
 * (returns k), or claims the batch (*claimed, key in *ck; returns 0). */
static uint32_t px_flight(px_ctx_t *c, struct llama_context *ctx, int32_t s, uint32_t m,
                          uint32_t first_out, kvs_key_t *ck, bool *claimed) {
  kvs__runtime_t *rt = kvs__runtime_get();
  const kvs_config_t *o = kvs__runtime_options();
  uint32_t jmax = (c->sh.seq[s].n + m) / c->chunk;
  *claimed = false;
  if (!rt || !kvs__cache_has_peers(rt) || !o || o->llama_wait_ms <= 0 || !jmax) return 0;
  *ck = px_claim_key(c, s, jmax);
  uint64_t deadline = kvs__now_ms() + (uint64_t)o->llama_wait_ms;
  uint64_t holder = px_peer_holding(rt, ck);
  if (!holder) holder = px_wait_follow(c, rt, s, ck, deadline);
  c->follow_id = 0;
  if (!holder) {
    if (!px_claim(rt, ck)) return 0;
    holder = px_peer_holding(rt, ck);
    if (!holder || holder > rt->instance_id) {
      *claimed = true;
      kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_claims);
      return 0;
    }
    px_unclaim(rt, ck); /* both claimed: the lower instance id computes */
  }
  kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_waits);
  kvs_log_debug("llama.cpp prefix cache: sequence %d: waiting for process %016llx, which "
                "computes the same prefix", s, (unsigned long long)holder);
  px_wait_claim(rt, holder, ck, &kvs__px_keys(&c->sh, (uint32_t)s)[jmax - 1], deadline);
  c->follow_id = holder;
  c->follow_seq = s;
  c->follow_key = *ck;
  return px_restore(c, ctx, s, m, first_out, false, NULL);
}

/* Split a batch of several sequences into its parts: true when every token belongs to one
 * CLEAN sequence at its next position (then its tokens are in the shadow after the sequence's
 * n, cnt[s] counts them and first[s] is the part index of its first output, UINT32_MAX none). */
static bool px_parts(px_ctx_t *c, const kvs__llama_batch_t *b, const int32_t *p0, uint32_t *cnt,
                     uint32_t *first) {
  uint32_t m = (uint32_t)b->n_tokens;
  memset(cnt, 0, KVS_PX_MAX_SEQ * sizeof *cnt);
  for (uint32_t i = 0; i < m; i++) {
    if (b->n_seq_id && b->n_seq_id[i] != 1) return false;
    int32_t s = b->seq_id ? b->seq_id[i][0] : 0;
    kvs__px_seq_t *q = &c->sh.seq[s];
    uint32_t at = q->n + cnt[s];
    if (q->tainted || at >= c->sh.cap) return false;
    int32_t pos = b->pos ? b->pos[i] : p0[s] + (int32_t)cnt[s];
    if (pos != (int32_t)at) return false;
    if (cnt[s] == 0) first[s] = UINT32_MAX;
    bool out = b->logits ? b->logits[i] != 0 : i == m - 1;
    if (out && first[s] == UINT32_MAX) first[s] = cnt[s];
    kvs__px_tok(&c->sh, (uint32_t)s)[at] = b->token[i];
    cnt[s]++;
  }
  return true;
}

/* A batch of several sequences that asks no output: when every token belongs to one CLEAN
 * sequence at its next position and each sequence's part is a whole restore (k = n_s + m_s,
 * kvs__px_restore_ok), and the batch itself splits into long ubatches only (m a multiple of
 * align, a long last ubatch: every token the engine would compute here is of the canonical
 * class), restore every sequence and decode nothing. Else (or when one restore fails: those
 * done are undone) nothing changed and the batch is the engine's. True when skipped. */
static bool px_mixed(px_ctx_t *c, struct llama_context *ctx, const kvs__llama_batch_t *b,
                     const int32_t *p0) {
  uint32_t m = (uint32_t)b->n_tokens;
  if (m % c->rules.align || kvs__px_last_ubatch(m, c->rules.ubatch) < c->rules.min_rows)
    return false;
  uint32_t cnt[KVS_PX_MAX_SEQ], first[KVS_PX_MAX_SEQ];
  if (!px_parts(c, b, p0, cnt, first)) return false;
  uint32_t done[KVS_PX_MAX_SEQ], nd = 0;
  bool ok = true;
  for (uint32_t s = 0; s < c->sh.n_seq && ok; s++) {
    if (!cnt[s]) continue;
    uint32_t n = c->sh.seq[s].n;
    ok = px_restore(c, ctx, (int32_t)s, cnt[s], cnt[s], true, NULL) == n + cnt[s];
    if (ok) done[nd++] = s;
  }
  if (!ok) {
    for (uint32_t i = 0; i < nd; i++) px_undo(c, ctx, (int32_t)done[i], c->sh.seq[done[i]].n);
    return false;
  }
  for (uint32_t i = 0; i < nd; i++) {
    kvs__px_seq_t *q = &c->sh.seq[done[i]];
    uint32_t k = q->n + cnt[done[i]];
    q->n = k;
    q->canon = k;
    if (q->nkeys < k / c->chunk) q->nkeys = k / c->chunk;
    if (q->snap < k / c->chunk * c->chunk) q->snap = k / c->chunk * c->chunk;
    kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_restores);
    kvs_stats_add(px_stats(), KVS_STAT_llama_prefix_restored_tokens, cnt[done[i]]);
  }
  px_set_skip(c, KVS_PX_SKIP_ALL);
  return true;
}

/* Why a prompt batch (more than one token) that was not restored into could not be (the
 * llama_prefix_refused_* counters; restores of eligible batches are judged in px_restore). */
static void px_count_refusal(const px_ctx_t *c, const kvs__llama_batch_t *b,
                             const kvs__px_batch_info_t *bi, const uint64_t *in, bool eligible) {
  int seqs = 0;
  for (size_t w = 0; w < KVS_PX_MAX_SEQ / 64; w++) seqs += __builtin_popcountll(in[w]);
  /* a generation step (one token per sequence) is no prompt */
  if (b->n_tokens <= seqs || !bi->has_tokens || eligible) return;
  kvs_stats_t *st = px_stats();
  if (c->disabled) kvs_stats_inc(st, KVS_STAT_llama_prefix_refused_disabled);
  else if (!bi->single) kvs_stats_inc(st, KVS_STAT_llama_prefix_refused_several);
  else kvs_stats_inc(st, KVS_STAT_llama_prefix_refused_unknown);
}

/* The decoded batch's arrays for a batch of m tokens (c->multi). */
static bool px_multi_arrays(px_ctx_t *c, uint32_t m) {
  if (m <= c->multi_cap) return true;
  size_t len = (size_t)m * (5 * sizeof(int32_t) + sizeof(int32_t *) + 1) + 64;
  if (!px_grow(&c->multi, &c->multi_len, len)) return false;
  c->multi_cap = m;
  c->mseq = (int32_t **)c->multi; /* pointers first: aligned */
  c->imap = (int32_t *)(void *)(c->mseq + m);
  c->mtok = c->imap + m;
  c->mpos = c->mtok + m;
  c->mnseq = c->mpos + m;
  c->mlogits = (int8_t *)(c->mnseq + m);
  return true;
}

/* In-process single flight (design §10.3): sequences of one batch (px_multi) that found nothing
 * to restore (kk[s] == 0) and share a prompt prefix of at least one chunk (and min tokens),
 * before the first output of each, compute it once. The leader, the lowest such sequence,
 * decodes its part up to its last chunk boundary before its first output, alone and asking no
 * output (a single-sequence batch: its KV is canonical as any prompt's), and stores it
 * (px_snapshot: other replicas find it too); each follower then restores it as any cached
 * prefix (px_restore: a sequence state load, which a per-sequence and a unified KV cache both
 * take, llama-kv-cache.cpp:2341, 2418; llama_memory_seq_cp is not used: across the streams of a
 * non-unified cache it copies whole streams only, llama-kv-cache.cpp seq_cp). On return
 * kk[leader] is the leader's new length and led[leader] is set (its canonical tokens in
 * lcanon); the caller decodes the rest and, if the engine refuses that, removes the leader's
 * new cells (old[leader].n on). A leader decode the engine does not complete is removed at
 * once and the batch goes on as without sharing: nothing is lost but the work. */
static void px_share(px_ctx_t *c, struct llama_context *ctx, kvs__px_pfn_llama_decode real,
                     const uint32_t *cnt, const uint32_t *first, const kvs__px_seq_t *old,
                     uint32_t *kk, bool *led, uint32_t *lcanon) {
  static __thread bool taken[KVS_PX_MAX_SEQ];
  static __thread uint32_t want[KVS_PX_MAX_SEQ];
  const uint32_t C = c->chunk;
  memset(taken, 0, sizeof taken);
  for (uint32_t s = 0; s < c->sh.n_seq; s++) {
    if (cnt[s] < 2 || kk[s] || taken[s]) continue;
    const int32_t *ts = kvs__px_tok(&c->sh, s);
    uint32_t ns = old[s].n, lim_s = ns + (first[s] == UINT32_MAX ? cnt[s] : first[s]);
    uint32_t pmax = 0, nf = 0;
    for (uint32_t t = s + 1; t < c->sh.n_seq; t++) {
      want[t] = 0;
      if (cnt[t] < 2 || kk[t] || taken[t]) continue;
      const int32_t *tt = kvs__px_tok(&c->sh, t);
      uint32_t nt = old[t].n, lim = nt + (first[t] == UINT32_MAX ? cnt[t] : first[t]);
      if (lim > lim_s) lim = lim_s;
      uint32_t l = 0;
      while (l < lim && ts[l] == tt[l]) l++;
      uint32_t p = l / C * C;
      if (p < C || p < c->min_tokens || p <= nt) continue;
      want[t] = p;
      taken[t] = true;
      nf++;
      if (p > pmax) pmax = p;
    }
    if (!nf) continue;
    /* The leader computes alone all the whole chunks before its first output, not only those a
     * follower of this batch shares: a slot whose prompt the engine cut at n_batch continues in
     * the next batch, and restores the rest from this state there (its cells decoded in a
     * batch of several sequences are not canonical and would not be stored). */
    if (lim_s / C * C > pmax) pmax = lim_s / C * C;
    /* Only a leader whose state will be stored leads (canonical KV of at least one chunk and
     * min tokens: a slot that kept a few tokens of an older prompt, BOS, decodes nothing
     * canonical), else its work would be undone below for nothing. */
    uint32_t canon = pmax > ns ? kvs__px_canon_after(&c->rules, ns, old[s].canon, pmax - ns)
                               : old[s].canon;
    if (canon / C < 1 || canon / C * C < c->min_tokens) {
      for (uint32_t t = s + 1; t < c->sh.n_seq; t++)
        if (want[t]) taken[t] = false;
      continue;
    }
    if (pmax > ns) { /* the leader computes [ns, pmax) */
      uint32_t len = pmax - ns;
      c->rseqval = (int32_t)s;
      kvs__llama_batch_t lb =
          px_seq_batch(ts + ns, ns, len, c->mpos, c->mnseq, c->mseq, c->mlogits, &c->rseqval);
      int32_t r = real(ctx, lb);
      if (r != 0) {
        /* 1, -1: nothing changed; else the ubatches done stay: removed */
        if (r != 1 && r != -1 && !px_real_llama_memory_seq_rm()(c->mem, (int32_t)s, (int32_t)ns, -1))
          kvs__px_taint(&c->sh, (int32_t)s);
        for (uint32_t t = s + 1; t < c->sh.n_seq; t++)
          if (want[t]) taken[t] = false;
        continue;
      }
      kvs__px_batch_info_t lbi;
      kvs__px_batch_scan(&lb, c->sh.n_seq, false, &lbi);
      int32_t p0[KVS_PX_MAX_SEQ] = {0};
      p0[s] = (int32_t)ns;
      kvs__px_batch_apply(&c->sh, &lb, &lbi, p0, &c->rules);
      kk[s] = pmax;
      led[s] = true;
      lcanon[s] = c->sh.seq[s].canon;
      /* the shadow's part tokens after pmax stay as px_parts wrote them */
    }
    (void)px_snapshot(c, ctx, (int32_t)s); /* a leader already holding it stores it too */
    bool all = true;
    for (uint32_t t = s + 1; t < c->sh.n_seq && all; t++) {
      if (!want[t]) continue;
      uint32_t fo = first[t] == UINT32_MAX ? cnt[t] : first[t];
      kk[t] = px_restore(c, ctx, (int32_t)t, cnt[t], fo, PX_PART_OF_MANY, NULL);
      all = kk[t] != 0;
    }
    if (all) {
      for (uint32_t t = s + 1; t < c->sh.n_seq; t++)
        if (want[t]) kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_shared_in_batch);
      continue;
    }
    /* A follower could not take it (the state not stored, a load refused): the group is
     * undone, so that the engine's own batch decides these sequences' KV as without kvshim. */
    for (uint32_t t = s + 1; t < c->sh.n_seq; t++) {
      if (!want[t] || !kk[t]) continue;
      kk[t] = 0;
      c->sh.seq[t] = old[t];
      px_undo(c, ctx, (int32_t)t, old[t].n);
    }
    if (led[s]) {
      kk[s] = 0;
      led[s] = false;
      c->sh.seq[s] = old[s];
      if (!px_real_llama_memory_seq_rm()(c->mem, (int32_t)s, (int32_t)ns, -1))
        kvs__px_taint(&c->sh, (int32_t)s);
    }
  }
}

/* A batch of several sequences (llama-server slots started together) that px_mixed could not
 * skip whole: every sequence part of at least two tokens extending a CLEAN sequence restores its
 * cached prefix (up to its first output), and the rest of every sequence is decoded in one
 * batch, its output indices remapped (c->imap). The engine splits such a batch across
 * sequences, so its own KV for them depends on which slots arrived together: the outputs are
 * one the engine produces, not bit-identical to one particular run. Returns false (nothing
 * done, the engine untouched) when no part could be restored; else *rc is the decode's result
 * (a decode the engine refused is undone and the batch decoded unchanged). */
static bool px_multi(px_ctx_t *c, struct llama_context *ctx, kvs__px_pfn_llama_decode real,
                     const kvs__llama_batch_t *b, const kvs__px_batch_info_t *bi,
                     const int32_t *p0, const uint64_t *in, int32_t *rc) {
  uint32_t m = (uint32_t)b->n_tokens;
  static __thread uint32_t cnt[KVS_PX_MAX_SEQ], first[KVS_PX_MAX_SEQ], kk[KVS_PX_MAX_SEQ];
  static __thread kvs__px_seq_t old[KVS_PX_MAX_SEQ];
  static __thread bool led[KVS_PX_MAX_SEQ];
  static __thread uint32_t lcanon[KVS_PX_MAX_SEQ];
  if (c->swa || !b->token || !px_multi_arrays(c, m)) return false;
  memset(kk, 0, sizeof kk);
  memset(led, 0, sizeof led);
  if (!px_parts(c, b, p0, cnt, first)) return false;
  bool any = false;
  for (uint32_t s = 0; s < c->sh.n_seq; s++) {
    if (cnt[s] < 2) continue;
    old[s] = c->sh.seq[s];
    uint32_t fo = first[s] == UINT32_MAX ? cnt[s] : first[s];
    kk[s] = px_restore(c, ctx, (int32_t)s, cnt[s], fo, PX_PART_OF_MANY, NULL);
    any |= kk[s] != 0;
  }
  px_share(c, ctx, real, cnt, first, old, kk, led, lcanon);
  for (uint32_t s = 0; s < c->sh.n_seq && !any; s++) any = kk[s] != 0;
  if (!any) return false;
  /* the decoded batch: every token but the restored ones, at their own positions */
  uint32_t o = 0;
  memset(cnt, 0, sizeof cnt);
  for (uint32_t i = 0; i < m; i++) {
    int32_t s = b->seq_id ? b->seq_id[i][0] : 0;
    uint32_t j = cnt[s]++, n_old = kk[s] ? old[s].n : c->sh.seq[s].n;
    if (kk[s] && n_old + j < kk[s]) {
      c->imap[i] = INT32_MAX;
      continue;
    }
    c->imap[i] = (int32_t)o;
    c->mtok[o] = b->token[i];
    c->mpos[o] = (int32_t)(n_old + j);
    c->mnseq[o] = 1;
    c->mseq[o] = b->seq_id ? b->seq_id[i] : &c->rseqval;
    c->mlogits[o] = (int8_t)(b->logits ? b->logits[i] != 0 : i == m - 1);
    o++;
  }
  c->rseqval = 0;
  c->imap_n = m;
  int32_t p1[KVS_PX_MAX_SEQ];
  memcpy(p1, p0, sizeof p1);
  for (uint32_t s = 0; s < c->sh.n_seq; s++) {
    if (!kk[s]) continue;
    kvs__px_seq_t *q = &c->sh.seq[s];
    q->n = kk[s];
    q->canon = led[s] ? lcanon[s] : kk[s]; /* a leader's as its own decode left it */
    if (q->nkeys > kk[s] / c->chunk) q->nkeys = kk[s] / c->chunk;
    if (q->snap < kk[s] / c->chunk * c->chunk) q->snap = kk[s] / c->chunk * c->chunk;
    p1[s] = (int32_t)kk[s];
  }
  kvs__llama_batch_t sub = {(int32_t)o, c->mtok, NULL, c->mpos, c->mnseq, c->mseq, c->mlogits};
  px_set_skip(c, PX_SKIP_MAP);
  int32_t r = o ? real(ctx, sub) : 0;
  if (r == 0) {
    if (o) {
      kvs__px_batch_info_t bi2;
      kvs__px_batch_scan(&sub, c->sh.n_seq, false, &bi2);
      px_after(c, &sub, &bi2, p1, in, 0);
    }
    for (uint32_t s = 0; s < c->sh.n_seq; s++) {
      if (!kk[s] || led[s]) continue;
      kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_restores);
      kvs_stats_add(px_stats(), KVS_STAT_llama_prefix_restored_tokens, kk[s] - old[s].n);
    }
  } else if (r == 1 || r == -1) {
    /* the engine kept its memory as before this call: each restored sequence back to its own
     * tokens, then the engine's batch */
    px_set_skip(c, 0);
    kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_restore_failures);
    for (uint32_t s = 0; s < c->sh.n_seq; s++) {
      if (!kk[s]) continue;
      c->sh.seq[s] = old[s];
      if (!led[s]) px_undo(c, ctx, (int32_t)s, old[s].n);
      else if (!px_real_llama_memory_seq_rm()(c->mem, (int32_t)s, (int32_t)old[s].n, -1))
        kvs__px_taint(&c->sh, (int32_t)s); /* a leader: its own cells after old[s].n go */
    }
    r = real(ctx, *b);
    px_after(c, b, bi, p0, in, r);
  } else {
    for (uint32_t s = 0; s < c->sh.n_seq; s++)
      if (in[s / 64] >> (s % 64) & 1) kvs__px_taint(&c->sh, (int32_t)s);
  }
  *rc = r;
  return true;
}

static int32_t px_decode(px_ctx_t *c, struct llama_context *ctx, kvs__px_pfn_llama_decode real,
                         const kvs__llama_batch_t *b) {
  px_set_skip(c, 0);
  c->saved_len = 0;
  if (b->n_tokens > 1) kvs_stats_add(px_stats(), KVS_STAT_llama_prefix_prompt_tokens, (uint64_t)b->n_tokens);
  kvs__px_batch_info_t bi;
  kvs__px_batch_scan(b, c->sh.n_seq, false, &bi);
  if (!bi.valid) {
    int32_t r = real(ctx, *b);
    if (r == 0) kvs__px_taint(&c->sh, -1);
    return r;
  }
  /* Where each sequence continues (llama.cpp's rule for pos == NULL), and whether memory
   * agrees with the shadow: a state change kvshim did not see taints the sequence. */
  uint64_t in[KVS_PX_MAX_SEQ / 64];
  int32_t p0[KVS_PX_MAX_SEQ];
  px_batch_seqs(b, in);
  kvs__px_pfn_llama_memory_seq_pos_max pos_max = px_real_llama_memory_seq_pos_max();
  kvs__px_pfn_llama_memory_seq_pos_min pos_min = px_real_llama_memory_seq_pos_min();
  for (uint32_t s = 0; s < c->sh.n_seq; s++) {
    p0[s] = 0;
    if (!(in[s / 64] >> (s % 64) & 1)) continue;
    int32_t hi = pos_max(c->mem, (int32_t)s);
    p0[s] = hi + 1;
    kvs__px_seq_t *q = &c->sh.seq[s];
    if (q->tainted) continue;
    int32_t lo = q->n == 0 ? -1 : pos_min(c->mem, (int32_t)s);
    bool agree = q->n == 0 ? hi == -1 : hi == (int32_t)q->n - 1 && (c->swa ? lo >= 0 : lo == 0);
    if (!agree) {
      kvs_log_debug("llama.cpp prefix cache: sequence %u: memory holds positions up to %d, "
                    "kvshim knew %u tokens: not cached until cleared", s, hi, q->n);
      kvs__px_taint(&c->sh, (int32_t)s);
    }
  }
  bool eligible = bi.single && bi.has_tokens && !c->disabled && !c->sh.seq[bi.seq].tainted;
  if (eligible && b->pos) {
    uint32_t n = c->sh.seq[bi.seq].n;
    for (int32_t i = 0; i < b->n_tokens && eligible; i++)
      eligible = b->pos[i] == (int32_t)(n + (uint32_t)i);
  }
  if (!bi.single && bi.has_tokens && !c->disabled && bi.first_out == (uint32_t)b->n_tokens &&
      px_mixed(c, ctx, b, p0)) {
    /* Skipped whole: as after any batch that claims nothing, the claim held goes (a peer
     * waiting on it would wait for a batch nobody computes). */
    px_drop_held(c, kvs__runtime_get(), NULL);
    return 0;
  }
  int32_t multi_rc;
  if (!bi.single && bi.has_tokens && !c->disabled && px_multi(c, ctx, real, b, &bi, p0, in, &multi_rc)) {
    px_drop_held(c, kvs__runtime_get(), NULL);
    return multi_rc;
  }
  kvs_log_trace("llama.cpp prefix cache: decode of %d tokens: %s sequence %d (%s, %u known)",
                b->n_tokens, bi.single ? "one" : "several", bi.seq,
                eligible ? "eligible" : "passed through",
                bi.single && !c->sh.seq[bi.seq].tainted ? c->sh.seq[bi.seq].n : 0);
  if (!eligible) {
    kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_passthrough);
    px_count_refusal(c, b, &bi, in, eligible);
  }
  int32_t r;
  if (eligible)
    memcpy(kvs__px_tok(&c->sh, (uint32_t)bi.seq) + c->sh.seq[bi.seq].n, b->token,
           (size_t)b->n_tokens * 4);
  bool possible = false, claimed = false;
  kvs_key_t ck;
  uint32_t k = eligible && (uint64_t)c->sh.seq[bi.seq].n + (uint32_t)b->n_tokens <= c->sh.cap
                   ? px_restore(c, ctx, bi.seq, (uint32_t)b->n_tokens, bi.first_out, false,
                                &possible)
                   : 0;
  if (!k && possible)
    k = px_flight(c, ctx, bi.seq, (uint32_t)b->n_tokens, bi.first_out, &ck, &claimed);
  if (c->held_on) /* this batch claimed its own key (or needs none): the last one goes */
    px_drop_held(c, kvs__runtime_get(), claimed ? &ck : NULL);
  if (k) {
    int32_t s = bi.seq;
    kvs__px_seq_t *q = &c->sh.seq[s];
    uint32_t n = q->n, m = (uint32_t)b->n_tokens, skip = k - n;
    uint32_t nkeys = q->nkeys; /* keys up to the restore point are now real */
    q->n = k;
    q->canon = k;
    q->nkeys = k / c->chunk > nkeys ? k / c->chunk : nkeys;
    if (q->snap < k / c->chunk * c->chunk) q->snap = k / c->chunk * c->chunk;
    kvs__llama_batch_t sub = *b;
    sub.n_tokens = (int32_t)(m - skip);
    sub.token += skip;
    if (sub.pos) sub.pos += skip;
    if (sub.n_seq_id) sub.n_seq_id += skip;
    if (sub.seq_id) sub.seq_id += skip;
    if (sub.logits) sub.logits += skip;
    /* A batch wholly inside the restored prefix asks no output: nothing left to decode. */
    px_set_skip(c, skip == m ? KVS_PX_SKIP_ALL : (int32_t)skip);
    r = skip == m ? 0 : real(ctx, sub);
    if (r == 0) {
      q->n = n + m;
      q->canon = kvs__px_canon_after(&c->rules, k, k, m - skip);
      kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_restores);
      kvs_stats_add(px_stats(), KVS_STAT_llama_prefix_restored_tokens, skip);
    } else if (r == 1 || r == -1) {
      /* The engine kept its memory as before this call: the k restored cells. Back to the n
       * the engine knows of, then its own batch. */
      px_set_skip(c, 0);
      kvs_stats_inc(px_stats(), KVS_STAT_llama_prefix_restore_failures);
      if (c->saved_len || !px_real_llama_memory_seq_rm()(c->mem, s, (int32_t)n, -1)) {
        px_undo(c, ctx, s, n); /* a replaced sequence: its own copy back */
      }
      q->n = n;
      q->canon = n;
      if (q->nkeys > n / c->chunk) q->nkeys = n / c->chunk;
      if (q->snap > n / c->chunk * c->chunk) q->snap = n / c->chunk * c->chunk;
      p0[s] = (int32_t)n;
      r = real(ctx, *b);
      px_after(c, b, &bi, p0, in, r);
    } else {
      kvs__px_taint(&c->sh, s);
    }
  } else {
    r = real(ctx, *b);
    px_after(c, b, &bi, p0, in, r);
  }
  /* A claimed batch is stored when done (progress for the processes waiting on it). */
  bool stored = r == 0 && eligible && (bi.last_out || claimed || c->swa) && !c->disabled &&
                px_snapshot(c, ctx, bi.seq);
  if (claimed && stored && !bi.last_out) px_mark_stored(kvs__runtime_get(), &ck);
  if (claimed) {
    /* Kept until the next batch of the sequence (px_drop_held), unless none follows. */
    if (r == 0 && !bi.last_out) {
      c->held_on = true;
      c->held_seq = bi.seq;
      c->held = ck;
    } else {
      px_unclaim(kvs__runtime_get(), &ck);
    }
  }
  return r;
}

/* ---- the wrappers ------------------------------------------------------------------------------ */

struct llama_context *llama_init_from_model(struct llama_model *model,
                                            kvs__llama_ctx_params_t params) {
  kvs__px_pfn_llama_init_from_model real = px_real_llama_init_from_model();
  if (kvs__unlikely(!real)) return NULL;
  struct llama_context *ctx = real(model, params);
  if (!ctx || kvs__hook_depth || px_depth || !kvs__family_enabled(&kvs__family_llama_prefix) ||
      !kvs__runtime_options()->llama_prefix)
    return ctx;
  if (!kvs__runtime_get() || !kvs__family_on(&kvs__family_llama_prefix)) return ctx;
  px_depth++;
  kvs__hook_count();
  px_register(ctx, model, &params);
  px_depth--;
  return ctx;
}

void llama_free(struct llama_context *ctx) {
  kvs__px_pfn_llama_free real = px_real_llama_free();
  /* Forget first, whatever the state: a context created later at this address must never
   * inherit this one's shadow. */
  px_forget(ctx);
  if (kvs__likely(real != NULL)) real(ctx);
}

int32_t llama_decode(struct llama_context *ctx, kvs__llama_batch_t batch) {
  kvs__px_pfn_llama_decode real = px_real_llama_decode();
  if (kvs__unlikely(!real)) return -1;
  px_ctx_t *c;
  if (!px_observe() || !(c = px_find(ctx))) return real(ctx, batch);
  px_depth++;
  kvs__hook_count();
  pthread_mutex_lock(&c->lock);
  int32_t r = px_decode(c, ctx, real, &batch);
  pthread_mutex_unlock(&c->lock);
  px_depth--;
  return r;
}

/* Index getters: the engine's batch index, mapped. */
#define PX_INDEXED(ret, name, missing)                                                        \
  ret name(struct llama_context *ctx, int32_t i) {                                            \
    kvs__px_pfn_##name real = px_real_##name();                                               \
    if (kvs__unlikely(!real)) return missing;                                                 \
    if (!px_observe()) return real(ctx, i);                                                   \
    return real(ctx, px_map(ctx, i));                                                         \
  }
PX_INDEXED(float *, llama_get_logits_ith, NULL)
PX_INDEXED(float *, llama_get_embeddings_ith, NULL)
PX_INDEXED(int32_t, llama_get_sampled_token_ith, -1)
PX_INDEXED(float *, llama_get_sampled_probs_ith, NULL)
PX_INDEXED(uint32_t, llama_get_sampled_probs_count_ith, 0)
PX_INDEXED(float *, llama_get_sampled_logits_ith, NULL)
PX_INDEXED(uint32_t, llama_get_sampled_logits_count_ith, 0)
PX_INDEXED(int32_t *, llama_get_sampled_candidates_ith, NULL)
PX_INDEXED(uint32_t, llama_get_sampled_candidates_count_ith, 0)
#undef PX_INDEXED

int32_t llama_sampler_sample(struct llama_sampler *smpl, struct llama_context *ctx, int32_t idx) {
  kvs__px_pfn_llama_sampler_sample real = px_real_llama_sampler_sample();
  if (kvs__unlikely(!real)) return -1;
  if (!px_observe()) return real(smpl, ctx, idx);
  int32_t mapped = px_map(ctx, idx);
  px_depth++; /* its own llama_get_logits_ith call gets the mapped index as is */
  int32_t r = real(smpl, ctx, mapped);
  px_depth--;
  return r;
}

/* Memory calls: the engine's result first, then the shadow. */
#define PX_MEM_VOID(name, params, args, op, ...)                                              \
  void name params {                                                                          \
    kvs__px_pfn_##name real = px_real_##name();                                               \
    if (kvs__unlikely(!real)) return;                                                         \
    real args;                                                                                \
    if (!px_observe()) return;                                                                \
    const int32_t a_[4] = {__VA_ARGS__};                                                      \
    px_depth++;                                                                               \
    px_on_mem(mem, op, a_, #name);                                                            \
    px_depth--;                                                                               \
  }
PX_MEM_VOID(llama_memory_clear, (kvs__llama_memory_t mem, bool data), (mem, data), op_clear, 0)
PX_MEM_VOID(llama_memory_seq_cp,
            (kvs__llama_memory_t mem, int32_t src, int32_t dst, int32_t p0, int32_t p1),
            (mem, src, dst, p0, p1), op_cp, src, dst, p0, p1)
PX_MEM_VOID(llama_memory_seq_keep, (kvs__llama_memory_t mem, int32_t seq_id), (mem, seq_id),
            op_keep, seq_id)
PX_MEM_VOID(llama_memory_seq_add,
            (kvs__llama_memory_t mem, int32_t seq_id, int32_t p0, int32_t p1, int32_t delta),
            (mem, seq_id, p0, p1, delta), op_add, seq_id, p0, p1, delta)
PX_MEM_VOID(llama_memory_seq_div,
            (kvs__llama_memory_t mem, int32_t seq_id, int32_t p0, int32_t p1, int d),
            (mem, seq_id, p0, p1, d), op_div, seq_id, p0, p1, d)
#undef PX_MEM_VOID

bool llama_memory_seq_rm(kvs__llama_memory_t mem, int32_t seq_id, int32_t p0, int32_t p1) {
  kvs__px_pfn_llama_memory_seq_rm real = px_real_llama_memory_seq_rm();
  if (kvs__unlikely(!real)) return false;
  bool r = real(mem, seq_id, p0, p1);
  if (!r || !px_observe()) return r;
  const int32_t a[4] = {seq_id, p0, p1, 0};
  px_depth++;
  px_on_mem(mem, op_rm, a, "llama_memory_seq_rm");
  px_depth--;
  return r;
}

/* Context settings after which the KV is no longer a function of the tokens alone. */
void llama_set_embeddings(struct llama_context *ctx, bool on) {
  kvs__px_pfn_llama_set_embeddings real = px_real_llama_set_embeddings();
  if (on && px_observe()) px_disable(ctx, "it outputs embeddings");
  if (kvs__likely(real != NULL)) real(ctx, on);
}

void llama_set_causal_attn(struct llama_context *ctx, bool on) {
  kvs__px_pfn_llama_set_causal_attn real = px_real_llama_set_causal_attn();
  if (!on && px_observe()) px_disable(ctx, "non-causal attention");
  if (kvs__likely(real != NULL)) real(ctx, on);
}

int32_t llama_set_adapters_lora(struct llama_context *ctx, struct llama_adapter_lora **adapters,
                                size_t n, float *scales) {
  kvs__px_pfn_llama_set_adapters_lora real = px_real_llama_set_adapters_lora();
  if (n && px_observe()) px_disable(ctx, "LoRA adapters");
  return kvs__likely(real != NULL) ? real(ctx, adapters, n, scales) : -1;
}

int32_t llama_set_adapter_cvec(struct llama_context *ctx, const float *data, size_t len,
                               int32_t n_embd, int32_t il_start, int32_t il_end) {
  kvs__px_pfn_llama_set_adapter_cvec real = px_real_llama_set_adapter_cvec();
  if (data && px_observe()) px_disable(ctx, "a control vector");
  return kvs__likely(real != NULL) ? real(ctx, data, len, n_embd, il_start, il_end) : -1;
}

bool llama_set_sampler(struct llama_context *ctx, int32_t seq_id, struct llama_sampler *smpl) {
  kvs__px_pfn_llama_set_sampler real = px_real_llama_set_sampler();
  if (smpl && px_observe()) px_disable(ctx, "a backend sampler");
  return kvs__likely(real != NULL) ? real(ctx, seq_id, smpl) : false;
}

size_t llama_state_set_data(struct llama_context *ctx, const uint8_t *src, size_t size) {
  kvs__px_pfn_llama_state_set_data real = px_real_llama_state_set_data();
  kvs__llama_prefix_state_load(ctx, -1);
  return kvs__likely(real != NULL) ? real(ctx, src, size) : 0;
}

/* ---- family ------------------------------------------------------------------------------------ */

static int px_family_init(kvs__runtime_t *rt) {
  return rt->opts.llama_prefix ? 0 : KVS__FAMILY_OFF;
}

static void px_fork_child(void) {
  /* The child keeps the parent's contexts (copied memory, shadows included) and builds its own
   * runtime, whose init turns the cache on again. Locks a parent thread held are reset. */
  pthread_mutex_init(&g_table_lock, NULL);
  for (size_t i = 0; i < PX_CTX_MAX; i++)
    if (atomic_load_explicit(&g_ctx[i].ctx, memory_order_relaxed))
      pthread_mutex_init(&g_ctx[i].lock, NULL);
}

const kvs__family_t kvs__family_llama_prefix = {KVS__FAMILY_HEAD, .init = px_family_init,
                                                  .fork_child = px_fork_child};
