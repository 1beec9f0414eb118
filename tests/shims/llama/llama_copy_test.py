#!/usr/bin/env python3
"""ctest driver: the llama.cpp state adapter with a cache peer (issues 13 and 15): a state
saved by one fakehost process and pushed to `kvshim serve` is restored by another in place,
from serve's pool under its pin, with no copy into the loader's own pool.

usage: llama_copy_test.py CASE --host FAKEHOST --plugin FAKEPLUGIN --preload LIBKVSHIM
                          --cli KVSHIM [--asan-runtime LIBASAN]

Cases:
  inplace     write-through off: A saves straight into serve's pool (cache_peer_stores 1,
              nothing kept or pushed) and exits; B loads: the exact line of a load without
              kvshim, cache_peer_loads 1, nothing committed in B's pool
  inplace-wt  the same with write-through on: the file is written before the blob is published
              in serve's pool, so the blob records the file's identity and B's load is a hit
  own-copy    the same with KVSHIM_ONE_COPY=0: A keeps its copy and pushes it (write-behind), B
              fetches a copy into its own pool (as before)
  serve-stopped  A saves a state into serve under one path, serve is stopped (SIGSTOP), A saves it
              under another (KVSHIM_RPC_TIMEOUT_MS=2000): the save falls back to A's own pool
              (cache_peer_fallbacks), the state file is exact, A's load is a local hit; serve
              is then killed and started again: A's next save goes into the new serve
  get-data-fails  the engine's get_data fails while writing into serve's slot (write-through
              off): the real function writes the file (exact return value), serve publishes
              nothing and holds no reservation (aborted), A counts a store failure, not a store
  serve-gone  serve SIGKILLed between the save and the load: B's load falls back to the file
              (write-through on), exact line
  lean-after-serve  A (KVSHIM_POOL_LEAN_SIZE=1M, pool 64M) saves a state straight into serve, serve
              is killed, A saves a 1.5 MB state: with no cache peer left the own pool is the
              cache again, full size (the save path's cache-peer lookup sizes the pool, as the
              rest of the one-copy path does): kept (no store failure), loaded back exactly
"""
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "kvo"))
sys.path.insert(0, HERE)
from harness import check, read_stats, wait_file  # noqa: E402
import harness  # noqa: E402
from kvo_copy_test import live_stats  # noqa: E402
from llama_shim import (N_TOK, Ctx, baseline_save_load, fields, models,  # noqa: E402
                        save_uncacheable, stat_eq, stop_process)


