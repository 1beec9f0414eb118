#!/usr/bin/env python3
"""ctest driver for refengine: runs the engine on tiny workloads and checks its JSON output.

usage: check_refengine.py CASE --engine REFENGINE [--bogus BOGUS_KVO_LIB]   (--list: the cases)

Every stdout line of a successful run must parse as JSON: one object per request, in order,
then one summary object. The cases check the offload behaviour the numbers must show.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from harness import Failure, check  # noqa: E402
import harness  # noqa: E402

# Small dimensions: a chunk is 3 layers x K,V x 32 tokens x 2 heads x 16 = 6144 elements.
C = 32
TINY = ["--chunk-tokens", str(C), "--layers", "3", "--kv-heads", "2", "--head-dim", "16",
        "--hidden", "32"]
CHUNK_BYTES_F32 = 3 * 2 * C * 2 * 16 * 4


def run(engine, args, env_extra=None, expect_rc=0):
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.run([engine] + args, capture_output=True, text=True, env=env, timeout=120)
    if p.returncode != expect_rc:
        raise Failure(f"{' '.join(args)}: exit {p.returncode}, expected {expect_rc}\n"
                      f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def parse(p, n_requests):
    """All stdout lines as JSON: n_requests request objects in order, then the summary."""
    lines = p.stdout.splitlines()
    objs = []
    for i, line in enumerate(lines):
        try:
            objs.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise Failure(f"stdout line {i + 1} is not JSON ({e}): {line!r}")
    check(len(objs) == n_requests + 1, f"expected {n_requests + 1} lines, got {len(objs)}")
    reqs, summary = objs[:-1], objs[-1]
    check(summary.get("summary") is True, f"last line is not the summary: {summary}")
    for i, r in enumerate(reqs):
        check(r["request"] == i, f"request line {i} has index {r['request']}")
        check(r["chunks"] == math.ceil(r["tokens"] / C), f"chunk count of {r}")
        check(r["computed"] + r["loaded"] == r["chunks"], f"computed + loaded != chunks: {r}")
        check(r["ttft_ms"] >= 0, f"negative ttft: {r}")
        check(r["stored"] <= r["computed"], f"stored more than computed: {r}")
        check(r["load_ms"] >= 0 and r["store_ms"] >= 0, f"negative load/store time: {r}")
    s = summary
    check(s["requests"] == n_requests, f"summary requests: {s}")
    for key, field in (("chunks_computed", "computed"), ("chunks_loaded", "loaded"),
                       ("chunks_stored", "stored"), ("chunks", "chunks"), ("tokens", "tokens")):
        check(s[key] == sum(r[field] for r in reqs), f"summary {key} != sum of {field}: {s}")
    ttfts = sorted(r["ttft_ms"] for r in reqs)
    check(abs(s["ttft_ms_mean"] - sum(ttfts) / len(ttfts)) < 0.01, f"ttft mean: {s}")
    check(s["ttft_ms_p50"] in [round(t, 3) for t in ttfts], f"p50 is not a request's ttft: {s}")
    check(s["ttft_ms_p50"] <= s["ttft_ms_p90"] <= ttfts[-1] + 0.001, f"percentiles: {s}")
    check(s["wall_ms"] >= 0 and s["kvo_errors"] == 0, f"summary: {s}")
    for key in ("compute_ms_per_chunk", "load_ms_per_chunk", "store_ms_per_chunk"):
        check(s[key] >= 0, f"summary {key}: {s}")
    return reqs, s


def case_native_cache(c):
    # 6 requests of 160 tokens (5 chunks) sharing 96 tokens (3 chunks).
    args = ["--requests", "6", "--prompt-tokens", "160", "--prefix-tokens", "96", *TINY]
    reqs, s = parse(run(c.engine, args + ["--native-cache", "16M", "--verify"]), 6)
    check(s["verify"] == "ok", f"verify: {s}")
    check(s["chunks_loaded"] > 0, f"nothing loaded with a native cache: {s}")
    check(reqs[0]["loaded"] == 0 and reqs[0]["stored"] == 5, f"first request: {reqs[0]}")
    for r in reqs[1:]:
        check(r["loaded"] == 3, f"shared prefix not loaded: {r}")
        check(r["computed"] == 2 and r["stored"] == 2, f"suffix not computed and stored: {r}")
    check(s["chunk_bytes"] == CHUNK_BYTES_F32, f"chunk_bytes: {s}")

    # Prefix groups: requests 0 and 1 start groups 0 and 1, later ones reuse them.
    reqs, s = parse(run(c.engine, args + ["--prefix-groups", "2", "--native-cache", "16M"]), 6)
    check([r["loaded"] for r in reqs] == [0, 0, 3, 3, 3, 3], f"prefix groups: {reqs}")
    check(s["verify"] == "off", f"verify without --verify: {s}")

    # A cache smaller than one chunk keeps nothing.
    _, s = parse(run(c.engine, args + ["--native-cache", str(CHUNK_BYTES_F32 - 1)]), 6)
    check(s["chunks_loaded"] == 0 and s["chunks_stored"] == 0, f"undersized cache: {s}")

    # Two chunks of room: LRU keeps the last two stores of a request (its suffix), never the
    # first chunk of the prefix, so nothing can be loaded and the engine stays correct.
    _, s = parse(run(c.engine, args + ["--native-cache", str(2 * CHUNK_BYTES_F32), "--verify"]), 6)
    check(s["chunks_loaded"] == 0 and s["chunks_computed"] == 30, f"two-chunk cache: {s}")


def case_no_cache(c):
    args = ["--requests", "4", "--prompt-tokens", "100", "--shared-prefix", "0.9", *TINY]
    reqs, s = parse(run(c.engine, args + ["--verify"]), 4)
    for r in reqs:
        check(r["loaded"] == 0 and r["stored"] == 0, f"default module cached something: {r}")
        check(r["computed"] == 4, f"100 tokens = 3 full chunks + a tail: {r}")
    check(s["chunks_loaded"] == 0 and s["verify"] == "ok", f"summary: {s}")


def case_dtypes(c):
    args = ["--requests", "3", "--prompt-tokens", "128", "--prefix-tokens", "128", *TINY,
            "--native-cache", "1M", "--verify"]
    for dtype in ("f16", "bf16", "f32"):
        for buf in ("host", "device"):
            reqs, s = parse(run(c.engine, args + ["--dtype", dtype, "--kvo-buffer", buf]), 3)
            size = 4 if dtype == "f32" else 2
            check(s["chunk_bytes"] == CHUNK_BYTES_F32 // 4 * size, f"{dtype} chunk_bytes: {s}")
            check([r["loaded"] for r in reqs] == [0, 4, 4], f"{dtype}/{buf}: {reqs}")
            check(s["verify"] == "ok", f"{dtype}/{buf}: {s}")


def case_requests_file(c):
    a = list(range(1, 65))                    # two full chunks
    b = list(range(1, 33)) + [7] * 40         # shares chunk 0 with a, then differs
    lines = [json.dumps({"tokens": a}),
             "",                              # blank lines are skipped
             json.dumps({"id": "x", "tokens": a, "meta": {"n": [1, 2.5e3, None, True]}}),
             json.dumps({"tokens": b, "note": "escaped \\\" quote"})]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "requests.jsonl")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        reqs, s = parse(run(c.engine, ["--requests-file", path, *TINY, "--native-cache", "1M",
                                     "--verify"]), 3)
        check([r["tokens"] for r in reqs] == [64, 64, 72], f"token counts: {reqs}")
        check([r["loaded"] for r in reqs] == [0, 2, 1], f"file requests: {reqs}")
        check(s["verify"] == "ok", f"summary: {s}")

        reqs, _ = parse(run(c.engine, ["--requests-file", path, "--requests", "1", *TINY]), 1)
        check(reqs[0]["tokens"] == 64, f"--requests limits the file: {reqs}")

        for bad, message in (('{"tokens":[1,2,-3]}', "non-negative"),
                             ('{"tokens":[1,2,3]', "expected"),
                             ('{"tokens":[]}', "empty"),
                             ('{"toks":[1]}', "no \"tokens\""),
                             ('{"tokens":[4294967296]}', "above"),
                             ('{"tokens":[1],"tokens":[2]}', "duplicate"),
                             ('[1,2,3]', "object")):
            with open(path, "w") as f:
                f.write(json.dumps({"tokens": a}) + "\n" + bad + "\n")
            p = run(c.engine, ["--requests-file", path, *TINY], expect_rc=2)
            check(f"{path}:2:" in p.stderr and message in p.stderr,
                  f"bad line {bad!r}: stderr {p.stderr!r}")
            check(p.stdout == "", f"bad file still printed results: {p.stdout!r}")
        run(c.engine, ["--requests-file", os.path.join(d, "missing.jsonl")], expect_rc=2)


def dump(engine, args):
    p = run(engine, args + ["--dump-requests"])
    return [json.loads(line)["tokens"] for line in p.stdout.splitlines()]


def case_workload(c):
    """The generated shared-prefix pattern, seen through --dump-requests."""
    base = ["--requests", "4", "--prompt-tokens", "160", "--prefix-tokens", "96",
            "--prefix-groups", "2", "--vocab", "1000"]
    r0, r1 = dump(c.engine, base), dump(c.engine, base + ["--rank", "1"])
    check(r0 == dump(c.engine, base), "the workload is not deterministic")
    check(len(r0) == 4 and all(len(t) == 160 for t in r0 + r1), "request count or length")
    check(all(0 <= x < 1000 for t in r0 + r1 for x in t), "a token id >= --vocab")
    for i in range(4):
        check(r0[i][:96] == r0[i % 2][:96] == r1[i][:96], f"request {i}: prefix not shared")
        check(r0[i][96:] != r1[i][96:], f"request {i}: ranks share the suffix")
    check(r0[0][:96] != r0[1][:96], "prefix groups share a prefix")
    check(len({tuple(t[96:]) for t in r0}) == 4, "requests share a suffix")
    check(dump(c.engine, base + ["--seed", "2"])[0] != r0[0], "--seed changes nothing")
    f = dump(c.engine, ["--requests", "2", "--prompt-tokens", "100", "--shared-prefix", "0.25"])
    check(f[0][:25] == f[1][:25] and f[0][25] != f[1][25], "--shared-prefix 0.25 of 100")

    # Replaying the dump as a requests file gives the same offload behaviour.
    args = ["--native-cache", "16M", "--verify", *TINY]
    gen, _ = parse(run(c.engine, base + args), 4)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.jsonl")
        with open(path, "w") as out:
            out.write(run(c.engine, base + ["--dump-requests"]).stdout)
        replay, _ = parse(run(c.engine, ["--requests-file", path] + args), 4)
    def counts(reqs):
        return [{k: v for k, v in r.items() if not k.endswith("_ms")} for r in reqs]
    check(counts(gen) == counts(replay), f"replay differs: {gen} vs {replay}")


def case_bad_flags(c):
    bad = [["--bogus"], ["--layers"], ["--layers", "0"], ["--layers", "abc"],
           ["--layers", "-3"], ["--requests", "1e3"], ["--shared-prefix", "1.5"],
           ["--shared-prefix", "0.5", "--prefix-tokens", "3"],
           ["--prompt-tokens", "10", "--prefix-tokens", "11"], ["--dtype", "f64"],
           ["--tp-rank", "1"], ["--native-cache", "12X"], ["--native-cache", "-1"],
           ["--kvo-buffer", "gpu"], ["--model-id", "x" * 64], ["--chunk-tokens", "65537"],
           ["stray"]]
    for args in bad:
        p = run(c.engine, args, expect_rc=2)
        check("usage: refengine" in p.stderr, f"{args}: no usage line in {p.stderr!r}")
        check(p.stdout == "", f"{args}: printed results: {p.stdout!r}")
    p = run(c.engine, ["--help"])
    check("--native-cache" in p.stdout and "--verify" in p.stdout, "help text")
    # Driver failures are runtime errors (exit 1) naming the call.
    p = run(c.engine, ["--prompt-tokens", "4096"], {"FAKECUDA_MEM_LIMIT": "1M"}, expect_rc=1)
    check("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in p.stderr, f"stderr: {p.stderr!r}")
    p = run(c.engine, [], {"FAKECUDA_DEVICES": "0"}, expect_rc=1)
    check("cuInit failed" in p.stderr and p.stdout == "", f"no device: {p.stderr!r}")


def case_interpose(c):
    """LD_PRELOAD of another kvo module replaces all three calls, as kvshim will."""
    args = ["--requests", "2", "--prompt-tokens", "100", *TINY]
    env = {"LD_PRELOAD": c.args.bogus, "ASAN_OPTIONS": "verify_asan_link_order=0"}
    reqs, s = parse(run(c.engine, args, env), 2)
    check(all(r["loaded"] == 3 and r["computed"] == 1 for r in reqs), f"lookup/load: {reqs}")
    reqs, s = parse(run(c.engine, args, {**env, "KVO_BOGUS_LOOKUP": "0"}), 2)
    check(all(r["stored"] == 3 for r in reqs), f"store not interposed: {reqs}")
    p = run(c.engine, args + ["--verify"], env, expect_rc=3)
    check("verify: request 0 chunk 0" in p.stderr, f"verify message: {p.stderr!r}")


def parser():
    ap = harness.parser(__doc__, "--engine")
    ap.add_argument("--bogus", help="a kvo module refengine does not link (case interpose)")
    return ap


class Ctx(harness.Context):
    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        self.engine = args.engine


if __name__ == "__main__":
    sys.exit(harness.main(harness.cases(globals()), parser(), Ctx))
