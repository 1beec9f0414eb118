#!/usr/bin/env python3
"""ctest driver for the llama.cpp state API adapter of libkvshim.so (shims/llama, design
§10.2, §3, §6, §14), on tests/fakes/llama.

usage: llama_shim.py CASE --host FAKEHOST --plugin LIBFAKEPLUGIN --preload LIBKVSHIM
                     --cli KVSHIM [--asan-runtime LIBASAN]

fakehost dlopen()s libfakeplugin.so RTLD_LOCAL (as Node loads an addon); the plugin calls
libfakellama through its PLT. LD_PRELOAD is set only in the environment of the fakehost
processes started here, each case has its own temporary KVSHIM_RUN_DIR and group, and every
preloaded process writes its KVSHIM_STATS JSON, which the cases read.

Cases:
  roundtrip         save, delete the file, load: served from the pool (the real function,
                    without kvshim, fails on the missing file); another context too
  write-through-off KVSHIM_LLAMA_WRITE_THROUGH=0: no file is written, save returns what the real
                    function returns for that state (checked against a run without kvshim),
                    load and the token-count query are served from the pool
  peer              write-through off: a second process loads the state from the first (alive)
                    through its coordinator, keeps a local copy, loads again after the first
                    exited
  serve             write-through off: the first process pushes to `kvshim serve` and exits; a
                    second one loads from serve
  fingerprint       two models of one shape and name, different weights: a load under the other
                    model misses and gets the real function's result (0 with no file; with the
                    file, the real engine's wrong-model restore, exactly as without kvshim); a
                    copy of the model file with the same mtime shares the cache
  corrupt           a blob corrupted in the pool (checksum, foreign version, other model, not a
                    llama state, truncated) is refused with its reason, dropped, and the real
                    function is called; with write-through on the real function then loads the
                    file
  same-as-real      one long script (saves, loads, bad paths, small capacity, other model,
                    other KV type, empty sequence, get/set data, whole-context files,
                    overwrites) run with and without kvshim: every output line is identical;
                    write-through off: the same for every line that does not depend on a
                    file kvshim did not write
  rtld-local        without kvshim dlsym(RTLD_NEXT) and dlsym(RTLD_DEFAULT) find nothing of the
                    plugin's libraries; with kvshim the real functions are found in
                    libfakellama.so anyway (logged as invisible to RTLD_NEXT) and served
  stale             the state file is replaced by another process after the save (with and
                    without write-through): the load returns the file's new state
  overwrite         write-through off: a second save to one path replaces the cached state
  fallbacks         get_data failing: the save is not cached and the real function writes the
                    file even with write-through off; a context with another KV type refuses
                    the cached state in set_data and the real function decides
  disabled          KVSHIM_ENABLE=0 and KVSHIM_HOOKS=cuda: identical to the run without kvshim,
                    state files written, nothing cached
  ctypes            an engine that opens libfakellama.so itself (RTLD_LOCAL) and calls every
                    function through dlsym(handle, name), as ctypes does: the lookups return
                    kvshim's wrappers, the round trip is served; identical results otherwise
"""
import os
import re
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from harness import ScriptContext, check, read_stats, stop_process, wait_file  # noqa: E402,F401 (stop_process: re-exported)
import harness  # noqa: E402


class Ctx(ScriptContext):
    group = "llama"
    what = "fakehost"

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.host = args.host
        self.plugin = args.plugin
        self.host_target = None  # what fakehost opens: the plugin, or libfakellama (ctypes)

    def argv(self, cmds):
        return [self.host, self.host_target or self.plugin] + list(cmds)


def fields(line):
    """'load ret=5 n=3 toks=ab check=1' -> {'ret': '5', 'n': '3', ...}"""
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


def touch(path):
    with open(path, "w"):
        pass


def stat_eq(st, **want):
    check(st is not None, "no stats")
    shown = {k: v for k, v in st.items() if k.startswith(("hook", "peer", "push"))}
    for k, v in want.items():
        check(st.get(k) == v, f"stats {k} = {st.get(k)}, expected {v} (stats: {shown})")


# ---- shared setup ---------------------------------------------------------------------------

