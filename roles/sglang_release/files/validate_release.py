"""Validate a new release before `current` moves to it (run with the release's own venv).

    venv/bin/python validate_release.py --device cpu|cuda [--plugin NAME] CONFIG.yaml ...

* Every engine config goes through SGLang's own argument parser, `prepare_server_args(
  ["--config", FILE])`, from the new venv, then through `ServerArgs.resolve_once()`, which
  reads the model's config.json as `sglang serve` does: a misspelt flag, an invalid value
  or an argument the model refuses fails here, with the engine's name and the reason. On a host without a GPU, `--device cpu` is
  appended for the check only (argument resolution otherwise looks for an accelerator).
* Then every module the engine loads at its first start is imported, found through
  SGLang's own lookups on the resolved arguments (`check_loads`): the PD transfer
  backend's classes (`get_kv_class`) and the third-party engine they import lazily (read
  from SGLang's source: `import` statements without a fallback in their `__init__`, and in
  the shared transfer engine SGLang's bootstrap would build), the attention backends
  (`ATTENTION_BACKENDS`) and the modules their factories import, the model class
  (`ModelRegistry`), the quantization config the loader builds, the speculative worker
  and draft model class, and the tool-call and reasoning parsers. A missing module or
  shared library refuses the release, naming the engine, the module and the fix.
* The plugin (our sm120_kernels wheel) must be discovered by SGLang's plugin loader in
  the `sglang.srt.plugins` entry-point group, and every SGLang function it hooks (its
  `*HOOK_TARGETS` tables) must import.

Prints one JSON document; exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import io
import json
import logging
import pkgutil
import re
import sys
import textwrap
from multiprocessing import get_context
from pathlib import Path


def _last_error(text: str, fallback: str) -> str:
    found = re.findall(r"^sglang serve: error: (.*)$", text, re.M)
    message = found[-1] if found else ([line for line in text.strip().splitlines() if line.strip()] or [fallback])[-1]
    # Invalid choices list every choice: keep the message readable.
    return re.sub(r"\(choose from ([^)]{160})[^)]*\)", r"(choose from \1...)", message)


def _parse_and_resolve(config: str, device: str, loads: bool = True) -> dict:
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
    result = {"ok": True, "tp_size": sa.tp_size, "port": sa.port,
              "disaggregation_mode": str(sa.disaggregation_mode)}
    if loads:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
            result["loads"], problems = check_loads(sa)
        if problems:
            result.update(ok=False, error="; ".join(problems))
    return result


# ---------------------------------------------------------------- what an engine loads at start

# Shared libraries that compiled transfer engines link, and where a host gets them.
_LIBRARY_FIXES = {
    "libibverbs": "install Debian's libibverbs1 and ibverbs-providers on this host (mooncake links them even for TCP)",
    "libmlx5": "install Debian's libibverbs1 and ibverbs-providers on this host (mooncake links them even for TCP)",
    "libcuda": "install the NVIDIA driver on this host (it provides libcuda.so.1)",
    "libnuma": "install Debian's libnuma1 on this host",
}


def _fix_for(exc: BaseException, module: str) -> str:
    """The fix for a failed import: a shared library, a package the venv lacks, or SGLang itself."""
    text = str(exc)
    lib = re.search(r"(lib[\w+-]+)(\.so[\w.]*): cannot open shared object file", text)
    if lib:
        return _LIBRARY_FIXES.get(lib.group(1), f"install the system package that provides {lib.group(1)}{lib.group(2)} "
                                  "on this host")
    top = module.split(".")[0]
    if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] != "sglang":
        return (f"the release venv has no {exc.name.split('.')[0]!r} package: pin the package that provides it in "
                "files/sglang/requirements.lock (the release venv is built from it)")
    if top == "sglang":
        return "this SGLang cannot import it: pin an SGLang that can, or change the recipe argument that selects it"
    return f"repair or re-pin the {top!r} package in files/sglang/requirements.lock"


def _source_tree(fn):
    return ast.parse(textwrap.dedent(inspect.getsource(fn)))


def _swallows_import_error(handler: ast.ExceptHandler) -> bool:
    """An except clause that catches ImportError and does not raise: the import is optional."""
    names = [] if handler.type is None else [
        n.id if isinstance(n, ast.Name) else getattr(n, "attr", "")
        for n in (handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type])]
    catches = handler.type is None or {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"} & set(names)
    return bool(catches) and not any(isinstance(n, ast.Raise) for n in ast.walk(handler))


def _platform_branch(test: ast.expr, globals_: dict):
    """True/False for an `if` on module-level platform flags (`_is_npu`, `not _is_hip`); None
    otherwise. A flag naming cuda reads True: the release serves on CUDA even when checked on CPU."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _platform_branch(test.operand, globals_)
        return None if inner is None else not inner
    if isinstance(test, ast.Name) and isinstance(globals_.get(test.id), bool):
        return True if "cuda" in test.id.lower() else globals_[test.id]
    return None


