"""Fused MoE expert GEMMs with 4-bit weights dequantised in registers (W4A16).

Two weight formats share one kernel; only the dequantisation differs:

* ``nvfp4``: ModelOpt NVFP4 (DeepSeek-V4-Flash). e2m1 codes, two per byte, the
  first element in the low nibble; one e4m3 scale per 16 values along K; one
  fp32 global scale per expert (``weight_scale_2``).
* ``int4``: compressed-tensors pack-quantized, symmetric, group 32 (Kimi-K2.5).
  Eight unsigned nibbles per int32 (value + 8), the first element in the low
  bits; one bf16 scale per 32 values along K.

In both formats the nibble at bits [4i, 4i+4) of int32 word j holds K index
8j+i, so the kernel reads the weights as int32 words and computes eight partial
products per word: one ``tl.dot`` per nibble position against the activations
at K = 8j+i. That avoids interleaving nibbles in registers.

The GEMMs are "swap-AB": the accumulator is [BLOCK_N, BLOCK_M] so that the
weight tile (many rows) is the MMA's M side and the few tokens of a decode step
are its N side (16 is the smallest MMA width Triton accepts).

Pipeline (four launches, all CUDA-graph safe):
  1. routing.moe_align: (token, slot) pairs sorted by expert, padded to BLOCK_M.
  2. gate/up GEMM + SiLU(gate)*up (optional swiglu clamp) -> bf16 intermediate.
  3. down GEMM, times the expert's global scale and the top-k weight -> fp32
     rows, one per (token, slot).
  4. combine: fp32 sum over the top-k slots, times the routed scaling factor
     (applied here and only here), -> bf16.

The torch reference (``moe_w4a16_reference``) dequantises the weights to bf16
and runs plain matmuls; the kernel must match it within the issue's tolerance.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from . import routing

FORMATS = ("nvfp4", "int4")
GROUP_SIZE = {"nvfp4": 16, "int4": 32}
# 2**119: folded into the NVFP4 block scale on the inline-asm path (see
# _DQ8_NVFP4); the global scale takes 2**7 so the product is unchanged.
_NVFP4_ASM_SCALE_SHIFT = 119

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# --------------------------------------------------------------------------
# Dequantisation, two implementations of each format.
# The inline-asm one is what runs on GPUs: 2.5 (nvfp4) or 2 (int4) integer/bf16x2
# instructions per element, so the dequantisation keeps up with memory. The
# plain-Triton one runs under TRITON_INTERPRET=1 (the interpreter cannot run PTX)
# and is the readable specification of the asm.
# --------------------------------------------------------------------------


@triton.jit
def _e4m3_to_f32(u):
    """Decode e4m3 bits (uint8 loaded as int32) exactly, without fp8 types
    (keeps the interpreter and every Triton backend on the same code)."""
    u = u.to(tl.int32)
    e = (u >> 3) & 0xF
    m = u & 0x7
    normal = ((e + 120) << 23) | (m << 20)
    val = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal.to(tl.float32, bitcast=True))
    return tl.where((u & 0x80) != 0, -val, val)


@triton.jit
def _to_bf16(x, INTERP: tl.constexpr):
    if INTERP:
        # Triton 3.8's interpreter truncates fp32 -> bf16; round to nearest
        # even on the bits first so the cast below is exact.
        b = x.to(tl.int32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
        x = b.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _nib(w, i: tl.constexpr):
    return (w >> (4 * i)) & 0xF


@triton.jit
def _fp4_val(n, s, INTERP: tl.constexpr):
    em = n & 7
    emf = em.to(tl.float32)
    mag = tl.where(em < 4, emf * 0.5, tl.where(em < 6, emf - 2.0, emf * 2.0 - 8.0))
    mag = tl.where(n >= 8, -mag, mag)
    # code (<= 2 significant bits) x e4m3 (4) fits bf16's 8 bits: exact.
    return _to_bf16(mag * s, INTERP)


@triton.jit
def _int4_val(n, s, INTERP: tl.constexpr):
    # (q - 8) x bf16 scale, rounded once to bf16: the reference's rounding.
    return _to_bf16((n - 8).to(tl.float32) * s, INTERP)


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
_DQ8_NVFP4 = """
        {
        .reg .b32 q, t, u, s2, v, nz;
        mov.b32 s2, {$9, $9};
        mov.b32 nz, 0x80008000;
        mov.b32 q, $8;
        shr.u32 t, q, 6;
        and.b32 t, t, 0x01C001C0;
        lop3.b32 u, q, 0x80008000, t, 0xEA;
        fma.rn.bf16x2 v, u, s2, nz;
        mov.b32 {$3, $7}, v;
        shl.b32 q, q, 4;
        shr.u32 t, q, 6;
        and.b32 t, t, 0x01C001C0;
        lop3.b32 u, q, 0x80008000, t, 0xEA;
        fma.rn.bf16x2 v, u, s2, nz;
        mov.b32 {$2, $6}, v;
        shl.b32 q, q, 4;
        shr.u32 t, q, 6;
        and.b32 t, t, 0x01C001C0;
        lop3.b32 u, q, 0x80008000, t, 0xEA;
        fma.rn.bf16x2 v, u, s2, nz;
        mov.b32 {$1, $5}, v;
        shl.b32 q, q, 4;
        shr.u32 t, q, 6;
        and.b32 t, t, 0x01C001C0;
        lop3.b32 u, q, 0x80008000, t, 0xEA;
        fma.rn.bf16x2 v, u, s2, nz;
        mov.b32 {$0, $4}, v;
        }
        """
_DQ8_INT4 = """
        {
        .reg .b32 q, u, s2, v, nz, one, c136;
        mov.b32 s2, {$9, $9};
        mov.b32 nz, 0x80008000;
        mov.b32 one, 0x3F803F80;
        mov.b32 c136, 0xC308C308;
        mov.b32 q, $8;
        lop3.b32 u, q, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 u, u, one, c136;
        fma.rn.bf16x2 v, u, s2, nz;
        mov.b32 {$0, $4}, v;
        shr.u32 q, q, 4;
        lop3.b32 u, q, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 u, u, one, c136;
        fma.rn.bf16x2 v, u, s2, nz;
        mov.b32 {$1, $5}, v;
        shr.u32 q, q, 4;
        lop3.b32 u, q, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 u, u, one, c136;
        fma.rn.bf16x2 v, u, s2, nz;
        mov.b32 {$2, $6}, v;
        shr.u32 q, q, 4;
        lop3.b32 u, q, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 u, u, one, c136;
        fma.rn.bf16x2 v, u, s2, nz;
        mov.b32 {$3, $7}, v;
        }
        """
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


# --------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------


@dataclass
class W4A16Weights:
    """Expert weights of one MoE layer in either format.

    w: int32 [E, N, K/8] (ModelOpt's uint8 [E, N, K/2] viewed as int32, or
    compressed-tensors' [E, K/8, N] repacked by make_weights); any strides work,
    rows of contiguous words are what the decode kernel reads fastest;
    s: scales [E, N, K/group] with arbitrary strides (uint8 e4m3 bits or bf16);
    g: fp32 per-expert global scale [E] (ones for int4).
    packed: w13/w2 are in fused_moe_w4a16_frag's fragment order
    ([E, N/16, K/64, 32, 4]) and s13/s2 its scale fragments ([E, N/16, K/64,
    32] int16, frag_pack_scales); scales() gives the checkpoint layout back.
    shift13/shift2: packed INT4 scale fragments hold the scales divided by
    2**shift (int4_headroom; the kernel multiplies its sums back).
    """

    fmt: str
    w13: torch.Tensor
    s13: torch.Tensor
    g13: torch.Tensor
    w2: torch.Tensor
    s2: torch.Tensor
    g2: torch.Tensor
    packed: bool = False
    shift13: int = 0
    shift2: int = 0

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w13.shape[2] * (64 if self.packed else 8)

    @property
    def inter(self) -> int:
        return self.w13.shape[1] * (16 if self.packed else 1) // 2

    def words(self, which: str) -> torch.Tensor:
        """w13 or w2 as [E, N, K/8] words (unpacked again if packed; tests and
        the reference)."""
        w = getattr(self, which)
        if not self.packed:
            return w
        from .fused_moe_w4a16_frag import frag_unpack

        return frag_unpack(w, self.fmt)

    def scales(self, which: str) -> torch.Tensor:
        """s13 or s2 as [E, N, K/group] (unpacked again if packed)."""
        s = getattr(self, which)
        if not self.packed:
            return s
        from .fused_moe_w4a16_frag import frag_unpack_scales

        shift = self.shift13 if which == "s13" else self.shift2
        out = frag_unpack_scales(s, self.fmt)
        return out if shift == 0 else (out.float() * 2.0**shift).to(out.dtype)


def _as_words(w: torch.Tensor, kn: bool) -> torch.Tensor:
    """Return an int32 [E, N, K/8] view."""
    if w.dtype == torch.uint8:  # ModelOpt [E, N, K/2]
        assert not kn, "uint8 weights are [E, N, K/2]"
        return w.view(torch.int32)
    assert w.dtype == torch.int32
    # compressed-tensors [E, K/8, N]: repacked once to [E, N, K/8] (rows with
    # contiguous words, as ModelOpt's), which the decode kernel reads coalesced
    return w.transpose(1, 2).contiguous() if kn else w


def _as_scales(s: torch.Tensor, kn: bool) -> torch.Tensor:
    if s.dtype == torch.float8_e4m3fn:
        s = s.view(torch.uint8)
    return s.transpose(1, 2).contiguous() if kn else s


def packable(n: int, k: int) -> bool:
    """Whether an [N, K] weight fits the fragment order (16-row, 64-column tiles)."""
    return n % 16 == 0 and k % 64 == 0


def make_weights(fmt, w13, s13, w2, s2, g13=None, g2=None, kn=False, pack=True) -> W4A16Weights:
    """Wrap checkpoint tensors. kn=True: compressed-tensors as SGLang loads it
    ([E, K/8, N] words, [E, K/32, N] scales), repacked here to [E, N, K/8] and
    [E, N, K/32] contiguous (a copy: the caller drops the originals).
    pack: put the words in fragment order (fused_moe_w4a16_frag.frag_pack, a
    copy) when both GEMMs' shapes allow it; such weights run on the fragment
    kernel at every batch size, others on the tensor-core GEMM below."""
    assert fmt in FORMATS
    w13v, w2v = _as_words(w13, kn), _as_words(w2, kn)
    s13v, s2v = _as_scales(s13, kn), _as_scales(s2, kn)
    if pack and packable(w13v.shape[1], w13v.shape[2] * 8) and packable(w2v.shape[1], w2v.shape[2] * 8):
        from .fused_moe_w4a16_frag import frag_pack, frag_pack_scales, int4_headroom

        w13v, w2v = frag_pack(w13v, fmt), frag_pack(w2v, fmt)
        # INT4 scale fragments need |s| < 2**-5 (frag_pack_scales): larger
        # scales are stored divided by a power of two, which the kernel
        # multiplies its sums by
        j13, j2 = (int4_headroom(s13v), int4_headroom(s2v)) if fmt == "int4" else (0, 0)
        s13v = frag_pack_scales(s13v if j13 == 0 else (s13v.float() * 2.0**-j13).to(s13v.dtype), fmt)
        s2v = frag_pack_scales(s2v if j2 == 0 else (s2v.float() * 2.0**-j2).to(s2v.dtype), fmt)
    else:
        pack = False
        j13 = j2 = 0
    e = w13v.shape[0]
    dev = w13.device
    if g13 is None:
        g13 = torch.ones(e, dtype=torch.float32, device=dev)
    if g2 is None:
        g2 = torch.ones(e, dtype=torch.float32, device=dev)
    g13 = g13.reshape(e, -1)[:, 0].float().contiguous()
    g2 = g2.reshape(e, -1)[:, 0].float().contiguous()
    return W4A16Weights(fmt, w13v, s13v, g13, w2v, s2v, g2, packed=pack, shift13=j13, shift2=j2)


def _use_asm() -> bool:
    if _interpreting():
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


def _gemm(x, W, s, g, out, tw, align, top_k, N, K, fmt, cfg, gated, x_sorted,
          swiglu_limit, num_valid):
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
        HAS_LIMIT=bool(swiglu_limit), USE_ASM=use_asm, INTERP=_interpreting(),
        BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


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
    rsf * sum_k w_k * expert_k(x) with the sum in fp32.
    """
    from .configs import get_config

    T, H = x.shape
    k = topk_ids.shape[1]
    E = weights.num_experts
    I = weights.inter
    assert H == weights.hidden, (H, weights.hidden)
    if weights.packed:
        from .fused_moe_w4a16_frag import fused_moe_w4a16_frag

        return fused_moe_w4a16_frag(x, weights, topk_weights, topk_ids, routed_scaling_factor=routed_scaling_factor,
                                    swiglu_limit=swiglu_limit, config=config or get_config(weights.fmt, T), out=out)
    assert weights.w2.shape[1] == H and weights.w2.shape[2] * 8 == I
    cfg = config or TENSOR_CORE_CONFIG[weights.fmt]
    c1, c2 = cfg["gate_up"], cfg["down"]
    bm = c1["BLOCK_M"]
    assert c2["BLOCK_M"] == bm, "both GEMMs share one alignment"
    x = x.contiguous()
    topk_ids = topk_ids.to(torch.int32).contiguous()
    topk_weights = topk_weights.float().contiguous()
    align = routing.moe_align(topk_ids, E, bm)
    n_rows = align[0].shape[0]
    inter = torch.empty((n_rows, I), dtype=torch.bfloat16, device=x.device)
    num_valid = T * k
    _gemm(x, weights.w13, weights.s13, weights.g13, inter, topk_weights, align, k, I, H,
          weights.fmt, c1, True, False, swiglu_limit, num_valid)
    buf = torch.empty((num_valid, H), dtype=torch.float32, device=x.device)
    _gemm(inter, weights.w2, weights.s2, weights.g2, buf, topk_weights, align, k, H, I,
          weights.fmt, c2, False, True, None, num_valid)
    return combine(buf, topk_ids, E, routed_scaling_factor, out)


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
        buf.stride(0), out.stride(0), BLOCK_H=COMBINE_BLOCK_H, KP=triton.next_power_of_2(k), INTERP=_interpreting(),
        WAIT_PRIOR=wait_prior, num_warps=4, **({"launch_pdl": True} if wait_prior else {}))
    return out


