#!/usr/bin/env python3
"""End-to-end checks of kvshim's llama.cpp state adapter in an unmodified engine (app.mjs on
node-llama-cpp 3.21.1), one case per ctest test (label e2e).

Every case: scripts/llama-setup (exit 77, the ctest skip code, when Node.js or the npm registry is
missing), a generated model (scripts/tiny-gguf), and reference tokens from app.mjs --no-cache
without kvshim. LD_PRELOAD is set only in the engine processes' environment; every case has its
own temporary KVSHIM_RUN_DIR (so its peers are only its own processes), and KVSHIM_* variables
inherited from the caller are dropped. KVSHIM_LLAMA_PREFIX=0: these cases check the state file
adapter (design 10.2), not the transparent prefix cache. Engines save with
KVSHIM_LLAMA_WRITE_THROUGH=0, so a
restored state can only have come through kvshim: the cache directory holds the app's .saved
marker and no state file, and the real llama_state_seq_load_file would fail on the missing file.
Process A evaluates prefix P and saves it; process B (fresh, same cache directory, prompt P +
another suffix) asks for the same path.

  peer       A stays alive (app.mjs --barrier-*) and B restores P from A's pool through the peer
             protocol: B loads, its tokens == the --no-cache reference, its KVSHIM_STATS shows
             hook_hits >= 1 and peer_hits >= 1, and no state file exists; `kvshim peers` lists A.
  serve      `kvshim serve` runs; A saves straight into its pool (one copy per node,
             KVSHIM_ONE_COPY=1: cache_peer_stores, nothing kept or pushed) and exits; B restores
             P from the serve peer: same checks (check_onecopy.py: the node's bytes, the
             KVSHIM_ONE_COPY=0 arm, serve killed).
  negative   the state really decides B's tokens: A evaluates another prefix Q and saves it under
             the name B asks for (app.mjs --state-name); B restores it through kvshim: the app
             sees the tokens differ, B's tokens differ from the reference and equal those of the
             same wrong state loaded from a file without kvshim.
  isolation  a second model of the same shape (same tiny-gguf flags, another --seed) never gets
             the first model's state: B on model 2 asks A (model 1) for the same path, misses,
             evaluates, and its tokens == model 2's reference (!= model 1's).
  fault      A is stopped (SIGSTOP): B, with KVSHIM_RPC_TIMEOUT_MS=300, times out, falls back and
             produces the reference tokens; then a second B (timeout 20 s) connects to the
             stopped A, A is killed (SIGKILL) while B waits for its reply, and B falls back well
             before its deadline with the reference tokens.
  inspect    `kvshim inspect --json` on the node addon (llama-addon.node) reports every llama.cpp
             hook that the addon or libllama-common calls interposable (the others: unreached),
             the state save/load functions imported through the addon's PLT, and both llama.cpp
             features (state adapter, prefix cache) available.

Usage: check_kvshim.py CASE --preload LIBKVSHIM --kvshim CLI [--work-dir DIR] [--keep]
                       [--no-setup] [--asan-runtime LIBASAN]      (--list: the cases)
(--asan-runtime: a sanitized libkvshim.so; LIBASAN goes first in the engines' LD_PRELOAD, with
leak detection off: node itself is not instrumented and keeps memory until exit.)
Exit status: 0 pass, 1 fail, 77 skipped (no Node.js >= 20 or no npm registry), 2 bad usage.
"""

import glob
import json
import os
import random
import signal
import subprocess
import sys
import time

from llama_e2e import HERE, say  # noqa: E402 (puts tests/lib on sys.path)
from harness import Context, Failure, check, read_stats, stop_process  # noqa: E402
import llama_e2e  # noqa: E402

APP = os.path.join(HERE, "app.mjs")

# A small model: every engine run takes about a second on one thread. Same shape, two seeds.
MODEL = dict(layers=4, embd=256, heads=4, kv_heads=4, ffn=512, vocab=1024, ctx=1024)
SEED_1, SEED_2 = 7, 8
PREFIX_TOKENS = 96
SUFFIX_TOKENS = 12
GEN_TOKENS = 12
RUN_TIMEOUT_S = 300


