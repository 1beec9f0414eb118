/* shims/llama: a sequence state split into a frame and chunk objects, and assembled back
 * (chunks.h; the format in design §10.4). Every read of a state, frame or chunk is bounds-checked
 * before it happens; nothing is written to a destination before its inputs passed every check. */
#include "chunks.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "blob.h" /* KVS_LLAMA_STATE_MAGIC, kvs__llama_hash */

/* ---- reading --------------------------------------------------------------------------------- */

typedef struct rd {
  const uint8_t *p;
  size_t len, off;
  bool bad; /* a read past len happened: every later read fails too */
} rd_t;

static const uint8_t *rd_take(rd_t *r, uint64_t n) {
  if (r->bad || n > r->len - r->off) {
    r->bad = true;
    return NULL;
  }
  const uint8_t *q = r->p + r->off;
  r->off += (size_t)n;
  return q;
}
static uint32_t rd_u32(rd_t *r) {
  const uint8_t *q = rd_take(r, 4);
  uint32_t v = 0;
  if (q) memcpy(&v, q, 4);
  return v;
}
static uint64_t rd_u64(rd_t *r) {
  const uint8_t *q = rd_take(r, 8);
  uint64_t v = 0;
  if (q) memcpy(&v, q, 8);
  return v;
}
/* Skip n cells of rows of row bytes each (n * row checked against what is left). */
static void rd_rows(rd_t *r, uint64_t n, uint64_t row) {
  if (r->bad || (row && n > (r->len - r->off) / row)) {
    r->bad = true;
    return;
  }
  rd_take(r, n * row);
}

static bool type_ok(int32_t t) { return t >= 0 && t < KVS_LLAMA_CHUNKS_MAX_TYPE; }
static bool row_ok(uint64_t row) { return row > 0 && row <= KVS_LLAMA_CHUNKS_MAX_ROW; }
/* v_trans 1: el bytes per element (a ggml type size: at most a few hundred bytes per block),
 * n_embd elements per cell. */
static bool vt_ok(uint32_t el, uint32_t embd) {
  return el > 0 && el <= 4096 && embd > 0 && (uint64_t)el * embd <= KVS_LLAMA_CHUNKS_MAX_ROW;
}

/* Meta bytes per cell of a single-sequence state: pos, n_seq_id, [ext], one seq id. */
static uint64_t meta_bytes(uint32_t flags) {
  return 12 + ((flags & KVS_LLAMA_FRAME_EXT) ? KVS_LLAMA_CELL_EXT : 0);
}

/* The stream the engine writes sequence seq into (llama-kv-cache.cpp:147-155). */
static uint32_t stream_of(uint32_t n_stream, int32_t seq) {
  return n_stream == 1 ? 0 : (uint32_t)seq;
}

/* Read the whole state under one reading of the format (flags: ext, has_v). OK (splittable,
 * *sc filled), CELLS (it reads, but is not one sequence at 0..n-1), LAYOUT (it does not read). */
static kvs__llama_chunks_status_t read_as(const uint8_t *p, size_t len, uint32_t flags,
                                          kvs__llama_chunks_scan_t *sc) {
  rd_t r = {p, len, 8, false};
  int32_t seq;
  memcpy(&seq, p + 4, 4);
  bool split = seq >= 0;
  uint64_t mb = meta_bytes(flags);
  kvs__llama_chunks_scan_t s;
  memset(&s, 0, sizeof s);
  s.seq = seq;
  s.flags = flags;
  bool have_n = false;
  while (r.off < len) {
    if (s.n_sections == KVS_LLAMA_CHUNKS_MAX_SECTIONS) return KVS_LLAMA_CHUNKS_LAYOUT;
    s.sec_off[s.n_sections] = r.off;
    uint32_t n_stream = rd_u32(&r);
    if (r.bad || n_stream == 0 || n_stream > KVS_LLAMA_CHUNKS_MAX_STREAMS)
      return KVS_LLAMA_CHUNKS_LAYOUT;
    uint32_t filled = 0, cells = 0;
    for (uint32_t st = 0; st < n_stream; st++) {
      uint32_t cc = rd_u32(&r);
      if (r.bad || cc > KVS_LLAMA_CHUNKS_MAX_CELLS) return KVS_LLAMA_CHUNKS_LAYOUT;
      if (cc == 0) continue;
      if (filled++ || !split || st != stream_of(n_stream, seq)) split = false;
      cells = cc;
      if ((uint64_t)cc > (len - r.off) / mb) return KVS_LLAMA_CHUNKS_LAYOUT;
      for (uint32_t i = 0; i < cc; i++) {
        const uint8_t *m = rd_take(&r, mb);
        int32_t pos, sid;
        uint32_t nsid;
        memcpy(&pos, m, 4);
        memcpy(&nsid, m + 4, 4);
        memcpy(&sid, m + mb - 4, 4);
        /* a state of one sequence names it once per cell (state_write_meta) */
        if (nsid != 1) return KVS_LLAMA_CHUNKS_LAYOUT;
        if (pos != (int32_t)i || sid != seq) split = false;
      }
      uint32_t v_trans = rd_u32(&r), n_layer = rd_u32(&r);
      if (r.bad || v_trans > 1 || n_layer == 0 || n_layer > KVS_LLAMA_CHUNKS_MAX_LAYERS)
        return KVS_LLAMA_CHUNKS_LAYOUT;
      uint64_t cb = (flags & KVS_LLAMA_FRAME_EXT) ? KVS_LLAMA_CELL_EXT : 0;
      for (uint32_t l = 0; l < n_layer; l++) {
        int32_t t = (int32_t)rd_u32(&r);
        uint64_t row = rd_u64(&r);
        if (r.bad || !type_ok(t) || !row_ok(row)) return KVS_LLAMA_CHUNKS_LAYOUT;
        rd_rows(&r, cc, row);
        cb += row;
      }
      for (uint32_t l = 0; (flags & KVS_LLAMA_FRAME_HAS_V) && l < n_layer; l++) {
        int32_t t = (int32_t)rd_u32(&r);
        uint64_t vc;
        if (v_trans) {
          uint32_t el = rd_u32(&r), embd = rd_u32(&r);
          if (r.bad || !type_ok(t) || !vt_ok(el, embd)) return KVS_LLAMA_CHUNKS_LAYOUT;
          vc = (uint64_t)el * embd;
        } else {
          vc = rd_u64(&r);
          if (r.bad || !type_ok(t) || !row_ok(vc)) return KVS_LLAMA_CHUNKS_LAYOUT;
        }
        rd_rows(&r, cc, vc);
        cb += vc;
      }
      if (r.bad) return KVS_LLAMA_CHUNKS_LAYOUT;
      if (filled == 1) { /* the first filled stream's layout is the section's */
        s.cell_bytes += cb;
        s.n_layers += n_layer;
      }
    }
    if (filled == 0 || (have_n && cells != s.n_cells)) split = false;
    s.n_cells = cells;
    have_n = true;
    s.n_sections++;
  }
  if (s.n_sections == 0) return KVS_LLAMA_CHUNKS_LAYOUT;
  if (s.cell_bytes > KVS_LLAMA_CHUNKS_MAX_CELL) split = false;
  if (!split) return KVS_LLAMA_CHUNKS_CELLS;
  s.frame_size = sizeof(kvs__llama_frame_hdr_t) +
                 s.n_sections * sizeof(kvs__llama_frame_sec_t) +
                 (uint64_t)s.n_layers * sizeof(kvs__llama_frame_layer_t);
  *sc = s;
  return KVS_LLAMA_CHUNKS_OK;
}

