#!/usr/bin/env python3
"""Measure (never run by ctest): TTFT of the second of two refengine processes that share a
4096-token prefix, with kvshim (the first process holds its cache, the second loads the prefix
through the peers) against the same request without kvshim.

usage: kvo_ttft.py --engine REFENGINE --preload LIBKVSHIM [--mode cold|warm] [--reps N]
                   [--hidden E] [-- EXTRA REFENGINE ARGS]

  cold  the second process's first request is the shared-prefix one (fresh pool pages, fresh
        device buffer: first-touch costs included)
  warm  the second process first runs one unrelated request, then the shared-prefix one (what
        a long-running engine sees); the shared request's TTFT is reported

Workload: --prompt-tokens 4352 --prefix-tokens 4096 --chunk-tokens 256 (16 shared chunks + 1),
default model dimensions, --hidden 128 (so computing a chunk takes >= 5 ms). Arms are
interleaved (on/off, then off/on, ...); the medians and their ratio are printed. Set
LD_LIBRARY_PATH to the fake driver's directory on machines without a GPU; KVSHIM_* variables
in the environment (KVSHIM_POOL_SIZE ...) reach both kvshim processes. Every "on" run uses
--verify and must load all 16 shared chunks.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--preload", required=True)
    ap.add_argument("--mode", choices=("cold", "warm"), default="cold")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hidden", default="128")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    work = ["--requests", "1", "--prompt-tokens", "4352", "--prefix-tokens", "4096"]
    model = ["--chunk-tokens", "256", "--hidden", a.hidden, *a.extra]
    tmp = tempfile.mkdtemp(prefix="kvo-ttft-")
    try:
        if a.mode == "warm":
            def dump(*x):
                return subprocess.run([a.engine, *work, *model, *x, "--dump-requests"],
                                      capture_output=True, text=True, check=True).stdout
            b_file = os.path.join(tmp, "b.jsonl")
            with open(b_file, "w") as f:
                f.write(dump("--seed", "99", "--rank", "1") + dump("--rank", "1"))
            b_args = ["--requests-file", b_file, *model]
            shared = 1
        else:
            b_args = [*work, *model, "--rank", "1"]
            shared = 0

        def env(run_dir, preload):
            e = dict(os.environ)
            e.pop("LD_PRELOAD", None)
            e["KVSHIM_RUN_DIR"] = run_dir
            if preload:
                e["LD_PRELOAD"] = a.preload
            return e

        times = {"on": [], "off": []}
        for rep in range(a.reps):
            for arm in (("on", "off") if rep % 2 == 0 else ("off", "on")):
                run_dir = tempfile.mkdtemp(dir=tmp)
                first = None
                if arm == "on":
                    first = subprocess.Popen([a.engine, *work, *model, "--rank", "0",
                                              "--hold-ms", "60000"], stdout=subprocess.PIPE,
                                             text=True, env=env(run_dir, True))
                    for line in first.stdout:
                        if '"summary":true' in line:
                            break
                verify = ["--verify"] if arm == "on" else []
                p = subprocess.run([a.engine, *b_args, *verify], capture_output=True,
                                   text=True, env=env(run_dir, arm == "on"))
                if first:
                    first.kill()
                    first.wait()
                if p.returncode != 0:
                    print(f"rep {rep} {arm}: exit {p.returncode}\n{p.stderr}", file=sys.stderr)
                    return 1
                lines = [json.loads(x) for x in p.stdout.splitlines()]
                r, summ = lines[shared], lines[-1]
                if arm == "on" and (r["loaded"] != 16 or summ["verify"] != "ok"):
                    print(f"rep {rep} on: did not load the prefix: {r}", file=sys.stderr)
                    return 1
                times[arm].append(r["ttft_ms"])
                print(f"rep {rep} {arm:3}: ttft {r['ttft_ms']:8.2f} ms  loaded {r['loaded']:2}"
                      f"  computed {r['computed']:2}  load_ms {r['load_ms']:6.2f}"
                      f"  compute_ms_per_chunk {summ['compute_ms_per_chunk']:.2f}")
        on, off = statistics.median(times["on"]), statistics.median(times["off"])
        print(f"{a.mode}: median TTFT with kvshim {on:.2f} ms (min {min(times['on']):.2f}, max "
              f"{max(times['on']):.2f}), without {off:.2f} ms (min {min(times['off']):.2f}, max "
              f"{max(times['off']):.2f}); ratio {on / off:.3f}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
