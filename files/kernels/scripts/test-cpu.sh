#!/usr/bin/env bash
# CPU tier of the kernel package tests (what `make test` runs):
#   1. kernels against their torch references under the Triton interpreter;
#   2. every shipped config cross-compiled for sm_120 with the real Triton,
#      plus the SGLang plugin and packaging tests.
# GPU tests (@pytest.mark.gpu) are deselected; they run on a lent GPU.
# Usage: scripts/test-cpu.sh [PYTHON] [TIER]
#   PYTHON: default <repo>/.venv-sglang/bin/python
#   TIER:   interpreter, compiler or both (the default)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="${1:-$repo/.venv-sglang/bin/python}"
tier="${2:-both}"
case "$tier" in interpreter|compiler|both) ;; *) echo "unknown tier: $tier (interpreter, compiler or both)" >&2; exit 2;; esac
cd "$here"

# build the wheel once and test what it installs
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
wheel="$("$py" -c 'import _build_backend as b, sys; print(b.build_wheel(sys.argv[1]))' "$work/dist" | tail -n1)"
"$py" -m zipfile -e "$work/dist/$wheel" "$work/site"
export SM120_TEST_SITE="$work/site" SM120_TEST_WHEEL="$work/dist/$wheel"
echo "sm120-kernels: testing $wheel"

# The two tiers run at once, each into its own log, printed whole when both have
# ended. The interpreter tier is the longer (about 6 CPU minutes against 2), so it
# runs on two pytest-xdist workers, each taking the next test as it finishes one.
opts=(-q -p no:cacheprovider -m "not gpu" -o "addopts=" --durations=5)
rc_interp=0; rc_compiler=0
if [ "$tier" != compiler ]; then
  TRITON_INTERPRET=1 "$py" -m pytest "${opts[@]}" -n "${SM120_INTERPRETER_WORKERS:-2}" tests \
    > "$work/interpreter.log" 2>&1 &
  interp=$!
fi
if [ "$tier" != interpreter ]; then
  env -u TRITON_INTERPRET "$py" -m pytest "${opts[@]}" tests > "$work/compiler.log" 2>&1 &
  compiler=$!
fi
if [ "$tier" != compiler ]; then
  wait "$interp" || rc_interp=$?
  echo "== interpreter tier (TRITON_INTERPRET=1): exit $rc_interp"
  cat "$work/interpreter.log"
fi
if [ "$tier" != interpreter ]; then
  wait "$compiler" || rc_compiler=$?
  echo "== compiler tier (sm_120 cross-compile, plugin, packaging): exit $rc_compiler"
  cat "$work/compiler.log"
fi
[ "$rc_interp" -eq 0 ] && [ "$rc_compiler" -eq 0 ]
