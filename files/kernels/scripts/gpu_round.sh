#!/usr/bin/env bash
# One lent-GPU call: indexer launch sweep (the fastest correct configs in
# stream written into the H200 config of the copy on the device), the
# DeepSeek-V4 and MoE GPU tests, and the benches (each case single call and in
# stream). TUNE=1: the MoE bench re-tunes the fragment kernel's launch shapes
# on the in-stream time, written as $OUT/NVIDIA_H200.json. Run from the
# repository root; results under $OUT.
set -uo pipefail
cd files/kernels
export PYTHONPATH=$PWD/src:$PWD/tests SM120_TEST_SITE=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'
# 1. indexer: candidates checked and timed; the fastest correct ones written into the H200 config
timeout 170 python3 scripts/indexer_sweep.py --json "$OUT/sweep.json" \
    --write src/sm120_kernels/configs/indexer-NVIDIA_H200.json > "$OUT/sweep.log" 2>&1
grep -v '^{' "$OUT/sweep.log" | tail -24
cp src/sm120_kernels/configs/indexer-NVIDIA_H200.json "$OUT/"
# 2. GPU tests (indexer and mHC with that config; MoE, routing and alignment)
timeout 110 python3 -m pytest -q -m gpu tests/test_indexer.py tests/test_mhc.py -p no:cacheprovider 2>&1 | tail -4
timeout 150 python3 -m pytest -q -rf tests/test_gpu.py -p no:cacheprovider 2>&1 | tail -6
# 3. benches (no torch reference timings: device time)
tune=()
[ "${TUNE:-0}" = 1 ] && tune=(--tune "$OUT/NVIDIA_H200.json")
timeout 150 python3 -m sm120_kernels.bench -k dsv4 --no-ref --json "$OUT/bench_dsv4.json" --plot "$OUT/bench_dsv4.png" \
    2>> "$OUT/bench.log" > /dev/null
timeout 240 python3 -m sm120_kernels.bench -k moe_w4a16 --no-ref "${tune[@]}" --json "$OUT/bench_moe.json" \
    --plot "$OUT/bench_moe.png" 2>> "$OUT/bench.log" > /dev/null
grep -v '^# tune' "$OUT/bench.log"
grep -h copy_bandwidth "$OUT"/bench_*.json
