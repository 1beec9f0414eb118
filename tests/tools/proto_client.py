#!/usr/bin/env python3
"""An independent client of the kvshim wire protocol, written from docs/protocol.md alone.

Each case starts `kvshim serve` in a temporary run directory and talks to its socket with the
Python standard library only (no kvshim code): HELLO with and without the AUTO_RELEASE caps bit
(5, 5.1), the SHM store and SKIPPED outcomes (4.4, 4.5), EXPORT_TENSORS and REPORT_BAD (4.10,
4.11), the one-round-trip retrieve
(PREPARE_RETRIEVE answering the lookup, 6), pins that an
AUTO_RELEASE retrieve ends at the client's next request (4.7), split messages (2.1), and bad
input: a malformed frame or payload gets a clear ERROR and closes the connection (8), a
well-formed request that cannot be served gets ERROR and the connection stays open, and nothing
stored is lost either way.

usage: proto_client.py CASE --cli build/tools/kvshim   (--list: the cases)
"""
import json
import mmap
import os
import re
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
from harness import check, require  # noqa: E402

# ---- docs/protocol.md, as numbers -------------------------------------------------------------
MAGIC = 0x4D53564B                     # 2: bytes 4B 56 53 4D
HDR = struct.Struct("<IHHIQI")         # 2: magic, version, opcode, flags, request_id, length
F_REPLY, F_MORE = 0x1, 0x2
OP = dict(HELLO=1, LOOKUP=2, PREPARE_STORE=3, COMMIT_STORE=4, ABORT=5, PREPARE_RETRIEVE=6,
          COMMIT_RETRIEVE=7, STATS=8, PING=9, EXPORT_TENSORS=10, REPORT_BAD=11, ERROR=255)
CAP_SHM, CAP_INLINE, CAP_SKIPPED, CAP_MAX_MESSAGE = 0x1, 0x2, 0x4, 0x8
CAP_REPORT_BAD, CAP_REMOTE, CAP_AUTO_RELEASE = 0x10, 0x20, 0x40
ROLE_ENGINE, ROLE_CACHE, ROLE_TOOL = 1, 2, 3
SHM, INLINE = 1, 2
HELLO_POOL_FD = 0x1
RETRIEVE_AUTO_RELEASE = 0x1
EBADMSG, EOPNOTSUPP, EPROTO, ENOENT, EPERM = -74, -95, -71, -2, -1
POOL_MAGIC = 0x4C4F4F504D48534B        # 5: "KSHMPOOL"
MIN_MAX_FRAME = 65536


class ServerError(Exception):
    """An ERROR reply (4.2): code, message, request id."""

    def __init__(self, code, message, rid):
        super().__init__(f"ERROR {code} ({message!r}) for request {rid}")
        self.code, self.message, self.rid = code, message, rid


class Closed(Exception):
    """The server closed the connection."""


def key(n):
    """A 16-byte chunk key (lo, hi), distinct per n."""
    return struct.pack("<QQ", 0x1000 + n, 0xC0FFEE00 + n)


def layout_u8(n):
    """layout (4): dtype 0 U8, ndim 1, shape [n]."""
    return struct.pack("<IIQ", 0, 1, n)


