#!/usr/bin/env python3
"""The disk tier of `kvshim serve` (core/tiers/disk.c, design §18): one case per test.

Each case starts `kvshim serve --disk DIR` processes in its own run directory, stores blobs
through `kvshim put` (or refengine's kvo chunks), kills or stops serve, damages DIR where the
case says, starts serve again and checks what is served, what is counted and what is logged.
The ENOSPC, read-only and O_DIRECT-refused cases mount a small tmpfs / a read-only bind mount / a
loop device with 4096-byte sectors in a private mount namespace (`unshare -m`, which needs root
or user namespaces, and losetup for the last: skipped, exit 77, without).

usage: disk_test.py CASE --cli build/tools/kvshim [--engine refengine --preload libkvshim.so]
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
import harness  # noqa: E402
from harness import Context, Skip, check, read_line, require  # noqa: E402

HDR = 128
ALIGN = 512
MAGIC = 0x4453564B


def payload(n, seed):
    """n bytes that differ per seed (not compressible by accident, cheap to make)."""
    block = bytes((i * 131 + seed * 17 + (i >> 8)) & 0xFF for i in range(4096))
    return (block * (n // 4096 + 1))[:n]


def payload_off(n_aliases=0):
    """Where a version 2 record's payload starts: the head padded to ALIGN (core/tiers/disk_format.h)."""
    return (HDR + 16 * n_aliases + ALIGN - 1) // ALIGN * ALIGN


def record_len(plen, n_aliases=0):
    return (payload_off(n_aliases) + plen + ALIGN - 1) // ALIGN * ALIGN


class Ctx(Context):
    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.engine = args.engine
        self.disk = os.path.join(tmp, "disk")
        self.serves = []

    def serve_disk(self, *extra, pool="64M", disk=None, wrap=(), expect_banner=True):
        """`kvshim serve --disk DIR` (wrap: a command line to run it under, e.g. unshare)."""
        argv = [*wrap, self.kvshim, "serve", "--pool-size", pool, "--disk", disk or self.disk,
                *extra]
        s = self.spawn(argv, self.env(preload=False), text=True)
        if expect_banner:
            s.banner = read_line(s, 30, "kvshim serve")
            require("socket" in s.banner, f"serve banner: {s.banner!r}")
        return s

    def cli(self, *args, expect_rc=None, data=None):
        p = subprocess.run([self.kvshim, *args], input=data, capture_output=True,
                           env=self.env(preload=False), timeout=60)
        if expect_rc is not None:
            require(p.returncode == expect_rc,
                    f"kvshim {' '.join(args)}: exit {p.returncode}, want {expect_rc}: "
                    f"{p.stderr.decode(errors='replace')}")
        return p

    def put(self, name, data):
        self.cli("put", name, "-", data=data, expect_rc=0)

    def get(self, name, expect_rc=0):
        return self.cli("get", name, expect_rc=expect_rc).stdout

    def stats(self):
        out = json.loads(self.cli("stats", "--json", expect_rc=0).stdout)
        require(len(out) == 1, f"one peer expected, stats of {len(out)}")
        return out[0]

    def wait_stat(self, name, at_least, what, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.stats()[name] >= at_least:
                return
            time.sleep(0.05)
        require(False, f"{what}: {name} stayed below {at_least}")

    def kill(self, s):
        """SIGKILL: nothing flushed, nothing cleaned up (a crash)."""
        s.send_signal(signal.SIGKILL)
        s.wait(timeout=10)
        # its socket is stale now; discovery removes it at the next lookup

    def stop(self, s):
        s.send_signal(signal.SIGTERM)
        out, err = s.communicate(timeout=60)
        check(s.returncode == 0, f"serve exit {s.returncode}: {err}")
        return err

    def segments(self, disk=None):
        d = disk or self.disk
        return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".kvseg"))

    def check_dir(self, expect_rc, disk=None):
        p = self.cli("disk", disk or self.disk)
        check(p.returncode == expect_rc,
              f"kvshim disk: exit {p.returncode}, want {expect_rc}: {p.stderr}")
        return dict(l.split(": ") for l in p.stdout.decode().splitlines())


