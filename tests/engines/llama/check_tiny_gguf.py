#!/usr/bin/env python3
"""Checks scripts/tiny-gguf (Python only, no engine): GGUF v3 structure read back with an
independent reader, the metadata llama.cpp requires, tensor names, shapes, types, alignment and
values, the tokenizer's layout and prefix closure, byte-identical output for the same flags,
atomic writes and clear errors for bad flags.
Usage: check_tiny_gguf.py tiny-gguf [--work-dir DIR] [--keep]      Exit status: 0 pass, 1 fail."""

import math
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_GGUF = os.path.normpath(os.path.join(HERE, "..", "..", "..", "scripts", "tiny-gguf"))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "lib")))
from harness import check  # noqa: E402
import harness  # noqa: E402

SPACE = "\u2581"


def tiny(*args):
    return subprocess.run([sys.executable, TINY_GGUF, "-q"] + list(args),
                          capture_output=True, text=True, timeout=300)


class Reader:
    """A minimal GGUF v3 reader, written from the format description in ggml's gguf.h."""

    SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}

    def __init__(self, data):
        self.d, self.o = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.o)
        self.o += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("<Q")
        s = self.d[self.o:self.o + n].decode("utf-8")
        self.o += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(self.SCALARS[t])

    def parse(self):
        magic = self.d[:4]
        self.o = 4
        version, n_t, n_kv = self.take("<I"), self.take("<Q"), self.take("<Q")
        kv = {}
        for _ in range(n_kv):
            k = self.string()
            t = self.take("<I")
            kv[k] = (t, self.value(t))
        tensors = []
        for _ in range(n_t):
            name = self.string()
            nd = self.take("<I")
            dims = [self.take("<Q") for _ in range(nd)]
            gtype, off = self.take("<I"), self.take("<Q")
            tensors.append((name, dims, gtype, off))
        align = kv.get("general.alignment", (4, 32))[1]
        data_start = self.o + (align - self.o % align) % align
        return magic, version, kv, tensors, data_start, align


