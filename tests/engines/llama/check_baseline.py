#!/usr/bin/env python3
"""Baseline exactness check of the node-llama-cpp test engine (tests/engines/llama), no kvshim.

Proves that the app and a tiny-gguf model work and that a loaded prefix state really is used:
  1. scripts/llama-setup (exit 77, the ctest skip code, when Node.js or the npm registry is
     missing), then scripts/tiny-gguf writes a 2-layer x 128 model into the work directory;
  2. reference: app.mjs --no-cache (every prefix evaluated, nothing saved);
     one-shot: app.mjs --no-cache --one-shot must give the same tokens (prefix-then-rest
     evaluation equals whole-prompt evaluation on this build);
  3. run 1 (fresh process, empty cache dir): each new prefix is evaluated and saved, a prompt that
     shares an earlier prompt's prefix loads that state in the same process; tokens == reference;
  4. run 2 (fresh process, same cache dir): every prefix is loaded; tokens == reference;
  5. every state file: magic 'ggsq', version 3, the prefix's token count, its name is the sha256 of
     its token ids, and its body holds at least the prefix's F16 K and V;
  6. negative controls under prompt 0's expected name: another prefix's whole file (the app sees
     the tokens differ), and prompt 0's header and tokens spliced onto another prefix's state body
     (the tokens match, the KV does not): both must change the generated tokens;
  7. bad state files: a file with a wrong magic fails to load with a reported error, the app
     evaluates instead, the tokens equal the reference and the file is left alone; a truncated
     file makes the pinned llama.cpp abort the process (GGML_ASSERT(nread <= state_size)), which is
     why the app loads only files marked .saved;
  8. a second fresh cache directory gets byte-identical state files (saves are deterministic).
Usage: check_baseline.py baseline [--work-dir DIR] [--keep] [--no-setup]   (--list: the cases)
Exit status: 0 pass, 1 fail, 77 skipped (no Node.js >= 20 or no npm registry), 2 bad usage.
"""

import hashlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys

from llama_e2e import HERE, say  # noqa: E402 (puts tests/lib on sys.path)
from harness import Context, Failure, check  # noqa: E402
import llama_e2e  # noqa: E402

APP = os.path.join(HERE, "app.mjs")

LLAMA_STATE_SEQ_MAGIC = 0x67677371  # 'ggsq' (include/llama.h)
LLAMA_STATE_SEQ_VERSION = 3

MODEL = dict(layers=2, embd=128, heads=2, kv_heads=2, ffn=256, vocab=1024, ctx=1024, seed=7)
PREFIX_TOKENS = 32
GEN_TOKENS = 16
A = ("The story of the king and the river is old. Once upon a time there was a king who lived "
     "near the sea, and every day he would walk to the river to look at the water. ")
B = ("Hello there, how are you today? I am fine, thank you very much for asking me this "
     "question about the weather on the mountain. ")
PROMPTS = [
    A + "He thought about the city and the people who live there.",
    A + "One morning a bird came to him and began to sing a song.",
    B + "The answer is simple: the cold wind comes from the north.",
    "Hi there.",  # shorter than the prefix: its prefix is all but its last token
]


def run_app(args, what):
    cmd = ["node", APP] + args
    p = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise Failure("%s: app.mjs exited %d: %s" % (what, p.returncode, " ".join(cmd)))
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    if not lines or not lines[-1].get("summary"):
        raise Failure("%s: no summary line in the output of %s" % (what, " ".join(cmd)))
    return lines[:-1], lines[-1]


def tokens_of(lines):
    return [x["gen_tokens"] for x in lines]


def state_files(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".seqstate"))


def stem(state_name):
    return state_name[:-len(".seqstate")]


def slurp(path):
    with open(path, "rb") as f:
        return f.read()


def mark_saved(d, state_name):
    with open(os.path.join(d, stem(state_name) + ".saved"), "w") as f:
        f.write("check_baseline\n")