N_TOK = 700


def models(ctx):
    """Model A, B (same name, shape, size and mtime as A: only the weights differ) and A2 (a
    copy of A at another path, same mtime)."""
    a, b, a2 = ctx.p("a.gguf"), ctx.p("b.gguf"), ctx.p("a2.gguf")
    ctx.run([f"mkmodel {a} alpha 4 64 256 1", f"mkmodel {b} alpha 4 64 256 2",
             f"setmtime {a} 1700000000", f"setmtime {b} 1700000000", f"copy {a} {a2}"],
            preload=False)
    return a, b, a2


def baseline_save_load(ctx, model, spec=f"r{N_TOK}@1"):
    """The real functions' values for one state: (save ret, load line) without kvshim."""
    f = ctx.p("baseline.bin")
    lines, _, _ = ctx.run([f"model 0 {model}", "ctx 0 0", f"decode 0 0 {spec}", f"save 0 0 {f}",
                           "clear 0 0", f"load 0 0 {f}"], preload=False)
    os.unlink(f)
    save_ret = int(fields(lines[3])["ret"])
    check(save_ret > 0, f"baseline save: {lines[3]}")
    check(fields(lines[5])["check"] == "1", f"baseline load: {lines[5]}")
    return save_ret, lines[5]


# ---- cases ------------------------------------------------------------------------------------

def case_roundtrip(ctx):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    save_ret, load_line = baseline_save_load(ctx, a)
    script = [f"model 0 {a}", "ctx 0 0", "ctx 1 0", f"decode 0 0 r{N_TOK}@1", f"save 0 0 {f}",
              f"exists {f}", f"rm {f}", "clear 0 0", f"load 0 0 {f}", f"load 1 2 {f}",
              f"exists {f}"]
    lines, err, st = ctx.run(script)
    check(fields(lines[4])["ret"] == str(save_ret), f"save returns the real value: {lines[4]}")
    check(lines[5] == "exists 1" and lines[6] == "rm ok", f"write-through wrote the file: {lines}")
    check(lines[8] == load_line, f"load after the file was deleted: {lines[8]} != {load_line}")
    check(lines[9] == load_line, f"load into another context: {lines[9]}")
    check(lines[10] == "exists 0", "a load writes no file")
    stat_eq(st, hook_stores=1, hook_hits=2, hook_misses=0, hook_fallbacks=0,
            hook_store_failures=0)
    # Without kvshim the same script fails on the deleted file: the pool really served it.
    lines, _, _ = ctx.run(script, preload=False)
    check(fields(lines[8])["ret"] == "0", f"without kvshim the load fails: {lines[8]}")


def case_write_through_off(ctx):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    save_ret, load_line = baseline_save_load(ctx, a)
    lines, err, st = ctx.run([f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1",
                              f"save 0 0 {f}", f"exists {f}", "clear 0 0", f"loadcount 0 0 {f}",
                              f"load 0 0 {f}", f"load 0 1 {f} {N_TOK - 1}", f"exists {f}"],
                             KVSHIM_LLAMA_WRITE_THROUGH=0)
    check(fields(lines[3])["ret"] == str(save_ret),
          f"write-through off returns the real function's byte count {save_ret}: {lines[3]}")
    check(lines[4] == "exists 0" and lines[9] == "exists 0", f"no file written: {lines}")
    check(lines[6] == f"loadcount ret=12 n={N_TOK}", f"token-count query: {lines[6]}")
    check(lines[7] == load_line, f"load: {lines[7]} != {load_line}")
    check(fields(lines[8])["ret"] == "0",
          f"capacity too small: the real function fails: {lines[8]}")
    stat_eq(st, hook_stores=1, hook_hits=2, hook_fallbacks=1, hook_store_failures=0)


