"""labctl's teardown when a killed container is still finishing its last writes.

A container whose poweroff timed out is killed; its processes can still be
writing (a journal flush) while its root is removed, and rmtree then fails with
"Directory not empty". down() retries the removal, killing leftovers in
between, and only gives up after RMTREE_TRIES attempts.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
labctl = load("labctl", REPO / "molecule" / "lab" / "labctl.py")


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A stopped host's directory (no pid) in a lab state directory of its own."""
    monkeypatch.setenv("SM120_LAB_STATE", str(tmp_path))
    monkeypatch.setattr(labctl.time, "sleep", lambda s: None)
    hdir = labctl.host_dir("lab-x")
    (hdir / "rootfs" / "var" / "log" / "journal").mkdir(parents=True)
    (hdir / "rootfs" / "var" / "log" / "journal" / "system.journal").write_text("x")
    (hdir / "host.json").write_text("{}")
    return hdir


def failing_rmtree(failures: int, calls: list):
    """shutil.rmtree that fails `failures` times as a racing writer makes it fail."""
    real = labctl.shutil.rmtree

    def rmtree(path, *args, **kwargs):
        calls.append(path)
        if len(calls) <= failures:
            raise OSError(errno.ENOTEMPTY, "Directory not empty", "rootfs")
        return real(path, *args, **kwargs)

    return rmtree


def test_down_retries_a_root_still_being_written(host, monkeypatch):
    calls = []
    monkeypatch.setattr(labctl.shutil, "rmtree", failing_rmtree(2, calls))
    labctl.down("lab-x")
    assert not host.exists()
    assert len(calls) == 3


def test_down_gives_up_after_its_tries(host, monkeypatch):
    calls = []
    monkeypatch.setattr(labctl.shutil, "rmtree", failing_rmtree(labctl.RMTREE_TRIES, calls))
    with pytest.raises(OSError):
        labctl.down("lab-x")
    assert len(calls) == labctl.RMTREE_TRIES
    assert host.exists()
