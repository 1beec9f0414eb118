#!/usr/bin/env python3
"""ctest driver for core/tiers/redis (the Redis client of the remote tier, design §17) against real
servers started by servers.py on free loopback ports.

usage: test_redis.py CASE --probe TEST_REDIS_PROBE       (test_redis.py --list: the cases)

The probe (test_redis_probe.c) holds one kvs_redis_t and answers one JSON line per command;
values are deterministic bytes of the key index, so the probe counts wrong bytes itself.

Cases:
  standalone-roundtrip  SET/GET/DEL/NX in one pipeline; 200 x 4 KiB, 8 x 1 MiB, 2 x 9 MiB back
                        byte for byte (the server's own copy checked with redis-cli too)
  standalone-db         redis://.../3 writes into database 3 and nowhere else
  standalone-pause      CLIENT PAUSE 3000: exec returns FAILED/-ETIMEDOUT at its 300 ms deadline,
                        long before the pause ends; works again once it ends
  standalone-password   requirepass: no password / wrong password -> -EACCES with a clear line
                        that never holds the password; the configured password overrides the URL
  standalone-not-redis  a TCP listener answering garbage -> -EPROTO, a silent one -> -ETIMEDOUT,
                        one answering +OK to everything or two replies to one command ->
                        -EPROTO, CLUSTER SLOTS of the wrong type or shape -> -EPROTO, nobody
                        -> -ECONNREFUSED, a standalone server as a cluster -> -EPROTO
  standalone-restart    server restarted: the next exec reconnects; server stopped: exec fails
                        with -ECONNREFUSED and nothing is sent; back again: it works
  standalone-info       version (= INFO server), standalone, 1 node, 16384 slots, an RTT
  cluster-roundtrip     6-node cluster, one seed: slot map, 300 keys over every master, CRC16
                        slots (hash tags too) equal to CLUSTER KEYSLOT for 300 keys; one master
                        paused: its keys time out at the deadline, the others are served
  cluster-moved         a slot resharded after the map was read: MOVED refreshes it, one exec
                        still returns the right value; writes land on the new owner
  cluster-ask           a slot half-migrated: a moved key is served through ASK + ASKING, a key
                        not yet moved by the old owner; after the migration both by MOVED
  cluster-failover      SIGKILL of a master: exec calls return errors or the right bytes, never
                        wrong ones, and all succeed again once the replica is promoted
"""
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import servers  # noqa: E402  (also puts tests/lib on sys.path)
from harness import Failure, check  # noqa: E402
import harness  # noqa: E402

ETIMEDOUT, ECONNREFUSED, EACCES, EPROTO, EINVAL = 110, 111, 13, 71, 22


