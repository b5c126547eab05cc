"""The two 4-bit weight formats, their dequantisation in torch (the
reference) and the Triton helpers the kernels share.

* ``nvfp4``: ModelOpt NVFP4 (DeepSeek-V4-Flash). e2m1 codes, two per byte, the
  first element in the low nibble; one e4m3 scale per 16 values along K; one
  fp32 global scale per expert (``weight_scale_2``).
* ``int4``: compressed-tensors pack-quantized, symmetric, group 32 (Kimi-K2.5).
  Eight unsigned nibbles per int32 (value + 8), the first element in the low
  bits; one bf16 scale per 32 values along K.

In both formats the nibble at bits [4i, 4i+4) of int32 word j holds K index
8j + i.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

FORMATS = ("nvfp4", "int4")
GROUP_SIZE = {"nvfp4": 16, "int4": 32}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def interpreting() -> bool:
    """Under TRITON_INTERPRET=1 (no PTX: the kernels take their plain paths)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# --------------------------------------------------------------------------
# Triton helpers
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



# --------------------------------------------------------------------------
# Torch reference: dequantise to bf16
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
