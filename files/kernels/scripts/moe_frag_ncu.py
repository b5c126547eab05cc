"""Run the fragment-packed MoE once per model at one batch (for ncu).

    PYTHONPATH=src ncu --clock-control none -k regex:_moe_frag python3 scripts/moe_frag_ncu.py [batch]
"""
import sys

import torch

from sm120_kernels import fused_moe_w4a16 as M
from sm120_kernels import fused_moe_w4a16_frag as F
from sm120_kernels.models import MODELS, ep_share_routing

b = int(sys.argv[1]) if len(sys.argv) > 1 else 64
dev = torch.device("cuda")
for model in MODELS[:1]:
    Wf = F.pack_weights(M._model_weights(model, dev))
    tw, ids, active = ep_share_routing(model, b, dev, seed=1000 + b)
    x = torch.randn((b, model.hidden), device=dev).to(torch.bfloat16)
    cfg = {"gate_up": {"NT": 1, "num_warps": 4, "pipe": True}, "down": {"NT": 1, "num_warps": 2, "pipe": True}}
    for _ in range(2):
        F.fused_moe_w4a16_frag(x, Wf, tw, ids, config=cfg, routed_scaling_factor=1.5, swiglu_limit=10.0)
    torch.cuda.synchronize()
