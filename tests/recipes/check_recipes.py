#!/usr/bin/env python3
"""Every engine of every layout of the shipped recipes, as the release validates it.

    .venv-sglang/bin/python tests/recipes/check_recipes.py

Renders each engine's config with the sglang_release role's own renderer (model path:
molecule/examples/models/<recipe>, the model's published config.json and no weights; a
separate speculative draft: molecule/examples/models/<recipe>-draft), with the recipe's
speculative decoding as shipped (every layout) and switched off (the co-located layout),
then runs the role's validate_release.parse_engine() on it: SGLang 0.5.23's parser and
its resolution against the model's config, with `--device cpu`, and the import of every
module the engine loads at start (on a machine without the NVIDIA driver, with the
libcuda.so.1 test double of molecule/shared/libcuda_stub loaded first). Then, once per recipe,
SGLang's model loader builds the quantization config the engines would load the weights
with, which must be the one the checkpoint needs (QUANT_CONFIG). One line per check;
exit status 1 when any check fails or a recipe has no config.json here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.dont_write_bytecode = True  # import the role's modules without leaving caches in roles/
sys.path[:0] = [str(REPO / "roles/sglang_release/filter_plugins"), str(REPO / "roles/sglang_release/files")]

from sglang_release import engine_args  # noqa: E402  (the role's renderer)
from validate_release import parse_engine, run_forked  # noqa: E402  (the role's validation)

MODELS = REPO / "molecule/examples/models"
LIBCUDA_STUB = REPO / "molecule/shared/libcuda_stub/build.sh"
# The quantization config SGLang's loader must build for each shipped checkpoint: the hybrid
# FP8 attention + NVFP4 experts of DeepSeek-V4-Flash-NVFP4, Kimi-K2.5's compressed-tensors INT4.
QUANT_CONFIG = {"deepseek-v4-flash-nvfp4": "HybridFp8NvFp4Config", "kimi-k2.5-int4": "CompressedTensorsConfig"}


def ensure_libcuda(workdir: Path) -> str:
    """Load libcuda.so.1 into this process, the stub (a test double) where no NVIDIA driver is
    installed: the PD engines' transfer engine (mooncake.engine) links it. Returns its path."""
    found = ctypes.util.find_library("cuda")
    if found:
        return found
    site = next((p for p in sys.path if p.endswith("site-packages") and (Path(p) / "mooncake").is_dir()), "")
    stub = subprocess.run([str(LIBCUDA_STUB), str(workdir / "libcuda-stub")] + ([site] if site else []), check=True,
                          capture_output=True, text=True).stdout.strip()
    ctypes.CDLL(stub, mode=ctypes.RTLD_GLOBAL)  # later dlopen("libcuda.so.1") finds it loaded
    return stub


def _quant_config(config: str) -> str:
    """The class name of the quantization config SGLang's loader builds for CONFIG."""
    try:
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader.loader import _get_quantization_config
        from sglang.srt.server_args import prepare_server_args

        server_args = prepare_server_args(["--config", config, "--device", "cpu"])
        server_args.resolve_once()
        return type(_get_quantization_config(ModelConfig.from_server_args(server_args), LoadConfig())).__name__
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure
        return f"{type(exc).__name__}: {exc}"


def check_quant_config(workdir, name, engine, recipe, model_dir) -> int:
    """The quantization config the loader builds from the rendered engine; 1 when it is not
    the checkpoint's (in a forked child, as the engine checks)."""
    path = workdir / f"{name}.quant.yaml"
    path.write_text(yaml.safe_dump(engine_args(engine, recipe, str(model_dir), "127.0.0.1")))
    built = run_forked(_quant_config, str(path), died="the checking process died")
    wanted = QUANT_CONFIG.get(name, "(no expectation in QUANT_CONFIG)")
    if built == wanted:
        print(f"ok   {name} quantization {recipe.get('quantization')!r}: the loader builds {built}")
        return 0
    print(f"FAIL {name} quantization {recipe.get('quantization')!r}: the loader builds {built}, not {wanted}")
    return 1


def check_engine(workdir, name, spec, layout, engine, recipe, model_dir) -> int:
    """One engine's config through the role's validation; 1 when it fails."""
    path = workdir / f"{name}.{layout}.{engine['name']}.spec-{spec}.yaml"
    path.write_text(yaml.safe_dump(engine_args(engine, recipe, str(model_dir), "127.0.0.1")))
    result = parse_engine(str(path), "cpu")
    label = f"{name} {layout} {engine['name']} ({engine['mode']}, speculative {spec})"
    if result["ok"]:
        print(f"ok   {label}: tp {result['tp_size']}, {result['disaggregation_mode']}")
        return 0
    print(f"FAIL {label}: {result['error']}")
    return 1


def main() -> int:
    started = time.monotonic()
    recipes = yaml.safe_load((REPO / "defaults/models.yml").read_text())["sglang_shipped_recipes"]
    workdir = Path(tempfile.mkdtemp(prefix="check-recipes-"))
    # Offline, as the engine units run; remote-code modules go to a private cache.
    os.environ.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(workdir / "hf_modules"))
    print(f"libcuda.so.1: {ensure_libcuda(workdir)}")
    failures = 0
    for name, recipe in sorted(recipes.items()):
        model_dir = MODELS / name
        if not (model_dir / "config.json").is_file():
            print(f"FAIL {name}: {model_dir}/config.json is missing")
            failures += 1
            continue
        for spec in ("on", "off"):
            variant = {**recipe, "speculative": {**(recipe.get("speculative") or {}), "enabled": spec == "on"}}
            for layout, engines in sorted(recipe["layouts"].items()):
                # Switched off, the speculative arguments leave every engine alike: one layout will do.
                if spec == "off" and layout != "unified_tp8":
                    continue
                for engine in engines:
                    failures += check_engine(workdir, name, spec, layout, engine, variant, model_dir)
        failures += check_quant_config(workdir, name, recipe["layouts"]["unified_tp8"][0], recipe, model_dir)
    print(f"{failures} failed, in {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