def token_prompts():
    """Prefixes P and Q (BOS + random ids, the same length) and suffixes a and b."""
    r = random.Random(2024)
    ids = lambda n: [r.randrange(300, MODEL["vocab"]) for _ in range(n)]  # noqa: E731
    p, q = [1] + ids(PREFIX_TOKENS - 1), [1] + ids(PREFIX_TOKENS - 1)
    a, b = ids(SUFFIX_TOKENS), ids(SUFFIX_TOKENS)
    return {"PA": p + a, "PB": p + b, "QA": q + a}


class Case(Context):
    """Sockets live in the harness's short temporary directory (a Unix socket path has 108
    bytes), files in the work directory."""
    preload_env = {"KVSHIM_LLAMA_WRITE_THROUGH": "0", "KVSHIM_LLAMA_PREFIX": "0",
                   "KVSHIM_POOL_SIZE": "256M", "KVSHIM_HOST_POOL_SIZE": "0"}
    asan_env = {"ASAN_OPTIONS": "detect_leaks=0"}

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        for what, path in (("--preload", args.preload), ("--kvshim", args.kvshim)):
            if not os.path.isfile(path):
                raise Failure("%s %s does not exist (build it first)" % (what, path))
        llama_e2e.setup(args)
        self.preload = os.path.abspath(args.preload)
        self.kvshim = os.path.abspath(args.kvshim)
        self.base_env = self.env(preload=False)
        self.prompts = {}
        for name, toks in token_prompts().items():
            path = os.path.join(work, name + ".json")
            with open(path, "w") as f:
                json.dump([{"tokens": toks}], f)
            self.prompts[name] = path
        self.models = {}

    # ---- environments ----------------------------------------------------------------------

    def kvshim_env(self, stats_name, **extra):
        """An engine under kvshim: LD_PRELOAD, this case's run dir, no write-through."""
        return self.env(KVSHIM_STATS=os.path.join(self.work, stats_name + ".%p.json"), **extra)

    def cli_env(self):
        return self.env(preload=False)

    def stats_of(self, stats_name, pid):
        return read_stats(os.path.join(self.work, "%s.%d.json" % (stats_name, pid)))

    # ---- models and engine runs ------------------------------------------------------------

    def model(self, seed):
        if seed not in self.models:
            self.models[seed] = llama_e2e.tiny_model(
                os.path.join(self.work, "model-seed%d.gguf" % seed), MODEL, seed)
        return self.models[seed]

    def app_args(self, seed, prompt, extra):
        return (["node", APP, "--model", self.model(seed), "--prompts", self.prompts[prompt],
                 "--tokens", str(GEN_TOKENS), "--prefix-tokens", str(PREFIX_TOKENS),
                 "--ctx-size", "512"] + extra)

    def start(self, what, seed, prompt, extra, env):
        cmd = self.app_args(seed, prompt, extra)
        p = self.spawn(cmd, env, text=True, cwd=HERE)
        p.what = what
        return p

    def finish(self, p, timeout=RUN_TIMEOUT_S):
        """Wait for an engine; its per-prompt lines and summary (Failure otherwise)."""
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            sys.stderr.write(err)
            raise Failure("%s: app.mjs still running after %d s" % (p.what, timeout))
        if p.returncode != 0:
            sys.stderr.write(err)
            raise Failure("%s: app.mjs exited %d" % (p.what, p.returncode))
        lines = [json.loads(x) for x in out.splitlines() if x.strip().startswith("{")]
        if not lines or not lines[-1].get("summary"):
            sys.stderr.write(err)
            raise Failure("%s: no summary line" % p.what)
        p.stderr_text = err
        return lines[:-1], lines[-1]

    def run(self, what, seed, prompt, extra, env=None):
        return self.finish(self.start(what, seed, prompt, extra, env or self.base_env))

    def reference(self, seed, prompt):
        lines, _ = self.run("reference %s model %d" % (prompt, seed), seed, prompt, ["--no-cache"])
        toks = lines[0]["gen_tokens"]
        if len(toks) != GEN_TOKENS:
            raise Failure("reference %s: %d tokens, not %d" % (prompt, len(toks), GEN_TOKENS))
        return toks

    def start_holder(self, what, seed, prompt, cache, stats_name, extra=(), **env):
        """An engine that saves and then stays alive (a kvshim peer) until release()."""
        bar = os.path.join(self.work, "barrier-" + stats_name)
        p = self.start(what, seed, prompt,
                       ["--cache-dir", cache, "--barrier-dir", bar, "--barrier-count", "2"]
                       + list(extra), self.kvshim_env(stats_name, **env))
        p.barrier = bar
        done = os.path.join(bar, "done.%d" % p.pid)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not os.path.exists(done):
            if p.poll() is not None:
                self.finish(p)  # raises with its stderr
                raise Failure("%s exited before its barrier" % what)
            if time.monotonic() > deadline:
                raise Failure("%s: not done after %d s" % (what, RUN_TIMEOUT_S))
            time.sleep(0.05)
        return p

    def release(self, p):
        with open(os.path.join(p.barrier, "done.release"), "w") as f:
            f.write("check_kvshim\n")
        return self.finish(p)

    def cache_dir(self, name):
        d = os.path.join(self.work, name)
        os.makedirs(d)
        return d

    def stop_serve(self, serve):
        serve.send_signal(signal.SIGTERM)
        try:
            rc = serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, "kvshim serve stops cleanly on SIGTERM (exit %s)" % rc)

    # ---- shared checks ---------------------------------------------------------------------

    def check_saved_without_file(self, who, line, cache):
        check(line["prefix_source"] == "evaluated" and line["saved"] is True,
              "%s: evaluated its prefix and saved it" % who)
        files = sorted(os.listdir(cache))
        check(any(f.endswith(".saved") for f in files) and
              not any(f.endswith(".seqstate") for f in files),
              "%s: the app's .saved marker exists and no state file was written (%s)"
              % (who, ", ".join(files)))

    def check_restored(self, who, line, summ, stats, cache, ref):
        check(line["prefix_source"] == "loaded" and line["prefix_match"] is True and
              summ["load_errors"] == 0,
              "%s: loaded the prefix state, with the prefix's tokens (prefix_source %s, %s ms)"
              % (who, line["prefix_source"], line.get("prefix_ms")))
        check(line["gen_tokens"] == ref, "%s: tokens == the --no-cache reference" % who)
        check(stats.get("hook_hits", 0) >= 1 and stats.get("peer_hits", 0) >= 1,
              "%s: KVSHIM_STATS hook_hits %d, peer_hits %d, peer_bytes_in %d"
              % (who, stats.get("hook_hits", 0), stats.get("peer_hits", 0),
                 stats.get("peer_bytes_in", 0)))
        check(not any(f.endswith(".seqstate") for f in os.listdir(cache)),
              "%s: still no state file in the cache directory" % who)


