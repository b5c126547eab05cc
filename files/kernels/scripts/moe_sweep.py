"""Time fragment-kernel launch variants (VARIANTS, on top of the shipped
config, one GEMM at a time; --both: also on both GEMMs at once) on the bench
cases, both bench figures (single call: CUDA-graph replay, L2 cleared; in
stream: the bench's input sets back to back in one graph; medians), each
checked against the reference first.

    PYTHONPATH=src python3 scripts/moe_sweep.py [--both | --only-both] [--key KEY] [--part GEMM] [--var JSON]
        [--top JSON] [--model NAME] [--device-name NAME] [batch ...]

--top merges whole-config keys ("dependent_launches", or a GEMM's keys under its name)
into the shipped config, one variant each; with --top and no --var only those
variants run.
"""
import argparse
import json

import torch
from triton.testing import do_bench

from sm120_kernels import fused_moe_w4a16 as M, moe_cases
from sm120_kernels.bench import stream_time_us
from sm120_kernels.configs import get_config
from sm120_kernels.models import MODELS, ep_share_routing
from sm120_kernels.registry import compare, graphed


# variants tried on top of the shipped config, one GEMM at a time: the keys
# they set (maxnreg: the register cap given to ptxas; with it ptxas issues a
# pipe step's loads before the step's MMAs instead of sinking them to the
# loop's end; scales_ahead: a pipe step decodes the next step's scales)
PIPE2 = {"pipe": True, "depth": 2}
VARIANTS = [{"pipe": True}, {"pipe": False}, {"depth": 1}, {"depth": 2}, {"depth": 3}, {"depth": 4},
            {"maxnreg": 128}, {"maxnreg": 168},
            {**PIPE2, "maxnreg": 128}, {**PIPE2, "maxnreg": 168}, {**PIPE2, "maxnreg": 128, "scales_ahead": True},
            {**PIPE2, "maxnreg": 168, "scales_ahead": True}, {**PIPE2, "scales_ahead": True}]


def with_variant(cfg: dict, var: dict) -> dict:
    """cfg with var's keys (scales_ahead only where the result pipes)."""
    out = {**cfg, **var}
    if not out["pipe"]:
        out.pop("scales_ahead", None)
    return out


def with_top(cfg: dict, top: dict) -> dict:
    """cfg with top's keys; a GEMM's keys (a dict under its name) merged into it."""
    return {**cfg, **{k: {**cfg[k], **v} if isinstance(v, dict) else v for k, v in top.items()}}


def label(var: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in var.items())


def main():
    ap = argparse.ArgumentParser(prog="scripts/moe_sweep.py")
    ap.add_argument("batches", nargs="*", type=int, default=[1, 8, 64])
    ap.add_argument("--both", action="store_true", help="also each variant on both GEMMs at once")
    ap.add_argument("--key", choices=sorted({k for v in VARIANTS for k in v}),
                    help="only the variants setting this key")
    ap.add_argument("--only-both", action="store_true", help="only the variants on both GEMMs at once")
    ap.add_argument("--part", choices=("gate_up", "down"), help="the variants on this GEMM only")
    ap.add_argument("--var", action="append", type=json.loads, metavar="JSON",
                    help='a variant to try instead of VARIANTS, e.g. \'{"maxnreg": 96}\' (repeatable)')
    ap.add_argument("--model", help="only the models whose name contains this")
    ap.add_argument("--top", action="append", type=json.loads, metavar="JSON", default=[],
                    help='whole-config keys, e.g. \'{"block_ready": true, "gate_up": {"direct_split": 2}}\' (repeatable)')
    ap.add_argument("--device-name", help="the config file of this device, not the local one's (e.g. 'NVIDIA H200')")
    args = ap.parse_args()
    dev = torch.device("cuda")
    variants_tried = [v for v in (args.var or ([] if args.top else VARIANTS)) if args.key is None or args.key in v]
    for model in MODELS:
        if args.model and args.model not in model.name:
            continue
        W = moe_cases._model_weights(model, dev)
        for b in args.batches:
            shipped = get_config(model.fmt, b, device_name=args.device_name)
            tw, ids, active = ep_share_routing(model, b, dev, seed=1000 + b)
            x = torch.randn((b, model.hidden), device=dev).to(torch.bfloat16)
            kw = dict(routed_scaling_factor=model.routed_scaling_factor, swiglu_limit=model.swiglu_limit)
            ref = M.moe_w4a16_reference(x, W, tw, ids, **kw)
            o = torch.empty_like(x)
            variants = [] if args.only_both else [
                (f"{part} {label(var)}", {**shipped, part: with_variant(shipped[part], var)})
                for part in ("gate_up", "down") if args.part in (None, part) for var in variants_tried]
            if args.both or args.only_both:
                variants += [(f"both {label(var)}", {**shipped, **{part: with_variant(shipped[part], var)
                                                                     for part in ("gate_up", "down")}})
                             for var in variants_tried]
            variants += [(f"top {json.dumps(top, separators=(',', ':'))}", with_top(shipped, top)) for top in args.top]
            for name, cfg in [("shipped", shipped)] + variants:
                if cfg == shipped and name != "shipped":
                    continue
                try:
                    out = M.fused_moe_w4a16(x, W, tw, ids, config=cfg, **kw)
                except Exception as ex:  # a variant that cannot launch (its error, and on to the next)
                    print(f"{model.name:18s} b{b:<3d} {name:52s} not run: {str(ex)[:120]}", flush=True)
                    continue
                res = compare(out, ref)
                replay = graphed(lambda cfg=cfg: M.fused_moe_w4a16(x, W, tw, ids, out=o, config=cfg, **kw), warmup=1)
                t = do_bench(replay, warmup=10, rep=80, return_mode="median") * 1e3
                del replay
                moe_cases._BENCH_CONFIG_OVERRIDE[(model.fmt, b)] = cfg
                spec = moe_cases._bench_moe(model, b)(dev)
                ts = stream_time_us(spec.stream_calls)[0]
                del spec
                moe_cases._BENCH_CONFIG_OVERRIDE.pop((model.fmt, b))
                print(f"{model.name:18s} b{b:<3d} {name:52s} {t:7.1f} us  in stream {ts:7.1f} us  "
                      f"{'ok' if res.ok else 'FAIL ' + res.detail}", flush=True)


if __name__ == "__main__":
    main()
