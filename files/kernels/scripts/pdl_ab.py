"""Programmatic dependent launch (PDL), A/B on the local GPU.

1. The floor: a chain of tiny kernels in one CUDA graph, time per kernel,
   launched plainly and with PDL (1, 132 and 1,024 programs).
2. mHC with the device's config file, with SM120_MHC_PDL=0 (no PDL) and with
   post and the one-launch pre both launched so at every n: each checked
   against the reference (n 1 / 8 / 64 / 300), the one-launch pre + post
   replayed 800 times in a graph, then both bench figures of every mHC bench
   case (single call, in stream) and pre alone / post alone in stream.
3. The one-launch pre's launch shapes at n 32 and 64 (PRE_SHAPES), each
   checked against the reference, pre alone in stream.

    PYTHONPATH=src python3 scripts/pdl_ab.py [--skip-mhc]
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

from sm120_kernels import mhc as H
from sm120_kernels.bench import bench_figures, copy_bandwidth, stream_time_us
from sm120_kernels.registry import graphed

dev = torch.device("cuda")


def rec(**kw):
    print(json.dumps(kw), flush=True)


@triton.jit
def _tiny(p, PDL: tl.constexpr):
    H._pdl_prologue(PDL)
    tl.store(p + tl.program_id(0), tl.program_id(0))


def floor():
    p = torch.zeros(4096, dtype=torch.int32, device=dev)
    for grid in (1, 132, 1024):
        for pdl in (False, True):
            meta = {"launch_pdl": True} if pdl else {}
            calls = [lambda: _tiny[(grid,)](p, PDL=pdl, num_warps=4, **meta)]
            us, _ = stream_time_us(calls, min_calls=64)
            rec(kind="floor", grid=grid, pdl=pdl, us_per_kernel=round(us, 2))


# SM120_MHC_PDL: None = the device's config file
MHC_VARIANTS = (None, "0", "post,pre_fused")


def mhc_part(bw):
    for pdl in MHC_VARIANTS:
        if pdl is None:
            os.environ.pop("SM120_MHC_PDL", None)
        else:
            os.environ["SM120_MHC_PDL"] = pdl
        for n in (1, 8, 64, 300):
            r = H.check_case(n, H.HIDDEN, "cuda", seed=7 + n)
            rec(kind="mhc_check", pdl=pdl, n=n, ok=r["ok"], col=r["col_sum_err"],
                worst=max(v for k, v in r.items() if k not in ("ok", "col_sum_err")))
        # repeated one-launch pre in a graph (the barrier and buffers under PDL)
        res, _, fn, sc, base, _, _ = H.make_inputs(64, H.HIDDEN, device="cuda", seed=3)
        ry, rp, rc = H.mhc_pre_ref(res, fn, sc, base, H.RMS_EPS, H.HC_EPS)
        out = {}

        def cap():
            out["v"] = H.mhc_pre(res, fn, sc, base, H.RMS_EPS, H.HC_EPS)
            H.mhc_post(out["v"][0], res, out["v"][1], out["v"][2])

        replay = graphed(lambda: [cap() for _ in range(8)], warmup=1)
        for _ in range(100):
            replay()
        torch.cuda.synchronize()
        y, p_, c = out["v"]
        rec(kind="mhc_repeat", pdl=pdl, y=H.rel_err(y, ry), post=H.rel_err(p_, rp), comb=H.rel_err(c, rc))
        for case in H.bench_cases():
            spec = case.make(dev)
            f = bench_figures(spec, bw)
            rec(kind="mhc_time", pdl=pdl, case=case.name, single_us=f["time_us"], stream_us=f["stream_us"],
                stream_us2=f["stream_us_repeat"], stream_bw=f["stream_bw_fraction"], bound_us=f["bound_us"])
        # pre alone and post alone, in stream (16 input sets)
        for n in (8, 64):
            sets = [H.make_inputs(n, H.HIDDEN, device="cuda", seed=50 + i) for i in range(16)]
            pre = [lambda a=a: H.mhc_pre(a[0], a[2], a[3], a[4], H.RMS_EPS, H.HC_EPS) for a in sets]
            post = [lambda a=a: H.mhc_post(a[1], a[0], a[5], a[6]) for a in sets]
            rec(kind="mhc_part", pdl=pdl, n=n, pre_stream_us=round(stream_time_us(pre)[0], 2),
                post_stream_us=round(stream_time_us(post)[0], 2))
    os.environ.pop("SM120_MHC_PDL", None)


PRE_SHAPES = [  # (block_m, block_d, pipe, replicas, num_warps); columns per program by the plan's rule
    (64, 16, 0, 8, 4), (64, 32, 0, 8, 4), (64, 16, 0, 4, 4), (64, 16, 0, 8, 8), (64, 16, 2, 8, 4),
    (32, 16, 0, 8, 4), (32, 32, 0, 8, 4), (32, 32, 2, 8, 4), (32, 16, 0, 4, 4), (32, 32, 0, 8, 8),
    (16, 32, 3, 4, 4), (16, 32, 0, 4, 4), (16, 32, 3, 8, 4),
]


def pre_shapes():
    """The one-launch pre's launch shapes at n 32 and 64: pre alone in stream."""
    os.environ["SM120_MHC_PDL"] = "0"
    for n in (32, 64):
        sets = [H.make_inputs(n, H.HIDDEN, device="cuda", seed=70 + i) for i in range(16)]
        a = sets[0]
        ry = H.mhc_pre_ref(a[0], a[2], a[3], a[4], H.RMS_EPS, H.HC_EPS)
        for bm, bd, pipe, reps, warps in PRE_SHAPES:
            cfg = {"pre_fused": {"max_rows": 64, "block_m": bm, "min_cols": 32, "block_d": bd, "num_warps": warps,
                                 "pipe": pipe, "replicas": reps, "large_rows": 1 << 20}}
            plan = H._pre_plan(a[0], a[2], cfg)
            try:
                out = H.mhc_pre(a[0], a[2], a[3], a[4], H.RMS_EPS, H.HC_EPS, config=cfg)
                err = max(H.rel_err(o, r) for o, r in zip(out, ry))
                calls = [lambda a=a: H.mhc_pre(a[0], a[2], a[3], a[4], H.RMS_EPS, H.HC_EPS, config=cfg) for a in sets]
                us = round(stream_time_us(calls)[0], 2)
            except Exception as exc:  # noqa: BLE001 - an out-of-resources shape is a result too
                err, us = None, f"{type(exc).__name__}: {exc}"[:120]
            rec(kind="pre_shape", n=n, bm=bm, bd=bd, pipe=pipe, reps=reps, warps=warps,
                plan=None if plan is None else list(plan[:5]), max_rel=err, pre_stream_us=us)
    os.environ.pop("SM120_MHC_PDL", None)


def main():
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name(dev), flush=True)
    bw = copy_bandwidth(dev)
    rec(kind="copy_bw_GBps", value=round(bw / 1e9, 1))
    floor()
    if "--skip-mhc" not in sys.argv:
        mhc_part(bw)
        pre_shapes()


if __name__ == "__main__":
    main()