def need_mounts():
    p = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if p.returncode != 0:
        raise Skip("unshare -m is not allowed here (no root, no user namespaces)")


# ---- cases ---------------------------------------------------------------------------------

def case_restart(ctx):
    """Objects survive a SIGKILL of serve: the next serve's scan finds them and serves them."""
    blobs = {"big": payload(3 << 20, 1), "small": payload(4096, 2), "odd": payload(70001, 3)}
    s = ctx.serve_disk()
    check("disk tier on" in s.banner, f"banner does not say the tier is on: {s.banner}")
    for name, data in blobs.items():
        ctx.put(name, data)
    ctx.wait_stat("disk_writes", 3, "write-behind")
    st = ctx.stats()
    check(st["disk_objects"] == 3 and st["disk_bytes"] == sum(record_len(len(v))
                                                              for v in blobs.values()),
          f"objects {st['disk_objects']} bytes {st['disk_bytes']}")
    ctx.kill(s)
    rep = ctx.check_dir(0)
    check(rep["objects"] == "3" and rep["bad"] == "0", f"kvshim disk: {rep}")
    s = ctx.serve_disk()
    st = ctx.stats()
    check(st["disk_scan_objects"] == 3, f"scan found {st['disk_scan_objects']}")
    for name, data in blobs.items():
        check(ctx.get(name) == data, f"{name}: bytes from disk differ")
    st = ctx.stats()
    check(st["disk_hits"] == 3 and st["disk_bytes_read"] == sum(map(len, blobs.values())),
          f"hits {st['disk_hits']} bytes_read {st['disk_bytes_read']}")
    check(st["disk_writes"] == 0, "serve wrote back what it read from disk")
    check(ctx.get("never-stored", expect_rc=1) == b"", "a missing name is a miss")
    check(ctx.stats()["disk_misses"] >= 1, "the miss is not counted")
    ctx.stop(s)


def case_refengine(ctx):
    """refengine's kvo chunks survive a SIGKILL of serve; a new engine restores the prefix from
    disk and its output verifies (identical to computing it)."""
    require(ctx.engine and ctx.preload, "refengine needs --engine and --preload")
    chunks = 1024 // 64
    args = harness.refengine_prefix_args(chunks, 64)
    s = ctx.serve_disk(pool="256M")
    p = subprocess.run([ctx.engine, *args, "--rank", "0"], capture_output=True, text=True,
                       env=ctx.env(preload=True), timeout=120)
    require(p.returncode == 0, f"refengine A: {p.returncode} {p.stderr}")
    ctx.wait_stat("disk_writes", chunks, "write-behind of A's chunks")
    ctx.kill(s)
    s = ctx.serve_disk(pool="256M")
    p = subprocess.run([ctx.engine, *args, "--rank", "1", "--verify"], capture_output=True,
                       text=True, env=ctx.env(preload=True), timeout=120)
    check(p.returncode == 0, f"refengine B: {p.returncode} {p.stderr}")
    lines = [json.loads(l) for l in p.stdout.splitlines()]
    check(lines[-1].get("verify") == "ok", f"B summary: {lines[-1]}")
    check(lines[0]["loaded"] == chunks, f"B loaded {lines[0]['loaded']} of {chunks} chunks")
    check(ctx.stats()["disk_hits"] >= chunks, "B's prefix did not come from disk")
    ctx.stop(s)


