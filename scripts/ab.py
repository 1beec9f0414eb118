#!/usr/bin/env python3
"""kvshim A/B runner (design.md §16). Started by scripts/ab, which installs python3-matplotlib
first; it also runs on its own (without matplotlib it skips the plot). Standard library only.

Model: one *run* = one arm of one repetition = P processes of COMMAND started together. Every
process yields a flat dict of numeric metrics (runner: wall/CPU/RSS; engine: its last JSON
line; kvshim: its KVSHIM_STATS file). A run's processes are reduced to one value per metric
(AGGREGATION below); repetitions are compared pair by pair against the off arm of the SAME
repetition, so slow drift of the machine cancels out of the ratios.
"""
import argparse
import csv
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import textwrap
import threading
import time

PROG = "scripts/ab"
ARMS = ("off", "loaded", "on")
DEFAULT_TIMEOUT_S = 600.0
# Bootstrap of each ratio's median over the repetitions: resamples, fixed seed (the same data
# gives the same interval), two-sided level.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 16
BOOTSTRAP_LEVEL = 0.95
# Metrics the runner measures itself, per process (os.wait4 rusage and the clock).
RUNNER_METRICS = ("wall_s", "user_s", "sys_s", "maxrss_mb")
# Metrics split into a "[rank0]" and a "[rest]" row when --procs > 1: the multi-process story
# is "rank 0 computes the shared prefix, ranks 1.. find it cached".
SPLIT_PREFIXES = ("ttft_", "chunks_loaded", "chunks_computed")
# Read at most this much of the end of a process's stdout to find its last JSON line.
STDOUT_TAIL_BYTES = 4 << 20
STDERR_TAIL_LINES = 12
# Default plot panels (those present in the data, in this order) unless --plot is given.
PLOT_DEFAULT = ("wall_s", "user_s", "maxrss_mb", "ttft_ms_mean", "ttft_ms_mean[rank0]",
                "ttft_ms_mean[rest]", "ttft_ms_p50", "ttft_ms_p90", "chunks_loaded",
                "kvshim.hook_hits")
ARM_COLOURS = {"off": "#8c8c8c", "loaded": "#e6a03c", "on": "#2f6db5"}

USAGE = f"{PROG} [OPTIONS] -- COMMAND [ARGS...]"
DESCRIPTION = """\
Run COMMAND with and without kvshim, interleaved, and compare.

Arms (--arms, run in the order given, one after the other, N times):
  off      no LD_PRELOAD and no KVSHIM_* variable at all
  loaded   LD_PRELOAD=libkvshim.so, the --env KVSHIM_* variables and KVSHIM_ENABLE=0:
           the cost of merely being loaded (every hook passes straight through)
  on       LD_PRELOAD=libkvshim.so and the --env KVSHIM_* variables
--env variables not named KVSHIM_* go to every arm; a --env LD_PRELOAD=X is kept in every
arm (kvshim goes first where preloaded). KVSHIM_* and LD_PRELOAD inherited from this
runner's own environment are dropped, so every arm starts from the same clean slate.

Each run (one arm of one repetition) starts --procs P copies of COMMAND at once, --stagger
MS apart. Copy i gets AB_RANK=i, AB_PROCS=P, AB_ARM=<arm>, AB_REP=<rep> in its environment,
{rank}, {arm} and {rep} in COMMAND and ARGS replaced by those values, its own KVSHIM_STATS
file, and stdin from /dev/null. The processes of one preloaded run share a fresh, empty
KVSHIM_RUN_DIR (removed afterwards): ranks share a cache, arms and repetitions never do
(unless --env sets KVSHIM_RUN_DIR). A preload that ld.so refuses fails the run.

Metrics per process: wall_s (start to exit), user_s and sys_s (CPU), maxrss_mb (peak RSS),
every numeric field of the LAST JSON line the command prints on stdout (refengine's summary:
ttft_ms_mean, ttft_ms_p50, wall_ms, chunks_loaded, ...), and every numeric field of kvshim's
KVSHIM_STATS file, prefixed "kvshim.".
Per run, processes are combined: max for wall_s, maxrss_mb and *wall_ms; sum for user_s and
sys_s (the CPU the whole job used); mean for everything else. With P > 1, TTFT-like metrics
also get a [rank0] row (the first process) and a [rest] row (mean of ranks 1..P-1).
Summary: per arm the median and [min..max] over repetitions; loaded/off and on/off ratios
are taken pair by pair inside each repetition, then shown as "median (lo..hi) [min..max]":
(lo..hi) is a bootstrap 95% interval of the median (2000 resamples of the repetitions with
replacement, fixed seed; with one repetition it is the value itself).

--cpus LIST (e.g. 2,3 or 0-3) pins every process of every arm to those CPUs (set in the runner
before each start and inherited by the child and all it starts), so the arms share the same
cores and do not wander; the CPUs must be in the runner's own affinity set.

Output: a progress line per run on stderr, the table on stdout, and in --out DIR:
  results.csv   one row per process per run: rep, arm, rank, pid, exit_code, status, metrics
  results.json  config, every run's raw per-process data, and the summary
  ab.png        one panel per metric: a bar per arm (median) with min..max whiskers
  logs/         each process's stdout and stderr      stats/  its KVSHIM_STATS file
A failing process (non-zero exit, signal, --timeout) is reported with its exit code and the
tail of its stderr; its run is left out of the summary, the other runs go on, and the exit
status is 1. Bad arguments: exit 2.
"""
EPILOG = """\
example (4 engines sharing a prompt prefix; rank 0 is started first):
  scripts/ab --reps 5 --procs 4 --stagger 200 --env KVSHIM_POOL_SIZE=2G -- \\
      build/tests/engines/refengine --rank {rank} --requests 16 --shared-prefix 0.75

  (refengine needs a CUDA driver: without a GPU, put the fake one first with
   LD_LIBRARY_PATH=build/tests/fakes/cuda/lib scripts/ab ...)
"""


