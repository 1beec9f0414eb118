#!/usr/bin/env python3
"""A/B of kvshim on unmodified llama-server replicas sharing a prefix (scripts/demo's real-engine
part; README "Use it with llama-server").

N replicas of llama-server (built by scripts/llama-server-setup, llama-server's default flags
unless --server-args says otherwise, one thread each) answer requests sent one after another,
round robin as a load balancer would: every prompt is one shared document of about --prefix
words (about as many tokens) plus a question of its own. Arms, interleaved per repetition:
  off     no preload
  loaded  LD_PRELOAD=libkvshim.so, KVSHIM_ENABLE=0
  on      LD_PRELOAD=libkvshim.so and `kvshim serve` in the group (the node's cache peer)
TTFT is measured by the client (request sent to first streamed token). Rows: replica 0's first
request (it computes the document), the other replicas' first requests (with kvshim they
restore the document computed by replica 0), and every later request (llama-server's own
prompt cache serves those in every arm). Every completion is compared across arms: kvshim must
not change a token. Prints the table, writes results.json, results.csv and a plot (ab.png).

usage: server_ab.py --preload LIB --kvshim CLI [--replicas N] [--requests N] [--reps N]
                    [--prefix WORDS] [--server-args "ARGS"] [--out DIR]
Exit status: 0 done and every output identical; 1 an output differed or a step failed;
77 llama-server cannot be built here.
"""
import argparse
import csv
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "engines", "llama"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import harness  # noqa: E402
import replica  # noqa: E402
from llama_e2e import text, tiny_model  # noqa: E402

ARMS = ("off", "loaded", "on")
ROWS = (("first0", "replica 0, first request (computes the document)"),
        ("first", "other replicas, first request"),
        ("later", "later requests (llama-server's own cache)"))


def say(msg):
    print("==> " + msg, file=sys.stderr, flush=True)


def arm_env(arm, args, run_dir, stats):
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith("KVSHIM_")}
    if arm == "off":
        return env
    env["LD_PRELOAD"] = args.preload
    env["KVSHIM_RUN_DIR"] = run_dir
    if arm == "loaded":
        env["KVSHIM_ENABLE"] = "0"
    else:
        env["KVSHIM_STATS"] = stats
        env["KVSHIM_HOST_POOL_SIZE"] = "0"
    return env


def run_arm(arm, rep, args, bins, model, prompts, out):
    """One repetition of one arm: start serve (on) and the replicas, send every request, stop.
    Returns the request records and the replicas' kvshim stats."""
    work = tempfile.mkdtemp(prefix="kvs-srv-", dir=args.tmp)
    run_dir = os.path.join(work, "run")
    os.makedirs(run_dir, mode=0o700)
    serve = None
    reps, records, stats = [], [], []
    try:
        if arm == "on":
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            env["KVSHIM_RUN_DIR"] = run_dir
            serve = subprocess.Popen([args.kvshim, "serve", "--pool-size", args.serve_pool],
                                     env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(out, "logs", "serve-%d.log" % rep), "w"))
            deadline = time.monotonic() + 30
            while not any(f.endswith(".sock") for f in _walk(run_dir)):
                harness.require(serve.poll() is None and time.monotonic() < deadline,
                                "kvshim serve did not start (log in %s/logs)" % out)
                time.sleep(0.05)
        for i in range(args.replicas):
            st = os.path.join(work, "stats-%d.json" % i)
            log = os.path.join(out, "logs", "%s-%d-replica%d.log" % (arm, rep, i))
            reps.append(replica.Replica(bins, model, env=arm_env(arm, args, run_dir, st),
                                        args=shlex.split(args.server_args), log=log,
                                        ctx=args.ctx))
        for r in reps:
            r.start()
        seen = [0] * args.replicas
        for k, prompt in enumerate(prompts):
            i = k % args.replicas
            res = reps[i].complete(prompt, n_predict=args.tokens)
            row = "first0" if (i == 0 and seen[i] == 0) else ("first" if seen[i] == 0 else "later")
            seen[i] += 1
            records.append({"arm": arm, "rep": rep, "request": k, "replica": i, "row": row,
                            "ttft_s": res["ttft_s"], "prompt_n": res["timings"].get("prompt_n"),
                            "cache_n": res["timings"].get("cache_n"), "content": res["content"]})
    finally:
        for r in reps:
            r.stop()
        if serve is not None:
            serve.terminate()
            serve.wait(30)
        for i in range(len(reps)):
            st = os.path.join(work, "stats-%d.json" % i)
            stats.append(harness.read_stats(st) if os.path.exists(st) else None)
        shutil.rmtree(work, ignore_errors=True)
    return records, stats


def _walk(d):
    for _, _, files in os.walk(d):
        yield from files


def fmt(v):
    return "%.0f" % (v * 1000)


