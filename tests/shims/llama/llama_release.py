#!/usr/bin/env python3
"""ctest driver for the table of llama.cpp releases kvshim knows (shims/llama/model.h,
KVS_LLAMA_RELEASES), on tests/fakes/llama's prefixhost.

usage: llama_release.py CASE --host PREFIXHOST --preload LIBKVSHIM --cli KVSHIM
                        [--asan-runtime LIBASAN]

The prefix cache reads struct llama_context_params only when llama_context_default_params()
answers as a known release does (the fake answers as the pinned llama.cpp v0.4.0, whose
defaults node-llama-cpp 3.22.1's llama.cpp v0.5.0 shares). Every case runs its script without
kvshim first and then with it; every output line must be identical.

Cases:
  known    the pinned defaults: the known releases are named once at info level, prefixes are
           restored, no warning
  unknown  FAKELLAMA_DEFAULTS=unknown (one default altered, as another release would answer): the
           outputs are identical, the prefix cache passes every call through (nothing restored,
           stored or looked up), and exactly one warning names the known releases, however many
           contexts the process creates
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from harness import check  # noqa: E402
import harness  # noqa: E402
from llama_prefix import Ctx, P, P1000, expect, models, prefix_stats, same  # noqa: E402

KNOWN = ("node-llama-cpp 3.21.1 (llama.cpp v0.4.0), node-llama-cpp 3.22.1 (llama.cpp v0.5.0)")
WARNING = "unknown llama.cpp release"


def script(a):
    """Two contexts, each evaluating P then a prompt sharing its first 1000 tokens."""
    return [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P}", "gen 0 0 4",
            "clear 0", f"prompt 0 0 {P1000}", "gen 0 0 4",
            "ctx 1 0 1", f"prompt 1 0 {P1000}", "gen 1 0 4"]


def case_known(ctx):
    a, _ = models(ctx)
    st, err = same(ctx, script(a), "known")
    check(f"struct llama_context_params of a known release: {KNOWN}" in err,
          f"known: the info line naming the known releases is missing:\n{err[-3000:]}")
    check(err.count("struct llama_context_params of a known release") == 1,
          f"known: the release is reported more than once:\n{err[-3000:]}")
    check(WARNING not in err, f"known: warned about the pinned release:\n{err[-3000:]}")
    expect(st, "known", restores=(">=", 2))


def case_unknown(ctx):
    a, _ = models(ctx)
    st, err = same(ctx, script(a), "unknown", ref_extra={"FAKELLAMA_DEFAULTS": "unknown"},
                   FAKELLAMA_DEFAULTS="unknown")
    lines = [ln for ln in err.splitlines() if WARNING in ln]
    check(len(lines) == 1, f"unknown: {len(lines)} warnings, expected exactly one:\n{err[-3000:]}")
    check(KNOWN in lines[0] and "passes every call through" in lines[0],
          f"unknown: the warning does not say what happens and which releases are known:\n"
          f"{lines[0]}")
    ps = prefix_stats(st)
    check(all(ps.get(k, 0) == 0 for k in ("restores", "snapshots", "lookups")),
          f"unknown: the prefix cache did something with an unknown release: {ps}")


CASES = {"known": case_known, "unknown": case_unknown}

if __name__ == "__main__":
    sys.exit(harness.main(CASES, harness.parser(__doc__, "--host", "--preload", "--cli", asan=True),
                          Ctx))
