/* Unit tests of the chunk codec (shims/llama/chunks.c, design §10.4) on states the fake llama
 * writes in the pinned llama.cpp's layout (fakellama.c body_write): split -> assemble gives the
 * state back byte for byte, the first chunks give exactly the state the engine writes for that
 * prefix (and it loads), and every damaged or foreign input is refused with its reason before a
 * byte is written. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chunks.h"
#include "fakegguf.h"
#include "fakellama.h"
#include "runtime.h"

/* blob.c (linked for kvs__llama_hash) raises libkvshim's re-entry depth around its store work
 * and asks the runtime for the cache peer; neither flow runs here. */
__thread int kvs__hook_depth;
uint64_t kvs__runtime_cache_peer(kvs__runtime_t *rt) {
  (void)rt;
  return 0;
}

#define T 64 /* chunk tokens */

static const kvs_key_t NS = {0x1111, 0x2222};

/* ---- a fake model and context ------------------------------------------------------------- */

static char g_model[64];

/* A GGUF the fake loads (fakellama.h): n_layer layers of n_embd bytes, swa > 0 a window. */
static struct llama_model *model(uint32_t n_layer, uint32_t n_embd, uint32_t swa) {
  strcpy(g_model, "/tmp/kvs-chunks-model-XXXXXX");
  int fd = mkstemp(g_model);
  cr_assert_geq(fd, 0);
  FILE *f = fdopen(fd, "wb");
  cr_assert_not_null(f);
  fakegguf_write(f, "chunks", n_layer, n_embd, 4, 1, swa);
  cr_assert_eq(fclose(f), 0);
  struct llama_model *m = llama_model_load_from_file(g_model, llama_model_default_params());
  unlink(g_model);
  cr_assert_not_null(m);
  return m;
}

/* flash 0: LLAMA_FLASH_ATTN_TYPE_DISABLED (V transposed); unified: one stream. */
static struct llama_context *context(struct llama_model *m, int flash, uint32_t n_seq,
                                     bool unified) {
  struct llama_context_params p = llama_context_default_params();
  p.n_ctx = 2048;
  p.n_seq_max = n_seq;
  p.flash_attn_type = flash;
  p.kv_unified = unified;
  struct llama_context *c = llama_init_from_model(m, p);
  cr_assert_not_null(c);
  return c;
}

static int32_t g_tok[1024];

static void tokens_init(uint32_t seed) {
  for (size_t i = 0; i < sizeof g_tok / sizeof g_tok[0]; i++)
    g_tok[i] = (int32_t)((i * 2654435761u + seed) % 1000);
}

/* The engine's state of sequence s (malloc'ed, *len bytes). */
static uint8_t *state_of(struct llama_context *c, int32_t s, size_t *len) {
  size_t n = llama_state_seq_get_size(c, s);
  cr_assert_gt(n, 8);
  uint8_t *b = malloc(n);
  cr_assert_eq(llama_state_seq_get_data(c, b, n, s), n);
  *len = n;
  return b;
}

/* A state split: its frame and chunk objects (each malloc'ed). */
typedef struct split {
  uint8_t *frame;
  size_t flen;
  uint8_t *ch[32];
  size_t chlen[32];
  uint32_t nch;
  kvs__llama_chunks_scan_t sc;
} split_t;

static void split_state(const uint8_t *st, size_t len, const int32_t *tok, kvs_key_t ns,
                        split_t *s) {
  memset(s, 0, sizeof *s);
  cr_assert_eq(kvs__llama_chunks_scan(st, len, &s->sc), KVS_LLAMA_CHUNKS_OK);
  s->flen = (size_t)s->sc.frame_size;
  s->frame = malloc(s->flen);
  uint64_t id = kvs__llama_chunks_frame(st, &s->sc, T, ns, s->frame, s->flen);
  cr_assert_neq(id, 0);
  for (uint32_t c = 0; kvs__llama_chunk_size(&s->sc, T, s->sc.n_cells, c); c++) {
    cr_assert_lt(c, 32);
    s->chlen[c] = (size_t)kvs__llama_chunk_size(&s->sc, T, s->sc.n_cells, c);
    s->ch[c] = malloc(s->chlen[c]);
    cr_assert_eq(kvs__llama_chunk_write(st, &s->sc, tok, T, s->sc.n_cells, c, s->frame, ns, s->ch[c], s->chlen[c]),
                 KVS_LLAMA_CHUNKS_OK);
    s->nch = c + 1;
  }
}

