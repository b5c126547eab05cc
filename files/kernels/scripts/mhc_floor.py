"""The floor under the mHC pre + post target, on the local GPU (in stream).

The target for pre + post at n 64 is twice its byte bound (bytes / the 2 GiB
copy bandwidth). This times, in stream as the bench does (back to back in one
CUDA graph, input sets rotating over twice the L2), the fastest ways the GPU
has to move the same bytes with no arithmetic at all:
- `copy1`: one launch moving pre's + post's bytes (read half, write half);
- `copy2`: two launches, one moving pre's bytes and one moving post's;
each as a device-to-device memcpy node and as a Triton copy kernel (16-byte
loads, several program sizes; the fastest is kept), next to two empty
kernels (the launch floor) and the shipped pre + post. If the copies alone
take longer than the target, no kernel that reads and writes these bytes in
that many launches can meet it on this GPU.

    PYTHONPATH=src python3 scripts/mhc_floor.py
"""
import json

import torch
import triton
import triton.language as tl

from sm120_kernels import mhc as H
from sm120_kernels.bench import copy_bandwidth, stream_time_us
from sm120_kernels.registry import stream_sets

dev = torch.device("cuda")


def rec(**kw):
    print(json.dumps(kw), flush=True)


@triton.jit
def _copy(src, dst, n_words, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n_words
    tl.store(dst + i, tl.load(src + i, mask=m), mask=m)


@triton.jit
def _tiny(p):
    tl.store(p + tl.program_id(0), tl.program_id(0))


def mhc_bytes(n):
    """The bench's byte counts (mhc.bench_cases): pre, post."""
    hc, d = H.HC_MULT, H.HIDDEN
    mix = 2 * hc + hc * hc
    b_res, b_x, b_fn, b_small = n * hc * d * 2, n * d * 2, mix * hc * d * 4, n * (hc + hc * hc) * 4
    return b_res + b_fn + b_x + b_small, b_x + 2 * b_res + b_small


def copy_calls(moved, sets, how):
    """One call per set: len(moved) launches, launch j reading and writing
    moved[j] / 2 bytes of that set's own buffers."""
    bufs = [[(torch.randint(0, 1 << 30, (m // 8,), dtype=torch.int32, device=dev),
              torch.empty(m // 8, dtype=torch.int32, device=dev)) for m in moved] for _ in range(sets)]

    def launch(s, d, block, warps):
        if how == "memcpy":
            d.copy_(s)
        else:
            _copy[(triton.cdiv(s.numel(), block),)](s, d, s.numel(), BLOCK=block, num_warps=warps)

    out = {}
    for block, warps in ((1, 0),) if how == "memcpy" else ((1024, 4), (2048, 4), (4096, 8), (8192, 8)):
        calls = [lambda b=b: [launch(s, d, block, warps) for s, d in b] for b in bufs]
        out[f"{block}x{warps}"] = round(stream_time_us(calls, min_calls=64)[0], 2)
    return out


def main():
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name(dev), flush=True)
    bw = copy_bandwidth(dev)
    rec(kind="copy_bw_GBps", value=round(bw / 1e9, 1))
    p = torch.zeros(4096, dtype=torch.int32, device=dev)
    for grid in (1, 132):
        us = stream_time_us([lambda: (_tiny[(grid,)](p), _tiny[(grid,)](p))], min_calls=64)[0]
        rec(kind="two_empty_kernels", grid=grid, us=round(us, 2))
    for n in (1, 8, 32, 64):
        pre_b, post_b = mhc_bytes(n)
        total = pre_b + post_b
        bound = total / bw * 1e6
        sets = stream_sets(total, dev)
        row = dict(kind="floor", n=n, bytes=total, bound_us=round(bound, 2), target_us=round(2 * bound, 2))
        for how in ("memcpy", "triton"):
            c1 = copy_calls([total], sets, how)
            c2 = copy_calls([pre_b, post_b], sets, how)
            row[f"copy1_{how}_us"] = min(c1.values())
            row[f"copy2_{how}_us"] = min(c2.values())
            row[f"copy2_{how}_all"] = c2
        ins = [H.make_inputs(n, H.HIDDEN, device="cuda", seed=90 + i) for i in range(sets)]
        calls = [lambda a=a: (H.mhc_pre(a[0], a[2], a[3], a[4], H.RMS_EPS, H.HC_EPS),
                              H.mhc_post(a[1], a[0], a[5], a[6])) for a in ins]
        row["shipped_pre_post_us"] = round(stream_time_us(calls)[0], 2)
        rec(**row)


if __name__ == "__main__":
    main()
