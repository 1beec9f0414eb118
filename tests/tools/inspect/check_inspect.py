#!/usr/bin/env python3
"""ctest driver for `kvshim inspect` and the run-time family scan (design.md section 11).

usage: check_inspect.py --kvshim KVSHIM --dir FIXTURES --probe PROBE.so --static-mode MODE
                        --object FILE.o [--refengine REFENGINE] CASE      (--list: the cases)

Every verdict case runs the fixture twice: once with LD_PRELOAD=PROBE.so, whose override of
the hook writes "probe:<hook>" to stderr when it is called, and once through
`kvshim inspect --json`. Inspect's "interposable" must equal what the probe saw, and the
verdict and reason must be the ones the case is built to show. The closure inspect resolved
must equal the one the dynamic loader maps (LD_TRACE_LOADED_OBJECTS), in the same order.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from harness import Failure, check  # noqa: E402
import harness  # noqa: E402


A = None  # parsed arguments


def fx(name):
    return os.path.join(A.dir, name)


def run(cmd, env_extra=None, expect_rc=0):
    env = dict(os.environ)
    for k, v in (env_extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    if expect_rc is not None and p.returncode != expect_rc:
        raise Failure(f"{' '.join(cmd)}: exit {p.returncode}, expected {expect_rc}\n"
                      f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def inspect(target, *extra, env=None, expect_rc=0):
    return run([A.kvshim, "inspect", target, *extra], env, expect_rc)


def inspect_json(target, *extra, env=None):
    p = inspect(target, "--json", *extra, env=env)
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError as e:
        raise Failure(f"inspect --json {target}: not JSON ({e}):\n{p.stdout}")


def family(doc, name):
    for f in doc["families"]:
        if f["family"] == name:
            return f
    raise Failure(f"family {name} missing from the report")


def symbol(doc, fam, name):
    for s in family(doc, fam)["symbols"]:
        if s["name"] == name:
            return s
    raise Failure(f"{fam}/{name} missing from the report")


def obj(doc, i):
    return doc["objects"][i]


def uses_by_name(sym):
    return {u["name"]: u for u in sym["uses"]}


def probe_hit(cmd, hook, env=None, expect_rc=0):
    """Runs cmd with the probe preloaded; True when the probe's override of hook was called."""
    base = run(cmd, env, expect_rc)
    check(f"probe:{hook}" not in base.stderr, f"probe line without the probe: {base.stderr!r}")
    p = run(cmd, {**(env or {}), "LD_PRELOAD": A.probe}, expect_rc)
    if expect_rc == 0:
        check(p.stdout.startswith("result=") or "summary" in p.stdout,
              f"{cmd[0]} printed no result: {p.stdout!r}")
    return f"probe:{hook}" in p.stderr.splitlines()


def loader_closure(exe, env=None):
    """The objects the dynamic loader maps for exe (no vDSO), and the names it cannot find."""
    p = run([exe], {**(env or {}), "LD_TRACE_LOADED_OBJECTS": "1"}, None)
    paths, missing = [], []
    for line in p.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            name, rest = (x.strip() for x in line.split("=>", 1))
            if rest.startswith("not found"):
                missing.append(name)
            elif rest.startswith("/") or rest.startswith("."):
                paths.append(os.path.realpath(rest.split(" (0x")[0]))
        elif line.startswith("/"):
            paths.append(os.path.realpath(line.split(" (0x")[0]))
    return paths, missing


def check_closure(doc, exe, env=None):
    want, want_missing = loader_closure(exe, env)
    got = [os.path.realpath(o["path"]) for o in doc["objects"][1:] if o["path"]]
    got_missing = [o["name"] for o in doc["objects"][1:] if not o["path"]]
    # the loader maps ld.so itself wherever; compare it as a member, the rest in order
    interp = os.path.realpath(doc["interpreter"]) if doc["interpreter"] else None
    check(sorted(got) == sorted(want),
          f"closure differs from the loader's:\ninspect: {got}\nloader:  {want}")
    check([p for p in got if p != interp] == [p for p in want if p != interp],
          f"load order differs from the loader's:\ninspect: {got}\nloader:  {want}")
    check(sorted(got_missing) == sorted(want_missing),
          f"missing objects differ: inspect {got_missing}, loader {want_missing}")


