"""A small interpreter for the inline PTX of the fragment kernel: 32-bit logic
(mov, and, or, shl, shr, shf.l.wrap, prmt, lop3, mad.lo), bf16x2 fma, and
mma.sync.m16n8k16 (bf16 in, fp32 accumulate) across a warp's 32 lanes. The
Triton interpreter cannot run inline PTX, so without this the CPU tier never
executes those strings; with it, the exact text the GPU compiles is run on CPU,
value by value, in exact arithmetic with round-to-nearest-even, as the PTX ISA
defines each instruction (the MMA sums exactly, then rounds once: tests give it
sums that fp32 holds exactly, where every summation order agrees).

Registers hold bit patterns as Python ints (32 bits; 16 for .b16 halves).
"""

from __future__ import annotations

import re
from fractions import Fraction

MASK32 = 0xFFFFFFFF


# ---------------------------------------------------------------- number formats
def _round(v: Fraction, mant_bits: int, min_exp: int) -> Fraction:
    """v rounded to nearest even with mant_bits fraction bits, subnormals below 2**min_exp."""
    if v == 0:
        return Fraction(0)
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1  # now 2**e <= a < 2**(e + 1)
    ulp = Fraction(2) ** (max(e, min_exp) - mant_bits)
    q, rem = divmod(a, ulp)
    if rem * 2 > ulp or (rem * 2 == ulp and q % 2 == 1):
        q += 1
    return (q * ulp) * (1 if v > 0 else -1)


def _encode(v: Fraction, exp_bits: int, mant_bits: int, negative_zero: bool = False) -> int:
    """Bits of v, which must be exactly representable (finite, normal or subnormal)."""
    bias = (1 << (exp_bits - 1)) - 1
    sign = 1 if (v < 0 or (v == 0 and negative_zero)) else 0
    a = abs(v)
    if a == 0:
        return sign << (exp_bits + mant_bits)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    if e < 1 - bias:  # subnormal
        m = a / Fraction(2) ** (1 - bias - mant_bits)
        exp_field = 0
    else:
        m = (a / Fraction(2) ** e - 1) * (1 << mant_bits)
        exp_field = e + bias
    assert m.denominator == 1 and exp_field < (1 << exp_bits) - 1, f"{v} not representable"
    return (sign << (exp_bits + mant_bits)) | (exp_field << mant_bits) | int(m)


def _decode(bits: int, exp_bits: int, mant_bits: int) -> Fraction:
    bias = (1 << (exp_bits - 1)) - 1
    sign = -1 if (bits >> (exp_bits + mant_bits)) & 1 else 1
    exp_field = (bits >> mant_bits) & ((1 << exp_bits) - 1)
    m = bits & ((1 << mant_bits) - 1)
    assert exp_field != (1 << exp_bits) - 1, f"inf or nan: {bits:#x}"
    if exp_field == 0:
        return sign * Fraction(m) * Fraction(2) ** (1 - bias - mant_bits)
    return sign * (1 + Fraction(m, 1 << mant_bits)) * Fraction(2) ** (exp_field - bias)


def bf16_value(bits: int) -> Fraction:
    return _decode(bits & 0xFFFF, 8, 7)


def bf16_bits(v: Fraction, negative_zero: bool = False) -> int:
    return _encode(_round(v, 7, -126), 8, 7, negative_zero)


def f32_value(bits: int) -> Fraction:
    return _decode(bits & MASK32, 8, 23)


def f32_bits(v: Fraction) -> int:
    return _encode(_round(v, 23, -126), 8, 23)


def e4m3_value(byte: int) -> Fraction:
    """OCP e4m3 (bias 7, no infinities; 0x7F and 0xFF are NaN)."""
    assert byte & 0x7F != 0x7F, "e4m3 NaN"
    sign = -1 if byte & 0x80 else 1
    e, m = (byte >> 3) & 0xF, byte & 7
    if e == 0:
        return sign * Fraction(m, 8) * Fraction(2) ** -6
    return sign * (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)


