"""The tensor-core MoE GEMM for weights whose shapes do not fit the fragment
order (rows not a multiple of 16 or K not a multiple of 64; no supported
model): checkpoint-order words dequantised to bf16 tiles, one ``tl.dot`` per
nibble position against the activations at K = 8j + i (no nibble interleaving
in registers).

The GEMMs are "swap-AB": the accumulator is [BLOCK_N, BLOCK_M] so that the
weight tile (many rows) is the MMA's M side and the few tokens of a decode step
are its N side (16 is the smallest MMA width Triton accepts). Inputs and
outputs are those of the fragment kernel (same alignment, same combine).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from .formats import FORMATS, GROUP_SIZE, _e4m3_to_f32, _fp4_val, _int4_val, _nib, _to_bf16, interpreting

# 2**119: folded into the NVFP4 block scale on the inline-asm path (see
# _DQ8_NVFP4); the global scale takes 2**7 so the product is unchanged.
_NVFP4_ASM_SCALE_SHIFT = 119


# --------------------------------------------------------------------------
# Dequantisation, two implementations of each format.
# The inline-asm one is what runs on GPUs: 2.5 (nvfp4) or 2 (int4) integer/bf16x2
# instructions per element, so the dequantisation keeps up with memory. The
# plain-Triton one runs under TRITON_INTERPRET=1 (the interpreter cannot run PTX)
# and is the readable specification of the asm.
# --------------------------------------------------------------------------


@triton.jit
def _dq8_nvfp4_ref(w, s, INTERP: tl.constexpr):
    return (_fp4_val(_nib(w, 0), s, INTERP), _fp4_val(_nib(w, 1), s, INTERP), _fp4_val(_nib(w, 2), s, INTERP),
            _fp4_val(_nib(w, 3), s, INTERP), _fp4_val(_nib(w, 4), s, INTERP), _fp4_val(_nib(w, 5), s, INTERP),
            _fp4_val(_nib(w, 6), s, INTERP), _fp4_val(_nib(w, 7), s, INTERP))


@triton.jit
def _dq8_int4_ref(w, s, INTERP: tl.constexpr):
    return (_int4_val(_nib(w, 0), s, INTERP), _int4_val(_nib(w, 1), s, INTERP), _int4_val(_nib(w, 2), s, INTERP),
            _int4_val(_nib(w, 3), s, INTERP), _int4_val(_nib(w, 4), s, INTERP), _int4_val(_nib(w, 5), s, INTERP),
            _int4_val(_nib(w, 6), s, INTERP), _int4_val(_nib(w, 7), s, INTERP))


# Inline PTX of the tensor-core GEMM's dequantisation (tests/ptx_sim.py runs these
# strings on CPU): a checkpoint-order word ($8) and its bf16 scale ($9) -> the
# word's eight bf16 values ($0-$7), two nibbles (i, i + 4) per 32-bit op.
# NVFP4, Marlin's trick: each nibble's sign goes to bf16 bit 15 and its 3 e/m bits
# to bits 6..8; that bf16 is code * 2**-126 (subnormal for e = 0, which the bf16x2
# FMA keeps). The scale arrives times 2**119, the global scale times 2**7.
# INT4: (w & 0x000F000F) | 0x43004300 is the bf16 pair (128 + q_i, 128 + q_{i+4});
# one exact FMA subtracts 136 (= 128 + 8), one FMA applies the scale.
def _dq8_ptx(fmt: str) -> str:
    """Four steps, each two nibbles (i, i + 4) into one bf16x2 register pair."""
    if fmt == "nvfp4":  # nibbles 3, 2, 1, 0 (and + 4), the word shifted left 4 bits per step
        regs = [".reg .b32 q, t, u, s2, v, nz;", "mov.b32 s2, {$9, $9};", "mov.b32 nz, 0x80008000;"]
        step = ["shr.u32 t, q, 6;", "and.b32 t, t, 0x01C001C0;", "lop3.b32 u, q, 0x80008000, t, 0xEA;",
                "fma.rn.bf16x2 v, u, s2, nz;"]
        order, shift = (3, 2, 1, 0), "shl.b32 q, q, 4;"
    else:  # nibbles 0, 1, 2, 3 (and + 4), the word shifted right 4 bits per step
        regs = [".reg .b32 q, u, s2, v, nz, one, c136;", "mov.b32 s2, {$9, $9};", "mov.b32 nz, 0x80008000;",
                "mov.b32 one, 0x3F803F80;", "mov.b32 c136, 0xC308C308;"]
        step = ["lop3.b32 u, q, 0x000F000F, 0x43004300, 0xEA;", "fma.rn.bf16x2 u, u, one, c136;",
                "fma.rn.bf16x2 v, u, s2, nz;"]
        order, shift = (0, 1, 2, 3), "shr.u32 q, q, 4;"
    lines = regs + ["mov.b32 q, $8;"]
    for n, i in enumerate(order):
        lines += ([shift] if n else []) + step + [f"mov.b32 {{${i}, ${i + 4}}}, v;"]
    return "\n        {\n        " + "\n        ".join(lines) + "\n        }\n        "


_DQ8_NVFP4 = _dq8_ptx("nvfp4")
_DQ8_INT4 = _dq8_ptx("int4")

_ASM_DQ8_NVFP4 = tl.constexpr(_DQ8_NVFP4)
_ASM_DQ8_INT4 = tl.constexpr(_DQ8_INT4)


@triton.jit
def _dq8_asm(w, s, FMT: tl.constexpr):
    """A checkpoint word's eight bf16 values by the inline PTX (_DQ8_NVFP4 / _DQ8_INT4)."""
    if FMT == 0:
        asm: tl.constexpr = _ASM_DQ8_NVFP4
    else:
        asm: tl.constexpr = _ASM_DQ8_INT4
    return tl.inline_asm_elementwise(asm=asm, constraints="=h,=h,=h,=h,=h,=h,=h,=h,r,h", args=[w, s],
                                     dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)