class Conn:
    """One connection to a server: frames out, messages in (split ones joined), fds kept."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(20)
        self.s.connect(path)
        self.buf = b""
        self.fds = []
        self.rid = 0
        self.hello = None
        self.pool = None

    def close(self):
        if self.pool is not None:
            self.pool.close()
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.s.close()

    def _fill(self, n):
        while len(self.buf) < n:
            try:
                data, anc, _, _ = self.s.recvmsg(1 << 20, socket.CMSG_SPACE(4 * 4),
                                                 getattr(socket, "MSG_CMSG_CLOEXEC", 0))
            except socket.timeout:
                raise harness.Failure(f"nothing from the server in {self.s.gettimeout()} s")
            for level, typ, payload in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    cut = len(payload) - len(payload) % 4
                    self.fds += list(struct.unpack(f"<{cut // 4}i", payload[:cut]))
            if not data:
                raise Closed()
            self.buf += data

    def send_frame(self, op, rid, body, flags=0, version=1, magic=MAGIC):
        self.s.sendall(HDR.pack(magic, version, op, flags, rid, len(body)) + body)

    def recv_frame(self):
        self._fill(HDR.size)
        magic, ver, op, flags, rid, n = HDR.unpack(self.buf[:HDR.size])
        require(magic == MAGIC, f"reply magic {magic:#x}")
        require(ver == 1, f"reply version {ver}")
        self._fill(HDR.size + n)
        body = self.buf[HDR.size:HDR.size + n]
        self.buf = self.buf[HDR.size + n:]
        return op, flags, rid, body

    def recv_msg(self):
        """(opcode, request id, payload) of the next message; ERROR raises ServerError."""
        op, flags, rid, body = self.recv_frame()
        require(flags & F_REPLY, f"a server frame without REPLY (opcode {op})")
        self.frames = [len(body)]
        while flags & F_MORE:
            op2, flags, rid2, more = self.recv_frame()
            require((op2, rid2) == (op, rid) and flags & F_REPLY, "split reply mismatch")
            self.frames.append(len(more))
            body += more
        if op == OP["ERROR"]:
            code, mlen = struct.unpack_from("<iH", body, 0)
            require(len(body) == 6 + mlen, f"ERROR payload of {len(body)} bytes, message {mlen}")
            raise ServerError(code, body[6:].decode(errors="replace"), rid)
        return op, rid, body

    def call(self, op, body):
        """One request, its reply payload (an ERROR raises ServerError)."""
        self.rid += 1
        self.send_frame(OP[op], self.rid, body)
        rop, rrid, payload = self.recv_msg()
        require(rrid == self.rid, f"{op}: reply for request {rrid}, sent {self.rid}")
        require(rop == OP[op], f"{op}: reply opcode {rop}")
        return payload

    def refused(self, what):
        """The next message, which must be an ERROR: the ServerError."""
        try:
            self.recv_msg()
        except ServerError as e:
            check(e.message != "", f"{what}: ERROR without a message")
            return e
        raise harness.Failure(f"{what}: answered, not refused")

    def expect_error(self, op, body, what, rid=None):
        """Sends one request that must be refused: the ServerError."""
        self.rid += 1
        self.send_frame(OP[op] if isinstance(op, str) else op, self.rid, body)
        e = self.refused(what)
        check(e.rid == (self.rid if rid is None else rid),
              f"{what}: ERROR for request {e.rid}, wanted {self.rid if rid is None else rid}")
        return e

    def expect_closed(self, what):
        try:
            self.recv_msg()
        except (Closed, ConnectionResetError, BrokenPipeError):
            return
        except harness.Failure as e:
            raise harness.Failure(f"{what}: the connection stayed open ({e})")
        raise harness.Failure(f"{what}: the connection stayed open")

    # ---- messages ---------------------------------------------------------------------------

    def do_hello(self, caps, strategy=0, role=ROLE_TOOL):
        """HELLO (4.1, 5): returns the reply as a dict; maps the pool when POOL_FD came."""
        group = b"proto"
        body = struct.pack("<HHBBBBIIQQQQIHH", 1, 1, role, strategy, 0, 0, os.getpid(), caps,
                           0xABCDEF, 0, 0, 0, MIN_MAX_FRAME, len(group), 0) + group
        p = self.call("HELLO", body)
        f = struct.unpack_from("<HHBBBBIIQQQQIHH", p, 0)
        h = dict(version_min=f[0], version_max=f[1], role=f[2], strategy_requested=f[3],
                 strategy_chosen=f[4], flags=f[5], pid=f[6], caps=f[7], instance_id=f[8],
                 pool_segment_size=f[9], pool_arena_size=f[10], pool_arena_used=f[11],
                 max_frame=f[12], group=p[56:56 + f[13]], max_message=None)
        require(f[14] == 0, "HELLO reply reserved field not 0")
        rest = 56 + f[13]
        if rest < len(p):  # padding to 8, then max_message (4.1)
            pad = (8 - rest % 8) % 8
            check(p[rest:rest + pad] == b"\0" * pad, "HELLO reply padding not zero")
            require(len(p) == rest + pad + 8, f"HELLO reply of {len(p)} bytes")
            h["max_message"] = struct.unpack_from("<Q", p, rest + pad)[0]
        self.hello = h
        if h["flags"] & HELLO_POOL_FD:
            require(len(self.fds) == 1, f"POOL_FD set, {len(self.fds)} fds received")
            self.pool = mmap.mmap(self.fds[0], h["pool_segment_size"], mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        return h

    def store_inline(self, keys, datas):
        """Inline COMMIT_STORE of chunks (kind 0), one per key (4.5): (committed, outcomes)."""
        n = len(datas[0])
        require(all(len(d) == n for d in datas), "chunks of one layout")
        head = struct.pack("<QBBHIII", 0, 1, 0, 0, 0, len(keys), 0)
        table = b"".join(k + struct.pack("<Q", len(d)) for k, d in zip(keys, datas))
        p = self.call("COMMIT_STORE", head + layout_u8(n) + table + b"".join(datas))
        committed, n_out = struct.unpack_from("<II", p, 0)
        require(len(p) == 8 + n_out, f"COMMIT_STORE reply of {len(p)} bytes")
        return committed, list(p[8:8 + n_out])

    def prepare_store(self, keys, n, strategy=SHM, mode=0):
        """PREPARE_STORE of chunks (4.4): (xfer, outcomes, slots [(key_index, offset, length)])."""
        p = self.call("PREPARE_STORE", struct.pack("<BBHIII", strategy, 0, 0, mode, len(keys), 0)
                      + layout_u8(n) + b"".join(keys))
        xfer, n_out, n_slots = struct.unpack_from("<QII", p, 0)
        outcomes = list(p[16:16 + n_out])
        pos = 16 + (n_out + 7) // 8 * 8
        check(p[16 + n_out:pos] == b"\0" * (pos - 16 - n_out), "PREPARE_STORE padding not zero")
        slots = []
        for _ in range(n_slots):
            ki, res, off, ln = struct.unpack_from("<IIQQ", p, pos)
            check(res == 0, "slot reserved field not 0")
            slots.append((ki, off, ln))
            pos += 24
        require(pos == len(p), f"PREPARE_STORE reply: {len(p) - pos} bytes after the slots")
        return xfer, outcomes, slots

    def commit_shm(self, xfer, slots):
        """SHM COMMIT_STORE naming these slots (4.5): objects committed."""
        body = struct.pack("<QBBHIII", xfer, 0, 0, 0, 0, len(slots), 0) + b"".join(
            struct.pack("<IIQQ", ki, 0, off, ln) for ki, off, ln in slots)
        p = self.call("COMMIT_STORE", body)
        committed, n_out = struct.unpack_from("<II", p, 0)
        check(n_out == 0 and len(p) == 8, f"shm COMMIT_STORE reply with {n_out} outcomes")
        return committed

    def lookup(self, keys):
        p = self.call("LOOKUP", struct.pack("<II", len(keys), 0) + b"".join(keys))
        found, res = struct.unpack("<II", p)
        check(res == 0, "LOOKUP reply reserved field not 0")
        return found

    def retrieve(self, keys, strategy, flags=0):
        """PREPARE_RETRIEVE (4.7): dict with xfer, n_found, pin_ms, objects [(key_index,
        offset, length, bytes or None)]."""
        p = self.call("PREPARE_RETRIEVE",
                      struct.pack("<BBHI", strategy, flags, 0, len(keys)) + b"".join(keys))
        xfer, n_found, n_obj, inl, r1, r2, pin_ms = struct.unpack_from("<QIIBBHI", p, 0)
        check(r1 == 0 and r2 == 0, "PREPARE_RETRIEVE reply reserved fields not 0")
        pos, objs = 24, []
        for _ in range(n_obj):
            ki, res, off, ln, dtype, ndim = struct.unpack_from("<IIQQII", p, pos)
            check(res == 0, "object record reserved field not 0")
            pos += 32 + 8 * ndim
            objs.append([ki, off, ln, None])
        if inl:
            for o in objs:
                o[3] = p[pos:pos + o[2]]
                pos += o[2]
        require(pos == len(p), f"PREPARE_RETRIEVE reply: {len(p) - pos} bytes after the table")
        return dict(xfer=xfer, n_found=n_found, inline=inl, pin_ms=pin_ms, objects=objs)

    def commit_retrieve(self, xfer):
        p = self.call("COMMIT_RETRIEVE", struct.pack("<Q", xfer))
        require(p == b"", "COMMIT_RETRIEVE reply not empty")

    def ping(self, echo=b"hi"):
        p = self.call("PING", struct.pack("<QII", 42, len(echo), 0) + echo)
        check(p == struct.pack("<QII", 42, len(echo), 0) + echo, "PING echo differs")

    def stats(self):
        """STATS INFO text (4.8) as {name: int}."""
        p = self.call("STATS", b"\0")
        n, = struct.unpack_from("<I", p, 0)
        require(len(p) == 4 + n, "STATS reply length")
        out = {}
        for line in p[4:].decode().splitlines():
            k, sep, v = line.partition(":")
            if sep and not k.startswith("#") and v.strip().isdigit():
                out[k] = int(v)
        return out


class Ctx(harness.Context):
    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.defaults = {"KVSHIM_GROUP": "proto"}
        self.conns = []
        s = self.serve()
        self.sock = s.banner.split("socket ")[1].split(",")[0].strip()
        self.serve_proc = s

    def conn(self, caps=CAP_SHM | CAP_INLINE, strategy=0, hello=True):
        c = Conn(self.sock)
        self.conns.append(c)
        if hello:
            c.do_hello(caps, strategy)
        return c

    def alive(self):
        check(self.serve_proc.poll() is None, "kvshim serve exited")

    def cleanup(self):
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass
        super().cleanup()


CHUNK = 4096


def data(n):
    return bytes((i * 7 + n) & 0xFF for i in range(CHUNK))


def stored(ctx, n=2):
    """Stores chunks 0..n-1 inline from a fresh connection."""
    c = ctx.conn()
    committed, outcomes = c.store_inline([key(i) for i in range(n)], [data(i) for i in range(n)])
    require(committed == n and outcomes == [0] * n, f"inline store: {committed} {outcomes}")
    return c


def eventually(fn, what, timeout=20):
    """fn() until it is true: the server notices a closed connection on its own thread, after
    the client's close() returned (6, leases end when the connection closes)."""
    deadline = time.monotonic() + timeout
    while not fn():
        require(time.monotonic() < deadline, what)
        time.sleep(0.01)