def die_usage(msg):
    """Bad arguments: one line, the usage, exit 2 (argparse does the same for its errors)."""
    sys.stderr.write(f"usage: {USAGE}\n{PROG}: error: {msg}\n(see {PROG} --help)\n")
    sys.exit(2)


def warn(msg):
    sys.stderr.write(f"{PROG}: {msg}\n")


# ================================================================================================
# Arguments
# ================================================================================================

def parse_args(argv):
    """Options come before the first "--", the command after it."""
    cut = argv.index("--") if "--" in argv else len(argv)
    opts, command = argv[:cut], argv[cut + 1:]
    a, extra = build_parser().parse_known_args(opts)   # handles --help; exits 2 on errors
    if extra:
        die_usage(f"unrecognized arguments: {' '.join(extra)} (COMMAND goes after '--')")
    if cut == len(argv):
        die_usage("missing '--' before COMMAND")
    if not command:
        die_usage("no COMMAND after '--'")
    a.command = command

    arms = [s.strip() for s in a.arms.split(",")]
    bad = [s for s in arms if s not in ARMS]
    if bad or not arms:
        die_usage(f"--arms: unknown arm {bad[0]!r} (choose from {', '.join(ARMS)})" if bad
                  else "--arms is empty")
    if len(set(arms)) != len(arms):
        die_usage(f"--arms lists an arm twice: {a.arms}")
    a.arms = arms
    if a.reps < 1:
        die_usage("--reps must be at least 1")
    if a.procs < 1:
        die_usage("--procs must be at least 1")
    if a.stagger < 0 or not math.isfinite(a.stagger):
        die_usage("--stagger must be a non-negative number of milliseconds")
    if not (a.timeout > 0) or not math.isfinite(a.timeout):
        die_usage("--timeout must be a positive number of seconds")
    if a.cpus is not None:
        a.cpus = parse_cpus(a.cpus)

    env = {}
    for kv in a.env:
        key, sep, val = kv.partition("=")
        if not sep or not key or not (key[0].isalpha() or key[0] == "_") or \
                not all(c.isalnum() or c == "_" for c in key):
            die_usage(f"--env expects NAME=VALUE, got {kv!r}")
        if key.startswith("AB_"):
            die_usage(f"--env {key}: AB_* variables are set by the runner")
        if key == "KVSHIM_STATS":
            warn("note: --env KVSHIM_STATS is ignored: every process gets its own stats file "
                 "in the output directory")
            continue
        env[key] = val
    a.env = env

    # The command must be runnable (resolved with rank 0's substitution, as it will be run).
    exe = substitute(command[0], 0, arms[0], 1)
    if shutil.which(exe) is None:
        die_usage(f"COMMAND not found or not executable: {exe}")

    needs_preload = any(arm != "off" for arm in arms)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    a.preload_default = a.preload is None
    a.preload = os.path.abspath(a.preload or os.path.join(root, "build/preload/libkvshim.so"))
    if needs_preload:
        if not os.path.isfile(a.preload):
            how = ("build it first (scripts/demo builds it into build/), or pass --preload PATH"
                   if a.preload_default else "check --preload")
            die_usage(f"the loaded/on arms need the kvshim library, and {a.preload} does not "
                      f"exist: {how}; or run only --arms off")
        if any(c in a.preload for c in ": \t\n"):
            die_usage(f"--preload path cannot hold ':' or blanks (LD_PRELOAD splits on them): "
                      f"{a.preload}")
    if a.out is None:
        a.out = os.path.join("ab-out", time.strftime("%Y%m%d-%H%M%S"))
        stem, n = a.out, 1
        while os.path.exists(a.out):             # two runs in the same second
            n += 1
            a.out = f"{stem}-{n}"
    a.out = os.path.abspath(a.out)
    if a.plot:
        a.plot = [m.strip() for m in a.plot.split(",") if m.strip()]
    return a


