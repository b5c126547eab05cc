"""Run the MoE (fragment kernel, shipped H200 config) once per model at one
batch, for Nsight Compute:

    PYTHONPATH=src ncu --clock-control none -k regex:_moe_frag python3 scripts/moe_frag_ncu.py [batch] [model index] [JSON]

JSON: keys set on top of the shipped config (moe_sweep.with_top), e.g. '{"gate_up": {"bulk": 4, "depth": 2}}'.
"""
import json
import sys

import torch

from sm120_kernels import fused_moe_w4a16 as M
from sm120_kernels.configs import get_config
from sm120_kernels.models import MODELS, ep_share_routing

from moe_sweep import with_top

b = int(sys.argv[1]) if len(sys.argv) > 1 else 64
models = MODELS[int(sys.argv[2]):int(sys.argv[2]) + 1] if len(sys.argv) > 2 else MODELS[:1]
dev = torch.device("cuda")
for model in models:
    W = M._model_weights(model, dev)
    tw, ids, active = ep_share_routing(model, b, dev, seed=1000 + b)
    x = torch.randn((b, model.hidden), device=dev).to(torch.bfloat16)
    cfg = with_top(get_config(model.fmt, b), json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
    for _ in range(2):
        M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=model.routed_scaling_factor,
                          swiglu_limit=model.swiglu_limit, config=cfg)
    torch.cuda.synchronize()
