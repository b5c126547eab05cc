"""The release's health gate (roles/sglang_release/files/wait_health.py): success, and each
way it gives up early or late, with the reason it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
wait_health = load("wait_health", REPO / "roles/sglang_release/files/wait_health.py")


def run(monkeypatch, capsys, answers, states, timeout=30.0):
    """main() against scripted /health answers and (ActiveState, NRestarts) readings; the
    clock advances one second per poll."""
    answers, states, clock = iter(answers), iter(states), iter(range(10_000))
    monkeypatch.setattr(wait_health, "health", lambda url: next(answers))
    monkeypatch.setattr(wait_health, "unit_state", lambda unit: next(states))
    monkeypatch.setattr(wait_health.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(wait_health.time, "sleep", lambda s: None)
    monkeypatch.setattr(wait_health.subprocess, "run",
                        lambda *a, **kw: subprocess.CompletedProcess(a, 0, stdout="journal line\n"))
    monkeypatch.setattr(sys, "argv", ["wait_health.py", "--url", "http://e:30001/health", "--unit", "engine",
                                      "--timeout", str(timeout)])
    return wait_health.main(), capsys.readouterr().out


def test_healthy_engine_passes(monkeypatch, capsys):
    rc, out = run(monkeypatch, capsys, [0, 503, 200], [("activating", 0)] * 3)
    assert rc == 0 and "engine: http://e:30001/health answered 200" in out


@pytest.mark.parametrize("states,reason", [
    ([("activating", 0), ("failed", 0)], "engine failed (last /health answer: no connection)"),
    ([("activating", 1), ("activating", 1), ("activating", 2)], "engine crashed and was restarted 1 time(s) while starting"),
])
def test_a_failed_or_restarted_unit_stops_the_wait_at_once(monkeypatch, capsys, states, reason):
    rc, out = run(monkeypatch, capsys, [0] * 5, states)
    assert rc == 1 and out.startswith(reason) and "journal line" in out


def test_an_engine_that_never_answers_fails_at_the_timeout(monkeypatch, capsys):
    rc, out = run(monkeypatch, capsys, [503] * 20, [("active", 0)] * 20, timeout=5)
    assert rc == 1
    assert out.startswith("engine: http://e:30001/health did not answer 200 within 5 s (last answer: 503, unit active)")