# ---- the cases ---------------------------------------------------------------------------------


def case_peer(c):
    ref_a, ref_b = c.reference(SEED_1, "PA"), c.reference(SEED_1, "PB")
    check(ref_a != ref_b, "references: the two suffixes generate different tokens")
    cache = c.cache_dir("cache")
    a = c.start_holder("A", SEED_1, "PA", cache, "a")
    peers = subprocess.run([c.kvshim, "peers", "--json"], env=c.cli_env(), capture_output=True,
                           text=True, timeout=60)
    try:
        listed = json.loads(peers.stdout)
    except ValueError:
        listed = None
    check(peers.returncode == 0 and str(a.pid) in peers.stdout,
          "kvshim peers lists A (pid %d) while it holds: %s"
          % (a.pid, json.dumps(listed)[:300] if listed is not None else peers.stderr.strip()))
    b_lines, b_sum = c.run("B", SEED_1, "PB", ["--cache-dir", cache], c.kvshim_env("b"))
    b = c.procs[-1]
    a_lines, _ = c.release(a)
    c.check_saved_without_file("A", a_lines[0], cache)
    check(a_lines[0]["gen_tokens"] == ref_a, "A: tokens == the --no-cache reference")
    a_stats = c.stats_of("a", a.pid)
    check(a_stats.get("hook_stores", 0) >= 1 and a_stats.get("coord_requests", 0) >= 1,
          "A: KVSHIM_STATS hook_stores %d, coord_requests %d (it served B)"
          % (a_stats.get("hook_stores", 0), a_stats.get("coord_requests", 0)))
    c.check_restored("B", b_lines[0], b_sum, c.stats_of("b", b.pid), cache, ref_b)


