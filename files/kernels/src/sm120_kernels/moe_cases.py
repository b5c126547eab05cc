"""The MoE's self-test and bench cases (registry.CASE_MODULES) and the
bench --tune candidates."""

from __future__ import annotations

import torch

from .fused_moe_w4a16 import fused_moe_w4a16, moe_w4a16_reference
from .weights import W4A16Weights, random_weights, weight_bytes_per_expert

_WEIGHT_CACHE: dict = {}


def _model_weights(model, device):
    key = (model.name, str(device))
    if key not in _WEIGHT_CACHE:
        # int4 in SGLang's own compressed-tensors layout ([E, K/8, N]), as the
        # plugin hands it over
        _WEIGHT_CACHE[key] = random_weights(model.fmt, model.local_experts, model.hidden, model.inter,
                                            device, seed=7, kn=model.fmt == "int4")
    return _WEIGHT_CACHE[key]


def _selftest_moe(model, batch, mode):
    from .models import ep_share_routing
    from .registry import CaseResult, compare

    def run(device):
        W = _model_weights(model, device)
        g = torch.Generator().manual_seed(batch)
        x = torch.randn((batch, model.hidden), generator=g).to(torch.bfloat16).to(device)
        if mode == "ep8":
            tw, ids, _ = ep_share_routing(model, batch, device, seed=batch)
        else:  # every slot local, duplicates of experts across tokens
            ids = torch.stack([torch.randperm(model.local_experts, generator=g)[: model.top_k]
                               for _ in range(batch)]).to(torch.int32).to(device)
            tw = (torch.rand((batch, model.top_k), generator=g) + 0.1).to(device)
        rsf = model.routed_scaling_factor
        out = fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=rsf, swiglu_limit=model.swiglu_limit)
        ref = moe_w4a16_reference(x, W, tw, ids, routed_scaling_factor=rsf, swiglu_limit=model.swiglu_limit)
        res = compare(out, ref)
        if mode == "all":
            # the routed scaling factor is applied exactly once
            out1 = fused_moe_w4a16(x, W, tw, ids, routed_scaling_factor=1.0, swiglu_limit=model.swiglu_limit)
            lin = compare(out, (out1.float() * rsf), min_cos=0.99999, max_rel=4e-3)
            if not lin.ok:
                return CaseResult(False, f"{res.detail}; out(rsf) != rsf*out(1): {lin.detail}", res.metrics)
            res.detail += f"; rsf-linear {lin.detail}"
        return res

    return run


def selftest_cases():
    from .models import MODELS
    from .registry import SelfTestCase

    cases = []
    for m in MODELS:
        for b in (1, 8, 64, 256):  # 256: 16-token blocks (prefill bucket)
            cases.append(SelfTestCase(f"moe_w4a16[{m.name},{m.fmt},ep8,batch={b}]", _selftest_moe(m, b, "ep8")))
        for b in (1, 32):  # every top-k slot local (one token: the down GEMM sums all k)
            cases.append(SelfTestCase(f"moe_w4a16[{m.name},{m.fmt},all-local,batch={b}]", _selftest_moe(m, b, "all")))
    return cases


def cpu_selftest_cases():
    """selftest --cpu: each model's format and clamp on 4 local experts of
    128 x 64 (the fragment kernel's smallest shapes), one through each path:
    three tokens (aligned blocks and the combine) and one (two launches)."""
    from dataclasses import replace

    from .models import MODELS
    from .registry import SelfTestCase

    cases = []
    for m in MODELS:
        small = replace(m, name=f"{m.name} small", hidden=128, inter=64, experts=32, top_k=3)
        for b in (3,) if m.fmt == "nvfp4" else (1,):
            cases.append(SelfTestCase(f"moe_w4a16[{small.name},{m.fmt},ep8,batch={b}]", _selftest_moe(small, b, "ep8")))
    return cases


def moe_bytes(model, batch: int, n_active: int) -> int:
    """Fewest bytes: the active experts' weights and scales once, x read, out written."""
    return n_active * weight_bytes_per_expert(model.fmt, model.hidden, model.inter) + 2 * 2 * batch * model.hidden


# (fmt, batch) -> {"gate_up": cfg, "down": cfg}; set by bench --tune
_BENCH_CONFIG_OVERRIDE: dict = {}

