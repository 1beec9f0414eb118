#!/usr/bin/env python3
"""Real Redis servers for the remote-tier tests: a standalone redis-server or a Redis Cluster
of 3 masters + 3 replicas, on free loopback ports, in a private temporary directory.

Only the standard library; needs Debian's redis-server and redis-tools (redis-cli) on PATH
(scripts/lib.sh KVS_PKGS_REMOTE). Every server is started with PR_SET_PDEATHSIG=SIGKILL, so
it dies with the Python process that started it even when that one is SIGKILLed; stop() and the
context managers also stop them and remove the directory.

Python API (import with sys.path pointing at tests/core/tiers):

    import servers
    with servers.Standalone(password=None) as s:   # one redis-server, ready (PING answers)
        s.url                  # "redis://127.0.0.1:PORT" ("redis://:PASS@..." with a password)
        s.port, s.dir
        s.cli("SET", "k", "v")  # redis-cli against it -> stdout stripped (str)
        s.pause(3000)          # CLIENT PAUSE 3000 (all clients)
        s.restart()            # stop and start again on the same port (the data is lost)
        s.stop()
    with servers.Cluster(masters=3, replicas=1, node_timeout_ms=1000) as c:  # cluster_state:ok
        c.url                  # "redis+cluster://127.0.0.1:P1,127.0.0.1:P2,..." (every node)
        c.ports                # all node ports; c.masters() -> {port: [(lo, hi), ...]}
        c.cli(port, *args)     # redis-cli -p port (no -c: MOVED/ASK are not followed)
        c.keyslot("key")       # CLUSTER KEYSLOT as the server computes it
        c.owner(slot)          # port of the master serving slot
        c.move_slot(slot, dst)             # a full reshard of one slot (keys migrated)
        c.begin_migration(slot, dst)       # IMPORTING/MIGRATING only (ASK territory) ...
        c.migrate_key(slot, dst, key)      # ... and move single keys
        c.finish_migration(slot, dst)      # SETSLOT NODE everywhere
        c.wait_replicated()                # every replica has its master's whole stream
        c.kill(port)                       # SIGKILL one node
        c.wait_failover(slot, dead)        # until a live master serves slot and state is ok

Command line (for shell experiments and other drivers):

    servers.py standalone [--password P]
    servers.py cluster [--masters 3] [--replicas 1] [--node-timeout-ms 1000]

prints one JSON line {"url": ..., "ports": [...], "dir": ...} once everything is ready, then
keeps the servers until its stdin reaches EOF or it gets SIGTERM/SIGINT, and cleans up.
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from harness import Failure  # noqa: E402

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
HOST = "127.0.0.1"


class ServerError(Failure):
    pass


class PortTaken(ServerError):
    """Another process took the port between free_port() and the server's bind."""


