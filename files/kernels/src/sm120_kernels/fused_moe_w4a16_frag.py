"""W4A16 MoE expert GEMMs on the tensor cores from registers: fragment-packed
4-bit weights, one ``mma.sync.m16n8k16`` per 32-bit word and lane.

Decode MoE is a stream of 4-bit weights past a handful of tokens. What limits it
is keeping enough weight bytes in flight and spending few instructions and few
L1 transactions per weight, not arithmetic. This kernel therefore

* stores each expert's weights once, at load time, in the order the tensor
  core's A fragment wants them (``frag_pack``): for a 16-row x 16-column tile
  each of the 32 lanes owns one int32 word holding exactly its eight A values,
  and the four K tiles of a 64-column group are one 16-byte load per lane. No
  shared memory, no shuffles: a warp reads 512 contiguous bytes per row tile
  and K group;
* permutes K inside each 64-column group (weights at pack time, so the
  activations need no copy) so that a lane's B registers for the whole group
  are 32 contiguous bytes of its token's row: two 16-byte loads, skipped for
  padding token slots;
* dequantises a word into the four bf16x2 A registers with inline PTX, the
  row's block scale applied in the same bf16x2 fma, and runs one
  ``mma.sync.m16n8k16`` (fp32) against up to 8 tokens (``NT`` = 2: 16 tokens,
  the A registers reused); the expert's global scale once at the end;
* splits K over the warps of a program (warp w takes groups w, w + NW, ...),
  keeps DEPTH groups' words in flight per warp (registers, or a shared-memory
  ring with BULK), and adds the warps' partial sums once, after the K loop.

Weights come packed by ``weights.frag_pack`` (the layout is described there).
The lane's B registers for tile j are its token's bf16 pairs 32kg + 8q + 2j
(b0) and + 1 (b1), in int32 units.

``frag_gemm`` is one GEMM launch; ``fused_moe_w4a16`` chains them with the
alignment and the combine. Under ``TRITON_INTERPRET=1`` (which
cannot run PTX) the loads are plain loads and the MMA is computed from the
warp's 32 lanes with reshapes, so the interpreter tier checks the same packing
and indexing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .configs import DEPENDENT_LAUNCHES, register_cap
from .formats import FORMATS, _fp4_val, _to_bf16, interpreting
from .weights import NVFP4_PIECES, NVFP4_SCALE_BASE

_SCALE_BASE = tl.constexpr(NVFP4_SCALE_BASE)


# --------------------------------------------------------------------------
# Inline PTX (GPU) and its interpreter equivalent
# --------------------------------------------------------------------------

# NVFP4: register a_r's two values moved to bf16 bit 15 (sign) and bits 6-8
# (exponent and mantissa) by NVFP4_PIECES: a bf16 of code * 2**-126 (a
# subnormal for e = 0), then times the row's block scale * 2**119 in the same
# fma: code * scale * 2**-7, exact (at most 6 significant bits). 13
# instructions per word.
def _nvfp4_a() -> str:
    ptx = {"shl": "shl.b32 {d}, q, {k};", "shr": "shr.u32 {d}, q, {k};", "rotl": "shf.l.wrap.b32 {d}, q, q, {k};"}
    lines, copies = ["mov.b32 q, $W;"], {}
    for r, pieces in enumerate(NVFP4_PIECES):
        srcs = []
        for op, k, mask in pieces:
            if k == 0:
                srcs.append(("q", mask))
                continue
            if (op, k) not in copies:
                copies[(op, k)] = f"c{len(copies)}"
                lines.append(ptx[op].format(d=copies[(op, k)], k=k))
            srcs.append((copies[(op, k)], mask))
        (src0, mask0), rest = srcs[0], srcs[1:]
        if rest:  # (src0 & mask0) | (src1 & mask1)
            lines.append(f"and.b32 t, {rest[0][0]}, {rest[0][1]:#010x};")
            lines.append(f"lop3.b32 u, {src0}, {mask0:#010x}, t, 0xEA;")
        else:
            lines.append(f"and.b32 u, {src0}, {mask0:#010x};")
        lines.append(f"fma.rn.bf16x2 a{r}, u, {'sh' if r % 2 else 'sl'}, nz;")
    return "\n        ".join(lines)


_NVFP4_A = _nvfp4_a()
# INT4: the word's nibbles 0-3 (bits 0-15) and 4-7 (bits 16-31), value i at
# bits 4i. A bf16 whose low byte holds v (exponent field 0 or 1) is exactly
# v * 2**-133, so masking nibbles i and i + 4 in place gives n * 2**-133 (bits
# 0-3) or n * 2**-129 (bits 4-7) with no shift, and one fma with the row's
# scale fragment S = s * 2**133 (or 2**129; frag_pack_scales) and C = -8 s
# (_INT4_SCALES) gives (n - 8) * s, rounded once as the reference. 9
# instructions per word (4 masks, one shift, 4 fmas) where 128 + n minus 136
# took 15.
_INT4_A = """mov.b32 q, $W;
        and.b32 u, q, 0x000F000F;
        fma.rn.bf16x2 a0, u, sl, cl;
        and.b32 u, q, 0x00F000F0;
        fma.rn.bf16x2 a1, u, sh, ch;
        shr.u32 t, q, 8;
        and.b32 u, t, 0x000F000F;
        fma.rn.bf16x2 a2, u, sl, cl;
        and.b32 u, t, 0x00F000F0;
        fma.rn.bf16x2 a3, u, sh, ch;"""
# INT4 scale fragment (the lane pair's bf16 S of rows g and g + 8, which the
# MMA asm multiplies by as it is) -> $0 = {-8 s_g, -8 s_g8} = S * {-2**-130,
# -2**-126}, exact (0x8008 = -2**-130, 0x8080 = -2**-126 in bf16).
_INT4_SCALES = """{
            .reg .b32 m, nz;
            mov.b32 m, 0x80808008;
            mov.b32 nz, 0x80008000;
            fma.rn.bf16x2 $0, $1, m, nz;
            }"""
def _mma_asm(fmt: str, nt: int) -> str:
    """One word -> scaled A fragment, then nt m16n8k16 MMAs accumulating.
    Operands: outputs $0 .. $(4nt - 1); inputs: the word, the scale register
    S (bf16x2, rows g and g + 8; INT4: then C, its -8 s), 2 B registers per n8
    tile, then the 4 nt accumulators. Registers a_r of rows g read S's low
    half in both lanes of the bf16x2 fma, rows g + 8 its high half (ptxas
    folds the {h, h} into the fma's operand, so this costs no instruction)."""
    n_out = 4 * nt
    ns = 1 if fmt == "nvfp4" else 2
    w = n_out
    body = (_NVFP4_A if fmt == "nvfp4" else _INT4_A).replace("$W", f"${w}")
    halves = [f"mov.b32 {{s0, s1}}, ${w + 1};", "mov.b32 sl, {s0, s0};", "mov.b32 sh, {s1, s1};"]
    if fmt == "int4":
        halves += [f"mov.b32 {{k0, k1}}, ${w + 2};", "mov.b32 cl, {k0, k0};", "mov.b32 ch, {k1, k1};"]
    mmas = []
    for j in range(nt):
        o = ", ".join(f"${4 * j + c}" for c in range(4))
        b = f"${n_out + 1 + ns + 2 * j}, ${n_out + 2 + ns + 2 * j}"
        c = ", ".join(f"${n_out + 1 + ns + 2 * nt + 4 * j + i}" for i in range(4))
        mmas.append(f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{o}}}, {{a0, a1, a2, a3}}, {{{b}}}, "
                    f"{{{c}}};")
    return ("""{
        .reg .b32 q, t, u, c0, c1, c2, c3, a0, a1, a2, a3, nz, sl, sh, cl, ch;
        .reg .b16 s0, s1, k0, k1;
        mov.b32 nz, 0x80008000;
        """ + "\n        ".join(halves) + "\n        " + body + "\n        " + "\n        ".join(mmas)
            + "\n        }")


def _mma_constraints(fmt: str, nt: int) -> str:
    return ",".join(["=f"] * (4 * nt) + ["r"] * ((2 if fmt == "nvfp4" else 3) + 2 * nt) + ["f"] * (4 * nt))


# NVFP4 scale fragment (the bytes c of rows g and g + 8, low byte first) ->
# bf16x2 $0 = {S_g, S_g8}, S = c * 16 + NVFP4_SCALE_BASE = s * 2**119
# (frag_pack_scales): prmt puts each byte in the low byte of its half, and the
# multiply-add shifts both into place (no carry leaves a half: c < 0x9A).
_NVFP4_SCALES = f"""{{
            .reg .b32 t;
            prmt.b32 t, $1, 0, 0x4140;
            mad.lo.u32 $0, t, 16, {NVFP4_SCALE_BASE * 0x10001:#010x};
            }}"""

_ASM_NVFP4_1 = tl.constexpr(_mma_asm("nvfp4", 1))
_ASM_NVFP4_2 = tl.constexpr(_mma_asm("nvfp4", 2))
_ASM_INT4_1 = tl.constexpr(_mma_asm("int4", 1))
_ASM_INT4_2 = tl.constexpr(_mma_asm("int4", 2))
_MMA_NVFP4_C1 = tl.constexpr(_mma_constraints("nvfp4", 1))
_MMA_NVFP4_C2 = tl.constexpr(_mma_constraints("nvfp4", 2))
_MMA_INT4_C1 = tl.constexpr(_mma_constraints("int4", 1))
_MMA_INT4_C2 = tl.constexpr(_mma_constraints("int4", 2))
_ASM_INT4_SCALES = tl.constexpr(_INT4_SCALES)
_ASM_NVFP4_SCALES = tl.constexpr(_NVFP4_SCALES)