kvs__llama_chunks_status_t kvs__llama_chunks_scan(const uint8_t *state, size_t len,
                                                  kvs__llama_chunks_scan_t *out) {
  uint32_t magic = 0;
  if (!state || len < KVS_LLAMA_STATE_HDR) return KVS_LLAMA_CHUNKS_FOREIGN;
  memcpy(&magic, state, 4);
  if (magic != KVS_LLAMA_STATE_MAGIC) return KVS_LLAMA_CHUNKS_FOREIGN;
  /* The four readings; exactly one must read the state to its end. */
  static const uint32_t readings[] = {KVS_LLAMA_FRAME_HAS_V, 0,
                                      KVS_LLAMA_FRAME_HAS_V | KVS_LLAMA_FRAME_EXT,
                                      KVS_LLAMA_FRAME_EXT};
  kvs__llama_chunks_scan_t found, s;
  unsigned reads = 0;
  kvs__llama_chunks_status_t st = KVS_LLAMA_CHUNKS_LAYOUT;
  for (size_t i = 0; i < sizeof readings / sizeof readings[0]; i++) {
    kvs__llama_chunks_status_t r = read_as(state, len, readings[i], &s);
    if (r == KVS_LLAMA_CHUNKS_LAYOUT) continue;
    reads++;
    st = r;
    if (r == KVS_LLAMA_CHUNKS_OK) found = s;
  }
  if (reads != 1) return KVS_LLAMA_CHUNKS_LAYOUT; /* none, or ambiguous */
  if (st == KVS_LLAMA_CHUNKS_OK) *out = found;
  return st;
}

/* ---- the walk shared by the frame and the chunk writer --------------------------------------- */

/* Offset of the first filled stream's v_trans in section i of a scanned state (its n_stream,
 * the stream counts before it and the cells' meta are skipped: scan checked them). */
static size_t sec_data(const uint8_t *state, const kvs__llama_chunks_scan_t *sc, uint32_t i,
                       size_t *meta_off) {
  uint32_t n_stream;
  size_t off = (size_t)sc->sec_off[i];
  memcpy(&n_stream, state + off, 4);
  off += 4 + 4 * ((size_t)stream_of(n_stream, sc->seq) + 1);
  *meta_off = off;
  return off + (size_t)sc->n_cells * meta_bytes(sc->flags);
}

static uint64_t seeded(const uint8_t *obj, size_t csum_off, size_t hdr, size_t len) {
  uint64_t h = kvs__llama_hash(obj, csum_off, 0);
  return kvs__llama_hash(obj + hdr, len - hdr, h);
}

static uint8_t *put_u32(uint8_t *o, uint32_t v) {
  memcpy(o, &v, 4);
  return o + 4;
}
static uint8_t *put_u64(uint8_t *o, uint64_t v) {
  memcpy(o, &v, 8);
  return o + 8;
}

/* How lay_out moves a run: out of the state (split), or into it (assembling). Splitting, a run
 * of at least `min` bytes is already in the chunk (the engine wrote it there: a direct
 * snapshot), or, planning, recorded in defer for the engine to write there. Assembling, a run of
 * at least defer->min bytes is recorded in defer instead of copied (a direct load). Runs are
 * recorded against the state at `state` (design §10.4). */
