"""One token under tensor parallelism (TP4: every expert on every GPU with a
quarter of the intermediate size, so all top-k slots are local), A/B on the
local GPU: the four-launch path against the two-launch one-token path, in the
shipped launch shapes and with the slots shared by 2 gate/up programs; in-stream time
(calls back to back in one CUDA graph over 8 routings, twice the L2) and single
call, each checked against the reference first.

    PYTHONPATH=src python3 scripts/moe_tp_ab.py
"""
import torch
from triton.testing import do_bench

from sm120_kernels import fused_moe_w4a16 as M
from sm120_kernels.bench import stream_time_us
from sm120_kernels.configs import get_config
from sm120_kernels.registry import graphed
from sm120_kernels.models import MODELS
from sm120_kernels.registry import compare


def main():
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(5)
    for model in MODELS:
        E, inter = model.experts, model.inter // 4
        W = M.random_weights(model.fmt, E, model.hidden, inter, dev, seed=9, kn=model.fmt == "int4")
        kw = dict(routed_scaling_factor=model.routed_scaling_factor, swiglu_limit=model.swiglu_limit)
        sets = []
        for _ in range(8):
            ids = torch.randperm(E, generator=g)[: model.top_k].view(1, -1).to(torch.int32).to(dev)
            tw = (torch.rand((1, model.top_k), generator=g) + 0.1).to(dev)
            x = torch.randn((1, model.hidden), generator=g).to(torch.bfloat16).to(dev)
            sets.append((x, tw, ids, torch.empty_like(x)))
        shipped = get_config(model.fmt, 1)
        variants = [("four launches", dict(shipped, direct=False)),
                    ("two launches (shipped)", shipped),
                    ("two launches, slots shared by 2",
                     dict(shipped, gate_up=dict(shipped["gate_up"], direct_split=2)))]
        x, tw, ids, _ = sets[0]
        ref = M.moe_w4a16_reference(x, W, tw, ids, **kw)
        for name, cfg in variants:
            res = compare(M.fused_moe_w4a16(x, W, tw, ids, config=cfg, **kw), ref)
            calls = [lambda s=s, cfg=cfg: M.fused_moe_w4a16(s[0], W, s[1], s[2], out=s[3], config=cfg, **kw)
                     for s in sets]
            single = do_bench(graphed(calls[0]), warmup=25, rep=200, return_mode="median") * 1e3
            stream = stream_time_us(calls)[0]
            print(f"{model.name:18s} TP4 b1 {name:34s} {res.detail:26s} {'ok' if res.ok else 'FAIL'}  "
                  f"single {single:6.2f} us  in stream {stream:6.2f} us", flush=True)
        del W
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