def shm_bytes(c, obj):
    return bytes(c.pool[obj[1]:obj[1] + obj[2]])


# ---- cases --------------------------------------------------------------------------------------

def case_hello(ctx):
    """HELLO without and with AUTO_RELEASE: the server's reply, its pool fd and header (5)."""
    c = ctx.conn(CAP_SHM | CAP_INLINE)
    h = c.hello
    check(h["role"] == ROLE_CACHE, f"serve's HELLO role {h['role']}, wanted 2 (cache)")
    check(h["version_min"] <= 1 <= h["version_max"], "serve does not speak version 1")
    check(h["caps"] & CAP_AUTO_RELEASE, f"serve does not offer AUTO_RELEASE: caps {h['caps']:#x}")
    check(h["caps"] & CAP_SHM and h["caps"] & CAP_INLINE, f"caps {h['caps']:#x}")
    check(not h["caps"] & CAP_REMOTE, "REMOTE offered by a serve without a remote tier")
    check(h["strategy_chosen"] == SHM and h["flags"] & HELLO_POOL_FD, "no shm for an shm client")
    check(h["max_message"] is None, "max_message sent to a client without MAX_MESSAGE")
    check(h["group"] == b"proto", f"group {h['group']!r}")
    check(MIN_MAX_FRAME <= h["max_frame"] <= 1 << 30, f"max_frame {h['max_frame']}")
    magic, abi, hsize, seg, inst = struct.unpack_from("<QIIQQ", c.pool, 0)
    check((magic, abi, hsize) == (POOL_MAGIC, 1, 256), "pool header magic/abi/size")
    check(seg == h["pool_segment_size"] and inst == h["instance_id"], "pool header identity")
    check(os.fstat(c.fds[0]).st_mode & 0o777 == 0o600, "pool fd mode not 0600")

    c2 = ctx.conn(CAP_SHM | CAP_INLINE | CAP_AUTO_RELEASE | CAP_MAX_MESSAGE)
    h2 = c2.hello
    check(h2["caps"] & CAP_AUTO_RELEASE, "AUTO_RELEASE not answered to a client that set it")
    check(h2["max_message"] is not None and h2["max_message"] >= h2["max_frame"],
          f"max_message {h2['max_message']} for a client with MAX_MESSAGE")

    c3 = ctx.conn(CAP_INLINE, strategy=INLINE)
    check(c3.hello["strategy_chosen"] == INLINE and not c3.hello["flags"] & HELLO_POOL_FD and
          not c3.fds, "an inline client got the pool")
    c3.ping()
    # A second HELLO is -EPROTO and closes (5).
    e = c3.expect_error("HELLO", struct.pack("<HHBBBBIIQQQQIHH", 1, 1, 3, 0, 0, 0, 1, 0, 0, 0,
                                             0, 0, MIN_MAX_FRAME, 0, 0), "second HELLO")
    check(e.code == EPROTO, f"second HELLO: {e.code}, wanted {EPROTO}")
    c3.expect_closed("second HELLO")
    # A HELLO request with strategy_chosen set is a field violation (5 step 2).
    c4 = ctx.conn(hello=False)
    e = c4.expect_error("HELLO", struct.pack("<HHBBBBIIQQQQIHH", 1, 1, 3, 0, 1, 0, 1, 0, 0, 0,
                                             0, 0, MIN_MAX_FRAME, 0, 0), "HELLO strategy_chosen")
    check(e.code == EBADMSG, f"HELLO with strategy_chosen: {e.code}")
    c4.expect_closed("HELLO with strategy_chosen")
    ctx.alive()