static void split_free(split_t *s) {
  free(s->frame);
  for (uint32_t i = 0; i < s->nch; i++) free(s->ch[i]);
}

static kvs__llama_chunks_status_t assemble(const split_t *s, uint32_t nch, int32_t seq,
                                           uint8_t *dst, size_t cap, size_t *out) {
  return kvs__llama_chunks_assemble(s->frame, s->flen, T, NS, (const uint8_t *const *)s->ch,
                                    s->chlen, nch, 0, seq, dst, cap, out, NULL);
}

/* ---- round trip and prefixes -------------------------------------------------------------- */

/* Decode n tokens into sequence seq, split its state, assemble all chunks: the same bytes. */
static void round_trip(int flash, uint32_t n_seq, bool unified, int32_t seq, uint32_t n) {
  struct llama_model *m = model(3, 24, 0);
  struct llama_context *c = context(m, flash, n_seq, unified);
  tokens_init(7);
  cr_assert_eq(fakellama_decode(c, seq, g_tok, (int32_t)n), 0);
  size_t len;
  uint8_t *st = state_of(c, seq, &len);
  split_t s;
  split_state(st, len, g_tok, NS, &s);
  cr_assert_eq(s.sc.n_cells, n);
  cr_assert_eq(s.nch, (n + T - 1) / T);
  uint64_t chunk_bytes = 0;
  for (uint32_t i = 0; i < s.nch; i++) chunk_bytes += s.chlen[i];
  /* the chunks hold the per-token bytes once: no more than the state plus headers and tokens */
  cr_assert_leq(chunk_bytes, len + s.nch * sizeof(kvs__llama_chunk_hdr_t) + 4ull * n);
  uint8_t *out = malloc(len);
  size_t got = 0;
  cr_assert_eq(kvs__llama_chunks_state_size(s.frame, n), len);
  cr_assert_eq(assemble(&s, s.nch, seq, out, len, &got), KVS_LLAMA_CHUNKS_OK);
  cr_assert_eq(got, len);
  cr_assert(memcmp(out, st, len) == 0, "assembled state differs from the engine's");
  free(out);
  free(st);
  split_free(&s);
  llama_free(c);
  llama_model_free(m);
}

Test(chunks, round_trip_flash_attn_rows) { round_trip(1, 1, false, 0, 300); }
Test(chunks, round_trip_transposed_v) { round_trip(0, 1, false, 0, 300); }
Test(chunks, round_trip_per_sequence_streams) { round_trip(0, 4, false, 2, 200); }
Test(chunks, round_trip_unified_stream) { round_trip(1, 4, true, 3, 129); }
Test(chunks, round_trip_exact_chunks) { round_trip(0, 1, false, 0, 256); }

/* A sequence decoded to `first` tokens (the engine's own state of them: pst) and then to
 * `total` (st, split into chunks of T: s), for the prefix checks below. */
typedef struct prefix_fx {
  struct llama_model *m;
  struct llama_context *c;
  uint8_t *pst, *st;
  size_t plen, len;
  split_t s;
} prefix_fx_t;

static void prefix_init(prefix_fx_t *x, int flash, unsigned seed, uint32_t first, uint32_t total) {
  x->m = model(2, 40, 0);
  x->c = context(x->m, flash, 2, false);
  tokens_init(seed);
  cr_assert_eq(fakellama_decode(x->c, 0, g_tok, (int32_t)first), 0);
  x->pst = state_of(x->c, 0, &x->plen);
  cr_assert_eq(fakellama_decode(x->c, 0, g_tok + first, (int32_t)(total - first)), 0);
  x->st = state_of(x->c, 0, &x->len);
  split_state(x->st, x->len, g_tok, NS, &x->s);
}

static void prefix_fini(prefix_fx_t *x) {
  free(x->pst);
  free(x->st);
  split_free(&x->s);
  llama_free(x->c);
  llama_model_free(x->m);
}

/* The first chunks of a longer state (first tokens: nch - 1 whole chunks and last_n tokens of
 * the next, or nch whole chunks with last_n 0) assemble to exactly the state the engine writes
 * for those tokens, for another destination sequence too, and the engine loads it with the
 * right KV. A continuation chunk used in part (last_n, design §10.4): more tokens than it holds
 * are refused, nothing written. */