def case_torn(ctx):
    """A write cut short (SIGKILL during the write-behind of a large object) is never served:
    the scan drops it, counts it and cuts the segment back; the objects before it are served."""
    first, big = payload(100000, 4), payload(24 << 20, 5)
    s = ctx.serve_disk("--disk-sync", "none")
    ctx.put("first", first)
    ctx.wait_stat("disk_writes", 1, "first write")
    ctx.put("big", big)
    ctx.kill(s)  # most often mid-write; the tail is torn by hand below when it was not
    seg = ctx.segments()[-1]
    good = record_len(len(first))
    size = os.path.getsize(seg)
    if size > good + (4 << 20):  # the big record was written whole: tear it as a crash would
        os.truncate(seg, good + (4 << 20) + 100)
    elif size == good:  # killed before any byte of it: write a torn head (half a record)
        with open(seg, "r+b") as f:
            f.seek(good)
            f.write(b"KVSD" + b"\x01" * 1000)
    rep = ctx.check_dir(1)
    check(rep["objects"] == "1" and int(rep["bad"]) >= 1, f"kvshim disk before restart: {rep}")
    s = ctx.serve_disk()
    st = ctx.stats()
    check(st["disk_scan_objects"] == 1 and st["disk_bad"] == 1,
          f"scan: objects {st['disk_scan_objects']} bad {st['disk_bad']}")
    check(os.path.getsize(seg) == good, f"torn tail not cut: {os.path.getsize(seg)} != {good}")
    check(ctx.get("first") == first, "the record before the torn one is not served")
    check(ctx.get("big", expect_rc=1) == b"", "the torn object was served")
    ctx.stop(s)
    check(ctx.check_dir(0)["bad"] == "0", "kvshim disk still finds bad records")


def case_flip(ctx):
    """Flipped bytes: in a payload, the record fails its hash when read (a miss, dropped,
    counted, logged); in a header, the scan drops it and resynchronises on the next record."""
    a, b, c = payload(50000, 6), payload(60000, 7), payload(70000, 8)
    s = ctx.serve_disk()
    for name, data in (("a", a), ("b", b), ("c", c)):
        ctx.put(name, data)
    ctx.wait_stat("disk_writes", 3, "write-behind")
    ctx.stop(s)
    seg = ctx.segments()[0]
    off_b = record_len(len(a))
    off_c = off_b + record_len(len(b))
    with open(seg, "r+b") as f:
        f.seek(off_b + payload_off() + 1234)  # b's payload
        x = f.read(1)
        f.seek(off_b + payload_off() + 1234)
        f.write(bytes([x[0] ^ 0x40]))
        f.seek(off_c + 30)  # c's header (payload length)
        x = f.read(1)
        f.seek(off_c + 30)
        f.write(bytes([x[0] ^ 0x01]))
    rep = ctx.check_dir(1)
    check(rep["objects"] == "1" and rep["bad"] == "2", f"kvshim disk: {rep}")
    s = ctx.serve_disk()
    st = ctx.stats()
    check(st["disk_scan_objects"] == 2 and st["disk_bad"] == 1,
          f"scan: objects {st['disk_scan_objects']} bad {st['disk_bad']}")
    check(ctx.get("a") == a, "a: not served")
    check(ctx.get("b", expect_rc=1) == b"", "b (flipped payload) was served")
    check(ctx.get("c", expect_rc=1) == b"", "c (flipped header) was served")
    st = ctx.stats()
    check(st["disk_bad"] == 2 and st["disk_objects"] == 1,
          f"after reads: bad {st['disk_bad']} objects {st['disk_objects']}")
    err = ctx.stop(s)
    check("failed its check: dropped, not served" in err, f"no log line for b: {err}")
    s = ctx.serve_disk()  # b's record was zeroed: the next scan does not find it again
    check(ctx.stats()["disk_scan_objects"] == 1, "the dropped record came back at a scan")
    ctx.stop(s)


