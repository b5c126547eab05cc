#!/bin/bash
# TEST DOUBLE: builds the stand-in libcuda.so.1 (libcuda_stub.c) for hosts without an
# NVIDIA driver, so that `import mooncake.engine` works there.
#
#   build.sh OUT_DIR [SITE_PACKAGES]
#
# Writes OUT_DIR/libcuda.so.1. With SITE_PACKAGES (a venv's site-packages holding the
# mooncake package), fails when the package imports a cu* symbol the stub lacks.
# Needs gcc and binutils (nm). Never install the result on a GPU host.
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR [SITE_PACKAGES]}
site=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
gcc -shared -fPIC -O1 -Wall -Werror -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" "$here/libcuda_stub.c"
if [ -n "$site" ]; then
  shopt -s nullglob
  wanted=$(for lib in "$site"/mooncake/*.so "$site"/mooncake*.libs/*; do
             nm -D --undefined-only "$lib" 2>/dev/null | awk '{print $2}'; done | sed 's/@.*//' | grep -E '^cu[A-Z]' | sort -u)
  [ -n "$wanted" ] || { echo "build.sh: no cu* symbols found under $site/mooncake (is mooncake installed there?)" >&2; exit 1; }
  have=$(nm -D --defined-only "$out/libcuda.so.1" | awk '{print $3}' | sort -u)
  missing=$(comm -23 <(echo "$wanted") <(echo "$have"))
  if [ -n "$missing" ]; then
    echo "build.sh: the mooncake package imports cu* symbols the stub lacks; add them to $here/libcuda_stub.c:" $missing >&2
    exit 1
  fi
fi
echo "$out/libcuda.so.1"
