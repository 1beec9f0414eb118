#!/usr/bin/env python3
"""ctest driver: the llama.cpp state adapter with a cache peer (issues 13 and 15): a state
saved by one fakehost process and pushed to `kvshim serve` is restored by another in place,
from serve's pool under its pin, with no copy into the loader's own pool.

usage: llama_copy_test.py CASE --host FAKEHOST --plugin FAKEPLUGIN --preload LIBKVSHIM
                          --cli KVSHIM [--asan-runtime LIBASAN]

Cases:
  inplace     write-through off: A saves (write-behind to serve) and exits; B loads: the exact
              line of a load without kvshim, cache_peer_loads 1, nothing committed in B's pool
  own-copy    the same with KVSHIM_ONE_COPY=0: B fetches a copy into its own pool (as before)
  serve-gone  serve SIGKILLed between the save and the load: B's load falls back to the file
              (write-through on), exact line
"""
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "fakellama"))
from harness import check  # noqa: E402
import harness  # noqa: E402
from llama_shim import N_TOK, Ctx, baseline_save_load, fields, models, stat_eq  # noqa: E402


def save_then_load(ctx, **env):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    save_ret, load_line = baseline_save_load(ctx, a)
    l1, _, st1 = ctx.run([f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1", f"save 0 0 {f}"],
                         **env)
    check(fields(l1[3])["ret"] == str(save_ret), f"save: {l1}")
    stat_eq(st1, hook_stores=1, push_queued=1)
    return a, f, load_line


def case_inplace(ctx):
    serve = ctx.serve()
    a, f, load_line = save_then_load(ctx, KVSHIM_LLAMA_WRITE_THROUGH=0)
    l2, e2, st2 = ctx.run([f"model 0 {a}", "ctx 0 0", f"load 0 0 {f}"],
                          KVSHIM_LLAMA_WRITE_THROUGH=0)
    check(l2[2] == load_line, f"load from serve: {l2[2]}\n{e2}")
    stat_eq(st2, hook_hits=1, peer_hits=1, cache_peer_loads=1, cache_peer_fallbacks=0)
    check(st2["store_committed_objects"] == 0 and st2["store_used_bytes"] == 0,
          f"B copied the state into its own pool: {st2}")
    serve.send_signal(signal.SIGTERM)
    serve.communicate(timeout=30)


def case_own_copy(ctx):
    serve = ctx.serve()
    a, f, load_line = save_then_load(ctx, KVSHIM_LLAMA_WRITE_THROUGH=0, KVSHIM_ONE_COPY=0)
    l2, e2, st2 = ctx.run([f"model 0 {a}", "ctx 0 0", f"load 0 0 {f}"],
                          KVSHIM_LLAMA_WRITE_THROUGH=0, KVSHIM_ONE_COPY=0)
    check(l2[2] == load_line, f"load from serve: {l2[2]}\n{e2}")
    stat_eq(st2, hook_hits=1, peer_hits=1, cache_peer_loads=0)
    check(st2["store_committed_objects"] == 1, f"B kept no copy: {st2}")
    serve.send_signal(signal.SIGTERM)
    serve.communicate(timeout=30)


def case_serve_gone(ctx):
    serve = ctx.serve()
    a, f, load_line = save_then_load(ctx)
    serve.send_signal(signal.SIGKILL)
    serve.wait(timeout=30)
    l2, e2, st2 = ctx.run([f"model 0 {a}", "ctx 0 0", f"load 0 0 {f}"])
    check(l2[2] == load_line, f"load from the file: {l2[2]}\n{e2}")
    stat_eq(st2, hook_hits=0, cache_peer_loads=0)


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()),
                          harness.parser(__doc__, "--host", "--plugin", "--preload", "--cli",
                                         asan=True), Ctx))
