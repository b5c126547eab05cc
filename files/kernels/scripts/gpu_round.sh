#!/usr/bin/env bash
# One lent-GPU call: indexer launch sweep (the fastest correct configs written
# into the H200 config of the copy on the device), the DeepSeek-V4 and MoE GPU
# tests, and the benches. Run from the repository root; results under $OUT.
set -uo pipefail
cd files/kernels
export PYTHONPATH=$PWD/src:$PWD/tests SM120_TEST_SITE=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'
# 1. indexer: candidates checked and timed; the fastest correct ones written into the H200 config
timeout 100 python3 scripts/indexer_sweep.py --json "$OUT/sweep.json" \
    --write src/sm120_kernels/configs/indexer-NVIDIA_H200.json > "$OUT/sweep.log" 2>&1
grep -v '^{' "$OUT/sweep.log" | tail -20
cp src/sm120_kernels/configs/indexer-NVIDIA_H200.json "$OUT/"
# 2. GPU tests (indexer and mHC with that config; MoE, routing and alignment)
timeout 80 python3 -m pytest -q -m gpu tests/test_indexer.py tests/test_mhc.py -p no:cacheprovider 2>&1 | tail -4
timeout 120 python3 -m pytest -q -rf tests/test_gpu.py -p no:cacheprovider 2>&1 | tail -6
# 3. benches (no torch reference timings: device time)
timeout 45 python3 -m sm120_kernels.bench -k dsv4 --no-ref --json "$OUT/bench_dsv4.json" --plot "" \
    2>> "$OUT/bench.log" > /dev/null
timeout 35 python3 -m sm120_kernels.bench -k moe_w4a16 --no-ref --json "$OUT/bench_moe.json" --plot "" \
    2>> "$OUT/bench.log" > /dev/null
cat "$OUT/bench.log"
grep -h copy_bandwidth "$OUT"/bench_*.json
