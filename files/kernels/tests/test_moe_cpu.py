"""W4A16 MoE against the torch reference under the Triton interpreter, small shapes."""

import pytest
import torch

from sm120_kernels import fused_moe_w4a16 as M
from sm120_kernels.registry import compare

from sm120_kernels import formats, routing, weights as P
from sm120_kernels import fused_moe_w4a16_frag as F

# tensor-core GEMM (weights whose shapes do not fit the fragment order)
CFG = {k: dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=1) for k in ("gate_up", "down")}
# the fragment kernel: 8 tokens per expert block (NT 1) or 16 (NT 2), so experts
# with more tokens span several blocks; K split over 2 warps, so the down
# GEMM's single K group (I = 64) leaves one warp on a clamped, zero-scaled group
CFG_FRAG = {"gate_up": dict(kernel="frag", NT=1, num_warps=2, pipe=True),
            "down": dict(kernel="frag", NT=1, num_warps=2, pipe=True, RT=2)}
CFG_FRAG2 = {"gate_up": dict(kernel="frag", NT=2, num_warps=1, pipe=False),
             "down": dict(kernel="frag", NT=2, num_warps=1, pipe=False, RT=1)}


def _run(fmt, T, E, H, I, ids, *, rsf=1.0, limit=None, kn=False, seed=0, scale=1.0, cfg=CFG):
    W = M.random_weights(fmt, E, H, I, "cpu", seed=seed, kn=kn)
    assert W.packed == (cfg is not CFG), "shapes must pick the kernel under test"
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn((T, H), generator=g) * scale).to(torch.bfloat16)
    tw = torch.rand(ids.shape, generator=g) + 0.1
    out = M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=rsf, swiglu_limit=limit, config=cfg)
    ref = M.moe_w4a16_reference(x, W, tw, ids, routed_scaling_factor=rsf, swiglu_limit=limit)
    return out, ref, (x, W, tw)


# the interpreter is slow on the fragment kernel (its MMA emulated per warp): fewer variants
VARIANTS = [(fmt, kn, T, "mma") for fmt, kn in (("nvfp4", False), ("int4", False), ("int4", True)) for T in (1, 5)]
VARIANTS += [("nvfp4", False, 3, "frag"), ("int4", True, 3, "frag"), ("nvfp4", False, 20, "frag2")]
# the register ring at depth 3 and 4 (K groups per warp and step), with K not
# a multiple of the step: clamped groups contribute nothing
CFG_RING3 = {"gate_up": dict(kernel="frag", NT=1, num_warps=2, pipe=False, depth=3),
             "down": dict(kernel="frag", NT=1, num_warps=1, pipe=False, depth=4, RT=2)}
CFG_RING4 = {"gate_up": dict(kernel="frag", NT=1, num_warps=1, pipe=False, depth=4),
             "down": dict(kernel="frag", NT=1, num_warps=2, pipe=False, depth=3, RT=1)}
VARIANTS += [("int4", True, 3, "ring3"), ("nvfp4", False, 1, "ring4")]
# pipe steps of 3 and 4 K groups per warp, the gate/up decoding the next
# step's scales (scales_ahead, which only INT4's configs use), with clamped
# groups as in the ring cases; maxnreg only reaches ptxas (not the interpreter)
CFG_AHEAD = {"gate_up": dict(kernel="frag", NT=1, num_warps=2, pipe=True, depth=3, scales_ahead=True, maxnreg=128),
             "down": dict(kernel="frag", NT=1, num_warps=1, pipe=True, depth=4, RT=2)}
VARIANTS += [("int4", True, 3, "ahead")]
FAMILY_CFG = {"mma": CFG, "frag": CFG_FRAG, "frag2": CFG_FRAG2, "ring3": CFG_RING3, "ring4": CFG_RING4,
              "ahead": CFG_AHEAD}