def case_one_rtt(ctx):
    """PREPARE_RETRIEVE answers the lookup: no LOOKUP first, n_found is the leading run (6)."""
    stored(ctx, 2)
    c = ctx.conn()
    r = c.retrieve([key(0), key(1), key(9), key(0)], SHM)
    check(r["n_found"] == 2, f"n_found {r['n_found']}, wanted 2 (the leading run)")
    check(len(r["objects"]) == 2 and [o[0] for o in r["objects"]] == [0, 1], "object records")
    check(r["xfer"] != 0 and r["pin_ms"] == 0, f"xfer {r['xfer']} pin_ms {r['pin_ms']}")
    for i, o in enumerate(r["objects"]):
        check(o[2] == CHUNK and shm_bytes(c, o) == data(i), f"shm bytes of chunk {i}")
    c.commit_retrieve(r["xfer"])
    r = c.retrieve([key(9), key(0)], SHM)
    check(r["n_found"] == 0 and r["xfer"] == 0 and not r["objects"], "a miss first: n_found 0")
    ci = ctx.conn(CAP_INLINE, strategy=INLINE)
    r = ci.retrieve([key(0), key(1)], INLINE)
    check(r["inline"] == 1 and r["xfer"] == 0 and r["n_found"] == 2, "inline retrieve head")
    check([o[3] for o in r["objects"]] == [data(0), data(1)], "inline bytes")
    ci.commit_retrieve(0)  # a valid no-op (4.6)
    check(c.lookup([key(0), key(1), key(2)]) == 2, "LOOKUP agrees with the retrieve")
    # remote_wait_ms to a serve without REMOTE: answered from its pool at once (4.3).
    p = c.call("LOOKUP", struct.pack("<II", 3, 60000) + key(0) + key(1) + key(2))
    check(p == struct.pack("<II", 2, 0), f"LOOKUP with remote_wait_ms, no tier: {p!r}")