def case_peer(ctx):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    ready, done, loaded, gone = ctx.p("ready"), ctx.p("done"), ctx.p("loaded"), ctx.p("gone")
    save_ret, load_line = baseline_save_load(ctx, a)
    p1, s1 = ctx.start([f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1", f"save 0 0 {f}",
                        f"exists {f}", f"touch {ready}", f"waitfile {done}"],
                       KVSHIM_LLAMA_WRITE_THROUGH=0)
    wait_file(ready, "first process")
    p2, s2 = ctx.start([f"model 0 {a}", "ctx 0 0", f"load 0 0 {f}", f"touch {loaded}",
                        f"waitfile {gone}", "clear 0 0", f"load 0 0 {f}"],
                       KVSHIM_LLAMA_WRITE_THROUGH=0)
    wait_file(loaded, "second process")
    touch(done)
    l1, _ = ctx.finish(p1, "first process", 7)
    touch(gone)
    l2, e2 = ctx.finish(p2, "second process", 7)
    check(fields(l1[3])["ret"] == str(save_ret) and l1[4] == "exists 0", f"first: {l1}")
    check(l2[2] == load_line, f"load through the peer: {l2[2]} != {load_line}\n{e2}")
    check(l2[6] == load_line, f"load from the local copy after the peer exited: {l2[6]}\n{e2}")
    st1, st2 = read_stats(s1), read_stats(s2)
    stat_eq(st1, hook_stores=1)
    stat_eq(st2, hook_hits=2, hook_misses=0, peer_hits=1)
    check(not os.path.exists(f), "no state file anywhere")


def case_serve(ctx):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    save_ret, load_line = baseline_save_load(ctx, a)
    serve = ctx.serve()
    l1, _, st1 = ctx.run([f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1", f"save 0 0 {f}",
                          f"exists {f}"], KVSHIM_LLAMA_WRITE_THROUGH=0)
    check(fields(l1[3])["ret"] == str(save_ret) and l1[4] == "exists 0", f"first: {l1}")
    # One copy per node (KVSHIM_ONE_COPY=1, the default): the save went straight into serve's
    # pool, nothing kept or pushed here; serve answering the second process shows it arrived.
    stat_eq(st1, hook_stores=1, cache_peer_stores=1, push_queued=0, store_used_bytes=0)
    l2, e2, st2 = ctx.run([f"model 0 {a}", "ctx 0 0", f"load 0 0 {f}"],
                          KVSHIM_LLAMA_WRITE_THROUGH=0)
    check(l2[2] == load_line, f"load from serve after the first process exited: {l2[2]}\n{e2}")
    stat_eq(st2, hook_hits=1, peer_hits=1)
    serve.send_signal(signal.SIGTERM)
    serve.communicate(timeout=30)
    check(serve.returncode == 0, f"serve exit {serve.returncode}")


def case_fingerprint(ctx):
    a, b, a2 = models(ctx)
    f = ctx.p("s.bin")
    save_ret, load_line = baseline_save_load(ctx, a)
    script = [f"model 0 {a}", f"model 1 {b}", f"model 2 {a2}", "ctx 0 0", "ctx 1 1", "ctx 2 2",
              f"decode 0 0 r{N_TOK}@1", f"save 0 0 {f}", f"load 1 0 {f}", f"load 2 0 {f}",
              f"load 0 1 {f}"]
    lines, err, st = ctx.run(script, KVSHIM_LLAMA_WRITE_THROUGH=0)
    check(fields(lines[7])["ret"] == str(save_ret), f"save: {lines[7]}")
    check(fields(lines[8])["ret"] == "0",
          f"model B (same shape and name, other weights) must not see A's state: {lines[8]}")
    check(lines[9] == load_line, f"a copy of A with the same mtime shares it: {lines[9]}")
    check(lines[10] == load_line, f"model A: {lines[10]}")
    stat_eq(st, hook_hits=2, hook_misses=1, hook_fallbacks=0)
    ns = re.findall(r"model (\S+): .* namespace ([0-9a-f]{32})", err)
    check(len(ns) == 3 and ns[0][1] != ns[1][1] and ns[0][1] == ns[2][1],
          f"namespaces logged: {ns}")
    # With write-through the real function loads the file under model B: whatever it does,
    # kvshim does the same (here: the restore succeeds and the KV is model A's, check=0).
    lines, _, st = ctx.run(script)
    base, _, _ = ctx.run(script, preload=False)
    check(lines == base, f"with write-through, as without kvshim:\n{lines}\n{base}")
    check(fields(lines[8])["check"] == "0", f"the real engine restores A's KV into B: {lines[8]}")
    stat_eq(st, hook_hits=2, hook_misses=1)


