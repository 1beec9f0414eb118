#!/usr/bin/env python3
"""ctest driver: one copy per node (issue 13, design §3.5) with refengine processes and
`kvshim serve` in one group.

usage: kvo_copy_test.py CASE --engine REFENGINE --preload LIBKVSHIM --cli KVSHIM
                        [--asan-runtime LIBASAN]

Cases:
  one-copy      serve + 4 engines sharing an 8-chunk prefix, all alive when counted: every
                chunk exists once in the node (sum of store_used_bytes over `kvshim stats
                --json` == the distinct chunk bytes), the engines keep nothing, outputs exact
  own-copy      KVSHIM_ONE_COPY=0: engines keep their own copies and write behind to serve
                (the behaviour before one copy per node)
  inline        KVSHIM_STRATEGY=inline: stores keep an own copy + write-behind, loads come
                from serve (the reply copied into the buffer)
  no-peer       no cache peer: the second engine loads the prefix from the first and keeps it
                (today's behaviour); no cache_peer_* counter moves, the pool is not limited
  kill-store    serve frozen, then SIGKILLed while an engine stores into it: the engine stays
                exact, falls back to its own pool (cache_peer_fallbacks), leaks no pin, and
                stores into a restarted serve again
  kill-load     serve SIGKILLed while an engine loads the shared prefix from it: the engine
                stays exact (the engine computes what it could not load), counts the fallback
  lean          the engine's pool is limited to KVSHIM_POOL_LEAN_SIZE while a cache peer is
                there, and the one-copy path falls back to it when serve refuses (pool full)
"""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from harness import Context, check, finish, read_line, read_stats  # noqa: E402
import harness  # noqa: E402
from kvo_test import parse_output as parse, wait_summary  # noqa: E402

# chunk = 4 layers x K,V x 64 tokens x 2 heads x 16 x f32 = 64 KiB
C = 64
SMALL = ["--chunk-tokens", str(C), "--layers", "4", "--kv-heads", "2", "--head-dim", "16",
         "--hidden", "32"]
CHUNK = 4 * 2 * C * 2 * 16 * 4
# 512 KiB chunks, each request its own 16-chunk prefix (a long run of stores and loads)
BIG = ["--chunk-tokens", str(C), "--layers", "8", "--kv-heads", "4", "--head-dim", "32",
       "--hidden", "32"]


class Ctx(Context):
    # RPC deadline: these cases check where chunks go, not how fast a peer answers. On a
    # loaded 2-core machine (load 10+, ASan) serve or an engine was seen to answer HELLO,
    # LOOKUP and PREPARE_STORE after the 2 s default (the caller then falls back by design),
    # so every process here waits up to 60 s. A SIGSTOPped serve is SIGKILLed, which ends a
    # call waiting on it at once.
    defaults = {"KVSHIM_HOST_POOL_SIZE": "64M", "KVSHIM_RPC_TIMEOUT_MS": "60000"}

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.engine = args.engine


def until_summary(p, what, timeout=120):
    return wait_summary(p, what, timeout)


def node_stats(ctx):
    p = subprocess.run([ctx.kvshim, "stats", "--json"], capture_output=True, text=True,
                       env=ctx.env(preload=False), timeout=120)
    check(p.returncode == 0, f"kvshim stats: exit {p.returncode}: {p.stderr}")
    return json.loads(p.stdout)


