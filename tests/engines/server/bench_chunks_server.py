#!/usr/bin/env python3
"""Benchmark (not a test): issue 25's workload on unmodified llama-server replicas.

usage: bench_chunks_server.py --preload LIBKVSHIM --cli KVSHIM [--prefix-words 1700]
                              [--suffix-words 400] [--requests 12] [--restores 0]
                              [--steady workload|short] [--work-dir DIR]
(the model trains on 4,096 tokens: llama-server caps the slot there, so prefix + suffix stay
below it)

One shared prefix (a fixed pseudo-random text of --prefix-words words) and --requests requests
that each add --suffix-words words of their own and ask for 8 tokens (temperature 0), sent one
after another, alternately, to two replicas (A the even requests, B the odd ones) with
`kvshim serve` in the group (one copy per node: the replicas keep no copies), on the 8x512
tiny-gguf model with llama-server's defaults but -np 1 (check_server.py's Ctx; one slot holds
the whole context). Once with
KVSHIM_LLAMA_CHUNKS=0 (whole blobs), once with 1 (chunk objects), each in a fresh run directory
and serve; the same requests sent the same way to two replicas without kvshim give the
reference completions, which must be identical.

Restore time (issue 25's "restore by assembly / restore of one whole blob of the same tokens"):
the replicas run with KVSHIM_LOG=debug, and each restore's line ("N tokens restored in W ns (C ns
on CPU)": lookup, fetch, checks, assembly and the engine's own llama_state_seq_set_data) gives
its wall and CPU time per restored token; printed per mode as median [min-max] over the
restores, and chunks / whole blobs of the medians. llama-server reuses a slot's own prompt, so
the workload restores once per replica (its first request, into a fresh process whose scratch
buffers and view of serve's pool are still cold); --restores R then sends R more of the
requests, alternately, with "cache_prompt": false (llama-server recomputes the prompt, so
kvshim restores it each time) for the steady state, timed apart. With --steady short those R
requests are the prefix and a short question each instead (no new chunk, so no snapshot between
two restores: the context's last assembly is loaded again, design §10.4).

Store time (issue 25's "store on the producer: no slower than today per stored byte"): each
snapshot's debug line ("N bytes stored in W ns (C ns on CPU)", prefix.c) gives its wall and CPU
time per stored byte (for chunks, the bytes of the chunks and frame written; dedup leaves the
rest unwritten) and per snapshot; printed per mode as median [min-max] over all snapshots and
over those after each replica's first (with chunks that one learns the context's frame by
copying the whole state), and chunks / whole blobs of the medians.

Node bytes in use: serve's store_used_bytes at the end plus both replicas'. The limit: the
distinct KV bytes of the workload, (prefix tokens + each request's tokens after the prefix)
x the model's KV bytes per token (8 layers x 512 K and 512 V values in f16: 16,384; token
counts from the replica's /tokenize). Printed per mode: bytes, distinct, ratio; and the
replicas' chunk counters.
"""
import argparse
import os
import re
import statistics
import sys
import tempfile
import urllib.error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_server as cs  # noqa: E402
import harness  # noqa: E402  (tests/lib, on the path check_server sets)

KV_PER_TOKEN = 8 * 512 * 2 * 2  # layers x (K + V) values per layer x 2 bytes (f16)
FLAGS = ("-np", "1")  # one slot holds the whole 8192-token context (the defaults split it in 4)


def prompts(args):
    prefix = cs.words(1, args.prefix_words)
    return prefix, [prefix + "\n\n" + cs.words(500 + i, args.suffix_words) + "\nAnswer:"
                    for i in range(args.requests)]


def complete(ctx, p, prompt):
    """The completion, or the server's error (the random-weight model's 8 tokens sometimes
    fail llama-server's output parser: HTTP 500, "does not match the expected Content-only
    format"; the same request fails the same way without kvshim, and is compared as such)."""
    try:
        return ctx.complete(p, prompt)[0]
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}: {e.read().decode(errors='replace')}"


