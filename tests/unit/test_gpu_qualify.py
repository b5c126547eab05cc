"""gpu_qualify: PCIe and P2P parsing, the all-reduce summary and the NCCL P2P decision,
against recorded output (fixtures/gpu_qualify: H100 captures and written 8-GPU files)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu_qualify"
SCRIPT = REPO / "roles" / "gpu_qualify" / "files" / "nccl_allreduce.py"
gq = load("gpu_qualify", REPO / "roles" / "gpu_qualify" / "filter_plugins" / "gpu_qualify.py")
script = load("nccl_allreduce", SCRIPT)

HOST = "gpu-node-1"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def summary(name: str, rc: int = 0) -> dict:
    return gq.allreduce_summary(text(name), rc)


ON, OFF = "8x-allreduce-p2p-0.json", "8x-allreduce-p2p-1.json"


# --- nvidia-smi topo -p2p ---------------------------------------------------------------

def test_p2p_matrix_of_a_two_socket_pcie_box():
    p2p = gq.parse_p2p(text("8x-rtx-pro-6000-p2p-r.txt"))
    assert p2p["devices"] == [f"GPU{i}" for i in range(8)]
    assert p2p["matrix"]["GPU0"]["GPU1"] == "OK"
    assert p2p["matrix"]["GPU0"]["GPU4"] == "CNS"
    assert p2p["matrix"]["GPU2"]["GPU3"] == "NS" and p2p["matrix"]["GPU3"]["GPU2"] == "NS"
    assert "GPU0" not in p2p["matrix"]["GPU0"]
    # 28 pairs: 16 across sockets, 1 NS, 11 OK within the sockets.
    assert p2p["counts"] == {"OK": 11, "CNS": 16, "NS": 1}
    assert p2p["all_ok"] is False


def test_p2p_matrix_all_ok():
    p2p = gq.parse_p2p(text("8x-rtx-pro-6000-p2p-r-all-ok.txt"))
    assert p2p["counts"] == {"OK": 28} and p2p["all_ok"] is True


def test_p2p_matrix_captured_on_one_h100_with_terminal_escapes():
    raw = text("h100-1gpu-p2p-r.txt")
    assert "\x1b[4m" in raw
    p2p = gq.parse_p2p(raw)
    assert p2p == {"devices": ["GPU0"], "matrix": {"GPU0": {}}, "counts": {}, "all_ok": True}


def test_p2p_pair_counts_take_the_worse_direction():
    raw = text("8x-rtx-pro-6000-p2p-r-all-ok.txt").replace(" GPU1\tOK\tX", " GPU1\tTNS\tX", 1)
    p2p = gq.parse_p2p(raw)
    assert p2p["matrix"]["GPU1"]["GPU0"] == "TNS" and p2p["matrix"]["GPU0"]["GPU1"] == "OK"
    assert p2p["counts"] == {"OK": 27, "TNS": 1}


@pytest.mark.parametrize("bad, message", [
    ("", "no P2P matrix header"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", "cannot talk to the driver"),
    (" \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n".replace("OK\t\n GPU1", "MAYBE\t\n GPU1"), "unknown P2P state 'MAYBE'"),
    (" \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n", "rows"),
])
def test_p2p_bad_output_is_refused(bad, message):
    with pytest.raises(gq.GpuQualifyParseError, match=re.escape(message)):
        gq.parse_p2p(bad)


# --- PCIe link query --------------------------------------------------------------------

def test_pcie_query_of_the_reference_host_at_rest():
    gpus = gq.parse_pcie(text("8x-rtx-pro-6000-pcie.csv"))
    assert len(gpus) == 8 and set(gpus[0]) == set(gq.PCIE_FIELDS)
    assert gpus[0]["pcie.link.gen.gpucurrent"] == 1 and gpus[0]["pcie.link.gen.max"] == 5
    assert gpus[7]["pcie.link.width.max"] == 16
    # An idle GPU trains its link down: that is no warning.
    assert gq.pcie_warnings(gpus, HOST) == []


def test_pcie_query_captured_on_an_h100_with_na():
    gpus = gq.parse_pcie(text("h100-1gpu-pcie.csv"))
    assert gpus == [{"index": 0, "pci.bus_id": "00000000:00:06.0", "name": "NVIDIA H100 80GB HBM3",
                     "pcie.link.gen.gpucurrent": 5, "pcie.link.gen.max": 5, "pcie.link.gen.gpumax": 5,
                     "pcie.link.gen.hostmax": None, "pcie.link.width.current": 16, "pcie.link.width.max": 16}]


def test_narrow_and_slow_slots_are_named():
    warnings = gq.pcie_warnings(gq.parse_pcie(text("8x-rtx-pro-6000-pcie-x8-slot.csv")), HOST)
    assert len(warnings) == 2
    assert warnings[0].startswith("gpu-node-1: GPU 5 (00000000:B8:00.0): PCIe Gen4 at most on this slot")
    assert warnings[1].startswith("gpu-node-1: GPU 6 (00000000:C8:00.0): PCIe link x8, the GPU supports x16. Fix:")


def test_pcie_query_with_a_short_line_is_refused():
    with pytest.raises(gq.GpuQualifyParseError, match="line 2 has 2 fields"):
        gq.parse_pcie("index, pci.bus_id, name\n0, 00000000:16:00.0\n")


# --- all-reduce runs --------------------------------------------------------------------

def test_bus_bandwidth_is_nccl_tests_definition():
    algbw, busbw = gq.bus_bandwidth(256 << 20, 0.01, 8)
    assert algbw == pytest.approx(26.8435456)
    assert busbw == pytest.approx(algbw * 14 / 8)
    assert gq.bus_bandwidth(1 << 20, 0.001, 1)[1] == 0.0
    assert script.bus_bandwidth(256 << 20, 0.01, 8) == gq.bus_bandwidth(256 << 20, 0.01, 8)


def test_allreduce_summaries():
    assert summary(ON)["status"] == "ok" and summary(ON)["results"][-1]["busbw_gbs"] == 39.6
    hung = summary("8x-allreduce-p2p-0-hung.json", rc=3)
    assert hung["status"] == "hung" and "counted as hung" in hung["error"]
    # coreutils timeout killed it before it printed anything
    assert gq.allreduce_summary("", 124)["status"] == "hung"
    assert gq.allreduce_summary("Traceback ...", 1)["status"] == "failed"
    assert gq.allreduce_summary("", None)["status"] == "not_run"
    wrong = json.dumps({"status": "error", "error": "the all-reduce returned wrong sums", "results": []})
    assert gq.allreduce_summary(wrong, 5) == {**gq.allreduce_summary(wrong, 5), "status": "failed",
                                              "error": "the all-reduce returned wrong sums"}


def test_allreduce_captured_on_one_h100():
    run = summary("h100-1gpu-allreduce-p2p-0.json")
    assert run["status"] == "ok" and run["world_size"] == 1 and run["nccl"] == "2.28.9"
    assert [row["bytes"] for row in run["results"]] == [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
    assert all(row["busbw_gbs"] == 0.0 and row["correct"] for row in run["results"])
    assert summary("h100-1gpu-allreduce-timeout.json", rc=3)["status"] == "hung"


def test_script_sizes_parse():
    assert script.parse_sizes("1M,256M,4K") == [4096, 1 << 20, 256 << 20]
    with pytest.raises(ValueError, match="--sizes"):
        script.parse_sizes("")


def test_script_without_torch_prints_json_and_fails():
    proc = subprocess.run([sys.executable, "-S", str(SCRIPT), "--sizes", "1M"], capture_output=True,
                          text=True, timeout=60, check=False)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 1 and report["status"] == "error"
    assert gq.allreduce_summary(proc.stdout, proc.returncode)["status"] == "failed"


# --- the decision -----------------------------------------------------------------------

def decide(on, off, gpus=8, **kwargs):
    return gq.p2p_decision(HOST, gpus, on, off, **kwargs)


def test_p2p_faster_turns_it_on():
    decision = decide(summary(ON), summary(OFF))
    assert decision["p2p"] == "enabled" and decision["env"] == {"NCCL_P2P_DISABLE": "0"}
    assert decision["source"] == "measured" and decision["problems"] == []
    assert decision["reason"] == "P2P faster: 39.6 GB/s with P2P, 21.3 without, at 256 MiB"


def test_p2p_hung_turns_it_off():
    decision = decide(summary("8x-allreduce-p2p-0-hung.json", rc=3), summary(OFF))
    assert decision["p2p"] == "disabled" and decision["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert decision["reason"].startswith("the all-reduce with P2P on hung")


def test_p2p_failed_turns_it_off():
    decision = decide(gq.allreduce_summary("", 1), summary(OFF))
    assert decision["env"] == {"NCCL_P2P_DISABLE": "1"} and "P2P on failed" in decision["reason"]


def test_p2p_not_faster_by_the_margin_stays_off():
    off = summary(OFF)
    on = json.loads(json.dumps(off))
    on["results"][-1]["busbw_gbs"] = off["results"][-1]["busbw_gbs"] * 1.03
    decision = decide(on, off)
    assert decision["env"] == {"NCCL_P2P_DISABLE": "1"} and decision["reason"].startswith("P2P not faster by 5%")
    assert decide(on, off, min_gain=0.02)["env"] == {"NCCL_P2P_DISABLE": "0"}


def test_p2p_off_broken_but_on_works_turns_it_on():
    assert decide(summary(ON), gq.allreduce_summary("", 124))["env"] == {"NCCL_P2P_DISABLE": "0"}


def test_both_broken_is_a_problem_naming_host_variable_and_fix():
    decision = decide(gq.allreduce_summary("", 124), gq.allreduce_summary("", 1))
    assert decision["env"] == {"NCCL_P2P_DISABLE": "1"}
    (problem,) = decision["problems"]
    assert problem.startswith("gpu-node-1: the NCCL all-reduce over 8 GPUs failed with P2P on (hung")
    assert "Fix:" in problem and "gpu_qualify_nccl_p2p" in problem


@pytest.mark.parametrize("forced, value", [("enabled", "0"), ("disabled", "1")])
def test_operator_forced_value_wins_over_any_measurement(forced, value):
    for on in (summary(ON), summary("8x-allreduce-p2p-0-hung.json", rc=3), gq.allreduce_summary("", None)):
        decision = decide(on, summary(OFF), forced=forced)
        assert decision["env"] == {"NCCL_P2P_DISABLE": value} and decision["source"] == "forced"


def test_bad_forced_value_is_a_problem():
    (problem,) = decide(summary(ON), summary(OFF), forced="yes")["problems"]
    assert problem == "gpu-node-1: gpu_qualify_nccl_p2p is 'yes'. Fix: use auto, enabled or disabled."


def test_single_gpu_changes_nothing():
    one = summary("h100-1gpu-allreduce-p2p-0.json")
    decision = decide(one, summary("h100-1gpu-allreduce-p2p-1.json"), gpus=1)
    assert decision["env"] == {} and decision["source"] == "single-gpu" and decision["p2p"] == "unchanged"


def test_unmeasured_keeps_the_field_workaround():
    decision = decide(gq.allreduce_summary("", None), gq.allreduce_summary("", None))
    assert decision["env"] == {"NCCL_P2P_DISABLE": "1"} and decision["source"] == "unmeasured"


def test_key_ignores_the_idle_link_state():
    rest = gq.identity(gq.parse_pcie(text("8x-rtx-pro-6000-pcie.csv")))
    busy = gq.identity(gq.parse_pcie(text("8x-rtx-pro-6000-pcie.csv").replace(", 1, 5, 5, 5,", ", 5, 5, 5, 5,")))
    assert gq.qualify_key(rest, "x") == gq.qualify_key(busy, "x")
    slot = gq.identity(gq.parse_pcie(text("8x-rtx-pro-6000-pcie-x8-slot.csv")))
    assert gq.qualify_key(rest, "x") != gq.qualify_key(slot, "x")


# --- the release's engine environment ---------------------------------------------------

release = load("sglang_release", REPO / "roles" / "sglang_release" / "filter_plugins" / "sglang_release.py")
ENGINE = {"name": "prefill-0", "mode": "prefill", "gpus": [0, 1, 2, 3]}


def test_measured_env_applies_under_the_operators():
    measured = {"NCCL_P2P_DISABLE": "0"}
    assert release.engine_env(ENGINE, {}, {}, measured_env=measured)["NCCL_P2P_DISABLE"] == "0"
    for recipe, host_env, engine in (({"env": {"NCCL_P2P_DISABLE": "1"}}, {}, ENGINE),
                                     ({}, {"NCCL_P2P_DISABLE": "1"}, ENGINE),
                                     ({}, {}, {**ENGINE, "env": {"NCCL_P2P_DISABLE": "1"}})):
        assert release.engine_env(engine, recipe, host_env, measured_env=measured)["NCCL_P2P_DISABLE"] == "1"
    assert "NCCL_P2P_DISABLE" not in release.engine_env(ENGINE, {}, {})


def test_shipped_recipes_leave_nccl_p2p_to_the_measurement():
    import yaml

    recipes = yaml.safe_load((REPO / "defaults" / "models.yml").read_text())["sglang_shipped_recipes"]
    for name, recipe in recipes.items():
        assert "NCCL_P2P_DISABLE" not in (recipe.get("env") or {}), name


def test_measured_env_skips_one_gpu_engines():
    one = {"name": "decode-0", "mode": "decode", "gpus": [4]}
    assert "NCCL_P2P_DISABLE" not in release.engine_env(one, {}, {}, measured_env={"NCCL_P2P_DISABLE": "0"})


def test_busbw_table_shows_a_hung_run_by_its_status():
    lines = gq.busbw_table(summary("8x-allreduce-p2p-0-hung.json", rc=3), summary(OFF))
    assert lines[0] == "all-reduce 1 MiB busbw: P2P on hung, P2P off 7.9 GB/s"
    assert lines[-1] == "all-reduce 256 MiB busbw: P2P on hung, P2P off 21.3 GB/s"
    assert gq.busbw_table(summary(ON), summary(OFF))[-1] == "all-reduce 256 MiB busbw: P2P on 39.6 GB/s, P2P off 21.3 GB/s"