def case_auto_release(ctx):
    """AUTO_RELEASE: pin_ms in the reply, pins held until the client's next request, which
    ends them; a COMMIT_RETRIEVE after that is -ENOENT and the connection stays open (4.7)."""
    stored(ctx, 2)
    watch = ctx.conn()
    base = watch.stats()["store_live_pins"]
    c = ctx.conn(CAP_SHM | CAP_INLINE | CAP_AUTO_RELEASE)
    t0 = time.monotonic()
    r = c.retrieve([key(0), key(1)], SHM, RETRIEVE_AUTO_RELEASE)
    check(r["n_found"] == 2 and r["xfer"] != 0, "AUTO_RELEASE retrieve found the chunks")
    check(r["pin_ms"] == 1000, f"pin_ms {r['pin_ms']}, wanted min(KVSHIM_LEASE_MS 30000, 1000)")
    check([shm_bytes(c, o) for o in r["objects"]] == [data(0), data(1)], "bytes under the pins")
    # Within pin_ms the pins are held; if this machine took longer, the server may have ended
    # them already, which is what pin_ms allows.
    pins = watch.stats()["store_live_pins"]
    if (time.monotonic() - t0) * 1000 < r["pin_ms"]:
        check(pins > base, f"store_live_pins {pins} (was {base}): no pins within pin_ms")
    c.ping()  # the next request ends them before it is served
    check(watch.stats()["store_live_pins"] == base, "pins still held after the next request")
    e = c.expect_error("COMMIT_RETRIEVE", struct.pack("<Q", r["xfer"]), "late COMMIT_RETRIEVE")
    check(e.code == ENOENT, f"COMMIT_RETRIEVE of auto-released pins: {e.code}, wanted -2")
    c.ping()  # the connection stays open (8)
    # A slow copy asks for the verdict: COMMIT_RETRIEVE naming the transfer ends it normally.
    r = c.retrieve([key(0)], SHM, RETRIEVE_AUTO_RELEASE)
    check(r["pin_ms"] > 0, "second AUTO_RELEASE retrieve")
    c.commit_retrieve(r["xfer"])
    check(watch.stats()["store_live_pins"] == base, "COMMIT_RETRIEVE did not end the pins")
    # The flag on an inline retrieve is ignored (pin_ms 0, xfer 0).
    r = c.retrieve([key(0)], INLINE, RETRIEVE_AUTO_RELEASE)
    check(r["xfer"] == 0 and r["pin_ms"] == 0 and r["objects"][0][3] == data(0), "inline flag")
    ctx.alive()


def case_no_auto_release(ctx):
    """A client without the AUTO_RELEASE bit: its flag is ignored, pins last until
    COMMIT_RETRIEVE (version-1 pins, 4.7)."""
    stored(ctx, 1)
    watch = ctx.conn()
    base = watch.stats()["store_live_pins"]
    c = ctx.conn(CAP_SHM | CAP_INLINE)
    r = c.retrieve([key(0)], SHM, RETRIEVE_AUTO_RELEASE)
    check(r["xfer"] != 0 and r["pin_ms"] == 0, f"flag honoured without the caps bit: {r}")
    c.ping()
    check(watch.stats()["store_live_pins"] == base + 1, "pins ended without COMMIT_RETRIEVE")
    c.commit_retrieve(r["xfer"])
    check(watch.stats()["store_live_pins"] == base, "COMMIT_RETRIEVE did not end the pins")
    # Another connection's transfer is -EPERM (4.6), and the connection stays open.
    r = c.retrieve([key(0)], SHM)
    e = watch.expect_error("COMMIT_RETRIEVE", struct.pack("<Q", r["xfer"]), "foreign xfer")
    check(e.code == EPERM, f"COMMIT_RETRIEVE of another connection's transfer: {e.code}")
    watch.ping()
    c.close()  # the pins end with the connection (6, leases)
    ctx.conns.remove(c)
    eventually(lambda: watch.stats()["store_live_pins"] == base, "pins outlived their connection")


