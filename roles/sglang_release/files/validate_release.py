"""Validate a new release before `current` moves to it (run with the release's own venv).

    venv/bin/python validate_release.py --device cpu|cuda [--plugin NAME] CONFIG.yaml ...

* Every engine config goes through SGLang's own argument parser, `prepare_server_args(
  ["--config", FILE])`, from the new venv, then through `ServerArgs.resolve_once()`, which
  reads the model's config.json as `sglang serve` does: a misspelt flag, an invalid value
  or an argument the model refuses fails here, with the engine's name and the reason. On a host without a GPU, `--device cpu` is
  appended for the check only (argument resolution otherwise looks for an accelerator).
* The plugin (our sm120_kernels wheel) must be discovered by SGLang's plugin loader in
  the `sglang.srt.plugins` entry-point group.

Prints one JSON document; exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import re
import sys
from multiprocessing import get_context
from pathlib import Path


def _last_error(text: str, fallback: str) -> str:
    found = re.findall(r"^sglang serve: error: (.*)$", text, re.M)
    message = found[-1] if found else ([line for line in text.strip().splitlines() if line.strip()] or [fallback])[-1]
    # Invalid choices list every choice: keep the message readable.
    return re.sub(r"\(choose from ([^)]{160})[^)]*\)", r"(choose from \1...)", message)


def _parse_and_resolve(config: str, device: str) -> dict:
    from sglang.srt.server_args import prepare_server_args

    argv = ["--config", config] + (["--device", device] if device == "cpu" else [])
    out = io.StringIO()
    step = "parse"
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
            sa = prepare_server_args(argv)
            step = "resolve"
            sa.resolve_once()
    except SystemExit:
        return {"ok": False, "error": _last_error(out.getvalue(), f"argument {step} exited")}
    except Exception as exc:  # noqa: BLE001 - every failure is reported per engine
        return {"ok": False, "error": f"{step}: {type(exc).__name__}: {exc}"}
    return {"ok": True, "tp_size": sa.tp_size, "port": sa.port,
            "disaggregation_mode": str(sa.disaggregation_mode)}


def _child(conn, fn, args) -> None:
    try:
        conn.send(fn(*args))
    finally:
        conn.close()


def run_forked(fn, *args, died):
    """fn(*args) in a forked child, so that no check sees another's state; `died` when the
    child ends without an answer."""
    _import_before_fork()
    ctx = get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(sender, fn, args))
    proc.start()
    sender.close()
    try:
        result = receiver.recv()
    except EOFError:
        result = died
    proc.join()
    return result


# What argument resolution imports (its hooks, the model configs: about 2,000 modules, 30 s
# on 2 cores), imported once in the parent so that each forked engine check takes a second.
# Importing has no engine-specific state; a module missing from another SGLang only costs time.
MODULES_BEFORE_FORK = ("sglang.srt.server_args", "sglang.srt.arg_groups.resolution_hooks",
                       "sglang.srt.configs.model_config")


def _import_before_fork() -> None:
    for module in MODULES_BEFORE_FORK:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)


def parse_engine(config: str, device: str) -> dict:
    """One engine config through SGLang's parser, then its resolution, as `sglang serve`
    does before loading weights: resolution reads the model's config.json and applies the
    model's own checks. Each engine in a forked child, so none sees another's state."""
    return run_forked(_parse_and_resolve, config, device,
                      died={"ok": False, "error": "the validating process died"})


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