def live_stats(ctx, p, what):
    """The counters of a live engine (kvshim stats PID --json): SIGTERM ends refengine's hold
    without writing KVSHIM_STATS."""
    r = subprocess.run([ctx.kvshim, "stats", str(p.pid), "--json"], capture_output=True,
                       text=True, env=ctx.env(preload=False), timeout=120)
    check(r.returncode == 0, f"kvshim stats {what}: exit {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


def run(ctx, args, env, what):
    p = subprocess.run([ctx.engine] + args, capture_output=True, text=True, env=env, timeout=120)
    check(p.returncode == 0, f"{what}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return parse(p.stdout, what)


def proc_state(p):
    """Each thread's state and kernel wait channel (why a process did not end)."""
    out = []
    try:
        tasks = sorted(os.listdir(f"/proc/{p.pid}/task"))
    except OSError:
        tasks = []
    for t in tasks:
        try:
            with open(f"/proc/{p.pid}/task/{t}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{p.pid}/task/{t}/wchan") as f:
                out.append(f"{t}:{st}:{f.read().strip()}")
        except OSError:
            pass
    return " ".join(out) or "gone"


def stop(p, what):
    p.send_signal(signal.SIGTERM)
    try:
        finish(p, 30, what)
    except harness.Failure as e:
        raise harness.Failure(f"{e} (threads: {proc_state(p)})")


def case_one_copy(ctx):
    serve = ctx.serve()
    n, prefix, suffix = 4, 8, 2
    args = ["--requests", "1", "--prompt-tokens", str((prefix + suffix) * C),
            "--prefix-tokens", str(prefix * C), *SMALL, "--verify", "--hold-ms", "120000"]
    engines = []
    for r in range(n):  # one after another: each later one loads the prefix from serve
        e = ctx.spawn([ctx.engine] + args + ["--rank", str(r)],
                      ctx.env(KVSHIM_STATS=ctx.stats_path(f"e{r}")), text=True)
        reqs, summ = until_summary(e, f"engine {r}")
        check(summ["verify"] == "ok" and summ["kvo_errors"] == 0, f"engine {r}: {summ}")
        want_loaded = 0 if r == 0 else prefix
        check(reqs[0]["loaded"] == want_loaded, f"engine {r} request 0: {reqs[0]}")
        engines.append(e)
    stats = node_stats(ctx)
    check(len(stats) == n + 1, f"{len(stats)} peers in the node, expected {n + 1}")
    used = sum(s["store_used_bytes"] for s in stats)
    # distinct chunks: the shared prefix once, each engine's own suffix
    distinct = (prefix + suffix * n) * CHUNK
    ratio = used / distinct
    print(f"node bytes in use {used}, distinct {distinct}: {ratio:.3f}")
    check(ratio <= 1.1, f"node bytes in use / distinct = {ratio:.3f} (> 1.1)")
    for r, e in enumerate(engines):
        s = live_stats(ctx, e, f"engine {r}")
        check(s["cache_peer_stores"] == (prefix + suffix if r == 0 else suffix),
              f"engine {r} cache_peer_stores {s['cache_peer_stores']}: {s}")
        check(s["cache_peer_loads"] == (0 if r == 0 else prefix),
              f"engine {r} cache_peer_loads {s['cache_peer_loads']}: {s}")
        check(s["store_committed_objects"] == 0 and s["push_queued"] == 0,
              f"engine {r} kept its own copy: {s}")
        check(s["cache_peer_fallbacks"] == 0 and s["hook_fallbacks"] == 0, f"engine {r}: {s}")
        check(s["peer_lookups"] <= 1, f"engine {r}: a prefix cost {s['peer_lookups']} lookups")
    for r, e in enumerate(engines):
        stop(e, f"engine {r}")
    stop(serve, "kvshim serve")


def case_own_copy(ctx):
    serve = ctx.serve()
    args = ["--requests", "1", "--prompt-tokens", str(10 * C), "--prefix-tokens",
            str(8 * C), *SMALL, "--verify"]
    _, summ = run(ctx, args + ["--rank", "0"],
                  ctx.env(KVSHIM_ONE_COPY=0, KVSHIM_STATS=ctx.stats_path("a")), "A")
    s = read_stats(ctx.stats_path("a"))
    check(s["store_committed_objects"] == 10 and s["push_sent"] == 10, f"A: {s}")
    check(s["cache_peer_stores"] == 0 and s["cache_peer_loads"] == 0, f"A: {s}")
    stop(serve, "kvshim serve")


def case_inline(ctx):
    # KVSHIM_STRATEGY=inline: serve's pool is not mapped, so stores cannot go into it: the
    # engine keeps its own copy and writes it behind (no fallback counted); loads still come
    # from serve (the reply copied into the buffer).
    serve = ctx.serve()
    args = ["--requests", "1", "--prompt-tokens", str(10 * C), "--prefix-tokens",
            str(8 * C), *SMALL, "--verify"]
    run(ctx, args + ["--rank", "0"],
        ctx.env(KVSHIM_STRATEGY="inline", KVSHIM_STATS=ctx.stats_path("a")), "A")
    s = read_stats(ctx.stats_path("a"))
    check(s["store_committed_objects"] == 10 and s["push_queued"] == 10, f"A: {s}")
    check(s["cache_peer_stores"] == 0 and s["cache_peer_fallbacks"] == 0, f"A: {s}")
    reqs, summ = run(ctx, args + ["--rank", "1"],
                     ctx.env(KVSHIM_STRATEGY="inline", KVSHIM_STATS=ctx.stats_path("b")), "B")
    s = read_stats(ctx.stats_path("b"))
    check(reqs[0]["loaded"] == 8 and summ["verify"] == "ok", f"B: {reqs}")
    check(s["cache_peer_loads"] == 8, f"B: {s}")
    stop(serve, "kvshim serve")


def case_no_peer(ctx):
    args = ["--requests", "1", "--prompt-tokens", str(10 * C), "--prefix-tokens",
            str(8 * C), *SMALL, "--verify"]
    a = ctx.spawn([ctx.engine] + args + ["--rank", "0", "--hold-ms", "120000"],
                  ctx.env(KVSHIM_STATS=ctx.stats_path("a")), text=True)
    until_summary(a, "A")
    reqs, summ = run(ctx, args + ["--rank", "1"], ctx.env(KVSHIM_STATS=ctx.stats_path("b"),
                                                          KVSHIM_POOL_LEAN_SIZE="1M"), "B")
    stop(a, "A")
    s = read_stats(ctx.stats_path("b"))
    check(reqs[0]["loaded"] == 8 and summ["verify"] == "ok", f"B: {reqs}")
    # B kept what it loaded and what it computed, in a pool not limited to the lean size
    check(s["store_committed_objects"] == 10, f"B store_committed_objects: {s}")
    check(s["store_used_bytes"] == 10 * CHUNK, f"B store_used_bytes: {s['store_used_bytes']}")
    check(s["cache_peer_stores"] == 0 and s["cache_peer_loads"] == 0 and
          s["cache_peer_fallbacks"] == 0, f"B: {s}")


def big_engine(ctx, n, extra_env):
    args = ["--requests", str(n), "--prefix-groups", str(n), "--prompt-tokens", str(17 * C),
            "--prefix-tokens", str(16 * C), *BIG, "--verify", "--hold-ms", "120000"]
    return ctx.spawn([ctx.engine] + args + ["--rank", "1"],
                     ctx.env(**extra_env), text=True)


def case_kill_store(ctx):
    serve = ctx.serve("256M")
    e = big_engine(ctx, 60, {"KVSHIM_STATS": ctx.stats_path("e")})
    first = read_line(e, 60, "engine line 1")
    harness.stop_process(serve)  # a store in flight waits on it...
    # (long enough that the engine reaches a store while serve is stopped even when a request
    # computes slowly, ASan on a loaded machine: 0.3 s missed it once in five runs there)
    time.sleep(1.0)
    serve.send_signal(signal.SIGKILL)  # ...and fails
    serve.wait(timeout=30)
    harness.stop_process(e)
    serve2 = ctx.serve("256M")
    e.send_signal(signal.SIGCONT)
    reqs, summ = until_summary(e, "engine")
    reqs = [json.loads(first)] + reqs
    check(summ["verify"] == "ok" and summ["kvo_errors"] == 0, f"engine: {summ}")
    s = live_stats(ctx, e, "engine")
    check(s["cache_peer_fallbacks"] >= 1, f"no fallback counted: {s}")
    check(s["cache_peer_stores"] > 17, f"the engine never stored into serve again: {s}")
    check(s["hook_fallbacks"] == 0 and s["store_live_pins"] == 0, f"engine: {s}")
    check(s["hook_store_failures"] == 0, f"a store was lost: {s}")
    s2 = live_stats(ctx, serve2, "serve")
    check(s2["store_used_bytes"] > 0 and s2["store_live_pins"] == 0, f"restarted serve: {s2}")
    stop(e, "engine")
    stop(serve2, "kvshim serve")


def case_kill_load(ctx):
    serve = ctx.serve("256M")
    n = 20
    args = ["--requests", str(n), "--prefix-groups", str(n), "--prompt-tokens", str(17 * C),
            "--prefix-tokens", str(16 * C), *BIG]
    run(ctx, args + ["--rank", "0"], ctx.env(KVSHIM_STATS=ctx.stats_path("a")), "A")
    a = read_stats(ctx.stats_path("a"))  # A filled serve with every prefix
    check(a["cache_peer_stores"] == n * 17 and a["cache_peer_fallbacks"] == 0,
          f"A did not store every chunk into serve: {a}")
    # Progress on stderr as it happens: a run that ctest ends at its TIMEOUT still says where.
    print("kill-load: A stored every chunk into serve", file=sys.stderr, flush=True)
    e = big_engine(ctx, n, {"KVSHIM_STATS": ctx.stats_path("e")})
    first = json.loads(read_line(e, 60, "engine line 1"))
    check(first["loaded"] == 16, f"engine request 0 did not load the prefix from serve: {first}")
    print(f"kill-load: engine request 0: {first}", file=sys.stderr, flush=True)
    harness.stop_process(e)
    harness.stop_process(serve)  # the engine's next call to serve waits on it...
    e.send_signal(signal.SIGCONT)
    time.sleep(0.3)
    serve.send_signal(signal.SIGKILL)  # ...and fails
    serve.wait(timeout=30)
    print("kill-load: serve killed", file=sys.stderr, flush=True)
    _, summ = until_summary(e, "engine")
    check(summ["verify"] == "ok" and summ["kvo_errors"] == 0, f"engine: {summ}")
    s = live_stats(ctx, e, "engine")
    print("kill-load: engine done, stopping it", file=sys.stderr, flush=True)
    stop(e, "engine")
    check(s["cache_peer_loads"] >= 16, f"the engine did not load from serve first: {s}")
    check(s["cache_peer_fallbacks"] >= 1, f"no fallback counted: {s}")
    check(s["hook_fallbacks"] == 0 and s["store_live_pins"] == 0, f"engine: {s}")


def case_lean(ctx):
    # 2 MiB chunks, serve's pool 1 MiB: serve refuses every store (too large) and the engine
    # keeps the chunks itself, in an own pool the lean size (4 MiB) limits: it evicts instead
    # of growing to KVSHIM_POOL_SIZE.
    serve = ctx.serve("1M")
    args = ["--requests", "2", "--prefix-groups", "2", "--prompt-tokens", str(17 * C),
            "--prefix-tokens", str(16 * C), "--chunk-tokens", str(C), "--layers", "32",
            "--kv-heads", "4", "--head-dim", "32", "--hidden", "32", "--verify",
            "--hold-ms", "120000"]
    e = ctx.spawn([ctx.engine] + args, ctx.env(KVSHIM_POOL_LEAN_SIZE="4M"), text=True)
    _, summ = until_summary(e, "engine")
    check(summ["verify"] == "ok", f"engine: {summ}")
    s = live_stats(ctx, e, "engine")
    stop(e, "engine")
    check(s["cache_peer_fallbacks"] >= 1 and s["cache_peer_stores"] == 0, f"serve kept: {s}")
    check(s["store_used_bytes"] <= 4 << 20, f"own pool past the lean size: {s['store_used_bytes']}")
    check(s["store_evictions"] >= 1 and s["hook_stores"] >= 1, f"no eviction in the lean pool: {s}")
    stop(serve, "kvshim serve")


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()),
                          harness.parser(__doc__, "--engine", "--preload", "--cli",
                                         asan=True), Ctx))