def case_shm_store(ctx):
    """SHM store (6): slots in the mapped pool, COMMIT_STORE publishes them; a commit naming
    only some slots is -EINVAL on an open connection, a slot outside its transfer -EFAULT and a
    closed connection, neither publishes anything (4.5, 8); ABORT frees a write transfer (4.6);
    SKIPPED only for a client with that caps bit (4.4, 5.1)."""
    c = ctx.conn(CAP_SHM | CAP_INLINE | CAP_SKIPPED)
    xfer, outcomes, slots = c.prepare_store([key(10), key(11)], CHUNK)
    check(xfer != 0 and outcomes == [0, 0] and [s_[0] for s_ in slots] == [0, 1],
          f"PREPARE_STORE: xfer {xfer} outcomes {outcomes} slots {slots}")
    for ki, off, ln in slots:
        require(ln == CHUNK, f"slot length {ln}")
        c.pool[off:off + ln] = data(10 + ki)
    check(c.commit_shm(xfer, slots) == 2, "shm commit of two chunks")
    _, outcomes, slots2 = c.prepare_store([key(10), key(11)], CHUNK)
    check(outcomes == [1, 1] and not slots2, f"stored keys again: {outcomes} (wanted PRESENT)")
    reader = ctx.conn(CAP_INLINE, strategy=INLINE)
    r = reader.retrieve([key(10), key(11)], INLINE)
    check([o[3] for o in r["objects"]] == [data(10), data(11)], "bytes written through shm")
    # A commit naming one of two slots: -EINVAL, the transfer aborted, the connection open.
    xfer, _, slots = c.prepare_store([key(12), key(13)], CHUNK)
    e = c.expect_error("COMMIT_STORE", struct.pack("<QBBHIII", xfer, 0, 0, 0, 0, 1, 0) +
                       struct.pack("<IIQQ", slots[0][0], 0, slots[0][1], slots[0][2]),
                       "partial commit")
    check(e.code == -22, f"partial commit: {e.code}, wanted -22")
    c.ping()
    check(reader.lookup([key(12)]) == 0, "a partial commit published a chunk")
    # ABORT of a write transfer: empty reply, nothing published.
    xfer, _, slots = c.prepare_store([key(14)], CHUNK)
    check(c.call("ABORT", struct.pack("<Q", xfer)) == b"", "ABORT reply not empty")
    check(reader.lookup([key(14)]) == 0, "an aborted transfer published its chunk")
    # SKIPPED: another owner holds key 20 (BUSY), so ALL_OR_NOTHING skips key 21.
    holder = ctx.conn()
    hx, outcomes, _ = holder.prepare_store([key(20)], CHUNK)
    require(outcomes == [0], f"holder's reservation: {outcomes}")
    x, outcomes, slots = c.prepare_store([key(21), key(20)], CHUNK, mode=1)
    check(x == 0 and not slots and outcomes == [6, 2], f"ALL_OR_NOTHING with CAP_SKIPPED: {outcomes}")
    old = ctx.conn(CAP_SHM | CAP_INLINE)
    x, outcomes, slots = old.prepare_store([key(21), key(20)], CHUNK, mode=1)
    check(x == 0 and outcomes == [2, 2], f"ALL_OR_NOTHING without CAP_SKIPPED: {outcomes}")
    # A slot outside its transfer: -EFAULT, closed, nothing published (8).
    xfer, _, slots = c.prepare_store([key(15)], CHUNK)
    ki, off, ln = slots[0]
    e = c.expect_error("COMMIT_STORE", struct.pack("<QBBHIII", xfer, 0, 0, 0, 0, 1, 0) +
                       struct.pack("<IIQQ", ki, 0, off + CHUNK, ln), "slot outside the transfer")
    check(e.code == -14, f"slot outside the transfer: {e.code}, wanted -14")
    c.expect_closed("slot outside the transfer")
    check(reader.lookup([key(15)]) == 0, "a refused commit published its chunk")
    # The holder's connection closes: its reservation ends, key 20 is free again (6, leases).
    holder.close()
    ctx.conns.remove(holder)
    got = []

    def reserved():
        x, outcomes, _ = old.prepare_store([key(20)], CHUNK)
        got[:] = [x, outcomes]
        return outcomes == [0]
    eventually(reserved, f"key 20 still refused after its holder closed: {got}")
    old.call("ABORT", struct.pack("<Q", got[0]))
    ctx.alive()


