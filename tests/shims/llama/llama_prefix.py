#!/usr/bin/env python3
"""ctest driver for the transparent llama.cpp prefix cache of libkvshim.so (shims/llama/prefix.c,
design §10.3), on tests/fakes/llama's prefixhost.

usage: llama_prefix.py CASE --host PREFIXHOST --preload LIBKVSHIM --cli KVSHIM
                       [--asan-runtime LIBASAN]

prefixhost calls libfakellama (batches, outputs, memory calls, greedy sampler) through its PLT.
Its fake KV depends on the kernel class of the ubatch that computed each cell, as the real CPU
backend's does (fakellama.h), so a restore that changed how any decoded token is computed would
change the outputs. Every case runs its scripts without kvshim first (the reference) and then
with LD_PRELOAD=libkvshim.so set only in the engine processes' environment, each case in its own
KVSHIM_RUN_DIR; every output line must be identical (outputs, sampled tokens, positions), and
the KVSHIM_STATS counters show what the cache did.

Cases:
  local       one process, one sequence: a long prompt, then prompts sharing its prefix in one
              batch, in engine batches of 512 (restores on continuation batches), through
              llama_batch_get_one (pos, seq_id, logits NULL), and after generation: identical,
              restores and snapshots counted
  sequences   one context, three sequences: a prompt on 0, prompts sharing its prefix on 1 and 2,
              a batch of two sequences and one of shared tokens (passed through): identical
  peer        process A stays alive; B (fresh) restores A's prefix through A's coordinator
  serve       `kvshim serve` is the cache peer: A stores, pushes and exits; B restores from serve
  divergence  prompts sharing less than a chunk (no restore), part of a chunk (the whole chunks
              restored), a sequence shifted as context shift does (not restored into, not
              stored), outputs requested on every token (nothing skipped), short batches (no
              canonical KV: nothing stored), an unaligned continuation: identical
  faults      corrupted blobs (state bytes, tokens, namespace) refused and dropped; a blob of
              another model and of another KV type never found; a pool too small for a state
              stores nothing: identical every time
  faults-peer the cache peer stopped (B times out) then killed while B waits for its answer:
              B decodes everything itself, identical
  taint       a sequence loaded through the engine's own state API, a context switched to
              embeddings: never restored into; identical
  offload     llama_supports_gpu_offload() true: only whole, aligned ubatches are skipped
  disabled    KVSHIM_ENABLE=0 and KVSHIM_LLAMA_PREFIX=0: identical, nothing restored or stored
  batches     restore points between chunk boundaries (any multiple of 64 up to the cached
              state's canonical tokens) and batches that ask no output and lie wholly in the
              cached prefix (not decoded at all), under engine batches of 512, 2048, 576, 544,
              100 and 96 tokens: identical, and the whole canonical shared prefix restored
  flight      single flight: A computes a prefix slowly; B, started while A is in its first
              batch, waits for A's claims (on WATCHes, a bounded number of LOOKUPs) and
              restores A's progress batch by batch (identical,
              the whole prefix restored, nothing computed twice); the claimant killed while B
              waits: B goes on at once; KVSHIM_LLAMA_WAIT_MS=0: no wait
  swa         a model with a sliding window: with swa_full off only states ending on a chunk
              boundary are stored and restored whole, untrimmed (a window cache cannot be
              trimmed); with swa_full the cache works as on any model: identical
  mixed       two sequences of one context evaluated together (batches holding both, no
              output) on a cached prefix: both restore it, batch by batch, and decode the rest;
              mixed batches that cannot be skipped whole (an output, a short or unaligned part,
              a token beyond the cached prefix) pass through: identical
  unified     llama-server's defaults, kv_unified: sequences of one KV stream restore (from the
              process and from serve), a load that finds no room beside the other sequences is
              refused by the engine and undone: identical
  used        a used sequence (BOS kept from an older prompt) takes the longer cached prefix
              (the load replaces it): outputs are a fresh sequence's; a refused load is undone
              from the sequence's own copy: identical
  multi       batches of several sequences with an output: each part restores its cached prefix,
              the rest of all sequences decoded together, outputs remapped: every output there,
              positions identical (logits differ: the engine's mixed ubatches)
  shared      two sequences of one batch, cold, sharing a prefix (per-sequence and unified KV):
              computed once (the engine's token count), the other restores it; a refused load:
              the engine's own batch: identical
  known       a state the engine saved and loaded back itself (--cache-ram) is known again
  chunks      KVSHIM_LLAMA_CHUNKS=1: a shared prefix with four suffixes stores the prefix's chunks
              once (dedup counted), restores by assembly, fewer bytes than whole blobs; a
              damaged chunk is refused, counted, dropped, the restore stops before it and the
              chunk is stored again; a fresh
              process restores from the first one's chunks, and from `kvshim serve`'s pool
              (one copy per node: no engine keeps a copy): identical
  chunks-mix  one restore by assembly from the process's own chunks and a peer's: identical
  chunks-evict  chunks evicted between store and restore: the restore stops before the first
              missing one, the next snapshot stores them again: identical
  chunks-foreign  chunks of another model or KV type are never found nor assembled: identical
  chunks-reuse  the same run restored again with no snapshot between: the state the context
              assembled last is loaded again, not assembled again (llama_chunks_reused); a
              snapshot between forces a new assembly: identical
  held-mixed  a claim held after a sequence's last claimed batch (no output asked: it is kept
              for the sequence's next batch) is dropped by the next batch even when that is a
              batch of several sequences skipped whole (restored from serve): B, whose batch
              has that claim key and nothing to restore, claims it itself and does not wait
"""
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from harness import ScriptContext, check, read_stats, wait_file  # noqa: E402
import harness  # noqa: E402
from llama_shim import stop_process  # noqa: E402


class Ctx(ScriptContext):
    group = "prefix"
    what = "prefixhost"
    timeout = 120

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.host = args.host

    def argv(self, cmds):
        return [self.host] + list(cmds)


def prefix_stats(st):
    return {k[len("llama_prefix_"):]: v for k, v in (st or {}).items()
            if k.startswith("llama_prefix_")}


def live_prefix_stats(ctx, p):
    """The llama_prefix_* counters of the live process p (kvshim stats PID --json); {} while it
    cannot answer yet (no coordinator before its runtime is up)."""
    return prefix_stats(harness.live_stats(ctx, p.pid))


def same(ctx, cmds, what, preload_extra=None, ref_extra=None, **kw):
    """Run cmds without and with kvshim; the lines must be identical. Returns (stats, stderr)."""
    ref, _, _ = ctx.run(cmds, preload=False, what=f"{what} (reference)", **(ref_extra or {}))
    got, err, st = ctx.run(cmds, what=what, **(preload_extra or {}), **kw)
    for i, (a, b) in enumerate(zip(ref, got)):
        check(a == b, f"{what}: command {i} '{cmds[i]}' differs with kvshim:\n  without: {a}\n"
                      f"  with:    {b}\nprefix stats: {prefix_stats(st)}\nstderr:\n{err[-3000:]}")
    print(f"{what}: {len(cmds)} commands identical; prefix stats {prefix_stats(st)}")
    return st, err


def expect(st, what, **cond):
    """cond: name=(op, value) over the llama_prefix_* counters."""
    ps = prefix_stats(st)
    for k, (op, v) in cond.items():
        got = ps.get(k)
        okay = {"==": got == v, ">=": got is not None and got >= v,
                ">": got is not None and got > v}[op]
        check(okay, f"{what}: llama_prefix_{k} = {got}, expected {op} {v} (all: {ps})")


def models(ctx):
    a, b = ctx.p("a.gguf"), ctx.p("b.gguf")
    ctx.run([f"mkmodel {a} alpha 2 32 64 1", f"mkmodel {b} alpha 2 32 64 2"], preload=False)
    return a, b


# Prompt P: 1100 tokens of seed 1. P1000: its first 1000 tokens then 150 of seed 9.
P = "r1100@1"
P1000 = "r1000@1+r150@9"


def case_local(ctx):
    a, _ = models(ctx)
    cmds = [f"model 0 {a}", "ctx 0 0 1",
            f"prompt 0 0 {P}", "gen 0 0 8",
            "clear 0", f"prompt 0 0 {P1000}", "gen 0 0 8",            # one batch: 768 restored
            "rm 0 0 -1 -1", f"prompt 0 0 {P}+r30@3 512", "gen 0 0 4",  # continuation batches
            "rm 0 0 -1 -1", f"prompt 0 0 {P}+r40@4 2048 getone", "gen 0 0 4",
            "rm 0 0 300 -1", f"prompt 0 0 r1100@1/300+r60@5 2048", "gen 0 0 4",  # truncated
            "pos 0 0"]
    st, _ = same(ctx, cmds, "local")
    expect(st, "local", restores=(">=", 4), restored_tokens=(">=", 768 + 512 + 1024),
           snapshots=(">=", 1), bad_blobs=("==", 0), restore_failures=("==", 0))
    # the time counters nest: the engine's own state calls happen inside kvshim's snapshots
    # and restores (nothing failed here, so nothing was undone outside a restore)
    snap, rest = st.get("llama_prefix_snapshot_ns", 0), st.get("llama_prefix_restore_ns", 0)
    get, put = st.get("llama_state_get_ns", 0), st.get("llama_state_set_ns", 0)
    check(snap > 0 and rest > 0 and get > 0 and put > 0,
          f"time counters: snapshot {snap}, restore {rest}, get {get}, set {put}")
    check(get <= snap + rest and put <= rest,
          f"engine time outside kvshim's: get {get} > {snap} + {rest} or set {put} > {rest}")


