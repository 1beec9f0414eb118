#!/usr/bin/env python3
"""Node bytes in use / distinct KV bytes for issue 25's workload, with and without chunk storage
(KVSHIM_LLAMA_CHUNKS), on tests/fakes/llama's prefixhost. Not a test (ctest does not run it): it
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
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from benchfig import spread  # noqa: E402
import harness  # noqa: E402


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


def start_serve(args, run_dir, group, pool):
    """`kvshim serve` in group, once it has printed its socket line."""
    serve = subprocess.Popen([args.kvshim, "serve", "--pool-size", pool],
                             env=env_for(run_dir, group), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    banner = serve.stdout.readline()
    if "socket" not in banner:
        sys.exit(f"kvshim serve did not start: {banner!r}")
    return serve


def run_mode(args, work, model, chunks):
    run_dir = tempfile.mkdtemp(prefix="kvs-bc-", dir="/tmp")
    group = f"bench-chunks-{chunks}-{os.getpid()}"
    serve = start_serve(args, run_dir, group, args.serve_pool)
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


def timing_run(args, work, model, chunks):
    """One process, its own pool (no peers; with --serve, a `kvshim serve` of its own in one-copy
    mode: stores go into serve's pool, restores read there): --stores different prefixes of
    --prefix tokens
    stored (each a snapshot: chunks or one whole blob), then restored --restores times in turn
    (rm, prompt prefix k + 16 tokens: the 16 never reach a chunk, so nothing more is stored; the
    prefixes in turn, so no restore is of the run restored just before, which a context keeps:
    every restore by assembly assembles, design §10.4), then the limit: the median memcpy of
    the state's bytes. Each restore's and store's
    time is its KVSHIM_LOG=debug line (prefix.c px_restore / px_snapshot; the counters'
    llama_prefix_restore_ns / snapshot_ns add up the same spans): the medians of those, robust
    to a process preempted on a busy machine where the sums are not."""
    run_dir = tempfile.mkdtemp(prefix="kvs-bt-", dir="/tmp")
    per_token = args.layers * (args.embd + 8)
    state = args.prefix * per_token
    # (the sleeps keep the debug lines under the log's 64 lines a second: core/log.h)
    cmds = [f"model 0 {model}", f"ctx 0 0 1 1 {args.prefix + 64} {args.prefix + 64}",
            "sleep 1100"]
    for k in range(args.stores):
        cmds += ["rm 0 0 -1 -1", f"prompt 0 0 r{args.prefix}@{k + 1}"]
    for i in range(args.restores):
        cmds += ["rm 0 0 -1 -1", f"prompt 0 0 r{args.prefix}@{i % args.stores + 1}+r16@{100 + i}",
                 "sleep 20"]
    cmds += [f"memcpy {state} 9"]
    st = os.path.join(work, f"timing-{int(chunks)}.json")
    pool = (args.stores + 2) * state * 2 // 2**20 + 64
    group = f"bench-timing-{os.getpid()}"
    serve = start_serve(args, run_dir, group, f"{pool}M") if args.serve else None
    r = subprocess.run([args.host] + cmds, capture_output=True, text=True, timeout=3600,
                       env=env_for(run_dir, group, args.preload,
                                   KVSHIM_STATS=st, KVSHIM_PEERS=int(args.serve),
                                   KVSHIM_POOL_SIZE=f"{pool}M",
                                   KVSHIM_LOG="debug", KVSHIM_LLAMA_DIRECT=int(args.direct),
                                   KVSHIM_LLAMA_CHUNKS=int(chunks)))
    if serve:
        serve.terminate()
        serve.communicate(timeout=30)
    shutil.rmtree(run_dir, ignore_errors=True)
    if r.returncode != 0:
        sys.exit(f"prefixhost exited {r.returncode}:\n{r.stderr[-3000:]}")
    e = json.load(open(st))
    if args.serve and e.get("cache_peer_stores", 0) < args.stores:
        sys.exit(f"chunks={int(chunks)}: {e.get('cache_peer_stores')} objects stored at serve, "
                 f"{e.get('cache_peer_fallbacks')} fell back")
    mc = [ln for ln in r.stdout.splitlines() if ln.startswith("memcpy ")][-1].split()
    n_rest = e["llama_prefix_restores"]
    if n_rest != args.restores or e["llama_prefix_restored_tokens"] != args.restores * args.prefix:
        sys.exit(f"chunks={int(chunks)}: {n_rest} restores of "
                 f"{e['llama_prefix_restored_tokens']} tokens, expected {args.restores} x "
                 f"{args.prefix}")
    if e["llama_prefix_snapshots"] != args.stores:
        sys.exit(f"chunks={int(chunks)}: {e['llama_prefix_snapshots']} snapshots, expected "
                 f"{args.stores}")
    if chunks and e.get("llama_chunks_assembled", 0) != args.restores:
        sys.exit(f"chunks=1: {e.get('llama_chunks_assembled')} assemblies")
    if args.stores < 2:
        sys.exit("--stores must be at least 2 (restores take the prefixes in turn)")
    rest = [(int(m.group(1)), int(m.group(2))) for m in
            re.finditer(r"tokens restored in (\d+) ns \((\d+) ns on CPU\)", r.stderr)]
    stores = [(int(m.group(2)) / int(m.group(1)), int(m.group(3)) / int(m.group(1))) for m in
              re.finditer(r"(\d+) bytes stored in (\d+) ns \((\d+) ns on CPU\)", r.stderr)]
    if len(rest) != args.restores or len(stores) != args.stores:
        sys.exit(f"chunks={int(chunks)}: {len(rest)} restore and {len(stores)} store log lines")
    return {"restore_ms": statistics.median(x[0] for x in rest) / 1e6,
            "restore_cpu_ms": statistics.median(x[1] for x in rest) / 1e6,
            "assemble_ms": e.get("llama_chunks_assemble_ns", 0) / n_rest / 1e6,
            "store_ns_per_byte": statistics.median(x[0] for x in stores),
            "store_cpu_ns_per_byte": statistics.median(x[1] for x in stores),
            "direct": e.get("llama_chunks_direct", 0),
            "direct_stores": e.get("llama_chunks_direct_stores", 0),
            "memcpy_ms": int(mc[2]) / 1e6, "state_bytes": state}


def timing(args, work, model):
    """Issue 25's two timing goals, per repetition (whole blobs, then chunks, back to back):
    restore by assembly / restore of one whole blob of the same tokens (goal <= 1.1), store
    ns per stored byte chunks / whole (goal <= 1.0); each restore time also as a ratio to the
    memcpy of the state's bytes in the same run. Median [min..max] over --reps."""
    where = "kvshim serve (one copy per node)" if args.serve else "own pool, no peers"
    print(f"timing: {args.prefix}-token prefix, {args.layers} layers x {args.embd} embd; "
          f"{args.stores} stores and {args.restores} restores per process, one process per "
          f"mode and repetition, {where}")
    rows = {}
    for rep in range(args.reps):
        w = timing_run(args, work, model, False)
        c = timing_run(args, work, model, True)
        mcp = statistics.median([w["memcpy_ms"], c["memcpy_ms"]])
        row = {"whole_ms": w["restore_ms"], "chunks_ms": c["restore_ms"],
               "whole_cpu_ms": w["restore_cpu_ms"], "chunks_cpu_ms": c["restore_cpu_ms"],
               "assemble_ms": c["assemble_ms"], "memcpy_ms": mcp,
               "direct_loads": c["direct"], "direct_stores": c["direct_stores"],
               "restore_ratio": c["restore_ms"] / w["restore_ms"],
               "restore_cpu_ratio": c["restore_cpu_ms"] / w["restore_cpu_ms"],
               "whole_cpu_vs_memcpy": w["restore_cpu_ms"] / w["memcpy_ms"],
               "chunks_cpu_vs_memcpy": c["restore_cpu_ms"] / c["memcpy_ms"],
               "whole_ns_B": w["store_ns_per_byte"], "chunks_ns_B": c["store_ns_per_byte"],
               "store_ratio": c["store_ns_per_byte"] / w["store_ns_per_byte"],
               "store_cpu_ratio": c["store_cpu_ns_per_byte"] / w["store_cpu_ns_per_byte"]}
        for k, v in row.items():
            rows.setdefault(k, []).append(v)
        print(f"  rep {rep + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
    summary(rows)


def summary(rows):
    """median [min..max] (n) of each list of figures, one line each."""
    for k, xs in rows.items():
        print("  " + spread(k, xs, width=20))


def main():
    ap = harness.parser(__doc__, "--host", "--preload", "--kvshim", prefix=4096, suffix=1024,
                        requests=50, layers=8, embd=512, serve_pool="3G", reps=1, stores=4,
                        restores=8)
    ap.add_argument("--timing", action="store_true",
                    help="the timing goals (restore and store, chunks vs whole) instead")
    ap.add_argument("--direct", type=int, choices=(0, 1), default=1,
                    help="KVSHIM_LLAMA_DIRECT for the timing runs (0: restores by assembly copy "
                         "the state, the way before direct loads; default 1)")
    ap.add_argument("--serve", action="store_true",
                    help="the timing runs with a kvshim serve of their own (one copy per node: "
                         "states and chunks stored in serve's pool) instead of the own pool")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kvs-bench-chunks-")
    model = os.path.join(work, "m.gguf")
    subprocess.run([args.host, f"mkmodel {model} bench {args.layers} {args.embd} 64 1"],
                   check=True, capture_output=True, env=env_for(work, "ref"))
    if args.timing:
        timing(args, work, model)
        shutil.rmtree(work, ignore_errors=True)
        return
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
        print(f"KVSHIM_LLAMA_CHUNKS={int(chunks)}:")
        summary({"node bytes / distinct KV": ratios, "wall s": walls})
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
