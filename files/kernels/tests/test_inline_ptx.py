"""The kernels' inline PTX, run on CPU (tests/ptx_sim.py; the Triton interpreter
cannot run PTX). Fragment kernel: the dequantisation the GPU compiles puts exactly
the reference's weight values, at the positions frag_pack assigns, into the A
registers mma.sync.m16n8k16 reads; the NVFP4 scale conversion is exact for
every e4m3 byte; and the whole one-word asm (dequantisation, then one or two
MMAs with their operands wired) run on a warp over a K group gives W @ x.
Tensor-core GEMM (the fallback for shapes the fragment order does not fit): its
dequantisation of a checkpoint-order word gives the reference's eight values."""

import os
import random
from fractions import Fraction

import pytest
import torch
from ptx_sim import PTX, bf16_bits, bf16_value, e4m3_value, f32_value, run_warp

from sm120_kernels import fused_moe_w4a16_frag as F, gemm_tensor_core as TC, weights as P

# the simulated text is what compiles; one tier is enough
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="pure Python; runs in the compiler tier")

FP4_MAGNITUDE = [Fraction(v) for v in ("0", "0.5", "1", "1.5", "2", "3", "4", "6")]
NVFP4_SCALE_SHIFT = Fraction(2) ** 119  # the scale registers carry e4m3 * 2**119 ...
NVFP4_VALUE_SHIFT = Fraction(2) ** -7  # ... so a dequantised value is code * scale * 2**-7


def fp4_value(code: int) -> Fraction:
    return (-1 if code & 8 else 1) * FP4_MAGNITUDE[code & 7]


def rounded_bf16(v: Fraction) -> Fraction:
    return bf16_value(bf16_bits(v))


def dequant_registers(fmt: str, word: int, scale_regs: tuple) -> list[int]:
    """a0..a3 of the one-tile MMA asm for one lane, the MMA itself left out."""
    asm = F._mma_asm(fmt, 1).strip()[1:-1]
    body = ";".join(st for st in asm.split(";") if not st.strip().startswith("mma.sync"))
    inputs = {"$4": word & 0xFFFFFFFF, **{f"${5 + i}": v for i, v in enumerate(scale_regs)}}
    sim = PTX(body, inputs).run()
    return [sim.regs[f"a{r}"] for r in range(4)]


def nvfp4_scale_register(lo: int, hi: int) -> int:
    """_NVFP4_SCALES on a lane's fragment, as frag_pack_scales stores the e4m3
    scales of rows g (lo) and g + 8 (hi)."""
    code = [int(P._NVFP4_SCALE_ENCODE[b]) for b in (lo, hi)]
    assert min(code) >= 0, (lo, hi)
    return PTX(F._NVFP4_SCALES, {"$1": code[0] | (code[1] << 8)}).run().regs["$0"]


def int4_scale_registers(s_g: int, s_g8: int) -> tuple[int, int]:
    """The INT4 scale fragment as frag_pack_scales stores the bf16 scales of rows
    g and g + 8 (times 2**133 and 2**129), and _INT4_SCALES's -8 s from it."""
    frag = bf16_bits(bf16_value(s_g) * Fraction(2) ** 133) | (bf16_bits(bf16_value(s_g8) * Fraction(2) ** 129) << 16)
    return frag, PTX(F._INT4_SCALES, {"$1": frag}).run().regs["$0"]


def lane_scales(fmt: str, scale_raw: list[int], g: int) -> tuple:
    """The scale registers of lanes 4g .. 4g + 3 (rows g and g + 8), as the kernel
    makes them from the raw scales (bf16 bits for INT4, e4m3 bytes for NVFP4)."""
    if fmt == "int4":
        return int4_scale_registers(scale_raw[g], scale_raw[g + 8])
    return (nvfp4_scale_register(scale_raw[g], scale_raw[g + 8]),)


