#!/usr/bin/env python3
"""ctest driver: llama-server's prefix survives a crash of `kvshim serve` through its disk tier.

usage: disk_server.py CASE --preload LIBKVSHIM --cli KVSHIM [--work-dir DIR]

The llama-server binaries, the model (scripts/tiny-gguf's 8x512), the prompts and the replica
helpers are check_server.py's (its Ctx is reused); exit 77 (skipped) when llama-server cannot be
prepared here. Issue 26, design §18.

Cases:
  restart   1. a replica without kvshim answers DOC + question 2 (the reference);
            2. `kvshim serve --disk DIR`; replica A (kvshim preloaded) computes DOC + question 1
               and stores its state; A stops; serve writes what it got to DIR (its disk_writes
               and disk_write_drops stop moving, at least one write);
            3. serve is SIGKILLed (nothing flushed, its pool gone) and started again on DIR: its
               scan finds A's objects;
            4. a fresh replica B asks DOC + question 2: its completion equals the reference,
               it restored >= 90% of DOC's tokens, and the restarted serve counts disk hits and
               no bad record.
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_server as cs  # noqa: E402
from check_server import DOC, ask, check, question, require  # noqa: E402
import harness  # noqa: E402  (check_server put tests/lib on the path)


class Ctx(cs.Ctx):
    def serve_disk(self, disk):
        """`kvshim serve --disk DIR` once it has printed its socket line with the disk tier."""
        s = self.spawn([self.kvshim, "serve", "--pool-size", "512M", "--disk", disk],
                       self.env(preload=False), text=True)
        s.banner = harness.read_line(s, 60, "kvshim serve --disk")
        require("disk tier on" in s.banner, f"serve banner: {s.banner!r}")
        return s

    def serve_stats(self, s):
        r = subprocess.run([self.kvshim, "stats", str(s.pid), "--json"], capture_output=True,
                           text=True, env=self.env(preload=False), timeout=60)
        check(r.returncode == 0, f"kvshim stats {s.pid} (serve): {r.stderr}")
        st = json.loads(r.stdout)
        return st[0] if isinstance(st, list) else st


def settled_writes(ctx, s, timeout=120):
    """Waits until serve has written at least one object and its disk_writes and
    disk_write_drops have not moved for a second: the write-behind queue is empty."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        st = ctx.serve_stats(s)
        now = (st.get("disk_writes", 0), st.get("disk_write_drops", 0))
        if now != last:
            last, since = now, time.monotonic()
        elif now[0] >= 1 and time.monotonic() - since >= 1.0:
            return st
        time.sleep(0.2)
    check(False, f"serve's write-behind did not settle within {timeout} s: {last}")


def case_restart(ctx):
    disk = ctx.p("disk")
    ref, r = cs.replay(ctx, (), [ask(DOC + question(2))], False)
    ctx.stop(r)
    s1 = ctx.serve_disk(disk)
    a = ctx.start_server(True)
    ctx.complete(a, DOC + question(1))
    doc = cs.ntokens(ctx, a, DOC)
    check(ctx.stats(a).get("snapshots", 0) >= 1, f"A stored nothing:\n{ctx.tail(a)}")
    ctx.stop(a)
    st = settled_writes(ctx, s1)
    print(f"serve before the crash: disk_writes {st.get('disk_writes')} "
          f"disk_bytes {st.get('disk_bytes')} drops {st.get('disk_write_drops')}")
    s1.send_signal(signal.SIGKILL)  # a crash: nothing flushed, the pool is gone
    s1.wait(timeout=30)
    s2 = ctx.serve_disk(disk)
    st = ctx.serve_stats(s2)
    print(f"restarted serve: scan found {st.get('disk_scan_objects')} objects "
          f"in {st.get('disk_scan_ms')} ms")
    check(st.get("disk_scan_objects", 0) >= 1, f"the restarted serve found nothing: {st}")
    got, b = cs.replay(ctx, (), [ask(DOC + question(2))], True)
    check(got == ref, f"B after the restart differs from llama-server without kvshim:\n"
                      f"  without: {ref!r}\n  with:    {got!r}\n{ctx.tail(b)}")
    cs.expect_restored(ctx, b, doc, "B after serve's restart")
    st = ctx.serve_stats(s2)
    print(f"restarted serve: disk_hits {st.get('disk_hits')} disk_bytes_read "
          f"{st.get('disk_bytes_read')} disk_bad {st.get('disk_bad')}")
    check(st.get("disk_hits", 0) >= 1 and st.get("disk_bad", 1) == 0,
          f"the restarted serve did not read A's state from disk: {st}")
    ctx.stop(b)


CASES = {"restart": case_restart}

if __name__ == "__main__":
    sys.exit(harness.main(CASES, harness.parser(__doc__, "--preload", "--cli"), Ctx))