def parse_cpus(text):
    """--cpus "0-2,5" -> [0, 1, 2, 5]; every CPU must be one this runner may use."""
    cpus = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            die_usage(f"--cpus expects a list such as 0,2 or 0-3, got {text!r}")
        if first < 0 or last < first:
            die_usage(f"--cpus: bad range {part.strip()!r}")
        cpus.update(range(first, last + 1))
    allowed = os.sched_getaffinity(0)
    outside = sorted(cpus - allowed)
    if outside:
        die_usage(f"--cpus: CPU {outside[0]} is not available to this process "
                  f"(allowed: {','.join(map(str, sorted(allowed)))})")
    return sorted(cpus)


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, usage=USAGE, description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default=",".join(ARMS), metavar="LIST",
                   help="comma list of off, loaded, on, in run order (default: off,loaded,on)")
    p.add_argument("--reps", type=int, default=5, metavar="N",
                   help="repetitions of the whole arm cycle (default 5)")
    p.add_argument("--procs", type=int, default=1, metavar="P",
                   help="copies of COMMAND started together in each run (default 1)")
    p.add_argument("--stagger", type=float, default=0.0, metavar="MS",
                   help="delay between the starts of consecutive copies, in ms (default 0)")
    p.add_argument("--env", action="extend", nargs="+", default=[], metavar="K=V",
                   help="environment for the runs (repeatable; see above for which arms)")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default ./ab-out/<YYYYmmdd-HHMMSS>)")
    p.add_argument("--preload", metavar="PATH",
                   help="kvshim library (default build/preload/libkvshim.so in the repository)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help="kill a run still going after S seconds; it counts as failed "
                        "(default 600)")
    p.add_argument("--cpus", metavar="LIST",
                   help="pin every process of every arm to these CPUs, e.g. 2,3 or 0-3 "
                        "(default: not pinned)")
    p.add_argument("--plot", metavar="LIST",
                   help="comma list of metrics for ab.png (default: wall_s, user_s, maxrss_mb "
                        "and the TTFT and cache metrics present)")
    return p


def substitute(arg, rank, arm, rep):
    return arg.replace("{rank}", str(rank)).replace("{arm}", arm).replace("{rep}", str(rep))


# ================================================================================================
# Running
# ================================================================================================

class Proc:
    """One process of a run. Filled in by its waiter thread (end, status, rusage) and by
    collect() (metrics). exit_code follows subprocess: -N when killed by signal N."""

    def __init__(self, rank):
        self.rank = rank
        self.pid = None
        self.start = self.end = None     # time.monotonic()
        self.status = None               # raw wait status
        self.rusage = None
        self.exit_code = None
        self.timed_out = False
        self.error = None                # why the process failed, one line; None = ok
        self.metrics = {}
        self.stdout = self.stderr = self.stats = None   # file paths


class Run:
    def __init__(self, rep, arm):
        self.rep, self.arm = rep, arm
        self.procs = []
        self.wall_s = None               # first start to last exit
        self.run_dir = None              # the temporary KVSHIM_RUN_DIR, if the runner made one
        self.aggregate = {}              # metric -> value over the run's processes

    @property
    def ok(self):
        return all(p.error is None for p in self.procs)