def summary_of(doc, fam):
    return family(doc, fam)["summary"]


def verdict_case(cmd, target, fam, hook, verdict, reason, env=None, closure=True):
    """The core comparison: inspect's verdict against the probe."""
    hit = probe_hit(cmd, hook, env)
    doc = inspect_json(target, env=env)
    s = symbol(doc, fam, hook)
    check(s["interposable"] == hit,
          f"{hook}: inspect says interposable={s['interposable']} ({s['verdict']}, {s['reason']}), "
          f"but the LD_PRELOAD override was {'called' if hit else 'not called'}")
    check((s["verdict"], s["reason"]) == (verdict, reason),
          f"{hook}: verdict {s['verdict']}/{s['reason']}, expected {verdict}/{reason}")
    if reason is not None:
        check(s["reason_text"], f"{hook}: no reason text")
    text = inspect(target, env=env).stdout
    fam_doc = family(doc, fam)
    check(fam_doc["summary"] and fam_doc["summary"] in text,
          f"summary line {fam_doc['summary']!r} not in the human output:\n{text}")
    row = [l for l in text.splitlines() if l.startswith("  " + hook + " ")]
    check(len(row) == 1, f"no single table row for {hook}:\n{text}")
    check((" yes " in row[0] + " ") == (verdict == "yes") and
          (reason is None or f"({reason})" in row[0]), f"row for {hook}: {row[0]!r}")
    if closure:
        check_closure(doc, cmd[0], env)
    return doc, s, text


def definer_use(s):
    return [u for u in s["uses"] if u["role"] != "import"]


# ---- cases -----------------------------------------------------------------------------------

def case_plt_import():
    doc, s, _ = verdict_case([fx("fx_kvo_main")], fx("fx_kvo_main"), "kvo", "kvo_lookup", "yes", None)
    u = uses_by_name(s)
    check(u["fx_kvo_main"]["role"] == "import" and u["fx_kvo_main"]["jump_slot"] >= 1,
          f"the executable's PLT import is not seen: {s['uses']}")
    check(u["libfx_kvo.so"]["role"] == "definition", f"definition: {s['uses']}")
    check(obj(doc, s["defined_in"])["name"] == "libfx_kvo.so", f"defined_in: {s['defined_in']}")
    # the executable reaches only kvo_lookup: the other two are defined but unreached
    check(summary_of(doc, "kvo") == "kvo: libfx_kvo.so, 1/3 hooks interposable",
          f"summary: {summary_of(doc, 'kvo')}")
    check([(x["name"], x["verdict"], x["reason"]) for x in family(doc, "kvo")["symbols"]
           if x["name"] != "kvo_lookup"] == [("kvo_load_chunk", "no", "unreached"),
                                              ("kvo_store_chunk", "no", "unreached")],
          f"unreached definitions: {family(doc, 'kvo')['symbols']}")
    check(family(doc, "llama")["present"] == 0 and family(doc, "cuda")["present"] == 0,
          "families the fixture does not link are reported present")


def case_plt_internal():
    doc, s, text = verdict_case([fx("fx_plt_main")], fx("fx_plt_main"), "llama", "llama_decode",
                                "yes", None)
    d = definer_use(s)
    check(len(d) == 1 and d[0]["jump_slot"] >= 1 and d[0]["direct_calls"] == 0,
          f"fx_run -> llama_decode inside libfx_plt.so should go through its PLT: {d}")
    calls = family(doc, "llama")["internal_plt_calls"]
    check(any(c["symbol"] == "llama_decode" and c["interposable"] for c in calls),
          f"internal PLT call not reported: {calls}")
    check("llama_decode in libfx_plt.so: 1 through the plt (interposable)" in text,
          f"internal PLT call not in the human output:\n{text}")