# ---------------------------------------------------------------- instructions
def _is_neg_zero_product(a: int, b: int, c: int, va: Fraction, vb: Fraction, vc: Fraction) -> bool:
    """IEEE sign of an exact zero result of a * b + c (round to nearest): -0 only
    when the product is -0 and c is -0."""
    prod_neg = ((a >> 15) ^ (b >> 15)) & 1
    return va * vb == 0 and vc == 0 and prod_neg == 1 and (c >> 15) & 1 == 1


def _fma_bf16(a: int, b: int, c: int) -> int:
    va, vb, vc = bf16_value(a), bf16_value(b), bf16_value(c)
    r = va * vb + vc
    return bf16_bits(r, negative_zero=(r == 0 and _is_neg_zero_product(a, b, c, va, vb, vc)))


def _halves(x: int) -> tuple[int, int]:
    return x & 0xFFFF, (x >> 16) & 0xFFFF


def _split_operands(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


class PTX:
    """Runs a straight-line PTX block. `inputs` maps operand tokens (``$2``,
    ``$W``) to their register bits; after run(), ``regs`` holds every register."""

    OPS = {"mov", "and", "or", "shl", "shr", "shf", "prmt", "lop3", "mad", "fma"}

    def __init__(self, asm: str, inputs: dict[str, int]):
        body = asm.strip()
        if body.startswith("{") and body.endswith("}"):
            body = body[1:-1]
        self.statements = [s.strip() for s in body.split(";") if s.strip()]
        self.regs: dict[str, int] = dict(inputs)

    def value(self, tok: str) -> int:
        if tok in self.regs:
            return self.regs[tok]
        if re.fullmatch(r"0[fF][0-9a-fA-F]{8}", tok):
            return int(tok[2:], 16)
        if re.fullmatch(r"0[xX][0-9a-fA-F]+", tok):
            return int(tok, 16)
        if re.fullmatch(r"-?\d+", tok):
            return int(tok) & MASK32
        raise KeyError(f"register {tok} read before it was written")

    def run(self) -> "PTX":
        for st in self.statements:
            self.step(st)
        return self

    def step(self, st: str) -> None:
        if st.startswith(".reg"):
            return
        opcode, _, rest = st.partition(" ")
        parts = opcode.split(".")
        ops = _split_operands(rest)
        assert parts[0] in self.OPS, f"instruction not modelled: {st}"
        getattr(self, "_" + parts[0])(parts[1:], ops)

    # integer and bit ops (.b32 / .u32)
    def _mov(self, mods, ops):
        dst, src = ops
        if dst.startswith("{"):  # unpack b32 into two 16-bit registers, low first
            lo, hi = [t.strip() for t in dst.strip("{}").split(",")]
            self.regs[lo], self.regs[hi] = _halves(self.value(src))
        elif src.startswith("{"):  # pack two 16-bit registers, low first
            lo, hi = [t.strip() for t in src.strip("{}").split(",")]
            self.regs[dst] = (self.value(lo) & 0xFFFF) | ((self.value(hi) & 0xFFFF) << 16)
        else:
            self.regs[dst] = self.value(src)

    def _and(self, mods, ops):
        self.regs[ops[0]] = self.value(ops[1]) & self.value(ops[2])

    def _or(self, mods, ops):
        self.regs[ops[0]] = self.value(ops[1]) | self.value(ops[2])

    def _shl(self, mods, ops):
        n = self.value(ops[2])
        self.regs[ops[0]] = (self.value(ops[1]) << n) & MASK32 if n < 32 else 0

    def _shr(self, mods, ops):
        assert mods[0] in ("u32", "b32"), f"only logical shifts are modelled: shr.{mods[0]}"
        n = self.value(ops[2])
        self.regs[ops[0]] = self.value(ops[1]) >> n if n < 32 else 0

    def _shf(self, mods, ops):  # funnel shift: the upper 32 bits of (b:a) << n
        assert mods[:2] == ["l", "wrap"], f"shf.{'.'.join(mods)} not modelled"
        d, a, b, n = ops
        n = self.value(n) & 31
        self.regs[d] = (((self.value(b) << 32 | self.value(a)) << n) >> 32) & MASK32

    def _prmt(self, mods, ops):  # default mode: selector nibble i picks byte i of (b:a); bit 3 replicates its sign
        assert mods == ["b32"], f"prmt.{'.'.join(mods)} not modelled"
        d, a, b, c = ops
        src, sel = (self.value(b) << 32) | self.value(a), self.value(c)
        r = 0
        for i in range(4):
            nib = (sel >> (4 * i)) & 0xF
            byte = (src >> (8 * (nib & 7))) & 0xFF
            if nib & 8:
                byte = 0xFF if byte & 0x80 else 0
            r |= byte << (8 * i)
        self.regs[d] = r

    def _lop3(self, mods, ops):
        d, a, b, c, lut = ops
        a, b, c, lut = self.value(a), self.value(b), self.value(c), self.value(lut)
        r = 0
        for bit in range(32):
            idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
            r |= ((lut >> idx) & 1) << bit
        self.regs[d] = r

    def _mad(self, mods, ops):  # the low 32 bits of a * b + c
        assert mods in (["lo", "u32"], ["lo", "s32"]), f"mad.{'.'.join(mods)} not modelled"
        d, a, b, c = ops
        self.regs[d] = (self.value(a) * self.value(b) + self.value(c)) & MASK32

    # floating point
    def _fma(self, mods, ops):
        assert mods == ["rn", "bf16x2"], f"fma.{'.'.join(mods)} not modelled"
        d, a, b, c = (self.value(t) if i else t for i, t in enumerate(ops))
        lo = _fma_bf16(a & 0xFFFF, b & 0xFFFF, c & 0xFFFF)
        hi = _fma_bf16(a >> 16, b >> 16, c >> 16)
        self.regs[d] = lo | (hi << 16)


# ---------------------------------------------------------------- a warp
MMA_BF16 = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"


def _vector(tok: str) -> list[str]:
    return [t.strip() for t in tok.strip("{}").split(",")]


def run_warp(asm: str, lane_inputs: list[dict[str, int]]) -> list[dict[str, int]]:
    """Run `asm` on 32 lanes in lockstep (inputs per lane); each mma.sync
    gathers its fragments from all lanes. Returns every lane's registers."""
    assert len(lane_inputs) == 32
    lanes = [PTX(asm, inputs) for inputs in lane_inputs]
    for st in lanes[0].statements:
        if not st.startswith("mma.sync"):
            for lane in lanes:
                lane.step(st)
            continue
        opcode, _, rest = st.partition(" ")
        assert opcode == MMA_BF16, f"mma not modelled: {opcode}"
        d, a, b, c = (_vector(t) for t in _split_operands(rest))
        # fragments (PTX ISA, m16n8k16 .bf16): lane = 4 g + q
        A = [[None] * 16 for _ in range(16)]
        B = [[None] * 8 for _ in range(16)]
        C = [[None] * 8 for _ in range(16)]
        for i, lane in enumerate(lanes):
            g, q = divmod(i, 4)
            for r in range(4):  # a_r: row g + 8 (r & 1), k 2q + 8 (r >> 1) + half
                for half in range(2):
                    A[g + 8 * (r & 1)][2 * q + 8 * (r >> 1) + half] = bf16_value(lane.value(a[r]) >> (16 * half))
            for r in range(2):  # b_r: k 2q + 8 r + half, column g
                for half in range(2):
                    B[2 * q + 8 * r + half][g] = bf16_value(lane.value(b[r]) >> (16 * half))
            for r in range(4):  # c_r: row g + 8 (r >> 1), column 2q + (r & 1)
                C[g + 8 * (r >> 1)][2 * q + (r & 1)] = f32_value(lane.value(c[r]))
        for i, lane in enumerate(lanes):
            g, q = divmod(i, 4)
            for r in range(4):
                m, n = g + 8 * (r >> 1), 2 * q + (r & 1)
                lane.regs[d[r]] = f32_bits(sum((A[m][k] * B[k][n] for k in range(16)), C[m][n]))
    return [lane.regs for lane in lanes]