def base_env(args):
    """The runner's environment less KVSHIM_*, LD_PRELOAD and AB_* (noted once), plus the
    --env variables that are not KVSHIM_*."""
    env = dict(os.environ)
    dropped = sorted(k for k in env if k.startswith("KVSHIM_") or k == "LD_PRELOAD"
                     or k.startswith("AB_"))
    for k in dropped:
        del env[k]
    if dropped:
        warn(f"note: ignoring {', '.join(dropped)} from the environment (pass with --env)")
    env.update({k: v for k, v in args.env.items() if not k.startswith("KVSHIM_")})
    return env


def arm_env(args, base, arm):
    env = dict(base)
    if arm == "off":
        return env
    env.update({k: v for k, v in args.env.items() if k.startswith("KVSHIM_")})
    if arm == "loaded":
        env["KVSHIM_ENABLE"] = "0"
    extra = args.env.get("LD_PRELOAD")
    env["LD_PRELOAD"] = args.preload + (":" + extra if extra else "")
    return env


class pinned:
    """With cpus, the calling thread runs on them inside the block (a child started there
    inherits the affinity, and passes it on); the previous affinity comes back after."""

    def __init__(self, cpus):
        self.cpus, self.saved = cpus, None

    def __enter__(self):
        if self.cpus:
            self.saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cpus)

    def __exit__(self, *exc):
        if self.saved is not None:
            os.sched_setaffinity(0, self.saved)


def waiter(proc):
    """Reap one process; runs in its own thread so every exit time is taken at the exit."""
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.end = time.monotonic()
    proc.status, proc.rusage = status, rusage


