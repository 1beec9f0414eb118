#!/usr/bin/env python3
"""KVSHIM_HOOKS=auto (the default): a hook family is enabled only when its library is in the
process (design §11), found through the loaded objects, with one info line per family.

usage: preload_hooks_auto.py CASE --engine REFENGINE --host FAKEHOST --plugin LIBFAKEPLUGIN
                             --preload LIBKVSHIM [--asan-runtime LIBASAN]

Cases (ctest preload_fake_<case>, dashes as underscores):
  auto-without-llama  refengine (kvo module + libcuda, no libllama): "llama.cpp: not in the
                 process", the kvo and cuda families found with their libraries, kvo chunks
                 stored by kvshim
  auto-with-llama     fakehost, whose plugin (dlopen'ed RTLD_LOCAL after start) pulls in
                 libfakellama: "llama.cpp: libfakellama.so, 12/12 hooks interposable", kvo and
                 cuda not in the process, the saved state cached by kvshim
  auto-explicit       refengine with KVSHIM_HOOKS=llama: the llama family is on although its library
                 is absent ("enabled by KVSHIM_HOOKS"); kvo and cuda are off, so kvshim
                 stores nothing and counts no hook call
Each family's line appears exactly once per process.
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
from harness import Context, check  # noqa: E402


class Ctx(Context):
    defaults = {"KVSHIM_POOL_SIZE": "64M", "KVSHIM_HOST_POOL_SIZE": "16M", "KVSHIM_LOG": "info"}
    preload_env = {"ASAN_OPTIONS": "verify_asan_link_order=0"}


FAMILIES = ("cuda", "llama.cpp", "llama.cpp prefix cache", "kvo")
ENGINE_ARGS = ["--requests", "2", "--prompt-tokens", "320", "--prefix-tokens", "256",
               "--chunk-tokens", "64", "--layers", "4", "--kv-heads", "2", "--head-dim", "16",
               "--hidden", "32", "--kvo-buffer", "host"]


def family_lines(err):
    """family -> the text after "<family>: " of its availability line, one per family."""
    out = {}
    for line in err.splitlines():
        m = re.search(r"info: (cuda|llama\.cpp prefix cache|llama\.cpp|kvo): (.*)$", line)
        if not m or " resolved in " in m.group(2) or m.group(2).startswith(("model ", "context ")):
            continue
        text = m.group(2)
        if not (text.startswith(("not in the process", "enabled by")) or
                "hooks interposable" in text):
            continue
        check(m.group(1) not in out, f"two lines for {m.group(1)}:\n{err}")
        out[m.group(1)] = text
    return out


def run(ctx, argv, **extra):
    stats = ctx.stats_path()
    env = ctx.env(KVSHIM_STATS=stats, **extra)
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    check(p.returncode == 0, f"{argv[0]} exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    with open(stats) as f:
        return p, json.load(f)


def case_without_llama(ctx):
    p, st = run(ctx, [ctx.args.engine] + ENGINE_ARGS)
    fams = family_lines(p.stderr)
    check(fams.get("llama.cpp", "").startswith("not in the process"), f"llama: {fams}")
    check(fams.get("llama.cpp prefix cache", "").startswith("not in the process"), f"{fams}")
    check(fams.get("kvo") == "libkvo_default.so, 3/3 hooks interposable", f"kvo: {fams}")
    check(re.fullmatch(r"libcuda\.so[.0-9]*, \d+/\d+ hooks interposable", fams.get("cuda", "")),
          f"cuda: {fams}")
    check(st["hook_stores"] > 0, f"kvo chunks stored by kvshim: {st}")


def case_with_llama(ctx):
    m, s = ctx.p("m.gguf"), ctx.p("s.bin")
    p, st = run(ctx, [ctx.args.host, ctx.args.plugin, f"mkmodel {m} a 2 8 4 1", f"model 0 {m}",
                            "ctx 0 0", "decode 0 0 1-40", f"save 0 0 {s}"])
    fams = family_lines(p.stderr)
    check(fams.get("llama.cpp") == "libfakellama.so, 12/12 hooks interposable", f"{fams}")
    check(fams.get("kvo", "").startswith("not in the process"), f"kvo: {fams}")
    check(fams.get("cuda", "").startswith("not in the process"), f"cuda: {fams}")
    check(st["hook_stores"] == 1, f"the save is cached: {st}")


def case_explicit(ctx):
    p, st = run(ctx, [ctx.args.engine] + ENGINE_ARGS, KVSHIM_HOOKS="llama")
    fams = family_lines(p.stderr)
    check(fams.get("llama.cpp") == "enabled by KVSHIM_HOOKS", f"llama: {fams}")
    check("kvo" not in fams and "cuda" not in fams, f"kvo and cuda are off: {fams}")
    check(st["hook_stores"] == 0 and st["hook_calls"] == 0, f"nothing served: {st}")


CASES = {"auto-without-llama": case_without_llama, "auto-with-llama": case_with_llama,
         "auto-explicit": case_explicit}


if __name__ == "__main__":
    sys.exit(harness.main(CASES, harness.parser(__doc__, "--engine", "--host", "--plugin",
                                                "--preload", asan=True), Ctx))
