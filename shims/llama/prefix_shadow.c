/* shims/llama: the pure part of the prefix cache (prefix_shadow.h): the shadow of each
 * sequence, the batch rules and the restore plan. No engine, no store, no allocation, no
 * locking: the caller (prefix.c) holds its context's lock. */
#include "prefix_shadow.h"

#include <string.h>

#define PX_INF UINT32_MAX

/* ---- kernel-class rules ------------------------------------------------------------------------ */

bool kvs__px_restore_ok(const kvs__px_rules_t *r, uint32_t min_tokens, uint32_t n,
                        uint32_t canon, uint32_t m, uint32_t first_out, uint32_t k) {
  if (!r || !r->ubatch || !r->align || m == 0) return false;
  if (k % r->align != 0 || k <= n || k < min_tokens) return false;
  uint32_t s = k - n;
  if (s > first_out || s > m) return false; /* an output is never skipped */
  if (canon != n) return false;
  if (n % r->align != 0) return false;
  /* an unaligned n_ubatch (node-llama-cpp gives sliding-window models batch + 1) only when the
   * batch is one ubatch in both splits */
  if (r->ubatch < r->min_rows || (r->ubatch % r->align != 0 && m > r->ubatch)) return false;
  /* s == m: nothing is decoded; the engine's own split must have given every token of the
   * batch the canonical class (its last ubatch long; n and n + m aligned). */
  if (s == m) return kvs__px_last_ubatch(m, r->ubatch) >= r->min_rows;
  if (s % r->ubatch == 0) return true;
  return kvs__px_last_ubatch(m, r->ubatch) >= r->min_rows &&
         kvs__px_last_ubatch(m - s, r->ubatch) >= r->min_rows;
}

uint32_t kvs__px_canon_after(const kvs__px_rules_t *r, uint32_t n, uint32_t canon, uint32_t m) {
  if (canon != n || !r || !r->ubatch || !r->align) return canon;
  for (uint32_t off = 0; off < m; off += r->ubatch) {
    uint32_t rows = m - off < r->ubatch ? m - off : r->ubatch;
    if (rows < r->min_rows || (n + off) % r->align != 0) break;
    canon = n + off + rows;
  }
  return canon;
}

/* ---- the shadow -------------------------------------------------------------------------------- */

static void seq_clear(kvs__px_seq_t *q) { memset(q, 0, sizeof *q); }
static void seq_taint(kvs__px_seq_t *q) {
  memset(q, 0, sizeof *q);
  q->tainted = 1;
}

/* Sequences an operation on s touches: [*lo, *hi). */
static bool targets(const kvs__px_shadow_t *sh, int32_t s, uint32_t *lo, uint32_t *hi) {
  if (s < 0) {
    *lo = 0;
    *hi = sh->n_seq;
    return true;
  }
  if ((uint32_t)s >= sh->n_seq) return false;
  *lo = (uint32_t)s;
  *hi = (uint32_t)s + 1;
  return true;
}

static uint32_t lo_of(int32_t p0) { return p0 < 0 ? 0 : (uint32_t)p0; }
static uint32_t hi_of(int32_t p1) { return p1 < 0 ? PX_INF : (uint32_t)p1; }

void kvs__px_clear(kvs__px_shadow_t *sh, int32_t s) {
  uint32_t a, b;
  if (!targets(sh, s, &a, &b)) return;
  for (uint32_t i = a; i < b; i++) seq_clear(&sh->seq[i]);
}

void kvs__px_taint(kvs__px_shadow_t *sh, int32_t s) {
  uint32_t a, b;
  if (!targets(sh, s, &a, &b)) return;
  for (uint32_t i = a; i < b; i++) seq_taint(&sh->seq[i]);
}

/* Keep [0, len) of a CLEAN sequence. */
static void seq_truncate(kvs__px_seq_t *q, uint32_t len, uint32_t chunk) {
  if (len >= q->n) return;
  q->n = len;
  if (q->canon > len) q->canon = len;
  uint32_t whole = len / chunk * chunk;
  if (q->snap > whole) q->snap = whole;
  if (q->nkeys > len / chunk) q->nkeys = len / chunk;
}