CORRUPT = {"body": "checksum mismatch", "tokens": "checksum mismatch",
           "version": "foreign magic, version or kind", "fp": "saved by another model",
           "statemagic": "not a llama.cpp sequence state",
           "length": "length does not match its header"}


def case_corrupt(ctx):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    save_ret, load_line = baseline_save_load(ctx, a)
    for mode, reason in CORRUPT.items():
        lines, err, st = ctx.run([f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1",
                                  f"save 0 0 {f}", f"corrupt {mode}", f"load 0 1 {f}",
                                  f"save 0 0 {f}", f"load 0 1 {f}"],
                                 what=f"corrupt {mode}", KVSHIM_LLAMA_WRITE_THROUGH=0,
                                 KVSHIM_PEERS=0)
        check(lines[4] == "corrupt ok 1", f"{mode}: {lines[4]}")
        check(fields(lines[5])["ret"] == "0" and fields(lines[5])["n"] == "777777",
              f"{mode}: a refused blob goes to the real function (no file: 0): {lines[5]}")
        check(f"refused: {reason}" in err, f"{mode}: reason '{reason}' not logged:\n{err}")
        check(lines[7] == load_line,
              f"{mode}: the bad blob was dropped, a new save works: {lines[7]}")
        stat_eq(st, hook_fallbacks=1, hook_hits=1, hook_stores=2)
    # With write-through the real function then loads the file.
    lines, err, st = ctx.run([f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1",
                              f"save 0 0 {f}", "corrupt body", f"load 0 1 {f}"], KVSHIM_PEERS=0)
    check(lines[5] == load_line, f"corrupt + write-through: the real load_file: {lines[5]}")
    stat_eq(st, hook_fallbacks=1, hook_hits=0)


def same_as_real_script(ctx, wt):
    a, b, _ = models(ctx)
    d = ctx.p("")
    s = [f"model 0 {a}", f"model 1 {b}", "ctx 0 0", "ctx 1 1", "ctx 2 0 4 2",
         "decode 0 0 r500@3", "decode 0 1 1-40", "size 0 0", "size 0 0 1", "size 0 3",
         f"save 0 0 {d}a.bin", f"save 0 1 {d}b.bin", f"save 0 2 {d}empty.bin",
         f"load 0 3 {d}a.bin", f"loadcount 0 3 {d}a.bin", f"load 0 3 {d}a.bin 499",
         f"load 0 3 {d}a.bin 500", f"load 0 3 {d}missing.bin", f"load 0 2 {d}empty.bin",
         f"load 0 3 {d}b.bin", f"load 0 3 {a}",
         "copyseq 0 0 0 3", "copyseq 0 1 0 2 1", "copyseq 0 0 2 0",
         f"savectx 0 0 {d}c.bin", f"loadctx 0 0 {d}c.bin", f"loadctx 0 0 {d}c.bin 3",
         "decode 0 0 1-10", f"save 0 0 {d}a.bin", f"load 0 3 {d}a.bin", "check 0 0",
         f"save 0 0 {d}./sub/../a.bin", f"save 0 0 {d}nodir/x.bin"]
    if wt:
        # Only write-through can tell these: the real function reads the files it wrote (a
        # state that does not fit the context: the real function fails after reading the
        # tokens, and reports their count; without the file it reports nothing).
        s += [f"load 2 0 {d}a.bin", f"load 1 0 {d}a.bin", f"load 0 3 {d}nodir/x.bin"]
    return s


