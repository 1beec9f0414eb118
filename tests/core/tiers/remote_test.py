#!/usr/bin/env python3
"""ctest driver for the remote tier (core/tiers/remote.c, design §17): `kvshim serve --remote` on a
real redis-server (or a 6-node Redis Cluster) started on free loopback ports by servers.py.

usage: remote_test.py CASE --cli KVSHIM [--engine REFENGINE --preload LIBKVSHIM]
                      [--asan-runtime LIBASAN]
       remote_test.py --list

A "node" is one `kvshim serve` with its own KVSHIM_RUN_DIR (same group name on every node), so
two nodes on this machine share nothing but the Redis server. Every case starts its own servers
and stops them. LD_PRELOAD is set only in the engine processes' environment.

Cases:
  roundtrip   `kvshim put` on node A is written behind (one value, header checked by hand),
              A's serve stops, `kvshim get` on node B returns the same bytes; B restarted comes
              back warm from Redis; stats and `kvshim stats --prometheus` count it
  ttl         KVSHIM_REMOTE_TTL is the value's PTTL; once it expired, B misses
  nx          a second writer of the same key does not replace the first value (SET NX)
  corrupt     SETRANGE inside a value's payload: B misses, the value is deleted, counted
  evict       maxmemory with allkeys-lru: evicted values are misses, every hit is exact
  pause       CLIENT PAUSE 3000: B's lookups (kvshim get, then refengine) return within
              KVSHIM_RPC_TIMEOUT_MS as misses; the engine computes everything, correctly
  breaker     Redis stopped under a running serve: misses at once, the breaker opens, serve
              stays up; Redis back: serve reconnects and writes behind again
  badinput    bad URL, wrong password, a server that is not Redis: one clear error line
              without the password; serve keeps serving its node; `kvshim remote` exit codes
  interop     a client of the first protocol v1 (LOOKUP offset 4 = 0) gets pool-only answers
              from a serve with a remote tier; CAP_REMOTE is offered only with a tier
  cluster     a 6-node cluster (3 masters + 3 replicas): `kvshim remote` sees it whole; blobs
              across slots round-trip from node A to node B
  failover    the cluster: MOVED after a reshard is followed; a master SIGKILLed while node B
              reads: misses counted, every byte returned correct, serve keeps running
  kvo         refengine (kvo) on node A computes a 4k-token prefix and exits with A's serve;
              refengine on node B loads every prefix chunk from Redis, --verify passes
"""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import servers  # noqa: E402  (h5's real Redis servers on free ports; puts tests/lib on sys.path)
from harness import Context, Failure, check  # noqa: E402
import harness  # noqa: E402


HDR = 128           # value header bytes (core/tiers/remote.h)
MAGIC = 0x5253564B  # "KVSR"


class Node:
    """One node: a run directory and (while running) its `kvshim serve`."""

    def __init__(self, ctx, name):
        self.ctx = ctx
        self.name = name
        self.run_dir = os.path.join(ctx.tmp, name)
        self.serve = None
        self.banner = ""

    def env(self, preload=False, **extra):
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("KVSHIM_") or k == "LD_PRELOAD":
                del env[k]
        env["KVSHIM_RUN_DIR"] = self.run_dir
        env["KVSHIM_GROUP"] = "nodes"
        env["KVSHIM_HOST_POOL_SIZE"] = "64M"
        if preload:
            env["LD_PRELOAD"] = ":".join(filter(None, [self.ctx.asan_runtime, self.ctx.preload]))
        for k, v in extra.items():
            env[k] = str(v)
        return env

    def start(self, remote=None, pool="64M", expect_up=True, **extra):
        argv = [self.ctx.cli, "serve", "--pool-size", pool]
        if remote is not None:
            argv += ["--remote", remote]
        self.serve = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=self.env(**extra))
        self.ctx.procs.append(self.serve)
        self.banner = harness.read_line(self.serve, 30, f"serve {self.name}").rstrip("\n")
        if expect_up:
            check("socket" in self.banner, f"serve {self.name} banner: {self.banner!r}")
        return self.serve

    def stop(self):
        """SIGTERM; returns serve's stderr. Serve must exit 0 (the tier never makes it fail)."""
        self.serve.send_signal(signal.SIGTERM)
        try:
            _, err = self.serve.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.serve.kill()
            raise Failure(f"serve {self.name} did not stop within 30 s")
        check(self.serve.returncode == 0,
              f"serve {self.name} exit {self.serve.returncode}: {err.decode(errors='replace')}")
        self.serve = None
        return err.decode(errors="replace")

    def cli(self, *args, expect_rc=None, timeout=60, stdin=None, **extra):
        p = subprocess.run([self.ctx.cli, *args], capture_output=True, env=self.env(**extra),
                           timeout=timeout, input=stdin)
        if expect_rc is not None and p.returncode != expect_rc:
            raise Failure(f"kvshim {' '.join(args)} on {self.name}: exit {p.returncode}, "
                          f"expected {expect_rc}\nstdout: {p.stdout[:400]!r}\n"
                          f"stderr: {p.stderr.decode(errors='replace')}")
        return p

    def stats(self):
        p = self.cli("stats", "--json", expect_rc=0)
        arr = json.loads(p.stdout)
        check(len(arr) == 1, f"node {self.name}: expected one peer, got {len(arr)}")
        return arr[0]

    def put(self, name, data):
        self.cli("put", name, "-", stdin=data, expect_rc=0)

    def get(self, name, expect_rc=0, **extra):
        return self.cli("get", name, expect_rc=expect_rc, **extra).stdout


