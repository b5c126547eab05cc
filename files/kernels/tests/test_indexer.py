"""DeepSeek-V4 indexer kernels: CPU interpreter tests, sm_120 cross-compile of
every shipped config, GPU tests (marked gpu) at the real shapes."""

from __future__ import annotations

import json
import os
import sys
from importlib import resources

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from sm120_kernels import indexer as I  # noqa: E402
from sm120_kernels import indexer_cases  # noqa: E402

on_cpu = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
gpu = pytest.mark.gpu


def _run(batch, next_n, ctxs, *, device="cpu", seed=0, ctx_2d=False, extra=0, config=None):
    q, kv, w, ctx, bt, max_ctx = I.make_inputs(batch, next_n, ctxs, device=device, seed=seed, ctx_2d=ctx_2d)
    max_len = max_ctx + extra
    out = torch.full((batch * next_n, max_len), float("nan"), device=device)  # poison: every column must be written
    I.paged_mqa_logits(q, kv, w, ctx, bt, max_len, out=out, config=config)
    ref = I.paged_mqa_logits_ref(q, kv, w, ctx, bt, max_len)
    return out, ref, ctx


# ---------------------------------------------------------------- CPU (interpreter)


@on_cpu
@pytest.mark.parametrize(
    "batch,next_n,ctxs,extra",
    [
        (1, 1, [1], 0),
        (2, 1, [63, 200], 5),  # not multiples of 64; max_len past the longest context
        (3, 1, [64, 129, 257], 64),
        (2, 2, [2, 190], 0),  # next_n 2: query i sees ctx - 2 + i
        (2, 2, [1, 65], 3),  # a query that sees nothing (whole row -inf)
    ],
)
@pytest.mark.parametrize(
    "prefetch,ppi,ppp,swap",
    [(True, 1, 2, False), (False, 1, 2, False), (False, 2, 3, False), (False, 4, 4, False),
     (True, 1, 3, True), (False, 1, 2, True), (False, 2, 3, True)],
)
def test_logits_match_reference(batch, next_n, ctxs, extra, prefetch, ppi, ppp, swap):
    cfg = {"prefetch": prefetch, "max_pages_per_prog": ppp, "pages_per_iter": ppi, "swap": swap}
    out, ref, _ = _run(batch, next_n, ctxs, seed=batch * 10 + next_n, extra=extra, config=cfg)
    res = I.compare_logits(out, ref)
    assert not torch.isnan(out).any(), "unwritten output"
    assert res["same_mask"], "-inf masks differ"
    assert res["calc_diff"] < 1e-3, res


@on_cpu
@pytest.mark.parametrize(
    "batch,next_n,ctxs,programs_per_sm",
    [
        (3, 1, [64, 129, 257], 1),  # 8 CPU "SMs": 2 splits of 5 pages per row (2 + 3)
        (1, 1, [1000], 3),  # 24 slots, 16 pages: one page per program
        (2, 2, [190, 700], 1),  # 4 splits of 11 pages (2, 3, 3, 3)
    ],
)
def test_logits_balanced_splits(batch, next_n, ctxs, programs_per_sm):
    """programs_per_sm: pages cut into near-equal runs, one wave of programs;
    every column written and equal to the reference."""
    cfg = {"prefetch": False, "swap": True, "programs_per_sm": programs_per_sm, "num_warps": 4, "num_stages": 3}
    out, ref, _ = _run(batch, next_n, ctxs, seed=batch * 7 + next_n, extra=64, config=cfg)
    res = I.compare_logits(out, ref)
    assert not torch.isnan(out).any(), "unwritten output"
    assert res["same_mask"], "-inf masks differ"
    assert res["calc_diff"] < 1e-3, res


@on_cpu
def test_logits_ctx_per_query_2d():
    ctxs = [[100, 101], [7, 64]]
    out, ref, _ = _run(2, 2, ctxs, seed=3, ctx_2d=True)
    res = I.compare_logits(out, ref)
    assert res["ok"], res