static void prefix(int flash, unsigned seed, uint32_t first, uint32_t nch, uint32_t last_n) {
  prefix_fx_t x;
  prefix_init(&x, flash, seed, first, first + 200);
  const uint8_t *const *ch = (const uint8_t *const *)x.s.ch;
  uint8_t *out = malloc(x.len);
  memset(out, 0xa5, x.len);
  size_t got = 0;
  if (last_n) {
    cr_assert_eq(kvs__llama_chunks_assemble(x.s.frame, x.s.flen, T, NS, ch, x.s.chlen, nch, T + 1,
                                            0, out, x.len, &got, NULL),
                 KVS_LLAMA_CHUNKS_FIELD);
    cr_assert_eq(out[0], 0xa5, "a refused assembly wrote");
  }
  for (int32_t seq = 0; seq < 2; seq++) {
    cr_assert_eq(kvs__llama_chunks_assemble(x.s.frame, x.s.flen, T, NS, ch, x.s.chlen, nch,
                                            last_n, seq, out, x.len, &got, NULL),
                 KVS_LLAMA_CHUNKS_OK);
    if (seq == 0) { /* the engine's own state of the first tokens */
      cr_assert_eq(got, x.plen);
      cr_assert(memcmp(out, x.pst, x.plen) == 0, "differs from the engine's %u-token state",
                first);
    } else { /* into sequence 1: the engine loads it and holds exactly the KV of those tokens */
      cr_assert_eq(llama_state_seq_set_data(x.c, out, got, 1), got);
      cr_assert_eq(fakellama_seq_n_cells(x.c, 1), (int32_t)first);
      cr_assert_eq(fakellama_seq_check(x.c, 1, g_tok, (int32_t)first), 1);
    }
  }
  free(out);
  prefix_fini(&x);
}

Test(chunks, prefix_is_the_engines_state_rows) { prefix(1, 11, 128, 2, 0); }
Test(chunks, prefix_is_the_engines_state_transposed) { prefix(0, 11, 128, 2, 0); }
Test(chunks, partial_chunk_is_the_engines_state_rows) { prefix(1, 12, 100, 2, 36); }
Test(chunks, partial_chunk_is_the_engines_state_transposed) { prefix(0, 12, 100, 2, 36); }

/* ---- runs left in the chunks (direct loads, design §10.4) ---------------------------------- */

/* An assembly told to leave the runs of at least `min` bytes in the chunks (cap of them at most)
 * writes every other byte of the full assembly and none of those runs; the runs it records are sorted, disjoint, at least min long, within the state, and
 * their sources hold exactly the state's bytes there: put in place they give the full assembly.
 * A byte flipped in a chunk's payload is still found (every run is hashed). */
static void deferred(int flash, uint64_t min, uint32_t cap) {
  struct llama_model *m = model(3, 24, 0);
  struct llama_context *c = context(m, flash, 1, false);
  tokens_init(5);
  cr_assert_eq(fakellama_decode(c, 0, g_tok, 300), 0);
  size_t len, got = 0;
  uint8_t *st = state_of(c, 0, &len);
  split_t s;
  split_state(st, len, g_tok, NS, &s);
  uint8_t *full = malloc(len), *out = malloc(len);
  cr_assert_eq(assemble(&s, s.nch, 0, full, len, &got), KVS_LLAMA_CHUNKS_OK);
  memset(out, 0xa5, len);
  kvs__llama_run_t *runs = calloc(cap, sizeof *runs);
  kvs__llama_defer_t d = {runs, cap, 7, min, 9}; /* n and bytes are reset */
  const uint8_t *const *ch = (const uint8_t *const *)s.ch;
  cr_assert_eq(kvs__llama_chunks_assemble(s.frame, s.flen, T, NS, ch, s.chlen, s.nch, 0, 0, out,
                                          len, &got, &d),
               KVS_LLAMA_CHUNKS_OK);
  cr_assert_eq(got, len);
  cr_assert_gt(d.n, 0, "no run left in the chunks");
  cr_assert_leq(d.n, cap);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < d.n; i++) {
    const kvs__llama_run_t *r = &runs[i];
    cr_assert_geq(r->len, min);
    cr_assert_leq(r->off + r->len, len);
    if (i) cr_assert_geq(r->off, runs[i - 1].off + runs[i - 1].len, "runs unsorted or overlapping");
    cr_assert(memcmp(r->chunk, full + r->off, (size_t)r->len) == 0, "run %u: not the state's bytes", i);
    for (uint64_t b = 0; b < r->len; b++)
      cr_assert_eq(out[r->off + b], 0xa5, "run %u was copied", i);
    memcpy(out + r->off, r->chunk, (size_t)r->len);
    sum += r->len;
  }
  cr_assert_eq(sum, d.bytes);
  cr_assert(memcmp(out, full, len) == 0, "the assembly with its runs in place differs");
  /* a flipped byte inside the first run's chunk payload */
  const kvs__llama_run_t r0 = runs[0];
  uint32_t i = 0;
  while (!(r0.chunk >= s.ch[i] && r0.chunk < s.ch[i] + s.chlen[i])) i++;
  s.ch[i][r0.chunk - s.ch[i]] ^= 0x10;
  cr_assert_eq(kvs__llama_chunks_assemble(s.frame, s.flen, T, NS, ch, s.chlen, s.nch, 0, 0, out,
                                          len, &got, &d),
               KVS_LLAMA_CHUNKS_CHECKSUM);
  free(runs);
  free(out);
  free(full);
  free(st);
  split_free(&s);
  llama_free(c);
  llama_model_free(m);
}

