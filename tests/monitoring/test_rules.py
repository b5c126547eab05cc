"""The Prometheus role's rules, rendered with its defaults: valid for promtool, every alert
has a summary and a runbook line, and each alert's promtool unit tests pass (it fires on a
failing series and stays quiet on healthy ones)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

import promlib

HERE = Path(__file__).resolve().parent
# The dead man's switch: it fires in every case, a healthy deployment included.
ALWAYS_FIRING = {"Watchdog"}


def rendered(tmp_path: Path) -> list[Path]:
    return promlib.render_rules(tmp_path / "rules")


def test_rules_pass_promtool_check(tmp_path):
    paths = rendered(tmp_path)
    result = subprocess.run([promlib.tool("promtool"), "check", "rules", *map(str, paths)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_summary_runbook_and_severity(tmp_path):
    alerts = [r for r in promlib.rules(rendered(tmp_path)) if "alert" in r]
    assert len(alerts) >= 12
    for rule in alerts:
        annotations = rule.get("annotations", {})
        assert annotations.get("summary"), f"{rule['alert']}: no summary"
        assert annotations.get("runbook"), f"{rule['alert']}: no runbook line"
        wanted = ("none",) if rule["alert"] in ALWAYS_FIRING else ("warning", "critical")
        assert rule.get("labels", {}).get("severity") in wanted, rule["alert"]


def test_watchdog_always_fires(tmp_path):
    """The dead man's switch fires on any data and on none (it needs no series)."""
    watchdog = next(r for r in promlib.rules(rendered(tmp_path)) if r.get("alert") == "Watchdog")
    assert watchdog["expr"] == "vector(1)" and "for" not in watchdog


def test_every_alert_has_a_firing_and_a_quiet_case(tmp_path):
    alerts = {r["alert"] for r in promlib.rules(rendered(tmp_path)) if "alert" in r}
    cases = yaml.safe_load((HERE / "rules_test.yml").read_text())["tests"]
    fires, quiet = set(), set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alerts - fires == set(), f"alerts never shown to fire: {sorted(alerts - fires)}"
    assert alerts - quiet - ALWAYS_FIRING == set(), f"alerts never shown to stay quiet: {sorted(alerts - quiet)}"
    assert quiet & ALWAYS_FIRING == set(), f"shown quiet, but must always fire: {sorted(quiet & ALWAYS_FIRING)}"


def test_alert_rules_fire_and_stay_quiet(tmp_path):
    """promtool test rules. The tests check labels, so annotations are left out of the
    copy they run against (their templates are checked by promtool check rules)."""
    paths = rendered(tmp_path)
    for path in paths:
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(HERE / "rules_test.yml", paths[0].parent / "rules_test.yml")
    result = subprocess.run([promlib.tool("promtool"), "test", "rules", "rules_test.yml"],
                            cwd=paths[0].parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_thresholds_come_from_variables(tmp_path):
    paths = promlib.render_rules(tmp_path / "custom", {
        "prometheus_alert_ttft_p99_seconds": 7.5, "prometheus_alert_gpu_temperature_celsius": 80,
        "prometheus_alert_queue_backlog_requests": 64, "prometheus_alert_model_disk_free_ratio": 0.2,
        "prometheus_model_root": "/data/models"})
    text = "\n".join(p.read_text() for p in paths)
    for needle in ("> 7.5", "> 80", "> 64", "< 0.2", 'mountpoint=~"/|/data|/data/models"'):
        assert needle in text, needle


def test_accept_length_floor_is_the_served_recipes(tmp_path):
    """SGLangSpecAcceptLengthLow fires below the served recipe's speculative.accept_length_floor."""
    recipes = yaml.safe_load((HERE.parents[1] / "defaults" / "models.yml").read_text())["sglang_shipped_recipes"]
    for name, recipe in recipes.items():
        floor = recipe["speculative"]["accept_length_floor"]
        paths = promlib.render_rules(tmp_path / name, {"sglang_model": name, "sglang_model_recipes": recipes})
        alert = next(r for r in promlib.rules(paths) if r.get("alert") == "SGLangSpecAcceptLengthLow")
        assert f'sglang:spec_accept_length:avg5m{{role=~"decode|unified"}} < {floor} and' in alert["expr"], alert["expr"]
