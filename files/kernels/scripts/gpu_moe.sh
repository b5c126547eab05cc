#!/usr/bin/env bash
# MoE work on the lent GPU in one call: the GPU tests (every MoE self-test case
# at the real shapes, the fragment kernel in every default launch shape), the
# self-test, and the bench (--tune: the fastest fragment-kernel candidates per
# batch, written as an H200 config under $OUT; SGLANG_DIR set: --peer). Run from the repository root.
set -uo pipefail
cd files/kernels
export PYTHONPATH=$PWD/src:$PWD/tests SM120_TEST_SITE=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'
timeout 240 python3 -m pytest -q -rf tests/test_gpu.py -p no:cacheprovider 2>&1 | tail -8
timeout 120 python3 -m sm120_kernels.selftest -k moe_w4a16 --json "$OUT/selftest.json" 2>&1 | tail -12
tune=()
[ "${TUNE:-1}" = 1 ] && tune=(--tune "$OUT/NVIDIA_H200.json")
# SGLANG_DIR: the pinned wheel's sglang package, or a copy of its _version.py and
# kernels/ops/moe/fused_moe_triton_kernels.py (carried to the lent GPU): adds bench --peer
peer=()
[ -n "${SGLANG_DIR:-}" ] && peer=(--peer "$SGLANG_DIR")
timeout 450 python3 -m sm120_kernels.bench -k moe_w4a16 "${tune[@]}" "${peer[@]}" --json "$OUT/bench.json" --plot "$OUT/bench.png" \
    2> "$OUT/bench.err" > /dev/null
grep -v '^# tune' "$OUT/bench.err" | tail -30
grep '^# tune' "$OUT/bench.err" | cut -c1-220 > "$OUT/tune.txt"
