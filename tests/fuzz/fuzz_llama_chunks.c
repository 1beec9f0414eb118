/* libFuzzer harness for the chunk codec (shims/llama/chunks.c, design §10.4): the splitter and
 * the assembler. The first byte picks the mode:
 *   even  the rest is a sequence state: kvs__llama_chunks_scan; when splittable, split into a
 *         frame and chunks of CHUNK tokens and assemble them back;
 *   odd   the rest is u32 frame length, frame, then (u32 length, chunk) pairs: assembled as
 *         they are, then again with the frame's and every chunk's checksum (and the chunks'
 *         frame_id) rewritten to the right values, so mutated fields get past the checksums to
 *         the checks behind them.
 * Properties (abort() = a finding): nothing reads outside the input (ASan: inputs are copied
 * into exactly-sized heap buffers); every status has a name; a refused scan leaves *out
 * untouched and a refused assembly writes nothing (but a checksum refusal, chunks.h); a split
 * state assembles back to exactly its bytes, and its first j chunks to a state of j * CHUNK
 * tokens (kvs__llama_chunks_state_size of it) that, unless it reads more than one way, scans
 * as splittable again and splits into the same chunks; the first p tokens of a chunk taken
 * with the whole chunks before it (last_n, the continuation chunk) give the state that the
 * split of the first j * CHUNK + p tokens (a short last chunk) assembles to; an assembled
 * state scans as splittable
 * with the chunks' token count (or as ambiguous, never as a bad layout or cells).
 * Seeds: tests/fuzz/corpus/fuzz_llama_chunks/ (gen_llama_corpus.c: states with rows and with
 * transposed V, and a frame with its chunks). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h" /* kvs__llama_hash */
#include "chunks.h"
#include "runtime.h"

#define CHUNK 4u
#define MAX_CH 64u
static const kvs_key_t NS = {0x1111111111111111ull, 0x2222222222222222ull};

/* blob.c (kvs__llama_hash) is linked without the runtime; its flows are never called. */
__thread int kvs__hook_depth;
uint64_t kvs__runtime_cache_peer(kvs__runtime_t *rt) {
  (void)rt;
  return 0;
}

#define CHECK(x)                                                                              \
  do {                                                                                        \
    if (!(x)) abort();                                                                        \
  } while (0)

static void named(kvs__llama_chunks_status_t s) {
  CHECK(strcmp(kvs__llama_chunks_status_name(s), "unknown") != 0);
}