def bound_case(exe, lib, reason, symbolic=False, role="definition", vis="default"):
    doc, s, text = verdict_case([fx(exe)], fx(exe), "llama", "llama_decode", "no", reason)
    d = definer_use(s)
    check(len(d) == 1 and d[0]["direct_calls"] >= 1 and d[0]["jump_slot"] == 0,
          f"the call inside {lib} should be a direct call: {d}")
    check(d[0]["role"] == role and d[0]["visibility"] == vis, f"definition: {d}")
    check([o["symbolic"] for o in doc["objects"] if o["name"] == lib] == [symbolic],
          f"{lib} symbolic flag: {doc['objects']}")
    check(f"llama_decode in {lib}:" in text and "direct call" in text,
          f"bound internal call not in the human output:\n{text}")
    check(family(doc, "llama")["internal_plt_calls"] == [], "a PLT call reported where none is")
    return doc, s


def case_symbolic():
    bound_case("fx_symbolic_main", "libfx_symbolic.so", "symbolic", symbolic=True)


def case_symbolic_functions():
    bound_case("fx_symfn_main", "libfx_symfn.so", "symbolic-functions")


def case_partial():
    """Two calls, two routes: the executable's PLT import reaches the override, the call
    inside libfx_symfn.so does not. The probe counts exactly the interposable routes."""
    partial_case("fx_partial_main", "libfx_symfn.so", "symbolic-functions")


def case_partial_protected():
    """A protected definition binds only its own object's calls: imports still interpose."""
    partial_case("fx_partial_prot_main", "libfx_protected.so", "protected")


def partial_case(name, lib, reason):
    exe = fx(name)
    run([exe])
    p = run([exe], {"LD_PRELOAD": A.probe})
    hits = p.stderr.splitlines().count("probe:llama_decode")
    doc = inspect_json(exe)
    s = symbol(doc, "llama", "llama_decode")
    routes = [u for u in s["uses"] if u["role"] == "import" or u["direct_calls"] or
              u["jump_slot"] + u["glob_dat"] + u["other_relocs"]]
    check(len(routes) == 2, f"two routes expected: {s['uses']}")
    check(sum(u["interposable"] for u in routes) == hits == 1,
          f"interposable routes {[u['interposable'] for u in routes]}, probe hits {hits}")
    check((s["verdict"], s["reason"], s["interposable"]) == ("partial", reason, False),
          f"verdict: {s}")
    u = uses_by_name(s)
    check(u[name]["interposable"] and not u[lib]["interposable"], f"routes: {s['uses']}")
    text = inspect(exe).stdout
    check(f"partial ({reason})" in text and "0/1 hooks interposable (1 partially)" in text,
          f"human output:\n{text}")
    check_closure(doc, exe)


def case_hidden():
    # the linker turns a hidden global into a local symbol (and drops STV_HIDDEN)
    doc, s = bound_case("fx_hidden_main", "libfx_hidden.so", "hidden", role="internal-definition",
                        vis="local")
    check(s["defined_in"] is None, f"a hidden definition is reported exported: {s}")


def case_protected():
    bound_case("fx_protected_main", "libfx_protected.so", "protected", vis="protected")


def case_static():
    reason = "static" if A.static_mode == "static" else "executable"
    doc, s, text = verdict_case([fx("fx_static")], fx("fx_static"), "llama", "llama_decode", "no",
                                reason, closure=A.static_mode != "static")
    d = definer_use(s)
    check(len(d) == 1 and d[0]["name"] == "fx_static" and d[0]["direct_calls"] >= 1,
          f"the executable's own call: {d}")
    if A.static_mode == "static":
        check(doc["kind"] == "static-executable" and len(doc["objects"]) == 1, f"kind: {doc['kind']}")
        check("LD_PRELOAD is ignored" in text, "no static note in the human output")
    else:
        check(doc["kind"] == "executable", f"kind: {doc['kind']}")


