"""The test report of `make test`: .ci/step.py records steps, .ci/report.py prints their
table and writes the README's, .ci/failure_summary.py names the failed steps from it."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from repo_module import REPO

STEP = REPO / ".ci" / "step.py"
REPORT = REPO / ".ci" / "report.py"
SUMMARY = REPO / ".ci" / "failure_summary.py"
# registered before it runs: its dataclasses look their module up in sys.modules
_spec = importlib.util.spec_from_file_location("ci_report", REPORT)
report = sys.modules["ci_report"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

T0 = 1_700_000_000.0  # the fake run's start: 2023-11-14T22:13:20Z


def env_for(reports: Path) -> dict[str, str]:
    env = dict(os.environ, SM120_REPORT_DIR=str(reports))
    env.pop("SM120_STEP_GROUP", None)
    return env


def step(reports: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STEP), *args], env=env_for(reports),
                          capture_output=True, text=True, timeout=60)


def fake_step(reports: Path, name: str, group: str, result: str, offset: float, seconds: float,
              log: str = "", pytest_xml: str | None = None) -> None:
    slug = report.slug(name)
    (reports / f"{slug}.log").write_text(log)
    if pytest_xml is not None:
        (reports / "pytest").mkdir(exist_ok=True)
        (reports / "pytest" / f"{slug}.xml").write_text(pytest_xml)
    report.write_step(reports / f"{slug}.xml", report.Step(
        name=name, group=group, result=result, start=T0 + offset, seconds=seconds,
        exit_status=0 if result == "passed" else 2, log=f"{slug}.log",
        pytest=f"pytest/{slug}.xml" if pytest_xml is not None else None,
        detail="" if result == "passed" else "exit status 2", output=log[-500:] if result != "passed" else ""))


def fake_run(reports: Path, wall: float) -> None:
    reports.mkdir(parents=True, exist_ok=True)
    report._write(reports / report.RUN_FILE,
                  report._run_element(report.Run(reports, [], started=T0, wall=wall, revision="abc1234")))


PYTEST_FAILED = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="0" tests="2" time="1.0">
<testcase classname="tests.unit.test_x" name="test_ok" time="0.1" />
<testcase classname="tests.unit.test_x" name="test_rate" time="0.2">
<failure message="AssertionError: rate 0.3 above 0.2&#10;assert 0.3 &lt;= 0.2">long traceback</failure>
</testcase></testsuite></testsuites>
"""

MOLECULE_LOG = """\
INFO     grafana-debian12 ➜ converge: Executing
TASK [grafana : Start grafana-server]
fatal: [grafana-debian12]: FAILED! => {"msg": "Unable to start service grafana-server"}
PLAY RECAP
ERROR    Ansible return code was 2, command was: ansible-playbook converge.yml
TASK [Destroy the lab hosts]
ok: [localhost]
"""


def test_step_records_passed_and_failed_commands_with_their_exit_status(tmp_path):
    reports = tmp_path / "reports"
    passed = step(reports, "--group", "background", "ok-step", "--", "sh", "-c", "echo fine")
    failed = step(reports, "roles/demo", "--", "sh", "-c", "echo first; echo 'the cause' >&2; exit 3")

    assert passed.returncode == 0
    assert passed.stdout.splitlines() == ["fine", "==> ok-step passed in 0 s"]
    assert failed.returncode == 3
    assert failed.stdout.splitlines()[-1] == "==> roles/demo FAILED after 0 s"
    run = report.load(reports)
    by_name = {s.name: s for s in run.steps}
    assert (by_name["ok-step"].result, by_name["ok-step"].group) == ("passed", "background")
    demo = by_name["roles/demo"]
    assert (demo.result, demo.group, demo.exit_status, demo.detail) == ("failed", "make", 3, "exit status 3")
    assert demo.output == "first\nthe cause"
    assert (reports / demo.log).read_text() == "first\nthe cause\n"
    assert 0 <= demo.seconds < 5 and abs(demo.start - time.time()) < 60


def test_step_record_of_output_with_control_characters_stays_readable_xml(tmp_path):
    # colours, an ansible-lint hyperlink and a NUL byte: XML 1.0 cannot hold \x1b or \x00
    script = r"printf '\033[31mred\033[0m \033]8;;https://x\033\\link\033]8;;\033\\ nul\000 end\n'; exit 1"
    assert step(tmp_path, "colours", "--", "bash", "-c", script).returncode == 1
    (recorded,) = report.load(tmp_path).steps
    assert recorded.output == "red link nul end"


