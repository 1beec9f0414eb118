#!/usr/bin/env python3
"""Restore a prefix from a kvshim peer vs evaluate it, on app.mjs (node-llama-cpp 3.21.1).

Not a test (ctest does not run it): it prints the medians that docs/PERF.md (section 6) reports.
On a generated model (scripts/tiny-gguf, default 8 layers x 512 embedding), with --prefixes N
distinct prefixes of --prefix-tokens tokens (BOS + seeded random ids), each followed by 4 tokens:
  evaluate   app.mjs --no-cache: each prefix evaluated (prefix_ms), no kvshim;
  A          under kvshim (KVSHIM_LLAMA_WRITE_THROUGH=0): evaluates and saves every prefix, then
             stays alive as the peer (app.mjs --barrier-*);
  peer       --reps fresh processes B under kvshim, each loading every prefix from A's pool
             (llama_state_seq_load_file served by kvshim: peer retrieve into B's pool + the
             engine's set_data); B's first load also opens the connection to A;
  local      in the same B processes, the same prefixes again: served from B's own pool;
  file       no kvshim: a process saves every prefix to state files, and after each B a fresh
             process loads them (llama.cpp's own load_file, files in the page cache): the
             engine's own restore, the limit of every restore path (node-llama-cpp exposes no
             set_data from memory; its file load is read() into a buffer + the same copy into
             the KV tensors that set_data makes).
The limit is printed beside each restore figure, measured in the same run: per repetition, the
median restore of B over the median load of the file process run right after it (peer / file,
local / file: 1.00 is the engine's own load), then the median [min..max] of those ratios over
the repetitions; likewise evaluate / peer (the issue's goal figure) per repetition.
With --serve KVSHIM_CLI, `kvshim serve` (--serve-pool, default 1G) runs in the group first: A saves
every prefix straight into serve's pool (one copy per node, KVSHIM_ONE_COPY=1), and every load of
B (both passes: "peer" and "local") is checked and handed to set_data in place in serve's pool.
kvshim runs with KVSHIM_LLAMA_PREFIX=0 (the state file adapter alone; --env may change it).
prefix_ms is app.mjs's figure: marker check + loadStateFromFile (or the evaluation) as the
JavaScript caller sees it. Output: one line per figure (median, min..max, n) and, with --json,
the raw samples.
Usage: bench_restore.py --preload LIBKVSHIM [--prefixes 5] [--prefix-tokens 500] [--reps 3]
                        [--pool-size 512M] [--env KVSHIM_X=V ...] [--work-dir DIR] [--json FILE]
                        [--serve KVSHIM_CLI [--serve-pool 1G]]
                        [tiny-gguf flags: --layers 8 --embd 512]
"""

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
APP = os.path.join(HERE, "app.mjs")
TINY_GGUF = os.path.join(ROOT, "scripts", "tiny-gguf")
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from benchfig import spread  # noqa: E402
import harness  # noqa: E402


def run(cmd, env, what):
    p = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        sys.exit("bench_restore: %s exited %d" % (what, p.returncode))
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return lines[:-1], lines[-1]


def fig(name, xs):
    return spread(name, xs, "ms")