def f16_stats(buf):
    vals = struct.unpack("<%de" % (len(buf) // 2), buf)
    n = len(vals)
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / n)
    return all(math.isfinite(v) for v in vals), mean, std


def case_tiny_gguf(c):
    run(c.work)


def run(work):
    cfg = dict(layers=3, embd=128, heads=4, kv_heads=2, ffn=320, vocab=1000, ctx=777, seed=5)
    flags = []
    for k, v in cfg.items():
        flags += ["--" + k.replace("_", "-"), str(v)]
    m1, m2, m3 = (os.path.join(work, n) for n in ("a.gguf", "b.gguf", "c.gguf"))
    p = tiny(*flags, "--out", m1)
    check(p.returncode == 0, "tiny-gguf writes a model (%s)" % p.stderr.strip())
    tiny(*flags, "--out", m2)
    d1 = open(m1, "rb").read()
    check(d1 == open(m2, "rb").read(), "same flags, byte-identical files")
    tiny(*[x if x != "5" else "6" for x in flags], "--out", m3)
    d3 = open(m3, "rb").read()
    check(len(d3) == len(d1) and d3 != d1, "another seed, same size, other bytes")
    check(sorted(os.listdir(work)) == ["a.gguf", "b.gguf", "c.gguf"], "no temporary files left")

    magic, version, kv, tensors, data_start, align = Reader(d1).parse()
    check(magic == b"GGUF" and version == 3, "magic GGUF, version 3")
    U32, F32, STR, ARR = 4, 6, 8, 9
    want = {
        "general.architecture": (STR, "llama"),
        "llama.context_length": (U32, cfg["ctx"]),
        "llama.embedding_length": (U32, cfg["embd"]),
        "llama.block_count": (U32, cfg["layers"]),
        "llama.feed_forward_length": (U32, cfg["ffn"]),
        "llama.attention.head_count": (U32, cfg["heads"]),
        "llama.attention.head_count_kv": (U32, cfg["kv_heads"]),
        "llama.rope.dimension_count": (U32, cfg["embd"] // cfg["heads"]),
        "tokenizer.ggml.model": (STR, "llama"),
        "tokenizer.ggml.bos_token_id": (U32, 1),
        "tokenizer.ggml.eos_token_id": (U32, 2),
        "tokenizer.ggml.unknown_token_id": (U32, 0),
    }
    for k, v in want.items():
        check(kv.get(k) == v, "metadata %s = %r (got %r)" % (k, v[1], kv.get(k)))
    eps = kv.get("llama.attention.layer_norm_rms_epsilon")
    check(eps is not None and eps[0] == F32 and 0 < eps[1] < 1e-3, "rms epsilon is a small f32")

    toks = kv["tokenizer.ggml.tokens"]
    scores = kv["tokenizer.ggml.scores"]
    types = kv["tokenizer.ggml.token_type"]
    check(toks[0] == ARR and toks[1][0] == STR and len(toks[1][1]) == cfg["vocab"],
          "tokenizer.ggml.tokens: %d strings" % cfg["vocab"])
    check(scores[1][0] == F32 and types[1][0] == 5 and len(scores[1][1]) == len(types[1][1])
          == cfg["vocab"], "scores (f32) and token types (i32) for every token")
    t, ty, sc = toks[1][1], types[1][1], scores[1][1]
    check(t[:3] == ["<unk>", "<s>", "</s>"] and ty[:3] == [2, 3, 3],
          "<unk> (unknown), <s>, </s> (control) first")
    check(t[3:259] == ["<0x%02X>" % b for b in range(256)] and set(ty[3:259]) == {6},
          "then the 256 byte tokens <0x00>..<0xFF> (type byte)")
    check(len(set(t)) == len(t), "token texts are unique")
    pieces = t[259:]
    check(set(ty[259:]) == {1} and all(sc[i] > sc[i + 1] for i in range(259, len(t) - 1)),
          "pieces are normal tokens with falling scores")
    check(SPACE in pieces and all(chr(c) in pieces for c in range(0x21, 0x7f)),
          "\u2581 and every printable ASCII character are pieces")
    index = {p: i for i, p in enumerate(pieces)}
    closed = all(len(p) == 1 or (p[:-1] in index and index[p[:-1]] < index[p]) for p in pieces)
    check(closed, "pieces are prefix-closed (each after its prefix): bigram merges reach them")
    words = ("the", "The", "of", "and", "water", "Word")
    check(all(SPACE + w in index for w in words), "common words are whole pieces")

    hd = cfg["embd"] // cfg["heads"]
    exp = [("token_embd.weight", [128, 1000], 1)]
    for i in range(cfg["layers"]):
        b = "blk.%d." % i
        exp += [(b + "attn_norm.weight", [128], 0), (b + "attn_q.weight", [128, 128], 1),
                (b + "attn_k.weight", [128, hd * 2], 1), (b + "attn_v.weight", [128, hd * 2], 1),
                (b + "attn_output.weight", [128, 128], 1), (b + "ffn_norm.weight", [128], 0),
                (b + "ffn_gate.weight", [128, 320], 1), (b + "ffn_up.weight", [128, 320], 1),
                (b + "ffn_down.weight", [320, 128], 1)]
    exp += [("output_norm.weight", [128], 0), ("output.weight", [128, 1000], 1)]
    check([(n, d, g) for n, d, g, _ in tensors] == exp,
          "%d tensors: names, shapes (GQA k/v %d wide), F16 matrices, F32 norms"
          % (len(exp), hd * 2))
    check(data_start % align == 0 and all(off % align == 0 for *_, off in tensors),
          "data section and every tensor offset aligned to %d" % align)
    end, overlap = 0, []
    for n, dims, g, off in tensors:
        if off < end:
            overlap.append(n)
        end = off + (2 if g == 1 else 4) * math.prod(dims)
    check(not overlap, "tensor data do not overlap (%s)" % overlap)
    check(data_start + end + (align - end % align) % align == len(d1),
          "file size == data start + tensor data (+ final padding)")
    for n, dims, g, off in tensors:
        buf = d1[data_start + off:data_start + off + (2 if g == 1 else 4) * math.prod(dims)]
        if g == 0:
            check(set(struct.unpack("<%df" % math.prod(dims), buf)) == {1.0}, "%s == 1.0" % n)
        elif n in ("token_embd.weight", "blk.1.attn_k.weight", "blk.2.ffn_down.weight"):
            finite, mean, std = f16_stats(buf)
            want_std = 1 / math.sqrt(dims[0])
            check(finite and abs(mean) < 0.05 * want_std + 1e-3 and abs(std / want_std - 1) < 0.1,
                  "%s: finite, mean %.4f, std %.4f ~ 1/sqrt(%d) = %.4f"
                  % (n, mean, std, dims[0], want_std))

    tied = os.path.join(work, "tied.gguf")
    tiny("--layers", "1", "--embd", "64", "--tied", "--out", tied)
    names = [x[0] for x in Reader(open(tied, "rb").read()).parse()[3]]
    check("output.weight" not in names and "token_embd.weight" in names,
          "--tied: no output.weight (llama.cpp reuses token_embd)")
    os.unlink(tied)

    before = open(m1, "rb").read()
    bad = [(["--embd", "100", "--heads", "3"], "--heads"), (["--kv-heads", "3"], "--kv-heads"),
           (["--vocab", "100"], "--vocab"), (["--layers", "0"], "--layers"),
           (["--embd", "96", "--heads", "32"], "head size"), (["--ctx", "1"], "--ctx"),
           (["--ffn", "0"], "--ffn"), (["--seed", "-1"], "--seed")]
    for args, word in bad:
        p = tiny(*args, "--out", m1)
        check(p.returncode == 2 and word in p.stderr,
              "bad flags %s: exit 2, message names %s (%s)"
              % (" ".join(args), word, p.stderr.strip().splitlines()[-1] if p.stderr else ""))
    p = tiny("--out", os.path.join(work, "no-such-dir", "m.gguf"))
    check(p.returncode != 0 and "does not exist" in p.stderr, "missing output directory: error")
    check(open(m1, "rb").read() == before, "a failed run leaves the existing file unchanged")
    check(sorted(os.listdir(work)) == ["a.gguf", "b.gguf", "c.gguf"], "still no temporary files")


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()), keep_going=True))
