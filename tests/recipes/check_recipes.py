#!/usr/bin/env python3
"""Every engine of every layout of the shipped recipes, as the release validates it.

    .venv-sglang/bin/python tests/recipes/check_recipes.py

Renders each engine's config with the sglang_release role's own renderer (model path:
molecule/examples/models/<recipe>, the model's published config.json and no weights; a
separate speculative draft: molecule/examples/models/<recipe>-draft), with the recipe's
speculative decoding as shipped (every layout) and switched off (the co-located layout),
then runs the role's validate_release.parse_engine() on it: SGLang 0.5.23's parser and
its resolution against the model's config, with `--device cpu`. One line per engine;
exit status 1 when any engine fails or a recipe has no config.json here.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.dont_write_bytecode = True  # import the role's modules without leaving caches in roles/
sys.path[:0] = [str(REPO / "roles/sglang_release/filter_plugins"), str(REPO / "roles/sglang_release/files")]

from sglang_release import engine_args  # noqa: E402  (the role's renderer)
from validate_release import parse_engine  # noqa: E402  (the role's validation)

MODELS = REPO / "molecule/examples/models"


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
    print(f"{failures} failed, in {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
