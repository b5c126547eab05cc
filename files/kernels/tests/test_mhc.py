"""DeepSeek-V4 mHC kernels: CPU interpreter tests, sm_120 cross-compile of
every shipped config, GPU tests (marked gpu) at the real shapes."""

from __future__ import annotations

import os
import sys
from importlib import resources

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from sm120_kernels import mhc as M  # noqa: E402
from sm120_kernels import mhc_cases  # noqa: E402
from sm120_kernels.registry import graphed  # noqa: E402

on_cpu = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
gpu = pytest.mark.gpu
TOL = M.MHC_TOL  # 2.3e-3 relative, bf16 outputs


# ---------------------------------------------------------------- CPU (interpreter)


@on_cpu
@pytest.mark.parametrize("n,d", [(1, 256), (3, 320), (17, 192)])  # d not a multiple of the tiles; n not of 16
def test_pre_post_fused_match_reference(n, d):
    res = mhc_cases.check_case(n, d, "cpu", seed=n + d)
    for key, value in res.items():
        if key not in ("ok", "col_sum_err"):
            assert value < TOL, (key, value)
    assert res["col_sum_err"] < 1e-5
    assert res["ok"]


@on_cpu
def test_two_launch_path_matches_reference(monkeypatch):
    """The path larger batches take (two-launch pre, fused post + pre GEMM)."""
    monkeypatch.setenv("SM120_MHC_NO_FUSED", "1")
    res = mhc_cases.check_case(5, 192, "cpu", seed=9)
    assert res["ok"], res


@on_cpu
def test_sinkhorn_columns_sum_to_one_and_matrix_not_symmetric():
    residual, _, fn, scale, base, _, _ = M.make_inputs(9, 256, seed=1)
    _, post, comb = M.mhc_pre(residual, fn, scale, base, M.RMS_EPS, M.HC_EPS)
    assert (comb.double().sum(-2) - 1).abs().max() < 1e-5
    assert (comb - comb.transpose(1, 2)).abs().max() > 1e-2  # the test can tell a transposed port
    _, rpost, rcomb = M.mhc_pre_ref(residual, fn, scale, base, M.RMS_EPS, M.HC_EPS)
    assert M.rel_err(comb, rcomb) < 1e-5 and M.rel_err(post, rpost) < 1e-5


@on_cpu
def test_post_uses_comb_k_j_not_j_k():
    """out[j] = post_j * y + sum_k comb[k, j] x_k: a transposed comb must fail."""
    residual, x, _, _, _, post, comb = M.make_inputs(4, 128, seed=2)
    assert (comb - comb.transpose(1, 2)).abs().max() > 1e-2
    out = M.mhc_post(x, residual, post, comb)
    good = M.rel_err(out, M.mhc_post_ref(x, residual, post, comb))
    bad = M.rel_err(out, M.mhc_post_ref(x, residual, post, comb.transpose(1, 2)))
    assert good < TOL and bad > 10 * TOL


@on_cpu
def test_pre_explicit_formula_small():
    """Hand-built case: pre weights, the collapse and the eps placement."""
    torch.manual_seed(3)
    n, hc, d = 2, 4, 64
    residual = torch.randn(n, hc, d).to(torch.bfloat16)
    fn = torch.randn(24, hc * d) * 0.05
    scale = torch.tensor([1.0, 0.5, 3.0])
    base = torch.randn(24)
    y, post, comb = M.mhc_pre(residual, fn, scale, base, 1e-6, 1e-6, 20)
    xf = residual.reshape(n, -1).double()
    mixes = (xf @ fn.double().T) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6)
    pre = torch.sigmoid(mixes[:, :4] * 1.0 + base[:4].double()) + 1e-6
    y_ref = (pre[:, :, None] * residual.double()).sum(1)
    assert M.rel_err(y, y_ref) < TOL
    assert M.rel_err(post, 2 * torch.sigmoid(mixes[:, 4:8] * 0.5 + base[4:8].double())) < 1e-5


@on_cpu
def test_zero_tokens():
    residual = torch.empty(0, 4, 128, dtype=torch.bfloat16)
    fn = torch.randn(24, 512)
    y, post, comb = M.mhc_pre(residual, fn, torch.ones(3), torch.zeros(24), 1e-6, 1e-6)
    assert y.shape == (0, 128) and post.shape == (0, 4) and comb.shape == (0, 4, 4)


