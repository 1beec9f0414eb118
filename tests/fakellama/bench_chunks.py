#!/usr/bin/env python3
"""Node bytes in use / distinct KV bytes for issue 25's workload, with and without chunk storage
(KVSHIM_LLAMA_CHUNKS), on tests/fakellama's prefixhost. Not a test (ctest does not run it): it
prints the figures docs/PERF.md (section 14) reports.

Workload: one shared prefix of --prefix tokens and --requests requests that each add --suffix
tokens of their own, sent one after another, alternately, to two engine processes (A takes the
even requests, B the odd ones; each waits for the previous request to finish), with
`kvshim serve` in the group (one copy per node: the engines keep no copies). Every request is
"rm the sequence, prompt prefix + its suffix, 2 tokens generated". The same requests run once
without kvshim in one process: every request's output lines must be identical.

Node bytes in use: serve's store_used_bytes at the end plus both engines' store_used_bytes at
exit. The limit, measured from the same run's fake model: distinct KV bytes = (prefix +
requests x suffix) tokens x the model's KV bytes per token (fakellama.c body_write: n_embd K
bytes and 8 V bytes per layer). Printed per mode: bytes, distinct, ratio; the bytes are a
function of the workload (repeated runs give the same figures; --reps checks that).

Usage: bench_chunks.py --host PREFIXHOST --preload LIBKVSHIM --kvshim CLI [--prefix 4096]
                       [--suffix 1024] [--requests 50] [--layers 8] [--embd 512] [--reps 1]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def env_for(run_dir, group, preload=None, **extra):
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith(("KVSHIM_", "FAKELLAMA_"))}
    env.update({"KVSHIM_RUN_DIR": run_dir, "KVSHIM_GROUP": group, "KVSHIM_POOL_SIZE": "64M"})
    if preload:
        env["LD_PRELOAD"] = preload
    env.update({k: str(v) for k, v in extra.items()})
    return env


def requests_of(args, n_ctx):
    head = ["model 0 {model}", f"ctx 0 0 1 1 {n_ctx}"]
    reqs = [["rm 0 0 -1 -1", f"prompt 0 0 r{args.prefix}@1+r{args.suffix}@{100 + i}",
             "gen 0 0 2"] for i in range(args.requests)]
    return head, reqs


def run_mode(args, work, model, chunks):
    run_dir = tempfile.mkdtemp(prefix="kvs-bc-", dir="/tmp")
    group = f"bench-chunks-{chunks}-{os.getpid()}"
    serve = subprocess.Popen([args.kvshim, "serve", "--pool-size", args.serve_pool],
                             env=env_for(run_dir, group), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    banner = serve.stdout.readline()
    if "socket" not in banner:
        sys.exit(f"kvshim serve did not start: {banner!r}")
    n_ctx = args.prefix + args.suffix + 64
    head, reqs = requests_of(args, n_ctx)
    head = [h.format(model=model) for h in head]
    procs, stats = [], []
    t0 = time.monotonic()
    for who in (0, 1):
        cmds = list(head)
        for i in range(who, args.requests, 2):
            cmds += [f"waitfile {work}/turn{chunks}-{i} 600"] + reqs[i] + \
                    [f"touch {work}/turn{chunks}-{i + 1}"]
        st = os.path.join(work, f"stats-{chunks}-{who}.json")
        stats.append(st)
        procs.append(subprocess.Popen(
            [args.host] + cmds, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env_for(run_dir, group, args.preload, KVSHIM_STATS=st,
                        KVSHIM_LLAMA_CHUNKS=int(chunks))))
    open(f"{work}/turn{chunks}-0", "w").close()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            sys.exit(f"prefixhost exited {p.returncode}:\n{err[-3000:]}")
        outs.append(out.splitlines())
    wall = time.monotonic() - t0
    r = subprocess.run([args.kvshim, "stats", str(serve.pid), "--json"], capture_output=True,
                       text=True, env=env_for(run_dir, group), timeout=60)
    sst = json.loads(r.stdout)
    serve.terminate()
    serve.communicate(timeout=30)
    shutil.rmtree(run_dir, ignore_errors=True)
    est = [json.load(open(s)) for s in stats]
    # request i's lines: A holds the even ones, B the odd ones, 3 lines + waitfile + touch each
    lines = {}
    for who, out in enumerate(outs):
        body = out[len(head):]
        for k, i in enumerate(range(who, args.requests, 2)):
            lines[i] = body[k * 5 + 1:k * 5 + 4]
    node = sst["store_used_bytes"] + sum(e["store_used_bytes"] for e in est)
    agg = {k: sum(e.get(k, 0) for e in est) for k in est[0] if k.startswith("llama_")}
    return {"node_bytes": node, "serve_bytes": sst["store_used_bytes"],
            "engine_bytes": [e["store_used_bytes"] for e in est], "lines": lines, "wall_s": wall,
            "stats": agg, "evictions": sst.get("store_evictions", 0)}


def reference(args, work, model):
    n_ctx = args.prefix + args.suffix + 64
    head, reqs = requests_of(args, n_ctx)
    cmds = [h.format(model=model) for h in head] + [c for r in reqs for c in r]
    out = subprocess.run([args.host] + cmds, capture_output=True, text=True, timeout=3600,
                         env=env_for(work, "ref")).stdout.splitlines()[len(head):]
    return {i: out[i * 3:i * 3 + 3] for i in range(args.requests)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", required=True)
    ap.add_argument("--preload", required=True)
    ap.add_argument("--kvshim", required=True)
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--suffix", type=int, default=1024)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--serve-pool", default="3G")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kvs-bench-chunks-")
    model = os.path.join(work, "m.gguf")
    subprocess.run([args.host, f"mkmodel {model} bench {args.layers} {args.embd} 64 1"],
                   check=True, capture_output=True, env=env_for(work, "ref"))
    per_token = args.layers * (args.embd + 8)  # the fake's K row + V bytes per layer
    distinct = (args.prefix + args.requests * args.suffix) * per_token
    print(f"workload: {args.prefix}-token prefix, {args.requests} x {args.suffix}-token "
          f"suffixes, 2 engines + kvshim serve; {per_token} KV bytes/token; distinct KV "
          f"{distinct} bytes ({distinct / 2**20:.1f} MiB)")
    ref = reference(args, work, model)
    for chunks in (False, True):
        ratios, walls = [], []
        for rep in range(args.reps):
            r = run_mode(args, work, model, chunks)
            bad = [i for i in range(args.requests) if r["lines"].get(i) != ref[i]]
            if bad:
                sys.exit(f"chunks={int(chunks)}: requests {bad[:5]} differ from the run without "
                         f"kvshim:\n{ref[bad[0]]}\n{r['lines'].get(bad[0])}")
            ratios.append(r["node_bytes"] / distinct)
            walls.append(r["wall_s"])
            print(f"  chunks={int(chunks)} rep {rep + 1}: node bytes {r['node_bytes']} (serve "
                  f"{r['serve_bytes']}, engines {r['engine_bytes']}), / distinct = "
                  f"{r['node_bytes'] / distinct:.3f}; serve evictions {r['evictions']}; "
                  f"{r['wall_s']:.1f} s; outputs identical; {r['stats']}")
        print(f"KVSHIM_LLAMA_CHUNKS={int(chunks)}: node bytes / distinct KV = "
              f"{statistics.median(ratios):.3f} [{min(ratios):.3f}..{max(ratios):.3f}] "
              f"(n={len(ratios)}), wall {statistics.median(walls):.1f} s")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