def case_sequences(ctx):
    a, _ = models(ctx)
    cmds = [f"model 0 {a}", "ctx 0 0 4",
            f"prompt 0 0 {P}", "gen 0 0 4",
            f"prompt 0 1 {P1000}", "gen 0 1 4",
            "shared 0 2 3 r600@1", "gen 0 3 2",
            "multi 0 0 r20@11 2 r30@12", "gen 0 2 2",
            "rm 0 3 -1 -1", "prompt 0 3 r1100@1+r300@7 512", "gen 0 3 4",
            "pos 0 0", "pos 0 1", "pos 0 2", "pos 0 3"]
    st, _ = same(ctx, cmds, "sequences")
    expect(st, "sequences", restores=(">=", 2), passthrough=(">=", 2))


def case_peer(ctx):
    a, _ = models(ctx)
    ready, done = ctx.p("a.ready"), ctx.p("b.done")
    b_cmds = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P1000}", "gen 0 0 8"]
    ref_b, _, _ = ctx.run(b_cmds, preload=False, what="B reference")
    pa, sa = ctx.start([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P}", "gen 0 0 4",
                        f"touch {ready}", f"waitfile {done} 60"])
    deadline = time.monotonic() + 60
    while not os.path.exists(ready):
        check(time.monotonic() < deadline and pa.poll() is None, "A never got ready")
        time.sleep(0.02)
    got, err, st = ctx.run(b_cmds, what="B")
    check(got == ref_b, f"B through the peer differs:\n{ref_b}\n{got}\n{err[-2000:]}")
    expect(st, "B", peer_restores=(">=", 1), restored_tokens=(">=", 768))
    with open(done, "w"):
        pass
    ctx.finish(pa, "A")
    expect(read_stats(sa), "A", snapshots=(">=", 1))


def case_serve(ctx):
    a, _ = models(ctx)
    ctx.serve()
    b_cmds = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P1000} 512", "gen 0 0 8"]
    ref_b, _, _ = ctx.run(b_cmds, preload=False, what="B reference")
    _, _, sa = ctx.run([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P}", "gen 0 0 4"], what="A")
    expect(sa, "A", snapshots=(">=", 1))
    check(sa.get("cache_peer_stores", 0) >= 1 and sa.get("store_used_bytes") == 0,
          f"A's snapshots did not go straight into serve's pool (one copy per node): {sa}")
    got, err, st = ctx.run(b_cmds, what="B")
    check(got == ref_b, f"B from serve differs:\n{ref_b}\n{got}\n{err[-2000:]}")
    expect(st, "B", peer_restores=(">=", 1), restored_tokens=(">=", 512))
    check(st.get("store_used_bytes") == 0, f"B kept a copy of serve's snapshot: {st}")
    # restored in place from serve's pool, under its pin (cache_peer_loads), not fetched into
    # a buffer of B's first
    check(st.get("cache_peer_loads", 0) >= 1,
          f"B did not restore in place from serve: cache_peer_loads {st.get('cache_peer_loads')}")


def case_divergence(ctx):
    a, _ = models(ctx)
    cmds = [f"model 0 {a}", "ctx 0 0 2",
            f"prompt 0 0 {P}", "gen 0 0 2",
            "clear 0", "prompt 0 0 r200@1+r500@2", "gen 0 0 4",   # shares < one chunk
            "clear 0", "prompt 0 0 r300@1+r500@3", "gen 0 0 4",   # 1 chunk, 32-row tail: none
            "clear 0", "prompt 0 0 r300@1+r200@3", "gen 0 0 4",   # 1 chunk + 44: 256 restored
            # context shift: drop 200 tokens after the first 50, shift the rest down
            "clear 0", f"prompt 0 0 {P}", "rm 0 0 50 250", "add 0 0 250 -1 -200",
            "prompt 0 0 r300@6", "gen 0 0 4", "pos 0 0",
            "rm 0 0 -1 -1", f"prompt 0 0 {P}+r10@8 2048 all", "gen 0 0 2",   # every token out
            "rm 0 1 -1 -1", f"prompt 0 1 r1100@21 48", "gen 0 1 2",  # short batches only
            "rm 0 1 -1 -1", "prompt 0 1 r100@1 100", f"prompt 0 1 r1100@1/100+r50@9 2048",
            "gen 0 1 2"]
    st, _ = same(ctx, cmds, "divergence")
    expect(st, "divergence", restores=(">=", 1), bad_blobs=("==", 0))
    # outputs on every token: a fresh process with only that prompt after P is cached
    cmds2 = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P}", "rm 0 0 -1 -1",
             f"prompt 0 0 {P}+r10@8 2048 all", "gen 0 0 2"]
    st2, _ = same(ctx, cmds2, "all outputs", KVSHIM_PEERS=0)
    expect(st2, "all outputs", restores=("==", 0), snapshots=(">=", 1))
    # short batches never give canonical KV: nothing is stored
    cmds3 = [f"model 0 {a}", "ctx 0 0 1", "prompt 0 0 r1100@30 48", "gen 0 0 2"]
    st3, _ = same(ctx, cmds3, "short batches", KVSHIM_PEERS=0)
    expect(st3, "short batches", snapshots=("==", 0), restores=("==", 0))
    # a shifted sequence is neither restored into nor stored
    cmds4 = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P}", "add 0 0 0 -1 5",
             "prompt 0 0 r600@40", "gen 0 0 2"]
    st4, _ = same(ctx, cmds4, "shifted", KVSHIM_PEERS=0)
    expect(st4, "shifted", snapshots=("==", 1), restores=("==", 0), passthrough=(">=", 2))


def case_faults(ctx):
    a, b = models(ctx)
    base = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P}"]
    tail = ["clear 0", f"prompt 0 0 {P1000}", "gen 0 0 8"]
    for mode in ("body", "tokens", "ns"):
        cmds = base + [f"corrupt {mode}"] + tail
        ref, _, _ = ctx.run(base + tail, preload=False, what=f"corrupt {mode} reference")
        got, err, st = ctx.run(cmds, what=f"corrupt {mode}", KVSHIM_PEERS=0)
        check(got[3] == "corrupt ok 1", f"corrupt {mode}: {got[3]}")
        check(got[:3] + got[4:] == ref, f"corrupt {mode}: output differs:\n{ref}\n{got}")
        expect(st, f"corrupt {mode}", bad_blobs=(">=", 1), restores=("==", 0))
    # another model (same shape, other weights) and another KV type never get A's states
    ctx.serve()
    ctx.run([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P}"], what="A")
    st, _ = same(ctx, [f"model 0 {b}", "ctx 0 0 1", f"prompt 0 0 {P1000}", "gen 0 0 8"],
                 "other model")
    expect(st, "other model", restores=("==", 0), bad_blobs=("==", 0))
    st, _ = same(ctx, [f"model 0 {a}", "ctx 0 0 1 2", f"prompt 0 0 {P1000}", "gen 0 0 8"],
                 "other KV type")
    expect(st, "other KV type", restores=("==", 0), bad_blobs=("==", 0))
    st, _ = same(ctx, [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P1000}", "gen 0 0 8"],
                 "same model and KV type")
    expect(st, "same model and KV type", peer_restores=(">=", 1))
    # a pool too small for one state: nothing stored, nothing breaks
    big = ctx.p("big.gguf")
    ctx.run([f"mkmodel {big} big 8 256 64 3"], preload=False)
    st, _ = same(ctx, [f"model 0 {big}", "ctx 0 0 1", f"prompt 0 0 {P}", "clear 0",
                       f"prompt 0 0 {P1000}", "gen 0 0 4"], "pool full",
                 KVSHIM_POOL_SIZE="1M", KVSHIM_PEERS=0)
    expect(st, "pool full", snapshot_failures=(">=", 1), restores=("==", 0))


def case_faults_peer(ctx):
    a, _ = models(ctx)
    serve = ctx.serve()
    ctx.run([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P}"], what="A")
    b_cmds = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P1000}", "gen 0 0 8"]
    ref, _, _ = ctx.run(b_cmds, preload=False, what="B reference")
    # the cache peer stops answering: B times out and decodes everything itself
    stop_process(serve)  # every thread stopped before B starts: none can answer B
    t0 = time.monotonic()
    got, err, st = ctx.run(b_cmds, what="B, peer stopped", KVSHIM_RPC_TIMEOUT_MS=300)
    check(got == ref, f"B with a stopped peer differs:\n{ref}\n{got}\n{err[-2000:]}")
    expect(st, "B, peer stopped", restores=("==", 0))
    check(time.monotonic() - t0 < 30, "B with a stopped peer took too long")
    # the cache peer is killed while B waits for its answer
    pb, sb = ctx.start(b_cmds, KVSHIM_RPC_TIMEOUT_MS=20000)
    time.sleep(1.0)
    t1 = time.monotonic()
    serve.send_signal(signal.SIGKILL)
    serve.wait(timeout=10)
    got, err = ctx.finish(pb, "B, peer killed", timeout=60)
    check(got == ref, f"B with a killed peer differs:\n{ref}\n{got}\n{err[-2000:]}")
    check(time.monotonic() - t1 < 15, "B did not fall back soon after the peer died")
    expect(read_stats(sb), "B, peer killed", restores=("==", 0))


def case_taint(ctx):
    a, _ = models(ctx)
    cmds = [f"model 0 {a}", "ctx 0 0 2",
            f"prompt 0 0 {P}",
            "copyseq 0 0 1",                       # engine state load into 1
            "prompt 0 1 r300@50", "gen 0 1 2",
            "rm 0 1 0 -1",                         # cleared: usable again
            f"prompt 0 1 {P1000}", "gen 0 1 2",
            "emb 0 1", "rm 0 1 -1 -1", f"prompt 0 1 {P1000}", "emb 0 0", "gen 0 1 2"]
    st, _ = same(ctx, cmds, "taint", KVSHIM_PEERS=0)
    expect(st, "taint", restores=("==", 1))


def case_offload(ctx):
    a, _ = models(ctx)
    cmds = [f"model 0 {a}", "ctx 0 0 1",
            f"prompt 0 0 {P}", "gen 0 0 2",
            "clear 0", f"prompt 0 0 {P1000}", "gen 0 0 4",      # 768 forbidden, 512 allowed
            "clear 0", f"prompt 0 0 {P}+r20@2", "gen 0 0 4",       # 1024 restored
            "clear 0", f"prompt 0 0 {P}+r20@2 512", "gen 0 0 4"]   # never a whole ubatch
    st, _ = same(ctx, cmds, "offload rules", FAKELLAMA_GPU=1, KVSHIM_PEERS=0,
                 ref_extra={"FAKELLAMA_GPU": 1})
    expect(st, "offload rules", restores=(">=", 2))
    check(prefix_stats(st)["restored_tokens"] % 512 == 0,
          f"offload rules skip whole ubatches only: {prefix_stats(st)}")


def case_disabled(ctx):
    a, _ = models(ctx)
    cmds = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P}", "clear 0", f"prompt 0 0 {P1000}",
            "gen 0 0 4"]
    # With the prefix cache off nothing builds the runtime here (no stats file), or the
    # counters stay 0 when something else did.
    st, _ = same(ctx, cmds, "KVSHIM_LLAMA_PREFIX=0", KVSHIM_LLAMA_PREFIX=0)
    ps = prefix_stats(st)
    check(all(ps.get(k, 0) == 0 for k in ("restores", "snapshots", "lookups")),
          f"KVSHIM_LLAMA_PREFIX=0: {ps}")
    st, _ = same(ctx, cmds, "KVSHIM_ENABLE=0", KVSHIM_ENABLE=0)
    check(st is None or prefix_stats(st).get("restores", 0) == 0, f"ENABLE=0: {st}")
    st, _ = same(ctx, cmds, "KVSHIM_HOOKS=cuda", KVSHIM_HOOKS="cuda")
    check(st is None or prefix_stats(st).get("restores", 0) == 0, f"HOOKS=cuda: {st}")


