"""DeepSeek-V4 indexer self-test and bench cases (registry.CASE_MODULES)."""

from __future__ import annotations

import torch
import triton

from .indexer import (HEAD_DIM, NUM_HEADS, PAGE_SIZE, TOPK, _kv_views, compare_logits, make_inputs,
                      paged_mqa_logits, paged_mqa_logits_ref, row_lengths, topk_indices, topk_overlap, topk_ref)


def check_logits_case(batch, next_n, context_lens, device, *, seed=0, ctx_2d=False, max_len_extra=0):
    q, kv, w, ctx, bt, max_ctx = make_inputs(batch, next_n, context_lens, device=device, seed=seed, ctx_2d=ctx_2d)
    max_len = max_ctx + max_len_extra
    out = torch.full((batch * next_n, max_len), float("nan"), dtype=torch.float32, device=device)
    paged_mqa_logits(q, kv, w, ctx, bt, max_len, out=out)
    ref = paged_mqa_logits_ref(q, kv, w, ctx, bt, max_len)
    res = compare_logits(out, ref)
    lens = row_lengths(ctx, next_n)
    idx = topk_indices(out, lens, TOPK)
    ref_idx = topk_ref(ref, lens.cpu(), TOPK).to(idx.device)
    res["topk_overlap"] = topk_overlap(idx.cpu(), ref_idx.cpu())
    res["ok"] = res["ok"] and res["topk_overlap"] >= 0.99
    return res


def selftest_cases():
    """SelfTestCase list at the model's real shapes (64 heads x 128, 64-token pages)."""
    from .registry import CaseResult, SelfTestCase

    def case(batch, next_n, ctxs, seed):
        def run(device):
            r = check_logits_case(batch, next_n, ctxs, device, seed=seed)
            detail = f"calc_diff={r['calc_diff']:.2e} same_mask={r['same_mask']} topk_overlap={r['topk_overlap']:.4f}"
            return CaseResult(bool(r["ok"]), detail, r)

        return run

    return [
        SelfTestCase("dsv4.indexer logits+topk b4 next_n1 ctx[1000,4097,65,33000]", case(4, 1, [1000, 4097, 65, 33000], 1)),
        SelfTestCase("dsv4.indexer logits+topk b3 next_n2 ctx[513,2049,8191]", case(3, 2, [513, 2049, 8191], 2)),
    ]


def bench_cases():
    """BenchCase list: bytes = the KV pages it must read (+ q, weights, output)."""
    from .registry import BenchCase, BenchSpec, graphed, stream_sets

    def setup(batch, next_n, ctx_len, with_topk):
        def make(device):
            rows = batch * next_n
            kv_bytes = batch * ctx_len * (HEAD_DIM + 4)
            nbytes = kv_bytes + batch * next_n * NUM_HEADS * (HEAD_DIM + 4)
            nbytes += rows * TOPK * 4 if with_topk else rows * ctx_len * 4

            def call_on(seed):
                """The call on one input set (its own pages, queries and weights)."""
                q, kv, w, ctx, bt, max_ctx = make_inputs(batch, next_n, [ctx_len] * batch, seed=seed, extra_pages=0)
                q, kv, w, ctx, bt = (t.to(device) for t in (q, kv, w, ctx, bt))
                scratch = torch.empty(rows, max_ctx, dtype=torch.float32, device=device)
                idx = torch.empty(rows, TOPK, dtype=torch.int32, device=device)
                lens = row_lengths(ctx, next_n)

                def fn():
                    paged_mqa_logits(q, kv, w, ctx, bt, max_ctx, out=scratch)
                    if with_topk:
                        topk_indices(scratch, lens, TOPK, out=idx)

                return fn, (q, kv, w, ctx, bt, max_ctx)

            fn, args = call_on(7)
            stream_calls = [fn] + [call_on(8 + i)[0] for i in range(stream_sets(nbytes, device) - 1)]
            return BenchSpec(
                fn=graphed(fn),
                bytes=nbytes,
                ref_fn=lambda: _torch_sm120_like(*args),
                stream_calls=stream_calls,
                extra={"kv_bytes": kv_bytes, "target": ">= 70% of copy bandwidth", "_target_fraction": 0.70},
            )

        return make

    grp = "DeepSeek-V4-Flash indexer (ctx 32K)"
    cases = [
        BenchCase(f"dsv4.indexer logits b{b} next_n1 ctx32768", grp, b, setup(b, 1, 32768, False))
        for b in (1, 8, 32, 64)
    ]
    cases.append(BenchCase("dsv4.indexer logits b32 next_n2 ctx32768", grp + " next_n 2", 32, setup(32, 2, 32768, False)))
    cases.append(BenchCase("dsv4.indexer logits+topk512 b32 next_n1 ctx32768", grp + " +topk", 32, setup(32, 1, 32768, True)))
    return cases


def _torch_sm120_like(q, kv, w, ctx, bt, max_len):
    """The vectorised torch computation SGLang runs on sm_120 without kernels
    (``fp8_paged_mqa_logits_torch_sm120``), for the speed-up column."""
    batch, next_n, heads, dim = q.shape
    kv8, kv32 = _kv_views(kv)
    pages = bt[:, : triton.cdiv(max_len, PAGE_SIZE)].clamp(min=0).long()
    g8 = kv8[pages]  # [B, P, 8448]
    kval = g8[..., : PAGE_SIZE * dim].reshape(batch, -1, dim).to(torch.bfloat16)
    ksc = kv32[pages][..., PAGE_SIZE * dim // 4 :].reshape(batch, -1)
    qb = q.reshape(batch, next_n * heads, dim).to(torch.bfloat16)
    s = torch.bmm(kval, qb.transpose(1, 2)).float().relu()  # [B, L, N*H]
    s = s.view(batch, -1, next_n, heads) * w.view(batch, 1, next_n, heads)
    return (s.sum(-1) * ksc[..., None]).transpose(1, 2)
