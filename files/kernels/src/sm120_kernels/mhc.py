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
references. Two launches for pre (split-K GEMM with the post fused in when
asked; then reduce + Sinkhorn + collapse), one for post.
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


@triton.jit
def _round_bf16(x):
    """fp32 rounded to the nearest bf16 (ties to even), still as fp32: the
    later cast is then exact on every backend (Triton's interpreter truncates)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


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
):
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
                r2 = tl.reshape(r, (BM, HC * BD)).to(tl.bfloat16)
                acc = tl.dot(r2, f_hi, acc)
                acc = tl.dot(r2, f_lo, acc)
            else:  # Triton's interpreter: its bf16 dot is wrong; plain fp32
                acc = tl.dot(tl.reshape(r, (BM, HC * BD)), f2, acc, input_precision="ieee")

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
    y_ptr,  # out [n, D] bf16
    post_ptr,  # out [n, HC] fp32
    comb_ptr,  # out [n, HC, HC] fp32
    n,
    D,
    n_chunks,
    stride_xn,
    stride_xk,
    stride_yn,
    inv_k,
    rms_eps,
    hc_eps,
    post_mult,
    HC: tl.constexpr,
    MIXP: tl.constexpr,
    NCH: tl.constexpr,
    ITERS: tl.constexpr,
    BD: tl.constexpr,
):
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
    tl.store(y_ptr + t * stride_yn + cols, _round_bf16(y).to(tl.bfloat16), mask=cmask)


def _resolve(name: str, default: dict, config: Optional[dict], device=None) -> dict:
    """Explicit config, else configs/mhc-<device>.json, else mhc-default.json."""
    if config is not None:
        return {**default, **config}
    from .indexer import _device_name, load_configs

    found = load_configs("mhc", _device_name(device)).get(name)
    return {**default, **(found or {})}


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
        cfg = _resolve("stage1_fused", DEFAULT_FUSED_CONFIG, config, residual.device)
    elif do_gemm:
        cfg = _resolve("stage1", DEFAULT_STAGE1_CONFIG, config, residual.device)
    else:
        cfg = _resolve("post", DEFAULT_POST_CONFIG, config, residual.device)
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
    )
    return res_out, part, sq, n_chunks


def _finish(residual, part, sq, n_chunks, hc_scale, hc_base, rms_eps, hc_eps, iters, post_mult, config=None):
    n, hc, d = residual.shape
    cfg = _resolve("finish", DEFAULT_FINISH_CONFIG, None, residual.device)
    bd = min(int(cfg["block_d"]), triton.next_power_of_2(d))
    dev = residual.device
    y = torch.empty(n, d, dtype=torch.bfloat16, device=dev)
    post = torch.empty(n, hc, dtype=torch.float32, device=dev)
    comb = torch.empty(n, hc, hc, dtype=torch.float32, device=dev)
    _mhc_finish_kernel[(n, triton.cdiv(d, bd))](
        residual,
        part,
        sq,
        hc_scale.float().contiguous(),
        hc_base.float().contiguous(),
        y,
        post,
        comb,
        n,
        d,
        n_chunks,
        residual.stride(0),
        residual.stride(1),
        y.stride(0),
        1.0 / (hc * d),
        float(rms_eps),
        float(hc_eps),
        float(post_mult),
        HC=hc,
        MIXP=part.shape[2],
        NCH=triton.next_power_of_2(n_chunks),
        ITERS=int(iters),
        BD=bd,
        num_warps=int(cfg["num_warps"]),
    )
    return y, post, comb


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


def check_case(n, d, device, *, seed=0):
    residual, x, fn, scale, base, post, comb = make_inputs(n, d, device=device, seed=seed)
    res = {}
    y, p, c = mhc_pre(residual, fn, scale, base, RMS_EPS, HC_EPS)
    ry, rp, rc = mhc_pre_ref(residual, fn, scale, base, RMS_EPS, HC_EPS)
    res["pre_y"] = rel_err(y, ry)
    res["pre_post"] = rel_err(p, rp)
    res["pre_comb"] = rel_err(c, rc)
    res["col_sum_err"] = float((c.double().sum(-2) - 1).abs().max()) if n else 0.0
    out = mhc_post(x, residual, post, comb)
    res["post"] = rel_err(out, mhc_post_ref(x, residual, post, comb))
    nr, y2, p2, c2 = mhc_post_pre(x, residual, post, comb, fn, scale, base, RMS_EPS, HC_EPS)
    ref_res = mhc_post_ref(x, residual, post, comb)
    ry2, rp2, rc2 = mhc_pre_ref(ref_res.to(torch.bfloat16), fn, scale, base, RMS_EPS, HC_EPS)
    res["fused_res"] = rel_err(nr, ref_res)
    res["fused_y"] = rel_err(y2, ry2)
    res["fused_post"] = rel_err(p2, rp2)
    res["fused_comb"] = rel_err(c2, rc2)
    errs = [v for k, v in res.items() if k != "col_sum_err"]
    res["ok"] = all(e < MHC_TOL for e in errs) and res["col_sum_err"] < 1e-5
    return res


def selftest_cases():
    from .registry import CaseResult, SelfTestCase

    def case(n, seed):
        def run(device):
            r = check_case(n, HIDDEN, device, seed=seed)
            worst = max(v for k, v in r.items() if k not in ("ok", "col_sum_err"))
            return CaseResult(bool(r["ok"]), f"max_rel={worst:.2e} col_sum_err={r['col_sum_err']:.1e}", r)

        return run

    return [SelfTestCase(f"dsv4.mhc pre/post/post+pre n{n} hidden{HIDDEN}", case(n, i)) for i, n in enumerate((1, 7, 64, 300))]


def bench_cases():
    """mHC pre + post (3 launches) and the fused post+pre (2 launches), each
    captured in a CUDA graph as SGLang's decode runs them."""
    from .indexer import _graphed
    from .registry import BenchCase, BenchSpec

    def setup(n, which):
        def make(device):
            residual, x, fn, scale, base, post, comb = make_inputs(n, HIDDEN, device=device, seed=11)
            hc, d = HC_MULT, HIDDEN
            mix = 2 * hc + hc * hc
            b_res = n * hc * d * 2
            b_x = n * d * 2
            b_fn = mix * hc * d * 4
            b_small = n * (hc + hc * hc) * 4
            if which == "pre+post":

                def fn_():
                    mhc_pre(residual, fn, scale, base, RMS_EPS, HC_EPS)
                    mhc_post(x, residual, post, comb)

                def ref():
                    mhc_pre_torch(residual, fn, scale, base, RMS_EPS, HC_EPS)
                    mhc_post_torch(x, residual, post, comb)

                # pre: residual + fn in, y + post/comb out; post: y + residual in, residual out
                nbytes = (b_res + b_fn + b_x + b_small) + (b_x + b_res + b_res + b_small)
            else:

                def fn_():
                    mhc_post_pre(x, residual, post, comb, fn, scale, base, RMS_EPS, HC_EPS)

                def ref():
                    r = mhc_post_torch(x, residual, post, comb)
                    mhc_pre_torch(r, fn, scale, base, RMS_EPS, HC_EPS)

                nbytes = b_x + b_res + b_res + b_fn + b_x + 2 * b_small
            return BenchSpec(
                fn=_graphed(fn_),
                bytes=nbytes,
                ref_fn=ref,
                extra={"target": "within 2x of bytes / copy bandwidth, >= 5x over torch", "_target_fraction": 0.5},
            )

        return make

    cases = [BenchCase(f"dsv4.mhc pre+post n{n}", "DeepSeek-V4-Flash mHC pre+post", n, setup(n, "pre+post")) for n in (1, 8, 32, 64)]
    cases += [BenchCase(f"dsv4.mhc post+pre fused n{n}", "DeepSeek-V4-Flash mHC post+pre fused", n, setup(n, "fused")) for n in (8, 64)]
    return cases
