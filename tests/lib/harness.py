"""The one harness kvshim's Python test drivers share (style rule 16; libuv's test/task.h).

A driver defines its cases as functions `case_<name>(ctx)` (or a dict name -> function), its
options, and optionally a Context subclass for its engine; then

    if __name__ == "__main__":
        sys.exit(harness.main(harness.cases(globals()),
                              harness.parser(__doc__, "--engine", "--preload", asan=True), Ctx))

`driver.py --list` prints the case names, one a line (tests/lib/kvshim_tests.cmake registers one
ctest per name at configure time); `driver.py CASE [options]` runs one case. Exit status: 0 pass,
1 fail, 77 skipped (ctest SKIP_RETURN_CODE), 2 bad usage. A failed case keeps its files and says
where; --keep keeps them after a pass too.

What is here, once:
  check(cond, what)   a failed check raises Failure(what); in keep-going mode (main(...,
                      keep_going=True), the node-llama-cpp e2e drivers) every check prints
                      "ok   what" / "FAIL what", a failure is recorded and the case goes on
  require(cond, what) a step the rest depends on: raises Failure(what) in every mode
  Failure             the one failure class: a failed check, or a step the rest depends on
  Skip                the case cannot run on this machine (exit 77)
  Context             one case's processes and files: a short temporary directory holding the
                      case's KVSHIM_RUN_DIR, child environments with or without LD_PRELOAD
                      (the sanitizer runtime first), `kvshim serve`, cleanup
  ScriptContext       the same for a script-driven engine (fakehost, prefixhost): run, start,
                      finish
  parser, setup_step  a driver's options; a setup program that may skip the case (exit 77)
  read_stats, sum_stats    KVSHIM_STATS JSON files
  read_line, finish   line reading from running children, with timeouts
"""
import argparse
import glob
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77


class Failure(Exception):
    """A check failed, or a step the rest of the case depends on did."""


class Skip(Exception):
    """The case cannot run here (no Node.js, no npm registry, ...): ctest reports it skipped."""


_soft = None  # keep-going mode: the failed checks' messages


def check(cond, what):
    """Passes when cond is true. Otherwise raises Failure(what), or in keep-going mode records
    it and returns False (every check's outcome is printed in that mode)."""
    if _soft is not None:
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            _soft.append(what)
        return bool(cond)
    if not cond:
        raise Failure(what)
    return True


def require(cond, what):
    """A step the rest of the case depends on: raises Failure(what) unless cond, in every mode."""
    if not cond:
        raise Failure(what)


# ---- KVSHIM_STATS ----------------------------------------------------------------------------

def read_stats(path):
    """The JSON stats a process wrote at exit (KVSHIM_STATS=path)."""
    require(os.path.exists(path), f"no KVSHIM_STATS file {path}")
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise Failure(f"stats file {path} is not JSON ({e}): {text[:200]!r}")


def live_stats(ctx, pid, timeout=60):
    """The stats of live process pid (`kvshim stats PID --json`, its first entry), or None while
    it cannot answer (no coordinator before its runtime is up)."""
    r = subprocess.run([ctx.kvshim, "stats", str(pid), "--json"], capture_output=True, text=True,
                       env=ctx.env(preload=False), timeout=timeout)
    if r.returncode != 0:
        return None
    d = json.loads(r.stdout)
    return d[0] if isinstance(d, list) else d


def sum_stats(pattern):
    """The integer counters of every stats file matching a glob, summed ({} when none)."""
    merged = {}
    for path in glob.glob(pattern):
        for k, v in read_stats(path).items():
            if isinstance(v, int):
                merged[k] = merged.get(k, 0) + v
    return merged


# ---- refengine (tests/engines/refengine) -----------------------------------------------------