# --------------------------------------------------------------------------
# Torch reference: dequantise to bf16, matmul in fp32.
# --------------------------------------------------------------------------


def _unpack_words(w: torch.Tensor) -> torch.Tensor:
    """int32 [..., K/8] -> int [..., K] nibbles (element 8j+i from bits 4i)."""
    shifts = torch.arange(0, 32, 4, device=w.device, dtype=torch.int32)
    n = (w.unsqueeze(-1) >> shifts) & 0xF
    return n.reshape(*w.shape[:-1], w.shape[-1] * 8)


def e4m3_to_float(s: torch.Tensor) -> torch.Tensor:
    if s.dtype == torch.uint8:
        s = s.view(torch.float8_e4m3fn)
    return s.float()


def dequant_reference(fmt: str, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """One expert: words [N, K/8] (any strides), scales [N, K/group], global
    scalar -> bf16 [N, K] = bf16(code x scale x global)."""
    n = _unpack_words(w.contiguous())
    grp = GROUP_SIZE[fmt]
    if fmt == "nvfp4":
        lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=w.device)
        code = lut[(n & 7).long()] * torch.where(n >= 8, -1.0, 1.0)
        sc = e4m3_to_float(s.contiguous())
    else:
        code = (n - 8).float()
        sc = s.contiguous().float()
    sc = sc.repeat_interleave(grp, dim=-1)[..., : code.shape[-1]]
    return (code * sc * g.float()).to(torch.bfloat16)


