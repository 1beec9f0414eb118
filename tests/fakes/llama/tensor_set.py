#!/usr/bin/env python3
"""ctest driver: libfakellama loads a state's tensor data through ggml_backend_tensor_set and
saves it through ggml_backend_tensor_get, as the pinned llama.cpp does (fakellama.c state_io_t,
fakeggml.h); FAKELLAMA_TENSOR_MEMCPY[_AFTER] turn that off for loads, FAKELLAMA_TENSOR_GET_MEMCPY
for saves.

usage: tensor_set.py CASE --host PREFIXHOST --fakehost FAKEHOST --fakellama LIBFAKELLAMA
                     --preload LIBTENSORSET_COUNT

The engines run with LD_PRELOAD=libtensorset_count.so, an interposer of ggml_backend_tensor_set
and ggml_backend_tensor_get that counts each one's calls and bytes and prints them at exit
(tensorset_count.c). A state of n cells of a model of L layers of n_embd holds
n * L * (n_embd + 8) bytes of K and V (fakellama.c body_write): every one of them must reach the
fake's KV through ggml_backend_tensor_set by default, none with FAKELLAMA_TENSOR_MEMCPY=1, and
come out of it into a saved state through ggml_backend_tensor_get by default, none with
FAKELLAMA_TENSOR_GET_MEMCPY=1; every output line (and saved file) must be the same as the
engine's without the interposer in every mode.

Cases (ctest tensorset_fake_<case>):
  set-data      prefixhost: a sequence copied into another (llama_state_seq_get_data +
                llama_state_seq_set_data) and decoded on, V in rows and V transposed
                (flash_attn_type 0): the state's K+V bytes in 2L (rows) or 5L (transposed:
                one run per layer for K, one per V element for V) calls; 0 calls with
                FAKELLAMA_TENSOR_MEMCPY=1; identical lines
  memcpy-after  two loads in one process under FAKELLAMA_TENSOR_MEMCPY_AFTER=0, 1, 2: the first
                N loads' bytes through ggml, the others memcpy: identical lines
  files         fakehost on libfakellama.so itself (dlopen RTLD_LOCAL, dlsym'ed calls): a
                sequence state file, a session file of two sequences, a set_data: every
                state's bytes through ggml; none with FAKELLAMA_TENSOR_MEMCPY=1; identical lines
  through       the interposer inverts the last byte of every write: a copied sequence, a
                loaded sequence file and session no longer hold their KV (fakehost's check),
                and prefixhost's outputs on a copied sequence change: the fake's KV is what
                ggml_backend_tensor_set wrote, never read from the state beside it; with
                FAKELLAMA_TENSOR_MEMCPY=1 (no call) they hold it
  bounds        the interposer moves every write one byte past its tensor's end: libfakeggml's
                GGML_ASSERT aborts the engine ("tensor write out of bounds")
  get-data      prefixhost: llama_state_seq_get_data, llama_state_get_data (statehash: length
                and XXH3) and a copied sequence, V in rows and transposed, one stream per
                sequence and unified: each save's K+V bytes in 2L or 5L tensor_get calls; 0
                with FAKELLAMA_TENSOR_GET_MEMCPY=1; identical lines (the same state bytes)
  save-files    fakehost: llama_state_seq_save_file and llama_state_save_file: every K+V byte
                through tensor_get; 0 calls with FAKELLAMA_TENSOR_GET_MEMCPY=1; the files'
                bytes identical to the reference's
  get-through   the interposer inverts the last byte each tensor_get returns: the saved states
                change (statehash, the copied sequence's outputs; each file in exactly one byte
                per run): a state's tensor bytes are what ggml_backend_tensor_get read, never
                copied from the KV beside it; with FAKELLAMA_TENSOR_GET_MEMCPY=1 they do not
"""
import os
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from harness import ScriptContext, check, require  # noqa: E402
import harness  # noqa: E402

N_LAYER, N_EMBD = 3, 40
KV_BYTES = N_LAYER * (N_EMBD + 8)  # a cell's K and V bytes in a state
V_ELEMENTS = 4                     # fakellama.c FAKE_V_ROW / FAKE_V_EL


