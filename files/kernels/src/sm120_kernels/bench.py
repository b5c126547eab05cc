"""Benchmarks: time, bytes moved, bandwidth as a fraction of the device's
measured copy bandwidth, and speed-up over the torch reference.

    python -m sm120_kernels.bench [--plot bench.png] [--json PATH] [-k SUBSTRING] [--no-ref] [--peer]

Method (the device tool's METHOD.md), two figures per case, medians:
- single call (time_us): the call captured alone in a CUDA graph, as SGLang's
  decode runs it; triton.testing.do_bench clears the L2 (writes a 256 MB
  buffer) before every replay and times it with CUDA events. This includes one
  graph launch: a graph holding one tiny kernel measures about 4.5 us this way.
- in stream (stream_us): the call repeated back to back in one CUDA graph, as
  it runs among the decode graph's other nodes, rotating through distinct input
  sets that together read at least twice the L2 (so no call finds its inputs
  cached); the replay's time over the number of calls.
Targets are judged on the in-stream time; both are printed. The copy bandwidth
is a 2 GiB device-to-device copy, counting bytes read plus bytes written.
"""

from __future__ import annotations

import argparse
import json
import sys

TARGET_FRACTION = 0.80  # batch >= 8: at least 80% of copy bandwidth
TARGET_BATCH1_US = 15.0


def copy_bandwidth(device) -> float:
    import torch
    from triton.testing import do_bench

    n = 1 << 31
    a = torch.empty(n, dtype=torch.uint8, device=device)
    a.random_()  # never time zeros
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    del a, b
    return 2 * n / (ms * 1e-3)


