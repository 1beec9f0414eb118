#!/usr/bin/env python3
"""Benchmark (not a test): issue 22's goals for llama-server replicas sharing a prefix.

usage: bench_server.py --preload LIBKVSHIM --cli KVSHIM [--reps N] [--work-dir DIR]

Each repetition, in a fresh KVSHIM_RUN_DIR with a fresh `kvshim serve`, on the 8x512 tiny-gguf
model with llama-server's default flags (4 slots, kv_unified), 2 threads:
  producer  replica A computes the shared document + question 1: its prompt time
            (timings.prompt_ms) with kvshim against a fresh replica without it (goal <= 1.05);
  consumer  replica B's first request, the document + question 2: time to first token (wall time
            of a 1-token completion) and prompt time with kvshim against without (goal <= 0.25),
            and the share of the document restored (goal >= 90%). Next to the TTFT ratio: its
            limit in the same run, the share of the prompt B still has to decode
            ((prompt - restored) / prompt), the ratio a free restore would give.
  where the time goes (kvshim's own counters, immune to the machine's noise): on A, the time
            its snapshot took inside the request (llama_prefix_snapshot_ns) against A's prompt
            time, and the engine's own serialisation inside it (llama_state_get_ns); on B, the
            restore (llama_prefix_restore_ns, the engine's llama_state_set_ns inside it)
            against B's TTFT. Their limit is 0 (a free store or restore).
Medians and spread (min-max) over the repetitions are printed; docs/PERF.md quotes them.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_server as cs  # noqa: E402


def one_rep(args, i):
    tmp, ctx = cs.bench_ctx(args, "kvs-bench-")
    try:
        ctx.serve(pool="512M")
        first = cs.DOC + cs.question(1 + 10 * i)
        second = cs.DOC + cs.question(2 + 10 * i)
        r = {}
        for preload in (False, True):
            a = ctx.start_server(preload)
            _, t = ctx.complete(a, first)
            r[f"producer_{int(preload)}"] = t["prompt_ms"]
            if preload:
                r["doc_tokens"] = cs.ntokens(ctx, a, cs.DOC)
                st = ctx.stats(a, everything=True)
                r["snapshot_ms"] = st.get("llama_prefix_snapshot_ns", 0) / 1e6
                r["serialise_ms"] = st.get("llama_state_get_ns", 0) / 1e6
                r["snapshot_bytes"] = st.get("llama_prefix_snapshot_bytes", 0)
            ctx.stop(a)
        for preload in (False, True):
            b = ctx.start_server(preload)
            t0 = time.monotonic()
            _, t = ctx.complete(b, second, n_predict=1)
            r[f"ttft_{int(preload)}"] = (time.monotonic() - t0) * 1000
            r[f"prompt_{int(preload)}"] = t["prompt_ms"]
            r["prompt_n"] = t["prompt_n"]
            if preload:
                st = ctx.stats(b, everything=True)
                r["restored"] = st.get("llama_prefix_restored_tokens", 0)
                r["restore_ms"] = st.get("llama_prefix_restore_ns", 0) / 1e6
                r["load_ms"] = st.get("llama_state_set_ns", 0) / 1e6
                r["prompt_tokens"] = cs.ntokens(ctx, b, second)
            ctx.stop(b)
        return r
    finally:
        ctx.cleanup()


def summary(name, xs, fmt="{:.3f}"):
    return (f"{name}: median " + fmt.format(statistics.median(xs)) + " (min " +
            fmt.format(min(xs)) + ", max " + fmt.format(max(xs)) + f", n={len(xs)})")


def run_reps(doc, one_rep):
    """Parse the benchmarks' common options (--preload, --cli, --reps, --work-dir; doc's first
    line is the description) and run one_rep(args, i) --reps times, printing each: the list."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--preload", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work-dir")
    args = ap.parse_args()
    reps = []
    for i in range(args.reps):
        r = one_rep(args, i)
        print(f"rep {i}: {r}", flush=True)
        reps.append(r)
    return reps


def main():
    reps = run_reps(__doc__, one_rep)
    prod = [r["producer_1"] / r["producer_0"] for r in reps]
    ttft = [r["ttft_1"] / r["ttft_0"] for r in reps]
    prompt = [r["prompt_1"] / r["prompt_0"] for r in reps]
    limit = [(r["prompt_tokens"] - r["restored"]) / r["prompt_tokens"] for r in reps]
    share = [r["restored"] / r["doc_tokens"] for r in reps]
    print(summary("producer prompt time on/off (goal <= 1.05)", prod))
    print(summary("producer prompt ms off", [r["producer_0"] for r in reps], "{:.0f}"))
    print(summary("producer prompt ms on", [r["producer_1"] for r in reps], "{:.0f}"))
    print(summary("second replica TTFT on/off (goal <= 0.25)", ttft))
    print(summary("  its limit: share of the prompt left to decode", limit))
    print(summary("second replica TTFT ms off", [r["ttft_0"] for r in reps], "{:.0f}"))
    print(summary("second replica TTFT ms on", [r["ttft_1"] for r in reps], "{:.0f}"))
    print(summary("second replica prompt time on/off", prompt))
    print(summary("share of the shared document restored (goal >= 0.90)", share))
    print("where the time goes (kvshim's counters; limit 0):")
    print(summary("  producer: snapshot / prompt time on", [r["snapshot_ms"] / r["producer_1"]
                                                          for r in reps]))
    print(summary("  producer: snapshot ms", [r["snapshot_ms"] for r in reps], "{:.1f}"))
    print(summary("  producer: of it, the engine's llama_state_seq_get_data ms",
                  [r["serialise_ms"] for r in reps], "{:.1f}"))
    print(summary("  producer: snapshot MB", [r["snapshot_bytes"] / 1e6 for r in reps], "{:.1f}"))
    print(summary("  consumer: restore / TTFT on", [r["restore_ms"] / r["ttft_1"] for r in reps]))
    print(summary("  consumer: restore ms", [r["restore_ms"] for r in reps], "{:.1f}"))
    print(summary("  consumer: of it, the engine's llama_state_seq_set_data ms",
                  [r["load_ms"] for r in reps], "{:.1f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