def free_port():
    """A loopback TCP port nobody listens on right now (cluster nodes also need port+10000)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as s2:
            try:
                s2.bind((HOST, port + 10000))
            except OSError:
                continue
        return port
    raise ServerError("no free port pair found")


def _die_with_parent():
    # prctl(PR_SET_PDEATHSIG, SIGKILL): the server dies with us, whatever kills us.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)


class Server:
    """One redis-server process with its own config file in dir."""

    def __init__(self, root, port, password=None, cluster=False, node_timeout_ms=1000,
                 extra=()):
        self.port = port
        self.password = password
        self.dir = os.path.join(root, str(port))
        os.makedirs(self.dir, exist_ok=True)
        conf = [
            f"port {port}", f"bind {HOST}", "protected-mode no", "daemonize no",
            f'dir "{self.dir}"', 'save ""', "appendonly no",
            f'logfile "{os.path.join(self.dir, "redis.log")}"',
        ]
        if password:
            conf.append(f"requirepass {password}")
            conf.append(f"masterauth {password}")
        if cluster:
            conf += ["cluster-enabled yes", "cluster-config-file nodes.conf",
                     f"cluster-node-timeout {node_timeout_ms}",
                     "cluster-replica-validity-factor 0", "cluster-allow-replica-migration no"]
        conf += list(extra)
        self.conf = os.path.join(self.dir, "redis.conf")
        with open(self.conf, "w") as f:
            f.write("\n".join(conf) + "\n")
        self.proc = None

    def start(self, timeout=10.0):
        self.proc = subprocess.Popen([REDIS_SERVER, self.conf], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                kind = PortTaken if "already in use" in tail else ServerError
                raise kind(f"redis-server on port {self.port} exited: {tail}")
            try:
                if self.cli("PING", timeout=2) == "PONG":
                    return self
            except ServerError:
                pass
            time.sleep(0.05)
        self.kill()
        raise ServerError(f"redis-server on port {self.port} not ready: {self.log_tail()}")

    def log_tail(self):
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return " | ".join(f.read().splitlines()[-5:])
        except OSError:
            return "(no log)"

    def cli(self, *args, timeout=20):
        cmd = [REDIS_CLI, "-h", HOST, "-p", str(self.port)]
        if self.password:
            cmd += ["--no-auth-warning", "-a", self.password]
        try:
            p = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ServerError(f"redis-cli {' '.join(map(str, args[:2]))} timed out")
        if p.returncode != 0:
            raise ServerError(f"redis-cli {' '.join(map(str, args[:2]))}: {p.stderr.strip()}")
        return p.stdout.strip()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class _Base:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kvshim-redis.")
        self.servers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def spawn(self, **kw):
        """A started Server on a free port (another port when one is taken meanwhile)."""
        for _ in range(5):
            try:
                srv = Server(self.dir, free_port(), **kw).start()
            except PortTaken:
                continue
            self.servers.append(srv)
            return srv
        raise ServerError("no free port for redis-server after 5 tries")

    def stop(self):
        for s in self.servers:
            s.stop()
        self.servers = []
        if self.dir and os.path.isdir(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None


class Standalone(_Base):
    def __init__(self, password=None, extra=()):
        super().__init__()
        self.password = password
        try:
            self.server = self.spawn(password=password, extra=extra)
        except BaseException:
            self.stop()
            raise
        self.port = self.server.port
        auth = f":{urllib.parse.quote(password, safe='')}@" if password else ""
        self.url = f"redis://{auth}{HOST}:{self.port}"
        self.ports = [self.port]

    def cli(self, *args, **kw):
        return self.server.cli(*args, **kw)

    def pause(self, ms):
        return self.cli("CLIENT", "PAUSE", ms)

    def restart(self):
        self.server.stop()
        self.server.start()


class Cluster(_Base):
    def __init__(self, masters=3, replicas=1, node_timeout_ms=1000):
        super().__init__()
        try:
            n = masters * (1 + replicas)
            for _ in range(n):
                self.spawn(cluster=True, node_timeout_ms=node_timeout_ms)
            self.ports = [s.port for s in self.servers]
            self.by_port = {s.port: s for s in self.servers}
            p = subprocess.run([REDIS_CLI, "--cluster", "create"] +
                               [f"{HOST}:{port}" for port in self.ports] +
                               ["--cluster-replicas", str(replicas), "--cluster-yes"],
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 0:
                raise ServerError("redis-cli --cluster create: " + p.stdout[-500:] + p.stderr[-500:])
            self.wait_ok()
            self.wait_replicas(replicas)
        except BaseException:
            self.stop()
            raise
        self.url = "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in self.ports)

    def cli(self, port, *args, **kw):
        return self.by_port[port].cli(*args, **kw)

    def live_ports(self):
        return [s.port for s in self.servers if s.alive()]

    def slots_of(self, port):
        """CLUSTER SLOTS as seen by one node: [(lo, hi, master_port), ...]."""
        res = []  # from CLUSTER NODES: redis-cli prints CLUSTER SLOTS' nested arrays flat
        for line in self.cli(port, "CLUSTER", "NODES").splitlines():
            f = line.split()
            if len(f) < 8 or "master" not in f[2] or "fail" in f[2]:
                continue
            mport = int(f[1].split("@")[0].rsplit(":", 1)[1])
            for sl in f[8:]:
                if sl.startswith("["):
                    continue  # a migration in progress, not an owned range
                lo, _, hi = sl.partition("-")
                res.append((int(lo), int(hi or lo), mport))
        return res

    def masters(self, port=None):
        port = port or self.live_ports()[0]
        m = {}
        for lo, hi, mp in self.slots_of(port):
            m.setdefault(mp, []).append((lo, hi))
        return m

    def node_id(self, port):
        return self.cli(port, "CLUSTER", "MYID")

    def keyslot(self, key):
        return int(self.cli(self.live_ports()[0], "CLUSTER", "KEYSLOT", key))

    def owner(self, slot, port=None):
        for lo, hi, mp in self.slots_of(port or self.live_ports()[0]):
            if lo <= slot <= hi:
                return mp
        return None

    def wait_ok(self, timeout=30.0):
        """Every live node says cluster_state:ok and they all agree on who owns every slot."""
        end = time.monotonic() + timeout
        last = ""
        while time.monotonic() < end:
            try:
                states = [self.cli(p, "CLUSTER", "INFO") for p in self.live_ports()]
                views = [sorted(self.slots_of(p)) for p in self.live_ports()]
                if all("cluster_state:ok" in s for s in states) and all(v == views[0] for v in views) \
                        and sum(hi - lo + 1 for lo, hi, _ in views[0]) == 16384:
                    return
                last = "state or views differ"
            except ServerError as e:
                last = str(e)
            time.sleep(0.1)
        raise ServerError(f"cluster not ok after {timeout}s: {last}")

    def wait_replicas(self, replicas, timeout=60.0):
        """Every master has `replicas` replicas online (synced: WAIT can count them)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                infos = [self.cli(p, "INFO", "replication") for p in self.masters()]
                if all(i.count("state=online") >= replicas for i in infos):
                    return
            except ServerError:
                pass
            time.sleep(0.1)
        raise ServerError(f"replicas not online after {timeout}s")

    def wait_replicated(self, timeout=30.0):
        """Every replica has acknowledged its master's whole replication stream (what WAIT
        from a fresh connection cannot tell: it waits only for that connection's writes)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            done = True
            for p in self.masters():
                info = dict(l.split(":", 1) for l in self.cli(p, "INFO", "replication").splitlines()
                            if ":" in l)
                off = info.get("master_repl_offset")
                reps = [v for k, v in info.items() if k.startswith("slave")]
                if not reps or any(f"offset={off}," not in v for v in reps):
                    done = False
            if done:
                return
            time.sleep(0.05)
        raise ServerError(f"replicas not caught up after {timeout}s")

    def begin_migration(self, slot, dst):
        src = self.owner(slot)
        if src == dst:
            raise ServerError(f"slot {slot} already on {dst}")
        self.cli(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(src))
        self.cli(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(dst))
        return src

    def migrate_key(self, src, dst, key):
        out = self.cli(src, "MIGRATE", HOST, dst, key, 0, 5000)
        if out not in ("OK", "NOKEY"):
            raise ServerError(f"MIGRATE {key}: {out}")

    def finish_migration(self, slot, src, dst):
        while True:
            keys = self.cli(src, "CLUSTER", "GETKEYSINSLOT", slot, 100).split()
            if not keys:
                break
            out = self.cli(src, "MIGRATE", HOST, dst, "", 0, 5000, "KEYS", *keys)
            if out != "OK":
                raise ServerError(f"MIGRATE KEYS: {out}")
        did = self.node_id(dst)
        self.cli(dst, "CLUSTER", "SETSLOT", slot, "NODE", did)
        self.cli(src, "CLUSTER", "SETSLOT", slot, "NODE", did)
        for mp in self.masters():
            if mp not in (src, dst):
                self.cli(mp, "CLUSTER", "SETSLOT", slot, "NODE", did)

    def move_slot(self, slot, dst):
        src = self.begin_migration(slot, dst)
        self.finish_migration(slot, src, dst)
        self.wait_ok()
        return src

    def kill(self, port):
        self.by_port[port].kill()

    def wait_failover(self, slot, dead, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            live = self.live_ports()
            try:
                o = self.owner(slot, live[0])
                if o and o != dead and o in live and \
                        "cluster_state:ok" in self.cli(live[0], "CLUSTER", "INFO"):
                    return o
            except ServerError:
                pass
            time.sleep(0.1)
        raise ServerError(f"no failover of slot {slot} within {timeout}s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    sa = sub.add_parser("standalone")
    sa.add_argument("--password")
    cl = sub.add_parser("cluster")
    cl.add_argument("--masters", type=int, default=3)
    cl.add_argument("--replicas", type=int, default=1)
    cl.add_argument("--node-timeout-ms", type=int, default=1000)
    a = ap.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1) or sys.stdin.close())
    if a.mode == "standalone":
        srv = Standalone(password=a.password)
    else:
        srv = Cluster(a.masters, a.replicas, a.node_timeout_ms)
    with srv:
        print(json.dumps({"url": srv.url, "ports": srv.ports, "dir": srv.dir}), flush=True)
        try:
            while not stop and sys.stdin.readline():
                pass
        except (KeyboardInterrupt, ValueError, OSError):
            pass


if __name__ == "__main__":
    main()