Test(chunks, runs_left_in_chunks_rows) { deferred(1, 64, 4096); }
Test(chunks, runs_left_in_chunks_transposed) { deferred(0, 64, 4096); }
Test(chunks, runs_left_in_chunks_capped) { deferred(1, 64, 3); }
Test(chunks, runs_left_in_chunks_short_runs_copied) { deferred(0, 1000, 4096); }

/* Direct snapshots (design §10.4): a chunk planned before the state exists writes nothing; its
 * recorded runs (at least min bytes each) name the state's bytes the engine will write into the
 * chunk; once they are there, kvs__llama_chunk_finish gives exactly the chunk kvs__llama_chunk_write
 * makes from the whole state. Too little room for the runs: FIELD. */
static void planned(int flash, uint64_t min) {
  struct llama_model *m = model(3, 24, 0);
  struct llama_context *c = context(m, flash, 2, false);
  tokens_init(9);
  cr_assert_eq(fakellama_decode(c, 1, g_tok, 300), 0);
  size_t len;
  uint8_t *st = state_of(c, 1, &len);
  split_t s;
  split_state(st, len, g_tok, NS, &s);
  for (uint32_t ci = 0; ci < s.nch; ci++) {
    uint8_t *dst = malloc(s.chlen[ci]);
    memset(dst, 0xa5, s.chlen[ci]);
    kvs__llama_run_t runs[64];
    kvs__llama_defer_t d = {runs, 64, 0, min, 0};
    cr_assert_eq(kvs__llama_chunk_plan(s.frame, s.sc.n_cells, s.sc.seq, T, s.sc.n_cells, ci, st,
                                       dst, s.chlen[ci], &d),
                 KVS_LLAMA_CHUNKS_OK);
    cr_assert_gt(d.n, 0, "chunk %u: no run planned", ci);
    for (size_t b = 0; b < s.chlen[ci]; b++) cr_assert_eq(dst[b], 0xa5, "the plan wrote");
    uint64_t sum = 0;
    for (uint32_t i = 0; i < d.n; i++) { /* the engine writes each run where the plan says */
      cr_assert_geq(runs[i].len, min);
      cr_assert(runs[i].chunk >= dst && runs[i].chunk + runs[i].len <= dst + s.chlen[ci]);
      memcpy(runs[i].chunk, st + runs[i].off, (size_t)runs[i].len);
      sum += runs[i].len;
    }
    cr_assert_eq(sum, d.bytes);
    cr_assert_eq(kvs__llama_chunk_finish(st, &s.sc, g_tok, T, s.sc.n_cells, ci, s.frame, NS, dst,
                                         s.chlen[ci], min),
                 KVS_LLAMA_CHUNKS_OK);
    cr_assert(memcmp(dst, s.ch[ci], s.chlen[ci]) == 0, "chunk %u differs from the split's", ci);
    /* the chunk's tokens as a range nobody reads (held already): the same runs of the state,
     * with no destination, for the engine's writes of them to be dropped */
    kvs__llama_run_t none[64];
    kvs__llama_defer_t dn = {none, 64, 0, min, 0};
    const uint64_t first = (uint64_t)ci * T;
    const uint64_t n = s.sc.n_cells - first < T ? s.sc.n_cells - first : T;
    cr_assert_eq(kvs__llama_plan_drop(s.frame, s.sc.n_cells, s.sc.seq, first, n, st, &dn),
                 KVS_LLAMA_CHUNKS_OK);
    cr_assert_eq(dn.n, d.n);
    cr_assert_eq(dn.bytes, d.bytes);
    for (uint32_t i = 0; i < d.n; i++) {
      cr_assert_eq(none[i].off, runs[i].off);
      cr_assert_eq(none[i].len, runs[i].len);
      cr_assert_null(none[i].chunk, "a run of a chunk nobody writes has a destination");
    }
    kvs__llama_defer_t small = {runs, 1, 0, min, 0};
    cr_assert_eq(kvs__llama_chunk_plan(s.frame, s.sc.n_cells, s.sc.seq, T, s.sc.n_cells, ci, st,
                                       dst, s.chlen[ci], &small),
                 KVS_LLAMA_CHUNKS_FIELD, "no room for the runs");
    kvs__llama_defer_t smalln = {none, 1, 0, min, 0};
    cr_assert_eq(kvs__llama_plan_drop(s.frame, s.sc.n_cells, s.sc.seq, first, n, st, &smalln),
                 KVS_LLAMA_CHUNKS_FIELD, "no room for the runs");
    cr_assert_eq(smalln.n, 0, "a refused plan leaves d as it was");
    cr_assert_eq(smalln.bytes, 0);
    free(dst);
  }
  /* all the chunks as one range: one run per layer (per element of a transposed V) covering
   * every chunk's, and bad ranges refused */
  kvs__llama_run_t all[64];
  kvs__llama_defer_t da = {all, 64, 0, min, 0};
  cr_assert_eq(kvs__llama_plan_drop(s.frame, s.sc.n_cells, s.sc.seq, 0, s.sc.n_cells, st, &da),
               KVS_LLAMA_CHUNKS_OK);
  for (uint32_t i = 0; i + 1 < da.n; i++)
    cr_assert_leq(all[i].off + all[i].len, all[i + 1].off, "runs in the state's order, apart");
  cr_assert_eq(all[0].len % s.sc.n_cells, 0, "a run is every cell's row or element");
  cr_assert_eq(kvs__llama_plan_drop(s.frame, s.sc.n_cells, s.sc.seq, 1, s.sc.n_cells, st, &da),
               KVS_LLAMA_CHUNKS_FIELD, "past the state's tokens");
  cr_assert_eq(kvs__llama_plan_drop(s.frame, s.sc.n_cells, s.sc.seq, 0, 0, st, &da),
               KVS_LLAMA_CHUNKS_FIELD, "no tokens");
  free(st);
  split_free(&s);
  llama_free(c);
  llama_model_free(m);
}

