#!/usr/bin/env python3
"""ctest driver: the node-llama-cpp prefix cache across two nodes through Redis (design §17,
§10.3). The engine is the unmodified CLI (`npx node-llama-cpp complete`), run exactly as
tests/engines/llama/check_prefix.py runs it (its Case class is reused, not copied).

  node A  `kvshim serve --remote redis://...` in its own KVSHIM_RUN_DIR; CLI A completes PA and
          exits; A's serve stops (its write-behind is flushed into Redis).
  node B  another `kvshim serve` on the same Redis, another run directory; CLI B completes PB,
          which shares PA's ~1,100-token prefix: B's completion equals B without kvshim, its
          stats show the prefix restored from the cache peer, and B's serve counts remote hits.

With --chunks both CLIs store and restore chunk objects (KVSHIM_LLAMA_CHUNKS=1, design §10.4):
B's serve brings the chunks, the frame and the continuation chunk from Redis (each looked up
first: only a LOOKUP asks a serve to consult its remote tier) and B assembles them; nothing is
refused as a damaged state.

usage: remote_llama.py --preload LIBKVSHIM --kvshim CLI [--asan-runtime LIBASAN] [--no-setup]
                       [--chunks]
Exit status: 0 pass, 1 fail, 77 skipped (no Node.js >= 20 / no node_modules).
"""
import argparse
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "engines", "llama"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "lib"))
import check_prefix as cp  # noqa: E402
import llama_e2e  # noqa: E402
import servers  # noqa: E402

# check_prefix's Case before and after the shared harness (tests/lib/harness.py): the
# constructor gained a work directory, and its errors became harness.Failure.
if hasattr(cp, "Fatal"):
    Failure = cp.Fatal
else:
    import harness  # noqa: E402
    Failure = harness.Failure
SKIP = 77
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def make_case(args, work):
    args.no_setup = True  # main() ran the setup step already
    if len(inspect.signature(cp.Case.__init__).parameters) == 4:  # (self, args, tmp, work)
        return cp.Case(args, work, work)
    return cp.Case(args, work)


def close_case(c):
    (getattr(c, "close", None) or getattr(c, "cleanup"))()


def start_serve(c, tier, where):
    """`kvshim serve` with its tier ("remote": a Redis URL, "disk": a directory) at where;
    returns once its banner says the tier is on."""
    s = subprocess.Popen([c.kvshim, "serve", "--pool-size", "512M", "--" + tier, where],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=c.env(False),
                         text=True)
    c.procs.append(s)
    banner = s.stdout.readline()
    if tier + " tier on" not in banner:
        raise Failure("kvshim serve did not start with its %s tier: %r" % (tier, banner))
    return s


def stop_serve(s):
    s.send_signal(signal.SIGTERM)
    _, err = s.communicate(timeout=60)
    if s.returncode != 0:
        raise Failure("kvshim serve exited %d: %s" % (s.returncode, err))


def serve_stats(c):
    p = subprocess.run([c.kvshim, "stats", "--json"], capture_output=True, text=True,
                       env=c.env(False), timeout=60)
    arr = json.loads(p.stdout or "[]")
    return arr[0] if arr else {}


def check_restored(b, ref_b, through):
    """B (its run b) answered as B without kvshim (ref_b) and restored the shared prefix through
    the serve named by through."""
    check(b["completion"] == ref_b["completion"],
          "B's completion equals B without kvshim:\n     %s\n     %s"
          % (ref_b["completion"], b["completion"]))
    check(cp.pstat(b, "restored_tokens") >= 512 and cp.pstat(b, "peer_restores") >= 1,
          "B restored the shared prefix through %s %s" % (through, cp.show(b)))


def check_chunks(c, a, b):
    """With --chunks: A stored chunk objects (none whole) and B assembled its restore from them;
    either way nothing B read was refused as a damaged state."""
    check(cp.pstat(b, "bad_blobs") == 0, "B refused nothing as a damaged state %s" % cp.show(b))
    if c.llama_env:
        check(a["stats"].get("llama_chunks_stored", 0) >= 2 and
              a["stats"].get("llama_chunks_whole", 0) == 0,
              "A stored chunk objects: %s" % {k: v for k, v in a["stats"].items()
                                               if k.startswith("llama_chunks_")})
        check(b["stats"].get("llama_chunks_assembled", 0) >= 1,
              "B assembled its restore from chunk objects: %s"
              % {k: v for k, v in b["stats"].items() if k.startswith("llama_chunks_")})


def run(c, redis):
    nodes = tempfile.mkdtemp(prefix="kvs-rl-n-")
    try:
        c.group = "nodes"
        ref_b = c.cli("B reference", "B", False, 2048)
        c.run_dir = os.path.join(nodes, "a")
        sa = start_serve(c, "remote", redis.url)
        a = c.cli("A on node A", "A", True, 2048, **c.llama_env)
        check(cp.pstat(a, "snapshots") >= 1 and a["stats"].get("cache_peer_stores", 0) >= 1,
                 "A stored its prompt's state straight into node A's serve %s" % cp.show(a))
        stop_serve(sa)
        c.run_dir = os.path.join(nodes, "b")
        sb = start_serve(c, "remote", redis.url)
        b = c.cli("B on node B", "B", True, 2048, **c.llama_env)
        check_restored(b, ref_b, "node B's serve")
        check_chunks(c, a, b)
        st = serve_stats(c)
        check(st.get("remote_hits", 0) >= 1 and st.get("remote_bad_values", 1) == 0,
                 "node B's serve fetched A's state from Redis: hits %s bad %s"
                 % (st.get("remote_hits"), st.get("remote_bad_values")))
        stop_serve(sb)
    finally:
        shutil.rmtree(nodes, ignore_errors=True)


def drive(body, prefix):
    """The driver's main, shared with tests/core/tiers/disk_llama.py: options, the setup step, one
    Case in a short work directory (its run directories' sockets live there), body(case), the
    summary line. Exit status 0, 1 or SKIP."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--preload", required=True)
    ap.add_argument("--kvshim", required=True)
    ap.add_argument("--asan-runtime", default="")
    ap.add_argument("--no-setup", action="store_true")
    ap.add_argument("--chunks", action="store_true",
                    help="the engines store chunk objects (KVSHIM_LLAMA_CHUNKS=1)")
    args = ap.parse_args()
    if not args.no_setup:
        rc = subprocess.run([llama_e2e.SETUP]).returncode
        if rc == SKIP:
            print("SKIP: the node-llama-cpp engine cannot be prepared here", flush=True)
            return SKIP
        if rc != 0:
            print("FAIL scripts/llama-setup exited %d" % rc, flush=True)
            return 1
    work = tempfile.mkdtemp(prefix=prefix)
    c = make_case(args, work)
    c.llama_env = {"KVSHIM_LLAMA_CHUNKS": "1"} if args.chunks else {}
    try:
        body(c)
    except Failure as e:
        check(False, str(e))
    finally:
        close_case(c)
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("%d check(s) failed" % len(failures), flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


def main():
    def body(c):
        with servers.Standalone() as redis:
            run(c, redis)
    return drive(body, "kvs-rl-")


if __name__ == "__main__":
    sys.exit(main())