def stream_time_us(calls, min_calls: int = 32, rep_ms: int = 200):
    """Per-call time of `calls` (one per input set) back to back in one CUDA
    graph, cycled to at least `min_calls` calls; returns (us, calls timed)."""
    from triton.testing import do_bench

    from .registry import graphed

    reps = len(calls) * -(-min_calls // len(calls))

    def all_calls():
        for i in range(reps):
            calls[i % len(calls)]()

    replay = graphed(all_calls, warmup=1)
    ms = do_bench(replay, warmup=10, rep=rep_ms, return_mode="median")
    del replay  # the graph's memory
    return ms * 1e3 / reps, reps


def bench_figures(spec, bw: float) -> dict:
    """Both figures of one BenchSpec, each timed twice (medians): the single
    call (spec.fn: one CUDA-graph replay, L2 cleared before each) and, when the
    spec has stream_calls, the per-call time in stream; bytes over each time
    as a fraction of the copy bandwidth bw (bytes/s)."""
    from triton.testing import do_bench

    t = do_bench(spec.fn, warmup=25, rep=200, return_mode="median") * 1e3
    t2 = do_bench(spec.fn, warmup=5, rep=100, return_mode="median") * 1e3
    row = {"time_us": round(t, 2), "time_us_repeat": round(t2, 2), "bytes": spec.bytes,
           "GBps": round(spec.bytes / (t * 1e-6) / 1e9, 1),
           "bw_fraction": round(spec.bytes / (t * 1e-6) / bw, 3),
           "bound_us": round(spec.bytes / bw * 1e6, 2)}
    if spec.stream_calls:
        ts, reps = stream_time_us(spec.stream_calls)
        ts2, _ = stream_time_us(spec.stream_calls)
        row.update({"stream_us": round(ts, 2), "stream_us_repeat": round(ts2, 2),
                    "stream_calls": reps, "stream_input_sets": len(spec.stream_calls),
                    "stream_bw_fraction": round(spec.bytes / (ts * 1e-6) / bw, 3)})
    return row


def peer_figures(spec, ours_us: float, pkg) -> dict:
    """bench --peer: SGLang's own MoE kernel for these weights (peer.py) on
    the case's inputs, checked against the torch reference, then timed as ours
    is (its GEMM launches only); speedup is its in-stream time over ours."""
    from triton.testing import do_bench

    from . import peer
    from .registry import compare, graphed

    p = spec.extra["_peer"]
    ref = spec.ref_fn()
    figures = {"ours": compare(p["out"](), ref).detail}
    for name, factory in peer.peers(p["model"], p["weights"], pkg).items():
        try:
            kernel = factory()
            gemms, full = kernel.bind(*p["inputs"])
            check = compare(full(), ref)
            if not check.ok:
                figures[name] = {"error": f"disagrees with the reference: {check.detail}"}
                continue
            t = do_bench(graphed(gemms, warmup=1), warmup=25, rep=200, return_mode="median") * 1e3
            ts, _ = stream_time_us([kernel.bind(*inputs)[0] for inputs in p["stream_inputs"]])
            figures[name] = {"time_us": round(t, 2), "stream_us": round(ts, 2), "check": check.detail,
                             "speedup": round(ts / ours_us, 2)}
        except Exception as exc:  # a peer that cannot run here is a result too
            figures[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return figures


def plot(rows, path, device_name, bw) -> list[str]:
    """One panel per case group, written to path; returns the panel titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .models import MODELS

    groups = sorted({r["group"] for r in rows})
    moe_groups = {m.name for m in MODELS}  # the MoE cases are grouped by model
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, grp in zip(axes[0], groups):
        rs = sorted((r for r in rows if r["group"] == grp), key=lambda r: r["batch"])
        xs = [r["batch"] for r in rs]
        ax.plot(xs, [r["time_us"] for r in rs], "o-", label="single call (median)")
        if all(r.get("stream_us") for r in rs):
            ax.plot(xs, [r["stream_us"] for r in rs], "^-", label="in stream (median)")
        ax.plot(xs, [r["bound_us"] for r in rs], "k--", label="bytes / copy bandwidth")
        if any(r.get("ref_time_us") for r in rs):
            ax.plot(xs, [r.get("ref_time_us") for r in rs], "s:", label="torch reference")
        for r in rs:
            ax.annotate(f"{100 * r.get('stream_bw_fraction', r['bw_fraction']):.0f}%",
                        (r["batch"], r.get("stream_us", r["time_us"])),
                        textcoords="offset points", xytext=(4, 6), fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (tokens)")
        ax.set_ylabel("µs")
        ax.set_title(f"{grp} MoE, EP8 share" if grp in moe_groups else grp)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"sm120_kernels on {device_name} (copy {bw / 1e9:.0f} GB/s; % = in stream)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return [ax.get_title() for ax in axes[0]]


def _time_trial(case, dev, do_bench, key, trial, label):
    """In-stream time (s) of the case with config `trial`, or None if it fails."""
    from . import moe_cases as M

    M._BENCH_CONFIG_OVERRIDE[key] = trial
    try:
        spec = case.make(dev)
        if spec.stream_calls:
            t_us, _ = stream_time_us(spec.stream_calls, min_calls=16, rep_ms=40)
            return t_us * 1e-3
        return do_bench(spec.fn, warmup=5, rep=40, return_mode="median")
    except Exception as exc:
        print(f"# tune {case.name} {label}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def one_token_trials(cfg: dict, top_k: int) -> list:
    """Batch 1: the one-token gate/up grid (direct_split: the rule, or 1, 2, 3
    or top_k programs per row tile sharing the token's slots), on top of the
    tuned launch shapes."""
    trials = [cfg]
    for split in sorted({1, 2, 3, top_k}):
        trials.append({**cfg, "gate_up": {**cfg["gate_up"], "direct_split": split}})
    return trials


def register_cap_trials(cfg: dict, kernel: str) -> list:
    """Batch 1, after the one-token grid, per GEMM: the kernel as two-set pipe
    steps under a register cap, with and without the next step's scales
    decoded ahead. Under its default register budget ptxas sinks a step's
    loads to the loop's end, so each step waits a full memory latency; with
    maxnreg it issues them before the step's MMAs. At one token the grids
    leave registers to spare; at 8 tokens and more the lost occupancy cost
    more than the overlap gained on the H200."""
    capped = {**cfg[kernel], "pipe": True, "depth": 2, "maxnreg": 128}
    return [cfg, {**cfg, kernel: capped}, {**cfg, kernel: {**capped, "scales_ahead": True}}]


def ring_trials(cfg: dict, kernel: str, batch: int) -> list:
    """Every batch, last, per GEMM: the K loop through the warps' shared-memory
    rings (bulk: 2 stages of 2 K groups; the rings have no use for pipe's
    scales_ahead or its register cap). On the H200 that tied with or lost to
    the register path at most batches; the RTX PRO
    6000's memory and shared memory differ, so a tune there tries it. At one
    token the down GEMM also tries rings holding its whole K whose first
    stages are copied before the gate/up GEMM ends (prefetch; 4 warps of 2
    stages of 4 groups, 8 warps of 1 stage of 4), under a 104-register cap so
    that two of its programs fit beside a gate/up program; on the H200 that
    won for DeepSeek-V4-Flash."""
    ring = {k: v for k, v in cfg[kernel].items() if k not in ("scales_ahead", "maxnreg")}
    trials = [cfg, {**cfg, kernel: {**ring, "bulk": 2, "depth": 2}}]
    if kernel == "down" and batch == 1:
        trials += [{**cfg, kernel: {**ring, "num_warps": nw, "bulk": bulk, "depth": 4, "prefetch": True,
                                    "maxnreg": 104}} for nw, bulk in ((4, 2), (8, 1))]
    return trials


def exchange_trials(cfg: dict, batch: int) -> list:
    """Several tokens with 8-token blocks: the epilogue's one-round exchange of
    the warps' sums (exchange) on the gate/up GEMM, the down GEMM, or both.
    On the H200 it paid at batch 8-64, on one GEMM or both."""
    if batch == 1 or cfg["gate_up"].get("NT", 1) != 1:
        return [cfg]
    def with_exchange(c: dict, on: bool) -> dict:
        return {**{k: v for k, v in c.items() if k != "exchange"}, **({"exchange": True} if on else {})}

    trials = [cfg] + [{**cfg, "gate_up": with_exchange(cfg["gate_up"], g), "down": with_exchange(cfg["down"], d)}
                      for g in (False, True) for d in (False, True)]
    return [t for i, t in enumerate(trials) if t not in trials[:i]]


def dependent_trials(cfg: dict, batch: int) -> list:
    """Last: programmatic dependent launches (sm_90 and newer). Several tokens:
    the GEMMs and the combine each starting while the launch before them
    runs, all of them or the GEMMs only, each also with block_ready (the down
    GEMM starting on each expert block as soon as the gate/up GEMM has
    finished it). One token in 8-token blocks, where the down GEMM does not
    already prefetch through its rings: its register path launched dependent
    on the gate/up GEMM, asking L2 for none or one of its first K steps first
    (pdl). On the H200 each of these paid somewhere."""
    if batch == 1 and cfg["gate_up"].get("NT", 1) == 1:
        if cfg["down"].get("bulk"):
            return [cfg]
        return [cfg] + [{**cfg, "down": {**cfg["down"], "pdl": steps}} for steps in (0, 1)]
    deps = [{**cfg, "dependent_launches": dep} for dep in (True, ["gate_up", "down"])]
    return [cfg] + deps + [{**d, "block_ready": True} for d in deps if not d["down"].get("bulk")]


def _fastest(case, dev, do_bench, key, trials, what):
    """The fastest of `trials` (the first is the incumbent, so one always
    runs), printed with its time."""
    timings = [(t, trial) for trial in trials
               if (t := _time_trial(case, dev, do_bench, key, trial, f"{what} {trial}")) is not None]
    best_t, best = min(timings, key=lambda t: t[0])
    print(f"# tune {case.name} {what}: {best_t * 1e3:.1f} us {best}", file=sys.stderr)
    return best


def _tune(case, dev, do_bench):
    """Per kernel family: fastest gate_up (with the family's first down), then
    fastest down; the faster family wins. Batch 1 then tries the one-token
    grids (one_token_trials), then the register cap (register_cap_trials);
    every batch then the shared-memory rings (ring_trials), several tokens the
    epilogue's exchange (exchange_trials), and last the dependent launches
    (dependent_trials)."""
    from . import moe_cases as M
    from .models import MODELS

    model = next(m for m in MODELS if m.name == case.group)
    key = (model.fmt, case.batch)
    winners = []
    for fam, (gus, downs) in M.TUNE_FAMILIES.items():
        best = {"gate_up": gus[0], "down": downs[0]}
        best_t = None
        for kernel, cands in (("gate_up", gus), ("down", downs)):
            timings = []
            for cand in cands:
                t = _time_trial(case, dev, do_bench, key, {**best, kernel: cand}, f"{kernel} {cand}")
                if t is not None:
                    timings.append((t, cand))
            if timings:
                best_t, best[kernel] = min(timings, key=lambda t: t[0])
        if best_t is not None:
            print(f"# tune {case.name} {fam}: {best_t * 1e3:.1f} us {best}", file=sys.stderr)
            winners.append((best_t, best))
    best = min(winners, key=lambda t: t[0])[1]
    if case.batch == 1 and best["gate_up"].get("NT", 1) == 1:
        best = _fastest(case, dev, do_bench, key, one_token_trials(best, model.top_k), "one-token grid")
        for kernel in ("gate_up", "down"):
            best = _fastest(case, dev, do_bench, key, register_cap_trials(best, kernel), f"{kernel} register cap")
    for kernel in ("gate_up", "down"):
        best = _fastest(case, dev, do_bench, key, ring_trials(best, kernel, case.batch), f"{kernel} ring")
    best = _fastest(case, dev, do_bench, key, exchange_trials(best, case.batch), "exchange")
    best = _fastest(case, dev, do_bench, key, dependent_trials(best, case.batch), "dependent launches")
    M._BENCH_CONFIG_OVERRIDE[key] = best
    return best


def write_tuned(path, tuned, device_name):
    from .models import MODELS

    data = {"_comment": f"{device_name}: fastest of the bench --tune candidates per batch (in-stream time: calls back to back in a CUDA graph over input sets twice the L2)."}
    for (group, batch), cfg in sorted(tuned.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        fmt = next(m.fmt for m in MODELS if m.name == group)
        data.setdefault(fmt, {})[str(batch)] = cfg
    # larger batches (prefill): the default's tensor-core tiles, not tuned here
    from .configs import load_file

    for fmt in list(data):
        if not fmt.startswith("_"):
            data[fmt]["1048576"] = load_file("default.json")[fmt]["1048576"]
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sm120_kernels.bench")
    ap.add_argument("--plot", default="sm120_kernels_bench.png")
    ap.add_argument("--json", help="also write the JSON here")
    ap.add_argument("-k", dest="filter")
    ap.add_argument("--no-ref", action="store_true", help="skip timing the torch reference")
    ap.add_argument("--peer", nargs="?", const="", metavar="SGLANG_DIR",
                    help="also time SGLang's own MoE kernel for these weights on the same inputs "
                    "(from the installed SGLang, or the sglang package directory given)")
    ap.add_argument("--tune", metavar="PATH",
                    help="time the candidate configs per case, use the fastest, write them as a config file")
    args = ap.parse_args(argv)

    import torch
    from triton.testing import do_bench

    from . import __version__
    from .registry import bench_cases

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    bw = copy_bandwidth(dev)
    rows = []
    tuned = {}
    pkg = None
    if args.peer is not None:
        from . import peer

        pkg = peer.sglang_dir(args.peer)
    for case in bench_cases():
        if args.filter and args.filter not in case.name:
            continue
        if args.tune and case.name.startswith("moe_w4a16"):
            tuned[(case.group, case.batch)] = _tune(case, dev, do_bench)
        spec = case.make(dev)
        row = {"case": case.name, "group": case.group, "batch": case.batch, **bench_figures(spec, bw)}
        t = row["time_us"]
        row.update({k: v for k, v in spec.extra.items() if not k.startswith("_")})
        judged = row.get("stream_us", t)
        if spec.ref_fn is not None and not args.no_ref:
            tr = do_bench(spec.ref_fn, warmup=1, rep=300, return_mode="median") * 1e3
            row["ref_time_us"] = round(tr, 1)
            row["speedup"] = round(tr / t, 1)
        if pkg is not None and "_peer" in spec.extra:
            row["peers"] = peer_figures(spec, judged, pkg)
            for pname, fig in row["peers"].items():
                if pname != "ours":
                    print(f"# {case.name} {pname}: " + (fig["error"] if "error" in fig else
                          f"in stream {fig['stream_us']:.1f} us, ours x{fig['speedup']} faster ({fig['check']})"),
                          file=sys.stderr, flush=True)
        fraction = spec.extra.get("_target_fraction", TARGET_FRACTION)
        if case.batch == 1 and case.name.startswith("moe_w4a16"):
            row["target"] = f"< {TARGET_BATCH1_US} us"
            row["meets_target"] = judged < TARGET_BATCH1_US
        elif case.batch > 1 or "_target_fraction" in spec.extra:
            row.setdefault("target", f">= {fraction:.0%} of copy bandwidth")
            row["meets_target"] = spec.bytes / (judged * 1e-6) / bw >= fraction
        rows.append(row)
        print(f"# {case.name}: {t:.1f} us ({row['bw_fraction']:.0%} of copy bw)"
              + (f"; in stream {row['stream_us']:.1f} us ({row['stream_bw_fraction']:.0%})" if "stream_us" in row else "")
              + (f", ref {row['ref_time_us']:.0f} us, x{row['speedup']}" if "speedup" in row else ""),
              file=sys.stderr, flush=True)
        del spec
    result = {"version": __version__, "device": name, "torch": torch.__version__,
              "triton": __import__("triton").__version__, "copy_bandwidth_GBps": round(bw / 1e9, 1),
              "method": "medians; time_us: one call per CUDA-graph replay, L2 cleared before each; "
              "stream_us: calls back to back in one graph over input sets twice the L2, per call",
              "results": rows}
    if pkg is not None:
        result["peer"] = f"SGLang {peer.sglang_version(pkg)}: {peer.KERNEL_FILE}"
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    if args.tune and tuned:
        write_tuned(args.tune, tuned, name)
        print(f"# tuned configs: {args.tune}", file=sys.stderr)
    if rows and args.plot:
        plot(rows, args.plot, name, bw)
        print(f"# plot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