def main():
    ap = harness.parser(__doc__, "--preload", optional=("--work-dir", "--json"), prefixes=5,
                        prefix_tokens=500, reps=3, layers=8, embd=512, serve_pool="1G")
    ap.add_argument("--pool-size", default="512M", help="KVSHIM_POOL_SIZE of A and B")
    ap.add_argument("--env", action="append", default=[], metavar="KVSHIM_X=V",
                    help="another KVSHIM_* variable for A and B (repeatable)")
    ap.add_argument("--serve", metavar="KVSHIM_CLI", help="run `kvshim serve` in the group")
    a = ap.parse_args()

    work = a.work_dir or tempfile.mkdtemp(prefix="kvshim-bench-restore-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    run_dir = tempfile.mkdtemp(prefix="kvs-bench-")
    model = os.path.join(work, "model.gguf")
    subprocess.run([sys.executable, TINY_GGUF, "-q", "--out", model, "--layers", str(a.layers),
                    "--embd", str(a.embd)], check=True)
    r = random.Random(500)
    prompts = [[1] + [r.randrange(300, 4096) for _ in range(a.prefix_tokens + 3)]
               for _ in range(a.prefixes)]
    once, twice = os.path.join(work, "once.json"), os.path.join(work, "twice.json")
    with open(once, "w") as f:
        json.dump([{"tokens": t} for t in prompts], f)
    with open(twice, "w") as f:
        json.dump([{"tokens": t} for t in prompts + prompts], f)
    ctx = str(max(1024, a.prefix_tokens + 64))
    common = ["node", APP, "--model", model, "--tokens", "1", "--prefix-tokens",
              str(a.prefix_tokens), "--ctx-size", ctx, "--batch-size", "512"]
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("KVSHIM_") and k != "LD_PRELOAD"}
    kv = dict(base, LD_PRELOAD=os.path.abspath(a.preload), KVSHIM_RUN_DIR=run_dir,
              KVSHIM_LLAMA_WRITE_THROUGH="0", KVSHIM_LLAMA_PREFIX="0",
              KVSHIM_POOL_SIZE=a.pool_size)
    for kv_pair in a.env:
        k, _, v = kv_pair.partition("=")
        if not k.startswith("KVSHIM_"):
            sys.exit("bench_restore: --env takes KVSHIM_* variables (got %r)" % kv_pair)
        kv[k] = v
    load0 = os.getloadavg()[0]
    res = {"evaluate": [], "A_evaluate": [], "peer": [], "peer_first": [], "local": [],
           "file": [], "state_bytes": None}

    lines, _ = run(common + ["--prompts", once, "--no-cache"], base, "evaluate")
    res["evaluate"] = [x["prefix_ms"] for x in lines]

    # The engine's own load (the limit): state files saved once, loaded by a fresh process
    # before each B (page cache warm, as the pool is).
    disk = os.path.join(work, "cache-disk")
    lines, _ = run(common + ["--prompts", once, "--cache-dir", disk], base, "file save")
    res["state_bytes"] = lines[0]["state_bytes"]
    per_rep = {"file": [], "peer": [], "local": []}

    def file_load(rep):
        lines, _ = run(common + ["--prompts", once, "--cache-dir", disk], base, "file load")
        if not all(x["prefix_source"] == "loaded" for x in lines):
            sys.exit("bench_restore: the file run did not load every prefix")
        ms = [x["prefix_ms"] for x in lines]
        res["file"] += ms
        per_rep["file"].append(statistics.median(ms))

    serve = None
    if a.serve:
        serve = subprocess.Popen([a.serve, "serve", "--pool-size", a.serve_pool],
                                 env=dict(base, KVSHIM_RUN_DIR=run_dir), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        if "socket" not in serve.stdout.readline():
            sys.exit("bench_restore: kvshim serve did not start")
    cache = os.path.join(work, "cache-kvshim")
    bar = os.path.join(work, "barrier")
    holder = subprocess.Popen(common + ["--prompts", once, "--cache-dir", cache, "--barrier-dir",
                                        bar, "--barrier-count", "2"], cwd=HERE,
                              env=dict(kv, KVSHIM_STATS=os.path.join(work, "a.json")),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not os.path.exists(os.path.join(bar, "done.%d" % holder.pid)):
            if holder.poll() is not None:
                sys.stderr.write(holder.stderr.read())
                sys.exit("bench_restore: A exited %d" % holder.returncode)
            time.sleep(0.05)
        for rep in range(a.reps):
            file_load(rep)
            stats = os.path.join(work, "b%d.json" % rep)
            lines, _ = run(common + ["--prompts", twice, "--cache-dir", cache],
                           dict(kv, KVSHIM_STATS=stats), "B")
            if not all(x["prefix_source"] == "loaded" and x["prefix_match"] for x in lines):
                sys.exit("bench_restore: B did not load every prefix: %s"
                         % [x["prefix_source"] for x in lines])
            with open(stats) as f:
                st = json.load(f)
            want = 2 * a.prefixes if serve else a.prefixes  # with serve: in place both times
            if st["peer_hits"] != want or st["hook_hits"] != 2 * a.prefixes or \
                    (serve and st.get("cache_peer_loads") != want):
                sys.exit("bench_restore: B: peer_hits %d, hook_hits %d, cache_peer_loads %s "
                         "(expected %d, %d)" % (st["peer_hits"], st["hook_hits"],
                                                st.get("cache_peer_loads"), want, 2 * a.prefixes))
            ms = [x["prefix_ms"] for x in lines]
            res["peer_first"].append(ms[0])
            res["peer"] += ms[1:a.prefixes]
            res["local"] += ms[a.prefixes:]
            per_rep["peer"].append(statistics.median(ms[1:a.prefixes]))
            per_rep["local"].append(statistics.median(ms[a.prefixes:]))
    finally:
        with open(os.path.join(bar, "done.release"), "w") as f:
            f.write("bench\n")
        out, _ = holder.communicate(timeout=600)
        if serve:
            serve.terminate()
            serve.communicate(timeout=60)
    a_lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")][:-1]
    res["A_evaluate"] = [x["prefix_ms"] for x in a_lines]

    print("model %d layers x %d embd, %d prefixes of %d tokens, state file %d bytes, %d reps%s"
          % (a.layers, a.embd, a.prefixes, a.prefix_tokens, res["state_bytes"], a.reps,
             ", serve in the group: peer and local both restore in place from serve's pool"
             if serve else ""))
    print("load average (1 min) at the start %.1f, at the end %.1f, %d CPUs"
          % (load0, os.getloadavg()[0], os.cpu_count() or 0))
    for k in ("evaluate", "A_evaluate", "peer_first", "peer", "local", "file"):
        print(fig(k, res[k]))
    ev = statistics.median(res["evaluate"])
    for k in ("peer", "local", "file"):
        print("evaluate / %-5s = %.0fx (pooled medians)" % (k, ev / statistics.median(res[k])))
    # Per repetition (B and the file process run back to back), then median [min..max].
    ratios = {
        "evaluate / peer": [ev / x for x in per_rep["peer"]],
        "evaluate / local": [ev / x for x in per_rep["local"]],
        "evaluate / file": [ev / x for x in per_rep["file"]],
        "peer / file (limit 1.00)": [x / y for x, y in zip(per_rep["peer"], per_rep["file"])],
        "local / file (limit 1.00)": [x / y for x, y in zip(per_rep["local"], per_rep["file"])],
    }
    print("per repetition (n=%d), median [min..max]:" % a.reps)
    for k, xs in ratios.items():
        print("  " + spread(k, xs, width=26, prec=2))
    res["per_rep"] = per_rep
    res["ratios"] = ratios
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    shutil.rmtree(run_dir, ignore_errors=True)
    if not a.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
