#!/usr/bin/env python3
"""End-to-end checks of kvshim's transparent prefix cache (design §10.3) in unmodified
node-llama-cpp 3.21.1 engines: its CLI (`npx node-llama-cpp complete`) and prefix_app.mjs. One
case per ctest test (label e2e).

Every case: scripts/llama-setup (exit 77, the ctest skip code, when Node.js or the npm registry
is missing) and a generated model (scripts/tiny-gguf). Each engine run is repeated without
kvshim: that run is the reference, and the run under kvshim must produce exactly the same
tokens. LD_PRELOAD is set only in the engines' environment; every case has its own
KVSHIM_RUN_DIR; KVSHIM_* variables inherited from the caller are dropped. Prompts share a
system prefix of about 1,100 tokens (generated English-like text).

  cli         `kvshim serve` is the cache peer. CLI A completes prompt PA and exits; CLI B (a
              new process) completes PB, which shares PA's long prefix: B's completion equals
              B without kvshim, its KVSHIM_STATS show restored tokens fetched from the peer and
              its prompt evaluation counts fewer tokens. Once with one batch for the prompt
              (--batchSize 2048), once with the default 512 (whole batches inside the cached
              prefix are not decoded, the last one restored up to a multiple of 64): >= 90% of
              B's prompt is restored either way.
  app         prefix_app.mjs, one context with three sequences, prompts sharing the prefix,
              in one batch and in batches of 512: identical tokens, restores counted.
  divergence  prompts sharing only part of a chunk (restored up to a multiple of 64 within
              it); a sequence that context shift shifted (small context, long generation); an
              output on every prompt token (nothing may be skipped); several sequences
              evaluated at once (batches mixing sequences): all identical to the runs without
              kvshim.
  faults      with A's states in `kvshim serve`: a model of the same shape with other weights
              and a context with another KV type never restore them; a pool too small for a
              state stores nothing; the cache peer stopped (short RPC deadline) and killed
              while B waits for it: B falls back; identical tokens every time.
  sequences   prompt A stored by a context of two sequences (through `kvshim serve`; a state
              loads only into a context with as many KV streams); a new process evaluates B
              and C at once on two sequences of one context (batches holding both): both
              restore the cached prefix, identical tokens (default 512 and 2048 batches).
  four        four processes started together, cold, on prompts sharing the prefix (512
              batches, `kvshim serve`): identical tokens; the shared batches are computed once
              (claims) and restored by the three others (single flight).
  swa         a sliding-window model (tiny_swa.py: OLMo2, 256-token window on 3 of 4 layers),
              which node-llama-cpp runs without swa_full: only states ending on a chunk
              boundary are stored, each restored whole (untrimmed): identical.
  disabled    KVSHIM_ENABLE=0 and KVSHIM_LLAMA_PREFIX=0: identical, nothing restored.
  chunks      KVSHIM_LLAMA_CHUNKS=1: three prompts sharing the prefix: the real engine's states
              split, the shared chunks stored once, restores by assembly: identical tokens.
  inspect     `kvshim inspect --json` on the addon (libllama in its closure): llama_get_logits_ith
              is reached from inside libllama (its sampler) through a JUMP_SLOT relocation, so
              the index remap covers it; llama_decode and the memory calls are interposable.

Usage: check_prefix.py CASE --preload LIBKVSHIM --kvshim CLI [--work-dir DIR] [--keep]
                       [--no-setup] [--asan-runtime LIBASAN]      (--list: the cases)
Exit status: 0 pass, 1 fail, 77 skipped (no Node.js >= 20 or no npm registry), 2 bad usage.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

from llama_e2e import HERE, LIBDIR, text  # noqa: E402 (puts tests/lib on sys.path)
from harness import Context, Failure, check, stop_process, sum_stats  # noqa: E402
import llama_e2e  # noqa: E402

APP = os.path.join(HERE, "prefix_app.mjs")
RUN_TIMEOUT_S = 300
MODEL = dict(layers=2, embd=128)

SYSTEM = text(1, 1100)
PROMPTS = {
    "A": SYSTEM + " question one is about the water",
    "B": SYSTEM + " now a different question about people and time",
    "C": SYSTEM + " and the third thing to say is good",
    "short": text(1, 330) + " " + text(5, 400),     # shares about 330 tokens (part of a chunk)
    "other": text(9, 1100),
    # the shared prefix, then a suffix of more than a chunk of its own (chunk storage)
    "L1": SYSTEM + " " + text(11, 400),
    "L2": SYSTEM + " " + text(12, 400),
    "L3": SYSTEM + " " + text(13, 400),
}


class Case(Context):
    """Sockets live in the harness's short temporary directory, files in the work directory."""
    asan_env = {"ASAN_OPTIONS": "detect_leaks=0"}
    preload_env = {"KVSHIM_POOL_SIZE": "512M", "KVSHIM_HOST_POOL_SIZE": "0", "KVSHIM_LOG": "info"}

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        llama_e2e.setup(args, skip_without_modules=False)
        self.preload = os.path.abspath(args.preload)
        self.kvshim = os.path.abspath(args.kvshim)
        self.files = {}
        for name, t in PROMPTS.items():
            path = os.path.join(work, name + ".txt")
            with open(path, "w") as f:
                f.write(t)
            self.files[name] = path
        self.models = {}
        self.group = "prefix"

    def model(self, seed=7):
        if seed not in self.models:
            self.models[seed] = llama_e2e.tiny_model(
                os.path.join(self.work, "model-%d.gguf" % seed), MODEL, seed)
        return self.models[seed]

    def env(self, preload=True, **extra):
        """KVSHIM_GROUP is the round's group; under kvshim each run has its own stats files."""
        if preload:
            self.n += 1
            extra.setdefault("KVSHIM_STATS", os.path.join(self.work, "stats%d.%%p.json" % self.n))
        return super().env(preload, KVSHIM_GROUP=self.group, **extra)

    def stats(self, env):
        """The stats of the one process of a run that wrote any (summed if several did)."""
        return sum_stats(env["KVSHIM_STATS"].replace("%p", "*"))

    def serve(self, pool="512M"):
        return super().serve(pool)

    # ---- the CLI ------------------------------------------------------------------------------

    def cli_start(self, prompt, env, batch=None, seed=7, extra=()):
        cmd = ["npx", "--no-install", "node-llama-cpp", "complete", "--model", self.model(seed),
               "--textFile", self.files[prompt], "--gpu", "false", "--contextSize", "2048",
               "--threads", "1", "--temperature", "0", "--maxTokens", "16", "--printTimings"]
        if batch:
            cmd += ["--batchSize", str(batch)]
        cmd += list(extra)
        return self.spawn(cmd, env, stdin=subprocess.PIPE, cwd=HERE)

    def cli_finish(self, p, what):
        try:
            out, err = p.communicate(input=b".exit\n", timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            raise Failure("%s: the CLI still runs after %d s" % (what, RUN_TIMEOUT_S))
        # The completion is on stdout; llama.cpp's timings may come on either stream, and
        # kvshim's log lines (stderr) must not be mistaken for engine output.
        out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode("utf-8", "replace"))
        err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err.decode("utf-8", "replace"))
        comp = [l for l in out.splitlines() if l.startswith("Completion: ")]
        ev = re.search(r"prompt eval time =\s*([0-9.]+) ms /\s*([0-9]+) tokens", out + err)
        if p.returncode != 0 or len(comp) != 1 or not ev:
            sys.stderr.write(out[-3000:] + err[-3000:])
            raise Failure("%s: the CLI exited %d without one completion and its timings"
                        % (what, p.returncode))
        return {"completion": comp[0], "eval_ms": float(ev.group(1)),
                "eval_tokens": int(ev.group(2)), "output": out, "log": err}

    def cli(self, what, prompt, kvshim, batch=None, seed=7, extra=(), **env_extra):
        env = self.env(kvshim, **env_extra)
        r = self.cli_finish(self.cli_start(prompt, env, batch, seed, extra), what)
        r["stats"] = self.stats(env) if kvshim else {}
        return r

    # ---- prefix_app.mjs -----------------------------------------------------------------------

    def app(self, what, prompts, kvshim, flags=(), seed=7, **env_extra):
        path = os.path.join(self.work, "prompts-%s.json" % re.sub(r"\W", "_", what))
        with open(path, "w") as f:
            json.dump([PROMPTS[p] for p in prompts], f)
        env = self.env(kvshim, **env_extra)
        cmd = ["node", APP, "--model", self.model(seed), "--prompts", path] + list(flags)
        p = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-4000:])
            raise Failure("%s: prefix_app.mjs exited %d" % (what, p.returncode))
        lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        outs = [(l["prompt"], l["seq"], l["prompt_tokens"], l.get("gen_tokens"),
                 l.get("next_tokens")) for l in lines if not l.get("summary")]
        return {"outs": outs, "summary": lines[-1], "stats": self.stats(env) if kvshim else {}}


