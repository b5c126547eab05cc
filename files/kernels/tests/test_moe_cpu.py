"""W4A16 MoE against the torch reference under the Triton interpreter, small shapes."""

import pytest
import torch

from sm120_kernels import fused_moe_w4a16 as M
from sm120_kernels.registry import compare

CFG = {k: dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=1) for k in ("gate_up", "down")}
# the CUDA-core decode kernel: 4 tokens per expert block, so experts with more
# tokens span several blocks
CFG_FMA = {k: dict(kernel="fma", BLOCK_M=4, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=1, prefetch=3)
           for k in ("gate_up", "down")}


def _run(fmt, T, E, H, I, ids, *, rsf=1.0, limit=None, kn=False, seed=0, scale=1.0, cfg=CFG):
    W = M.random_weights(fmt, E, H, I, "cpu", seed=seed, kn=kn)
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn((T, H), generator=g) * scale).to(torch.bfloat16)
    tw = torch.rand(ids.shape, generator=g) + 0.1
    out = M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=rsf, swiglu_limit=limit, config=cfg)
    ref = M.moe_w4a16_reference(x, W, tw, ids, routed_scaling_factor=rsf, swiglu_limit=limit)
    return out, ref, (x, W, tw)


# the interpreter is slow on the CUDA-core kernel: cover it on fewer variants
VARIANTS = [(fmt, kn, T, "mma") for fmt, kn in (("nvfp4", False), ("int4", False), ("int4", True)) for T in (1, 5)]
VARIANTS += [("nvfp4", False, 3, "fma"), ("int4", True, 3, "fma")]


@pytest.mark.parametrize("fmt,kn,T,family", VARIANTS)
def test_moe_matches_reference(interpret, fmt, kn, T, family):
    # H=320 (fma: 160) and I=96 are not multiples of BLOCK_K=128 / BLOCK_N=64;
    # expert 3 gets no tokens; -1 slots belong to other ranks; 9 is out of range.
    E, H, I, k = 4, (320 if family == "mma" else 160), 96, 3
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(0, 3, (T, k), generator=g, dtype=torch.int32)
    ids[0] = torch.tensor([0, -1, 2], dtype=torch.int32)
    if T > 2:
        ids[1] = torch.tensor([-1, 9, -1], dtype=torch.int32)  # no local slot at all
    out, ref, _ = _run(fmt, T, E, H, I, ids, rsf=1.5, kn=kn, seed=T, cfg=CFG if family == "mma" else CFG_FMA)
    res = compare(out, ref)
    assert res.ok, res.detail
    if T > 2:
        assert torch.count_nonzero(out[1]) == 0


@pytest.mark.parametrize("fmt,family", [("nvfp4", "mma"), ("int4", "mma")])
def test_swiglu_clamp(interpret, fmt, family):
    E, H, I, T, k = 2, 256, 64, 4, 2
    ids = torch.tensor([[0, 1]] * T, dtype=torch.int32)
    # inputs scaled up so that gate/up exceed the limit
    out, ref, _ = _run(fmt, T, E, H, I, ids, limit=0.5, scale=8.0, cfg=CFG if family == "mma" else CFG_FMA)
    out_nolimit, ref_nolimit, _ = _run(fmt, T, E, H, I, ids, limit=None, scale=8.0)
    assert compare(out, ref).ok
    assert not compare(ref, ref_nolimit).ok, "clamp must change the result at this scale"


def test_routed_scaling_factor_applied_once(interpret):
    E, H, I, T, k = 3, 256, 64, 3, 2
    ids = torch.tensor([[0, 1], [2, -1], [1, 2]], dtype=torch.int32)
    W = M.random_weights("nvfp4", E, H, I, "cpu", seed=3)
    x = torch.randn((T, H)).to(torch.bfloat16)
    tw = torch.rand((T, k)) + 0.1
    o1 = M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=1.0, config=CFG).float()  # noqa
    o2 = M.fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=2.5, config=CFG).float()
    # out(rsf) = rsf * out(1) up to one bf16 rounding
    torch.testing.assert_close(o2, 2.5 * o1, rtol=2 ** -7, atol=1e-6)
    assert not torch.allclose(o2, o1)


def test_dequant_reference_formats():
    # NVFP4: e2m1 codes with the first element in the low nibble
    w = torch.tensor([[0x76543210, -0x01234568]], dtype=torch.int32)  # bytes 10 32 54 76 | 98 BA DC FE
    s = torch.tensor([[0x38]], dtype=torch.uint8)  # e4m3 1.0
    d = M.dequant_reference("nvfp4", w, s, torch.tensor(0.5)).float()[0]
    lut = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    expect = [v * 0.5 for v in lut] + [-v * 0.5 for v in lut]
    assert d.tolist() == expect
    # INT4: value = (q - 8) * scale
    s4 = torch.tensor([[0.25]], dtype=torch.bfloat16)
    d4 = M.dequant_reference("int4", w[:, :1].repeat(1, 4), s4, torch.tensor(1.0)).float()[0]
    assert d4[:8].tolist() == [(q - 8) * 0.25 for q in range(8)]