static void split_mode(const uint8_t *st, size_t len) {
  kvs__llama_chunks_scan_t sc, before;
  memset(&sc, 0x5a, sizeof sc);
  before = sc;
  kvs__llama_chunks_status_t r = kvs__llama_chunks_scan(st, len, &sc);
  named(r);
  if (r != KVS_LLAMA_CHUNKS_OK) {
    CHECK(memcmp(&sc, &before, sizeof sc) == 0);
    return;
  }
  uint32_t nch = (sc.n_cells + CHUNK - 1) / CHUNK;
  if (nch > MAX_CH || sc.n_cells > 4096) return;
  uint8_t *frame = malloc((size_t)sc.frame_size);
  int32_t *tok = calloc(sc.n_cells, 4);
  uint64_t id = kvs__llama_chunks_frame(st, &sc, CHUNK, NS, frame, (size_t)sc.frame_size);
  CHECK(id != 0);
  CHECK(kvs__llama_frame_check(frame, (size_t)sc.frame_size, CHUNK, NS, NULL) ==
        KVS_LLAMA_CHUNKS_OK);
  uint8_t *ch[MAX_CH];
  size_t chlen[MAX_CH];
  for (uint32_t c = 0; c < nch; c++) {
    tok[c * CHUNK] = (int32_t)c;
    chlen[c] = (size_t)kvs__llama_chunk_size(&sc, CHUNK, sc.n_cells, c);
    CHECK(chlen[c] > 0);
    ch[c] = malloc(chlen[c]);
    CHECK(kvs__llama_chunk_write(st, &sc, tok, CHUNK, sc.n_cells, c, frame, NS, ch[c], chlen[c]) ==
          KVS_LLAMA_CHUNKS_OK);
  }
  CHECK(kvs__llama_chunk_size(&sc, CHUNK, sc.n_cells, nch) == 0);
  for (uint32_t c = 0; c < nch; c++) { /* direct snapshots: planned, written, finished */
    kvs__llama_run_t runs[64];
    kvs__llama_defer_t d = {runs, 64, 0, 16, 0};
    uint8_t *dst = malloc(chlen[c]);
    kvs__llama_chunks_status_t pr = kvs__llama_chunk_plan(frame, sc.n_cells, sc.seq, CHUNK,
                                                          sc.n_cells, c, st, dst, chlen[c], &d);
    CHECK(pr == KVS_LLAMA_CHUNKS_OK || pr == KVS_LLAMA_CHUNKS_FIELD); /* FIELD: over 64 runs */
    if (pr == KVS_LLAMA_CHUNKS_OK) {
      for (uint32_t i = 0; i < d.n; i++) {
        CHECK(runs[i].len >= 16 && runs[i].off + runs[i].len <= len &&
              runs[i].chunk >= dst && runs[i].chunk + runs[i].len <= dst + chlen[c]);
        memcpy(runs[i].chunk, st + runs[i].off, (size_t)runs[i].len);
      }
      CHECK(kvs__llama_chunk_finish(st, &sc, tok, CHUNK, sc.n_cells, c, frame, NS, dst, chlen[c],
                                    16) == KVS_LLAMA_CHUNKS_OK);
      CHECK(memcmp(dst, ch[c], chlen[c]) == 0);
      /* its tokens as a range nobody reads: the same runs, no destination */
      kvs__llama_run_t none[64];
      kvs__llama_defer_t dn = {none, 64, 0, 16, 0};
      const uint64_t first = (uint64_t)c * CHUNK;
      const uint64_t n = sc.n_cells - first < CHUNK ? sc.n_cells - first : CHUNK;
      CHECK(kvs__llama_plan_drop(frame, sc.n_cells, sc.seq, first, n, st, &dn) ==
            KVS_LLAMA_CHUNKS_OK);
      CHECK(dn.n == d.n && dn.bytes == d.bytes);
      for (uint32_t i = 0; i < d.n; i++)
        CHECK(!none[i].chunk && none[i].off == runs[i].off && none[i].len == runs[i].len);
    }
    free(dst);
  }
  uint8_t *out = malloc(len);
  size_t got = 0;
  CHECK(kvs__llama_chunks_assemble(frame, (size_t)sc.frame_size, CHUNK, NS,
                                   (const uint8_t *const *)ch, chlen, nch, 0, sc.seq, out, len,
                                   &got, NULL) == KVS_LLAMA_CHUNKS_OK);
  CHECK(got == len && memcmp(out, st, len) == 0);
  { /* the runs of at least 16 bytes left in the chunks (at most 64; direct loads): the other
     * bytes written, the runs sorted and disjoint, and in place they give the state again */
    kvs__llama_run_t runs[64];
    kvs__llama_defer_t d = {runs, 64, 0, 16, 0};
    memset(out, 0xa5, len);
    CHECK(kvs__llama_chunks_assemble(frame, (size_t)sc.frame_size, CHUNK, NS,
                                     (const uint8_t *const *)ch, chlen, nch, 0, sc.seq, out, len,
                                     &got, &d) == KVS_LLAMA_CHUNKS_OK);
    uint64_t sum = 0, end = 0;
    for (uint32_t i = 0; i < d.n; i++) {
      CHECK(runs[i].len >= 16 && runs[i].off >= end && runs[i].off + runs[i].len <= len);
      end = runs[i].off + runs[i].len;
      memcpy(out + runs[i].off, runs[i].chunk, (size_t)runs[i].len);
      sum += runs[i].len;
    }
    CHECK(sum == d.bytes && got == len && memcmp(out, st, len) == 0);
  }
  for (uint32_t j = 1; j < nch; j++) { /* every prefix of whole chunks */
    size_t want = (size_t)kvs__llama_chunks_state_size(frame, (uint64_t)j * CHUNK);
    CHECK(want > 0 && want < len);
    CHECK(kvs__llama_chunks_assemble(frame, (size_t)sc.frame_size, CHUNK, NS,
                                     (const uint8_t *const *)ch, chlen, j, 0, sc.seq, out, want,
                                     &got, NULL) == KVS_LLAMA_CHUNKS_OK);
    CHECK(got == want);
    uint8_t *pre = malloc(got);
    memcpy(pre, out, got);
    kvs__llama_chunks_scan_t ps;
    /* a shorter state may read more than one way (then it is not split again: LAYOUT) */
    kvs__llama_chunks_status_t pr = kvs__llama_chunks_scan(pre, got, &ps);
    CHECK(pr == KVS_LLAMA_CHUNKS_OK || pr == KVS_LLAMA_CHUNKS_LAYOUT);
    if (pr == KVS_LLAMA_CHUNKS_OK)
      CHECK(ps.n_cells == j * CHUNK && ps.cell_bytes == sc.cell_bytes);
    uint8_t *again = malloc(chlen[0]);
    for (uint32_t c = 0; pr == KVS_LLAMA_CHUNKS_OK && c < j; c++) {
      CHECK(kvs__llama_chunk_write(pre, &ps, tok, CHUNK, ps.n_cells, c, frame, NS, again, chlen[0]) ==
            KVS_LLAMA_CHUNKS_OK);
      CHECK(memcmp(again, ch[c], chlen[c]) == 0);
    }
    free(again);
    free(pre);
    /* j whole chunks, then p tokens of chunk j (last_n) == the split of the first j CHUNK + p
     * tokens, whose chunk j is short (upto), assembled whole */
    for (uint32_t p = 1; j + 1 <= nch && p < CHUNK && (uint64_t)j * CHUNK + p <= sc.n_cells;
         p += CHUNK - 2) {
      uint32_t upto = j * CHUNK + p;
      size_t sz = (size_t)kvs__llama_chunks_state_size(frame, upto);
      uint8_t *part = malloc(sz), *whole = malloc(sz);
      size_t g1 = 0, g2 = 0;
      CHECK(kvs__llama_chunks_assemble(frame, (size_t)sc.frame_size, CHUNK, NS,
                                       (const uint8_t *const *)ch, chlen, j + 1, p, sc.seq,
                                       part, sz, &g1, NULL) == KVS_LLAMA_CHUNKS_OK);
      size_t tl = (size_t)kvs__llama_chunk_size(&sc, CHUNK, upto, j);
      CHECK(tl > 0 && tl <= chlen[j]);
      uint8_t *tail = malloc(tl);
      CHECK(kvs__llama_chunk_write(st, &sc, tok, CHUNK, upto, j, frame, NS, tail, tl) ==
            KVS_LLAMA_CHUNKS_OK);
      const uint8_t *mix[MAX_CH];
      size_t mixlen[MAX_CH];
      for (uint32_t c = 0; c < j; c++) mix[c] = ch[c], mixlen[c] = chlen[c];
      mix[j] = tail;
      mixlen[j] = tl;
      CHECK(kvs__llama_chunks_assemble(frame, (size_t)sc.frame_size, CHUNK, NS, mix, mixlen,
                                       j + 1, 0, sc.seq, whole, sz, &g2, NULL) == KVS_LLAMA_CHUNKS_OK);
      CHECK(g1 == sz && g2 == sz && memcmp(part, whole, sz) == 0);
      /* more tokens than the chunk holds: refused */
      CHECK(kvs__llama_chunks_assemble(frame, (size_t)sc.frame_size, CHUNK, NS, mix, mixlen,
                                       j + 1, p + 1, sc.seq, whole, sz, &g2, NULL) ==
            KVS_LLAMA_CHUNKS_FIELD);
      free(tail);
      free(part);
      free(whole);
    }
  }
  free(out);
  for (uint32_t c = 0; c < nch; c++) free(ch[c]);
  free(tok);
  free(frame);
}

