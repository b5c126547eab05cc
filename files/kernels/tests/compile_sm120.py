"""Cross-compile every kernel, in every shipped configuration, for sm_120 with
the installed Triton (no GPU needed) and report shared memory and spills.

Run without TRITON_INTERPRET. Prints one JSON object per kernel variant.
"""

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET", "0") != "1"

import triton  # noqa: E402
from sm120_compile_util import (SM120, SM120_SHARED_LIMIT, compile_sm120, hottest_loop, load_use_distance,  # noqa: E402
                                opcode_mix)

from sm120_kernels import combine, configs, formats, fused_moe_w4a16_frag as F, gemm_tensor_core as TC  # noqa: E402
from sm120_kernels import routing as R  # noqa: E402
from sm120_kernels.models import MODELS  # noqa: E402


def compile_one(fn, signature, constexprs, num_warps, num_stages, k_loop=False, target=SM120):
    """Resources of one build (sm_120 unless told; shared: Triton's and the
    static shared memory in the PTX together); with k_loop, also its hottest
    loop's length, HMMA count and instruction classes (from the SASS).
    constexprs["maxnreg"], where present, is the launch's register cap."""
    sig = {k: v for k, v in signature.items() if v != "constexpr"}
    constexprs = dict(constexprs)
    maxnreg = constexprs.pop("maxnreg", None)
    r = compile_sm120(fn, sig, constexprs, num_warps, num_stages, target=target, sass=k_loop, maxnreg=maxnreg)
    res = {"shared": r["shared"] + r["static_shared"], "spills": r["spills"], "registers": r["registers"],
           "stack": r["stack"]}
    if k_loop:
        body = hottest_loop(r["sass"])
        res.update(loop_instructions=len(body), loop_hmma=sum(op.startswith("HMMA") for _, op, _ in body),
                   loop_mix=opcode_mix(body), loop_load_use=load_use_distance(body))
    return res


def gemm_variants():
    """Each distinct (format, GEMM, config) among the shipped files, once."""
    seen = set()
    for v in _gemm_variants():
        key = (v[1].__name__, json.dumps(v[3], sort_keys=True), v[4], v[5])  # same kernel build: once
        if key not in seen:
            seen.add(key)
            yield v


FRAG_SIG = {
    "x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "out_ptr": "*bf16", "tw_ptr": "*fp32",
    "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "num_post_ptr": "*i32", "ready_ptr": "*i32",
    "num_valid": "i32", "top_k": "i32", "KG": "i32",
    "stride_xm": "i64", "stride_we": "i64", "stride_wt": "i64", "stride_se": "i64", "stride_sn": "i64",
    "stride_om": "i64", "up_tiles": "i32", "g_mult": "fp32", "swiglu_limit": "fp32", "rsf": "fp32",
    "num_experts": "i32", "ready_target": "i32",
}