@triton.jit
def _cvt_scale(raw, FMT: tl.constexpr, USE_ASM: tl.constexpr):
    if FMT == 0:  # nvfp4: e4m3 bits
        s = _e4m3_to_f32(raw)
        if USE_ASM:
            s = (s * 6.646139978924579e35).to(tl.bfloat16)  # x 2**119, exact
    else:  # int4: bf16
        if USE_ASM:
            s = raw.to(tl.bfloat16)
        else:
            s = raw.to(tl.float32)
    return s


@triton.jit
def _load_scale(s_ptrs, mask, FMT: tl.constexpr, USE_ASM: tl.constexpr):
    return _cvt_scale(tl.load(s_ptrs, mask=mask, other=0), FMT, USE_ASM)


@triton.jit
def _dq8(w, s, FMT: tl.constexpr, USE_ASM: tl.constexpr, INTERP: tl.constexpr):
    if USE_ASM:
        r = _dq8_asm(w, s, FMT)
    elif FMT == 0:
        r = _dq8_nvfp4_ref(w, s, INTERP)
    else:
        r = _dq8_int4_ref(w, s, INTERP)
    return r


@triton.jit
def _mma(w, x, acc, INTERP: tl.constexpr):
    if INTERP:
        # Triton 3.8's interpreter multiplies bf16 operands as their uint16
        # bit patterns; fp32 operands (exact widening) give the true product.
        return tl.dot(w.to(tl.float32), x.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w, x, acc)


@triton.jit
def _acc8(acc, wq, x_ptrs, x_mask, stride_xk, INTERP: tl.constexpr):
    # eight K-strided activation slices against the eight nibble planes
    acc = _mma(wq[0], tl.load(x_ptrs + 0 * stride_xk, mask=x_mask, other=0.0), acc, INTERP)
    acc = _mma(wq[1], tl.load(x_ptrs + 1 * stride_xk, mask=x_mask, other=0.0), acc, INTERP)
    acc = _mma(wq[2], tl.load(x_ptrs + 2 * stride_xk, mask=x_mask, other=0.0), acc, INTERP)
    acc = _mma(wq[3], tl.load(x_ptrs + 3 * stride_xk, mask=x_mask, other=0.0), acc, INTERP)
    acc = _mma(wq[4], tl.load(x_ptrs + 4 * stride_xk, mask=x_mask, other=0.0), acc, INTERP)
    acc = _mma(wq[5], tl.load(x_ptrs + 5 * stride_xk, mask=x_mask, other=0.0), acc, INTERP)
    acc = _mma(wq[6], tl.load(x_ptrs + 6 * stride_xk, mask=x_mask, other=0.0), acc, INTERP)
    acc = _mma(wq[7], tl.load(x_ptrs + 7 * stride_xk, mask=x_mask, other=0.0), acc, INTERP)
    return acc