def test_step_failing_to_start_its_command_is_a_failed_step(tmp_path):
    result = step(tmp_path, "missing", "--", str(tmp_path / "no-such-command"))
    assert result.returncode == 127
    (recorded,) = report.load(tmp_path).steps
    assert recorded.result == "failed" and "cannot run" in recorded.output


def test_step_stopped_by_sigterm_is_recorded_as_stopped(tmp_path):
    # as `make test` stops the background checks: SIGTERM to the whole process group
    proc = subprocess.Popen([sys.executable, str(STEP), "waits", "--", "sh", "-c", "echo started; exec sleep 60"],
                            env=env_for(tmp_path), stdout=subprocess.DEVNULL, start_new_session=True)
    log = tmp_path / "waits.log"
    deadline = time.time() + 20
    while not (log.exists() and "started" in log.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=4) == 128 + signal.SIGTERM  # before the step would pass the signal on
    (recorded,) = report.load(tmp_path).steps
    assert (recorded.result, recorded.detail) == ("stopped", f"stopped by signal {int(signal.SIGTERM)}")


def test_step_names_the_junit_report_of_the_pytest_it_ran(tmp_path):
    (tmp_path / "test_demo.py").write_text("def test_pass():\n    pass\n\n"
                                           "def test_rate():\n    assert 0.3 <= 0.2, 'rate above limit'\n")
    junit = tmp_path / "reports" / "pytest" / "demo-tests.xml"
    # its own rootdir, as make test's pytest steps have the repository's: test ids and classnames follow it
    result = step(tmp_path / "reports", "demo-tests", "--", sys.executable, "-m", "pytest", "-q", "-p",
                  "no:cacheprovider", f"--rootdir={tmp_path}", str(tmp_path / "test_demo.py"), f"--junitxml={junit}")
    assert result.returncode == 1
    (recorded,) = report.load(tmp_path / "reports").steps
    assert recorded.pytest == "pytest/demo-tests.xml"

    summary = subprocess.run([sys.executable, str(SUMMARY), "--reports", str(tmp_path / "reports"),
                              str(tmp_path / "no-log")], capture_output=True, text=True, check=True).stdout
    assert "==> demo-tests FAILED after" in summary
    assert "FAILED test_demo::test_rate - AssertionError: rate above limit" in summary
    assert "test_pass" not in summary