def packed_tile(fmt: str, rows: int, cols: int):
    """Random 4-bit codes [rows, cols] (nibble i of word j = column 8j + i) and
    frag_pack's words for them, [lane, word] of the one row tile and K group."""
    codes = torch.randint(0, 16, (rows, cols), dtype=torch.int64)
    words = (codes.view(rows, cols // 8, 8) << torch.arange(0, 32, 4)).sum(-1)
    words = torch.where(words < 2**31, words, words - 2**32).to(torch.int32)
    return codes, P.frag_pack(words.unsqueeze(0), fmt)[0, 0, 0]


def test_nvfp4_scale_decode_is_exact_for_every_e4m3_scale():
    """frag_pack_scales' code and _NVFP4_SCALES give s * 2**119 exactly for every
    non-negative e4m3 scale, subnormals included, in the half of its row; -0
    gives a scale whose products with every code are zero."""
    bytes_ = [b for b in range(0x7F)] + [0x80]  # every non-negative e4m3 but NaN, and -0
    for lo, hi in zip(bytes_, reversed(bytes_)):
        reg = nvfp4_scale_register(lo, hi)
        for half, byte in ((reg & 0xFFFF, lo), (reg >> 16, hi)):
            if byte == 0x80:
                for mag in range(8):  # code * 2**-126 times S rounds to zero
                    sim = PTX("fma.rn.bf16x2 d, u, s, nz", {"u": mag << 6, "s": half, "nz": 0x8000}).run()
                    assert bf16_value(sim.regs["d"] & 0xFFFF) == 0, (hex(half), mag)
                continue
            assert bf16_value(half) == e4m3_value(byte) * NVFP4_SCALE_SHIFT, (hex(byte), hex(half))


def test_nvfp4_scale_decode_is_two_instructions():
    """Per K group: one prmt and one multiply-add for both rows' scales."""
    ops = [st.split()[0] for st in F._NVFP4_SCALES.strip("{} \n").split(";") if st.strip()
           and not st.strip().startswith(".reg")]
    assert ops == ["prmt.b32", "mad.lo.u32"], ops
    ops4 = [st.split()[0] for st in F._INT4_SCALES.strip("{} \n").split(";") if st.strip()
            and not st.strip().startswith((".reg", "mov"))]
    assert ops4 == ["fma.rn.bf16x2"], ops4


def _random_bf16_scale(rng: random.Random) -> int:
    """A bf16 scale of either sign (normal, exponent 2**-30 .. 2**-6, below the
    INT4 fragments' 2**-5) with a random mantissa."""
    return (rng.randint(0, 1) << 15) | ((rng.randint(127 - 30, 127 - 6)) << 7) | rng.randint(0, 127)


@pytest.mark.parametrize("fmt", ["int4", "nvfp4"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dequantised_fragment_matches_reference(fmt, seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    rows, cols = 16, 64  # one row tile, one K group: 32 lanes x 4 words
    codes, packed = packed_tile(fmt, rows, cols)
    if fmt == "int4":
        scale_raw = [_random_bf16_scale(rng) for _ in range(rows)]
        scale = [bf16_value(b) for b in scale_raw]
    else:
        scale_raw = [rng.randint(0, 0x7E) for _ in range(rows)]
        scale_raw[3], scale_raw[10], scale_raw[12] = 0, 0x80, 0x01  # zero, -0, the smallest subnormal
        scale = [e4m3_value(b) for b in scale_raw]
    seen = set()
    for lane in range(32):
        g, q = divmod(lane, 4)
        scale_regs = lane_scales(fmt, scale_raw, g)
        for j in range(4):
            regs = dequant_registers(fmt, int(packed[lane, j]), scale_regs)
            for r in range(4):
                rh, ch = r & 1, r >> 1
                for half in range(2):
                    # mma.sync.m16n8k16 A: a_r holds row g + 8 rh, k 2q + 8 ch + half of tile j,
                    # which frag_pack fills from column 16 q + 4 j + 2 ch + half
                    row, col = g + 8 * rh, 16 * q + 4 * j + 2 * ch + half
                    code = int(codes[row, col])
                    got = bf16_value((regs[r] >> (16 * half)) & 0xFFFF)
                    if fmt == "int4":
                        want = rounded_bf16((code - 8) * scale[row])  # rounded once, as the reference
                    else:
                        want = fp4_value(code) * scale[row] * NVFP4_VALUE_SHIFT  # exact
                    assert got == want, (fmt, lane, j, r, half, code, float(got), float(want))
                    seen.add((row, col))
    assert len(seen) == rows * cols  # every weight of the tile reached a register once


def _bf16_pair(lo: Fraction, hi: Fraction) -> int:
    return bf16_bits(lo) | (bf16_bits(hi) << 16)


@pytest.mark.parametrize("fmt", ["int4", "nvfp4"])
@pytest.mark.parametrize("nt", [1, 2])
def test_whole_mma_asm_computes_one_k_group(fmt, nt):
    """The full one-word asm (dequantise, then nt MMAs) over the four words of a
    K group, run on a warp: the accumulators hold W @ x for 16 rows and 8 nt
    tokens, with the lane's B registers loaded as the kernel loads them (token
    pairs 8q + 2j and + 1 of the group, in int32 units). Inputs are chosen so
    fp32 holds every partial sum exactly, which makes the check exact."""
    rng = random.Random(7 * nt + (fmt == "nvfp4"))
    torch.manual_seed(nt)
    rows, cols, tokens = 16, 64, 8 * nt
    codes, packed = packed_tile(fmt, rows, cols)
    x = [[Fraction(rng.randint(-4, 4)) for _ in range(cols)] for _ in range(tokens)]
    if fmt == "int4":
        scale_raw = [bf16_bits(Fraction(2) ** -rng.randint(6, 10)) for _ in range(rows)]
        scale = [bf16_value(b) for b in scale_raw]
        weight = [[(int(codes[m, k]) - 8) * scale[m] for k in range(cols)] for m in range(rows)]
    else:
        scale_raw = [(rng.randint(5, 9) << 3) | rng.randint(0, 7) for _ in range(rows)]  # 2**-2 .. 2**2
        scale = [e4m3_value(b) for b in scale_raw]
        weight = [[fp4_value(int(codes[m, k])) * scale[m] * NVFP4_VALUE_SHIFT for k in range(cols)]
                  for m in range(rows)]
    n_out = 4 * nt
    acc = [[0] * n_out for _ in range(32)]
    for j in range(4):
        inputs = []
        for lane in range(32):
            g, q = divmod(lane, 4)
            scale_regs = lane_scales(fmt, scale_raw, g)  # the word's operand, then these
            b = n_out + 1 + len(scale_regs)  # the first B operand
            regs = {f"${n_out}": int(packed[lane, j]) & 0xFFFFFFFF}
            regs.update({f"${n_out + 1 + i}": v for i, v in enumerate(scale_regs)})
            for t in range(nt):  # the token of this lane in n8 tile t: 8 t + g
                row = x[8 * t + g]
                b0 = 8 * q + 2 * j  # int32 index within the group: bf16 elements 2 b0, 2 b0 + 1
                regs[f"${b + 2 * t}"] = _bf16_pair(row[2 * b0], row[2 * b0 + 1])
                regs[f"${b + 1 + 2 * t}"] = _bf16_pair(row[2 * b0 + 2], row[2 * b0 + 3])
            for i in range(n_out):
                regs[f"${b + 2 * nt + i}"] = acc[lane][i]
            inputs.append(regs)
        out = run_warp(F._mma_asm(fmt, nt), inputs)
        acc = [[out[lane][f"${i}"] for i in range(n_out)] for lane in range(32)]
    for lane in range(32):
        g, q = divmod(lane, 4)
        for t in range(nt):
            for r in range(4):
                m, n = g + 8 * (r >> 1), 8 * t + 2 * q + (r & 1)
                want = sum(weight[m][k] * x[n][k] for k in range(cols))
                assert f32_value(acc[lane][4 * t + r]) == want, (fmt, nt, lane, t, r)


@pytest.mark.parametrize("fmt", ["int4", "nvfp4"])
def test_tensor_core_gemm_dequantisation(fmt):
    """_DQ8_INT4 / _DQ8_NVFP4: nibble i of a checkpoint word -> output $i, times the scale the
    GEMM passes ($9: the bf16 scale; NVFP4: e4m3 * 2**119, as _cvt_scale makes it)."""
    rng = random.Random(11)
    asm = TC._DQ8_INT4 if fmt == "int4" else TC._DQ8_NVFP4
    words = [sum(((i + k) % 16) << (4 * i) for i in range(8)) for k in range(16)]  # every code at every nibble
    words += [rng.getrandbits(32) for _ in range(48)]
    for word in words:
        if fmt == "int4":
            s_bits = _random_bf16_scale(rng)
            scale = bf16_value(s_bits)
        else:
            byte = rng.randint(0, 0x7E)
            s_bits = bf16_bits(e4m3_value(byte) * NVFP4_SCALE_SHIFT)
            scale = e4m3_value(byte)
        sim = PTX(asm, {"$8": word, "$9": s_bits}).run()
        for i in range(8):
            code = (word >> (4 * i)) & 0xF
            if fmt == "int4":
                want = rounded_bf16((code - 8) * scale)
            else:
                want = fp4_value(code) * scale * NVFP4_VALUE_SHIFT
            assert bf16_value(sim.regs[f"${i}"]) == want, (fmt, hex(word), i, code)