RESTORED = re.compile(r"(\d+) tokens restored in (\d+) ns \((\d+) ns on CPU\)")


def restores_logged(r):
    """(wall, CPU) ns per restored token of every restore replica r logged so far."""
    with open(r.log, errors="replace") as f:
        return [(int(w) / int(n), int(c) / int(n)) for n, w, c in RESTORED.findall(f.read())]


STORED = re.compile(r"(\d+) bytes stored in (\d+) ns \((\d+) ns on CPU\)")


def stores_logged(r):
    """(wall, CPU) ns per stored byte and (wall, CPU) ms of every snapshot replica r logged so
    far."""
    with open(r.log, errors="replace") as f:
        return [(int(w) / int(n), int(c) / int(n), int(w) / 1e6, int(c) / 1e6)
                for n, w, c in STORED.findall(f.read())]


def run(ctx, reqs, preload, chunks, restores=0, steady_reqs=None, direct=1):
    """The requests, alternately to two replicas: (completions, per-replica counters, the
    workload's restores and the --restores ones (steady_reqs, else reqs, in turn), each as
    (wall, CPU) ns per restored token, and every snapshot (stores_logged), all of them and the
    later ones (each replica's first apart: with chunks it learns the context's frame by
    copying the whole state, design §10.4))."""
    steady_reqs = steady_reqs or reqs
    extra = {"KVSHIM_LLAMA_CHUNKS": str(int(chunks)), "KVSHIM_LOG": "debug",
             "KVSHIM_LLAMA_DIRECT": str(direct)} if preload else {}
    reps = [ctx.start_server(preload, FLAGS, **extra) for _ in range(2)]
    out = [complete(ctx, reps[i % 2], r) for i, r in enumerate(reqs)]
    first = [restores_logged(r) for r in reps] if preload else []
    for i in range(restores if preload else 0):
        try:  # (the completion itself is not compared here: only the restore is timed)
            ctx.complete(reps[i % 2], steady_reqs[i % len(steady_reqs)], cache_prompt=False)
        except urllib.error.HTTPError:
            pass
    st = [ctx.stats(r, everything=True) for r in reps] if preload else []
    for r in reps:
        ctx.stop(r)
    steady = [x for r, f in zip(reps, first) for x in restores_logged(r)[len(f):]]
    per_rep = [stores_logged(r) for r in reps] if preload else []
    stores = [x for xs in per_rep for x in xs]
    later = [x for xs in per_rep for x in xs[1:]]
    return out, st, ([x for f in first for x in f], steady, stores, later)


def spread(xs, digits=1):
    return (f"{statistics.median(xs):.{digits}f} [{min(xs):.{digits}f}-{max(xs):.{digits}f}]"
            if xs else "-")


