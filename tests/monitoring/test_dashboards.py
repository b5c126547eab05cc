"""The Grafana dashboards in roles/grafana/files/dashboards: structure, data source
references, unique panel ids, a description on every panel, every query valid PromQL for a
real Prometheus, and the GPU panels' queries non-empty against recorded scrapes of both
GPU exporters (dcgm-exporter and nvidia_gpu_exporter) and of the GPU textfile collector,
loaded into Prometheus with `promtool tsdb create-blocks-from openmetrics`."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import promlib

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
TEXTFILE_SCRIPT = promlib.REPO / "roles" / "gpu_exporter" / "files" / "sm120-gpu-textfile"
DATASOURCE_UID = "sm120-prometheus"
# Where each recorded scrape appears, as Prometheus would label it through file_sd.
GPU_HOSTS = {"dcgm-exporter.prom": "gpu-dcgm", "nvidia-gpu-exporter.prom": "gpu-smi"}
GPU_METRIC = re.compile(r"\b(DCGM_FI_\w+|nvidia_smi_\w+|sm120_gpu_\w+)")


def test_dashboards_exist():
    names = set(promlib.dashboards())
    assert {"sglang-pd-overview.json", "gpu-hosts.json"} <= names


@pytest.mark.parametrize("name", sorted(promlib.dashboards()))
def test_dashboard_structure(name):
    dash = promlib.dashboards()[name]
    assert dash.get("uid") and dash.get("title") and isinstance(dash.get("panels"), list)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["datasource"]["current"]["value"] == DATASOURCE_UID
    ids = [p["id"] for p in dash["panels"]] + [c["id"] for p in dash["panels"] for c in p.get("panels", [])]
    assert len(ids) == len(set(ids)), f"{name}: repeated panel ids"
    for panel in promlib.panels(dash):
        where = f"{name}: panel {panel['id']} '{panel.get('title')}'"
        assert panel.get("title"), where
        assert len(panel.get("description", "")) >= 20, f"{where}: no description"
        assert panel.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel.get("targets"), f"{where}: no query"
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), where
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), where
        for target in panel["targets"]:
            assert target.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, where
            assert target.get("expr"), where
            used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
            assert used <= set(variables) | {"__rate_interval", "__interval"}, f"{where}: unknown variables {used}"
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, var["name"]


def test_pd_overview_covers_the_reference_panels():
    dash = promlib.dashboards()["sglang-pd-overview.json"]
    assert len(promlib.panels(dash)) >= 17
    assert {v["name"] for v in dash["templating"]["list"]} >= {"host", "role", "instance"}
    exprs = " ".join(t["expr"] for p in promlib.panels(dash) for t in p["targets"])
    for needle in ("prompt_tokens", "generation_tokens", "requests:rate5m", "time_to_first_token_seconds:p99",
                   "inter_token_latency_seconds:p50", "e2e_request_latency_seconds:p90", "num_running_reqs",
                   "num_queue_reqs", "token_usage", "cache_hit_rate", "num_prefill_bootstrap_queue_reqs",
                   "num_prefill_inflight_queue_reqs", "num_decode_prealloc_queue_reqs",
                   "num_decode_transfer_queue_reqs", "kv_transfer_latency_ms", "kv_transfer_speed_gb_s",
                   "bootstrap_failed", "transfer_failed", "spec_accept_length", "sglang_router:requests",
                   "sglang_router:responses", "sglang_router:request_duration_seconds", "smg_worker_health"):
        assert needle in exprs, needle


# ------------------------------------------------------------- a real Prometheus
def openmetrics(text: str, extra: dict[str, str], end: float, steps: int = 41, step: float = 15.0) -> str:
    """A Prometheus text scrape repeated over time as OpenMetrics: gauges constant,
    counters (*_total) rising from 0 to their scraped value in the window's second half."""
    families: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{.*\})?\s+(\S+)$", line.strip())
        assert match, line
        name, labels, value = match.group(1), match.group(2) or "{}", float(match.group(3))
        inner = labels[1:-1].rstrip(",")
        added = ",".join(f'{k}="{v}"' for k, v in extra.items())
        families.setdefault(name, []).append((f"{name}{{{inner + ',' if inner else ''}{added}}}", value))
    out = []
    for name, series in families.items():
        out.append(f"# TYPE {name} unknown")
        for sample, value in series:
            for i in range(steps):
                ts = end - (steps - 1 - i) * step
                v = (value if i >= steps // 2 else 0.0) if name.endswith("_total") else value
                out.append(f"{sample} {v} {ts:.3f}")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def fixture_prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("prometheus")
    end = float(int(time.time()) - 3600)
    textfile = work / "gpu-textfile.prom"
    subprocess.run([sys.executable, str(TEXTFILE_SCRIPT), "--output", str(textfile),
                    "--kernel-log", str(FIXTURES / "kernel-xid.log"), "--dmon", str(FIXTURES / "nvidia-smi-dmon.txt")],
                   check=True)
    parts = []
    for fixture, host in GPU_HOSTS.items():
        parts.append(openmetrics((FIXTURES / fixture).read_text(), {"job": "gpu", "host": host, "instance": host}, end))
    for host in GPU_HOSTS.values():
        parts.append(openmetrics(textfile.read_text(), {"job": "node", "host": host, "instance": host}, end))
    # Families must not repeat across blocks of one file: merge by family name.
    merged: dict[str, list[str]] = {}
    for part in parts:
        name = None
        for line in part.splitlines():
            if line.startswith("# TYPE "):
                name = line.split()[2]
                merged.setdefault(name, [line])
            else:
                merged[name].append(line)
    om = work / "fixtures.om"
    om.write_text("\n".join(line for lines in merged.values() for line in lines) + "\n# EOF\n")
    tsdb = work / "tsdb"
    result = subprocess.run([promlib.tool("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = promlib.render_rules(work / "rules")
    # Rules evaluated every 2 s: the alerts panel's test waits for the Watchdog's first round.
    prom = promlib.Prometheus(work, tsdb, rules, evaluation_interval="2s")
    yield prom, end
    prom.stop()


def test_every_dashboard_query_is_valid_promql(fixture_prometheus):
    prom, end = fixture_prometheus
    errors = []
    for name, panel, target, expr in promlib.queries():
        answer = promlib.query(prom.url, expr, end)
        if answer.get("status") != "success":
            errors.append(f"{name}: '{panel['title']}' {target['refId']}: {answer.get('error')}: {expr}")
    dashes = promlib.dashboards().values()
    for var in (v for d in dashes for v in d["templating"]["list"] if v["type"] == "query"):
        inner = re.match(r"label_values\((.*),\s*\w+\)$", var["definition"])
        assert inner, var["definition"]
        answer = promlib.query(prom.url, promlib.substitute(inner.group(1)), end)
        if answer.get("status") != "success":
            errors.append(f"variable {var['name']}: {answer.get('error')}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("host", sorted(GPU_HOSTS.values()))
def test_gpu_panels_have_data_from_each_exporter(fixture_prometheus, host):
    prom, end = fixture_prometheus
    dash = promlib.dashboards()["gpu-hosts.json"]
    empty, checked = [], 0
    for panel in promlib.panels(dash):
        for target in panel["targets"]:
            if not GPU_METRIC.search(target["expr"]):
                continue
            checked += 1
            expr = promlib.substitute(target["expr"], {"host": host})
            answer = promlib.query(prom.url, expr, end)
            assert answer["status"] == "success", answer
            if not answer["data"]["result"]:
                empty.append(f"'{panel['title']}' {target['refId']}: {expr}")
    assert checked >= 9
    assert not empty, f"no data on {host}:\n" + "\n".join(empty)


def test_gpu_alerts_see_the_fixtures(fixture_prometheus):
    """The GPU alert expressions select the exporters' real series (with a threshold of 0)."""
    prom, end = fixture_prometheus
    for expr in ("max by (host, gpu, uuid) (DCGM_FI_DEV_GPU_TEMP or nvidia_smi_temperature_gpu) > 0",
                 "sum by (host, pci_bus_id, xid) (increase(sm120_gpu_xid_errors_total[15m])) > 0"):
        result = promlib.query(prom.url, expr, end)["data"]["result"]
        assert {r["metric"]["host"] for r in result} == set(GPU_HOSTS.values()), expr


def test_check_queries_reports_missing_targets_and_data(fixture_prometheus):
    """The site-level checker (check_queries.py) fails, and says why, on a Prometheus that
    scrapes no engine, router or node (the fixture one)."""
    prom, _ = fixture_prometheus
    result = subprocess.run([sys.executable, str(HERE / "check_queries.py"), "--prometheus", prom.url,
                             "--skip-gpu", "--wait", "0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    for needle in ("FAIL job sglang_engine: no target", "FAIL job sglang_router: no target",
                   "FAIL recording rule sglang:prompt_tokens:rate5m: no data",
                   "'Prefill token throughput' A: no data", "FAILED: targets, recording rules and"):
        assert needle in result.stdout, (needle, result.stdout[-3000:])
    assert "DCGM_FI" not in result.stdout  # GPU panels skipped


def test_pd_overview_shows_the_accept_length_beside_decode_throughput():
    """The recording rule SGLangSpecAcceptLengthLow watches, in the panel right of decode tok/s."""
    by_title = {p["title"]: p for p in promlib.panels(promlib.dashboards()["sglang-pd-overview.json"])}
    decode, spec = by_title["Decode token throughput"]["gridPos"], by_title["Speculative accept length"]["gridPos"]
    assert spec["y"] == decode["y"] and spec["x"] == decode["x"] + decode["w"]
    assert [t["expr"] for t in by_title["Speculative accept length"]["targets"]] == [
        'sglang:spec_accept_length:avg5m{host=~"$host", role=~"$role", instance=~"$instance"}']


ALERTS_PANEL = "Firing alerts by severity"


@pytest.mark.parametrize("name", ["gpu-hosts.json", "sglang-pd-overview.json"])
def test_alerts_panel_counts_the_rules_firing_alerts_by_severity(fixture_prometheus, name):
    """The GPU and PD dashboards open with the firing alerts by severity: against the fixture
    Prometheus, which evaluates the role's real alert rules, the panel's query counts the
    Watchdog under severity none (All hosts), and no alert for a host that fires none."""
    prom, _ = fixture_prometheus
    dash = promlib.dashboards()[name]
    (panel,) = [p for p in promlib.panels(dash) if p["title"] == ALERTS_PANEL]
    assert panel["gridPos"]["y"] == 0 and panel["gridPos"]["w"] == 24, "the first thing on the dashboard"
    (target,) = panel["targets"]
    assert target["legendFormat"] == "{{severity}}" and target["instant"]
    deadline, result = time.time() + 60, []
    while time.time() < deadline:  # until the rules' first evaluation
        answer = promlib.query(prom.url, promlib.substitute(target["expr"]))
        assert answer["status"] == "success", answer
        result = answer["data"]["result"]
        if result:
            break
        time.sleep(2)
    assert [(r["metric"], r["value"][1]) for r in result] == [({"severity": "none"}, "1")]
    quiet = promlib.query(prom.url, promlib.substitute(target["expr"], {"host": "gpu-dcgm"}))
    assert quiet["status"] == "success" and quiet["data"]["result"] == []
