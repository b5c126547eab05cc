"""Routing and alignment self-test cases (registry.CASE_MODULES)."""

from __future__ import annotations

import torch

from .routing import biased_topk, biased_topk_reference, moe_align, moe_align_reference


ROUTING_CASES = (
    # name, experts, top_k, scoring, groups, topk_group
    ("DeepSeek-V4-Flash sqrtsoftplus", 256, 6, "sqrtsoftplus", 1, 1),
    ("Kimi-K2.5 sigmoid noaux_tc", 384, 8, "sigmoid", 1, 1),
    ("DeepSeek-V3 grouped noaux_tc", 256, 8, "sigmoid", 8, 4),
)


def check_topk(device, E, k, scoring, ng, tg, T=64, ties=False, seed=0):
    from .registry import CaseResult

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((T, E), generator=g)
    if ties:  # exact ties: repeated values, the lower index must win
        logits = (logits * 2).round() / 2
    bias = torch.randn((E,), generator=g) * 0.1
    if ties:
        bias = torch.zeros(E)
    logits, bias = logits.to(device), bias.to(device)
    kw = dict(scoring_func=scoring, num_expert_group=ng, topk_group=tg, renormalize=True,
              routed_scaling_factor=2.5, apply_routed_scaling_factor_on_output=True)
    w, ids = biased_topk(logits, bias, k, **kw)
    rw, rids = biased_topk_reference(logits, bias, k, **kw)
    if not torch.equal(ids.cpu(), rids.cpu()):
        bad = (ids.cpu() != rids.cpu()).any(dim=1).sum().item()
        return CaseResult(False, f"ids differ in {bad}/{T} rows")
    err = (w - rw).abs().max().item()
    if err > 1e-5:
        return CaseResult(False, f"weights max abs err {err:.2e}")
    return CaseResult(True, f"ids exact, weights max err {err:.1e}")


def check_align(device, n_tokens, k, E, block_m, seed=0):
    from .registry import CaseResult

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, E + 2, (n_tokens, k), generator=g, dtype=torch.int32).to(device)
    got = moe_align(ids, E, block_m)
    ref = moe_align_reference(ids, E, block_m)
    npost = int(ref[2].item())
    if int(got[2].item()) != npost:
        return CaseResult(False, f"num_post {int(got[2].item())} != {npost}")
    if not torch.equal(got[0][:npost].cpu(), ref[0][:npost].cpu()):
        return CaseResult(False, "sorted ids differ")
    nb = npost // block_m
    if not torch.equal(got[1][:nb].cpu(), ref[1][:nb].cpu()):
        return CaseResult(False, "expert ids differ")
    return CaseResult(True, f"exact ({npost} padded rows)")


def selftest_cases():
    from .registry import SelfTestCase

    cases = []
    for name, E, k, sc, ng, tg in ROUTING_CASES:
        cases.append(SelfTestCase(f"topk[{name}]", lambda d, a=(E, k, sc, ng, tg): check_topk(d, *a, T=256)))
        cases.append(SelfTestCase(f"topk[{name},ties]", lambda d, a=(E, k, sc, ng, tg): check_topk(d, *a, T=64, ties=True)))
    for T, k, E in ((1, 6, 32), (64, 6, 32), (64, 8, 48), (512, 8, 48)):
        cases.append(SelfTestCase(f"align[T={T},k={k},E={E}]", lambda d, a=(T, k, E): check_align(d, *a, 16)))
    return cases


def cpu_selftest_cases():
    """selftest --cpu: each scoring on 32 experts, ties, and the alignment, small."""
    from .registry import SelfTestCase

    cases = [SelfTestCase(f"topk[{name} small]", lambda d, a=(sc, ng, tg): check_topk(d, 32, 4, *a, T=8))
             for name, _, _, sc, ng, tg in ROUTING_CASES]
    cases.append(SelfTestCase("topk[sigmoid small,ties]", lambda d: check_topk(d, 32, 4, "sigmoid", 1, 1, T=8, ties=True)))
    cases.append(SelfTestCase("align[T=8,k=3,E=4]", lambda d: check_align(d, 8, 3, 4, 16)))
    return cases
