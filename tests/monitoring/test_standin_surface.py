"""The engine stand-in (a test double) serves without importing SGLang, yet what it exports
is SGLang's: its /metrics after a sequence of requests, KV transfers and a failed transfer
equals, sample by sample, what SGLang 0.5.23's own collectors export after the same events
(Prometheus multiprocess mode, as in the engine unit), and its tool-call and usage stream
chunks equal SGLang's protocol classes' JSON byte for byte. The metric families come from
sglang_resolve.py, which the stand-in runs once per config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESOLVER = REPO / "molecule/engine_standin/sglang_resolve.py"
# One engine as the lab renders it (a decode engine in PD mode, with the lab's extra labels).
ENGINE_CONFIG = """\
model-path: {model}
served-model-name: lab-tiny
host: 127.0.0.1
port: 30001
tp-size: 4
disaggregation-mode: decode
disaggregation-transfer-backend: mooncake_tcp
enable-metrics: true
extra-metric-labels:
  role: decode
  instance: decode-0
tool-call-parser: deepseekv4
reasoning-parser: deepseek-v4
"""


def run(tmp_path: Path, *argv: str) -> dict:
    multiproc = Path(tempfile.mkdtemp(prefix="multiproc-", dir=tmp_path))  # one per process, as per engine
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PROMETHEUS_MULTIPROC_DIR": str(multiproc)}
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("engine")
    (base / "model").mkdir()
    (base / "model/config.json").write_text((REPO / "molecule/engine_standin/lab-tiny/config.json").read_text())
    path = base / "decode-0.yaml"
    path.write_text(ENGINE_CONFIG.format(model=base / "model"))
    return path


@pytest.fixture(scope="module")
def surface(config, tmp_path_factory) -> Path:
    answer = run(tmp_path_factory.mktemp("resolve"), str(RESOLVER), "--config", str(config))
    path = config.with_name("surface.json")
    path.write_text(json.dumps(answer))
    return path


@pytest.fixture(scope="module")
def both(config, surface, tmp_path_factory) -> tuple[dict, dict]:
    tmp = tmp_path_factory.mktemp("probe")
    probe = str(HERE / "standin_surface_probe.py")
    return run(tmp, probe, "sglang", str(config)), run(tmp, probe, "standin", str(surface))


def samples(exposition: str) -> dict:
    """(name, labels) -> value; the `pid` label of multiprocess_mode="all" gauges names the
    writing process, which differs between the two sides."""
    out = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if not s.name.endswith("_created"):
                labels = {k: ("<pid>" if k == "pid" else v) for k, v in s.labels.items()}
                out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def test_resolver_reports_what_sglang_resolved(surface):
    answer = json.loads(surface.read_text())
    assert answer["sglang_version"] == "0.5.23"
    assert answer["server_args"]["disaggregation_mode"] == "decode"
    assert answer["server_args"]["port"] == 30001
    assert answer["environ"] == {"MC_FORCE_TCP": "1"}  # SGLang's PD hook for mooncake_tcp
    assert answer["mooncake"] == {"hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "protocol": "rdma",
                                  "device_name": ""}
    assert len(answer["metrics"]["families"]) > 50


def test_standin_exports_what_sglang_exports(both):
    reference, standin = (samples(side["exposition"]) for side in both)
    assert len(reference) > 300
    assert any(name == "sglang:num_requests_total" and value == 3 for (name, _), value in reference.items())
    missing = sorted(k for k in reference if k not in standin)
    extra = sorted(k for k in standin if k not in reference)
    differ = sorted((k, reference[k], standin[k]) for k in reference if k in standin
                    and abs(reference[k] - standin[k]) > 1e-9 * max(1.0, abs(reference[k])))
    assert not missing and not extra and not differ, (
        f"missing {missing[:10]} ({len(missing)}), extra {extra[:10]} ({len(extra)}), differ {differ[:10]}")


def test_standin_streams_sglang_chunks_without_importing_sglang(both):
    reference, standin = both
    assert standin["chunks"] == reference["chunks"]
    assert standin["sglang_modules"] == []