def pstat(r, name):
    return r["stats"].get("llama_prefix_" + name, 0)


def show(r):
    return {k[13:]: v for k, v in r["stats"].items() if k.startswith("llama_prefix_")}


# Sequences evaluated at once (--concurrent) are not deterministic in node-llama-cpp itself:
# which tokens of which sequence share a batch depends on timing, and the batch shape changes
# the floating-point sums. Measured without kvshim (node-llama-cpp 3.21.1, 2 sequences, 6 runs
# each): 2 distinct outputs with 512-token batches and 2 with 2048. There, kvshim's output must
# be one that the engine alone produces: the reference is sampled up to REF_SAMPLES times.
# One of the engine's outputs is rare: in 50 runs without kvshim and 35 with it (under load,
# batch 2048) it came once each, token for token the same, so 6 samples miss it ~88% of the
# time and a kvshim run that lands on it would fail (2 in 16 runs did). Such a run is repeated,
# up to KVSHIM_TRIES runs in all, against every reference sampled: an output that kvshim
# changes fails every try. Three tries still failed once in a fresh-clone CI run under load
# (2026-12-08, after 16 passes of the test alone and beside a busy core): five now. When
# every try fails, every output seen is kept in the work directory (outs-*.json).
REF_SAMPLES = 6
KVSHIM_TRIES = 5