typedef struct mover {
  bool split, plan;
  bool drop; /* planning runs nobody writes (kvs__llama_plan_drop): recorded with chunk NULL */
  uint64_t min; /* splitting: runs this long are in the chunk already (UINT64_MAX: none) */
  kvs__llama_defer_t *defer;
  const uint8_t *state;
} mover_t;

/* Record run [st, st + len) of the state as chunk[0, len) in d; false when there is no room. */
static bool record(kvs__llama_defer_t *d, const mover_t *m, uint8_t *st, uint8_t *chunk,
                   uint64_t len) {
  if (d->n >= d->cap) return false;
  d->runs[d->n++] = (kvs__llama_run_t){(uint64_t)(st - m->state), len, m->drop ? NULL : chunk};
  d->bytes += len;
  return true;
}

/* Move len bytes between a place in the state (st) and the chunk's payload (pl). */
static void mv(const mover_t *m, uint8_t *st, uint8_t *pl, uint64_t len) {
  kvs__llama_defer_t *d = m->defer;
  if (m->split) {
    if (len < m->min) {
      if (!m->plan) memcpy(pl, st, (size_t)len);
    } else if (m->plan && !record(d, m, st, pl, len)) {
      d->cap = 0; /* no room: the plan is refused (kvs__llama_chunk_plan) */
    }
    return;
  }
  if (d && len && len >= d->min && record(d, m, st, pl, len)) return;
  memcpy(st, pl, (size_t)len);
}

/* The one walk of a state's layout by its frame, shared by the splitter and the assembler: the
 * state of sequence seq holding N tokens in frame f (checked) at state. With pl NULL, write all
 * of the state but the per-token payload (the state header, stream counts, cell metadata but
 * its ext, the section and layer headers). Else move tokens [a, a + n) between their places in
 * the state and the payload pl of a chunk of `held` tokens (n <= held; in the payload's order:
 * per section ext, K per layer, V per layer, each a run of `held` cells of which the first n
 * move): out of the state (split, n == held; the state is only read) or into it (a partial
 * continuation chunk moves its first n). With hs, each run or block of the payload (an ext run,
 * a layer's K run, a layer's V run or transposed block: all of it, in order) is hashed into hs
 * while it is in cache: assembling, just before its cells move out of it; splitting, just after
 * they moved into it. hs then holds the hash of the whole payload. Returns the end of the
 * state. */
/* blk_hash(.., false, ..) before a payload block's cells move, (.., true, ..) after: hashes it
 * into hs (when given) at the moment lay_out's comment says. */
static void blk_hash(kvs__llama_hasher_t *hs, const mover_t *m, bool after, const uint8_t *p,
                     uint64_t len) {
  if (hs && after == m->split) kvs__llama_hasher_update(hs, p, (size_t)len);
}

static uint8_t *lay_out(const uint8_t *f, uint64_t N, int32_t seq, uint8_t *state, uint8_t *pl,
                        uint64_t a, uint64_t n, uint64_t held, const mover_t *m,
                        kvs__llama_hasher_t *hs) {
  kvs__llama_frame_hdr_t fh;
  memcpy(&fh, f, sizeof fh);
  const bool ext = (fh.flags & KVS_LLAMA_FRAME_EXT) != 0;
  const bool has_v = (fh.flags & KVS_LLAMA_FRAME_HAS_V) != 0;
  const uint64_t mb = meta_bytes(fh.flags);
  const uint8_t *lay = f + sizeof fh + fh.n_sections * sizeof(kvs__llama_frame_sec_t);
  uint8_t *o = state + 8;
  if (!pl) put_u32(put_u32(state, KVS_LLAMA_STATE_MAGIC), (uint32_t)seq);
  for (uint32_t i = 0; i < fh.n_sections; i++) {
    kvs__llama_frame_sec_t s;
    memcpy(&s, f + sizeof fh + i * sizeof s, sizeof s);
    /* each stream's count, the sequence's cells right after its own (state_write) */
    uint32_t mine = stream_of(s.n_stream, seq);
    if (!pl) {
      o = put_u32(o, s.n_stream);
      for (uint32_t k = 0; k <= mine; k++) o = put_u32(o, k == mine ? (uint32_t)N : 0);
      for (uint64_t k = 0; k < N; k++) { /* pos k, one seq id (the destination's); ext: pl */
        o = put_u32(put_u32(o, (uint32_t)k), 1);
        o = put_u32(o + (ext ? KVS_LLAMA_CELL_EXT : 0), (uint32_t)seq);
      }
      o = put_u32(put_u32(o, s.v_trans), s.n_layer);
    } else {
      o += 4 + 4 * ((uint64_t)mine + 1);
      if (ext) blk_hash(hs, m, false, pl, held * KVS_LLAMA_CELL_EXT);
      for (uint64_t j = 0; ext && j < n; j++)
        mv(m, o + (a + j) * mb + 8, pl + j * KVS_LLAMA_CELL_EXT, KVS_LLAMA_CELL_EXT);
      if (ext) blk_hash(hs, m, true, pl, held * KVS_LLAMA_CELL_EXT);
      if (ext) pl += held * KVS_LLAMA_CELL_EXT;
      o += N * mb + 8;
    }
    for (uint32_t l = 0; l < s.n_layer; l++) {
      kvs__llama_frame_layer_t L;
      memcpy(&L, lay + l * sizeof L, sizeof L);
      if (!pl) put_u64(put_u32(o, (uint32_t)L.k_type), L.k_row);
      o += 12;
      if (pl) {
        blk_hash(hs, m, false, pl, held * L.k_row);
        mv(m, o + a * L.k_row, pl, n * L.k_row);
        blk_hash(hs, m, true, pl, held * L.k_row);
        pl += held * L.k_row;
      }
      o += N * L.k_row;
    }
    for (uint32_t l = 0; has_v && l < s.n_layer; l++) {
      kvs__llama_frame_layer_t L;
      memcpy(&L, lay + l * sizeof L, sizeof L);
      if (!pl && s.v_trans) put_u32(put_u32(put_u32(o, (uint32_t)L.v_type), L.v_el), L.v_embd);
      else if (!pl) put_u64(put_u32(o, (uint32_t)L.v_type), L.v_row);
      o += 12;
      if (s.v_trans) { /* element j of every cell is one run of N values: the chunk's n of it */
        uint8_t *blk = pl;
        if (pl) blk_hash(hs, m, false, blk, L.v_embd * held * L.v_el);
        for (uint64_t j = 0; pl && j < L.v_embd; j++, pl += held * L.v_el)
          mv(m, o + (j * N + a) * L.v_el, pl, n * L.v_el);
        if (pl) blk_hash(hs, m, true, blk, L.v_embd * held * L.v_el);
        o += N * L.v_el * L.v_embd;
      } else {
        if (pl) {
          blk_hash(hs, m, false, pl, held * L.v_row);
          mv(m, o + a * L.v_row, pl, n * L.v_row);
          blk_hash(hs, m, true, pl, held * L.v_row);
          pl += held * L.v_row;
        }
        o += N * L.v_row;
      }
    }
    for (uint32_t k = mine + 1; k < s.n_stream; k++, o += 4)
      if (!pl) put_u32(o, 0);
    lay += s.n_layer * sizeof(kvs__llama_frame_layer_t);
  }
  return o;
}

