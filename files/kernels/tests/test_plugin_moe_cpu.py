"""The plugin's MoE glue with SGLang's own dispatch/combine types, on CPU under
the Triton interpreter: the weights a ModelOpt NVFP4 / compressed-tensors layer
holds after loading go through our process_weights/apply hooks and give the
reference result; SGLang's original functions are not called for taken-over
layers and are called for the others."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sm120_kernels import fused_moe_w4a16 as M  # noqa: E402
from sm120_kernels import plugin  # noqa: E402
from sm120_kernels.registry import compare  # noqa: E402

E, H, I, T, K = 3, 256, 64, 4, 2
# the fragment kernel (the plugin packs the weights); the down GEMM's single K
# group split over 2 warps exercises the clamped-group path
CFG = {"gate_up": dict(kernel="frag", NT=1, num_warps=2, pipe=True),
       "down": dict(kernel="frag", NT=1, num_warps=2, pipe=True, RT=2)}


def _runner_cfg(rsf=None, limit=None):
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig

    return MoeRunnerConfig(num_experts=E, num_local_experts=E, hidden_size=H, intermediate_size_per_partition=I,
                           top_k=K, routed_scaling_factor=rsf, swiglu_limit=limit)


def _layer(fmt, rsf, fused_rsf, limit, seed=11):
    W = M.random_weights(fmt, E, H, I, "cpu", seed=seed, kn=fmt == "int4", pack=False)  # checkpoint order
    P = torch.nn.Parameter
    if fmt == "nvfp4":
        layer = SimpleNamespace(
            w13_weight=P(W.w13.view(torch.uint8), requires_grad=False),
            w13_weight_scale=P(W.s13.view(torch.float8_e4m3fn), requires_grad=False),
            w13_weight_scale_2=P(W.g13[:, None].repeat(1, 2), requires_grad=False),
            w2_weight=P(W.w2.view(torch.uint8), requires_grad=False),
            w2_weight_scale=P(W.s2.view(torch.float8_e4m3fn), requires_grad=False),
            w2_weight_scale_2=P(W.g2.clone(), requires_grad=False))
        method = SimpleNamespace()
    else:  # SGLang's compressed-tensors layout: [E, K/8, N], [E, K/32, N]
        layer = SimpleNamespace(
            w13_weight_packed=P(W.w13.transpose(1, 2).contiguous(), requires_grad=False),
            w13_weight_scale=P(W.s13.transpose(1, 2).contiguous(), requires_grad=False),
            w2_weight_packed=P(W.w2.transpose(1, 2).contiguous(), requires_grad=False),
            w2_weight_scale=P(W.s2.transpose(1, 2).contiguous(), requires_grad=False))
        method = SimpleNamespace(num_bits=4, group_size=32, sym=True, actorder=None)
    layer.moe_runner_config = _runner_cfg(rsf, limit)
    layer.should_fuse_routed_scaling_factor_in_topk = fused_rsf
    layer.layer_id = 0
    return layer, method, W


def _must_not_run(*a, **k):
    raise AssertionError("SGLang's original ran for a layer we took over")


@pytest.fixture
def frag_config(monkeypatch):
    """Our kernels run with CFG, whatever config file matches this machine."""
    monkeypatch.setattr(M, "get_config", lambda *a, **k: CFG)


def _apply(method, layer, ids, seed):
    """The apply hook on T random tokens routed to `ids`: (its output, x, top-k weights)."""
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    g = torch.Generator().manual_seed(seed)
    x = torch.randn((T, H), generator=g).to(torch.bfloat16)
    tw = torch.rand((T, K), generator=g) + 0.1
    disp = StandardDispatchOutput(hidden_states=x, hidden_states_scale=None,
                                  topk_output=StandardTopKOutput(tw, ids, torch.zeros(T, E)))
    return plugin._around_moe_apply(_must_not_run, method, layer, disp), x, tw


@pytest.mark.parametrize("fmt,fused_rsf", [("nvfp4", True), ("int4", False)])
def test_hooks_run_our_kernel(interpret, frag_config, fmt, fused_rsf):
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput

    rsf, limit = 2.5, (10.0 if fmt == "nvfp4" else None)
    layer, method, W = _layer(fmt, rsf, fused_rsf, limit)

    before = (layer.w13_weight if fmt == "nvfp4" else layer.w13_weight_packed).shape
    assert plugin._around_process_weights(_must_not_run, method, layer) is None
    ours = getattr(layer, plugin._ATTR)
    assert ours is not None and ours.packed
    # the layer's parameter now shares our packed words, in the shape SGLang loaded
    param = layer.w13_weight if fmt == "nvfp4" else layer.w13_weight_packed
    assert param.shape == before and param.data_ptr() == ours.w13.data_ptr()

    ids = torch.tensor([[0, 2], [1, -1], [2, 0], [-1, -1]], dtype=torch.int32)
    res, x, tw = _apply(method, layer, ids, seed=1)
    assert isinstance(res, StandardCombineInput)
    # rsf exactly once: by the router when it is fused there, else by us
    want_rsf = 1.0 if fused_rsf else rsf
    ref = M.moe_w4a16_reference(x, W, tw, ids, routed_scaling_factor=want_rsf, swiglu_limit=limit)
    r = compare(res.hidden_states, ref)
    assert r.ok, r.detail


# what SGLang's loader writes per expert: words, block scales and (NVFP4) global scales
_LOADED = {"nvfp4": plugin._MODELOPT_PARAMS + ("w13_weight_scale_2", "w2_weight_scale_2"),
           "int4": plugin._CT_PARAMS}


def _loaded_bytes(layer, fmt):
    return {name: getattr(layer, name).data.contiguous().view(torch.uint8).clone() for name in _LOADED[fmt]}


@pytest.mark.parametrize("fmt", ["nvfp4", "int4"])
def test_weight_update_restores_the_checkpoint_layout_then_repacks(interpret, frag_config, fmt):
    """SGLang's weight update (update_weights_from_disk / _tensor / _distributed):
    restore_weights_before_loading, then load (here only expert 1, as a partial
    update does), then process_weights_after_loading. The layer must give the
    bytes it loaded back, and then compute with the new expert 1 and the old 0 and 2."""
    layer, method, _ = _layer(fmt, None, True, None)
    loaded = _loaded_bytes(layer, fmt)
    plugin._around_process_weights(_must_not_run, method, layer)
    assert getattr(layer, plugin._ATTR).packed

    assert plugin._around_restore_weights(_must_not_run, method, layer) is None
    assert getattr(layer, plugin._ATTR, None) is None
    restored = _loaded_bytes(layer, fmt)
    for name in _LOADED[fmt]:
        assert torch.equal(restored[name], loaded[name]), f"{name} is not the checkpoint layout after restore"

    new, _, _ = _layer(fmt, None, True, None, seed=12)
    expected, _, _ = _layer(fmt, None, True, None)
    for name in _LOADED[fmt]:
        getattr(layer, name).data[1].copy_(getattr(new, name).data[1])
        getattr(expected, name).data[1].copy_(getattr(new, name).data[1])
    plugin._around_process_weights(_must_not_run, method, layer)
    W_expected = plugin._modelopt_weights(expected) if fmt == "nvfp4" else plugin._ct_weights(method, expected)

    ids = torch.tensor([[0, 1], [1, -1], [2, 1], [-1, -1]], dtype=torch.int32)
    res, x, tw = _apply(method, layer, ids, seed=2)
    ref = M.moe_w4a16_reference(x, W_expected, tw, ids, routed_scaling_factor=1.0, swiglu_limit=None)
    r = compare(res.hidden_states, ref)
    assert r.ok, r.detail


def test_restore_leaves_layers_not_taken_over_to_sglang():
    layer, method, _ = _layer("int4", None, True, None)
    calls = []
    plugin._around_restore_weights(lambda *a, **k: calls.append("restore"), method, layer)
    assert calls == ["restore"]


def test_layers_not_taken_over_use_sglang(monkeypatch):
    layer, method, _ = _layer("nvfp4", None, True, None)
    layer.moe_runner_config.activation = "gelu"
    calls = []
    plugin._around_process_weights(lambda *a, **k: calls.append("pwal"), method, layer)
    assert calls == ["pwal"] and getattr(layer, plugin._ATTR, None) is None
    out = plugin._around_moe_apply(lambda *a, **k: "original", method, layer, None)
    assert out == "original"


def test_routing_hook_matches_reference(interpret):
    from sglang.srt.layers.moe import topk as sgl_topk

    logits = torch.randn(5, 64)
    bias = torch.randn(64) * 0.1
    original = sgl_topk.biased_topk_jit_kernel_impl
    w, ids = plugin._around_biased_topk(original, logits, logits, bias, 6, True, scoring_func="sqrtsoftplus",
                                        routed_scaling_factor=1.5, apply_routed_scaling_factor_on_output=True,
                                        num_token_non_padded=torch.tensor(3))
    from sm120_kernels.routing import biased_topk_reference

    rw, rids = biased_topk_reference(logits, bias, 6, scoring_func="sqrtsoftplus", routed_scaling_factor=1.5,
                                     apply_routed_scaling_factor_on_output=True)
    assert ids[:3].tolist() == rids[:3].tolist()
    assert (ids[3:] == -1).all() and (w[3:] == 0).all()
    torch.testing.assert_close(w[:3], rw[:3], rtol=1e-5, atol=1e-6)
