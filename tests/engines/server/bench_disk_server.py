#!/usr/bin/env python3
"""Benchmark (not a test): issue 26's restart-warm goal for llama-server and the disk tier.

usage: bench_disk_server.py --preload LIBKVSHIM --cli KVSHIM [--reps N]

Each repetition, in a fresh KVSHIM_RUN_DIR and disk directory, on the 8x512 tiny-gguf model with
llama-server's default flags, 2 threads (disk_server.py's restart case, timed):
  off   a fresh replica without kvshim: time to first token (wall time of a 1-token completion)
        of the document + question 2 (computing the ~1.4k-token prefix);
  on    `kvshim serve --disk DIR`, replica A computes the document + question 1 and stops, the
        write-behind settles, serve is SIGKILLed and started again on DIR, the segment files
        are dropped from the page cache (posix_fadvise DONTNEED: a cold restart), and a fresh
        replica B with kvshim asks the same request: its TTFT.
Goal: on / off <= 0.3. Next to it, its limit in the same run: the share of B's prompt left to
decode ((prompt - restored) / prompt), the ratio a free restore would give. Medians and spread
(min-max) over the repetitions; docs/PERF.md section 12 quotes them.
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_server as cs  # noqa: E402
import disk_server as ds  # noqa: E402
import bench_server as bs  # noqa: E402


def drop_cache(d):
    for name in os.listdir(d):
        fd = os.open(os.path.join(d, name), os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def ttft(ctx, p, prompt):
    t0 = time.monotonic()
    ctx.complete(p, prompt, n_predict=1)
    return (time.monotonic() - t0) * 1000


def one_rep(args, i):
    tmp, ctx = cs.bench_ctx(args, "kvs-bds-", ds.Ctx)
    try:
        first = cs.DOC + cs.question(1 + 10 * i)
        second = cs.DOC + cs.question(2 + 10 * i)
        r = {}
        b = ctx.start_server(False)
        r["ttft_off"] = ttft(ctx, b, second)
        ctx.stop(b)
        disk = ctx.p("disk")
        s = ctx.serve_disk(disk)
        a = ctx.start_server(True)
        ctx.complete(a, first)
        ctx.stop(a)
        ds.settled_writes(ctx, s)
        s.send_signal(signal.SIGKILL)
        s.wait(timeout=30)
        s = ctx.serve_disk(disk)
        drop_cache(disk)
        b = ctx.start_server(True)
        r["ttft_on"] = ttft(ctx, b, second)
        r["restored"] = ctx.stats(b).get("restored_tokens", 0)
        r["prompt_tokens"] = cs.ntokens(ctx, b, second)
        r["disk_hits"] = ctx.serve_stats(s).get("disk_hits", 0)
        ctx.stop(b)
        return r
    finally:
        ctx.cleanup()


def main():
    reps = bs.run_reps(__doc__, one_rep)
    print(bs.summary("restart-warm TTFT on/off (goal <= 0.3)",
                  [r["ttft_on"] / r["ttft_off"] for r in reps]))
    print(bs.summary("  its limit: share of the prompt left to decode",
                  [(r["prompt_tokens"] - r["restored"]) / r["prompt_tokens"] for r in reps]))
    print(bs.summary("TTFT ms without kvshim (computing the prefix)", [r["ttft_off"] for r in reps],
                  "{:.0f}"))
    print(bs.summary("TTFT ms after serve's restart (prefix from disk)",
                  [r["ttft_on"] for r in reps], "{:.0f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
