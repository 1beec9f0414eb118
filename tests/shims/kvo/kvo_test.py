#!/usr/bin/env python3
"""ctest driver for the kvo hooks of libkvshim.so (shims/kvo, design §10.1, §3, §7).

usage: kvo_test.py CASE --engine REFENGINE --preload LIBKVSHIM --cli KVSHIM --abi KVO_ABI
                   [--asan-runtime LIBASAN]

Every case runs in its own temporary KVSHIM_RUN_DIR; LD_PRELOAD is set only in the
environment of the engine processes it starts (never in this script's). The fake CUDA driver
comes from LD_LIBRARY_PATH (set by ctest through kvs_fakecuda_env).

Cases:
  abi             the ABI client (kvo_abi) with kvshim on, loaded-but-off, hooks off, and no
                  preload: bad input passes through unchanged, stores come back byte for byte
  peer-device     two refengine processes sharing a prefix: the second loads it from the
  peer-host       first through the peers (device or host kvo buffers), --verify passes
  salt            a second tenant (KVSHIM_SALT) does not see the first one's chunks
  serve           the first process stores into `kvshim serve` (one copy per node; then again
                  with KVSHIM_ONE_COPY=0: write-behind) and exits; a second one started
                  afterwards loads the prefix from serve
  disabled        KVSHIM_ENABLE=0 (and KVSHIM_HOOKS=cuda): stdout minus timings equals the
                  run without the preload; refengine --hold-ms checks
  pool-full       chunks larger than the pool: every store is counted as a failure and falls
                  back to the engine's module, results stay correct
  pool-small      a pool that holds a few chunks: eviction, prefetch that cannot keep
                  everything, still correct
  kill            the first process is SIGKILLed while the second retrieves from it: the
                  second stays correct and never waits past the RPC deadline
  hooks-kvo-only  KVSHIM_HOOKS=kvo (no CUDA shim, so no device copies): device buffers pass
                  through untouched, host buffers are served
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from harness import Context, Failure, check, finish, read_line, read_stats  # noqa: E402
import harness  # noqa: E402


# Small model: chunk = 4 layers x K,V x 64 tokens x 2 heads x 16 x f32 = 64 KiB.
C = 64
SMALL = ["--chunk-tokens", str(C), "--layers", "4", "--kv-heads", "2", "--head-dim", "16",
         "--hidden", "32"]
TIMING_KEYS = ("ttft_ms", "load_ms", "store_ms", "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p90",
               "compute_ms_per_chunk", "load_ms_per_chunk", "store_ms_per_chunk", "wall_ms")


class Ctx(Context):
    # RPC deadline: the cases check where chunks come from, not how fast a peer answers (the
    # kill case sets its own). On a loaded 2-core machine (load 10+, ASan) engines and serve
    # were seen to answer HELLO after the 2 s default (kvo_copy_test.py; the caller then
    # computes the chunk, by design), so every process here waits up to 60 s.
    defaults = {"KVSHIM_HOST_POOL_SIZE": "64M", "KVSHIM_RPC_TIMEOUT_MS": "60000"}

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.engine = args.engine
        self.abi = args.abi


def parse_output(out, what):
    objs = []
    for i, line in enumerate(out.splitlines()):
        try:
            objs.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise Failure(f"{what}: stdout line {i + 1} is not JSON ({e}): {line!r}")
    check(objs and objs[-1].get("summary") is True, f"{what}: no summary line in {out!r}")
    return objs[:-1], objs[-1]


def run_engine(ctx, args, env, what, timeout=120, expect_rc=0):
    p = subprocess.run([ctx.engine] + args, capture_output=True, text=True, env=env,
                       timeout=timeout)
    if p.returncode != expect_rc:
        raise Failure(f"{what}: exit {p.returncode}, expected {expect_rc}\n"
                      f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def wait_summary(p, what, timeout=120):
    """Read request lines until the summary (the process keeps running: --hold-ms)."""
    lines = []
    while True:
        line = read_line(p, timeout, what)
        lines.append(line)
        if '"summary":true' in line:
            return parse_output("".join(lines), what)


def socks(ctx):
    d = os.path.join(ctx.run_dir, "default")
    return sorted(f for f in os.listdir(d) if f.endswith(".sock")) if os.path.isdir(d) else []


def strip_timings(out):
    res = []
    for line in out.splitlines():
        o = json.loads(line)
        for k in TIMING_KEYS:
            o.pop(k, None)
        res.append(o)
    return res


def workload(prefix_chunks, suffix_chunks, requests, extra=()):
    return ["--requests", str(requests), "--prompt-tokens", str((prefix_chunks + suffix_chunks) * C),
            "--prefix-tokens", str(prefix_chunks * C), *SMALL, *extra]


# ---------------------------------------------------------------------------------------------

def check_off_stats(path):
    """KVSHIM_ENABLE=0 still writes KVSHIM_STATS (README): "enabled": false, no hook call."""
    check(os.path.exists(path), f"KVSHIM_ENABLE=0 wrote no stats ({path})")
    s = read_stats(path)
    check(s.get("enabled") is False and s["hook_calls"] == 0 and s["hook_stores"] == 0,
          f"KVSHIM_ENABLE=0 stats: {s}")


def case_abi(ctx):
    def run_abi(mode, env, what):
        p = subprocess.run([ctx.abi, mode], capture_output=True, text=True, env=env, timeout=120)
        check(p.returncode == 0 and p.stdout.strip() == "ok",
              f"{what}: exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")

    st = ctx.stats_path("abi-on")
    run_abi("on", ctx.env(KVSHIM_PEERS=0, KVSHIM_STATS=st), "kvshim on")
    s = read_stats(st)
    # 4 + 1 (present) + 520 + 4 threads x 50 x 8 stores reached the store path
    check(s["hook_stores"] >= 4 + 1 + 520 + 200 * 4, f"hook_stores: {s['hook_stores']}")
    check(s["hook_hits"] >= 4 + 1 + 200 * 4, f"hook_hits: {s['hook_hits']}")
    check(s["hook_fallbacks"] == 0, f"hook_fallbacks: {s['hook_fallbacks']}")
    check(s["store_objects"] >= 4 + 520, f"store_objects: {s['store_objects']}")
    # The device calls passed through without reaching the store.
    check(s["hook_store_failures"] <= 200 * 4 - 4, f"hook_store_failures: {s}")
    run_abi("off", ctx.env(KVSHIM_ENABLE=0, KVSHIM_STATS=ctx.stats_path("abi-off")),
            "KVSHIM_ENABLE=0")
    check_off_stats(ctx.stats_path("abi-off"))
    run_abi("off", ctx.env(KVSHIM_HOOKS="cuda", KVSHIM_PEERS=0), "KVSHIM_HOOKS=cuda")
    run_abi("off", ctx.env(preload=False), "no preload")


def peer_pair(ctx, buffer, a_env=None, b_env=None, prefix=8, suffix=2, requests=2):
    """A (rank 0) computes and holds; B (rank 1) shares the prefix. Returns both results."""
    args = workload(prefix, suffix, requests, ["--kvo-buffer", buffer])
    a = ctx.spawn([ctx.engine] + args + ["--rank", "0", "--verify", "--hold-ms", "120000"],
                  ctx.env(KVSHIM_STATS=ctx.stats_path("a"), **(a_env or {})))
    a_reqs, a_sum = wait_summary(a, "process A")
    check(len(socks(ctx)) == 1, f"A's socket: {socks(ctx)}")
    b = run_engine(ctx, args + ["--rank", "1", "--verify"],
                   ctx.env(KVSHIM_STATS=ctx.stats_path("b"), **(b_env or {})), "process B")
    b_reqs, b_sum = parse_output(b.stdout, "process B")
    a.terminate()
    a.communicate(timeout=30)
    return (a_reqs, a_sum), (b_reqs, b_sum, read_stats(ctx.stats_path("b")))


def check_pair(a, b, prefix=8, suffix=2, requests=2):
    (a_reqs, a_sum), (b_reqs, b_sum, bs) = a, b
    check(a_reqs[0]["loaded"] == 0 and a_reqs[0]["stored"] == prefix + suffix,
          f"A request 0: {a_reqs[0]}")
    check(a_sum["verify"] == "ok" and a_sum["kvo_errors"] == 0, f"A summary: {a_sum}")
    check(b_sum["verify"] == "ok" and b_sum["kvo_errors"] == 0, f"B summary: {b_sum}")
    check(b_reqs[0]["loaded"] == prefix and b_reqs[0]["computed"] == suffix,
          f"B request 0 did not load the shared prefix from A: {b_reqs[0]}")
    check(b_sum["chunks_loaded"] == prefix * requests, f"B summary: {b_sum}")
    check(b_sum["chunks_stored"] == suffix * requests, f"B stored its own chunks: {b_sum}")
    check(bs["peer_hits"] >= prefix, f"B peer_hits: {bs['peer_hits']}")
    check(bs["hook_hits"] == prefix * requests, f"B hook_hits: {bs['hook_hits']}")
    check(bs["hook_misses"] == 0 and bs["hook_fallbacks"] == 0, f"B misses/fallbacks: {bs}")
    check(bs["hook_stores"] == suffix * requests, f"B hook_stores: {bs['hook_stores']}")
    # One LOOKUP per kvo_lookup (the loads copy from the peer the lookup found, asking no
    # one again), and the loaded chunks are B's own objects now (kept behind the engine,
    # README "Peer hits go through the local store"; all kept by exit).
    check(bs["peer_lookups"] <= requests, f"B peer_lookups: {bs['peer_lookups']}")
    check(bs["store_committed_objects"] == prefix + suffix * requests,
          f"B store_committed_objects: {bs['store_committed_objects']}")


def case_peer_device(ctx):
    a, b = peer_pair(ctx, "device")
    check_pair(a, b)


def case_peer_host(ctx):
    a, b = peer_pair(ctx, "host")
    check_pair(a, b)


def case_salt(ctx):
    # Another tenant (KVSHIM_SALT) in the same group never sees the first one's chunks.
    a, b = peer_pair(ctx, "host", b_env={"KVSHIM_SALT": "tenant-b"})
    (a_reqs, a_sum), (b_reqs, b_sum, bs) = a, b
    check(a_sum["chunks_stored"] == 10 + 2, f"A: {a_sum}")
    check(b_reqs[0]["loaded"] == 0 and b_sum["verify"] == "ok", f"B saw A's chunks: {b_reqs}")
    check(bs["peer_hits"] == 0 and bs["peer_lookups"] >= 1, f"B stats: {bs}")
    # Same salt on both sides: shared again.
    shutil.rmtree(ctx.run_dir, ignore_errors=True)
    a, b = peer_pair(ctx, "host", a_env={"KVSHIM_SALT": "tenant-b"},
                     b_env={"KVSHIM_SALT": "tenant-b"})
    check_pair(a, b)


def case_serve(ctx):
    for one_copy in (1, 0):
        shutil.rmtree(ctx.run_dir, ignore_errors=True)
        serve_round(ctx, one_copy)


def serve_round(ctx, one_copy):
    serve = ctx.serve()
    args = workload(8, 2, 1, ["--kvo-buffer", "device"])
    a = run_engine(ctx, args + ["--rank", "0"], ctx.env(KVSHIM_STATS=ctx.stats_path("a"),
                                                        KVSHIM_ONE_COPY=one_copy), "A")
    _, a_sum = parse_output(a.stdout, "A")
    s = read_stats(ctx.stats_path("a"))
    check(a_sum["chunks_stored"] == 10, f"A summary: {a_sum}")
    check(s["hook_stores"] == 10, f"A hook_stores: {s['hook_stores']}")
    if one_copy:  # straight into serve's pool, nothing kept in A's (README "One copy per node")
        check(s["cache_peer_stores"] == 10 and s["push_queued"] == 0 and
              s["store_committed_objects"] == 0, f"A one copy: {s}")
    else:
        check(s["push_queued"] == 10 and s["push_sent"] == 10 and s["push_dropped"] == 0,
              f"A write-behind: queued {s['push_queued']} sent {s['push_sent']} "
              f"dropped {s['push_dropped']}")
    check(len(socks(ctx)) == 1, f"only serve's socket is left after A exited: {socks(ctx)}")
    b = run_engine(ctx, args + ["--rank", "1", "--verify"],
                   ctx.env(KVSHIM_STATS=ctx.stats_path("b"), KVSHIM_ONE_COPY=one_copy), "B")
    b_reqs, b_sum = parse_output(b.stdout, "B")
    bs = read_stats(ctx.stats_path("b"))
    check(b_reqs[0]["loaded"] == 8 and b_sum["verify"] == "ok", f"B from serve: {b_reqs}")
    check(bs["peer_hits"] >= 8 and bs["hook_hits"] == 8, f"B stats: peer_hits "
          f"{bs['peer_hits']} hook_hits {bs['hook_hits']}")
    check(bs["cache_peer_loads"] == (8 if one_copy else 0), f"B cache_peer_loads: {bs}")
    serve.send_signal(signal.SIGTERM)
    _, err = finish(serve, 30, "kvshim serve")
    check(serve.returncode == 0, f"serve exit {serve.returncode}: {err}")


def case_disabled(ctx):
    # The module's own cache makes the engine's answers non-trivial (loads from request 1 on).
    args = workload(6, 2, 3, ["--native-cache", "64M", "--verify"])
    base = run_engine(ctx, args, ctx.env(preload=False), "no preload")
    want = strip_timings(base.stdout)
    check(want[-1]["chunks_loaded"] == 12, f"native cache: {want[-1]}")
    for what, env in (("KVSHIM_ENABLE=0", ctx.env(KVSHIM_ENABLE=0,
                                                   KVSHIM_STATS=ctx.stats_path("off"))),
                      ("KVSHIM_HOOKS=cuda", ctx.env(KVSHIM_HOOKS="cuda", KVSHIM_PEERS=0))):
        got = run_engine(ctx, args, env, what)
        check(strip_timings(got.stdout) == want,
              f"{what}: output differs from the run without kvshim\n"
              f"without:\n{base.stdout}\nwith:\n{got.stdout}")
    check_off_stats(ctx.stats_path("off"))
    check(socks(ctx) == [], f"KVSHIM_ENABLE=0 left sockets: {socks(ctx)}")
    # refengine --hold-ms (the flag the peer cases use): bounded, and it really holds.
    for bad in ("x", "-1", "86400001"):
        p = run_engine(ctx, ["--hold-ms", bad], ctx.env(preload=False), f"--hold-ms {bad}",
                       expect_rc=2)
        check("usage: refengine" in p.stderr and p.stdout == "", f"--hold-ms {bad}: {p.stderr}")
    t0 = time.monotonic()
    run_engine(ctx, workload(1, 0, 1, ["--hold-ms", "300"]), ctx.env(preload=False), "hold")
    check(time.monotonic() - t0 >= 0.3, "--hold-ms 300 returned early")


def case_pool_full(ctx):
    # 2 MiB chunks, a 1 MiB pool: every store is TOO_LARGE.
    big = ["--chunk-tokens", str(C), "--layers", "8", "--kv-heads", "8", "--head-dim", "64",
           "--hidden", "32"]
    args = ["--requests", "2", "--prompt-tokens", str(5 * C + 10), "--prefix-tokens",
            str(4 * C), *big, "--verify"]
    env = ctx.env(KVSHIM_POOL_SIZE="1M", KVSHIM_STATS=ctx.stats_path("full"))
    # Without a native cache nothing is kept anywhere: the engine computes everything.
    p = run_engine(ctx, args, env, "pool full")
    reqs, summ = parse_output(p.stdout, "pool full")
    s = read_stats(ctx.stats_path("full"))
    check(summ["chunks_loaded"] == 0 and summ["chunks_stored"] == 0, f"summary: {summ}")
    check(s["hook_stores"] == 0 and s["hook_store_failures"] == 10, f"stores: {s}")
    check(s["store_too_large"] == 10, f"store_too_large: {s['store_too_large']}")
    # With the engine's own cache, the declined stores land there and are loaded from there.
    p = run_engine(ctx, args + ["--native-cache", "64M"], env, "pool full + native cache")
    reqs, summ = parse_output(p.stdout, "pool full + native cache")
    s = read_stats(ctx.stats_path("full"))
    check(summ["verify"] == "ok", f"summary: {summ}")
    check(reqs[0]["stored"] == 5 and reqs[1]["loaded"] == 4 and reqs[1]["stored"] == 1,
          f"the engine's module did not take the declined stores: {reqs}")
    check(s["hook_store_failures"] == 6 and s["hook_stores"] == 0, f"stores: {s}")


def case_pool_small(ctx):
    # 256 KiB chunks, 16 shared; a 1 MiB pool holds 3 of them.
    mid = ["--chunk-tokens", str(C), "--layers", "8", "--kv-heads", "2", "--head-dim", "32",
           "--hidden", "32"]
    args = ["--requests", "2", "--prompt-tokens", str(17 * C), "--prefix-tokens", str(16 * C),
            *mid, "--verify"]
    # One process: stores evict each other, the prefix is never fully cached.
    p = run_engine(ctx, args, ctx.env(KVSHIM_POOL_SIZE="1M", KVSHIM_PEERS=0,
                                      KVSHIM_STATS=ctx.stats_path("one")), "small pool")
    reqs, summ = parse_output(p.stdout, "small pool")
    s = read_stats(ctx.stats_path("one"))
    check(summ["verify"] == "ok", f"summary: {summ}")
    check(s["store_evictions"] > 0 and s["hook_stores"] > 0, f"evictions: {s}")
    check(reqs[1]["loaded"] == 0, f"chunk 0 was evicted first: {reqs[1]}")
    # Two processes: B's pool cannot keep A's prefix; its loads fetch from A one by one.
    a = ctx.spawn([ctx.engine] + args + ["--rank", "0", "--hold-ms", "120000"],
                  ctx.env(KVSHIM_STATS=ctx.stats_path("a")))
    wait_summary(a, "A")
    b = run_engine(ctx, args + ["--rank", "1"],
                   ctx.env(KVSHIM_POOL_SIZE="1M", KVSHIM_STATS=ctx.stats_path("b")), "B")
    reqs, summ = parse_output(b.stdout, "B")
    bs = read_stats(ctx.stats_path("b"))
    a.terminate()
    a.communicate(timeout=30)
    check(summ["verify"] == "ok" and reqs[0]["loaded"] == 16, f"B: {reqs}")
    check(bs["peer_hits"] > 16 and bs["hook_hits"] >= 16, f"B stats: {bs}")
    check(bs["store_evictions"] > 0, f"B evictions: {bs['store_evictions']}")


def case_kill(ctx):
    # 512 KiB chunks, every request its own 16-chunk prefix: B retrieves from A all along.
    big = ["--chunk-tokens", str(C), "--layers", "8", "--kv-heads", "4", "--head-dim", "32",
           "--hidden", "32"]
    n = 5
    args = ["--requests", str(n), "--prefix-groups", str(n), "--prompt-tokens", str(17 * C),
            "--prefix-tokens", str(16 * C), *big]
    rpc_ms = 1000
    rng = random.Random(7)
    # first-line: after B's first request; start: as B starts (HELLO, first lookup); stopped:
    # A is frozen (SIGSTOP) after B's first request, so B's next call to it is in flight
    # and waiting when A is killed; random: anywhere in the first 300 ms.
    # frozen: A stays stopped until B is done (a live but stuck peer): every call to it ends
    # at the RPC deadline.
    for rnd, when in enumerate(("first-line", "start", "stopped", "random", "random",
                                "frozen")):
        shutil.rmtree(ctx.run_dir, ignore_errors=True)
        a = ctx.spawn([ctx.engine] + args + ["--rank", "0", "--hold-ms", "120000"], ctx.env())
        a_reqs, _ = wait_summary(a, f"round {rnd}: A")
        full_ms = max(r["ttft_ms"] for r in a_reqs)  # all 17 chunks computed
        t0 = time.monotonic()
        b = ctx.spawn([ctx.engine] + args + ["--rank", "1", "--verify"],
                      ctx.env(KVSHIM_RPC_TIMEOUT_MS=rpc_ms,
                              KVSHIM_STATS=ctx.stats_path(f"b{rnd}")))
        first = ""
        if when in ("first-line", "stopped", "frozen"):
            first = read_line(b, 60, f"round {rnd}: B")
        if when in ("stopped", "frozen"):
            harness.stop_process(a)
        if when == "stopped":
            time.sleep(0.3)
        elif when == "random":
            time.sleep(rng.uniform(0.0, 0.3))
        if when != "frozen":
            a.send_signal(signal.SIGKILL)
            a.wait(timeout=30)
        out, err = finish(b, 120, f"round {rnd}: B after A was killed")
        elapsed = time.monotonic() - t0
        if when == "frozen":
            a.send_signal(signal.SIGKILL)
            a.wait(timeout=30)
        out = first + out
        check(b.returncode == 0, f"round {rnd} ({when}): B exit {b.returncode}\n{err}")
        reqs, summ = parse_output(out, f"round {rnd}: B")
        check(summ["verify"] == "ok" and summ["kvo_errors"] == 0, f"round {rnd}: {summ}")
        check(len(reqs) == n, f"round {rnd}: {len(reqs)} requests")
        if when in ("first-line", "stopped"):
            check(reqs[0]["loaded"] == 16, f"round {rnd}: B request 0 did not load: {reqs[0]}")
            check(reqs[-1]["loaded"] == 0, f"round {rnd}: loaded after A died: {reqs[-1]}")
        worst = max(r["ttft_ms"] for r in reqs)
        # a frozen peer may cost one call on the open connection plus one re-dial (HELLO)
        deadlines = 2 if when == "frozen" else 1
        check(worst < 2 * full_ms + deadlines * rpc_ms + 1000,
              f"round {rnd}: a request waited {worst:.0f} ms (compute {full_ms:.0f} ms, RPC "
              f"deadline {rpc_ms} ms)")
        check(elapsed < 60, f"round {rnd}: B took {elapsed:.1f} s")
        s = read_stats(ctx.stats_path(f"b{rnd}"))
        check(s["hook_fallbacks"] == 0, f"round {rnd}: fallbacks {s['hook_fallbacks']}")
        if os.environ.get("KVO_TEST_VERBOSE"):
            print(f"round {rnd} ({when}): loaded {[r['loaded'] for r in reqs]}, worst ttft "
                  f"{worst:.1f} ms, full compute {full_ms:.1f} ms, peer_errors "
                  f"{s['peer_errors']}, peer_hits {s['peer_hits']}")


def case_hooks_kvo_only(ctx):
    # Device buffers: no accelerator copy without the CUDA shim, so kvshim keeps nothing and
    # loads nothing, and the engine's module (no cache) answers.
    a, b = peer_pair(ctx, "device", a_env={"KVSHIM_HOOKS": "kvo"}, b_env={"KVSHIM_HOOKS": "kvo"})
    (a_reqs, a_sum), (b_reqs, b_sum, bs) = a, b
    check(a_sum["chunks_stored"] == 0 and a_sum["verify"] == "ok", f"A: {a_sum}")
    check(b_sum["chunks_loaded"] == 0 and b_sum["verify"] == "ok", f"B: {b_sum}")
    check(bs["hook_hits"] == 0 and bs["hook_stores"] == 0 and bs["hook_calls"] > 0, f"B: {bs}")
    shutil.rmtree(ctx.run_dir, ignore_errors=True)
    # Host buffers are served by memcpy.
    a, b = peer_pair(ctx, "host", a_env={"KVSHIM_HOOKS": "kvo"}, b_env={"KVSHIM_HOOKS": "kvo"})
    check_pair(a, b)


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()),
                          harness.parser(__doc__, "--engine", "--preload", "--cli", "--abi",
                                         asan=True), Ctx))
