#!/usr/bin/env python3
"""ctest driver for test_redis_zcopy (core/redis arguments given in parts, and replies received
into the caller's buffer) against a real redis-server that servers.py starts on a free loopback
port and stops.

usage: test_redis_zcopy.py PROGRAM
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import servers  # noqa: E402


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
    return rc


if __name__ == "__main__":
    sys.exit(main())
