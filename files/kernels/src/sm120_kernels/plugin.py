"""SGLang plugin (entry point group ``sglang.srt.plugins``, name ``sm120_kernels``).

SGLang's ``load_plugins()`` calls :func:`register` in every process. It hooks our
kernels in only when

* the CUDA device is sm_120 (compute capability 12.x), and
* the self-test passed on this device with this package version: the stamp file
  written by ``python -m sm120_kernels.selftest`` (``SM120_KERNELS_STAMP`` or
  ``<venv>/share/sm120_kernels/selftest.json``) names this version, this device
  and the Triton in use, and
* ``SM120_KERNELS_DISABLE`` is not set to 1.

Otherwise it logs why and registers nothing. Every hook is AROUND: it runs our
kernel for the cases it covers and calls SGLang's original otherwise. The
targets are listed in HOOK_TARGETS (MoE, routing) and DSV4_HOOK_TARGETS
(DeepSeek-V4 indexer logits and mHC) with the parameters we rely on.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger("sm120_kernels")

_MOE = "sglang.srt.layers.quantization"
_CT = f"{_MOE}.compressed_tensors.schemes.compressed_tensors_wNa16_moe"
_TOPK = "sglang.srt.layers.moe.topk"

# dotted target -> parameter names it must have (checked by the tests against
# the pinned SGLang, and at registration time)
HOOK_TARGETS = {
    f"{_MOE}.modelopt_quant.ModelOptNvFp4FusedMoEMethod.process_weights_after_loading": ["self", "layer"],
    f"{_MOE}.modelopt_quant.ModelOptNvFp4FusedMoEMethod.apply": ["self", "layer", "dispatch_output"],
    # a weight update (update_weights_from_disk / _tensor / _distributed) calls this
    # before it loads checkpoint-format tensors into the layer's parameters
    f"{_MOE}.modelopt_quant.ModelOptNvFp4FusedMoEMethod.restore_weights_before_loading": ["self", "layer"],
    f"{_CT}.CompressedTensorsWNA16MoE.process_weights_after_loading": ["self", "layer"],
    f"{_CT}.CompressedTensorsWNA16MoE.restore_weights_before_loading": ["self", "layer"],
    f"{_CT}.CompressedTensorsWNA16MoE.apply_weights": ["self", "layer", "dispatch_output"],
    f"{_CT}.CompressedTensorsWNA16TritonMoE.process_weights_after_loading": ["self", "layer"],
    f"{_CT}.CompressedTensorsWNA16TritonMoE.apply_weights": ["self", "layer", "dispatch_output"],
    f"{_TOPK}.biased_topk_jit_kernel_impl": [
        "hidden_states", "gating_output", "correction_bias", "topk", "renormalize", "scoring_func",
        "num_fused_shared_experts", "routed_scaling_factor", "num_token_non_padded",
        "expert_location_dispatch_info", "apply_routed_scaling_factor_on_output", "packed_out",
        "sqrtsoftplus_log1p", "router_logits_partials", "num_shared_append"],
    f"{_TOPK}.biased_grouped_topk_gpu": [
        "hidden_states", "gating_output", "correction_bias", "topk", "renormalize", "num_expert_group",
        "topk_group", "num_fused_shared_experts", "routed_scaling_factor",
        "apply_routed_scaling_factor_on_output"],
}

# DeepSeek-V4 indexer logits and mHC (sm120_kernels.indexer / .mhc adapters)
_DSV4_LOGITS = ["q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table", "deep_gemm_metadata",
                "max_seq_len", "clean_logits"]
DSV4_HOOK_TARGETS = {
    "sglang.kernels.ops.attention.dsa.tilelang_kernel.tilelang_fp8_paged_mqa_logits": _DSV4_LOGITS,
    "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120": _DSV4_LOGITS,
    "sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayerBase.hc_pre": [
        "self", "x", "hc_fn", "hc_scale", "hc_base", "norm", "forward_batch"],
    "sglang.srt.models.deepseek_v4_mhc.post": ["cfg", "x", "residual", "post_mix", "comb"],
    "sglang.srt.models.deepseek_common.amd.deepseek_v4_fused_mhc.apply_mhc_post_pre_boundary": [
        "layer_input", "residual", "post", "comb", "hc_fn", "hc_scale", "hc_base", "hc_mult", "rms_eps",
        "hc_eps", "hc_post_mult", "sinkhorn_iters", "norm_weight", "norm_eps", "fn_transpose"],
}


def dsv4_hooks() -> dict:
    """DSV4 target -> AROUND hook (imported lazily: they pull in the kernels)."""
    from . import indexer, mhc

    t = list(DSV4_HOOK_TARGETS)
    return {t[0]: indexer.sglang_logits_hook, t[1]: indexer.sglang_logits_hook,
            t[2]: mhc.sglang_hc_pre_hook, t[3]: mhc.sglang_post_hook, t[4]: mhc.sglang_post_pre_boundary_hook}


_ATTR = "_sm120_w4a16"  # set on a FusedMoE layer whose experts we run


# --------------------------------------------------------------------------
# Self-test stamp
# --------------------------------------------------------------------------


def default_stamp_path() -> Path:
    env = os.environ.get("SM120_KERNELS_STAMP")
    if env:
        return Path(env)
    return Path(sys.prefix) / "share" / "sm120_kernels" / "selftest.json"


def write_stamp(path, summary: dict) -> Path:
    p = Path(path) if path else default_stamp_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    keep = {k: summary[k] for k in ("version", "device", "torch", "triton", "passed", "failed")}
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(keep, indent=1))
    tmp.replace(p)
    return p


def stamp_problem(device_name: str) -> str | None:
    """None if a passing self-test stamp matches this install and device."""
    import triton

    from . import __version__

    p = default_stamp_path()
    try:
        st = json.loads(p.read_text())
    except FileNotFoundError:
        return f"no self-test stamp at {p} (run python -m sm120_kernels.selftest)"
    except Exception as exc:
        return f"unreadable self-test stamp {p}: {exc}"
    want = {"version": __version__, "device": device_name, "triton": triton.__version__}
    for k, v in want.items():
        if st.get(k) != v:
            return f"self-test stamp {p} is for {k}={st.get(k)!r}, not {v!r}"
    if st.get("failed", 1) != 0 or not st.get("passed"):
        return f"self-test stamp {p} records failures"
    return None


# --------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------


def why_not() -> str | None:
    """The reason the plugin stays out on this machine, or None."""
    if os.environ.get("SM120_KERNELS_DISABLE") == "1":
        return "SM120_KERNELS_DISABLE=1"
    try:
        import torch
    except Exception as exc:  # pragma: no cover
        return f"torch unavailable: {exc}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    cap = torch.cuda.get_device_capability()
    if cap[0] != 12:
        return f"device is sm_{cap[0]}{cap[1]}, not sm_120"
    return stamp_problem(torch.cuda.get_device_name())


def check_targets(targets: dict | None = None) -> list[str]:
    """Problems with the hook targets in the installed SGLang (empty if none)."""
    import pkgutil

    problems = []
    if targets is None:
        targets = {**HOOK_TARGETS, **DSV4_HOOK_TARGETS}
    for target, params in targets.items():
        try:
            obj = pkgutil.resolve_name(target)
        except Exception as exc:
            problems.append(f"{target}: {type(exc).__name__}: {exc}")
            continue
        got = list(inspect.signature(obj).parameters)
        if got[: len(params)] != params:
            problems.append(f"{target}: parameters {got}, expected {params}")
    return problems


def register():
    """Entry point. Returns the list of registered targets (empty when out)."""
    reason = why_not()
    if reason:
        logger.info("sm120_kernels: not hooking into SGLang: %s", reason)
        return []
    problems = check_targets(HOOK_TARGETS)
    if problems:
        logger.warning("sm120_kernels: not hooking into SGLang, targets changed: %s", "; ".join(problems))
        return []
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks = {
        "process_weights_after_loading": _around_process_weights,
        "restore_weights_before_loading": _around_restore_weights,
        "apply": _around_moe_apply,
        "apply_weights": _around_moe_apply,
        "biased_topk_jit_kernel_impl": _around_biased_topk,
        "biased_grouped_topk_gpu": _around_biased_grouped_topk,
    }
    for target in HOOK_TARGETS:
        HookRegistry.register(target, hooks[target.rsplit(".", 1)[1]], HookType.AROUND)
    registered = list(HOOK_TARGETS)
    # DeepSeek-V4 indexer / mHC: a group of its own, so a drifted DSV4 target
    # leaves the MoE hooks in place
    problems = check_targets(DSV4_HOOK_TARGETS)
    if problems:
        logger.warning("sm120_kernels: DeepSeek-V4 indexer/mHC stay on SGLang's kernels, targets changed: %s",
                       "; ".join(problems))
    else:
        for target, hook in dsv4_hooks().items():
            HookRegistry.register(target, hook, HookType.AROUND)
        registered += list(DSV4_HOOK_TARGETS)
    logger.info("sm120_kernels: hooked %d SGLang functions", len(registered))
    return registered


# --------------------------------------------------------------------------
# MoE hooks
# --------------------------------------------------------------------------


def _cfg(layer):
    return getattr(layer, "moe_runner_config", None)


def _takeover_problem(method, layer) -> str | None:
    cfg = _cfg(layer)
    if cfg is None:
        return "layer has no moe_runner_config"
    if cfg.activation != "silu" or not cfg.is_gated:
        return f"activation {cfg.activation} gated={cfg.is_gated}"
    if cfg.apply_router_weight_on_input or cfg.no_combine:
        return "router weight on input / no_combine"
    if cfg.gemm1_alpha is not None or cfg.gemm1_clamp_limit is not None:
        return "gemm1 alpha/clamp (swiglu-oai) not covered"
    if getattr(cfg, "num_fused_shared_experts", 0):
        return "fused shared experts"
    try:
        from sglang.srt.layers.moe import get_moe_a2a_backend

        if not get_moe_a2a_backend().is_none():
            return "all-to-all MoE backend"
    except Exception:
        pass
    return None


# a layer's (w13 words, w13 scales, w2 words, w2 scales), in make_weights' argument order
_MODELOPT_PARAMS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
_CT_PARAMS = ("w13_weight_packed", "w13_weight_scale", "w2_weight_packed", "w2_weight_scale")


def _modelopt_weights(layer):
    from .weights import make_weights

    s13 = layer.w13_weight_scale_2
    if s13.dim() == 2 and s13.shape[1] >= 2 and not bool((s13[:, 0] == s13[:, 1]).all()):
        return None  # gate and up with different global scales: not covered
    W = make_weights("nvfp4", *(getattr(layer, name).data for name in _MODELOPT_PARAMS),
                     s13.data, layer.w2_weight_scale_2.data)
    _rebind(layer, _MODELOPT_PARAMS, W)
    return W


def _rebind(layer, names, W):
    """Point the layer's word parameters (and, when packed, its scale parameters)
    at our repacked tensors (same bytes, viewed in each parameter's dtype and
    shape), so the checkpoint-order copies are freed and SGLang still sees the
    shapes it loaded."""
    for name, ours, scale in zip(names, (W.w13, W.s13, W.w2, W.s2), (False, True, False, True)):
        param = getattr(layer, name)
        if (W.packed or not scale) and ours.data_ptr() != param.data.data_ptr():
            param.data = ours.view(param.dtype).view(param.shape)


def _ct_weights(method, layer):
    from .weights import make_weights

    if getattr(method, "num_bits", 4) != 4 or getattr(method, "group_size", None) != 32:
        return None
    if not getattr(method, "sym", True) or getattr(method, "actorder", None):
        return None
    # SGLang loads compressed-tensors MoE weights transposed: [E, K/8, N];
    # make_weights repacks the words and the scales to fragment order (or, for
    # shapes that do not fit it, to [E, N, K/8] and [E, N, K/32]). The layer's
    # parameters become views of the repacked tensors (same shapes), so the
    # originals are freed.
    W = make_weights("int4", *(getattr(layer, name).data for name in _CT_PARAMS), kn=True)
    _rebind(layer, _CT_PARAMS, W)
    if not W.packed:
        layer.w13_weight_scale.data = W.s13.transpose(1, 2)
        layer.w2_weight_scale.data = W.s2.transpose(1, 2)
    return W


def _around_process_weights(original, self, layer, *args, **kwargs):
    problem = _takeover_problem(self, layer)
    weights = None
    if problem is None:
        try:
            weights = _modelopt_weights(layer) if hasattr(layer, "w13_weight_scale_2") else _ct_weights(self, layer)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if weights is None and problem is None:
            problem = "weight format not covered"
    if problem is not None:
        logger.info("sm120_kernels: layer %s stays on SGLang's MoE: %s", getattr(layer, "layer_id", "?"), problem)
        return original(self, layer, *args, **kwargs)
    # our kernels read the checkpoint layout directly: skip SGLang's repacking
    setattr(layer, _ATTR, weights)
    return None


def _around_restore_weights(original, self, layer, *args, **kwargs):
    """Before a weight update: put the checkpoint layout back into the layer's
    parameters, which share our repacked tensors. The update then loads new
    tensors into them (all experts, or only some), and process_weights_after_loading
    repacks the whole layer from a consistent checkpoint-layout state; without
    this, experts the update does not touch would be repacked a second time."""
    weights = getattr(layer, _ATTR, None)
    if weights is None:
        return original(self, layer, *args, **kwargs)
    modelopt = hasattr(layer, "w13_weight_scale_2")
    names = _MODELOPT_PARAMS if modelopt else _CT_PARAMS
    layouts = (weights.words("w13"), weights.scales("s13"), weights.words("w2"), weights.scales("s2"))
    for name, tensor in zip(names, layouts):
        param = getattr(layer, name)
        if not modelopt:  # SGLang loads compressed-tensors transposed: [E, K/8, N], [E, K/32, N]
            tensor = tensor.transpose(1, 2)
        param.data = tensor.contiguous().view(param.dtype).view(param.shape)
    delattr(layer, _ATTR)
    return None


def _local_ids(layer, topk_ids):
    disp = getattr(layer, "dispatcher", None)
    if disp is not None and getattr(disp, "skip_local_expert_mapping", False):
        ep_size = getattr(layer, "moe_ep_size", 1)
        if ep_size > 1:
            # global ids: shift into this rank's range; others fall outside it
            return topk_ids - layer.moe_ep_rank * layer.num_local_experts
    return topk_ids


def _around_moe_apply(original, self, layer, dispatch_output, *args, **kwargs):
    weights = getattr(layer, _ATTR, None)
    if weights is None:
        return original(self, layer, dispatch_output, *args, **kwargs)
    from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput

    from .fused_moe_w4a16 import fused_moe_w4a16

    cfg = _cfg(layer)
    topk_output = dispatch_output.topk_output
    if hasattr(topk_output, "to_standard"):  # bypassed routing: run it now
        topk_output = topk_output.to_standard()
    from sglang.srt.layers.moe.topk import TopKOutputChecker

    if not TopKOutputChecker.format_is_standard(topk_output):
        # SGLang's repacking was skipped for this layer, so its kernels cannot run either
        raise RuntimeError(f"sm120_kernels: unsupported top-k output {type(topk_output).__name__} "
                           "for a layer whose experts run on sm120_kernels; set SM120_KERNELS_DISABLE=1")
    topk_weights, topk_ids = topk_output.topk_weights, topk_output.topk_ids
    if getattr(layer, "should_fuse_routed_scaling_factor_in_topk", False):
        rsf = 1.0  # the router already multiplied the weights
    else:
        rsf = cfg.routed_scaling_factor or 1.0
    out = fused_moe_w4a16(dispatch_output.hidden_states, weights, topk_weights,
                          _local_ids(layer, topk_ids), routed_scaling_factor=rsf,
                          swiglu_limit=cfg.swiglu_limit)
    return StandardCombineInput(hidden_states=out)


# --------------------------------------------------------------------------
# Routing hooks
# --------------------------------------------------------------------------


def _mask_padded(w, ids, num_token_non_padded):
    if num_token_non_padded is None:
        return w, ids
    import torch

    rows = torch.arange(ids.shape[0], device=ids.device)[:, None]
    pad = rows >= num_token_non_padded
    return w.masked_fill(pad, 0.0), ids.masked_fill(pad, -1)


def _bias_ok(bias, E):
    return bias is not None and bias.dim() == 1 and bias.shape[0] == E


def _around_biased_topk(original, *args, **kwargs):
    ba = inspect.signature(original).bind(*args, **kwargs)
    ba.apply_defaults()
    a = ba.arguments
    E = a["gating_output"].shape[1]
    covered = (
        _bias_ok(a["correction_bias"], E) and not a["num_fused_shared_experts"]
        and a["expert_location_dispatch_info"] is None and a["packed_out"] is None
        and not a["sqrtsoftplus_log1p"] and a["router_logits_partials"] is None
        and not a["num_shared_append"] and a["scoring_func"] in ("sigmoid", "sqrtsoftplus")
    )
    if not covered:
        return original(*args, **kwargs)
    from .routing import biased_topk

    w, ids = biased_topk(
        a["gating_output"], a["correction_bias"], a["topk"], scoring_func=a["scoring_func"],
        renormalize=a["renormalize"], routed_scaling_factor=a["routed_scaling_factor"],
        apply_routed_scaling_factor_on_output=bool(a["apply_routed_scaling_factor_on_output"]))
    return _mask_padded(w, ids, a["num_token_non_padded"])


def _around_biased_grouped_topk(original, *args, **kwargs):
    ba = inspect.signature(original).bind(*args, **kwargs)
    ba.apply_defaults()
    a = ba.arguments
    E = a["gating_output"].shape[1]
    ng = a["num_expert_group"] or 1
    covered = (
        _bias_ok(a["correction_bias"], E) and not a["num_fused_shared_experts"]
        and E % ng == 0 and (ng & (ng - 1)) == 0
    )
    if not covered:
        return original(*args, **kwargs)
    from .routing import biased_topk

    return biased_topk(
        a["gating_output"], a["correction_bias"], a["topk"], scoring_func="sigmoid",
        num_expert_group=ng, topk_group=a["topk_group"] or 1, renormalize=a["renormalize"],
        routed_scaling_factor=a["routed_scaling_factor"],
        apply_routed_scaling_factor_on_output=bool(a["apply_routed_scaling_factor_on_output"]))
