#!/usr/bin/env python3
"""ctest driver: kvshim's llama.cpp prefix cache (design §10.3) in an unmodified llama-server.

usage: check_server.py CASE --preload LIBKVSHIM --cli KVSHIM [--work-dir DIR]

The binaries come from scripts/llama-server-setup (llama-server with shared libraries, built from
the llama.cpp source the pinned node-llama-cpp ships); when it cannot prepare them (exit 77) the
case exits 77 and ctest reports it skipped. The model is scripts/tiny-gguf's 8x512 model (random
weights, cached in the work directory). Every request runs at temperature 0 with 8 predicted
tokens; every completion of a replica with kvshim is compared with the same requests, in the same
order, sent to a fresh replica of the same flags without kvshim. The restored-token counts come
from `kvshim stats PID --json` of the live replica (one process each).

The prompts: a shared document of about 1,400 tokens (DOC_WORDS words of a fixed pseudo-random
text) and a different question after it; an unrelated prompt shares only BOS with them.

Cases:
  defaults    two replicas with llama-server's defaults (4 slots, kv_unified): A computes the
              document, B restores >= 90% of it from `kvshim serve`; identical
  used        B first serves an unrelated prompt (its slot keeps BOS), then the document: >= 90%
              restored (the load replaces the slot's sequence); identical
  np1         B with -np 1 (one sequence, one stream: the same namespace as the defaults)
  cache-ram   -np 1, a second document in between: llama-server saves the slot to its
              --cache-ram prompt cache and loads it back; kvshim knows the loaded state again
              (llama_prefix_states_known) and nothing is refused as unknown; identical
  slots       /slots save and restore (--slot-save-path), also with KVSHIM_LLAMA_WRITE_THROUGH=0:
              the restored slot's tokens are known again; identical
  cache-reuse --cache-reuse 64: llama-server's own chunk reuse shifts the cells (kvshim leaves
              that sequence alone until it is cleared); identical
  concurrent  four requests sent at once to a fresh replica with defaults (its slots' prompts
              arrive in multi-sequence batches): every slot restores >= 90% of the document
              (restored in each batch, the rest of all slots decoded together); each completion
              is one the replica without kvshim gives (its own concurrent run, or the same
              question alone)
  concurrent-cold
              four prompts sharing the document sent in one request (a prompt array: their
              slots start in one batch) to ONE fresh replica, no producer; one slot computes the
              document alone and stores it, the other three restore it (>= 90% of 3 x the
              document restored, llama_prefix_shared_in_batch >= 1); each completion is one
              the replica without kvshim gives
  chunks      chunk storage (KVSHIM_LLAMA_CHUNKS=1, design §10.4) with llama-server's defaults
              (4 slots, kv_unified): A stores the document as chunk objects (none whole), then
              an unrelated document in another slot, written in place in serve's pool
              (llama_chunks_direct_stores; serve holds every chunk), B
              restores >= 90% of it assembled from them (llama_chunks_assembled), each a
              direct load (llama_chunks_direct: the chunks served to ggml_backend_tensor_set
              where they lie); identical
  killed      replica A stores the document, then is SIGKILLed in the middle of another
              request; B restores >= 90% of the document from `kvshim serve`; identical
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from harness import Context, Skip, check, require  # noqa: E402
import harness  # noqa: E402

DOC_WORDS = 1150      # about 1,400 tokens with tiny-gguf's tokenizer
N_PREDICT = 8
SERVER_START_S = 120  # a loaded 2-core machine


def words(seed, n):
    vocab = ("the of and to in is was for on are with as by at from that this which be it or an "
             "have has not but all were when we there can more one time so what out up about "
             "other into than them these some would her like him see only its now could people "
             "my made over did down way find use may water long little very after words called "
             "just where most know get through back much before go good new write our used me "
             "man too any day same right look think also around another came come work three "
             "word must because does part even place well such here take why things help put "
             "years different away again off went old number great tell men say small every "
             "found still between name should home big give air line set own under read last "
             "never us left end along while might next sound below saw something thought both "
             "few those always looked show large often together asked house world going want "
             "school important until form food keep children feet land side without boy once "
             "animals life enough took sometimes four head above kind began almost live page "
             "got earth need far hand high year mother light parts country father let night "
             "following picture being study second eyes soon times story boys since white days "
             "ever paper hard near sentence better best across during today others however sure "
             "means knew").split()
    rnd = random.Random(seed)
    return " ".join(rnd.choice(vocab) for _ in range(n))


DOC = words(1, DOC_WORDS)
DOC2 = words(2, DOC_WORDS)
UNRELATED = words(3, 300)


def question(i):
    return f"\n\nQuestion {i}: " + words(100 + i, 12) + "\nAnswer:"


class Ctx(Context):
    timeout = 300

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.defaults = {"KVSHIM_GROUP": "server", "KVSHIM_POOL_SIZE": "512M",
                         "KVSHIM_HOST_POOL_SIZE": "0", "KVSHIM_LOG": "info"}
        r = subprocess.run([os.path.join(ROOT, "scripts", "llama-server-setup")],
                           capture_output=True, text=True)
        if r.returncode == 77:
            raise Skip(f"llama-server cannot be prepared here: {r.stderr.strip()[-500:]}")
        require(r.returncode == 0, f"llama-server-setup: exit {r.returncode}\n{r.stderr[-2000:]}")
        self.bin = r.stdout.strip().splitlines()[-1]
        self.server = os.path.join(self.bin, "llama-server")
        require(os.access(self.server, os.X_OK), f"no llama-server in {self.bin}")
        cache = os.path.join(args.work_dir or tmp, "..", "model-8x512.gguf")
        self.model = os.path.abspath(cache)
        if not os.path.exists(self.model):
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "tiny-gguf"), "-q",
                            "--layers", "8", "--embd", "512", "--out", self.model], check=True)

    def start_server(self, preload, flags=(), **extra):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = [self.server, "-m", self.model, "--host", "127.0.0.1", "--port", str(port),
                "-t", "2", "-c", "8192", "--no-webui", *flags]
        log = open(self.p(f"server-{port}.log"), "w")
        env = self.env(preload, **extra)
        env["LD_LIBRARY_PATH"] = self.bin
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append(p)
        p.url, p.log, p.preload = f"http://127.0.0.1:{port}", log.name, preload
        deadline = time.monotonic() + SERVER_START_S
        while True:
            check(p.poll() is None, f"llama-server exited {p.returncode}:\n{self.tail(p)}")
            try:
                with urllib.request.urlopen(p.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return p
            except OSError:
                pass
            check(time.monotonic() < deadline, f"llama-server not ready:\n{self.tail(p)}")
            time.sleep(0.2)

    @staticmethod
    def tail(p, n=3000):
        with open(p.log, errors="replace") as f:
            return f.read()[-n:]

    def post(self, p, path, body, timeout=300):
        req = urllib.request.Request(p.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def complete(self, p, prompt, **kw):
        r = self.post(p, "/completion", {"prompt": prompt, "n_predict": N_PREDICT,
                                         "temperature": 0, "top_k": 1, "seed": 1, **kw})
        return r["content"], r.get("timings", {})

    def stats(self, p, everything=False):
        """p's llama_prefix_* counters without their prefix (everything: all its counters)."""
        r = subprocess.run([self.kvshim, "stats", str(p.pid), "--json"], capture_output=True,
                           text=True, env=self.env(preload=False), timeout=60)
        check(r.returncode == 0, f"kvshim stats {p.pid}: {r.stderr}")
        st = json.loads(r.stdout)
        if everything:
            return st
        return {k[len("llama_prefix_"):]: v for k, v in st.items()
                if k.startswith("llama_prefix_")}

    def stop(self, p):
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()