@on_cpu
def test_next_n_mask_convention():
    """Query i of a request sees keys 0 .. ctx - next_n + i (DeepGEMM's convention)."""
    out, _, _ = _run(1, 2, [100], seed=4)
    finite = torch.isfinite(out)
    assert finite[0].sum() == 99 and finite[1].sum() == 100
    assert finite[0, :99].all() and finite[1, :100].all()


@on_cpu
def test_unused_pages_are_never_read():
    """Block-table entries past the context are -1; pointing them at garbage changes nothing."""
    q, kv, w, ctx, bt, max_ctx = I.make_inputs(2, 1, [70, 130], seed=5)
    assert (bt == -1).any()
    out1 = I.paged_mqa_logits(q, kv, w, ctx, bt, max_ctx + 64)
    bt2 = bt.clone()
    bt2[bt2 == -1] = 10**6  # far out of range: reading it would fault / differ
    out2 = I.paged_mqa_logits(q, kv, w, ctx, bt2, max_ctx + 64)
    assert torch.equal(out1, out2)


@on_cpu
def test_topk_matches_reference():
    out, ref, ctx = _run(3, 1, [600, 1100, 300], seed=6)
    lens = I.row_lengths(ctx, 1)
    idx = I.topk_indices(out, lens, 512)
    ref_idx = I.topk_ref(ref, lens, 512)
    assert I.topk_overlap(idx, ref_idx) >= 0.99
    # the short row: every position, then -1
    assert idx[2, :300].tolist() == list(range(300)) and (idx[2, 300:] == -1).all()
    # ascending, unique, within the row
    for r, n in enumerate(lens.tolist()):
        v = idx[r][idx[r] >= 0]
        assert torch.all(v[1:] > v[:-1]) and int(v.max()) < n


@on_cpu
@pytest.mark.parametrize("config", [None, {"block": 256, "num_warps": 4, "splits": 8}])
def test_topk_exact_on_distinct_values_and_ties(config):
    """Also with the row split over 8 programs (ties across chunk borders)."""
    torch.manual_seed(0)
    rows, cols, k = 4, 3000, 512
    x = torch.randn(rows, cols)
    x[1] = torch.round(x[1] * 4) / 4  # heavy ties: lowest positions win at the threshold
    x[2, 2500:] = float("-inf")
    x[3] = torch.round(x[3])  # a few values only: the threshold bin spans every chunk
    lens = torch.tensor([cols, cols, 2700, cols], dtype=torch.int32)
    idx = I.topk_indices(x, lens, k, config=config)
    for r in range(rows):
        n = int(lens[r])
        row = x[r, :n]
        thresh = torch.sort(row[torch.isfinite(row)], descending=True).values[k - 1]
        expect = torch.nonzero(row > thresh).flatten().tolist()
        eq = torch.nonzero(row == thresh).flatten().tolist()
        expect = sorted(expect + eq[: k - len(expect)])
        assert idx[r].tolist() == expect, r


@on_cpu
def test_topk_excludes_inf_and_pads():
    x = torch.full((1, 1000), float("-inf"))
    x[0, 10:20] = torch.arange(10.0)
    idx = I.topk_indices(x, torch.tensor([1000], dtype=torch.int32), 512)
    assert idx[0, :10].tolist() == list(range(10, 20)) and (idx[0, 10:] == -1).all()


@on_cpu
def test_fused_topk_api():
    q, kv, w, ctx, bt, max_ctx = I.make_inputs(2, 2, [900, 1500], seed=8)
    idx = I.paged_mqa_logits_topk(q, kv, w, ctx, bt, max_ctx, 512)
    ref = I.paged_mqa_logits_ref(q, kv, w, ctx, bt, max_ctx)
    ref_idx = I.topk_ref(ref, I.row_lengths(ctx, 2), 512)
    assert idx.shape == (4, 512)
    assert I.topk_overlap(idx, ref_idx) >= 0.99


