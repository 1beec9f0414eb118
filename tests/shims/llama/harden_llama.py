#!/usr/bin/env python3
"""ctest driver for the prefix cache under faults in the cache peer (issue 17), on
tests/fakes/llama's prefixhost, reusing llama_prefix.py's harness (each run without kvshim first:
the reference; every output line must be identical with kvshim).

usage: harden_llama.py CASE --host PREFIXHOST --preload LIBKVSHIM --cli KVSHIM
                       [--asan-runtime LIBASAN]

Cases:
  corrupt-serve  A's states are pushed to `kvshim serve`; bytes of serve's pool are flipped
                 through its memfd (/proc/<pid>/fd). B's outputs are identical; the corrupt
                 state is counted as a bad blob (llama_prefix_bad_blobs, not a plain miss), B
                 reports it (peer_bad_reports) and serve drops it (coord_bad_dropped); a second
                 B is never handed the same corrupt object again.
  chunks-frame   KVSHIM_LLAMA_CHUNKS=1: A's chunks and frame are stored at serve, then one byte
                 of the frame's body is flipped there. B's outputs are identical; the frame is
                 refused (llama_prefix_bad_blobs), reported and dropped at serve (and nothing
                 else: the chunk objects B then meets looking for a state stored whole are not
                 damaged blobs); B's snapshot stores the frame again, so B2 restores the prefix
                 from the chunks with nothing refused.
  chunks-tokens  KVSHIM_LLAMA_CHUNKS=1: one byte of the tokens of one of A's chunk objects at
                 serve is flipped. A chunk under the prompt's key with other tokens is damaged
                 (the key is the chain hash of its tokens): B's outputs are identical, the chunk
                 is refused (llama_prefix_bad_blobs) and dropped at serve (that one alone), B's
                 snapshot stores it again, and B2 restores the prefix from the chunks.
"""
import mmap
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_prefix as lp  # noqa: E402  (the prefixhost context, models and prompts)
import harness  # noqa: E402  (tests/lib, put on the path by llama_prefix)
from harness import Failure, check  # noqa: E402


def serve_stats(ctx, s):
    d = harness.live_stats(ctx, s.pid, timeout=30)
    check(d is not None, f"kvshim stats {s.pid}: no answer")
    return d


def flip_pool(pid):
    """Flip one byte in every 4 KiB page of the cache arena of process pid's pool memfd."""
    m, lo, hi = pool_map(pid)
    flipped = 0
    for off in range(lo + 200, hi, 4096):
        m[off] ^= 0x5A
        flipped += 1
    m.close()
    return flipped