def test_finish_prints_every_step_with_its_share_of_the_wall_time(tmp_path):
    fake_run(tmp_path, wall=0)
    fake_step(tmp_path, "yamllint", "background", "passed", offset=10, seconds=30)
    fake_step(tmp_path, "roles/grafana", "lane", "failed", offset=5, seconds=70, log=MOLECULE_LOG)
    run = report.finish(tmp_path)
    assert run.wall > 1000  # from the fake run's start to now

    fake_run(tmp_path, wall=200)
    out = subprocess.run([sys.executable, str(REPORT), "--dir", str(tmp_path), "table"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    rows = [line.split() for line in out if not line.startswith("-")]
    assert rows[1] == ["roles/grafana", "lane", "1", "failed", "5", "70", "35", "%"]
    assert rows[2] == ["yamllint", "background", "passed", "10", "30", "15", "%"]
    assert rows[3] == ["wall", "time", "failed", "200", "100", "%"]


def test_finished_run_holds_every_step_as_junit(tmp_path):
    fake_run(tmp_path, wall=0)
    fake_step(tmp_path, "unit-tests", "background", "passed", offset=1, seconds=2)
    fake_step(tmp_path, "molecule/examples", "lane", "failed", offset=3, seconds=4, log=MOLECULE_LOG)
    report.finish(tmp_path)
    root = ET.parse(tmp_path / report.RUN_FILE).getroot()
    assert (root.tag, root.get("tests"), root.get("failures")) == ("testsuites", "2", "1")
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["unit-tests"].find("failure") is None
    assert "Unable to start service" in cases["molecule/examples"].find("failure").text


def test_lane_steps_take_the_lane_that_had_just_freed_up(tmp_path):
    fake_run(tmp_path, wall=300)
    fake_step(tmp_path, "molecule/examples", "lane", "passed", offset=0, seconds=200)
    fake_step(tmp_path, "molecule/examples_multinode", "lane", "passed", offset=0.5, seconds=100)
    fake_step(tmp_path, "roles/preflight", "lane", "passed", offset=100.7, seconds=50)
    fake_step(tmp_path, "roles/grafana", "lane", "passed", offset=200.2, seconds=20)
    where = {s.name: s.where for s in report.load(tmp_path).steps}
    assert where == {"molecule/examples": "lane 1", "molecule/examples_multinode": "lane 2",
                     "roles/preflight": "lane 2", "roles/grafana": "lane 1"}


def test_readme_table_is_written_between_the_markers_only(tmp_path):
    fake_run(tmp_path / "reports", wall=3717)
    fake_step(tmp_path / "reports", "molecule/examples", "lane", "passed", offset=219, seconds=2726)
    readme = tmp_path / "README.md"
    readme.write_text(textwrap.dedent("""\
        # Tests
        before
        <!-- ci-times:begin: python3 .ci/report.py readme -->
        | old | table |
        <!-- ci-times:end -->
        after
        """))
    subprocess.run([sys.executable, str(REPORT), "--dir", str(tmp_path / "reports"), "readme", str(readme)],
                   check=True)
    assert readme.read_text() == textwrap.dedent("""\
        # Tests
        before
        <!-- ci-times:begin: python3 .ci/report.py readme -->
        `make test` of abc1234, 2023-11-14: **3,717 s** wall time; every step passed.

        | step | where | result | started at s | seconds | share of wall time |
        |---|---|---|---:|---:|---:|
        | molecule/examples | lane 1 | passed | 219 | 2,726 | 73 % |
        | **wall time** | | passed | | **3,717** | 100 % |

        <!-- ci-times:end -->
        after
        """)


def test_table_of_a_missing_report_is_refused(tmp_path):
    result = subprocess.run([sys.executable, str(REPORT), "--dir", str(tmp_path / "none"), "table"],
                            capture_output=True, text=True)
    assert result.returncode == 1 and "no test report" in result.stderr


def summary_of(tmp_path: Path, reports: Path, log: str = "") -> str:
    (tmp_path / "ci.log").write_text(log)
    return subprocess.run([sys.executable, str(SUMMARY), "--reports", str(reports), str(tmp_path / "ci.log")],
                          capture_output=True, text=True, check=True).stdout


def test_summary_names_each_failed_step_with_its_cause(tmp_path):
    reports = tmp_path / "reports"
    fake_run(reports, wall=500)
    fake_step(reports, "yamllint", "background", "passed", offset=1, seconds=3, log="fine\n")
    fake_step(reports, "unit-tests", "background", "failed", offset=5, seconds=12, pytest_xml=PYTEST_FAILED,
              log="1 failed, 1 passed\n")
    fake_step(reports, "roles/grafana", "lane", "failed", offset=2, seconds=65, log=MOLECULE_LOG)
    fake_step(reports, "kernels-interpreter", "background", "stopped", offset=20, seconds=40, log="....\n")
    lines = summary_of(tmp_path, reports).splitlines()

    assert lines[:4] == [
        "---- CI failure summary ----",
        "==> roles/grafana FAILED after 65 s (lane 1; exit status 2)",
        "TASK [grafana : Start grafana-server]",
        'fatal: [grafana-debian12]: FAILED! => {"msg": "Unable to start service grafana-server"}',
    ]
    assert lines[5:8] == [
        "==> unit-tests FAILED after 12 s (background; exit status 2)",
        "FAILED tests.unit.test_x::test_rate - AssertionError: rate 0.3 above 0.2",
        f"(pytest's report: {reports / 'pytest' / 'unit-tests.xml'})",
    ]
    assert lines[-1] == "stopped after the failure: kernels-interpreter"
    assert not any("yamllint" in line or "Destroy" in line for line in lines)


def test_summary_prints_the_end_of_a_log_without_a_failed_task(tmp_path):
    reports = tmp_path / "reports"
    fake_run(reports, wall=10)
    fake_step(reports, "syntax-check", "background", "failed", offset=0, seconds=4,
              log="ok  site.yml\nbench.yml: the play has no hosts line\n")
    lines = summary_of(tmp_path, reports).splitlines()
    assert lines[2:4] == ["ok  site.yml", "bench.yml: the play has no hosts line"]


@pytest.mark.parametrize("reports", ["missing", "no-failed-step"])
def test_summary_reads_the_log_without_a_failed_step_in_a_report(tmp_path, reports):
    directory = tmp_path / reports
    if reports == "no-failed-step":
        fake_run(directory, wall=10)
        fake_step(directory, "yamllint", "background", "passed", offset=0, seconds=1)
    log = ("==> kernels on CPU: Triton interpreter\n"
           "FAILED tests/test_mhc.py::test_post[4] - AssertionError: 3.1e-3 > 2.3e-3\n"
           "make: *** [Makefile:99: test-kernels] Error 1\n")
    lines = summary_of(tmp_path, directory, log).splitlines()
    assert "==> kernels on CPU: Triton interpreter" in lines
    assert "FAILED tests/test_mhc.py::test_post[4]" in " ".join(lines)