void kvs__px_rm(kvs__px_shadow_t *sh, int32_t s, int32_t p0, int32_t p1) {
  uint32_t a, b, lo = lo_of(p0), hi = hi_of(p1);
  if (!targets(sh, s, &a, &b) || lo >= hi) return;
  for (uint32_t i = a; i < b; i++) {
    kvs__px_seq_t *q = &sh->seq[i];
    if (q->tainted) {
      if (lo == 0 && hi == PX_INF) seq_clear(q); /* all of it, whatever it held */
      continue;
    }
    if (lo >= q->n) continue;          /* nothing there */
    if (hi >= q->n) seq_truncate(q, lo, sh->chunk);
    else seq_taint(q);                  /* a hole: positions no longer 0..n-1 */
  }
}

void kvs__px_cp(kvs__px_shadow_t *sh, int32_t src, int32_t dst, int32_t p0, int32_t p1) {
  if (src == dst) return;
  if (dst < 0 || (uint32_t)dst >= sh->n_seq) {
    kvs__px_taint(sh, -1); /* llama.cpp would not accept it; trust nothing */
    return;
  }
  kvs__px_seq_t *d = &sh->seq[dst];
  if (src < 0 || (uint32_t)src >= sh->n_seq) {
    seq_taint(d);
    return;
  }
  const kvs__px_seq_t *q = &sh->seq[src];
  uint32_t lo = lo_of(p0), hi = hi_of(p1);
  if (!q->tainted && (lo >= hi || lo >= q->n)) return; /* no cell is copied */
  if (q->tainted || d->tainted || d->n != 0 || lo != 0) {
    seq_taint(d);
    return;
  }
  uint32_t len = hi < q->n ? hi : q->n;
  memcpy(kvs__px_tok(sh, (uint32_t)dst), kvs__px_tok(sh, (uint32_t)src), (size_t)len * 4);
  d->n = len;
  d->canon = q->canon < len ? q->canon : len;
  uint32_t whole = len / sh->chunk * sh->chunk;
  d->snap = q->snap < whole ? q->snap : whole;
  d->nkeys = q->nkeys < len / sh->chunk ? q->nkeys : len / sh->chunk;
  if (d->nkeys)
    memcpy(kvs__px_keys(sh, (uint32_t)dst), kvs__px_keys(sh, (uint32_t)src),
           (size_t)d->nkeys * sizeof(kvs_key_t));
}

void kvs__px_keep(kvs__px_shadow_t *sh, int32_t s) {
  for (uint32_t i = 0; i < sh->n_seq; i++)
    if (s < 0 || i != (uint32_t)s) seq_clear(&sh->seq[i]);
}

/* Positions of [lo, hi) move: a sequence with a cell there is no longer a plain prefix. */
static void shift(kvs__px_shadow_t *sh, int32_t s, int32_t p0, int32_t p1) {
  uint32_t a, b, lo = lo_of(p0), hi = hi_of(p1);
  if (!targets(sh, s, &a, &b) || lo >= hi) return;
  for (uint32_t i = a; i < b; i++) {
    kvs__px_seq_t *q = &sh->seq[i];
    if (!q->tainted && lo < q->n) seq_taint(q);
  }
}

void kvs__px_add(kvs__px_shadow_t *sh, int32_t s, int32_t p0, int32_t p1, int32_t delta) {
  if (delta != 0) shift(sh, s, p0, p1);
}

void kvs__px_div(kvs__px_shadow_t *sh, int32_t s, int32_t p0, int32_t p1, int d) {
  if (d != 1) shift(sh, s, p0, p1);
}

/* ---- batches ----------------------------------------------------------------------------------- */

static int32_t n_ids(const kvs__llama_batch_t *b, int32_t i) {
  return b->n_seq_id ? b->n_seq_id[i] : 1;
}
static int32_t id_of(const kvs__llama_batch_t *b, int32_t i, int32_t j) {
  return b->seq_id ? b->seq_id[i][j] : 0;
}