def moe_w4a16_reference(
    x: torch.Tensor,
    weights: W4A16Weights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    routed_scaling_factor: float = 1.0,
    swiglu_limit: Optional[float] = None,
) -> torch.Tensor:
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


# --------------------------------------------------------------------------
# Random weights in the checkpoint layouts (tests, self-test, benchmark)
# --------------------------------------------------------------------------


def random_weights(fmt: str, E: int, H: int, I: int, device, seed: int = 0, kn: bool = False,
                   pack: bool = True) -> W4A16Weights:
    """Checkpoint-shaped random weights (pack=False: left in checkpoint word
    order). Scales are chosen so that activations keep unit-ish magnitude
    through both GEMMs."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def words(n, k):
        b = torch.randint(0, 256, (E, n, k // 2), generator=gen, dtype=torch.uint8)
        return b.to(device)

    if fmt == "nvfp4":
        def scales(n, k, target):
            # e4m3 block scales around target / 6 (max code), global scale 1/64
            v = (torch.rand((E, n, k // 16), generator=gen) * 0.5 + 0.75) * target * 64
            return v.to(torch.float8_e4m3fn).view(torch.uint8).to(device)
        w13 = words(2 * I, H)
        w2 = words(H, I)
        s13 = scales(2 * I, H, 1.0 / math.sqrt(H) / 2)
        s2 = scales(H, I, 1.0 / math.sqrt(I) / 2)
        g13 = torch.full((E,), 1.0 / 64, device=device)
        g2 = torch.full((E,), 1.0 / 64, device=device)
        return make_weights(fmt, w13, s13, w2, s2, g13, g2, pack=pack)
    w13 = words(2 * I, H).view(torch.int32)
    w2 = words(H, I).view(torch.int32)
    s13 = ((torch.rand((E, 2 * I, H // 32), generator=gen) * 0.5 + 0.75) / math.sqrt(H) / 4).to(torch.bfloat16).to(device)
    s2 = ((torch.rand((E, H, I // 32), generator=gen) * 0.5 + 0.75) / math.sqrt(I) / 4).to(torch.bfloat16).to(device)
    if kn:  # SGLang's compressed-tensors layout: [E, K/8, N]
        return make_weights(fmt, w13.transpose(1, 2).contiguous(), s13.transpose(1, 2).contiguous(),
                            w2.transpose(1, 2).contiguous(), s2.transpose(1, 2).contiguous(), kn=True, pack=pack)
    return make_weights(fmt, w13, s13, w2, s2, pack=pack)


def weight_bytes_per_expert(fmt: str, H: int, I: int) -> int:
    elems = 3 * H * I
    scale_bytes = 1 if fmt == "nvfp4" else 2
    return elems // 2 + elems // GROUP_SIZE[fmt] * scale_bytes + (8 if fmt == "nvfp4" else 0)


# --------------------------------------------------------------------------
# Self-test and benchmark cases (see registry.py)
# --------------------------------------------------------------------------

_WEIGHT_CACHE: dict = {}


def _model_weights(model, device):
    key = (model.name, str(device))
    if key not in _WEIGHT_CACHE:
        # int4 in SGLang's own compressed-tensors layout ([E, K/8, N]), as the
        # plugin hands it over
        _WEIGHT_CACHE[key] = random_weights(model.fmt, model.local_experts, model.hidden, model.inter,
                                            device, seed=7, kn=model.fmt == "int4")
    return _WEIGHT_CACHE[key]


def _selftest_moe(model, batch, mode):
    from .models import ep_share_routing
    from .registry import CaseResult, compare

    def run(device):
        W = _model_weights(model, device)
        g = torch.Generator().manual_seed(batch)
        x = torch.randn((batch, model.hidden), generator=g).to(torch.bfloat16).to(device)
        if mode == "ep8":
            tw, ids, _ = ep_share_routing(model, batch, device, seed=batch)
        else:  # every slot local, duplicates of experts across tokens
            ids = torch.stack([torch.randperm(model.local_experts, generator=g)[: model.top_k]
                               for _ in range(batch)]).to(torch.int32).to(device)
            tw = (torch.rand((batch, model.top_k), generator=g) + 0.1).to(device)
        rsf = model.routed_scaling_factor
        out = fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=rsf, swiglu_limit=model.swiglu_limit)
        ref = moe_w4a16_reference(x, W, tw, ids, routed_scaling_factor=rsf, swiglu_limit=model.swiglu_limit)
        res = compare(out, ref)
        if mode == "all":
            # the routed scaling factor is applied exactly once
            out1 = fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=1.0, swiglu_limit=model.swiglu_limit)
            lin = compare(out, (out1.float() * rsf), min_cos=0.99999, max_rel=4e-3)
            if not lin.ok:
                return CaseResult(False, f"{res.detail}; out(rsf) != rsf*out(1): {lin.detail}", res.metrics)
            res.detail += f"; rsf-linear {lin.detail}"
        return res

    return run


def selftest_cases():
    from .models import MODELS
    from .registry import SelfTestCase

    cases = []
    for m in MODELS:
        for b in (1, 8, 64, 256):  # 256: 16-token blocks (prefill bucket)
            cases.append(SelfTestCase(f"moe_w4a16[{m.name},{m.fmt},ep8,batch={b}]", _selftest_moe(m, b, "ep8")))
        for b in (1, 32):  # every top-k slot local (one token: the down GEMM sums all k)
            cases.append(SelfTestCase(f"moe_w4a16[{m.name},{m.fmt},all-local,batch={b}]", _selftest_moe(m, b, "all")))
    return cases


def moe_bytes(model, batch: int, n_active: int) -> int:
    """Fewest bytes: the active experts' weights and scales once, x read, out written."""
    return n_active * weight_bytes_per_expert(model.fmt, model.hidden, model.inter) + 2 * 2 * batch * model.hidden


