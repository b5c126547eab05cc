"""Where a several-token MoE call spends its time, program by program: the
alignment, the two GEMMs and the combine, timed in stream (the bench's input
sets back to back in one CUDA graph) with each program's %globaltimer stamps.

A timing probe, not a test: it loads copies of the kernel modules with stamps
added (text patches, each checked to apply exactly once, so a changed kernel
fails loudly here) in place of the package's, so the shipped kernels are
untouched. Per program it records: start, first block's ids loaded, first
block's K loop done, last block's stores issued, the block count known, and the
SM. The stamps are predicated on the values they follow, so none is taken
before its value exists. The last call of each replay is read back; figures
are medians over replays, in µs from the call's alignment start.

    PYTHONPATH=src python3 scripts/moe_timeline.py [--model NAME] [--top JSON] [--replays N] [batch ...]
"""
import argparse
import importlib.util
import json
import pathlib
import statistics
import sys

import torch

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "sm120_kernels"
SLOTS = 8192  # records per launch kind
FIELDS = 8  # start, ids, loop, end, smid, nblk, -, -
KINDS = ("gate_up", "down", "align", "combine")

STAMP_HELPERS = '''

@triton.jit
def _gt(dep):
    """%globaltimer once dep (int32) exists."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $1, -1234567; @p mov.u64 $0, %globaltimer; @!p mov.u64 $0, 0; }",
        "=l,r", [dep], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid(dep):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [dep], dtype=tl.int32, is_pure=False, pack=1)

'''


def _patch(text: str, old: str, new: str, where: str) -> str:
    n = text.count(old)
    assert n == 1, f"{where}: {old!r} found {n} times (the kernel changed; update the probe)"
    return text.replace(old, new)


def _patch_in(text: str, start: str, end: str, edits, where: str) -> str:
    """edits applied only between the markers start and end."""
    i = text.index(start)
    j = text.index(end, i)
    seg = text[i:j]
    for old, new in edits:
        seg = _patch(seg, old, new, where)
    return text[:i] + seg + text[j:]


def _stamped(module: str, kernel: str, grid: str, end: str, edits) -> str:
    """module's source with the stamp helpers and kernel taking the stamp
    buffer first (tlp_ptr; its launch kernel[grid] passes _TL_BUF), then
    edits between the kernel's def and end."""
    text = (SRC / f"{module}.py").read_text()
    text = _patch(text, "import triton.language as tl\n",
                  "import triton.language as tl\n" + STAMP_HELPERS + "_TL_BUF = None\n", module)
    text = _patch(text, f"def {kernel}(", f"def {kernel}(tlp_ptr, ", module)
    text = _patch(text, f"{kernel}[{grid}](", f"{kernel}[{grid}](_TL_BUF, ", module)
    return _patch_in(text, f"def {kernel}(", end, edits, module)


def _load(name: str, text: str):
    full = f"sm120_kernels.{name}"
    path = SRC / f"{name}.py"
    spec = importlib.util.spec_from_loader(full, loader=None, origin=str(path))
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = str(path)  # triton.jit reads the source through inspect: keep the file's text there
    mod.__package__ = "sm120_kernels"
    sys.modules[full] = mod
    import linecache
    linecache.cache[str(path)] = (len(text), None, text.splitlines(True), str(path))
    exec(compile(text, str(path), "exec"), mod.__dict__)
    return mod


