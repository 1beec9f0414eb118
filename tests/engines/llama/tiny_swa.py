#!/usr/bin/env python3
"""tiny_swa.py: a small OLMo2-architecture GGUF with sliding-window attention, for the prefix
cache's sliding-window tests (issue 16 item 8). It is scripts/tiny-gguf (same flags, tokenizer,
weights, writer) with another architecture: general.architecture = olmo2, per block attn_q,
attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, post_attention_norm, ffn_gate, ffn_up,
ffn_down, post_ffw_norm (llama.cpp's OLMo2 tensors, llama-model.cpp), and
olmo2.attention.sliding_window = --swa: the pinned llama.cpp then uses a window of that many
tokens on 3 of 4 layers (LLM_ARCH_OLMO2: set_swa_pattern(4)).

usage: tiny_swa.py --swa N [tiny-gguf flags...] --out PATH
"""
import importlib.machinery
import importlib.util
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "..", "..", "..", "scripts", "tiny-gguf")


def load_tiny():
    loader = importlib.machinery.SourceFileLoader("tiny_gguf", TINY)
    spec = importlib.util.spec_from_loader("tiny_gguf", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def main(argv):
    swa = None
    if "--swa" in argv:
        i = argv.index("--swa")
        swa = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if not swa or swa < 1:
        sys.stderr.write("tiny_swa.py: --swa N (N >= 1) is required\n")
        return 2
    t = load_tiny()
    build_llama = t.build_model

    def build_olmo2(a):
        header, tensors, total = build_llama(a)  # the llama model: reuse its tensor objects
        F32 = t.GGML_F32
        by = {x.name: x for x in tensors}
        out = [by["token_embd.weight"]]
        for i in range(a.layers):
            p = "blk.%d." % i
            out += [by[p + n] for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight",
                                        "attn_output.weight")]
            out += [t.Tensor(p + "attn_q_norm.weight", [a.embd], F32),
                    t.Tensor(p + "attn_k_norm.weight", [by[p + "attn_k.weight"].dims[1]], F32),
                    t.Tensor(p + "post_attention_norm.weight", [a.embd], F32)]
            out += [by[p + n] for n in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")]
            out.append(t.Tensor(p + "post_ffw_norm.weight", [a.embd], F32))
        out += [x for x in tensors if x.name in ("output_norm.weight", "output.weight")]
        # the key/values: llama.* becomes olmo2.*, plus the window
        kv_end = header.index(tensors[0].info())
        kvs_blob = header[4 + 4 + 8 + 8:kv_end]
        kvs_blob = kvs_blob.replace(t.gguf_str("llama"), t.gguf_str("olmo2"), 1)
        for key in (b"vocab_size", b"context_length", b"embedding_length", b"block_count",
                    b"feed_forward_length", b"attention.head_count_kv",
                    b"attention.head_count", b"rope.dimension_count", b"rope.freq_base",
                    b"attention.layer_norm_rms_epsilon"):
            old = t.gguf_str("llama." + key.decode())
            kvs_blob = kvs_blob.replace(old, t.gguf_str("olmo2." + key.decode()), 1)
        n_kv = int.from_bytes(header[16:24], "little") + 1
        kvs_blob += t.kv_u32("olmo2.attention.sliding_window", swa)
        off = 0
        for x in out:
            x.offset = off
            off += x.nbytes + t.pad_to(x.nbytes)
        hdr = (t.GGUF_MAGIC + struct.pack("<IQQ", t.GGUF_VERSION, len(out), n_kv) + kvs_blob
               + b"".join(x.info() for x in out))
        hdr += b"\0" * t.pad_to(len(hdr))
        return hdr, out, len(hdr) + off

    t.build_model = build_olmo2
    t.write_model(t.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
