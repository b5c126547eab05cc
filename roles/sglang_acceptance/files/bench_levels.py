#!/usr/bin/env python3
"""Run SGLang's serving benchmark (sglang.benchmark.serving) at several concurrency levels
in one process (its imports take most of a minute), one level after the other.

usage: bench_levels.py --workdir DIR --levels 1,8,32,64 --rounds N --api-key-file F -- <benchmark arguments>

The benchmark sends the client key in F (the gateway asks for it) as SGLang's benchmark
does with OPENAI_API_KEY, which this process sets for itself (not on a command line).

Each level sends rounds x concurrency requests (at least rounds) and writes its result to
DIR/c<level>.jsonl; DIR/progress.log gets one line per level as it ends ("concurrency N
done: ..." or "concurrency N failed: ..."), which the playbook follows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--levels", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--api-key-file", required=True, type=Path)
    ours = ap.parse_args(argv[:split])
    os.environ["OPENAI_API_KEY"] = ours.api_key_file.read_text().strip()
    bench_args = argv[split + 1:]
    ours.workdir.mkdir(parents=True, exist_ok=True)
    progress = ours.workdir / "progress.log"
    progress.write_text("")

    def say(line: str):
        with progress.open("a") as f:
            f.write(line + "\n")
        print(line, flush=True)

    try:
        from sglang.benchmark import serving  # noqa: PLC0415 - heavy, after the arguments are checked
    except Exception as exc:  # noqa: BLE001 - reported where the playbook looks
        say(f"concurrency all failed: cannot import sglang.benchmark.serving: {exc}")
        return 1

    for level in [int(x) for x in ours.levels.split(",")]:
        out = ours.workdir / f"c{level}.jsonl"
        out.unlink(missing_ok=True)
        sys.argv = ["sglang.benchmark.serving", *bench_args, "--max-concurrency", str(level),
                    "--num-prompts", str(max(level * ours.rounds, ours.rounds)), "--output-file", str(out)]
        try:
            serving.cli_main()
            result = json.loads(out.read_text().splitlines()[-1])
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported, then the run stops
            say(f"concurrency {level} failed: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            return 1
        say(f"concurrency {level} done: {result['completed']} requests, "
            f"{result['output_throughput']:.1f} output tok/s, TTFT p50 {result['median_ttft_ms']:.1f} ms "
            f"p99 {result['p99_ttft_ms']:.1f} ms, ITL p50 {result['median_itl_ms']:.1f} ms "
            f"p99 {result['p99_itl_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Skip the interpreter's teardown of SGLang's imports (torch and friends): seconds.
    os._exit(code)