@pytest.mark.parametrize("fmt,kn,T,family", VARIANTS)
def test_moe_matches_reference(interpret, fmt, kn, T, family):
    # mma: H=320 and I=96 are not multiples of BLOCK_K=128 / BLOCK_N=64 (nor of
    # the fragment order's 64 columns, so the weights stay unpacked); frag:
    # H=128, I=64; expert 3 gets no tokens; -1 slots belong to other ranks; 9 is
    # out of range; T=20 puts more than 16 tokens on one expert (two blocks);
    # ring and ahead: H=448 (320 for ring4), I=128.
    E, H, I, k = 4, (320 if family == "mma" else 128), (96 if family == "mma" else 64), 3
    if family.startswith("ring") or family == "ahead":
        # 7 (ring4: 5) and 2 K groups: not a multiple of any ring step (4 or 6
        # groups), so each ends on clamped ones; the gate/up takes two steps
        H, I = (320 if family == "ring4" else 448), 128
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(0, 3, (T, k), generator=g, dtype=torch.int32)
    ids[0] = torch.tensor([0, -1, 2], dtype=torch.int32)
    if T > 2:
        ids[1] = torch.tensor([-1, 9, -1], dtype=torch.int32)  # no local slot at all
    if family == "frag2":
        ids[2:, 0] = 1  # 18 tokens on expert 1
    out, ref, _ = _run(fmt, T, E, H, I, ids, rsf=1.5, kn=kn, seed=T, cfg=FAMILY_CFG[family],
                       limit=0.5 if family == "frag2" else None)
    res = compare(out, ref)
    assert res.ok, res.detail
    if T > 2:
        assert torch.count_nonzero(out[1]) == 0


@pytest.mark.parametrize("fmt,kn,rt,split,ids", [
    ("nvfp4", False, 2, 3, [0, -1, 2]),  # a slot routed to another rank between two local ones
    ("int4", True, 1, 2, [2, 9, 1]),  # 9: out of range; two gate/up programs share the 3 slots
    ("nvfp4", False, 1, 1, [-1, -1, -1]),  # nothing local: zeros
    ("nvfp4", False, 1, 1, [1, 3, 0]),  # every slot local, one gate/up program walks them
])
def test_one_token_direct_path(interpret, monkeypatch, fmt, kn, rt, split, ids):
    """One token: two launches (each slot its own block, the down GEMM sums the
    slots and applies rsf) against the reference and against the aligned path
    of 16-token blocks."""
    aligned_calls = []
    align = routing.moe_align
    monkeypatch.setattr(routing, "moe_align", lambda *a, **kw: aligned_calls.append(a) or align(*a, **kw))
    E, H, I = 4, 128, 64
    cfg = {"gate_up": dict(CFG_FRAG["gate_up"], direct_split=split), "down": dict(CFG_FRAG["down"], RT=rt)}
    ids = torch.tensor([ids], dtype=torch.int32)
    limit = 0.5 if fmt == "nvfp4" else None
    out, ref, (x, W, tw) = _run(fmt, 1, E, H, I, ids, rsf=1.5, kn=kn, seed=5, cfg=cfg, limit=limit)
    assert not aligned_calls, "one token takes the path without the alignment launch"
    aligned = M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=1.5, config=CFG_FRAG2, swiglu_limit=limit)
    assert len(aligned_calls) == 1
    if (ids < 0).all():
        assert torch.count_nonzero(out) == 0 and torch.count_nonzero(ref) == 0
        return
    assert compare(out, ref).ok, compare(out, ref).detail
    # same sums in another order: equal up to fp32 rounding before the bf16 cast
    torch.testing.assert_close(out.float(), aligned.float(), rtol=2 ** -7, atol=1e-5)


# one_clamp ships in NVFP4's configs only, on 8-row blocks, with and without the pipe
@pytest.mark.parametrize("fmt,pipe,ahead,nt", [("nvfp4", True, False, 1), ("nvfp4", False, False, 1)])
def test_one_clamp_is_bit_identical(interpret, fmt, pipe, ahead, nt):
    """one_clamp (one address computation per K step, the other register sets
    at constant offsets) loads the same groups: the output is the plain
    config's bit for bit, and the reference's (K a whole number of steps:
    H 256 = 4 groups over 1 warp x 2 sets, I 128 = 2 groups over 1 warp x 2;
    a pipe's last prefetch then reloads the last step, and is never used)."""
    E, H, I, k, T = 4, 256, 128, 3, 5
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, E, (T, k), generator=g, dtype=torch.int32)
    ids[1] = torch.tensor([-1, 9, 2], dtype=torch.int32)
    gu = dict(kernel="frag", NT=nt, num_warps=1, pipe=pipe, depth=2, **({"scales_ahead": True} if ahead else {}))
    plain = {"gate_up": gu, "down": dict(kernel="frag", NT=nt, num_warps=1, pipe=pipe, depth=2, RT=2)}
    clamped = {p: dict(c, one_clamp=True) for p, c in plain.items()}
    out, ref, (x, W, tw) = _run(fmt, T, E, H, I, ids, rsf=1.5, seed=7, cfg=clamped)
    assert compare(out, ref).ok, compare(out, ref).detail
    assert torch.equal(out, M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=1.5, config=plain))