def install(stamps=("ids", "loop", "end")):
    """The patched routing, fused_moe_w4a16 and fused_moe_w4a16_frag as the
    package's modules; returns the stamp buffer. stamps: which of the GEMM
    programs' stamps after their start (each costs registers)."""
    import sm120_kernels  # noqa: F401  (the package itself, unpatched __init__)

    rt = _stamped("routing", "_align_kernel", "(1,)", "def moe_align_reference", [
        ("    offs = tl.arange(0, BLOCK)\n",
         "    offs = tl.arange(0, BLOCK)\n"
         f"    rec = tlp_ptr + {2 * SLOTS * FIELDS} + offs * 0\n"
         "    tl.store(rec, _gt(offs), mask=offs == 0)\n"
         "    tl.store(rec + 4, _smid(offs).to(tl.int64), mask=offs == 0)\n"),
        ("    tl.store(expert_ids_ptr + dest // BLOCK_M, se, mask=ok)\n",
         "    tl.store(expert_ids_ptr + dest // BLOCK_M, se, mask=ok)\n"
         "    tl.store(rec + 3, _gt(dest), mask=offs == 0)\n"),
    ])
    fm = _stamped("fused_moe_w4a16", "_combine_kernel", "(T, triton.cdiv(H, COMBINE_BLOCK_H))", "# Host side", [
        ("                    WAIT_PRIOR: tl.constexpr = False):\n",
         "                    WAIT_PRIOR: tl.constexpr = False):\n"
         "    o0 = tl.arange(0, BLOCK_H)\n"
         f"    rec = tlp_ptr + ({3 * SLOTS} + tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)) * {FIELDS} + o0 * 0\n"
         "    tl.store(rec, _gt(o0), mask=o0 == 0)\n"
         "    tl.store(rec + 4, _smid(o0).to(tl.int64), mask=o0 == 0)\n"),
        ("    tl.store(out_ptr + t.to(tl.int64) * stride_om + offs, _to_bf16(acc * rsf, INTERP), mask=mask)\n",
         "    tl.store(out_ptr + t.to(tl.int64) * stride_om + offs, _to_bf16(acc * rsf, INTERP), mask=mask)\n"
         "    tl.store(rec + 3, _gt(acc.to(tl.int32, bitcast=True)), mask=o0 == 0)\n"),
    ])
    fr = _stamped("fused_moe_w4a16_frag", "_moe_frag_kernel", "grid", "# Host side", [
        ("    gi = lane // 4\n",
         "    gi = lane // 4\n"
         f"    rec = tlp_ptr + ((0 if GATED else {SLOTS}) + tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)).to(tl.int64) * {FIELDS} + t * 0\n"
         "    tl.store(rec, _gt(t), mask=t == 0)\n"
         "    tl.store(rec + 1, t.to(tl.int64) * 0, mask=t == 0)\n"
         "    tl.store(rec + 2, t.to(tl.int64) * 0, mask=t == 0)\n"
         "    tl.store(rec + 3, t.to(tl.int64) * 0, mask=t == 0)\n"
         "    tl.store(rec + 4, _smid(t).to(tl.int64), mask=t == 0)\n"),
        ("            nblk = tl.load(num_post_ptr, volatile=WAIT_READY) // BM\n",
         "            nblk = tl.load(num_post_ptr, volatile=WAIT_READY) // BM\n"
         "            tl.store(rec + 5, _gt(t * 0 + nblk), mask=t == 0)\n"),
    ] + [e for name, e in (
        ("ids", ("                sid = tl.load(sorted_ids_ptr + mb * BM + gi)\n",
         "                sid = tl.load(sorted_ids_ptr + mb * BM + gi)\n"
         "                tl.store(rec + 1, _gt(sid + e.to(tl.int32)), mask=(t == 0) & (mb == tl.program_id(1)))\n")),
        ("loop", ("                                         ONE_CLAMP)\n",
         "                                         ONE_CLAMP)\n"
         "                tl.store(rec + 2, _gt(acc0[0].to(tl.int32, bitcast=True)), mask=(t == 0) & (mb == tl.program_id(1)))\n")),
        ("end", ("            if SIGNAL_READY:  # every thread's stores of this block, then one count\n",
         "            tl.store(rec + 3, _gt(acc0[0].to(tl.int32, bitcast=True)), mask=t == 0)\n"
         "            if SIGNAL_READY:  # every thread's stores of this block, then one count\n")),
    ) if name in stamps])

    buf = torch.zeros(4 * SLOTS * FIELDS, dtype=torch.int64, device="cuda")
    mods = [_load("routing", rt), _load("fused_moe_w4a16", fm), _load("fused_moe_w4a16_frag", fr)]
    for m in mods:
        m._TL_BUF = buf
    import sm120_kernels
    sm120_kernels.routing, sm120_kernels.fused_moe_w4a16, sm120_kernels.fused_moe_w4a16_frag = mods
    return buf


def q(vals, p):
    s = sorted(vals)
    return s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))] if s else float("nan")


