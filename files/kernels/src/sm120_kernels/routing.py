"""Routing for the W4A16 MoE: expert selection and the sorted/padded layout.

* ``biased_topk``: DeepSeek-V4's sqrtsoftplus top-k and the DeepSeek/Kimi
  sigmoid "noaux_tc" biased grouped top-k. Scores choose experts with the
  correction bias added; the weights are the unbiased scores of the chosen
  experts, optionally renormalised (sum + 1e-20, as SGLang) and optionally
  multiplied by the routed scaling factor. Ties go to the lower expert index
  (``tl.argmax(tie_break_left=True)``); the reference uses a stable descending
  sort, which breaks ties the same way. Output slots are in descending score
  order.
* ``moe_align``: (token, slot) pairs grouped by local expert, each expert's run
  padded to BLOCK_M, as the GEMM kernels consume them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SCORING = ("sigmoid", "sqrtsoftplus")
RENORM_EPS = 1e-20  # sglang.srt.layers.moe.topk._RENORMALIZE_SUM_EPSILON


# --------------------------------------------------------------------------
# Top-k selection
# --------------------------------------------------------------------------


@triton.jit
def _biased_topk_kernel(
    logits_ptr, bias_ptr, w_ptr, ids_ptr,
    E, stride_l, rsf,
    TOPK: tl.constexpr, SCORE: tl.constexpr, N_GROUP: tl.constexpr,
    TOPK_GROUP: tl.constexpr, RENORM: tl.constexpr, APPLY_RSF: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    # One program per token; experts laid out [N_GROUP, BLOCK_G] so that the
    # group scores (sum of each group's top two) are row reductions.
    t = tl.program_id(0)
    gi = tl.arange(0, N_GROUP)
    ci = tl.arange(0, BLOCK_G)
    epg = E // N_GROUP
    eidx = gi[:, None] * epg + ci[None, :]
    valid = ci[None, :] < epg
    x = tl.load(logits_ptr + t.to(tl.int64) * stride_l + eidx, mask=valid, other=0.0).to(tl.float32)
    if SCORE == 0:
        s = tl.sigmoid(x)
    else:
        # sqrt(softplus(x)); softplus as torch: x above 20, else log1p(exp(x)).
        y = tl.exp(x)
        u = 1.0 + y
        # log1p(y) without cancellation (Goldberg): exact where 1 + y rounds to 1
        lp = tl.where(u == 1.0, y, tl.log(u) * (y / (u - 1.0)))
        sp = tl.where(x > 20.0, x, lp)
        s = tl.sqrt(sp)
    b = tl.load(bias_ptr + eidx, mask=valid, other=0.0).to(tl.float32)
    neg_inf = float("-inf")
    c = tl.where(valid, s + b, neg_inf)
    if N_GROUP > 1:
        m1 = tl.max(c, axis=1)
        first = tl.argmax(c, axis=1, tie_break_left=True)
        c2 = tl.where(ci[None, :] == first[:, None], neg_inf, c)
        gscore = m1 + tl.max(c2, axis=1)
        keep = tl.zeros((N_GROUP,), dtype=tl.int1)
        for _ in tl.static_range(TOPK_GROUP):
            gsel = tl.argmax(gscore, axis=0, tie_break_left=True)
            keep = keep | (gi == gsel)
            gscore = tl.where(gi == gsel, neg_inf, gscore)
        c = tl.where(keep[:, None], c, neg_inf)
    cf = tl.reshape(c, (N_GROUP * BLOCK_G,))
    sf = tl.reshape(s, (N_GROUP * BLOCK_G,))
    ef = tl.reshape(eidx, (N_GROUP * BLOCK_G,))
    ko = tl.arange(0, TOPK)
    sel_w = tl.zeros((TOPK,), dtype=tl.float32)
    sel_i = tl.zeros((TOPK,), dtype=tl.int32)
    for j in tl.static_range(TOPK):
        # argmax over the flat [group, slot] layout; equal scores -> lowest
        # position, and positions increase with expert index.
        p = tl.argmax(cf, axis=0, tie_break_left=True)
        hit = tl.arange(0, N_GROUP * BLOCK_G) == p
        ev = tl.sum(tl.where(hit, ef, 0), axis=0)
        wv = tl.sum(tl.where(hit, sf, 0.0), axis=0)
        sel_w = tl.where(ko == j, wv, sel_w)
        sel_i = tl.where(ko == j, ev, sel_i)
        cf = tl.where(hit, neg_inf, cf)
    if RENORM:
        sel_w = sel_w / (tl.sum(sel_w, axis=0) + 1e-20)
    if APPLY_RSF:
        sel_w = sel_w * rsf
    tl.store(w_ptr + t * TOPK + ko, sel_w)
    tl.store(ids_ptr + t * TOPK + ko, sel_i)


def biased_topk(
    logits: torch.Tensor,
    bias: torch.Tensor,
    topk: int,
    *,
    scoring_func: str = "sqrtsoftplus",
    num_expert_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float | None = None,
    apply_routed_scaling_factor_on_output: bool = False,
):
    """-> (topk_weights fp32 [T, k], topk_ids int32 [T, k])."""
    assert scoring_func in SCORING
    T, E = logits.shape
    ng = max(int(num_expert_group or 1), 1)
    assert E % ng == 0 and (ng & (ng - 1)) == 0, "groups must be a power of two"
    assert triton.next_power_of_2(topk) == topk or True
    kp = triton.next_power_of_2(topk)
    w = torch.empty((T, kp), dtype=torch.float32, device=logits.device)
    ids = torch.empty((T, kp), dtype=torch.int32, device=logits.device)
    if T == 0:
        return w[:, :topk], ids[:, :topk]
    logits = logits.contiguous()
    if kp != topk:
        # non power-of-two k: select kp, renormalise over the first k outside
        _biased_topk_kernel[(T,)](
            logits, bias.contiguous(), w, ids, E, logits.stride(0), 1.0,
            TOPK=kp, SCORE=SCORING.index(scoring_func), N_GROUP=ng, TOPK_GROUP=int(topk_group or 1),
            RENORM=False, APPLY_RSF=False, BLOCK_G=triton.next_power_of_2(E // ng), num_warps=4)
        w, ids = w[:, :topk], ids[:, :topk].contiguous()
        if renormalize:
            w = w / (w.sum(dim=-1, keepdim=True) + RENORM_EPS)
        if apply_routed_scaling_factor_on_output and routed_scaling_factor is not None:
            w = w * routed_scaling_factor
        return w.contiguous(), ids
    _biased_topk_kernel[(T,)](
        logits, bias.contiguous(), w, ids, E, logits.stride(0), float(routed_scaling_factor or 1.0),
        TOPK=kp, SCORE=SCORING.index(scoring_func), N_GROUP=ng, TOPK_GROUP=int(topk_group or 1),
        RENORM=bool(renormalize),
        APPLY_RSF=bool(apply_routed_scaling_factor_on_output and routed_scaling_factor is not None),
        BLOCK_G=triton.next_power_of_2(E // ng), num_warps=4)
    return w, ids


def biased_topk_reference(
    logits, bias, topk, *, scoring_func="sqrtsoftplus", num_expert_group=1, topk_group=1,
    renormalize=True, routed_scaling_factor=None, apply_routed_scaling_factor_on_output=False,
):
    """SGLang's biased_grouped_topk_impl / biased_topk_impl math in fp32, with
    the tie rule made explicit (stable sort: lower index first)."""
    x = logits.float()
    if scoring_func == "sigmoid":
        s = x.sigmoid()
    else:
        s = torch.nn.functional.softplus(x).sqrt()
    T, E = s.shape
    c = s + bias.float()[None, :]
    ng = max(int(num_expert_group or 1), 1)
    if ng > 1:
        cg = c.view(T, ng, E // ng)
        top2 = torch.sort(cg, dim=-1, descending=True, stable=True)[0][..., :2].sum(-1)
        gidx = torch.sort(top2, dim=-1, descending=True, stable=True)[1][:, :topk_group]
        gmask = torch.zeros((T, ng), dtype=torch.bool, device=c.device)
        gmask.scatter_(1, gidx, True)
        c = c.masked_fill(~gmask.repeat_interleave(E // ng, dim=1), float("-inf"))
    ids = torch.sort(c, dim=-1, descending=True, stable=True)[1][:, :topk]
    w = s.gather(1, ids)
    if renormalize:
        w = w / (w.sum(dim=-1, keepdim=True) + RENORM_EPS)
    if apply_routed_scaling_factor_on_output and routed_scaling_factor is not None:
        w = w * routed_scaling_factor
    return w.float(), ids.to(torch.int32)


# --------------------------------------------------------------------------
# Alignment: sorted (token, slot) pairs, padded per expert to BLOCK_M
# --------------------------------------------------------------------------


def align_capacity(n_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound on padded rows: every pair, plus (block_m - 1) of padding for
    each expert that can be non-empty."""
    return n_pairs + min(n_pairs, num_experts) * (block_m - 1)