@pytest.mark.parametrize("fmt,nw,rt", [("nvfp4", 1, 2), ("int4", 2, 1), ("nvfp4", 4, 1), ("int4", 4, 2)])
def test_exchange_is_bit_identical(interpret, fmt, nw, rt):
    """exchange (the warps' sums of a block in one round, each warp finishing
    its own C registers) writes every output row the per-register reductions
    write: the plain config's output bit for bit (the interpreter sums the
    warps in the same order), and the reference's. One warp finishing all four
    C registers, two warps two each, four one each; the down GEMM with one and
    two row tiles; one block walker, so a program exchanges for several blocks
    (I 64: the down GEMM's single K group leaves the other warps clamped)."""
    E, H, I, k, T = 4, 256, 64, 3, 5
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, E, (T, k), generator=g, dtype=torch.int32)
    ids[1] = torch.tensor([-1, 9, 2], dtype=torch.int32)
    plain = {"gate_up": dict(kernel="frag", NT=1, num_warps=nw, pipe=True, depth=2, walkers=1),
             "down": dict(kernel="frag", NT=1, num_warps=nw, pipe=False, depth=2, RT=rt, walkers=1)}
    exchanged = {p: dict(c, exchange=True) for p, c in plain.items()}
    out, ref, (x, W, tw) = _run(fmt, T, E, H, I, ids, rsf=1.5, seed=11, cfg=exchanged)
    assert compare(out, ref).ok, compare(out, ref).detail
    assert torch.equal(out, M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=1.5, config=plain))


def test_exchange_asm_layout():
    """The exchange's shared buffer: [warp][vector][lane] 16-byte vectors (a
    lane's stores and loads 16 bytes apart, so no two lanes of a quarter-warp
    share a bank), one barrier before the stores (a walker's previous block)
    and one between stores and loads, every warp's vectors read and added."""
    from sm120_kernels.fused_moe_w4a16_frag import _exchange_asm

    for nw, nv in ((1, 4), (2, 8), (4, 8), (8, 4)):
        asm = _exchange_asm(nw, nv)
        vec = nv // 4
        assert f".b8 moe_xchg[{nw * vec * 512}]" in asm
        assert asm.count("bar.sync 0;") == 2
        assert asm.index("bar.sync 0;") < asm.index("st.shared") < asm.rindex("bar.sync 0;") < asm.index("ld.shared")
        assert asm.count("st.shared.v4.f32") == vec
        assert asm.count("ld.shared.v4.f32") == nw * vec
        assert asm.count("add.f32") == (nw - 1) * nv
        assert f"mad.lo.u32 xa, ${2 * nv + 1}, 16, xa;" in asm  # lanes 16 bytes apart


@pytest.mark.parametrize("fmt,family,walkers", [("nvfp4", "frag2", 1), ("int4", "frag", 2)])
def test_block_walkers_cap(interpret, fmt, family, walkers):
    """walkers caps the programs per row tile that walk the expert blocks:
    with fewer walkers than blocks each walks several, and the output is the
    uncapped launch's bit for bit (T 12, three slots each over four experts:
    more blocks than walkers with 8- and with 16-token blocks)."""
    E, H, I, k, T = 4, 128, 64, 3, 12
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(0, 4, (T, k), generator=g, dtype=torch.int32)
    ids[1] = torch.tensor([-1, 9, -1], dtype=torch.int32)
    cfg = FAMILY_CFG[family]
    capped = {p: dict(cfg[p], walkers=walkers) for p in ("gate_up", "down")}
    out, ref, (x, W, tw) = _run(fmt, T, E, H, I, ids, rsf=1.5, seed=T, cfg=capped)
    assert compare(out, ref).ok, compare(out, ref).detail
    assert torch.equal(out, M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=1.5, config=cfg))


@pytest.mark.parametrize("k,tiles,expect", [
    (6, 128, 2), (8, 128, 2),  # EP8 (DeepSeek-V4-Flash, Kimi-K2.5): 2 programs per row tile walk the slots
    (6, 32, 6), (8, 32, 8),  # TP4: every slot local, 32 row tiles: a program per slot
    (6, 300, 1),  # more row tiles than SMs: one program walks all slots
])
def test_direct_split_rule(k, tiles, expect):
    """The one-token gate/up grid on a 132-SM GPU (the H200's EP8 and TP4 cases)."""
    assert F.direct_split(k, tiles, 132, {}) == expect
    assert F.direct_split(k, tiles, 132, {"direct_split": 3}) == 3