def case_same_as_real(ctx):
    for wt in (1, 0):
        script = same_as_real_script(ctx, wt)
        os.makedirs(ctx.p("sub"), exist_ok=True)
        base, _, _ = ctx.run(script, preload=False)
        for f in ("a.bin", "b.bin", "empty.bin", "c.bin"):
            os.unlink(ctx.p(f))
        got, err, st = ctx.run(script, KVSHIM_LLAMA_WRITE_THROUGH=wt)
        for i, (x, y) in enumerate(zip(base, got)):
            if wt == 0 and script[i].endswith("nodir/x.bin") and script[i].startswith("save"):
                # With write-through off the state is kept although the directory is missing.
                check(x == "save ret=0" and y != x, f"nodir save: {x} / {y}")
                continue
            check(x == y, f"write-through {wt}: line {i + 1} '{script[i]}':\n"
                          f"  without kvshim: {x}\n  with kvshim:    {y}")
        check(st["hook_hits"] >= 5 and st["hook_stores"] >= 5, f"write-through {wt}: the cache was "
              f"used: hits {st['hook_hits']} stores {st['hook_stores']}")
        for f in ("a.bin", "b.bin", "empty.bin"):
            check(os.path.exists(ctx.p(f)) == bool(wt), f"write-through {wt}: file {f}")
            if wt:
                os.unlink(ctx.p(f))
        os.unlink(ctx.p("c.bin"))


def case_rtld_local(ctx):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    lines, _, _ = ctx.run(["rtld llama_state_seq_save_file", f"model 0 {a}",
                           "rtld llama_state_seq_save_file"], preload=False)
    for line in (lines[0], lines[2]):
        check(line == "rtld llama_state_seq_save_file next=null default=null",
              f"the plugin's libraries are not in the global scope: {line}")
    lines, err, st = ctx.run([f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1",
                              f"save 0 0 {f}", f"rm {f}", f"load 0 1 {f}"])
    for fn in ("llama_state_seq_save_file", "llama_state_seq_load_file",
               "llama_state_seq_get_size", "llama_state_seq_get_data",
               "llama_state_seq_set_data", "llama_get_model"):
        want = (f"llama.cpp: {fn} resolved in {os.path.dirname(ctx.plugin)}/libfakellama.so "
                "(not visible to dlsym(RTLD_NEXT)")
        check(want in err, f"resolution of {fn} not logged as expected:\n{err}")
    check(fields(lines[5])["check"] == "1", f"served: {lines[5]}")
    stat_eq(st, hook_stores=1, hook_hits=1)


def case_stale(ctx):
    a, _, _ = models(ctx)
    for wt in (1, 0):
        f = ctx.p(f"s{wt}.bin")
        ready, go = ctx.p(f"ready{wt}"), ctx.p(f"go{wt}")
        p1, s1 = ctx.start([f"model 0 {a}", "ctx 0 0", "decode 0 0 r300@1", f"save 0 0 {f}",
                            f"touch {ready}", f"waitfile {go}", f"load 0 1 {f}"],
                           KVSHIM_LLAMA_WRITE_THROUGH=wt)
        wait_file(ready, "first process")
        l0, _, _ = ctx.run([f"model 0 {a}", "ctx 0 0", "decode 0 0 r400@2", f"save 0 0 {f}",
                            "clear 0 0", f"load 0 1 {f}"], preload=False)
        touch(go)
        l1, e1 = ctx.finish(p1, "first process", 7)
        check(l1[6] == l0[5] and fields(l1[6])["n"] == "400",
              f"write-through {wt}: the replaced file wins: {l1[6]} != {l0[5]}\n{e1}")
        check("changed on disk since it was cached" in e1, f"not logged:\n{e1}")
        stat_eq(read_stats(s1), hook_fallbacks=1, hook_hits=0)


def case_overwrite(ctx):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    lines, err, st = ctx.run([f"model 0 {a}", "ctx 0 0", "decode 0 0 r300@1", f"save 0 0 {f}",
                              "decode 0 0 r10@5", f"save 0 0 {f}", f"load 0 1 {f}",
                              f"loadcount 0 1 {f}"], KVSHIM_LLAMA_WRITE_THROUGH=0)
    check(fields(lines[6])["n"] == "310" and fields(lines[6])["check"] == "1",
          f"the second save replaced the first: {lines[6]}")
    check(lines[7] == "loadcount ret=12 n=310", lines[7])
    stat_eq(st, hook_stores=2, hook_hits=2)