class Ctx(ScriptContext):
    group = "tensorset"
    what = "prefixhost"

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.model = self.p("m.gguf")
        self.on_fakehost = False  # True: fakehost on libfakellama.so runs the commands

    def argv(self, cmds):
        if self.on_fakehost:
            return [self.args.fakehost, self.args.fakellama] + list(cmds)
        return [self.args.host] + list(cmds)

    def head(self):
        return [f"mkmodel {self.model} tensorset {N_LAYER} {N_EMBD} 4 7", f"model 0 {self.model}"]


def counted(err, what, fn="set"):
    """(calls, bytes) of ggml_backend_tensor_<fn> from the interposer's exit line."""
    m = re.search(rf"^tensor{fn} calls=(\d+) bytes=(\d+)$", err, re.M)
    require(m, f"{what}: no 'tensor{fn} calls=' line from the interposer; stderr:\n{err[-2000:]}")
    return int(m.group(1)), int(m.group(2))


def reference(ctx, cmds):
    """The lines of cmds without the interposer and without FAKELLAMA_* settings."""
    return ctx.run(cmds, preload=False, what=f"{ctx.what} (reference)")[0]


def compare(ctx, cmds, ref, what, calls, nbytes, get=None, **extra):
    """Runs cmds with the interposer (extra: the environment): the reference's lines, and the
    interposer saw calls calls (None: any) of nbytes bytes in all of ggml_backend_tensor_set,
    and with get = (calls, bytes) as many of ggml_backend_tensor_get (None: not checked)."""
    got, err, _ = ctx.run(cmds, what=what, **extra)
    check(len(got) == len(ref), f"{what}: {len(got)} lines, the reference {len(ref)}")
    for i, (a, b) in enumerate(zip(ref, got)):
        check(a == b, f"{what}: command {i} '{cmds[i]}' differs from the reference:\n"
                      f"  reference: {a}\n  {what}: {b}")
    for fn, want in (("set", (calls, nbytes)), ("get", get)):
        if want is None:
            continue
        c, n = counted(err, what, fn)
        check(n == want[1], f"{what}: {n} bytes through ggml_backend_tensor_{fn}, want {want[1]}")
        check(want[0] is None or c == want[0],
              f"{what}: {c} ggml_backend_tensor_{fn} calls, want {want[0]}")
        print(f"{what}: {len(cmds)} commands identical, tensor_{fn} {c} calls, {n} bytes")
    return got


def set_data_cmds(ctx, flash):
    return ctx.head() + [f"ctx 0 0 2 1 512 512 512 1 0 {flash}", "prompt 0 0 r300@1",
                         "copyseq 0 0 1", "prompt 0 1 r8@5", "gen 0 1 3", "pos 0 1"]


def case_set_data(ctx):
    for flash, runs in ((-1, 2 * N_LAYER), (0, N_LAYER + V_ELEMENTS * N_LAYER)):
        cmds = set_data_cmds(ctx, flash)
        what = f"set_data, flash_attn_type {flash}"
        ref = reference(ctx, cmds)
        check(re.fullmatch(r"copyseq get=\d+ set=[1-9]\d*", ref[4]) is not None,
              f"{what}: the state loaded: {ref[4]}")
        saved = (runs, 300 * KV_BYTES)  # copyseq's get_data
        compare(ctx, cmds, ref, what, runs, 300 * KV_BYTES, get=saved)
        compare(ctx, cmds, ref, f"{what}, FAKELLAMA_TENSOR_MEMCPY=1", 0, 0, get=saved,
                FAKELLAMA_TENSOR_MEMCPY=1)


def case_memcpy_after(ctx):
    cmds = ctx.head() + ["ctx 0 0 2 1 512", "prompt 0 0 r300@1", "copyseq 0 0 1",
                         "prompt 0 0 r100@2", "copyseq 0 0 1", "prompt 0 1 r8@5", "pos 0 1"]
    first, second = 300 * KV_BYTES, 400 * KV_BYTES
    ref = reference(ctx, cmds)
    for after, calls, nbytes in ((0, 0, 0), (1, 2 * N_LAYER, first),
                                 (2, 4 * N_LAYER, first + second)):
        compare(ctx, cmds, ref, f"FAKELLAMA_TENSOR_MEMCPY_AFTER={after}", calls, nbytes,
                get=(4 * N_LAYER, first + second), FAKELLAMA_TENSOR_MEMCPY_AFTER=after)