@pytest.mark.parametrize("fmt,family", [("nvfp4", "frag"), ("int4", "frag")])
def test_swiglu_clamp(interpret, fmt, family):
    E, H, I, T = 2, 256, 64, 4
    ids = torch.tensor([[0, 1]] * T, dtype=torch.int32)
    # inputs scaled up so that gate/up exceed the limit
    out, ref, _ = _run(fmt, T, E, H, I, ids, limit=0.5, scale=8.0, cfg=FAMILY_CFG[family])
    out_nolimit, ref_nolimit, _ = _run(fmt, T, E, H, I, ids, limit=None, scale=8.0, cfg=FAMILY_CFG[family])
    assert compare(out, ref).ok
    assert not compare(ref, ref_nolimit).ok, "clamp must change the result at this scale"


def test_routed_scaling_factor_applied_once(interpret):
    E, H, I, T, k = 3, 128, 64, 3, 2
    ids = torch.tensor([[0, 1], [2, -1], [1, 2]], dtype=torch.int32)
    W = M.random_weights("nvfp4", E, H, I, "cpu", seed=3)
    assert W.packed
    x = torch.randn((T, H)).to(torch.bfloat16)
    tw = torch.rand((T, k)) + 0.1
    o1 = M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=1.0, config=CFG_FRAG).float()  # noqa
    o2 = M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=2.5, config=CFG_FRAG).float()
    # out(rsf) = rsf * out(1) up to one bf16 rounding
    torch.testing.assert_close(o2, 2.5 * o1, rtol=2 ** -7, atol=1e-6)
    assert not torch.allclose(o2, o1)


def test_dequant_reference_formats():
    # NVFP4: e2m1 codes with the first element in the low nibble
    w = torch.tensor([[0x76543210, -0x01234568]], dtype=torch.int32)  # bytes 10 32 54 76 | 98 BA DC FE
    s = torch.tensor([[0x38]], dtype=torch.uint8)  # e4m3 1.0
    d = formats.dequant_reference("nvfp4", w, s, torch.tensor(0.5)).float()[0]
    lut = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    expect = [v * 0.5 for v in lut] + [-v * 0.5 for v in lut]
    assert d.tolist() == expect
    # INT4: value = (q - 8) * scale
    s4 = torch.tensor([[0.25]], dtype=torch.bfloat16)
    d4 = formats.dequant_reference("int4", w[:, :1].repeat(1, 4), s4, torch.tensor(1.0)).float()[0]
    assert d4[:8].tolist() == [(q - 8) * 0.25 for q in range(8)]