/* Both headers (frame and chunk) open with the same tag: magic, version, hdr_size. */
typedef struct head_tag {
  uint32_t magic;
  uint16_t version, hdr_size;
} head_tag_t;
_Static_assert(offsetof(kvs__llama_frame_hdr_t, hdr_size) == offsetof(head_tag_t, hdr_size) &&
                   offsetof(kvs__llama_chunk_hdr_t, hdr_size) == offsetof(head_tag_t, hdr_size),
               "frame and chunk headers open with the tag");

/* A header of size bytes at h: zeroed, its tag ours. */
static void head_open(void *h, size_t size, uint32_t magic) {
  head_tag_t t = {magic, KVS_LLAMA_CHUNKS_VERSION, (uint16_t)size};
  memset(h, 0, size);
  memcpy(h, &t, sizeof t);
}

/* The header of size bytes at the front of p (len bytes) into h: SHORT, FOREIGN (a tag not
 * ours, of another size) or OK. */
static kvs__llama_chunks_status_t head_read(const uint8_t *p, size_t len, void *h, size_t size,
                                            uint32_t magic) {
  if (!p || len < size) return KVS_LLAMA_CHUNKS_SHORT;
  memcpy(h, p, size);
  head_tag_t t;
  memcpy(&t, h, sizeof t);
  if (t.magic != magic || t.version != KVS_LLAMA_CHUNKS_VERSION || t.hdr_size != size)
    return KVS_LLAMA_CHUNKS_FOREIGN;
  return KVS_LLAMA_CHUNKS_OK;
}

uint64_t kvs__llama_chunks_frame(const uint8_t *state, const kvs__llama_chunks_scan_t *sc,
                                 uint32_t T, kvs_key_t ns, uint8_t *dst, size_t cap) {
  if (T == 0 || cap < sc->frame_size) return 0;
  kvs__llama_frame_hdr_t h;
  head_open(&h, sizeof h, KVS_LLAMA_FRAME_MAGIC);
  h.chunk_tokens = T;
  h.n_sections = sc->n_sections;
  h.flags = sc->flags;
  h.n_layers = sc->n_layers;
  h.cell_bytes = sc->cell_bytes;
  h.ns_lo = ns.lo;
  h.ns_hi = ns.hi;
  h.size = sc->frame_size;
  uint8_t *secs = dst + sizeof h;
  uint8_t *lay = secs + sc->n_sections * sizeof(kvs__llama_frame_sec_t);
  uint64_t n = sc->n_cells;
  for (uint32_t i = 0; i < sc->n_sections; i++) {
    size_t meta;
    rd_t r = {state, (size_t)-1, sec_data(state, sc, i, &meta), false};
    kvs__llama_frame_sec_t fs = {0, 0, 0, 0};
    memcpy(&fs.n_stream, state + sc->sec_off[i], 4);
    fs.v_trans = rd_u32(&r);
    fs.n_layer = rd_u32(&r);
    kvs__llama_frame_layer_t L[1];
    uint8_t *first = lay;
    for (uint32_t l = 0; l < fs.n_layer; l++, lay += sizeof L[0]) {
      memset(L, 0, sizeof L);
      L->k_type = (int32_t)rd_u32(&r);
      L->k_row = rd_u64(&r);
      r.off += (size_t)(n * L->k_row);
      memcpy(lay, L, sizeof L[0]);
    }
    for (uint32_t l = 0; (sc->flags & KVS_LLAMA_FRAME_HAS_V) && l < fs.n_layer; l++) {
      memcpy(L, first + l * sizeof L[0], sizeof L[0]);
      L->v_type = (int32_t)rd_u32(&r);
      if (fs.v_trans) {
        L->v_el = rd_u32(&r);
        L->v_embd = rd_u32(&r);
        r.off += (size_t)(n * L->v_el * L->v_embd);
      } else {
        L->v_row = rd_u64(&r);
        r.off += (size_t)(n * L->v_row);
      }
      memcpy(first + l * sizeof L[0], L, sizeof L[0]);
    }
    memcpy(secs + i * sizeof fs, &fs, sizeof fs);
  }
  h.checksum = 0;
  memcpy(dst, &h, sizeof h);
  h.checksum = seeded(dst, offsetof(kvs__llama_frame_hdr_t, checksum), sizeof h, sc->frame_size);
  memcpy(dst + offsetof(kvs__llama_frame_hdr_t, checksum), &h.checksum, 8);
  return h.checksum;
}

