"""Expert weights of one MoE layer: the checkpoint tensors wrapped
(``make_weights``, what the plugin calls) and, where the shapes allow, packed
once at load time into the fragment order the fragment kernel reads
(``frag_pack``, ``frag_pack_scales``; their inverses give the checkpoint
layout back for the reference).

Fragment layout (``frag_pack``), per expert: ``[N/16, K/64, 32, 4]`` int32, the
last index the K tile j within the group. Tile (r, group kg, j) covers rows
16r .. 16r + 15 and the 16 columns 64kg + 16q + 4j + 2ch + hi (q = 0..3,
ch, hi = 0..1) in the MMA's column order c = 8ch + 2q + hi. Lane l (g = l // 4,
q = l % 4) holds the A values (row, c) (g, 2q), (g+8, 2q), (g, 2q+8), (g+8, 2q+8)
(the low halves of the bf16x2 registers a_0 .. a_3 of the A fragment) and
(g, 2q+1), (g+8, 2q+1), (g, 2q+9), (g+8, 2q+9) (their high halves): INT4 as
nibbles 0 .. 7 in that order; NVFP4 with each value's sign and exponent/mantissa
bits where few shifts move them into bf16 position (NVFP4_PIECES).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .formats import FORMATS, GROUP_SIZE, e4m3_to_float

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
        return frag_unpack(w, self.fmt)

    def scales(self, which: str) -> torch.Tensor:
        """s13 or s2 as [E, N, K/group] (unpacked again if packed)."""
        s = getattr(self, which)
        if not self.packed:
            return s
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
    pack: put the words in fragment order (frag_pack, a
    copy) when both GEMMs' shapes allow it; such weights run on the fragment
    kernel at every batch size, others on the tensor-core GEMM below."""
    assert fmt in FORMATS
    w13v, w2v = _as_words(w13, kn), _as_words(w2, kn)
    s13v, s2v = _as_scales(s13, kn), _as_scales(s2, kn)
    if pack and packable(w13v.shape[1], w13v.shape[2] * 8) and packable(w2v.shape[1], w2v.shape[2] * 8):
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


# --------------------------------------------------------------------------
# Packing (host, once per layer at load time)
# --------------------------------------------------------------------------


# NVFP4 words: _NVFP4_A builds register a_r of the A fragment as the OR of
# masked copies of the word (op, amount, mask), each putting bits at bf16 bit
# 15 (sign) and bits 6-8 (exponent and mantissa) of both 16-bit halves (the
# low and high value). frag_pack stores each value's bits where its register's
# pieces take them from (NVFP4_BIT_SOURCE). a0 is the word masked, a1 and a2 one
# copy each, a3 two: 9 integer instructions per word; 2-bit shifts are the
# fewest that tile the word (no four rotations of one 4-bit pattern do).
_NVFP4_FIELDS = 0x81C081C0  # bits 6-8 and 15 of each half
NVFP4_PIECES = (
    (("shl", 0, _NVFP4_FIELDS),),
    (("shl", 6, _NVFP4_FIELDS),),
    (("rotl", 12, _NVFP4_FIELDS),),
    (("shl", 2, 0x80C080C0), ("shr", 6, 0x01000100)),
)


def _nvfp4_bit_source() -> tuple:
    """For value i (= 4 hi + r) and nibble bit b (0: mantissa, 1-2: exponent,
    3: sign): the word bit that a_r's pieces move to bf16 bit 6 + b (sign: 15)
    of half hi."""
    table = []
    for i in range(8):
        hi, r = divmod(i, 4)
        row = []
        for b in range(4):
            dst = 16 * hi + (15 if b == 3 else 6 + b)
            op, k, _ = next(pc for pc in NVFP4_PIECES[r] if pc[2] >> dst & 1)
            src = {"shl": dst - k, "shr": dst + k, "rotl": (dst - k) % 32}[op]
            assert 0 <= src < 32, (i, b, op, k)
            row.append(src)
        table.append(tuple(row))
    assert sorted(p for row in table for p in row) == list(range(32)), "NVFP4 pieces must tile the word"
    return tuple(table)


NVFP4_BIT_SOURCE = _nvfp4_bit_source()


