/* Unit tests of the prefix cache's pure part (shims/llama/prefix_shadow.c): the kernel-class
 * rules, the shadow of sequences under batches and memory calls, the index remap, chunk keys,
 * and the blob checks of the prefix kind (shims/llama/blob.c). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "keys.h"
#include "blob.h"
#include "runtime.h"
#include "blobtest.h"
#include "prefix_shadow.h"

/* blob.c raises libkvshim's re-entry depth around its store work (not exercised here). */
__thread int kvs__hook_depth;
/* ... and ask the runtime for the cache peer (no flow runs here: none). */
uint64_t kvs__runtime_cache_peer(kvs__runtime_t *rt) {
  (void)rt;
  return 0;
}

static const kvs__px_rules_t CPU = {512, 64, 64};
static const kvs__px_rules_t GPU = {512, 512, 512};

/* restore_ok(rules, n, canon, m, first_out, k) with min tokens 256 */
static bool ok(const kvs__px_rules_t *r, uint32_t n, uint32_t canon, uint32_t m, uint32_t f,
               uint32_t k) {
  return kvs__px_restore_ok(r, 256, n, canon, m, f, k);
}

Test(prefix_rules, cpu_whole_prompt, .timeout = 30) {
  /* 1100 tokens in one call (ubatches 512, 512, 76), output on the last */
  cr_expect(ok(&CPU, 0, 0, 1100, 1099, 1024), "same ubatches from 1024 on");
  cr_expect(ok(&CPU, 0, 0, 1100, 1099, 768), "76 and 332 rows: both the long class");
  cr_expect(ok(&CPU, 0, 0, 1100, 1099, 512));
  cr_expect(ok(&CPU, 0, 0, 1100, 1099, 256));
  cr_expect_not(ok(&CPU, 0, 0, 1100, 1099, 1280), "beyond the batch");
  cr_expect_not(ok(&CPU, 0, 0, 1100, 1099, 1100), "not aligned to 64");
  cr_expect_not(ok(&CPU, 0, 0, 1100, 1099, 1024 + 64), "12 rows left: the short class");
  cr_expect(ok(&CPU, 0, 0, 1100, 1099, 960), "any multiple of 64, not only chunk boundaries");
  cr_expect(ok(&CPU, 0, 0, 1100, 1099, 320));
  cr_expect_not(ok(&CPU, 0, 0, 1100, 1099, 352), "not a multiple of 64");
  /* an output at index 500 may not be skipped */
  cr_expect_not(ok(&CPU, 0, 0, 1100, 500, 768));
  cr_expect(ok(&CPU, 0, 0, 1100, 500, 256));
  cr_expect(ok(&CPU, 0, 0, 1100, 256, 256), "the output token itself is decoded");
  cr_expect_not(ok(&CPU, 0, 0, 1100, 255, 256));
}

Test(prefix_rules, cpu_short_tail, .timeout = 30) {
  /* 1030 tokens: the engine's last ubatch has 6 rows (the short class) */
  cr_expect_not(ok(&CPU, 0, 0, 1030, 1029, 768), "6-row tail would become 262 rows");
  cr_expect(ok(&CPU, 0, 0, 1030, 1029, 512), "s a multiple of n_ubatch: identical ubatches");
  cr_expect(ok(&CPU, 0, 0, 1030, 1029, 1024));
  /* one token must be left to decode */
  cr_expect_not(ok(&CPU, 0, 0, 1024, 1023, 1024));
  cr_expect(ok(&CPU, 0, 0, 1025, 1024, 1024));
}

Test(prefix_rules, cpu_continuation, .timeout = 30) {
  /* second engine batch of 512 after 512 canonical tokens */
  cr_expect(ok(&CPU, 512, 512, 512, 511, 768));
  cr_expect_not(ok(&CPU, 512, 500, 512, 511, 768), "a non-canonical token before the batch");
  cr_expect_not(ok(&CPU, 512, 512, 512, 511, 512), "k must exceed n");
  /* a batch starting at an unaligned position */
  cr_expect_not(ok(&CPU, 100, 100, 600, 599, 256));
  cr_expect(ok(&CPU, 128, 128, 600, 599, 256), "128 + 128: aligned to 64");
  cr_expect_not(ok(&CPU, 160, 160, 600, 599, 256), "s = 96 is not a multiple of 64");
  /* a short batch: never the long class */
  cr_expect_not(ok(&CPU, 0, 0, 300, 299, 256), "44 rows left");
  cr_expect(ok(&CPU, 0, 0, 320, 319, 256), "64 rows left, 320 in the engine's split");
}

