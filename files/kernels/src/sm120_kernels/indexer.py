"""DeepSeek-V4 sparse-attention indexer: paged FP8 MQA logits and top-k.

What the datacenter kernels (DeepGEMM ``fp8_paged_mqa_logits``) compute, as
Triton kernels that compile for sm_120 (and run on any CUDA GPU Triton
supports with an FP8 ``tl.dot``: sm_89 and newer).

Layout (SGLang's DeepSeek-V4 C4 indexer cache):

* ``kv_cache``: one page per 64 tokens, 64 * 132 bytes: the 64 x 128 FP8 (e4m3)
  key values first, then the 64 fp32 per-token scales. Accepted as
  ``[num_pages, 64, 1, 132]`` or ``[num_pages, 8448]`` uint8 (or fp8).
* ``q``: ``[batch, next_n, 64, 128]`` FP8 e4m3.
* ``weights``: ``[batch * next_n, 64]`` fp32 (the q scale folded in).
* ``context_lens``: ``[batch]`` int32: query ``i`` of a request sees keys
  ``0 .. ctx - next_n + i`` (DeepGEMM's convention), or ``[batch, next_n]``:
  query ``i`` sees keys ``< context_lens[b, i]``.
* ``block_table``: ``[batch, max_pages]`` int32 page ids; entries past the
  context are never read (they may be -1).

``logits[b * next_n + i, s] = k_scale[s] * sum_h w[., h] * relu(q[b, i, h] . k[s])``
and ``-inf`` wherever ``s`` is past what the query sees (up to
``max_context_len`` columns, every column written).

``paged_mqa_logits_topk`` returns the indices (positions in the sequence) of
the ``topk`` largest logits of each row instead, in ascending position order,
``-1`` where a row has fewer than ``topk`` visible keys. It runs the logits
kernel into a scratch buffer and a radix-select top-k kernel over it (one
call; two launches).

Each kernel has its fp32 torch reference beside it (``*_ref``).
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch
import triton
import triton.language as tl

from .configs import register_cap

PAGE_SIZE = 64
HEAD_DIM = 128
NUM_HEADS = 64
TOPK = 512
PAGE_BYTES = PAGE_SIZE * (HEAD_DIM + 4)  # 8448

FP8 = torch.float8_e4m3fn

try:  # tl.histogram grew a mask argument; older Triton builds lack it
    import inspect as _inspect

    _HIST_HAS_MASK = "mask" in _inspect.signature(tl.histogram).parameters
except (TypeError, ValueError):  # pragma: no cover
    _HIST_HAS_MASK = False

# Defaults when no per-device config file has an entry (see configs.py / JSON).
DEFAULT_LOGITS_CONFIG = {"max_pages_per_prog": 8, "num_warps": 4, "num_stages": 3, "prefetch": True}
DEFAULT_LOGITS_N2_CONFIG = {"max_pages_per_prog": 8, "num_warps": 8, "num_stages": 3, "prefetch": True}
DEFAULT_TOPK_CONFIG = {"block": 2048, "num_warps": 8, "waves": 4}


# --------------------------------------------------------------------------
# Logits kernel
# --------------------------------------------------------------------------


@triton.jit
def _page_logits(q, qt, w, k, sc, NEXT_N: tl.constexpr, H: tl.constexpr, BN: tl.constexpr, SWAP: tl.constexpr):
    """``[NEXT_N, BN]`` logits of BN keys ``k`` (fp8 ``[BN, D]``) with scales ``sc``."""
    if SWAP:
        # keys as the MMA's M side: the head sum runs along N, inside each
        # warp (no cross-warp reduction per page)
        s = tl.dot(k, qt)  # [BN, M] fp32
        s = tl.maximum(s, 0.0) * w[None, :]
        s3 = tl.reshape(s, (BN, NEXT_N, H))
        logit = tl.trans(tl.sum(s3, axis=2) * sc[:, None])
    else:
        s = tl.dot(q, tl.trans(k))  # [M, BN] fp32
        s = tl.maximum(s, 0.0) * w[:, None]
        s3 = tl.reshape(s, (NEXT_N, H, BN))
        logit = tl.sum(s3, axis=1) * sc[None, :]
    return logit


@triton.jit
def _l2_prefetch_page(kv8_ptr, bt_row, p, p_stop, PAGE_U8: tl.constexpr):
    """Ask L2 for page p of the row (keys and scales, 66 lines of 128 B: one
    prefetch per 66 B), when p < p_stop. No registers wait for it."""
    if p < p_stop:
        page = tl.load(bt_row + p).to(tl.int64)
        ptrs = kv8_ptr + page * PAGE_U8 + tl.arange(0, 128) * (PAGE_U8 // 128)
        tl.inline_asm_elementwise(
            asm="prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", constraints="=r,l", args=[ptrs],
            dtype=tl.int32, is_pure=False, pack=1,
        )


@triton.jit
def _mqa_logits_kernel(
    q_ptr,
    kv8_ptr,
    kv32_ptr,
    w_ptr,
    ctx_ptr,
    bt_ptr,
    out_ptr,
    max_len,
    n_splits,
    stride_qb,
    stride_qn,
    stride_qh,
    stride_wr,
    stride_cb,
    stride_cn,
    stride_bt,
    stride_out,
    NEXT_N: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    CTX_2D: tl.constexpr,
    PREFETCH: tl.constexpr,
    PPI: tl.constexpr = 1,
    SWAP: tl.constexpr = False,
    L2_AHEAD: tl.constexpr = 0,
):
    """Program (b, sp): the logits of batch row b, split sp of the row's pages
    cut into n_splits near-equal runs (their lengths differ by at most one).
    L2_AHEAD > 0 (PPI 1): page p + L2_AHEAD is prefetched into L2 while page p
    is computed (inline PTX; not under the interpreter).

    Register count is sensitive to the order of this prologue: on the H200
    (Triton 3.6, sm_90a) SWAP with next_n 1 and L2_AHEAD 0 takes 71 registers
    here (the previous kernel: 64), 7 programs per SM instead of 8, so batch
    32 (1,024 programs) no longer runs in one wave: 61.8 instead of 48.9 us.
    With L2_AHEAD 1 (the H200 config) it is 64 again. sm_120 builds are not
    affected (same register counts as before for every shipped config)."""
    M: tl.constexpr = NEXT_N * H
    PAGE_U8: tl.constexpr = PAGE * (D + 4)
    PAGE_F32: tl.constexpr = PAGE_U8 // 4
    SCALE_F32: tl.constexpr = (PAGE * D) // 4
    BN: tl.constexpr = PPI * PAGE

    offs_m = tl.arange(0, M)
    offs_d = tl.arange(0, D)
    offs_t = tl.arange(0, PAGE)
    offs_n = tl.arange(0, NEXT_N)
    offs_j = tl.arange(0, BN)
    jp = offs_j // PAGE
    jt = offs_j % PAGE
    qn = offs_m // H
    qh = offs_m % H
    n_out_pages = tl.cdiv(max_len, PAGE)
    b = tl.program_id(0).to(tl.int64)
    sp = tl.program_id(1)
    q = tl.load(
        q_ptr + b * stride_qb + qn[:, None] * stride_qn + qh[:, None] * stride_qh + offs_d[None, :]
    )
    qt = tl.trans(q)  # [D, M] (SWAP)
    w = tl.load(w_ptr + (b * NEXT_N + qn) * stride_wr + qh)

    if CTX_2D:
        lens = tl.load(ctx_ptr + b * stride_cb + offs_n * stride_cn)
    else:
        ctx = tl.load(ctx_ptr + b * stride_cb)
        lens = ctx - NEXT_N + 1 + offs_n
    lens = tl.maximum(lens, 0)
    max_valid = tl.max(lens, axis=0)
    n_valid_pages = tl.cdiv(max_valid, PAGE)

    p_begin = (sp * n_out_pages) // n_splits
    p_end = ((sp + 1) * n_out_pages) // n_splits
    out_rows = out_ptr + (b * NEXT_N + offs_n).to(tl.int64)[:, None] * stride_out
    bt_row = bt_ptr + b * stride_bt

    # Pages that hold visible keys.
    p_stop = tl.minimum(p_end, n_valid_pages)
    if L2_AHEAD > 0 and PPI == 1:
        for a in range(1, L2_AHEAD):
            _l2_prefetch_page(kv8_ptr, bt_row, p_begin + a, p_stop, PAGE_U8)
    if PREFETCH and PPI == 1:
        # Register double buffering: the next page's keys are in flight while
        # this page's dot runs (the loop is not pipelined through shared
        # memory on sm_120, where the fp8 operand goes straight to registers).
        ok = p_begin < p_stop
        page = tl.load(bt_row + p_begin, mask=ok, other=0).to(tl.int64)
        k_nxt = tl.load(kv8_ptr + page * PAGE_U8 + offs_t[:, None] * D + offs_d[None, :], mask=ok, other=0.0)
        sc_nxt = tl.load(kv32_ptr + page * PAGE_F32 + SCALE_F32 + offs_t, mask=ok, other=0.0)
        for p in range(p_begin, p_stop):
            k = k_nxt
            sc = sc_nxt
            ok = p + 1 < p_stop
            page = tl.load(bt_row + p + 1, mask=ok, other=0).to(tl.int64)
            k_nxt = tl.load(kv8_ptr + page * PAGE_U8 + offs_t[:, None] * D + offs_d[None, :], mask=ok, other=0.0)
            sc_nxt = tl.load(kv32_ptr + page * PAGE_F32 + SCALE_F32 + offs_t, mask=ok, other=0.0)
            if L2_AHEAD > 0:
                _l2_prefetch_page(kv8_ptr, bt_row, p + L2_AHEAD, p_stop, PAGE_U8)
            logit = _page_logits(q, qt, w, k, sc, NEXT_N, H, PAGE, SWAP)  # [NEXT_N, PAGE]
            pos = p * PAGE + offs_t
            logit = tl.where(pos[None, :] < lens[:, None], logit, float("-inf"))
            tl.store(out_rows + pos[None, :], logit, mask=(pos[None, :] < max_len))
    else:
        # PPI pages (PPI * 64 keys) per dot
        for g in range(p_begin, p_stop, PPI):
            if PPI == 1:
                page = tl.load(bt_row + g).to(tl.int64)
                k = tl.load(kv8_ptr + page * PAGE_U8 + offs_t[:, None] * D + offs_d[None, :])
                sc = tl.load(kv32_ptr + page * PAGE_F32 + SCALE_F32 + offs_t)
                okp = offs_t >= 0
                if L2_AHEAD > 0:
                    _l2_prefetch_page(kv8_ptr, bt_row, g + L2_AHEAD, p_stop, PAGE_U8)
            else:
                pidx = g + jp
                okp = pidx < p_stop
                page = tl.load(bt_row + pidx, mask=okp, other=0).to(tl.int64)
                k = tl.load(kv8_ptr + page[:, None] * PAGE_U8 + jt[:, None] * D + offs_d[None, :], mask=okp[:, None], other=0.0)
                sc = tl.load(kv32_ptr + page * PAGE_F32 + SCALE_F32 + jt, mask=okp, other=0.0)
            logit = _page_logits(q, qt, w, k, sc, NEXT_N, H, BN, SWAP)  # [NEXT_N, BN]
            pos = g * PAGE + offs_j
            logit = tl.where(pos[None, :] < lens[:, None], logit, float("-inf"))
            tl.store(out_rows + pos[None, :], logit, mask=okp[None, :] & (pos[None, :] < max_len))

    # Columns past every query's context: -inf.
    neg = tl.full((NEXT_N, PAGE), float("-inf"), tl.float32)
    for p in range(tl.maximum(p_begin, n_valid_pages), p_end):
        pos = p * PAGE + offs_t
        tl.store(out_rows + pos[None, :], neg, mask=(pos[None, :] < max_len))


def _kv_views(kv_cache: torch.Tensor):
    if kv_cache.dtype not in (torch.uint8, FP8):
        raise TypeError(f"kv_cache must be uint8 or float8_e4m3fn, got {kv_cache.dtype}")
    num_pages = kv_cache.shape[0]
    if kv_cache.numel() != num_pages * PAGE_BYTES:
        raise ValueError(
            f"kv_cache must hold {PAGE_BYTES} bytes per page (64 tokens x 132 B), got shape {tuple(kv_cache.shape)}"
        )
    if kv_cache.stride(0) != PAGE_BYTES or not kv_cache[0].is_contiguous():
        raise ValueError("kv_cache pages must be contiguous, 8448 bytes apart")
    flat = kv_cache.view(torch.uint8).reshape(num_pages, PAGE_BYTES)
    return flat.view(FP8), flat.view(torch.float32)


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return _num_sms_cuda(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _num_sms_cuda(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _device_name(device: Optional[torch.device]) -> Optional[str]:
    if device is None or device.type != "cuda":
        return None
    return torch.cuda.get_device_name(device)


def _resolve_config(name: str, default: dict, config: Optional[dict], device=None) -> dict:
    if config is not None:
        return {**default, **config}
    from .configs import load_configs

    found = load_configs("indexer", _device_name(device)).get(name)
    return {**default, **(found or {})}


def paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    *,
    out: Optional[torch.Tensor] = None,
    config: Optional[dict] = None,
) -> torch.Tensor:
    """FP8 paged MQA logits, ``[batch * next_n, max_context_len]`` fp32."""
    batch, next_n, heads, dim = q.shape
    if dim != HEAD_DIM:
        raise ValueError(f"head dim must be {HEAD_DIM}, got {dim}")
    if next_n & (next_n - 1) or heads & (heads - 1):
        raise ValueError("next_n and the head count must be powers of two")
    if q.dtype != FP8:
        raise TypeError(f"q must be float8_e4m3fn, got {q.dtype}")
    if q.stride(-1) != 1:
        raise ValueError("q must be contiguous in its last dimension")
    rows = batch * next_n
    if weights.shape != (rows, heads):
        raise ValueError(f"weights must be {(rows, heads)}, got {tuple(weights.shape)}")
    weights = weights.float()
    if weights.stride(-1) != 1:
        weights = weights.contiguous()
    kv8, kv32 = _kv_views(kv_cache)
    ctx = context_lens.to(torch.int32)
    if ctx.dim() == 2 and ctx.shape[1] == 1 and next_n == 1:
        ctx = ctx[:, 0]
    ctx_2d = ctx.dim() == 2
    if ctx_2d and ctx.shape != (batch, next_n):
        raise ValueError(f"context_lens must be [batch] or [batch, next_n], got {tuple(ctx.shape)}")
    if not ctx_2d and ctx.shape != (batch,):
        raise ValueError(f"context_lens must be [batch] or [batch, next_n], got {tuple(ctx.shape)}")
    bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    if bt.stride(-1) != 1:
        bt = bt.contiguous()
    if out is None:
        out = torch.empty(rows, max_context_len, dtype=torch.float32, device=q.device)
    elif out.shape[0] != rows or out.shape[1] < max_context_len or out.stride(-1) != 1:
        raise ValueError("out must be [batch * next_n, >= max_context_len] with unit column stride")
    if rows == 0 or max_context_len == 0:
        return out

    if next_n == 1:
        cfg = _resolve_config("logits", DEFAULT_LOGITS_CONFIG, config, q.device)
    else:
        cfg = _resolve_config("logits_next_n2", DEFAULT_LOGITS_N2_CONFIG, config, q.device)
    n_out_pages = triton.cdiv(max_context_len, PAGE_SIZE)
    ppi = int(cfg.get("pages_per_iter", 1))
    if cfg.get("programs_per_sm"):
        # One wave with every SM equally loaded: programs_per_sm resident
        # programs per SM (what the kernel's registers allow), the rows' pages
        # split into near-equal runs among them.
        slots = int(cfg["programs_per_sm"]) * _num_sms(q.device)
        n_sp = max(1, min(n_out_pages, slots // batch))
    else:
        # Enough programs to fill the device about four times over; at most
        # max_pages_per_prog pages each.
        target = int(cfg.get("waves", 4)) * _num_sms(q.device)
        ppp = max(ppi, min(int(cfg["max_pages_per_prog"]), (batch * n_out_pages) // target))
        ppp = triton.cdiv(ppp, ppi) * ppi
        n_sp = triton.cdiv(n_out_pages, ppp)
    _mqa_logits_kernel[(batch, n_sp)](
        q,
        kv8,
        kv32,
        weights,
        ctx,
        bt,
        out,
        max_context_len,
        n_sp,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        weights.stride(0),
        ctx.stride(0),
        ctx.stride(1) if ctx_2d else 0,
        bt.stride(0),
        out.stride(0),
        NEXT_N=next_n,
        H=heads,
        D=dim,
        PAGE=PAGE_SIZE,
        CTX_2D=ctx_2d,
        PREFETCH=bool(cfg["prefetch"]),
        PPI=ppi,
        SWAP=bool(cfg.get("swap", False)),
        L2_AHEAD=0 if os.environ.get("TRITON_INTERPRET") == "1" else int(cfg.get("l2_ahead", 0)),
        num_warps=int(cfg["num_warps"]),
        num_stages=int(cfg["num_stages"]),
        **register_cap(cfg),
    )
    return out


def row_lengths(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """Visible keys per logits row, ``[batch * next_n]`` int32."""
    ctx = context_lens.to(torch.int32)
    if ctx.dim() == 2:
        return ctx.reshape(-1).clamp(min=0)
    offs = torch.arange(next_n, device=ctx.device, dtype=torch.int32)
    return (ctx[:, None] - next_n + 1 + offs[None, :]).reshape(-1).clamp(min=0)


# --------------------------------------------------------------------------
# Top-k (radix select over order-preserving 32-bit keys)
# --------------------------------------------------------------------------


@triton.jit
def _ordered_key(x):
    bits = x.to(tl.uint32, bitcast=True)
    neg = (bits >> 31) == 1
    return tl.where(neg, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@triton.jit
def _apply_hist(hrow, prefix, pmask, krem, SHIFT: tl.constexpr, NB: tl.constexpr):
    """Pick the bin holding the krem-th largest key from a finished histogram."""
    bins = tl.arange(0, NB)
    hist = tl.load(hrow + bins)
    total = tl.sum(hist, axis=0)
    ge = total - tl.cumsum(hist, axis=0) + hist  # elements with digit >= bin
    bstar = tl.sum((ge >= krem).to(tl.int32), axis=0) - 1
    greater = tl.sum(tl.where(bins > bstar, hist, 0), axis=0)
    bsel = tl.maximum(bstar, 0).to(tl.uint32)
    new_prefix = prefix | (bsel << SHIFT)
    new_mask = pmask | tl.full((), (NB - 1) << SHIFT, tl.uint32)
    return new_prefix, new_mask, krem - greater, total


@triton.jit
def _topk_pass_kernel(
    logits_ptr,
    len_ptr,
    hist_ptr,  # [rows, 3 * 2048] int32, zeroed
    cnt_ptr,  # [rows, SP, 4] int32: greater, equal, valid per chunk
    out_ptr,
    n_cols,
    chunk,
    stride_l,
    stride_o,
    K: tl.constexpr,
    PASS: tl.constexpr,
    SHIFT: tl.constexpr,
    NB: tl.constexpr,
    SP: tl.constexpr,
    BLOCK: tl.constexpr,
    HIST_MASK: tl.constexpr,
):
    """One step of a radix select spread over SP programs per row.
    PASS 0-2: histogram of the next 11/11/10 key bits among the keys that
    match the prefix so far (atomics into hist); PASS 3: per-chunk counts
    against the threshold; PASS 4: write the selected positions in order."""
    row = tl.program_id(0).to(tl.int64)
    sp = tl.program_id(1)
    length = tl.minimum(tl.load(len_ptr + row), n_cols)
    base = logits_ptr + row * stride_l
    hrow = hist_ptr + row * (3 * 2048)
    prefix = tl.zeros((), tl.uint32)
    pmask = tl.zeros((), tl.uint32)
    krem = tl.full((), K, tl.int32)
    total = tl.zeros((), tl.int32)
    if PASS >= 1:
        prefix, pmask, krem, total = _apply_hist(hrow, prefix, pmask, krem, 21, 2048)
    if PASS >= 2:
        prefix, pmask, krem, _t2 = _apply_hist(hrow + 2048, prefix, pmask, krem, 10, 2048)
    if PASS >= 3:
        prefix, pmask, krem, _t3 = _apply_hist(hrow + 4096, prefix, pmask, krem, 0, 1024)
    take_all = total <= K
    start = sp * chunk
    stop = tl.minimum(start + chunk, length)
    offs0 = tl.arange(0, BLOCK)
    if PASS < 3:
        if PASS > 0:
            stop = tl.where(take_all, start, stop)  # the row is taken whole
        hist = tl.zeros((NB,), tl.int32)
        for st in range(start, stop, BLOCK):
            offs = st + offs0
            inb = offs < stop
            x = tl.load(base + offs, mask=inb, other=float("-inf"))
            key = _ordered_key(x)
            valid = inb & (x != float("-inf")) & ((key & pmask) == prefix)
            digit = ((key >> SHIFT) & (NB - 1)).to(tl.int32)
            if HIST_MASK:
                hist += tl.histogram(digit, NB, mask=valid)
            else:
                # Invalid elements land in the upper half, which is dropped.
                h2 = tl.histogram(tl.where(valid, digit, NB + digit), 2 * NB)
                h2 = tl.reshape(h2, (2, NB))
                hist += tl.sum(tl.where(tl.arange(0, 2)[:, None] == 0, h2, 0), axis=0)
        bins = tl.arange(0, NB)
        tl.atomic_add(hrow + PASS * 2048 + bins, hist, mask=hist > 0, sem="relaxed")
    elif PASS == 3:
        n_gt = tl.zeros((), tl.int32)
        n_eq = tl.zeros((), tl.int32)
        n_va = tl.zeros((), tl.int32)
        for st in range(start, stop, BLOCK):
            offs = st + offs0
            inb = offs < stop
            x = tl.load(base + offs, mask=inb, other=float("-inf"))
            key = _ordered_key(x)
            valid = inb & (x != float("-inf"))
            n_gt += tl.sum((valid & (key > prefix)).to(tl.int32), axis=0)
            n_eq += tl.sum((valid & (key == prefix)).to(tl.int32), axis=0)
            n_va += tl.sum(valid.to(tl.int32), axis=0)
        cbase = cnt_ptr + (row * SP + sp) * 4
        tl.store(cbase + 0, n_gt)
        tl.store(cbase + 1, n_eq)
        tl.store(cbase + 2, n_va)
    else:
        obase = out_ptr + row * stride_o
        cs = tl.arange(0, SP)
        before = cs < sp
        cb = cnt_ptr + (row * SP + cs) * 4
        gt_c = tl.load(cb + 0, mask=before, other=0)
        eq_c = tl.load(cb + 1, mask=before, other=0)
        va_c = tl.load(cb + 2, mask=before, other=0)
        eq_before = tl.cumsum(eq_c, axis=0) - eq_c
        sel_c = gt_c + tl.minimum(tl.maximum(krem - eq_before, 0), eq_c)
        sel_c = tl.where(take_all, va_c, sel_c)
        n_sel = tl.sum(sel_c, axis=0)
        n_eq = tl.sum(eq_c, axis=0)
        thresh = prefix
        for st in range(start, stop, BLOCK):
            offs = st + offs0
            inb = offs < stop
            x = tl.load(base + offs, mask=inb, other=float("-inf"))
            key = _ordered_key(x)
            valid = inb & (x != float("-inf"))
            gt = valid & (key > thresh)
            eq = valid & (key == thresh)
            eq_i = eq.to(tl.int32)
            eq_rank = n_eq + tl.cumsum(eq_i, axis=0) - 1
            sel = tl.where(take_all, valid, gt | (eq & (eq_rank < krem)))
            sel_i = sel.to(tl.int32)
            pos = n_sel + tl.cumsum(sel_i, axis=0) - 1
            tl.store(obase + pos, offs.to(tl.int32), mask=sel)
            n_sel += tl.sum(sel_i, axis=0)
            n_eq += tl.sum(eq_i, axis=0)
        if sp == 0:
            for st in range(tl.minimum(total, K), K, BLOCK):
                offs = st + offs0
                tl.store(obase + offs, tl.full((BLOCK,), -1, tl.int32), mask=offs < K)


def topk_splits(rows: int, n_cols: int, block: int, waves: int, device) -> int:
    """Programs per row (a power of two): enough to fill the device ``waves``
    times, at most one per ``block`` columns."""
    want = max(1, (waves * _num_sms(device)) // max(rows, 1))
    sp = 1
    while sp * 2 <= min(want, 64, max(1, triton.cdiv(n_cols, block))):
        sp *= 2
    return sp


def topk_indices(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    topk: int = TOPK,
    *,
    out: Optional[torch.Tensor] = None,
    config: Optional[dict] = None,
) -> torch.Tensor:
    """Positions of the ``topk`` largest finite logits among the first
    ``lengths[r]`` columns of each row, ascending; ``-1`` padding.
    Ties at the threshold go to the lowest positions.

    Radix select over order-preserving 32-bit keys (11 + 11 + 10 bits), each
    row split over several programs: three histogram launches (atomics into a
    per-row histogram), one count launch, one write launch."""
    rows, n_cols = logits.shape
    if logits.dtype != torch.float32 or logits.stride(-1) != 1:
        raise ValueError("logits must be fp32 with unit column stride")
    if topk & (topk - 1):
        raise ValueError("topk must be a power of two")
    lengths = lengths.to(torch.int32).reshape(-1)
    if lengths.shape[0] != rows:
        raise ValueError("one length per row")
    if out is None:
        out = torch.empty(rows, topk, dtype=torch.int32, device=logits.device)
    if rows == 0:
        return out
    cfg = _resolve_config("topk", DEFAULT_TOPK_CONFIG, config, logits.device)
    block = int(cfg["block"])
    sp = int(cfg["splits"]) if "splits" in cfg else topk_splits(rows, n_cols, block, int(cfg.get("waves", 4)), logits.device)
    chunk = triton.cdiv(triton.cdiv(max(n_cols, 1), sp), block) * block
    hist = torch.zeros(rows, 3 * 2048, dtype=torch.int32, device=logits.device)
    cnt = torch.empty(rows, sp, 4, dtype=torch.int32, device=logits.device)
    for p, (shift, nb) in enumerate(((21, 2048), (10, 2048), (0, 1024), (0, 2048), (0, 2048))):
        _topk_pass_kernel[(rows, sp)](
            logits,
            lengths,
            hist,
            cnt,
            out,
            n_cols,
            chunk,
            logits.stride(0),
            out.stride(0),
            K=topk,
            PASS=p,
            SHIFT=shift,
            NB=nb,
            SP=sp,
            BLOCK=block,
            HIST_MASK=_HIST_HAS_MASK,
            num_warps=int(cfg["num_warps"]),
        )
    return out


def paged_mqa_logits_topk(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    topk: int = TOPK,
    *,
    scratch: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Top-``topk`` key positions per query row, ``[batch * next_n, topk]`` int32."""
    logits = paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len, out=scratch)
    lens = row_lengths(context_lens, q.shape[1])
    return topk_indices(logits, lens, topk, out=out)