def case_files(ctx):
    ctx.on_fakehost = True
    seq_file, session = ctx.p("seq.bin"), ctx.p("session.bin")
    cmds = ctx.head() + ["ctx 0 0 2", "decode 0 0 r200@1", "decode 0 1 r50@2",
                         f"save 0 0 {seq_file}", "clear 0 0", f"load 0 0 {seq_file}",
                         f"savectx 0 0 {session}", "clear 0 0", "clear 0 1",
                         f"loadctx 0 0 {session}", "check 0 0", "copyseq 0 0 0 1"]
    # the sequence file (200 cells), the session (200 + 50), the copy (200)
    nbytes = (200 + 250 + 200) * KV_BYTES
    ref = reference(ctx, cmds)
    check(ref[-2] == "check 1", f"the session's sequence 0 holds its KV: {ref[-2]}")
    # saved the same: the sequence file, the session's two sequences, the copy's get_data
    saved = (4 * 2 * N_LAYER, nbytes)
    compare(ctx, cmds, ref, "file loads", 4 * 2 * N_LAYER, nbytes, get=saved)
    compare(ctx, cmds, ref, "file loads, FAKELLAMA_TENSOR_MEMCPY=1", 0, 0, get=saved,
            FAKELLAMA_TENSOR_MEMCPY=1)


def case_through(ctx):
    cmds = set_data_cmds(ctx, 0)
    ref = reference(ctx, cmds)
    got, _, _ = ctx.run(cmds, what="prefixhost, writes altered", TENSORSET_FLIP_LAST=1)
    check(got[5:7] != ref[5:7], "the altered writes change the outputs on the copied sequence:\n"
                                f"  reference: {ref[5:7]}\n  altered:   {got[5:7]}")
    ctx.on_fakehost = True
    seq_file, session = ctx.p("seq.bin"), ctx.p("session.bin")
    # (the files are saved before any load: a state saved from altered KV would be altered back)
    cmds = ctx.head() + ["ctx 0 0 2", "decode 0 0 r200@1", "decode 0 1 r50@2",
                         f"save 0 0 {seq_file}", f"savectx 0 0 {session}", "copyseq 0 0 0 1",
                         f"load 0 0 {seq_file}", f"loadctx 0 0 {session}"]
    loads = ("copyseq", "load", "loadctx")
    for extra, held in (({}, "1"), ({"TENSORSET_FLIP_LAST": 1}, "0"),
                        ({"TENSORSET_FLIP_LAST": 1, "FAKELLAMA_TENSOR_MEMCPY": 1}, "1")):
        lines, err, _ = ctx.run(cmds, what=f"fakehost {extra}", **extra)
        for line in lines:
            if line.split()[0] in loads:
                check(f"check={held}" in line.split(), f"fakehost {extra}: {line} (want "
                                                       f"check={held})\nstderr:\n{err[-2000:]}")


def case_bounds(ctx):
    cmds = set_data_cmds(ctx, -1)
    env = ctx.env(TENSORSET_PAST_END=1)
    p = subprocess.run(ctx.argv(cmds), capture_output=True, text=True, env=env,
                       timeout=ctx.timeout)
    check(p.returncode == -signal.SIGABRT, f"the engine aborted: exit {p.returncode}\n"
                                           f"stderr:\n{p.stderr[-2000:]}")
    check("GGML_ASSERT(offset + size <= ggml_nbytes(tensor)" in p.stderr and
          "tensor write out of bounds" in p.stderr, f"the bounds check's message:\n{p.stderr}")


def get_data_cmds(ctx, flash, unified):
    """Saves of a sequence, of the context with one and with two sequences (unified: the second
    after the first in the one stream's tensors), the copy's; then outputs on the copy."""
    return ctx.head() + [f"ctx 0 0 2 1 1024 512 512 1 {unified} {flash}", "prompt 0 0 r300@1",
                         "statehash 0 0", "statehash 0 all", "copyseq 0 0 1", "statehash 0 all",
                         "gen 0 1 3", "pos 0 1"]