def case_enospc(ctx):
    """A full file system (a 4 MiB tmpfs): one clear line, counted, writes paused; every object
    is still served from memory, and what reached the disk from there."""
    need_mounts()
    mnt = ctx.disk
    os.makedirs(mnt, exist_ok=True)
    blobs = [payload(1500 * 1024, 10 + i) for i in range(4)]
    sh = f'mount -t tmpfs -o size=4m tmpfs "{mnt}" && exec "$@"'
    s = ctx.serve_disk(wrap=("unshare", "-m", "sh", "-c", sh, "sh"))
    for i, data in enumerate(blobs):
        ctx.put(f"b{i}", data)
    ctx.wait_stat("disk_write_errors", 1, "ENOSPC")
    for i, data in enumerate(blobs):
        check(ctx.get(f"b{i}") == data, f"b{i} not served after ENOSPC")
    st = ctx.stats()
    check(st["disk_writes"] == 2 and st["disk_write_drops"] >= 1,
          f"writes {st['disk_writes']} drops {st['disk_write_drops']}")
    err = ctx.stop(s)
    check(err.count("the file system is full") == 1, f"want one ENOSPC line: {err}")


def case_readonly(ctx):
    """A read-only DIR: serve says so, serves what is on it, writes nothing, keeps serving new
    objects from memory."""
    need_mounts()
    old = payload(200000, 20)
    s = ctx.serve_disk()
    ctx.put("old", old)
    ctx.wait_stat("disk_writes", 1, "write-behind")
    ctx.stop(s)
    d = ctx.disk
    sh = f'mount --bind "{d}" "{d}" && mount -o remount,bind,ro "{d}" && exec "$@"'
    s = ctx.serve_disk(wrap=("unshare", "-m", "sh", "-c", sh, "sh"))
    check(ctx.get("old") == old, "the object on the read-only DIR is not served")
    new = payload(100000, 21)
    ctx.put("new", new)
    check(ctx.get("new") == new, "a new object is not served from memory")
    st = ctx.stats()
    check(st["disk_writes"] == 0 and st["disk_write_errors"] == 1 and st["disk_hits"] == 1,
          f"writes {st['disk_writes']} errors {st['disk_write_errors']} hits {st['disk_hits']}")
    err = ctx.stop(s)
    check("is read-only: serving the 1 objects on it, writing nothing" in err,
          f"no read-only line: {err}")


def case_direct_refused(ctx):
    """A file system on 4096-byte sectors (a loop device) refuses O_DIRECT at 512 bytes: one
    line, and every object, large ones included, is written and read buffered instead, byte for
    byte across a restart; nothing is lost or counted bad."""
    need_mounts()
    for tool in ("losetup", "mkfs.ext4"):
        if not shutil.which(tool):
            raise Skip(f"{tool} is not installed")
    img = os.path.join(ctx.tmp, "img")
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    p = subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", img], capture_output=True)
    require(p.returncode == 0, f"mkfs.ext4: {p.stderr!r}")
    p = subprocess.run(["losetup", "--find", "--show", "--sector-size", "4096", img],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise Skip(f"no loop device with 4096-byte sectors here: {p.stderr.strip()}")
    dev = p.stdout.strip()
    try:
        mnt = ctx.disk
        os.makedirs(mnt, exist_ok=True)
        sh = f'mount "{dev}" "{mnt}" && mkdir -p "{mnt}/tier" && exec "$@"'
        wrap = ("unshare", "-m", "sh", "-c", sh, "sh")
        tier = os.path.join(mnt, "tier")
        blobs = {"big": payload(3 << 20, 70), "odd": payload((1 << 20) + 1, 71),
                 "small": payload(5000, 72)}
        s = ctx.serve_disk(disk=tier, wrap=wrap)
        for name, data in blobs.items():
            ctx.put(name, data)
        ctx.wait_stat("disk_writes", 3, "write-behind")
        st = ctx.stats()
        check(st["disk_writes_direct"] == 0 and st["disk_write_errors"] == 0
              and st["disk_write_drops"] == 0,
              f"direct {st['disk_writes_direct']} errors {st['disk_write_errors']} "
              f"drops {st['disk_write_drops']}")
        err = ctx.stop(s)
        s = ctx.serve_disk(disk=tier, wrap=wrap)
        check(ctx.stats()["disk_scan_objects"] == 3, "the scan did not find the 3 objects")
        for name, data in blobs.items():
            check(ctx.get(name) == data, f"{name} not served byte for byte")
        st = ctx.stats()
        check(st["disk_hits"] == 3 and st["disk_bad"] == 0 and st["disk_reads_direct"] == 0,
              f"hits {st['disk_hits']} bad {st['disk_bad']} direct {st['disk_reads_direct']}")
        err += ctx.stop(s)
        line = "refuses O_DIRECT at 512-byte alignment: buffered I/O from now on"
        check(err.count(line) == 2, f"want the line once per serve: {err}")
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)


