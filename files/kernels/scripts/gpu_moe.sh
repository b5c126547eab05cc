#!/usr/bin/env bash
# MoE decode work on the lent GPU: self-test, per-kernel profile, bench (--tune when TUNE=1).
# Run from the repository root; results under $OUT.
set -uo pipefail
cd files/kernels
export PYTHONPATH=$PWD/src:$PWD/tests SM120_TEST_SITE=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'
python3 -m sm120_kernels.selftest -k moe_w4a16 --json "$OUT/selftest.json" 2>&1 | tail -12
[ "${PROFILE:-1}" = 1 ] && python3 scripts/moe_profile.py 1 8 64 2>&1 | tee "$OUT/profile.txt"
tune=()
[ "${TUNE:-0}" = 1 ] && tune=(--tune "$OUT/NVIDIA_H200.json")
python3 -m sm120_kernels.bench -k moe_w4a16 --no-ref "${tune[@]}" --json "$OUT/bench.json" --plot "$OUT/bench.png" 2> "$OUT/bench.err" > /dev/null
grep -v '^# tune' "$OUT/bench.err" | tail -30
grep '^# tune' "$OUT/bench.err" | cut -c1-200