Test(prefix_rules, cpu_whole_batch, .timeout = 30) {
  /* a batch asking no output (first_out == m) that lies wholly in the cached prefix */
  static const struct {
    uint32_t n, canon, m, f, k;
    bool want;
    const char *why;
  } cases[] = {
      {0, 0, 512, 512, 512, true, "not decoded at all"},
      {512, 512, 512, 512, 1024, true, "the second batch"},
      {0, 0, 576, 576, 576, true, "512 + 64 rows: both long"},
      {0, 0, 512, 511, 512, false, "its last token has an output"},
      {0, 0, 544, 544, 544, false, "544 is not a multiple of 64"},
      {0, 0, 544, 544, 512, true, "the 32-row ubatch is the engine's own"},
      {512, 500, 512, 512, 1024, false, "a non-canonical token before it"},
      {100, 100, 412, 412, 512, false, "an unaligned start"},
      {0, 0, 512, 512, 576, false, "beyond the batch"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    cr_expect_eq(ok(&CPU, cases[i].n, cases[i].canon, cases[i].m, cases[i].f, cases[i].k),
                 cases[i].want, "%s", cases[i].why);
  kvs__px_rules_t u96l = {96, 32, 64};
  cr_expect_not(kvs__px_restore_ok(&u96l, 0, 0, 0, 128, 128, 128), "32 < min_rows");
  cr_expect(kvs__px_restore_ok(&u96l, 0, 0, 0, 160, 160, 160), "96 + 64 rows");
  kvs__px_rules_t u513 = {513, 64, 64};
  cr_expect(ok(&u513, 0, 0, 512, 512, 512), "n_ubatch 513, one ubatch: skipped whole");
  cr_expect(ok(&u513, 1024, 1024, 390, 389, 1344), "n_ubatch 513, one ubatch: 70 rows left");
  cr_expect_not(ok(&u513, 0, 0, 1100, 1099, 1024), "n_ubatch 513, several ubatches");
  cr_expect(ok(&GPU, 0, 0, 512, 512, 512), "offload: one whole aligned ubatch");
  cr_expect_not(ok(&GPU, 0, 0, 1024, 1024, 768), "offload: not a whole ubatch");
}

Test(prefix_rules, bad_parameters, .timeout = 30) {
  kvs__px_rules_t small = {32, 64, 64}, zero = {0, 64, 64};
  cr_expect_not(ok(&small, 0, 0, 1100, 1099, 512), "n_ubatch below the long class");
  cr_expect_not(ok(&zero, 0, 0, 1100, 1099, 512));
  cr_expect_not(kvs__px_restore_ok(&CPU, 256, 0, 0, 0, 0, 256), "empty batch");
  cr_expect_not(kvs__px_restore_ok(&CPU, 768, 0, 0, 1100, 1099, 512), "below min tokens");
  cr_expect_not(kvs__px_restore_ok(NULL, 256, 0, 0, 1100, 1099, 512));
}

Test(prefix_rules, offload_only_whole_ubatches, .timeout = 30) {
  cr_expect(ok(&GPU, 0, 0, 1100, 1099, 512));
  cr_expect(ok(&GPU, 0, 0, 1100, 1099, 1024));
  cr_expect_not(ok(&GPU, 0, 0, 1100, 1099, 768));
  cr_expect_not(ok(&GPU, 0, 0, 1100, 1099, 256));
  cr_expect(ok(&GPU, 512, 512, 1100, 1099, 1024));
  cr_expect_not(ok(&GPU, 256, 256, 1100, 1099, 768), "n not a multiple of n_ubatch");
}

Test(prefix_rules, canon_after, .timeout = 30) {
  cr_expect_eq(kvs__px_canon_after(&CPU, 0, 0, 1100), 1100);
  cr_expect_eq(kvs__px_canon_after(&CPU, 0, 0, 1030), 1024, "the 6-row tail is not canonical");
  cr_expect_eq(kvs__px_canon_after(&CPU, 1024, 1024, 1), 1024, "a generated token");
  cr_expect_eq(kvs__px_canon_after(&CPU, 1024, 1000, 600), 1000, "canon stopped earlier");
  cr_expect_eq(kvs__px_canon_after(&CPU, 100, 100, 600), 100, "unaligned start");
  cr_expect_eq(kvs__px_canon_after(&CPU, 64, 64, 600), 664);
  cr_expect_eq(kvs__px_canon_after(&GPU, 0, 0, 1100), 1024);
  cr_expect_eq(kvs__px_canon_after(&GPU, 0, 0, 1024), 1024);
  cr_expect_eq(kvs__px_canon_after(&CPU, 0, 0, 48), 0);
}

/* ---- the shadow ----------------------------------------------------------------------------- */

#define NSEQ 4
#define CAP 2048
#define CHUNK 256

typedef struct fix {
  kvs__px_shadow_t sh;
  kvs__px_seq_t seq[NSEQ];
  int32_t *tok;
  kvs_key_t *keys;
} fix_t;

static void fix_init(fix_t *f) {
  memset(f, 0, sizeof *f);
  f->tok = calloc((size_t)NSEQ * CAP, sizeof *f->tok);
  f->keys = calloc((size_t)NSEQ * (CAP / CHUNK + 1), sizeof *f->keys);
  cr_assert(f->tok && f->keys);
  f->sh = (kvs__px_shadow_t){NSEQ, CAP, CAP / CHUNK + 1, CHUNK, f->seq, f->tok, f->keys};
}
static void fix_fini(fix_t *f) {
  free(f->tok);
  free(f->keys);
}

/* Decode n tokens (value base + i) at positions start.. into seq s, one batch, explicit
 * positions; returns the shadow's new n. */
static uint32_t feed(fix_t *f, int32_t s, int32_t start, int32_t n, int32_t base) {
  int32_t *tok = calloc((size_t)n, 4), *pos = calloc((size_t)n, 4), *nid = calloc((size_t)n, 4);
  int32_t **sid = calloc((size_t)n, sizeof *sid);
  int8_t *lg = calloc((size_t)n, 1);
  for (int32_t i = 0; i < n; i++) {
    tok[i] = base + i;
    pos[i] = start + i;
    nid[i] = 1;
    sid[i] = &s;
  }
  lg[n - 1] = 1;
  kvs__llama_batch_t b = {n, tok, NULL, pos, nid, sid, lg};
  kvs__px_batch_info_t bi;
  kvs__px_batch_scan(&b, NSEQ, false, &bi);
  cr_assert(bi.valid && bi.single && bi.seq == s && bi.first_out == (uint32_t)n - 1 && bi.last_out);
  kvs__px_batch_apply(&f->sh, &b, &bi, NULL, &CPU);
  free(tok);
  free(pos);
  free(nid);
  free(sid);
  free(lg);
  return f->seq[s].n;
}

/* A fixture whose sequence 0 holds n fed tokens (values base..) with a snapshot of snap tokens
 * under nkeys chunk keys. */
static void fix_snapped(fix_t *f, int32_t n, int32_t base, uint32_t snap, uint32_t nkeys) {
  fix_init(f);
  feed(f, 0, 0, n, base);
  f->seq[0].snap = snap;
  f->seq[0].nkeys = nkeys;
}

Test(prefix_shadow, batches_build_a_plain_prefix, .timeout = 30) {
  fix_t f;
  fix_init(&f);
  cr_expect_eq(feed(&f, 1, 0, 1030, 5), 1030);
  cr_expect_eq(f.seq[1].canon, 1024);
  cr_expect_eq(kvs__px_tok(&f.sh, 1)[1029], 5 + 1029);
  cr_expect_eq(feed(&f, 1, 1030, 1, 9000), 1031, "a generated token");
  cr_expect_eq(f.seq[1].canon, 1024);
  cr_expect_eq(f.seq[0].n, 0, "other sequences untouched");
  /* a batch that does not continue at n taints */
  feed(&f, 1, 1040, 4, 0);
  cr_expect(f.seq[1].tainted);
  cr_expect_eq(f.seq[1].n, 0);
  fix_fini(&f);
}

Test(prefix_shadow, auto_positions_and_several_sequences, .timeout = 30) {
  fix_t f;
  fix_init(&f);
  int32_t tok[6] = {1, 2, 3, 4, 5, 6}, s0 = 0, s2 = 2;
  int32_t *sid[6] = {&s0, &s2, &s0, &s2, &s0, &s2};
  int32_t nid[6] = {1, 1, 1, 1, 1, 1};
  kvs__llama_batch_t b = {6, tok, NULL, NULL, nid, sid, NULL};
  kvs__px_batch_info_t bi;
  kvs__px_batch_scan(&b, NSEQ, false, &bi);
  cr_expect(bi.valid);
  cr_expect_not(bi.single);
  cr_expect_eq(bi.first_out, 5);
  int32_t p0[NSEQ] = {0, 0, 0, 0};
  kvs__px_batch_apply(&f.sh, &b, &bi, p0, &CPU);
  cr_expect_eq(f.seq[0].n, 3);
  cr_expect_eq(f.seq[2].n, 3);
  cr_expect_eq(kvs__px_tok(&f.sh, 2)[2], 6);
  cr_expect_eq(f.seq[0].canon, 0, "several sequences: not canonical");
  /* memory says sequence 0 continues at 7: it is not what kvshim knew */
  int32_t p1[NSEQ] = {7, 3, 3, 3};
  kvs__px_batch_apply(&f.sh, &b, &bi, p1, &CPU);
  cr_expect(f.seq[0].tainted);
  cr_expect_eq(f.seq[2].n, 6);
  /* a token shared by two sequences lands in both */
  int32_t one = 42, pos = 6, two = 2;
  int32_t ids[2] = {2, 3};
  int32_t *idp[1] = {ids};
  f.seq[3] = f.seq[2];
  memcpy(kvs__px_tok(&f.sh, 3), kvs__px_tok(&f.sh, 2), 6 * 4);
  kvs__llama_batch_t sh = {1, &one, NULL, &pos, &two, idp, NULL};
  kvs__px_batch_scan(&sh, NSEQ, false, &bi);
  cr_expect(bi.valid && !bi.single);
  kvs__px_batch_apply(&f.sh, &sh, &bi, NULL, &CPU);
  cr_expect_eq(f.seq[2].n, 7);
  cr_expect_eq(f.seq[3].n, 7);
  cr_expect_eq(kvs__px_tok(&f.sh, 3)[6], 42);
  fix_fini(&f);
}

Test(prefix_shadow, getone_style_batch, .timeout = 30) {
  fix_t f;
  fix_init(&f);
  int32_t tok[300];
  for (int i = 0; i < 300; i++) tok[i] = i;
  kvs__llama_batch_t b = {300, tok, NULL, NULL, NULL, NULL, NULL};
  kvs__px_batch_info_t bi;
  kvs__px_batch_scan(&b, NSEQ, false, &bi);
  cr_expect(bi.valid && bi.single && bi.seq == 0 && bi.first_out == 299 && bi.last_out);
  int32_t p0[NSEQ] = {0};
  kvs__px_batch_apply(&f.sh, &b, &bi, p0, &CPU);
  cr_expect_eq(f.seq[0].n, 300);
  cr_expect_eq(f.seq[0].canon, 300);
  kvs__px_batch_scan(&b, NSEQ, true, &bi);
  cr_expect_eq(bi.first_out, 0, "embeddings: every token is an output");
  fix_fini(&f);
}

Test(prefix_shadow, bad_batches, .timeout = 30) {
  fix_t f;
  fix_init(&f);
  feed(&f, 0, 0, 10, 0);
  int32_t tok[2] = {1, 2}, bad = 9, zero = 0;
  int32_t *sid[2] = {&bad, &bad};
  int32_t nid[2] = {1, 1};
  kvs__llama_batch_t b = {2, tok, NULL, NULL, nid, sid, NULL};
  kvs__px_batch_info_t bi;
  kvs__px_batch_scan(&b, NSEQ, false, &bi);
  cr_expect_not(bi.valid, "sequence id out of range");
  int32_t nid0[2] = {0, 1};
  kvs__llama_batch_t b0 = {2, tok, NULL, NULL, nid0, sid, NULL};
  kvs__px_batch_scan(&b0, NSEQ, false, &bi);
  cr_expect_not(bi.valid, "a token of no sequence");
  kvs__llama_batch_t empty = {0, tok, NULL, NULL, NULL, NULL, NULL};
  kvs__px_batch_scan(&empty, NSEQ, false, &bi);
  cr_expect_not(bi.valid);
  cr_expect_eq(f.seq[0].n, 10, "scanning changes nothing");
  /* decoded although unreadable: nothing is trusted */
  kvs__px_batch_apply(&f.sh, &b, &bi, NULL, &CPU);
  cr_expect(f.seq[0].tainted);
  /* an embeddings batch taints its sequences */
  kvs__px_clear(&f.sh, -1);
  feed(&f, 1, 0, 10, 0);
  float e[2] = {0};
  int32_t one = 1, *s1[2] = {&one, &one};
  kvs__llama_batch_t eb = {2, NULL, e, NULL, nid, s1, NULL};
  kvs__px_batch_scan(&eb, NSEQ, false, &bi);
  cr_expect(bi.valid && !bi.has_tokens);
  int32_t p0[NSEQ] = {0, 10, 0, 0};
  kvs__px_batch_apply(&f.sh, &eb, &bi, p0, &CPU);
  cr_expect(f.seq[1].tainted);
  cr_expect_not(f.seq[0].tainted);
  /* beyond the shadow's capacity */
  kvs__px_clear(&f.sh, -1);
  int32_t big_n = CAP + 1;
  int32_t *big = calloc((size_t)big_n, 4);
  kvs__llama_batch_t bb = {big_n, big, NULL, NULL, NULL, NULL, NULL};
  kvs__px_batch_scan(&bb, NSEQ, false, &bi);
  kvs__px_batch_apply(&f.sh, &bb, &bi, p0, &CPU);
  cr_expect(f.seq[0].tainted);
  free(big);
  (void)zero;
  fix_fini(&f);
}

Test(prefix_shadow, outputs, .timeout = 30) {
  int32_t tok[4] = {1, 2, 3, 4};
  int8_t none[4] = {0, 0, 0, 0}, mid[4] = {0, 1, 0, 0};
  kvs__llama_batch_t b = {4, tok, NULL, NULL, NULL, NULL, none};
  kvs__px_batch_info_t bi;
  kvs__px_batch_scan(&b, NSEQ, false, &bi);
  cr_expect_eq(bi.first_out, 4);
  cr_expect_not(bi.last_out);
  b.logits = mid;
  kvs__px_batch_scan(&b, NSEQ, false, &bi);
  cr_expect_eq(bi.first_out, 1);
  cr_expect_not(bi.last_out);
}

Test(prefix_shadow, memory_calls, .timeout = 30) {
  fix_t f;
  fix_snapped(&f, 1100, 0, 1024, 4);
  kvs__px_rm(&f.sh, 0, 2000, -1);
  cr_expect_eq(f.seq[0].n, 1100, "nothing there");
  kvs__px_rm(&f.sh, 0, 600, -1);
  cr_expect_eq(f.seq[0].n, 600);
  cr_expect_eq(f.seq[0].canon, 600);
  cr_expect_eq(f.seq[0].snap, 512);
  cr_expect_eq(f.seq[0].nkeys, 2);
  kvs__px_rm(&f.sh, 0, 600, 700);
  cr_expect_eq(f.seq[0].n, 600, "a range past the end");
  kvs__px_rm(&f.sh, 0, 100, 200);
  cr_expect(f.seq[0].tainted, "a hole");
  kvs__px_rm(&f.sh, 0, 0, 5000);
  cr_expect(f.seq[0].tainted, "a tainted sequence is cleared only by removing all of it");
  kvs__px_rm(&f.sh, 0, -1, -1);
  cr_expect_not(f.seq[0].tainted);
  cr_expect_eq(f.seq[0].n, 0);
  /* every sequence at once */
  feed(&f, 0, 0, 10, 0);
  feed(&f, 1, 0, 10, 0);
  kvs__px_rm(&f.sh, -1, 5, -1);
  cr_expect_eq(f.seq[0].n, 5);
  cr_expect_eq(f.seq[1].n, 5);
  kvs__px_rm(&f.sh, 7, 0, -1); /* out of range: nothing */
  cr_expect_eq(f.seq[1].n, 5);
  /* shifts */
  kvs__px_add(&f.sh, 0, 0, -1, 0);
  cr_expect_not(f.seq[0].tainted, "delta 0");
  kvs__px_add(&f.sh, 0, 5, -1, -2);
  cr_expect_not(f.seq[0].tainted, "no cell in the range");
  kvs__px_div(&f.sh, 0, 0, -1, 1);
  cr_expect_not(f.seq[0].tainted, "d 1");
  kvs__px_add(&f.sh, 0, 2, 4, 3);
  cr_expect(f.seq[0].tainted);
  kvs__px_div(&f.sh, 1, 0, -1, 2);
  cr_expect(f.seq[1].tainted);
  kvs__px_add(&f.sh, 2, 0, -1, 5);
  cr_expect_not(f.seq[2].tainted, "an empty sequence has nothing to shift");
  /* keep and clear */
  kvs__px_clear(&f.sh, -1);
  feed(&f, 0, 0, 10, 0);
  feed(&f, 1, 0, 10, 0);
  kvs__px_taint(&f.sh, 2);
  kvs__px_keep(&f.sh, 1);
  cr_expect_eq(f.seq[0].n, 0);
  cr_expect_eq(f.seq[1].n, 10);
  cr_expect_not(f.seq[2].tainted);
  fix_fini(&f);
}

Test(prefix_shadow, copies, .timeout = 30) {
  fix_t f;
  fix_snapped(&f, 600, 7, 512, 2);
  kvs__px_keys_compute(&f.sh, 0, (kvs_key_t){1, 2}, 0, 2);
  kvs__px_cp(&f.sh, 0, 1, -1, 300);
  cr_expect_eq(f.seq[1].n, 300);
  cr_expect_eq(f.seq[1].canon, 300);
  cr_expect_eq(f.seq[1].snap, 256);
  cr_expect_eq(f.seq[1].nkeys, 1);
  cr_expect(kvs_key_eq(kvs__px_keys(&f.sh, 1)[0], kvs__px_keys(&f.sh, 0)[0]));
  cr_expect_eq(memcmp(kvs__px_tok(&f.sh, 1), kvs__px_tok(&f.sh, 0), 300 * 4), 0);
  kvs__px_cp(&f.sh, 0, 1, -1, -1);
  cr_expect(f.seq[1].tainted, "into a non-empty sequence");
  kvs__px_cp(&f.sh, 0, 2, 10, -1);
  cr_expect(f.seq[2].tainted, "not from position 0");
  kvs__px_cp(&f.sh, 0, 3, 700, -1);
  cr_expect_not(f.seq[3].tainted, "nothing copied");
  cr_expect_eq(f.seq[3].n, 0);
  kvs__px_cp(&f.sh, 1, 3, -1, -1);
  cr_expect(f.seq[3].tainted, "from a tainted sequence");
  kvs__px_cp(&f.sh, 0, 0, -1, -1);
  cr_expect_eq(f.seq[0].n, 600, "onto itself: nothing");
  kvs__px_cp(&f.sh, 0, 9, -1, -1);
  for (int s = 0; s < NSEQ; s++) cr_expect(f.seq[s].tainted, "a bad destination: trust nothing");
  fix_fini(&f);
}

Test(prefix_shadow, keys_are_the_design_chain, .timeout = 30) {
  fix_t f;
  fix_init(&f);
  feed(&f, 2, 0, 1100, 3);
  kvs_key_t ns = {0x1234, 0x5678}, want[4];
  size_t n = kvs_keys_chunks(ns, (const uint32_t *)(const void *)kvs__px_tok(&f.sh, 2), 1100, CHUNK,
                             want, 4);
  cr_assert_eq(n, 4);
  kvs__px_keys_compute(&f.sh, 2, ns, 0, 2);
  kvs__px_keys_compute(&f.sh, 2, ns, 2, 4); /* continues from keys[1] */
  for (int j = 0; j < 4; j++) cr_expect(kvs_key_eq(kvs__px_keys(&f.sh, 2)[j], want[j]), "key %d", j);
  fix_fini(&f);
}

Test(prefix_shadow, index_remap, .timeout = 30) {
  cr_expect_eq(kvs__px_map_index(0, 5), 5);
  cr_expect_eq(kvs__px_map_index(100, -1), -1, "negative: counted from the last output");
  cr_expect_eq(kvs__px_map_index(100, 99), INT32_MAX, "a skipped token has no output");
  cr_expect_eq(kvs__px_map_index(100, 100), 0);
  cr_expect_eq(kvs__px_map_index(100, 150), 50);
}

/* ---- blob --------------------------------------------------------------------------------- */

static const uint8_t FP[KVS_LLAMA_FP_SIZE] = {1, 2, 3, 4,  5,  6,  7,  8,
                                              9, 10, 11, 12, 13, 14, 15, 16};
static const kvs_key_t NS = {0xabc, 0xdef};

static uint8_t *mkblob(uint32_t n, uint32_t keyed, uint64_t state, uint64_t *len) {
  kvs__llama_blob_hdr_t h;
  uint8_t *b = blob_new(&h, KVS_LLAMA_BLOB_KIND_PREFIX, n, state, FP, NS, len);
  h.keyed_tokens = keyed;
  h.chunk_tokens = CHUNK;
  for (uint32_t i = 0; i < n; i++) memcpy(b + KVS_LLAMA_BLOB_HDR + 4 * i, &i, 4);
  uint32_t magic = KVS_LLAMA_STATE_MAGIC;
  memcpy(b + KVS_LLAMA_BLOB_HDR + 4ull * n, &magic, 4);
  blob_seal(b, &h, *len);
  return b;
}

static kvs__llama_blob_status_t check(const uint8_t *b, uint64_t len, kvs__llama_blob_hdr_t *h) {
  const kvs__llama_blob_want_t want = {KVS_LLAMA_BLOB_KIND_PREFIX, CHUNK, FP, NS};
  return kvs__llama_blob_check(b, len, &want, h);
}

Test(prefix_blob, accepts_a_good_blob, .timeout = 30) {
  uint64_t len;
  uint8_t *b = mkblob(600, 512, 1000, &len);
  kvs__llama_blob_hdr_t h;
  memset(&h, 0, sizeof h);
  cr_assert_eq(check(b, len, &h), KVS_LLAMA_BLOB_OK);
  cr_expect_eq(h.n_tokens, 600);
  cr_expect_eq(h.keyed_tokens, 512);
  cr_expect_eq(h.state_size, 1000);
  free(b);
}

Test(prefix_blob, refuses_each_bad_field, .timeout = 30) {
  uint64_t len;
  kvs__llama_blob_hdr_t h, untouched;
  memset(&untouched, 0x5a, sizeof untouched);
  struct {
    const char *what;
    size_t off;
    uint8_t xor_;
    bool reseal;
    kvs__llama_blob_status_t want;
  } cases[] = {
      {"magic", offsetof(kvs__llama_blob_hdr_t, magic), 1, true, KVS_LLAMA_BLOB_FOREIGN},
      {"version", offsetof(kvs__llama_blob_hdr_t, version), 2, true, KVS_LLAMA_BLOB_FOREIGN},
      {"hdr_size", offsetof(kvs__llama_blob_hdr_t, hdr_size), 8, true, KVS_LLAMA_BLOB_FOREIGN},
      {"n_tokens", offsetof(kvs__llama_blob_hdr_t, n_tokens), 1, true, KVS_LLAMA_BLOB_LENGTH},
      {"state_size", offsetof(kvs__llama_blob_hdr_t, state_size), 4, true, KVS_LLAMA_BLOB_LENGTH},
      {"keyed not a chunk multiple", offsetof(kvs__llama_blob_hdr_t, keyed_tokens), 1, true,
       KVS_LLAMA_BLOB_KEYED},
      {"chunk", offsetof(kvs__llama_blob_hdr_t, chunk_tokens), 1, true, KVS_LLAMA_BLOB_KEYED},
      {"canon below keyed", offsetof(kvs__llama_blob_hdr_t, canon_tokens), 1, true,
       KVS_LLAMA_BLOB_KEYED},
      {"canon beyond the tokens", offsetof(kvs__llama_blob_hdr_t, canon_tokens) + 2, 1, true,
       KVS_LLAMA_BLOB_KEYED},
      {"model", offsetof(kvs__llama_blob_hdr_t, model_fp) + 3, 0x10, true, KVS_LLAMA_BLOB_MODEL},
      {"namespace", offsetof(kvs__llama_blob_hdr_t, ns_hi), 1, true, KVS_LLAMA_BLOB_NAMESPACE},
      {"state magic", KVS_LLAMA_BLOB_HDR + 4 * 600, 0xff, true, KVS_LLAMA_BLOB_STATE},
      {"a state byte", KVS_LLAMA_BLOB_HDR + 4 * 600 + 500, 0x40, false, KVS_LLAMA_BLOB_CHECKSUM},
      {"a token", KVS_LLAMA_BLOB_HDR + 8, 1, false, KVS_LLAMA_BLOB_CHECKSUM},
      {"saved_ns", offsetof(kvs__llama_blob_hdr_t, saved_ns), 1, false, KVS_LLAMA_BLOB_CHECKSUM},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t *b = mkblob(600, 512, 1000, &len);
    b[cases[i].off] ^= cases[i].xor_;
    if (cases[i].reseal) blob_reseal(b, len);
    h = untouched;
    kvs__llama_blob_status_t st = check(b, len, &h);
    cr_expect_eq(st, cases[i].want, "%s: got %s", cases[i].what, kvs__llama_blob_status_name(st));
    cr_expect_eq(memcmp(&h, &untouched, sizeof h), 0, "%s: header written on failure",
                 cases[i].what);
    free(b);
  }
  uint8_t *b = mkblob(600, 512, 1000, &len);
  cr_expect_eq(check(b, len - 1, &h), KVS_LLAMA_BLOB_LENGTH, "truncated");
  cr_expect_eq(check(b, KVS_LLAMA_BLOB_HDR - 1, &h), KVS_LLAMA_BLOB_SHORT);
  cr_expect_eq(check(NULL, len, &h), KVS_LLAMA_BLOB_SHORT);
  free(b);
  b = mkblob(600, 768, 1000, &len);
  cr_expect_eq(check(b, len, &h), KVS_LLAMA_BLOB_KEYED, "keyed beyond the tokens");
  free(b);
  b = mkblob(600, 0, 1000, &len);
  cr_expect_eq(check(b, len, &h), KVS_LLAMA_BLOB_KEYED, "nothing keyed");
  free(b);
  b = mkblob(600, 512, 4, &len);
  cr_expect_eq(check(b, len, &h), KVS_LLAMA_BLOB_STATE, "state shorter than its header");
  free(b);
  for (int s = 0; s <= (int)KVS_LLAMA_BLOB_CHECKSUM; s++)
    cr_expect_neq(strcmp(kvs__llama_blob_status_name((kvs__llama_blob_status_t)s), "unknown"), 0);
}
