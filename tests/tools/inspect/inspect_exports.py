#!/usr/bin/env python3
"""inspect_exports: the hooks `kvshim inspect` checks are exactly the hooks libkvshim.so exports.

Three lists must agree (design §2, style rule 7 and 14):
  1. what `kvshim inspect LIB --json` reports, family by family (its lists are generated from
     shims/*/*_hooks.h);
  2. `nm -D --defined-only LIB`, the library's real dynamic symbol table;
  3. preload/exports.txt, the hand-written oracle (so a change to the hook rows that nobody
     meant shows up here).
dlsym is exported too but is no hook family's: it is in 2 and 3 only.

usage: inspect_exports.py --kvshim KVSHIM --lib LIBKVSHIM --exports EXPORTS_TXT [--nm NM]
"""
import argparse
import json
import subprocess
import sys

NOT_A_HOOK = {"dlsym"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvshim", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--exports", required=True)
    ap.add_argument("--nm", default="nm")
    a = ap.parse_args()
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    p = subprocess.run([a.kvshim, "inspect", a.lib, "--json"], capture_output=True, text=True,
                       timeout=120)
    check(p.returncode == 0, f"kvshim inspect {a.lib} --json exits 0 ({p.returncode}): "
          f"{p.stderr.strip()}")
    if p.returncode != 0:
        return 1
    doc = json.loads(p.stdout)
    inspect = {}
    for fam in doc["families"]:
        for s in fam["symbols"]:
            check(s["name"] not in inspect, f"{s['name']} is in one family only")
            inspect[s["name"]] = fam["family"]
        check(fam["present"] == fam["hooks"] == len(fam["symbols"]),
              f"{fam['family']}: every hook inspect checks is defined in the library "
              f"({fam['present']}/{fam['hooks']})")

    p = subprocess.run([a.nm, "-D", "--defined-only", a.lib], capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 0, f"nm -D --defined-only exits 0 ({p.returncode})")
    nm = {line.split()[-1].split("@")[0] for line in p.stdout.splitlines() if line.strip()}

    with open(a.exports) as f:
        oracle = {line.strip() for line in f if line.strip() and not line.startswith("#")}

    want = set(inspect)
    for name, other in (("nm -D --defined-only", nm), ("preload/exports.txt", oracle)):
        hooks = other - NOT_A_HOOK
        check(hooks == want, f"inspect's hooks == {name} (inspect only: "
              f"{sorted(want - hooks)}, {name} only: {sorted(hooks - want)})")
    check(NOT_A_HOOK <= nm and NOT_A_HOOK <= oracle, "dlsym is exported and in the oracle")
    print(f"{len(want)} hooks in {len(doc['families'])} families")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