def refengine_prefix_args(prefix_chunks, chunk_tokens=64):
    """refengine's options for one request on its small model (4 layers, 2 KV heads of 16) whose
    prompt is a shared prefix of prefix_chunks chunks of chunk_tokens and two chunks more, the
    kvo buffers in host memory. The caller adds --rank (and --verify)."""
    return ["--requests", "1", "--prompt-tokens", str((prefix_chunks + 2) * chunk_tokens),
            "--prefix-tokens", str(prefix_chunks * chunk_tokens),
            "--chunk-tokens", str(chunk_tokens), "--layers", "4", "--kv-heads", "2",
            "--head-dim", "16", "--hidden", "32", "--kvo-buffer", "host"]


# ---- lines from running children --------------------------------------------------------------

def wait_file(path, what, p=None, timeout=60):
    """Waits until path exists (a child's "ready" file): a Failure naming what after timeout
    seconds, or as soon as the process p (when given) has exited without making it."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        require(p is None or p.poll() is None,
                f"{what}: exited (rc {p.returncode if p else None}) before {path} appeared")
        require(time.monotonic() < deadline, f"{what}: {path} did not appear in {timeout} s")
        time.sleep(0.01)


def stop_process(p):
    """SIGSTOP the child p and return once it is stopped. kill() only queues a stop: the thread
    it picks stops when it next runs, and only then are the others told, so a thread of p that
    is already running, or is woken by a request before the picked one gets a CPU, still
    answers it (seen on a loaded machine: a request sent after kill() was served). The group
    stop is complete, every thread stopped, when the parent's waitid(WSTOPPED) reports it
    (man 2 waitid)."""
    p.send_signal(signal.SIGSTOP)
    r = os.waitid(os.P_PID, p.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
    check(r is not None and r.si_code == os.CLD_STOPPED, f"pid {p.pid} stopped (waitid: {r})")


_pending = {}  # pid -> bytes read from stdout but not yet returned as lines


def read_line(p, timeout, what):
    """One stdout line of a running process, within timeout seconds. Raw reads on the fd, so
    lines that arrive together are never stuck in a buffer select() cannot see; the rest is
    kept for the next read_line or finish()."""
    deadline = time.monotonic() + timeout
    buf = _pending.get(p.pid, b"")
    fd = p.stdout.fileno()
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        require(left > 0, f"{what}: no output line within {timeout} s")
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            p.wait(timeout=30)
            err = p.stderr.read() if p.stderr else ""
            if isinstance(err, bytes):
                err = err.decode(errors="replace")
            raise Failure(f"{what}: exited (rc {p.returncode}) before the line; stderr:\n{err}")
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    _pending[p.pid] = rest
    return line.decode() + "\n"


def finish(p, timeout, what, input=None):
    """Waits for a process: (the rest of its stdout after the lines read so far, its stderr),
    both str. A process still running after timeout seconds is a Failure (it is killed by
    Context.cleanup)."""
    try:
        out, err = p.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failure(f"{what}: still running after {timeout} s")
    rest = _pending.pop(p.pid, b"")
    if isinstance(out, bytes):
        out = out.decode(errors="replace")
    if isinstance(err, bytes):
        err = err.decode(errors="replace")
    return rest.decode(errors="replace") + (out or ""), err or ""


# ---- one case's processes and files -----------------------------------------------------------

class Context:
    """One case: tmp (a short temporary directory: Unix socket paths have 108 bytes) holding
    the KVSHIM_RUN_DIR, work (--work-dir, or tmp) for the case's files, the processes started,
    and the environments they get. Subclasses set the class attributes below and add their
    engine's helpers. Options read from args when the driver has them: --preload, --cli or
    --kvshim (the kvshim CLI: self.kvshim), --asan-runtime (a sanitized libkvshim.so: that
    runtime goes first in LD_PRELOAD)."""

    drop = ("KVSHIM_",)   # inherited variables (name prefixes) no child sees; LD_PRELOAD too
    defaults = {}         # every child gets these (after KVSHIM_RUN_DIR)
    preload_env = {}      # children with LD_PRELOAD get these
    asan_env = {}         # children with LD_PRELOAD and a sanitizer runtime get these

    def __init__(self, args, tmp, work):
        self.args = args
        self.tmp = tmp
        self.work = work
        self.preload = getattr(args, "preload", None)
        self.kvshim = getattr(args, "cli", None) or getattr(args, "kvshim", None)  # the CLI
        self.asan_runtime = getattr(args, "asan_runtime", None) or ""
        self.run_dir = os.path.join(tmp, "run")
        self.procs = []
        self.n = 0

    def p(self, name):
        """A path in the case's work directory."""
        return os.path.join(self.work, name)

    def stats_path(self, name=None):
        """A fresh KVSHIM_STATS path (numbered), or <name>.stats.json."""
        if name is None:
            self.n += 1
            return self.p(f"stats{self.n}.json")
        return self.p(name + ".stats.json")

    def env(self, preload=True, **extra):
        """A child's environment: the caller's minus `drop` and LD_PRELOAD, this case's run
        directory, `defaults`; with preload, LD_PRELOAD (sanitizer runtime first); then extra."""
        env = {k: v for k, v in os.environ.items()
               if k != "LD_PRELOAD" and not k.startswith(self.drop)}
        env["KVSHIM_RUN_DIR"] = self.run_dir
        env.update(self.defaults)
        if preload:
            env["LD_PRELOAD"] = ":".join(filter(None, [self.asan_runtime, self.preload]))
            env.update(self.preload_env)
            if self.asan_runtime:
                env.update(self.asan_env)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def spawn(self, argv, env, text=False, stdin=None, **kw):
        """Starts a child with piped stdout and stderr; cleanup() kills it if still running."""
        p = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env, text=text, **kw)
        self.procs.append(p)
        return p

    def serve(self, pool="64M"):
        """`kvshim serve` (not preloaded) in this case's run directory, once it has printed its
        socket line."""
        s = self.spawn([self.kvshim, "serve", "--pool-size", pool], self.env(preload=False),
                       text=True)
        s.banner = read_line(s, 30, "kvshim serve")
        require("socket" in s.banner, f"serve banner: {s.banner!r}")
        return s

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            try:
                p.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):
                pass


