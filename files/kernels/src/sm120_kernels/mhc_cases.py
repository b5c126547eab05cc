"""DeepSeek-V4 mHC self-test and bench cases (registry.CASE_MODULES)."""

from __future__ import annotations

import torch

from .mhc import (HC_EPS, HC_MULT, HIDDEN, MHC_TOL, RMS_EPS, make_inputs, mhc_post, mhc_post_pre, mhc_post_ref,
                  mhc_post_torch, mhc_pre, mhc_pre_ref, mhc_pre_torch, rel_err)


def check_case(n, d, device, *, seed=0):
    residual, x, fn, scale, base, post, comb = make_inputs(n, d, device=device, seed=seed)
    res = {}
    y, p, c = mhc_pre(residual, fn, scale, base, RMS_EPS, HC_EPS)
    ry, rp, rc = mhc_pre_ref(residual, fn, scale, base, RMS_EPS, HC_EPS)
    res["pre_y"] = rel_err(y, ry)
    res["pre_post"] = rel_err(p, rp)
    res["pre_comb"] = rel_err(c, rc)
    res["col_sum_err"] = float((c.double().sum(-2) - 1).abs().max()) if n else 0.0
    out = mhc_post(x, residual, post, comb)
    res["post"] = rel_err(out, mhc_post_ref(x, residual, post, comb))
    nr, y2, p2, c2 = mhc_post_pre(x, residual, post, comb, fn, scale, base, RMS_EPS, HC_EPS)
    ref_res = mhc_post_ref(x, residual, post, comb)
    ry2, rp2, rc2 = mhc_pre_ref(ref_res.to(torch.bfloat16), fn, scale, base, RMS_EPS, HC_EPS)
    res["fused_res"] = rel_err(nr, ref_res)
    res["fused_y"] = rel_err(y2, ry2)
    res["fused_post"] = rel_err(p2, rp2)
    res["fused_comb"] = rel_err(c2, rc2)
    errs = [v for k, v in res.items() if k != "col_sum_err"]
    res["ok"] = all(e < MHC_TOL for e in errs) and res["col_sum_err"] < 1e-5
    return res


def selftest_cases():
    from .registry import CaseResult, SelfTestCase

    def case(n, seed):
        def run(device):
            r = check_case(n, HIDDEN, device, seed=seed)
            worst = max(v for k, v in r.items() if k not in ("ok", "col_sum_err"))
            return CaseResult(bool(r["ok"]), f"max_rel={worst:.2e} col_sum_err={r['col_sum_err']:.1e}", r)

        return run

    return [SelfTestCase(f"dsv4.mhc pre/post/post+pre n{n} hidden{HIDDEN}", case(n, i)) for i, n in enumerate((1, 7, 64, 300))]


def mhc_bytes(n: int, d: int = HIDDEN, hc: int = HC_MULT):
    """Fewest bytes at n rows, as the bench counts them: (pre, post, fused post+pre).
    pre: residual + fn in, y + post/comb out; post: y + residual (+ post/comb) in,
    residual out; fused: y + residual + post/comb + fn in, residual + y + post/comb out."""
    b_res = n * hc * d * 2
    b_x = n * d * 2
    b_fn = (2 * hc + hc * hc) * hc * d * 4
    b_small = n * (hc + hc * hc) * 4
    return b_res + b_fn + b_x + b_small, b_x + 2 * b_res + b_small, 2 * b_x + 2 * b_res + b_fn + 2 * b_small


def bench_cases():
    """mHC pre + post (3 launches) and the fused post+pre (2 launches), each
    captured in a CUDA graph as SGLang's decode runs them."""
    from .registry import BenchCase, BenchSpec, graphed, stream_sets

    def setup(n, which):
        def make(device):
            pre, post, fused = mhc_bytes(n)
            nbytes = pre + post if which == "pre+post" else fused

            def call_on(seed):
                """The calls on one input set (its own residual, layer output and
                parameters, as another layer has)."""
                residual, x, fn, scale, base, post, comb = make_inputs(n, HIDDEN, device=device, seed=seed)
                if which == "pre+post":

                    def fn_():
                        mhc_pre(residual, fn, scale, base, RMS_EPS, HC_EPS)
                        mhc_post(x, residual, post, comb)

                    def ref():
                        mhc_pre_torch(residual, fn, scale, base, RMS_EPS, HC_EPS)
                        mhc_post_torch(x, residual, post, comb)
                else:

                    def fn_():
                        mhc_post_pre(x, residual, post, comb, fn, scale, base, RMS_EPS, HC_EPS)

                    def ref():
                        r = mhc_post_torch(x, residual, post, comb)
                        mhc_pre_torch(r, fn, scale, base, RMS_EPS, HC_EPS)

                return fn_, ref

            fn_, ref = call_on(11)
            stream_calls = [fn_] + [call_on(12 + i)[0] for i in range(stream_sets(nbytes, device) - 1)]
            return BenchSpec(
                fn=graphed(fn_),
                bytes=nbytes,
                ref_fn=ref,
                stream_calls=stream_calls,
                extra={"target": "within 2x of bytes / copy bandwidth, >= 5x over torch", "_target_fraction": 0.5},
            )

        return make

    cases = [BenchCase(f"dsv4.mhc pre+post n{n}", "DeepSeek-V4-Flash mHC pre+post", n, setup(n, "pre+post")) for n in (1, 8, 32, 64)]
    cases += [BenchCase(f"dsv4.mhc post+pre fused n{n}", "DeepSeek-V4-Flash mHC post+pre fused", n, setup(n, "fused")) for n in (8, 64)]
    return cases
