#!/usr/bin/env python3
"""ctest driver for test_redis_zcopy (core/tiers/redis arguments given in parts, and replies received
into the caller's buffer) against a real redis-server that servers.py starts on a free loopback
port and stops.

usage: test_redis_zcopy.py PROGRAM

Then PROGRAM URL MODE against a listener that breaks a GET reply inside the bulk string a
sink receives (MODE reset, stall, badend): the command fails with the right errno.
"""
import os
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import servers  # noqa: E402

# A GET reply broken inside the bulk string a sink receives, after +PONG for the handle's PING:
# mode -> (bytes sent for the GET, close after them)
BROKEN = {
    "reset": (b"$300000\r\n" + b"h" * 128 + b"p" * 1000, True),   # connection closed mid-body
    "stall": (b"$300000\r\n" + b"h" * 128 + b"p" * 1000, False),  # the rest never comes
    "badend": (b"$130\r\n" + b"h" * 130 + b"XY", False),          # no "\r\n" after the bytes
}


def broken_server(mode):
    """One-connection listener answering PING, then the broken GET reply of `mode`."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    body, close = BROKEN[mode]

    def serve():
        c, _ = ls.accept()
        with c:
            for answer in (b"+PONG\r\n", body):
                if not c.recv(65536):
                    return
                c.sendall(answer)
            if not close:
                while c.recv(65536):
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return ls


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with servers.Standalone() as s:
        rc = subprocess.run([sys.argv[1], s.url], timeout=300).returncode
        if rc == 0:
            # the server holds exactly what was sent: 128 + 9 MiB bytes
            n = s.cli("STRLEN", f"zc:{9 << 20}")
            if n != str(128 + (9 << 20)):
                print(f"FAIL server-side STRLEN {n}")
                rc = 1
    for mode in BROKEN:
        ls = broken_server(mode)
        url = f"redis://127.0.0.1:{ls.getsockname()[1]}"
        r = subprocess.run([sys.argv[1], url, mode], timeout=60).returncode
        ls.close()
        rc = rc or r
    return rc


if __name__ == "__main__":
    sys.exit(main())