def no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def read_state_file(path):
    """(magic, version, token ids, body bytes) of an llama_state_seq_save_file file."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack_from("<III", data, 0)
    toks = list(struct.unpack_from("<%di" % n, data, 12))
    return magic, version, toks, data[12 + 4 * n:]


class Case(Context):
    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        llama_e2e.setup(args)


def case_baseline(c):
    run_checks(c.work)


def run_checks(work):
    model = llama_e2e.tiny_model(os.path.join(work, "model.gguf"), MODEL)
    prompts = os.path.join(work, "prompts.json")
    with open(prompts, "w") as f:
        json.dump(PROMPTS, f)
    common = ["--model", model, "--prompts", prompts, "--tokens", str(GEN_TOKENS),
              "--prefix-tokens", str(PREFIX_TOKENS), "--ctx-size", "512"]

    ref, _ = run_app(common + ["--no-cache"], "reference")
    ref_toks = tokens_of(ref)
    check(all(len(t) == GEN_TOKENS for t in ref_toks),
          "reference: %d tokens generated for each of %d prompts" % (GEN_TOKENS, len(PROMPTS)))
    check(len({tuple(t) for t in ref_toks}) == len(PROMPTS),
          "reference: the prompts generate different tokens")
    check(ref[3]["prefix_tokens"] == ref[3]["prompt_tokens"] - 1,
          "a prompt shorter than the prefix uses all but its last token as prefix")
    one, _ = run_app(common + ["--no-cache", "--one-shot"], "one-shot")
    check(tokens_of(one) == ref_toks, "one-shot evaluation == prefix-then-rest evaluation")

    cache = os.path.join(work, "cache")
    run1, s1 = run_app(common + ["--cache-dir", cache], "run 1")
    check([x["prefix_source"] for x in run1] == ["evaluated", "loaded", "evaluated", "evaluated"],
          "run 1: new prefixes evaluated and saved, the shared prefix loaded in-process "
          "(got %s)" % [x["prefix_source"] for x in run1])
    check([x.get("saved") for x in run1] == [True, None, True, True],
          "run 1: each evaluated prefix saved by this process")
    check(run1[0]["state_file"] == run1[1]["state_file"] != run1[2]["state_file"],
          "run 1: prompts 0 and 1 share a state file name, prompt 2 has its own")
    check(tokens_of(run1) == ref_toks, "run 1: tokens == reference")
    check(s1["load_errors"] == 0, "run 1: no load errors")

    run2, s2 = run_app(common + ["--cache-dir", cache], "run 2")
    check(all(x["prefix_source"] == "loaded" and x["prefix_match"] for x in run2),
          "run 2 (fresh process): every prefix loaded, with matching tokens")
    check(tokens_of(run2) == ref_toks, "run 2: tokens == reference")

    states = state_files(cache)
    check(len(states) == 3 and all(os.path.exists(os.path.join(cache, stem(n) + ".saved"))
                                   for n in states),
          "3 distinct prefixes, 3 state files, each marked .saved (got %d)" % len(states))
    kv_min = PREFIX_TOKENS * MODEL["layers"] * 2 * (MODEL["embd"] // MODEL["heads"]
                                                     * MODEL["kv_heads"]) * 2
    for name in states:
        magic, version, toks, body = read_state_file(os.path.join(cache, name))
        digest = hashlib.sha256(struct.pack("<%di" % len(toks), *toks)).hexdigest()
        check(magic == LLAMA_STATE_SEQ_MAGIC and version == LLAMA_STATE_SEQ_VERSION
              and digest + ".seqstate" == name and len(body) >= len(toks) and
              (len(toks) != PREFIX_TOKENS or len(body) >= kv_min),
              "%s...: magic 'ggsq' v%d, %d tokens, name == sha256(tokens), body %d bytes"
              % (name[:12], version, len(toks), len(body)))

    # Negative controls: only prompt 0, under its expected name, with another prefix's state.
    p0 = os.path.join(work, "prompt0.json")
    with open(p0, "w") as f:
        json.dump(PROMPTS[:1], f)
    one_common = [x if x != prompts else p0 for x in common]
    name_a, name_b = run1[0]["state_file"], run1[2]["state_file"]
    file_a, file_b = os.path.join(cache, name_a), os.path.join(cache, name_b)

    swap = os.path.join(work, "cache-swap")
    os.makedirs(swap)
    shutil.copyfile(file_b, os.path.join(swap, name_a))
    mark_saved(swap, name_a)
    neg, _ = run_app(one_common + ["--cache-dir", swap], "swap")
    check(neg[0]["prefix_source"] == "loaded" and neg[0]["prefix_match"] is False,
          "swap: another prefix's file loads, and the app sees its tokens differ")
    check(neg[0]["gen_tokens"] != ref_toks[0], "swap: another prefix's state changes the tokens")

    splice = os.path.join(work, "cache-splice")
    os.makedirs(splice)
    _, _, toks_a, body_a = read_state_file(file_a)
    _, _, toks_b, body_b = read_state_file(file_b)
    check(len(toks_a) == len(toks_b) and len(body_a) == len(body_b),
          "prompts 0 and 2 have state files of the same shape")
    with open(file_a, "rb") as f:
        head_a = f.read(12 + 4 * len(toks_a))
    with open(os.path.join(splice, name_a), "wb") as f:
        f.write(head_a + body_b)
    mark_saved(splice, name_a)
    neg, _ = run_app(one_common + ["--cache-dir", splice], "splice")
    check(neg[0]["prefix_source"] == "loaded" and neg[0]["prefix_match"] is True,
          "splice: prompt 0's header and tokens on prompt 2's state body load as prompt 0")
    check(neg[0]["gen_tokens"] != ref_toks[0],
          "splice: the state body (not the token list) decides the tokens")

    bad = os.path.join(work, "cache-badmagic")
    os.makedirs(bad)
    with open(file_a, "rb") as f:
        good = f.read()
    badbytes = b"XXXX" + good[4:]
    with open(os.path.join(bad, name_a), "wb") as f:
        f.write(badbytes)
    mark_saved(bad, name_a)
    res, s = run_app(one_common + ["--cache-dir", bad], "bad magic")
    check(res[0]["prefix_source"] == "evaluated" and "load_error" in res[0]
          and s["load_errors"] == 1 and res[0]["saved"] is False,
          "bad magic: the load fails with an error (%r), the prefix is evaluated, not saved"
          % res[0].get("load_error"))
    check(res[0]["gen_tokens"] == ref_toks[0], "bad magic: tokens == reference")
    with open(os.path.join(bad, name_a), "rb") as f:
        check(f.read() == badbytes, "bad magic: the file is left as it was")

    trunc = os.path.join(work, "cache-trunc")
    os.makedirs(trunc)
    with open(os.path.join(trunc, name_a), "wb") as f:
        f.write(good[:len(good) // 2])
    mark_saved(trunc, name_a)
    p = subprocess.run(["node", APP] + one_common + ["--cache-dir", trunc], cwd=HERE,
                       capture_output=True, text=True, timeout=600, preexec_fn=no_core)
    check(p.returncode == -signal.SIGABRT and "GGML_ASSERT" in p.stderr,
          "truncated file: the pinned llama.cpp aborts the engine (exit %d, %s)"
          % (p.returncode, (p.stderr.strip().splitlines() or ["no stderr"])[-1][-80:]))

    cache2 = os.path.join(work, "cache2")
    run_app(common + ["--cache-dir", cache2], "second cache")
    same = all(slurp(os.path.join(cache, n)) == slurp(os.path.join(cache2, n)) for n in states)
    check(sorted(state_files(cache2)) == states and same,
          "a fresh cache directory gets byte-identical state files")

    say("run 1 prefix evaluation %.1f ms mean, run 2 load %.1f ms mean"
        % (s1["prefix_ms_evaluated_mean"], s2["prefix_ms_loaded_mean"]))


if __name__ == "__main__":
    sys.exit(llama_e2e.main(globals(), Case))