/* Bytes of chunk c of the first `upto` of N tokens, cell_bytes of payload per token (0: none). */
static uint64_t chunk_bytes(uint64_t N, uint64_t cell_bytes, uint32_t T, uint64_t upto,
                            uint32_t c) {
  if (upto > N) upto = N;
  if (T == 0 || (uint64_t)c * T >= upto) return 0;
  uint64_t n = upto - (uint64_t)c * T;
  if (n > T) n = T;
  return sizeof(kvs__llama_chunk_hdr_t) + 4 * n + n * cell_bytes;
}

uint64_t kvs__llama_chunk_size(const kvs__llama_chunks_scan_t *sc, uint32_t T, uint32_t upto,
                               uint32_t c) {
  return chunk_bytes(sc->n_cells, sc->cell_bytes, T, upto, c);
}

uint64_t kvs__llama_frame_chunk_size(const uint8_t *frame, uint64_t N, uint32_t T, uint32_t upto,
                                     uint32_t c) {
  kvs__llama_frame_hdr_t fh;
  memcpy(&fh, frame, sizeof fh);
  return chunk_bytes(N, fh.cell_bytes, T, upto, c);
}

kvs__llama_chunks_status_t kvs__llama_chunk_finish(const uint8_t *state,
                                                   const kvs__llama_chunks_scan_t *sc,
                                                   const int32_t *tok, uint32_t T, uint32_t upto,
                                                   uint32_t c, const uint8_t *frame, kvs_key_t ns,
                                                   uint8_t *dst, size_t cap, uint64_t min) {
  uint64_t size = kvs__llama_chunk_size(sc, T, upto, c);
  if (size == 0) return KVS_LLAMA_CHUNKS_FIELD;
  if (cap < size) return KVS_LLAMA_CHUNKS_SPACE;
  if (upto > sc->n_cells) upto = sc->n_cells;
  uint64_t a = (uint64_t)c * T, N = sc->n_cells;
  uint32_t n = (uint32_t)(upto - a < T ? upto - a : T);
  kvs__llama_chunk_hdr_t h;
  head_open(&h, sizeof h, KVS_LLAMA_CHUNK_MAGIC);
  h.index = c;
  h.n_tokens = n;
  h.chunk_tokens = T;
  memcpy(&h.frame_id, frame + offsetof(kvs__llama_frame_hdr_t, checksum), 8);
  h.payload = (uint64_t)n * sc->cell_bytes;
  h.ns_lo = ns.lo;
  h.ns_hi = ns.hi;
  memcpy(dst + sizeof h, tok + a, 4 * (size_t)n);
  memcpy(dst, &h, sizeof h);
  /* the checksum seeded() computes, in pieces: the header before it, the tokens, then each
   * block of the payload right after the walk wrote it (in cache; one pass over the state) */
  kvs__llama_hasher_t hs;
  kvs__llama_hasher_init(&hs, kvs__llama_hash(dst, offsetof(kvs__llama_chunk_hdr_t, checksum), 0));
  kvs__llama_hasher_update(&hs, dst + sizeof h, 4 * (size_t)n);
  /* a splittable state is laid out as the frame says (scan: one stream, cells 0..N-1); the
   * walk only reads it when splitting */
  const mover_t split = {.split = true, .min = min, .state = state};
  lay_out(frame, N, sc->seq, (uint8_t *)(uintptr_t)state, dst + sizeof h + 4 * (size_t)n, a, n,
          n, &split, &hs);
  h.checksum = kvs__llama_hasher_digest(&hs);
  memcpy(dst + offsetof(kvs__llama_chunk_hdr_t, checksum), &h.checksum, 8);
  return KVS_LLAMA_CHUNKS_OK;
}

kvs__llama_chunks_status_t kvs__llama_chunk_write(const uint8_t *state,
                                                  const kvs__llama_chunks_scan_t *sc,
                                                  const int32_t *tok, uint32_t T, uint32_t upto,
                                                  uint32_t c, const uint8_t *frame, kvs_key_t ns,
                                                  uint8_t *dst, size_t cap) {
  return kvs__llama_chunk_finish(state, sc, tok, T, upto, c, frame, ns, dst, cap, UINT64_MAX);
}

