"""Plain data movement in stream: the floor under a kernel chain's time.

`floor_us(launches, sets)` times, as the bench's in-stream figure (back to
back in one CUDA graph, input sets rotating over twice the L2), a chain of
launches that only move bytes: ("copy", n) reads and writes n / 2 bytes
(a Triton copy, 16-byte loads; the fastest of several program sizes),
("read", n) reads n bytes (a Triton sum, one word written per program),
("memcpy", n) is a device-to-device memcpy node of n / 2 bytes, ("empty",)
an empty one-program kernel. Used by mhc_floor.py and moe_floor.py.
"""
import json

import torch
import triton
import triton.language as tl

from sm120_kernels.bench import copy_bandwidth, stream_time_us

BLOCKS = ((1024, 4), (2048, 4), (4096, 8), (8192, 8))


def rec(**kw):
    print(json.dumps(kw), flush=True)


def start(device) -> float:
    """Print the versions and the device, record its copy bandwidth and return it (bytes/s)."""
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name(device), flush=True)
    bw = copy_bandwidth(device)
    rec(kind="copy_bw_GBps", value=round(bw / 1e9, 1))
    return bw


@triton.jit
def _copy(src, dst, n_words, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n_words
    tl.store(dst + i, tl.load(src + i, mask=m), mask=m)


@triton.jit
def _read(src, dst, n_words, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + tl.program_id(0), tl.sum(tl.load(src + i, mask=i < n_words, other=0), axis=0))


@triton.jit
def _tiny(p):
    tl.store(p + tl.program_id(0), tl.program_id(0))


def floor_us(launches, sets: int, device) -> float:
    """Per-call µs of the chain, best over BLOCKS for the Triton kinds."""
    def bufs_for():
        """One set's (kind, source, destination) per launch: copies write their
        source's size, reads one word per program."""
        out = []
        for kind, *n in launches:
            words = max(1, n[0] // (4 if kind == "read" else 8)) if n else 1
            src = torch.randint(0, 1 << 30, (words,), dtype=torch.int32, device=device)
            dst = torch.empty(words if kind in ("copy", "memcpy") else words // BLOCKS[0][0] + 1,
                              dtype=torch.int32, device=device)
            out.append((kind, src, dst))
        return out

    sets_bufs = [bufs_for() for _ in range(sets)]
    tiny = torch.zeros(1, dtype=torch.int32, device=device)

    def launch(kind, s, d, block, warps):
        if kind == "memcpy":
            d.copy_(s)
        elif kind == "empty":
            _tiny[(1,)](tiny)
        else:
            kern = _copy if kind == "copy" else _read
            kern[(triton.cdiv(s.numel(), block),)](s, d, s.numel(), BLOCK=block, num_warps=warps)

    best = None
    triton_kinds = any(k in ("copy", "read") for k, *_ in launches)
    for block, warps in BLOCKS if triton_kinds else BLOCKS[:1]:
        calls = [lambda b=b: [launch(k, s, d, block, warps) for k, s, d in b] for b in sets_bufs]
        us = stream_time_us(calls, min_calls=64)[0]
        best = us if best is None else min(best, us)
    return round(best, 2)
