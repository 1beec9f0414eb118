#!/usr/bin/env python3
"""Measure (never run by ctest): one copy per node (issue 13) with refengine and `kvshim serve`.

usage: kvo_copy_bench.py --engine REFENGINE --preload LIBKVSHIM --cli KVSHIM [--reps N]
                         [--engines 4,8] [--hold-ms MS] [--only node|rss]
                         [-- EXTRA REFENGINE ARGS]

Figures, each as a median with its [min..max] over --reps repetitions:
  node bytes  N engines (--engines) share a 4096-token prefix (256-token chunks, 1 MiB each)
              with `kvshim serve` in the group, all alive when counted: the sum of
              store_used_bytes over `kvshim stats --json` (every process of the node) divided
              by the distinct bytes cached (serve's store_used_bytes: every chunk reaches serve
              in both arms, and serve's pool is large enough to evict nothing). Limit: 1.0.
              Arms: KVSHIM_ONE_COPY=1 (default) and 0 (own copies + write-behind).
  engine RSS  one engine's max RSS (wait4 ru_maxrss) running the same workload and staying
              alive --hold-ms (3000) after it, without
              kvshim (off), and with kvshim at default settings without a cache peer (alone)
              and with one (serve); kvshim's cost is on - off minus what the engine keeps in
              its own pool (its store_used_bytes at exit). Goal: <= 64 MiB.
Set LD_LIBRARY_PATH to the fake driver's directory on machines without a GPU.
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


def fmt(xs, unit="", scale=1.0, prec=3):
    xs = [x / scale for x in xs]
    return (f"{statistics.median(xs):.{prec}f}{unit} [{min(xs):.{prec}f}.."
            f"{max(xs):.{prec}f}]")


class Bench:
    def __init__(self, a):
        self.a = a
        self.tmp = tempfile.mkdtemp(prefix="kvo-copy-")
        self.work = ["--requests", "1", "--prompt-tokens", "4352", "--prefix-tokens", "4096",
                     "--chunk-tokens", "256", "--hidden", "128", *a.extra]

    def env(self, run_dir, preload, **extra):
        e = {k: v for k, v in os.environ.items()
             if k != "LD_PRELOAD" and not k.startswith("KVSHIM_")}
        e["KVSHIM_RUN_DIR"] = run_dir
        if preload:
            e["LD_PRELOAD"] = self.a.preload
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def serve(self, run_dir):
        s = subprocess.Popen([self.a.cli, "serve", "--pool-size", "512M"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=self.env(run_dir, False))
        line = s.stdout.readline()
        if "socket" not in line:
            raise SystemExit(f"serve did not start: {line!r}")
        return s

    def stats(self, run_dir):
        p = subprocess.run([self.a.cli, "stats", "--json"], capture_output=True, text=True,
                           env=self.env(run_dir, False), check=True)
        return json.loads(p.stdout)

    def node_ratio(self, n, one_copy):
        run_dir = tempfile.mkdtemp(dir=self.tmp)
        serve = self.serve(run_dir)
        engines = []
        try:
            for r in range(n):
                e = subprocess.Popen([self.a.engine, *self.work, "--rank", str(r), "--verify",
                                      "--hold-ms", "600000"], stdout=subprocess.PIPE, text=True,
                                     env=self.env(run_dir, True, KVSHIM_ONE_COPY=one_copy))
                for line in e.stdout:
                    if '"summary":true' in line:
                        if json.loads(line)["verify"] != "ok":
                            raise SystemExit(f"engine {r}: {line}")
                        break
                engines.append(e)
            # write-behind (one_copy=0) reaches serve in the background: wait until it is done
            for _ in range(100):
                st = self.stats(run_dir)
                if all(s.get("push_queued", 0) == s.get("push_sent", 0) + s.get("push_dropped", 0)
                       for s in st):
                    break
                time.sleep(0.1)
            used = sum(s["store_used_bytes"] for s in st)
            distinct = max(s["store_used_bytes"] for s in st)  # serve holds every chunk
            return used / distinct, used, distinct
        finally:
            for e in engines:
                e.kill()
                e.wait()
            serve.kill()
            serve.wait()

    def rss(self, arm):
        run_dir = tempfile.mkdtemp(dir=self.tmp)
        serve = self.serve(run_dir) if arm == "serve" else None
        stats = os.path.join(run_dir, "e.json")
        try:
            p = subprocess.Popen([self.a.engine, *self.work, "--rank", "1", "--hold-ms",
                                  str(self.a.hold_ms)],
                                 stdout=subprocess.DEVNULL,
                                 env=self.env(run_dir, arm != "off", KVSHIM_STATS=stats))
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = status
            if status != 0:
                raise SystemExit(f"rss {arm}: exit status {status}")
            kept = 0
            if arm != "off":
                with open(stats) as f:
                    kept = json.load(f)["store_used_bytes"]
            return ru.ru_maxrss * 1024, kept
        finally:
            if serve:
                serve.kill()
                serve.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--preload", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--engines", default="4,8")
    ap.add_argument("--hold-ms", type=int, default=3000,
                    help="the RSS runs stay alive this long after their request (a background "
                    "prefault has time to show)")
    ap.add_argument("--only", choices=("node", "rss"))
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    b = Bench(a)
    try:
        for n in [int(x) for x in a.engines.split(",")] if a.only != "rss" else []:
            for one_copy in (1, 0):
                rs = [b.node_ratio(n, one_copy) for _ in range(a.reps)]
                print(f"node bytes, {n} engines, KVSHIM_ONE_COPY={one_copy}: in use / distinct "
                      f"{fmt([r[0] for r in rs])} (in use {fmt([r[1] for r in rs], ' MiB', 2**20, 1)}"
                      f", distinct {fmt([r[2] for r in rs], ' MiB', 2**20, 1)}); limit 1.0",
                      flush=True)
        if a.only == "node":
            return 0
        res = {arm: [] for arm in ("off", "alone", "serve")}
        for rep in range(a.reps):
            for arm in (("off", "alone", "serve") if rep % 2 == 0 else ("serve", "alone", "off")):
                res[arm].append(b.rss(arm))
        off = statistics.median(r[0] for r in res["off"])
        print(f"engine max RSS without kvshim: {fmt([r[0] for r in res['off']], ' MiB', 2**20, 1)}")
        for arm in ("alone", "serve"):
            cost = [r[0] - off - r[1] for r in res[arm]]
            print(f"engine max RSS with kvshim, {arm}: "
                  f"{fmt([r[0] for r in res[arm]], ' MiB', 2**20, 1)}; kept in its pool "
                  f"{fmt([r[1] for r in res[arm]], ' MiB', 2**20, 1)}; on - off - kept "
                  f"{fmt(cost, ' MiB', 2**20, 1)} (goal <= 64 MiB)", flush=True)
        return 0
    finally:
        shutil.rmtree(b.tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