class Ctx(Context):
    """The case: its nodes' run directories live in tmp; options --cli, --engine, --preload,
    --asan-runtime."""

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.cli = args.cli
        self.engine = args.engine

    def node(self, name):
        return Node(self, name)


def wait_for(cond, what, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise Failure(f"timed out waiting for {what}")


def written_behind(a, url, blobs):
    """Node A, started with the Redis at url as its tier, puts blobs {name: bytes}, and stops
    once every one is written behind."""
    a.start(url)
    for name, data in blobs.items():
        a.put(name, data)
    wait_for(lambda: a.stats()["remote_writes"] == len(blobs), "A's writes to the cluster")
    a.stop()


def read_all(b, blobs, when, **env):
    """`kvshim get` of every blob on node B: each one is a hit with the right bytes or a clean
    miss (exit 1, nothing written). Returns (hits, misses)."""
    hits = misses = 0
    for name, data in blobs.items():
        p = b.cli("get", name, **env)
        if p.returncode == 0:
            check(p.stdout == data, f"{name}: wrong bytes {when}")
            hits += 1
        else:
            check(p.returncode == 1 and p.stdout == b"", f"{name}: exit {p.returncode}")
            misses += 1
    return hits, misses


def payload(n, seed):
    out = bytearray()
    x = seed & 0xFFFFFFFF or 1
    while len(out) < n:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out += struct.pack("<I", x)
    return bytes(out[:n])


def redis_keys(r):
    out = r.cli("--scan", "--pattern", "kvshim:v1:*")
    return [k for k in out.split() if k]


def raw_value(r, key):
    """The value bytes under key, through redis-cli --no-raw escaping avoided: use DUMP-free
    GETRANGE in hex with a Lua helper."""
    hexs = r.cli("EVAL", "local v = redis.call('GET', KEYS[1]); if not v then return '' end; "
                 "return (v:gsub('.', function(c) return string.format('%02x', c:byte()) end))",
                 "1", key)
    return bytes.fromhex(hexs)


# ---- cases ------------------------------------------------------------------------------------

def case_roundtrip(ctx):
    with servers.Standalone() as r:
        a, b = ctx.node("a"), ctx.node("b")
        a.start(r.url)
        check("remote tier on" in a.banner, f"banner does not say the tier is on: {a.banner}")
        data = payload(300 * 1024 + 7, 1)
        a.put("blob-1", data)
        wait_for(lambda: len(redis_keys(r)) == 1, "one value in Redis")
        key = redis_keys(r)[0]
        check(key.startswith("kvshim:v1:") and len(key) == 10 + 32, f"key name {key!r}")
        v = raw_value(r, key)
        magic, version, kind = struct.unpack_from("<IHH", v, 0)
        plen, = struct.unpack_from("<Q", v, 24)
        check(magic == MAGIC and version == 1 and kind == 0, f"header {v[:8].hex()}")
        check(plen == len(data) and v[HDR:] == data, f"payload of {plen} bytes differs")
        check(int(r.cli("PTTL", key)) > 0, "value written without an expiry")
        sa = a.stats()
        check(sa["remote_writes"] == 1 and sa["remote_bytes_out"] == len(v),
              f"A stats: writes {sa['remote_writes']} bytes_out {sa['remote_bytes_out']}")
        prom = a.cli("stats", "--prometheus", expect_rc=0).stdout.decode()
        check("# TYPE kvshim_remote_writes_total counter" in prom and
              "kvshim_remote_writes_total{instance=" in prom and "} 1\n" in prom,
              f"prometheus text:\n{prom[:2000]}")
        a.stop()
        b.start(r.url)
        check(b.get("blob-1") == data, "B: bytes from Redis differ from what A stored")
        sb = b.stats()
        # bytes in: the value, and the header probe read before it (GETRANGE 0 143)
        check(sb["remote_hits"] == 1 and len(v) <= sb["remote_bytes_in"] <= len(v) + 144,
              f"B stats: hits {sb['remote_hits']} bytes_in {sb['remote_bytes_in']}")
        check(sb["remote_writes"] == 0, "B wrote back what it fetched")
        check(b.get("no-such-blob", expect_rc=1) == b"", "a missing name is a miss")
        # restart: the pool is empty, Redis still has it: warm again.
        b.stop()
        b.start(r.url)
        check(b.get("blob-1") == data, "B restarted: bytes differ")
        check(b.stats()["remote_hits"] == 1, "B restarted: not served from Redis")
        b.stop()


def case_ttl(ctx):
    with servers.Standalone() as r:
        a, b = ctx.node("a"), ctx.node("b")
        a.start(r.url, KVSHIM_REMOTE_TTL=1500)
        a.put("short", payload(5000, 2))
        wait_for(lambda: redis_keys(r), "the value in Redis")
        ttl = int(r.cli("PTTL", redis_keys(r)[0]))
        check(0 < ttl <= 1500, f"PTTL {ttl}, KVSHIM_REMOTE_TTL 1500")
        a.stop()
        wait_for(lambda: not redis_keys(r), "the value to expire", timeout=10)
        b.start(r.url)
        b.get("short", expect_rc=1)
        check(b.stats()["remote_misses"] >= 1, "the expired value was not counted as a miss")
        b.stop()


def case_nx(ctx):
    with servers.Standalone() as r:
        a, c, b = ctx.node("a"), ctx.node("c"), ctx.node("b")
        first, second = payload(8192, 3), payload(8192, 4)
        a.start(r.url)
        a.put("same", first)
        wait_for(lambda: a.stats()["remote_writes"] == 1, "A's write")
        a.stop()
        c.start(r.url)
        c.put("same", second)  # c's own pool does not have it: it writes behind too
        wait_for(lambda: c.stats()["remote_write_present"] == 1, "C's NX refusal")
        check(c.stats()["remote_writes"] == 0, "C overwrote A's value")
        c.stop()
        b.start(r.url)
        check(b.get("same") == first, "B got the second writer's bytes: NX not honoured")
        b.stop()


def case_corrupt(ctx):
    with servers.Standalone() as r:
        a, b = ctx.node("a"), ctx.node("b")
        data = payload(64 * 1024, 5)
        a.start(r.url)
        a.put("victim", data)
        wait_for(lambda: redis_keys(r), "the value in Redis")
        a.stop()
        key = redis_keys(r)[0]
        r.cli("SETRANGE", key, str(HDR + 1000), "X")
        b.start(r.url)
        out = b.get("victim", expect_rc=1)
        check(out == b"", "a corrupted value reached the client")
        sb = b.stats()
        check(sb["remote_bad_values"] == 1, f"bad value not counted: {sb['remote_bad_values']}")
        check(sb["remote_hits"] == 0, "a corrupted value counted as a hit")
        check(r.cli("EXISTS", key) == "0", "the corrupted value was not deleted")
        # A header that lies about its key is refused the same way.
        b.stop()
        a.start(r.url)
        a.put("victim", data)
        wait_for(lambda: redis_keys(r), "the value again")
        a.stop()
        r.cli("SETRANGE", key, "8", "\x01")  # key.lo's first byte
        b.start(r.url)
        b.get("victim", expect_rc=1)
        check(b.stats()["remote_bad_values"] == 1, "a value naming another key was accepted")
        b.stop()


def case_evict(ctx):
    with servers.Standalone() as r:
        r.cli("CONFIG", "SET", "maxmemory", str(3 << 20))
        r.cli("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
        a, b = ctx.node("a"), ctx.node("b")
        a.start(r.url)
        blobs = {f"e{i}": payload(512 * 1024, 100 + i) for i in range(12)}
        for name, data in blobs.items():
            a.put(name, data)
        wait_for(lambda: a.stats()["remote_writes"] + a.stats()["remote_errors"] >= 12,
                 "A's writes")
        a.stop()
        evicted = int(r.cli("INFO", "stats").split("evicted_keys:")[1].split()[0])
        check(evicted > 0, "maxmemory did not evict anything: the case proves nothing")
        b.start(r.url)
        hits, misses = read_all(b, blobs, "after evictions")
        check(misses > 0 and hits > 0, f"hits {hits} misses {misses}: expected some of each")
        sb = b.stats()
        check(sb["remote_misses"] >= misses and sb["remote_bad_values"] == 0,
              f"B stats: misses {sb['remote_misses']} bad {sb['remote_bad_values']}")
        b.stop()


def case_pause(ctx):
    with servers.Standalone() as r:
        a, b = ctx.node("a"), ctx.node("b")
        a.start(r.url)
        data = payload(100000, 6)
        a.put("paused", data)
        wait_for(lambda: redis_keys(r), "the value in Redis")
        a.stop()
        b.start(r.url, KVSHIM_REMOTE_TIMEOUT_MS=5000)
        r.pause(3000)
        rpc_ms = 800
        t0 = time.monotonic()
        p = b.cli("get", "paused", KVSHIM_RPC_TIMEOUT_MS=rpc_ms)
        took = (time.monotonic() - t0) * 1000
        check(p.returncode == 1 and p.stdout == b"", f"paused server: exit {p.returncode}")
        # The deadline is the RPC timeout; allow process start-up and exit around it.
        check(took < rpc_ms + 700, f"lookup took {took:.0f} ms with KVSHIM_RPC_TIMEOUT_MS {rpc_ms}")
        check(b.stats()["remote_timeouts"] >= 1, "the late lookup was not counted")
        # Once the pause is over the same lookup is a hit (the fetch went on behind it).
        wait_for(lambda: b.cli("get", "paused").stdout == data, "a hit after the pause", 10)
        # While a LOOKUP waits for the paused Redis, serve's coordinator serves everyone else:
        # it never blocks on the network.
        sock = b.banner.split("socket ")[1].split(",")[0].strip()
        absent = struct.pack("<QQ", 12345, 67890)
        r.pause(3000)
        res = {}

        def waiting_lookup():
            t = time.monotonic()
            res["found"] = hello_lookup(sock, [absent], 2000)[1]
            res["ms"] = (time.monotonic() - t) * 1000
        th = threading.Thread(target=waiting_lookup)
        th.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        b.stats()
        stats_ms = (time.monotonic() - t0) * 1000
        th.join(10)
        check(stats_ms < 1500, f"kvshim stats took {stats_ms:.0f} ms while a lookup waited")
        check(res.get("found") == 0 and 1500 < res.get("ms", 0) < 2900,
              f"deferred lookup during the pause: {res} (remote_wait_ms 2000)")
        wait_for(lambda: b.cli("get", "paused").stdout == data, "a hit after the pause", 10)
        if ctx.engine and ctx.preload:
            # An engine's lookups during a pause: each returns within the RPC deadline as a
            # miss, the engine computes everything itself, correctly.
            r.pause(3000)
            p = subprocess.run([ctx.engine, "--requests", "1", "--prompt-tokens", "512",
                                "--prefix-tokens", "256", "--chunk-tokens", "64", "--layers", "2",
                                "--kv-heads", "2", "--head-dim", "16", "--hidden", "32",
                                "--kvo-buffer", "host", "--verify"], capture_output=True,
                               text=True, env=b.env(preload=True, KVSHIM_RPC_TIMEOUT_MS=rpc_ms),
                               timeout=60)
            check(p.returncode == 0, f"refengine during the pause: {p.returncode} {p.stderr}")
            first = json.loads(p.stdout.splitlines()[0])
            check(first["loaded"] == 0 and first["computed"] == first["chunks"],
                  f"refengine during the pause: {first}")
        b.stop()


def case_breaker(ctx):
    """Redis stops under a running serve: lookups miss at once, failures open the breaker;
    Redis comes back: serve reconnects by itself and writes behind again."""
    with servers.Standalone() as r:
        b = ctx.node("b")
        b.start(r.url, KVSHIM_REMOTE_TIMEOUT_MS=300)
        b.put("before", payload(5000, 9))
        wait_for(lambda: b.stats()["remote_writes"] == 1, "the first write")
        r.server.stop()
        for i in range(8):
            t0 = time.monotonic()
            p = b.cli("get", f"absent-{i}", KVSHIM_RPC_TIMEOUT_MS=1000)
            took = time.monotonic() - t0
            check(p.returncode == 1 and took < 1.7, f"get {i} with Redis down: exit "
                  f"{p.returncode} in {took:.2f} s")
        st = b.stats()
        check(st["remote_breaker_opens"] >= 1, f"the breaker never opened: {st}")
        check(st["remote_errors"] + st["remote_timeouts"] >= 3, f"failures not counted: {st}")
        check(b.serve.poll() is None, "serve exited with Redis down")
        b.put("during", payload(5000, 10))  # dropped or failed: counted, never fatal
        r.server.start()
        data = payload(7000, 11)

        def written():
            b.put(f"after-{time.monotonic_ns()}", data)
            return b.stats()["remote_writes"] >= 2
        wait_for(written, "a write once Redis is back (reconnect after the back-off)", 40)
        b.stop()


def case_badinput(ctx):
    a = ctx.node("a")
    data = payload(10000, 7)

    def node_still_serves(what):
        a.put("local", data)
        check(a.get("local") == data, f"{what}: the node tier does not serve any more")

    # A URL that does not parse: one line, serve goes on without the tier.
    a.start("http://nowhere:1", expect_up=True)
    node_still_serves("bad URL")
    err = a.stop()
    lines = [l for l in err.splitlines() if "remote" in l]
    check(len(lines) == 1 and "remote tier off" in lines[0], f"bad URL stderr: {err!r}")
    p = a.cli("remote", "--remote", "redis//x")
    check(p.returncode == 2 and len(p.stderr.decode().strip().splitlines()) == 1,
          f"kvshim remote, bad URL: exit {p.returncode} {p.stderr!r}")
    p = a.cli("remote")
    check(p.returncode == 2, f"kvshim remote without a URL: exit {p.returncode}")

    with servers.Standalone(password="s3cr3t-pw") as r:
        pwfile = os.path.join(ctx.tmp, "pw")
        with open(pwfile, "w") as f:
            f.write("wrong-pw-XYZ\n")
        os.chmod(pwfile, 0o600)
        url = f"redis://127.0.0.1:{r.port}"
        a.start(url, KVSHIM_REMOTE_PASSWORD_FILE=pwfile)
        node_still_serves("wrong password")
        err = a.stop()
        check("wrong-pw-XYZ" not in err and "s3cr3t" not in err, "the password was printed")
        check(any("remote tier" in l for l in err.splitlines()), f"no error line: {err!r}")
        p = a.cli("remote", "--remote", url, "--remote-password-file", pwfile)
        out = (p.stdout + p.stderr).decode()
        check(p.returncode == 1 and "wrong-pw-XYZ" not in out and len(out.strip().splitlines()) == 1,
              f"kvshim remote, wrong password: exit {p.returncode} {out!r}")
        # The password in the URL is never printed either.
        p = a.cli("remote", "--remote", f"redis://:bad-in-url@127.0.0.1:{r.port}")
        out = (p.stdout + p.stderr).decode()
        check(p.returncode == 1 and "bad-in-url" not in out, f"URL password: {out!r}")
        with open(pwfile, "w") as f:
            f.write("s3cr3t-pw\n")
        p = a.cli("remote", "--remote", url, "--remote-password-file", pwfile)
        out = p.stdout.decode()
        check(p.returncode == 0 and "mode: standalone" in out and "slots: 16384/16384" in out
              and "s3cr3t" not in out, f"kvshim remote, right password: {p.returncode} {out!r}")

    # Not Redis: a TCP server that answers garbage.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    stop = threading.Event()

    def junk():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            try:
                c.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
                time.sleep(0.05)
            except OSError:
                pass
            c.close()

    t = threading.Thread(target=junk, daemon=True)
    t.start()
    try:
        p = a.cli("remote", "--remote", f"redis://127.0.0.1:{port}", "--remote-timeout-ms", "500")
        check(p.returncode == 1 and len(p.stderr.decode().strip().splitlines()) == 1,
              f"kvshim remote, not Redis: exit {p.returncode} {p.stderr!r}")
        a.start(f"redis://127.0.0.1:{port}", KVSHIM_REMOTE_TIMEOUT_MS=500)
        node_still_serves("not Redis")
        a.stop()
    finally:
        stop.set()
        t.join()
        srv.close()
    # Nobody listening: exit 3 (unreachable).
    p = a.cli("remote", "--remote", f"redis://127.0.0.1:{port}", "--remote-timeout-ms", "500")
    check(p.returncode == 3, f"kvshim remote, nobody listening: exit {p.returncode} {p.stderr!r}")


def hello_lookup(sock_path, keys, remote_wait_ms):
    """A raw protocol v1 client: HELLO, then one LOOKUP (docs/protocol.md 4.1, 4.3)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(sock_path)

    def frame(op, rid, body):
        return struct.pack("<IHHIQI", 0x4D53564B, 1, op, 0, rid, len(body)) + body

    def recv_msg():
        hdr = b""
        while len(hdr) < 24:
            hdr += s.recv(24 - len(hdr))
        magic, ver, op, flags, rid, n = struct.unpack("<IHHIQI", hdr)
        body = b""
        while len(body) < n:
            body += s.recv(n - len(body))
        return op, body

    group = b"nodes"
    hello = struct.pack("<HHBBBBIIQQQQIHH", 1, 1, 3, 2, 0, 0, os.getpid(), 2, 0, 0, 0, 0,
                        1 << 16, len(group), 0) + group
    s.sendall(frame(1, 1, hello))
    op, body = recv_msg()
    check(op == 1, f"HELLO answered with opcode {op}")
    caps, = struct.unpack_from("<I", body, 12)
    req = struct.pack("<II", len(keys), remote_wait_ms) + b"".join(keys)
    s.sendall(frame(2, 2, req))
    op, body = recv_msg()
    s.close()
    check(op == 2, f"LOOKUP answered with opcode {op}: {body!r}")
    return caps, struct.unpack_from("<I", body, 0)[0]


def case_interop(ctx):
    with servers.Standalone() as r:
        a, b = ctx.node("a"), ctx.node("b")
        a.start(r.url)
        a.put("old", payload(4096, 8))
        wait_for(lambda: redis_keys(r), "the value in Redis")
        a.stop()
        hexkey = redis_keys(r)[0][len("kvshim:v1:"):]
        hi, lo = int(hexkey[:16], 16), int(hexkey[16:], 16)
        key = struct.pack("<QQ", lo, hi)
        b.start(r.url)
        sock = b.banner.split("socket ")[1].split(",")[0].strip()
        caps, found = hello_lookup(sock, [key], 0)
        check(caps & 0x20, f"a serve with a remote tier does not offer CAP_REMOTE: caps {caps}")
        check(found == 0, "a v1 LOOKUP (offset 4 = 0) consulted the remote tier")
        caps, found = hello_lookup(sock, [key], 1500)
        check(found == 1, "LOOKUP with remote_wait_ms did not bring the key from Redis")
        caps, found = hello_lookup(sock, [key], 0)
        check(found == 1, "the fetched key is not in the pool for a v1 client")
        b.stop()
        c = ctx.node("c")
        c.start()
        sock = c.banner.split("socket ")[1].split(",")[0].strip()
        caps, found = hello_lookup(sock, [key], 0)
        check(not caps & 0x20 and found == 0, f"serve without a tier: caps {caps} found {found}")
        c.stop()


def case_cluster(ctx):
    with servers.Cluster(masters=3, replicas=1) as cl:
        a, b = ctx.node("a"), ctx.node("b")
        p = a.cli("remote", "--remote", cl.url, expect_rc=0)
        out = p.stdout.decode()
        check("mode: cluster" in out and "nodes: 3" in out and "slots: 16384/16384" in out,
              f"kvshim remote on the cluster: {out!r}")
        blobs = {f"c{i}": payload(40000 + i, 200 + i) for i in range(24)}
        written_behind(a, cl.url, blobs)
        per_master = {}
        for port in cl.masters():
            per_master[port] = int(cl.cli(port, "DBSIZE"))
        check(sum(1 for n in per_master.values() if n > 0) >= 2,
              f"keys did not spread over the masters: {per_master}")
        b.start(cl.url)
        for name, data in blobs.items():
            check(b.get(name) == data, f"{name}: bytes from the cluster differ")
        check(b.stats()["remote_hits"] == len(blobs), "B: not every blob came from the cluster")
        b.stop()


def case_failover(ctx):
    """MOVED after a reshard is followed; a master SIGKILLed while node B reads: failover,
    misses counted, every byte returned correct, serve never exits."""
    with servers.Cluster(masters=3, replicas=1, node_timeout_ms=1000) as cl:
        a, b = ctx.node("a"), ctx.node("b")
        blobs = {f"f{i}": payload(30000 + i, 300 + i) for i in range(30)}
        written_behind(a, cl.url, blobs)
        names = {}
        port0 = cl.ports[0]
        for key in cl.cli(port0, "--scan", "--pattern", "kvshim:v1:*").split():
            names[key] = cl.keyslot(key)
        for port in cl.masters():
            for key in cl.cli(port, "--scan", "--pattern", "kvshim:v1:*").split():
                names[key] = cl.keyslot(key)
        check(len(names) == len(blobs), f"{len(names)} keys in the cluster, {len(blobs)} stored")
        # Reshard the slot of one key to another master: B's first read meets MOVED.
        key, slot = next(iter(names.items()))
        src = cl.owner(slot)
        dst = next(p for p in cl.masters() if p != src)
        b.start(cl.url)
        cl.move_slot(slot, dst)
        check(cl.owner(slot) == dst, "the slot did not move")
        for name, data in blobs.items():
            check(b.get(name) == data, f"{name}: wrong bytes after the reshard")
        b.stop()
        # Kill a master (not the one B dials first) while B reads everything again.
        b.start(cl.url, KVSHIM_REMOTE_TIMEOUT_MS=300)
        victim = next(p for p in cl.masters() if p != dst)
        slots_of_victim = [s for s in names.values() if cl.owner(s) == victim]
        cl.kill(victim)
        hits, misses = read_all(b, blobs, "during the failover", KVSHIM_RPC_TIMEOUT_MS=1000)
        check(b.serve.poll() is None, "serve exited during the failover")
        if slots_of_victim:
            cl.wait_failover(slots_of_victim[0], victim)
        st = b.stats()
        check(misses == 0 or st["remote_errors"] + st["remote_timeouts"] +
              st["remote_misses"] > 0, f"{misses} misses but nothing counted: {st}")
        # After the failover the replica serves what it had: every hit is still exact.
        wait_for(lambda: b.cli("get", "f0", KVSHIM_RPC_TIMEOUT_MS=1000).returncode in (0, 1),
                 "B answering after the failover")
        for name, data in blobs.items():
            p = b.cli("get", name, KVSHIM_RPC_TIMEOUT_MS=2000)
            check(p.returncode == 1 or p.stdout == data, f"{name}: wrong bytes after failover")
        b.stop()


def case_kvo(ctx):
    check(ctx.engine and ctx.preload, "kvo needs --engine and --preload")
    prefix_chunks = 4096 // 64
    args = harness.refengine_prefix_args(prefix_chunks, 64)
    with servers.Standalone() as r:
        a, b = ctx.node("a"), ctx.node("b")
        a.start(r.url, pool="256M")
        p = subprocess.run([ctx.engine, *args, "--rank", "0"], capture_output=True, text=True,
                           env=a.env(preload=True), timeout=120)
        check(p.returncode == 0, f"refengine A: {p.returncode} {p.stderr}")
        a.stop()  # flushes the write-behind
        check(len(redis_keys(r)) >= prefix_chunks,
              f"Redis holds {len(redis_keys(r))} values, A computed {prefix_chunks} prefix chunks")
        b.start(r.url, pool="256M")
        st = os.path.join(ctx.tmp, "b.stats.json")
        p = subprocess.run([ctx.engine, *args, "--rank", "1", "--verify"], capture_output=True,
                           text=True, env=b.env(preload=True, KVSHIM_STATS=st), timeout=120)
        check(p.returncode == 0, f"refengine B: {p.returncode} {p.stderr}")
        lines = [json.loads(l) for l in p.stdout.splitlines()]
        check(lines[-1].get("verify") == "ok", f"B summary: {lines[-1]}")
        check(lines[0]["loaded"] == prefix_chunks,
              f"B loaded {lines[0]['loaded']} of {prefix_chunks} prefix chunks")
        check(b.stats()["remote_hits"] >= prefix_chunks, "B's prefix did not come from Redis")
        b.stop()


if __name__ == "__main__":
    ap = harness.parser(__doc__, "--cli", asan=True, optional=("--engine", "--preload"))
    sys.exit(harness.main(harness.cases(globals()), ap, Ctx))