Test(chunks, planned_chunk_is_the_split_rows) { planned(1, 64); }
Test(chunks, planned_chunk_is_the_split_transposed) { planned(0, 64); }

/* Two prompts sharing 128 tokens give byte-identical first chunks (what dedup relies on), from
 * different sequences. */
Test(chunks, shared_prefix_chunks_identical) {
  struct llama_model *m = model(2, 16, 0);
  struct llama_context *c = context(m, 0, 2, false);
  tokens_init(3);
  int32_t other[200];
  memcpy(other, g_tok, 128 * 4);
  for (int i = 128; i < 200; i++) other[i] = 999 - g_tok[i];
  cr_assert_eq(fakellama_decode(c, 0, g_tok, 200), 0);
  cr_assert_eq(fakellama_decode(c, 1, other, 200), 0);
  size_t l0, l1;
  uint8_t *s0 = state_of(c, 0, &l0), *s1 = state_of(c, 1, &l1);
  split_t a, b;
  split_state(s0, l0, g_tok, NS, &a);
  split_state(s1, l1, other, NS, &b);
  cr_assert_eq(a.flen, b.flen);
  cr_assert(memcmp(a.frame, b.frame, a.flen) == 0, "one context layout, one frame");
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(a.chlen[i], b.chlen[i]);
    cr_assert(memcmp(a.ch[i], b.ch[i], a.chlen[i]) == 0, "shared chunk %d differs", i);
  }
  cr_assert(memcmp(a.ch[2], b.ch[2], a.chlen[2]) != 0);
  free(s0);
  free(s1);
  split_free(&a);
  split_free(&b);
  llama_free(c);
  llama_model_free(m);
}

/* ---- bad input: every refusal has its reason, and nothing is written ---------------------- */

typedef struct fx {
  struct llama_model *m;
  struct llama_context *c;
  uint8_t *st;
  size_t len;
  split_t s;
  uint8_t *out;
} fx_t;