def frag_pack(words: torch.Tensor, fmt: str) -> torch.Tensor:
    """int32 [E, N, K/8] (nibble i of word j = K index 8j + i) ->
    int32 [E, N/16, K/64, 32, 4] in the order described above. INT4 words hold
    register a_r's two values as nibbles r and r + 4; NVFP4 words put each
    value's four bits where _NVFP4_A takes them from (NVFP4_BIT_SOURCE). One
    expert at a time, so the temporary is one expert's nibbles."""
    E, N, KW = words.shape
    K = KW * 8
    assert N % 16 == 0 and K % 64 == 0, (N, K)
    out = torch.empty((E, N // 16, K // 64, 32, 4), dtype=torch.int32, device=words.device)
    shifts = _bit_positions(fmt, words.device)
    for e in range(E):
        nib = ((words[e].unsqueeze(-1) >> torch.arange(0, 32, 4, device=words.device, dtype=torch.int32)) & 0xF)
        # row = 16 rt + 8 rh + g; column = 64 kg + 16 q + 4 j + 2 ch + hi
        n8 = nib.reshape(N, K).view(N // 16, 2, 8, K // 64, 4, 4, 2, 2)  # rt rh g kg q j ch hi
        n8 = n8.permute(0, 3, 2, 4, 5, 7, 6, 1)  # rt kg g q j | hi ch rh: value i = 4 hi + 2 ch + rh
        n8 = n8.reshape(N // 16, K // 64, 32, 4, 8).to(torch.int64)
        if fmt == "nvfp4":  # shifts [8 values, 4 nibble bits]
            packed = (((n8[..., None] >> torch.arange(4, device=n8.device)) & 1) << shifts).sum((-1, -2))
        else:
            packed = (n8 << shifts).sum(-1)
        out[e] = torch.where(packed < 2**31, packed, packed - 2**32).to(torch.int32)
    return out


# NVFP4 scale fragments: each e4m3 block scale s (unsigned, as NVFP4 defines
# them) is stored as the byte c whose bf16 c * 16 + NVFP4_SCALE_BASE is
# s * 2**119 exactly. c has 5 exponent and 3 mantissa bits, so e4m3's
# subnormals are normal numbers here (for a normal e4m3 byte, c = byte + 16),
# and zero is NVFP4_SCALE_ZERO (bf16 -0.0: the products are zero). A lane's
# two rows then decode in a prmt and a multiply-add each (_NVFP4_SCALES).
NVFP4_SCALE_BASE = 0x7680  # bf16 exponent field 237 = 127 + 119 - 9
NVFP4_SCALE_ZERO = 0x98  # 0x98 * 16 + 0x7680 = 0x8000
NVFP4_SCALE_NEG_ZERO = 0x99  # -2**-129: every product rounds to -0 or 0


def _nvfp4_scale_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """(encode: e4m3 byte -> c, -1 for negative or NaN scales; decode: c -> e4m3 byte)."""
    enc, dec = [-1] * 256, [0x7F] * 256
    values = e4m3_to_float(torch.arange(256, dtype=torch.int32).to(torch.uint8)).tolist()
    for byte, v in enumerate(values):
        if byte in (0, 0x80):
            c = NVFP4_SCALE_ZERO if byte == 0 else NVFP4_SCALE_NEG_ZERO
        elif v > 0 and math.isfinite(v):
            f, e = math.frexp(v)  # v = f * 2**e, 0.5 <= f < 1
            c = ((e - 1 + 9) << 3) | int((2 * f - 1) * 8)
            bits = c * 16 + NVFP4_SCALE_BASE
            assert c < 0x90 and (1 + (bits & 0x7F) / 128) * 2.0 ** ((bits >> 7) - 127) == v * 2.0**119, hex(byte)
        else:  # negative, NaN
            continue
        enc[byte], dec[c] = c, byte
    return torch.tensor(enc, dtype=torch.int32), torch.tensor(dec, dtype=torch.int32)


_NVFP4_SCALE_ENCODE, _NVFP4_SCALE_DECODE = _nvfp4_scale_tables()


# INT4 scale fragments hold s * 2**133 (rows g) and s * 2**129 (rows g + 8) as
# bf16, which needs |s| < 2**-5; make_weights divides a layer's scales by
# 2**int4_headroom(s) (W4A16Weights.shift13 / shift2), and the kernel multiplies
# its sums by that power of two (g_mult).
INT4_ROW_SHIFT = (133, 129)


def int4_headroom(s: torch.Tensor) -> int:
    """The power of two j such that every INT4 scale / 2**j is below 2**-5 in
    magnitude (0 for every real checkpoint seen: group scales are ~1e-3)."""
    top = float(s.float().abs().max()) if s.numel() else 0.0
    if top < 2.0**-5:
        return 0
    return int(torch.floor(torch.log2(torch.tensor(top)))) + 6

def _times_pow2(t: torch.Tensor, k: int) -> torch.Tensor:
    """t * 2**k in two exact steps (2**133 is not a finite fp32)."""
    return t * 2.0 ** (k // 2) * 2.0 ** (k - k // 2)


def frag_pack_scales(s: torch.Tensor, fmt: str) -> torch.Tensor:
    """Block scales [E, N, G] (e4m3 bytes as uint8, or bf16) -> int16
    [E, N/16, K/64, 32]: what lane (g, q) of row tile rt needs for K group kg,
    so a warp's scales of a K group are one 64-byte load. NVFP4: the bytes of
    rows g (low byte) and g + 8 (high) for its 16 columns' group 4 kg + q,
    each e4m3 scale recoded as _NVFP4_SCALES decodes it (NVFP4_SCALE_BASE).
    INT4: row g + 8 (q & 1)'s scale for group 2 kg + q // 2, so lanes q and
    q ^ 1 together hold rows g and g + 8 of one group, which each of them reads
    as one 32-bit load; as the bf16 of s * 2**133 (rows g) or s * 2**129 (rows
    g + 8), what _INT4_A multiplies its masked nibbles by (|s| < 2**-5). Same
    size as the checkpoint's."""
    E, N, G = s.shape
    per_kg = 4 if fmt == "nvfp4" else 2
    assert N % 16 == 0 and G % per_kg == 0, (s.shape, fmt)
    KG = G // per_kg
    if fmt == "nvfp4":
        b = _NVFP4_SCALE_ENCODE.to(s.device)[s.contiguous().view(torch.uint8).to(torch.long)]
        if bool((b < 0).any()):
            bad = int(s.contiguous().view(torch.uint8).flatten()[int((b.flatten() < 0).nonzero()[0])])
            raise ValueError(f"NVFP4 block scales must be non-negative e4m3 numbers (ue4m3, as ModelOpt writes "
                             f"them); found {int((b < 0).sum())} negative or NaN, the first byte {bad:#04x}. Fix: "
                             "export the checkpoint's weight_scale tensors as amax / 6 / global scale, unsigned")
        b = b.view(E, N // 16, 2, 8, KG, 4)  # rt rh g kg q
        out = b[:, :, 0] | (b[:, :, 1] << 8)  # e rt g kg q
        out = out.permute(0, 1, 3, 2, 4)  # e rt kg g q
    else:
        assert int4_headroom(s) == 0, (f"INT4 scales up to {float(s.float().abs().max())}: divide them by "
                                       "2**int4_headroom(s) first (make_weights does: W4A16Weights.shift13 / shift2)")
        f = s.float().view(E, N // 16, 2, 8, G)  # rt rh g group
        f = torch.stack([_times_pow2(f[:, :, rh], k) for rh, k in enumerate(INT4_ROW_SHIFT)], dim=2)
        b = f.to(torch.bfloat16).view(torch.int16).view(E, N // 16, 2, 8, KG, 2)  # rt rh g kg qh
        out = b.permute(0, 1, 4, 3, 5, 2)  # e rt kg g qh rh: lane q = 2 qh + rh
    out = out.reshape(E, N // 16, KG, 32)
    return torch.where(out >= 2**15, out - 2**16, out).to(torch.int16).contiguous()


def frag_unpack_scales(sf: torch.Tensor, fmt: str) -> torch.Tensor:
    """Inverse of frag_pack_scales (tests, the reference): [E, N, G] uint8 or bf16."""
    E, RT, KG, _ = sf.shape
    v = sf.to(torch.int32) & 0xFFFF
    if fmt == "nvfp4":
        v = v.view(E, RT, KG, 8, 4).permute(0, 1, 3, 2, 4)  # e rt g kg q
        out = torch.stack((v & 0xFF, v >> 8), dim=2)  # e rt rh g kg q
        out = _NVFP4_SCALE_DECODE.to(out.device)[out.to(torch.long)]
        return out.reshape(E, RT * 16, KG * 4).to(torch.uint8)
    v = v.view(E, RT, KG, 8, 2, 2).permute(0, 1, 5, 3, 2, 4)  # e rt rh g kg qh
    f = torch.where(v >= 2**15, v - 2**16, v).to(torch.int16).view(torch.bfloat16).float()
    f = torch.stack([_times_pow2(f[:, :, rh], -k) for rh, k in enumerate(INT4_ROW_SHIFT)], dim=2)
    return f.reshape(E, RT * 16, KG * 2).to(torch.bfloat16)


def _bit_positions(fmt: str, device):
    """Where value i (= 4 hi + r) of a word sits: INT4 nibble 4i; NVFP4
    [8, 4], the word bit of each of its nibble's bits (NVFP4_BIT_SOURCE)."""
    if fmt == "nvfp4":
        return torch.tensor(NVFP4_BIT_SOURCE, device=device, dtype=torch.int64)
    return torch.arange(0, 32, 4, device=device, dtype=torch.int64)


def frag_unpack(frag: torch.Tensor, fmt: str) -> torch.Tensor:
    """Inverse of frag_pack (tests, the reference)."""
    E, RT, KG, _, _ = frag.shape
    N, K = RT * 16, KG * 64
    shifts = _bit_positions(fmt, frag.device)
    nib_shifts = torch.arange(0, 32, 4, device=frag.device, dtype=torch.int64)
    out = torch.empty((E, N, K // 8), dtype=torch.int32, device=frag.device)
    for e in range(E):
        w = frag[e].to(torch.int64).unsqueeze(-1) & 0xFFFFFFFF  # rt kg lane j | value
        if fmt == "nvfp4":
            nib = (((w[..., None] >> shifts) & 1) << torch.arange(4, device=w.device)).sum(-1)
        else:
            nib = (w >> shifts) & 0xF
        nib = nib.view(RT, KG, 8, 4, 4, 2, 2, 2)  # rt kg g q j hi ch rh
        nib = nib.permute(0, 7, 2, 1, 3, 4, 6, 5).reshape(N, K // 8, 8)
        packed = (nib << nib_shifts).sum(-1)
        out[e] = torch.where(packed < 2**31, packed, packed - 2**32).to(torch.int32)
    return out




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


