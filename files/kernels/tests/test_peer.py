"""bench --peer's stand-in for SGLang's Triton W4A16 MoE: SGLang's own kernel,
compiled from the pinned wheel's source, gives the reference's result when
launched as peer.py launches it, with the config SGLang would pick."""

from types import SimpleNamespace

import pytest
import torch

from sm120_kernels import peer
from sm120_kernels.fused_moe_w4a16 import moe_w4a16_reference
from sm120_kernels.registry import compare
from sm120_kernels.weights import random_weights


@pytest.mark.parametrize("T", [3, 6])  # 3 tokens: SGLang's small-batch config; 6 > 4 experts: its large one
def test_sglang_kernel_matches_reference(interpret, T):
    model = SimpleNamespace(local_experts=4, hidden=128, inter=64, top_k=3, swiglu_limit=None,
                            routed_scaling_factor=1.5)
    W = random_weights("int4", model.local_experts, model.hidden, model.inter, "cpu", seed=T, kn=True, pack=False)
    g = torch.Generator().manual_seed(T)
    x = torch.randn((T, model.hidden), generator=g).to(torch.bfloat16)
    tw = torch.rand((T, model.top_k), generator=g) + 0.1
    ids = torch.randint(0, model.local_experts, (T, model.top_k), generator=g, dtype=torch.int32)
    ids[0] = torch.tensor([0, -1, 2], dtype=torch.int32)  # a slot on another rank
    kernel = peer.TritonW4A16(model, W, peer.sglang_dir())
    _, full = kernel.bind(x.float(), tw, ids)  # fp32: the interpreter's bf16 dot is wrong
    res = compare(full(), moe_w4a16_reference(x, W, tw, ids, routed_scaling_factor=1.5))
    assert res.ok, res.detail


@pytest.mark.parametrize("tokens", [1, 8, 48, 64])
def test_default_config_is_sglangs(tokens):
    """The launch config is SGLang's own choice for these shapes: its default
    (it ships no tuned int4_w4a16 file for 48 local experts)."""
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as C

    pkg = peer.sglang_dir()
    assert not list((pkg / "srt/layers/moe/moe_runner/triton_utils/configs").glob("*/E=48,*int4_w4a16*"))
    C.get_exec = lambda: SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=False))
    assert peer.default_config(tokens, 48) == C.get_default_config(tokens, 48, 1024, 7168, 8, "int4_w4a16", False, [0, 32])