def case_serve(c):
    ref_b = c.reference(SEED_1, "PB")
    cache = c.cache_dir("cache")
    serve = c.serve("256M")
    if serve.poll() is not None or ".sock" not in serve.banner:
        raise Failure("kvshim serve did not start: %s" % serve.banner)
    say(serve.banner.strip())
    a_lines, _ = c.run("A", SEED_1, "PA", ["--cache-dir", cache], c.kvshim_env("a"))
    a = c.procs[-1]
    c.check_saved_without_file("A", a_lines[0], cache)
    a_stats = c.stats_of("a", a.pid)
    check(a_stats.get("hook_stores", 0) >= 1 and a_stats.get("cache_peer_stores", 0) >= 1 and
          a_stats.get("push_queued", 0) == 0 and a_stats.get("store_used_bytes") == 0,
          "A: saved straight into kvshim serve's pool, kept and pushed nothing (hook_stores %d, "
          "cache_peer_stores %d, push_queued %d, store_used_bytes %s)"
          % (a_stats.get("hook_stores", 0), a_stats.get("cache_peer_stores", 0),
             a_stats.get("push_queued", 0), a_stats.get("store_used_bytes")))
    st = subprocess.run([c.kvshim, "stats", str(serve.pid), "--json"], env=c.cli_env(),
                        capture_output=True, text=True, timeout=60)
    check(st.returncode == 0 and '"store_objects":1' in st.stdout.replace(" ", ""),
          "kvshim stats of serve: it holds A's state after A exited (%s)"
          % (st.stdout.strip()[:200] or st.stderr.strip()))
    b_lines, b_sum = c.run("B", SEED_1, "PB", ["--cache-dir", cache], c.kvshim_env("b"))
    b = c.procs[-1]
    c.check_restored("B", b_lines[0], b_sum, c.stats_of("b", b.pid), cache, ref_b)
    c.stop_serve(serve)


def case_negative(c):
    ref_b = c.reference(SEED_1, "PB")
    name = ["--state-name", "shared-name"]
    # The same wrong state from a file, without kvshim: Q's state under the name B asks for.
    disk = c.cache_dir("cache-disk")
    c.run("A on disk", SEED_1, "QA", ["--cache-dir", disk] + name)
    d_lines, _ = c.run("B on disk", SEED_1, "PB", ["--cache-dir", disk] + name)
    check(d_lines[0]["prefix_source"] == "loaded" and d_lines[0]["prefix_match"] is False,
          "without kvshim: B loads Q's state file under its expected name; the app sees the "
          "tokens differ")
    check(d_lines[0]["gen_tokens"] != ref_b,
          "without kvshim: another prefix's state changes B's tokens")
    cache = c.cache_dir("cache")
    a = c.start_holder("A", SEED_1, "QA", cache, "a", name)
    b_lines, b_sum = c.run("B", SEED_1, "PB", ["--cache-dir", cache] + name, c.kvshim_env("b"))
    b = c.procs[-1]
    a_lines, _ = c.release(a)
    c.check_saved_without_file("A", a_lines[0], cache)
    line, stats = b_lines[0], c.stats_of("b", b.pid)
    check(line["prefix_source"] == "loaded" and line["prefix_match"] is False and
          stats.get("hook_hits", 0) >= 1 and stats.get("peer_hits", 0) >= 1,
          "B restores Q's state from A through kvshim (hook_hits %d, peer_hits %d); the app sees "
          "the tokens differ" % (stats.get("hook_hits", 0), stats.get("peer_hits", 0)))
    check(line["gen_tokens"] != ref_b, "B: the restored state changes its tokens (!= reference)")
    check(line["gen_tokens"] == d_lines[0]["gen_tokens"],
          "B: its tokens == those of the same state loaded from a file without kvshim")


