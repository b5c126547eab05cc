"""labctl's teardown when a killed container is still finishing its last writes.

A container whose poweroff timed out is killed; its processes can still be
writing (a journal flush) while its root is removed, and the removal then fails with
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


def failing_remove(failures: int, calls: list):
    """labctl.remove_tree that fails `failures` times as a racing writer makes it fail."""
    real = labctl.remove_tree

    def remove_tree(path):
        calls.append(path)
        if len(calls) <= failures:
            raise OSError(errno.ENOTEMPTY, "Directory not empty", "rootfs")
        return real(path)

    return remove_tree


def test_down_retries_a_root_still_being_written(host, monkeypatch):
    calls = []
    monkeypatch.setattr(labctl, "remove_tree", failing_remove(2, calls))
    labctl.down("lab-x")
    assert not host.exists()
    assert len(calls) == 3


def test_down_gives_up_after_its_tries(host, monkeypatch):
    calls = []
    monkeypatch.setattr(labctl, "remove_tree", failing_remove(labctl.RMTREE_TRIES, calls))
    with pytest.raises(OSError):
        labctl.down("lab-x")
    assert len(calls) == labctl.RMTREE_TRIES
    assert host.exists()


def test_remove_tree_removes_and_reports_what_it_could_not(tmp_path, monkeypatch):
    tree = tmp_path / "root"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    labctl.remove_tree(tree)
    assert not tree.exists()
    # rm failing on a file a straggler is still writing: the error names it
    tree.mkdir()
    failed = labctl.subprocess.CompletedProcess([], 1, "", "rm: cannot remove 'root/var/log': Directory not empty")
    monkeypatch.setattr(labctl.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(OSError, match="Directory not empty"):
        labctl.remove_tree(tree)