@on_cpu
def test_int64_offsets_beyond_2_31():
    """Page offsets and output row offsets past 2**31 elements, without
    allocating them: untouched virtual memory is never committed."""
    pages_needed = (2**31) // I.PAGE_BYTES + 8  # page ids whose byte offset passes 2**31
    kv = torch.empty(pages_needed, I.PAGE_BYTES, dtype=torch.uint8)
    q, kv_small, w, ctx, bt, max_ctx = I.make_inputs(3, 1, [70, 40, 130], seed=9, extra_pages=0)
    small = kv_small.reshape(-1, I.PAGE_BYTES)
    hi = torch.arange(pages_needed - small.shape[0], pages_needed, dtype=torch.int32)
    kv[hi.long()] = small
    bt_hi = bt.clone()
    bt_hi[bt >= 0] = hi[bt[bt >= 0].long()]
    row_stride = 2**30 + 64  # row 2 starts past 2**31 elements (2**33 bytes)
    big = torch.empty(3 * row_stride, dtype=torch.float32)
    out = big.as_strided((3, max_ctx), (row_stride, 1))
    out.fill_(float("nan"))
    I.paged_mqa_logits(q, kv, w, ctx, bt_hi, max_ctx, out=out)
    ref = I.paged_mqa_logits_ref(q, kv_small, w, ctx, bt, max_ctx)
    res = I.compare_logits(out.clone(), ref)
    assert res["ok"], res
    del big, kv


def test_sglang_adapter_signature_matches_targets():
    import inspect

    params = list(inspect.signature(I.sglang_fp8_paged_mqa_logits).parameters)
    assert params == [
        "q_fp8",
        "kvcache_fp8",
        "weight",
        "seq_lens",
        "page_table",
        "deep_gemm_metadata",
        "max_seq_len",
        "clean_logits",
    ]


# ---------------------------------------------------------------- sm_120 cross-compile

LOGITS_SIG = {
    "q_ptr": "*fp8e4nv",
    "kv8_ptr": "*fp8e4nv",
    "kv32_ptr": "*fp32",
    "w_ptr": "*fp32",
    "ctx_ptr": "*i32",
    "bt_ptr": "*i32",
    "out_ptr": "*fp32",
    "max_len": "i32",
    "n_splits": "i32",
    "stride_qb": "i32",
    "stride_qn": "i32",
    "stride_qh": "i32",
    "stride_wr": "i32",
    "stride_cb": "i32",
    "stride_cn": "i32",
    "stride_bt": "i32",
    "stride_out": "i32",
}
TOPK_SIG = {"logits_ptr": "*fp32", "len_ptr": "*i32", "hist_ptr": "*i32", "cnt_ptr": "*i32", "out_ptr": "*i32",
            "n_cols": "i32", "chunk": "i32", "stride_l": "i32", "stride_o": "i32"}
TOPK_PASSES = ((21, 2048), (10, 2048), (0, 1024), (0, 2048), (0, 2048))


def _shipped_indexer_configs():
    root = resources.files("sm120_kernels").joinpath("configs")
    out = []
    for f in sorted(root.iterdir(), key=lambda p: p.name):
        if f.name.startswith("indexer-") and f.name.endswith(".json"):
            data = json.loads(f.read_text())
            for key, cfg in data.items():
                if not key.startswith("_"):
                    out.append((f.name, key, cfg))
    return out


