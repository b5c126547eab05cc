"""sglang_engine's orphaned-GPU-process killer against recorded nvidia-smi output.

The fixture: prefill-0 (GPUs 0-3) crashed and left pids 4101/4102 (still in its old
cgroup); decode-0 (GPUs 4-7) is running (5201/5202); someone's python (6001) runs on GPU 2
from a login session. Starting prefill-0 must kill 4101, 4102 and 6001, never decode-0's.
"""

from __future__ import annotations

import stat
from pathlib import Path
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu_orphans"
orphans = load("gpu_orphans", REPO / "roles" / "sglang_engine" / "files" / "sglang_gpu_orphans.py")

UNITS = {4101: "sglang-engine@prefill-0.service", 4102: "sglang-engine@prefill-0.service",
         5201: "sglang-engine@decode-0.service", 5202: "sglang-engine@decode-0.service", 6001: None}


def recorded():
    gpus = orphans.parse_gpus((FIXTURES / "query-gpu.csv").read_text())
    apps = orphans.parse_apps((FIXTURES / "compute-apps.csv").read_text())
    return gpus, apps


def test_parse():
    gpus, apps = recorded()
    assert len(gpus) == 8 and gpus["GPU-0a1b2c3d-0000-4000-8000-000000000004"] == "4"
    assert [a[0] for a in apps] == [4101, 4102, 5201, 5202, 6001]


def test_only_this_instances_gpus_are_cleaned():
    gpus, apps = recorded()
    kill, spared = orphans.select(apps, gpus, {"0", "1", "2", "3"}, "sglang-engine@prefill-0.service", UNITS.get)
    assert sorted(p for p, *_ in kill) == [4101, 4102, 6001]
    assert spared == []


def test_another_instance_is_never_killed():
    gpus, apps = recorded()
    # A misconfigured layout: prefill-0 claims GPU 4, where decode-0 runs.
    kill, spared = orphans.select(apps, gpus, {"4"}, "sglang-engine@prefill-0.service", UNITS.get)
    assert kill == []
    assert [(p, why) for p, _, _, why in spared] == [(5201, "belongs to sglang-engine@decode-0.service")]


def test_running_decode_restart_sees_only_its_own_leftovers():
    gpus, apps = recorded()
    kill, spared = orphans.select(apps, gpus, {"4", "5", "6", "7"}, "sglang-engine@decode-0.service", UNITS.get)
    assert sorted(p for p, *_ in kill) == [5201, 5202]


def test_unit_of_reads_the_cgroup(tmp_path):
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "cgroup").write_text(
        "12:devices:/system.slice/system-sglang\\x2dengine.slice/sglang-engine@decode-0.service\n"
        "0::/system.slice/system-sglang\\x2dengine.slice/sglang-engine@decode-0.service\n")
    (tmp_path / "78").mkdir()
    (tmp_path / "78" / "cgroup").write_text("0::/user.slice/user-0.slice/session-3.scope\n")
    assert orphans.unit_of(77, tmp_path) == "sglang-engine@decode-0.service"
    assert orphans.unit_of(78, tmp_path) is None
    assert orphans.unit_of(79, tmp_path) is None


def test_main_dry_run_with_a_fake_nvidia_smi(tmp_path, capsys):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n"
                    f"  --query-gpu=*) cat {FIXTURES / 'query-gpu.csv'} ;;\n"
                    f"  --query-compute-apps=*) cat {FIXTURES / 'compute-apps.csv'} ;;\nesac\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    rc = orphans.main(["--unit", "sglang-engine@prefill-0.service", "--gpus", "0,1,2,3",
                       "--nvidia-smi", str(fake), "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "pid 4101" in out and "pid 6001" in out and "would kill" in out
    assert "5201" not in out


def test_no_nvidia_smi_is_not_an_error(capsys):
    assert orphans.main(["--unit", "u.service", "--gpus", "0", "--nvidia-smi", "/nonexistent"]) == 0
    assert "no nvidia-smi" in capsys.readouterr().out