def test_frag_pack_layout():
    """frag_pack puts lane (g, q)'s A values of each 16 x 16 tile into one word
    (INT4: nibbles r and r + 4 = the bf16x2 register a_r of the m16n8k16 A
    fragment; NVFP4: the same values, read back through _NVFP4_A's integer
    steps) and round-trips; K is permuted within
    64-column groups as documented."""
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-2**31, 2**31 - 1, (2, 32, 16), generator=g, dtype=torch.int32)
    f = P.frag_pack(w, "int4")
    fn = P.frag_pack(w, "nvfp4")
    assert f.shape == fn.shape == (2, 2, 2, 32, 4)
    assert torch.equal(P.frag_unpack(f, "int4"), w) and torch.equal(P.frag_unpack(fn, "nvfp4"), w)
    nib = ((w[1].unsqueeze(-1) >> torch.arange(0, 32, 4)) & 0xF).reshape(32, 128)
    for rt, kg, lane, j in ((0, 0, 0, 0), (1, 1, 29, 3), (0, 1, 6, 2)):
        gi, q = lane // 4, lane % 4
        word = int(f[1, rt, kg, lane, j]) & 0xFFFFFFFF
        got = [(word >> (4 * i)) & 0xF for i in range(8)]

        def a(row, c):  # A[row][c] of tile (rt, kg, j): K column 64 kg + 16 q' + 4 j + 2 ch + hi
            ch, qq, hi = c // 8, (c % 8) // 2, c % 2
            return int(nib[16 * rt + row, 64 * kg + 16 * qq + 4 * j + 2 * ch + hi])

        want = [a(gi, 2 * q), a(gi + 8, 2 * q), a(gi, 2 * q + 8), a(gi + 8, 2 * q + 8),
                a(gi, 2 * q + 1), a(gi + 8, 2 * q + 1), a(gi, 2 * q + 9), a(gi + 8, 2 * q + 9)]
        assert got == want, (rt, kg, lane, j)
        wn = int(fn[1, rt, kg, lane, j]) & 0xFFFFFFFF
        regs = [_nvfp4_register(wn, pieces) for pieces in P.NVFP4_PIECES]
        got_n = [(((regs[i % 4] >> (16 * (i // 4) + 15)) & 1) << 3) | ((regs[i % 4] >> (16 * (i // 4) + 6)) & 7)
                 for i in range(8)]
        assert got_n == want, (rt, kg, lane, j)


def _nvfp4_register(word, pieces):
    """What _NVFP4_A's integer steps leave in one register (before the fma)."""
    out = 0
    for op, k, mask in pieces:
        moved = {"shl": word << k, "shr": word >> k, "rotl": (word << k) | (word >> (32 - k))}[op]
        out |= moved & 0xFFFFFFFF & mask
    return out


def test_nvfp4_decode_is_nine_integer_instructions():
    """_NVFP4_A: per register one fma; the bits it moves tile the word (every
    word bit reaches exactly one value's bit), in 9 integer instructions."""
    body = [line.strip().split()[0] for line in F._NVFP4_A.splitlines()]
    assert body.count("fma.rn.bf16x2") == 4
    assert len([op for op in body if op not in ("fma.rn.bf16x2", "mov.b32")]) == 9
    assert sorted(b for row in P.NVFP4_BIT_SOURCE for b in row) == list(range(32))
    for bit in range(32):  # a single set bit lands in exactly one register field
        fields = [_nvfp4_register(1 << bit, pieces) & 0x81C081C0 for pieces in P.NVFP4_PIECES]
        assert sorted(bin(f).count("1") for f in fields) == [0, 0, 0, 1], bit


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
def test_frag_pack_scales_layout(fmt):
    """frag_pack_scales gives lane (g, q) of row tile rt and K group kg the
    scales it multiplies by (NVFP4: rows g and g + 8 of group 4 kg + q as the
    low and high byte, each e4m3 scale as the code _NVFP4_SCALES decodes; INT4: row g + 8 (q & 1) of group 2 kg + q // 2, the other
    row being lane q ^ 1's, as the bf16 of s * 2**133 for rows g and s * 2**129
    for rows g + 8), keeps the size, and round-trips exactly."""
    g = torch.Generator().manual_seed(1)
    E, N, K = 2, 32, 128
    per_kg = 4 if fmt == "nvfp4" else 2
    raw = torch.randint(0, 2**16, (E, N, K // 64 * per_kg), generator=g, dtype=torch.int32)
    if fmt == "nvfp4":  # any non-negative e4m3 (zeros, subnormals, the largest) and -0
        s = (raw % 0x7F).to(torch.uint8)
        s[0, 0, 0], s[0, 1, 1], s[1, 2, 3], s[1, 3, 0] = 0x80, 0x01, 0x7E, 0x00
    else:  # any bf16 below 2**-5 in magnitude: signs, zeros, subnormals, the largest
        mag = (raw & 0x7FFF) % 0x3D00
        s = torch.where(raw >= 2**15, mag | -2**15, mag).to(torch.int16).view(torch.bfloat16)
        s[0, 0, 0] = 0.0
        s[1, 5, 1] = 2.0**-5 * (1 - 2.0**-8)
        s[1, 9, 2] = -2.0**-133
    sf = P.frag_pack_scales(s, fmt)
    assert sf.dtype == torch.int16 and sf.shape == (E, N // 16, K // 64, 32)
    assert sf.numel() * 2 == s.numel() * s.element_size()
    back = P.frag_unpack_scales(sf, fmt)
    assert back.dtype == s.dtype and torch.equal(back.view(torch.uint8), s.view(torch.uint8))
    if fmt == "nvfp4":
        bits = P._NVFP4_SCALE_ENCODE[s.to(torch.long)]
        assert bits.min() >= 0
        assert (s.to(torch.int32) + 16 == bits)[(s >= 8) & (s < 0x7F)].all()  # normal scales: e4m3 + 16
    else:
        rows = torch.arange(N)[None, :, None] % 16 < 8
        shifted = torch.where(rows, s.double() * 2.0**133, s.double() * 2.0**129)
        bits = shifted.float().to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
        assert torch.equal(shifted, shifted.float().to(torch.bfloat16).double()), "not exact in bf16"
    for e, rt, kg, lane in ((0, 0, 0, 0), (1, 1, 1, 31), (0, 1, 0, 6), (1, 0, 1, 13), (1, 0, 0, 21)):
        gi, q = divmod(lane, 4)
        got = int(sf[e, rt, kg, lane]) & 0xFFFF
        if fmt == "nvfp4":
            want = int(bits[e, 16 * rt + gi, 4 * kg + q]) | (int(bits[e, 16 * rt + gi + 8, 4 * kg + q]) << 8)
        else:
            want = int(bits[e, 16 * rt + gi + 8 * (q & 1), 2 * kg + q // 2])
        assert got == want, (fmt, e, rt, kg, lane)


@pytest.mark.parametrize("byte", [0x81, 0xB8, 0xFE, 0x7F, 0xFF])
def test_nvfp4_scale_fragments_refuse_negative_and_nan_scales(byte):
    """NVFP4 block scales are unsigned e4m3: a negative or NaN one is refused
    with the fix, before anything is packed."""
    s = torch.full((1, 16, 4), 0x38, dtype=torch.uint8)
    s[0, 7, 2] = byte
    with pytest.raises(ValueError, match=f"non-negative e4m3.*first byte {byte:#04x}.*Fix"):
        P.frag_pack_scales(s, "nvfp4")


def test_int4_scale_fragments_refuse_scales_without_headroom():
    s = torch.full((1, 16, 2), 2.0**-5, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="int4_headroom"):
        P.frag_pack_scales(s, "int4")
    assert [P.int4_headroom(torch.tensor([v])) for v in (0.0, 0.031, 2.0**-5, -0.05, 0.5, 3.0)] == [0, 0, 1, 1, 5, 7]


def test_int4_large_scales_are_stored_shifted(interpret):
    """make_weights stores INT4 scales of 2**-5 and above divided by a power of
    two, which the kernel multiplies its sums by: scales() gives the original
    scales back, and the kernel's output is that of the original scales."""
    E, H, I, T = 2, 128, 64, 3
    W = M.random_weights("int4", E, H, I, "cpu", seed=6, pack=False)
    s13, s2 = (W.s13.float() * 64).to(torch.bfloat16), (W.s2.float() * 64).to(torch.bfloat16)
    big = P.make_weights("int4", W.w13, s13, W.w2, s2)
    j13, j2 = P.int4_headroom(s13), P.int4_headroom(s2)
    assert big.packed and (big.shift13, big.shift2) == (j13, j2) and j13 > 0 and j2 > 0
    assert torch.equal(big.g13, W.g13) and torch.equal(big.g2, W.g2)
    assert torch.equal(big.scales("s13").view(torch.int16), s13.view(torch.int16))
    assert torch.equal(big.scales("s2").view(torch.int16), s2.view(torch.int16))
    g = torch.Generator().manual_seed(6)
    x = (torch.randn((T, H), generator=g) / 64).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [1, -1], [0, 0]], dtype=torch.int32)
    tw = torch.rand(ids.shape, generator=g) + 0.1
    out = M.fused_moe_w4a16(x, big, tw, ids, config=CFG_FRAG)
    plain = P.W4A16Weights("int4", W.w13, s13, W.g13, W.w2, s2, W.g2)
    res = compare(out, M.moe_w4a16_reference(x, plain, tw, ids))
    assert res.ok, res.detail


def test_unpackable_shapes_stay_in_checkpoint_order():
    W = M.random_weights("int4", 2, 320, 96, "cpu", kn=True)
    assert not W.packed and W.w13.shape == (2, 192, 40)


def test_fragment_kernel_takes_activations_at_any_offset(interpret):
    # a view starting 2 bytes into its storage: the 16-byte activation loads need a copy
    E, H, I, T = 2, 128, 64, 2
    W = M.random_weights("int4", E, H, I, "cpu", seed=4, kn=True)
    base = torch.randn(T * H + 1).to(torch.bfloat16)
    x = base[1:].view(T, H)
    assert x.data_ptr() % 16 != 0
    ids = torch.tensor([[0, 1], [1, -1]], dtype=torch.int32)
    tw = torch.rand((T, 2)) + 0.1
    out = M.fused_moe_w4a16(x, W, tw, ids, config=CFG_FRAG)
    assert compare(out, M.moe_w4a16_reference(x, W, tw, ids)).ok
