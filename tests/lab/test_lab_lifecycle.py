"""The lab's own contract: real systemd hosts on their own addresses, and a destroy that
leaves nothing behind, also after a failed converge."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LABCTL = [sys.executable, str(REPO / "molecule/lab/labctl.py")]
NET = os.environ.get("SM120_LAB_NET", "127.0.2")
HOSTS = {"lab-a": ("bookworm", f"{NET}.95"), "lab-b": ("trixie", f"{NET}.96")}


def labctl(*args: str, lab_id: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, SM120_LAB_ID=lab_id)
    return subprocess.run([*LABCTL, *args], env=env, capture_output=True, text=True, check=check)


def ssh(address: str, command: str, user: str = "root") -> str:
    key = REPO / ".cache/lab/ssh/id_ed25519"
    return subprocess.run(
        ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "LogLevel=ERROR", f"{user}@{address}", command],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()


@pytest.fixture(scope="module")
def lab():
    lab_id = "pytest-lifecycle"
    try:
        for name, (release, address) in HOSTS.items():
            labctl("up", name, "--release", release, "--address", address, lab_id=lab_id)
        yield lab_id
    finally:
        labctl("down", "--all", lab_id=lab_id)
        leftovers = labctl("check-clean", lab_id=lab_id, check=False)
        assert leftovers.returncode == 0, leftovers.stdout


def test_hosts_boot_systemd_as_pid1_with_their_own_identity(lab):
    for name, (release, address) in HOSTS.items():
        assert ssh(address, "ps -o comm= -p 1") == "systemd"
        assert ssh(address, "hostname") == name
        assert ssh(address, "systemctl is-system-running") in ("running", "degraded")
        version = {"bookworm": "12", "trixie": "13"}[release]
        assert ssh(address, ". /etc/os-release; echo $VERSION_ID") == version


def test_the_operator_user_logs_in_and_becomes_root_without_a_password(lab):
    """As the README's inventory connects (ansible_user: deploy, ansible_become: true)."""
    for _, address in HOSTS.values():
        assert ssh(address, "id -un", user="deploy") == "deploy"
        assert ssh(address, "sudo -n id -un", user="deploy") == "root"


def test_same_port_on_two_hosts_reaches_each_host(lab):
    for name, (_, address) in HOSTS.items():
        ssh(address, f"mkdir -p /srv/probe && echo {name} > /srv/probe/who && "
                     f"systemd-run --unit=probe -p WorkingDirectory=/srv/probe "
                     f"python3 -m http.server 8080 --bind {address}")
    for name, (_, address) in HOSTS.items():
        for _ in range(50):
            try:
                body = urllib.request.urlopen(f"http://{address}:8080/who", timeout=2).read().decode()
                break
            except OSError:
                subprocess.run(["sleep", "0.2"], check=True)
        assert body.strip() == name


def test_destroy_after_failed_converge_leaves_nothing():
    env = dict(os.environ, SM120_LAB_ID="pytest-failing-converge")
    molecule = Path(sys.executable).with_name("molecule")
    run = subprocess.run([str(molecule), "test", "-s", "failing_converge"], cwd=Path(__file__).parent,
                         env=env, capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode != 0, "the converge was meant to fail"
    # It failed where it was meant to, after the service and the mount were in place.
    assert "TASK [Fail the converge]" in output
    for host in ("lifecycle-debian12", "lifecycle-debian13"):
        # Two changes (the service and the mount), then the deliberate failure.
        assert re.search(rf"{host}\s+: ok=2\s+changed=2\s+unreachable=0\s+failed=1", output), output[-3000:]
    # Molecule ran destroy after the failure, and destroy's own check passed.
    assert "Check that nothing of the lab remains" in output
    leftovers = labctl("check-clean", lab_id="pytest-failing-converge", check=False)
    assert leftovers.returncode == 0, leftovers.stdout
    assert json.loads(leftovers.stdout) == {"processes": [], "mounts": [], "hosts": [], "fence": []}
    nspawn = subprocess.run(["pgrep", "-f", "systemd-nspawn.*lifecycle-debian"], capture_output=True, text=True)
    assert nspawn.stdout == "", f"nspawn processes left: {nspawn.stdout}"
