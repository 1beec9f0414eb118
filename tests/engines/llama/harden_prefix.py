#!/usr/bin/env python3
"""End-to-end: kvshim's prefix cache in unmodified node-llama-cpp 3.21.1 engines (its CLI) under
faults in the cache peer (issue 17), reusing check_prefix.py's harness: each engine run is
repeated without kvshim (the reference) and must produce exactly the same completion.

  corrupt   A's state is pushed to `kvshim serve`; bytes of serve's pool are flipped through its
            memfd (/proc/<pid>/fd). B: identical; the corrupt state counted as a bad blob
            (llama_prefix_bad_blobs) and reported (peer_bad_reports); serve dropped it
            (coord_bad_dropped). B2: identical and never handed the corrupt state again.
  killed    serve SIGKILLed while B is fetching/restoring A's state, at several delays: B's
            completion is identical every time, and B's counters explain it (a restore from
            the peer, or peer errors / no restore).

Usage: harden_prefix.py --case CASE --preload LIBKVSHIM --kvshim CLI [--work-dir DIR] [--keep]
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
import check_prefix as cp  # noqa: E402


def serve_stats(c, s):
    p = subprocess.run([c.kvshim, "stats", str(s.pid), "--json"], capture_output=True, text=True,
                       env=c.env(False), timeout=60)
    if p.returncode != 0:
        raise cp.Fatal("kvshim stats: %s" % p.stderr)
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
    raise cp.Fatal("no kvshim pool memfd in %s" % fd_dir)


def case_corrupt(c):
    serve = c.serve()
    a = c.cli("A", "A", True, 2048)
    cp.check(cp.pstat(a, "snapshots") >= 1, "A stored its state %s" % cp.show(a))
    time.sleep(1.0)  # write-behind
    cp.check(serve_stats(c, serve)["store_objects"] >= 1, "serve holds A's state")
    flip_pool(serve.pid)
    ref_b = c.cli("B reference", "B", False, 2048)
    b = c.cli("B, serve corrupted", "B", True, 2048, KVSHIM_PUSH="off")
    cp.check(b["completion"] == ref_b["completion"], "B identical with a corrupted cache peer")
    cp.check(cp.pstat(b, "bad_blobs") >= 1 and cp.pstat(b, "peer_restores") == 0,
             "the corrupt state is a bad blob, never restored %s" % cp.show(b))
    cp.check(b["stats"].get("peer_bad_reports", 0) >= 1, "B reported it to serve")
    st = serve_stats(c, serve)
    cp.check(st["coord_bad_dropped"] >= 1, "serve dropped the corrupt state (reports %d, "
             "dropped %d)" % (st["coord_bad_reports"], st["coord_bad_dropped"]))
    b2 = c.cli("B2", "B", True, 2048, KVSHIM_PUSH="off")
    cp.check(b2["completion"] == ref_b["completion"] and cp.pstat(b2, "bad_blobs") == 0,
             "B2 identical and not handed the corrupt state again %s" % cp.show(b2))


def case_killed(c):
    ref_b = c.cli("B reference", "B", False, 2048)
    for delay in (0.5, 1.5, 3.0):
        serve = c.serve()
        c.cli("A", "A", True, 2048)
        time.sleep(1.0)
        env = c.env(True, KVSHIM_PUSH="off")
        p = c.cli_start("B", env, 2048)
        time.sleep(delay)
        serve.send_signal(signal.SIGKILL)
        serve.wait(timeout=10)
        b = c.cli_finish(p, "B, serve killed after %.1f s" % delay)
        b["stats"] = c.stats(env)
        explained = (cp.pstat(b, "peer_restores") >= 1 or b["stats"].get("peer_errors", 0) >= 1
                     or cp.pstat(b, "restores") == 0)
        cp.check(b["completion"] == ref_b["completion"] and explained,
                 "serve killed %.1f s into B: identical; peer_restores %d, peer_errors %d %s"
                 % (delay, cp.pstat(b, "peer_restores"), b["stats"].get("peer_errors", 0),
                    cp.show(b)))


if __name__ == "__main__":
    # check_prefix.py's runner (llama-setup, work dir, cleanup) with this file's cases added.
    cp.CASES = ("corrupt", "killed")
    cp.case_corrupt, cp.case_killed = case_corrupt, case_killed
    sys.exit(cp.main())
