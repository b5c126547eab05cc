"""Per-kernel device times of one MoE call (torch.profiler), for the lent GPU.
Each of the 20 profiled calls routes the batch to other local experts (as
the bench's in-stream sets do), so the weights come from DRAM, not the L2.

    PYTHONPATH=src python3 scripts/moe_profile.py [batch ...]
"""
import sys

import torch

from sm120_kernels import fused_moe_w4a16 as M
from sm120_kernels.models import MODELS, ep_share_routing


def main():
    batches = [int(b) for b in sys.argv[1:]] or [1, 64]
    dev = torch.device("cuda")
    for model in MODELS:
        W = M._model_weights(model, dev)
        for b in batches:
            tw, ids, active = ep_share_routing(model, b, dev, seed=1000 + b)
            x = torch.randn((b, model.hidden), device=dev).to(torch.bfloat16)
            kw = dict(routed_scaling_factor=model.routed_scaling_factor, swiglu_limit=model.swiglu_limit)
            for _ in range(3):
                M.fused_moe_w4a16(x, W, tw, ids, **kw)
            torch.cuda.synchronize()
            shifted = [torch.where(ids >= 0, (ids + i * len(active)) % model.local_experts, ids) for i in range(20)]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for ids_i in shifted:
                    M.fused_moe_w4a16(x, W, tw, ids_i, **kw)
                torch.cuda.synchronize()
            print(f"## {model.name} batch {b} ({len(active)} active experts)")
            for ev in prof.key_averages():
                if ev.device_type == torch.autograd.DeviceType.CUDA and ev.count:
                    print(f"   {ev.key[:60]:60s} {ev.device_time_total / ev.count:8.1f} us x{ev.count // 20}")


if __name__ == "__main__":
    main()
