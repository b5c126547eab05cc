#!/usr/bin/env bash
# One lent-GPU call: the indexer sweep (one wave, even page splits; the fastest
# correct config in stream written into the device copy's H200 config), then
# the DeepSeek-V4 and MoE benches with both timings (single call, in stream);
# the MoE bench re-tunes the fragment kernel's launch shapes on the in-stream
# time. Run from the repository root; results under $OUT.
set -uo pipefail
cd files/kernels
export PYTHONPATH=$PWD/src:$PWD/tests SM120_TEST_SITE=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'
timeout 170 python3 scripts/indexer_sweep.py --json "$OUT/sweep.json" \
    --write src/sm120_kernels/configs/indexer-NVIDIA_H200.json > "$OUT/sweep.log" 2>&1
grep -v '^{' "$OUT/sweep.log" | tail -24
cp src/sm120_kernels/configs/indexer-NVIDIA_H200.json "$OUT/"
timeout 150 python3 -m sm120_kernels.bench -k dsv4 --no-ref --json "$OUT/bench_dsv4.json" --plot "$OUT/bench_dsv4.png" \
    2> "$OUT/bench_dsv4.log" > /dev/null
cat "$OUT/bench_dsv4.log"
timeout 240 python3 -m sm120_kernels.bench -k moe_w4a16 --no-ref --tune "$OUT/NVIDIA_H200.json" \
    --json "$OUT/bench_moe.json" --plot "$OUT/bench_moe.png" 2> "$OUT/bench_moe.log" > /dev/null
grep -v '^# tune' "$OUT/bench_moe.log" | tail -12
grep '^# tune' "$OUT/bench_moe.log" | cut -c1-200 > "$OUT/tune.txt"
