#!/usr/bin/env python3
"""End-to-end: kvshim's prefix cache in unmodified node-llama-cpp 3.21.1 engines (its CLI) under
faults in the cache peer (issue 17), reusing check_prefix.py's harness: each engine run is
repeated without kvshim (the reference) and must produce exactly the same completion.

  corrupt   A's state is pushed to `kvshim serve`; bytes of serve's pool are flipped through its
            memfd (/proc/<pid>/fd). B: identical; the corrupt state counted as a bad blob
            (llama_prefix_bad_blobs) and reported (peer_bad_reports); serve dropped it
            (coord_bad_dropped). B2: identical and never handed the corrupt state again.
  full      serve's pool is full of objects pinned by another client (soak_client --hold-pins):
            A's snapshot cannot be kept there (push_dropped, serve's store_no_space); B is
            identical and restores nothing from the peer.
  killed    serve SIGKILLed just as B connected to it (about to look up and fetch A's state)
            and 20 / 100 ms later: B's completion is identical every time, and B's counters
            explain it: a restore from the peer (peer_restores), a failed peer call
            (peer_errors), or no peer asked at all (peer_lookups 0: B's watcher dropped the
            dead serve before B's prompt, which it then computed itself).

Usage: harden_prefix.py CASE --preload LIBKVSHIM --kvshim CLI [--work-dir DIR] [--keep]
                        [--no-setup] [--asan-runtime LIBASAN]
Exit status: 0 pass, 1 fail, 77 skipped (no Node.js >= 20 or no npm registry).
"""
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_prefix as cp  # noqa: E402  (the CLI context: c.cli, c.serve, pstat, show)
import llama_e2e  # noqa: E402
from harness import Failure, check  # noqa: E402  (tests/lib, on the path through check_prefix)


def serve_stats(c, s):
    p = subprocess.run([c.kvshim, "stats", str(s.pid), "--json"], capture_output=True, text=True,
                       env=c.env(False), timeout=60)
    if p.returncode != 0:
        raise Failure("kvshim stats: %s" % p.stderr)
    d = json.loads(p.stdout)
    return d[0] if isinstance(d, list) else d


def flip_pool(pid):
    fd_dir = "/proc/%d/fd" % pid
    for n in os.listdir(fd_dir):
        try:
            if "kvshim-pool" not in os.readlink(os.path.join(fd_dir, n)):
                continue
        except OSError:
            continue
        with open(os.path.join(fd_dir, n), "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
            off, size = struct.unpack_from("<QQ", m, 40)
            for o in range(off + 200, off + size, 4096):
                m[o] ^= 0x5A
            m.close()
            return
    raise Failure("no kvshim pool memfd in %s" % fd_dir)


def case_corrupt(c):
    serve = c.serve()
    a = c.cli("A", "A", True, 2048)
    check(cp.pstat(a, "snapshots") >= 1, "A stored its state %s" % cp.show(a))
    time.sleep(1.0)  # write-behind
    check(serve_stats(c, serve)["store_objects"] >= 1, "serve holds A's state")
    flip_pool(serve.pid)
    ref_b = c.cli("B reference", "B", False, 2048)
    b = c.cli("B, serve corrupted", "B", True, 2048, KVSHIM_PUSH="off")
    check(b["completion"] == ref_b["completion"], "B identical with a corrupted cache peer")
    check(cp.pstat(b, "bad_blobs") >= 1 and cp.pstat(b, "peer_restores") == 0,
             "the corrupt state is a bad blob, never restored %s" % cp.show(b))
    check(b["stats"].get("peer_bad_reports", 0) >= 1, "B reported it to serve")
    st = serve_stats(c, serve)
    check(st["coord_bad_dropped"] >= 1, "serve dropped the corrupt state (reports %d, "
             "dropped %d)" % (st["coord_bad_reports"], st["coord_bad_dropped"]))
    b2 = c.cli("B2", "B", True, 2048, KVSHIM_PUSH="off")
    check(b2["completion"] == ref_b["completion"] and cp.pstat(b2, "bad_blobs") == 0,
             "B2 identical and not handed the corrupt state again %s" % cp.show(b2))


def case_full(c):
    serve = c.serve(pool="4M")
    holder = subprocess.Popen([os.path.join(os.path.dirname(c.kvshim), "..", "tests", "core",
                                            "wire", "soak_client"), "--hold-pins", str(8 << 20)],
                              stdout=subprocess.PIPE, env=c.env(False), text=True)
    c.procs.append(holder)
    line = holder.stdout.readline()
    if not line.startswith("held "):
        raise Failure("soak_client --hold-pins: %r" % line)
    st0 = serve_stats(c, serve)
    check(st0["store_free_bytes"] == 0 and st0["store_live_pins"] >= 1,
             "serve's pool is full of pinned objects (%s)" % line.strip())
    ref_b = c.cli("B reference", "B", False, 2048)
    a = c.cli("A, serve full", "A", True, 2048)
    time.sleep(1.0)  # write-behind
    st = serve_stats(c, serve)
    check(a["stats"].get("push_dropped", 0) >= 1 and st["store_no_space"] >= 1,
             "A's state could not be kept by a full serve: push_dropped %d, serve no_space %d"
             % (a["stats"].get("push_dropped", 0), st["store_no_space"]))
    b = c.cli("B, serve full", "B", True, 2048)
    check(b["completion"] == ref_b["completion"] and cp.pstat(b, "peer_restores") == 0,
             "B identical with a full cache peer %s" % cp.show(b))


def fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def case_killed(c):
    ref_b = c.cli("B reference", "B", False, 2048)
    for delay in (0.0, 0.02, 0.1):
        serve = c.serve()
        c.cli("A", "A", True, 2048)
        time.sleep(1.0)  # write-behind done, A's connections closed
        base = fds(serve.pid)
        env = c.env(True, KVSHIM_PUSH="off")
        p = c.cli_start("B", env, 2048)
        # B connected to serve (one more descriptor there): it is about to look up and fetch
        # A's state. Kill serve then, or a little later, in the middle of that.
        t0 = time.monotonic()
        while fds(serve.pid) <= base and p.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.002)
        time.sleep(delay)
        serve.send_signal(signal.SIGKILL)
        serve.wait(timeout=10)
        b = c.cli_finish(p, "B, serve killed %.2f s after B connected" % delay)
        b["stats"] = c.stats(env)
        # Explained: B restored before serve died, or a call to it failed, or B's watcher had
        # already dropped the dead serve (its socket went) before B's first prompt asked
        # anything: no peer was asked (peer_lookups 0) and B computed the prompt itself.
        pr, pe = cp.pstat(b, "peer_restores"), b["stats"].get("peer_errors", 0)
        asked = b["stats"].get("peer_lookups", 0)
        check(b["completion"] == ref_b["completion"] and (pr >= 1 or pe >= 1 or asked == 0),
                 "serve killed %.2f s after B connected: identical; explained by peer_restores "
                 "%d, peer_errors %d or peer_lookups %d %s" % (delay, pr, pe, asked, cp.show(b)))


if __name__ == "__main__":
    sys.exit(llama_e2e.main(globals(), cp.Case, "--preload", "--kvshim", asan=True))
