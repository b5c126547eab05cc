"""Every shipped MoE/routing config cross-compiled for sm_120 with the installed
Triton (3.8.0 in the pinned stack): shared memory <= 101,376 B, no spills."""

import os

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="compiles with the real compiler (second pass of test-cpu.sh)")


def _variants():
    import compile_sm120 as C

    return list(C.gemm_variants()) + list(C.other_variants())


@pytest.mark.parametrize("variant", _variants() if os.environ.get("TRITON_INTERPRET") != "1" else [],
                         ids=lambda v: v[0])
def test_compiles_for_sm120(variant):
    import compile_sm120 as C

    name, fn, sig, const, warps, stages = variant
    res = C.compile_one(fn, sig, const, warps, stages)
    assert res["shared"] <= C.SMEM_LIMIT, res
    assert res["spills"] == 0, res