def save_then_load(ctx, **env):
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    save_ret, load_line = baseline_save_load(ctx, a)
    l1, _, st1 = ctx.run([f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1", f"save 0 0 {f}"],
                         **env)
    check(fields(l1[3])["ret"] == str(save_ret), f"save: {l1}")
    if env.get("KVSHIM_ONE_COPY") == 0:  # own copy, written behind to serve
        stat_eq(st1, hook_stores=1, push_queued=1, cache_peer_stores=0)
        check(st1["store_committed_objects"] == 1, f"A kept no copy: {st1}")
    else:  # straight into serve's pool, nothing kept here
        stat_eq(st1, hook_stores=1, push_queued=0, cache_peer_stores=1, store_used_bytes=0)
    return a, f, load_line


def serve_round(ctx, **env):
    """A saves, B loads the same path, serve in the group: B's stats (its line checked)."""
    serve = ctx.serve()
    a, f, load_line = save_then_load(ctx, **env)
    if env.get("KVSHIM_LLAMA_WRITE_THROUGH") != 0:
        check(os.path.exists(f), "write-through: no state file")
    l2, e2, st2 = ctx.run([f"model 0 {a}", "ctx 0 0", f"load 0 0 {f}"], **env)
    check(l2[2] == load_line, f"load from serve: {l2[2]}\n{e2}")
    serve.send_signal(signal.SIGTERM)
    serve.communicate(timeout=30)
    return st2


def case_inplace(ctx):
    st2 = serve_round(ctx, KVSHIM_LLAMA_WRITE_THROUGH=0)
    stat_eq(st2, hook_hits=1, peer_hits=1, cache_peer_loads=1, cache_peer_fallbacks=0)
    check(st2["store_committed_objects"] == 0 and st2["store_used_bytes"] == 0,
          f"B copied the state into its own pool: {st2}")


def case_inplace_wt(ctx):
    st2 = serve_round(ctx)
    stat_eq(st2, hook_hits=1, cache_peer_loads=1, cache_peer_fallbacks=0, store_used_bytes=0)


def case_own_copy(ctx):
    st2 = serve_round(ctx, KVSHIM_LLAMA_WRITE_THROUGH=0, KVSHIM_ONE_COPY=0)
    stat_eq(st2, hook_hits=1, peer_hits=1, cache_peer_loads=0)
    check(st2["store_committed_objects"] == 1, f"B kept no copy: {st2}")


def case_serve_stopped(ctx):
    serve = ctx.serve()
    a, _, _ = models(ctx)
    f, f2 = ctx.p("s.bin"), ctx.p("s2.bin")
    ready, go, ready2, go2 = (ctx.p(x) for x in ("ready", "go", "ready2", "go2"))
    save_ret, load_line = baseline_save_load(ctx, a)
    # A first saves the state under another path straight into serve (cache_peer_stores 1: A is
    # connected to it), then serve stops and A saves the path it loads; then serve is killed, a
    # new one starts, and A's next save goes into it.
    cmds = [f"model 0 {a}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1", f"save 0 0 {ctx.p('w.bin')}",
            f"touch {ready}", f"waitfile {go}", f"save 0 0 {f}", "clear 0 0", f"load 0 0 {f}",
            f"touch {ready2}", f"waitfile {go2}", f"save 0 0 {f2}"]
    pa, sa = ctx.start(cmds, KVSHIM_RPC_TIMEOUT_MS=2000)
    serve2 = None
    try:
        wait_file(ready, "A ready", pa)
        stop_process(serve)  # every thread of serve stopped before A may send its next save
        with open(go, "w"):
            pass
        wait_file(ready2, "A at its second save", pa)
        serve.send_signal(signal.SIGKILL)
        serve.wait(timeout=30)
        serve2 = ctx.serve()
        time.sleep(0.3)  # past the peer discovery's rate limit (200 ms)
        with open(go2, "w"):
            pass
        lines, err = ctx.finish(pa, "A", len(cmds))
    finally:
        for s in (serve, serve2):
            if s and s.poll() is None:
                s.send_signal(signal.SIGKILL)
                s.wait(timeout=30)
    check(fields(lines[6])["ret"] == str(save_ret), f"save: {lines[6]}\n{err}")
    check(lines[8] == load_line, f"load: {lines[8]}\n{err}")
    check(fields(lines[11])["ret"] == str(save_ret), f"save after serve restarted: {lines[11]}")
    st = read_stats(sa)
    check(st["cache_peer_stores"] == 2,
          f"the saves before the stop and after the restart did not both go into serve: {st}")
    check(st["cache_peer_fallbacks"] >= 1, f"the failed store into serve was not counted: {st}")
    stat_eq(st, hook_stores=3, hook_hits=1)
    check(st["store_committed_objects"] == 1, f"A kept other than the one fallback copy: {st}")


def case_get_data_fails(ctx):
    serve = ctx.serve()
    a, _, _ = models(ctx)
    f = ctx.p("s.bin")
    save_ret, _ = baseline_save_load(ctx, a)
    _, _, st = save_uncacheable(ctx, a, f, save_ret)
    stat_eq(st, hook_stores=0, hook_store_failures=1, cache_peer_stores=0, store_used_bytes=0)
    s = live_stats(ctx, serve, "serve")
    check(s["store_objects"] == 0 and s["store_reserved_bytes"] == 0 and s["store_aborts"] >= 1,
          f"serve published or kept a reservation of the failed save: {s}")
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


def case_lean_after_serve(ctx):
    serve = ctx.serve()
    m = ctx.p("big.gguf")
    ctx.run([f"mkmodel {m} alpha 4 512 256 1"], preload=False)
    f1, f2 = ctx.p("s1.bin"), ctx.p("s2.bin")
    ready, go = ctx.p("ready"), ctx.p("go")
    save_ret, load_line = baseline_save_load(ctx, m)
    check(save_ret > 1 << 20, f"the state must be larger than the lean pool: {save_ret}")
    cmds = [f"model 0 {m}", "ctx 0 0", f"decode 0 0 r{N_TOK}@1", f"save 0 0 {f1}",
            f"touch {ready}", f"waitfile {go}", f"save 0 0 {f2}", "clear 0 0", f"load 0 0 {f2}"]
    pa, sa = ctx.start(cmds, KVSHIM_LLAMA_WRITE_THROUGH=0, KVSHIM_POOL_SIZE="64M",
                       KVSHIM_POOL_LEAN_SIZE="1M")
    try:
        wait_file(ready, "A ready", pa)
        serve.send_signal(signal.SIGKILL)
        serve.wait(timeout=30)
        time.sleep(0.3)  # past the peer discovery's rate limit (200 ms)
        with open(go, "w"):
            pass
        lines, err = ctx.finish(pa, "A", len(cmds))
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGKILL)
            serve.wait(timeout=30)
    check(fields(lines[3])["ret"] == str(save_ret), f"save into serve: {lines[3]}\n{err}")
    check(fields(lines[6])["ret"] == str(save_ret), f"save after serve died: {lines[6]}\n{err}")
    check(lines[8] == load_line, f"load of the state kept after serve died: {lines[8]}\n{err}")
    st = read_stats(sa)
    stat_eq(st, hook_stores=2, cache_peer_stores=1, hook_store_failures=0, hook_hits=1)
    check(st["store_committed_objects"] == 1,
          f"the state saved without a cache peer was not kept in the full-size pool: {st}")


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()),
                          harness.parser(__doc__, "--host", "--plugin", "--preload", "--cli",
                                         asan=True), Ctx))