def case_isolation(c):
    m1, m2 = c.model(SEED_1), c.model(SEED_2)
    check(os.path.getsize(m1) == os.path.getsize(m2),
          "models 1 and 2: same shape and size (%d bytes), different seeds" % os.path.getsize(m1))
    ref_1, ref_2 = c.reference(SEED_1, "PB"), c.reference(SEED_2, "PB")
    check(ref_1 != ref_2, "references: the two models generate different tokens")
    cache = c.cache_dir("cache")
    a = c.start_holder("A (model 1)", SEED_1, "PA", cache, "a")
    b_lines, b_sum = c.run("B (model 2)", SEED_2, "PB", ["--cache-dir", cache],
                           c.kvshim_env("b"))
    b = c.procs[-1]
    a_lines, _ = c.release(a)
    c.check_saved_without_file("A", a_lines[0], cache)
    line, stats = b_lines[0], c.stats_of("b", b.pid)
    check(stats.get("peer_lookups", 0) >= 1 and stats.get("peer_hits", 0) == 0 and
          stats.get("hook_hits", 0) == 0 and stats.get("hook_misses", 0) >= 1,
          "B on model 2 asked its peer A for the same path and missed (peer_lookups %d, "
          "peer_hits %d, hook_hits %d, hook_misses %d)"
          % (stats.get("peer_lookups", 0), stats.get("peer_hits", 0), stats.get("hook_hits", 0),
             stats.get("hook_misses", 0)))
    check(line["prefix_source"] == "evaluated" and "load_error" in line,
          "B: the real load found no file (%r) and the app evaluated the prefix"
          % line.get("load_error"))
    check(line["gen_tokens"] == ref_2, "B: tokens == model 2's reference")


def unix_socket_entries(path):
    """Sockets bound to path in /proc/net/unix (the listener plus unaccepted connections)."""
    with open("/proc/net/unix") as f:
        return sum(1 for ln in f if ln.rstrip("\n").endswith(" " + path))


def case_fault(c):
    ref_b = c.reference(SEED_1, "PB")
    cache = c.cache_dir("cache")
    a = c.start_holder("A", SEED_1, "PA", cache, "a")
    socks = glob.glob(os.path.join(c.run_dir, "*", "*.sock"))
    if len(socks) != 1:
        raise Failure("expected A's one socket in %s, found %s" % (c.run_dir, socks))
    sock = socks[0]
    stop_process(a)  # every thread of A stopped: none can still answer B
    say("A (pid %d) stopped" % a.pid)

    t0 = time.monotonic()
    b_lines, _ = c.run("B1", SEED_1, "PB", ["--cache-dir", cache],
                       c.kvshim_env("b1", KVSHIM_RPC_TIMEOUT_MS=300))
    b1 = c.procs[-1]
    line, stats = b_lines[0], c.stats_of("b1", b1.pid)
    check(stats.get("hook_hits", 0) == 0 and stats.get("peer_errors", 0) +
          stats.get("peer_misses", 0) >= 1,
          "B1 (A stopped, KVSHIM_RPC_TIMEOUT_MS=300): the peer call failed (peer_errors %d, "
          "peer_misses %d), no hit" % (stats.get("peer_errors", 0), stats.get("peer_misses", 0)))
    check(line["prefix_source"] == "evaluated" and line["gen_tokens"] == ref_b,
          "B1: fell back, evaluated the prefix, tokens == reference (%.1f s in all)"
          % (time.monotonic() - t0))

    before = unix_socket_entries(sock)
    b2 = c.start("B2", SEED_1, "PB", ["--cache-dir", cache],
                 c.kvshim_env("b2", KVSHIM_RPC_TIMEOUT_MS=20000))
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while unix_socket_entries(sock) <= before:
        if b2.poll() is not None or time.monotonic() > deadline:
            raise Failure("B2 never connected to the stopped A (%d entries for %s)"
                        % (unix_socket_entries(sock), sock))
        time.sleep(0.005)
    t_kill = time.monotonic()
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    say("B2 connected to the stopped A; A (pid %d) killed" % a.pid)
    b_lines, _ = c.finish(b2)
    after_kill = time.monotonic() - t_kill
    line, stats = b_lines[0], c.stats_of("b2", b2.pid)
    check(stats.get("hook_hits", 0) == 0 and stats.get("peer_errors", 0) +
          stats.get("peer_misses", 0) >= 1,
          "B2: A's death is a failed peer call (peer_errors %d, peer_misses %d), no hit"
          % (stats.get("peer_errors", 0), stats.get("peer_misses", 0)))
    check(line["prefix_source"] == "evaluated" and line["gen_tokens"] == ref_b,
          "B2: fell back, evaluated the prefix, tokens == reference")
    check(after_kill < 15.0,
          "B2: finished %.1f s after the kill, well inside its 20 s RPC deadline" % after_kill)
    check(a.returncode == -signal.SIGKILL, "A died of SIGKILL")