static void fx_init(fx_t *f, int flash) {
  f->m = model(2, 16, 0);
  f->c = context(f->m, flash, 1, false);
  tokens_init(5);
  cr_assert_eq(fakellama_decode(f->c, 0, g_tok, 200), 0);
  f->st = state_of(f->c, 0, &f->len);
  split_state(f->st, f->len, g_tok, NS, &f->s);
  f->out = malloc(f->len);
  memset(f->out, 0xa5, f->len);
}

static void fx_fini(fx_t *f) {
  for (size_t i = 0; i < f->len; i++)
    if (f->out[i] != 0xa5) cr_assert_fail("a refused assembly wrote byte %zu", i);
  free(f->out);
  free(f->st);
  split_free(&f->s);
  llama_free(f->c);
  llama_model_free(f->m);
}

/* The split under NS of n_tokens of g_tok decoded by a new flash-attention context of m (a
 * layout other than a plain context's); the context and its state are freed, *o is the caller's
 * (split_free). */
static void split_flash(struct llama_model *m, int32_t n_tokens, split_t *o) {
  struct llama_context *c = context(m, 1, 1, false);
  cr_assert_eq(fakellama_decode(c, 0, g_tok, n_tokens), 0);
  size_t len;
  uint8_t *st = state_of(c, 0, &len);
  split_state(st, len, g_tok, NS, o);
  free(st);
  llama_free(c);
}

static kvs__llama_chunks_status_t fx_assemble(fx_t *f, uint32_t nch) {
  size_t got = 0;
  return assemble(&f->s, nch, 0, f->out, f->len, &got);
}

Test(chunks_bad, state_not_a_sequence_state) {
  fx_t f;
  fx_init(&f, 1);
  kvs__llama_chunks_scan_t sc;
  memset(&sc, 0x5a, sizeof sc);
  kvs__llama_chunks_scan_t before = sc;
  f.st[0] ^= 1;
  cr_assert_eq(kvs__llama_chunks_scan(f.st, f.len, &sc), KVS_LLAMA_CHUNKS_FOREIGN);
  f.st[0] ^= 1;
  cr_assert_eq(kvs__llama_chunks_scan(f.st, 4, &sc), KVS_LLAMA_CHUNKS_FOREIGN);
  cr_assert_eq(kvs__llama_chunks_scan(NULL, 0, &sc), KVS_LLAMA_CHUNKS_FOREIGN);
  cr_assert(memcmp(&sc, &before, sizeof sc) == 0, "a refusal filled *out");
  fx_fini(&f);
}

Test(chunks_bad, state_truncated_or_padded) {
  fx_t f;
  fx_init(&f, 0);
  kvs__llama_chunks_scan_t sc;
  cr_assert_eq(kvs__llama_chunks_scan(f.st, f.len - 1, &sc), KVS_LLAMA_CHUNKS_LAYOUT);
  cr_assert_eq(kvs__llama_chunks_scan(f.st, f.len - 300, &sc), KVS_LLAMA_CHUNKS_LAYOUT);
  uint8_t *pad = calloc(1, f.len + 4);
  memcpy(pad, f.st, f.len);
  cr_assert_eq(kvs__llama_chunks_scan(pad, f.len + 4, &sc), KVS_LLAMA_CHUNKS_LAYOUT);
  free(pad);
  fx_fini(&f);
}

Test(chunks_bad, state_cells_not_a_prefix) {
  fx_t f;
  fx_init(&f, 1);
  kvs__llama_chunks_scan_t sc;
  /* cell 5's position (n_stream, one stream count, then 12-byte cells from offset 16) */
  size_t pos5 = 8 + 4 + 4 + 5 * 12;
  f.st[pos5] ^= 1;
  cr_assert_eq(kvs__llama_chunks_scan(f.st, f.len, &sc), KVS_LLAMA_CHUNKS_CELLS);
  f.st[pos5] ^= 1;
  /* another sequence id in one cell */
  f.st[pos5 + 8] ^= 1;
  cr_assert_eq(kvs__llama_chunks_scan(f.st, f.len, &sc), KVS_LLAMA_CHUNKS_CELLS);
  f.st[pos5 + 8] ^= 1;
  /* a cell naming two sequences: no reading of the format parses it */
  f.st[pos5 + 4] = 2;
  cr_assert_eq(kvs__llama_chunks_scan(f.st, f.len, &sc), KVS_LLAMA_CHUNKS_LAYOUT);
  fx_fini(&f);
}