class Probe:
    def __init__(self, path):
        self.p = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def q(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline()
        if not out:
            raise Failure(f"probe died on {line[:60]!r} (rc {self.p.wait()})")
        return json.loads(out)

    def ok(self, line):
        r = self.q(line)
        check(r.get("rc", -1) >= 0, f"{line[:60]!r} failed: {r}")
        return r

    def close(self):
        self.p.stdin.close()
        rc = self.p.wait(timeout=30)
        check(rc == 0, f"probe exited with {rc}")

    def cleanup(self):
        if self.p.poll() is None:
            self.p.kill()


@contextlib.contextmanager
def client_on(probe, server, create_args=""):
    """A server (servers.Standalone or servers.Cluster) with the probe's client created on it
    (its URL + create_args); the probe must exit cleanly once the block is done."""
    with server as s:
        probe.ok(f"create {s.url}{create_args}")
        yield s
        probe.close()


def vals(r):
    return [(x["t"], x.get("s", x.get("i", x.get("e")))) for x in r["results"]]


# ---- standalone ----------------------------------------------------------------------------

def case_standalone_roundtrip(probe):
    with client_on(probe, servers.Standalone(), " 2000") as s:
        r = probe.ok("exec SET a 1 | GET a | SET a 2 NX | GET a | DEL a | GET a | INCR n | PING")
        check(vals(r) == [("STATUS", "OK"), ("STRING", "1"), ("NIL", None), ("STRING", "1"),
                          ("INTEGER", 1), ("NIL", None), ("INTEGER", 1), ("STATUS", "PONG")],
              f"pipeline replies {vals(r)}")
        check(r["rc"] == 8, f"rc {r['rc']}")
        r = probe.ok("exec HGET a")  # a server error is a reply, not a failure
        check(vals(r)[0][0] == "ERROR" and r["rc"] == 1, f"error reply {r}")
        for n, size in ((200, 4096), (8, 1 << 20), (2, 9 << 20), (50, 100)):
            r = probe.ok(f"fill {n} k{size} {size}")
            check(r["ok"] == n, f"fill {n}x{size}: {r}")
            r = probe.ok(f"check {n} k{size} {size}")
            check(r["ok"] == n and r["wrong"] == 0, f"check {n}x{size}: {r}")
        # the probe compares bytes; this shows the comparison can fail
        r = probe.ok("check 5 k4096 4095")
        check(r["wrong"] == 5, f"a wrong size must count as wrong: {r}")
        # the server holds exactly what was sent (STRLEN of the zero-copy large argument)
        check(s.cli("STRLEN", "k1048576:7") == str(1 << 20), "server-side length")


def case_standalone_db(probe):
    with client_on(probe, servers.Standalone(), "/3") as s:
        probe.ok("exec SET dbkey three")
        check(s.cli("-n", "3", "GET", "dbkey") == "three", "value not in database 3")
        check(s.cli("-n", "0", "GET", "dbkey") == "", "value leaked into database 0")
        probe.ok(f"create redis://localhost:{s.port}/3")  # a name (::1 refused, then 127.0.0.1)
        check(vals(probe.ok("exec GET dbkey")) == [("STRING", "three")], "GET through localhost")
        r = probe.q(f"create {s.url}/100000")
        check(r["rc"] == -EINVAL and "SELECT" in r["err"], f"database out of range: {r}")


def case_standalone_pause(probe):
    with client_on(probe, servers.Standalone(), " 300") as s:
        probe.ok("exec SET p 1")
        s.pause(3000)
        t0 = time.monotonic()
        r = probe.q("exec GET p | GET p")
        took = time.monotonic() - t0
        check(r["rc"] == 0 and all(v == ("FAILED", -ETIMEDOUT) for v in vals(r)),
              f"paused server: {r}")
        check("300 ms" in r["err"], f"error line: {r['err']}")
        check(took < 2.0, f"exec took {took:.2f}s against a 300 ms deadline (pause is 3 s)")
        # still paused: the reconnect and its exec are bounded too
        r = probe.q("exec GET p")
        check(vals(r) == [("FAILED", -ETIMEDOUT)], f"second exec while paused: {r}")
        check(time.monotonic() - t0 < 2.5, "second exec not bounded by its deadline")
        end = time.monotonic() + 10
        while time.monotonic() < end:
            r = probe.q("exec GET p")
            if vals(r) == [("STRING", "1")]:
                break
            time.sleep(0.2)
        check(vals(r) == [("STRING", "1")], f"after the pause: {r}")


def case_standalone_password(probe):
    pw = "s3cr:t@pw"
    with servers.Standalone(password=pw) as s:
        host = f"127.0.0.1:{s.port}"
        r = probe.q(f"create redis://{host} 2000")
        check(r["rc"] == -EACCES and "password" in r["err"], f"no password: {r}")
        r = probe.q(f"create redis://:wrongpass123@{host} 2000")
        check(r["rc"] == -EACCES and "authentication refused" in r["err"], f"wrong password: {r}")
        check("wrongpass123" not in r["err"], f"password printed: {r['err']}")
        r = probe.q(f"create redis://default:wrongpass123@{host} 2000")
        check(r["rc"] == -EACCES and "wrongpass123" not in r["err"], f"wrong user:pass: {r}")
        # the configured password (KVSHIM_REMOTE_PASSWORD_FILE) wins over the URL's
        probe.ok(f"create redis://:wrongpass123@{host} 2000 {pw}")
        probe.ok("exec SET pw ok")
        probe.ok(f"create {s.url} 2000")  # %-encoded in the URL
        check(vals(probe.ok("exec GET pw")) == [("STRING", "ok")], "GET with URL password")
        probe.ok(f"create redis://default:{s.url.split(':', 2)[2]}")  # user:pass form
        check(vals(probe.ok("exec GET pw")) == [("STRING", "ok")], "GET with user:pass")
        # the password is sent again on a reconnect
        s.restart()
        probe.ok("exec SET pw2 ok")
        check(vals(probe.ok("exec GET pw2")) == [("STRING", "ok")], "after reconnect")
    with servers.Standalone() as s:  # a password for a server that has none: refused too
        r = probe.q(f"create redis://:wrongpass123@127.0.0.1:{s.port} 2000")
        check(r["rc"] == -EACCES and "wrongpass123" not in r["err"], f"needless password: {r}")
        probe.close()


class FakeServer:
    """A TCP listener that is not Redis: answers `reply` to whatever it gets (None: silence)."""

    def __init__(self, reply):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.conns = []
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        try:
            while c.recv(4096):
                if self.reply is not None:
                    c.sendall(self.reply)
        except OSError:
            pass

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def case_standalone_not_redis(probe):
    for reply, want, word in ((b"HTTP/1.0 400 Bad Request\r\n\r\n", -EPROTO, "not a Redis server"),
                              (b"+OK\r\n", -EPROTO, "not a Redis server"),
                              (b"+PONG\r\n+PONG\r\n", -EPROTO, "unexpected data"),
                              (None, -ETIMEDOUT, "no reply")):
        f = FakeServer(reply)
        try:
            t0 = time.monotonic()
            r = probe.q(f"create redis://127.0.0.1:{f.port} 300")
            check(r["rc"] == want and word in r["err"], f"fake server {reply!r}: {r}")
            check("\n" not in r["err"], "error is one line")
            check(time.monotonic() - t0 < 2.0, "create not bounded by its deadline")
        finally:
            f.close()
    # cluster seeds whose CLUSTER SLOTS reply has the wrong type or shape
    for reply in (b":1\r\n", b"*1\r\n*3\r\n:0\r\n:99999\r\n*2\r\n$1\r\nh\r\n:1\r\n",
                  b"*1\r\n*3\r\n:0\r\n:10\r\n*2\r\n:1\r\n:1\r\n"):
        f = FakeServer(reply)
        try:
            r = probe.q(f"create redis+cluster://127.0.0.1:{f.port} 300")
            check(r["rc"] == -EPROTO and "wrong shape" in r["err"], f"CLUSTER SLOTS {reply!r}: {r}")
        finally:
            f.close()
    port = servers.free_port()
    r = probe.q(f"create redis://127.0.0.1:{port} 300")
    check(r["rc"] == -ECONNREFUSED and "refused" in r["err"], f"nobody listening: {r}")
    r = probe.q(f"create redis+cluster://127.0.0.1:{port} 300")
    check(r["rc"] == -ECONNREFUSED, f"cluster, nobody listening: {r}")
    r = probe.q("create http://127.0.0.1:6379")
    check(r["rc"] == -EINVAL and "scheme" in r["err"], f"bad URL: {r}")
    with servers.Standalone() as s:  # a standalone server named as a cluster
        r = probe.q(f"create redis+cluster://127.0.0.1:{s.port} 1000")
        check(r["rc"] == -EPROTO and "cluster" in r["err"], f"standalone as cluster: {r}")
    probe.close()


def case_standalone_restart(probe):
    with client_on(probe, servers.Standalone(), " 1000") as s:
        probe.ok("exec SET r 1")
        s.restart()  # no persistence: the data is gone, the connection is stale
        r = probe.ok("exec GET r | SET r 2")
        check(vals(r) == [("NIL", None), ("STATUS", "OK")], f"first exec after restart: {r}")
        s.server.stop()
        r = probe.q("exec GET r")
        check(r["rc"] == -ECONNREFUSED and "refused" in r["err"], f"server down: {r}")
        s.server.start()
        r = probe.ok("exec SET r 3 | GET r")
        check(vals(r) == [("STATUS", "OK"), ("STRING", "3")], f"server back: {r}")


def case_standalone_info(probe):
    with client_on(probe, servers.Standalone()) as s:
        r = probe.ok("info")
        want = [line.split(":", 1)[1] for line in s.cli("INFO", "server").splitlines()
                if line.startswith("redis_version:")][0]
        check(r["version"] == want, f"version {r['version']!r} != {want!r}")
        check(r["cluster"] == 0 and r["nodes"] == 1 and r["slots"] == 16384, f"mode: {r}")
        check(r["rtt_us"] > 0, f"rtt: {r}")
        s.server.stop()
        r = probe.q("info")
        check(r["rc"] == -ECONNREFUSED, f"info, server down: {r}")


# ---- cluster -------------------------------------------------------------------------------

def slot_owner_other(c, key):
    """key's slot, the master serving it and another master."""
    slot = c.keyslot(key)
    src = c.owner(slot)
    return slot, src, next(p for p in c.masters() if p != src)


def case_cluster_roundtrip(probe):
    with servers.Cluster() as c:
        seed = c.ports[-1]  # one seed is enough (a replica, most likely)
        probe.ok(f"create redis+cluster://127.0.0.1:{seed} 2000")
        r = probe.ok("info")
        check(r["cluster"] == 1 and r["nodes"] == 3 and r["slots"] == 16384, f"cluster info: {r}")
        r = probe.ok("fill 300 ck 1000")
        check(r["ok"] == 300, f"fill across slots: {r}")
        r = probe.ok("check 300 ck 1000")
        check(r["ok"] == 300 and r["wrong"] == 0, f"check across slots: {r}")
        for port in c.masters():
            check(int(c.cli(port, "DBSIZE")) > 50, f"master {port} got few keys")
        r = probe.ok("exec PING")
        check(vals(r) == [("STATUS", "PONG")], f"keyless command: {r}")
        keys = [f"key{i}" for i in range(200)] + [f"{{user{i}}}.following" for i in range(50)] + \
               ["", "{", "}", "{}", "{}x", "x{}", "{a}{b}", "a{b}c{d}", "{{a}}", "foo", "123456789"]
        keys += [f"kvshim:v1:{i:032x}" for i in range(39)]
        for k in keys:
            want = c.keyslot(k) if k else 0
            got = probe.q(f"slot {k}")["slot"] if k else 0
            check(got == want, f"slot of {k!r}: {got} != CLUSTER KEYSLOT {want}")
        # one paused master costs only its own keys, within the deadline
        probe.ok(f"create {c.url} 300")
        paused = c.owner(c.keyslot("ck:0"))
        c.cli(paused, "CLIENT", "PAUSE", 2500)
        t0 = time.monotonic()
        r = probe.ok("check 300 ck 1000")
        took = time.monotonic() - t0
        check(r["wrong"] == 0 and r["failed"] > 50 and r["ok"] > 100 and r["ok"] + r["failed"] == 300,
              f"one master paused: {r}")
        check(took < 2.0, f"exec took {took:.2f}s against a 300 ms deadline (pause is 2.5 s)")
        probe.close()


def case_cluster_moved(probe):
    with client_on(probe, servers.Cluster(), " 3000") as c:
        probe.ok("fill 50 mv 500")
        slot, _, dst = slot_owner_other(c, "mv:0")
        c.move_slot(slot, dst)
        check(c.owner(slot) == dst, "reshard did not happen")
        r = probe.ok("check 50 mv 500")  # mv:0 gets MOVED inside this exec
        check(r["ok"] == 50 and r["wrong"] == 0, f"after reshard: {r}")
        r = probe.ok("exec SET mv:0 new | GET mv:0")
        check(vals(r) == [("STATUS", "OK"), ("STRING", "new")], f"write after reshard: {r}")
        check(c.cli(dst, "GET", "mv:0") == "new", "write did not land on the new owner")
        # a second slot moved: the refreshed map sends it straight there
        slot2, _, dst2 = slot_owner_other(c, "mv:1")
        c.move_slot(slot2, dst2)
        r = probe.ok("check 50 mv 500")
        check(r["ok"] == 49 and r["wrong"] == 1, f"second reshard (mv:0 was rewritten): {r}")


def case_cluster_ask(probe):
    with client_on(probe, servers.Cluster(), " 3000") as c:
        probe.ok("exec SET {t}a va | SET {t}b vb")
        slot, src, dst = slot_owner_other(c, "{t}a")
        c.begin_migration(slot, dst)
        c.migrate_key(src, dst, "{t}a")
        check(c.cli(src, "GET", "{t}a").startswith("ASK"), "the old owner should answer ASK")
        r = probe.ok("exec GET {t}a | GET {t}b")
        check(vals(r) == [("STRING", "va"), ("STRING", "vb")], f"during migration: {r}")
        r = probe.ok("exec GET {t}a")
        check(vals(r) == [("STRING", "va")], f"ASK does not change the map: {r}")
        c.finish_migration(slot, src, dst)
        c.wait_ok()
        r = probe.ok("exec GET {t}a | GET {t}b | SET {t}c vc")
        check(vals(r) == [("STRING", "va"), ("STRING", "vb"), ("STATUS", "OK")],
              f"after migration: {r}")
        check(c.cli(dst, "GET", "{t}c") == "vc", "write after migration not on the new owner")


def case_cluster_failover(probe):
    with client_on(probe, servers.Cluster(node_timeout_ms=1000), " 500") as c:
        n = 200
        r = probe.ok(f"fill {n} fo 2000")
        check(r["ok"] == n, f"fill: {r}")
        c.wait_replicated()  # the replicas have every key before the kill
        slot = c.keyslot("fo:0")
        dead = c.owner(slot)
        keys_before = int(c.cli(dead, "DBSIZE"))
        c.kill(dead)
        failed_calls = 0
        end = time.monotonic() + 40
        r = None
        while time.monotonic() < end:
            probe.q("fill 30 fw 3000")  # writes during the failover: OK, failed or CLUSTERDOWN
            w = probe.q("check 30 fw 3000")  # what reads back is right or missing
            check(w.get("wrong", 0) == 0, f"wrong bytes of a write during failover: {w}")
            r = probe.q(f"check {n} fo 2000")
            check(r.get("wrong", 0) == 0, f"wrong bytes during failover: {r}")
            if r["rc"] >= 0 and r["ok"] == n:
                break
            check(r["rc"] < 0 or r["failed"] + r["nil"] + r["other"] > 0, f"odd result: {r}")
            failed_calls += 1
            time.sleep(0.05)
        if not (r and r["rc"] >= 0 and r["ok"] == n):
            views = {p: c.slots_of(p) for p in c.live_ports()}
            sizes = {p: c.cli(p, "DBSIZE") for p in c.live_ports()}
            raise Failure(f"not all keys back after failover: {r}; dead {dead} had {keys_before} "
                          f"keys; DBSIZE {sizes}; views {views}")
        check(failed_calls > 0, "the kill was not seen at all")
        new = c.wait_failover(slot, dead)
        check(new != dead, "slot still on the dead master")
        r = probe.ok("fill 30 fw 3000")
        check(r["ok"] == 30, f"writes after failover: {r}")
        r = probe.ok("check 30 fw 3000")
        check(r["ok"] == 30 and r["wrong"] == 0, f"reads of writes after failover: {r}")
        r = probe.ok("exec SET fo:0 after | GET fo:0")
        check(vals(r) == [("STATUS", "OK"), ("STRING", "after")], f"write after failover: {r}")
        r = probe.ok("info")
        check(r["nodes"] == 3 and r["slots"] == 16384, f"info after failover: {r}")


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()), harness.parser(__doc__, "--probe"),
                          lambda args, tmp, work: Probe(args.probe)))