kvs__llama_chunks_status_t kvs__llama_chunk_plan(const uint8_t *frame, uint64_t N, int32_t seq,
                                                 uint32_t T, uint32_t upto, uint32_t c,
                                                 const uint8_t *state, uint8_t *dst, size_t cap,
                                                 kvs__llama_defer_t *d) {
  uint64_t size = kvs__llama_frame_chunk_size(frame, N, T, upto, c);
  if (size == 0 || seq < 0 || !d) return KVS_LLAMA_CHUNKS_FIELD;
  if (cap < size) return KVS_LLAMA_CHUNKS_SPACE;
  if (upto > N) upto = (uint32_t)N;
  uint64_t a = (uint64_t)c * T, n = upto - a < T ? upto - a : T;
  const uint32_t room = d->cap;
  /* the state's places are only computed: nothing at state or dst is read or written */
  const mover_t plan = {.split = true, .plan = true, .min = d->min, .defer = d, .state = state};
  lay_out(frame, N, seq, (uint8_t *)(uintptr_t)state, dst + sizeof(kvs__llama_chunk_hdr_t) + 4 * n,
          a, n, n, &plan, NULL);
  if (d->cap == 0) { /* no room for every run */
    d->cap = room;
    return KVS_LLAMA_CHUNKS_FIELD;
  }
  return KVS_LLAMA_CHUNKS_OK;
}

kvs__llama_chunks_status_t kvs__llama_plan_drop(const uint8_t *frame, uint64_t N, int32_t seq,
                                                uint64_t a, uint64_t n, const uint8_t *state,
                                                kvs__llama_defer_t *d) {
  if (!d || seq < 0 || n == 0 || a > N || n > N - a) return KVS_LLAMA_CHUNKS_FIELD;
  const uint32_t room = d->cap, n0 = d->n;
  const uint64_t bytes0 = d->bytes;
  /* The walk moves tokens [a, a + n) as one payload of n tokens; that payload is never
   * written, so its places are counted from state (a payload is smaller than the state: they
   * stay inside it) and only the state's are recorded. */
  const mover_t plan = {.split = true, .plan = true, .drop = true, .min = d->min, .defer = d,
                        .state = state};
  lay_out(frame, N, seq, (uint8_t *)(uintptr_t)state, (uint8_t *)(uintptr_t)state, a, n, n, &plan,
          NULL);
  if (d->cap == 0) { /* no room: as it was */
    d->cap = room, d->n = n0, d->bytes = bytes0;
    return KVS_LLAMA_CHUNKS_FIELD;
  }
  return KVS_LLAMA_CHUNKS_OK;
}

/* ---- checks ---------------------------------------------------------------------------------- */

kvs__llama_chunks_status_t kvs__llama_frame_check(const uint8_t *f, size_t len, uint32_t T,
                                                  kvs_key_t ns, kvs__llama_frame_hdr_t *hdr) {
  kvs__llama_frame_hdr_t h;
  kvs__llama_chunks_status_t st = head_read(f, len, &h, sizeof h, KVS_LLAMA_FRAME_MAGIC);
  if (st != KVS_LLAMA_CHUNKS_OK) return st;
  if (h.n_sections == 0 || h.n_sections > KVS_LLAMA_CHUNKS_MAX_SECTIONS ||
      (h.flags & ~(KVS_LLAMA_FRAME_EXT | KVS_LLAMA_FRAME_HAS_V)) != 0 || h.n_layers == 0 ||
      h.n_layers > h.n_sections * KVS_LLAMA_CHUNKS_MAX_LAYERS)
    return KVS_LLAMA_CHUNKS_FIELD;
  uint64_t want = sizeof h + h.n_sections * sizeof(kvs__llama_frame_sec_t) +
                  (uint64_t)h.n_layers * sizeof(kvs__llama_frame_layer_t);
  if (h.size != want || len != want) return KVS_LLAMA_CHUNKS_LENGTH;
  if (h.chunk_tokens != T || T == 0) return KVS_LLAMA_CHUNKS_FRAME;
  if (h.ns_lo != ns.lo || h.ns_hi != ns.hi) return KVS_LLAMA_CHUNKS_NAMESPACE;
  const uint8_t *lay = f + sizeof h + h.n_sections * sizeof(kvs__llama_frame_sec_t);
  uint64_t layers = 0, cb = 0;
  bool has_v = (h.flags & KVS_LLAMA_FRAME_HAS_V) != 0;
  for (uint32_t i = 0; i < h.n_sections; i++) {
    kvs__llama_frame_sec_t s;
    memcpy(&s, f + sizeof h + i * sizeof s, sizeof s);
    if (s.n_stream == 0 || s.n_stream > KVS_LLAMA_CHUNKS_MAX_STREAMS || s.v_trans > 1 ||
        s.n_layer == 0 || s.n_layer > KVS_LLAMA_CHUNKS_MAX_LAYERS || s.zero != 0 ||
        layers + s.n_layer > h.n_layers)
      return KVS_LLAMA_CHUNKS_FIELD;
    cb += (h.flags & KVS_LLAMA_FRAME_EXT) ? KVS_LLAMA_CELL_EXT : 0;
    for (uint32_t l = 0; l < s.n_layer; l++) {
      kvs__llama_frame_layer_t L;
      memcpy(&L, lay + (layers + l) * sizeof L, sizeof L);
      bool ok = type_ok(L.k_type) && row_ok(L.k_row);
      if (!has_v) ok = ok && L.v_type == 0 && L.v_row == 0 && L.v_el == 0 && L.v_embd == 0;
      else if (s.v_trans) ok = ok && type_ok(L.v_type) && L.v_row == 0 && vt_ok(L.v_el, L.v_embd);
      else ok = ok && type_ok(L.v_type) && row_ok(L.v_row) && L.v_el == 0 && L.v_embd == 0;
      if (!ok) return KVS_LLAMA_CHUNKS_FIELD;
      cb += L.k_row + (has_v ? (s.v_trans ? (uint64_t)L.v_el * L.v_embd : L.v_row) : 0);
    }
    layers += s.n_layer;
  }
  if (layers != h.n_layers || cb != h.cell_bytes || cb > KVS_LLAMA_CHUNKS_MAX_CELL)
    return KVS_LLAMA_CHUNKS_FIELD;
  if (seeded(f, offsetof(kvs__llama_frame_hdr_t, checksum), sizeof h, len) != h.checksum)
    return KVS_LLAMA_CHUNKS_CHECKSUM;
  if (hdr) *hdr = h;
  return KVS_LLAMA_CHUNKS_OK;
}