def summary(records, stats_by_run, args):
    table, medians = [], {}
    for key, label in ROWS:
        cells = []
        for arm in ARMS:
            v = [r["ttft_s"] for r in records if r["arm"] == arm and r["row"] == key]
            if v:
                medians[(key, arm)] = statistics.median(v)
                cells.append("%s [%s-%s]" % (fmt(statistics.median(v)), fmt(min(v)), fmt(max(v))))
            else:
                cells.append("-")
        on, off = medians.get((key, "on")), medians.get((key, "off"))
        ratio = "%.2f" % (on / off) if on and off else "-"
        table.append((label, cells, ratio))
    w = max(len(label) for label, _, _ in table)
    print("TTFT ms, median [min-max] over %d repetition(s); %d replicas, %d requests each"
          % (args.reps, args.replicas, args.requests))
    print("%-*s  %-18s %-18s %-18s %s" % (w, "", "off", "loaded", "on", "on/off"))
    for label, cells, ratio in table:
        print("%-*s  %-18s %-18s %-18s %s" % (w, label, cells[0], cells[1], cells[2], ratio))
    restored = [sum(s.get("llama_prefix_restored_tokens", 0) for s in run if s)
                for run in stats_by_run]
    if restored:
        print("tokens restored by kvshim per on-arm run (all replicas): %s"
              % ", ".join(str(x) for x in restored))
    return medians


def plot(records, medians, args, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("python3-matplotlib is not installed: no plot")
        return None
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.26
    colors = {"off": "#888888", "loaded": "#c9a227", "on": "#2a7ab9"}
    for j, arm in enumerate(ARMS):
        xs, ys, lo, hi = [], [], [], []
        for i, (key, _) in enumerate(ROWS):
            v = [r["ttft_s"] * 1000 for r in records if r["arm"] == arm and r["row"] == key]
            if not v:
                continue
            m = statistics.median(v)
            xs.append(i + (j - 1) * width)
            ys.append(m)
            lo.append(m - min(v))
            hi.append(max(v) - m)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=arm, color=colors[arm])
    ax.set_xticks(range(len(ROWS)))
    ax.set_xticklabels(["replica 0\nfirst request", "other replicas\nfirst request",
                        "later\nrequests"])
    ax.set_ylabel("time to first token (ms)")
    ax.set_title("llama-server x%d (%s) sharing a %d-word document"
                 % (args.replicas, args.server_args or "default flags", args.prefix))
    ax.legend(title="kvshim")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preload", required=True, help="libkvshim.so")
    ap.add_argument("--kvshim", required=True, help="the kvshim CLI")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3, help="requests per replica")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--prefix", type=int, default=1400, help="words of the shared document")
    ap.add_argument("--tokens", type=int, default=16, help="tokens generated per request")
    ap.add_argument("--ctx", type=int, default=8192, help="llama-server -c")
    ap.add_argument("--server-args", default="", help="extra llama-server flags (default none)")
    ap.add_argument("--serve-pool", default="512M", help="kvshim serve --pool-size")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tmp", default=None, help="where run directories go (default $TMPDIR)")
    args = ap.parse_args()
    if args.replicas < 2 or args.requests < 1 or args.reps < 1:
        ap.error("--replicas must be at least 2, --requests and --reps at least 1")
    out = args.out or os.path.join(ROOT, "ab-out", "server-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    try:
        bins = replica.binaries()
    except harness.Skip as e:
        say("skipped: %s" % e)
        return harness.SKIP
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    model = os.path.join(data, "model-%dx%d.gguf" % (args.layers, args.embd))
    if not os.path.exists(model):
        tiny_model(model, {"layers": args.layers, "embd": args.embd})
    document = text(1, args.prefix)
    prompts = [document + " question " + text(100 + k, 12) for k in range(args.replicas * args.requests)]
    records, on_stats = [], []
    for rep in range(args.reps):
        for arm in ARMS:
            say("repetition %d/%d, arm %s: %d replicas, %d requests"
                % (rep + 1, args.reps, arm, args.replicas, len(prompts)))
            recs, stats = run_arm(arm, rep, args, bins, model, prompts, out)
            records += recs
            if arm == "on":
                on_stats.append(stats)
    ref = {r["request"]: r["content"] for r in records if r["arm"] == "off" and r["rep"] == 0}
    differ = [r for r in records if r["content"] != ref.get(r["request"])]
    medians = summary(records, on_stats, args)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"records": records, "stats": on_stats, "args": vars(args)}, f, indent=1)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arm", "rep", "request", "replica", "row", "ttft_ms", "prompt_n", "cache_n"])
        for r in records:
            w.writerow([r["arm"], r["rep"], r["request"], r["replica"], r["row"],
                        round(r["ttft_s"] * 1000, 1), r["prompt_n"], r["cache_n"]])
    png = plot(records, medians, args, os.path.join(out, "ab.png"))
    print("outputs: %s (results.json, results.csv%s)" % (out, ", ab.png" if png else ""))
    if differ:
        print("FAILED: %d completion(s) differ from the off arm's (first: request %d, arm %s)"
              % (len(differ), differ[0]["request"], differ[0]["arm"]))
        return 1
    print("every completion identical in every arm (%d requests)" % len(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