def kill_group(pid, sig):
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def execute(args, base, rep, arm, live):
    """One run: start the P processes, wait for them (or the deadline), collect metrics.
    live: the set of process-group ids currently running, for the SIGINT handler."""
    run = Run(rep, arm)
    env = arm_env(args, base, arm)
    if arm != "off" and "KVSHIM_RUN_DIR" not in args.env:
        run.run_dir = tempfile.mkdtemp(prefix=f"kvshim-ab-{arm}-")
        env["KVSHIM_RUN_DIR"] = run.run_dir
    threads = []
    t_run = time.monotonic()
    deadline = t_run + args.timeout
    try:
        for rank in range(args.procs):
            if rank and args.stagger:
                time.sleep(max(0.0, min(args.stagger / 1000.0, deadline - time.monotonic())))
            proc = Proc(rank)
            run.procs.append(proc)
            name = f"rep{rep}-{arm}-rank{rank}"
            proc.stdout = os.path.join(args.out, "logs", name + ".stdout")
            proc.stderr = os.path.join(args.out, "logs", name + ".stderr")
            penv = dict(env, AB_RANK=str(rank), AB_PROCS=str(args.procs), AB_ARM=arm,
                        AB_REP=str(rep))
            if arm != "off":
                proc.stats = os.path.join(args.out, "stats", name + ".json")
                if os.path.exists(proc.stats):
                    os.unlink(proc.stats)      # a reused --out must not show old stats
                penv["KVSHIM_STATS"] = proc.stats
            argv = [substitute(x, rank, arm, rep) for x in args.command]
            with open(proc.stdout, "wb") as out, open(proc.stderr, "wb") as err, \
                    pinned(args.cpus):
                proc.start = time.monotonic()
                try:
                    # Own session: a timeout kills the process and everything it started.
                    proc.pid = os.posix_spawnp(argv[0], argv, penv, file_actions=[
                        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                        (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                        (os.POSIX_SPAWN_DUP2, err.fileno(), 2)], setsid=True)
                except OSError as e:
                    proc.error = f"cannot start {argv[0]}: {e.strerror}"
                    continue
            live.add(proc.pid)
            t = threading.Thread(target=waiter, args=(proc,), daemon=True)
            t.start()
            threads.append((proc, t))

        for proc, t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        late = [proc for proc, t in threads if t.is_alive()]
        for proc in late:
            proc.timed_out = True
            kill_group(proc.pid, signal.SIGKILL)
        for proc, t in threads:
            t.join()
    finally:
        # Whatever a process left behind in its session ends with the run (nothing may carry
        # a cache from one arm into the next); then the run's socket directory goes.
        for proc, _ in threads:
            kill_group(proc.pid, signal.SIGTERM)
            live.discard(proc.pid)
        if run.run_dir:
            shutil.rmtree(run.run_dir, ignore_errors=True)
    run.wall_s = time.monotonic() - t_run

    for proc in run.procs:
        if proc.status is not None:
            collect(proc, args)
    run.aggregate = aggregate(run.procs, args.procs)
    return run


def collect(proc, args):
    """Exit status, rusage and the two JSON sources into proc.metrics; a failure into error."""
    proc.exit_code = os.waitstatus_to_exitcode(proc.status)
    if proc.timed_out:
        proc.error = f"timed out after {args.timeout:g} s (killed)"
    elif proc.exit_code < 0:
        try:
            name = signal.Signals(-proc.exit_code).name
        except ValueError:
            name = "?"
        proc.error = f"killed by signal {-proc.exit_code} ({name})"
    elif proc.exit_code != 0:
        proc.error = f"exit {proc.exit_code}"
    elif proc.stats and preload_refused(proc.stderr):
        # ld.so only warns and runs the program without the library: that run measured nothing.
        proc.error = "ld.so did not preload the kvshim library (see its stderr)"
    m = proc.metrics
    m["wall_s"] = proc.end - proc.start
    m["user_s"] = proc.rusage.ru_utime
    m["sys_s"] = proc.rusage.ru_stime
    m["maxrss_mb"] = proc.rusage.ru_maxrss / 1024.0    # Linux: KiB
    for k, v in flatten(last_json_line(proc.stdout)).items():
        m[f"engine.{k}" if k in RUNNER_METRICS else k] = v
    if proc.stats and os.path.exists(proc.stats):
        try:
            with open(proc.stats, encoding="utf-8") as f:
                stats = json.load(f)
        except (OSError, ValueError) as e:
            warn(f"note: cannot read {proc.stats}: {e}")
            stats = {}
        for k, v in flatten(stats).items():
            if k != "kvshim_stats_version":
                m["kvshim." + k] = v


def last_json_line(path):
    """The last stdout line that is a JSON object, or {}."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - STDOUT_TAIL_BYTES))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    return {}


def flatten(obj, prefix=""):
    """Numeric leaves of a JSON object (booleans are not numbers); nested keys joined by '.'."""
    out = {}
    for k, v in obj.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[prefix + k] = v
    return out


def preload_refused(path):
    """Whether ld.so reported that an LD_PRELOAD object was ignored (it says so first)."""
    try:
        with open(path, "rb") as f:
            return b"cannot be preloaded" in f.read(65536)
    except OSError:
        return False


def stderr_tail(path):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return lines[-STDERR_TAIL_LINES:]


# ================================================================================================
# Aggregation and summary
# ================================================================================================

def how(metric):
    """How a run's processes are combined for one metric: max, sum or mean."""
    if metric in ("wall_s", "maxrss_mb") or metric.endswith("wall_ms"):
        return "max"        # the run lasts as long as its slowest process
    if metric in ("user_s", "sys_s"):
        return "sum"        # the CPU the whole job used
    return "mean"


def is_split(metric):
    return any(metric.startswith(p) for p in SPLIT_PREFIXES)


def aggregate(procs, nprocs):
    """One value per metric for the run (metrics some process lacks use those that have it);
    with nprocs > 1, the split metrics also as "<m>[rank0]" and "<m>[rest]"."""
    per = {}
    for p in procs:
        for k, v in p.metrics.items():
            per.setdefault(k, []).append((p.rank, v))
    agg = {}
    for k, pairs in per.items():
        vals = [v for _, v in pairs]
        rule = how(k)
        agg[k] = max(vals) if rule == "max" else sum(vals) if rule == "sum" else \
            sum(vals) / len(vals)
        if nprocs > 1 and is_split(k):
            first = [v for r, v in pairs if r == 0]
            rest = [v for r, v in pairs if r > 0]
            if first:
                agg[k + "[rank0]"] = first[0]
            if rest:
                agg[k + "[rest]"] = sum(rest) / len(rest)
    return agg


def spread(values):
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def bootstrap_median(values):
    """(lo, hi): percentile bootstrap interval (BOOTSTRAP_LEVEL) of the median of values,
    BOOTSTRAP_RESAMPLES resamples with replacement from a fixed seed; widened to hold the
    median itself."""
    med = statistics.median(values)
    if len(values) < 2:
        return med, med
    rng = random.Random(BOOTSTRAP_SEED)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n))
                  for _ in range(BOOTSTRAP_RESAMPLES))
    tail = (1.0 - BOOTSTRAP_LEVEL) / 2.0
    lo = meds[int(math.floor(tail * (BOOTSTRAP_RESAMPLES - 1)))]
    hi = meds[int(math.ceil((1.0 - tail) * (BOOTSTRAP_RESAMPLES - 1)))]
    return min(lo, med), max(hi, med)


