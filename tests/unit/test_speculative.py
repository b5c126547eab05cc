"""Speculative decoding: the recipes' speculative block, as sglang_release renders it into
every engine and as preflight refuses it before any change (one test per guard; each guard is
also a bad-input case in roles/preflight/molecule/default/cases.yml)."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import pytest
import yaml
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
sys.dont_write_bytecode = True



checks = load("preflight_checks", REPO / "roles/preflight/filter_plugins/preflight_checks.py")
release = load("sglang_release", REPO / "roles/sglang_release/filter_plugins/sglang_release.py")
RECIPES = yaml.safe_load((REPO / "defaults/models.yml").read_text())["sglang_shipped_recipes"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
MESSAGE = re.compile(r"^[\w.-]+: [\w\[\]().' -]+: .+[.;)] Fix: .+\.$")
PD = [{"name": "prefill-0", "mode": "prefill", "gpus": [0, 1, 2, 3], "port": 30000, "bootstrap_port": 8998},
      {"name": "decode-0", "mode": "decode", "gpus": [4, 5, 6, 7], "port": 30001}]


def _recipe(name, **speculative):
    recipe = copy.deepcopy(RECIPES[name])
    recipe["hf_revision"] = COMMIT
    if recipe["speculative"].get("draft_hf_repo"):
        recipe["speculative"]["draft_hf_revision"] = COMMIT
    recipe["speculative"].update(speculative)
    return recipe


def _errors(name, recipe):
    errors = checks.recipe_errors(name, {name: recipe}, "gpu-box-1")
    for error in errors:
        assert MESSAGE.match(error), error
    return errors


# ------------------------------------------------------------------------ the shipped recipes
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_shipped_recipes_pass_once_pinned(name):
    assert _errors(name, _recipe(name)) == []


def test_deepseek_uses_the_mtp_head_and_kimi_an_eagle3_draft():
    ds, kimi = RECIPES["deepseek-v4-flash-nvfp4"]["speculative"], RECIPES["kimi-k2.5-int4"]["speculative"]
    # SGLang 0.5.23's DeepSeek-V4 hook: EAGLE with topk 1, or DSPARK.
    assert ds["enabled"] and ds["algorithm"] == "EAGLE" and ds["eagle_topk"] == 1 and "draft_hf_repo" not in ds
    assert ds["moe_runner_backend"] == RECIPES["deepseek-v4-flash-nvfp4"]["args"]["moe-runner-backend"]
    assert kimi["enabled"] and kimi["algorithm"] == "EAGLE3" and kimi["draft_hf_repo"]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_engine_gets_the_same_speculative_arguments(name):
    recipe = RECIPES[name]
    rendered = [release.engine_args(engine, recipe, "/srv/models/" + name, "10.0.0.1")
                for engines in recipe["layouts"].values() for engine in engines]
    specs = [{k: v for k, v in args.items() if k.startswith("speculative-")} for args in rendered]
    assert specs[0] and all(spec == specs[0] for spec in specs)
    assert specs[0]["speculative-algorithm"] == recipe["speculative"]["algorithm"]
    if recipe["speculative"].get("draft_hf_repo"):
        assert specs[0]["speculative-draft-model-path"] == f"/srv/models/{name}-draft"
    layout = {"h": {"address": "10.0.0.1", "engines": {
        e["name"]: {"mode": e["mode"], "args": release.engine_args(e, recipe, "/m", "10.0.0.1")}
        for e in recipe["layouts"]["pd_tp4"]}}}
    assert release.cross_engine_errors(layout) == []


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_switched_off_renders_no_speculative_argument(name):
    recipe = _recipe(name, enabled=False)
    args = release.engine_args(RECIPES[name]["layouts"]["pd_tp4"][1], recipe, "/m", "10.0.0.1")
    assert not [k for k in args if k.startswith("speculative-")]
    assert _errors(name, _recipe(name, enabled=False, draft_hf_revision="main")) == []


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_preflight_sees_the_block_as_the_release_renders_it(name):
    rendered = release.speculative_args(RECIPES[name], "/m")
    mirrored = checks._speculative_block(RECIPES[name])
    assert set(rendered) == set(mirrored)
    assert {k: v for k, v in rendered.items() if k != "speculative-draft-model-path"} == \
           {k: v for k, v in mirrored.items() if k != "speculative-draft-model-path"}


# ---------------------------------------------------------------------------------- guards
def test_eagle_with_an_eagle3_draft_is_refused():
    errors = _errors("kimi-k2.5-int4", _recipe("kimi-k2.5-int4", algorithm="EAGLE"))
    assert len(errors) == 1 and errors[0].startswith(
        "gpu-box-1: sglang_model_recipes['kimi-k2.5-int4'].speculative.algorithm: is EAGLE, which drafts with "
        "the checkpoint's own MTP head, but draft_hf_repo names a separate EAGLE-3 draft (nvidia/Kimi-K2.5-Thinking-Eagle3)")
    assert "Fix: set algorithm: EAGLE3 for the draft" in errors[0]
    # And EAGLE3 without a draft has nothing to draft with.
    errors = _errors("deepseek-v4-flash-nvfp4", _recipe("deepseek-v4-flash-nvfp4", algorithm="EAGLE3"))
    assert len(errors) == 1 and ".speculative.draft_hf_repo: is missing; EAGLE3 needs" in errors[0]


@pytest.mark.parametrize("unset", ["num_steps", "eagle_topk", "num_draft_tokens"])
def test_steps_topk_and_draft_tokens_only_together(unset):
    errors = _errors("deepseek-v4-flash-nvfp4", _recipe("deepseek-v4-flash-nvfp4", **{unset: None}))
    assert len(errors) == 1
    assert f"sglang_model_recipes['deepseek-v4-flash-nvfp4'].speculative.{unset}: is unset while " in errors[0]
    assert "Fix: set num_steps, eagle_topk and num_draft_tokens together" in errors[0]
    # None of them: SGLang chooses.
    none = {field: None for field in ("num_steps", "eagle_topk", "num_draft_tokens")}
    assert _errors("deepseek-v4-flash-nvfp4", _recipe("deepseek-v4-flash-nvfp4", **none)) == []
    errors = _errors("deepseek-v4-flash-nvfp4", _recipe("deepseek-v4-flash-nvfp4", num_steps=0))
    assert len(errors) == 1 and ".speculative.num_steps: 0 is not a positive whole number." in errors[0]


@pytest.mark.parametrize("revision", ["", "main", "a92f577", "v1.0"])
def test_draft_revision_must_be_a_commit(revision):
    errors = _errors("kimi-k2.5-int4", _recipe("kimi-k2.5-int4", draft_hf_revision=revision))
    assert len(errors) == 1 and errors[0].startswith(
        f"gpu-box-1: sglang_model_recipes['kimi-k2.5-int4'].speculative.draft_hf_revision: {revision!r} is not a commit hash")
    assert "sglang_recipe_overrides: {kimi-k2.5-int4: {speculative: {draft_hf_revision: <commit>}}}." in errors[0]
    # The shipped recipe pins its draft (the snapshot NVIDIA's Dynamo recipe serves); hf_revision
    # is the operator's to pin.
    shipped = copy.deepcopy(RECIPES["kimi-k2.5-int4"])
    assert shipped["speculative"]["draft_hf_revision"] == "0b0c6ac039089ad2c2418c91c039553381a302d9"
    assert [e for e in _errors("kimi-k2.5-int4", shipped) if "draft" in e] == []
    shipped["hf_revision"] = COMMIT
    assert _errors("kimi-k2.5-int4", shipped) == []


def test_speculative_arguments_that_differ_between_prefill_and_decode():
    recipe = _recipe("deepseek-v4-flash-nvfp4")
    recipe["mode_args"] = {"prefill": {}, "decode": {"speculative-num-steps": 2}}
    errors = checks.speculative_errors({"a": {"sglang_engines": PD}}, ["a"], recipe, "ds")
    assert len(errors) == 1 and MESSAGE.match(errors[0])
    assert errors[0].startswith("a: sglang_model_recipes['ds'].mode_args.decode: --speculative-num-steps is 2 on "
                                "engine decode-0 (decode, a) but 3 on engine prefill-0 (prefill, a);")
    assert "Fix: set them once in the recipe's speculative block (sglang_model_recipes['ds'].speculative)" in errors[0]
    # The block alone is identical on every engine.
    assert checks.speculative_errors({"a": {"sglang_engines": PD}}, ["a"], _recipe("deepseek-v4-flash-nvfp4"), "ds") == []


@pytest.mark.parametrize("where", ["recipe", "mode", "host", "engine"])
def test_fp8_kv_cache_on_kimi_is_refused(where):
    recipe = _recipe("kimi-k2.5-int4")
    hostvars = {"a": {"sglang_engines": copy.deepcopy(PD)}}
    if where == "recipe":
        recipe["args"]["kv-cache-dtype"] = "fp8_e4m3"
    elif where == "mode":
        recipe["mode_args"]["decode"] = {"kv_cache_dtype": "fp8_e5m2"}
    elif where == "host":
        hostvars["a"]["sglang_release_engine_args"] = {"kv-cache-dtype": "fp8_e4m3"}
    else:
        hostvars["a"]["sglang_engines"][1]["args"] = {"kv-cache-dtype": "fp8_e4m3"}
    errors = checks.kv_cache_errors(hostvars, ["a"], recipe, "kimi-k2.5-int4")
    assert len(errors) == 1 and MESSAGE.match(errors[0]), errors
    assert "--kv-cache-dtype is 'fp8_e" in errors[0] and "Fix: remove kv-cache-dtype" in errors[0]
    variable = {"recipe": "sglang_model_recipes['kimi-k2.5-int4'].args",
                "mode": "sglang_model_recipes['kimi-k2.5-int4'].mode_args.decode",
                "host": "sglang_release_engine_args", "engine": "sglang_engines[1] (decode-0).args"}[where]
    assert errors[0].startswith(f"a: {variable}: ")
    # DeepSeek-V4 resolves its own FP8 KV cache; auto is fine on Kimi.
    assert checks.kv_cache_errors(hostvars, ["a"], _recipe("deepseek-v4-flash-nvfp4"), "deepseek-v4-flash-nvfp4") == []
    recipe = _recipe("kimi-k2.5-int4")
    recipe["args"]["kv-cache-dtype"] = "auto"
    assert checks.kv_cache_errors({"a": {"sglang_engines": PD}}, ["a"], recipe, "kimi-k2.5-int4") == []


SPECULATIVE_CASES = ("speculative", "EAGLE", "draft revision", "FP8 KV cache")


@pytest.mark.parametrize("case", [c for c in yaml.safe_load(
    (REPO / "roles/preflight/molecule/default/cases.yml").read_text())["preflight_cases"]
    if any(word in c["name"] for word in SPECULATIVE_CASES)], ids=lambda c: c["name"])
def test_the_bad_input_cases_match_these_guards(case):
    """Each speculative case's expected patterns match what the guards say for its inputs (the
    molecule scenario runs them through site.yml; this keeps the patterns and messages in step)."""
    model = case["vars"].get("sglang_model", "lab-tiny")
    recipes = case["vars"].get("sglang_model_recipes",
                               {"lab-tiny": {"path": "/p", "served_model_name": "t", "quantization": "none", "disk_gb": 1}})
    hosts = {h: {"sglang_engines": case["vars"].get("sglang_engines", PD)} for h in ("preflight-debian12", "preflight-debian13")}
    said = [e for h in hosts for e in checks.recipe_errors(model, recipes, h)]
    said += checks.speculative_errors(hosts, list(hosts), recipes[model], model)
    said += checks.kv_cache_errors(hosts, list(hosts), recipes[model], model)
    for pattern in case["expect"]:
        assert re.search(pattern, "\n".join(said), re.S), (pattern, said)