def save_uncacheable(ctx, a, f, save_ret):
    """A save to f whose get_data fails (FAKELLAMA_GET_DATA_FAIL=1, write-through off): the real
    function writes the file, with its exact return value. Returns (lines, stderr, stats)."""
    lines, err, st = ctx.run([f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1",
                              f"save 0 0 {f}", f"exists {f}"], KVSHIM_LLAMA_WRITE_THROUGH=0,
                             FAKELLAMA_GET_DATA_FAIL=1)
    check(fields(lines[3])["ret"] == str(save_ret) and lines[4] == "exists 1",
          f"an uncacheable save is written by the real function: {lines}\n{err[-2000:]}")
    return lines, err, st


def case_fallbacks(ctx):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    save_ret, load_line = baseline_save_load(ctx, a)
    _, _, st = save_uncacheable(ctx, a, f, save_ret)
    stat_eq(st, hook_stores=0, hook_store_failures=1)
    lines, _, st = ctx.run([f"model 0 {a}", "ctx 0 0", f"load 0 0 {f}"],
                           KVSHIM_LLAMA_WRITE_THROUGH=0)
    check(lines[2] == load_line, f"then loaded from the file: {lines[2]}")
    stat_eq(st, hook_misses=1, hook_hits=0)
    os.unlink(f)
    # Another KV type: set_data refuses the cached state, the real function (no file) fails.
    lines, err, st = ctx.run([f"model 0 {a}", "ctx 0 0", "ctx 1 0 4 2", f"decode 0 0 r{N_TOK}@1",
                              f"save 0 0 {f}", f"load 1 0 {f}", f"load 0 1 {f}"],
                             KVSHIM_LLAMA_WRITE_THROUGH=0)
    check(fields(lines[5])["ret"] == "0", f"other KV type: {lines[5]}")
    check(lines[6] == load_line, f"the blob was kept for contexts it fits: {lines[6]}")
    check("set_data read 0 of" in err, f"not logged:\n{err}")
    stat_eq(st, hook_fallbacks=1, hook_hits=1)


def case_disabled(ctx):
    script = same_as_real_script(ctx, 1)
    os.makedirs(ctx.p("sub"), exist_ok=True)
    base, _, _ = ctx.run(script, preload=False)
    for extra in ({"KVSHIM_ENABLE": 0}, {"KVSHIM_HOOKS": "cuda"}):
        got, err, st = ctx.run(script, KVSHIM_LLAMA_WRITE_THROUGH=0, **extra)
        check(got == base, f"{extra}: differs from the run without kvshim")
        check(st is None or st.get("hook_calls", 0) == 0, f"{extra}: hooks counted: {st}")
        check(os.path.exists(ctx.p("a.bin")), f"{extra}: the real function wrote the file")
        for f in ("a.bin", "b.bin", "empty.bin", "c.bin"):
            os.unlink(ctx.p(f))


def case_ctypes(ctx):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    lib = os.path.join(os.path.dirname(ctx.plugin), "libfakellama.so")
    save_ret, load_line = baseline_save_load(ctx, a)
    script = [f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1", f"save 0 0 {f}", f"rm {f}",
              f"load 0 1 {f}", "copyseq 0 1 0 2 0"]
    ctx.host_target = lib
    lines, err, st = ctx.run(script)
    check(fields(lines[3])["ret"] == str(save_ret), f"save: {lines[3]}")
    check(lines[5] == load_line, f"served through the dlsym'd pointers: {lines[5]}\n{err}")
    check(fields(lines[6])["check"] == "1", f"get/set data: {lines[6]}")
    stat_eq(st, hook_stores=1, hook_hits=1)
    check(st["hook_calls"] >= 7, f"every dlsym'd state function is a wrapper: {st['hook_calls']}")
    base, _, _ = ctx.run(script, preload=False)
    check(fields(base[5])["ret"] == "0", f"without kvshim the deleted file is gone: {base[5]}")
    check(base[:5] == lines[:5], f"otherwise identical:\n{base}\n{lines}")


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()),
                          harness.parser(__doc__, "--host", "--plugin", "--preload", "--cli",
                                         asan=True), Ctx))