def _compile_cases():
    cases = []
    for fname, key, cfg in _shipped_indexer_configs():
        if key.startswith("logits"):
            for next_n in ((1,) if key == "logits" else (2,)):
                for ctx_2d in (False, True):
                    cases.append(pytest.param(fname, key, cfg, next_n, ctx_2d, id=f"{fname}:{key}:n{next_n}:2d{int(ctx_2d)}"))
        else:
            cases.append(pytest.param(fname, key, cfg, 0, False, id=f"{fname}:{key}"))
    return cases


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles with the real compiler")
@pytest.mark.parametrize("fname,key,cfg,next_n,ctx_2d", _compile_cases())
def test_shipped_configs_compile_for_sm120(fname, key, cfg, next_n, ctx_2d):
    from sm120_compile_util import SM120_SHARED_LIMIT, compile_sm120

    if key.startswith("logits"):
        r = compile_sm120(
            I._mqa_logits_kernel,
            LOGITS_SIG,
            {"NEXT_N": next_n, "H": 64, "D": 128, "PAGE": 64, "CTX_2D": ctx_2d, "PREFETCH": bool(cfg["prefetch"]),
             "PPI": int(cfg.get("pages_per_iter", 1)), "SWAP": bool(cfg.get("swap", False)),
             "L2_AHEAD": int(cfg.get("l2_ahead", 0))},
            cfg["num_warps"],
            cfg["num_stages"],
        )
        # int64 addressing of pages and output rows
        assert "i32 to i64" in r["ttir"]
    else:
        for p, (shift, nb) in enumerate(TOPK_PASSES):
            r = compile_sm120(
                I._topk_pass_kernel,
                TOPK_SIG,
                {"K": 512, "PASS": p, "SHIFT": shift, "NB": nb, "SP": 64, "BLOCK": cfg["block"],
                 "HIST_MASK": I._HIST_HAS_MASK},
                cfg["num_warps"],
            )
            assert r["shared"] <= SM120_SHARED_LIMIT, (p, r["shared"])
            assert r["spills"] == 0, (p, r["report"])
            assert r["stack"] == 0, (p, r["report"])
        return
    assert r["shared"] <= SM120_SHARED_LIMIT, r["shared"]
    assert r["spills"] == 0, r["report"]
    assert r["stack"] == 0, r["report"]


def test_every_config_file_has_all_keys():
    for fname, key, cfg in _shipped_indexer_configs():
        need = {"logits": I.DEFAULT_LOGITS_CONFIG, "logits_next_n2": I.DEFAULT_LOGITS_N2_CONFIG, "topk": I.DEFAULT_TOPK_CONFIG}[key]
        assert set(need) <= set(cfg), (fname, key)


# ---------------------------------------------------------------- GPU (lent H200; not CI)


@gpu
@pytest.mark.parametrize("batch,next_n", [(1, 1), (32, 1), (16, 2), (5, 2)])
def test_gpu_real_shapes(batch, next_n):
    g = torch.Generator().manual_seed(batch)
    ctxs = (torch.randint(1, 40000, (batch,), generator=g)).tolist()
    ctxs[0] = 32768 + 17
    res = indexer_cases.check_logits_case(batch, next_n, ctxs, "cuda", seed=batch)
    assert res["ok"], res


@gpu
def test_gpu_int64_rows_times_length():
    """rows x max_len > 2**31: 66,000 rows x 32,768 columns (8.6 GB of logits)."""
    rows, max_len = 66_000, 32_768
    q, kv, w, ctx, bt, _ = I.make_inputs(2, 1, [3000, 32768], device="cuda", seed=1)
    sel = torch.arange(rows, device="cuda") % 2
    qr, wr, cr, btr = q[sel], w[sel], ctx[sel], bt[sel]
    cr = cr.clone()
    cr[-1] = 32768
    out = I.paged_mqa_logits(qr, kv, wr, cr, btr, max_len)
    for r in (0, rows - 2, rows - 1):
        ref = I.paged_mqa_logits_ref(qr[r : r + 1], kv, wr[r : r + 1], cr[r : r + 1], btr[r : r + 1], max_len)
        res = I.compare_logits(out[r : r + 1], ref)
        assert res["ok"], (r, res)
    del out
    torch.cuda.empty_cache()
