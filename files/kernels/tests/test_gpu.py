"""GPU tier (lent H200; not CI): every self-test case at the models' real
shapes, and the inline-asm dequantisation against the plain-Triton one."""

import os

import pytest
import torch

from sm120_kernels import registry

pytestmark = pytest.mark.gpu


MINE = ("moe_w4a16", "topk", "align")  # indexer/mHC have their own GPU tests


@pytest.mark.parametrize("case", [c for c in registry.selftest_cases() if c.name.startswith(MINE)],
                         ids=lambda c: c.name)
def test_selftest_case(case):
    res = case.run(torch.device("cuda"))
    assert res.ok, res.detail


def shipped_config(fmt, kernel):
    """The default file's first bucket whose GEMMs use this kernel (fma: decode, mma:
    tensor cores), so the test follows the configs that ship."""
    from sm120_kernels import configs

    buckets = configs.load_file("default.json")[fmt]
    return next(buckets[b] for b in sorted((b for b in buckets if b.isdigit()), key=int)
                if buckets[b]["gate_up"]["kernel"] == kernel)


@pytest.mark.parametrize("family", ["fma", "mma"])
@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
def test_asm_dequant_matches_plain(fmt, family, monkeypatch):
    from sm120_kernels import fused_moe_w4a16 as M

    cfg = shipped_config(fmt, family)

    E, H, I, T, k = 4, 1024, 256, 16, 3
    W = M.random_weights(fmt, E, H, I, "cuda", seed=5)
    x = torch.randn((T, H), device="cuda").to(torch.bfloat16)
    ids = torch.randint(0, E, (T, k), device="cuda", dtype=torch.int32)
    tw = torch.rand((T, k), device="cuda")
    a = M.fused_moe_w4a16(x, W, tw, ids, config=cfg)
    monkeypatch.setenv("SM120_KERNELS_NO_ASM", "1")
    b = M.fused_moe_w4a16(x, W, tw, ids, config=cfg)
    # same bf16 weights, same MMA order: equal up to the 2**7 split of the
    # NVFP4 scales (exact in fp32)
    torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-3)
    assert registry.compare(a, b, min_cos=0.99999, max_rel=2e-3).ok