def bench_ctx(args, prefix, ctx_class=None):
    """A context for one benchmark repetition in a new temporary directory (returned with it):
    the benchmarks take --preload, --cli and --work-dir; ctx_class defaults to Ctx."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    ns = argparse.Namespace(preload=args.preload, cli=args.cli, work_dir=None, asan_runtime="",
                            keep=False)
    ctx = (ctx_class or Ctx)(ns, tmp, args.work_dir or tmp)
    os.makedirs(ctx.run_dir, exist_ok=True)
    return tmp, ctx

def ntokens(ctx, p, text):
    return len(ctx.post(p, "/tokenize", {"content": text, "add_special": True})["tokens"])


def replay(ctx, flags, steps, preload, **extra):
    """A fresh replica runs steps (callables taking (ctx, server) and returning a value):
    (values, server). The server is left running (the caller stops it)."""
    p = ctx.start_server(preload, flags, **extra)
    return [step(ctx, p) for step in steps], p


def ask(prompt, **kw):
    return lambda ctx, p: ctx.complete(p, prompt, **kw)[0]


def compare(ctx, flags, steps, what, **extra):
    """steps on a fresh replica without kvshim, then with it: identical completions. Returns
    the kvshim replica (running) and its completions."""
    ref, r = replay(ctx, flags, steps, False)
    ctx.stop(r)
    got, p = replay(ctx, flags, steps, True, **extra)
    for i, (a, b) in enumerate(zip(ref, got)):
        check(a == b, f"{what}: request {i} differs with kvshim:\n  without: {a!r}\n"
                      f"  with:    {b!r}\nstats: {ctx.stats(p)}\nlog:\n{ctx.tail(p)}")
    print(f"{what}: {len(steps)} completions identical")
    return p, got


def producer(ctx, flags=()):
    """Replica A with kvshim computes DOC + question 1 and stores it (serve is the cache peer)."""
    ctx.serve(pool="512M")
    p, _ = compare(ctx, flags, [ask(DOC + question(1))], "A")
    st = ctx.stats(p)
    check(st.get("snapshots", 0) >= 1, f"A stored nothing: {st}\n{ctx.tail(p)}")
    doc_tokens = ntokens(ctx, p, DOC)
    ctx.stop(p)
    return doc_tokens


def expect_restored(ctx, p, doc_tokens, what, frac=0.9):
    st = ctx.stats(p)
    print(f"{what}: {st}")
    check(st.get("restored_tokens", 0) >= frac * doc_tokens,
          f"{what}: restored {st.get('restored_tokens')} of a {doc_tokens}-token shared "
          f"prefix (< {frac:.0%}): {st}\nlog:\n{ctx.tail(p)}")
    return st


def case_defaults(ctx):
    doc = producer(ctx)
    p, _ = compare(ctx, (), [ask(DOC + question(2))], "B, defaults")
    expect_restored(ctx, p, doc, "B, defaults")


def case_used(ctx):
    doc = producer(ctx)
    p, _ = compare(ctx, (), [ask(UNRELATED), ask(DOC + question(2))], "B, used slot")
    expect_restored(ctx, p, doc, "B, used slot")


def case_np1(ctx):
    doc = producer(ctx)
    p, _ = compare(ctx, ("-np", "1"), [ask(DOC + question(2))], "B, -np 1")
    expect_restored(ctx, p, doc, "B, -np 1")


def case_cache_ram(ctx):
    flags = ("-np", "1", "--cache-ram", "1024")
    p, _ = compare(ctx, flags, [ask(DOC + question(1)), ask(DOC2 + question(2)),
                                ask(DOC + question(3)), ask(DOC2 + question(4))], "cache-ram")
    st = ctx.stats(p)
    print(f"cache-ram: {st}")
    check(st.get("states_known", 0) >= 1, f"cache-ram: no reloaded state known: {st}\n"
                                           f"{ctx.tail(p)}")
    check(st.get("refused_unknown", 0) == 0, f"cache-ram: a reloaded slot unknown: {st}")


def slots_steps(ctx):
    path = ctx.p("slots")
    os.makedirs(path, exist_ok=True)

    def save(ctx, p):
        return ctx.post(p, "/slots/0?action=save", {"filename": "doc.bin"}).get("n_saved")

    def erase(ctx, p):
        return ctx.post(p, "/slots/0?action=erase", {}).get("n_erased")

    def restore(ctx, p):
        return ctx.post(p, "/slots/0?action=restore", {"filename": "doc.bin"}).get("n_restored")
    return path, [ask(DOC + question(1), id_slot=0), save, erase, restore,
                  ask(DOC + question(2), id_slot=0)]


def case_slots(ctx):
    for wt in ("1", "0"):
        path, steps = slots_steps(ctx)
        flags = ("-np", "1", "--slot-save-path", path + "/")
        p, _ = compare(ctx, flags, steps, f"slots, write-through {wt}",
                       KVSHIM_LLAMA_WRITE_THROUGH=wt)
        st = ctx.stats(p)
        print(f"slots, write-through {wt}: {st}")
        check(st.get("states_known", 0) >= 1, f"slots: the restored slot is unknown: {st}")
        ctx.stop(p)


def case_cache_reuse(ctx):
    flags = ("-np", "1", "--cache-reuse", "64")
    compare(ctx, flags, [ask(DOC + question(1)), ask(UNRELATED[:200] + DOC + question(2)),
                         ask(DOC + question(3))], "cache-reuse")


def together(ctx, p, prompts):
    """The completions of prompts sent to p at once (one thread each)."""
    out = [None] * len(prompts)

    def one(i):
        out[i] = ctx.complete(p, prompts[i])[0]
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    return out


def concurrent_ref(ctx, prompts):
    """The replica without kvshim: its completions of prompts sent at once, and of each alone."""
    ref_p = ctx.start_server(False)
    ref = together(ctx, ref_p, prompts)
    alone = [ctx.complete(ref_p, q)[0] for q in prompts]
    ctx.stop(ref_p)
    return ref, alone


def check_concurrent(ctx, p, what, got, ref, alone):
    st = ctx.stats(p)
    print(f"{what}: {st}")
    for i, g in enumerate(got):
        check(g in (ref[i], alone[i]), f"{what}: request {i}: {g!r} is neither the "
              f"replica's concurrent {ref[i]!r} nor alone {alone[i]!r}\n{st}\n{ctx.tail(p)}")
    return st


def case_concurrent(ctx):
    doc = producer(ctx)
    prompts = [DOC + question(i) for i in range(2, 6)]
    ref, alone = concurrent_ref(ctx, prompts)
    p = ctx.start_server(True)
    st = check_concurrent(ctx, p, "concurrent", together(ctx, p, prompts), ref, alone)
    check(st.get("restored_tokens", 0) >= 0.9 * doc * len(prompts),
          f"concurrent: restored {st.get('restored_tokens')} of 4 x {doc}: {st}\n{ctx.tail(p)}")


def one_request(ctx, p, prompts):
    """The completions of prompts sent in ONE request (llama-server's "prompt" as an array of
    strings: one task per prompt, queued together, so their slots start in the same batch
    whatever the machine's timing)."""
    r = ctx.post(p, "/completion", {"prompt": prompts, "n_predict": N_PREDICT,
                                    "temperature": 0, "top_k": 1, "seed": 1})
    check(isinstance(r, list) and len(r) == len(prompts), f"one request of {len(prompts)} "
          f"prompts: not {len(prompts)} results: {str(r)[:500]}")
    return [x["content"] for x in sorted(r, key=lambda x: x.get("index", 0))]


def case_concurrent_cold(ctx):
    prompts = [DOC + question(i) for i in range(2, 6)]
    ref_p = ctx.start_server(False)
    ref = one_request(ctx, ref_p, prompts)
    alone = [ctx.complete(ref_p, q)[0] for q in prompts]
    ctx.stop(ref_p)
    p = ctx.start_server(True)
    got = one_request(ctx, p, prompts)
    doc = ntokens(ctx, p, DOC)
    st = check_concurrent(ctx, p, "concurrent, cold", got, ref, alone)
    check(st.get("restored_tokens", 0) >= 0.9 * doc * (len(prompts) - 1),
          f"concurrent, cold: restored {st.get('restored_tokens')} of 3 x {doc}: the document "
          f"was computed more than once: {st}\n{ctx.tail(p)}")
    check(st.get("shared_in_batch", 0) >= 1,
          f"concurrent, cold: no sequence restored from its own batch's leader: {st}")


def case_chunks(ctx):
    sv = ctx.serve(pool="512M")
    chunks = {"KVSHIM_LLAMA_CHUNKS": "1"}
    # A's second prompt shares nothing with its first: llama-server gives it an unused slot, whose
    # snapshot knows the context's frame and is written in place in serve's pool (direct store)
    a, _ = compare(ctx, (), [ask(DOC + question(1)), ask(DOC2 + question(3))], "A, chunks",
                   **chunks)
    doc, doc2 = ntokens(ctx, a, DOC), ntokens(ctx, a, DOC2)
    sa = ctx.stats(a, everything=True)
    per_chunk = int(ctx.defaults.get("KVSHIM_CHUNK_TOKENS", "256"))
    print(f"A: {({k: v for k, v in sa.items() if k.startswith(('llama_chunks_', 'cache_peer'))})}")
    check(sa.get("llama_prefix_snapshots", 0) >= 2,
          f"A did not store both prompts: {sa}\n{ctx.tail(a)}")
    check(sa.get("llama_chunks_stored", 0) >= doc // per_chunk + doc2 // per_chunk,
          f"A stored {sa.get('llama_chunks_stored')} chunks for {doc}- and {doc2}-token "
          f"documents: {sa}")
    check(sa.get("llama_chunks_whole", 0) == 0, f"A stored whole states: {sa}")
    check(sa.get("llama_chunks_direct_stores", 0) >= 1 and
          sa.get("llama_chunks_direct_store_refused", 0) == 0 and
          sa.get("cache_peer_fallbacks", 0) == 0,
          f"A's second snapshot was not written in place in serve's pool (design 10.4): {sa}")
    node = harness.live_stats(ctx, sv.pid) or {}
    check(node.get("store_objects", 0) >= sa.get("llama_chunks_stored") + 1,
          f"serve holds {node.get('store_objects')} objects, A stored "
          f"{sa.get('llama_chunks_stored')} chunks and a frame: {node}")
    ctx.stop(a)
    p, _ = compare(ctx, (), [ask(DOC + question(2))], "B, chunks", **chunks)
    expect_restored(ctx, p, doc, "B, chunks")
    sb = ctx.stats(p, everything=True)
    print(f"B: {({k: v for k, v in sb.items() if k.startswith('llama_chunks_')})}")
    check(sb.get("llama_chunks_assembled", 0) >= 1,
          f"B restored without assembling chunks: {sb}\n{ctx.tail(p)}")
    # the real reader uploads through ggml_backend_tensor_set: every assembly loads directly
    check(sb.get("llama_chunks_direct", 0) == sb.get("llama_chunks_assembled") and
          sb.get("llama_chunks_direct_refused", 0) == 0,
          f"B's restores by assembly were not direct loads (design 10.4): {sb}")


def case_killed(ctx):
    ctx.serve(pool="512M")
    a = ctx.start_server(True)
    ctx.complete(a, DOC + question(1))
    doc = ntokens(ctx, a, DOC)
    check(ctx.stats(a).get("snapshots", 0) >= 1, f"A stored nothing:\n{ctx.tail(a)}")
    t = threading.Thread(target=lambda: _swallow(lambda: ctx.complete(a, DOC2 + question(2))),
                         daemon=True)
    t.start()
    time.sleep(0.5)  # A is in the middle of DOC2's prompt (about 1 s on this machine)
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=30)
    t.join(timeout=30)
    p, _ = compare(ctx, (), [ask(DOC + question(2))], "B after A was killed")
    expect_restored(ctx, p, doc, "B after A was killed")


def _swallow(fn):
    try:
        fn()
    except OSError:
        pass  # the connection to the killed replica drops


CASES = {
    "defaults": case_defaults,
    "used": case_used,
    "np1": case_np1,
    "cache-ram": case_cache_ram,
    "slots": case_slots,
    "cache-reuse": case_cache_reuse,
    "killed": case_killed,
    "chunks": case_chunks,
    "concurrent": case_concurrent,
    "concurrent-cold": case_concurrent_cold,
}

if __name__ == "__main__":
    sys.exit(harness.main(CASES, harness.parser(__doc__, "--preload", "--cli"), Ctx))
