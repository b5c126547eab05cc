"""The release validation imports what each engine loads at start, and refuses what is missing.

    .venv-sglang/bin/python -m pytest -q tests/recipes

A PD prefill engine of the kimi-k2.5-int4 recipe, rendered as the role renders it (model:
molecule/examples/models, config.json only), goes through the role's validate_release.py:
from a copy of .venv-sglang without the transfer package (refused, naming the engine,
`mooncake` and the fix), and from .venv-sglang itself (passes, having imported
mooncake.engine). On a machine without the NVIDIA driver the libcuda.so.1 test double of
molecule/shared/libcuda_stub stands in for it.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import check_recipes  # noqa: E402  (puts the role's renderer and validation on sys.path)
from sglang_release import engine_args  # noqa: E402
from validate_release import _fix_for, _Loads, _parsers, check_loads, parse_engine, run_forked  # noqa: E402

REPO = check_recipes.REPO
VALIDATE = REPO / "roles/sglang_release/files/validate_release.py"
RECIPE = "kimi-k2.5-int4"
ENGINE = "prefill-0"
SITE = Path(next(p for p in sys.path if p.endswith("site-packages") and (Path(p) / "sglang").is_dir()))


def _render(directory: Path, name: str, **args) -> Path:
    """The recipe's prefill engine as the role renders it, with `args` changed."""
    recipe = yaml.safe_load((REPO / "defaults/models.yml").read_text())["sglang_shipped_recipes"][RECIPE]
    engine = next(e for e in recipe["layouts"]["pd_tp4"] if e["name"] == ENGINE)
    rendered = {**engine_args(engine, recipe, str(check_recipes.MODELS / RECIPE), "127.0.0.1"), **args}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(rendered))
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("release-loads")
    os.environ.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(path / "hf_modules"))
    check_recipes.ensure_libcuda(path)
    return path


def _validate(python: Path, config: Path, workdir: Path) -> tuple[int, dict]:
    """validate_release.py as the role runs it, from `python`'s venv."""
    env = {**os.environ, "SGLANG_PLUGINS": ""}
    found = ctypes.util.find_library("cuda")
    if not found:  # the test double, built by ensure_libcuda
        env["LD_LIBRARY_PATH"] = str(workdir / "libcuda-stub")
    proc = subprocess.run([str(python), str(VALIDATE), "--device", "cpu", str(config)], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no JSON from validate_release.py (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return proc.returncode, json.loads(lines[-1])


@pytest.fixture(scope="module")
def venv_without_mooncake(workdir) -> Path:
    """A copy of .venv-sglang without the transfer package: a fresh venv whose site-packages
    links every entry of .venv-sglang's except mooncake* (no reinstall)."""
    venv = workdir / "venv-no-mooncake"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / SITE.parent.name / "site-packages"
    for entry in SITE.iterdir():
        if not entry.name.lower().startswith("mooncake"):
            (site / entry.name).symlink_to(entry)
    return venv / "bin/python"


def test_missing_transfer_package_refuses_the_release(workdir, venv_without_mooncake):
    config = _render(workdir, ENGINE)
    rc, report = _validate(venv_without_mooncake, config, workdir)
    assert rc == 1, report
    error = next((e for e in report["errors"] if e.startswith(f"engine {ENGINE}:")), "")
    assert "mooncake" in error and "requirements.lock" in error, report["errors"]


def test_full_venv_imports_the_transfer_engine(workdir):
    config = _render(workdir, ENGINE)
    rc, report = _validate(Path(sys.executable), config, workdir)
    assert rc == 0, report["errors"]
    loads = report["engines"][ENGINE]["loads"]
    assert "mooncake.engine.TransferEngine" in loads["shared transfer engine"], loads
    assert any(c.endswith(".MooncakeKVManager") for c in loads["PD transfer backend mooncake"]), loads


def test_missing_shared_library_is_named_with_its_fix():
    """The compiled engine without libcuda.so.1 (a fresh process, stub not loaded) or libibverbs."""
    if ctypes.util.find_library("cuda"):
        pytest.skip("this host has the NVIDIA driver's libcuda.so.1")
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from validate_release import _Loads; "
            "loads = _Loads(); loads.imports('shared transfer engine', 'mooncake.engine'); print(json.dumps(loads.problems))")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run([sys.executable, "-c", code, str(VALIDATE.parent)], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout
    problems = json.loads(out.strip().splitlines()[-1])
    assert len(problems) == 1 and "libcuda.so.1" in problems[0] and "NVIDIA driver" in problems[0], problems
    ibverbs = ImportError("libibverbs.so.1: cannot open shared object file: No such file or directory")
    assert "libibverbs1 and ibverbs-providers" in _fix_for(ibverbs, "mooncake.engine")


def test_typo_in_tool_call_parser_is_refused(workdir):
    """By SGLang's parser (its choices), and by the registry check when a name gets past it."""
    result = parse_engine(str(_render(workdir, "typo", **{"tool-call-parser": "kimi-k2"})), "cpu")
    assert not result["ok"] and "kimi-k2" in result["error"], result
    loads = _Loads()
    _parsers(SimpleNamespace(tool_call_parser="kimi-k2", reasoning_parser="kimi_k2"), loads)
    assert len(loads.problems) == 1, loads.problems
    assert loads.problems[0].startswith("tool-call-parser kimi-k2: not in SGLang's parser registry"), loads.problems
    assert "kimi_k2" in loads.problems[0], loads.problems


def _loads_of(config: str) -> list[str]:
    """check_loads' problems for the resolved config."""
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(["--config", config, "--device", "cpu"])
    sa.resolve_once()
    return check_loads(sa)[1]


def test_model_without_a_class_is_refused(workdir):
    model = workdir / "no-such-model"
    model.mkdir()
    config = json.loads((check_recipes.MODELS / RECIPE / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    for extra in (check_recipes.MODELS / RECIPE).glob("*.py"):  # the remote-code config class
        (model / extra.name).symlink_to(extra)
    result = parse_engine(str(_render(workdir, "no-class", **{"model-path": str(model)})), "cpu")
    assert not result["ok"], result
    assert "NoSuchModelForCausalLM" in result["error"] and "model" in result["error"], result["error"]


def test_missing_model_module_is_refused(workdir):
    """A registry entry whose class cannot be found (the model module failed to import)."""
    result = run_forked(_without_model_class, str(_render(workdir, "no-module")), died=["the checking process died"])
    assert len(result) == 1 and result[0].startswith("model: "), result
    assert "KimiK25ForConditionalGeneration" in result[0] and "Fix: serve" in result[0], result


def _without_model_class(config: str) -> list[str]:
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.models.pop("KimiK25ForConditionalGeneration")  # as when kimi_k25.py fails to import
    return _loads_of(config)