# candidates for bench --tune: the fragment kernel's launch shapes (warps that
# split K, the next K group's loads issued before this one's MMAs or after,
# down GEMM row tiles per program); one family, both GEMMs share BLOCK_M = 8 NT.
def _frag(nw, pipe, rt=None, nt=1, depth=1):
    c = dict(kernel="frag", NT=nt, num_warps=nw, pipe=pipe)
    if depth != 1:
        c["depth"] = depth
    if rt:
        c["RT"] = rt
    return c


TUNE_FAMILIES = {
    # depth 3 and 4: the register ring only (pipe False)
    "frag": ([_frag(4, False)] + [_frag(nw, p, depth=d) for nw in (2, 4, 8, 16) for p in (True, False)
                                  for d in (1, 2, 3, 4) if (nw, p, d) != (4, False, 1) and (d <= 2 or not p)],
             [_frag(2, False, 2)] + [_frag(nw, p, rt, depth=d) for nw in (1, 2, 4, 8, 16) for p in (True, False)
                                     for rt in (1, 2) for d in (1, 2, 3, 4)
                                     if (nw, p, rt, d) != (2, False, 2, 1) and (d <= 2 or not p)]),
}


def _bench_moe(model, batch):
    from .models import ep_share_routing
    from .registry import BenchSpec, graphed, stream_sets

    def make(device):
        W = _model_weights(model, device)
        tw, ids, active = ep_share_routing(model, batch, device, seed=1000 + batch)
        x = torch.randn((batch, model.hidden), device=device).to(torch.bfloat16)
        kw = dict(routed_scaling_factor=model.routed_scaling_factor, swiglu_limit=model.swiglu_limit)
        out = torch.empty_like(x)
        cfg = _BENCH_CONFIG_OVERRIDE.get((model.fmt, batch))

        def call():
            return fused_moe_w4a16(x, W, tw, ids, out=out, config=cfg, **kw)

        call()
        torch.cuda.synchronize()
        fn = call
        try:
            # decode runs under CUDA graphs in SGLang; time the same way
            fn = graphed(call, warmup=1)
        except Exception as exc:  # keep eager timing, say so
            print(f"# graph capture failed for {model.name} b={batch}: {exc}")
        # in-stream sets: the same batch routed to other local experts (ids
        # shifted), so back-to-back calls read other weights, as successive
        # layers do; enough sets that together they read twice the L2
        nbytes = moe_bytes(model, batch, len(active))
        n_sets = min(stream_sets(nbytes, device), max(2, model.local_experts // len(active)))
        stream_calls, stream_inputs = [], []
        for i in range(n_sets):
            ids_i = torch.where(ids >= 0, (ids + i * len(active)) % model.local_experts, ids)
            x_i = torch.randn((batch, model.hidden), device=device).to(torch.bfloat16)
            out_i = torch.empty_like(x_i)
            stream_inputs.append((x_i, tw, ids_i))
            stream_calls.append(lambda x_i=x_i, ids_i=ids_i, out_i=out_i:
                                fused_moe_w4a16(x_i, W, tw, ids_i, out=out_i, config=cfg, **kw))
        # the reference reads checkpoint-order words: unpack once, outside the timing
        W_ref = W4A16Weights(W.fmt, W.words("w13"), W.scales("s13"), W.g13, W.words("w2"), W.scales("s2"), W.g2)
        return BenchSpec(
            fn=fn, bytes=nbytes, stream_calls=stream_calls,
            ref_fn=lambda: moe_w4a16_reference(x, W_ref, tw, ids, **kw),
            extra={"model": model.name, "fmt": model.fmt, "active_experts": len(active),
                   "local_slots": int((ids >= 0).sum().item()), "cuda_graph": fn is not call,
                   # bench --peer: the same inputs for SGLang's own kernels
                   "_peer": {"model": model, "weights": W, "inputs": (x, tw, ids),
                             "stream_inputs": stream_inputs, "out": call}})

    return make


def bench_cases():
    from .models import MODELS
    from .registry import BenchCase

    return [BenchCase(f"moe_w4a16[{m.name},batch={b}]", m.name, b, _bench_moe(m, b))
            for m in MODELS for b in (1, 8, 32, 64)]

