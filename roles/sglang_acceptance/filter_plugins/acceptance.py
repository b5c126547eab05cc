"""The acceptance figures of a release: summary of sglang.benchmark.serving's results, the
comparison with the previous release and the recipe's baseline, and the regression gate.

Pure functions of their inputs (no I/O), used as Ansible filters and by tests/unit.
"""

from __future__ import annotations

import math
import re

# The gated figures: (key, label, unit, better) -- better: "higher" or "lower".
FIGURES = (
    ("single_stream_tok_s", "single-stream output tok/s", "tok/s", "higher"),
    ("throughput_tok_s", "output throughput at the reference concurrency", "tok/s", "higher"),
    ("ttft_p99_ms", "p99 TTFT at the reference concurrency", "ms", "lower"),
)

# sglang.benchmark.serving's result keys -> ours, per concurrency level.
LEVEL_KEYS = {
    "completed": "completed",
    "request_throughput": "request_throughput",
    "output_throughput": "output_tok_s",
    "total_throughput": "total_tok_s",
    "median_ttft_ms": "ttft_p50_ms",
    "p99_ttft_ms": "ttft_p99_ms",
    "median_itl_ms": "itl_p50_ms",
    "p99_itl_ms": "itl_p99_ms",
    "median_tpot_ms": "tpot_p50_ms",
}


def _num(value):
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def summarize(results, reference_concurrency, meta=None, accept_length=None):
    """One summary from the benchmark's per-level results (one dict per level, as
    sglang.benchmark.serving writes them to its --output-file).

    Single-stream output tok/s is the decode speed of one stream: 1000 / median TPOT at
    concurrency 1 (the time to the first token excluded, as public single-stream figures
    are quoted)."""
    levels = []
    for raw in sorted(results, key=lambda r: int(r["max_concurrency"])):
        level = {"concurrency": int(raw["max_concurrency"])}
        for theirs, ours in LEVEL_KEYS.items():
            level[ours] = _num(raw.get(theirs))
        levels.append(level)
    by_level = {level["concurrency"]: level for level in levels}
    single = by_level.get(1, {})
    reference = by_level.get(int(reference_concurrency), {})
    tpot = single.get("tpot_p50_ms")
    figures = {
        "single_stream_tok_s": round(1000.0 / tpot, 2) if tpot else None,
        "throughput_tok_s": reference.get("output_tok_s"),
        "ttft_p99_ms": reference.get("ttft_p99_ms"),
    }
    return {**(meta or {}), "reference_concurrency": int(reference_concurrency), "levels": levels,
            "figures": figures, "spec_accept_length": _num(accept_length)}


def compare(current, base):
    """Rows comparing two figure dicts: figure, label, unit, current, base, change_pct
    (signed, relative to base) and worse_pct (how much worse, >= 0 when worse)."""
    rows = []
    for key, label, unit, better in FIGURES:
        now, then = _num((current or {}).get(key)), _num((base or {}).get(key))
        change = round((now - then) / then * 100.0, 2) if now is not None and then else None
        worse = None if change is None else (-change if better == "higher" else change)
        rows.append({"figure": key, "label": label, "unit": unit, "current": now, "base": then,
                     "change_pct": change, "worse_pct": worse})
    return rows


def gate_failures(summary, bases, max_drop_pct, max_ttft_rise_pct):
    """Messages for every gated figure that got worse than its threshold against any base.

    bases: a list of {"name": ..., "figures": {...}} (the previous release's results, the
    recipe's baseline file). Each message names the figure, both values, the release and the
    base it is compared with."""
    limits = {"single_stream_tok_s": float(max_drop_pct), "throughput_tok_s": float(max_drop_pct),
              "ttft_p99_ms": float(max_ttft_rise_pct)}
    failures = []
    release = summary.get("release", "?")
    for base in bases or []:
        for row in compare(summary.get("figures"), base.get("figures")):
            limit = limits[row["figure"]]
            if row["worse_pct"] is None or row["worse_pct"] <= limit:
                continue
            verb = "dropped" if row["figure"] != "ttft_p99_ms" else "rose"
            failures.append(
                f"{row['label']} {verb} {abs(row['change_pct']):.1f} % (limit {limit:g} %): "
                f"{row['current']:g} {row['unit']} on release {release} against {row['base']:g} {row['unit']} "
                f"in {base['name']}")
    return failures


_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


def metric_mean(text, name):
    """The mean of a Prometheus exposition's samples of one metric (all label sets), or None
    when it has none (non-finite values are left out)."""
    values = []
    for line in (text or "").splitlines():
        match = _SAMPLE.match(line.strip())
        if match and match.group("name") == name:
            value = _num(match.group("value"))
            if value is not None:
                values.append(value)
    return round(sum(values) / len(values), 3) if values else None


class FilterModule:
    def filters(self):
        return {
            "acceptance_summary": summarize,
            "acceptance_compare": compare,
            "acceptance_gate_failures": gate_failures,
            "acceptance_metric_mean": metric_mean,
        }
