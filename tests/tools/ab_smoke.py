#!/usr/bin/env python3
"""ctest driver for the A/B runner (scripts/ab): checks the shape of what it prints and writes,
never the timings.

usage: ab_smoke.py CASE --ab SCRIPTS_AB --engine REFENGINE --preload PRELOAD   (--list: the cases)
  CASE     run | fail | usage | cpus
  PRELOAD  libkvshim.so; when it does not exist the loaded and on arms are left out (said so)
Each case runs in its own temporary directory (the current directory while it runs, so a
default ./ab-out would land there, never in the source tree).

run    2 refengine processes in the arms off, loaded, on: table, results.csv, results.json, ab.png
fail   one arm of one repetition runs `false`: exit 1, the error and its stderr reported, the
       other repetitions still run; a hung command is killed by --timeout
usage  bad arguments: exit 2, the usage line, nothing written
cpus   3 repetitions with --cpus (one CPU): every process saw only that CPU; each ratio cell
       reads "median (lo..hi) [min..max]" and results.json holds its bootstrap interval with
       ci_lo <= median <= ci_hi
"""
import csv
import json
import os
import re
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from harness import Context, Failure, check  # noqa: E402
import harness  # noqa: E402

# A tiny workload: 3 requests of 96 tokens = 3 chunks of 32, the first 64 tokens shared.
REQUESTS, CHUNKS_PER_REQUEST = 3, 3
ENGINE_ARGS = ["--rank", "{rank}", "--requests", str(REQUESTS), "--prompt-tokens", "96",
               "--prefix-tokens", "64", "--chunk-tokens", "32", "--layers", "2",
               "--kv-heads", "2", "--head-dim", "16", "--hidden", "32"]
RUNNER_COLUMNS = ["rep", "arm", "rank", "pid", "exit_code", "status", "wall_s", "user_s",
                  "sys_s", "maxrss_mb"]