@triton.jit
def _mma_emulated(w, s_lo, s_hi, b0, b1, FMT: tl.constexpr, NW: tl.constexpr):
    """What the inline MMA adds, from tensor ops over the warp's lanes
    (interpreter only; scales as fp32): lane (g, q) gets C[g][2q], C[g][2q+1],
    C[g+8][2q], C[g+8][2q+1] of A (16 x 16, the 32 lanes' scaled words) times
    B (16 x 8)."""
    w3 = tl.reshape(w, (NW, 8, 4))  # [warp, g, q]
    rh = tl.arange(0, 2)[:, None, None, None, None]
    ch = tl.arange(0, 2)[None, None, :, None, None]
    hi = tl.arange(0, 2)[None, None, None, None, :]
    w6 = w3[:, None, :, None, :, None]  # warp rh g ch q hi
    if FMT == 0:
        # _NVFP4_A's integer steps (NVFP4_PIECES), then each half's bf16 sign
        # bit and exponent/mantissa bits read back as the e2m1 code
        q = w3.to(tl.int64) & 0xFFFFFFFF
        a0 = q & 0x81C081C0
        a1 = (q << 6) & 0x81C081C0
        a2 = ((q << 12) | (q >> 20)) & 0x81C081C0
        a3 = ((q << 2) & 0x80C080C0) | ((q >> 6) & 0x01000100)
        reg = tl.where(ch == 0, tl.where(rh == 0, a0[:, None, :, None, :, None], a1[:, None, :, None, :, None]),
                       tl.where(rh == 0, a2[:, None, :, None, :, None], a3[:, None, :, None, :, None]))
        half = reg >> (16 * hi)[None]
        nib = (((half >> 15) & 1) << 3) | ((half >> 6) & 7)
    else:
        nib = (w6 >> (4 * (4 * hi + 2 * ch + rh))[None]) & 0xF
    sl = tl.reshape(s_lo, (NW, 8, 4))[:, None, :, None, :, None]
    sh = tl.reshape(s_hi, (NW, 8, 4))[:, None, :, None, :, None]
    scale = tl.where(rh[None] == 0, sl, sh)
    if FMT == 0:
        a = _fp4_val(nib, 1.0, True).to(tl.float32) * scale  # exact
    else:
        a = _to_bf16((nib - 8).to(tl.float32) * scale, True).to(tl.float32)
    a = tl.reshape(a, (NW, 16, 16))  # [warp, row 8 rh + g, col 8 ch + 2 q + hi]
    bsel = tl.where(tl.arange(0, 2)[None, :, None, None] == 0, tl.reshape(b0, (NW, 8, 4))[:, None, :, :],
                    tl.reshape(b1, (NW, 8, 4))[:, None, :, :])  # warp ch n q
    bits = (bsel[:, :, :, :, None] >> (16 * tl.arange(0, 2))[None, None, None, None, :]) & 0xFFFF  # warp ch n q hi
    bf = (bits << 16).to(tl.float32, bitcast=True)
    b = tl.reshape(tl.permute(bf, (0, 1, 3, 4, 2)), (NW, 16, 8))  # [warp, col, token]
    c = tl.sum(a[:, :, :, None] * b[:, None, :, :], axis=2)  # [warp, row, token]
    c = tl.reshape(c, (NW, 2, 8, 4, 2))  # warp rh g q c
    sel_rh = tl.arange(0, 2)[None, :, None, None, None]
    sel_c = tl.arange(0, 2)[None, None, None, None, :]
    p0 = tl.reshape(tl.sum(tl.sum(tl.where((sel_rh == 0) & (sel_c == 0), c, 0.0), axis=4), axis=1), (32 * NW,))
    p1 = tl.reshape(tl.sum(tl.sum(tl.where((sel_rh == 0) & (sel_c == 1), c, 0.0), axis=4), axis=1), (32 * NW,))
    p2 = tl.reshape(tl.sum(tl.sum(tl.where((sel_rh == 1) & (sel_c == 0), c, 0.0), axis=4), axis=1), (32 * NW,))
    p3 = tl.reshape(tl.sum(tl.sum(tl.where((sel_rh == 1) & (sel_c == 1), c, 0.0), axis=4), axis=1), (32 * NW,))
    return p0, p1, p2, p3


@triton.jit
def _mma(acc, w, s_lo, s_hi, c_lo, c_hi, b, FMT: tl.constexpr, NT: tl.constexpr, NW: tl.constexpr,
         INTERP: tl.constexpr):
    """acc (4 NT fp32 per lane) += scaled A (one word per lane) x B, one K tile.
    s_lo, s_hi, c_lo, c_hi: _decode_tile's scale registers (c: INT4 only; on
    the GPU s_hi and c_hi are s_lo and c_lo, whose halves serve both rows)."""
    if INTERP:
        p0, p1, p2, p3 = _mma_emulated(w, s_lo, s_hi, b[0], b[1], FMT, NW)
        if NT == 1:
            return (acc[0] + p0, acc[1] + p1, acc[2] + p2, acc[3] + p3)
        else:
            p4, p5, p6, p7 = _mma_emulated(w, s_lo, s_hi, b[2], b[3], FMT, NW)
            return (acc[0] + p0, acc[1] + p1, acc[2] + p2, acc[3] + p3,
                    acc[4] + p4, acc[5] + p5, acc[6] + p6, acc[7] + p7)
    if NT == 1:
        if FMT == 0:
            return tl.inline_asm_elementwise(asm=_ASM_NVFP4_1, constraints=_MMA_NVFP4_C1,
                                             args=[w, s_lo, b[0], b[1], acc[0], acc[1], acc[2], acc[3]],
                                             dtype=(tl.float32,) * 4, is_pure=True, pack=1)
        return tl.inline_asm_elementwise(asm=_ASM_INT4_1, constraints=_MMA_INT4_C1,
                                         args=[w, s_lo, c_lo, b[0], b[1], acc[0], acc[1], acc[2], acc[3]],
                                         dtype=(tl.float32,) * 4, is_pure=True, pack=1)
    else:
        if FMT == 0:
            return tl.inline_asm_elementwise(asm=_ASM_NVFP4_2, constraints=_MMA_NVFP4_C2,
                                             args=[w, s_lo, b[0], b[1], b[2], b[3], acc[0], acc[1], acc[2], acc[3],
                                                   acc[4], acc[5], acc[6], acc[7]],
                                             dtype=(tl.float32,) * 8, is_pure=True, pack=1)
        return tl.inline_asm_elementwise(asm=_ASM_INT4_2, constraints=_MMA_INT4_C2,
                                         args=[w, s_lo, c_lo, b[0], b[1], b[2], b[3], acc[0], acc[1], acc[2], acc[3],
                                               acc[4], acc[5], acc[6], acc[7]],
                                         dtype=(tl.float32,) * 8, is_pure=True, pack=1)


@triton.jit
def _ld_words(p, INTERP: tl.constexpr):
    """A lane's four K tiles of one row tile: one 16-byte load, streamed past L1."""
    if INTERP:
        return tl.load(p), tl.load(p + 1), tl.load(p + 2), tl.load(p + 3)
    return tl.inline_asm_elementwise(
        asm="ld.global.nc.L1::no_allocate.v4.b32 {$0, $1, $2, $3}, [$4];", constraints="=r,=r,=r,=r,l",
        args=[p], dtype=(tl.int32,) * 4, is_pure=True, pack=1)


def _x_asm(space: str) -> str:
    """A lane's 32 bytes of activations from `space` ("global.nc" or
    "shared"), predicated on $9 (zeros, and no access, where it is 0)."""
    return ("""{
        .reg .pred p;
        setp.ne.b32 p, $9, 0;
        mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0;
        mov.b32 $4, 0; mov.b32 $5, 0; mov.b32 $6, 0; mov.b32 $7, 0;
        @p ld.SPACE.v4.b32 {$0, $1, $2, $3}, [$8];
        @p ld.SPACE.v4.b32 {$4, $5, $6, $7}, [$8+16];
        }""".replace("SPACE", space))


_ASM_X_GLOBAL = tl.constexpr(_x_asm("global.nc"))
# written by the gate/up GEMM while this launch runs (block_ready): not the
# read-only path, which does not see other SMs' writes
_ASM_X_COHERENT = tl.constexpr(_x_asm("global"))
_ASM_X_SHARED = tl.constexpr(_x_asm("shared"))


@triton.jit
def _ld_x(p, valid, INTERP: tl.constexpr, XC: tl.constexpr = False):
    """A lane's B registers for one K group: 32 contiguous bytes of its token's
    row (zeros, and no memory access, for a padding slot)."""
    if INTERP:
        return (tl.load(p, mask=valid, other=0), tl.load(p + 1, mask=valid, other=0),
                tl.load(p + 2, mask=valid, other=0), tl.load(p + 3, mask=valid, other=0),
                tl.load(p + 4, mask=valid, other=0), tl.load(p + 5, mask=valid, other=0),
                tl.load(p + 6, mask=valid, other=0), tl.load(p + 7, mask=valid, other=0))
    return tl.inline_asm_elementwise(
        asm=_ASM_X_COHERENT if XC else _ASM_X_GLOBAL, constraints="=r,=r,=r,=r,=r,=r,=r,=r,l,r",
        args=[p, valid.to(tl.int32)],
        dtype=(tl.int32,) * 8, is_pure=True, pack=1)