def required_imports(fn) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of every absolute import in fn's body that runs when fn runs: branches
    on platform flags are followed as on a CUDA host; imports whose ImportError is swallowed
    (optional features) are left out."""
    found = []

    def visit(node, optional):
        if isinstance(node, ast.Try):
            swallowed = any(_swallows_import_error(h) for h in node.handlers)
            for child in node.body:
                visit(child, optional or swallowed)
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, optional)
            return
        if isinstance(node, ast.If):
            taken = _platform_branch(node.test, fn.__globals__)
            for child in (node.body if taken is not False else []) + (node.orelse if taken is not True else []):
                visit(child, optional)
            return
        if isinstance(node, ast.Import) and not optional:
            found.extend((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not optional and node.level == 0 and node.module:
            found.append((node.module, tuple(alias.name for alias in node.names)))
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                visit(child, optional)

    for node in _source_tree(fn).body[0].body:
        visit(node, False)
    return found


def constructed_classes(fn) -> list[type]:
    """SGLang classes fn constructs by name (`Engine(...)`), so their __init__ can be read too."""
    classes = []
    for node in ast.walk(_source_tree(fn)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            obj = fn.__globals__.get(node.func.id)
            if inspect.isclass(obj) and obj.__module__.startswith("sglang.") and obj not in classes:
                classes.append(obj)
    return classes


def _import(module: str, names=()) -> list[str]:
    """Import module (and each name from it) for real; the dotted names imported."""
    mod = importlib.import_module(module)
    done = []
    for name in names:
        if name == "*":
            continue
        if not hasattr(mod, name):
            importlib.import_module(f"{module}.{name}")
        done.append(f"{module}.{name}")
    return done or [module]


class _Loads:
    """What one engine loads at start, and the problems found; each step reports for itself."""

    def __init__(self):
        self.loaded: dict[str, list[str]] = {}
        self.problems: list[str] = []

    def add(self, what: str, *names: str) -> None:
        self.loaded.setdefault(what, []).extend(n for n in names if n not in self.loaded.get(what, []))

    def refuse(self, what: str, message: str, fix: str) -> None:
        self.problems.append(f"{what}: {message}. Fix: {fix}")

    def imports(self, what: str, module: str, names=()) -> None:
        try:
            self.add(what, *_import(module, names))
        except Exception as exc:  # noqa: BLE001 - ImportError, or OSError from a shared library
            self.refuse(what, f"cannot import {module} ({type(exc).__name__}: {exc})", _fix_for(exc, module))

    def lazy_imports(self, what: str, functions) -> None:
        """Import what SGLang imports inside these functions when the engine starts."""
        for fn in functions:
            self.add(what + " (read)", f"{fn.__module__}.{fn.__qualname__}")
            for module, names in required_imports(fn):
                self.imports(what, module, names)

    @contextlib.contextmanager
    def step(self, what: str, fix: str):
        """A lookup in SGLang's registries; an exception refuses with this fix."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - reported per engine
            module = getattr(exc, "name", None) or ""
            self.refuse(what, f"{type(exc).__name__}: {exc}",
                        _fix_for(exc, module) if isinstance(exc, ImportError) else fix)


def _transfer_backend(sa, loads: _Loads) -> None:
    """PD engines: the KV classes of the resolved backend (`mooncake_tcp` already reads
    `mooncake`) and the third-party engine their constructors import."""
    if str(sa.disaggregation_mode) in ("null", "None"):
        return
    from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class

    from sglang.srt.arg_groups.overrides import resolution_result

    # the resolution's value: SGLang's PD hook rewrites mooncake_tcp to mooncake on its record
    resolved = resolution_result(sa, "disaggregation_transfer_backend", sa.disaggregation_transfer_backend)
    what = f"PD transfer backend {resolved}"
    constructors = []
    with loads.step(what, "set sglang_release_transfer_backend to a backend this SGLang has"):
        backend = TransferBackend(resolved)
        for kind in (KVClassType.MANAGER, KVClassType.SENDER, KVClassType.RECEIVER, KVClassType.BOOTSTRAP_SERVER):
            cls = get_kv_class(backend, kind)
            if cls is None:  # the fake backend has no bootstrap server
                continue
            loads.add(what, f"{cls.__module__}.{cls.__qualname__}")
            constructors += [c.__dict__["__init__"] for c in cls.__mro__
                             if c.__module__.startswith("sglang.") and "__init__" in c.__dict__]
    loads.lazy_imports(what, constructors)


