"""Variant sweep for the DeepSeek-V4 indexer and mHC kernels on the local GPU
(one call on a lent machine): times each launch config, prints a table.

    PYTHONPATH=src python scripts/tune_dsv4.py [--json PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
from triton.testing import do_bench

from sm120_kernels import indexer as I
from sm120_kernels import mhc as M
from sm120_kernels.registry import graphed


def copy_bw(dev):
    n = 1 << 31
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    a.random_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * n / (ms * 1e-3)


def t_us(fn):
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sm120-ok", help="JSON of logits configs that compile for sm_120 (next_n,ppi,warps,stages)")
    ap.add_argument("--write-config", help="write the fastest indexer configs here")
    ap.add_argument("--skip-mhc", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bw(dev)
    rows = []
    print(f"# {torch.cuda.get_device_name()} copy {bw / 1e9:.0f} GB/s, torch {torch.__version__}", flush=True)

    # ---- indexer logits, batch 32 ctx 32K
    ok = json.load(open(args.sm120_ok)) if args.sm120_ok else None
    best = {}
    for batch, next_n in ((32, 1), (32, 2)):
        q, kv, w, ctx, bt, mx = I.make_inputs(batch, next_n, [32768] * batch, seed=7, extra_pages=0)
        q, kv, w, ctx, bt = (t.to(dev) for t in (q, kv, w, ctx, bt))
        out = torch.empty(batch * next_n, mx, device=dev)
        nbytes = batch * 32768 * 132 + q.numel() + w.numel() * 4 + out.numel() * 4
        if next_n == 1:
            grid = [(ppi, nw, ns, ppp) for ppi, nw, ns, ppp in itertools.product((1, 2, 4), (4, 8), (2, 3, 4), (8, 32))]
        else:
            grid = [(ppi, nw, ns, 16) for ppi, nw, ns in itertools.product((1, 2, 4), (4, 8), (1, 2, 3))]
        key = "logits" if next_n == 1 else "logits_next_n2"
        for ppi, nw, ns, ppp in grid:
            if ok is not None and not ok.get(f"{next_n},{ppi},{nw},{ns}", [False])[0]:
                continue  # over sm_120's shared memory or spills
            cfg = {"prefetch": False, "num_warps": nw, "max_pages_per_prog": ppp, "num_stages": ns, "pages_per_iter": ppi}
            try:
                fn = graphed(lambda: I.paged_mqa_logits(q, kv, w, ctx, bt, mx, out=out, config=cfg))
                t = t_us(fn)
            except Exception as exc:  # noqa: BLE001
                print(f"indexer b{batch} n{next_n} {cfg}: {type(exc).__name__} {exc}"[:300], flush=True)
                continue
            r = {"kernel": "indexer_logits", "batch": batch, "next_n": next_n, **cfg, "us": round(t, 2), "frac": round(nbytes / (t * 1e-6) / bw, 3)}
            rows.append(r)
            print(r, flush=True)
            if key not in best or t < best[key][0]:
                best[key] = (t, cfg)
        if batch == 32 and next_n == 1:
            lens = I.row_lengths(ctx, 1)
            idx = torch.empty(32, 512, dtype=torch.int32, device=dev)
            I.paged_mqa_logits(q, kv, w, ctx, bt, mx, out=out)
            ref_idx = I.topk_ref(out, lens, 512)
            for (blk, nw), waves in itertools.product(((1024, 4), (2048, 4), (2048, 8), (4096, 8)), (2, 4, 8)):
                cfg = {"block": blk, "num_warps": nw, "waves": waves}
                try:
                    fn = graphed(lambda: I.topk_indices(out, lens, 512, out=idx, config=cfg))
                    t = t_us(fn)
                    overlap = I.topk_overlap(idx, ref_idx)
                except Exception as exc:  # noqa: BLE001
                    print(f"topk {cfg}: {type(exc).__name__} {exc}"[:300], flush=True)
                    continue
                r = {"kernel": "topk", "batch": 32, **cfg, "us": round(t, 2), "overlap": overlap}
                rows.append(r)
                print(r, flush=True)
                if overlap >= 0.99 and ("topk" not in best or t < best["topk"][0]):
                    best["topk"] = (t, cfg)
        del kv, out
    if args.write_config:
        conf = {"_comment": "Tuned on the lent H200 (torch 2.11, Triton 3.6) by scripts/tune_dsv4.py: batch 32, "
                "context 32K, among the configs that compile for sm_120 within its shared memory. On sm_90 the "
                "FP8 operand goes through shared memory and Triton pipelines the loop itself."}
        for k, (t, cfg) in best.items():
            conf[k] = cfg
            print(f"best {k}: {t:.1f} us {cfg}", flush=True)
        with open(args.write_config, "w") as f:
            json.dump(conf, f, indent=1)
            f.write("\n")
    if args.skip_mhc:
        rows_out(args, bw, rows)
        return 0

    # ---- mHC
    for n in (64, 8):
        residual, x, fn, scale, base, post, comb = M.make_inputs(n, M.HIDDEN, device=dev, seed=11)
        hc, d = 4, M.HIDDEN
        b_res, b_x, b_fn = n * hc * d * 2, n * d * 2, 24 * hc * d * 4
        for chunk, bd, nw in ((128, 16, 4), (64, 16, 4), (256, 16, 4), (128, 8, 4), (64, 8, 2), (128, 16, 8)):
            cfg = {"block_m": 16, "chunk_d": chunk, "block_d": bd, "num_warps": nw}
            try:
                f = graphed(lambda: M.mhc_pre(residual, fn, scale, base, 1e-6, 1e-6, config=cfg))
                t = t_us(f)
            except Exception as exc:  # noqa: BLE001
                print(f"mhc pre {cfg}: {type(exc).__name__} {exc}"[:300], flush=True)
                continue
            nbytes = b_res + b_fn + b_x
            r = {"kernel": "mhc_pre", "n": n, **cfg, "us": round(t, 2), "bound_us": round(nbytes / bw * 1e6, 2)}
            rows.append(r)
            print(r, flush=True)
        for chunk, bd, nw, bm in ((512, 512, 4, 1), (1024, 1024, 4, 1), (256, 256, 2, 1), (512, 256, 4, 2), (2048, 1024, 8, 1)):
            cfg = {"block_m": bm, "chunk_d": chunk, "block_d": bd, "num_warps": nw}
            try:
                f = graphed(lambda: M.mhc_post(x, residual, post, comb, config=cfg))
                t = t_us(f)
            except Exception as exc:  # noqa: BLE001
                print(f"mhc post {cfg}: {type(exc).__name__} {exc}"[:300], flush=True)
                continue
            nbytes = b_x + 2 * b_res
            r = {"kernel": "mhc_post", "n": n, **cfg, "us": round(t, 2), "bound_us": round(nbytes / bw * 1e6, 2)}
            rows.append(r)
            print(r, flush=True)
        for chunk, bd, nw in ((128, 8, 4), (64, 8, 4), (128, 8, 8), (256, 8, 4)):
            cfg = {"block_m": 16, "chunk_d": chunk, "block_d": bd, "num_warps": nw}
            try:
                f = graphed(lambda: M.mhc_post_pre(x, residual, post, comb, fn, scale, base, 1e-6, 1e-6, config=cfg))
                t = t_us(f)
            except Exception as exc:  # noqa: BLE001
                print(f"mhc fused {cfg}: {type(exc).__name__} {exc}"[:300], flush=True)
                continue
            nbytes = 2 * b_x + 2 * b_res + b_fn
            r = {"kernel": "mhc_post_pre", "n": n, **cfg, "us": round(t, 2), "bound_us": round(nbytes / bw * 1e6, 2)}
            rows.append(r)
            print(r, flush=True)
        # torch reference
        tr = t_us(lambda: (M.mhc_pre_torch(residual, fn, scale, base, 1e-6, 1e-6), M.mhc_post_torch(x, residual, post, comb)))
        rows.append({"kernel": "mhc_pre+post_torch", "n": n, "us": round(tr, 2)})
        print(rows[-1], flush=True)
    rows_out(args, bw, rows)
    return 0


def rows_out(args, bw, rows):
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_GBps": bw / 1e9, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