/* A sliding-window cache without swa_full keeps only the window's cells: not splittable. */
Test(chunks_bad, state_of_a_window_cache) {
  struct llama_model *m = model(2, 16, 64);
  struct llama_context_params p = llama_context_default_params();
  p.n_ctx = 1024;
  p.swa_full = false;
  struct llama_context *c = llama_init_from_model(m, p);
  cr_assert_not_null(c);
  tokens_init(9);
  cr_assert_eq(fakellama_decode(c, 0, g_tok, 300), 0);
  size_t len;
  uint8_t *st = state_of(c, 0, &len);
  kvs__llama_chunks_scan_t sc;
  kvs__llama_chunks_status_t r = kvs__llama_chunks_scan(st, len, &sc);
  if (fakellama_seq_n_cells(c, 0) < 300) cr_assert_eq(r, KVS_LLAMA_CHUNKS_CELLS);
  else cr_assert_eq(r, KVS_LLAMA_CHUNKS_OK); /* the fake kept every cell */
  free(st);
  llama_free(c);
  llama_model_free(m);
}

Test(chunks_bad, frame_damaged) {
  fx_t f;
  fx_init(&f, 0);
  kvs__llama_frame_hdr_t h;
  /* every byte of the frame matters */
  for (size_t i = 0; i < f.s.flen; i++) {
    f.s.frame[i] ^= 0x10;
    cr_assert_neq(kvs__llama_frame_check(f.s.frame, f.s.flen, T, NS, &h), KVS_LLAMA_CHUNKS_OK,
                  "flipped frame byte %zu accepted", i);
    cr_assert_neq(fx_assemble(&f, 1), KVS_LLAMA_CHUNKS_OK);
    f.s.frame[i] ^= 0x10;
  }
  size_t csum = offsetof(kvs__llama_frame_hdr_t, checksum);
  f.s.frame[csum] ^= 1;
  cr_assert_eq(fx_assemble(&f, 1), KVS_LLAMA_CHUNKS_CHECKSUM);
  f.s.frame[csum] ^= 1;
  /* a layer's K type out of range: a field check, before the checksum */
  size_t k_type0 = sizeof(kvs__llama_frame_hdr_t) + sizeof(kvs__llama_frame_sec_t);
  f.s.frame[k_type0 + 3] = 0x7f;
  cr_assert_eq(fx_assemble(&f, 1), KVS_LLAMA_CHUNKS_FIELD);
  f.s.frame[k_type0 + 3] = 0;
  cr_assert_eq(kvs__llama_frame_check(f.s.frame, f.s.flen - 1, T, NS, &h),
               KVS_LLAMA_CHUNKS_LENGTH);
  cr_assert_eq(kvs__llama_frame_check(f.s.frame, 10, T, NS, &h), KVS_LLAMA_CHUNKS_SHORT);
  fx_fini(&f);
}

Test(chunks_bad, chunk_damaged_truncated_or_foreign) {
  fx_t f;
  fx_init(&f, 1);
  uint8_t *c1 = f.s.ch[1];
  c1[f.s.chlen[1] / 2] ^= 4; /* a flipped KV byte */
  cr_assert_eq(fx_assemble(&f, 3), KVS_LLAMA_CHUNKS_CHECKSUM);
  c1[f.s.chlen[1] / 2] ^= 4;
  /* the one refusal that writes (chunks.h: chunk 0 was checked and copied before chunk 1's
   * checksum failed); chunk 1 and later left nothing */
  for (size_t i = 0; i < f.len; i++)
    cr_assert(f.out[i] == 0xa5 || i >= 8, "the state header was written before a refusal");
  memset(f.out, 0xa5, f.len);
  f.s.chlen[1]--;
  cr_assert_eq(fx_assemble(&f, 3), KVS_LLAMA_CHUNKS_LENGTH);
  f.s.chlen[1]++;
  c1[0] ^= 1;
  cr_assert_eq(fx_assemble(&f, 3), KVS_LLAMA_CHUNKS_FOREIGN);
  c1[0] ^= 1;
  /* assembled with another namespace's key: the frame is refused first */
  size_t got;
  kvs_key_t other = {NS.lo + 1, NS.hi};
  cr_assert_eq(kvs__llama_chunks_assemble(f.s.frame, f.s.flen, T, other,
                                          (const uint8_t *const *)f.s.ch, f.s.chlen, 3, 0, 0, f.out,
                                          f.len, &got, NULL),
               KVS_LLAMA_CHUNKS_NAMESPACE);
  /* another chunk size */
  cr_assert_eq(kvs__llama_chunks_assemble(f.s.frame, f.s.flen, T * 2, NS,
                                          (const uint8_t *const *)f.s.ch, f.s.chlen, 3, 0, 0, f.out,
                                          f.len, &got, NULL),
               KVS_LLAMA_CHUNKS_FRAME);
  fx_fini(&f);
}

