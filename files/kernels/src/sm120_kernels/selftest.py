"""Run every kernel against its torch reference on the local GPU, at the
models' real shapes. Exit status 0 only if every case passes.

    python -m sm120_kernels.selftest [--json PATH] [--stamp PATH] [-k SUBSTRING] [--cpu]

On success it writes the stamp file the SGLang plugin requires before it hooks
anything in (default: plugin.default_stamp_path(), inside the venv).
--cpu: the MoE and routing cases on small shapes under the Triton interpreter,
for a release built on a host without a GPU; it never writes the stamp.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sm120_kernels.selftest")
    ap.add_argument("--json", help="write the results here as JSON")
    ap.add_argument("--stamp", help="stamp file to write on success (default: inside the venv)")
    ap.add_argument("--no-stamp", action="store_true")
    ap.add_argument("-k", dest="filter", help="only cases whose name contains this")
    ap.add_argument("--cpu", action="store_true",
                    help="small shapes under the Triton interpreter (no GPU; never writes the stamp)")
    args = ap.parse_args(argv)
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton is first imported

    import torch

    from . import __version__, plugin
    from .registry import selftest_cases

    if args.cpu:
        dev, name = torch.device("cpu"), "cpu (Triton interpreter)"
        print(f"# sm120_kernels {__version__} on {name}, small shapes")
    elif not torch.cuda.is_available():
        print("selftest: no CUDA device", file=sys.stderr)
        return 2
    else:
        dev = torch.device("cuda")
        name = torch.cuda.get_device_name(dev)
        print(f"# sm120_kernels {__version__} on {name} (sm_{''.join(map(str, torch.cuda.get_device_capability(dev)))})")
    results = []
    failed = 0
    for case in selftest_cases(cpu=args.cpu):
        if args.filter and args.filter not in case.name:
            continue
        t0 = time.perf_counter()
        try:
            res = case.run(dev)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            ok, detail, metrics = res.ok, res.detail, res.metrics
        except Exception as exc:
            ok, detail, metrics = False, f"{type(exc).__name__}: {exc}", {}
            traceback.print_exc()
        dt = time.perf_counter() - t0
        failed += not ok
        results.append({"case": case.name, "ok": ok, "detail": detail, "metrics": metrics, "seconds": round(dt, 3)})
        print(f"{'PASS' if ok else 'FAIL'} {case.name}: {detail} ({dt:.1f}s)", flush=True)
    summary = {"version": __version__, "device": name, "torch": torch.__version__,
               "triton": __import__("triton").__version__, "passed": len(results) - failed,
               "failed": failed, "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"# {len(results) - failed}/{len(results)} passed")
    if failed or not results:
        return 1
    if not args.no_stamp and not args.filter and not args.cpu:
        path = plugin.write_stamp(args.stamp, summary)
        print(f"# stamp written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