def ab(scripts_ab, args, expect_rc, timeout=240, env_extra=None):
    """Run scripts/ab; returns (stdout, stderr)."""
    env = dict(os.environ, **(env_extra or {}))
    # An ASan-built libkvshim.so is preloaded ahead of the engine's own ASan runtime.
    env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"),
                                                 "verify_asan_link_order=0"]))
    p = subprocess.run([scripts_ab] + args, capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=timeout)
    if p.returncode != expect_rc:
        raise Failure(f"scripts/ab {' '.join(args)}: exit {p.returncode}, expected {expect_rc}"
                      f"\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p.stdout, p.stderr


def arms_for(preload):
    if os.path.isfile(preload):
        return ["off", "loaded", "on"]
    print(f"NOTE: {preload} is not built: only the off arm is tested (the loaded and on arms "
          f"need the kvshim library)")
    return ["off"]


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
        f.seek(0)
        header = next(csv.reader(f))
    return header, rows


def table_rows(stdout):
    """The table's body as {metric: [cells]}, between the dashed rule and the first blank."""
    lines = stdout.splitlines()
    rule = next((i for i, ln in enumerate(lines) if ln.startswith("-----")), None)
    check(rule is not None and rule > 0, f"no table in stdout:\n{stdout}")
    header = lines[rule - 1].split()
    body = {}
    for ln in lines[rule + 1:]:
        if not ln.strip() or ln.startswith(("same in every run", "files:")) or \
                "0 in every run" in ln:
            break
        body[ln.split()[0]] = ln
    return header, body


def check_png(path):
    check(os.path.isfile(path), f"{path} was not written (is python3-matplotlib installed?)")
    with open(path, "rb") as f:
        data = f.read()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG (magic {data[:8]!r})")
    check(len(data) > 10000, f"{path} is only {len(data)} bytes")
    check(data[12:16] == b"IHDR", f"{path}: no IHDR chunk first")
    width, height = struct.unpack(">II", data[16:24])
    check(width >= 400 and height >= 300, f"{path}: {width}x{height} is too small to read")


def case_run(c):
    scripts_ab, engine, preload, work = c.args.ab, c.args.engine, c.preload, c.work
    arms = arms_for(preload)
    out = os.path.join(work, "out")
    stdout, stderr = ab(scripts_ab, ["--reps", "1", "--procs", "2", "--arms", ",".join(arms),
                                     "--preload", preload, "--out", out, "--",
                                     engine] + ENGINE_ARGS, 0)
    for arm in arms:
        check(f"rep 1/1 arm {arm}: 2 procs ... done in" in stderr,
              f"no progress line for arm {arm}:\n{stderr}")

    # The table: a column per arm and per ratio, and the promised rows.
    header, body = table_rows(stdout)
    ratios = [f"{a}/off" for a in arms if a != "off"]
    check(header == ["metric"] + arms + ratios, f"table header {header}")
    for m in ("wall_s", "user_s", "maxrss_mb", "ttft_ms_mean", "ttft_ms_p50",
              "ttft_ms_mean[rank0]", "ttft_ms_mean[rest]"):
        check(m in body, f"table has no {m} row:\n{stdout}")
    # A count equal in every run is listed under the table once there are several runs.
    check((f"requests={REQUESTS}" in stdout) == (len(arms) > 1) and
          ("requests" in body) == (len(arms) == 1), f"requests count misplaced:\n{stdout}")

    # results.csv: one row per process per run, every process ok with the engine's metrics.
    header, rows = read_csv(os.path.join(out, "results.csv"))
    check(header[:len(RUNNER_COLUMNS)] == RUNNER_COLUMNS, f"csv header {header}")
    for col in ("ttft_ms_mean", "ttft_ms_p50", "chunks", "chunks_loaded", "wall_ms"):
        check(col in header, f"csv has no {col} column: {header}")
    check(sorted((r["rep"], r["arm"], r["rank"]) for r in rows)
          == sorted(("1", a, str(k)) for a in arms for k in range(2)), f"csv rows {rows}")
    for r in rows:
        check(r["status"] == "ok" and r["exit_code"] == "0", f"csv row not ok: {r}")
        check(int(r["requests"]) == REQUESTS and
              int(r["chunks"]) == REQUESTS * CHUNKS_PER_REQUEST, f"engine metrics: {r}")
        for col in ("wall_s", "user_s", "sys_s", "maxrss_mb", "ttft_ms_mean"):
            check(float(r[col]) >= 0, f"{col} in {r}")
        check(float(r["maxrss_mb"]) > 0, f"maxrss_mb in {r}")
    if "on" in arms:
        stats_cols = [c for c in header if c.startswith("kvshim.")]
        check(stats_cols, f"no kvshim.* columns: the on arm wrote no KVSHIM_STATS ({header})")
        check(all(r[stats_cols[0]] != "" for r in rows if r["arm"] == "on"),
              "an on-arm process has no kvshim stats")
        check(all(r[stats_cols[0]] == "" for r in rows if r["arm"] == "off"),
              "an off-arm process has kvshim stats")

    # results.json: config, the raw runs, the summary with per-arm spreads and ratios.
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        data = json.load(f)
    check(set(data) >= {"config", "runs", "summary"}, f"results.json keys {list(data)}")
    cfg = data["config"]
    check(cfg["arms"] == arms and cfg["reps"] == 1 and cfg["procs"] == 2 and
          cfg["command"][0] == engine, f"config {cfg}")
    check(len(data["runs"]) == len(arms), f"{len(data['runs'])} runs")
    for run in data["runs"]:
        check(run["ok"] and [p["rank"] for p in run["procs"]] == [0, 1], f"run {run}")
        check("ttft_ms_mean[rank0]" in run["aggregate"], f"no split in {run['aggregate']}")
    s = data["summary"]
    check(s["failures"] == 0 and s["runs_ok"] == len(arms), f"summary counts {s}")
    wall = s["metrics"]["wall_s"]
    check(set(wall["arms"]) == set(arms) and wall["aggregation"] == "max", f"wall_s {wall}")
    check(set(wall["ratios"]) == set(ratios), f"wall_s ratios {wall['ratios']}")
    for st in wall["arms"].values():
        check(st["n"] == 1 and st["min"] <= st["median"] <= st["max"], f"spread {st}")
    check(s["metrics"]["user_s"]["aggregation"] == "sum", "user_s is not summed")
    check(s["metrics"]["ttft_ms_mean"]["aggregation"] == "mean", "ttft_ms_mean not a mean")

    check_png(os.path.join(out, "ab.png"))
    logs = sorted(os.listdir(os.path.join(out, "logs")))
    check(len([x for x in logs if x.endswith(".stdout")]) == 2 * len(arms), f"logs {logs}")

    # Each arm's environment, seen by a command that echoes it as JSON: {rank} and AB_*, --env
    # variables (KVSHIM_* only where preloaded, KVSHIM_ENABLE=0 in loaded, a fresh run
    # directory), and KVSHIM_* from the runner's own environment dropped.
    out2 = os.path.join(work, "out-env")
    fields = {"env_rank": "$AB_RANK", "arg_rank": "{rank}", "procs": "$AB_PROCS",
              "smoke": "$SMOKE_VALUE", "lease": "${KVSHIM_LEASE_MS:-0}",
              "enable": "${KVSHIM_ENABLE:-1}", "chunk": "${KVSHIM_CHUNK_TOKENS:-0}",
              "preloaded": "$([ -n \"$LD_PRELOAD\" ] && echo 1 || echo 0)",
              "run_dir": "$([ -d \"$KVSHIM_RUN_DIR\" ] && echo 1 || echo 0)"}
    script = "echo \"{" + ", ".join(f'\\"{k}\\": {v}' for k, v in fields.items()) + "}\""
    ab(scripts_ab, ["--reps", "1", "--procs", "3", "--stagger", "10", "--arms", ",".join(arms),
                    "--preload", preload, "--env", "SMOKE_VALUE=7", "KVSHIM_LEASE_MS=12345",
                    "--out", out2, "--", "sh", "-c", script], 0,
       env_extra={"KVSHIM_CHUNK_TOKENS": "64"})
    _, rows = read_csv(os.path.join(out2, "results.csv"))
    check(len(rows) == 3 * len(arms), f"rows {rows}")
    want = {"off": ("0", "1", "0", "0"), "loaded": ("12345", "0", "1", "1"),
            "on": ("12345", "1", "1", "1")}
    for r in rows:
        check(r["env_rank"] == r["arg_rank"] == r["rank"] and r["procs"] == "3" and
              r["smoke"] == "7", f"rank/env not passed: {r}")
        got = (r["lease"], r["enable"], r["preloaded"], r["run_dir"])
        check(got == want[r["arm"]] and r["chunk"] == "0",
              f"arm {r['arm']} environment (lease, enable, preloaded, run_dir) = {got}: {r}")


def case_fail(c):
    scripts_ab, engine, preload, work = c.args.ab, c.args.engine, c.preload, c.work
    arms = arms_for(preload)
    bad = arms[-1]
    out = os.path.join(work, "out")
    script = (f'if [ "$AB_ARM" = {bad} ] && [ "$AB_REP" = 2 ]; then '
              f'echo "boom from rank $AB_RANK" >&2; exec false; fi; echo "{{\\"x\\": 1}}"')
    stdout, stderr = ab(scripts_ab, ["--reps", "3", "--procs", "2", "--arms", ",".join(arms),
                                     "--preload", preload, "--out", out, "--",
                                     "sh", "-c", script], 1)
    check(f"rep 2/3 arm {bad}: 2 procs ... FAILED" in stderr, f"no FAILED line:\n{stderr}")
    check(f"rep 2 arm {bad} rank 0: exit 1" in stderr, f"exit code not reported:\n{stderr}")
    check("| boom from rank 1" in stderr, f"stderr tail not reported:\n{stderr}")
    check(f"rep 3/3 arm {bad}: 2 procs ... done" in stderr, f"rep 3 did not run:\n{stderr}")
    check("1 of" in stderr and "runs failed" in stderr, f"no failure summary:\n{stderr}")
    check("metric" in stdout and "wall_s" in stdout, f"no table after a failure:\n{stdout}")
    _, rows = read_csv(os.path.join(out, "results.csv"))
    check(len(rows) == 3 * len(arms) * 2, f"{len(rows)} csv rows")
    failed = [r for r in rows if r["status"] != "ok"]
    check(sorted((r["rep"], r["arm"], r["rank"]) for r in failed)
          == [("2", bad, "0"), ("2", bad, "1")], f"failed rows {failed}")
    check(all(r["exit_code"] == "1" and r["status"] == "exit 1" for r in failed), f"{failed}")
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        data = json.load(f)
    check(data["summary"]["failures"] == 1, f"summary {data['summary']['failures']}")
    check(data["summary"]["metrics"]["wall_s"]["arms"][bad]["n"] == 2,
          "the failed run was not left out of the summary")

    # A hung run is killed at --timeout and reported; the runner does not wait for it.
    t0 = time.monotonic()
    _, stderr = ab(scripts_ab, ["--reps", "1", "--arms", "off", "--timeout", "1", "--out",
                                os.path.join(work, "out-hung"), "--", "sleep", "60"], 1)
    check(time.monotonic() - t0 < 30, "--timeout did not stop the hung run")
    check("rep 1 arm off rank 0: timed out after 1 s (killed)" in stderr,
          f"timeout not reported:\n{stderr}")


def case_cpus(c):
    preload, work = c.preload, c.work
    arms = arms_for(preload)
    cpu = min(os.sched_getaffinity(0))
    out = os.path.join(work, "out")
    # Each process prints the CPUs it may run on and a value that differs between processes.
    prog = ("import json, os; a = os.sched_getaffinity(0); print(json.dumps("
            "{'ncpus': len(a), 'cpu': min(a), 'v': 1 + os.getpid() % 97}))")
    stdout, _ = ab(c.args.ab, ["--reps", "3", "--arms", ",".join(arms), "--cpus", str(cpu),
                               "--preload", preload, "--out", out, "--",
                               sys.executable, "-c", prog], 0)
    check(f"pinned to CPUs {cpu}" in stdout, f"no pinning line:\n{stdout}")
    _, rows = read_csv(os.path.join(out, "results.csv"))
    check(len(rows) == 3 * len(arms), f"rows {rows}")
    for r in rows:
        check(r["ncpus"] == "1" and r["cpu"] == str(cpu), f"process not pinned to {cpu}: {r}")
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        data = json.load(f)
    check(data["config"]["cpus"] == [cpu], f"config cpus {data['config'].get('cpus')}")
    if len(arms) == 1:
        print("NOTE: no ratio without the loaded and on arms: the interval is not checked")
        return
    ratios = data["summary"]["metrics"]["v"]["ratios"]
    check(set(ratios) == {f"{a}/off" for a in arms if a != "off"}, f"ratios {ratios}")
    for name, st in ratios.items():
        check(st["n"] == 3 and "ci_lo" in st and "ci_hi" in st, f"{name}: no interval: {st}")
        check(st["min"] <= st["ci_lo"] <= st["median"] <= st["ci_hi"] <= st["max"],
              f"{name}: interval does not hold the median: {st}")
    _, body = table_rows(stdout)
    check("v" in body, f"no row for v:\n{stdout}")
    num = r"(-?[0-9.]+)"
    cells = re.findall(num + r" \(" + num + r"\.\." + num + r"\) \[" + num + r"\.\." + num
                       + r"\]", body["v"])
    check(len(cells) == len(ratios), f"ratio cells not 'median (lo..hi) [min..max]': {body['v']}")
    for med, lo, hi, mn, mx in ((float(x) for x in cell) for cell in cells):
        check(mn <= lo <= med <= hi <= mx, f"table interval does not hold the median: {body['v']}")


def case_usage(c):
    scripts_ab, engine, preload, work = c.args.ab, c.args.engine, c.preload, c.work
    out = os.path.join(work, "never")
    bad = [
        ["--reps", "0", "--", "true"],
        ["--arms", "off,bogus", "--", "true"],
        ["--procs", "x", "--", "true"],
        ["--env", "NOEQUALS", "--", "true"],
        ["--frob", "--", "true"],
        ["--reps", "1", "true"],                                   # no "--"
        ["--arms", "off", "--"],                                   # no command
        ["--arms", "off", "--", os.path.join(work, "no-such-program")],
        ["--arms", "off,on", "--preload", os.path.join(work, "missing.so"), "--", "true"],
        ["--arms", "off", "--cpus", "x", "--", "true"],
        ["--arms", "off", "--cpus", "3-1", "--", "true"],
        ["--arms", "off", "--cpus", str(max(os.sched_getaffinity(0)) + 1), "--", "true"],
    ]
    for args in bad:
        _, stderr = ab(scripts_ab, args, 2)
        check(stderr.startswith("usage: scripts/ab") or "\nusage: scripts/ab" in stderr,
              f"{args}: no usage line:\n{stderr}")
        check("error:" in stderr, f"{args}: no error message:\n{stderr}")
    check(not os.path.exists(out) and not os.path.exists(os.path.join(os.getcwd(), "ab-out")),
          "a bad invocation wrote an output directory")
    _, stderr = ab(scripts_ab, ["--arms", "on", "--preload", os.path.join(work, "missing.so"),
                                "--", "true"], 2)
    check("missing.so does not exist" in stderr, f"missing preload not named:\n{stderr}")
    stdout, _ = ab(scripts_ab, ["--help"], 0)
    for word in ("--arms", "--reps", "--procs", "--stagger", "--env", "--out", "--preload",
                 "--timeout", "--cpus", "bootstrap", "{rank}", "AB_RANK", "KVSHIM_STATS", "example"):
        check(word in stdout, f"--help does not mention {word}")


class Ctx(Context):
    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.cwd = os.getcwd()
        os.chdir(work)

    def cleanup(self):
        os.chdir(self.cwd)
        super().cleanup()


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()),
                          harness.parser(__doc__, "--ab", "--engine", "--preload"), Ctx))
