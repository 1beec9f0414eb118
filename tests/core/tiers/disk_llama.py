#!/usr/bin/env python3
"""ctest driver: the node-llama-cpp prefix cache survives a crash of `kvshim serve` through its
disk tier (design §18, §10.3). The engine is the unmodified CLI (`npx node-llama-cpp
complete`), run exactly as tests/engines/llama/check_prefix.py runs it (its Case class is
reused, as tests/core/tiers/remote_llama.py does).

  1. `kvshim serve --disk DIR`; CLI A completes PA and exits; once serve has written A's state
     to DIR, serve is SIGKILLed (nothing flushed).
  2. a new `kvshim serve --disk DIR` (empty pool, the scan finds A's state); CLI B completes PB,
     which shares PA's ~1,100-token prefix: B's completion equals B without kvshim, its stats
     show the prefix restored from the cache peer, and serve counts disk hits.

With --chunks both CLIs store and restore chunk objects (KVSHIM_LLAMA_CHUNKS=1): every chunk
and the frame are written behind before the crash, and B assembles its restore from disk.

usage: disk_llama.py --preload LIBKVSHIM --kvshim CLI [--asan-runtime LIBASAN] [--no-setup]
                     [--chunks]
Exit status: 0 pass, 1 fail, 77 skipped (no Node.js >= 20 / no node_modules).
"""
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import remote_llama as rl  # noqa: E402  (its Case adapters, checks and serve helpers)
from remote_llama import check, cp, serve_stats, start_serve, stop_serve  # noqa: E402

SKIP = 77


def run(c):
    tmp = tempfile.mkdtemp(prefix="kvs-dl-n-")
    try:
        c.group = "disk"
        disk = os.path.join(tmp, "disk")
        ref_b = c.cli("B reference", "B", False, 2048)
        c.run_dir = os.path.join(tmp, "run")
        s1 = start_serve(c, "disk", disk)
        a = c.cli("A", "A", True, 2048, **c.llama_env)
        check(cp.pstat(a, "snapshots") >= 1 and a["stats"].get("cache_peer_stores", 0) >= 1,
              "A stored its prompt's state straight into serve %s" % cp.show(a))
        # every object A stored (one blob; or its chunks and frame) written behind
        want = max(1, serve_stats(c).get("store_committed_objects", 1))
        deadline = time.time() + 60
        while serve_stats(c).get("disk_writes", 0) < want and time.time() < deadline:
            time.sleep(0.1)
        check(serve_stats(c).get("disk_writes", 0) >= want,
              "serve wrote A's %d objects to disk" % want)
        s1.kill()  # a crash: nothing flushed, the pool is gone
        s1.wait(timeout=30)
        s2 = start_serve(c, "disk", disk)
        b = c.cli("B after the restart", "B", True, 2048, **c.llama_env)
        rl.check_restored(b, ref_b, "the restarted serve")
        rl.check_chunks(c, a, b)
        st = serve_stats(c)
        check(st.get("disk_scan_objects", 0) >= 1 and st.get("disk_hits", 0) >= 1 and
              st.get("disk_bad", 1) == 0,
              "the restarted serve read A's state from disk: scan %s hits %s bad %s"
              % (st.get("disk_scan_objects"), st.get("disk_hits"), st.get("disk_bad")))
        stop_serve(s2)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    return rl.drive(run, "kvs-dl-")


if __name__ == "__main__":
    sys.exit(main())
