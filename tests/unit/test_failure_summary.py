""".ci/failure_summary.py names the failed step, its failed task and the message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "failure_summary.py"

# Two role lanes side by side (make -O prints each whole): the failed lane's verdict is
# followed by the other lane's output, as in a real `make test` log.
LANES_LOG = """\
\x1b[1m==> molecule test --all in roles/prometheus\x1b[0m
  \x1b[2m\u2502\x1b[0m TASK [prometheus : Install the rules]
  \x1b[2m\u2502\x1b[0m failed: [prometheus-debian13] (item=alerts.yml) => {"msg": "failed to validate"}
  \x1b[2m\u2502\x1b[0m TASK [Record the refusal]
  \x1b[2m\u2502\x1b[0m ok: [prometheus-debian13]
  \x1b[2m\u2502\x1b[0m TASK [Copy the binaries into the upstream layout]
  \x1b[2m\u2502\x1b[0m failed: [localhost] (item=promtool) => {"msg": "Could not find or
  \x1b[2m\u2502\x1b[0m   access '/usr/bin/promtool' on the Ansible Controller."}
  \x1b[2m\u2502\x1b[0m PLAY RECAP
ERROR    Ansible return code was 2, command was: ansible-playbook prepare.yml
==> roles/prometheus FAILED after 168 s
make[2]: *** [Makefile:133: molecule-role/prometheus] Error 1
==> molecule test --all in roles/nvidia_driver
  \x1b[2m\u2502\x1b[0m TASK [nvidia_driver : Install]
  \x1b[2m\u2502\x1b[0m ok: [nvidia-debian12]
==> roles/nvidia_driver passed in 272 s
make[1]: *** [Makefile:130: test-roles] Error 2
"""


def summary(tmp_path: Path, log: str) -> list[str]:
    path = tmp_path / "ci.log"
    path.write_text(log)
    out = subprocess.run([sys.executable, str(SCRIPT), str(path)], check=True, capture_output=True, text=True)
    return out.stdout.splitlines()


def test_failed_lane_names_its_last_failed_task(tmp_path):
    lines = summary(tmp_path, LANES_LOG)
    assert lines[:3] == ["---- CI failure summary ----", "==> molecule test --all in roles/prometheus",
                         "TASK [Copy the binaries into the upstream layout]"]
    message = " ".join(lines[3:])
    assert "failed: [localhost] (item=promtool)" in message
    assert "'/usr/bin/promtool' on the Ansible Controller" in message
    assert "nvidia" not in message


def test_pytest_failure_is_named(tmp_path):
    log = ("==> kernels on CPU: Triton interpreter\n"
           "FAILED tests/test_mhc.py::test_post[4] - AssertionError: 3.1e-3 > 2.3e-3\n"
           "1 failed, 93 passed in 120.00s\n"
           "==> monitoring: promtool rule tests\n"
           "29 passed in 0.09s\n"
           "make: *** [Makefile:99: test-kernels] Error 1\n")
    lines = summary(tmp_path, log)
    assert lines[1] == "==> kernels on CPU: Triton interpreter"
    assert "FAILED tests/test_mhc.py::test_post[4]" in " ".join(lines[2:])
