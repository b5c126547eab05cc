"""Validate a new release before `current` moves to it (run with the release's own venv).

    venv/bin/python validate_release.py --device cpu|cuda [--plugin NAME] CONFIG.yaml ...

* Every engine config goes through SGLang's own argument parser, `prepare_server_args(
  ["--config", FILE])`, from the new venv: a misspelt flag or an invalid value fails here,
  with the engine's name and the argument. On a host without a GPU, `--device cpu` is
  appended for the check only (argument resolution otherwise looks for an accelerator).
* The plugin (our sm120_kernels wheel) must be discovered by SGLang's plugin loader in
  the `sglang.srt.plugins` entry-point group.

Prints one JSON document; exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import re
import sys
from pathlib import Path


def parse_engine(config: str, device: str) -> dict:
    from sglang.srt.server_args import prepare_server_args

    argv = ["--config", config] + (["--device", device] if device == "cpu" else [])
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            sa = prepare_server_args(argv)
    except SystemExit:
        text = err.getvalue()
        found = re.findall(r"^sglang serve: error: (.*)$", text, re.M)
        message = found[-1] if found else (text.strip().splitlines() or ["argument parser exited"])[-1]
        # Invalid choices list every choice: keep the message readable.
        message = re.sub(r"\(choose from ([^)]{160})[^)]*\)", r"(choose from \1...)", message)
        return {"ok": False, "error": message}
    except Exception as exc:  # noqa: BLE001 - every failure is reported per engine
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "tp_size": sa.tp_size, "port": sa.port,
            "disaggregation_mode": str(sa.disaggregation_mode)}


def check_plugin(name: str) -> dict:
    from importlib.metadata import version

    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    if name not in found:
        return {"ok": False, "error": f"plugin {name!r} is not discovered in entry-point group "
                f"{GENERAL_PLUGINS_GROUP} (found: {sorted(found)})"}
    dist = found[name][1]
    return {"ok": True, "plugin": name, "distribution": dist, "version": version(dist) if dist else None,
            "group": GENERAL_PLUGINS_GROUP}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--plugin", default="")
    ap.add_argument("configs", nargs="*")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    result = {"engines": {}, "errors": []}
    for config in args.configs:
        name = Path(config).stem
        res = parse_engine(config, args.device)
        result["engines"][name] = res
        if not res["ok"]:
            result["errors"].append(f"engine {name}: {res['error']}")
    if args.plugin:
        res = check_plugin(args.plugin)
        result["plugin"] = res
        if not res["ok"]:
            result["errors"].append(res["error"])
    logging.disable(logging.NOTSET)
    print(json.dumps(result))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