@triton.jit
def _ld_scale(p, FMT: tl.constexpr, INTERP: tl.constexpr):
    """The lane's part of a row tile's scale fragment for one K group
    (frag_pack_scales); a warp reads 64 contiguous bytes. NVFP4: the lane's
    16 bits (rows g and g + 8). INT4: the 32 bits of its lane pair (2 (l // 2),
    2 (l // 2) + 1: the bf16 scales of rows g and g + 8 of the lane's group),
    so neither lane waits for the other (no shuffle); p points at the pair."""
    if INTERP:
        if FMT == 0:
            return tl.load(p).to(tl.int32) & 0xFFFF
        return (tl.load(p).to(tl.int32) & 0xFFFF) | ((tl.load(p + 1).to(tl.int32) & 0xFFFF) << 16)
    if FMT == 0:
        return tl.inline_asm_elementwise(asm="ld.global.nc.u16 $0, [$1];", constraints="=r,l", args=[p],
                                         dtype=tl.int32, is_pure=True, pack=1)
    return tl.inline_asm_elementwise(asm="ld.global.nc.b32 $0, [$1];", constraints="=r,l", args=[p],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _nvfp4_scales(v, ok, EVEN_K: tl.constexpr, INTERP: tl.constexpr):
    """An NVFP4 lane's scale fragment (_ld_scale: the bytes of rows g and g + 8,
    frag_pack_scales) -> what _mma multiplies rows g and g + 8 by: on the GPU
    one bf16x2 {S_g, S_g8}, S = s * 2**119 (_NVFP4_SCALES; the global scale
    takes 2**-119 * 2**126 = 2**7), returned for both rows; in the interpreter
    fp32 s of each row, from the same bf16 bits. Zero for a clamped group (not
    ok)."""
    if INTERP:
        a = (((v & 0xFF) * 16 + _SCALE_BASE) << 16).to(tl.float32, bitcast=True) * 2.0**-119
        b = ((((v >> 8) & 0xFF) * 16 + _SCALE_BASE) << 16).to(tl.float32, bitcast=True) * 2.0**-119
    else:
        a = tl.inline_asm_elementwise(asm=_ASM_NVFP4_SCALES, constraints="=r,r", args=[v], dtype=tl.int32,
                                      is_pure=True, pack=1)
        b = a
    if not EVEN_K:
        a = tl.where(ok, a, 0)
        b = tl.where(ok, b, 0)
    return a, b


@triton.jit
def _int4_scales(v, ok, EVEN_K: tl.constexpr, INTERP: tl.constexpr):
    """An INT4 lane's scale fragment (_ld_scale: S of rows g and g + 8) ->
    what _mma multiplies by and adds: on the GPU the fragment itself (bf16x2
    {S_g, S_g8}) and its -8 s (_INT4_SCALES), each returned for both rows; in
    the interpreter fp32 s of each row (S / 2**133 and S / 2**129,
    INT4_ROW_SHIFT), twice. Zero for a clamped group (not ok)."""
    if INTERP:  # two steps: 2**-133 is not a normal fp32
        a = ((v & 0xFFFF) << 16).to(tl.float32, bitcast=True) * 2.0**-66 * 2.0**-67
        b = (v & -65536).to(tl.float32, bitcast=True) * 2.0**-64 * 2.0**-65
        ca = a
        cb = b
    else:
        a = v
        b = v
        ca = tl.inline_asm_elementwise(asm=_ASM_INT4_SCALES, constraints="=r,r", args=[v], dtype=tl.int32,
                                       is_pure=True, pack=1)
        cb = ca
    if not EVEN_K:
        a = tl.where(ok, a, 0)
        b = tl.where(ok, b, 0)
        ca = tl.where(ok, ca, 0)
        cb = tl.where(ok, cb, 0)
    return a, b, ca, cb


# --------------------------------------------------------------------------
# Shared-memory rings (BULK): bulk copies into shared memory, mbarriers
# --------------------------------------------------------------------------
#
# The register path holds the bytes in flight in registers, and ptxas decides
# where their loads issue (under its default register budget at the loop's
# end, so each step waits a full memory latency). With BULK stages, each warp instead streams
# its own contiguous share of K through a ring of BULK stages of DEPTH K groups
# in a static shared buffer: lane 0 copies a stage's words and scales
# (cp.async.bulk, sm_90 and later), the lanes of the valid token slots their
# activation rows, onto the stage's mbarrier; the warp waits for the barrier,
# reads the stage and refills the slot at once (the warp itself read it; no
# other warp touches its ring, so no warp waits on another). No register holds
# a byte in flight, so the copies are as deep as the ring.


def ring_decl(nbytes: int) -> str:
    """The rings' static shared buffer (nbytes, 128-aligned) and its address:
    one declaration per kernel (the asm is called once). Static shared memory
    is limited to 48 KB per program."""
    if not 0 < nbytes <= 48 * 1024:
        raise ValueError(f"the shared-memory rings need {nbytes} bytes; at most 49152 (48 KB) are static: "
                         "fewer stages (bulk), warps or depth")
    return ("{\n        .shared .align 128 .b8 moe_ring[%d];\n        mov.u32 $0, moe_ring;\n        }" % nbytes)


def ring_bytes(nw: int, depth: int, two: bool, xrows: int, stages: int) -> int:
    """Shared memory of the rings: per warp, stages x (each row tile's words
    (depth x 512) and scale fragments (depth x 64), xrows activation rows
    (depth x 128 each)), then one mbarrier per warp and stage."""
    stage = (2 if two else 1) * depth * 576 + xrows * depth * 128
    return nw * stages * (stage + 8)


def ring_launch(cfg: dict, kg: int, two: bool, xrows: int, interpreting: bool = False) -> tuple:
    """The kernel's BULK and RING for a config: its "bulk" stages where the
    rings apply (on the GPU, K a whole number of stages of every warp, the
    rings within 48 KB: a one-token config's rings hold one activation row,
    the same config's blocks of 8 tokens eight), else the register path
    (0, "")."""
    nw, depth = cfg["num_warps"], cfg.get("depth", 1)
    bulk = int(cfg.get("bulk", 0))
    if not bulk or interpreting or kg % (nw * depth):
        return 0, ""
    nbytes = ring_bytes(nw, depth, two, xrows, bulk)
    return (bulk, ring_decl(nbytes)) if nbytes <= 48 * 1024 else (0, "")


def _dependent_launch_capable(device) -> bool:
    """Programmatic dependent launches (griddepcontrol) need a GPU of sm_90 or newer."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def ring_prefetch(cfg: dict, kg: int, one_token_down: bool, device) -> bool:
    """Whether a launch prefetches (config "prefetch"): one token's down GEMM
    through its rings, launched as a programmatic dependent launch (sm_90 and
    newer) after a gate/up GEMM that lets it start at once. Its programs that
    find room beside the gate/up GEMM's copy their first stages of weights
    into the rings, then wait for the gate/up GEMM's output."""
    if not (cfg.get("prefetch") and one_token_down and ring_launch(cfg, kg, False, 1, interpreting())[0]):
        return False
    return _dependent_launch_capable(device)


def dependent_launches(cfg: dict, device) -> frozenset:
    """Which of a config's launches from several tokens on are programmatic
    dependent launches (sm_90 and newer; whole-config key "dependent_launches":
    true for all of configs.DEPENDENT_LAUNCHES, or a list of them): the
    launch before each lets it start at once, and it waits for that launch's
    outputs."""
    want = cfg.get("dependent_launches")
    if not want or interpreting() or not _dependent_launch_capable(device):
        return frozenset()
    want = frozenset(DEPENDENT_LAUNCHES if want is True else want)
    assert want <= set(DEPENDENT_LAUNCHES), f"dependent_launches: some of {DEPENDENT_LAUNCHES}, not {sorted(want)}"
    return want


def block_ready(cfg: dict, dep: frozenset, down_kg: int) -> bool:
    """Whether the down GEMM starts on each expert block once the gate/up GEMM
    has finished that block's row tiles (whole-config key "block_ready"),
    rather than after the whole gate/up launch: only as a dependent launch
    (dependent_launches has "down") on the register path (a ring's bulk
    copies would need the async proxy ordered after the count)."""
    return bool(cfg.get("block_ready")) and "down" in dep and not ring_launch(cfg["down"], down_kg, False, 8)[0]


def dependent_down(cfg: dict, kg: int, device) -> bool:
    """Whether one token's down GEMM is a programmatic dependent launch: it
    prefetches through its rings (ring_prefetch), or config "pdl" (the
    register path: an int, the K steps of its first live slot each warp asks
    L2 for, 0 for none, before it waits for the gate/up GEMM's output)."""
    if ring_prefetch(cfg, kg, True, device):
        return True
    if cfg.get("pdl") is None or interpreting() or ring_launch(cfg, kg, False, 1)[0]:
        return False
    return _dependent_launch_capable(device)


_RING_INIT = tl.constexpr("""{
        .reg .pred p;
        setp.eq.u32 p, $1, 0;
        @p mbarrier.init.shared::cta.b64 [$2], 1;
        @p fence.mbarrier_init.release.cluster;
        mov.b32 $0, 0;
        }""")

# one stage of a warp's ring: $4 the slot's address, $5 the stage's first K
# group. flags bit 0: this lane copies row tile 0's words and scales and
# arrives on the barrier ($2) with the tiles' bytes ($3); bit 1: row tile 1's;
# bit 2: an activation row ($11, to $10 in the slot); bit 3: only register
# that row's bytes, bit 4: only copy it (a prefetch: the weights before the
# activations exist). The activation lanes register their bytes before the
# arriving lane arrives (bar.warp.sync), so the phase cannot complete without
# them; the proxy fence orders the warp's earlier reads of the slot before the
# copies overwrite it. $12: K groups per stage, $13: the scales' offset.
_RING_ISSUE = tl.constexpr("""{
        .reg .pred pt0, pt1, px, pxc;
        .reg .b32 f, wb, sbytes, xbytes, d;
        .reg .b64 o, src;
        mov.b32 $0, 0;
        and.b32 f, $1, 1;
        setp.ne.b32 pt0, f, 0;
        and.b32 f, $1, 2;
        setp.ne.b32 pt1, f, 0;
        and.b32 f, $1, 12;
        setp.ne.b32 px, f, 0;
        and.b32 f, $1, 20;
        setp.ne.b32 pxc, f, 0;
        shl.b32 wb, $12, 9;
        shl.b32 sbytes, $12, 6;
        shl.b32 xbytes, $12, 7;
        @px mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [$2], xbytes;
        bar.warp.sync -1;
        fence.proxy.async.shared::cta;
        @pt0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [$2], $3;
        mul.wide.u32 o, $5, 512;
        add.s64 src, $6, o;
        @pt0 cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$4], [src], wb, [$2];
        add.s64 src, $8, o;
        add.u32 d, $4, wb;
        @pt1 cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d], [src], wb, [$2];
        mul.wide.u32 o, $5, 64;
        add.s64 src, $7, o;
        add.u32 d, $4, $13;
        @pt0 cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d], [src], sbytes, [$2];
        add.s64 src, $9, o;
        add.u32 d, d, sbytes;
        @pt1 cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d], [src], sbytes, [$2];
        mul.wide.u32 o, $5, 128;
        add.s64 src, $11, o;
        add.u32 d, $4, $10;
        @pxc cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d], [src], xbytes, [$2];
        }""")

_RING_WAIT = tl.constexpr("""{
        .reg .pred pd;
        RING_WAIT_FULL:
        mbarrier.try_wait.parity.shared::cta.b64 pd, [$1], $2;
        @!pd bra RING_WAIT_FULL;
        mov.b32 $0, 0;
        }""")


@triton.jit
def _ring_init(lane, bar):
    return tl.inline_asm_elementwise(asm=_RING_INIT, constraints="=r,r,r", args=[lane, bar], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _ring_issue(flags, bar, tile_bytes, slot_addr, k0, wb0, sb0, wb1, sb1, x_off, xrow, groups, soff):
    return tl.inline_asm_elementwise(
        asm=_RING_ISSUE, constraints="=r,r,r,r,r,r,l,l,l,l,r,l,r,r",
        args=[flags, bar, tile_bytes, slot_addr, k0, wb0, sb0, wb1, sb1, x_off, xrow, groups, soff],
        dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _ring_wait(bar, parity):
    """0, once the stage at bar has landed (added to the stage's addresses, so
    its reads follow)."""
    return tl.inline_asm_elementwise(asm=_RING_WAIT, constraints="=r,r,r", args=[bar, parity], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _lds_words(a):
    return tl.inline_asm_elementwise(asm="ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", constraints="=r,=r,=r,=r,r",
                                     args=[a], dtype=(tl.int32,) * 4, is_pure=False, pack=1)


@triton.jit
def _lds_scale(a, FMT: tl.constexpr):
    if FMT == 0:
        return tl.inline_asm_elementwise(asm="ld.shared.u16 $0, [$1];", constraints="=r,r", args=[a],
                                         dtype=tl.int32, is_pure=False, pack=1)
    return tl.inline_asm_elementwise(asm="ld.shared.b32 $0, [$1];", constraints="=r,r", args=[a], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _lds_x(a, valid):
    """_ld_x from the ring: the lane's 32 bytes of its token's row (zeros for a
    padding slot, whose row was not copied)."""
    return tl.inline_asm_elementwise(
        asm=_ASM_X_SHARED, constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r", args=[a, valid.to(tl.int32)],
        dtype=(tl.int32,) * 8, is_pure=False, pack=1)


# block_ready: the gate/up GEMM's programs count each expert block's finished
# row tiles (moe_align's ready counts); the down GEMM's programs start on a
# block once its count is complete, instead of waiting for the whole gate/up
# launch (griddepcontrol.wait), so the first blocks' down GEMM runs while the
# gate/up GEMM's last programs do.
_READY_WAIT = tl.constexpr("""{
        .reg .pred p;
        .reg .b32 v;
        READY_WAIT:
        ld.acquire.gpu.global.b32 v, [$1];
        setp.lt.s32 p, v, $2;
        @p nanosleep.u32 64;
        @p bra READY_WAIT;
        mov.b32 $0, 0;
        }""")
_READY_SIGNAL = tl.constexpr("""{
        .reg .pred p;
        setp.ne.b32 p, $2, 0;
        @p red.release.gpu.global.add.s32 [$1], 1;
        mov.b32 $0, 0;
        }""")


@triton.jit
def _ready_wait(p, target):
    """Each thread: until the count at p reaches target (acquire: the gate/up
    GEMM's stores before it are visible to this thread's loads after)."""
    return tl.inline_asm_elementwise(asm=_READY_WAIT, constraints="=r,l,r", args=[p, target], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _ready_signal(p, first):
    """The thread with first set: count one more finished row tile at p
    (release: after the barrier before it, the program's stores are ordered
    before the count)."""
    return tl.inline_asm_elementwise(asm=_READY_SIGNAL, constraints="=r,l,r", args=[p, first.to(tl.int32)],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_ask(p):
    """Ask L2 for the line at p; no register waits for it."""
    tl.inline_asm_elementwise(asm="prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", constraints="=r,l", args=[p],
                              dtype=tl.int32, is_pure=False, pack=1)


# --------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------


@triton.jit
def _load_tile(wp, sp, kg, FMT: tl.constexpr, INTERP: tl.constexpr):
    """One row tile's raw words (four K tiles) and the lane's scale fragment
    (the lane's 16 columns of the group lie in one scale group)."""
    w0, w1, w2, w3 = _ld_words(wp + kg * 128, INTERP)
    return (w0, w1, w2, w3, _ld_scale(sp + kg * 32, FMT, INTERP))


@triton.jit
def _decode_tile(raw, ok, FMT: tl.constexpr, EVEN_K: tl.constexpr, INTERP: tl.constexpr):
    """A row tile's loads with its scale fragment decoded (_mma's s_lo, s_hi,
    c_lo, c_hi in place of the raw fragment; c: INT4 only)."""
    if FMT == 0:
        s_lo, s_hi = _nvfp4_scales(raw[4], ok, EVEN_K, INTERP)
        c_lo = s_lo
        c_hi = s_hi
    else:
        s_lo, s_hi, c_lo, c_hi = _int4_scales(raw[4], ok, EVEN_K, INTERP)
    return (raw[0], raw[1], raw[2], raw[3], s_lo, s_hi, c_lo, c_hi)


@triton.jit
def _decode(ld, ok, FMT: tl.constexpr, TWO: tl.constexpr, EVEN_K: tl.constexpr, INTERP: tl.constexpr):
    """_group_loads' result with both row tiles' scales decoded (SCALES_AHEAD)."""
    t0 = _decode_tile(ld[0], ok, FMT, EVEN_K, INTERP)
    t1 = t0
    if TWO:
        t1 = _decode_tile(ld[1], ok, FMT, EVEN_K, INTERP)
    return t0, t1, ld[2]


@triton.jit
def _decode_sets(la, lb, lc, ld, kg, KG, FMT: tl.constexpr, NW: tl.constexpr, TWO: tl.constexpr,
                 DEPTH: tl.constexpr, EVEN_K: tl.constexpr, INTERP: tl.constexpr):
    """_decode of the DEPTH register sets holding K groups kg, kg + NW, ...
    (the unused sets are copies of the first, as in the kernel)."""
    a = _decode(la, kg < KG, FMT, TWO, EVEN_K, INTERP)
    b = a
    c = a
    d = a
    if DEPTH >= 2:
        b = _decode(lb, kg + NW < KG, FMT, TWO, EVEN_K, INTERP)
    if DEPTH >= 3:
        c = _decode(lc, kg + 2 * NW < KG, FMT, TWO, EVEN_K, INTERP)
    if DEPTH >= 4:
        d = _decode(ld, kg + 3 * NW < KG, FMT, TWO, EVEN_K, INTERP)
    return a, b, c, d


@triton.jit
def _tile_step(acc, raw, xs, ok, FMT: tl.constexpr, NT: tl.constexpr, NW: tl.constexpr,
               EVEN_K: tl.constexpr, INTERP: tl.constexpr, DECODED: tl.constexpr = False):
    """acc (4 NT fp32 per lane) += one row tile's K group (four MMAs).
    DECODED: raw holds the decoded scales (_decode_tile), not the fragment."""
    if not DECODED:
        raw = _decode_tile(raw, ok, FMT, EVEN_K, INTERP)
    for j in tl.static_range(4):
        if NT == 1:
            b = (xs[2 * j], xs[2 * j + 1])
        else:
            b = (xs[2 * j], xs[2 * j + 1], xs[8 + 2 * j], xs[9 + 2 * j])
        acc = _mma(acc, raw[j], raw[4], raw[5], raw[6], raw[7], b, FMT, NT, NW, INTERP)
    return acc


@triton.jit
def _load_x(xb, xb2, valid, valid2, kg, NT: tl.constexpr, INTERP: tl.constexpr, XC: tl.constexpr = False):
    x = _ld_x(xb + kg * 32, valid, INTERP, XC)
    if NT == 2:
        x = x + _ld_x(xb2 + kg * 32, valid2, INTERP, XC)
    return x


@triton.jit
def _group_loads(wp0, wp1, sp0, sp1, xb, xb2, valid, valid2, kg, FMT: tl.constexpr, NT: tl.constexpr,
                 TWO: tl.constexpr, INTERP: tl.constexpr, XC: tl.constexpr = False):
    """Everything one K group needs: the row tiles' words and scales, the
    tokens' activations."""
    t0 = _load_tile(wp0, sp0, kg, FMT, INTERP)
    t1 = t0
    if TWO:
        t1 = _load_tile(wp1, sp1, kg, FMT, INTERP)
    return t0, t1, _load_x(xb, xb2, valid, valid2, kg, NT, INTERP, XC)


@triton.jit
def _group_compute(acc0, acc1, ld, ok, FMT: tl.constexpr, NT: tl.constexpr, NW: tl.constexpr, TWO: tl.constexpr,
                   EVEN_K: tl.constexpr, INTERP: tl.constexpr, DECODED: tl.constexpr = False):
    acc0 = _tile_step(acc0, ld[0], ld[2], ok, FMT, NT, NW, EVEN_K, INTERP, DECODED)
    if TWO:
        acc1 = _tile_step(acc1, ld[1], ld[2], ok, FMT, NT, NW, EVEN_K, INTERP, DECODED)
    return acc0, acc1


@triton.jit
def _loads_at(src, kg, KG, FMT: tl.constexpr, NT: tl.constexpr, TWO: tl.constexpr, INTERP: tl.constexpr,
              XC: tl.constexpr = False):
    """_group_loads of K group kg, clamped to the last group (src: the row
    tiles' word and scale pointers, the activation pointers and their masks;
    a clamped group's MMAs are zeroed by its ok flag)."""
    return _group_loads(src[0], src[1], src[2], src[3], src[4], src[5], src[6], src[7], tl.minimum(kg, KG - 1),
                        FMT, NT, TWO, INTERP, XC)


@triton.jit
def _advanced(src, o):
    """_loads_at's src with its pointers o K groups on (masks as they are)."""
    return (src[0] + o * 128, src[1] + o * 128, src[2] + o * 32, src[3] + o * 32, src[4] + o * 32, src[5] + o * 32,
            src[6], src[7])


@triton.jit
def _loads_of(src, FMT: tl.constexpr, NT: tl.constexpr, TWO: tl.constexpr, INTERP: tl.constexpr,
              XC: tl.constexpr = False):
    """_group_loads at src's pointers as they are (no clamp)."""
    return _group_loads(src[0], src[1], src[2], src[3], src[4], src[5], src[6], src[7], 0, FMT, NT, TWO, INTERP, XC)


@triton.jit
def _load_sets(src, kg, KG, FMT: tl.constexpr, NW: tl.constexpr, NT: tl.constexpr, TWO: tl.constexpr,
               DEPTH: tl.constexpr, INTERP: tl.constexpr, XC: tl.constexpr = False, ONE_CLAMP: tl.constexpr = False):
    """The DEPTH register sets' loads of K groups kg, kg + NW, ... (the unused
    sets are copies of the first). ONE_CLAMP (K a whole number of steps):
    one clamp for the step, so each set's addresses are the first's plus a
    constant (the step past the last, a pipe's final prefetch, reloads the
    last step instead of the last group)."""
    if ONE_CLAMP:
        # the step's pointers once; each set is a constant offset from them
        sb = _advanced(src, tl.minimum(kg, KG - 1 - (DEPTH - 1) * NW))
        a = _loads_of(sb, FMT, NT, TWO, INTERP, XC)
        b = a
        c = a
        d = a
        if DEPTH >= 2:
            b = _loads_of(_advanced(sb, NW), FMT, NT, TWO, INTERP, XC)
        if DEPTH >= 3:
            c = _loads_of(_advanced(sb, 2 * NW), FMT, NT, TWO, INTERP, XC)
        if DEPTH >= 4:
            d = _loads_of(_advanced(sb, 3 * NW), FMT, NT, TWO, INTERP, XC)
    else:
        a = _loads_at(src, kg, KG, FMT, NT, TWO, INTERP, XC)
        b = a
        c = a
        d = a
        if DEPTH >= 2:
            b = _loads_at(src, kg + NW, KG, FMT, NT, TWO, INTERP, XC)
        if DEPTH >= 3:
            c = _loads_at(src, kg + 2 * NW, KG, FMT, NT, TWO, INTERP, XC)
        if DEPTH >= 4:
            d = _loads_at(src, kg + 3 * NW, KG, FMT, NT, TWO, INTERP, XC)
    return a, b, c, d


@triton.jit
def _ring_step(acc0, acc1, ld, src, kg, step, KG, FMT: tl.constexpr, NT: tl.constexpr, NW: tl.constexpr,
               TWO: tl.constexpr, EVEN_K: tl.constexpr, INTERP: tl.constexpr, XC: tl.constexpr = False):
    """One register set of the ring: multiply its K group kg, then reload it in
    place with group kg + step."""
    acc0, acc1 = _group_compute(acc0, acc1, ld, kg < KG, FMT, NT, NW, TWO, EVEN_K, INTERP)
    return acc0, acc1, _loads_at(src, kg + step, KG, FMT, NT, TWO, INTERP, XC)


@triton.jit
def _zeros(n: tl.constexpr, NT: tl.constexpr):
    z = tl.zeros((n,), dtype=tl.float32)
    if NT == 1:
        return (z, z, z, z)
    else:
        return (z, z, z, z, z, z, z, z)


@triton.jit
def _warp_sum(v, NW: tl.constexpr):
    return tl.sum(tl.reshape(v, (NW, 32)), axis=0)


@triton.jit
def _warp_sum2(a, b, NW: tl.constexpr):
    """Two [32 NW] per-warp partials summed over the warps in one reduction
    (one shared-memory exchange for both, not one each)."""
    return tl.split(tl.sum(tl.reshape(tl.join(a, b), (NW, 32, 2)), axis=0))


@triton.jit
def _swiglu(gate, up, limit, HAS_LIMIT: tl.constexpr):
    """SiLU(gate) * up, with DeepSeek-V4's clamp (gate <= limit, |up| <= limit)."""
    if HAS_LIMIT:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    return gate / (1.0 + tl.exp(-gate)) * up


def _exchange_asm(nw: int, nv: int) -> str:
    """The warps' partial sums of nv (4 or 8) C registers exchanged through a
    static shared buffer in one round: each thread stores its nv values as
    16-byte vectors at [warp][vector][lane] (lanes 16 bytes apart: no bank
    conflicts), one barrier, then reads its lane's vectors of every warp and
    adds them. A barrier first, so a block walker's next exchange does not
    overwrite values another warp still reads. Outputs $0 .. $(nv-1); inputs
    the nv values, the warp and the lane."""
    vec = nv // 4
    wstride = vec * 512
    lines = ["{", f".shared .align 16 .b8 moe_xchg[{nw * wstride}];", ".reg .u32 xb, xa, xr;",
             ".reg .f32 xt<4>;", "mov.u32 xb, moe_xchg;",
             f"mad.lo.u32 xa, ${2 * nv}, {wstride}, xb;", f"mad.lo.u32 xa, ${2 * nv + 1}, 16, xa;",
             f"mad.lo.u32 xr, ${2 * nv + 1}, 16, xb;", "bar.sync 0;"]
    for v in range(vec):
        ins = ",".join(f"${nv + 4 * v + i}" for i in range(4))
        lines.append(f"st.shared.v4.f32 [xa+{512 * v}], {{{ins}}};")
    lines.append("bar.sync 0;")
    for v in range(vec):
        outs = ",".join(f"${4 * v + i}" for i in range(4))
        lines.append(f"ld.shared.v4.f32 {{{outs}}}, [xr+{512 * v}];")
    for w in range(1, nw):
        for v in range(vec):
            lines.append(f"ld.shared.v4.f32 {{xt0,xt1,xt2,xt3}}, [xr+{w * wstride + 512 * v}];")
            for i in range(4):
                lines.append(f"add.f32 ${4 * v + i}, ${4 * v + i}, xt{i};")
    lines.append("}")
    return "\n".join(lines)


@triton.jit
def _lane_sum(v, NW: tl.constexpr):
    """The interpreter's _exchange: the warps' sum for each lane, back in [32 NW] layout."""
    return tl.reshape(tl.broadcast_to(tl.reshape(_warp_sum(v, NW), (1, 32)), (NW, 32)), (32 * NW,))


@triton.jit
def _exchange4(a, b, c, d, warp, lane, ASM: tl.constexpr, NW: tl.constexpr, INTERP: tl.constexpr):
    """The warps' sums of four [32 NW] C registers for the thread's lane, in
    [32 NW] layout (every warp holds them); ASM: _exchange_asm(NW, 4)."""
    if INTERP:
        return _lane_sum(a, NW), _lane_sum(b, NW), _lane_sum(c, NW), _lane_sum(d, NW)
    return tl.inline_asm_elementwise(asm=ASM, constraints="=f,=f,=f,=f,f,f,f,f,r,r", args=[a, b, c, d, warp, lane],
                                     dtype=(tl.float32,) * 4, is_pure=False, pack=1)


@triton.jit
def _exchange8(a, b, c, d, e, f, g, h, warp, lane, ASM: tl.constexpr, NW: tl.constexpr, INTERP: tl.constexpr):
    """_exchange4 for eight; ASM: _exchange_asm(NW, 8)."""
    if INTERP:
        a, b, c, d = _exchange4(a, b, c, d, warp, lane, ASM, NW, INTERP)
        e, f, g, h = _exchange4(e, f, g, h, warp, lane, ASM, NW, INTERP)
        return a, b, c, d, e, f, g, h
    return tl.inline_asm_elementwise(asm=ASM, constraints="=f,=f,=f,=f,=f,=f,=f,=f,f,f,f,f,f,f,f,f,r,r",
                                     args=[a, b, c, d, e, f, g, h, warp, lane], dtype=(tl.float32,) * 8,
                                     is_pure=False, pack=1)


@triton.jit
def _reg_k_loop(acc0, acc1, wp0, wp1, sp0, sp1, xb, xb2, valid, valid2, warp, KG, FMT: tl.constexpr,
                NT: tl.constexpr, NW: tl.constexpr, TWO: tl.constexpr, PIPE: tl.constexpr, DEPTH: tl.constexpr,
                EVEN_K: tl.constexpr, INTERP: tl.constexpr, SCALES_AHEAD: tl.constexpr, XC: tl.constexpr = False,
                ONE_CLAMP: tl.constexpr = False):
    """The K loop from registers: acc0, acc1 += the row tiles' K groups."""
    # software pipeline over DEPTH register sets (K groups kg, kg + NW,
    # ...). Ring (not PIPE): each set is multiplied, then reloaded in
    # place with the group DEPTH steps ahead, so a load has the other
    # sets' MMAs to land in and needs no register copy (a copy of a
    # value still in flight stalls the warp until it lands). PIPE: all
    # of the next step's loads, then this step's MMAs. Where ptxas puts
    # the loads is its choice: under its default register budget it
    # sinks them to the loop's end (each step then waits a full memory
    # latency); a launch with maxnreg lets it keep them first.
    kg = warp
    step = NW * DEPTH
    src = (wp0, wp1, sp0, sp1, xb, xb2, valid, valid2)
    la, lb, lc, ld = _load_sets(src, kg, KG, FMT, NW, NT, TWO, DEPTH, INTERP, XC, EVEN_K and ONE_CLAMP)
    if SCALES_AHEAD:  # pipe only: the register sets carry decoded scales
        la, lb, lc, ld = _decode_sets(la, lb, lc, ld, kg, KG, FMT, NW, TWO, DEPTH, EVEN_K, INTERP)
    for it in range(0, tl.cdiv(KG, step)):
        if PIPE:
            # every set's next loads, then this step's MMAs; with
            # SCALES_AHEAD the next scales are decoded after the MMAs
            na, nb, nc, nd = _load_sets(src, kg + step, KG, FMT, NW, NT, TWO, DEPTH, INTERP, XC,
                                        EVEN_K and ONE_CLAMP)
            acc0, acc1 = _group_compute(acc0, acc1, la, kg < KG, FMT, NT, NW, TWO, EVEN_K, INTERP,
                                        SCALES_AHEAD)
            if DEPTH >= 2:
                acc0, acc1 = _group_compute(acc0, acc1, lb, kg + NW < KG, FMT, NT, NW, TWO, EVEN_K,
                                            INTERP, SCALES_AHEAD)
            if DEPTH >= 3:
                acc0, acc1 = _group_compute(acc0, acc1, lc, kg + 2 * NW < KG, FMT, NT, NW, TWO, EVEN_K,
                                            INTERP, SCALES_AHEAD)
            if DEPTH >= 4:
                acc0, acc1 = _group_compute(acc0, acc1, ld, kg + 3 * NW < KG, FMT, NT, NW, TWO, EVEN_K,
                                            INTERP, SCALES_AHEAD)
            if SCALES_AHEAD:
                na, nb, nc, nd = _decode_sets(na, nb, nc, nd, kg + step, KG, FMT, NW, TWO, DEPTH, EVEN_K,
                                              INTERP)
            la = na
            lb = nb
            lc = nc
            ld = nd
        else:
            acc0, acc1, la = _ring_step(acc0, acc1, la, src, kg, step, KG, FMT, NT, NW, TWO, EVEN_K,
                                        INTERP, XC)
            if DEPTH >= 2:
                acc0, acc1, lb = _ring_step(acc0, acc1, lb, src, kg + NW, step, KG, FMT, NT, NW, TWO,
                                            EVEN_K, INTERP, XC)
            if DEPTH >= 3:
                acc0, acc1, lc = _ring_step(acc0, acc1, lc, src, kg + 2 * NW, step, KG, FMT, NT, NW, TWO,
                                            EVEN_K, INTERP, XC)
            if DEPTH >= 4:
                acc0, acc1, ld = _ring_step(acc0, acc1, ld, src, kg + 3 * NW, step, KG, FMT, NT, NW, TWO,
                                            EVEN_K, INTERP, XC)
        kg += step
    return acc0, acc1


@triton.jit
def _ring_loads(sbase, lane, gi, tq, slane, xr0, valid, valid2, d: tl.constexpr, FMT: tl.constexpr,
                NT: tl.constexpr, TWO: tl.constexpr, DEPTH: tl.constexpr):
    """_group_loads' result for group d of a landed stage of the warp's ring
    (slot at sbase: each row tile's DEPTH groups of words, then of scale
    fragments, then the activation rows)."""
    NTILE: tl.constexpr = 2 if TWO else 1
    w0, w1, w2, w3 = _lds_words(sbase + d * 512 + lane * 16)
    t0 = (w0, w1, w2, w3, _lds_scale(sbase + NTILE * DEPTH * 512 + d * 64 + slane * 2, FMT))
    t1 = t0
    if TWO:
        v0, v1, v2, v3 = _lds_words(sbase + DEPTH * 512 + d * 512 + lane * 16)
        t1 = (v0, v1, v2, v3, _lds_scale(sbase + 2 * DEPTH * 512 + DEPTH * 64 + d * 64 + slane * 2, FMT))
    xoff: tl.constexpr = NTILE * DEPTH * 576
    x = _lds_x(sbase + xoff + xr0 * (DEPTH * 128) + d * 128 + tq * 32, valid)
    if NT == 2:
        x = x + _lds_x(sbase + xoff + (8 + gi) * (DEPTH * 128) + d * 128 + tq * 32, valid2)
    return t0, t1, x


@triton.jit
def _ring_first_stages(flags, rb, cnt, t, wb0, wb1, sb0, sb1, x_off, xrow, KG, NW: tl.constexpr, TWO: tl.constexpr,
                       DEPTH: tl.constexpr, BULK: tl.constexpr, STAGE: tl.constexpr, BARS: tl.constexpr):
    """Issue the first BULK stages of the warp's ring (slots from cnt on) with
    these flags (_RING_ISSUE)."""
    NTILE: tl.constexpr = 2 if TWO else 1
    warp = t // 32
    z = t * 0
    nst = KG // (NW * DEPTH)
    k_warp = warp * (nst * DEPTH)  # the warp's first K group
    ring = rb + warp * (BULK * STAGE)
    bars = rb + BARS + warp * (8 * BULK)
    for jj in tl.static_range(BULK):
        if jj < nst:
            sl = (cnt + jj) % BULK
            _ring_issue(flags, bars + 8 * sl, z + NTILE * DEPTH * 576, ring + sl * STAGE, k_warp + jj * DEPTH,
                        wb0 + z, sb0 + z, wb1 + z, sb1 + z, x_off, xrow, z + DEPTH, z + NTILE * DEPTH * 512)


@triton.jit
def _ring_prefetch(rb, t, wb0, wb1, sb0, sb1, valid, KG, NW: tl.constexpr, TWO: tl.constexpr,
                   DEPTH: tl.constexpr, BULK: tl.constexpr, STAGE: tl.constexpr, BARS: tl.constexpr):
    """One token's first block, before its activations exist (PREFETCH): the
    first BULK stages' words and scales into the rings (cnt 0), with the
    activation row's bytes registered on each stage's barrier; _ring_k_loop
    (prefetched) copies the rows once the previous kernel is done."""
    lane = t % 32
    flags = tl.where(lane == 0, 3 if TWO else 1, 0) | tl.where((lane % 4 == 0) & valid, 8, 0)
    _ring_first_stages(flags, rb, t * 0, t, wb0, wb1, sb0, sb1, t * 0, wb0 + t * 0, KG, NW, TWO, DEPTH, BULK, STAGE,
                       BARS)


@triton.jit
def _ring_k_loop(acc0, acc1, rb, cnt, t, wb0, wb1, sb0, sb1, xrow0, xrow1, valid, valid2, slane, KG,
                 FMT: tl.constexpr, NT: tl.constexpr, NW: tl.constexpr, TWO: tl.constexpr, DEPTH: tl.constexpr,
                 BULK: tl.constexpr, DIRECT: tl.constexpr, STAGE: tl.constexpr, BARS: tl.constexpr,
                 prefetched=False):
    """The K loop through the warps' rings: warp w takes K groups w x KG / NW
    onwards, DEPTH per stage, BULK stages in flight. cnt: the stages each ring
    took before this block (each stage's slot and barrier phase follow from
    it). wb*, sb*: the row tiles' words and scale fragments at K group 0;
    xrow0 / xrow1: the lane's token rows (token slots gi and 8 + gi).
    prefetched: _ring_prefetch issued the first stages' weights (cnt 0); the
    prologue then only copies their activation rows."""
    NTILE: tl.constexpr = 2 if TWO else 1
    lane = t % 32
    warp = t // 32
    gi = lane // 4
    tq = lane % 4
    # lane 0 copies the words and scales; lane 4 gi token slot gi's activation
    # row, lane 4 gi + 1 slot 8 + gi's (NT 2); one row per block for one token
    flags = tl.where(lane == 0, 3 if TWO else 1, 0) | tl.where((tq == 0) & valid, 4, 0)
    xslot = gi
    if DIRECT:
        xslot = gi * 0
    xrow = xrow0
    if NT == 2:
        flags = flags | tl.where((tq == 1) & valid2, 4, 0)
        xslot = tl.where(tq == 1, 8 + gi, gi)
        xrow = tl.where(tq == 1, xrow1, xrow0)
    xr0 = gi
    if DIRECT:
        xr0 = gi * 0
    x_off = NTILE * DEPTH * 576 + xslot * (DEPTH * 128)
    z = t * 0
    nst = KG // (NW * DEPTH)
    k_warp = warp * (nst * DEPTH)  # the warp's first K group
    ring = rb + warp * (BULK * STAGE)
    bars = rb + BARS + warp * (8 * BULK)
    first = flags
    if prefetched:
        first = tl.where((flags & 4) != 0, 16, 0)  # the activation rows' copies only
    _ring_first_stages(first, rb, cnt, t, wb0, wb1, sb0, sb1, x_off, xrow, KG, NW, TWO, DEPTH, BULK, STAGE, BARS)
    for j in range(nst):
        i = cnt + j
        slot = i % BULK
        dep = _ring_wait(bars + 8 * slot, z + (i // BULK) % 2)
        sbase = ring + slot * STAGE + dep
        # group by group, the next group's reads before this one's MMAs (two
        # groups' registers live, not DEPTH); the slot refilled after its last read
        cur = _ring_loads(sbase, lane, gi, tq, slane, xr0, valid, valid2, 0, FMT, NT, TWO, DEPTH)
        for d in tl.static_range(DEPTH):
            nxt = cur
            if d + 1 < DEPTH:
                nxt = _ring_loads(sbase, lane, gi, tq, slane, xr0, valid, valid2, d + 1, FMT, NT, TWO, DEPTH)
            else:
                # the warp has read the slot: refill it with the stage BULK ahead
                if j + BULK < nst:
                    _ring_issue(flags, bars + 8 * slot, z + NTILE * DEPTH * 576, ring + slot * STAGE,
                                k_warp + (j + BULK) * DEPTH, wb0 + z, sb0 + z, wb1 + z, sb1 + z, x_off, xrow,
                                z + DEPTH, z + NTILE * DEPTH * 512)
            acc0, acc1 = _group_compute(acc0, acc1, cur, True, FMT, NT, NW, TWO, True, False)
            cur = nxt
    return acc0, acc1


@triton.jit
def _moe_frag_kernel(
    x_ptr, w_ptr, s_ptr, g_ptr, out_ptr, tw_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr, ready_ptr,
    num_valid, top_k, KG,
    stride_xm, stride_we, stride_wt, stride_se, stride_sn, stride_om,
    up_tiles, g_mult, swiglu_limit, rsf, num_experts, ready_target,
    FMT: tl.constexpr, GATED: tl.constexpr, X_IS_SORTED: tl.constexpr, HAS_LIMIT: tl.constexpr,
    NT: tl.constexpr, NW: tl.constexpr, RT: tl.constexpr, PIPE: tl.constexpr, DEPTH: tl.constexpr,
    EVEN_K: tl.constexpr, INTERP: tl.constexpr, DIRECT: tl.constexpr = False, KP: tl.constexpr = 1,
    SCALES_AHEAD: tl.constexpr = False, BULK: tl.constexpr = 0, RING: tl.constexpr = "",
    LAUNCH_DEPENDENTS: tl.constexpr = False, PREFETCH: tl.constexpr = False, WAIT_PRIOR: tl.constexpr = False,
    L2_STEPS: tl.constexpr = 0, SIGNAL_READY: tl.constexpr = False, WAIT_READY: tl.constexpr = False,
    ONE_CLAMP: tl.constexpr = False, XCHG: tl.constexpr = "",
):
    """Program (row tiles, expert-block walker). GATED: output rows 16 pid0 ..
    + 16 of the gate and the same rows of the up projection (up_tiles row tiles
    further), -> bf16 SiLU(gate) * up at the sorted position. Else (down): RT
    (1 or 2) consecutive row tiles, -> fp32 rows times the top-k weight at the
    (token, slot) index. BLOCK_M = 8 NT tokens of one expert at a time, the
    grid's second axis walking the expert blocks. Same inputs and outputs as
    fused_moe_w4a16's kernels.

    DIRECT (one token, NT 1; no alignment launch): block mb is the token's
    top-k slot mb (expert_ids_ptr = the token's top-k ids, read at once as a
    KP-wide vector; slots routed elsewhere are skipped). GATED writes row
    8 mb of out. The down GEMM (grid axis 1 of size 1) walks every slot and
    sums its rows times the top-k weight in registers, then writes the
    token's bf16 output times rsf: the combine without its launch.

    BULK > 0: each warp streams its share of K through a shared-memory ring
    of BULK stages (_ring_k_loop; RING declares the buffer; KG a multiple of
    NW x DEPTH).

    Programmatic dependent launch: LAUNCH_DEPENDENTS lets the next kernel
    launch at once; at one token PREFETCH (the down GEMM through its
    rings, launched with launch_pdl) copies its first live slot's first
    stages of weights before it waits for the gate/up GEMM's output;
    WAIT_PRIOR (launched with launch_pdl) waits for the previous launch's
    outputs before it reads any: with several tokens the alignment's (gate/up) or
    the gate/up GEMM's (down); at one token the down GEMM's register path
    first asks L2 for its first live slot's first L2_STEPS K steps.
    Per block instead (block_ready, several tokens): SIGNAL_READY (gate/up)
    counts each finished row tile of block mb at ready_ptr[mb]; WAIT_READY
    (down, launched with launch_pdl) starts on block mb once that count is
    ready_target, and reads the gate/up GEMM's rows through the coherent
    path.

    XCHG (_exchange_asm; NT 1, not DIRECT): a block's epilogue exchanges the
    warps' partial sums of every C register in one round through a static
    shared buffer, and warp w finishes C registers w, w + NW, ...; else one
    tl.sum over the warps per C register."""
    BM: tl.constexpr = 8 * NT
    TWO: tl.constexpr = GATED or RT == 2
    EXCHANGE: tl.constexpr = XCHG != ""  # the host sets XCHG only for NT 1, not DIRECT
    # the rings' layout (ring_bytes): per warp BULK stages of STAGE bytes, then
    # the barriers (one per warp and stage)
    NTILE: tl.constexpr = 2 if TWO else 1
    STAGE: tl.constexpr = NTILE * DEPTH * 576 + (1 if DIRECT else BM) * DEPTH * 128
    BARS: tl.constexpr = NW * BULK * STAGE
    t = tl.arange(0, 32 * NW)
    lane = t % 32
    warp = t // 32
    gi = lane // 4
    tq = lane % 4
    if GATED:
        tile0 = tl.program_id(0)
        tile1 = tile0 + up_tiles
    else:
        tile0 = tl.program_id(0) * RT
        tile1 = tile0 + 1
    if DIRECT:
        nblk = top_k
        # the token's ids and weights in one load each, not one dependent load per slot
        kidx = tl.arange(0, KP)
        ids_vec = tl.load(expert_ids_ptr + kidx, mask=kidx < top_k, other=-1)
        tw_vec = tl.load(tw_ptr + kidx, mask=kidx < top_k, other=0.0)
    else:
        if WAIT_PRIOR and not WAIT_READY:  # the alignment's (or the gate/up GEMM's) outputs
            tl.extra.cuda.gdc_wait()
        # WAIT_READY: the alignment ended before any gate/up program let this
        # launch start; its count read from L2, not a cached line
        nblk = tl.load(num_post_ptr, volatile=WAIT_READY) // BM
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    l32 = tl.arange(0, 32)
    # DIRECT down: the token's sums over its slots (C rows gi and gi + 8 of
    # each row tile; column 0, held by the lanes with l32 % 4 == 0)
    tot00 = tl.zeros((32,), tl.float32)
    tot02 = tl.zeros((32,), tl.float32)
    tot10 = tl.zeros((32,), tl.float32)
    tot12 = tl.zeros((32,), tl.float32)
    cnt = tl.program_id(0) * 0  # stages each warp's ring has taken so far (BULK)
    rb = t * 0
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    if BULK > 0:
        rb = tl.inline_asm_elementwise(asm=RING, constraints="=r,r", args=[t], dtype=tl.int32, is_pure=True, pack=1)
        for sl in tl.static_range(BULK):
            _ring_init(lane, rb + BARS + 8 * (warp * BULK + sl))
        tl.debug_barrier()
    first_live = num_experts * 0 + KP  # PREFETCH: the first live slot (KP: none)
    if PREFETCH:
        live_vec = (ids_vec >= 0) & (ids_vec < num_experts) & (kidx < top_k)
        first_live = tl.min(tl.where(live_vec, kidx, KP))
        if first_live < KP:
            ef = tl.sum(tl.where(kidx == first_live, ids_vec, 0)).to(tl.int64)
            _ring_prefetch(rb, t, w_ptr + ef * stride_we + tile0 * stride_wt,
                           w_ptr + ef * stride_we + tile1 * stride_wt,
                           s_ptr + ef * stride_se + tile0.to(tl.int64) * stride_sn,
                           s_ptr + ef * stride_se + tile1.to(tl.int64) * stride_sn, gi == 0, KG, NW, TWO, DEPTH,
                           BULK, STAGE, BARS)
        tl.extra.cuda.gdc_wait()
    if DIRECT and WAIT_PRIOR:
        if L2_STEPS > 0:
            live_vec = (ids_vec >= 0) & (ids_vec < num_experts) & (kidx < top_k)
            first_live = tl.min(tl.where(live_vec, kidx, KP))
            if first_live < KP:
                ef = tl.sum(tl.where(kidx == first_live, ids_vec, 0)).to(tl.int64)
                pw0 = w_ptr + ef * stride_we + tile0 * stride_wt + lane * 4
                pw1 = w_ptr + ef * stride_we + tile1 * stride_wt + lane * 4
                for j in tl.static_range(L2_STEPS * DEPTH):
                    kgp = tl.minimum(warp + j * NW, KG - 1)
                    _l2_ask(pw0 + kgp * 128)
                    if TWO:
                        _l2_ask(pw1 + kgp * 128)
        tl.extra.cuda.gdc_wait()
    for mb in range(tl.program_id(1), nblk, tl.num_programs(1)):
        if DIRECT:
            e_id = tl.sum(tl.where(kidx == mb, ids_vec, 0))
            live = (e_id >= 0) & (e_id < num_experts)
            e = tl.where(live, e_id, 0).to(tl.int64)
            sid = tl.where(gi == 0, mb, num_valid)
        else:
            if WAIT_READY:  # the block's rows from every gate/up program
                _ready_wait(ready_ptr + mb + t * 0, ready_target)
            live = mb >= 0
            # the lane's B column: token slot gi (and gi + 8) of this block
            e = tl.load(expert_ids_ptr + mb).to(tl.int64)
            sid = tl.load(sorted_ids_ptr + mb * BM + gi)
        valid = sid < num_valid
        if live:
            if X_IS_SORTED:
                xr = (mb * BM + gi).to(tl.int64)
            else:
                xr = tl.where(valid, sid // top_k, 0).to(tl.int64)
            xb = x32 + xr * stride_xm + 8 * tq
            xb2 = xb
            valid2 = valid
            if NT == 2:  # the second n8 tile: token slots 8 .. 15
                sid2 = tl.load(sorted_ids_ptr + mb * BM + 8 + gi)
                valid2 = sid2 < num_valid
                if X_IS_SORTED:
                    xr2 = (mb * BM + 8 + gi).to(tl.int64)
                else:
                    xr2 = tl.where(valid2, sid2 // top_k, 0).to(tl.int64)
                xb2 = x32 + xr2 * stride_xm + 8 * tq
            wp0 = w_ptr + e * stride_we + tile0 * stride_wt + lane * 4
            wp1 = w_ptr + e * stride_we + tile1 * stride_wt + lane * 4
            # scale fragments (frag_pack_scales): [E, N/16, K/64, 32] int16; an
            # INT4 lane reads its lane pair's 32 bits (_ld_scale)
            slane = lane if FMT == 0 else lane - lane % 2
            sp0 = s_ptr + e * stride_se + tile0.to(tl.int64) * stride_sn + slane
            sp1 = s_ptr + e * stride_se + tile1.to(tl.int64) * stride_sn + slane
            acc0 = _zeros(32 * NW, NT)
            acc1 = acc0
            if BULK > 0:
                acc0, acc1 = _ring_k_loop(
                    acc0, acc1, rb, cnt, t, w_ptr + e * stride_we + tile0 * stride_wt,
                    w_ptr + e * stride_we + tile1 * stride_wt,
                    s_ptr + e * stride_se + tile0.to(tl.int64) * stride_sn,
                    s_ptr + e * stride_se + tile1.to(tl.int64) * stride_sn,
                    xb - 8 * tq, xb2 - 8 * tq, valid, valid2, slane, KG, FMT, NT, NW, TWO, DEPTH, BULK, DIRECT,
                    STAGE, BARS, PREFETCH and (mb == first_live))
                cnt += KG // (NW * DEPTH)
            else:
                acc0, acc1 = _reg_k_loop(acc0, acc1, wp0, wp1, sp0, sp1, xb, xb2, valid, valid2, warp, KG, FMT, NT,
                                         NW, TWO, PIPE, DEPTH, EVEN_K, INTERP, SCALES_AHEAD, WAIT_READY,
                                         ONE_CLAMP)
            g = tl.load(g_ptr + e) * g_mult
            # the reduced [32] tile: C rows gi, gi + 8; columns (tokens) 2 tq, 2 tq + 1
            if DIRECT:
                # one token in column 0: only C rows gi (j = 0) and gi + 8 (j = 2)
                # are kept, their warp sums two per shared-memory exchange
                # (one program per SM at one token: the epilogue's barriers are
                # not hidden by other programs)
                c00, c02 = _warp_sum2(acc0[0], acc0[2], NW)
                c10 = c00
                c12 = c02
                if TWO:
                    c10, c12 = _warp_sum2(acc1[0], acc1[2], NW)
                s0 = (c00, c02)  # j = 0 and 2 (j // 2)
                s1 = (c10, c12)
            if DIRECT and not GATED:
                g = g * tl.sum(tl.where(kidx == mb, tw_vec, 0.0))
                tot00 += s0[0] * g
                tot02 += s0[1] * g
                if RT == 2:
                    tot10 += s1[0] * g
                    tot12 += s1[1] * g
            if EXCHANGE:
                # one bank-conflict-free exchange of every C register
                # (_exchange_asm), then each warp finishes its own C registers
                # j = warp, warp + NW, ... (not every warp all four)
                slot_t = mb * BM + 2 * tq
                sid_te = tl.load(sorted_ids_ptr + slot_t)
                sid_to = tl.load(sorted_ids_ptr + slot_t + 1)
                if not GATED:
                    tw_te = tl.load(tw_ptr + sid_te, mask=sid_te < num_valid, other=0.0)
                    tw_to = tl.load(tw_ptr + sid_to, mask=sid_to < num_valid, other=0.0)
                if TWO:
                    x0, x1, x2, x3, y0, y1, y2, y3 = _exchange8(acc0[0], acc0[1], acc0[2], acc0[3], acc1[0], acc1[1],
                                                                acc1[2], acc1[3], warp, lane, XCHG, NW,
                                                                INTERP)
                else:
                    x0, x1, x2, x3 = _exchange4(acc0[0], acc0[1], acc0[2], acc0[3], warp, lane, XCHG, NW, INTERP)
                    y0, y1, y2, y3 = x0, x1, x2, x3
                JPW: tl.constexpr = (4 + NW - 1) // NW
                for r in tl.static_range(JPW):
                    jw = warp + r * NW
                    odd = (jw % 2) == 1
                    v0 = tl.where(jw == 0, x0, tl.where(jw == 1, x1, tl.where(jw == 2, x2, x3))) * g
                    v1 = tl.where(jw == 0, y0, tl.where(jw == 1, y1, tl.where(jw == 2, y2, y3))) * g
                    sidj = tl.where(odd, sid_to, sid_te)
                    okj = (sidj < num_valid) & (jw < 4)
                    rr = gi + 8 * ((jw // 2) % 2)
                    if GATED:
                        h = _swiglu(v0, v1, swiglu_limit, HAS_LIMIT)
                        slot = slot_t + (jw % 2)
                        tl.store(out_ptr + slot.to(tl.int64) * stride_om + tile0 * 16 + rr, _to_bf16(h, INTERP),
                                 mask=okj)
                    else:
                        tw = tl.where(odd, tw_to, tw_te)
                        o_row = out_ptr + sidj.to(tl.int64) * stride_om
                        tl.store(o_row + tile0 * 16 + rr, v0 * tw, mask=okj)
                        if RT == 2:
                            tl.store(o_row + tile1 * 16 + rr, v1 * tw, mask=okj)
            # the tile's C registers j (one token, GATED: its column 0, j = 0 and 2)
            for j in tl.static_range(0, 0 if (DIRECT and not GATED) or EXCHANGE else 4 * NT, 2 if DIRECT else 1):
                if DIRECT:
                    v0 = s0[j // 2] * g
                else:
                    v0 = _warp_sum(acc0[j], NW) * g
                rr = l32 // 4 + 8 * ((j // 2) % 2)
                slot = mb * BM + 8 * (j // 4) + 2 * (l32 % 4) + (j % 2)
                if DIRECT:  # block mb holds slot mb in column 0 only (GATED here)
                    okj = slot == mb * BM
                else:
                    sidj = tl.load(sorted_ids_ptr + slot)
                    okj = sidj < num_valid
                if GATED:
                    gate = v0
                    if DIRECT:
                        up = s1[j // 2] * g
                    else:
                        up = _warp_sum(acc1[j], NW) * g
                    h = _swiglu(gate, up, swiglu_limit, HAS_LIMIT)
                    tl.store(out_ptr + slot.to(tl.int64) * stride_om + tile0 * 16 + rr, _to_bf16(h, INTERP), mask=okj)
                else:
                    tw = tl.load(tw_ptr + sidj, mask=okj, other=0.0)
                    o_row = out_ptr + sidj.to(tl.int64) * stride_om
                    tl.store(o_row + tile0 * 16 + rr, v0 * tw, mask=okj)
                    if RT == 2:
                        tl.store(o_row + tile1 * 16 + rr, _warp_sum(acc1[j], NW) * g * tw, mask=okj)
            if SIGNAL_READY:  # every thread's stores of this block, then one count
                tl.debug_barrier()
                _ready_signal(ready_ptr + mb + t * 0, t == 0)
    if DIRECT and not GATED:
        # the token's output row, the routed scaling factor applied here once
        # (slots routed elsewhere leave zeros)
        col0 = l32 % 4 == 0
        rr = l32 // 4
        tl.store(out_ptr + tile0 * 16 + rr, _to_bf16(tot00 * rsf, INTERP), mask=col0)
        tl.store(out_ptr + tile0 * 16 + 8 + rr, _to_bf16(tot02 * rsf, INTERP), mask=col0)
        if RT == 2:
            tl.store(out_ptr + tile1 * 16 + rr, _to_bf16(tot10 * rsf, INTERP), mask=col0)
            tl.store(out_ptr + tile1 * 16 + 8 + rr, _to_bf16(tot12 * rsf, INTERP), mask=col0)


# --------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------

# one token's gate/up: one program per top-k slot while these fit per SM
DIRECT_PROGRAMS_PER_SM = 2


def direct_split(top_k: int, tiles: int, sms: int, cfg: dict) -> int:
    """Programs per gate/up row tile that share one token's top-k slots (each
    walks its share). One program per slot when those fit in
    DIRECT_PROGRAMS_PER_SM per SM: under TP every slot is local and there
    are few row tiles. Else just enough per row tile for one program per SM:
    under EP most slots are routed to other ranks, and their programs only
    take block slots. cfg "direct_split" fixes it."""
    if cfg.get("direct_split"):
        split = cfg["direct_split"]
    elif top_k * tiles <= DIRECT_PROGRAMS_PER_SM * sms:
        split = top_k
    else:
        split = triton.cdiv(sms, tiles)
    return max(1, min(top_k, split))


def frag_gemm(x, Wf, s, g, out, tw, align, top_k, n_out, fmt, cfg, gated, x_sorted, swiglu_limit, num_valid,
               rsf=1.0, direct=False, launch_dependents=False, wait_prior=False, scale_shift=0, ready=None):
    """One GEMM launch. align: moe_align's (sorted ids, expert ids, count);
    direct: one token, align = (its top-k ids,) * 3 (see the kernel's DIRECT).
    launch_dependents: let the next launch start now (one token's gate/up
    before a dependent down GEMM, dependent_down). scale_shift: the INT4
    scale fragments' power of two (W4A16Weights.shift13 / shift2). ready:
    block_ready's counts (moe_align's fourth output): the gate/up GEMM counts
    its finished row tiles per block there, the down GEMM (wait_prior) waits
    for each block's."""
    sorted_ids, expert_ids = align[0], align[1]
    E, RT, KG = Wf.shape[:3]
    assert cfg.get("kernel") == "frag", f"packed weights need a fragment-kernel config, not {cfg}"
    # 16-byte activation loads; scale rows contiguous along K
    assert x.stride(1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
    assert s.dtype == torch.int16 and s.shape[1:] == (RT, KG, 32) and s.stride(3) == 1 and s.stride(2) == 32, (
        "scales must be frag_pack_scales' fragments", s.dtype, s.shape, s.stride())
    nt, nw = cfg["NT"], cfg["num_warps"]
    depth = cfg.get("depth", 1)
    assert depth in (1, 2, 3, 4), f"depth 1-4: {cfg}"
    scales_ahead = bool(cfg.get("scales_ahead"))
    assert cfg["pipe"] or not scales_ahead, f"scales_ahead is a pipe option: {cfg}"
    rt = 1 if gated else cfg.get("RT", 1)
    assert (n_out // 16) % rt == 0
    bulk, ring = ring_launch(cfg, KG, gated or rt == 2, 1 if direct else 8 * nt, interpreting())
    prefetch = ring_prefetch(cfg, KG, direct and not gated, x.device)
    if direct and not gated and not prefetch:
        wait_prior = dependent_down(cfg, KG, x.device)
    tiles = n_out // 16 // rt
    if direct and gated:  # the token's slots shared by direct_split() programs per row tile
        from .indexer import _num_sms

        assert nt == 1
        grid = (tiles, direct_split(top_k, tiles, _num_sms(x.device), cfg))
    elif direct:  # down: one program per row tile walks all slots
        assert nt == 1
        grid = (tiles, 1)
    else:
        # block walkers: one per expert block that can exist, at most the config's "walkers" (each
        # then walks several blocks when more exist; the others exit at once)
        grid = (tiles, max(1, min(expert_ids.shape[0], E, num_valid, cfg.get("walkers") or E)))
    wait_ready = ready is not None and not gated
    assert not wait_ready or (wait_prior and not bulk), "block_ready: a dependent down GEMM on the register path"
    _moe_frag_kernel[grid](
        x, Wf, s, g, out, tw, sorted_ids, expert_ids, align[2], align[2] if ready is None else ready,
        num_valid, top_k, KG,
        x.stride(0) // 2, Wf.stride(0), Wf.stride(1), s.stride(0), s.stride(1), out.stride(0),
        (RT // 2) if gated else 0, (128.0 if (fmt == "nvfp4" and not interpreting()) else 1.0) * 2.0**scale_shift,
        float(swiglu_limit or 0.0), float(rsf), E, x.shape[1] // 16 if wait_ready else 0,
        FMT=FORMATS.index(fmt), GATED=gated, X_IS_SORTED=x_sorted, HAS_LIMIT=bool(swiglu_limit),
        NT=nt, NW=nw, RT=rt, PIPE=cfg["pipe"], DEPTH=depth, EVEN_K=KG % (nw * depth) == 0,
        INTERP=interpreting(), DIRECT=direct, KP=triton.next_power_of_2(top_k) if direct else 1,
        SCALES_AHEAD=scales_ahead, BULK=bulk, RING=ring, LAUNCH_DEPENDENTS=launch_dependents, PREFETCH=prefetch,
        WAIT_PRIOR=wait_prior, L2_STEPS=int(cfg.get("pdl") or 0) if wait_prior and direct else 0,
        SIGNAL_READY=ready is not None and gated, WAIT_READY=wait_ready,
        ONE_CLAMP=bool(cfg.get("one_clamp")),
        XCHG=_exchange_asm(nw, 8 if gated or rt == 2 else 4) if cfg.get("exchange") and nt == 1 and not direct else "",
        num_warps=nw, num_stages=1, **({"launch_pdl": True} if prefetch or wait_prior else {}),
        **register_cap(cfg),
    )