/* kvs__llama_chunk_check but its checksum: *h its header on OK. */
static kvs__llama_chunks_status_t chunk_fields(const uint8_t *chunk, size_t len,
                                               const kvs__llama_frame_hdr_t *fh, uint32_t c,
                                               kvs__llama_chunk_hdr_t *hdr) {
  kvs__llama_chunk_hdr_t h;
  kvs__llama_chunks_status_t st = head_read(chunk, len, &h, sizeof h, KVS_LLAMA_CHUNK_MAGIC);
  if (st != KVS_LLAMA_CHUNKS_OK) return st;
  if (h.ns_lo != fh->ns_lo || h.ns_hi != fh->ns_hi) return KVS_LLAMA_CHUNKS_NAMESPACE;
  if (h.frame_id != fh->checksum || h.chunk_tokens != fh->chunk_tokens)
    return KVS_LLAMA_CHUNKS_FRAME;
  if (h.index != c) return KVS_LLAMA_CHUNKS_ORDER;
  if (h.n_tokens == 0 || h.n_tokens > h.chunk_tokens || h.zero != 0 ||
      h.payload != (uint64_t)h.n_tokens * fh->cell_bytes)
    return KVS_LLAMA_CHUNKS_FIELD;
  if (len != sizeof h + 4ull * h.n_tokens + h.payload) return KVS_LLAMA_CHUNKS_LENGTH;
  *hdr = h;
  return KVS_LLAMA_CHUNKS_OK;
}

kvs__llama_chunks_status_t kvs__llama_chunk_check(const uint8_t *chunk, size_t len,
                                                  const kvs__llama_frame_hdr_t *fh, uint32_t c,
                                                  kvs__llama_chunk_hdr_t *hdr) {
  kvs__llama_chunk_hdr_t h;
  kvs__llama_chunks_status_t st = chunk_fields(chunk, len, fh, c, &h);
  if (st != KVS_LLAMA_CHUNKS_OK) return st;
  if (seeded(chunk, offsetof(kvs__llama_chunk_hdr_t, checksum), sizeof h, len) != h.checksum)
    return KVS_LLAMA_CHUNKS_CHECKSUM;
  if (hdr) *hdr = h;
  return KVS_LLAMA_CHUNKS_OK;
}

/* ---- assembly -------------------------------------------------------------------------------- */

/* Sort recorded runs by their place in the state (distinct places: runs never overlap). A
 * heapsort: in place, no allocation (qsort may allocate), O(n log n) for the chunk-major order
 * the assembler records them in. */
static void runs_sift(kvs__llama_run_t *r, size_t i, size_t n) {
  for (size_t c; (c = 2 * i + 1) < n; i = c) {
    if (c + 1 < n && r[c + 1].off > r[c].off) c++;
    if (r[i].off >= r[c].off) return;
    kvs__llama_run_t t = r[i];
    r[i] = r[c];
    r[c] = t;
  }
}

void kvs__llama_runs_sort(kvs__llama_defer_t *d) {
  kvs__llama_run_t *r = d->runs;
  size_t n = d->n;
  for (size_t i = n / 2; i-- > 0;) runs_sift(r, i, n);
  for (size_t e = n; e-- > 1;) {
    kvs__llama_run_t t = r[0];
    r[0] = r[e];
    r[e] = t;
    runs_sift(r, 0, e);
  }
}

uint64_t kvs__llama_chunks_state_size(const uint8_t *f, uint64_t n) {
  kvs__llama_frame_hdr_t h;
  memcpy(&h, f, sizeof h);
  if (n == 0 || n > KVS_LLAMA_CHUNKS_MAX_CELLS) return 0;
  uint64_t size = KVS_LLAMA_STATE_HDR + n * h.cell_bytes;
  for (uint32_t i = 0; i < h.n_sections; i++) {
    kvs__llama_frame_sec_t s;
    memcpy(&s, f + sizeof h + i * sizeof s, sizeof s);
    /* n_stream, the stream counts, pos / n_seq_id / seq id per cell, v_trans, n_layer, and a
     * 12-byte type + row (or type + el + n_embd) header per layer for K and for V */
    size += 4 + 4ull * s.n_stream + 12 * n + 8 +
            12ull * s.n_layer * ((h.flags & KVS_LLAMA_FRAME_HAS_V) ? 2 : 1);
  }
  return size;
}

uint64_t kvs__llama_chunks_state_tokens(const uint8_t *f, uint64_t size) {
  /* the size is base + n * per (kvs__llama_chunks_state_size) */
  uint64_t s1 = kvs__llama_chunks_state_size(f, 1), s2 = kvs__llama_chunks_state_size(f, 2);
  if (!s1 || s2 <= s1 || size < s1) return 0;
  uint64_t per = s2 - s1, n = (size - (s1 - per)) / per;
  return kvs__llama_chunks_state_size(f, n) == size ? n : 0;
}

