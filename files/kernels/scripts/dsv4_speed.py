"""One lent-GPU call for the DeepSeek-V4 kernels: correctness of the one-launch
mHC pre (and its barrier under repetition), per-kernel profile, and timings of
mHC / indexer variants (CUDA-graph replay, L2 cleared, do_bench medians).

    PYTHONPATH=src python3 scripts/dsv4_speed.py [--skip-indexer] [--skip-mhc]
"""
from __future__ import annotations

import json
import os
import sys

import torch
from triton.testing import do_bench

from sm120_kernels import indexer as I
from sm120_kernels import mhc as M
from sm120_kernels.registry import graphed

OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
rows = []


def t_us(fn, rep=200):
    return do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3


def rec(**kw):
    rows.append(kw)
    print(json.dumps(kw), flush=True)


def no_fused(on: bool):
    if on:
        os.environ["SM120_MHC_NO_FUSED"] = "1"
    else:
        os.environ.pop("SM120_MHC_NO_FUSED", None)


def mhc_part(bw):
    # ---- correctness (fused path n <= 64, old path above)
    for n in (1, 7, 8, 33, 64, 65, 300):
        r = M.check_case(n, M.HIDDEN, "cuda", seed=100 + n)
        rec(kind="mhc_check", n=n, ok=r["ok"], **{k: (round(v, 8) if isinstance(v, float) else v) for k, v in r.items() if k != "ok"})
    # ---- repetition: same inputs, bit-identical outputs every call, n switching
    ins = {n: M.make_inputs(n, M.HIDDEN, device="cuda", seed=5 + n) for n in (1, 16, 64)}
    first = {n: M.mhc_pre(*ins[n][:1], ins[n][2], ins[n][3], ins[n][4], M.RMS_EPS, M.HC_EPS) for n in ins}
    worst = {"y": 0.0, "post": 0.0, "comb": 0.0}
    refs = {n: M.mhc_pre_ref(ins[n][0], ins[n][2], ins[n][3], ins[n][4], M.RMS_EPS, M.HC_EPS) for n in ins}
    worst_ref = 0.0

    def upd(n, y, p, c):
        nonlocal worst_ref
        y0, p0, c0 = first[n]
        for k, a, b0 in (("y", y, y0), ("post", p, p0), ("comb", c, c0)):
            worst[k] = max(worst[k], M.rel_err(a, b0))
        ry, rp, rc = refs[n]
        worst_ref = max(worst_ref, M.rel_err(y, ry), M.rel_err(p, rp), M.rel_err(c, rc))

    for it in range(600):
        n = (1, 16, 64)[it % 3]
        res, _, fn, sc, base, _, _ = ins[n]
        y, p, c = M.mhc_pre(res, fn, sc, base, M.RMS_EPS, M.HC_EPS)
        if it % 25 == 0 or it > 580:
            upd(n, y, p, c)
    res, _, fn, sc, base, _, _ = ins[64]
    outs = {}

    def cap():
        outs["v"] = M.mhc_pre(res, fn, sc, base, M.RMS_EPS, M.HC_EPS)

    g = graphed(cap)
    for _ in range(300):
        g()
    torch.cuda.synchronize()
    upd(64, *outs["v"])
    rec(kind="mhc_repeat", vs_first=worst, vs_ref=worst_ref)

    # ---- profile (eager, per-kernel device time)
    n = 64
    res, x, fn, sc, base, post, comb = M.make_inputs(n, M.HIDDEN, device="cuda", seed=11)
    for label, old in (("new", False),):
        no_fused(old)
        for _ in range(3):
            M.mhc_pre(res, fn, sc, base, M.RMS_EPS, M.HC_EPS)
            M.mhc_post(x, res, post, comb)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                M.mhc_pre(res, fn, sc, base, M.RMS_EPS, M.HC_EPS)
                M.mhc_post(x, res, post, comb)
            torch.cuda.synchronize()
        for ev in prof.key_averages():
            if ev.device_type == torch.autograd.DeviceType.CUDA and ev.count:
                rec(kind="mhc_profile", path=label, kernel=ev.key[:50], us=round(ev.device_time_total / ev.count, 2), per_call=ev.count // 20)
    no_fused(False)

    # ---- timings
    base = dict(M.DEFAULT_PRE_FUSED_CONFIG)
    pre_cfgs = {
        "default": dict(base),
        "A16_pipe3_R1_all": {"max_rows": 64, "block_m": 16, "min_cols": 32, "block_d": 32, "num_warps": 4, "pipe": 3},
    }
    post_cfgs = {"p1_256_256_w2": {"block_m": 1, "chunk_d": 256, "block_d": 256, "num_warps": 2}}
    # correctness of each variant
    for name in pre_cfgs:
        for n in (1, 17, 64):
            res, x, fn, sc, base, post, comb = M.make_inputs(n, M.HIDDEN, device="cuda", seed=3 + n)
            y, p, c = M.mhc_pre(res, fn, sc, base, M.RMS_EPS, M.HC_EPS, config={"pre_fused": pre_cfgs[name]})
            ry, rp, rc = M.mhc_pre_ref(res, fn, sc, base, M.RMS_EPS, M.HC_EPS)
            rec(kind="mhc_check_cfg", cfg=name, n=n, y=M.rel_err(y, ry), post=M.rel_err(p, rp), comb=M.rel_err(c, rc))
    post_cfgs = {
        "p1_256_256_w2": {"block_m": 1, "chunk_d": 256, "block_d": 256, "num_warps": 2},
    }
    for n in (1, 8, 32, 64):
        res, x, fn, sc, base, post, comb = M.make_inputs(n, M.HIDDEN, device="cuda", seed=11)
        hc, d = 4, M.HIDDEN
        b_pre = n * hc * d * 2 + 24 * hc * d * 4 + n * d * 2 + n * 20 * 4
        b_post = n * d * 2 + 2 * n * hc * d * 2 + n * 20 * 4
        no_fused(True)
        t = t_us(graphed(lambda: M.mhc_pre(res, fn, sc, base, M.RMS_EPS, M.HC_EPS)))
        rec(kind="mhc_pre", n=n, variant="old", us=round(t, 2), bound_us=round(b_pre / bw * 1e6, 2))
        no_fused(False)
        for name, cfg in pre_cfgs.items():
            try:
                t = t_us(graphed(lambda: M.mhc_pre(res, fn, sc, base, M.RMS_EPS, M.HC_EPS, config={"pre_fused": cfg})))
                rec(kind="mhc_pre", n=n, variant=name, us=round(t, 2))
            except Exception as exc:  # noqa: BLE001
                rec(kind="mhc_pre", n=n, variant=name, error=f"{type(exc).__name__}: {exc}"[:200])
        for name, cfg in post_cfgs.items():
            try:
                t = t_us(graphed(lambda: M.mhc_post(x, res, post, comb, config=cfg)))
                rec(kind="mhc_post", n=n, variant=name, us=round(t, 2), bound_us=round(b_post / bw * 1e6, 2))
            except Exception as exc:  # noqa: BLE001
                rec(kind="mhc_post", n=n, variant=name, error=f"{type(exc).__name__}: {exc}"[:200])

        def both():
            M.mhc_pre(res, fn, sc, base, M.RMS_EPS, M.HC_EPS)
            M.mhc_post(x, res, post, comb)

        t = t_us(graphed(both))
        rec(kind="mhc_pre+post", n=n, variant="default", us=round(t, 2), bound_us=round((b_pre + b_post) / bw * 1e6, 2))
    tiny = torch.empty(256, device=dev)
    t = t_us(graphed(lambda: tiny.fill_(1.0)))
    rec(kind="mhc_pre", n=0, variant="one_tiny_kernel_graph", us=round(t, 2))


def indexer_part(bw):
    for batch, nn in ((32, 1), (32, 2), (8, 1), (64, 1)):
        q, kv, w, ctx, bt, mx = I.make_inputs(batch, nn, [32768] * batch, seed=7, extra_pages=0)
        q, kv, w, ctx, bt = (t.to(dev) for t in (q, kv, w, ctx, bt))
        out = torch.empty(batch * nn, mx, device=dev)
        nbytes = batch * 32768 * 132 + q.numel() + w.numel() * 4 + out.numel() * 4
        base_cfg = I._resolve_config("logits" if nn == 1 else "logits_next_n2", I.DEFAULT_LOGITS_CONFIG, None, dev)
        ref = I.paged_mqa_logits(q, kv, w, ctx, bt, mx).clone()
        if nn == 1 and batch == 32:
            rr = I.paged_mqa_logits_ref(q, kv, w, ctx, bt, mx)
            rec(kind="idx_check", variant="file", **I.compare_logits(ref, rr))
        variants = {"file": base_cfg, "store_t": {**base_cfg, "store_t": True}}
        for name, cfg in variants.items():
            try:
                o = I.paged_mqa_logits(q, kv, w, ctx, bt, mx, config=cfg)
                chk = I.compare_logits(o, ref)
                t = t_us(graphed(lambda: I.paged_mqa_logits(q, kv, w, ctx, bt, mx, out=out, config=cfg)))
                rec(kind="idx_logits", batch=batch, next_n=nn, variant=name, us=round(t, 2),
                    frac=round(nbytes / (t * 1e-6) / bw, 3), same_as_file=chk["ok"], calc_diff=chk["calc_diff"])
            except Exception as exc:  # noqa: BLE001
                rec(kind="idx_logits", batch=batch, next_n=nn, variant=name, error=f"{type(exc).__name__}: {exc}"[:200])


def main():
    import triton

    n = 1 << 31
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    a.random_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    del a, b
    bw = 2 * n / (ms * 1e-3)
    rec(kind="env", device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, copy_GBps=round(bw / 1e9))
    if "--skip-mhc" not in sys.argv:
        mhc_part(bw)
    if "--skip-indexer" not in sys.argv:
        indexer_part(bw)
    with open(os.path.join(OUT, "dsv4_speed.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("# summary")
    for r in rows:
        if r["kind"] in ("mhc_pre", "mhc_post", "mhc_pre+post", "idx_logits", "mhc_repeat", "mhc_check", "idx_check"):
            print(" ".join(f"{k}={v}" for k, v in r.items() if k not in ("pre_y", "pre_post", "fused_res", "fused_post")))


if __name__ == "__main__":
    main()
