"""The SGLang functions the DeepSeek-V4 indexer and mHC kernels replace exist in
the pinned SGLang (0.5.23) with the signatures the replacements take.

Read from the installed source with ast (importing these modules pulls in
TileLang / CUDA-only pieces), so this runs on a CPU-only machine."""

from __future__ import annotations

import ast
import importlib.util
import os

import pytest

sglang_spec = importlib.util.find_spec("sglang")
pytestmark = pytest.mark.skipif(sglang_spec is None, reason="sglang not installed")


@pytest.fixture(autouse=True)
def _one_tier(request):
    """Each test runs in one tier: those that run kernels (they ask for the
    `interpret` fixture) in the interpreter tier, the rest in the compiler tier."""
    if os.environ.get("TRITON_INTERPRET") == "1" and "interpret" not in request.fixturenames:
        pytest.skip("runs in the compiler tier")


LOGITS_ARGS = ["q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table", "deep_gemm_metadata", "max_seq_len", "clean_logits"]

# dotted path -> expected positional/keyword parameter names (self included for methods)
TARGETS = {
    # sm_120 default (SGLANG_OPT_USE_TILELANG_INDEXER set by SGLang's model hook on sm_120)
    "sglang.kernels.ops.attention.dsa.tilelang_kernel.tilelang_fp8_paged_mqa_logits": LOGITS_ARGS,
    # sm_120 with SGLANG_OPT_USE_TILELANG_INDEXER=0 (vectorised torch path)
    "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120": LOGITS_ARGS,
    # mHC pre of a DeepSeek-V4 decoder layer (returns y, post, comb, norm_fused)
    "sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayerBase.hc_pre": [
        "self", "x", "hc_fn", "hc_scale", "hc_base", "norm", "forward_batch"],
    # mHC post (R'[i] = post[i] * x + sum_j comb[j][i] * R[j])
    "sglang.srt.models.deepseek_v4_mhc.post": ["cfg", "x", "residual", "post_mix", "comb"],
    # fused post + next pre at the attention/FFN boundary (returns None to decline)
    "sglang.srt.models.deepseek_common.amd.deepseek_v4_fused_mhc.apply_mhc_post_pre_boundary": [
        "layer_input", "residual", "post", "comb", "hc_fn", "hc_scale", "hc_base", "hc_mult", "rms_eps",
        "hc_eps", "hc_post_mult", "sinkhorn_iters", "norm_weight", "norm_eps", "fn_transpose"],
}


def _find_def(dotted: str):
    root = sglang_spec.submodule_search_locations[0]
    parts = dotted.split(".")[1:]
    for split in range(len(parts), 0, -1):
        path = os.path.join(root, *parts[:split]) + ".py"
        if os.path.exists(path):
            rest = parts[split:]
            break
    else:
        raise AssertionError(f"no module file for {dotted}")
    node = ast.parse(open(path).read())
    for name in rest:
        found = None
        for child in node.body:
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)) and child.name == name:
                found = child
        assert found is not None, f"{dotted}: {name} not in {path}"
        node = found
    return node


@pytest.mark.parametrize("dotted", sorted(TARGETS))
def test_target_exists_with_signature(dotted):
    fn = _find_def(dotted)
    assert isinstance(fn, ast.FunctionDef)
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
    assert names == TARGETS[dotted], (dotted, names)


def test_sglang_pin():
    from importlib.metadata import version

    assert version("sglang") == "0.5.23"


def test_call_sites_resolve_targets_at_call_time():
    """The call sites look the targets up when they run (local import or module
    attribute), so replacing the attribute takes effect."""
    root = sglang_spec.submodule_search_locations[0]
    src = open(os.path.join(root, "srt/layers/attention/dsv4/indexer.py")).read()
    assert "tilelang_fp8_paged_mqa_logits as fn" in src
    assert "fn = fp8_paged_mqa_logits_torch_sm120" in src
    src = open(os.path.join(root, "srt/models/deepseek_v4.py")).read()
    assert "return mhc.post(self.hc_cfg, x, residual, post, comb)" in src
    src = open(os.path.join(root, "srt/models/deepseek_v4_boundary.py")).read()
    assert "layer.hc_pre(" in src and "apply_mhc_post_pre_boundary," in src


def test_replacements_take_the_same_arguments():
    import inspect

    from sm120_kernels import indexer

    assert list(inspect.signature(indexer.sglang_fp8_paged_mqa_logits).parameters) == LOGITS_ARGS


# ---------------------------------------------------------------- plugin adapters


def _kwonly(dotted):
    fn = _find_def(dotted)
    return [a.arg for a in fn.args.kwonlyargs]


def test_plugin_targets_are_the_documented_ones():
    from sm120_kernels import plugin

    assert plugin.DSV4_HOOK_TARGETS == TARGETS
    assert sorted(plugin.dsv4_hooks()) == sorted(TARGETS)