# (fmt, batch) -> {"gate_up": cfg, "down": cfg}; set by bench --tune
_BENCH_CONFIG_OVERRIDE: dict = {}

# candidates for bench --tune: the fragment kernel's launch shapes (warps that
# split K, the next K group's loads issued before this one's MMAs or after,
# down GEMM row tiles per program); one family, both GEMMs share BLOCK_M = 8 NT.
def _frag(nw, pipe, rt=None, nt=1, depth=1):
    c = dict(kernel="frag", NT=nt, num_warps=nw, pipe=pipe)
    if depth != 1:
        c["depth"] = depth
    if rt:
        c["RT"] = rt
    return c


TUNE_FAMILIES = {
    # depth 3 and 4: the register ring only (pipe False)
    "frag": ([_frag(4, False)] + [_frag(nw, p, depth=d) for nw in (2, 4, 8, 16) for p in (True, False)
                                  for d in (1, 2, 3, 4) if (nw, p, d) != (4, False, 1) and (d <= 2 or not p)],
             [_frag(2, False, 2)] + [_frag(nw, p, rt, depth=d) for nw in (1, 2, 4, 8, 16) for p in (True, False)
                                     for rt in (1, 2) for d in (1, 2, 3, 4)
                                     if (nw, p, rt, d) != (2, False, 2, 1) and (d <= 2 or not p)]),
}


