"""One token, A/B on the local GPU: the four-launch path (alignment, gate/up,
down, combine) and the two-launch path (each top-k slot its own block, the
combine summed by the down GEMM) in the shipped shapes (split 0: the grid
rule) and with the token's slots split over k, 3 or 2 gate/up programs per
row tile; both timings of
the bench (single call and in stream), each checked against the reference.

    PYTHONPATH=src python3 scripts/moe_direct_ab.py
"""
import torch
from triton.testing import do_bench

from sm120_kernels import fused_moe_w4a16 as M
from sm120_kernels.bench import stream_time_us
from sm120_kernels.configs import get_config
from sm120_kernels.models import MODELS, ep_share_routing
from sm120_kernels.registry import compare


def main():
    dev = torch.device("cuda")
    for model in MODELS:
        W = M._model_weights(model, dev)
        kw = dict(routed_scaling_factor=model.routed_scaling_factor, swiglu_limit=model.swiglu_limit)
        shipped = get_config(model.fmt, 1)
        for direct, split in ((False, 0), (True, 0), (True, model.top_k), (True, 3), (True, 2)):
            cfg = dict(shipped, direct=direct)
            if split:
                cfg["gate_up"] = dict(cfg["gate_up"], direct_split=split)
            for mode in ("ep8", "all-local"):
                if mode == "ep8":
                    tw, ids, _ = ep_share_routing(model, 1, dev, seed=1001)
                else:
                    ids = torch.randperm(model.local_experts)[: model.top_k].view(1, -1).to(torch.int32).to(dev)
                    tw = torch.rand((1, model.top_k), device=dev) + 0.1
                x = torch.randn((1, model.hidden), device=dev).to(torch.bfloat16)
                res = compare(M.fused_moe_w4a16(x, W, tw, ids, config=cfg, **kw), M.moe_w4a16_reference(x, W, tw, ids, **kw))
                M._BENCH_CONFIG_OVERRIDE[(model.fmt, 1)] = cfg
                if mode == "ep8":
                    spec = M._bench_moe(model, 1)(dev)
                    single = do_bench(spec.fn, warmup=25, rep=200, return_mode="median") * 1e3
                    stream = stream_time_us(spec.stream_calls)[0]
                    times = f"single {single:6.2f} us  in stream {stream:6.2f} us"
                else:
                    times = ""
                print(f"{model.name:18s} b1 {mode:9s} direct={int(direct)} split={split} {res.detail:28s} "
                      f"{'ok' if res.ok else 'FAIL'}  {times}", flush=True)
                M._BENCH_CONFIG_OVERRIDE.pop((model.fmt, 1), None)


if __name__ == "__main__":
    main()
