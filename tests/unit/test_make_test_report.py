"""`make test` records each step in the test report and ends with its table, passed or
failed: run on a copy of the Makefile whose steps are stand-ins of a second or less."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repo_module import REPO

_spec = importlib.util.spec_from_file_location("ci_report_for_make", REPO / ".ci" / "report.py")
report = sys.modules["ci_report_for_make"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

# Later recipes replace the Makefile's (make warns and uses them); the prerequisites stay.
STAND_INS = r"""
stand_in = mkdir -p $(@D); $(call run_step,$(1)) true; touch $@
.cache/apt.stamp: ; @$(call stand_in,apt)
$(VENV)/.stamp: ; @$(call stand_in,venv)
$(SGLANG_VENV)/.stamp: ; @$(call stand_in,sglang-venv)
$(PROMETHEUS_BIN_DIR)/promtool: ; @$(call stand_in,prometheus-bin)
$(MONITORING_BIN_DIR)/amtool: ; @$(call stand_in,monitoring-bin)
rootfs: ; @$(call run_step,rootfs) true
test-lab: ; @$(call run_step,lab-lifecycle) sh -c 'exit $(LAB_RC)'
test-static: ; @$(call run_step,yamllint) true
test-unit test-drafts test-monitoring test-recipes test-kernels-compiler: ; @$(call run_step,$@) true
test-kernels-interpreter: ; @$(call run_step,kernels-interpreter) sleep $(INTERPRETER_S)
molecule-site/%: ; @$(call run_step,molecule/$*,lane) sleep 1
molecule-role/%: ; @$(call run_step,roles/$*,lane) sh -c 'until [ -e $(ROLE_AFTER) ]; do sleep 0.1; done; exit $(ROLE_RC)'
SITE_RUN = examples
ROLE_NAMES = grafana preflight
LAB_RC ?= 0
ROLE_RC ?= 0
ROLE_AFTER ?= /
INTERPRETER_S ?= 0.2
"""


# The background checks' session at nice 19 gets next to no CPU on a busy runner (in `make
# test` this test is itself one of them): the copy's runs at the caller's priority.
NICE_19 = ("echo 19 > /proc/self/autogroup", "exec nice -n 19 ")


@pytest.fixture
def tree(tmp_path):
    makefile = (REPO / "Makefile").read_text()
    for text in NICE_19:
        assert text in makefile
        makefile = makefile.replace(text, "true" if "autogroup" in text else "exec ")
    (tmp_path / "Makefile").write_text(makefile + STAND_INS)
    shutil.copytree(REPO / ".ci", tmp_path / ".ci", ignore=shutil.ignore_patterns("__pycache__"))
    for prerequisite in ("requirements/controller.txt", "requirements/kernels-test.txt",
                         "files/sglang/requirements.lock"):
        (tmp_path / prerequisite).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / prerequisite).touch()
    return tmp_path


def make_test(tree: Path, *variables: str) -> subprocess.CompletedProcess:
    # a clean make: not a sub-make of the `make test-unit` this may run under
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "SM120_STEP_GROUP", "SM120_REPORT_DIR")}
    return subprocess.run(["make", "--no-print-directory", "test", *variables], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)


def steps_of(tree: Path) -> dict[str, tuple[str, str]]:
    run = report.load(tree / ".cache" / "reports")
    return {s.name: (s.group, s.result) for s in run.steps}


def test_passing_run_records_every_step_and_ends_with_the_table(tree):
    result = make_test(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout.splitlines()
    assert "all tests passed" in out[-1]
    table_at = out.index(next(line for line in out if line.startswith("---- test report: ")))
    assert out[table_at + 1].split()[:3] == ["step", "where", "result"]
    assert out[-3].split()[:3] == ["wall", "time", "passed"]  # then a blank line and the banner
    assert steps_of(tree) == {
        **{name: ("first phase", "passed") for name in
           ("apt", "venv", "rootfs", "sglang-venv", "prometheus-bin", "monitoring-bin", "lab-lifecycle")},
        **{name: ("lane", "passed") for name in ("molecule/examples", "roles/grafana", "roles/preflight")},
        **{name: ("background", "passed") for name in
           ("yamllint", "test-unit", "test-drafts", "test-kernels-compiler", "test-monitoring", "test-recipes",
            "kernels-interpreter")},
    }


def test_failed_lane_stops_the_background_and_still_prints_the_table(tree):
    # the roles fail once the background checks have reached the interpreter tier
    result = make_test(tree, "ROLE_RC=1", "INTERPRETER_S=60",
                       f"ROLE_AFTER={tree}/.cache/reports/kernels-interpreter.log")
    assert result.returncode == 2
    assert "all tests passed" not in result.stdout
    assert "wall time" in result.stdout.splitlines()[-1]
    steps = steps_of(tree)
    assert steps["roles/grafana"] == ("lane", "failed")
    assert steps["kernels-interpreter"] == ("background", "stopped")


def test_failed_first_phase_prints_the_table_and_runs_no_lane(tree):
    result = make_test(tree, "LAB_RC=1")
    assert result.returncode == 2
    assert "wall time" in result.stdout.splitlines()[-1]
    steps = steps_of(tree)
    assert steps["lab-lifecycle"] == ("first phase", "failed")
    assert not any(group == "lane" for group, _ in steps.values())