def _shared_transfer_engine(sa, loads: _Loads) -> None:
    """The shared Mooncake engine SGLang's process bootstrap builds (PD with mooncake, HiCache's
    mooncake storage, elastic EP): SGLang's own decision, with the construction recorded, not run."""
    from sglang.srt.distributed.device_communicators import mooncake_transfer_engine as mte
    from sglang.srt.runtime_context import publish

    what = "shared transfer engine"
    with loads.step(what, "check the engine's transfer and cache arguments"):
        publish(sa, role="scheduler")
        init, local_ip, calls = mte.init_mooncake_transfer_engine, mte.get_local_ip_auto, []
        # Building the engine needs the device and the network: record that SGLang would build it.
        mte.init_mooncake_transfer_engine = lambda **kwargs: calls.append(kwargs)
        mte.get_local_ip_auto = lambda *args, **kwargs: "127.0.0.1"
        try:
            mte.maybe_init_shared_mooncake_transfer_engine(gpu_id=0)
        finally:
            mte.init_mooncake_transfer_engine, mte.get_local_ip_auto = init, local_ip
        if calls:
            loads.lazy_imports(what, [init] + [cls.__init__ for cls in constructed_classes(init)])


def _attention(sa, loads: _Loads) -> None:
    """The resolved prefill/decode (and draft) attention backends: the registry's factories and
    the modules they import (the factories themselves need a model runner on the device)."""
    from sglang.srt.arg_groups.overrides import attention_backends_of
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    names = [b for b in attention_backends_of(sa) if b]
    if sa.speculative_algorithm and getattr(sa, "speculative_draft_attention_backend", None):
        names.append(sa.speculative_draft_attention_backend)
    for name in dict.fromkeys(names):
        what = f"attention backend {name}"
        factory = ATTENTION_BACKENDS.get(name)
        if factory is None:
            loads.refuse(what, "not in SGLang's attention backend registry",
                         f"set attention-backend to one of {sorted(ATTENTION_BACKENDS)}")
            continue
        loads.lazy_imports(what, [factory])