def case_exe_internal():
    doc, s, _ = verdict_case([fx("fx_selfdyn")], fx("fx_selfdyn"), "llama", "llama_decode", "no",
                             "executable")
    check(doc["kind"] == "pie-executable", f"kind: {doc['kind']}")
    d = definer_use(s)
    check(len(d) == 1 and d[0]["name"] == "fx_selfdyn" and d[0]["role"] == "internal-definition"
          and d[0]["direct_calls"] >= 1, f"the executable's own call: {d}")


def case_exe_defined():
    doc, s, _ = verdict_case([fx("fx_cb_main")], fx("fx_cb_main"), "kvo", "kvo_lookup", "no",
                             "executable")
    u = uses_by_name(s)
    check(u["fx_cb_main"]["role"] == "definition", f"the executable's definition: {s['uses']}")
    imp = u["libfx_cb.so"]
    check(imp["role"] == "import" and imp["jump_slot"] >= 1 and not imp["interposable"] and
          imp["reason"] == "executable", f"the library's call into the executable: {imp}")


def case_plugin():
    plugin = fx("libfx_plugin.so")
    hit = probe_hit([fx("fx_host"), plugin], "llama_state_seq_save_file")
    check(hit, "the probe did not interpose the RTLD_LOCAL plugin's call")
    doc = inspect_json(plugin)
    check(doc["kind"] == "shared-library", f"kind of the plugin: {doc['kind']}")
    s = symbol(doc, "llama", "llama_state_seq_save_file")
    check(s["interposable"] == hit and s["verdict"] == "yes", f"plugin verdict: {s}")
    u = uses_by_name(s)
    check(u["libfx_plugin.so"]["role"] == "import" and u["libfx_plugin.so"]["jump_slot"] >= 1,
          f"the plugin's import: {s['uses']}")
    state = [o for o in doc["objects"] if o["name"] == "libfx_state.so"]
    check(len(state) == 1 and state[0]["via"] == "runpath", f"libfx_state.so: {state}")
    check(summary_of(doc, "llama") == "llama.cpp: libfx_state.so, 1/1 hooks interposable",
          f"summary: {summary_of(doc, 'llama')}")
    host = inspect_json(fx("fx_host"))
    check(family(host, "llama")["present"] == 0 and family(host, "llama")["summary"] is None,
          "the host does not link the plugin's family, yet it is reported")
    check(any("dlopen" in n for n in host["notes"]), "no dlopen note in the JSON")
    text = inspect(fx("fx_host")).stdout
    check("llama.cpp: not present" in text and "inspect each plugin directly" in text,
          f"host report:\n{text}")
    check_closure(host, fx("fx_host"))


def case_rpath_chain():
    doc, s, _ = verdict_case([fx("fx_chain_rpath")], fx("fx_chain_rpath"), "kvo", "kvo_lookup",
                             "yes", None)
    kvo = [o for o in doc["objects"] if o["name"] == "libfx_kvo.so"]
    check(len(kvo) == 1 and kvo[0]["via"] == "rpath" and
          obj(doc, kvo[0]["needed_by"])["name"] == "libfx_mid.so",
          f"libfx_kvo.so should come from the executable's DT_RPATH via libfx_mid.so: {kvo}")
    check(uses_by_name(s)["libfx_mid.so"]["role"] == "import", f"uses: {s['uses']}")


def case_runpath_chain():
    exe = fx("fx_chain_runpath")
    # DT_RUNPATH is not inherited: the loader itself fails, and inspect must agree
    p = run([exe], {"LD_LIBRARY_PATH": None}, None)
    check(p.returncode != 0 and "libfx_kvo.so" in p.stderr, f"the loader found libfx_kvo.so: {p}")
    doc = inspect_json(exe, env={"LD_LIBRARY_PATH": None})
    kvo = [o for o in doc["objects"] if o["name"] == "libfx_kvo.so"]
    check(len(kvo) == 1 and kvo[0]["path"] is None and kvo[0]["via"] == "not found",
          f"libfx_kvo.so should not be found: {kvo}")
    check_closure(doc, exe, {"LD_LIBRARY_PATH": None})
    s = symbol(doc, "kvo", "kvo_lookup")
    check(s["defined_in"] is None and s["verdict"] == "yes", f"unresolved import: {s}")
    text = inspect(exe, env={"LD_LIBRARY_PATH": None}).stdout
    check("not found" in text and "needed by libfx_mid.so" in text, f"human output:\n{text}")
    # with LD_LIBRARY_PATH both find it
    env = {"LD_LIBRARY_PATH": A.dir}
    doc, s, _ = verdict_case([exe], exe, "kvo", "kvo_lookup", "yes", None, env=env)
    kvo = [o for o in doc["objects"] if o["name"] == "libfx_kvo.so"]
    check(kvo[0]["via"] == "LD_LIBRARY_PATH", f"via: {kvo}")


