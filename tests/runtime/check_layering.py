#!/usr/bin/env python3
"""The cache facade's include rule (design §3.7): no file under shims/ includes core's store,
pool or peer client, calls them, or reaches the runtime's store, pool, peers, one-copy or
keep-behind directly; the tiers are runtime/cache.h's. (shims/cuda's pool use for pinned host
memory is memory, not a cache tier: the pool rules do not apply under shims/cuda.)

core/'s layers include one way (design §2): core/ (the base), core/memory/, core/wire/,
core/tiers/, each including only headers of its own layer and of those before it.

The library's layers include one way too (design §2): preload/ -> shims/ -> runtime/ -> core/,
a file including only headers of its own layer and of those below it. One exception: runtime/
reads the shims' rows (shims/families.h and each family's <name>_rows.h, which runtime/rows.h
composes), and those headers include nothing but row headers (*_hooks.h, *_rows.h).

Two rules of the library as a whole (core/, runtime/, shims/, preload/; design §3.8, §19):
discovery runs only on the runtime's watcher (no file but runtime/discovery.c calls
kvs_peers_discover or kvs_peers_pin_cache outside core/), and threads are started and their
priority changed only through core/prim (no pthread_create, setpriority, getpriority,
sched_setscheduler or SCHED_IDLE in code outside core/prim.c; comments may name them).

    check_layering.py <source root>

Prints every offending line and exits 1 when there is one; exits 2 when it finds no shim."""
import pathlib
import re
import sys

RULES = [
    (re.compile(r'#\s*include\s*["<](store|peer)\.h[">]'),
     "includes core/memory/store.h or core/wire/peer.h"),
    (re.compile(r'\bkvs_(store|peers)_\w+\s*\('), "calls the store or the peer client"),
    (re.compile(r'\bkvs__runtime_(cache_peer|keep|keep_release)\s*\('),
     "runs one-copy mode or keep-behind itself"),
    (re.compile(r'->\s*(store|peers)\b'), "reaches the runtime's store or peers"),
]
DISCOVERY_RULES = [  # runtime/, shims/, preload/ but runtime/discovery.c
    (re.compile(r'\bkvs_peers_(discover|pin_cache)\s*\('),
     "runs discovery or adopts a cache peer, past runtime/discovery.h"),
]
THREAD_RULES = [  # the library but core/prim.c
    (re.compile(r'\bpthread_create\s*\('), "starts a thread past kvs__prim_thread_start"),
    (re.compile(r'\b(setpriority|getpriority|sched_setscheduler)\s*\(|\bSCHED_IDLE\b'),
     "changes a thread's priority past core/prim.h"),
]
POOL_RULES = [  # everywhere but shims/cuda
    (re.compile(r'#\s*include\s*["<]pool\.h[">]'), "includes core/memory/pool.h"),
    (re.compile(r'\bkvs_pool_\w+\s*\('), "calls the pool"),
    (re.compile(r'->\s*pool\b'), "reaches the runtime's pool"),
]


def sources(root, *dirs):
    return sorted(p for d in dirs for p in (root / d).rglob("*") if p.suffix in (".c", ".h"))


def scan(root, files, rules_of, text_of, why_suffix):
    """Print every line of files that a rule of rules_of(path) matches in text_of(line)."""
    bad = 0
    for f in files:
        rules = rules_of(f)
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            hit = next((why for rule, why in rules if rule.search(text_of(line))), None)
            if hit:
                print(f"{f.relative_to(root).as_posix()}:{n}: {hit}{why_suffix}: {line.strip()}")
                bad += 1
    return bad


CORE_LAYERS = ("", "memory", "wire", "tiers")  # core/<layer>/, in include order
LIB_LAYERS = ("core", "runtime", "shims", "preload")  # the library's layers, in include order
INCLUDE = re.compile(r'\s*#\s*include\s*"([^"]+)"')


def rows_only(name):
    """The shims' headers runtime/ may read: the families' list and each family's rows."""
    return name == "families.h" or name.endswith("_rows.h")