def same_app(c, what, prompts, flags=(), seed=7, **env_extra):
    ref = c.app(what + " (reference)", prompts, False, flags, seed)
    got = c.app(what, prompts, True, flags, seed, **env_extra)
    refs = [ref["outs"]]
    tried = [got["outs"]]
    while "--concurrent" in flags and got["outs"] not in refs:
        if len(refs) < REF_SAMPLES:
            refs.append(c.app(what + " (reference %d)" % len(refs), prompts, False, flags,
                              seed)["outs"])
        elif len(tried) < KVSHIM_TRIES:
            got = c.app(what + " (try %d)" % (len(tried) + 1), prompts, True, flags, seed,
                        **env_extra)
            tried.append(got["outs"])
        else:
            break
    if got["outs"] not in refs:
        with open(os.path.join(c.work, "outs-%s.json" % re.sub(r"\W", "_", what)), "w") as f:
            json.dump({"references": refs, "kvshim_runs": tried}, f)
    check(got["outs"] in refs, "%s: tokens identical to a run without kvshim (%d sampled, "
          "%d kvshim runs) %s" % (what, len(refs), len(tried), show(got)))
    return got


# ---- cases ------------------------------------------------------------------------------------

def case_cli(c):
    for batch in (2048, None):
        tag = "batch %s" % (batch or "default (512)")
        c.group = "cli%s" % (batch or "default")  # each round starts with nothing cached
        c.serve()
        ref_b = c.cli("B reference, " + tag, "B", False, batch)
        a = c.cli("A, " + tag, "A", True, batch)
        check(pstat(a, "snapshots") >= 1 and a["stats"].get("cache_peer_stores", 0) >= 1 and
              a["stats"].get("store_used_bytes") == 0,  # one copy per node (issue 13)
              "%s: A stored its prompt's state straight into serve's pool %s" % (tag, show(a)))
        b = c.cli("B, " + tag, "B", True, batch)
        check(b["completion"] == ref_b["completion"],
              "%s: B's completion equals B without kvshim:\n     %s\n     %s"
              % (tag, ref_b["completion"], b["completion"]))
        check(pstat(b, "restored_tokens") >= 0.9 * ref_b["eval_tokens"] and
              pstat(b, "peer_restores") >= 1,
              "%s: B restored >= 90%% of its %d prompt tokens (the shared prefix) from the "
              "cache peer %s" % (tag, ref_b["eval_tokens"], show(b)))
        check(b["eval_tokens"] + pstat(b, "restored_tokens") == ref_b["eval_tokens"],
              "%s: B evaluated %d prompt tokens instead of %d (%.1f ms instead of %.1f)"
              % (tag, b["eval_tokens"], ref_b["eval_tokens"], b["eval_ms"], ref_b["eval_ms"]))