def case_bad_input():
    with tempfile.TemporaryDirectory() as tmp:
        def bad(args, rc, needle):
            p = run([A.kvshim, "inspect", *args], expect_rc=rc)
            check(needle in p.stderr, f"inspect {args}: stderr lacks {needle!r}: {p.stderr!r}")
            check(p.stdout == "", f"inspect {args}: wrote a report: {p.stdout!r}")
        bad([], 2, "no BINARY")
        bad([fx("fx_kvo_main"), fx("fx_host")], 2, "one BINARY")
        bad(["--frobnicate", fx("fx_kvo_main")], 2, "unknown option --frobnicate")
        bad([fx("fx_kvo_main"), "--ld-cache"], 2, "needs a FILE")
        bad([os.path.join(tmp, "missing")], 1, "No such file or directory")
        bad([tmp], 1, "Is a directory")
        bad([os.path.abspath(__file__)], 1, "not an ELF file")
        empty = os.path.join(tmp, "empty")
        open(empty, "wb").close()
        bad([empty], 1, "not an ELF file")
        bad([A.object], 1, "relocatable object")
        fifo = os.path.join(tmp, "fifo")
        os.mkfifo(fifo)
        bad([fifo], 1, "not a regular file")  # and no hang opening it
        with open(fx("fx_kvo_main"), "rb") as f:
            head = f.read(200)
        trunc = os.path.join(tmp, "truncated")
        with open(trunc, "wb") as f:
            f.write(head)
        bad([trunc], 1, "truncated")
        noread = os.path.join(tmp, "noread")
        shutil.copy(fx("fx_kvo_main"), noread)
        os.chmod(noread, 0)
        if not os.access(noread, os.R_OK):  # root reads anything: then it is a good binary
            bad([noread], 1, "Permission denied")
        # nothing was changed by inspecting
        check(open(trunc, "rb").read() == head, "inspect modified its input")
        p = run([A.kvshim, "help", "inspect"])
        check(p.stdout.startswith("usage: kvshim inspect"), f"help: {p.stdout!r}")
        p = run([A.kvshim, "inspect", "--help"])
        check(p.stdout.startswith("usage: kvshim inspect"), f"--help: {p.stdout!r}")
        p = run([A.kvshim, "--help"])
        check("inspect BINARY" in p.stdout, "inspect missing from the command list")