def ratio_spread(values):
    """spread() plus ci_lo, ci_hi: the bootstrap interval of the median."""
    s = spread(values)
    if s:
        s["ci_lo"], s["ci_hi"] = bootstrap_median(values)
    return s


def metric_order(dicts):
    """The keys of the metric dicts in display order: runner metrics, then the engine's in the
    order it printed them, then kvshim's; each split row right after its metric."""
    seen = {}
    for d in dicts:
        for k in d:
            seen.setdefault(k, len(seen))

    def key(k):
        base = k.split("[")[0]
        group = 0 if base in RUNNER_METRICS else 2 if base.startswith("kvshim.") else 1
        return (group, RUNNER_METRICS.index(base) if group == 0 else seen.get(base, 0),
                0 if k == base else 1 if k.endswith("[rank0]") else 2)
    return sorted(seen, key=key)


def summarize(args, runs):
    """Per metric: median/min/max per arm over the successful runs, and the loaded/off and
    on/off ratios taken inside each repetition (both runs ok, off value non-zero)."""
    ok = {(r.rep, r.arm): r for r in runs if r.ok}
    metrics = {}
    for m in metric_order(r.aggregate for r in runs):
        arms = {}
        for arm in args.arms:
            vals = [r.aggregate[m] for (rep, a), r in sorted(ok.items())
                    if a == arm and m in r.aggregate]
            s = spread(vals)
            if s:
                arms[arm] = s
        ratios = {}
        if "off" in args.arms:
            for arm in (a for a in args.arms if a != "off"):
                vals = []
                for rep in range(1, args.reps + 1):
                    base, run = ok.get((rep, "off")), ok.get((rep, arm))
                    if base and run and m in base.aggregate and m in run.aggregate \
                            and base.aggregate[m] != 0:
                        vals.append(run.aggregate[m] / base.aggregate[m])
                s = ratio_spread(vals)
                if s:
                    ratios[f"{arm}/off"] = s
        rule = "rank 0" if m.endswith("[rank0]") else "mean of ranks 1.." \
            if m.endswith("[rest]") else how(m)
        metrics[m] = {"aggregation": rule, "arms": arms, "ratios": ratios}
    return metrics


# ================================================================================================
# Output: table, CSV, JSON, plot
# ================================================================================================

def fmt(v, decimals=None):
    """A number for the table: integers as such, others to `decimals` places (default: three
    significant digits)."""
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    if decimals is None:
        decimals = places(v)
    return f"{v:.{decimals}f}"


def places(v):
    """Decimal places that show three significant digits of v."""
    return max(0, 2 - math.floor(math.log10(abs(v)))) if v else 0


def cell(s, ratio=False):
    """ "median [min..max]", the three with the same number of decimal places (those that
    give the median three significant digits; a ratio always gets three)."""
    if not s:
        return "-"
    d = 3 if ratio else places(s["median"] or s["max"])
    f = (lambda v: f"{v:.3f}") if ratio else (lambda v: fmt(v, d))
    if s["min"] == s["max"]:
        return f(s["median"])
    ci = f" ({f(s['ci_lo'])}..{f(s['ci_hi'])})" if "ci_lo" in s else ""
    return f"{f(s['median'])}{ci} [{f(s['min'])}..{f(s['max'])}]"


