"""The GPU textfile collector (roles/gpu_exporter/files/sm120-gpu-textfile) on a recorded
kernel log and nvidia-smi dmon output: Xid counts per bus id and Xid, PCIe bytes/s per GPU,
and a valid exposition for promtool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import promlib

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCRIPT = promlib.REPO / "roles" / "gpu_exporter" / "files" / "sm120-gpu-textfile"


def run(tmp_path: Path, *args: str) -> str:
    out = tmp_path / "gpu.prom"
    subprocess.run([sys.executable, str(SCRIPT), "--output", str(out), *args], check=True)
    return out.read_text()


def test_xid_and_pcie(tmp_path):
    text = run(tmp_path, "--kernel-log", str(FIXTURES / "kernel-xid.log"), "--dmon", str(FIXTURES / "nvidia-smi-dmon.txt"))
    assert 'sm120_gpu_xid_errors_total{pci_bus_id="0000:c1:00",xid="79"} 1' in text
    assert 'sm120_gpu_xid_errors_total{pci_bus_id="0000:41:00",xid="13"} 2' in text
    assert 'sm120_gpu_pcie_rx_bytes_per_second{gpu="0"} 1843000000' in text
    assert 'sm120_gpu_pcie_tx_bytes_per_second{gpu="1"} 198000000' in text
    assert "sm120_gpu_textfile_success 1" in text
    result = subprocess.run([promlib.tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_clean_log_and_unreadable_log(tmp_path):
    clean = tmp_path / "clean.log"
    clean.write_text("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05\n")
    text = run(tmp_path, "--kernel-log", str(clean), "--dmon", "/dev/null")
    assert "sm120_gpu_xid_errors_total{" not in text and "sm120_gpu_textfile_success 1" in text
    text = run(tmp_path, "--kernel-log", str(tmp_path / "missing.log"), "--dmon", "/dev/null")
    assert "sm120_gpu_textfile_success 0" in text