def case_json():
    with tempfile.TemporaryDirectory() as tmp:
        # a path needing escapes; the library beside it is found through $ORIGIN
        d = os.path.join(tmp, 'we"ird\\dir\tname')
        os.mkdir(d)
        exe = os.path.join(d, "fx_kvo_main")
        shutil.copy(fx("fx_kvo_main"), exe)
        shutil.copy(fx("libfx_kvo.so"), d)
        p = run([A.kvshim, "inspect", exe, "--json"])
        doc = json.loads(p.stdout)
        check(doc["binary"] == exe, f"binary: {doc['binary']!r}")
        check(os.path.dirname(doc["objects"][1]["path"]) == d, f"$ORIGIN: {doc['objects'][1]}")
        sizes = {"cuda": 20, "llama": 39, "kvo": 3}  # every hook libkvshim.so exports
        check([f["family"] for f in doc["families"]] == ["cuda", "llama", "kvo"], "families")
        for f in doc["families"]:
            syms = f["symbols"]
            check(len(syms) == sizes[f["family"]] == f["hooks"], f"{f['family']}: {len(syms)} hooks")
            present = [s for s in syms if s["verdict"] != "absent"]
            check(f["present"] == len(present), f"{f['family']}: present {f['present']}")
            check(f["interposable"] == sum(s["interposable"] for s in syms),
                  f"{f['family']}: interposable count")
            check(f["present"] == f["interposable"] + f["partial"] + f["not_interposable"],
                  f"{f['family']}: counts do not add up")
            for s in syms:
                check(s["interposable"] == (s["verdict"] == "yes"), f"{s}")
                check((s["reason"] is None) == (s["verdict"] in ("yes", "absent")), f"{s}")
                for u in s["uses"]:
                    check(0 <= u["object"] < len(doc["objects"]) and
                          doc["objects"][u["object"]]["path"], f"use of a missing object: {u}")
        text = run([A.kvshim, "inspect", exe]).stdout
        check("kvo: libfx_kvo.so, 1/3 hooks interposable" in text, f"human:\n{text}")
        check(all(f["summary"] in text for f in doc["families"] if f["summary"]),
              "JSON summaries differ from the table's")


def case_ld_cache():
    exe = fx("fx_kvo_main")

    def libc(*extra):
        doc = inspect_json(exe, *extra)
        c = [o for o in doc["objects"] if o["name"] == "libc.so.6"]
        check(len(c) == 1 and c[0]["path"], f"libc.so.6 not resolved with {extra}: {c}")
        return c[0]["via"], os.path.realpath(c[0]["path"])

    via, path = libc()
    check(via == "ld.so.cache", f"libc.so.6 via {via} with the system cache")
    check_closure(inspect_json(exe), exe)
    with tempfile.TemporaryDirectory() as tmp:
        junk = os.path.join(tmp, "junk.cache")
        with open(junk, "wb") as f:
            f.write(b"glibc-ld.so.cache1.1" + b"\xff" * 100)
        for extra in ([f"--ld-cache={junk}", "--no-ldconfig"],
                      ["--ld-cache", os.path.join(tmp, "none"), "--no-ldconfig"]):
            via2, path2 = libc(*extra)
            check(via2 == "default" and path2 == path, f"{extra}: {via2} {path2} (want default)")
        have_ldconfig = any(os.access(p, os.X_OK) for p in
                            ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/bin/ldconfig",
                             "/usr/bin/ldconfig"))
        via3, path3 = libc(f"--ld-cache={junk}")
        check(path3 == path and via3 == ("ld.so.cache" if have_ldconfig else "default"),
              f"ldconfig fallback: {via3} {path3}")


def case_refengine():
    eng = A.refengine
    args = ["--requests", "1", "--prompt-tokens", "64", "--chunk-tokens", "32", "--layers", "3",
            "--kv-heads", "2", "--head-dim", "16", "--hidden", "32"]
    hit_kvo = probe_hit([eng, *args], "kvo_lookup")
    hit_cuda = probe_hit([eng, *args], "cuMemAlloc_v2")
    doc = inspect_json(eng)
    for fam, hook, hit in (("kvo", "kvo_lookup", hit_kvo), ("cuda", "cuMemAlloc_v2", hit_cuda)):
        s = symbol(doc, fam, hook)
        check(s["interposable"] == hit and hit, f"{hook}: inspect {s['verdict']}, probe hit={hit}")
        check(uses_by_name(s)["refengine"]["role"] == "import" and
              uses_by_name(s)["refengine"]["jump_slot"] >= 1, f"{hook} import: {s['uses']}")
    check(summary_of(doc, "kvo") == "kvo: libkvo_default.so, 3/3 hooks interposable",
          f"kvo summary: {summary_of(doc, 'kvo')}")
    cuda = family(doc, "cuda")
    check(obj(doc, cuda["defined_in"])["name"] == "libcuda.so.1" and
          cuda["summary"].startswith("CUDA driver: libcuda.so.1, "),
          f"cuda family should come through libcuda.so.1: {cuda['summary']}")
    imported = [s["name"] for s in cuda["symbols"]
                if "refengine" in uses_by_name(s) and uses_by_name(s)["refengine"]["role"] == "import"]
    check({"cuMemAlloc_v2", "cuMemFree_v2", "cuMemHostAlloc", "cuMemFreeHost"} <= set(imported),
          f"cuda imports of refengine: {imported}")
    check(family(doc, "llama")["present"] == 0, "refengine links no llama.cpp")
    check_closure(doc, eng)
    text = inspect(eng).stdout
    check("kvo: libkvo_default.so, 3/3 hooks interposable" in text, f"human output:\n{text}")