@triton.jit
def _moe_gemm_kernel(
    x_ptr, w_ptr, s_ptr, g_ptr, out_ptr, tw_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    num_valid, top_k, N, K,
    stride_xm, stride_xk,
    stride_we, stride_wn, stride_wk,
    stride_se, stride_sn, stride_sk,
    stride_om,
    up_offset, g_mult, swiglu_limit,
    FMT: tl.constexpr, GROUP: tl.constexpr, GATED: tl.constexpr,
    X_IS_SORTED: tl.constexpr, HAS_LIMIT: tl.constexpr, USE_ASM: tl.constexpr, INTERP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One [BLOCK_M tokens of one expert] x [BLOCK_N output columns] tile.

    GATED: gate/up GEMM, N = intermediate size, gate rows [0, N) and up rows
    [up_offset, up_offset + N); writes bf16 SiLU(gate)*up at the sorted position.
    else: down GEMM; X rows are sorted positions; writes fp32 rows times the
    top-k weight at the (token, slot) index.
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    num_post = tl.load(num_post_ptr)
    if pid_m * BLOCK_M >= num_post:
        return
    BK8: tl.constexpr = BLOCK_K // 8
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ids = tl.load(sorted_ids_ptr + offs_m)
    valid_m = ids < num_valid
    e = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if X_IS_SORTED:
        x_rows = offs_m.to(tl.int64)
    else:
        x_rows = (ids // top_k).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_j = tl.arange(0, BK8)
    KW = K // 8

    w_base = w_ptr + e * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
    s_base = s_ptr + e * stride_se + offs_n[:, None].to(tl.int64) * stride_sn
    x_base = x_ptr + x_rows[None, :] * stride_xm

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if GATED:
        acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(KW, BK8)):
        kw = k0 * BK8 + offs_j
        mask_k = kw < KW
        wmask = mask_n[:, None] & mask_k[None, :]
        kg = (kw * 8) // GROUP
        x_ptrs = x_base + (kw * 8)[:, None] * stride_xk
        x_mask = mask_k[:, None] & valid_m[None, :]
        w = tl.load(w_base + kw[None, :] * stride_wk, mask=wmask, other=0)
        s = _load_scale(s_base + kg[None, :] * stride_sk, wmask, FMT, USE_ASM)
        acc = _acc8(acc, _dq8(w, s, FMT, USE_ASM, INTERP), x_ptrs, x_mask, stride_xk, INTERP)
        if GATED:
            wu = tl.load(w_base + up_offset * stride_wn + kw[None, :] * stride_wk, mask=wmask, other=0)
            su = _load_scale(s_base + up_offset * stride_sn + kg[None, :] * stride_sk, wmask, FMT, USE_ASM)
            acc_u = _acc8(acc_u, _dq8(wu, su, FMT, USE_ASM, INTERP), x_ptrs, x_mask, stride_xk, INTERP)

    g = tl.load(g_ptr + e) * g_mult
    out_mask = mask_n[:, None] & valid_m[None, :]
    if GATED:
        gate = acc * g
        up = acc_u * g
        if HAS_LIMIT:
            # DeepSeek-V4 swiglu clamp, as SGLang's swiglu_limit_func
            gate = tl.minimum(gate, swiglu_limit)
            up = tl.minimum(tl.maximum(up, -swiglu_limit), swiglu_limit)
        h = gate / (1.0 + tl.exp(-gate)) * up
        o_ptrs = out_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None]
        tl.store(o_ptrs, _to_bf16(h, INTERP), mask=out_mask)
    else:
        tw = tl.load(tw_ptr + ids, mask=valid_m, other=0.0).to(tl.float32)
        y = acc * g * tw[None, :]
        o_ptrs = out_ptr + ids[None, :].to(tl.int64) * stride_om + offs_n[:, None]
        tl.store(o_ptrs, y, mask=out_mask)


def _use_asm() -> bool:
    if interpreting():
        return False
    return os.environ.get("SM120_KERNELS_NO_ASM", "0") != "1"


# Weights whose shapes do not fit the fragment order (not a multiple of 16 rows
# or 64 columns; no supported model) run on the tensor-core GEMM with these
# tiles (they fit sm_120's shared memory).
TENSOR_CORE_CONFIG = {
    fmt: {"gate_up": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=4),
          "down": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=8, num_stages=3)}
    for fmt in FORMATS
}


def gemm_tensor_core(x, W, s, g, out, tw, align, top_k, N, K, fmt, cfg, gated, x_sorted, swiglu_limit, num_valid):
    """One GEMM launch on checkpoint-order weights (the fragment kernel's
    arguments; cfg: BLOCK_M/N/K, num_warps, num_stages)."""
    sorted_ids, expert_ids, num_post = align
    use_asm = _use_asm()
    fmt_id = FORMATS.index(fmt)
    g_mult = 2.0 ** (126 - _NVFP4_ASM_SCALE_SHIFT) if (use_asm and fmt_id == 0) else 1.0
    bm = cfg["BLOCK_M"]
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), expert_ids.shape[0])
    _moe_gemm_kernel[grid](
        x, W, s, g, out, tw,
        sorted_ids, expert_ids, num_post,
        num_valid, top_k, N, K,
        x.stride(0), x.stride(1),
        W.stride(0), W.stride(1), W.stride(2),
        s.stride(0), s.stride(1), s.stride(2),
        out.stride(0),
        N if gated else 0, g_mult, float(swiglu_limit or 0.0),
        FMT=fmt_id, GROUP=GROUP_SIZE[fmt], GATED=gated, X_IS_SORTED=x_sorted,
        HAS_LIMIT=bool(swiglu_limit), USE_ASM=use_asm, INTERP=interpreting(),
        BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
