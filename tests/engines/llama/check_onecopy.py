#!/usr/bin/env python3
"""One copy per node (issue 13) in unmodified node-llama-cpp engines (app.mjs on node-llama-cpp
3.21.1) with `kvshim serve` in the group, one case per ctest test (label e2e).

Same setup as check_kvshim.py (whose Case this reuses: a generated model, reference tokens from
app.mjs --no-cache without kvshim, KVSHIM_LLAMA_WRITE_THROUGH=0, KVSHIM_LLAMA_PREFIX=0, a
temporary KVSHIM_RUN_DIR per case). The node's bytes are the sum of store_used_bytes over every
process (the engines' KVSHIM_STATS at exit, serve's `kvshim stats --json` while it runs); the
distinct bytes are serve's store_used_bytes (every state reaches serve in both arms).

  once       A evaluates prefix P and saves it, B and C (fresh processes, prompts P + other
             suffixes) restore it: their tokens == the --no-cache reference, the save went
             straight into serve's pool (A: cache_peer_stores >= 1, push_queued 0), the restores
             read it in place (cache_peer_loads >= 1), and the node holds the state once: node
             bytes / distinct bytes == 1, serve holds 1 object, every engine's store_used_bytes 0
  own-copy   the same with KVSHIM_ONE_COPY=0 (as before issue 13): A keeps its copy and pushes it,
             B and C fetch and keep one each: node bytes / distinct bytes == 4, tokens exact
  killed     A runs SAVES prompts with distinct prefixes; after its first line serve is stopped
             (SIGSTOP, so the store in flight waits on it) and then SIGKILLed: A keeps working,
             its tokens == the reference for every prompt, cache_peer_fallbacks >= 1, and the
             states it saved after the kill are in its own pool (store_used_bytes > 0); B then
             runs the same prompts, restoring from A (still alive) or evaluating: tokens exact

Usage: check_onecopy.py CASE --preload LIBKVSHIM --kvshim CLI [--work-dir DIR] [--keep]
                        [--no-setup] [--asan-runtime LIBASAN]      (--list: the cases)
Exit status: 0 pass, 1 fail, 77 skipped (no Node.js >= 20 or no npm registry), 2 bad usage.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

from llama_e2e import say  # noqa: E402 (puts tests/lib on sys.path)
from harness import Failure, check, read_line  # noqa: E402
import harness  # noqa: E402
import check_kvshim as ck  # noqa: E402
import llama_e2e  # noqa: E402

SAVES = 8  # prompts with distinct prefixes in the killed case


class Case(ck.Case):
    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        r = random.Random(13)
        ids = lambda n: [r.randrange(300, ck.MODEL["vocab"]) for _ in range(n)]  # noqa: E731
        path = os.path.join(work, "SAVES.json")
        with open(path, "w") as f:
            json.dump([{"tokens": [1] + ids(ck.PREFIX_TOKENS - 1 + ck.SUFFIX_TOKENS)}
                       for _ in range(SAVES)], f)
        self.prompts["SAVES"] = path

    def serve_stats(self, serve):
        st = subprocess.run([self.kvshim, "stats", str(serve.pid), "--json"], env=self.cli_env(),
                            capture_output=True, text=True, timeout=60)
        if st.returncode != 0:
            raise Failure("kvshim stats of serve: %s" % st.stderr.strip())
        return json.loads(st.stdout)

    def reference_all(self, prompt):
        lines, _ = self.run("reference " + prompt, ck.SEED_1, prompt, ["--no-cache"])
        return [x["gen_tokens"] for x in lines]



def save_and_restore(c, **env):
    """A saves P, B and C restore it, serve in the group: (engine stats, serve stats)."""
    refs = {"PB": c.reference(ck.SEED_1, "PB")}
    cache = c.cache_dir("cache")
    serve = c.serve("256M")
    a_lines, _ = c.run("A", ck.SEED_1, "PA", ["--cache-dir", cache], c.kvshim_env("a", **env))
    c.check_saved_without_file("A", a_lines[0], cache)
    stats = {"a": c.stats_of("a", c.procs[-1].pid)}
    for who, prompt in (("b", "PB"), ("c", "PB")):
        lines, summ = c.run(who.upper(), ck.SEED_1, prompt, ["--cache-dir", cache],
                            c.kvshim_env(who, **env))
        stats[who] = c.stats_of(who, c.procs[-1].pid)
        c.check_restored(who.upper(), lines[0], summ, stats[who], cache, refs[prompt])
    s = c.serve_stats(serve)
    c.stop_serve(serve)
    node = s["store_used_bytes"] + sum(st.get("store_used_bytes", 0) for st in stats.values())
    say("node bytes %d, distinct (serve) %d, serve objects %d; engines: %s"
        % (node, s["store_used_bytes"], s["store_objects"],
           ", ".join("%s %d" % (k, v.get("store_used_bytes", 0)) for k, v in stats.items())))
    check(s["store_objects"] == 1 and s["store_used_bytes"] > 0,
          "serve holds the one state (%d objects)" % s["store_objects"])
    return stats, node / max(1, s["store_used_bytes"])


def case_once(c):
    stats, ratio = save_and_restore(c)
    a = stats["a"]
    check(a.get("cache_peer_stores", 0) >= 1 and a.get("push_queued", 0) == 0,
          "A: saved straight into serve's pool (cache_peer_stores %d, push_queued %d)"
          % (a.get("cache_peer_stores", 0), a.get("push_queued", 0)))
    for who in ("b", "c"):
        check(stats[who].get("cache_peer_loads", 0) >= 1,
              "%s: restored in place from serve's pool (cache_peer_loads %d)"
              % (who.upper(), stats[who].get("cache_peer_loads", 0)))
    check(all(st.get("store_used_bytes") == 0 for st in stats.values()) and ratio == 1.0,
          "the node holds the state once: node bytes / distinct bytes = %.3f" % ratio)


def case_own_copy(c):
    stats, ratio = save_and_restore(c, KVSHIM_ONE_COPY="0")
    a = stats["a"]
    check(a.get("cache_peer_stores", 0) == 0 and a.get("push_queued", 0) >= 1,
          "A: kept its copy and pushed it (push_queued %d)" % a.get("push_queued", 0))
    check(ratio == 4.0, "own copies: node bytes / distinct bytes = %.3f (A, B, C, serve)" % ratio)


def case_killed(c):
    refs = c.reference_all("SAVES")
    cache = c.cache_dir("cache")
    serve = c.serve("256M")
    env = c.kvshim_env("a", KVSHIM_RPC_TIMEOUT_MS="2000")
    bar = os.path.join(c.work, "barrier-a")
    a = c.start("A", ck.SEED_1, "SAVES",
                ["--cache-dir", cache, "--barrier-dir", bar, "--barrier-count", "2"], env)
    a.barrier = bar
    first = read_line(a, ck.RUN_TIMEOUT_S, "A's first line")
    serve.send_signal(signal.SIGSTOP)  # the store in flight waits on it...
    time.sleep(0.3)
    serve.send_signal(signal.SIGKILL)  # ...and fails
    serve.wait(timeout=30)
    say("serve killed after A's first line")
    done = os.path.join(bar, "done.%d" % a.pid)
    deadline = time.monotonic() + ck.RUN_TIMEOUT_S
    while not os.path.exists(done):
        if a.poll() is not None or time.monotonic() > deadline:
            c.finish(a)
            raise Failure("A did not reach its barrier")
        time.sleep(0.05)
    b_lines, _ = c.run("B", ck.SEED_1, "SAVES", ["--cache-dir", cache], c.kvshim_env("b"))
    pending = harness._pending.pop(a.pid, b"").decode()  # lines read along with the first
    a_lines, _ = c.release(a)
    a_lines = [json.loads(x) for x in [first] + pending.splitlines()
               if x.strip().startswith("{")] + a_lines
    check([x["gen_tokens"] for x in a_lines] == refs,
          "A: every prompt's tokens == the --no-cache reference (%d prompts)" % len(a_lines))
    check([x["gen_tokens"] for x in b_lines] == refs,
          "B: every prompt's tokens == the --no-cache reference (%s)"
          % ", ".join(x["prefix_source"] for x in b_lines))
    st = c.stats_of("a", a.pid)
    check(st.get("cache_peer_fallbacks", 0) >= 1 and st.get("store_used_bytes", 0) > 0,
          "A: the failed store into serve was counted (cache_peer_fallbacks %d, cache_peer_stores "
          "%d) and the later states kept in its own pool (store_used_bytes %d)"
          % (st.get("cache_peer_fallbacks", 0), st.get("cache_peer_stores", 0),
             st.get("store_used_bytes", 0)))
    check(st.get("hook_store_failures", 0) == 0,
          "A: no save lost (hook_store_failures %d)" % st.get("hook_store_failures", 0))


if __name__ == "__main__":
    sys.exit(llama_e2e.main(globals(), Case, "--preload", "--kvshim", asan=True))