def case_missing_dir(ctx):
    """A DIR that cannot be made: one line, counted, serve runs from memory."""
    s = ctx.serve_disk(disk=os.path.join(ctx.tmp, "no", "such", "dir"))
    check("disk tier on" not in s.banner, f"banner says the tier is on: {s.banner}")
    data = payload(30000, 30)
    ctx.put("x", data)
    check(ctx.get("x") == data, "not served from memory")
    check(ctx.stats()["disk_write_errors"] == 1, "not counted")
    err = ctx.stop(s)
    check("kvshim serve: disk tier off: cannot create" in err, f"no clear line: {err}")


def case_size(ctx):
    """--disk-size: the oldest segments are deleted to stay under it; a restart serves the
    newest objects and misses the deleted ones."""
    blobs = [payload(600 * 1024, 40 + i) for i in range(12)]
    s = ctx.serve_disk("--disk-size", "4M")
    for i, data in enumerate(blobs):
        ctx.put(f"b{i}", data)
    ctx.wait_stat("disk_writes", len(blobs), "write-behind")
    st = ctx.stats()
    check(st["disk_bytes"] <= 4 << 20 and st["disk_evictions"] > 0,
          f"bytes {st['disk_bytes']} evictions {st['disk_evictions']}")
    ctx.kill(s)
    total = sum(os.path.getsize(f) for f in ctx.segments())
    check(total <= 4 << 20, f"DIR holds {total} bytes, over 4M")
    s = ctx.serve_disk("--disk-size", "4M")
    check(ctx.get("b11") == blobs[11], "the newest object is not served")
    check(ctx.get("b0", expect_rc=1) == b"", "the oldest object was not deleted")
    ctx.stop(s)


def case_two_serves(ctx):
    """A second serve on one DIR is refused with a clear error; the first goes on."""
    s = ctx.serve_disk()
    t = ctx.serve_disk(expect_banner=False)
    out, err = t.communicate(timeout=30)
    check(t.returncode == 1, f"second serve exit {t.returncode}")
    check(f"is in use by another kvshim serve (pid {s.pid}" in err, f"error line: {err}")
    data = payload(10000, 50)
    ctx.put("x", data)
    check(ctx.get("x") == data, "the first serve stopped serving")
    ctx.stop(s)
    s = ctx.serve_disk()  # the lock died with its holder
    ctx.stop(s)


def case_small_pool(ctx):
    """A disk object larger than the pool: a miss (counted), never a failure; serve goes on."""
    big, small = payload(3 << 20, 60), payload(8192, 61)
    s = ctx.serve_disk()
    ctx.put("big", big)
    ctx.put("small", small)
    ctx.wait_stat("disk_writes", 2, "write-behind")
    ctx.stop(s)
    s = ctx.serve_disk(pool="1M")
    check(ctx.get("big", expect_rc=1) == b"", "an object larger than the pool was served")
    check(ctx.get("small") == small, "the small object is not served")
    st = ctx.stats()
    check(st["disk_misses"] >= 1 and st["disk_hits"] == 1,
          f"misses {st['disk_misses']} hits {st['disk_hits']}")
    ctx.stop(s)
    check(ctx.check_dir(0)["objects"] == "2", "the big object left the disk")


if __name__ == "__main__":
    ap = harness.parser(__doc__, "--cli", asan=True, optional=("--engine", "--preload"))
    sys.exit(harness.main(harness.cases(globals()), ap, Ctx))
