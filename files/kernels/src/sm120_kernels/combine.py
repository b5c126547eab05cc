"""The MoE's last launch: out[t] = rsf * the fp32 sum over token t's local
top-k slots of the down GEMM's rows, as bf16. The routed scaling factor is
applied here and only here."""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .formats import _to_bf16, interpreting


@triton.jit
def _combine_kernel(buf_ptr, ids_ptr, out_ptr, top_k, H, num_local, rsf,
                    stride_bm, stride_om, BLOCK_H: tl.constexpr, KP: tl.constexpr, INTERP: tl.constexpr,
                    WAIT_PRIOR: tl.constexpr = False):
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < H
    # the token's ids in one load, then all its local rows at once: two
    # dependent memory round trips, not two per slot (the ids are not the
    # previous kernel's output: loaded before its wait)
    j = tl.arange(0, KP)
    eid = tl.load(ids_ptr + t * top_k + j, mask=j < top_k, other=-1)
    if WAIT_PRIOR:  # a programmatic dependent launch: buf is the previous kernel's output
        tl.extra.cuda.gdc_wait()
    # slots routed to other ranks (-1 or out of range) contribute nothing
    local = (eid >= 0) & (eid < num_local)
    rows = (t * top_k + j).to(tl.int64)
    v = tl.load(buf_ptr + rows[:, None] * stride_bm + offs[None, :], mask=local[:, None] & mask[None, :], other=0.0)
    acc = tl.sum(v, axis=0)
    # the routed scaling factor is applied here, exactly once
    tl.store(out_ptr + t.to(tl.int64) * stride_om + offs, _to_bf16(acc * rsf, INTERP), mask=mask)


# the combine's columns per program (H200, batch 8: 512 measured faster than 1024)
COMBINE_BLOCK_H = 512


def combine(buf: torch.Tensor, topk_ids: torch.Tensor, num_local: int, routed_scaling_factor: float,
            out: Optional[torch.Tensor] = None, wait_prior: bool = False) -> torch.Tensor:
    """The last launch of both GEMM paths: out[t] = rsf * sum over token t's
    local top-k slots of the fp32 rows buf[t * k + j], as bf16. wait_prior: a
    programmatic dependent launch after a kernel that lets it start early."""
    T, k = topk_ids.shape
    H = buf.shape[1]
    if out is None:
        out = torch.empty((T, H), dtype=torch.bfloat16, device=buf.device)
    _combine_kernel[(T, triton.cdiv(H, COMBINE_BLOCK_H))](
        buf, topk_ids, out, k, H, num_local, float(routed_scaling_factor),
        buf.stride(0), out.stride(0), BLOCK_H=COMBINE_BLOCK_H, KP=triton.next_power_of_2(k), INTERP=interpreting(),
        WAIT_PRIOR=wait_prior, num_warps=4, **({"launch_pdl": True} if wait_prior else {}))
    return out

