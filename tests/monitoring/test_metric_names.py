"""Every metric name a dashboard panel or a rule uses exists in what it reads from:
`sglang:*` in the pinned SGLang's own collectors, `smg_*` in the running pinned router's
/metrics, recording-rule names in the rule files, GPU names in the exporters' recorded
scrapes. Nothing here is a list we typed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import promlib

HERE = Path(__file__).resolve().parent
ROUTER_LAUNCHER = HERE.parents[1] / "roles/sglang_router/files/sglang-router-launch"
TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
               "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 512,
               "rms_norm_eps": 1e-6, "torch_dtype": "float32"}


@pytest.fixture(scope="module")
def used(tmp_path_factory) -> dict[str, set[str]]:
    """Metric names used, by where they are used."""
    rule_paths = promlib.render_rules(tmp_path_factory.mktemp("rules"))
    out: dict[str, set[str]] = {}
    for rule in promlib.rules(rule_paths):
        where = f"rule {rule.get('record') or rule.get('alert')}"
        for name in promlib.metric_names(rule["expr"]):
            out.setdefault(name, set()).add(where)
    for name, panel, target, expr in promlib.queries():
        for metric in promlib.metric_names(expr):
            out.setdefault(metric, set()).add(f"{name}: {panel['title']}")
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> set[str]:
    return {r["record"] for r in promlib.rules(promlib.render_rules(tmp_path_factory.mktemp("r"))) if "record" in r}


@pytest.fixture(scope="module")
def sglang_names(tmp_path_factory) -> set[str]:
    model = tmp_path_factory.mktemp("model")
    (model / "config.json").write_text(json.dumps(TINY_CONFIG))
    result = subprocess.run([sys.executable, str(HERE / "sglang_metric_names.py"), str(model)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["version"] == "0.5.23", data["version"]
    return set(data["names"])


@pytest.fixture(scope="module")
def router_names(tmp_path_factory) -> set[str]:
    """Start the pinned sglang-router in PD mode, with the launcher the router unit runs,
    against two plain HTTP workers, send it requests, and read the metric names from its
    /metrics."""
    log_dir = tmp_path_factory.mktemp("router")
    host = "127.0.0.1"
    prefill, decode, port, metrics = (promlib.free_port() for _ in range(4))
    procs = [subprocess.Popen([sys.executable, str(HERE / "fake_worker.py"), host, str(p)]) for p in (prefill, decode)]
    log = open(log_dir / "router.log", "wb")
    procs.append(subprocess.Popen(
        [sys.executable, str(ROUTER_LAUNCHER), "--pd-disaggregation",
         "--prefill", f"http://{host}:{prefill}", "8998", "--decode", f"http://{host}:{decode}",
         "--host", host, "--port", str(port), "--prometheus-host", host, "--prometheus-port", str(metrics)],
        stdout=log, stderr=subprocess.STDOUT))
    try:
        deadline = time.time() + 180
        text = ""
        while time.time() < deadline:
            try:
                body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 1}}).encode()
                req = urllib.request.Request(f"http://{host}:{port}/generate", body, {"Content-Type": "application/json"})
                urllib.request.urlopen(req, timeout=5).read()
                text = urllib.request.urlopen(f"http://{host}:{metrics}/metrics", timeout=5).read().decode()
                if "smg_worker_health" in text and "smg_router_requests_total" in text:
                    break
            except OSError:
                pass
            time.sleep(1)
        assert text, (log_dir / "router.log").read_text()[-3000:]
        names = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
        return names
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        log.close()


def test_sglang_metrics_exist_in_pinned_sglang(used, sglang_names):
    wanted = {n for n in used if n.startswith("sglang:") and n.count(":") == 1}
    assert len(wanted) >= 15
    missing = {n: sorted(used[n]) for n in wanted if n not in sglang_names}
    assert not missing, f"not exported by the pinned SGLang: {missing}"


def test_router_metrics_exist_in_pinned_router(used, router_names):
    wanted = {n for n in used if n.startswith("smg_")}
    assert wanted
    missing = {n: sorted(used[n]) for n in wanted if n not in router_names}
    assert not missing, f"not exported by the pinned router: {missing}"


def test_recording_rule_names_are_defined(used, recorded):
    wanted = {n for n in used if n.count(":") >= 2 or n.startswith(("sglang_router:", "node:"))}
    missing = {n: sorted(used[n]) for n in wanted if n not in recorded}
    assert not missing, f"used but recorded by no rule: {missing}"


def test_gpu_metrics_exist_in_the_recorded_scrapes(used, tmp_path):
    fixtures = HERE / "fixtures"
    textfile = tmp_path / "gpu.prom"
    subprocess.run([sys.executable, str(promlib.REPO / "roles" / "gpu_exporter" / "files" / "sm120-gpu-textfile"),
                    "--output", str(textfile), "--kernel-log", str(fixtures / "kernel-xid.log"),
                    "--dmon", str(fixtures / "nvidia-smi-dmon.txt")], check=True)
    text = (fixtures / "dcgm-exporter.prom").read_text() + (fixtures / "nvidia-gpu-exporter.prom").read_text()
    text += textfile.read_text()
    wanted = {n for n in used if n.startswith(("DCGM_", "nvidia_smi_", "sm120_gpu_"))}
    assert len(wanted) >= 10
    missing = {n: sorted(used[n]) for n in wanted if n not in text and n.removesuffix("_total") not in text}
    assert not missing, missing


def test_router_launcher_leaves_sglang_out_and_refuses_mini_lb():
    """The unit's launcher parses with the package's own parser (its --help) without
    importing SGLang, and refuses the Python load balancer it leaves out."""
    shown = subprocess.run([sys.executable, "-X", "importtime", str(ROUTER_LAUNCHER), "--help"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "--pd-disaggregation" in shown.stdout
    imported = {line.split("|")[-1].strip() for line in shown.stderr.splitlines() if line.startswith("import time:")}
    assert "sglang_router.router_args" in imported
    assert not {name for name in imported if name == "sglang" or name.startswith("sglang.")}
    refused = subprocess.run([sys.executable, str(ROUTER_LAUNCHER), "--mini-lb", "--worker-urls", "http://127.0.0.1:9"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert "--mini-lb" in refused.stderr and "sglang_router_extra_args" in refused.stderr