kvs__llama_chunks_status_t kvs__llama_chunks_assemble(const uint8_t *f, size_t flen, uint32_t T,
                                                      kvs_key_t ns, const uint8_t *const *ch,
                                                      const size_t *chlen, uint32_t nch,
                                                      uint32_t last_n, int32_t seq, uint8_t *dst,
                                                      size_t cap, size_t *out_len,
                                                      kvs__llama_defer_t *defer) {
  kvs__llama_frame_hdr_t fh;
  kvs__llama_chunks_status_t st = kvs__llama_frame_check(f, flen, T, ns, &fh);
  if (st != KVS_LLAMA_CHUNKS_OK) return st;
  if (nch == 0 || !ch || !chlen) return KVS_LLAMA_CHUNKS_ORDER;
  if (seq < 0) return KVS_LLAMA_CHUNKS_FIELD;
  uint64_t N = 0;
  uint32_t held = 0; /* the last chunk's own tokens (its payload's runs) */
  for (uint32_t i = 0; i < nch; i++) { /* every field first; the checksums while copying */
    kvs__llama_chunk_hdr_t h;
    st = chunk_fields(ch[i], chlen[i], &fh, i, &h);
    if (st != KVS_LLAMA_CHUNKS_OK) return st;
    if (i + 1 < nch && h.n_tokens != T) return KVS_LLAMA_CHUNKS_ORDER;
    held = h.n_tokens;
    if (i + 1 == nch && last_n > h.n_tokens) return KVS_LLAMA_CHUNKS_FIELD;
    N += i + 1 == nch && last_n ? last_n : h.n_tokens;
  }
  uint64_t size = kvs__llama_chunks_state_size(f, N);
  if (size == 0) return KVS_LLAMA_CHUNKS_FIELD;
  for (uint32_t i = 0; i < fh.n_sections; i++) { /* the sequence must have a stream */
    kvs__llama_frame_sec_t s;
    memcpy(&s, f + sizeof fh + i * sizeof s, sizeof s);
    if (s.n_stream > 1 && (uint32_t)seq >= s.n_stream) return KVS_LLAMA_CHUNKS_FIELD;
  }
  if (!dst || cap < size) return KVS_LLAMA_CHUNKS_SPACE;
  if (defer) defer->n = 0, defer->bytes = 0;
  const mover_t into = {.defer = defer, .state = dst};
  /* One read of each chunk: each run of its payload hashed while it is in cache, then copied to
   * its places (lay_out with a hasher: the checksum seeded() computes, in pieces), the checksum
   * compared at the chunk's end. A damaged chunk is found only after it and the chunks before
   * it were copied: dst is then partly written (CHECKSUM is the one refusal that writes). */
  for (uint32_t i = 0; i < nch; i++) {
    const size_t cs = offsetof(kvs__llama_chunk_hdr_t, checksum);
    uint64_t sum;
    memcpy(&sum, ch[i] + cs, 8);
    uint64_t n = i + 1 < nch ? T : N - (uint64_t)i * T, own = i + 1 < nch ? T : held;
    kvs__llama_hasher_t hs;
    kvs__llama_hasher_init(&hs, kvs__llama_hash(ch[i], cs, 0));
    kvs__llama_hasher_update(&hs, ch[i] + sizeof(kvs__llama_chunk_hdr_t), (size_t)(4 * own));
    /* (assembling: the chunk is only read; the last may give only its first n of own) */
    uint8_t *pl = (uint8_t *)(uintptr_t)(ch[i] + sizeof(kvs__llama_chunk_hdr_t) + 4 * own);
    lay_out(f, N, seq, dst, pl, (uint64_t)i * T, n, own, &into, &hs);
    if (kvs__llama_hasher_digest(&hs) != sum) return KVS_LLAMA_CHUNKS_CHECKSUM;
  }
  *out_len = (size_t)(lay_out(f, N, seq, dst, NULL, 0, 0, 0, &into, NULL) - dst);
  if (defer) kvs__llama_runs_sort(defer);
  return KVS_LLAMA_CHUNKS_OK;
}

const char *kvs__llama_chunks_status_name(kvs__llama_chunks_status_t s) {
  switch (s) {
  case KVS_LLAMA_CHUNKS_OK: return "ok";
  case KVS_LLAMA_CHUNKS_SHORT: return "shorter than its header";
  case KVS_LLAMA_CHUNKS_FOREIGN: return "foreign magic, version or header size";
  case KVS_LLAMA_CHUNKS_LAYOUT: return "state layout not known (no single reading parses it)";
  case KVS_LLAMA_CHUNKS_CELLS: return "cells are not one sequence at 0..n-1 (not splittable)";
  case KVS_LLAMA_CHUNKS_FIELD: return "a field out of range or inconsistent";
  case KVS_LLAMA_CHUNKS_LENGTH: return "length does not match its header (truncated?)";
  case KVS_LLAMA_CHUNKS_NAMESPACE: return "made by a context with another model or KV settings";
  case KVS_LLAMA_CHUNKS_FRAME: return "a chunk of another frame or chunk size";
  case KVS_LLAMA_CHUNKS_ORDER: return "chunks out of order, or a short chunk before the last";
  case KVS_LLAMA_CHUNKS_CHECKSUM: return "checksum mismatch (corrupted)";
  case KVS_LLAMA_CHUNKS_SPACE: return "destination too small";
  }
  return "unknown";
}