@pytest.mark.parametrize("dotted", sorted(TARGETS))
def test_adapter_signature_matches_target(dotted):
    """Each AROUND hook takes (original, <the target's own parameters>), with
    the same keyword-only parameters, so SGLang's wrapper can pass any call on."""
    import inspect

    from sm120_kernels import plugin

    hook = plugin.dsv4_hooks()[dotted]
    params = list(inspect.signature(hook).parameters.values())
    assert params[0].name == "original"
    assert [p.name for p in params[1:]] == TARGETS[dotted]
    kwonly = [p.name for p in params[1:] if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert kwonly == _kwonly(dotted)


def test_plugin_resolves_targets_in_installed_sglang():
    """What plugin.register() checks on the GPU host: importing the pinned
    SGLang modules, each target has the parameters the adapters take."""
    from sm120_kernels import plugin

    assert plugin.check_targets(plugin.DSV4_HOOK_TARGETS) == []


def _dsv4_registered():
    from sglang.srt.plugins.hook_registry import HookRegistry

    return [t for t in HookRegistry._hooks if t in TARGETS and HookRegistry._hooks[t]]


def test_without_sm120_no_dsv4_hook_registers(caplog):
    import logging

    import torch

    from sm120_kernels import plugin

    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 12:
        pytest.skip("this machine has an sm_120 device")
    with caplog.at_level(logging.INFO, logger="sm120_kernels"):
        assert plugin.register() == []
    assert _dsv4_registered() == []
    assert "not hooking into SGLang" in caplog.text


def test_sm120_with_stamp_registers_dsv4_hooks(monkeypatch, tmp_path):
    import torch
    import triton
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sm120_kernels import __version__, plugin

    name = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (12, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    stamp = tmp_path / "selftest.json"
    plugin.write_stamp(stamp, {"version": __version__, "device": name, "torch": "x",
                               "triton": triton.__version__, "passed": 1, "failed": 0})
    monkeypatch.setenv("SM120_KERNELS_STAMP", str(stamp))
    saved = {k: list(v) for k, v in HookRegistry._hooks.items()}
    try:
        got = plugin.register()
        assert set(TARGETS) <= set(got)
        hooks = plugin.dsv4_hooks()
        for target in TARGETS:
            assert [(ht, h) for ht, h, _ in HookRegistry._hooks[target]] == [(HookType.AROUND, hooks[target])]
    finally:
        HookRegistry._hooks.clear()
        HookRegistry._hooks.update(saved)


class _Original:
    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return "original"


def test_adapters_decline_what_they_do_not_cover():
    """CPU tensors (or other shapes) go to SGLang's original, arguments unchanged."""
    import types

    import torch

    from sm120_kernels import indexer, mhc

    orig = _Original()
    q = torch.zeros(2, 1, 64, 128, dtype=torch.float8_e4m3fn)
    kv = torch.zeros(3, 64, 1, 132, dtype=torch.uint8)
    w, sl, pt = torch.zeros(2, 64), torch.ones(2, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32)
    assert indexer.sglang_logits_hook(orig, q, kv, w, sl, pt, None, 64, clean_logits=False) == "original"
    assert orig.calls[-1][0][:2] == (q, kv) and orig.calls[-1][0][6:] == (64, False)

    layer = types.SimpleNamespace(hc_mult=4, rms_norm_eps=1e-6, hc_eps=1e-6, hc_sinkhorn_iters=20)
    x = torch.zeros(2, 4, 64, dtype=torch.bfloat16)
    fn = torch.zeros(24, 256)
    s, b = torch.ones(3), torch.zeros(24)
    assert mhc.sglang_hc_pre_hook(orig, layer, x, fn, s, b, norm=None) == "original"
    cfg = types.SimpleNamespace(mult=4)
    assert mhc.sglang_post_hook(orig, cfg, x[:, 0], x, torch.ones(2, 4), torch.ones(2, 4, 4)) == "original"
    assert mhc.sglang_post_pre_boundary_hook(
        orig, x[:, 0], x, torch.ones(2, 4), torch.ones(2, 4, 4), fn, s, b, 4, 1e-6, 1e-6, 2.0, 20, None, None,
        fn_transpose=True) == "original"
    assert orig.calls[-1][1] == {"fn_transpose": True}


def test_mhc_adapters_compute_the_sglang_contract(interpret, monkeypatch):
    """The hooks' outputs in SGLang's conventions (interpreter, small hidden):
    hc_pre -> (y, post, comb, False); post; boundary with fn in either layout."""
    import types

    import torch

    from sm120_kernels import mhc

    monkeypatch.setattr(mhc, "_on_device", lambda t: True)
    n, d = 3, 64
    residual, x, fn, scale, base, post, comb = mhc.make_inputs(n, d, seed=5)
    layer = types.SimpleNamespace(hc_mult=4, rms_norm_eps=1e-6, hc_eps=1e-6, hc_sinkhorn_iters=20)
    orig = _Original()
    y, p, c, fused = mhc.sglang_hc_pre_hook(orig, layer, residual, fn, scale, base, None, None)
    ry, rp, rc = mhc.mhc_pre_ref(residual, fn, scale, base, 1e-6, 1e-6, 20, 2.0)
    assert fused is False and not orig.calls
    assert mhc.rel_err(y, ry) < 2.3e-3 and mhc.rel_err(p, rp) < 1e-4 and mhc.rel_err(c, rc) < 1e-4

    out = mhc.sglang_post_hook(orig, types.SimpleNamespace(mult=4), x, residual, post, comb)
    assert mhc.rel_err(out, mhc.mhc_post_ref(x, residual, post, comb)) < 2.3e-3

    for fn_in, transpose in ((fn, False), (fn.t(), True)):
        r2, y2, p2, c2, fused2 = mhc.sglang_post_pre_boundary_hook(
            orig, x, residual, post[:, :, None], comb, fn_in, scale, base, 4, 1e-6, 1e-6, 2.0, 20, None, None,
            fn_transpose=transpose)
        rr = mhc.mhc_post_ref(x, residual, post, comb)
        ry2, rp2, rc2 = mhc.mhc_pre_ref(rr.to(torch.bfloat16), fn, scale, base, 1e-6, 1e-6, 20, 2.0)
        assert fused2 is False
        assert mhc.rel_err(r2, rr) < 2.3e-3 and mhc.rel_err(y2, ry2) < 2.3e-3
        assert mhc.rel_err(p2, rp2) < 1e-4 and mhc.rel_err(c2, rc2) < 1e-4
    assert not orig.calls
