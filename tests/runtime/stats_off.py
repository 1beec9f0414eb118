#!/usr/bin/env python3
"""KVSHIM_STATS when kvshim is off (issue 16 item 6): every process that loaded libkvshim.so
with KVSHIM_STATS set and called at least one hooked function writes the file at exit, with
"enabled" (false under KVSHIM_ENABLE=0, true otherwise), so an A/B run reads both arms alike.

usage: stats_off.py CASE --engine REFENGINE --preload LIBKVSHIM [--asan-runtime LIBASAN]

Cases (ctest stats_fake_<case>, dashes as underscores):
  enable-0     refengine (kvo) with KVSHIM_ENABLE=0: the file exists, "enabled": false, the hook
               counters 0 (every hook passed through)
  enable-1     the same with KVSHIM_ENABLE=1: "enabled": true, hook calls counted, chunks stored
  no-hook      a process that loads libkvshim.so but calls no hooked function (/bin/true, as an
               unrelated child of an engine would) writes nothing
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
from harness import Context, check  # noqa: E402


class Ctx(Context):
    defaults = {"KVSHIM_POOL_SIZE": "64M", "KVSHIM_HOST_POOL_SIZE": "16M"}
    preload_env = {"ASAN_OPTIONS": "verify_asan_link_order=0"}


ENGINE_ARGS = ["--requests", "2", "--prompt-tokens", "320", "--prefix-tokens", "256",
               "--chunk-tokens", "64", "--layers", "4", "--kv-heads", "2", "--head-dim", "16",
               "--hidden", "32", "--kvo-buffer", "host"]


def run(ctx, argv, **extra):
    stats = ctx.stats_path()
    env = ctx.env(KVSHIM_STATS=stats, **extra)
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    check(p.returncode == 0, f"{argv[0]} exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p, stats


def load(stats, p):
    check(os.path.exists(stats), f"no stats file {stats}\n{p.stderr}")
    with open(stats) as f:
        return json.load(f)


def case_enable_0(ctx):
    p, stats = run(ctx, [ctx.args.engine] + ENGINE_ARGS, KVSHIM_ENABLE="0")
    st = load(stats, p)
    check(st.get("enabled") is False, f"\"enabled\": false: {st}")
    hooks = {k: v for k, v in st.items() if k.startswith("hook_")}
    check("hook_calls" in hooks and not any(hooks.values()), f"hook counters 0 when off: {st}")


def case_enable_1(ctx):
    p, stats = run(ctx, [ctx.args.engine] + ENGINE_ARGS, KVSHIM_ENABLE="1")
    st = load(stats, p)
    check(st.get("enabled") is True, f"\"enabled\": true: {st}")
    check(st["hook_calls"] > 0 and st["hook_stores"] > 0, f"kvo served by kvshim: {st}")


def case_no_hook(ctx):
    p, stats = run(ctx, ["/bin/true"], KVSHIM_ENABLE="0")
    check(not os.path.exists(stats), f"a process calling no hook wrote {stats}")
    p, stats = run(ctx, ["/bin/true"], KVSHIM_ENABLE="1")
    check(not os.path.exists(stats), f"a process calling no hook wrote {stats}")


CASES = {"enable-0": case_enable_0, "enable-1": case_enable_1, "no-hook": case_no_hook}


if __name__ == "__main__":
    sys.exit(harness.main(CASES, harness.parser(__doc__, "--engine", "--preload", asan=True), Ctx))
