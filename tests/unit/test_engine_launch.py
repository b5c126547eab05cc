"""sglang_engine's launcher (sglang-engine-launch) and the router's: the keys from the unit's
credentials reach the server's arguments but not the process's command line, and what the
process writes has them redacted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE_LAUNCHER = REPO / "roles" / "sglang_engine" / "files" / "sglang_engine_launch.py"
ROUTER_LAUNCHER = REPO / "roles" / "sglang_router" / "files" / "sglang-router-launch"
WORKER_KEY = "worker-key-0123456789abcdef0123456789"
ADMIN_KEY = "admin-key-0123456789abcdef01234567890"

# What the server sees (written to a file beside it, not through the redacted streams): its
# arguments and its command line as /proc shows it to others; then a log line with its
# resolved arguments, as SGLang's engine writes at start.
SERVER = """
import json, pathlib, sys
cmdline = open("/proc/self/cmdline", "rb").read().decode().split("\\0")
pathlib.Path(__file__).with_name("seen.json").write_text(json.dumps({"argv": sys.argv[1:], "cmdline": cmdline}))
keys = dict(zip(sys.argv[1::2], sys.argv[2::2]))
print("server_args=" + repr({"api_key": keys.get("--api-key"), "admin_api_key": keys.get("--admin-api-key")}),
      file=sys.stderr)
"""


def launch(tmp_path: Path, credentials: dict[str, str], *target: str) -> subprocess.CompletedProcess:
    directory = tmp_path / "credentials"
    directory.mkdir()
    for name, value in credentials.items():
        (directory / name).write_text(value + "\n")
    return subprocess.run([sys.executable, str(ENGINE_LAUNCHER), *target], capture_output=True, text=True,
                          env={"CREDENTIALS_DIRECTORY": str(directory), "PATH": "/usr/bin:/bin"}, check=False)


def test_keys_reach_the_arguments_not_the_command_line_nor_the_log(tmp_path):
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    done = launch(tmp_path, {"api-key": WORKER_KEY, "admin-api-key": ADMIN_KEY}, str(server), "--config", "x.yaml")
    assert done.returncode == 0, done.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == ["--config", "x.yaml", "--api-key", WORKER_KEY, "--admin-api-key", ADMIN_KEY]
    assert not any(WORKER_KEY in part or ADMIN_KEY in part for part in seen["cmdline"])
    assert WORKER_KEY not in done.stderr and ADMIN_KEY not in done.stderr
    assert "'api_key': '<redacted>'" in done.stderr and "'admin_api_key': '<redacted>'" in done.stderr


def test_a_module_runs_as_python_m_does(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "serve.py").write_text(SERVER)
    directory = tmp_path / "credentials"
    directory.mkdir()
    (directory / "api-key").write_text(WORKER_KEY)
    done = subprocess.run([sys.executable, str(ENGINE_LAUNCHER), "-m", "pkg.serve", "--port", "1"],
                          capture_output=True, text=True, cwd=tmp_path, check=False,
                          env={"CREDENTIALS_DIRECTORY": str(directory), "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert json.loads((package / "seen.json").read_text())["argv"] == ["--port", "1", "--api-key", WORKER_KEY]


def test_an_empty_credential_is_refused(tmp_path):
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    done = launch(tmp_path, {"api-key": ""}, str(server))
    assert done.returncode != 0
    assert "credential api-key" in done.stderr and "sglang_worker_api_key" in done.stderr


def test_without_credentials_nothing_is_added(tmp_path):
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    done = subprocess.run([sys.executable, str(ENGINE_LAUNCHER), str(server), "--x"], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin"}, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["argv"] == ["--x"]


def test_router_launcher_adds_the_worker_key(tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("router_launch", str(ROUTER_LAUNCHER))
    spec = importlib.util.spec_from_loader("router_launch", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    (tmp_path / "worker-api-key").write_text(WORKER_KEY + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert module.worker_api_key_args() == ["--api-key", WORKER_KEY]
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    assert module.worker_api_key_args() == []
