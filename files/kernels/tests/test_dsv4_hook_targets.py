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
