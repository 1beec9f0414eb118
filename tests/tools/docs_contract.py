#!/usr/bin/env python3
"""README.md, docs/reference.md and docs/protocol.md against the lists they document, which
are written once in the code (X-macros) and reach users through the kvshim binary.

  options   docs/reference.md's configuration table against `kvshim --help`
            (runtime/rows.h, every layer's rows): the same variables, defaults, and every
            size/integer range stated and right; every KVSHIM_* name the docs mention exists; KVSHIM_HOOKS's
            choices are shims/families.h's
  stats     docs/reference.md's "Every counter" table against `kvshim stats --prometheus`,
            --json and the INFO text of a running `kvshim serve` (runtime/rows.h): names,
            order, kind, meaning; every counter named elsewhere in the docs exists
  protocol  docs/protocol.md's opcode, error code and caps tables against core/wire/proto.h
            (KVS_PROTO_OPCODES, KVS_PROTO_ERRORS, KVS_PROTO_CAP_*); the message schema
            (KVS_PROTO_REQUESTS, KVS_PROTO_FIELDS_*): every request opcode has a handler row,
            and each flat payload's size formula and field order are those of section 4
  cli       README's `kvshim` command table and exit codes against `kvshim --help` and the
            commands' exit codes for help and usage errors
  design    every "design §N" / "design §N.M" cited anywhere in the tree (code, scripts, docs)
            names a section of docs/design.md, and that file has its sections numbered in order

usage: docs_contract.py CASE --cli build/tools/kvshim --source .   (--list: the cases)
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
from harness import check, require  # noqa: E402


# The documents whose KVSHIM_* names and counter names must exist in the code.
DOCS = ("README.md", "docs/reference.md", "docs/demo.md", "docs/protocol.md", "docs/design.md")


def read(ctx, rel):
    with open(os.path.join(ctx.args.source, rel)) as f:
        return f.read()


def section(text, title):
    """The lines of a Markdown section (from its heading to the next heading of its level)."""
    m = re.search(r"^(#+) " + re.escape(title) + r"\s*$", text, re.M)
    require(m, f"no section {title!r}")
    level = len(m.group(1))
    end = re.compile(r"^#{1,%d} " % level, re.M).search(text, m.end())
    return text[m.end():end.start() if end else len(text)]


def table(text):
    """The rows of the first Markdown table in text, as lists of cells (header and rule
    skipped)."""
    rows, started = [], False
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if started and not set("".join(cells)) <= set("-: "):
                rows.append(cells)
            started = True
        elif started:
            break
    require(rows, "empty table")
    return rows


def run_cli(ctx, *argv, env=None):
    return subprocess.run([ctx.kvshim, *argv], capture_output=True, text=True, timeout=60,
                          env=env or ctx.env(preload=False))


# ---- options -------------------------------------------------------------------------------

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MS = {"ms": 1, "s": 1000, "min": 60000, "h": 3600000, "d": 86400000, "year": 31536000000}


def size_value(s):
    m = re.fullmatch(r"(\d+)([KMGT]?)", s)
    return int(m.group(1)) * UNITS[m.group(2)] if m else None


def range_in(meaning, kind):
    """The (lo, hi) a README meaning states as 'A–B' (en dash): sizes 1M–1T, integers 1–64,
    durations '10 ms – 24 h'."""
    for a, b in re.findall(r"(\d+(?:\s?[A-Za-z]+)?)\s?–\s?(\d+(?:\s?[A-Za-z]+)?)", meaning):
        if kind == "size":
            lo, hi = size_value(a), size_value(b)
        else:
            def num(x):
                m = re.fullmatch(r"(\d+)\s?([a-z]*)", x)
                if not m or (m.group(2) and m.group(2) not in MS):
                    return None
                return int(m.group(1)) * (MS[m.group(2)] if m.group(2) else 1)
            lo, hi = num(a), num(b)
        if lo is not None and hi is not None:
            return lo, hi
    return None


def help_variables(ctx):
    """{name: (kind, lo, hi, default, help)} from `kvshim --help`."""
    p = run_cli(ctx, "--help")
    require(p.returncode == 0, f"kvshim --help: exit {p.returncode}")
    out = {}
    for line in p.stdout.splitlines():
        m = re.match(r"  (KVSHIM_\w+) \(--([\w-]+)\) (.*?), default (.*?): (.*)$", line)
        if not m:
            continue
        env, flag, kind, default, text = m.groups()
        check(flag == env[len("KVSHIM_"):].lower().replace("_", "-"), f"{env}: flag --{flag}")
        lo = hi = None
        r = re.match(r"(size|integer) (\d+[KMGT]?)\.\.(\d+[KMGT]?)", kind)
        if r:
            lo, hi = size_value(r.group(2)), size_value(r.group(3))
            kind = r.group(1)
        elif kind.startswith("integer"):
            kind = "integer"
        out[env] = (kind, lo, hi, "" if default == "(empty)" else default, text)
    require(len(out) > 20, f"kvshim --help lists {len(out)} variables:\n{p.stdout}")
    return out


def case_options(ctx):
    code = help_variables(ctx)
    # KVSHIM_HOOKS's choices are the hook families of shims/families.h, in their order (a
    # family's bit is its row's position, asserted in preload/preload.c).
    families = re.findall(r"\n  X\([A-Z_]+, ([a-z_]+), \"", read(ctx, "shims/families.h"))
    check(code["KVSHIM_HOOKS"][0].endswith(" " + "|".join(families)),
          f"KVSHIM_HOOKS choices {code['KVSHIM_HOOKS'][0]!r} vs shims/families.h {families}")
    doc = {}
    for cells in table(section(read(ctx, "docs/reference.md"), "Configuration")):
        names = [n.strip() for n in cells[0].split("/")]
        defaults = [d.strip() for d in cells[1].split("/")]
        for i, n in enumerate(names):
            doc[n] = (defaults[i] if len(defaults) == len(names) else cells[1], cells[2])
    check(sorted(doc) == sorted(code),
          f"reference options table vs kvshim --help: only in the docs "
          f"{sorted(set(doc) - set(code))}, "
          f"only in the code {sorted(set(code) - set(doc))}")
    for env, (kind, lo, hi, default, text) in code.items():
        if env not in doc:
            continue
        d, meaning = doc[env]
        check(meaning, f"{env}: no meaning in README")
        if default:
            check(d == default, f"{env}: README default {d!r}, code {default!r}")
        else:  # an empty default is "(empty)", or what the help says the empty value means
            check(d == "(empty)" or f"(default {d})" in text,
                  f"{env}: README default {d!r}, code empty ({text!r})")
        if kind in ("size", "integer"):
            r = range_in(meaning, kind)
            check(r == (lo, hi), f"{env}: README states the range {r}, the code {lo}..{hi}")
    # Every KVSHIM_* name README mentions is a variable, or one of the scripts' own.
    scripts = {"KVSHIM_FUZZ_SECONDS", "KVSHIM_SOAK_MINUTES", "KVSHIM_TEST_JOBS",
               "KVSHIM_CUDA_INCLUDE_DIR", "KVSHIM_BUILD_TESTS", "KVSHIM_BUILD_BENCH", "KVSHIM_DEBUG",
               "KVSHIM_SANITIZE", "KVSHIM_WERROR", "KVSHIM_FUZZ"}
    for doc_name in DOCS:
        for n in sorted(set(re.findall(r"KVSHIM_[A-Z0-9_]*[A-Z0-9]", read(ctx, doc_name)))):
            check(n in code or n in scripts, f"{doc_name} names {n}, which is no variable")


# ---- stats ---------------------------------------------------------------------------------

def case_stats(ctx):
    doc = [(c[0].strip("`"), c[1], c[2])
           for c in table(section(read(ctx, "docs/reference.md"), "Every counter"))]
    s = ctx.serve()
    prom = run_cli(ctx, "stats", "--prometheus")
    require(prom.returncode == 0, f"kvshim stats --prometheus: exit {prom.returncode} {prom.stderr}")
    code, seen = [], set()
    for line in prom.stdout.splitlines():
        m = re.match(r"# HELP kvshim_(\w+) (.*)$", line)
        if m:
            code.append([m.group(1), None, m.group(2)])
        m = re.match(r"# TYPE kvshim_(\w+) (\w+)$", line)
        if m:
            check(code and code[-1][0] == m.group(1), f"TYPE without HELP: {line}")
            code[-1][1] = m.group(2)
        m = re.match(r"kvshim_(\w+)\{instance=\"[0-9a-f]{16}\",pid=\"\d+\",role=\"cache\"\} \d+$",
                     line)
        if m:
            seen.add(m.group(1))
    names = []
    for name, kind, text in code:
        check(kind in ("counter", "gauge"), f"{name}: TYPE {kind}")
        check(name.endswith("_total") == (kind == "counter"), f"{name}: a {kind}'s name")
        names.append(name[:-len("_total")] if kind == "counter" else name)
        check(name in seen, f"{name}: no sample for the serve")
    want = [(n, k, t) for n, (_, k, t) in zip(names, code)]
    check([d[0] for d in doc] == names,
          f"reference 'Every counter' names vs kvshim stats: only in the docs "
          f"{[d[0] for d in doc if d[0] not in names]}, only in the code "
          f"{[n for n in names if n not in [d[0] for d in doc]]} (or another order)")
    for d, w in zip(doc, want):
        check(d == w, f"reference row {d} vs the code's {w}")
    js = run_cli(ctx, "stats", "--json")
    require(js.returncode == 0, f"kvshim stats --json: exit {js.returncode}")
    obj = json.loads(js.stdout)
    require(isinstance(obj, list) and len(obj) == 1, f"stats --json of one peer: {js.stdout[:200]}")
    check(list(obj[0]) == ["kvshim_stats_version"] + names and obj[0]["kvshim_stats_version"] == 1,
          f"stats --json members: {list(obj[0])[:5]}...")
    inst = s.banner.split("instance ")[1].split(",")[0]
    one = run_cli(ctx, "stats", inst[:6], "--json")
    check(one.returncode == 0 and isinstance(json.loads(one.stdout), dict),
          f"kvshim stats PEER --json: one object, exit {one.returncode}: {one.stdout[:80]!r}")
    none = run_cli(ctx, "stats", "ffffffffffffffff0")
    check(none.returncode == 1, f"kvshim stats of no matching peer: exit {none.returncode}")
    info = run_cli(ctx, "stats")
    lines = [ln for ln in info.stdout.splitlines() if ln and not ln.startswith("#")]
    check([ln.split(":")[0] for ln in lines] == names, "INFO text names vs the table")
    check("# kvshim stats v1" in info.stdout, "INFO text without '# kvshim stats v1'")
    # Counters named anywhere else in the docs exist.
    prefixes = ("store_", "pool_", "host_arena_", "peer_", "push_", "coord_", "hook_", "cuda_",
                "llama_prefix_", "remote_", "cache_peer_")
    # (test and program names, wire fields: not counters)
    not_stats = {"remote_wait_ms", "peer_caps", "cuda_preload_fork", "cuda_pinpeer",
                 "cuda_hostalloc_bench", "cuda_ipc_reader", "coord_faults", "store_chunk",
                 "cuda_preload_test", "pool_size", "pool_segment_size", "pool_arena_size",
                 "pool_arena_used", "remote_roundtrip"}
    gpu_prefixes = ("host_arena_", "cache_peer_", "cuda_device_", "cuda_ipc_opens")
    for doc_name in DOCS + ("docs/gpu.md",):
        path = os.path.join(ctx.args.source, doc_name)
        if not os.path.exists(path):
            continue
        for n in sorted(set(re.findall(r"`([a-z0-9_]+)`", read(ctx, doc_name)))):
            if n.startswith(gpu_prefixes if doc_name == "docs/gpu.md" else prefixes) and \
                    n not in not_stats:
                check(n in names, f"{doc_name} names `{n}`, which is no counter")
    s.terminate()


# ---- protocol ------------------------------------------------------------------------------

def case_protocol(ctx):
    doc = read(ctx, "docs/protocol.md")
    hdr = read(ctx, "core/wire/proto.h")
    ops = re.findall(r"X\((\w+), (\d+), \"\w+\"\)", hdr[hdr.index("KVS_PROTO_OPCODES(X)"):])
    doc_ops = [(c[1], c[0]) for c in table(section(doc, "3. Opcodes"))]
    check(sorted((n, int(v)) for n, v in ops) == sorted((n, int(v)) for n, v in doc_ops),
          f"opcodes: code {ops}, docs {doc_ops}")
    errs = re.findall(r"X\((E\w+), (-\d+), \"", hdr[hdr.index("KVS_PROTO_ERRORS(X)"):])
    doc_errs = [(c[1], c[0]) for c in table(section(doc, "7. Error codes"))]
    check(sorted((n, int(v)) for n, v in errs) == sorted((n, int(v)) for n, v in doc_errs),
          f"error codes: code {errs}, docs {doc_errs}")
    caps = {n: int(v, 16).bit_length() - 1
            for n, v in re.findall(r"#define KVS_PROTO_CAP_(\w+) (0x[0-9a-f]+)u", hdr)}
    hello = section(doc, "4.1 HELLO (request and reply; `56 + group_len` bytes)")
    row = [c for c in table(hello) if c[3] == "caps"][0][4]
    doc_caps = {n: int(b) for b, n in re.findall(r"bit (\d+) `(\w+)`", row)}
    check(doc_caps == caps, f"HELLO caps: code {caps}, docs {doc_caps}")
    added = {c[1].strip("`"): int(c[0]) for c in table(section(doc, "5.1 Additions to version 1"))}
    check(added == {n: b for n, b in caps.items() if b >= 2},
          f"5.1 additions {added} vs the caps bits above SHM and INLINE {caps}")
    flags = re.findall(r"#define KVS_PROTO_RETRIEVE_(\w+) (0x[0-9a-f]+)u", hdr)
    pr = [c for c in table(section(doc, "4.7 PREPARE_RETRIEVE")) if c[3] == "flags"][0][4]
    for n, v in flags:
        check(f"bit {int(v, 16).bit_length() - 1} `{n}`" in pr, f"PREPARE_RETRIEVE flag {n}")
    schema(doc, hdr, ops)


# The flat payloads of core/wire/proto.h: where section 4 describes each (subsection, the words
# before its byte count, or None for the subsection's heading) and the byte size of the
# elements of its arrays (the structs' element types: key 16, slot 24, bytes 1).
PAYLOAD_DOCS = {
    "error": ("4.2", None), "lookup": ("4.3", "Request"), "lookup_reply": ("4.3", "Reply"),
    "prepare_store": ("4.4", "Request"), "prepare_store_reply": ("4.4", "Reply"),
    "commit_store_reply": ("4.5", "Reply"), "xfer": ("4.6", "Request"),
    "prepare_retrieve": ("4.7", "Request"), "stats": ("4.8", "Request"),
    "text": ("4.8", "Reply"), "ping": ("4.9", "Request and reply"),
    "export": ("4.10", "Request"), "report": ("4.11", "Request"),
    "report_reply": ("4.11", "Reply"), "watch": ("4.12", "Request"),
    "watch_reply": ("4.12", "Reply"),
}
ELEMENT_BYTES = {"keys": 16, "slots": 24, "outcomes": 1, "message": 1, "text": 1, "echo": 1}
SCALAR_BYTES = {"U8": 1, "U16": 2, "U32": 4, "U64": 8, "ZERO16": 2, "ZERO32": 4}


def subsection(doc, number):
    m = re.search(r"^### %s (.*)$" % re.escape(number), doc, re.M)
    require(m, f"docs/protocol.md has no section {number}")
    return m.group(1), section(doc, f"{number} {m.group(1)}")


def payload_size(fields):
    """The size formula of a field list, as section 4 writes it: `24 + 8*ndim + 16*n_keys`."""
    fixed, terms = 0, []
    for kind, name, count in fields:
        if kind in SCALAR_BYTES:
            fixed += SCALAR_BYTES[kind]
        elif kind == "LAYOUT":
            fixed += 8
            terms.append("8*ndim")
        elif kind == "PAD8":
            terms[-1] = f"pad8({terms[-1]})"
        elif kind == "ARRAY":
            e = ELEMENT_BYTES[name]
            terms.append(count if e == 1 else f"{e}*{count}")
    return " + ".join([str(fixed)] + terms) if terms else str(fixed)


def schema(doc, hdr, ops):
    table_text = hdr[hdr.index("#define KVS_PROTO_REQUESTS(X)"):hdr.index("#define KVS_PROTO_FLAT")]
    reqs = re.findall(r"X\((\w+), (\w+), (\w+)\)", table_text)
    check(sorted(r[0] for r in reqs) == sorted(n for n, _ in ops if n != "ERROR"),
          f"KVS_PROTO_REQUESTS rows {[r[0] for r in reqs]} vs the request opcodes")
    flat = re.findall(r"X\((\w+)\)", hdr[hdr.index("#define KVS_PROTO_FLAT(X)"):
                                          hdr.index("#define KVS_PROTO_FIELDS_")])
    check(sorted(flat) == sorted(PAYLOAD_DOCS), f"flat payloads {flat} vs {sorted(PAYLOAD_DOCS)}")
    for name in flat:
        m = re.search(r"#define KVS_PROTO_FIELDS_%s\(F\)((?:[^\n]*\\\n)*[^\n]*)" % name, hdr)
        require(m, f"no KVS_PROTO_FIELDS_{name}")
        fields = re.findall(r"F\((\w+), ([\w.]+), (\w+)\)", m.group(1))
        number, words = PAYLOAD_DOCS.get(name, ("?", None))
        title, body = subsection(doc, number)
        where = title if words is None else body
        lead = "" if words is None else re.escape(words) + r" \("
        said = re.search(lead + r"`?([^`()]*?(?:\([^()]*\)[^`()]*?)*)`? bytes?[);]", where)
        got = said.group(1).replace(" ", "") if said else None
        want = payload_size(fields)
        check(got == want.replace(" ", ""),
              f"{name}: docs/protocol.md {number} says {got!r} bytes, KVS_PROTO_FIELDS_{name} "
              f"makes {want!r}")
        # Where the subsection tabulates this payload, the fields and their order agree.
        tables = [t for t in re.split(r"\n(?=Request|Reply|\| offset)", body) if "| offset" in t]
        names = [("reserved" if k.startswith("ZERO") else "padding" if k == "PAD8" else
                  "layout" if k == "LAYOUT" else n) for k, n, _ in fields]
        for t in tables:
            doc_names = [c[3] for c in table(t)]
            if doc_names and doc_names[0] == names[0] and len(doc_names) == len(names):
                check(doc_names == names, f"{name}: table fields {doc_names} vs schema {names}")


# ---- cli -----------------------------------------------------------------------------------

def case_cli(ctx):
    readme = read(ctx, "README.md")
    sec = section(readme, "The `kvshim` command")
    doc_cmds = set()
    for cells in table(sec):
        doc_cmds |= set(re.findall(r"`kvshim ([a-z]+)", cells[0]))
    p = run_cli(ctx, "--help")
    require(p.returncode == 0, f"kvshim --help: exit {p.returncode}")
    usage = p.stdout.split("\nvariables")[0]
    cmds = set(re.findall(r"^  (\w+)", usage, re.M))
    check(doc_cmds == cmds, f"README commands {sorted(doc_cmds)}, kvshim --help {sorted(cmds)}")
    m = re.search(r"Exit codes: (.*?)\. The wire", " ".join(sec.split()))
    require(m, "README: no exit code sentence")
    check(m.group(1) in " ".join(usage.split()), f"exit codes: README {m.group(1)!r}, help "
                                                  f"{usage.splitlines()[-1]!r}")
    check(p.stdout.count("  KVSHIM_") >= 30, "kvshim --help does not list the variables")
    for c in sorted(cmds - {"help"}):
        h = run_cli(ctx, c, "--help")
        check(h.returncode == 0 and h.stdout.startswith(f"usage: kvshim {c}"),
              f"kvshim {c} --help: exit {h.returncode} {h.stdout[:60]!r}")
        h2 = run_cli(ctx, "help", c)
        check(h2.returncode == 0 and h2.stdout == h.stdout, f"kvshim help {c}")
    for argv, what in ((["help", "nosuch"], "help for an unknown command"),
                       (["nosuch"], "unknown command"), ([], "no command"),
                       (["stats", "--pool-size", "12Q"], "a bad value"),
                       (["peers", "--prometheus"], "--prometheus on peers")):
        r = run_cli(ctx, *argv)
        check(r.returncode == 2 and ("usage: kvshim" in r.stderr or r.stderr.startswith("kvshim")),
              f"{what}: exit {r.returncode}, stderr {r.stderr[:80]!r}")
    s = ctx.serve()
    check(re.fullmatch(r"kvshim serve: pid %d, instance [0-9a-f]{16}, group docs, pool 64M, "
                       r"socket %s/docs/[0-9a-f]{16}\.sock" % (s.pid, re.escape(ctx.run_dir)),
                       s.banner.strip()), f"serve's line: {s.banner!r}")
    s.terminate()
    check(s.wait(timeout=30) == 0, f"serve after SIGTERM: exit {s.returncode}")
    # An unknown variable's warning points to kvshim --help, which lists the variables.
    env = ctx.env(preload=False, KVSHIM_NO_SUCH_THING="1")
    r = run_cli(ctx, "peers", env=env)
    check("KVSHIM_NO_SUCH_THING" in r.stderr and "kvshim --help" in r.stderr,
          f"unknown variable warning: {r.stderr!r}")


# ---- design --------------------------------------------------------------------------------

# A citation: the word design, then a section (4, 9.1), then more joined by "-", "–", "," or
# "and" (§9.1-§9.5, §4–§6, §10.2 and §10.3, §8, §2, §9.4).
CITATION = re.compile(
    r"\bdesign\s+§(\d+(?:\.\d+)?)((?:\s*(?:,|-|–|and)\s*§\d+(?:\.\d+)?)*)", re.I)


def design_sections(text):
    """The numbers of docs/design.md's sections ("## N. Title") and subsections
    ("### N.M Title"), checked to run in order: 1, 2, 2.1, 2.2, 3, ..."""
    numbers = re.findall(r"^##+ (\d+(?:\.\d+)?)\.? ", text, re.M)
    require(numbers, "docs/design.md has no numbered sections")
    last_top, last_sub, disorder = 0, 0, []
    for n in numbers:
        top, _, sub = n.partition(".")
        if sub:
            if int(top) != last_top or int(sub) != last_sub + 1:
                disorder.append(n)
            last_sub = int(sub)
        else:
            if int(top) != last_top + 1:
                disorder.append(n)
            last_top, last_sub = int(top), 0
    check(not disorder, f"docs/design.md numbers its sections in order (out of order: {disorder})")
    return set(numbers)


def tree_files(root):
    """The files of the source tree: git's list where it is a checkout, else a walk that skips
    build folders and hidden ones."""
    p = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True, timeout=60)
    if p.returncode == 0 and p.stdout:
        return [f for f in p.stdout.decode().split("\0") if f]
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build", "node_modules"))]
        out += [os.path.relpath(os.path.join(d, f), root) for f in files]
    return out


def citations(text):
    """Every section number a text cites as "design §...", with its line number."""
    for m in CITATION.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        for n in [m.group(1)] + re.findall(r"§(\d+(?:\.\d+)?)", m.group(2)):
            yield line, n


def case_design(ctx):
    sections = design_sections(read(ctx, "docs/design.md"))
    cited, unresolved = 0, []
    for rel in tree_files(ctx.args.source):
        path = os.path.join(ctx.args.source, rel)
        if not os.path.isfile(path) or os.path.getsize(path) > 4 << 20:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:  # binary (a fuzz corpus, a model)
            continue
        for line, n in citations(text):
            cited += 1
            if n not in sections:
                unresolved.append(f"{rel}:{line} §{n}")
    require(cited >= 50, f"only {cited} design citations found in the tree: is it the tree?")
    check(not unresolved, f"every one of the {cited} design citations names a section of "
                          f"docs/design.md (these do not: {unresolved})")


class Ctx(harness.Context):
    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.defaults = {"KVSHIM_GROUP": "docs"}


if __name__ == "__main__":
    ap = harness.parser(__doc__, "--cli", "--source")
    sys.exit(harness.main(harness.cases(globals()), ap, Ctx, keep_going=True))
