"""nvidia_driver's nvidia-smi parsing and GPU checks against recorded output (fixtures/nvidia)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia"
smi = load("nvidia_smi", REPO / "roles" / "nvidia_driver" / "filter_plugins" / "nvidia_smi.py")

HOST = "gpu-node-1"


def query(name: str) -> list[dict]:
    return smi.parse_query((FIXTURES / name).read_text())


def check(name: str, **kwargs) -> list[str]:
    args = {"expected_count": 8, "branch": "580", "compute_cap": "12.0",
            "name_pattern": "RTX PRO 6000 Blackwell"}
    args.update(kwargs)
    return smi.gpu_errors(query(name), HOST, **args)


def test_query_fields_are_what_the_role_asks_for():
    gpus = query("query-8x-rtx-pro-6000-server.csv")
    assert len(gpus) == 8
    assert [g["index"] for g in gpus] == list(range(8))
    assert set(gpus[0]) == set(smi.QUERY_FIELDS)
    assert gpus[0]["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert gpus[0]["compute_cap"] == "12.0"
    assert gpus[0]["power.limit"] == 600.0
    assert gpus[0]["memory.total"] == 97887.0
    assert gpus[7]["pci.bus_id"] == "00000000:DB:00.0"


def test_units_and_na_values_parse():
    text = ("index, name, power.limit [W], memory.total [MiB]\n"
            "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 600.00 W, 97887 MiB\n"
            "1, NVIDIA RTX PRO 6000 Blackwell Server Edition, [N/A], 97887 MiB\n")
    gpus = smi.parse_query(text)
    assert gpus[0]["power.limit"] == 600.0 and gpus[0]["memory.total"] == 97887.0
    assert gpus[1]["power.limit"] is None


@pytest.mark.parametrize("fixture", ["query-8x-rtx-pro-6000-server.csv",
                                     "query-8x-rtx-pro-6000-workstation.csv"])
def test_reference_host_passes(fixture):
    assert check(fixture) == []
    assert check(fixture, exact_version="580.95.05") == []


def test_missing_gpu_fails_with_count_message():
    errors = check("query-gpu-missing.csv")
    assert len(errors) == 1
    assert re.search(r"^gpu-node-1: nvidia_driver_gpu_count: nvidia-smi reports 7 GPU\(s\), 8 are expected "
                     r"\(found: 0@00000000:18:00\.0, .*6@00000000:BA:00\.0\)\. Fix: check that every GPU is seated",
                     errors[0])


def test_compute_capability_90_fails_per_gpu():
    errors = check("query-h100-cc90.csv", name_pattern="")
    assert len(errors) == 8
    assert errors[0] == (
        "gpu-node-1: GPU 0 (NVIDIA H100 80GB HBM3, 00000000:18:00.0): compute capability 9.0, "
        "expected 12.0 (sm_120). Fix: this deployment targets RTX PRO 6000 Blackwell (sm_120); move the "
        "host out of the group or set nvidia_driver_compute_cap for its GPUs.")


def test_name_pattern_is_checked():
    errors = check("query-h100-cc90.csv", compute_cap="")
    assert len(errors) == 8 and all("nvidia_driver_gpu_name_pattern" in e for e in errors)


def test_driver_off_the_branch_fails():
    errors = check("query-driver-570.csv")
    assert len(errors) == 8
    assert errors[3].startswith(
        "gpu-node-1: GPU 3 (NVIDIA RTX PRO 6000 Blackwell Server Edition, 00000000:5D:00.0): driver "
        "570.172.08 is loaded, not the pinned branch 580 (nvidia_driver_branch). Fix: reboot")


def test_driver_off_the_exact_pin_fails():
    errors = check("query-8x-rtx-pro-6000-server.csv", exact_version="580.105.08")
    assert len(errors) == 8
    assert "driver 580.95.05 is loaded, not the pinned version 580.105.08 (nvidia_driver_version)" in errors[0]


def test_persistence_mode_off_fails():
    errors = check("query-persistence-disabled.csv")
    assert len(errors) == 8
    assert "persistence mode is Disabled, expected Enabled. Fix: check nvidia-persistenced" in errors[0]


def test_driver_not_loaded_is_a_clear_parse_error():
    with pytest.raises(smi.NvidiaSmiParseError, match="nvidia-smi cannot talk to the driver: NVIDIA-SMI has failed"):
        smi.parse_query((FIXTURES / "smi-no-driver.txt").read_text())


def test_malformed_row_is_rejected():
    with pytest.raises(smi.NvidiaSmiParseError, match="line 2 has 2 fields, the header has 3"):
        smi.parse_query("index, name, compute_cap\n0, x\n")


def test_topology_of_the_reference_host():
    topo = smi.parse_topo((FIXTURES / "topo-8x-rtx-pro-6000.txt").read_text())
    assert topo["devices"] == [f"GPU{i}" for i in range(8)]
    assert topo["matrix"]["GPU0"]["GPU3"] == "NODE"
    assert topo["matrix"]["GPU0"]["GPU4"] == "SYS"
    assert "GPU0" not in topo["matrix"]["GPU0"]
    assert topo["links"] == {"NODE": 12, "SYS": 16}
    assert topo["nvlink"] is False
    assert topo["cpu_affinity"]["GPU5"] == "48-95,144-191"
    assert topo["numa_affinity"] == {f"GPU{i}": "0" if i < 4 else "1" for i in range(8)}


def test_topology_with_nics_and_nvlink():
    text = ("\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tNV18\tPXB\t0-31\t0\t\tN/A\n"
            "GPU1\tNV18\t X \tPXB\t0-31\t0\t\tN/A\n"
            "NIC0\tPXB\tPXB\t X \t\t\t\t\n\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n")
    topo = smi.parse_topo(text)
    assert topo["devices"] == ["GPU0", "GPU1"]
    assert topo["matrix"]["GPU0"] == {"GPU1": "NV18", "NIC0": "PXB"}
    assert topo["links"] == {"NV18": 1} and topo["nvlink"] is True


def test_topology_garbage_is_rejected():
    with pytest.raises(smi.NvidiaSmiParseError, match="no topology matrix header"):
        smi.parse_topo("nothing here\n")


def test_power_limit_plan():
    gpus = query("query-8x-rtx-pro-6000-server.csv")
    assert smi.power_limit_plan(gpus, {}, HOST) == {"changes": [], "errors": []}
    assert smi.power_limit_plan(gpus, {"all": 600}, HOST)["changes"] == []
    plan = smi.power_limit_plan(gpus, {"all": 450, 7: 500}, HOST)
    assert plan["errors"] == []
    assert [c["target"] for c in plan["changes"]] == [450.0] * 7 + [500.0]
    bad = smi.power_limit_plan(gpus, {"2": 800, 9: 400}, HOST)
    assert bad["changes"] == []
    assert bad["errors"] == [
        "gpu-node-1: nvidia_driver_power_limits: 800 W for GPU 2 (NVIDIA RTX PRO 6000 Blackwell Server "
        "Edition, 00000000:3A:00.0) is outside its range 300-600 W. Fix: choose a limit within the range.",
        "gpu-node-1: nvidia_driver_power_limits: GPU 9 does not exist on this host. Fix: use the indices "
        "nvidia-smi lists (0-7) or 'all'."]


def test_driver_matches():
    assert smi.driver_matches("580.95.05", "580")
    assert not smi.driver_matches("590.44.01", "580")
    assert smi.driver_matches("580.95.05", "580", "580.95.05")
    assert not smi.driver_matches("580.95.05", "580", "580.105.08")