def pool_map(pid):
    """The cache arena of process pid's pool memfd, mapped: (mmap, start, end)."""
    fd_dir = f"/proc/{pid}/fd"
    for n in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, n))
        except OSError:
            continue
        if "kvshim-pool" not in target:
            continue
        with open(os.path.join(fd_dir, n), "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
        magic, = struct.unpack_from("<Q", m, 0)
        check(magic == 0x4C4F4F504D48534B, f"not a kvshim pool: {magic:#x}")
        cache_off, cache_size = struct.unpack_from("<QQ", m, 40)
        return m, cache_off, cache_off + cache_size
    raise Failure(f"no kvshim pool memfd among {fd_dir}")


FRAME_MAGIC = struct.pack("<I", 0x4653564B)  # "KVSF": shims/llama/chunks.h
CHUNK_MAGIC = struct.pack("<I", 0x4B53564B)  # "KVSK"
OBJ_HDR = 64  # a frame's or chunk's header; a chunk's tokens follow it (chunks.h)


def flip_objects(pid, magic, most):
    """Flip one byte just past the header (a frame's body, a chunk's first token) of at most
    `most` chunk-storage objects with this magic in pid's pool (each starts with its magic at an
    extent's start, a multiple of 64 bytes). Returns how many."""
    m, lo, hi = pool_map(pid)
    flipped, at = 0, m.find(magic, lo, hi)
    while at >= 0 and flipped < most:
        if at % 64 == 0:
            m[at + OBJ_HDR + 4] ^= 0x5A
            flipped += 1
        at = m.find(magic, at + 4, hi)
    m.close()
    return flipped


def flip_frames(pid):
    """Flip one byte of the body of every frame object in pid's pool. Returns how many."""
    return flip_objects(pid, FRAME_MAGIC, 1 << 30)


def case_chunks_frame(ctx):
    chunks_damaged(ctx, "chunks-frame", flip_frames)


def case_chunks_tokens(ctx):
    chunks_damaged(ctx, "chunks-tokens", lambda pid: flip_objects(pid, CHUNK_MAGIC, 1))


def chunks_damaged(ctx, what, flip):
    """A stores chunks at serve; flip(serve pid) damages one object there (returns how many it
    found); B is identical, refuses the object and has serve drop it alone, and B2 restores."""
    a, _ = lp.models(ctx)
    s = ctx.serve()
    on = {"KVSHIM_LLAMA_CHUNKS": "1"}
    b_cmds = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {lp.P1000} 512", "gen 0 0 8"]
    ref_b, _, _ = ctx.run(b_cmds, preload=False, what="B reference")
    _, _, sa = ctx.run([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {lp.P}", "gen 0 0 4"],
                       what="A", **on)
    check(sa.get("llama_chunks_stored", 0) >= 4 and sa.get("cache_peer_stores", 0) >= 1,
          f"A did not store chunks at serve: {sa}")
    before = serve_stats(ctx, s)
    n = flip(s.pid)
    check(n == 1, f"{what}: {n} objects damaged in serve's pool, expected 1")
    got, err, st = ctx.run(b_cmds, what="B", **on)
    check(got == ref_b, f"B differs:\n{ref_b}\n{got}\n{err[-2000:]}")
    # a damaged frame ends the restore; a damaged chunk ends the run before it
    lp.expect(st, "B", bad_blobs=(">=", 1), **({"restores": ("==", 0)} if what == "chunks-frame"
                                               else {}))
    after = serve_stats(ctx, s)
    check(after["coord_bad_dropped"] == 1,
          f"serve dropped {after['coord_bad_dropped']} objects, expected the damaged one alone "
          f"(held {before['store_objects']}, now {after['store_objects']})")
    got2, err2, st2 = ctx.run(b_cmds, what="B2", **on)
    check(got2 == ref_b, f"B2 differs:\n{ref_b}\n{got2}\n{err2[-2000:]}")
    lp.expect(st2, "B2", bad_blobs=("==", 0), restored_tokens=(">=", 1024))
    print(f"{what}: identical; B bad_blobs {st.get('llama_prefix_bad_blobs')}, serve "
          f"dropped {after['coord_bad_dropped']}; B2 restored "
          f"{st2.get('llama_prefix_restored_tokens')} tokens")


def case_corrupt_serve(ctx):
    a, _ = lp.models(ctx)
    s = ctx.serve()
    b_cmds = [f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {lp.P1000} 512", "gen 0 0 8"]
    ref_b, _, _ = ctx.run(b_cmds, preload=False, what="B reference")
    _, _, sa = ctx.run([f"model 0 {a}", "ctx 0 0 1", f"prompt 0 0 {lp.P}", "gen 0 0 4"],
                       what="A", KVSHIM_PEERS=1)
    check(sa.get("push_sent", 0) + sa.get("push_queued", 0) + sa.get("cache_peer_stores", 0)
          >= 1, f"A stored nothing at serve: {sa}")
    before = serve_stats(ctx, s)
    check(before["store_objects"] >= 1, f"serve holds nothing: {before}")
    print(f"flipped {flip_pool(s.pid)} bytes of serve's pool")
    got, err, st = ctx.run(b_cmds, what="B")
    check(got == ref_b, f"B differs:\n{ref_b}\n{got}\n{err[-2000:]}")
    lp.expect(st, "B", bad_blobs=(">=", 1), peer_restores=("==", 0))
    check(st.get("peer_bad_reports", 0) >= 1, f"B reported nothing: {st}")
    after = serve_stats(ctx, s)
    check(after["coord_bad_reports"] >= 1 and after["coord_bad_dropped"] >= 1,
             f"serve did not drop the corrupt state: reports {after['coord_bad_reports']}, "
             f"dropped {after['coord_bad_dropped']}")
    # Serve no longer hands the corrupt object out: B2 sees no bad blob.
    got2, err2, st2 = ctx.run(b_cmds, what="B2", KVSHIM_PUSH="off")
    check(got2 == ref_b, f"B2 differs:\n{ref_b}\n{got2}\n{err2[-2000:]}")
    lp.expect(st2, "B2", bad_blobs=("==", 0))
    print(f"corrupt-serve: identical; B bad_blobs {st.get('llama_prefix_bad_blobs')}, serve "
          f"dropped {after['coord_bad_dropped']}; B2 bad_blobs 0")


if __name__ == "__main__":
    sys.exit(harness.main({"corrupt-serve": case_corrupt_serve, "chunks-frame": case_chunks_frame,
                           "chunks-tokens": case_chunks_tokens},
                          harness.parser(__doc__, "--host", "--preload", "--cli", asan=True),
                          lp.Ctx))
