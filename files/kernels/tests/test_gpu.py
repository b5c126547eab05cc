"""GPU tier (lent H200; not CI): every self-test case at the models' real
shapes, and the inline-asm dequantisation against the plain-Triton one."""

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


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
def test_asm_dequant_matches_plain(fmt, monkeypatch):
    """The tensor-core GEMM (unpacked weights): inline-asm dequantisation
    against the plain-Triton one."""
    from sm120_kernels import fused_moe_w4a16 as M, gemm_tensor_core as TC

    cfg = TC.TENSOR_CORE_CONFIG[fmt]
    E, H, I, T, k = 4, 1024, 256, 16, 3
    W = M.random_weights(fmt, E, H, I, "cuda", seed=5, pack=False)
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


def _against_reference(fmt, cfg, E, H, I, ids, seed):
    """fused_moe_w4a16 with cfg on random weights and activations for the
    top-k ids, compared with the dequantised reference (rsf 1.5, clamp 10)."""
    from sm120_kernels import fused_moe_w4a16 as M

    W = M.random_weights(fmt, E, H, I, "cuda", seed=seed)
    assert W.packed
    x = torch.randn((ids.shape[0], H), device="cuda").to(torch.bfloat16)
    tw = torch.rand(ids.shape, device="cuda")
    out = M.fused_moe_w4a16(x, W, tw, ids, config=cfg, routed_scaling_factor=1.5, swiglu_limit=10.0)
    ref = M.moe_w4a16_reference(x, W, tw, ids, routed_scaling_factor=1.5, swiglu_limit=10.0)
    return registry.compare(out, ref)


