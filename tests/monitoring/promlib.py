"""Shared helpers for the monitoring tests: render the Prometheus role's rule templates
with its defaults, find promtool and Prometheus, read the dashboards and their queries.

Standard library plus jinja2 and PyYAML (both in the SGLang venv the tests run in)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import jinja2
import yaml

REPO = Path(__file__).resolve().parents[2]
PROM_ROLE = REPO / "roles" / "prometheus"
DASHBOARD_DIR = REPO / "roles" / "grafana" / "files" / "dashboards"
RULE_FILES = ["sm120-recording.yml", "sm120-alerts.yml"]
# Grafana variables in dashboard queries and what stands in for them when a query is
# sent to Prometheus as it is ("All" selected).
VARIABLE_VALUES = {"host": ".*", "role": ".*", "instance": ".*", "__rate_interval": "5m", "__interval": "1m"}


def tool(name: str) -> str:
    """Path of a Prometheus binary (prometheus, promtool): from $SM120_PROMETHEUS_BIN_DIR
    when set (e.g. unpacked from the .deb with dpkg-deb -x), else PATH or /usr/bin, where
    Debian's prometheus package puts both."""
    bin_dir = os.environ.get("SM120_PROMETHEUS_BIN_DIR")
    candidates = [Path(bin_dir) / name] if bin_dir else []
    candidates += [Path(p) for p in (shutil.which(name), f"/usr/bin/{name}") if p]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise RuntimeError(f"{name} not found: apt-get install prometheus (Debian's package has promtool), "
                       "or set SM120_PROMETHEUS_BIN_DIR")


def role_defaults() -> dict:
    """The Prometheus role's defaults, Jinja expressions resolved as in a bare inventory."""
    raw = yaml.safe_load((PROM_ROLE / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined)
    out = {}
    for key, value in raw.items():
        if isinstance(value, str) and "{{" in value:
            value = env.from_string(value).render(**raw)
        out[key] = value
    return out


def _template_env(text: str) -> tuple[jinja2.Environment, str]:
    """Honour Ansible's `#jinja2:` header (custom delimiters) like the template module."""
    first, _, rest = text.partition("\n")
    options = {}
    if first.startswith("#jinja2:"):
        for item in first[len("#jinja2:"):].split(","):
            key, _, value = item.strip().partition(":")
            options[key.strip()] = value.strip().strip("'\"")
        text = rest
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, **options)
    return env, text


def render_rules(dest: Path, overrides: dict | None = None) -> list[Path]:
    """Render the role's rule templates into dest with its defaults (plus overrides)."""
    context = {**role_defaults(), "ansible_managed": "rendered by tests/monitoring", **(overrides or {})}
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in RULE_FILES:
        env, text = _template_env((PROM_ROLE / "templates" / "rules" / f"{name}.j2").read_text())
        path = dest / name
        path.write_text(env.from_string(text).render(**context))
        paths.append(path)
    return paths


def rules(paths: list[Path]) -> list[dict]:
    out = []
    for path in paths:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def panels(dashboard: dict) -> list[dict]:
    """Every panel, rows' nested panels included (rows themselves excluded)."""
    out = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def substitute(expr: str, values: dict | None = None) -> str:
    values = {**VARIABLE_VALUES, **(values or {})}

    def repl(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


def queries() -> list[tuple[str, dict, dict, str]]:
    """(dashboard file, panel, target, expression with variables substituted)."""
    out = []
    for name, dash in dashboards().items():
        for panel in panels(dash):
            for target in panel.get("targets", []):
                out.append((name, panel, target, substitute(target["expr"])))
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that start with a known prefix
    (keeps function names, label names and keywords out without a full parser)."""
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    stripped = re.sub(r"\{[^}]*\}", "{}", stripped)
    stripped = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", stripped)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped))
    prefixes = ("sglang:", "sglang_router:", "smg_", "node_", "node:", "DCGM_", "nvidia_smi_", "sm120_")
    return {n for n in names if n.startswith(prefixes) or n == "up"}


# ---------------------------------------------------------------- a local Prometheus
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Prometheus:
    """A real Prometheus (Debian's binary) on a loopback port, over a given TSDB directory."""

    def __init__(self, workdir: Path, tsdb: Path, rule_files: list[Path] | None = None, evaluation_interval: str = "15s"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"evaluation_interval": evaluation_interval}, "rule_files": [str(p) for p in rule_files or []]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={tsdb}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=3650d"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"Prometheus did not become ready: {(workdir / 'prometheus.log').read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def query(url: str, expr: str, at: float | None = None) -> dict:
    """Instant query; returns the API's JSON (status error included, never raises on 400)."""
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    req = f"{url}/api/v1/query?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as err:
        return json.loads(err.read() or b'{"status": "error", "error": "HTTP error"}')