# --------------------------------------------------------------------------
# SGLang adapter (same signature as the functions it replaces)
# --------------------------------------------------------------------------


def sglang_fp8_paged_mqa_logits(
    q_fp8: torch.Tensor,
    kvcache_fp8: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    deep_gemm_metadata=None,
    max_seq_len: int = 0,
    clean_logits: bool = True,
) -> torch.Tensor:
    """Drop-in for SGLang's ``tilelang_fp8_paged_mqa_logits`` /
    ``fp8_paged_mqa_logits_torch_sm120``: ``q_fp8 [rows, 1, H, D]``,
    ``seq_lens [rows]`` or ``[rows, 1]``; logits ``[rows, max_seq_len]`` with
    ``-inf`` past each row's length (a superset of ``clean_logits``)."""
    del deep_gemm_metadata, clean_logits
    if seq_lens.dim() == 2 and q_fp8.shape[1] == 1:
        seq_lens = seq_lens[:, 0]
    return paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, max_seq_len)


def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether these kernels take this call (else the caller keeps its own)."""
    return (
        q.is_cuda
        and q.dim() == 4
        and q.dtype == FP8
        and q.shape[-1] == HEAD_DIM
        and q.shape[1] in (1, 2, 4)
        and q.shape[2] in (16, 32, 64, 128)
        and kv_cache.dtype in (torch.uint8, FP8)
        and kv_cache.shape[0] * PAGE_BYTES == kv_cache.numel()
    )


def sglang_logits_covers(q_fp8, kvcache_fp8, weight, seq_lens, page_table) -> bool:
    """The SGLang call shapes ``sglang_fp8_paged_mqa_logits`` takes over:
    one query per row (SGLang folds next_n into the rows), ``weight [rows, H]``,
    ``seq_lens [rows]`` or ``[rows, 1]``, one page-table row per query row."""
    if not (isinstance(q_fp8, torch.Tensor) and supports(q_fp8, kvcache_fp8)):
        return False
    rows, next_n, heads = q_fp8.shape[:3]
    return (
        next_n == 1
        and rows > 0
        and kvcache_fp8.is_cuda
        and tuple(weight.shape) == (rows, heads)
        and seq_lens.shape[0] == rows
        and (seq_lens.dim() == 1 or tuple(seq_lens.shape) == (rows, 1))
        and page_table.dim() == 2
        and page_table.shape[0] == rows
    )


def sglang_logits_hook(
    original,
    q_fp8,
    kvcache_fp8,
    weight,
    seq_lens,
    page_table,
    deep_gemm_metadata=None,
    max_seq_len=0,
    clean_logits=True,
):
    """AROUND hook (sm120_kernels.plugin) for SGLang's
    ``tilelang_fp8_paged_mqa_logits`` and ``fp8_paged_mqa_logits_torch_sm120``:
    our kernel for the shapes it covers, SGLang's ``original`` otherwise."""
    if sglang_logits_covers(q_fp8, kvcache_fp8, weight, seq_lens, page_table):
        return sglang_fp8_paged_mqa_logits(
            q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len, clean_logits
        )
    return original(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len, clean_logits)