def _random_ids(T, E, k):
    """T tokens' top-k ids, every fifth token's second slot routed elsewhere."""
    ids = torch.randint(0, E, (T, k), device="cuda", dtype=torch.int32)
    ids[::5, 1] = -1
    return ids


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
@pytest.mark.parametrize("bucket", ["1", "64", "1048576"])
def test_fragment_kernel_every_default_config(fmt, bucket):
    """Each shipped default launch shape of the fragment kernel (inline PTX MMA)
    against the reference, with a batch that fills several expert blocks."""
    from sm120_kernels import configs

    cfg = configs.load_file("default.json")[fmt][bucket]
    res = _against_reference(fmt, cfg, 4, 1024, 256, _random_ids(40, 4, 3), seed=6)
    assert res.ok, res.detail


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
@pytest.mark.parametrize("bucket", ["1", "64", "1048576"])
def test_fragment_kernel_through_rings(fmt, bucket):
    """Both GEMMs through the warps' shared-memory rings (config "bulk") against
    the reference: one token (the two-launch path), and 40 tokens in several
    expert blocks per program (the rings' stages and barrier phases carried
    from block to block), with 8 and 16 tokens per block."""
    from sm120_kernels import configs, fused_moe_w4a16_frag as F

    base = configs.load_file("default.json")[fmt][bucket]
    depth = 1 if base["gate_up"]["NT"] == 2 else 2
    cfg = {part: {**base[part], "num_warps": 4, "depth": depth, "bulk": 2} for part in ("gate_up", "down")}
    E, H, I = 4, 2048, 512
    for part, kg in (("gate_up", H // 64), ("down", I // 64)):
        assert F.ring_launch(cfg[part], kg, True, 8 * cfg[part]["NT"])[0] == 2  # the rings, not the fallback
    res = _against_reference(fmt, cfg, E, H, I, _random_ids(1 if bucket == "1" else 40, E, 3), seed=7)
    assert res.ok, res.detail


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
@pytest.mark.parametrize("down", [{"num_warps": 4, "bulk": 2}, {"num_warps": 8, "bulk": 1}], ids=["4w", "8w"])
@pytest.mark.parametrize("first_live", [0, 1])
def test_one_token_down_prefetch(fmt, down, first_live):
    """One token, the down GEMM through its rings with its first live slot's
    weights prefetched before the gate/up GEMM ends (programmatic dependent
    launch), against the reference: the other live slots stream as usual
    after it (the rings' stages carried on), the first slot routed elsewhere
    or not."""
    from sm120_kernels import configs, fused_moe_w4a16_frag as F

    base = configs.load_file("default.json")[fmt]["1"]
    cfg = {"gate_up": base["gate_up"],
           "down": {"kernel": "frag", "NT": 1, "pipe": False, "depth": 4, "RT": 1, "prefetch": True, **down}}
    E, H, I = 4, 1024, 2048
    assert F.ring_prefetch(cfg["down"], I // 64, True, torch.device("cuda"))
    ids = torch.tensor([[-1, 2, 0, 3]] if first_live else [[1, -1, 3, 0]], device="cuda", dtype=torch.int32)
    res = _against_reference(fmt, cfg, E, H, I, ids, seed=8)
    assert res.ok, res.detail


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
@pytest.mark.parametrize("dependent", [True, ["gate_up", "down"], ["combine"]], ids=["all", "gemms", "combine"])
@pytest.mark.parametrize("T", [8, 40])
def test_dependent_launches(fmt, dependent, T):
    """Several tokens with programmatic dependent launches (dependent_launches):
    each dependent launch starts while the one before it runs and waits for its
    outputs; against the reference, with batches of one and several waves."""
    from sm120_kernels import configs, fused_moe_w4a16_frag as F

    cfg = {**configs.load_file("default.json")[fmt]["64"], "dependent_launches": dependent}
    assert F.dependent_launches(cfg, torch.device("cuda"))
    E, H, I = 8, 1024, 2048
    res = _against_reference(fmt, cfg, E, H, I, _random_ids(T, E, 4), seed=9)
    assert res.ok, res.detail


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
@pytest.mark.parametrize("T", [8, 40])
def test_block_ready(fmt, T):
    """The down GEMM starting on each expert block once the gate/up GEMM has
    counted all of that block's row tiles (block_ready), while the gate/up
    GEMM's other programs still run: against the reference, on several calls
    in a row (each call's alignment zeroes the counts), with one and several
    expert blocks per gate/up wave."""
    from sm120_kernels import configs, fused_moe_w4a16_frag as F

    E, H, I = 8, 1024, 2048
    cfg = {**configs.load_file("default.json")[fmt]["64"], "dependent_launches": ["gate_up", "down"],
           "block_ready": True}
    assert F.block_ready(cfg, F.dependent_launches(cfg, torch.device("cuda")), I // 64)
    for seed in (10, 11, 12):
        res = _against_reference(fmt, cfg, E, H, I, _random_ids(T, E, 4), seed=seed)
        assert res.ok, (seed, res.detail)


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
@pytest.mark.parametrize("walkers", [1, 3])
def test_block_walkers_cap(fmt, walkers):
    """walkers: fewer block walkers per row tile than expert blocks, each
    walking several (with dependent launches and block_ready): the uncapped
    launch's output bit for bit, and the reference."""
    from sm120_kernels import configs, fused_moe_w4a16 as M

    E, H, I, T = 8, 1024, 2048, 40
    base = {**configs.load_file("default.json")[fmt]["64"], "dependent_launches": ["gate_up", "down"],
            "block_ready": True}
    capped = {**base, **{p: {**base[p], "walkers": walkers} for p in ("gate_up", "down")}}
    W = M.random_weights(fmt, E, H, I, "cuda", seed=15)
    ids = _random_ids(T, E, 4)
    x = torch.randn((T, H), device="cuda").to(torch.bfloat16)
    tw = torch.rand(ids.shape, device="cuda")
    want = M.fused_moe_w4a16(x, W, tw, ids, config=base, routed_scaling_factor=1.5)
    got = M.fused_moe_w4a16(x, W, tw, ids, config=capped, routed_scaling_factor=1.5)
    assert torch.equal(got, want)
    assert registry.compare(got, M.moe_w4a16_reference(x, W, tw, ids, routed_scaling_factor=1.5)).ok


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
@pytest.mark.parametrize("l2_steps", [0, 1, 4])
@pytest.mark.parametrize("first_live", [0, 1])
def test_one_token_down_pdl(fmt, l2_steps, first_live):
    """One token, the down GEMM's register path launched dependent on the
    gate/up GEMM (pdl), asking L2 for its first live slot's first K steps
    (none, one, more than the slot has) before it waits; the first slot
    routed elsewhere or not."""
    from sm120_kernels import configs, fused_moe_w4a16_frag as F

    base = configs.load_file("default.json")[fmt]["1"]
    cfg = {"gate_up": base["gate_up"],
           "down": {"kernel": "frag", "NT": 1, "num_warps": 4, "pipe": True, "depth": 2, "RT": 1, "pdl": l2_steps}}
    E, H, I = 4, 1024, 2048
    assert F.dependent_down(cfg["down"], I // 64, torch.device("cuda"))
    ids = torch.tensor([[-1, 2, 0, 3]] if first_live else [[1, -1, 3, 0]], device="cuda", dtype=torch.int32)
    res = _against_reference(fmt, cfg, E, H, I, ids, seed=10)
    assert res.ok, res.detail
