"""DeepSeek-V4 mHC (manifold-constrained hyper-connections) as Triton kernels.

hc_mult streams (4) of the residual, ``residual [n, 4, D]`` bf16.

* ``mhc_pre``: ``mixes = (flatten(residual) @ fn.T) * rsqrt(mean(x^2) + rms_eps)``
  (one skinny GEMM, N = 24, fp32), then
  ``pre = sigmoid(mixes[0:4] * s0 + b[0:4]) + eps``,
  ``post = 2 * sigmoid(mixes[4:8] * s1 + b[4:8])``,
  ``comb = softmax_row(mixes[8:24].view(4, 4) * s2 + b[8:24]) + eps``, then a
  column normalisation and ``iters - 1`` (row, column) Sinkhorn rounds, each
  with ``+eps`` in the denominator: columns of ``comb`` sum to 1;
  ``y = sum_k pre[k] * residual[k]``. Returns ``(y, post, comb)``.
* ``mhc_post``: ``out[j] = post[j] * x + sum_k comb[k, j] * residual[k]``.
* ``mhc_post_pre``: the post of one sublayer fused with the pre of the next
  (the new residual is written once and the next GEMM reads it on the fly).

The same math as SGLang's ``_mhc_pre_torch`` / ``_mhc_post_torch`` and the
TileLang ``hc_split_sinkhorn_kernel``; ``*_ref`` below are fp32 torch
references. Pre for decode batches (n <= 64 by default) is one launch: a
split-K GEMM whose fp32 partial sums go to a reduction buffer by atomics, a
grid barrier, then the collapse and the Sinkhorn of each row (see
``_mhc_pre_fused_kernel``); larger batches take two launches (split-K GEMM
with the post fused in when asked; then reduce + Sinkhorn + collapse). One
launch for post; post+pre for decode batches is post then the one-launch pre.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

HC_MULT = 4
SINKHORN_ITERS = 20
HIDDEN = 4096  # DeepSeek-V4-Flash
POST_MULT = 2.0

DEFAULT_STAGE1_CONFIG = {"block_m": 16, "chunk_d": 64, "block_d": 16, "num_warps": 4}
DEFAULT_FUSED_CONFIG = {"block_m": 16, "chunk_d": 64, "block_d": 8, "num_warps": 4}
DEFAULT_FINISH_CONFIG = {"block_d": 1024, "num_warps": 4}
DEFAULT_POST_CONFIG = {"block_m": 1, "chunk_d": 512, "block_d": 512, "num_warps": 4}
# one-launch pre for decode batches (n <= max_rows): row blocks of block_m,
# columns per program: the smallest power of two >= min_cols that keeps the
# grid within one program per SM; GEMM in sub-blocks of block_d columns,
# a loop Triton pipelines with pipe stages (0: unrolled); the fp32 atomics of
# the split-K reduction go to `replicas` copies of the buffer (fewer atomics
# per address: same-address atomics serialise in L2); from large_rows rows
# on, the entries of "large" replace these
DEFAULT_PRE_FUSED_CONFIG = {"max_rows": 64, "block_m": 16, "min_cols": 32, "block_d": 32, "num_warps": 4, "pipe": 3,
                            "replicas": 4, "large_rows": 33,
                            "large": {"block_m": 64, "block_d": 16, "pipe": 0, "replicas": 8}}


@triton.jit
def _round_bf16(x):
    """fp32 rounded to the nearest bf16 (ties to even), still as fp32: the
    later cast is then exact on every backend (Triton's interpreter truncates)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _pdl_prologue(PDL: tl.constexpr):
    """Programmatic dependent launch (launched with launch_pdl): wait until
    the previous kernel in the stream has finished and its writes are visible
    (before this kernel reads or writes anything), then let the next kernel's
    programs launch: its launch overlaps this kernel instead of following it."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _mhc_stage1_kernel(
    x_ptr,  # residual in [n, HC, D] bf16
    y_ptr,  # layer output [n, D] bf16 (DO_POST)
    post_ptr,  # [n, HC] fp32 (DO_POST)
    comb_ptr,  # [n, HC, HC] fp32 (DO_POST)
    res_ptr,  # new residual [n, HC, D] bf16 (DO_POST)
    fn_ptr,  # [MIX, HC * D] fp32 (DO_GEMM)
    part_ptr,  # [n_chunks, n, MIXP] fp32 (DO_GEMM)
    sq_ptr,  # [n_chunks, n] fp32 (DO_GEMM)
    n,
    D,
    stride_xn,
    stride_xk,
    stride_yn,
    stride_pn,
    stride_cn,
    stride_rn,
    stride_fn,
    HC: tl.constexpr,
    MIX: tl.constexpr,
    MIXP: tl.constexpr,
    BM: tl.constexpr,
    CHUNK: tl.constexpr,
    BD: tl.constexpr,
    DO_POST: tl.constexpr,
    DO_GEMM: tl.constexpr,
    DOT_BF16: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_prologue(PDL)
    pid_m = tl.program_id(0)
    pid_d = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < n
    rows64 = rows.to(tl.int64)
    hk = tl.arange(0, HC)
    mix = tl.arange(0, MIXP)

    if DO_POST:
        post = tl.load(post_ptr + rows64[:, None] * stride_pn + hk[None, :], mask=rmask[:, None], other=0.0)
        # comb[m, k, j]
        comb = tl.load(
            comb_ptr + rows64[:, None, None] * stride_cn + hk[None, :, None] * HC + hk[None, None, :],
            mask=rmask[:, None, None],
            other=0.0,
        )
    if DO_GEMM:
        acc = tl.zeros((BM, MIXP), tl.float32)
        sq = tl.zeros((BM,), tl.float32)

    for dd in tl.static_range(0, CHUNK, BD):
        cols = pid_d * CHUNK + dd + tl.arange(0, BD)
        cmask = cols < D
        m3 = rmask[:, None, None] & cmask[None, None, :]
        x = tl.load(
            x_ptr + rows64[:, None, None] * stride_xn + hk[None, :, None] * stride_xk + cols[None, None, :],
            mask=m3,
            other=0.0,
        ).to(tl.float32)  # [BM, HC, BD]
        if DO_POST:
            yv = tl.load(
                y_ptr + rows64[:, None] * stride_yn + cols[None, :],
                mask=rmask[:, None] & cmask[None, :],
                other=0.0,
            ).to(tl.float32)  # [BM, BD]
            # r[m, j, d] = post[m, j] * y[m, d] + sum_k comb[m, k, j] * x[m, k, d]
            mixed = tl.sum(comb[:, :, :, None] * x[:, :, None, :], axis=1)
            r = _round_bf16(post[:, :, None] * yv[:, None, :] + mixed).to(tl.bfloat16)
            tl.store(
                res_ptr + rows64[:, None, None] * stride_rn + hk[None, :, None] * D + cols[None, None, :],
                r,
                mask=m3,
            )
            r = r.to(tl.float32)
        else:
            r = x
        if DO_GEMM:
            acc, sq = _gemm_tile(r, fn_ptr, cols, D, stride_fn, acc, sq, HC, MIX, MIXP, BD, DOT_BF16)

    if DO_GEMM:
        pbase = part_ptr + (pid_d * n + rows64) * MIXP
        tl.store(pbase[:, None] + mix[None, :], acc, mask=rmask[:, None])
        tl.store(sq_ptr + pid_d * n + rows64, sq, mask=rmask)


@triton.jit
def _mhc_finish_kernel(
    x_ptr,  # residual [n, HC, D] bf16 (the one the GEMM saw)
    part_ptr,
    sq_ptr,
    scale_ptr,  # [3] fp32
    base_ptr,  # [MIX] fp32
    outs,  # (y [n, D] bf16, contiguous; post [n, HC] fp32; comb [n, HC, HC] fp32): _pre_outputs
    mix_args,  # (1 / (HC * D), rms_eps, hc_eps, post_mult): _pre_outputs
    n,
    D,
    n_chunks,
    stride_xn,
    stride_xk,
    HC: tl.constexpr,
    MIXP: tl.constexpr,
    NCH: tl.constexpr,
    ITERS: tl.constexpr,
    BD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_prologue(PDL)
    y_ptr, post_ptr, comb_ptr = outs
    inv_k, rms_eps, hc_eps, post_mult = mix_args
    t = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    hk = tl.arange(0, HC)
    s = tl.arange(0, NCH)
    smask = s < n_chunks
    pbase = part_ptr + (s * n + t) * MIXP

    sq = tl.sum(tl.load(sq_ptr + s * n + t, mask=smask, other=0.0), axis=0)
    rs = 1.0 / tl.sqrt(sq * inv_k + rms_eps)
    s0 = tl.load(scale_ptr + 0)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)

    pre_raw = tl.sum(tl.load(pbase[:, None] + hk[None, :], mask=smask[:, None], other=0.0), axis=0)
    post_raw = tl.sum(tl.load(pbase[:, None] + HC + hk[None, :], mask=smask[:, None], other=0.0), axis=0)
    comb_raw = tl.sum(
        tl.load(
            pbase[:, None, None] + 2 * HC + hk[None, :, None] * HC + hk[None, None, :],
            mask=smask[:, None, None],
            other=0.0,
        ),
        axis=0,
    )  # [HC, HC]

    pre = tl.sigmoid(pre_raw * rs * s0 + tl.load(base_ptr + hk)) + hc_eps
    post = post_mult * tl.sigmoid(post_raw * rs * s1 + tl.load(base_ptr + HC + hk))
    c = comb_raw * rs * s2 + tl.load(base_ptr + 2 * HC + hk[:, None] * HC + hk[None, :])
    c = tl.exp(c - tl.max(c, axis=1)[:, None])
    c = c / tl.sum(c, axis=1)[:, None] + hc_eps
    c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
    for _ in tl.static_range(ITERS - 1):
        c = c / (tl.sum(c, axis=1)[:, None] + hc_eps)
        c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)

    if pid_d == 0:
        tl.store(post_ptr + t * HC + hk, post)
        tl.store(comb_ptr + t * HC * HC + hk[:, None] * HC + hk[None, :], c)

    cols = pid_d * BD + tl.arange(0, BD)
    cmask = cols < D
    x = tl.load(
        x_ptr + t * stride_xn + hk[:, None] * stride_xk + cols[None, :],
        mask=cmask[None, :],
        other=0.0,
    ).to(tl.float32)
    y = tl.sum(pre[:, None] * x, axis=0)
    tl.store(y_ptr + t * D + cols, _round_bf16(y).to(tl.bfloat16), mask=cmask)


@triton.jit
def _rcp(t, ASM: tl.constexpr):
    """1 / t: rcp.approx.ftz.f32 (one MUFU instruction, relative error below
    2^-23; t >= eps here, never subnormal) where ASM, else a division (the
    interpreter cannot run PTX)."""
    if ASM:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [t], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / t


@triton.jit
def _norm4(a, b, c, d, eps, ASM: tl.constexpr):
    # one reciprocal and four products: the 20 Sinkhorn rounds are bound by
    # their instruction issue, and four divisions took 173 instructions a round
    r = _rcp((a + b) + (c + d) + eps, ASM)
    return a * r, b * r, c * r, d * r


@triton.jit
def _softmax4(a, b, c, d, eps):
    m = tl.maximum(tl.maximum(a, b), tl.maximum(c, d))
    a = tl.exp(a - m)
    b = tl.exp(b - m)
    c = tl.exp(c - m)
    d = tl.exp(d - m)
    t = a + b + c + d
    return tl.math.fdiv(a, t) + eps, tl.math.fdiv(b, t) + eps, tl.math.fdiv(c, t) + eps, tl.math.fdiv(d, t) + eps


@triton.jit
def _ld_sum(p, RSZ: tl.constexpr, R: tl.constexpr):
    """Sum of the R replicas p, p + RSZ, ... (independent loads, L2 only)."""
    v = tl.load(p, cache_modifier=".cg")
    for i in tl.static_range(1, R):
        v += tl.load(p + i * RSZ, cache_modifier=".cg")
    return v


@triton.jit
def _ld_sum_m(p, mask, RSZ: tl.constexpr, R: tl.constexpr):
    v = tl.load(p, mask=mask, other=0.0, cache_modifier=".cg")
    for i in tl.static_range(1, R):
        v += tl.load(p + i * RSZ, mask=mask, other=0.0, cache_modifier=".cg")
    return v


@triton.jit
def _mhc_row_mix(
    pr,  # this row's reduced mixes (MIX values, then the sum of squares)
    scale_ptr,
    base_ptr,
    outs,  # (y, post, comb); post and comb are written here
    row,
    mix_args,  # (1 / (HC * D), rms_eps, hc_eps, post_mult)
    ITERS: tl.constexpr,
    HC: tl.constexpr,
    MIX: tl.constexpr,
    RSZ: tl.constexpr,
    R: tl.constexpr,
    ASM: tl.constexpr,
):
    """post and the Sinkhorn comb of one row. The 4 x 4 matrix is held as 16
    scalars, so no step needs a cross-thread reduction (the old finish
    kernel spent most of its time in those)."""
    post_ptr = outs[1]
    comb_ptr = outs[2]
    inv_k, rms_eps, hc_eps, post_mult = mix_args
    hk = tl.arange(0, HC)
    rs = 1.0 / tl.sqrt(_ld_sum(pr + MIX, RSZ, R) * inv_k + rms_eps)
    praw = _ld_sum(pr + HC + hk, RSZ, R)
    s2 = tl.load(scale_ptr + 2) * rs
    cb = base_ptr + 2 * HC
    q = pr + 2 * HC
    c00 = _ld_sum(q + 0, RSZ, R) * s2 + tl.load(cb + 0)
    c01 = _ld_sum(q + 1, RSZ, R) * s2 + tl.load(cb + 1)
    c02 = _ld_sum(q + 2, RSZ, R) * s2 + tl.load(cb + 2)
    c03 = _ld_sum(q + 3, RSZ, R) * s2 + tl.load(cb + 3)
    c10 = _ld_sum(q + 4, RSZ, R) * s2 + tl.load(cb + 4)
    c11 = _ld_sum(q + 5, RSZ, R) * s2 + tl.load(cb + 5)
    c12 = _ld_sum(q + 6, RSZ, R) * s2 + tl.load(cb + 6)
    c13 = _ld_sum(q + 7, RSZ, R) * s2 + tl.load(cb + 7)
    c20 = _ld_sum(q + 8, RSZ, R) * s2 + tl.load(cb + 8)
    c21 = _ld_sum(q + 9, RSZ, R) * s2 + tl.load(cb + 9)
    c22 = _ld_sum(q + 10, RSZ, R) * s2 + tl.load(cb + 10)
    c23 = _ld_sum(q + 11, RSZ, R) * s2 + tl.load(cb + 11)
    c30 = _ld_sum(q + 12, RSZ, R) * s2 + tl.load(cb + 12)
    c31 = _ld_sum(q + 13, RSZ, R) * s2 + tl.load(cb + 13)
    c32 = _ld_sum(q + 14, RSZ, R) * s2 + tl.load(cb + 14)
    c33 = _ld_sum(q + 15, RSZ, R) * s2 + tl.load(cb + 15)
    post = post_mult * tl.sigmoid(praw * rs * tl.load(scale_ptr + 1) + tl.load(base_ptr + HC + hk))
    tl.store(post_ptr + row * HC + hk, post)
    # softmax over each row (comb[k, :]) + eps, then a column normalisation
    c00, c01, c02, c03 = _softmax4(c00, c01, c02, c03, hc_eps)
    c10, c11, c12, c13 = _softmax4(c10, c11, c12, c13, hc_eps)
    c20, c21, c22, c23 = _softmax4(c20, c21, c22, c23, hc_eps)
    c30, c31, c32, c33 = _softmax4(c30, c31, c32, c33, hc_eps)
    c00, c10, c20, c30 = _norm4(c00, c10, c20, c30, hc_eps, ASM)
    c01, c11, c21, c31 = _norm4(c01, c11, c21, c31, hc_eps, ASM)
    c02, c12, c22, c32 = _norm4(c02, c12, c22, c32, hc_eps, ASM)
    c03, c13, c23, c33 = _norm4(c03, c13, c23, c33, hc_eps, ASM)
    for _ in range(ITERS - 1):
        c00, c01, c02, c03 = _norm4(c00, c01, c02, c03, hc_eps, ASM)
        c10, c11, c12, c13 = _norm4(c10, c11, c12, c13, hc_eps, ASM)
        c20, c21, c22, c23 = _norm4(c20, c21, c22, c23, hc_eps, ASM)
        c30, c31, c32, c33 = _norm4(c30, c31, c32, c33, hc_eps, ASM)
        c00, c10, c20, c30 = _norm4(c00, c10, c20, c30, hc_eps, ASM)
        c01, c11, c21, c31 = _norm4(c01, c11, c21, c31, hc_eps, ASM)
        c02, c12, c22, c32 = _norm4(c02, c12, c22, c32, hc_eps, ASM)
        c03, c13, c23, c33 = _norm4(c03, c13, c23, c33, hc_eps, ASM)
    cp = comb_ptr + row * (HC * HC)
    tl.store(cp + 0, c00)
    tl.store(cp + 1, c01)
    tl.store(cp + 2, c02)
    tl.store(cp + 3, c03)
    tl.store(cp + 4, c10)
    tl.store(cp + 5, c11)
    tl.store(cp + 6, c12)
    tl.store(cp + 7, c13)
    tl.store(cp + 8, c20)
    tl.store(cp + 9, c21)
    tl.store(cp + 10, c22)
    tl.store(cp + 11, c23)
    tl.store(cp + 12, c30)
    tl.store(cp + 13, c31)
    tl.store(cp + 14, c32)
    tl.store(cp + 15, c33)


@triton.jit
def _gemm_tile(r, fn_ptr, cols, D, stride_fn, acc, sq,
               HC: tl.constexpr, MIX: tl.constexpr, MIXP: tl.constexpr, BD: tl.constexpr, DOT_BF16: tl.constexpr):
    """acc += r [BM, HC, BD] (bf16-exact fp32) x the fn^T tile of columns cols;
    sq += the rows' sums of squares of r."""
    hk = tl.arange(0, HC)
    mix = tl.arange(0, MIXP)
    cmask = cols < D
    sq += tl.sum(tl.sum(r * r, axis=2), axis=1)
    # fn^T tile: [HC, BD, MIXP] -> [HC * BD, MIXP]; K index = k * D + col
    f = tl.load(
        fn_ptr + mix[None, None, :] * stride_fn + hk[:, None, None] * D + cols[None, :, None],
        mask=(mix[None, None, :] < MIX) & cmask[None, :, None],
        other=0.0,
    )
    # fp32 fn as bf16 hi + lo on the tensor cores: r is bf16-exact (the
    # residual), so two bf16 products give ~16 mantissa bits of fn.
    f2 = tl.reshape(f, (HC * BD, MIXP))
    if DOT_BF16:
        f_hi = f2.to(tl.bfloat16)
        f_lo = (f2 - f_hi.to(tl.float32)).to(tl.bfloat16)
        r2 = tl.reshape(r, (r.shape[0], HC * BD)).to(tl.bfloat16)
        acc = tl.dot(r2, f_hi, acc)
        acc = tl.dot(r2, f_lo, acc)
    else:  # Triton's interpreter: its bf16 dot is wrong; plain fp32
        acc = tl.dot(tl.reshape(r, (r.shape[0], HC * BD)), f2, acc, input_precision="ieee")
    return acc, sq


@triton.jit
def _pre_gemm_step(x_ptr, fn_ptr, rows64, rmask, c0, D, stride_xn, stride_xk, stride_fn, acc, sq,
                   HC: tl.constexpr, MIX: tl.constexpr, MIXP: tl.constexpr, BD: tl.constexpr, DOT_BF16: tl.constexpr):
    """One [BM, HC * BD] x [HC * BD, MIXP] step of the pre GEMM (+ sums of squares)."""
    hk = tl.arange(0, HC)
    cols = c0 + tl.arange(0, BD)
    r = tl.load(
        x_ptr + rows64[:, None, None] * stride_xn + hk[None, :, None] * stride_xk + cols[None, None, :],
        mask=rmask[:, None, None] & (cols < D)[None, None, :],
        other=0.0,
    ).to(tl.float32)  # [BM, HC, BD]
    return _gemm_tile(r, fn_ptr, cols, D, stride_fn, acc, sq, HC, MIX, MIXP, BD, DOT_BF16)


@triton.jit
def _mhc_pre_fused_kernel(
    x_ptr,  # residual [n, HC, D] bf16
    fn_ptr,  # [MIX, HC * D] fp32
    scale_ptr,  # [3] fp32
    base_ptr,  # [MIX] fp32
    red_ptr,  # workspace [2, RED_ROWS, MIXP] fp32: mixes (+ sum of squares in column MIX), zero at rest
    sync_ptr,  # workspace [2] int32: arrivals, generation (its parity picks the buffer)
    outs,  # (y [n, D] bf16, contiguous; post [n, HC] fp32; comb [n, HC, HC] fp32): _pre_outputs
    mix_args,  # (1 / (HC * D), rms_eps, hc_eps, post_mult): _pre_outputs
    n,
    D,
    stride_xn,
    stride_xk,
    stride_fn,
    HC: tl.constexpr,
    MIX: tl.constexpr,
    MIXP: tl.constexpr,
    BM: tl.constexpr,
    CW: tl.constexpr,
    BD: tl.constexpr,
    GK: tl.constexpr,
    RED_ROWS: tl.constexpr,
    R: tl.constexpr,  # replicas of the buffer the atomics go to (program kj adds into kj % R)
    RMAX: tl.constexpr,  # replicas allocated (the parity stride)
    ITERS: tl.constexpr,
    PHASE: tl.constexpr,  # 3: one launch (grid barrier); 1 then 2: two launches (interpreter)
    DOT_BF16: tl.constexpr,
    PIPE: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    """The whole mHC pre in one launch for decode batches. Program (rg, kj)
    owns rows [rg*BM, rg*BM+BM) and columns [kj*CW, kj*CW+CW) of each stream:
    its split-K GEMM tile (+ sums of squares) is added into the buffer of
    this call (fp32 atomics); a grid barrier (every program is resident: the
    grid is at most one program per SM); then each program collapses its
    own columns with the reduced pre mixes, and program kj gets post and the
    Sinkhorn comb of rows kj, kj+GK, ... of its group.

    Two buffers alternate with the barrier generation: while one is
    accumulated, the programs zero the other one for the next call, so both
    are clean at rest without a memset launch."""
    _pdl_prologue(PDL)
    y_ptr = outs[0]
    inv_k, rms_eps, hc_eps, post_mult = mix_args
    rg = tl.program_id(0)
    kj = tl.program_id(1)
    pid = rg * GK + kj
    nprog = tl.num_programs(0) * GK
    rows = rg * BM + tl.arange(0, BM)
    rmask = rows < n
    rows64 = rows.to(tl.int64)
    hk = tl.arange(0, HC)
    mix = tl.arange(0, MIXP)
    col0 = kj * CW
    cnt = sync_ptr
    gen = sync_ptr + 1
    RSZ: tl.constexpr = RED_ROWS * MIXP
    RED: tl.constexpr = RMAX * RSZ
    if PHASE == 3:
        g0 = tl.atomic_add(gen, 0, sem="acquire")
        cur = g0 & 1
    else:
        cur = 0
    red = red_ptr + cur * RED

    if PHASE % 2 == 1:
        acc = tl.zeros((BM, MIXP), tl.float32)
        sq = tl.zeros((BM,), tl.float32)
        if PIPE > 0:  # a loop Triton pipelines (num_stages): sub-blocks' loads in flight together
            for dd in range(0, CW, BD):
                acc, sq = _pre_gemm_step(x_ptr, fn_ptr, rows64, rmask, col0 + dd, D, stride_xn, stride_xk, stride_fn,
                                         acc, sq, HC, MIX, MIXP, BD, DOT_BF16)
        else:
            for dd in tl.static_range(0, CW, BD):
                acc, sq = _pre_gemm_step(x_ptr, fn_ptr, rows64, rmask, col0 + dd, D, stride_xn, stride_xk, stride_fn,
                                         acc, sq, HC, MIX, MIXP, BD, DOT_BF16)
        acc = tl.where(mix[None, :] == MIX, sq[:, None], acc)
        tl.atomic_add(
            red + (kj % R) * RSZ + rows[:, None] * MIXP + mix[None, :],
            acc,
            mask=rmask[:, None] & (mix[None, :] <= MIX),
            sem="relaxed",
        )
        if PHASE == 3:
            # clear this program's share of the other buffer (the next call's)
            ZB: tl.constexpr = 64
            other = red_ptr + (1 - cur) * RED
            for z in range(pid * ZB, RED, nprog * ZB):
                tl.store(other + z + tl.arange(0, ZB), tl.zeros((ZB,), tl.float32))

    # this program's columns for the collapse (in flight across the barrier)
    cols = col0 + tl.arange(0, CW)
    cmask = cols < D
    xc = tl.load(
        x_ptr + rows64[:, None, None] * stride_xn + hk[None, :, None] * stride_xk + cols[None, None, :],
        mask=rmask[:, None, None] & cmask[None, None, :],
        other=0.0,
    )

    if PHASE == 3:
        # grid barrier (sense reversal: the last to arrive resets the count
        # and bumps the generation)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt, 1, sem="acq_rel")
        if arrived == nprog - 1:
            tl.atomic_xchg(cnt, 0, sem="relaxed")
            tl.atomic_add(gen, 1, sem="release")
        else:
            g = tl.atomic_add(gen, 0, sem="acquire")
            while g == g0:
                g = tl.atomic_add(gen, 0, sem="acquire")
        tl.debug_barrier()

    if PHASE >= 2:
        pr = red + rows[:, None] * MIXP
        sq = _ld_sum_m(red + rows * MIXP + MIX, rmask, RSZ, R)
        praw = _ld_sum_m(pr + hk[None, :], rmask[:, None], RSZ, R)  # [BM, HC]
        rs = 1.0 / tl.sqrt(sq * inv_k + rms_eps)
        pre = tl.sigmoid(praw * rs[:, None] * tl.load(scale_ptr) + tl.load(base_ptr + hk)[None, :]) + hc_eps
        y = tl.sum(pre[:, :, None] * xc.to(tl.float32), axis=1)  # [BM, CW]
        tl.store(
            y_ptr + rows64[:, None] * D + cols[None, :],
            _round_bf16(y).to(tl.bfloat16),
            mask=rmask[:, None] & cmask[None, :],
        )
        for rr in range(kj, BM, GK):
            row = rg * BM + rr
            if row < n:
                _mhc_row_mix(
                    red + row * MIXP,
                    scale_ptr, base_ptr, outs, row.to(tl.int64), mix_args, ITERS, HC, MIX, RSZ, R, PHASE == 3,
                )


def _resolve(name: str, default: dict, config: Optional[dict], device=None) -> dict:
    """Explicit config, else configs/mhc-<device>.json, else mhc-default.json."""
    if config is not None:
        return {**default, **config}
    from .configs import load_configs
    from .indexer import _device_name

    found = load_configs("mhc", _device_name(device)).get(name)
    return {**default, **(found or {})}


def _pdl_meta(device, kernel: str, cfg: dict, n: int) -> dict:
    """Launch options for programmatic dependent launch (PDL: the kernel waits
    for the previous kernel in its prologue, so its launch overlaps that
    kernel's tail) when the kernel's config entry says "pdl" and n is at most
    its "pdl_max_rows" (sm_90 and newer, not under the interpreter).
    SM120_MHC_PDL overrides: 0, 1, or the config entries to launch so,
    comma-separated (any n)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or device.type != "cuda":
        return {}
    env = os.environ.get("SM120_MHC_PDL")
    if env is not None:
        on = env == "1" or kernel in env.split(",")
    else:
        on = bool(cfg.get("pdl", False)) and n <= int(cfg.get("pdl_max_rows", 1 << 30))
    if not on or torch.cuda.get_device_capability(device)[0] < 9:
        return {}
    return {"PDL": True, "launch_pdl": True}


def _check_residual(residual: torch.Tensor):
    if residual.dim() != 3 or residual.dtype != torch.bfloat16:
        raise ValueError(f"residual must be [n, hc, D] bf16, got {tuple(residual.shape)} {residual.dtype}")
    if residual.stride(2) != 1 or residual.stride(1) != residual.shape[2]:
        raise ValueError("residual rows must be contiguous [hc, D]")


def _stage1(
    residual,
    fn,
    *,
    x=None,
    post=None,
    comb=None,
    config=None,
):
    n, hc, d = residual.shape
    do_post = x is not None
    do_gemm = fn is not None
    if do_gemm and do_post:
        kind, default = "stage1_fused", DEFAULT_FUSED_CONFIG
    elif do_gemm:
        kind, default = "stage1", DEFAULT_STAGE1_CONFIG
    else:
        kind, default = "post", DEFAULT_POST_CONFIG
    cfg = _resolve(kind, default, config, residual.device)
    bm, chunk, bd = int(cfg["block_m"]), int(cfg["chunk_d"]), int(cfg["block_d"])
    if do_gemm:
        # one row block for decode batches, so fn is read once
        bm = min(max(16, triton.next_power_of_2(n)), max(bm, 16))
    n_chunks = triton.cdiv(d, chunk)
    dev = residual.device
    res_out = torch.empty_like(residual) if do_post else residual
    mix = fn.shape[0] if do_gemm else 2 * hc + hc * hc
    mixp = max(16, triton.next_power_of_2(mix))
    part = torch.empty(n_chunks, n, mixp, dtype=torch.float32, device=dev) if do_gemm else residual
    sq = torch.empty(n_chunks, n, dtype=torch.float32, device=dev) if do_gemm else residual
    if do_post:
        post = post.reshape(n, hc).float()
        comb = comb.reshape(n, hc, hc).float()
        if x.stride(-1) != 1:
            x = x.contiguous()
        post = post.contiguous()
        comb = comb.contiguous()
    if do_gemm:
        if fn.dtype != torch.float32 or fn.stride(-1) != 1:
            fn = fn.float().contiguous()
        if fn.shape[1] != hc * d:
            raise ValueError(f"fn must be [{mix}, {hc * d}]")
    grid = (triton.cdiv(n, bm), n_chunks)
    _mhc_stage1_kernel[grid](
        residual,
        x if do_post else residual,
        post if do_post else part,
        comb if do_post else part,
        res_out,
        fn if do_gemm else part,
        part,
        sq,
        n,
        d,
        residual.stride(0),
        residual.stride(1),
        x.stride(0) if do_post else 0,
        post.stride(0) if do_post else 0,
        comb.stride(0) if do_post else 0,
        res_out.stride(0),
        fn.stride(0) if do_gemm else 0,
        HC=hc,
        MIX=mix,
        MIXP=mixp,
        BM=bm,
        CHUNK=chunk,
        BD=bd,
        DO_POST=do_post,
        DO_GEMM=do_gemm,
        DOT_BF16=os.environ.get("TRITON_INTERPRET") != "1",
        num_warps=int(cfg["num_warps"]),
        **_pdl_meta(dev, kind, cfg, n),
    )
    return res_out, part, sq, n_chunks


def _pre_outputs(residual, rms_eps, hc_eps, post_mult):
    """What both pre kernels take as their ``outs`` and ``mix_args`` tuples:
    (y [n, D] bf16 contiguous, post [n, hc] fp32, comb [n, hc, hc] fp32), new,
    and (1 / (hc * D), rms_eps, hc_eps, post_mult)."""
    n, hc, d = residual.shape
    dev = residual.device
    outs = (
        torch.empty(n, d, dtype=torch.bfloat16, device=dev),
        torch.empty(n, hc, dtype=torch.float32, device=dev),
        torch.empty(n, hc, hc, dtype=torch.float32, device=dev),
    )
    return outs, (1.0 / (hc * d), float(rms_eps), float(hc_eps), float(post_mult))


def _finish(residual, part, sq, n_chunks, hc_scale, hc_base, rms_eps, hc_eps, iters, post_mult, config=None):
    n, hc, d = residual.shape
    cfg = _resolve("finish", DEFAULT_FINISH_CONFIG, None, residual.device)
    bd = min(int(cfg["block_d"]), triton.next_power_of_2(d))
    outs, mix_args = _pre_outputs(residual, rms_eps, hc_eps, post_mult)
    _mhc_finish_kernel[(n, triton.cdiv(d, bd))](
        residual,
        part,
        sq,
        hc_scale.float().contiguous(),
        hc_base.float().contiguous(),
        outs,
        mix_args,
        n,
        d,
        n_chunks,
        residual.stride(0),
        residual.stride(1),
        HC=hc,
        MIXP=part.shape[2],
        NCH=triton.next_power_of_2(n_chunks),
        ITERS=int(iters),
        BD=bd,
        num_warps=int(cfg["num_warps"]),
        **_pdl_meta(residual.device, "finish", cfg, n),
    )
    return outs


_WORKSPACE: dict = {}
_RED_ROWS = 256  # rows the one-launch pre covers at most (config max_rows)
_RED_REPLICAS = 8  # most replicas of the reduction buffer (config "replicas")


def _workspace(device):
    """Per-device buffers and barrier words of the one-launch pre, allocated
    once and kept for the life of the process (CUDA graphs hold their
    addresses): zero at rest, each call leaves them so. Calls on one device
    must not run concurrently on two streams."""
    key = (device.type, device.index if device.index is not None else torch.cuda.current_device())
    ws = _WORKSPACE.get(key)
    if ws is None:
        red = torch.zeros(2 * _RED_REPLICAS * _RED_ROWS * 32, dtype=torch.float32, device=device)
        sync = torch.zeros(2, dtype=torch.int32, device=device)
        ws = _WORKSPACE[key] = (red, sync)
    return ws


def _effective_cfg(n: int, cfg: dict) -> dict:
    """The pre_fused entries for n rows ("large" from large_rows rows on)."""
    if "large" in cfg and n >= int(cfg.get("large_rows", 1 << 30)):
        return {**cfg, **cfg["large"]}
    return cfg


def _fused_shape(n: int, d: int, sms: int, cfg: dict):
    """(BM, CW, BD, GK, groups) of the one-launch pre, or None when n is past
    max_rows or the grid would not fit one program per SM."""
    cfg = _effective_cfg(n, cfg)
    if n > min(int(cfg["max_rows"]), _RED_ROWS):
        return None
    bm = min(int(cfg["block_m"]), max(16, triton.next_power_of_2(n)))
    groups = triton.cdiv(n, bm)
    cw = max(int(cfg["min_cols"]), 16)
    while groups * triton.cdiv(d, cw) > sms and cw < d:
        cw *= 2
    gk = triton.cdiv(d, cw)
    if gk * groups > sms:
        return None
    return bm, cw, min(int(cfg["block_d"]), cw), gk, groups


def _fused_plan(n: int, d: int, hc: int, device, config: Optional[dict]):
    """(BM, CW, BD, GK, groups, num_warps, cfg) for the one-launch pre, or None."""
    from .indexer import _num_sms

    cfg = _resolve("pre_fused", DEFAULT_PRE_FUSED_CONFIG, config, device)
    shape = _fused_shape(n, d, _num_sms(device), cfg)
    if shape is None:
        return None
    cfg = _effective_cfg(n, cfg)
    return (*shape, int(cfg["num_warps"]), cfg)


def _pre_fused(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, iters, post_mult, plan, interp):
    n, hc, d = residual.shape
    bm, cw, bd, gk, groups, warps, plan_cfg = plan
    mix = fn.shape[0]
    mixp = 32
    dev = residual.device
    if interp:
        red = torch.zeros(2 * _RED_REPLICAS * _RED_ROWS * mixp, dtype=torch.float32, device=dev)
        sync = torch.zeros(2, dtype=torch.int32, device=dev)
    else:
        red, sync = _workspace(dev)
    if fn.dtype != torch.float32 or fn.stride(-1) != 1:
        fn = fn.float().contiguous()
    outs, mix_args = _pre_outputs(residual, rms_eps, hc_eps, post_mult)
    args = (
        residual, fn, hc_scale.float().contiguous(), hc_base.float().contiguous(), red, sync, outs, mix_args,
        n, d, residual.stride(0), residual.stride(1), fn.stride(0),
    )
    reps = max(1, min(int(plan_cfg.get("replicas", 1)), _RED_REPLICAS, gk))
    meta = dict(HC=hc, MIX=mix, MIXP=mixp, BM=bm, CW=cw, BD=bd, GK=gk, RED_ROWS=_RED_ROWS, R=reps,
                RMAX=_RED_REPLICAS, ITERS=int(iters),
                DOT_BF16=not interp, num_warps=warps, PIPE=int(plan_cfg.get("pipe", 0)),
                **_pdl_meta(dev, "pre_fused", plan_cfg, n))
    if int(plan_cfg.get("pipe", 0)) > 0:
        meta["num_stages"] = int(plan_cfg["pipe"])
    for phase in ((1, 2) if interp else (3,)):
        _mhc_pre_fused_kernel[(groups, gk)](*args, PHASE=phase, **meta)
    return outs


def _pre_plan(residual, fn, config):
    """The one-launch pre's plan when it covers this call (SM120_MHC_NO_FUSED=1
    turns it off), else None."""
    n, hc, d = residual.shape
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if os.environ.get("SM120_MHC_NO_FUSED") == "1" or not (interp or residual.is_cuda):
        return None
    if hc != 4 or fn.shape[0] != 24:
        return None
    return _fused_plan(n, d, hc, residual.device, None if config is None else config.get("pre_fused"))


def mhc_pre(
    residual: torch.Tensor,
    fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    rms_eps: float,
    hc_eps: float,
    sinkhorn_iters: int = SINKHORN_ITERS,
    post_mult: float = POST_MULT,
    *,
    config: Optional[dict] = None,
):
    """``(y [n, D] bf16, post [n, hc] fp32, comb [n, hc, hc] fp32)``."""
    _check_residual(residual)
    n, hc, d = residual.shape
    if n == 0:
        return (
            residual.new_empty(0, d),
            torch.empty(0, hc, dtype=torch.float32, device=residual.device),
            torch.empty(0, hc, hc, dtype=torch.float32, device=residual.device),
        )
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    plan = _pre_plan(residual, fn, config)
    if plan is not None:
        out = _pre_fused(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult, plan, interp)
        if out is not None:
            return out
    _, part, sq, n_chunks = _stage1(residual, fn, config=config)
    return _finish(residual, part, sq, n_chunks, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult)


def mhc_post(
    x: torch.Tensor,
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    *,
    config: Optional[dict] = None,
) -> torch.Tensor:
    """``out[:, j] = post[:, j] * x + sum_k comb[:, k, j] * residual[:, k]``, bf16."""
    _check_residual(residual)
    if residual.shape[0] == 0:
        return torch.empty_like(residual)
    res_out, _, _, _ = _stage1(residual, None, x=x, post=post, comb=comb, config=config)
    return res_out


def mhc_post_pre(
    x: torch.Tensor,
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    rms_eps: float,
    hc_eps: float,
    sinkhorn_iters: int = SINKHORN_ITERS,
    post_mult: float = POST_MULT,
    *,
    config: Optional[dict] = None,
):
    """Post of this sublayer then pre of the next:
    ``(new_residual, y, post', comb')``."""
    _check_residual(residual)
    n, hc, d = residual.shape
    if n == 0:
        y, p, c = mhc_pre(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult)
        return torch.empty_like(residual), y, p, c
    if _pre_plan(residual, fn, config) is not None:
        # decode batches: post, then the one-launch pre (faster on the H200
        # than the fused post + two-launch pre below)
        new_res = mhc_post(x, residual, post, comb)
        y, p, c = mhc_pre(new_res, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult, config=config)
        return new_res, y, p, c
    new_res, part, sq, n_chunks = _stage1(residual, fn, x=x, post=post, comb=comb, config=config)
    y, p, c = _finish(new_res, part, sq, n_chunks, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, post_mult)
    return new_res, y, p, c


# --------------------------------------------------------------------------
# SGLang adapters (AROUND hooks registered by sm120_kernels.plugin)
# --------------------------------------------------------------------------


def _on_device(t: torch.Tensor) -> bool:
    return t.is_cuda


def _covers(residual, hc_mult, fn=None) -> bool:
    """[n > 0, hc_mult, D] bf16 on the GPU with contiguous rows; fn [24, hc*D]
    (either orientation) when given."""
    if not isinstance(residual, torch.Tensor) or residual.dim() != 3 or hc_mult != HC_MULT:
        return False
    n, hc, d = residual.shape
    ok = (
        n > 0
        and hc == hc_mult
        and residual.dtype == torch.bfloat16
        and _on_device(residual)
        and residual.stride(2) == 1
        and residual.stride(1) == d
    )
    if ok and fn is not None:
        mix = 2 * hc + hc * hc
        ok = tuple(fn.shape) in ((mix, hc * d), (hc * d, mix))
    return ok


def _native_fn(fn: torch.Tensor, hc: int, d: int) -> torch.Tensor:
    """fn as [24, hc * D] (SGLang passes it transposed to some kernels)."""
    return fn if fn.shape[-1] == hc * d else fn.t()


def _symmetric_alloc():
    """SGLang allocates the pre's output in the symmetric-memory pool when the
    all-reduce uses it (its own sm_120 path does so); the same context here."""
    import contextlib

    try:
        from sglang.srt.models import deepseek_v4 as m

        return m.use_symmetric_memory(m.get_parallel().tp_group, disabled=not m.is_allocation_symmetric())
    except Exception:  # noqa: BLE001 - no TP group (tests) or a changed module
        return contextlib.nullcontext()


def _post_mult() -> float:
    try:
        from sglang.srt.models.deepseek_v4_mhc import MHC_POST_MULT_VALUE

        return float(MHC_POST_MULT_VALUE)
    except Exception:  # noqa: BLE001
        return POST_MULT


def sglang_hc_pre_hook(original, self, x, hc_fn, hc_scale, hc_base, norm=None, forward_batch=None):
    """``DeepseekV4DecoderLayerBase.hc_pre``: ``(y, post, comb, norm_fused)``;
    the norm is left to the caller (``norm_fused`` False)."""
    hc = getattr(self, "hc_mult", None)
    if not _covers(x, hc, hc_fn):
        return original(self, x, hc_fn, hc_scale, hc_base, norm, forward_batch)
    fn = _native_fn(hc_fn, x.shape[1], x.shape[2])
    with _symmetric_alloc():
        y, post, comb = mhc_pre(
            x, fn, hc_scale, hc_base, self.rms_norm_eps, self.hc_eps, self.hc_sinkhorn_iters, _post_mult()
        )
    return y, post, comb, False


def sglang_post_hook(original, cfg, x, residual, post_mix, comb):
    """``deepseek_v4_mhc.post``: ``R'[i] = post[i] * x + sum_j comb[j][i] * R[j]``."""
    if not (
        _covers(residual, getattr(cfg, "mult", None))
        and x.dtype == torch.bfloat16
        and tuple(x.shape) == (residual.shape[0], residual.shape[2])
        and post_mix.numel() == residual.shape[0] * residual.shape[1]
        and comb.numel() == residual.shape[0] * residual.shape[1] ** 2
    ):
        return original(cfg, x, residual, post_mix, comb)
    return mhc_post(x, residual, post_mix, comb)


def sglang_post_pre_boundary_hook(
    original,
    layer_input,
    residual,
    post,
    comb,
    hc_fn,
    hc_scale,
    hc_base,
    hc_mult,
    rms_eps,
    hc_eps,
    hc_post_mult,
    sinkhorn_iters,
    norm_weight,
    norm_eps,
    *,
    fn_transpose,
):
    """``apply_mhc_post_pre_boundary``: the post of this sublayer and the pre
    of the next, ``(new_residual, y, post', comb', norm_fused=False)``."""
    if not (
        _covers(residual, hc_mult, hc_fn)
        and layer_input.dtype == torch.bfloat16
        and tuple(layer_input.shape) == (residual.shape[0], residual.shape[2])
        and post.numel() == residual.shape[0] * hc_mult
        and comb.numel() == residual.shape[0] * hc_mult * hc_mult
    ):
        return original(
            layer_input, residual, post, comb, hc_fn, hc_scale, hc_base, hc_mult, rms_eps, hc_eps,
            hc_post_mult, sinkhorn_iters, norm_weight, norm_eps, fn_transpose=fn_transpose,
        )
    fn = _native_fn(hc_fn, hc_mult, residual.shape[2])
    new_res = mhc_post(layer_input, residual, post, comb)
    with _symmetric_alloc():
        y, p, c = mhc_pre(new_res, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters, hc_post_mult)
    return new_res, y, p, c, False


# --------------------------------------------------------------------------
# fp32 torch references
# --------------------------------------------------------------------------


def sinkhorn_ref(comb_logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """softmax over the last dim + eps, column normalise, then iters - 1 rounds."""
    c = comb_logits.softmax(-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def mhc_pre_ref(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters=SINKHORN_ITERS, post_mult=POST_MULT):
    n, hc, d = residual.shape
    xf = residual.reshape(n, hc * d).double()
    rs = torch.rsqrt(xf.square().mean(-1, keepdim=True) + rms_eps)
    mixes = (xf @ fn.double().T) * rs
    scale, base = hc_scale.double(), hc_base.double()
    pre = torch.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = post_mult * torch.sigmoid(mixes[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    comb = mixes[:, 2 * hc :].view(n, hc, hc) * scale[2] + base[2 * hc :].view(hc, hc)
    comb = sinkhorn_ref(comb, sinkhorn_iters, hc_eps)
    y = (pre[:, :, None] * residual.double()).sum(1)
    return y.float(), post.float(), comb.float()


def mhc_post_ref(x, residual, post, comb):
    out = post.double().reshape(*post.shape[:2], 1) * x.double()[:, None, :] + (
        comb.double()[:, :, :, None] * residual.double()[:, :, None, :]
    ).sum(1)
    return out.float()


def mhc_pre_torch(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, sinkhorn_iters=SINKHORN_ITERS, post_mult=POST_MULT):
    """The eager torch path SGLang runs without kernels (speed-up baseline)."""
    n, hc, d = residual.shape
    xf = residual.reshape(n, hc * d).float()
    rs = torch.rsqrt(xf.square().mean(-1, keepdim=True) + rms_eps)
    mixes = torch.nn.functional.linear(xf, fn) * rs
    pre = torch.sigmoid(mixes[:, :hc] * hc_scale[0] + hc_base[:hc]) + hc_eps
    post = post_mult * torch.sigmoid(mixes[:, hc : 2 * hc] * hc_scale[1] + hc_base[hc : 2 * hc])
    comb = mixes[:, 2 * hc :].view(n, hc, hc) * hc_scale[2] + hc_base[2 * hc :].view(hc, hc)
    comb = sinkhorn_ref(comb, sinkhorn_iters, hc_eps)
    y = (pre[:, :, None] * residual.float()).sum(1).to(residual.dtype)
    return y, post, comb


def mhc_post_torch(x, residual, post, comb):
    return (post[:, :, None] * x[:, None, :] + (comb[:, :, :, None] * residual[:, :, None, :]).sum(1)).to(x.dtype)


# --------------------------------------------------------------------------
# Test data and checks
# --------------------------------------------------------------------------


def make_inputs(n, d=HIDDEN, hc=HC_MULT, *, device="cpu", seed=0):
    """Residual, layer output, parameters and a non-symmetric (post, comb)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    mix = 2 * hc + hc * hc
    residual = (torch.randn(n, hc, d, generator=g) * (1 + torch.arange(hc).view(1, hc, 1))).to(torch.bfloat16)
    x = torch.randn(n, d, generator=g).to(torch.bfloat16)
    fn = torch.randn(mix, hc * d, generator=g) * (hc * d) ** -0.5
    hc_scale = torch.tensor([0.9, 1.3, 2.1])
    hc_base = torch.randn(mix, generator=g) * 0.5
    post = 2 * torch.sigmoid(torch.randn(n, hc, generator=g))
    comb = sinkhorn_ref(torch.randn(n, hc, hc, generator=g) * 2, SINKHORN_ITERS, 1e-6)
    t = lambda v: v.to(device)  # noqa: E731
    return t(residual), t(x), t(fn), t(hc_scale), t(hc_base), t(post), t(comb)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    den = ref.norm()
    return float((out - ref).norm() / den) if den > 0 else float(out.norm())


MHC_TOL = 2.3e-3  # relative, bf16 outputs
RMS_EPS = 1e-6
HC_EPS = 1e-6