def test_pdl_launch_follows_config_rows_and_override(monkeypatch):
    """PDL launch options: only where the kernel's config entry says "pdl" and
    n <= pdl_max_rows; SM120_MHC_PDL overrides (0, 1, or entry names); never
    before sm_90 or under the interpreter. The H200 file turns it on for post
    and the one-launch pre up to 8 rows, the sm_120 default nowhere."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("SM120_MHC_PDL", raising=False)
    cap = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap[0])
    dev = torch.device("cuda", 0)
    on = {"PDL": True, "launch_pdl": True}
    cfg = {"pdl": True, "pdl_max_rows": 8}
    assert M._pdl_meta(dev, "post", cfg, 8) == on
    assert M._pdl_meta(dev, "post", cfg, 9) == {}
    assert M._pdl_meta(dev, "post", {}, 1) == {}
    assert M._pdl_meta(torch.device("cpu"), "post", cfg, 1) == {}
    monkeypatch.setenv("SM120_MHC_PDL", "post")
    assert M._pdl_meta(dev, "post", {}, 64) == on
    assert M._pdl_meta(dev, "pre_fused", cfg, 1) == {}
    monkeypatch.setenv("SM120_MHC_PDL", "0")
    assert M._pdl_meta(dev, "post", cfg, 1) == {}
    monkeypatch.setenv("SM120_MHC_PDL", "1")
    assert M._pdl_meta(dev, "finish", {}, 300) == on
    cap[0] = (8, 9)
    assert M._pdl_meta(dev, "finish", {}, 300) == {}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cap[0] = (12, 0)
    assert M._pdl_meta(dev, "finish", {}, 1) == {}

    from sm120_kernels.configs import load_configs

    h200 = load_configs("mhc", "NVIDIA H200")
    assert [k for k, v in h200.items() if v.get("pdl")] == ["post", "pre_fused"]
    assert h200["post"]["pdl_max_rows"] == h200["pre_fused"]["pdl_max_rows"] == 8
    default = load_configs("mhc", "NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert not any(v.get("pdl") for v in default.values())
    # the H200 file extends the default: its entries merged over the default's
    strip = {k: {kk: vv for kk, vv in v.items() if not kk.startswith("pdl")} for k, v in h200.items()}
    assert strip == default and h200["pre_fused"]["large"] == default["pre_fused"]["large"]


# ---------------------------------------------------------------- sm_120 cross-compile

STAGE1_SIG = {
    "x_ptr": "*bf16",
    "y_ptr": "*bf16",
    "post_ptr": "*fp32",
    "comb_ptr": "*fp32",
    "res_ptr": "*bf16",
    "fn_ptr": "*fp32",
    "part_ptr": "*fp32",
    "sq_ptr": "*fp32",
    "n": "i32",
    "D": "i32",
    "stride_xn": "i32",
    "stride_xk": "i32",
    "stride_yn": "i32",
    "stride_pn": "i32",
    "stride_cn": "i32",
    "stride_rn": "i32",
    "stride_fn": "i32",
}
FINISH_SIG = {
    "x_ptr": "*bf16",
    "part_ptr": "*fp32",
    "sq_ptr": "*fp32",
    "scale_ptr": "*fp32",
    "base_ptr": "*fp32",
    "outs": ("*bf16", "*fp32", "*fp32"),  # y, post, comb
    "mix_args": ("fp32", "fp32", "fp32", "fp32"),  # 1 / (HC * D), rms_eps, hc_eps, post_mult
    "n": "i32",
    "D": "i32",
    "n_chunks": "i32",
    "stride_xn": "i32",
    "stride_xk": "i32",
}


PRE_FUSED_SIG = {
    "x_ptr": "*bf16",
    "fn_ptr": "*fp32",
    "scale_ptr": "*fp32",
    "base_ptr": "*fp32",
    "red_ptr": "*fp32",
    "sync_ptr": "*i32",
    "outs": ("*bf16", "*fp32", "*fp32"),
    "mix_args": ("fp32", "fp32", "fp32", "fp32"),
    "n": "i32",
    "D": "i32",
    "stride_xn": "i32",
    "stride_xk": "i32",
    "stride_fn": "i32",
}


def _shipped_mhc_configs():
    from sm120_kernels.configs import load_config_file

    root = resources.files("sm120_kernels").joinpath("configs")
    out = []
    for f in sorted(root.iterdir(), key=lambda p: p.name):
        if f.name.startswith("mhc-") and f.name.endswith(".json"):
            for key, cfg in load_config_file(f.name).items():
                if isinstance(cfg, dict):
                    out.append((f.name, key, cfg))
    return out


def _cases():
    cases = []
    for fname, key, cfg in _shipped_mhc_configs():
        if key in ("stage1", "stage1_fused"):
            cases.append(pytest.param(fname, key, cfg, key == "stage1_fused", id=f"{fname}:{key}"))
        else:
            cases.append(pytest.param(fname, key, cfg, False, id=f"{fname}:{key}"))
    return cases


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles with the real compiler")
@pytest.mark.parametrize("fname,key,cfg,do_post", _cases())
def test_shipped_configs_compile_for_sm120(fname, key, cfg, do_post):
    from sm120_compile_util import SM120_SHARED_LIMIT, compile_sm120

    if key == "pre_fused":
        # every column width the plan can pick on sm_120 (188 SMs) for n <= max_rows, hidden 4096
        shapes = [M._fused_shape(n, M.HIDDEN, 188, cfg) for n in range(1, cfg["max_rows"] + 1)]
        assert all(shapes)
        variants = set()
        for n, (bm, cw, bd, gk, _groups) in enumerate(shapes, start=1):
            eff = M._effective_cfg(n, cfg)
            reps = max(1, min(eff.get("replicas", 1), M._RED_REPLICAS, gk))
            variants.add((bm, cw, bd, gk, reps, eff.get("pipe", 0), eff["num_warps"], bool(eff.get("pdl"))))
        for bm, cw, bd, gk, reps, pipe, warps, pdl in sorted(variants):
            r = compile_sm120(
                M._mhc_pre_fused_kernel,
                PRE_FUSED_SIG,
                {"HC": 4, "MIX": 24, "MIXP": 32, "BM": bm, "CW": cw, "BD": bd, "GK": gk, "RED_ROWS": M._RED_ROWS,
                 "R": reps, "RMAX": M._RED_REPLICAS, "ITERS": 20, "PHASE": 3, "DOT_BF16": True, "PIPE": pipe,
                 "PDL": pdl},
                warps,
                max(1, pipe),
            )
            assert r["shared"] <= SM120_SHARED_LIMIT, (bm, cw, r["shared"])
            assert r["spills"] == 0, (bm, cw, r["report"])
            assert r["stack"] == 0, (bm, cw, r["report"])
        return
    if key == "finish":
        r = compile_sm120(
            M._mhc_finish_kernel,
            FINISH_SIG,
            {"HC": 4, "MIXP": 32, "NCH": 64, "ITERS": 20, "BD": cfg["block_d"], "PDL": bool(cfg.get("pdl"))},
            cfg["num_warps"],
        )
    else:
        gemm = key in ("stage1", "stage1_fused")
        r = compile_sm120(
            M._mhc_stage1_kernel,
            STAGE1_SIG,
            {
                "HC": 4,
                "MIX": 24,
                "MIXP": 32,
                "BM": max(16, cfg["block_m"]) if gemm else cfg["block_m"],
                "CHUNK": cfg["chunk_d"],
                "BD": cfg["block_d"],
                "DO_POST": do_post or not gemm,
                "DO_GEMM": gemm,
                "DOT_BF16": True,
                "PDL": bool(cfg.get("pdl")),
            },
            cfg["num_warps"],
        )
    assert r["shared"] <= SM120_SHARED_LIMIT, r["shared"]
    assert r["spills"] == 0, r["report"]
    assert r["stack"] == 0, r["report"]


# ---------------------------------------------------------------- GPU (lent H200; not CI)


@gpu
@pytest.mark.parametrize("n", [1, 8, 64, 257, 4096])
def test_gpu_real_shapes(n):
    res = mhc_cases.check_case(n, M.HIDDEN, "cuda", seed=n)
    assert res["ok"], res


@gpu
def test_gpu_pre_fused_repeated_calls():
    """The one-launch pre's buffers and barrier words are reused across calls
    (and alternate between two buffers): changing n, eager and graph replays,
    every call stays right."""
    ins = {n: M.make_inputs(n, M.HIDDEN, device="cuda", seed=40 + n) for n in (1, 16, 33, 64)}
    refs = {n: M.mhc_pre_ref(r, fn, sc, b, M.RMS_EPS, M.HC_EPS) for n, (r, _, fn, sc, b, _, _) in ins.items()}
    for it in range(200):
        n = (1, 16, 33, 64)[it % 4]
        r, _, fn, sc, b, _, _ = ins[n]
        y, p, c = M.mhc_pre(r, fn, sc, b, M.RMS_EPS, M.HC_EPS)
        if it % 7 == 0 or it > 190:
            ry, rp, rc = refs[n]
            assert M.rel_err(y, ry) < TOL and M.rel_err(p, rp) < 1e-5 and M.rel_err(c, rc) < 1e-5, (it, n)
    r, _, fn, sc, b, _, _ = ins[64]
    out = {}
    replay = graphed(lambda: out.update(v=M.mhc_pre(r, fn, sc, b, M.RMS_EPS, M.HC_EPS)), warmup=1)
    for _ in range(51):
        replay()
    torch.cuda.synchronize()
    ry, rp, rc = refs[64]
    assert M.rel_err(out["v"][0], ry) < TOL and M.rel_err(out["v"][2], rc) < 1e-5