@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, expert_ids_ptr, num_post_ptr, ready_ptr,
                  n, E, CAP,
                  BLOCK: tl.constexpr, E_BINS: tl.constexpr, BLOCK_M: tl.constexpr,
                  INIT_BLOCK: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr = False,
                  READY: tl.constexpr = False):
    # Single program: decode-sized inputs (n <= 8192 pairs).
    if LAUNCH_DEPENDENTS:  # the GEMM after it may launch now (it waits for this kernel's outputs)
        tl.extra.cuda.gdc_launch_dependents()
    offs = tl.arange(0, BLOCK)
    inb = offs < n
    e = tl.load(ids_ptr + offs, mask=inb, other=-1)
    local = inb & (e >= 0) & (e < E)
    eb = tl.where(local, e, E)  # E = "not here" bin, sorted last
    counts = tl.histogram(eb, E_BINS)
    bins = tl.arange(0, E_BINS)
    counts = tl.where(bins < E, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_start = tl.cumsum(padded, axis=0) - padded
    raw_start = tl.cumsum(counts, axis=0) - counts
    tl.store(num_post_ptr, tl.sum(padded, axis=0))
    # unused rows point past the last pair: the GEMMs mask them out
    for i in range(0, tl.cdiv(CAP, INIT_BLOCK)):
        o = i * INIT_BLOCK + tl.arange(0, INIT_BLOCK)
        tl.store(sorted_ptr + o, n + tl.zeros_like(o), mask=o < CAP)
        if READY:  # the blocks' ready counts (moe_align's ready) start at zero
            tl.store(ready_ptr + o, tl.zeros_like(o), mask=o < CAP // BLOCK_M)
    tl.debug_barrier()  # the fill lands before the scatter below writes over it (other threads, same rows)
    # stable order inside an expert: sort by (expert, pair index)
    key = eb * BLOCK + offs
    sk = tl.sort(key)
    se = sk // BLOCK
    sidx = sk % BLOCK
    pos = tl.arange(0, BLOCK)
    ok = se < E
    se_c = tl.where(ok, se, 0)
    # each pair's expert starts, gathered in registers (no round trip through memory)
    ps = tl.where(ok, tl.gather(pad_start, se_c, 0), 0)
    rs = tl.where(ok, tl.gather(raw_start, se_c, 0), 0)
    dest = ps + (pos - rs)
    tl.store(sorted_ptr + dest, sidx, mask=ok)
    tl.store(expert_ids_ptr + dest // BLOCK_M, se, mask=ok)


def moe_align_reference(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """Torch version (also the path for inputs too large for one program)."""
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    cap = align_capacity(n, num_experts, block_m)
    dev = flat.device
    local = (flat >= 0) & (flat < num_experts)
    eb = torch.where(local, flat, torch.full_like(flat, num_experts))
    order = torch.sort(eb * max(n, 1) + torch.arange(n, device=dev), stable=True)[1]
    counts = torch.bincount(eb, minlength=num_experts + 1)[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    pad_start = torch.cumsum(padded, 0) - padded
    raw_start = torch.cumsum(counts, 0) - counts
    se = eb[order]
    ok = se < num_experts
    se_c = torch.where(ok, se, torch.zeros_like(se))
    dest = pad_start[se_c] + torch.arange(n, device=dev) - raw_start[se_c]
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=dev)
    max_blocks = max(cap // block_m, 1)
    expert_ids = torch.zeros((max_blocks,), dtype=torch.int32, device=dev)
    dest_ok = torch.where(ok, dest, torch.full_like(dest, cap))
    sorted_ids = torch.cat([sorted_ids, sorted_ids.new_zeros(1)])
    sorted_ids.scatter_(0, dest_ok, order.to(torch.int32))
    sorted_ids = sorted_ids[:cap]
    blk = torch.where(ok, dest // block_m, torch.full_like(dest, max_blocks))
    expert_ids = torch.cat([expert_ids, expert_ids.new_zeros(1)])
    expert_ids.scatter_(0, blk, se.to(torch.int32))
    expert_ids = expert_ids[:max_blocks]
    num_post = padded.sum().reshape(1).to(torch.int32)
    return sorted_ids, expert_ids, num_post


MAX_ALIGN_PAIRS = 8192


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int, launch_dependents: bool = False,
              ready: bool = False):
    """-> (sorted_ids [cap] int32, expert_ids [cap // block_m] int32,
    num_tokens_post_padded [1] int32). Rows past num_post hold the sentinel n.
    launch_dependents: the next launch (a programmatic dependent one) may start
    at once. ready: also a zeroed int32 count per block [cap // block_m] (the
    fragment kernel's block_ready: the gate/up GEMM counts a block's finished
    row tiles there, and the down GEMM starts on a block once all are in)."""
    n = topk_ids.numel()
    if n > MAX_ALIGN_PAIRS or n == 0:
        out = moe_align_reference(topk_ids, num_experts, block_m)
        return out + (torch.zeros_like(out[1]),) if ready else out
    flat = topk_ids.reshape(-1).to(torch.int32).contiguous()
    cap = align_capacity(n, num_experts, block_m)
    dev = flat.device
    sorted_ids = torch.empty((cap,), dtype=torch.int32, device=dev)
    expert_ids = torch.empty((max(cap // block_m, 1),), dtype=torch.int32, device=dev)
    num_post = torch.empty((1,), dtype=torch.int32, device=dev)
    counts = torch.empty_like(expert_ids) if ready else num_post
    e_bins = triton.next_power_of_2(num_experts + 1)
    block = max(triton.next_power_of_2(n), 16)
    _align_kernel[(1,)](flat, sorted_ids, expert_ids, num_post, counts, n, num_experts, cap,
                        BLOCK=block, E_BINS=e_bins, BLOCK_M=block_m, INIT_BLOCK=1024,
                        LAUNCH_DEPENDENTS=launch_dependents, READY=ready, num_warps=4 if block <= 1024 else 8)
    return (sorted_ids, expert_ids, num_post, counts) if ready else (sorted_ids, expert_ids, num_post)