void kvs__px_batch_scan(const kvs__llama_batch_t *b, uint32_t n_seq, bool embeddings,
                        kvs__px_batch_info_t *out) {
  memset(out, 0, sizeof *out);
  out->seq = -1;
  int32_t m = b->n_tokens;
  if (m <= 0) return;
  out->valid = 1;
  out->has_tokens = b->token != NULL;
  out->single = 1;
  for (int32_t i = 0; i < m && out->valid; i++) {
    int32_t ns = n_ids(b, i);
    if (ns < 1 || (uint32_t)ns > n_seq || (b->n_seq_id && !b->seq_id)) {
      out->valid = 0;
      break;
    }
    for (int32_t j = 0; j < ns; j++) {
      int32_t id = id_of(b, i, j);
      if (id < 0 || (uint32_t)id >= n_seq) {
        out->valid = 0;
        break;
      }
    }
    if (!out->valid) break;
    if (ns != 1) out->single = 0;
    else if (out->seq < 0) out->seq = id_of(b, i, 0);
    else if (id_of(b, i, 0) != out->seq) out->single = 0;
  }
  if (!out->valid) {
    out->single = 0;
    out->seq = -1;
    return;
  }
  if (!out->single) out->seq = -1;
  if (embeddings) {
    out->first_out = 0;
    out->last_out = 1;
  } else if (!b->logits) {
    out->first_out = (uint32_t)m - 1;
    out->last_out = 1;
  } else {
    out->first_out = (uint32_t)m;
    for (int32_t i = 0; i < m; i++)
      if (b->logits[i]) {
        out->first_out = (uint32_t)i;
        break;
      }
    out->last_out = b->logits[m - 1] != 0;
  }
}

void kvs__px_batch_apply(kvs__px_shadow_t *sh, const kvs__llama_batch_t *b,
                         const kvs__px_batch_info_t *bi, const int32_t *p0,
                         const kvs__px_rules_t *rules) {
  if (!bi->valid) {
    kvs__px_taint(sh, -1); /* decoded although we could not read it: trust nothing */
    return;
  }
  int32_t m = b->n_tokens;
  if (!bi->has_tokens) {
    for (int32_t i = 0; i < m; i++)
      for (int32_t j = 0; j < n_ids(b, i); j++) kvs__px_taint(sh, id_of(b, i, j));
    return;
  }
  uint32_t n0 = 0, canon0 = 0;
  if (bi->single && !sh->seq[bi->seq].tainted) {
    n0 = sh->seq[bi->seq].n;
    canon0 = sh->seq[bi->seq].canon;
  }
  int32_t next[KVS_PX_MAX_SEQ];
  if (!b->pos)
    for (uint32_t s = 0; s < sh->n_seq; s++) next[s] = p0 ? p0[s] : -1;
  for (int32_t i = 0; i < m; i++) {
    int32_t ns = n_ids(b, i);
    int32_t pos = b->pos ? b->pos[i] : next[id_of(b, i, 0)];
    for (int32_t j = 0; j < ns; j++) {
      int32_t id = id_of(b, i, j);
      if (!b->pos) next[id] = pos + 1;
      kvs__px_seq_t *q = &sh->seq[id];
      if (q->tainted) continue;
      if (pos < 0 || (uint32_t)pos != q->n || q->n >= sh->cap) {
        seq_taint(q);
        continue;
      }
      kvs__px_tok(sh, (uint32_t)id)[q->n++] = b->token[i];
    }
  }
  if (bi->single) {
    kvs__px_seq_t *q = &sh->seq[bi->seq];
    if (!q->tainted && q->n == n0 + (uint32_t)m)
      q->canon = kvs__px_canon_after(rules, n0, canon0, (uint32_t)m);
  }
}

void kvs__px_keys_compute(kvs__px_shadow_t *sh, uint32_t s, kvs_key_t ns, uint32_t from,
                          uint32_t upto) {
  kvs_key_t *keys = kvs__px_keys(sh, s);
  const uint32_t *tok = (const uint32_t *)(const void *)kvs__px_tok(sh, s);
  kvs_key_t prev = from ? keys[from - 1] : ns;
  for (uint32_t j = from; j < upto && j < sh->kcap; j++) {
    prev = kvs_keys_chain(prev, tok + (size_t)j * sh->chunk, sh->chunk);
    keys[j] = prev;
  }
}