def print_table(args, runs, summary, out=sys.stdout):
    n_ok = sum(r.ok for r in runs)
    ratio_cols = [f"{a}/off" for a in args.arms if a != "off"] if "off" in args.arms else []
    header = ["metric"] + list(args.arms) + ratio_cols
    # Counts that had one value in every run (two or more) go to a footer line, kvshim
    # counters that stayed 0 are only counted, so that the table shows what changed.
    rows, same, zeros, constant = [], [], 0, {}
    for m, s in summary.items():
        base = m.split("[")[0]
        vals = {v for st in s["arms"].values() for v in (st["min"], st["max"])}
        runs_with = sum(st["n"] for st in s["arms"].values())
        if len(vals) == 1 and runs_with > 1 and base not in RUNNER_METRICS and \
                float(next(iter(vals))).is_integer():
            v = vals.pop()
            if m.startswith("kvshim.") and v == 0:
                zeros += 1
            elif constant.get(base) != v:          # a split row only when it tells more
                same.append(f"{m}={fmt(v)}")
            constant[m] = v
            continue
        rows.append([m] + [cell(s["arms"].get(a)) for a in args.arms]
                    + [cell(s["ratios"].get(c), ratio=True) for c in ratio_cols])
    w = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]

    def line(r):
        return "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i])
                         for i, c in enumerate(r)).rstrip()

    def p(s=""):
        out.write(s + "\n")
    p()
    p(f"kvshim A/B: {' '.join(args.command)}")
    p(f"{args.reps} rep(s) x {len(args.arms)} arm(s) x {args.procs} proc(s)"
      + (f", stagger {args.stagger:g} ms" if args.stagger else "")
      + f"; {n_ok} of {len(runs)} runs ok")
    p("cells: median [min..max] over repetitions; ratios taken inside each repetition, "
      f"median (bootstrap {BOOTSTRAP_LEVEL:.0%} interval of the median) [min..max]")
    if args.cpus:
        p(f"pinned to CPUs {','.join(map(str, args.cpus))}")
    p("per run: max over processes for wall_s, maxrss_mb, *wall_ms; sum for user_s, sys_s; "
      "mean for the rest"
      + ("; [rank0] = process 0, [rest] = mean of processes 1.." if args.procs > 1 else ""))
    p()
    p(line(header))
    p(line(["-" * x for x in w]))
    for r in rows:
        p(line(r))
    if same:
        p(f"same in every run: {', '.join(same)}")
    if zeros:
        p(f"{zeros} kvshim counter{'s were' if zeros > 1 else ' was'} 0 in every run "
          f"(all in results.json)")
    if "off" not in args.arms:
        p("(no off arm: no ratios)")
    p()


def write_csv(path, runs):
    cols = metric_order(p.metrics for r in runs for p in r.procs)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["rep", "arm", "rank", "pid", "exit_code", "status"] + cols)
        for r in runs:
            for p in r.procs:
                w.writerow([r.rep, r.arm, p.rank, p.pid or "",
                            "" if p.exit_code is None else p.exit_code,
                            "ok" if p.error is None else p.error]
                           + ["" if c not in p.metrics else repr_num(p.metrics[c]) for c in cols])


def repr_num(v):
    return str(v) if isinstance(v, int) else f"{v:.6g}"


