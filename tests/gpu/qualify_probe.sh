#!/usr/bin/env bash
# Tier 6 (GPU machine, not CI): the gpu_qualify probe's GPU part for real. Captures the
# nvidia-smi outputs the role reads and runs the all-reduce script with P2P on and off,
# plus a deliberately too-short timeout (the hang path). Writes everything under $1.
set -u
out=${1:?usage: qualify_probe.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/../.." && pwd)
script=$here/roles/gpu_qualify/files/nccl_allreduce.py
fields=index,pci.bus_id,name,pcie.link.gen.gpucurrent,pcie.link.gen.max,pcie.link.gen.gpumax,pcie.link.gen.hostmax,pcie.link.width.current,pcie.link.width.max
nvidia-smi --query-gpu=$fields --format=csv,nounits >"$out/pcie.csv" 2>&1; echo "pcie query rc=$?"
nvidia-smi topo -p2p r >"$out/p2p-r.txt" 2>&1; echo "p2p r rc=$?"
nvidia-smi topo -p2p w >"$out/p2p-w.txt" 2>&1; echo "p2p w rc=$?"
nvidia-smi topo -m >"$out/topo.txt" 2>&1; echo "topo -m rc=$?"
nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader >"$out/compute-apps.csv" 2>&1; echo "apps rc=$?"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
for p2p in 0 1; do
  start=$(date +%s%N)
  NCCL_P2P_DISABLE=$p2p timeout -k 10 120 "$py" "$script" --sizes 1M,4M,16M,64M,256M --timeout 100 \
    >"$out/allreduce-p2p-$p2p.json" 2>"$out/allreduce-p2p-$p2p.err"
  echo "allreduce P2P_DISABLE=$p2p rc=$? wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))"
done
NCCL_P2P_DISABLE=0 timeout -k 10 60 "$py" "$script" --sizes 1M --timeout 0.5 >"$out/allreduce-timeout.json" 2>/dev/null
echo "allreduce with a 0.5 s bound rc=$?"
for f in "$out"/*.csv "$out"/*.txt "$out"/*.json; do echo "== $(basename "$f")"; head -c 1500 "$f"; echo; done