def case_export_report(ctx):
    """EXPORT_TENSORS of a range serve never allocated: no descriptors (4.10); REPORT_BAD with
    bytes that do not match what the server holds drops nothing (4.11)."""
    stored(ctx, 1)
    c = ctx.conn()
    check(c.hello["caps"] & CAP_REPORT_BAD, "serve does not offer REPORT_BAD")
    p = c.call("EXPORT_TENSORS", struct.pack("<QQ", 0x10000, 4096))
    check(p == struct.pack("<II", 0, 0), f"EXPORT_TENSORS of nothing: {p!r}")
    p = c.call("REPORT_BAD", key(0) + struct.pack("<QQ", CHUNK, 0x1234))
    check(p == struct.pack("<II", 0, 0), f"REPORT_BAD with another checksum: {p!r}")
    p = c.call("REPORT_BAD", key(99) + struct.pack("<QQ", CHUNK, 0x1234))
    check(p == struct.pack("<II", 0, 0), f"REPORT_BAD of an unknown key: {p!r}")
    check(c.lookup([key(0)]) == 1, "a REPORT_BAD that did not match dropped the object")
    st = c.stats()
    check(st["coord_bad_reports"] == 2 and st["coord_bad_dropped"] == 0,
          f"coord_bad_reports {st['coord_bad_reports']} coord_bad_dropped {st['coord_bad_dropped']}")
    # address + length overflowing u64 is malformed (4.10): -EBADMSG, closed.
    e = c.expect_error("EXPORT_TENSORS", struct.pack("<QQ", 2**64 - 16, 4096), "overflowing range")
    check(e.code == EBADMSG, f"EXPORT_TENSORS overflow: {e.code}")
    c.expect_closed("EXPORT_TENSORS overflow")


def case_stats(ctx):
    """STATS (4.8): INFO text with CRLF lines under '# kvshim stats v1', JSON with the same
    names; another format is malformed."""
    c = ctx.conn()
    p = c.call("STATS", b"\0")
    text = p[4:].decode()
    check(text.startswith("# kvshim stats v1\r\n") and text.endswith("\r\n"), "INFO framing")
    names = [ln.split(":")[0] for ln in text.split("\r\n")[1:-1]]
    check(all(re.fullmatch(r"[a-z0-9_]+:\d+", ln) for ln in text.split("\r\n")[1:-1]),
          "INFO lines are name:decimal")
    p = c.call("STATS", b"\1")
    obj = json.loads(p[4:].decode())
    check(list(obj) == ["kvshim_stats_version"] + names and obj["kvshim_stats_version"] == 1,
          "JSON members vs INFO names")
    e = c.expect_error("STATS", b"\2", "STATS format 2")
    check(e.code == EBADMSG, f"STATS format 2: {e.code}")
    c.expect_closed("STATS format 2")


def case_split(ctx):
    """Split messages (2.1): a LOOKUP sent as two frames is one message; a long reply comes in
    frames of the client's max_frame; a continuation with another opcode is -EPROTO."""
    stored(ctx, 2)
    c = ctx.conn()
    body = struct.pack("<II", 2, 0) + key(0) + key(1)
    c.rid += 1
    c.send_frame(OP["LOOKUP"], c.rid, body[:20], flags=F_MORE)
    c.send_frame(OP["LOOKUP"], c.rid, body[20:])
    _, rid, p = c.recv_msg()
    check(rid == c.rid and struct.unpack("<II", p) == (2, 0), f"split LOOKUP: {p!r}")
    # A reply longer than the client's max_frame (65536) comes in frames of exactly that size
    # and a last, shorter or full one.
    big = bytes(i * 13 & 0xFF for i in range(200000))
    committed, _ = c.store_inline([key(30)], [big])
    require(committed == 1, "inline store of 200000 bytes")
    ci = ctx.conn(CAP_INLINE, strategy=INLINE)
    r = ci.retrieve([key(30)], INLINE)
    check(r["objects"][0][3] == big, "a split inline reply's bytes")
    check(len(ci.frames) > 1 and all(n == MIN_MAX_FRAME for n in ci.frames[:-1]) and
          0 < ci.frames[-1] <= MIN_MAX_FRAME, f"reply frames {ci.frames}")
    # A continuation frame that breaks the rule (another opcode): -EPROTO, closed.
    c.rid += 1
    c.send_frame(OP["LOOKUP"], c.rid, body[:20], flags=F_MORE)
    c.send_frame(OP["PING"], c.rid, struct.pack("<QII", 1, 0, 0))
    e = c.refused("a broken continuation")
    check(e.code == EPROTO, f"broken continuation: {e.code}, wanted {EPROTO}")
    c.expect_closed("broken continuation")
    ctx.alive()