/* The checksum chunks.c seals frames and chunks with (chunks.h). */
static uint64_t seeded(const uint8_t *o, size_t csum, size_t hdr, size_t len) {
  return kvs__llama_hash(o + hdr, len - hdr, kvs__llama_hash(o, csum, 0));
}

static void assemble_mode(const uint8_t *d, size_t n, bool fix) {
  if (n < 4) return;
  uint32_t flen;
  memcpy(&flen, d, 4);
  d += 4;
  n -= 4;
  if (flen > n) return;
  uint8_t *frame = malloc(flen ? flen : 1);
  memcpy(frame, d, flen);
  d += flen;
  n -= flen;
  uint8_t *ch[MAX_CH];
  size_t chlen[MAX_CH];
  uint32_t nch = 0;
  while (n >= 4 && nch < MAX_CH) {
    uint32_t l;
    memcpy(&l, d, 4);
    d += 4;
    n -= 4;
    if (l > n) break;
    ch[nch] = malloc(l ? l : 1);
    memcpy(ch[nch], d, l);
    chlen[nch++] = l;
    d += l;
    n -= l;
  }
  if (fix && flen >= sizeof(kvs__llama_frame_hdr_t)) {
    size_t cs = offsetof(kvs__llama_frame_hdr_t, checksum);
    uint64_t fc = seeded(frame, cs, sizeof(kvs__llama_frame_hdr_t), flen);
    memcpy(frame + cs, &fc, 8);
    for (uint32_t i = 0; i < nch; i++) {
      if (chlen[i] < sizeof(kvs__llama_chunk_hdr_t)) continue;
      memcpy(ch[i] + offsetof(kvs__llama_chunk_hdr_t, frame_id), &fc, 8);
      size_t cc = offsetof(kvs__llama_chunk_hdr_t, checksum);
      uint64_t c = seeded(ch[i], cc, sizeof(kvs__llama_chunk_hdr_t), chlen[i]);
      memcpy(ch[i] + cc, &c, 8);
    }
  }
  size_t cap = 1u << 16;
  uint8_t *out = malloc(cap);
  memset(out, 0xa5, cap);
  size_t got = 7;
  const uint32_t last_n = nch % 2; /* odd: only the last chunk's first token */
  kvs__llama_chunks_status_t r =
      kvs__llama_chunks_assemble(frame, flen, CHUNK, NS, (const uint8_t *const *)ch, chlen, nch,
                                 last_n, (int32_t)(nch % 3), out, cap, &got, NULL);
  named(r);
  if (r != KVS_LLAMA_CHUNKS_OK) {
    CHECK(got == 7);
    /* CHECKSUM is found while copying (chunks.h): the chunks before the damaged one wrote */
    for (size_t i = 0; r != KVS_LLAMA_CHUNKS_CHECKSUM && i < cap; i += 61) CHECK(out[i] == 0xa5);
  } else {
    uint64_t toks = 0;
    for (uint32_t i = 0; i < nch; i++) {
      uint32_t t;
      memcpy(&t, ch[i] + offsetof(kvs__llama_chunk_hdr_t, n_tokens), 4);
      toks += i + 1 == nch && last_n ? last_n : t;
    }
    CHECK(got == kvs__llama_chunks_state_size(frame, toks));
    uint8_t *st = malloc(got);
    memcpy(st, out, got);
    kvs__llama_chunks_scan_t sc;
    kvs__llama_chunks_status_t sr = kvs__llama_chunks_scan(st, got, &sc);
    CHECK(sr == KVS_LLAMA_CHUNKS_OK || sr == KVS_LLAMA_CHUNKS_LAYOUT); /* LAYOUT: ambiguous */
    if (sr == KVS_LLAMA_CHUNKS_OK) CHECK(sc.n_cells == toks && sc.seq == (int32_t)(nch % 3));
    free(st);
  }
  free(out);
  for (uint32_t i = 0; i < nch; i++) free(ch[i]);
  free(frame);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t *d = malloc(size - 1 ? size - 1 : 1);
  memcpy(d, data + 1, size - 1);
  if ((data[0] & 1) == 0) {
    split_mode(d, size - 1);
  } else {
    assemble_mode(d, size - 1, false);
    assemble_mode(d, size - 1, true);
  }
  free(d);
  return 0;
}
