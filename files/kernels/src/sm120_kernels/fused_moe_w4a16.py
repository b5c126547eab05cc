"""The MoE forward (``fused_moe_w4a16``) and its torch reference.

Packed weights (every supported model) run on the fragment kernel:
  one token in 8-token blocks: two launches (each top-k slot its own block,
  the down GEMM sums the slots and applies the routed scaling factor);
  otherwise four: routing.moe_align ((token, slot) pairs sorted by expert,
  padded to the block), the gate/up GEMM with SiLU(gate) * up (optional swiglu
  clamp) into a bf16 intermediate, the down GEMM times the expert's global
  scale and the top-k weight into fp32 rows, and the combine.
Unpacked weights run the same four launches on the tensor-core GEMM. Every
launch is CUDA-graph safe.

The reference (``moe_w4a16_reference``) dequantises the weights to bf16 and
runs plain matmuls; the kernels must match it within the issue's tolerance.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import routing
from .combine import combine
from .configs import get_config
from .formats import dequant_reference
from .fused_moe_w4a16_frag import block_ready, dependent_down, dependent_launches, frag_gemm
from .gemm_tensor_core import TENSOR_CORE_CONFIG, gemm_tensor_core
from .weights import W4A16Weights, make_weights, random_weights

__all__ = ["fused_moe_w4a16", "moe_w4a16_reference", "make_weights", "random_weights", "W4A16Weights"]


def fused_moe_w4a16(
    x: torch.Tensor,
    weights: W4A16Weights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    routed_scaling_factor: float = 1.0,
    swiglu_limit: Optional[float] = None,
    config: Optional[dict] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """MoE forward for the local experts.

    x: [T, H] bf16. topk_ids: [T, k] local expert ids; ids < 0 or >= E (experts
    on other ranks, padding) contribute nothing. Returns [T, H] bf16 =
    rsf * sum_k w_k * expert_k(x) with the sum in fp32. config: packed weights
    {"gate_up": cfg, "down": cfg, ...} as in configs/*.json (default: the
    device's file); unpacked weights the tensor-core GEMM's tiles
    (default TENSOR_CORE_CONFIG).
    """
    T, H = x.shape
    assert H == weights.hidden, (H, weights.hidden)
    topk_ids = topk_ids.to(torch.int32).contiguous()
    topk_weights = topk_weights.float().contiguous()
    x = x.contiguous()
    if weights.packed:
        if x.data_ptr() % 16:  # a view at an odd offset: the kernel loads activations 16 bytes at a time
            x = x.clone()
        return _fragment_path(x, weights, topk_weights, topk_ids, routed_scaling_factor, swiglu_limit,
                              config or get_config(weights.fmt, T), out)
    return _tensor_core_path(x, weights, topk_weights, topk_ids, routed_scaling_factor, swiglu_limit,
                             config or TENSOR_CORE_CONFIG[weights.fmt], out)


def _fragment_path(x, weights, topk_weights, topk_ids, rsf, swiglu_limit, cfg, out):
    T, H = x.shape
    k = topk_ids.shape[1]
    E, I, fmt = weights.num_experts, weights.inter, weights.fmt
    bm = 8 * cfg["gate_up"]["NT"]
    assert cfg["down"]["NT"] * 8 == bm, "both GEMMs share one alignment"
    num_valid = T * k
    if T == 1 and bm == 8:
        # one token: each top-k slot is its own block (no alignment launch) and
        # the down GEMM sums the slots itself (no combine launch)
        ids = (topk_ids,) * 3
        inter = torch.empty((k * bm, I), dtype=torch.bfloat16, device=x.device)
        frag_gemm(x, weights.w13, weights.s13, weights.g13, inter, topk_weights, ids, k, I, fmt,
                  cfg["gate_up"], True, False, swiglu_limit, num_valid, direct=True,
                  launch_dependents=dependent_down(cfg["down"], weights.w2.shape[2], x.device),
                  scale_shift=weights.shift13)
        if out is None:
            out = torch.empty((T, H), dtype=torch.bfloat16, device=x.device)
        frag_gemm(inter, weights.w2, weights.s2, weights.g2, out, topk_weights, ids, k, H, fmt,
                  cfg["down"], False, True, None, num_valid, rsf=rsf, direct=True, scale_shift=weights.shift2)
        return out
    dep = dependent_launches(cfg, x.device)
    by_block = block_ready(cfg, dep, weights.w2.shape[2])
    align = routing.moe_align(topk_ids, E, bm, launch_dependents="gate_up" in dep, ready=by_block)
    ready = align[3] if by_block else None
    inter = torch.empty((align[0].shape[0], I), dtype=torch.bfloat16, device=x.device)
    frag_gemm(x, weights.w13, weights.s13, weights.g13, inter, topk_weights, align, k, I, fmt,
              cfg["gate_up"], True, False, swiglu_limit, num_valid, launch_dependents="down" in dep,
              wait_prior="gate_up" in dep, scale_shift=weights.shift13, ready=ready)
    buf = torch.empty((num_valid, H), dtype=torch.float32, device=x.device)
    frag_gemm(inter, weights.w2, weights.s2, weights.g2, buf, topk_weights, align, k, H, fmt,
              cfg["down"], False, True, None, num_valid, rsf=rsf, launch_dependents="combine" in dep,
              wait_prior="down" in dep, scale_shift=weights.shift2, ready=ready)
    return combine(buf, topk_ids, E, rsf, out, wait_prior="combine" in dep)


def _tensor_core_path(x, weights, topk_weights, topk_ids, rsf, swiglu_limit, cfg, out):
    T, H = x.shape
    k = topk_ids.shape[1]
    E, I = weights.num_experts, weights.inter
    assert weights.w2.shape[1] == H and weights.w2.shape[2] * 8 == I
    c1, c2 = cfg["gate_up"], cfg["down"]
    bm = c1["BLOCK_M"]
    assert c2["BLOCK_M"] == bm, "both GEMMs share one alignment"
    align = routing.moe_align(topk_ids, E, bm)
    inter = torch.empty((align[0].shape[0], I), dtype=torch.bfloat16, device=x.device)
    num_valid = T * k
    gemm_tensor_core(x, weights.w13, weights.s13, weights.g13, inter, topk_weights, align, k, I, H,
                     weights.fmt, c1, True, False, swiglu_limit, num_valid)
    buf = torch.empty((num_valid, H), dtype=torch.float32, device=x.device)
    gemm_tensor_core(inter, weights.w2, weights.s2, weights.g2, buf, topk_weights, align, k, H, I,
                     weights.fmt, c2, False, True, None, num_valid)
    return combine(buf, topk_ids, E, rsf, out)


def moe_w4a16_reference(
    x: torch.Tensor,
    weights: W4A16Weights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    routed_scaling_factor: float = 1.0,
    swiglu_limit: Optional[float] = None,
) -> torch.Tensor:
    """fused_moe_w4a16 in torch: weights dequantised to bf16, fp32 matmuls, the
    SiLU product rounded to bf16 as the kernels store it."""
    T, H = x.shape
    E, I = weights.num_experts, weights.inter
    acc = torch.zeros((T, H), dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    words13, words2 = weights.words("w13"), weights.words("w2")
    s13, s2 = weights.scales("s13"), weights.scales("s2")
    for e in torch.unique(ids).tolist():
        if e < 0 or e >= E:
            continue
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        w13 = dequant_reference(weights.fmt, words13[e], s13[e], weights.g13[e])
        w2 = dequant_reference(weights.fmt, words2[e], s2[e], weights.g2[e])
        h = x[tok].float() @ w13.float().t()
        gate, up = h[:, :I], h[:, I:]
        if swiglu_limit:
            gate = gate.clamp(max=swiglu_limit)
            up = up.clamp(min=-swiglu_limit, max=swiglu_limit)
        a = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
        y = a.float() @ w2.float().t()
        acc.index_add_(0, tok, y * topk_weights[tok, slot].float()[:, None])
    return (acc * routed_scaling_factor).to(torch.bfloat16)


