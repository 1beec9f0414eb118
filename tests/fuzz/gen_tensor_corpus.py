#!/usr/bin/env python3
"""Write the seed corpus of fuzz_tensor: tensor descriptor encodings, version 1.

The layout is built here from the description in core/wire/tensor.h, independently of tensor.c
(python3 standard library only), so the seeds also cross-check the encoder:

    u8 kind | u8 version | u16 body_len
    body: u32 dtype | u32 ndim | u64 storage_offset | u8 uuid[16]
          | u64 shape[ndim] | i64 stride[ndim] | handle
    CPU_SHM (1):     u64 instance_id | u64 offset | u64 length
    CUDA_IPC (2):    u8 handle[64] | u64 offset | u64 alloc_len
    CUDA_VMM_FD (3): u32 fd_index | u64 offset | u64 size | u64 granularity

Valid seeds cover every kind, ndim 1..8, every dtype, contiguous, permuted, broadcast and
negative strides; invalid seeds cover each rejection (unknown kind or version, truncation,
trailing bytes, ndim 9, unknown dtype, zero dim, region too small).

Usage: gen_tensor_corpus.py [OUTDIR]   (default: corpus/fuzz_tensor next to this script)
Output is deterministic: running it again rewrites the same files.
"""
import os
import random
import struct
import sys

KIND_CPU, KIND_IPC, KIND_VMM = 1, 2, 3
DTYPE_SIZE = [1, 2, 2, 4, 1, 1, 1, 4]  # U8 F16 BF16 F32 F8E4M3 F8E5M2 I8 I32 (core/memory/store.h)


def span_bytes(dtype, shape, stride, storage_offset):
    """[lo, hi) bytes of the region the view touches (None when it starts before the region)."""
    pos = sum(s * (n - 1) for n, s in zip(shape, stride) if s > 0)
    neg = sum(-s * (n - 1) for n, s in zip(shape, stride) if s < 0)
    if neg > storage_offset:
        return None
    es = DTYPE_SIZE[dtype]
    return (storage_offset - neg) * es, (storage_offset + pos + 1) * es


def encode(kind, dtype, shape, stride, storage_offset, uuid, handle, version=1):
    ndim = len(shape)
    body = struct.pack("<IIQ", dtype, ndim, storage_offset) + uuid
    body += struct.pack("<%dQ" % ndim, *shape) + struct.pack("<%dq" % ndim, *stride)
    if kind == KIND_CPU:
        body += struct.pack("<QQQ", *handle)
    elif kind == KIND_IPC:
        body += handle[0] + struct.pack("<QQ", handle[1], handle[2])
    else:
        body += struct.pack("<IQQQ", *handle)
    return struct.pack("<BBH", kind, version, len(body)) + body


def valid_seed(rng, kind, ndim, dtype, stride_style):
    shape = [rng.randint(1, 5) for _ in range(ndim)]
    stride, run = [0] * ndim, 1
    for k in reversed(range(ndim)):
        if stride_style == "contiguous":
            stride[k] = run
        elif stride_style == "broadcast":
            stride[k] = 0 if k % 2 else run
        elif stride_style == "negative":
            stride[k] = -run if k == ndim - 1 else run
        else:  # permuted / padded
            stride[k] = run * rng.randint(1, 3)
        run *= shape[k]
    neg = sum(-s * (n - 1) for n, s in zip(shape, stride) if s < 0)
    storage_offset = neg + rng.randint(0, 8)
    _, hi = span_bytes(dtype, shape, stride, storage_offset)
    uuid = bytes(16) if kind == KIND_CPU and rng.random() < 0.5 else bytes(
        rng.randint(1, 255) for _ in range(16))
    if kind == KIND_CPU:
        handle = (rng.getrandbits(63) | 1, 4096 * rng.randint(1, 1 << 20), hi + rng.choice([0, 64, 4096]))
    elif kind == KIND_IPC:
        off = rng.choice([0, 512, 1 << 20])
        handle = (bytes(rng.getrandbits(8) for _ in range(64)), off, off + hi + rng.choice([0, 1, 4096]))
    else:
        gran = 1 << rng.choice([16, 21])
        off = rng.choice([0, 4096])
        size = (off + hi + gran - 1) // gran * gran
        handle = (rng.randint(0, 252), off, size, gran)
    return encode(kind, dtype, shape, stride, storage_offset, uuid, handle)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus", "fuzz_tensor")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(20240611)
    seeds = {}
    names = {KIND_CPU: "cpu", KIND_IPC: "ipc", KIND_VMM: "vmm"}
    styles = ["contiguous", "broadcast", "negative", "padded"]
    for kind in (KIND_CPU, KIND_IPC, KIND_VMM):
        for ndim in range(1, 9):
            dtype = (ndim + kind) % len(DTYPE_SIZE)
            style = styles[(ndim + kind) % len(styles)]
            seeds["valid-%s-ndim%d-%s" % (names[kind], ndim, style)] = valid_seed(rng, kind, ndim, dtype, style)

    # Each invalid seed is one change away from a valid F16 [.., ..] CPU_SHM descriptor.
    base = valid_seed(rng, KIND_CPU, 2, 1, "contiguous")
    ipc = valid_seed(rng, KIND_IPC, 3, 3, "contiguous")
    seeds["valid-cpu-ndim2-f16-base"] = base
    seeds["bad-kind-7"] = bytes([7]) + base[1:]
    seeds["bad-kind-0"] = bytes([0]) + base[1:]
    seeds["bad-version-3"] = base[:1] + bytes([3]) + base[2:]
    seeds["bad-truncated-header"] = base[:3]
    seeds["bad-truncated-body"] = base[:-1]
    seeds["bad-truncated-ipc-handle"] = ipc[:60]
    seeds["bad-trailing-byte"] = base + b"\0"
    seeds["bad-body-too-long"] = base[:2] + struct.pack("<H", len(base) - 4 + 8) + base[4:] + bytes(8)
    seeds["bad-ndim-9"] = base[:8] + struct.pack("<I", 9) + base[12:]
    seeds["bad-ndim-0"] = base[:8] + struct.pack("<I", 0) + base[12:]
    seeds["bad-dtype-8"] = base[:4] + struct.pack("<I", 8) + base[8:]
    seeds["bad-zero-dim"] = base[:36] + struct.pack("<Q", 0) + base[44:]
    seeds["bad-region-short"] = base[:-8] + struct.pack("<Q", 1)
    seeds["empty"] = b""

    for name, data in sorted(seeds.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(seeds), out))


if __name__ == "__main__":
    main()