def _model_class(sa, loads: _Loads, what: str, **draft) -> None:
    """The model class SGLang's loader picks for the checkpoint's architectures, and the
    quantization config it builds for it."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.quantization import get_quantization_config
    from sglang.srt.model_loader.loader import _get_quantization_config
    from sglang.srt.model_loader.utils import get_model_architecture

    path = draft.get("model_path") or sa.model_path
    try:
        config = ModelConfig.from_server_args(sa, **draft)
    except Exception as exc:  # noqa: BLE001 - reported per engine
        loads.refuse(what, f"{type(exc).__name__}: {exc}", f"check {path}/config.json")
        return
    archs = list(getattr(config.hf_config, "architectures", None) or [])
    fix = f"serve {path} with an SGLang whose model registry has a class for {archs}, or fix its config.json"
    try:
        cls, arch = get_model_architecture(config)
    except Exception as exc:  # noqa: BLE001 - reported per engine; the quantization needs the class too
        loads.refuse(what, f"{type(exc).__name__}: {exc}", fix)
        return
    if arch not in archs and str(sa.model_impl) not in ("transformers", "ModelImpl.TRANSFORMERS"):
        loads.refuse(what, f"SGLang's model registry has no class for architectures {archs} of {path} "
                     f"(it would fall back to {arch}; a model module that failed to import is logged as "
                     "'Ignore import error when loading sglang.srt.models...')", fix)
        return
    loads.add(what, f"{cls.__module__}.{cls.__qualname__}")
    if config.quantization:
        quant = f"{what} quantization {config.quantization}"
        with loads.step(quant, "set the recipe's quantization to a method this SGLang has"):
            method = get_quantization_config(config.quantization)
            loads.add(quant, f"{method.__module__}.{method.__qualname__}")
            # The config the loader builds from the target's checkpoint metadata (not the draft's:
            # the lab's draft config.json is a stand-in without the published quantization block).
            if not draft:
                built = type(_get_quantization_config(config, LoadConfig()))
                loads.add(quant, f"{built.__module__}.{built.__qualname__}")


def _speculative(sa, loads: _Loads) -> None:
    """The speculative worker SGLang's scheduler creates, and the draft's model class (a separate
    draft, or the checkpoint's own head for MTP/EAGLE)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algorithm = SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    if algorithm.is_none():
        return
    what = f"speculative {sa.speculative_algorithm}"
    with loads.step(what, "set the recipe's speculative algorithm to one this SGLang has"):
        worker = algorithm.create_worker(sa)
        loads.add(what, f"{worker.__module__}.{worker.__qualname__}")
    if algorithm.is_ngram():  # no draft model
        return
    _model_class(sa, loads, f"{what} draft model", model_path=sa.speculative_draft_model_path or sa.model_path,
                 model_revision=sa.speculative_draft_model_revision, is_draft_model=True)


def _parsers(sa, loads: _Loads) -> None:
    """The tool-call and reasoning parsers by name in SGLang's registries ("auto" picks one from
    the chat template at start, which needs the tokenizer files)."""
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    for arg, name, registry in (("tool-call-parser", sa.tool_call_parser, FunctionCallParser.ToolCallParserEnum),
                                ("reasoning-parser", sa.reasoning_parser, ReasoningParser.DetectorMap)):
        if name in (None, "", "auto"):
            continue
        if name not in registry:
            loads.refuse(f"{arg} {name}", "not in SGLang's parser registry",
                         f"set {arg} in the recipe to one of {sorted(registry)}")
            continue
        cls = registry[name]
        loads.add(arg, f"{cls.__module__}.{cls.__qualname__}")


def check_loads(sa) -> tuple[dict, list[str]]:
    """Import what the engine with resolved arguments `sa` loads at its first start, through
    SGLang's own lookups. Returns (what -> modules and classes, problems)."""
    loads = _Loads()
    for check in (_transfer_backend, _shared_transfer_engine, _attention, _speculative, _parsers):
        with loads.step(check.__name__.strip("_").replace("_", " "), "see the error: this check could not run"):
            check(sa, loads)
    _model_class(sa, loads, "model")
    return loads.loaded, loads.problems


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
# on 2 cores), and the registries check_loads reads (the model registry imports every model
# module: 7 s), imported once in the parent so that each forked engine check takes a second.
# Importing has no engine-specific state; a module that fails here is imported again, and
# reported, in each engine's child.
MODULES_BEFORE_FORK = ("sglang.srt.server_args", "sglang.srt.arg_groups.resolution_hooks",
                       "sglang.srt.configs.model_config", "sglang.srt.models.registry",
                       "sglang.srt.model_loader.loader", "sglang.srt.disaggregation.utils",
                       "sglang.srt.layers.attention.attention_registry", "sglang.srt.speculative.spec_info",
                       "sglang.srt.function_call.function_call_parser", "sglang.srt.parser.reasoning_parser",
                       "sglang.srt.distributed.device_communicators.mooncake_transfer_engine")


def _import_before_fork() -> None:
    for module in MODULES_BEFORE_FORK:
        with contextlib.suppress(Exception):
            importlib.import_module(module)


def parse_engine(config: str, device: str, loads: bool = True) -> dict:
    """One engine config through SGLang's parser, then its resolution, as `sglang serve`
    does before loading weights: resolution reads the model's config.json and applies the
    model's own checks; then (loads) what the engine imports at start. Each engine in a
    forked child, so none sees another's state."""
    return run_forked(_parse_and_resolve, config, device, loads,
                      died={"ok": False, "error": "the validating process died"})


def check_plugin(name: str) -> dict:
    from importlib.metadata import version

    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    if name not in found:
        return {"ok": False, "error": f"plugin {name!r} is not discovered in entry-point group "
                f"{GENERAL_PLUGINS_GROUP} (found: {sorted(found)})"}
    register, dist = found[name]
    # The plugin declares the SGLang functions it hooks in its module's *HOOK_TARGETS tables.
    module = sys.modules[register.__module__]
    targets = [t for attr, table in vars(module).items() if attr.endswith("HOOK_TARGETS") and isinstance(table, dict)
               for t in table]
    if not targets:
        return {"ok": False, "error": f"plugin {name!r}: no *HOOK_TARGETS table in {module.__name__} (the validation "
                "reads its hook targets there). Fix: keep the targets in HOOK_TARGETS-named dicts"}
    missing = []
    for target in targets:
        try:
            pkgutil.resolve_name(target)
        except Exception as exc:  # noqa: BLE001 - each target is reported
            missing.append(f"{target} ({type(exc).__name__}: {exc})")
    if missing:
        return {"ok": False, "error": f"plugin {name!r} hooks SGLang functions this SGLang cannot import: "
                f"{'; '.join(missing)}. Fix: update the plugin's hook targets for this SGLang, or pin the SGLang "
                "it was written for"}
    return {"ok": True, "plugin": name, "distribution": dist, "version": version(dist) if dist else None,
            "group": GENERAL_PLUGINS_GROUP, "hook_targets": len(targets)}


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
