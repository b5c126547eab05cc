"""labctl's teardown: a host's directory leaves the lab at once (a rename) and is deleted
by a detached process, which tries again while a killed container is still finishing its
last writes (a journal flush makes rm fail with "Directory not empty")."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
labctl = load("labctl", REPO / "molecule" / "lab" / "labctl.py")


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A stopped host's directory (no pid) in a lab state directory of its own."""
    monkeypatch.setenv("SM120_LAB_STATE", str(tmp_path / "lab"))
    monkeypatch.setenv("SM120_LAB_ID", f"unit-{tmp_path.name}")
    hdir = labctl.host_dir("lab-x")
    (hdir / "rootfs" / "var" / "log" / "journal").mkdir(parents=True)
    (hdir / "rootfs" / "var" / "log" / "journal" / "system.journal").write_text("x")
    (hdir / "host.json").write_text("{}")
    return hdir


def trashed(host: Path) -> list[Path]:
    return sorted(labctl.trash_dir().glob(f"{labctl.lab_id()}-lab-x-*"))


def wait_gone(host: Path, seconds: float) -> list[Path]:
    deadline = time.monotonic() + seconds
    while trashed(host) and time.monotonic() < deadline:
        time.sleep(0.1)
    return trashed(host)


def test_down_removes_the_host_at_once_and_its_files_in_the_background(host):
    labctl.down("lab-x")
    assert not host.exists()
    assert labctl.all_hosts() == []
    assert wait_gone(host, 10) == []


def test_background_deletion_tries_again_while_a_file_cannot_go(host):
    # An immutable file stands in for a straggler's write: rm fails until it is lifted.
    journal = host / "rootfs/var/log/journal/system.journal"
    subprocess.run(["chattr", "+i", str(journal)], check=True)
    labctl.down("lab-x")
    assert not host.exists()
    time.sleep(1.5)
    [moved] = trashed(host)
    assert (moved / "rootfs/var/log/journal/system.journal").exists()
    subprocess.run(["chattr", "-i", str(moved / "rootfs/var/log/journal/system.journal")], check=True)
    assert wait_gone(host, 10) == []