def case_app(c):
    for bs in ("2048", "512"):
        r = same_app(c, "three sequences, batch " + bs, ["A", "B", "C"],
                     ["--sequences", "3", "--batch-size", bs], KVSHIM_PEERS=0)
        check(pstat(r, "restores") >= 2 and pstat(r, "snapshots") >= 1,
              "batch %s: the second and third prompts restored the first's prefix %s"
              % (bs, show(r)))


def case_divergence(c):
    r = same_app(c, "part of a chunk", ["A", "short"], ["--batch-size", "2048"], KVSHIM_PEERS=0)
    check(pstat(r, "restored_tokens") % 64 == 0 and 0 < pstat(r, "restored_tokens") <= 330,
          "the shared part restored up to a multiple of 64 (about 330 tokens shared) %s"
          % show(r))
    r = same_app(c, "context shift", ["A", "B", "A"],
                 ["--ctx-size", "1280", "--tokens", "400", "--batch-size", "2048"],
                 KVSHIM_PEERS=0)
    check(pstat(r, "passthrough") >= 100, "the shifted sequence was passed through %s" % show(r))
    check(pstat(r, "restores") >= 2, "cleared sequences were restored into again %s" % show(r))
    r = same_app(c, "an output on every token", ["A", "B"],
                 ["--outputs", "all", "--batch-size", "2048"], KVSHIM_PEERS=0)
    check(pstat(r, "restored_tokens") == 0, "no token with an output skipped %s" % show(r))
    r = same_app(c, "several sequences at once", ["A", "B", "C"],
                 ["--sequences", "3", "--concurrent", "--batch-size", "2048"], KVSHIM_PEERS=0)
    check(pstat(r, "passthrough") >= 1, "batches of several sequences passed through %s"
          % show(r))
    r = same_app(c, "other prompts after the prefix", ["A", "other", "B"],
                 ["--batch-size", "512", "--tokens", "24"], KVSHIM_PEERS=0)


def case_sequences(c):
    c.serve()
    # a state loads only into a context with as many KV streams: A also has two sequences
    a = c.app("A", ["A"], True, ["--sequences", "2", "--batch-size", "512"])
    check(pstat(a, "snapshots") >= 1, "A stored its prompt's state %s" % show(a))
    for bs in ("512", "2048"):
        r = same_app(c, "two sequences at once, batch " + bs, ["B", "C"],
                     ["--sequences", "2", "--concurrent", "--batch-size", bs])
        check(pstat(r, "restores") >= 2 and pstat(r, "restored_tokens") >= 2 * 512,
              "batch %s: both sequences restored the cached prefix %s" % (bs, show(r)))


def case_four(c):
    """Four processes start together, cold, on prompts sharing the prefix: one computes each
    batch of it, the others wait for its claim and restore its progress."""
    c.serve()
    names = ["A", "B", "C", "A"]
    refs, procs = [], []
    for i, name in enumerate(names):
        refs.append(c.app("reference %d" % i, [name], False, ["--batch-size", "512"])["outs"])
    for i, name in enumerate(names):
        path = os.path.join(c.work, "prompts-four-%d.json" % i)
        with open(path, "w") as f:
            json.dump([PROMPTS[name]], f)
        env = c.env(True)
        cmd = ["node", APP, "--model", c.model(), "--prompts", path, "--batch-size", "512"]
        procs.append((env, c.spawn(cmd, env, text=True, cwd=HERE)))
    total = {}
    for i, (env, p) in enumerate(procs):
        out, err = p.communicate(timeout=RUN_TIMEOUT_S)
        check(p.returncode == 0, "process %d exited %d: %s" % (i, p.returncode, err[-2000:]))
        lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        outs = [(l["prompt"], l["seq"], l["prompt_tokens"], l.get("gen_tokens"),
                 l.get("next_tokens")) for l in lines if not l.get("summary")]
        check(outs == refs[i], "process %d: tokens identical to its run without kvshim" % i)
        for k, v in c.stats(env).items():
            if k.startswith("llama_prefix_"):
                total[k[13:]] = total.get(k[13:], 0) + v
    # 1,024 shared tokens in two 512-token batches: computed once (claims), restored thrice.
    # Claims are not atomic across processes: two that look at the same moment can both claim
    # a batch (README: "a race can still leave two computing, never none"), so one 512-token
    # batch computed twice is allowed; without single flight, four cold starts restore nothing.
    check(total.get("claims", 0) <= 2 + 4 and total.get("restored_tokens", 0) >= 3 * 1024 - 512,
          "the shared prefix was computed about once: %s" % total)


