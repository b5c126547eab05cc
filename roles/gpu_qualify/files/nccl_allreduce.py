#!/usr/bin/env python3
"""Short NCCL all-reduce over this host's GPUs, one process per GPU; prints one JSON line.

Run by the gpu_qualify role with the release venv's Python (torch and its NCCL), once with
NCCL_P2P_DISABLE=0 and once with =1, under coreutils `timeout` as the outer bound. The
script also bounds itself (--timeout): a run whose ranks do not finish in time is reported
as {"status": "timeout"} and its processes are killed, which the role counts as P2P broken.

Bus bandwidth as nccl-tests computes it for all-reduce: algbw = bytes / time,
busbw = algbw * 2 (n - 1) / n. With one GPU there is no inter-GPU traffic: busbw is 0 and
the JSON says so (world_size 1).

Output (stdout, last line): {"status": "ok"|"timeout"|"error", "world_size": n,
 "p2p_disable": "0"|"1"|None, "torch": ..., "nccl": ..., "devices": [...],
 "results": [{"bytes": B, "time_us": t, "algbw_gbs": a, "busbw_gbs": b, "correct": bool}],
 "error": "..."}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MIB = 1 << 20


def parse_sizes(text):
    """'1M,16M,256M' or '1048576,...' -> sorted byte counts."""
    sizes = []
    for item in str(text).split(","):
        item = item.strip().upper()
        if not item:
            continue
        factor = {"K": 1 << 10, "M": MIB, "G": 1 << 30}.get(item[-1], 1)
        number = item[:-1] if item[-1] in "KMG" else item
        sizes.append(int(float(number) * factor))
    if not sizes or min(sizes) < 4:
        raise ValueError(f"--sizes {text!r}: give byte sizes of 4 bytes or more, e.g. 1M,16M,256M")
    return sorted(set(sizes))


def bus_bandwidth(nbytes, seconds, world_size):
    """(algbw, busbw) in GB/s (10^9 bytes), nccl-tests' all-reduce definition."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * 2 * (world_size - 1) / world_size if world_size > 0 else 0.0


def _worker(rank, world_size, port, sizes, warmup, iters, queue):
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, device_id=torch.device("cuda", rank))
        rows = []
        for nbytes in sizes:
            count = max(1, nbytes // 4)
            # Non-zero data (rank + 1), checked after the timed loop: a result that is
            # fast and wrong is no result.
            buf = torch.full((count,), float(rank + 1), dtype=torch.float32, device="cuda")
            for _ in range(warmup):
                dist.all_reduce(buf)
            torch.cuda.synchronize()
            buf.fill_(float(rank + 1))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dist.barrier()
            start.record()
            for _ in range(iters):
                dist.all_reduce(buf)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / iters
            # After `iters` sums of a vector holding s = n(n+1)/2: s * n^(iters-1).
            expected = world_size * (world_size + 1) / 2 * world_size ** (iters - 1)
            correct = bool(torch.allclose(buf[:16], torch.full_like(buf[:16], expected), rtol=1e-5))
            times = torch.tensor([seconds], device="cuda")
            # The slowest rank's time is the collective's time.
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            algbw, busbw = bus_bandwidth(count * 4, times.item(), world_size)
            # One rank: NCCL's in-place all-reduce moves no data, the time is launch overhead.
            rows.append({"bytes": count * 4, "time_us": round(times.item() * 1e6, 2),
                         "algbw_gbs": round(algbw, 3) if world_size > 1 else None,
                         "busbw_gbs": round(busbw, 3), "correct": correct})
            del buf
        dist.destroy_process_group()
        if rank == 0:
            queue.put({"results": rows})
    except Exception as exc:  # noqa: BLE001 - reported as JSON, the role decides
        queue.put({"error": f"rank {rank}: {type(exc).__name__}: {exc}"})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,16M,256M", help="message sizes (K/M/G suffixes)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole run")
    parser.add_argument("--port", type=int, default=29577, help="rendezvous port on 127.0.0.1")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to use (0: all visible)")
    args = parser.parse_args(argv)
    report = {"status": "error", "world_size": 0, "p2p_disable": os.environ.get("NCCL_P2P_DISABLE"),
              "sizes": [], "results": []}
    try:
        report["sizes"] = parse_sizes(args.sizes)
        import torch
        import torch.multiprocessing as mp

        report["torch"] = torch.__version__
        report["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version()) if torch.cuda.is_available() else None
        visible = torch.cuda.device_count()
        world_size = min(visible, args.gpus) if args.gpus > 0 else visible
        report["world_size"] = world_size
        if world_size == 0:
            report["error"] = "torch sees no CUDA device (CUDA_VISIBLE_DEVICES, driver)"
            print(json.dumps(report))
            return 2
        report["devices"] = [torch.cuda.get_device_name(i) for i in range(world_size)]
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        started = time.monotonic()
        procs = mp.start_processes(_worker, args=(world_size, args.port, report["sizes"], args.warmup,
                                                  args.iters, queue),
                                   nprocs=world_size, join=False, start_method="spawn")
        deadline = started + args.timeout
        while True:
            try:
                if procs.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                    break
            except Exception as exc:  # noqa: BLE001 - a rank died (signal, exit code)
                for proc in procs.processes:
                    if proc.is_alive():
                        proc.kill()
                report["error"] = f"a rank exited: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
                print(json.dumps(report))
                return 4
            if time.monotonic() >= deadline:
                for proc in procs.processes:
                    if proc.is_alive():
                        proc.kill()
                report.update(status="timeout",
                              error=f"the all-reduce did not finish in {args.timeout:g} s (counted as hung)")
                print(json.dumps(report))
                return 3
        report["seconds"] = round(time.monotonic() - started, 2)
        messages = []
        while not queue.empty():
            messages.append(queue.get())
        errors = [m["error"] for m in messages if "error" in m]
        results = next((m["results"] for m in messages if "results" in m), [])
        report["results"] = results
        if errors or not results:
            report["error"] = "; ".join(errors) or "rank 0 reported nothing"
            print(json.dumps(report))
            return 4
        if not all(row["correct"] for row in results):
            report["error"] = "the all-reduce returned wrong sums"
            print(json.dumps(report))
            return 5
        report["status"] = "ok"
        if world_size == 1:
            report["note"] = "one GPU: no GPU-to-GPU traffic; only the NCCL path and the sums were checked"
        print(json.dumps(report))
        return 0
    except Exception as exc:  # noqa: BLE001 - the role reads the JSON, never a traceback
        report["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(report))
        return 1


if __name__ == "__main__":
    sys.exit(main())