def _bench_moe(model, batch):
    from .models import ep_share_routing
    from .registry import BenchSpec, graphed, stream_sets

    def make(device):
        W = _model_weights(model, device)
        tw, ids, active = ep_share_routing(model, batch, device, seed=1000 + batch)
        x = torch.randn((batch, model.hidden), device=device).to(torch.bfloat16)
        kw = dict(routed_scaling_factor=model.routed_scaling_factor, swiglu_limit=model.swiglu_limit)
        out = torch.empty_like(x)
        cfg = _BENCH_CONFIG_OVERRIDE.get((model.fmt, batch))

        def call():
            return fused_moe_w4a16(x, W, tw, ids, out=out, config=cfg, **kw)

        call()
        torch.cuda.synchronize()
        fn = call
        try:
            # decode runs under CUDA graphs in SGLang; time the same way
            fn = graphed(call, warmup=1)
        except Exception as exc:  # keep eager timing, say so
            print(f"# graph capture failed for {model.name} b={batch}: {exc}")
        # in-stream sets: the same batch routed to other local experts (ids
        # shifted), so back-to-back calls read other weights, as successive
        # layers do; enough sets that together they read twice the L2
        nbytes = moe_bytes(model, batch, len(active))
        n_sets = min(stream_sets(nbytes, device), max(2, model.local_experts // len(active)))
        stream_calls = []
        for i in range(n_sets):
            ids_i = torch.where(ids >= 0, (ids + i * len(active)) % model.local_experts, ids)
            x_i = torch.randn((batch, model.hidden), device=device).to(torch.bfloat16)
            out_i = torch.empty_like(x_i)
            stream_calls.append(lambda x_i=x_i, ids_i=ids_i, out_i=out_i:
                                fused_moe_w4a16(x_i, W, tw, ids_i, out=out_i, config=cfg, **kw))
        # the reference reads checkpoint-order words: unpack once, outside the timing
        W_ref = W4A16Weights(W.fmt, W.words("w13"), W.scales("s13"), W.g13, W.words("w2"), W.scales("s2"), W.g2)
        return BenchSpec(
            fn=fn, bytes=nbytes, stream_calls=stream_calls,
            ref_fn=lambda: moe_w4a16_reference(x, W_ref, tw, ids, **kw),
            extra={"model": model.name, "fmt": model.fmt, "active_experts": len(active),
                   "local_slots": int((ids >= 0).sum().item()), "cuda_graph": fn is not call})

    return make


def bench_cases():
    from .models import MODELS
    from .registry import BenchCase

    return [BenchCase(f"moe_w4a16[{m.name},batch={b}]", m.name, b, _bench_moe(m, b))
            for m in MODELS for b in (1, 8, 32, 64)]