def _gemm_variants():
    ptr = {"bf16": "*bf16", "i32": "*i32", "u8": "*u8", "f32": "*fp32"}
    # the fragment kernel, in every shipped configuration (packed weights: every model)
    for fname in configs.shipped_files():
        data = configs.load_file(fname)
        for model in MODELS:
            fmt = model.fmt
            for bucket, cfgs in data[fmt].items():
                dep = cfgs.get("dependent_launches", False)
                dep = set(configs.DEPENDENT_LAUNCHES if dep is True else dep or ())
                for kernel, gated in (("gate_up", True), ("down", False)):
                    c = cfgs[kernel]
                    sig = dict(FRAG_SIG, s_ptr="*i16",  # scale fragments (frag_pack_scales)
                               out_ptr=ptr["bf16"] if gated else ptr["f32"])
                    k_words = (model.hidden if gated else model.inter) // 64
                    const = dict(FMT=formats.FORMATS.index(fmt), GATED=gated, X_IS_SORTED=not gated,
                                 HAS_LIMIT=bool(model.swiglu_limit) and gated, NT=c["NT"], NW=c["num_warps"],
                                 RT=1 if gated else c.get("RT", 1), PIPE=c["pipe"], DEPTH=c.get("depth", 1),
                                 EVEN_K=k_words % (c["num_warps"] * c.get("depth", 1)) == 0, INTERP=False,
                                 DIRECT=False, KP=1, SCALES_AHEAD=bool(c.get("scales_ahead")),
                                 LAUNCH_DEPENDENTS=("down" if gated else "combine") in dep, PREFETCH=False,
                                 WAIT_PRIOR=kernel in dep, L2_STEPS=0, ONE_CLAMP=bool(c.get("one_clamp")),
                                 **({"maxnreg": c["maxnreg"]} if c.get("maxnreg") else {}))
                    two = gated or c.get("RT", 1) == 2
                    bulk, ring = F.ring_launch(c, k_words, two, 8 * c["NT"])
                    # block_ready: the gate/up counts each block's row tiles, the down waits for them
                    ready = F.block_ready(cfgs, frozenset(dep), model.inter // 64)
                    # exchange: the epilogue's one-round exchange of the warps' sums
                    xchg = F._exchange_asm(c["num_warps"], 8 if two else 4) if c.get("exchange") and c["NT"] == 1 else ""
                    yield (f"{fname}:{fmt}:{bucket}:{kernel}", F._moe_frag_kernel, sig,
                           dict(const, BULK=bulk, RING=ring, SIGNAL_READY=ready and gated,
                                WAIT_READY=ready and not gated, XCHG=xchg), c["num_warps"], 1)
                    if bucket == "1" and c["NT"] == 1:  # one token: the two-launch path (bf16 output)
                        bulk, ring = F.ring_launch(c, k_words, two, 1)  # one activation row
                        # a dependent down GEMM (dependent_down on sm_90 and newer: through
                        # its rings, prefetching, or the register path, pdl), and the
                        # gate/up that lets it launch early
                        down_ring = F.ring_launch(cfgs["down"], model.inter // 64, False, 1)[0] > 0
                        prefetch = bool(cfgs["down"].get("prefetch")) and down_ring
                        pdl = cfgs["down"].get("pdl") is not None and not down_ring
                        yield (f"{fname}:{fmt}:{bucket}:{kernel}:direct", F._moe_frag_kernel,
                               dict(sig, out_ptr=ptr["bf16"]),
                               dict(const, DIRECT=True, KP=8, BULK=bulk, RING=ring,
                                    LAUNCH_DEPENDENTS=(prefetch or pdl) and gated, PREFETCH=prefetch and not gated,
                                    WAIT_PRIOR=pdl and not gated,
                                    L2_STEPS=int(cfgs["down"]["pdl"]) if pdl and not gated else 0,
                                    SIGNAL_READY=False, WAIT_READY=False, XCHG=""),
                               c["num_warps"], 1)
    # the tensor-core GEMM for weights that do not fit the fragment order
    for model in MODELS:
        fmt = model.fmt
        for kernel, gated in (("gate_up", True), ("down", False)):
            c = TC.TENSOR_CORE_CONFIG[fmt][kernel]
            sig = {
                "x_ptr": ptr["bf16"], "w_ptr": ptr["i32"],
                "s_ptr": ptr["u8"] if fmt == "nvfp4" else ptr["bf16"], "g_ptr": ptr["f32"],
                "out_ptr": ptr["bf16"] if gated else ptr["f32"], "tw_ptr": ptr["f32"],
                "sorted_ids_ptr": ptr["i32"], "expert_ids_ptr": ptr["i32"], "num_post_ptr": ptr["i32"],
                "num_valid": "i32", "top_k": "i32", "N": "i32", "K": "i32",
                "stride_xm": "i64", "stride_xk": "i64",
                "stride_we": "i64", "stride_wn": "i64", "stride_wk": "i64",
                "stride_se": "i64", "stride_sn": "i64", "stride_sk": "i64",
                "stride_om": "i64", "up_offset": "i32", "g_mult": "fp32", "swiglu_limit": "fp32",
            }
            const = dict(FMT=formats.FORMATS.index(fmt), GROUP=formats.GROUP_SIZE[fmt], GATED=gated,
                         X_IS_SORTED=not gated, HAS_LIMIT=bool(model.swiglu_limit) and gated,
                         USE_ASM=True, INTERP=False, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
                         BLOCK_K=c["BLOCK_K"])
            yield f"tensor-core:{fmt}:{kernel}", TC._moe_gemm_kernel, sig, const, c["num_warps"], c["num_stages"]


def other_variants():
    sig = {"buf_ptr": "*fp32", "ids_ptr": "*i32", "out_ptr": "*bf16", "top_k": "i32", "H": "i32",
           "num_local": "i32", "rsf": "fp32", "stride_bm": "i64", "stride_om": "i64",
           "BLOCK_H": "constexpr", "KP": "constexpr", "INTERP": "constexpr", "WAIT_PRIOR": "constexpr"}
    for dependent in (False, True):  # dependent: a programmatic dependent launch (dependent_launches)
        yield (f"combine{'[dependent]' if dependent else ''}", combine._combine_kernel, sig,
               {"BLOCK_H": combine.COMBINE_BLOCK_H, "KP": 8, "INTERP": False, "WAIT_PRIOR": dependent}, 4, 1)
    # dependents: lets the gate/up GEMM launch at once; ready: zeroes block_ready's counts
    for n, warps, dependents, ready in ((64, 4, False, False), (64, 4, True, False), (64, 4, True, True),
                                        (2048, 4, False, False), (8192, 8, False, False)):
        sig = {"ids_ptr": "*i32", "sorted_ptr": "*i32", "expert_ids_ptr": "*i32", "num_post_ptr": "*i32",
               "ready_ptr": "*i32", "n": "i32", "E": "i32", "CAP": "i32", "BLOCK": "constexpr",
               "E_BINS": "constexpr", "BLOCK_M": "constexpr", "INIT_BLOCK": "constexpr",
               "LAUNCH_DEPENDENTS": "constexpr", "READY": "constexpr"}
        yield (f"align[{n}]{'[dependents]' if dependents else ''}{'[ready]' if ready else ''}", R._align_kernel,
               sig, {"BLOCK": n, "E_BINS": 512, "BLOCK_M": 16, "INIT_BLOCK": 1024, "LAUNCH_DEPENDENTS": dependents,
                     "READY": ready}, warps, 1)
    for model in MODELS:
        sig = {"logits_ptr": "*fp32", "bias_ptr": "*fp32", "w_ptr": "*fp32", "ids_ptr": "*i32",
               "E": "i32", "stride_l": "i64", "rsf": "fp32"}
        const = dict(TOPK=triton.next_power_of_2(model.top_k), SCORE=R.SCORING.index(model.scoring),
                     N_GROUP=model.num_expert_group, TOPK_GROUP=model.topk_group, RENORM=True,
                     APPLY_RSF=True, BLOCK_G=triton.next_power_of_2(model.experts // model.num_expert_group))
        sig.update({k: "constexpr" for k in const})
        yield f"topk[{model.name}]", R._biased_topk_kernel, sig, const, 4, 1


def main():
    only = sys.argv[1] if len(sys.argv) > 1 else None
    for name, fn, sig, const, w, s in list(gemm_variants()) + list(other_variants()):
        if only and only not in name:
            continue
        try:
            res = compile_one(fn, sig, const, w, s)
            res["ok"] = res["shared"] <= SM120_SHARED_LIMIT and res["spills"] == 0
        except Exception as exc:  # an OutOfResources or compile error is a failure
            res = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        res["name"] = name
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