def lib_layers(root):
    """Print every #include in the library of a header of a layer above the file's own (the
    runtime's reading the shims' rows excepted, see above), and every include in those row
    headers of more than rows; the count."""
    where = {}  # header name -> its layer
    for i, layer in enumerate(LIB_LAYERS):
        for h in (root / layer).rglob("*.h"):
            where.setdefault(h.name, i)
    bad = 0
    for f in sources(root, *LIB_LAYERS):
        rel = f.relative_to(root).as_posix()
        mine = LIB_LAYERS.index(rel.split("/")[0])
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc, name = m.group(1), m.group(1).rsplit("/", 1)[-1]
            if "/" in inc:  # by its path from the including file
                try:
                    top = (f.parent / inc).resolve().relative_to(root.resolve()).parts[0]
                except ValueError:
                    continue
                layer = LIB_LAYERS.index(top) if top in LIB_LAYERS else None
            else:
                layer = where.get(inc)
            if layer is not None and layer > mine and not (
                    LIB_LAYERS[mine] == "runtime" and LIB_LAYERS[layer] == "shims" and
                    rows_only(name)):
                print(f"{rel}:{n}: {LIB_LAYERS[mine]}/ includes a header of "
                      f"{LIB_LAYERS[layer]}/: {line.strip()}")
                bad += 1
            if rel.startswith("shims/") and rows_only(f.name) and not (
                    rows_only(name) or name.endswith("_hooks.h")):
                print(f"{rel}:{n}: a row header includes more than rows: {line.strip()}")
                bad += 1
    return bad


def core_layers(root):
    """Print every #include in core/ of a header of a later layer; the count."""
    layer_of = {h.name: CORE_LAYERS.index(h.parent.name if h.parent.name != "core" else "")
                for h in (root / "core").rglob("*.h")}
    bad = 0
    for f in sources(root, "core"):
        mine = CORE_LAYERS.index(f.parent.name if f.parent.name != "core" else "")
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
            if m and layer_of.get(m.group(1), 0) > mine:
                print(f"{f.relative_to(root).as_posix()}:{n}: core/{CORE_LAYERS[mine] or '.'} "
                      f"includes a header of core/{CORE_LAYERS[layer_of[m.group(1)]]}: "
                      f"{line.strip()}")
                bad += 1
    return bad


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(argv[1])
    files = sources(root, "shims")
    if not files:
        print(f"check_layering: no file under {root / 'shims'}", file=sys.stderr)
        return 2
    bad = scan(root, files, lambda f: RULES if f.parent.name == "cuda" else RULES + POOL_RULES,
               lambda line: line, ", past runtime/cache.h")
    if bad:
        print(f"check_layering: {bad} line(s) in shims/ bypass the cache facade", file=sys.stderr)
        return 1

    def lib_rules(f):
        rel = f.relative_to(root).as_posix()
        rules = [] if rel == "core/prim.c" else list(THREAD_RULES)
        if not rel.startswith("core/") and rel != "runtime/discovery.c":
            rules += DISCOVERY_RULES
        return rules

    bad = core_layers(root)
    if bad:
        print(f"check_layering: {bad} include(s) in core/ run against its layers", file=sys.stderr)
        return 1
    bad = lib_layers(root)
    if bad:
        print(f"check_layering: {bad} include(s) run against preload -> shims -> runtime -> core",
              file=sys.stderr)
        return 1

    lib = sources(root, "core", "runtime", "shims", "preload")
    bad = scan(root, lib, lib_rules, code_of, "")
    if bad:
        print(f"check_layering: {bad} line(s) break the discovery or thread rule", file=sys.stderr)
        return 1
    print(f"check_layering: {len(files)} files under shims/ reach the tiers only through "
          f"runtime/cache.h; core/'s layers and the library's include one way (runtime/ reading "
          f"only the shims' rows); of {len(lib)} library files only "
          "runtime/discovery.c discovers and only core/prim.c starts threads or changes "
          "priorities")
    return 0


def code_of(line):
    """The line without its comments (a line inside a block comment starts with '*')."""
    s = line.strip()
    if s.startswith(("*", "/*", "//")):
        return ""
    return re.sub(r"/\*.*?(\*/|$)|//.*$", "", line)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