def case_get_data(ctx):
    for flash, runs in ((-1, 2 * N_LAYER), (0, N_LAYER + V_ELEMENTS * N_LAYER)):
        for unified in (0, 1):
            cmds = get_data_cmds(ctx, flash, unified)
            what = f"get_data, flash_attn_type {flash}, kv_unified {unified}"
            ref = reference(ctx, cmds)
            check(re.fullmatch(r"copyseq get=\d+ set=[1-9]\d*", ref[6]) is not None,
                  f"{what}: the state loaded: {ref[6]}")
            # statehash of the sequence, of the context (one sequence), copyseq, of the context
            # (two sequences)
            compare(ctx, cmds, ref, what, runs, 300 * KV_BYTES, get=(5 * runs, 1500 * KV_BYTES))
            compare(ctx, cmds, ref, f"{what}, FAKELLAMA_TENSOR_GET_MEMCPY=1", runs,
                    300 * KV_BYTES, get=(0, 0), FAKELLAMA_TENSOR_GET_MEMCPY=1)


def save_files_cmds(ctx, tag):
    return ctx.head() + ["ctx 0 0 2", "decode 0 0 r200@1", "decode 0 1 r50@2",
                         f"save 0 0 {ctx.p(tag + '-seq.bin')}",
                         f"savectx 0 0 {ctx.p(tag + '-session.bin')}"]


def saved_files(ctx, tag):
    out = []
    for name in ("seq", "session"):
        with open(ctx.p(f"{tag}-{name}.bin"), "rb") as f:
            out.append(f.read())
    return out


def case_save_files(ctx):
    ctx.on_fakehost = True
    ref = ctx.run(save_files_cmds(ctx, "ref"), preload=False, what="fakehost (reference)")[0]
    want = saved_files(ctx, "ref")
    check(all(want), "the reference saved both files")
    # the sequence file (200 cells), the session (200 + 50)
    saved = (3 * 2 * N_LAYER, (200 + 250) * KV_BYTES)
    for tag, get, extra in (("ggml", saved, {}),
                            ("memcpy", (0, 0), {"FAKELLAMA_TENSOR_GET_MEMCPY": 1})):
        what = f"file saves, {extra or 'through ggml'}"
        compare(ctx, save_files_cmds(ctx, tag), ref, what, 0, 0, get=get, **extra)
        for name, a, b in zip(("sequence file", "session file"), want, saved_files(ctx, tag)):
            check(a == b, f"{what}: the {name} differs from the reference's")


def case_get_through(ctx):
    flip = {"TENSORGET_FLIP_LAST": 1}
    cmds = get_data_cmds(ctx, 0, 0)
    ref = reference(ctx, cmds)
    got = ctx.run(cmds, what="prefixhost, reads altered", **flip)[0]
    for i in (4, 5, 7, 8):  # the statehash lines, gen 0 1 3
        check(got[i] != ref[i], f"the altered reads change '{cmds[i]}': {got[i]}")
    compare(ctx, cmds, ref, "prefixhost, reads altered, FAKELLAMA_TENSOR_GET_MEMCPY=1",
            None, 300 * KV_BYTES, get=(0, 0), FAKELLAMA_TENSOR_GET_MEMCPY=1, **flip)
    ctx.on_fakehost = True
    ctx.run(save_files_cmds(ctx, "ref"), preload=False, what="fakehost (reference)")
    want = saved_files(ctx, "ref")
    ctx.run(save_files_cmds(ctx, "flip"), what="fakehost, reads altered", **flip)
    # one byte per run: 2L for the sequence file, 2 x 2L for the session's two sequences
    for name, a, b, runs in zip(("sequence file", "session file"), want,
                                saved_files(ctx, "flip"), (2 * N_LAYER, 4 * N_LAYER)):
        diff = sum(1 for x, y in zip(a, b) if x != y)
        check(len(a) == len(b) and diff == runs,
              f"reads altered: the {name} differs in {diff} bytes, want {runs} (one per run)")
    ctx.run(save_files_cmds(ctx, "memcpy"), what="fakehost, reads altered, memcpy",
            FAKELLAMA_TENSOR_GET_MEMCPY=1, **flip)
    check(saved_files(ctx, "memcpy") == want,
          "reads altered, FAKELLAMA_TENSOR_GET_MEMCPY=1: the files are the reference's")


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()),
                          harness.parser(__doc__, "--host", "--fakehost", "--fakellama",
                                         "--preload"), Ctx))