def case_swa(c):
    """A sliding-window model (OLMo2, a 256-token window on 3 of 4 layers, tiny_swa.py):
    node-llama-cpp runs it without swa_full, so a state can never be trimmed: only states that
    end on a chunk boundary are stored (after the no-output batches [0,512) and [512,1024), not
    at the prompt's end) and each is restored whole, untrimmed: identical tokens."""
    path = os.path.join(c.work, "swa.gguf")
    subprocess.run([sys.executable, os.path.join(HERE, "tiny_swa.py"), "-q", "--swa", "256",
                    "--layers", "4", "--embd", "256", "--out", path], check=True)
    c.models["swa"] = path
    r = same_app(c, "sliding window, batch 512", ["A", "B", "A"], ["--batch-size", "512"],
                 seed="swa", KVSHIM_PEERS=0)
    check(pstat(r, "snapshots") == 2 and pstat(r, "restores") == 4 and
          pstat(r, "restored_tokens") == 4 * 512 and pstat(r, "restore_failures") == 0,
          "B and A again skip the batches [0,512) and [512,1024), each an untrimmed state %s"
          % show(r))


def case_faults(c):
    serve = c.serve()
    a = c.cli("A", "A", True, 2048)
    check(pstat(a, "snapshots") >= 1, "A stored its state %s" % show(a))
    # another model of the same shape (other weights)
    ref = c.cli("B reference, model 2", "B", False, 2048, seed=8)
    b = c.cli("B, model 2", "B", True, 2048, seed=8)
    check(b["completion"] == ref["completion"] and pstat(b, "restores") == 0,
          "another model never gets A's state; identical %s" % show(b))
    # another KV type
    kv = ("--kvCacheKeyType", "Q8_0", "--kvCacheValueType", "Q8_0")
    ref = c.cli("B reference, Q8_0 KV", "B", False, 2048, extra=kv)
    b = c.cli("B, Q8_0 KV", "B", True, 2048, extra=kv)
    check(b["completion"] == ref["completion"] and pstat(b, "restores") == 0,
          "a Q8_0 KV context never gets A's F16 state; identical %s" % show(b))
    # a pool too small for the state
    ref_b = c.cli("B reference", "B", False, 2048)
    b = c.cli("B, 1M pool, no peers", "B", True, 2048, KVSHIM_POOL_SIZE="1M", KVSHIM_PEERS=0)
    check(b["completion"] == ref_b["completion"] and pstat(b, "snapshot_failures") >= 1
          and pstat(b, "restores") == 0, "a full pool stores nothing; identical %s" % show(b))
    # the cache peer stops answering, then dies while B waits for it
    stop_process(serve)  # every thread of serve stopped: none can still answer B
    t0 = time.monotonic()
    b = c.cli("B, peer stopped", "B", True, 2048, KVSHIM_RPC_TIMEOUT_MS=300)
    check(b["completion"] == ref_b["completion"] and pstat(b, "restores") == 0,
          "a stopped cache peer is a miss (%.1f s); identical %s"
          % (time.monotonic() - t0, show(b)))
    env = c.env(True, KVSHIM_RPC_TIMEOUT_MS=20000)
    p = c.cli_start("B", env, 2048)
    time.sleep(4.0)
    check(p.poll() is None, "B still waits for the stopped cache peer when it is killed")
    t1 = time.monotonic()
    serve.send_signal(signal.SIGKILL)
    serve.wait(timeout=10)
    b = c.cli_finish(p, "B, peer killed")
    b["stats"] = c.stats(env)
    check(b["completion"] == ref_b["completion"] and time.monotonic() - t1 < 15,
          "the cache peer killed while B waits: B falls back in %.1f s; identical %s"
          % (time.monotonic() - t1, show(b)))