def case_malformed(ctx):
    """Bad input: malformed frames and payloads get ERROR and a closed connection, requests
    that cannot be served get ERROR on an open one; the stored chunks are intact (7, 8)."""
    stored(ctx, 2)
    # Trailing byte after a LOOKUP's keys: -EBADMSG with the request id, then closed.
    c = ctx.conn()
    e = c.expect_error("LOOKUP", struct.pack("<II", 1, 0) + key(0) + b"\0", "trailing byte")
    check(e.code == EBADMSG, f"trailing byte: {e.code}")
    c.expect_closed("trailing byte")
    # A reserved PREPARE_RETRIEVE flag bit: -EBADMSG.
    c = ctx.conn(CAP_SHM | CAP_INLINE | CAP_AUTO_RELEASE)
    e = c.expect_error("PREPARE_RETRIEVE", struct.pack("<BBHI", SHM, 2, 0, 1) + key(0),
                       "PREPARE_RETRIEVE flag bit 1")
    check(e.code == EBADMSG, f"flag bit 1: {e.code}")
    c.expect_closed("flag bit 1")
    # Bad magic: ERROR with request id 0 (the id cannot be trusted), closed.
    c = ctx.conn()
    c.rid += 1
    c.send_frame(OP["PING"], c.rid, b"", magic=0x12345678)
    e = c.refused("bad magic")
    check(e.code == EBADMSG and e.rid == 0, f"bad magic: {e.code} for request {e.rid}")
    c.expect_closed("bad magic")
    # Unknown opcode 12 and version 2: -EOPNOTSUPP, -EPROTONOSUPPORT, with the id.
    c = ctx.conn()
    e = c.expect_error(12, b"", "opcode 12")
    check(e.code == EOPNOTSUPP, f"opcode 12: {e.code}")
    c.expect_closed("opcode 12")
    c = ctx.conn()
    c.rid += 1
    c.send_frame(OP["PING"], c.rid, struct.pack("<QII", 1, 0, 0), version=2)
    e = c.refused("version 2")
    check(e.code == -93 and e.rid == c.rid, f"version 2: {e.code} for request {e.rid}")
    c.expect_closed("version 2")
    # Request id 0 on a request: -EBADMSG.
    c = ctx.conn()
    c.send_frame(OP["PING"], 0, struct.pack("<QII", 1, 0, 0))
    e = c.refused("request id 0")
    check(e.code == EBADMSG, f"request id 0: {e.code}")
    c.expect_closed("request id 0")
    # A request before HELLO: -EPROTO.
    c = ctx.conn(hello=False)
    e = c.expect_error("PING", struct.pack("<QII", 1, 0, 0), "PING before HELLO")
    check(e.code == EPROTO, f"before HELLO: {e.code}")
    c.expect_closed("before HELLO")
    # A frame marked REPLY from the client: -EPROTO.
    c = ctx.conn()
    c.rid += 1
    c.send_frame(OP["PING"], c.rid, struct.pack("<QII", 1, 0, 0), flags=F_REPLY)
    e = c.refused("REPLY frame from a client")
    check(e.code == EPROTO and e.rid == c.rid, f"REPLY from a client: {e.code}")
    c.expect_closed("REPLY from a client")
    # Before the handshake a frame is at most 65536 bytes: -EMSGSIZE, closed.
    c = ctx.conn(hello=False)
    c.rid += 1
    c.s.sendall(HDR.pack(MAGIC, 1, OP["HELLO"], 0, c.rid, MIN_MAX_FRAME + 1))
    e = c.refused("an oversized HELLO")
    check(e.code == -90 and e.rid == c.rid, f"oversized HELLO: {e.code} for {e.rid}")
    c.expect_closed("oversized HELLO")
    # shm on a connection that negotiated inline: -EOPNOTSUPP, and the connection stays open.
    c = ctx.conn(CAP_INLINE, strategy=INLINE)
    e = c.expect_error("PREPARE_RETRIEVE", struct.pack("<BBHI", SHM, 0, 0, 1) + key(0),
                       "shm retrieve on an inline connection")
    check(e.code == EOPNOTSUPP, f"shm on inline: {e.code}")
    c.ping()
    # Well-formed but unserveable: an unknown transfer is -ENOENT, the connection stays open.
    c = ctx.conn()
    e = c.expect_error("COMMIT_RETRIEVE", struct.pack("<Q", 0xDEAD), "unknown transfer")
    check(e.code == ENOENT, f"unknown transfer: {e.code}")
    e = c.expect_error("ABORT", struct.pack("<Q", 0xDEAD), "unknown write transfer")
    check(e.code == ENOENT, f"ABORT of an unknown transfer: {e.code}")
    c.ping()
    # An inline commit entry whose length disagrees with the layout: -EINVAL, still open.
    head = struct.pack("<QBBHIII", 0, 1, 0, 0, 0, 1, 0)
    e = c.expect_error("COMMIT_STORE", head + layout_u8(8) + key(5) + struct.pack("<Q", 4) +
                       b"abcd", "entry length vs layout")
    check(e.code == -22, f"entry length vs layout: {e.code}")
    c.ping()
    # Nothing lost: the chunks are all there, byte for byte, for a new connection.
    ctx.alive()
    n = ctx.conn(CAP_INLINE, strategy=INLINE)
    r = n.retrieve([key(0), key(1), key(5)], INLINE)
    check(r["n_found"] == 2 and [o[3] for o in r["objects"]] == [data(0), data(1)],
          "stored chunks after the bad input")
    check(n.stats()["coord_bad_frames"] == 9, "coord_bad_frames: the 9 closed connections, not the refusals")


if __name__ == "__main__":
    ap = harness.parser(__doc__, "--cli")
    sys.exit(harness.main(harness.cases(globals()), ap, Ctx))