def write_json(path, args, runs, summary, host, started):
    data = {
        "config": {"command": args.command, "arms": args.arms, "reps": args.reps,
                   "procs": args.procs, "stagger_ms": args.stagger, "env": args.env,
                   "preload": args.preload if any(a != "off" for a in args.arms) else None,
                   "timeout_s": args.timeout, "cpus": args.cpus, "out": args.out, "argv": sys.argv[1:],
                   "started": started, "host": host},
        "runs": [{"rep": r.rep, "arm": r.arm, "ok": r.ok, "wall_s": r.wall_s,
                  "aggregate": r.aggregate,
                  "procs": [{"rank": p.rank, "pid": p.pid, "exit_code": p.exit_code,
                             "error": p.error, "metrics": p.metrics, "stdout": p.stdout,
                             "stderr": p.stderr, "kvshim_stats": p.stats} for p in r.procs]}
                 for r in runs],
        "summary": {"runs": len(runs), "runs_ok": sum(r.ok for r in runs),
                    "failures": sum(not r.ok for r in runs), "metrics": summary},
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def write_plot(path, args, summary):
    """ab.png: one panel per metric, a bar per arm at the median with min..max whiskers and
    the ratio to off in the panel title. Returns False (after a warning) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warn("warning: matplotlib is not installed (Debian: python3-matplotlib; scripts/ab "
             "installs it when run as root): ab.png skipped")
        return False
    wanted = args.plot or PLOT_DEFAULT
    missing = [m for m in wanted if m not in summary] if args.plot else []
    if missing:
        warn(f"warning: --plot: no data for {', '.join(missing)}")
    panels = [m for m in wanted if m in summary and summary[m]["arms"]]
    if not panels:
        warn("warning: nothing to plot: ab.png skipped")
        return False
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.3 * nrows + 0.8),
                             squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, m in zip(axes.flat, panels):
        s = summary[m]["arms"]
        top = max(st["max"] for st in s.values()) or 1.0
        for x, arm in enumerate(args.arms):          # every arm keeps its place and colour
            st = s.get(arm)
            if st is None:
                ax.text(x, 0.04 * top, "n/a", ha="center", va="bottom", fontsize=8)
                continue
            ax.bar(x, st["median"], width=0.6, color=ARM_COLOURS[arm],
                   yerr=[[st["median"] - st["min"]], [st["max"] - st["median"]]], capsize=5,
                   ecolor="black", error_kw={"linewidth": 1})
            ax.text(x, st["max"] + 0.02 * top, fmt(st["median"]), ha="center", va="bottom",
                    fontsize=8)
        ax.set_xticks(range(len(args.arms)), args.arms)
        ax.set_ylim(0, top * 1.18)
        ratio = "   ".join(f"{k} {v['median']:.2f}" for k, v in summary[m]["ratios"].items())
        ax.set_title(m + "\n" + ratio, fontsize=10)
        ax.tick_params(labelsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    cmd = textwrap.wrap("kvshim A/B: " + " ".join(args.command), width=40 * ncols,
                        max_lines=2, placeholder=" ...")
    fig.suptitle("\n".join(cmd) + f"\n{args.reps} rep(s), {args.procs} proc(s); bars: median, "
                 f"whiskers: min..max; titles: median ratio to off", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ================================================================================================
# Main
# ================================================================================================

def main(argv):
    args = parse_args(argv)
    for d in ("", "logs", "stats"):
        os.makedirs(os.path.join(args.out, d), exist_ok=True)
    base = base_env(args)
    host = {"hostname": platform.node(), "kernel": platform.release(),
            "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "python": platform.python_version()}
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    live = set()

    def on_signal(signum, _frame):
        for pid in list(live):
            kill_group(pid, signal.SIGKILL)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    runs, interrupted, warned_stats = [], False, False
    try:
        for rep in range(1, args.reps + 1):
            for arm in args.arms:
                n = args.procs
                sys.stderr.write(f"rep {rep}/{args.reps} arm {arm}: {n} proc{'s' * (n > 1)} ... ")
                sys.stderr.flush()
                run = execute(args, base, rep, arm, live)
                runs.append(run)
                failed = [p for p in run.procs if p.error]
                if not failed:
                    sys.stderr.write(f"done in {run.wall_s:.1f} s\n")
                else:
                    sys.stderr.write(f"FAILED in {run.wall_s:.1f} s\n")
                    for p in failed:
                        warn(f"rep {rep} arm {arm} rank {p.rank}: {p.error}; "
                             f"stderr ({p.stderr}):")
                        for ln in stderr_tail(p.stderr) or ["(empty)"]:
                            sys.stderr.write(f"    | {ln}\n")
                if arm == "on" and not warned_stats and run.ok and \
                        not any(k.startswith("kvshim.") for k in run.aggregate):
                    warned_stats = True
                    warn(f"note: arm on wrote no kvshim stats (KVSHIM_STATS) in rep {rep}")
    except KeyboardInterrupt:
        interrupted = True
        sys.stderr.write("\n")
        warn("interrupted: writing the results of the runs done so far")

    summary = summarize(args, runs)
    print_table(args, runs, summary)
    write_csv(os.path.join(args.out, "results.csv"), runs)
    write_json(os.path.join(args.out, "results.json"), args, runs, summary, host, started)
    plotted = write_plot(os.path.join(args.out, "ab.png"), args, summary)
    files = "results.csv, results.json" + (", ab.png" if plotted else "")
    sys.stdout.write(f"files: {args.out}/{{{files}}}\n")
    sys.stdout.flush()

    failures = sum(not r.ok for r in runs)
    if failures:
        warn(f"{failures} of {len(runs)} runs failed (details above); the summary leaves "
             f"them out")
    if interrupted:
        return 130
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
