#!/usr/bin/env python3
"""Kill processes orphaned by a crashed engine instance on THIS instance's GPUs only.

    sglang-gpu-orphans --unit sglang-engine@prefill-0.service --gpus 0,1,2,3 [--grace 15] [--dry-run]

Runs as the engine unit's ExecStartPre (as root), before the engine starts. At that
moment no process of this instance should hold its GPUs, so a compute process found on
them is an orphan of a crashed instance (the reference deployment was blocked by such
zombies again and again). It is killed (SIGTERM, then SIGKILL after --grace seconds)
unless it belongs to another running systemd unit: a process of another engine instance
is never touched, whatever its GPUs (it is reported instead).

GPU indices are nvidia-smi's (PCI bus order; the units set CUDA_DEVICE_ORDER=PCI_BUS_ID so
CUDA_VISIBLE_DEVICES names the same boards). Without nvidia-smi there is nothing to check.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def parse_gpus(text: str) -> dict[str, str]:
    """`nvidia-smi --query-gpu=index,uuid --format=csv,noheader` -> {uuid: index}."""
    gpus = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            gpus[parts[1]] = parts[0]
    return gpus


def parse_apps(text: str) -> list[tuple[int, str, str]]:
    """`nvidia-smi --query-compute-apps=pid,gpu_uuid,process_name --format=csv,noheader`."""
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) >= 2 and parts[0].isdigit():
            apps.append((int(parts[0]), parts[1], parts[2] if len(parts) > 2 else ""))
    return apps


def unit_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The systemd unit (service) whose cgroup holds pid, or None."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        found = re.findall(r"/([^/]+\.service)(?:/|$)", path)
        if found:
            return found[-1]
    return None


def select(apps, gpus_by_uuid, my_gpus, my_unit, unit_lookup):
    """Returns (to_kill, spared): lists of (pid, gpu index, name, reason)."""
    to_kill, spared = [], []
    for pid, uuid, name in apps:
        index = gpus_by_uuid.get(uuid)
        if index is None or index not in my_gpus:
            continue
        unit = unit_lookup(pid)
        if unit and unit != my_unit:
            spared.append((pid, index, name, f"belongs to {unit}"))
        else:
            to_kill.append((pid, index, name, f"orphan ({unit or 'no unit'})"))
    return to_kill, spared


def nvidia_smi(binary: str, *query: str) -> str:
    return subprocess.run([binary, *query, "--format=csv,noheader"], capture_output=True, text=True,
                          check=True, timeout=60).stdout


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit", required=True)
    ap.add_argument("--gpus", required=True, help="comma-separated nvidia-smi indices")
    ap.add_argument("--grace", type=float, default=15)
    ap.add_argument("--nvidia-smi", default=shutil.which("nvidia-smi") or "")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    my_gpus = {g.strip() for g in args.gpus.split(",") if g.strip()}
    if not args.nvidia_smi or not Path(args.nvidia_smi).exists():
        print(f"{args.unit}: no nvidia-smi on this host; no GPU processes to check")
        return 0
    try:
        gpus = parse_gpus(nvidia_smi(args.nvidia_smi, "--query-gpu=index,uuid"))
        apps = parse_apps(nvidia_smi(args.nvidia_smi, "--query-compute-apps=pid,gpu_uuid,process_name"))
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"{args.unit}: nvidia-smi failed ({exc}); cannot check for orphans", file=sys.stderr)
        return 0
    to_kill, spared = select(apps, gpus, my_gpus, args.unit, unit_of)
    for pid, index, name, why in spared:
        print(f"{args.unit}: GPU {index}: pid {pid} ({name}) {why}: not killed", file=sys.stderr)
    if not to_kill:
        print(f"{args.unit}: GPUs {','.join(sorted(my_gpus))}: no orphaned processes")
        return 0
    for pid, index, name, why in to_kill:
        print(f"{args.unit}: GPU {index}: pid {pid} ({name}) is an {why}: "
              f"{'would kill' if args.dry_run else 'killing'}")
        if not args.dry_run:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    if args.dry_run:
        return 0
    deadline = time.monotonic() + args.grace
    while time.monotonic() < deadline and any(alive(p) for p, *_ in to_kill):
        time.sleep(0.5)
    for pid, *_ in to_kill:
        if alive(pid):
            print(f"{args.unit}: pid {pid} ignored SIGTERM for {args.grace:.0f} s: SIGKILL")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