def case_inspect(c):
    addons = sorted(glob.glob(os.path.join(HERE, "node_modules", "@node-llama-cpp", "*", "bins",
                                           "*", "llama-addon.node")))
    if not addons:
        raise Failure("no node_modules/@node-llama-cpp/*/bins/*/llama-addon.node")
    addon = addons[0]
    p = subprocess.run([c.kvshim, "inspect", addon, "--json"], env=c.cli_env(),
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, "kvshim inspect %s exits 0 (%d)" % (os.path.relpath(addon, HERE),
                                                              p.returncode))
    try:
        doc = json.loads(p.stdout)
    except ValueError as e:
        raise Failure("kvshim inspect --json: not JSON (%s): %s" % (e, p.stdout[:200]))
    fam = [f for f in doc.get("families", []) if f.get("family") == "llama"]
    if not check(len(fam) == 1, "the report has one llama family"):
        return
    fam = fam[0]
    # every hook some object of the closure calls is interposable; the rest are defined in
    # libllama but called by nothing here (unreached): LD_PRELOAD would never see them
    unreached = [s["name"] for s in fam["symbols"] if s["verdict"] == "no"]
    check(fam["present"] == fam["hooks"] > 0 and fam["partial"] == 0 and
          all(s["reason"] == "unreached" for s in fam["symbols"] if s["verdict"] == "no") and
          fam["interposable"] + len(unreached) == fam["hooks"],
          "llama family: %d/%d hooks present, %d interposable, unreached: %s (%s)"
          % (fam["present"], fam["hooks"], fam["interposable"], unreached, fam.get("summary")))
    feats = {f["name"]: f["state"] for f in fam["features"]}
    check(feats == {"state adapter": "available", "prefix cache": "available"},
          "both llama.cpp features are available: %s" % feats)
    defined = doc["objects"][fam["defined_in"]]
    check(defined["soname"].startswith("libllama"),
          "the hooks are defined in %s" % defined["soname"])
    syms = {s["name"]: s for s in fam["symbols"]}
    for name in ("llama_state_seq_save_file", "llama_state_seq_load_file",
                 "llama_model_load_from_file"):
        s = syms.get(name)
        plt = s and any(u["role"] == "import" and u["name"] == "llama-addon.node" and
                        u["jump_slot"] >= 1 and u["interposable"] for u in s["uses"])
        check(bool(s) and s["verdict"] == "yes" and s["interposable"] and plt,
              "%s: interposable, imported by llama-addon.node through its PLT" % name)


if __name__ == "__main__":
    sys.exit(llama_e2e.main(globals(), Case, "--preload", "--kvshim", asan=True))