def case_disabled(c):
    c.serve()
    c.cli("A", "A", True, 2048)
    ref_b = c.cli("B reference", "B", False, 2048)
    for var, val in (("KVSHIM_ENABLE", "0"), ("KVSHIM_LLAMA_PREFIX", "0")):
        b = c.cli("B, %s=%s" % (var, val), "B", True, 2048, **{var: val})
        check(b["completion"] == ref_b["completion"] and pstat(b, "restores") == 0
              and b["eval_tokens"] == ref_b["eval_tokens"],
              "%s=%s: identical, nothing restored %s" % (var, val, show(b)))
    b = c.cli("B, on", "B", True, 2048)
    check(b["completion"] == ref_b["completion"] and pstat(b, "restores") >= 1,
          "control: the same run with the cache on restores %s" % show(b))


def case_chunks(c):
    """KVSHIM_LLAMA_CHUNKS=1 (design §10.4) on the real engine: three prompts sharing the
    system prefix, each with a suffix longer than a chunk, one after another in one context: its states split (none stored whole), the
    prefix's chunks are stored once (dedup counted), the later prompts restore by assembly,
    tokens identical to the run without kvshim; the chunks hold fewer bytes than whole blobs."""
    flags = ["--batch-size", "512"]
    r = same_app(c, "chunks", ["L1", "L2", "L3"], flags, KVSHIM_PEERS=0, KVSHIM_LLAMA_CHUNKS="1")
    ch = {k: v for k, v in r["stats"].items() if k.startswith("llama_chunks_")}
    print("chunks:", ch, show(r))
    check(ch.get("llama_chunks_whole") == 0 and ch.get("llama_chunks_stored", 0) >= 1,
          "the real engine's states split into chunks %s" % ch)
    check(ch.get("llama_chunks_dedup", 0) >= 2 and ch.get("llama_chunks_assembled", 0) >= 2
          and pstat(r, "restores") >= 2,
          "the shared prefix's chunks stored once and restored by assembly %s %s" % (ch, show(r)))
    w = same_app(c, "whole blobs", ["L1", "L2", "L3"], flags, KVSHIM_PEERS=0)
    on, off = pstat(r, "snapshot_bytes"), pstat(w, "snapshot_bytes")
    print("chunks: %d bytes stored as chunks, %d as whole blobs (%.2fx)" % (on, off, off / on))
    check(on < off, "chunk storage stored fewer bytes (%d vs %d)" % (on, off))


def case_inspect(c):
    lib = os.path.join(LIBDIR, "llama-addon.node")  # its closure holds libllama
    p = subprocess.run([c.kvshim, "inspect", "--json", lib], capture_output=True, text=True,
                       timeout=120)
    if not check(p.returncode == 0, "kvshim inspect --json %s" % os.path.basename(lib)):
        return
    fam = [f for f in json.loads(p.stdout)["families"] if f["family"] == "llama"][0]
    syms = {s["name"]: s for s in fam["symbols"]}
    lg = syms.get("llama_get_logits_ith")
    use = lg and [u for u in lg["uses"] if u["role"] == "definition"]
    check(bool(use) and use[0]["jump_slot"] >= 1 and use[0]["direct_calls"] == 0
          and lg["interposable"],
          "libllama's own calls to llama_get_logits_ith (its sampler) go through its PLT: "
          "the index remap covers them (%s)" % (use and use[0]))
    for name in ("llama_decode", "llama_get_embeddings_ith", "llama_memory_seq_rm",
                 "llama_memory_seq_add", "llama_memory_clear"):
        check(name in syms and syms[name]["interposable"], "%s is interposable" % name)


if __name__ == "__main__":
    sys.exit(llama_e2e.main(globals(), Case, "--preload", "--kvshim", asan=True))