def features(doc, fam):
    return {f["name"]: f for f in family(doc, fam)["features"]}


def case_binding_internal():
    """llama.cpp linked into the binding, its C API exported but called through no relocation
    (the binding calls the implementation directly): LD_PRELOAD never sees llama_decode, so
    inspect must say so, for the program and for the binding inspected alone, and name the
    features lost (the prefix cache and the state adapter need llama_decode /
    llama_model_load_from_file)."""
    doc, s, text = verdict_case([fx("fx_binding_main")], fx("fx_binding_main"), "llama",
                                "llama_decode", "no", "unreached")
    d = definer_use(s)
    check(len(d) == 1 and d[0]["name"] == "libfx_binding.so" and d[0]["role"] == "definition"
          and d[0]["jump_slot"] + d[0]["glob_dat"] + d[0]["other_relocs"] == 0
          and d[0]["direct_calls"] == 0, f"no route to the exported llama_decode: {s['uses']}")
    check(summary_of(doc, "llama") == "llama.cpp: libfx_binding.so, 0/3 hooks interposable",
          f"summary: {summary_of(doc, 'llama')}")
    for target in (fx("fx_binding_main"), fx("libfx_binding.so")):
        doc = inspect_json(target)
        fe = features(doc, "llama")
        check(fe["prefix cache"]["state"] == "lost" and fe["prefix cache"]["hook"] ==
              "llama_decode" and fe["prefix cache"]["reason"] == "unreached" and
              "no prompt prefix is restored" in fe["prefix cache"]["lost"],
              f"{target}: prefix cache: {fe['prefix cache']}")
        check(fe["state adapter"]["state"] == "absent" and fe["state adapter"]["hook"] is None,
              f"{target}: the binding makes no state call: {fe['state adapter']}")
        text = inspect(target).stdout
        check("  prefix cache: lost, llama_decode not interposable (unreached): no prompt prefix "
              "is restored from kvshim's cache: every token is computed\n" in text and
              "state adapter:" not in text and "  unreached: exported, but no object inspected "
              "reaches it through a dynamic relocation" in text, f"human output:\n{text}")


def case_binding_plt():
    """The same binding calling its exported C API through its own PLT: interposable, the
    prefix cache available."""
    doc, s, text = verdict_case([fx("fx_binding_plt_main")], fx("fx_binding_plt_main"), "llama",
                                "llama_decode", "yes", None)
    d = definer_use(s)
    check(len(d) == 1 and d[0]["jump_slot"] >= 1 and d[0]["direct_calls"] == 0,
          f"the binding's call to llama_decode should go through its PLT: {d}")
    check(summary_of(doc, "llama") == "llama.cpp: libfx_binding_plt.so, 3/3 hooks interposable",
          f"summary: {summary_of(doc, 'llama')}")
    fe = features(doc, "llama")
    check(fe["prefix cache"] == {"name": "prefix cache", "state": "available", "hook": None,
                                 "reason": None, "lost": None}, f"prefix cache: {fe}")
    check("  prefix cache: available\n" in text, f"human output:\n{text}")


def parser():
    ap = harness.parser(__doc__, "--kvshim", "--dir", "--probe", "--object")
    ap.add_argument("--static-mode", choices=["static", "nopie"], required=True)
    ap.add_argument("--refengine")
    return ap


def context(args, tmp, work):
    global A
    A = args
    return harness.Context(args, tmp, work)


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()), parser(), context))