def case_batches(ctx):
    a, _ = models(ctx)
    shared = "r1400@1"  # 1430-token prompts sharing 1400 tokens: 1344 = 21 x 64 restorable
    cmds = [f"model 0 {a}", "ctx 0 0 1",
            f"prompt 0 0 {shared}+r30@2 512", "gen 0 0 4",     # stored: 1430 canonical
            "clear 0", f"prompt 0 0 {shared}+r32@3 512", "gen 0 0 8",   # 512 + 512 + 320
            "clear 0", f"prompt 0 0 {shared}+r32@4 2048", "gen 0 0 8",  # 1344
            "clear 0", f"prompt 0 0 {shared}+r32@5 576", "gen 0 0 8",   # 576 + 576 + 192
            "clear 0", f"prompt 0 0 {shared}+r40@6 544", "gen 0 0 8",   # 512, then unaligned
            "clear 0", f"prompt 0 0 {shared}+r32@7 100", "gen 0 0 4",   # 36-row rests: none
            "clear 0", f"prompt 0 0 {shared}+r32@8 96", "gen 0 0 4",    # none
            # wholly inside the cached prefix, output on its last token: that batch is decoded
            "clear 0", "prompt 0 0 r1344@1 512", "gen 0 0 4",             # 512 + 512 + 256
            # a state canonical up to 1024 only (a 26-row ubatch, then an unaligned batch)
            "clear 0", "prompt 0 0 r1100@11 1050", "gen 0 0 2",
            "clear 0", "prompt 0 0 r1100@11+r100@12 2048", "gen 0 0 4",  # 1024, not 1088
            "pos 0 0"]
    st, _ = same(ctx, cmds, "batches", KVSHIM_PEERS=0)
    want = 1344 * 3 + 512 + 1280 + 1024
    expect(st, "batches", restored_tokens=("==", want), bad_blobs=("==", 0),
           restore_failures=("==", 0))
    # a fresh process through `kvshim serve`, default 512-token batches: >= 90% of the prompt
    ctx.serve()
    ctx.run([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r30@2 512", "gen 0 0 2"],
            what="A")
    st, _ = same(ctx, [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r32@3 512",
                       "gen 0 0 8"], "B, fresh process")
    expect(st, "B, fresh process", restored_tokens=(">=", int(0.9 * 1432)),
           peer_restores=(">=", 1))


def case_mixed(ctx):
    a, _ = models(ctx)
    shared = "r1400@1"
    cmds = [f"model 0 {a}", "ctx 0 0 4",
            f"prompt 0 0 {shared}+r30@2 512", "gen 0 0 2",   # cached (sequence 0)
            # sequences 1 and 2 together: 256 + 256 per batch, all inside the cached prefix
            "multi 0 1 r256@1 2 r256@1 none",
            "multi 0 1 r512@1/256 2 r512@1/256 none",
            "multi 0 1 r768@1/512 2 r768@1/512 none",
            "multi 0 1 r1024@1/768 2 r1024@1/768 none",
            "pos 0 1", "pos 0 2",
            "prompt 0 1 r1400@1/1024+r20@3 512", "gen 0 1 4",   # 320 more restored
            "prompt 0 2 r1400@1/1024+r20@4 512", "gen 0 2 4",
            # not skipped whole: an output, a 32-token part, a token beyond the cached prefix
            "rm 0 1 -1 -1", "rm 0 2 -1 -1",
            "multi 0 1 r256@1 2 r256@1",
            "multi 0 1 r288@1/256 2 r288@1/256 none",
            "rm 0 1 -1 -1", "rm 0 2 -1 -1",
            "multi 0 1 r256@1 2 r255@1+r1@9 none",
            "gen 0 1 2", "pos 0 1", "pos 0 2"]
    st, _ = same(ctx, cmds, "mixed", KVSHIM_PEERS=0)
    expect(st, "mixed", restored_tokens=(">=", 2 * 1024 + 2 * 320), bad_blobs=("==", 0),
           restore_failures=("==", 0))


def case_flight(ctx):
    a, _ = models(ctx)
    shared, touch = "r1400@1", ctx.p("a.decoding")
    b_cmds = [f"model 0 {a}", "ctx 0 0 1", f"waitfile {touch} 60",
              f"prompt 0 0 {shared}+r32@3 512", "gen 0 0 8"]
    with open(touch, "w"):
        pass
    ref_b, _, _ = ctx.run(b_cmds, preload=False, what="B reference")
    os.unlink(touch)
    # A computes the prefix slowly (each llama_decode call 700 ms); B starts its prompt while
    # A is in its first batch: it waits for A's claims and restores A's progress batch by batch
    pa, sa = ctx.start([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r30@2 512",
                        "gen 0 0 2"], FAKELLAMA_DECODE_DELAY_MS=700, FAKELLAMA_DECODE_TOUCH=touch)
    got, err, st = ctx.run(b_cmds, what="B")
    check(got == ref_b, f"B after waiting differs:\n{ref_b}\n{got}\n{err[-2000:]}")
    expect(st, "B", waits=(">=", 1), restored_tokens=("==", 1344), claims=("==", 0))
    # B slept on WATCHes at A (docs/protocol.md 4.12), answered when A's claim went or its
    # progress was marked stored: a few messages in all, not a LOOKUP every 2 ms of ~2 s of
    # waiting (about a thousand before WATCH)
    check(st.get("peer_watches", 0) >= 1, f"B sent no WATCH: {st.get('peer_watches')}")
    check(st.get("peer_lookups", 0) <= 60,
          f"B asked its peers {st.get('peer_lookups')} times while waiting (polling?)")
    ctx.finish(pa, "A")
    expect(read_stats(sa), "A", claims=("==", 3), snapshots=("==", 3), waits=("==", 0))
    # a claimant that dies: its claim goes with its coordinator, and B goes on at once (long
    # before its 60 s deadline) and computes the prefix itself
    os.unlink(touch)
    pa, _ = ctx.start([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r30@2 512"],
                      FAKELLAMA_DECODE_DELAY_MS=60000, FAKELLAMA_DECODE_TOUCH=touch)
    pb, sb = ctx.start(b_cmds, KVSHIM_LLAMA_WAIT_MS=60000)
    # A is killed once B waits on its claim (B's live llama_prefix_waits): B's start, model
    # load and first lookup can take longer than any fixed pause on a loaded machine, and with
    # A killed first B finds no claim and rightly waits 0
    deadline = time.monotonic() + 60
    while live_prefix_stats(ctx, pb).get("waits", 0) < 1:
        check(pa.poll() is None and pb.poll() is None and time.monotonic() < deadline,
              "B never waited for A's claim")
        time.sleep(0.05)
    pa.send_signal(signal.SIGKILL)
    pa.wait(timeout=10)
    got, err = ctx.finish(pb, "B, claimant killed", timeout=30)
    check(got == ref_b, f"B after its claimant died differs:\n{ref_b}\n{got}\n{err[-2000:]}")
    expect(read_stats(sb), "B, claimant killed", waits=(">=", 1), restores=("==", 0))
    # the same with waiting off: B computes what A has not stored yet
    with open(touch, "w"):
        pass
    got, err, st = ctx.run(b_cmds, what="B, KVSHIM_LLAMA_WAIT_MS=0", KVSHIM_LLAMA_WAIT_MS=0)
    check(got == ref_b, f"B without waiting differs:\n{ref_b}\n{got}")
    expect(st, "B, KVSHIM_LLAMA_WAIT_MS=0", waits=("==", 0), claims=("==", 0))


def case_unified(ctx):
    a, _ = models(ctx)
    # llama-server's defaults: 4 sequences in one unified KV cache (kv_unified, -np auto)
    cmds = [f"model 0 {a}", "ctx 0 0 4 1 8192 2048 512 1 1",
            f"prompt 0 0 {P}", "gen 0 0 4",
            f"prompt 0 1 {P1000}", "gen 0 1 4",                  # 960 restored into sequence 1
            f"prompt 0 2 {P}+r30@3", "gen 0 2 4",                # 1024 restored into 2
            "pos 0 0", "pos 0 1", "pos 0 2"]
    st, _ = same(ctx, cmds, "unified", KVSHIM_PEERS=0)
    expect(st, "unified", restores=("==", 2), restored_tokens=("==", 960 + 1024),
           bad_blobs=("==", 0), restore_failures=("==", 0))
    # a fresh replica with defaults restores from serve what another one stored (n_stream 1 in
    # both: a -np 1 replica shares the namespace)
    ctx.serve()
    ctx.run([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {P}", "gen 0 0 2"], what="A, -np 1")
    st, _ = same(ctx, [f"model 0 {a}", "ctx 0 0 4 1 8192 2048 512 1 1", f"prompt 0 3 {P1000}",
                       "gen 0 3 4"], "B, unified")
    expect(st, "B, unified", restored_tokens=("==", 960), peer_restores=("==", 1))
    # the stream holds no room for the state beside the other sequences' cells: the engine
    # refuses the load (llama-kv-cache.cpp:2421), kvshim undoes it and the batch is the
    # engine's own
    cmds = [f"model 0 {a}", "ctx 0 0 2 1 1200 1200 512 1 1",
            f"prompt 0 0 {P}", "gen 0 0 2", "rm 0 0 0 -1",
            "prompt 0 1 r50@60", "prompt 0 0 r1000@1", "gen 0 0 2",      # fits beside: restored
            "rm 0 0 -1 -1", "prompt 0 1 r100@61", "prompt 0 0 r1000@1", "gen 0 0 2",  # no room
            "pos 0 0", "pos 0 1"]
    st, _ = same(ctx, cmds, "unified, full", KVSHIM_PEERS=0)
    expect(st, "unified, full", restores=("==", 1), restore_failures=("==", 0))


def case_multi(ctx):
    """Batches of several sequences that cannot be skipped whole (llama-server slots started
    together, an output asked): each sequence's part restores its cached prefix up to its first
    output and the rest of every sequence is decoded in one batch, outputs remapped."""
    a, _ = models(ctx)
    cmds = [f"model 0 {a}", "ctx 0 0 4 1 8192 2048 512 1 1",
            "prompt 0 0 r1400@1+r30@2 2048", "gen 0 0 2",
            "multi 0 1 r1024@1 2 r1024@1",               # output on 2's last token
            "multi 0 1 r1400@1/1024+r20@3 2 r1400@1/1024+r20@4",
            "gen 0 2 4", "pos 0 1", "pos 0 2"]
    # The engine's own KV for these parts comes from ubatches mixing both sequences (another
    # kernel class than a restored prefix's, as in the real backend): the logits differ, every
    # output is still there (bad=0: each remapped index has an output) and the memory is the
    # engine's (positions), and the decode succeeds.
    def shape(lines):
        return [" ".join(w for w in ln.split() if w.split("=")[0] not in ("out", "toks", "last"))
                for ln in lines]
    ref, _, _ = ctx.run(cmds, preload=False, what="multi (reference)")
    got, err, st = ctx.run(cmds, what="multi", KVSHIM_PEERS=0)
    check(shape(got) == shape(ref) and all("bad=0" in ln for ln in got if " bad=" in ln),
          f"multi:\n{ref}\n{got}\n{prefix_stats(st)}\n{err[-3000:]}")
    expect(st, "multi", restores=(">=", 3), restored_tokens=(">=", 1024 + 1023 + 300),
           restore_failures=("==", 0))


def case_shared(ctx):
    """In-process single flight: two sequences of one batch (llama-server slots started
    together), cold, sharing a 768-token prefix. The prefix is computed once: the engine decodes
    768 tokens fewer than without kvshim (its own token count), the second sequence restores it
    from the first's stored state, every output identical (the fake's kernel classes are
    those of the engine's mixed ubatches here: 512-row tiles at positions 0, 256, 512, then a
    40-row tail, as the lone prefix and the rest decode give). Per-sequence and unified KV
    (llama-server's default). A follower whose state load the engine refuses computes the
    prefix itself in the engine's own batch (the leader's decode is undone): identical, nothing
    shared."""
    a, _ = models(ctx)
    for unified in (0, 1):
        cmds = [f"model 0 {a}", f"ctx 0 0 4 1 8192 2048 512 1 {unified}",
                "multi 0 1 r768@1+r20@3 2 r768@1+r20@4", "gen 0 2 4",
                "prompt 0 1 r4@9", "gen 0 1 3", "pos 0 1", "pos 0 2", "decoded 0"]
        what = f"shared (unified {unified})"
        ref, _, _ = ctx.run(cmds, preload=False, what=f"{what} (reference)")
        got, err, st = ctx.run(cmds, what=what, KVSHIM_PEERS=0)
        detail = f"\n{ref}\n{got}\n{prefix_stats(st)}\n{err[-3000:]}"
        check(ref[:-1] == got[:-1], f"{what}: outputs differ with kvshim:{detail}")
        dref, dgot = int(ref[-1].split()[1]), int(got[-1].split()[1])
        check(dref - dgot == 768, f"{what}: the engine computed {dref} tokens without kvshim, "
                                  f"{dgot} with it: the shared prefix not computed once{detail}")
        expect(st, what, shared_in_batch=("==", 1), restored_tokens=("==", 768),
               restore_failures=("==", 0), snapshots=(">=", 1))
        print(f"{what}: {dref} tokens computed without kvshim, {dgot} with it")
        got, err, st = ctx.run(cmds, what=f"{what}, load refused", KVSHIM_PEERS=0,
                               FAKELLAMA_SET_DATA_FAIL_OVER="100")
        detail = f"\n{ref}\n{got}\n{prefix_stats(st)}\n{err[-3000:]}"
        check(ref[:-1] == got[:-1], f"{what}, load refused: differs with kvshim:{detail}")
        expect(st, f"{what}, load refused", shared_in_batch=("==", 0), restores=("==", 0))


def case_used(ctx):
    """A used sequence (llama-server keeps the common start of a slot's older prompt, BOS at
    least): the longer cached prefix is restored and the load replaces the sequence. Its
    outputs are then those the engine computes for the prompt in a fresh sequence (the kept
    cells of an unaligned prefix cannot be matched byte for byte), which is what the reference
    runs here: the same commands with the sequence cleared instead of kept."""
    a, _ = models(ctx)
    bos, doc = "1-1", "r1400@1"
    ctx.serve()
    ctx.run([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {bos}+{doc}+r30@2", "gen 0 0 2"],
            what="producer")

    def used(keep):
        return [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {bos}+r300@7", "gen 0 0 4",
                f"rm 0 0 {keep} -1", f"prompt 0 0 {bos + '+' if not keep else ''}{doc}+r32@3",
                "gen 0 0 8",
                "pos 0 0"]
    ref, _, _ = ctx.run(used(0), preload=False, what="used (reference: a fresh sequence)")
    got, err, st = ctx.run(used(1), what="used")
    # the batch sizes differ (n=): the outputs (out=), generated tokens and positions may not
    def outputs(lines):
        return [" ".join(w for w in ln.split() if not w.startswith("n=")) for ln in lines[5:]]
    check(outputs(got) == outputs(ref), f"used: outputs differ from a fresh sequence's:\n{ref}\n"
                                        f"{got}\n{prefix_stats(st)}\n{err[-3000:]}")
    expect(st, "used", restores=("==", 1), restored_tokens=("==", 1344 - 1),
           peer_restores=("==", 1), restore_failures=("==", 0))
    # the engine refuses the load: the sequence's own kept cells are loaded back (a copy kept
    # before the restore), and the batch is the engine's own: identical to the reference
    # without kvshim
    got, err, st = ctx.run(used(1), what="used, load refused", FAKELLAMA_SET_DATA_FAIL_OVER=100)
    ref1, _, _ = ctx.run(used(1), preload=False, what="used (reference)")
    check(got == ref1, f"used, load refused: differs:\n{ref1}\n{got}\n{err[-3000:]}")
    expect(st, "used, load refused", restores=("==", 0))


def case_known(ctx):
    """A sequence the engine saved itself (llama_state_seq_get_data) and loaded back
    (set_data, into another sequence: llama-server's --cache-ram prompt cache) is known again:
    restored into and stored, identical."""
    a, _ = models(ctx)
    cmds = [f"model 0 {a}", "ctx 0 0 2",
            "prompt 0 0 r1400@1 512", "gen 0 0 2",
            "copyseq 0 0 1",                        # get_data of 0, set_data into 1
            "rm 0 0 -1 -1",
            "prompt 0 1 r60@5", "gen 0 1 2",         # continues the known sequence 1
            "pos 0 1"]
    st, _ = same(ctx, cmds, "known", KVSHIM_PEERS=0)
    expect(st, "known", states_known=("==", 1), refused_unknown=("==", 0))


def case_swa(ctx):
    a, _ = models(ctx)
    w = ctx.p("swa.gguf")
    ctx.run([f"mkmodel {w} alpha 2 32 64 1 256"], preload=False)
    prompts = [f"prompt 0 0 {P} 512", "gen 0 0 2", "clear 0", f"prompt 0 0 {P1000} 512",
               "gen 0 0 4"]
    # a 256-token window without swa_full: only states ending on a chunk boundary are stored
    # (after [0,512) and [512,1024); not at 1100, which could only be restored trimmed), and
    # one is restored only whole: P1000's [0,512) is skipped, its [512,1024) (diverging at
    # 1000) is decoded
    st, err = same(ctx, [f"model 0 {w}", "ctx 0 0 1 1 4096 2048 512 0"] + prompts,
                   "sliding window", KVSHIM_PEERS=0)
    expect(st, "sliding window", snapshots=("==", 3), restores=("==", 1),
           restored_tokens=("==", 512), restore_failures=("==", 0))
    # chunk storage asked for: the same whole states, each counted with its reason, and said
    st, err = same(ctx, [f"model 0 {w}", "ctx 0 0 1 1 4096 2048 512 0"] + prompts,
                   "sliding window, chunks", KVSHIM_PEERS=0, KVSHIM_LLAMA_CHUNKS=1,
                   KVSHIM_LOG="info")
    expect(st, "sliding window, chunks", snapshots=("==", 3), restored_tokens=("==", 512))
    cs = chunk_stats(st)
    check(cs.get("llama_chunks_whole") == 3 and cs.get("llama_chunks_whole_window") == 3 and
          cs.get("llama_chunks_stored") == 0, f"window states not counted as whole: {cs}")
    check("chunk storage off for this context: a sliding-window cache" in err,
          f"no line says why the states are whole:\n{err[-2000:]}")
    # with swa_full (llama.cpp keeps every cell) the cache works as on any model, and its
    # states (a base and a window section) split into chunks
    st, _ = same(ctx, [f"model 0 {w}", "ctx 0 0 1 1 4096 2048 512 1"] + prompts,
                 "sliding window, swa_full", KVSHIM_PEERS=0)
    expect(st, "sliding window, swa_full", snapshots=(">=", 1), restores=(">=", 1))
    st, _ = same(ctx, [f"model 0 {w}", "ctx 0 0 1 1 4096 2048 512 1"] + prompts,
                 "sliding window, swa_full, chunks", KVSHIM_PEERS=0, KVSHIM_LLAMA_CHUNKS=1)
    expect(st, "sliding window, swa_full, chunks", restores=(">=", 1))
    cs = chunk_stats(st)
    check(cs.get("llama_chunks_whole") == 0 and cs.get("llama_chunks_stored", 0) >= 4 and
          cs.get("llama_chunks_assembled", 0) >= 1, f"swa_full: not split: {cs}")


def case_held_mixed(ctx):
    a, _ = models(ctx)
    ctx.serve()
    # P0 stores a prefix (into serve) that A's mixed batch restores whole
    ctx.run([f"model 0 {a}", "ctx 0 0 4", "prompt 0 0 r1400@5+r30@2 512", "gen 0 0 2"], what="P0")
    ready, go = ctx.p("ready"), ctx.p("go")
    # A computes r1024@1 in two claimed batches asking no output, so it holds the second claim
    # (its snapshots fail: get_data fails, so only the claim tells a peer about the prefix),
    # then a batch of sequences 1 and 2 inside P0's prefix, skipped whole; then A waits.
    a_cmds = [f"model 0 {a}", "ctx 0 0 4", "prompt 0 0 r1024@1 512 none",
              "multi 0 1 r256@5 2 r256@5 none", "pos 0 1", f"touch {ready}",
              f"waitfile {go} 60"]
    pa, sa = ctx.start(a_cmds, FAKELLAMA_GET_DATA_FAIL=1)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            check(time.monotonic() < deadline and pa.poll() is None, "A never got ready")
            time.sleep(0.02)
        # B's one batch of r1024@1 finds nothing to restore and has the claim key of A's second
        # batch: with the claim still held, B would wait for A (up to its 20 s deadline)
        t0 = time.monotonic()
        _, err, sb = ctx.run([f"model 0 {a}", "ctx 0 0 4", "prompt 0 0 r1024@1 1024"],
                             what="B", KVSHIM_LLAMA_WAIT_MS=20000)
        waited = time.monotonic() - t0
    finally:
        with open(go, "w"):
            pass
    la, _ = ctx.finish(pa, "A")
    check(la[4] == "pos 0..255", f"A's mixed batch: {la}")
    st = read_stats(sa)
    expect(st, "A", claims=("==", 2), restores=("==", 2), restored_tokens=("==", 512),
           restore_failures=("==", 0))
    expect(sb, "B", waits=("==", 0), claims=("==", 1))
    check(waited < 15, f"B waited {waited:.1f} s on A's claim")


def chunk_stats(st):
    return {k: v for k, v in (st or {}).items() if k.startswith("llama_chunks_")}


def case_chunks(ctx):
    """KVSHIM_LLAMA_CHUNKS=1 (design §10.4): one shared 1024-token prefix and four different
    suffixes in one process: the prefix's four chunks are stored once (dedup counted for every
    later prompt), every later prompt restores by assembly, outputs identical; the chunk objects
    hold less than half the bytes the whole blobs hold for the same prompts; a fresh process
    restores the run from the first one's chunks (a peer); a window model stores whole."""
    a, _ = models(ctx)
    shared = "r1024@1"
    cmds = [f"model 0 {a}", "ctx 0 0 1"]
    for k in range(2, 6):
        cmds += ["rm 0 0 -1 -1", f"prompt 0 0 {shared}+r300@{k}", "gen 0 0 4"]
    on = {"KVSHIM_LLAMA_CHUNKS": "1", "KVSHIM_PEERS": "0"}
    st, err = same(ctx, cmds, "chunks", preload_extra=on)
    ch = chunk_stats(st)
    print(f"chunks: {ch}")
    check(ch.get("llama_chunks_stored") == 4 + 4 * 1 and ch.get("llama_chunks_dedup") == 3 * 4,
          f"chunks: expected 8 chunks stored (4 shared + 1 per prompt) and 12 dedup hits: {ch}")
    check(ch.get("llama_chunks_saved_bytes", 0) > 0 and ch.get("llama_chunks_whole") == 0, f"{ch}")
    check(ch.get("llama_chunks_assembled", 0) >= 3, f"chunks: no restore by assembly: {ch}")
    expect(st, "chunks", restores=(">=", 3), restored_tokens=(">=", 3 * 1024),
           bad_blobs=("==", 0), restore_failures=("==", 0))
    st_off, _ = same(ctx, cmds, "whole blobs", KVSHIM_PEERS="0")
    on_b, off_b = st["llama_prefix_snapshot_bytes"], st_off["llama_prefix_snapshot_bytes"]
    print(f"chunks: stored {on_b} bytes as chunks, {off_b} as whole blobs ({off_b / on_b:.2f}x)")
    check(2 * on_b < off_b, f"chunk storage did not save: {on_b} vs {off_b} bytes")
    # a damaged chunk: refused, counted and dropped; the restore retries with the run before
    # it; the next prompt's snapshot stores chunk 1 again
    dmg = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r300@2", "gen 0 0 4",
           "corruptchunk 1", "rm 0 0 -1 -1", f"prompt 0 0 {shared}+r300@3", "gen 0 0 4",
           "rm 0 0 -1 -1", f"prompt 0 0 {shared}+r300@4", "gen 0 0 4"]
    ref, _, _ = ctx.run(dmg[:4] + dmg[5:], preload=False, what="damaged chunk (reference)")
    got, err, sd = ctx.run(dmg, what="damaged chunk", **on)
    check(got[4] == "corruptchunk ok 1" and got[:4] + got[5:] == ref,
          f"damaged chunk: differs with kvshim:\n{ref}\n{got}\n{err[-2000:]}")
    cd = chunk_stats(sd)
    check("chunk objects refused: checksum mismatch" in err, f"no refusal logged:\n{err[-2000:]}")
    # (the 256 tokens before the damaged chunk are no restore point for that batch under the
    # kernel-class rules; the next prompt restores the whole prefix again)
    expect(sd, "damaged chunk", bad_blobs=("==", 1), restores=(">=", 1),
           restored_tokens=(">=", 1024))
    check(cd.get("llama_chunks_stored") == 5 + 1 + 1 + 1, f"chunk 1 stored again once: {cd}")
    # a fresh process B restores A's chunks through A's coordinator
    ready, done = ctx.p("a.ready"), ctx.p("b.done")
    b_cmds = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r300@9", "gen 0 0 4"]
    ref_b, _, _ = ctx.run(b_cmds, preload=False, what="B reference")
    pa, sa = ctx.start([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r300@2", "gen 0 0 4",
                        f"touch {ready}", f"waitfile {done} 60"], KVSHIM_LLAMA_CHUNKS="1")
    deadline = time.monotonic() + 60
    while not os.path.exists(ready):
        check(time.monotonic() < deadline and pa.poll() is None, "A never got ready")
        time.sleep(0.02)
    got, err, sb = ctx.run(b_cmds, what="B", KVSHIM_LLAMA_CHUNKS="1")
    check(got == ref_b, f"B from A's chunks differs:\n{ref_b}\n{got}\n{err[-2000:]}")
    expect(sb, "B", peer_restores=(">=", 1), restored_tokens=(">=", 1024))
    check(chunk_stats(sb).get("llama_chunks_assembled", 0) >= 1, f"B: {chunk_stats(sb)}")
    with open(done, "w"):
        pass
    ctx.finish(pa, "A")
    # one copy per node: `kvshim serve` holds the chunks, no engine keeps a copy
    ctx.serve()
    _, _, sa = ctx.run([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r300@2", "gen 0 0 4"],
                       what="A to serve", KVSHIM_LLAMA_CHUNKS="1")
    check(chunk_stats(sa).get("llama_chunks_stored") == 5 and
          chunk_stats(sa).get("llama_chunks_tails") == 1 and sa.get("cache_peer_stores") == 7
          and sa.get("store_used_bytes") == 0,
          f"A's frame, 5 chunks and the tail went straight into serve's pool: {chunk_stats(sa)} {sa}")
    got, err, sb = ctx.run(b_cmds, what="B from serve", KVSHIM_LLAMA_CHUNKS="1")
    check(got == ref_b, f"B from serve's chunks differs:\n{ref_b}\n{got}\n{err[-2000:]}")
    expect(sb, "B from serve", peer_restores=(">=", 1), restored_tokens=(">=", 1024))
    check(sb.get("store_used_bytes") == 0 and chunk_stats(sb).get("llama_chunks_dedup", 0) >= 4,
          f"B kept no copy and stored only its own chunks: {chunk_stats(sb)} {sb}")
    # read in place in serve's pool, frame and chunks in one transfer (px_chunks_in_place)
    check(sb.get("cache_peer_loads", 0) >= 1 and sb.get("store_reserved", 0) == 0,
          f"B's restore was not read in place in serve's pool: {sb}")


def case_chunks_mix(ctx):
    """KVSHIM_LLAMA_CHUNKS=1, one restore from a mix of local and peer chunks: B holds the
    first two chunks of a 1024-token prefix (its own 612-token prompt), A (a peer) then stores
    the prefix and keeps only chunks 2 and 3 (0 and 1 are B's: dedup); B's next prompt
    restores all 1024 tokens from its own two chunks and A's two, outputs identical. Without
    the peer run after the local one B restores 512 tokens at most."""
    a, _ = models(ctx)
    shared = "r1024@1"
    b_ready, a_ready = ctx.p("b.ready"), ctx.p("a.ready")
    b_go, done = ctx.p("b.go"), ctx.p("done")
    b_cmds = [f"model 0 {a}", "ctx 0 0 1", "prompt 0 0 r512@1+r100@7", "gen 0 0 4",
              f"touch {b_ready}", f"waitfile {b_go} 60",
              "rm 0 0 -1 -1", f"prompt 0 0 {shared}+r300@9", "gen 0 0 4", f"touch {done}"]
    a_cmds = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r300@2", "gen 0 0 4",
              f"touch {a_ready}", f"waitfile {done} 60"]
    ref_b, _, _ = ctx.run([c for c in b_cmds if not c.startswith(("touch", "waitfile"))],
                          preload=False, what="B reference")
    on = {"KVSHIM_LLAMA_CHUNKS": "1"}
    pb, sb = ctx.start(b_cmds, **on)
    wait_file(b_ready, "B ready", pb)
    pa, sa = ctx.start(a_cmds, **on)
    wait_file(a_ready, "A ready", pa)
    with open(b_go, "w"):
        pass
    lb, err = ctx.finish(pb, "B")
    ctx.finish(pa, "A")
    got = [ln for ln in lb if not ln.startswith(("touch", "waitfile"))]
    check(got == ref_b, f"B from local and peer chunks differs:\n{ref_b}\n{got}\n{err[-2000:]}")
    sta, stb = read_stats(sa), read_stats(sb)
    ca, cb = chunk_stats(sta), chunk_stats(stb)
    print(f"chunks-mix: A {ca}\nchunks-mix: B {cb} {prefix_stats(stb)}")
    check(ca.get("llama_chunks_dedup") == 2 and ca.get("llama_chunks_stored") == 3,
          f"A found chunks 0, 1 at B and stored 2, 3 and its suffix's: {ca}")
    check(cb.get("llama_chunks_assembled") == 1, f"B: one restore by assembly: {cb}")
    expect(stb, "B", restores=("==", 1), restored_tokens=("==", 1024), peer_restores=("==", 1),
           bad_blobs=("==", 0), restore_failures=("==", 0))


def case_chunks_foreign(ctx):
    """KVSHIM_LLAMA_CHUNKS=1: chunks stored by a context of one model are never assembled for
    a context of another model (same shape, other weights) nor of another KV type, though the
    prompt's tokens are the same (their keys chain from the context's namespace: design §10.4);
    outputs identical, nothing refused. Without the namespace B would load A's chunks (outputs
    of the wrong weights, or a KV type the engine refuses)."""
    a, b = models(ctx)
    shared = "r1024@1"
    ready, done = ctx.p("a.ready"), ctx.p("done")
    pa, sa = ctx.start([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r300@2", "gen 0 0 4",
                        f"touch {ready}", f"waitfile {done} 60"], KVSHIM_LLAMA_CHUNKS="1")
    wait_file(ready, "A ready", pa)
    try:
        for what, model, kv in (("other model", b, 1), ("other KV type", a, 8),
                                ("same model and KV type", a, 1)):
            cmds = [f"model 0 {model}", f"ctx 0 0 1 {kv}", f"prompt 0 0 {shared}+r300@3",
                    "gen 0 0 4"]
            st, err = same(ctx, cmds, f"chunks-foreign: {what}",
                           preload_extra={"KVSHIM_LLAMA_CHUNKS": "1"})
            cs = chunk_stats(st)
            if model == a and kv == 1:  # the control: A's chunks are found and assembled
                check(cs.get("llama_chunks_assembled") == 1, f"{what}: {cs}")
                expect(st, what, restored_tokens=("==", 1024), peer_restores=("==", 1))
                continue
            check(cs.get("llama_chunks_assembled", 0) == 0 and cs.get("llama_chunks_dedup") == 0,
                  f"{what}: A's chunks were found: {cs}")
            expect(st, what, restores=("==", 0), bad_blobs=("==", 0), restore_failures=("==", 0))
    finally:
        with open(done, "w"):
            pass
    ctx.finish(pa, "A")


def case_chunks_tail(ctx):
    """KVSHIM_LLAMA_CHUNKS=1 restores past a run's whole chunks as far as a whole blob does
    (design §10.4, continuation chunks). One process, no peers. A 600-token prompt stores two
    chunks and its 88 canonical tokens past them as a short tail chunk; the same prompt with a
    suffix restores the two chunks and the tail. A 1000-token prompt stores three chunks (the
    third also under the continuation key after the second); another 1000-token prompt sharing
    its first 700 tokens restores two chunks and the first 188 tokens of that third chunk. The
    tokens restored with chunks equal those restored from whole blobs (KVSHIM_LLAMA_CHUNKS=0),
    more than the 1,024 the whole chunks alone give; outputs identical. Without continuation
    chunks each restore stops at 512."""
    a, _ = models(ctx)
    cmds = [f"model 0 {a}", "ctx 0 0 1",
            "prompt 0 0 r600@1", "gen 0 0 2",
            "rm 0 0 -1 -1", "prompt 0 0 r600@1+r50@2", "gen 0 0 2",
            "rm 0 0 -1 -1", "prompt 0 0 r700@3+r300@4", "gen 0 0 2",
            "rm 0 0 -1 -1", "prompt 0 0 r700@3+r300@5", "gen 0 0 2"]
    st, err = same(ctx, cmds, "chunks-tail", preload_extra={"KVSHIM_LLAMA_CHUNKS": "1",
                                                            "KVSHIM_PEERS": "0"})
    whole, _ = same(ctx, cmds, "chunks-tail (whole blobs)", KVSHIM_PEERS="0")
    cs, tw = chunk_stats(st), prefix_stats(whole).get("restored_tokens")
    print(f"chunks-tail: {cs}; restored {prefix_stats(st).get('restored_tokens')} with chunks, "
          f"{tw} from whole blobs")
    check(tw is not None and tw > 2 * 512, f"whole blobs restored {tw}: the test's premise")
    expect(st, "chunks-tail", restores=("==", 2), restored_tokens=("==", tw), bad_blobs=("==", 0),
           restore_failures=("==", 0))
    check(cs.get("llama_chunks_tails", 0) >= 2 and cs.get("llama_chunks_whole") == 0,
          f"chunks-tail: tails stored: {cs}")
    check(cs.get("llama_chunks_tail_tokens") == tw - 2 * 512 and cs.get("llama_chunks_assembled") == 2,
          f"chunks-tail: {tw - 2 * 512} tokens past the whole chunks expected: {cs}")


def case_chunks_reuse(ctx):
    """KVSHIM_LLAMA_CHUNKS=1, one process, no peers (design §10.4, the assembly kept). A
    1024-token prefix is stored as chunks by a prompt with a 300-token suffix; prompts with
    20-token suffixes restore its four chunks and store nothing (their suffix ends no new
    chunk). The first loads the run directly (its runs left in the chunks: the buffer is not
    the whole state), so the next, the same run again, assembles it whole; a prompt with a
    300-token suffix then loads that state again from the context's buffer and snapshots (the
    buffer holds its state now), so the prompt after it assembles whole again. Outputs
    identical."""
    a, _ = models(ctx)
    shared = "r1024@1"
    cmds = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {shared}+r300@2", "gen 0 0 2"]
    for suffix in ("r20@3", "r20@4", "r300@5", "r20@6"):
        cmds += ["rm 0 0 -1 -1", f"prompt 0 0 {shared}+{suffix}", "gen 0 0 2"]
    st, err = same(ctx, cmds, "chunks-reuse", preload_extra={"KVSHIM_LLAMA_CHUNKS": "1",
                                                             "KVSHIM_PEERS": "0"})
    cs = chunk_stats(st)
    print(f"chunks-reuse: {cs}")
    expect(st, "chunks-reuse", restores=("==", 4), restored_tokens=(">=", 4 * 1024),
           bad_blobs=("==", 0), restore_failures=("==", 0))
    check(cs.get("llama_chunks_assembled") == 3 and cs.get("llama_chunks_reused") == 1 and
          cs.get("llama_chunks_direct") == 1,
          f"chunks-reuse: expected 3 assemblies (r20@3 direct, r20@4 and r20@6 whole) and 1 "
          f"reuse (r300@5): {cs}")


def case_chunks_direct(ctx):
    """KVSHIM_LLAMA_CHUNKS=1, direct loads (design §10.4). The fake loads a state's tensor runs
    through libfakeggml's ggml_backend_tensor_set, as llama.cpp's llama_io_read_host does, so a
    restore by assembly writes only the state's metadata and kvshim serves the runs from the
    chunks where they lie. Three prompts restore three different runs (the prefix's four chunks,
    then 100 and 200 tokens of its continuation chunk too): three direct loads, outputs
    identical. An engine that reads the tensor bytes itself (FAKELLAMA_TENSOR_MEMCPY=1, as a
    llama.cpp linked statically would): the first direct load is found incomplete, undone and
    counted (llama_chunks_direct_refused), the run assembled whole and loaded again: the same
    three restores, no failure, no direct load after it. One that stops going through ggml after
    its first load (FAKELLAMA_TENSOR_MEMCPY_AFTER=1): the first restore is direct, the second is
    refused and loaded whole. KVSHIM_LLAMA_DIRECT=0: every assembly copied. A context with V
    transposed (no flash attention): its K runs load directly, its short per-element V runs are
    copied. Without the check after each load the MEMCPY runs would load bytes never written
    (outputs differ)."""
    a, _ = models(ctx)
    shared = "r1024@1"
    body = [f"prompt 0 0 {shared}+r300@2", "gen 0 0 2"]
    for suffix in ("r20@3", "r100@2+r20@3", "r200@2+r20@4"):
        body += ["rm 0 0 -1 -1", f"prompt 0 0 {shared}+{suffix}", "gen 0 0 2"]
    cmds = [f"model 0 {a}", "ctx 0 0 1"] + body
    transposed = [f"model 0 {a}", "ctx 0 0 1 1 4096 2048 512 0 0 0"] + body
    on = {"KVSHIM_LLAMA_CHUNKS": "1", "KVSHIM_PEERS": "0"}
    modes = (("through ggml", {}, 3, 0, 3),
             ("engine copies itself", {"FAKELLAMA_TENSOR_MEMCPY": "1"}, 0, 1, 4),
             ("engine copies itself after one load", {"FAKELLAMA_TENSOR_MEMCPY_AFTER": "1"}, 1, 1, 4),
             ("KVSHIM_LLAMA_DIRECT=0", {"KVSHIM_LLAMA_DIRECT": "0"}, 0, 0, 3))
    restored = None
    for what, env, direct, refused, assembled in modes:
        ref_env = {k: v for k, v in env.items() if k.startswith("FAKELLAMA_")}
        st, err = same(ctx, cmds, f"chunks-direct: {what}", preload_extra={**on, **env},
                       ref_extra=ref_env)
        cs = chunk_stats(st)
        print(f"chunks-direct: {what}: {cs}")
        expect(st, what, restores=("==", 3), bad_blobs=("==", 0), restore_failures=("==", 0))
        check(cs.get("llama_chunks_direct") == direct and
              cs.get("llama_chunks_direct_refused") == refused and
              cs.get("llama_chunks_assembled") == assembled,
              f"{what}: expected {direct} direct loads, {refused} refused, {assembled} "
              f"assemblies: {cs}")
        check((cs.get("llama_chunks_direct_bytes", 0) > 0) == (direct > 0), f"{what}: {cs}")
        check(("did not upload every tensor run" in err) == (refused > 0),
              f"{what}: the refusal is logged once it happens:\n{err[-2000:]}")
        got = prefix_stats(st).get("restored_tokens")
        restored = got if restored is None else restored
        check(got == restored, f"{what}: restored {got} tokens, {restored} through ggml")
    st, err = same(ctx, transposed, "chunks-direct: V transposed", preload_extra=on)
    cs = chunk_stats(st)
    expect(st, "V transposed", restores=("==", 3), bad_blobs=("==", 0), restore_failures=("==", 0))
    check(cs.get("llama_chunks_direct") == 3 and cs.get("llama_chunks_direct_refused") == 0,
          f"V transposed: expected 3 direct loads: {cs}")


def same_with_serve(ctx, cmds, what, env):
    """same() with a fresh `kvshim serve` in the case's group (one copy per node), stopped
    after: (the engine's stats, serve's stats at the end)."""
    sv = ctx.serve()
    try:
        st, _ = same(ctx, cmds, what, preload_extra=env)
        return st, harness.live_stats(ctx, sv.pid) or {}
    finally:
        sv.kill()
        sv.communicate(timeout=10)


def case_chunks_direct_store(ctx):
    """KVSHIM_LLAMA_CHUNKS=1, direct snapshots (design §10.4). The fake writes a state's tensor
    runs through libfakeggml's ggml_backend_tensor_get, as llama.cpp's llama_io_write_host does,
    so once a context's frame is known (its first snapshot, split by copying) each later snapshot
    reserves its chunks first and kvshim sends the runs the engine writes straight into them.
    Four snapshots after the first: one storing past a shared prefix (4 chunks found already
    stored: dedup), one of a fresh prompt, and one longer prompt after each; then prompts
    restore from the chunks those snapshots wrote in place: outputs identical, and the chunk
    counters and node
    bytes equal those of the copying snapshots (KVSHIM_LLAMA_DIRECT=0). An engine that writes the
    tensor bytes itself (FAKELLAMA_TENSOR_GET_MEMCPY=1): the first direct snapshot is found
    incomplete, its reservations dropped (llama_chunks_direct_store_refused) and the state
    stored by copying, as every later one: the same counters and outputs. With one copy per node
    (`kvshim serve`) the chunks are reserved in serve's pool, each held across the engine's call
    without the connection's lock, and written there in place: the same 4 direct snapshots, and
    serve ends with the chunk counters and bytes of a serve the same prompts filled by copying
    (each run with a fresh serve). With 16-token chunks of a wider model a snapshot reserves
    more chunks than one batch of requests holds: every chunk still lands at serve. An engine
    that reaches serve inline writes its chunks in place in its own pool. With --tensor-count,
    the bytes the engine downloads are counted: a direct snapshot drops the downloads of chunks
    held already, so fewer than a copying one."""
    a, _ = models(ctx)
    shared = "r1024@1"
    # With --tensor-count, libtensorset_count.so after kvshim counts the bytes the engine really
    # downloads (kvshim's hook forwards to it): a direct snapshot does not download the runs of
    # chunks held already (nobody reads them), so it downloads fewer than a copying one.
    count = ({"LD_PRELOAD": ":".join(filter(None, (ctx.asan_runtime, ctx.preload,
                                                   ctx.args.tensor_count)))}
             if getattr(ctx.args, "tensor_count", None) else {})

    def downloaded(err):
        m = re.search(r"tensorget calls=\d+ bytes=(\d+)", err)
        return int(m.group(1)) if m else None
    cmds = [f"model 0 {a}", "ctx 0 0 1"]
    for p in (f"{shared}+r300@2", f"{shared}+r300@3", "r1300@7", "r1300@7+r300@8",
              f"{shared}+r300@3+r300@4", f"{shared}+r300@3+r300@4+r9@5", "r1300@7+r300@8+r9@6",
              f"{shared}+r300@2+r9@9"):
        cmds += ["rm 0 0 -1 -1", f"prompt 0 0 {p}", "gen 0 0 2"]
    on = {"KVSHIM_LLAMA_CHUNKS": "1", "KVSHIM_PEERS": "0"}
    keep = ("llama_chunks_stored", "llama_chunks_dedup", "llama_chunks_saved_bytes",
            "llama_chunks_tails", "llama_chunks_assembled")
    base = None
    got_bytes = {}
    for what, env, direct, refused in (("KVSHIM_LLAMA_DIRECT=0", {"KVSHIM_LLAMA_DIRECT": "0"}, 0, 0),
                                       ("through ggml", {}, 4, 0),
                                       ("engine writes itself", {"FAKELLAMA_TENSOR_GET_MEMCPY": "1"},
                                        0, 1)):
        ref_env = {k: v for k, v in env.items() if k.startswith("FAKELLAMA_")}
        st, err = same(ctx, cmds, f"chunks-direct-store: {what}",
                       preload_extra={**on, **env, **count}, ref_extra=ref_env)
        cs = chunk_stats(st)
        got_bytes[what] = downloaded(err)
        print(f"chunks-direct-store: {what}: {cs} used {st.get('store_used_bytes')}, engine "
              f"downloaded {got_bytes[what]} bytes")
        check(cs.get("llama_chunks_direct_stores") == direct and
              cs.get("llama_chunks_direct_store_refused") == refused,
              f"{what}: expected {direct} direct snapshots, {refused} refused: {cs}")
        expect(st, what, snapshots=("==", 5), restores=(">=", 6), bad_blobs=("==", 0),
               restore_failures=("==", 0), snapshot_failures=("==", 0))
        got = ({k: cs.get(k) for k in keep}, st.get("store_used_bytes"))
        base = got if base is None else base
        check(got == base, f"{what}: chunk counters and node bytes {got}, copying {base}")
    if count:
        full, direct = got_bytes["KVSHIM_LLAMA_DIRECT=0"], got_bytes["through ggml"]
        check(full and direct is not None and direct < full,
              f"direct snapshots downloaded {direct} bytes, copying ones {full}: the runs of "
              f"chunks held already must not be downloaded")
    at_serve = None
    for what, env, direct in (("serve, KVSHIM_LLAMA_DIRECT=0", {"KVSHIM_LLAMA_DIRECT": "0"}, 0),
                              ("serve", {}, 4)):
        st, node = same_with_serve(ctx, cmds, f"chunks-direct-store: {what}",
                                   {"KVSHIM_LLAMA_CHUNKS": "1", **env})
        cs = chunk_stats(st)
        print(f"chunks-direct-store: {what}: {cs} cache_peer_stores "
              f"{st.get('cache_peer_stores')}, serve holds {node.get('store_used_bytes')}")
        check(cs.get("llama_chunks_direct_stores") == direct and
              cs.get("llama_chunks_direct_store_refused", 0) == 0,
              f"{what}: expected {direct} direct snapshots into serve's pool: {cs}")
        expect(st, what, snapshots=("==", 5), restores=(">=", 6), bad_blobs=("==", 0),
               restore_failures=("==", 0), snapshot_failures=("==", 0))
        check(st.get("cache_peer_stores", 0) > 0 and st.get("cache_peer_fallbacks", 0) == 0,
              f"{what}: every chunk stored at serve: {st.get('cache_peer_stores')} stored, "
              f"{st.get('cache_peer_fallbacks')} fell back")
        got = ({k: cs.get(k) for k in keep}, node.get("store_used_bytes"),
               node.get("store_objects"))
        at_serve = got if at_serve is None else at_serve
        check(got == at_serve, f"{what}: chunk counters and serve's bytes and objects {got}, "
                               f"copying {at_serve}")
    # 16-token chunks of a model of 256 values a row (a chunk's K run 4 KiB, planned): a
    # snapshot of up to 1,933 tokens reserves more chunks than one batch of requests holds
    # (KVS_PEERS_RESERVE_MAX, 64): several batches, every chunk at serve
    wide = ctx.p("wide.gguf")
    ctx.run([f"mkmodel {wide} alpha 2 256 64 1"], preload=False)
    st, _ = same_with_serve(ctx, [f"model 0 {wide}"] + cmds[1:],
                            "chunks-direct-store: serve, 16-token chunks",
                            {"KVSHIM_LLAMA_CHUNKS": "1", "KVSHIM_CHUNK_TOKENS": "16"})
    cs = chunk_stats(st)
    print(f"chunks-direct-store: serve, 16-token chunks: {cs}")
    snaps = prefix_stats(st).get("snapshots", 0)
    at = st.get("cache_peer_stores", 0)
    check(snaps >= 5 and cs.get("llama_chunks_direct_stores") == snaps - 1 and
          cs.get("llama_chunks_stored", 0) > 64 and st.get("cache_peer_fallbacks", 0) == 0 and
          at >= cs.get("llama_chunks_stored", 0) + cs.get("llama_chunks_tails", 0),
          f"16-token chunks: expected every snapshot but the first ({snaps}) direct, over 64 "
          f"chunks, every one stored at serve ({at}): {cs}, fallbacks "
          f"{st.get('cache_peer_fallbacks')}")
    expect(st, "16-token chunks", restores=(">=", 6), bad_blobs=("==", 0),
           restore_failures=("==", 0), snapshot_failures=("==", 0))
    # an engine that reaches serve inline (KVSHIM_STRATEGY=inline: no mapping of serve's pool)
    # cannot write there in place: its snapshots still write in place, into its own pool
    st, _ = same_with_serve(ctx, cmds, "chunks-direct-store: serve inline",
                            {"KVSHIM_LLAMA_CHUNKS": "1", "KVSHIM_STRATEGY": "inline"})
    cs = chunk_stats(st)
    print(f"chunks-direct-store: serve inline: {cs}")
    check(cs.get("llama_chunks_direct_stores") == 4 and
          {k: cs.get(k) for k in keep} == base[0],
          f"serve inline: expected 4 direct snapshots into the own pool and the counters of "
          f"{base[0]}: {cs}")
    expect(st, "serve inline", snapshots=("==", 5), restores=(">=", 6), bad_blobs=("==", 0),
           restore_failures=("==", 0), snapshot_failures=("==", 0))


def case_chunks_evict(ctx):
    """KVSHIM_LLAMA_CHUNKS=1, a chunk evicted between store and restore. One process, no peers,
    a 2 MiB pool (512 pages); a chunk of this model is 67 pages (256 tokens x 1056 bytes plus
    its header and tokens), the frame 1, a 100-token tail chunk 26. Prompt X stores a
    1024-token prefix as chunks X0-X3 and its suffix's tail (295 pages); X's first 512 tokens
    alone restore 448 of them from X0-X1 (the last row group is decoded; X0, X1 and the frame
    used: to the LRU tail; no continuation is looked at, the prompt ends with X1); prompt Y
    stores 4 chunks of its own, the 4th evicting the LRU head, X2. X with another suffix then
    restores 512 tokens (the run stops before the first missing chunk, though X3 is there) and
    its snapshot stores X2 again (evicting X3), X3 (evicting X's first tail and Y0) and its own
    tail; the next X restores all 1024. Outputs identical throughout. Without the snapshot's
    every-chunk check (a whole blob's: the last key only) X2 never comes back."""
    m = ctx.p("m.gguf")
    ctx.run([f"mkmodel {m} evict 4 256 64 1"], preload=False)
    cmds = [f"model 0 {m}", "ctx 0 0 1",
            "prompt 0 0 r1024@1+r100@2", "gen 0 0 2",
            "rm 0 0 -1 -1", "prompt 0 0 r512@1", "gen 0 0 2",
            "rm 0 0 -1 -1", "prompt 0 0 r1024@5", "gen 0 0 2",
            "rm 0 0 -1 -1", "prompt 0 0 r1024@1+r100@4", "gen 0 0 2",
            "rm 0 0 -1 -1", "prompt 0 0 r1024@1+r100@6", "gen 0 0 2"]
    st, err = same(ctx, cmds, "chunks-evict", preload_extra={
        "KVSHIM_LLAMA_CHUNKS": "1", "KVSHIM_PEERS": "0", "KVSHIM_POOL_SIZE": "2M"})
    cs = chunk_stats(st)
    print(f"chunks-evict: {cs}, store evictions {st.get('store_evictions')}")
    check(st.get("store_arena_bytes") == 2 << 20 and st.get("store_evictions") == 4,
          f"expected X2, X3, X's tail and Y0 evicted (4) from a 2 MiB arena: {st}")
    # restores: 448 (X0-1), 512 (X after the eviction: X0-1, X2 missing), 1024 (X0-3)
    expect(st, "chunks-evict", restores=("==", 3), restored_tokens=("==", 448 + 512 + 1024),
           bad_blobs=("==", 0), restore_failures=("==", 0))
    # stored: X 4, Y 4, X2 and X3 again (X0-1 found there: dedup)
    check(cs.get("llama_chunks_stored") == 4 + 4 + 2 and cs.get("llama_chunks_dedup") == 2,
          f"evicted chunks stored again: {cs}")


CASES = {
    "local": case_local,
    "sequences": case_sequences,
    "peer": case_peer,
    "serve": case_serve,
    "divergence": case_divergence,
    "faults": case_faults,
    "faults-peer": case_faults_peer,
    "taint": case_taint,
    "offload": case_offload,
    "disabled": case_disabled,
    "batches": case_batches,
    "mixed": case_mixed,
    "flight": case_flight,
    "swa": case_swa,
    "held-mixed": case_held_mixed,
    "unified": case_unified,
    "used": case_used,
    "multi": case_multi,
    "shared": case_shared,
    "known": case_known,
    "chunks": case_chunks,
    "chunks-mix": case_chunks_mix,
    "chunks-foreign": case_chunks_foreign,
    "chunks-evict": case_chunks_evict,
    "chunks-tail": case_chunks_tail,
    "chunks-reuse": case_chunks_reuse,
    "chunks-direct": case_chunks_direct,
    "chunks-direct-store": case_chunks_direct_store,
}


if __name__ == "__main__":
    sys.exit(harness.main(CASES, harness.parser(__doc__, "--host", "--preload", "--cli", asan=True,
                                                optional=("--tensor-count",)),
                          Ctx))