def main():
    ap = harness.parser(__doc__, "--preload", "--cli", optional=("--work-dir",),
                        prefix_words=1700, suffix_words=400, requests=12, restores=0)
    ap.add_argument("--steady", choices=("workload", "short"), default="workload",
                    help="the --restores requests: the workload's, or the prefix and a short "
                         "question each (no snapshot between restores)")
    ap.add_argument("--direct", type=int, choices=(0, 1), default=1,
                    help="KVSHIM_LLAMA_DIRECT of the replicas (0: a restore by assembly copies "
                         "the state, the way before direct loads; default 1)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvs-bench-chunks-server-")
    ns = argparse.Namespace(preload=args.preload, cli=args.cli, work_dir=None, asan_runtime="",
                            keep=False)
    prefix, reqs = prompts(args)
    steady_reqs = [prefix + cs.question(i) for i in range(8)] if args.steady == "short" else None
    ref = None
    timing = {}
    for chunks in (None, False, True):
        ctx = cs.Ctx(ns, tmp, args.work_dir or tmp)
        ctx.run_dir = tempfile.mkdtemp(prefix="run-", dir=tmp)
        try:
            if chunks is None:  # the reference, and the token counts
                p = ctx.start_server(False)
                pt = cs.ntokens(ctx, p, prefix)
                distinct = pt + sum(cs.ntokens(ctx, p, r) - pt for r in reqs)
                ctx.stop(p)
                ref, _, _ = run(ctx, reqs, False, False)
                print(f"workload: {pt}-token prefix, {args.requests} requests "
                      f"({(distinct - pt) / args.requests:.0f} tokens each after it), 2 "
                      f"llama-server replicas + kvshim serve; distinct KV {distinct} tokens x "
                      f"{KV_PER_TOKEN} = {distinct * KV_PER_TOKEN} bytes")
                continue
            serve = ctx.serve(pool="3G")
            got, st, (first, steady, stores, later) = run(ctx, reqs, True, chunks, args.restores,
                                                              steady_reqs, args.direct)
            timing[chunks] = (first, steady, stores, later)
            bad = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
            if bad:
                sys.exit(f"chunks={int(chunks)}: requests {bad} differ from the replicas without "
                         f"kvshim: {ref[bad[0]]!r} vs {got[bad[0]]!r}")
            sst = ctx.stats(serve, everything=True)
            node = sst["store_used_bytes"] + sum(s["store_used_bytes"] for s in st)
            agg = {k: sum(s.get(k, 0) for s in st) for k in st[0]
                   if k.startswith(("llama_chunks_", "llama_prefix_restored_tokens",
                                    "llama_prefix_snapshot_bytes", "llama_prefix_snapshots"))}
            print(f"KVSHIM_LLAMA_CHUNKS={int(chunks)}: node bytes {node} (serve "
                  f"{sst['store_used_bytes']}, replicas {[s['store_used_bytes'] for s in st]}), "
                  f"/ distinct KV = {node / (distinct * KV_PER_TOKEN):.3f}; serve evictions "
                  f"{sst.get('store_evictions', 0)}; {len(reqs)} completions identical; {agg}")
            for what, per_token in (("first per replica", first), ("steady", steady)):
                print(f"  restores, {what}: {len(per_token)}, ns per restored token: wall "
                      f"{spread([w for w, _ in per_token])}, CPU "
                      f"{spread([c for _, c in per_token])}")
            print(f"  snapshots: {len(stores)}, ns per stored byte: wall "
                  f"{spread([x[0] for x in stores], 3)}, CPU {spread([x[1] for x in stores], 3)}"
                  f"; the {len(later)} after each replica's first: ns per stored byte wall "
                  f"{spread([x[0] for x in later], 3)}, CPU {spread([x[1] for x in later], 3)}, "
                  f"ms per snapshot wall {spread([x[2] for x in later], 2)}, CPU "
                  f"{spread([x[3] for x in later], 2)}")
        finally:
            ctx.cleanup()
    none = ([], [], [], [])
    for j, i, what in ((2, 0, "per stored byte, all snapshots, wall"),
                       (2, 1, "per stored byte, all snapshots, CPU"),
                       (3, 0, "per stored byte, later snapshots, wall"),
                       (3, 1, "per stored byte, later snapshots, CPU"),
                       (3, 2, "per snapshot, later snapshots, wall"),
                       (3, 3, "per snapshot, later snapshots, CPU")):
        on, off = timing.get(True, none)[j], timing.get(False, none)[j]
        if on and off:
            a = statistics.median(x[i] for x in on)
            b = statistics.median(x[i] for x in off)
            goal = " (goal <= 1.0)" if "byte" in what else ""
            print(f"store {what}, chunks / whole blobs (medians): {a / b:.2f}{goal}")
    for j, which in ((0, "first per replica"), (1, "steady")):
        on, off = timing.get(True, none)[j], timing.get(False, none)[j]
        for i, what in ((0, "wall"), (1, "CPU")):
            if on and off:
                a = statistics.median(x[i] for x in on)
                b = statistics.median(x[i] for x in off)
                print(f"restore per token, chunks / whole blobs ({which}, {what}, medians): "
                      f"{a / b:.2f} (goal <= 1.1)")


if __name__ == "__main__":
    main()
