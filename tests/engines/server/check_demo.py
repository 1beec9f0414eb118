#!/usr/bin/env python3
"""scripts/demo's llama-server part (server_ab.py) on the real llama-server, small.

Cases:
  demo  2 replicas with llama-server's default flags, 2 requests each, one repetition of the
        arms off, loaded and on: server_ab.py exits 0 (every completion identical in every
        arm), writes results.json, results.csv and, where Debian's python3 has matplotlib,
        ab.png; in the on arm the second replica's first request restores at least 85% of
        the prompt replica 0 computed (the shared document is about 96% of it)
Skips (77) where scripts/llama-server-setup cannot build llama-server.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import harness  # noqa: E402
from harness import check, require  # noqa: E402

# Debian's python3 sees python3-matplotlib (scripts/ab and scripts/demo pick it the same way).
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def has_matplotlib():
    return subprocess.run([PY, "-c", "import matplotlib"], stderr=subprocess.DEVNULL).returncode == 0


def case_demo(ctx):
    out = os.path.join(ctx.work, "demo")
    cmd = [PY, os.path.join(HERE, "server_ab.py"), "--preload", ctx.args.preload,
           "--kvshim", ctx.args.kvshim, "--replicas", "2", "--requests", "2", "--reps", "1",
           "--out", out, "--tmp", ctx.tmp]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=900)
    print(p.stdout[-3000:], flush=True)
    if p.returncode == harness.SKIP:
        raise harness.Skip("llama-server cannot be built here")
    check(p.returncode == 0, "server_ab.py exited %d (0: every completion identical)" % p.returncode)
    require(os.path.exists(os.path.join(out, "results.json")), "results.json written")
    check(os.path.exists(os.path.join(out, "results.csv")), "results.csv written")
    if has_matplotlib():
        check(os.path.getsize(os.path.join(out, "ab.png")) > 10000, "ab.png written")
    res = json.load(open(os.path.join(out, "results.json")))
    first0 = [r for r in res["records"] if r["arm"] == "off" and r["row"] == "first0"]
    require(len(first0) == 1 and first0[0]["prompt_n"], "the off arm's first request has prompt_n")
    prompt = first0[0]["prompt_n"]
    require(len(res["stats"]) == 1 and all(res["stats"][0]), "both on-arm replicas wrote stats")
    restored = [s.get("llama_prefix_restored_tokens", 0) for s in res["stats"][0]]
    check(restored[1] >= 0.85 * prompt,
          "replica 1 restored %d tokens of a %d-token prompt (>= 85%%)" % (restored[1], prompt))
    check(restored[0] == 0, "replica 0 (it computes the document) restored nothing: %d" % restored[0])


if __name__ == "__main__":
    ap = harness.parser(__doc__, "--preload", "--kvshim")
    sys.exit(harness.main(harness.cases(globals()), ap))