# --------------------------------------------------------------------------
# References (fp32 torch)
# --------------------------------------------------------------------------


def paged_mqa_logits_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
) -> torch.Tensor:
    """fp32 reference: dequantised keys, per row, masked to -inf."""
    batch, next_n, heads, dim = q.shape
    kv8, kv32 = _kv_views(kv_cache)
    lens = row_lengths(context_lens, next_n).tolist()
    out = torch.full((batch * next_n, max_context_len), float("-inf"), dtype=torch.float32, device=q.device)
    qf = q.float()
    bt = block_table.long()
    for b in range(batch):
        for i in range(next_n):
            r = b * next_n + i
            n = min(lens[r], max_context_len)
            if n <= 0:
                continue
            pages = bt[b, : triton.cdiv(n, PAGE_SIZE)]
            k = kv8[pages, : PAGE_SIZE * dim].float().reshape(-1, dim)[:n]
            sc = kv32[pages, PAGE_SIZE * dim // 4 :].reshape(-1)[:n]
            s = torch.relu(qf[b, i] @ k.T)  # [H, n]
            out[r, :n] = (weights[r].float()[:, None] * s).sum(0) * sc
    return out


def topk_ref(logits: torch.Tensor, lengths: torch.Tensor, topk: int = TOPK) -> torch.Tensor:
    """Reference top-k: sorted positions, -1 padded."""
    rows = logits.shape[0]
    out = torch.full((rows, topk), -1, dtype=torch.int32, device=logits.device)
    for r, n in enumerate(lengths.tolist()):
        row = logits[r, :n]
        finite = torch.nonzero(torch.isfinite(row)).flatten()
        if finite.numel() <= topk:
            idx = finite
        else:
            idx = torch.topk(row, topk).indices
        idx = torch.sort(idx).values
        out[r, : idx.numel()] = idx.to(torch.int32)
    return out


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - 2 sum(xy) / sum(x^2 + y^2), in float64."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    if denom == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denom)


def compare_logits(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Tolerance check of the issue: same -inf mask, calc_diff < 1e-3."""
    mask_out = torch.isneginf(out)
    mask_ref = torch.isneginf(ref)
    same_mask = bool(torch.equal(mask_out, mask_ref))
    finite = ~mask_ref
    diff = calc_diff(out[finite], ref[finite]) if finite.any() else 0.0
    has_nan = bool(torch.isnan(out).any())
    return {"same_mask": same_mask, "calc_diff": diff, "ok": same_mask and diff < 1e-3 and not has_nan}


def topk_overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of b's valid indices that a also holds (row by row, pooled)."""
    hit = total = 0
    for ra, rb in zip(a.tolist(), b.tolist()):
        sb = {i for i in rb if i >= 0}
        sa = {i for i in ra if i >= 0}
        hit += len(sa & sb)
        total += len(sb)
        if len(sa) != len(sb):
            total += abs(len(sa) - len(sb))
    return 1.0 if total == 0 else hit / total


# --------------------------------------------------------------------------
# Test data
# --------------------------------------------------------------------------


def quantize_kv(k: torch.Tensor) -> torch.Tensor:
    """[tokens_padded_to_pages, 128] float -> packed pages (per-token fp32 scale)."""
    n, dim = k.shape
    assert n % PAGE_SIZE == 0 and dim == HEAD_DIM
    amax = k.abs().float().amax(-1, keepdim=True).clamp(min=1e-4)
    sf = amax / 448.0
    kq = (k.float() / sf).to(FP8)
    pages = n // PAGE_SIZE
    packed = torch.empty(pages, PAGE_BYTES, dtype=torch.uint8, device=k.device)
    packed[:, : PAGE_SIZE * dim] = kq.view(torch.uint8).reshape(pages, PAGE_SIZE * dim)
    packed[:, PAGE_SIZE * dim :] = sf.reshape(pages, PAGE_SIZE).contiguous().view(torch.uint8)
    return packed


def make_inputs(
    batch: int,
    next_n: int,
    context_lens,
    *,
    heads: int = NUM_HEADS,
    extra_pages: int = 3,
    device="cpu",
    seed: int = 0,
    ctx_2d: bool = False,
):
    """Random q / weights, pages in shuffled order, -1 past each context."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ctx = torch.tensor(context_lens, dtype=torch.int32)
    if ctx_2d:
        max_ctx = int(ctx.max())
        need = [triton.cdiv(int(c.max()), PAGE_SIZE) for c in ctx]
    else:
        max_ctx = int(ctx.max())
        need = [triton.cdiv(int(c), PAGE_SIZE) for c in ctx]
    total_pages = sum(need) + extra_pages
    max_pages = triton.cdiv(max_ctx, PAGE_SIZE) + 1
    perm = torch.randperm(total_pages, generator=g)
    bt = torch.full((batch, max_pages), -1, dtype=torch.int32)
    used = 0
    for b in range(batch):
        bt[b, : need[b]] = perm[used : used + need[b]].to(torch.int32)
        used += need[b]
    k = torch.randn(total_pages * PAGE_SIZE, HEAD_DIM, generator=g)
    k = k * (0.5 + torch.rand(total_pages * PAGE_SIZE, 1, generator=g))
    kv = quantize_kv(k).reshape(total_pages, PAGE_SIZE, 1, HEAD_DIM + 4)
    q = (torch.randn(batch, next_n, heads, HEAD_DIM, generator=g) * 2).to(FP8)
    w = torch.randn(batch * next_n, heads, generator=g) * (HEAD_DIM**-0.5)
    return (
        q.to(device),
        kv.to(device),
        w.to(device),
        ctx.to(device),
        bt.to(device),
        max_ctx,
    )