def summarize(recs_by_replay):
    """Medians over replays of each launch's figures (µs from the alignment start)."""
    rows = {}
    for recs in recs_by_replay:
        t0 = recs["align"][0][0]
        one = {}
        for kind in KINDS:
            r = recs[kind]
            st = [(x[0] - t0) / 1e3 for x in r]
            work = [x for x in r if x[1] or x[3]]
            one[f"{kind} programs"] = len(r)
            one[f"{kind} start min"] = min(st)
            one[f"{kind} start max"] = max(st)
            if kind in ("align", "combine"):
                en = [(x[3] - t0) / 1e3 for x in r]
                one[f"{kind} end max"] = max(en)
                continue
            one[f"{kind} working"] = len(work)
            ex = [x for x in r if not (x[1] or x[3])]
            if ex:
                one[f"{kind} exit nblk med"] = q([(x[5] - t0) / 1e3 for x in ex], 0.5)
            if not work:
                continue
            for name, f in (("start", 0), ("ids", 1), ("loop", 2), ("end", 3)):
                v = [(x[f] - t0) / 1e3 for x in work]
                for p, lab in ((0.0, "min"), (0.1, "p10"), (0.5, "med"), (0.9, "p90"), (1.0, "max")):
                    one[f"{kind} {name} {lab}"] = q(v, p)
            first_end = min(x[3] for x in work)
            one[f"{kind} started after first end"] = sum(x[0] > first_end for x in work)
            per_sm = {}
            for x in work:
                per_sm[x[4]] = per_sm.get(x[4], 0) + 1
            one[f"{kind} SMs used"] = len(per_sm)
            one[f"{kind} programs/SM max"] = max(per_sm.values())
            one[f"{kind} loop us med"] = q([(x[2] - x[1]) / 1e3 for x in work], 0.5)
            one[f"{kind} prologue us med"] = q([(x[1] - x[0]) / 1e3 for x in work], 0.5)
            one[f"{kind} epilogue us med"] = q([(x[3] - x[2]) / 1e3 for x in work], 0.5)
        for k, v in one.items():
            rows.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in rows.items()}


def timer_step():
    """The smallest nonzero %globaltimer step seen by one thread (ns)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _tick(out_ptr, N: tl.constexpr):
        o = tl.arange(0, 1)
        prev = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [o], dtype=tl.int64, is_pure=False,
                                         pack=1)
        for i in range(N):
            cur = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [o], dtype=tl.int64,
                                            is_pure=False, pack=1)
            tl.store(out_ptr + i + o, cur - prev)
            prev = cur

    out = torch.zeros(4096, dtype=torch.int64, device="cuda")
    _tick[(1,)](out, N=4096, num_warps=1)
    d = [v for v in out.tolist() if v > 0]
    return min(d) if d else None, statistics.median(d) if d else None


def compiled_registers():
    """Registers and spills of every compiled fragment-kernel build (best effort)."""
    from sm120_kernels import fused_moe_w4a16_frag as F

    out = []
    for cache in getattr(F._moe_frag_kernel, "device_caches", {}).values():
        for k in cache[0].values():
            try:
                k._init_handles()
                out.append((k.n_regs, k.n_spills))
            except Exception:  # noqa: BLE001 - a diagnostic
                pass
    return sorted(set(out))


def main():
    ap = argparse.ArgumentParser(prog="scripts/moe_timeline.py")
    ap.add_argument("batches", nargs="*", type=int, default=[8, 32])
    ap.add_argument("--model")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--top", type=json.loads, default=None, help="whole-config keys merged into the shipped config")
    ap.add_argument("--stamps", default="ids,loop,end", help="the GEMM programs' stamps after their start")
    args = ap.parse_args()
    buf = install(tuple(s for s in args.stamps.split(",") if s))
    from sm120_kernels import fused_moe_w4a16 as M
    from sm120_kernels.bench import stream_time_us
    from sm120_kernels.configs import get_config
    from sm120_kernels.models import MODELS
    from sm120_kernels.registry import graphed

    print("globaltimer step (ns): min, median", timer_step(), flush=True)
    dev = torch.device("cuda")
    for model in MODELS:
        if args.model and args.model not in model.name:
            continue
        for b in args.batches:
            if args.top:
                shipped = get_config(model.fmt, b)
                cfg = {**shipped, **{k: {**shipped[k], **v} if isinstance(v, dict) else v
                                     for k, v in args.top.items()}}
                M._BENCH_CONFIG_OVERRIDE[(model.fmt, b)] = cfg
            spec = M._bench_moe(model, b)(dev)
            calls = spec.stream_calls
            reps = len(calls) * -(-32 // len(calls))
            ts = stream_time_us(calls)[0]

            def all_calls():
                for i in range(reps):
                    calls[i % len(calls)]()

            replay = graphed(all_calls, warmup=1)
            got = []
            for _ in range(args.replays):
                buf.zero_()
                replay()
                torch.cuda.synchronize()
                r = buf.view(4, SLOTS, FIELDS).cpu().tolist()
                got.append({k: [x for x in r[i] if x[0]] for i, k in enumerate(KINDS)})
            del replay, spec
            M._BENCH_CONFIG_OVERRIDE.pop((model.fmt, b), None)
            s = summarize(got)
            print(f"\n{model.name} batch {b}: in stream {ts:.1f} us per call (stamped kernels), {reps} calls per replay")
            for k, v in s.items():
                print(f"  {k:40s} {v:8.2f}")
            print("  registers (spills) of the stamped GEMMs:", compiled_registers())
            sys.stdout.flush()


if __name__ == "__main__":
    main()
