"""The acceptance role's figures (roles/sglang_acceptance/filter_plugins/acceptance.py): the
summary of sglang.benchmark.serving's results, the comparison, the regression gate and the
accept length read from /metrics; and preflight's refusal of gate inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from repo_module import load

REPO = Path(__file__).resolve().parents[2]



acc = load("acceptance", REPO / "roles/sglang_acceptance/filter_plugins/acceptance.py")
checks = load("preflight_checks", REPO / "roles/preflight/filter_plugins/preflight_checks.py")


def level(c, tpot, out, ttft99, **extra):
    """One level as sglang.benchmark.serving writes it (the keys the summary reads)."""
    return {"max_concurrency": c, "completed": 4 * c, "request_throughput": c / 2, "output_throughput": out,
            "total_throughput": out * 3, "median_ttft_ms": ttft99 / 2, "p99_ttft_ms": ttft99,
            "median_itl_ms": tpot, "p99_itl_ms": tpot * 2, "median_tpot_ms": tpot, **extra}


RESULTS = [level(8, 12.0, 600.0, 80.0), level(1, 10.0, 90.0, 50.0), level(32, 20.0, 1500.0, 120.0)]


def test_summary_reads_single_stream_from_tpot_and_the_reference_level():
    summary = acc.summarize(RESULTS, 8, {"release": "r2"}, accept_length=2.5)
    assert [x["concurrency"] for x in summary["levels"]] == [1, 8, 32]
    assert summary["figures"] == {"single_stream_tok_s": 100.0, "throughput_tok_s": 600.0, "ttft_p99_ms": 80.0}
    assert summary["levels"][0]["itl_p99_ms"] == 20.0
    assert summary["release"] == "r2" and summary["spec_accept_length"] == 2.5


def test_summary_without_the_reference_level_has_no_gated_throughput():
    summary = acc.summarize(RESULTS, 64)
    assert summary["figures"]["throughput_tok_s"] is None and summary["figures"]["ttft_p99_ms"] is None


def test_compare_signs_the_change_and_how_much_worse():
    rows = {r["figure"]: r for r in acc.compare({"single_stream_tok_s": 90, "throughput_tok_s": 660, "ttft_p99_ms": 110},
                                                {"single_stream_tok_s": 100, "throughput_tok_s": 600, "ttft_p99_ms": 100})}
    assert rows["single_stream_tok_s"]["change_pct"] == -10.0 and rows["single_stream_tok_s"]["worse_pct"] == 10.0
    assert rows["throughput_tok_s"]["change_pct"] == 10.0 and rows["throughput_tok_s"]["worse_pct"] == -10.0
    assert rows["ttft_p99_ms"]["worse_pct"] == 10.0


def test_compare_without_a_base_value_has_no_change():
    rows = acc.compare({"single_stream_tok_s": 90}, {})
    assert all(r["change_pct"] is None and r["worse_pct"] is None for r in rows)


@pytest.mark.parametrize("figures, failing", [
    ({"single_stream_tok_s": 95.0, "throughput_tok_s": 570.0, "ttft_p99_ms": 110.0}, []),  # at the limits
    ({"single_stream_tok_s": 94.9, "throughput_tok_s": 600.0, "ttft_p99_ms": 100.0}, ["single-stream output tok/s"]),
    ({"single_stream_tok_s": 100.0, "throughput_tok_s": 569.0, "ttft_p99_ms": 100.0}, ["output throughput"]),
    ({"single_stream_tok_s": 100.0, "throughput_tok_s": 600.0, "ttft_p99_ms": 110.5}, ["p99 TTFT"]),
    ({"single_stream_tok_s": 200.0, "throughput_tok_s": 900.0, "ttft_p99_ms": 10.0}, []),  # better is fine
])
def test_gate_fails_beyond_the_thresholds_only(figures, failing):
    base = [{"name": "the results of release r1",
             "figures": {"single_stream_tok_s": 100.0, "throughput_tok_s": 600.0, "ttft_p99_ms": 100.0}}]
    found = acc.gate_failures({"release": "r2", "figures": figures}, base, 5, 10)
    assert len(found) == len(failing)
    for message, label in zip(found, failing):
        assert message.startswith(label)


def test_gate_message_names_figure_values_release_and_base():
    bases = [{"name": "the results of release r1", "figures": {"single_stream_tok_s": 100.0}},
             {"name": "baseline files/acceptance/baselines/m.yml", "figures": {"single_stream_tok_s": 1000.0}}]
    found = acc.gate_failures({"release": "r2", "figures": {"single_stream_tok_s": 80.0}}, bases, 5, 10)
    assert found == [
        "single-stream output tok/s dropped 20.0 % (limit 5 %): 80 tok/s on release r2 against 100 tok/s "
        "in the results of release r1",
        "single-stream output tok/s dropped 92.0 % (limit 5 %): 80 tok/s on release r2 against 1000 tok/s "
        "in baseline files/acceptance/baselines/m.yml"]


def test_gate_without_bases_or_figures_passes():
    assert acc.gate_failures({"release": "r", "figures": {"single_stream_tok_s": 1}}, [], 5, 10) == []
    assert acc.gate_failures({"release": "r", "figures": {"single_stream_tok_s": 1}},
                             [{"name": "baseline", "figures": {}}], 5, 10) == []


def test_metric_mean_reads_every_label_set_and_skips_others():
    text = "\n".join([
        "# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.",
        "# TYPE sglang:spec_accept_length gauge",
        'sglang:spec_accept_length{engine_type="decode",tp_rank="0"} 2.5',
        'sglang:spec_accept_length{engine_type="decode",tp_rank="1"} 3.5',
        'sglang:spec_accept_length_other{x="1"} 9',
        'sglang:num_running_reqs{tp_rank="0"} 4.0',
    ])
    assert acc.metric_mean(text, "sglang:spec_accept_length") == 3.0
    assert acc.metric_mean(text, "sglang:gen_throughput") is None
    assert acc.metric_mean("sglang:spec_accept_length NaN", "sglang:spec_accept_length") is None


# ----------------------------------------------------------------------------- preflight
RECIPE = {"bench": {"input_len": 2048, "output_len": 512, "reference_concurrency": 32, "context_length": 262144}}


def test_preflight_passes_the_shipped_recipes_and_baselines_with_the_gate_on():
    shipped = yaml.safe_load((REPO / "defaults/models.yml").read_text())["sglang_shipped_recipes"]
    for model, recipe in shipped.items():
        baseline = (REPO / "files/acceptance/baselines" / f"{model}.yml").read_text()
        assert checks.acceptance_errors({"sglang_acceptance_gate": True}, "h", model, recipe, baseline) == []


def test_preflight_ignores_gate_inputs_with_the_gate_off():
    assert checks.acceptance_errors({"sglang_acceptance_max_drop_pct": -1}, "h", "m", {}) == []


@pytest.mark.parametrize("variables, recipe, baseline, variable", [
    ({"sglang_acceptance_max_drop_pct": 0}, RECIPE, None, "sglang_acceptance_max_drop_pct"),
    ({"sglang_acceptance_max_ttft_rise_pct": "ten"}, RECIPE, None, "sglang_acceptance_max_ttft_rise_pct"),
    ({"sglang_acceptance_concurrency": [8, 32]}, RECIPE, None, "sglang_acceptance_concurrency"),
    ({}, {}, None, "sglang_model_recipes['m'].bench"),
    ({}, {"bench": {**RECIPE["bench"], "output_len": 0}}, None, "sglang_model_recipes['m'].bench.output_len"),
    ({}, {"bench": {**RECIPE["bench"], "reference_concurrency": 16}}, None,
     "sglang_model_recipes['m'].bench.reference_concurrency"),
    ({}, RECIPE, "gate: {single_stream_tok_s: fast}", "sglang_acceptance_baselines_dir"),
    ({}, RECIPE, "gate: [", "sglang_acceptance_baselines_dir"),
])
def test_preflight_refuses_gate_inputs_naming_host_variable_and_fix(variables, recipe, baseline, variable):
    errors = checks.acceptance_errors({"sglang_acceptance_gate": True, **variables}, "gpu-01", "m", recipe, baseline)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"gpu-01: {variable}: ") and " Fix: " in errors[0]


plot = load("plot_bench", REPO / "roles/sglang_acceptance/files/plot_bench.py")


def test_plot_draws_both_releases_into_a_png(tmp_path):
    import matplotlib.image

    current = acc.summarize(RESULTS, 8, {"release": "r2", "recipe": "kimi-k2.5-int4", "input_len": 64, "output_len": 32})
    previous = acc.summarize([level(1, 12.0, 80.0, 60.0), level(8, 14.0, 500.0, 90.0)], 8, {"release": "r1"})
    for name, prev in (("alone.png", None), ("both.png", previous)):
        plot.plot(current, tmp_path / name, prev)
    pixels = matplotlib.image.imread(tmp_path / "both.png")
    assert pixels.shape[:2] == (420, 1100)
    # the previous release's dashed lines add pixels to the same axes
    alone = matplotlib.image.imread(tmp_path / "alone.png")
    assert (pixels != alone).any()
    assert plot.series(current, "output_tok_s") == ([1, 8, 32], [90.0, 600.0, 1500.0])


def test_plot_skips_levels_without_the_figure():
    bench = {"levels": [{"concurrency": 1, "itl_p99_ms": None}, {"concurrency": 8, "itl_p99_ms": 3.0}]}
    assert plot.series(bench, "itl_p99_ms") == ([8], [3.0])