class ScriptContext(Context):
    """A script-driven engine (tests/fakes/llama's fakehost and prefixhost): argv(cmds) runs the
    commands in order and prints one line per command. Every case has its own group; inherited
    FAKELLAMA_* settings are dropped too."""
    drop = ("KVSHIM_", "FAKELLAMA_")
    group = "kvshim"        # KVSHIM_GROUP of the case's processes
    what = "engine"         # the engine's name in messages
    timeout = 60            # seconds one run may take

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.defaults = {"KVSHIM_GROUP": self.group, "KVSHIM_POOL_SIZE": "64M",
                         "KVSHIM_HOST_POOL_SIZE": "0", "KVSHIM_LOG": "info",
                         "ASAN_OPTIONS": "verify_asan_link_order=0"}

    def argv(self, cmds):
        raise NotImplementedError

    def run(self, cmds, preload=True, what=None, timeout=None, **extra):
        """Runs the engine to completion, with its own KVSHIM_STATS when preloaded: (output
        lines, stderr, stats or None)."""
        what = what or self.what
        stats = self.stats_path() if preload else None
        env = self.env(preload, **extra)
        if stats:
            env["KVSHIM_STATS"] = stats
        p = subprocess.run(self.argv(cmds), capture_output=True, text=True, env=env,
                           timeout=timeout or self.timeout)
        if p.returncode != 0:
            raise Failure(f"{what}: exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        lines = p.stdout.splitlines()
        require(len(lines) == len(cmds), f"{what}: {len(lines)} lines for {len(cmds)} commands:\n"
                                         f"{p.stdout}\nstderr:\n{p.stderr}")
        return lines, p.stderr, read_stats(stats) if stats and os.path.exists(stats) else None

    def start(self, cmds, preload=True, **extra):
        """Starts the engine in the background with its own KVSHIM_STATS: (Popen, stats path)."""
        stats = self.stats_path()
        env = self.env(preload, **extra)
        env["KVSHIM_STATS"] = stats
        return self.spawn(self.argv(cmds), env, text=True), stats

    def finish(self, p, what, n_cmds=None, timeout=None):
        """Waits for a started engine, which must exit 0: (lines, stderr)."""
        out, err = finish(p, timeout or self.timeout, what)
        require(p.returncode == 0, f"{what}: exit {p.returncode}\nstdout:\n{out}\nstderr:\n{err}")
        lines = out.splitlines()
        if n_cmds is not None:
            require(len(lines) == n_cmds, f"{what}: {len(lines)} lines for {n_cmds} commands:\n{out}")
        return lines, err


# ---- the runner --------------------------------------------------------------------------------

def parser(doc, *required, asan=False, optional=(), **defaults):
    """A driver's option parser: its docstring's first line, each of `required` (an option
    taking a value, e.g. "--preload"), each of `optional` (the same, but a driver may go without
    it: the cases that need it skip), each of `defaults` (an option named by the keyword, "_"
    for "-", with that default and its type: layers=8 is --layers, an int, 8 when not given),
    and with asan, --asan-runtime (the sanitizer runtime that goes first in LD_PRELOAD with a
    sanitized libkvshim.so). Drivers add their other options."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    for opt in required:
        ap.add_argument(opt, required=True)
    for opt in optional:
        ap.add_argument(opt)
    for name, default in defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    if asan:
        ap.add_argument("--asan-runtime", default="",
                        help="ASan builds: the sanitizer runtime, preloaded before kvshim")
    return ap


def setup_step(argv):
    """Runs a setup program that exits 77 when this machine cannot run the case (e.g.
    scripts/llama-setup without Node.js or the npm registry): Skip, or Failure on another
    error."""
    rc = subprocess.run(argv).returncode
    if rc == SKIP:
        raise Skip(f"{os.path.basename(argv[0])} cannot prepare this machine (see above)")
    require(rc == 0, f"{' '.join(argv)} exited {rc}")


def cases(namespace):
    """{name: function} of a module's case_* functions, in definition order (case_foo_bar is
    case foo-bar)."""
    return {n[len("case_"):].replace("_", "-"): f for n, f in namespace.items()
            if n.startswith("case_") and callable(f)}


def main(case_table, parser=None, context=Context, keep_going=False):
    """Runs the case named on the command line (or lists them with --list). parser: the
    driver's options (the case name, --work-dir and --keep are added here). context(args, tmp,
    work) builds the case's context; it may raise Skip or Failure. A case function takes the
    context, or nothing when the driver keeps its options in a module global."""
    global _soft
    argv = sys.argv[1:]
    if "--list" in argv:
        print("\n".join(case_table))
        return 0
    ap = parser or argparse.ArgumentParser()
    ap.add_argument("case", choices=list(case_table))
    ap.add_argument("--work-dir", help="the case's files (emptied first; default: a temporary "
                                       "directory)")
    ap.add_argument("--keep", action="store_true", help="keep the case's files after a pass")
    args = ap.parse_args(argv)
    name = args.case
    tmp = tempfile.mkdtemp(prefix=f"kvs-{name}-")
    work = tmp
    if args.work_dir:
        work = os.path.abspath(args.work_dir)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
    if keep_going:
        _soft = []
    ctx, rc = None, 0
    try:
        ctx = context(args, tmp, work)
        fn = case_table[name]
        if fn.__code__.co_argcount:
            fn(ctx)
        else:
            fn()
    except Skip as e:
        print(f"SKIP {name}: {e}", flush=True)
        rc = SKIP
    except (Failure, subprocess.TimeoutExpired) as e:
        if _soft is not None:
            check(False, str(e))
        else:
            print(f"FAIL {name}: {e}", file=sys.stderr, flush=True)
            rc = 1
    finally:
        if ctx is not None:
            ctx.cleanup()
    if _soft:
        print(f"{name}: {len(_soft)} check(s) failed", flush=True)
        rc = 1
    if rc == 1 or args.keep:
        print(f"(files kept in {tmp}" + (f" and {work})" if work != tmp else ")"),
              file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
        if work != tmp:
            shutil.rmtree(work, ignore_errors=True)
    if rc == 0:
        print(f"ok {name}")
    return rc