/* A chunk made in another namespace, or with another context layout (another frame), is never
 * assembled with this frame, even with a valid checksum. */
Test(chunks_bad, chunk_of_another_model_or_kv_setting) {
  fx_t f;
  fx_init(&f, 0);
  kvs_key_t other = {NS.lo, NS.hi ^ 1};
  split_t o;
  split_state(f.st, f.len, g_tok, other, &o);
  uint8_t *keep = f.s.ch[1];
  size_t keep_len = f.s.chlen[1];
  f.s.ch[1] = o.ch[1];
  cr_assert_eq(fx_assemble(&f, 3), KVS_LLAMA_CHUNKS_NAMESPACE);
  /* the same tokens through a flash-attention context: another layout, another frame */
  split_t o2;
  split_flash(f.m, 200, &o2);
  f.s.ch[1] = o2.ch[1];
  f.s.chlen[1] = o2.chlen[1];
  cr_assert_eq(fx_assemble(&f, 3), KVS_LLAMA_CHUNKS_FRAME);
  f.s.ch[1] = keep;
  f.s.chlen[1] = keep_len;
  split_free(&o);
  split_free(&o2);
  fx_fini(&f);
}

Test(chunks_bad, chunks_out_of_order_or_missing) {
  fx_t f;
  fx_init(&f, 1);
  uint8_t *c0 = f.s.ch[0], *c1 = f.s.ch[1];
  size_t l0 = f.s.chlen[0], l1 = f.s.chlen[1];
  /* a missing middle chunk: 0, 2 */
  f.s.ch[1] = f.s.ch[2];
  f.s.chlen[1] = f.s.chlen[2];
  cr_assert_eq(fx_assemble(&f, 2), KVS_LLAMA_CHUNKS_ORDER);
  /* swapped */
  f.s.ch[0] = c1;
  f.s.chlen[0] = l1;
  f.s.ch[1] = c0;
  f.s.chlen[1] = l0;
  cr_assert_eq(fx_assemble(&f, 2), KVS_LLAMA_CHUNKS_ORDER);
  f.s.ch[0] = c0;
  f.s.chlen[0] = l0;
  f.s.ch[1] = c1;
  f.s.chlen[1] = l1;
  cr_assert_eq(fx_assemble(&f, 0), KVS_LLAMA_CHUNKS_ORDER);
  fx_fini(&f);
}

/* A short (last) chunk before another: 200 tokens split at 64 give 64, 64, 64, 8; a state of
 * 100 tokens split the same way gives 64, 36, whose chunk 1 is short. */
Test(chunks_bad, short_chunk_before_the_last) {
  fx_t f;
  fx_init(&f, 1);
  split_t o;
  split_flash(f.m, 100, &o);
  uint8_t *keep = f.s.ch[1];
  size_t keep_len = f.s.chlen[1];
  f.s.ch[1] = o.ch[1];
  f.s.chlen[1] = o.chlen[1];
  cr_assert_eq(fx_assemble(&f, 2), KVS_LLAMA_CHUNKS_OK); /* 64 + 36: a valid 100-token state */
  cr_assert_eq(fx_assemble(&f, 3), KVS_LLAMA_CHUNKS_ORDER);
  f.s.ch[1] = keep;
  f.s.chlen[1] = keep_len;
  memset(f.out, 0xa5, f.len); /* the 2-chunk assembly above was valid and wrote */
  split_free(&o);
  fx_fini(&f);
}

Test(chunks_bad, destination_too_small) {
  fx_t f;
  fx_init(&f, 0);
  size_t got = 0;
  cr_assert_eq(assemble(&f.s, f.s.nch, 0, f.out, f.len - 1, &got), KVS_LLAMA_CHUNKS_SPACE);
  cr_assert_eq(got, 0);
  /* a sequence without a stream in this context layout */
  cr_assert_eq(assemble(&f.s, 1, -1, f.out, f.len, &got), KVS_LLAMA_CHUNKS_FIELD);
  fx_fini(&f);
}

Test(chunks_bad, status_names) {
  for (int s = KVS_LLAMA_CHUNKS_OK; s <= KVS_LLAMA_CHUNKS_SPACE; s++)
    cr_assert_str_neq(kvs__llama_chunks_status_name((kvs__llama_chunks_status_t)s), "unknown");
}
