"""Cross-field checks of the user's inputs for the preflight role.

Each filter returns a list of error strings; an empty list means the input is sound.
Every error names the host, the variable (with its index) and the fix, so a user can
act on it without reading the role.
"""

from __future__ import annotations

import ipaddress
import re

ENGINE_MODES = ("prefill", "decode", "unified")
LOOPBACK_ONLY = {"127.0.0.1", "localhost", "::1"}
UNPINNED_WORDS = {"", "latest", "main", "master", "head", "stable", "nightly", "*", "any"}
RANGE_CHARS = re.compile(r"[*<>^~,|]|\.x$")


def _err(host: str, var: str, problem: str, fix: str) -> str:
    return f"{host}: {var}: {problem} Fix: {fix}"


def _engine_label(engine: dict, index: int) -> str:
    return f"sglang_engines[{index}]" + (f" ({engine['name']})" if engine.get("name") else "")


def engine_errors(engines, host, gpu_count, listen_address, reserved_ports=None):
    """Checks within one host: names, modes, GPU sets, parallelism, ports.

    reserved_ports: {owner: port} already taken on listen_address (the router's, when the
    router runs on this host).
    """
    errors = []
    if not isinstance(engines, list) or not engines:
        return [_err(host, "sglang_engines", "is empty or not a list; this host is in "
                     "sglang_engine_hosts and has no engine to run.",
                     "list at least one engine ({name, mode, gpus, port}) for this host, or "
                     "remove the host from sglang_engine_hosts.")]
    names, gpu_owner, bootstrap_owner = {}, {}, {}
    port_owner = {(str(listen_address), int(port)): f"router {owner}"
                  for owner, port in (reserved_ports or {}).items()}
    for i, engine in enumerate(engines):
        label = _engine_label(engine if isinstance(engine, dict) else {}, i)
        if not isinstance(engine, dict):
            errors.append(_err(host, label, f"is {type(engine).__name__}, not a mapping.",
                               "write each engine as {name: ..., mode: ..., gpus: [...], port: ...}."))
            continue
        missing = [k for k in ("name", "mode", "gpus", "port") if k not in engine]
        if missing:
            errors.append(_err(host, label, f"lacks {', '.join(missing)}.",
                               "give every engine a name, a mode, a gpus list and a port."))
            continue
        name = str(engine["name"])
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,40}", name):
            errors.append(_err(host, f"{label}.name", f"{name!r} is not a valid unit name part.",
                               "use lower-case letters, digits and '-' (e.g. prefill-0)."))
        if name in names:
            errors.append(_err(host, f"{label}.name", f"{name!r} is also the name of "
                               f"sglang_engines[{names[name]}].", "give every engine on a host its own name."))
        names.setdefault(name, i)
        mode = engine["mode"]
        if mode not in ENGINE_MODES:
            errors.append(_err(host, f"{label}.mode", f"{mode!r} is not an engine mode.",
                               f"use one of {', '.join(ENGINE_MODES)}."))
        gpus = engine["gpus"]
        if (not isinstance(gpus, list) or not gpus
                or not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus)):
            errors.append(_err(host, f"{label}.gpus", f"{gpus!r} is not a non-empty list of GPU indices.",
                               "list the GPU indices this engine uses, e.g. [0, 1, 2, 3]."))
            gpus = []
        for gpu in gpus:
            if not 0 <= gpu < gpu_count:
                errors.append(_err(host, f"{label}.gpus", f"GPU {gpu} does not exist; the host has "
                                   f"{gpu_count} GPUs (0-{gpu_count - 1}).",
                                   "use indices below sglang_gpu_count, or correct sglang_gpu_count for this host."))
            elif gpu in gpu_owner:
                errors.append(_err(host, f"{label}.gpus", f"GPU {gpu} is also used by {gpu_owner[gpu]}.",
                                   "give each engine on a host its own GPUs."))
            else:
                gpu_owner[gpu] = name
        if len(set(gpus)) != len(gpus):
            errors.append(_err(host, f"{label}.gpus", f"{gpus} lists a GPU twice.", "list each GPU once."))
        tp = engine.get("tp", len(gpus))
        dp = engine.get("dp", 1)
        if not isinstance(tp, int) or tp < 1 or tp & (tp - 1):
            errors.append(_err(host, f"{label}.tp", f"{tp!r} is not a power of two.",
                               "use a tensor-parallel size of 1, 2, 4 or 8."))
        elif not isinstance(dp, int) or dp < 1 or tp * dp != len(gpus):
            errors.append(_err(host, f"{label}.tp", f"tp {tp} x dp {dp} does not match the {len(gpus)} "
                               "GPUs in its gpus list.", "make tp x dp equal the number of GPUs, or leave tp unset."))
        ports = [("port", engine["port"])]
        if mode == "prefill":
            if "bootstrap_port" not in engine:
                errors.append(_err(host, f"{label}.bootstrap_port", "is missing; a prefill engine "
                                   "serves the KV-transfer bootstrap.",
                                   "set a bootstrap_port (e.g. 8998) unique on this host."))
            else:
                bport = engine["bootstrap_port"]
                if bport in bootstrap_owner:
                    errors.append(_err(host, f"{label}.bootstrap_port", f"{bport} is also the bootstrap "
                                       f"port of {bootstrap_owner[bport]}.", "give every prefill engine on a host its own bootstrap_port."))
                bootstrap_owner.setdefault(bport, name)
                ports.append(("bootstrap_port", bport))
        elif "bootstrap_port" in engine:
            errors.append(_err(host, f"{label}.bootstrap_port", f"is set on a {mode} engine; only prefill "
                               "engines serve the bootstrap.", "remove bootstrap_port from this engine."))
        address = str(engine.get("host", listen_address))
        for key, port in ports:
            if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
                errors.append(_err(host, f"{label}.{key}", f"{port!r} is not a port in 1024-65535.",
                                   "use an unprivileged TCP port."))
                continue
            owner = port_owner.get((address, port))
            if owner:
                errors.append(_err(host, f"{label}.{key}", f"{address}:{port} is also used by {owner}.",
                                   "give every listener on an address its own port."))
            port_owner.setdefault((address, port), f"{name}.{key}")
    return errors


def _is_loopback_only(address: str) -> bool:
    return address in LOOPBACK_ONLY


def topology_errors(hostvars, engine_hosts, router_hosts):
    """Checks across hosts: the PD layout as the router will see it."""
    errors = []
    layout = {}
    for host in engine_hosts:
        hv = hostvars[host]
        layout[host] = {
            "engines": hv.get("sglang_engines") or [],
            "listen_address": hv.get("sglang_listen_address") or hv.get("ansible_host") or host,
        }
    modes = {}
    for host, info in sorted(layout.items()):
        for engine in info.get("engines") or []:
            if isinstance(engine, dict) and engine.get("mode") in ENGINE_MODES:
                modes.setdefault(engine["mode"], []).append((host, engine))
    if not modes:
        return errors
    first_host = sorted(layout)[0]
    if "unified" in modes and ({"prefill", "decode"} & modes.keys()):
        errors.append(_err(first_host, "sglang_engines", "mixes unified engines with prefill/decode "
                           "engines; the router runs either in PD mode or in plain mode.",
                           "use only prefill and decode engines (PD) or only unified engines."))
    if ({"prefill", "decode"} & modes.keys()) and not {"prefill", "decode"} <= modes.keys():
        lacking = "decode" if "prefill" in modes else "prefill"
        errors.append(_err(first_host, "sglang_engines", f"a PD layout needs at least one prefill and "
                           f"one decode engine; no host has a {lacking} engine.",
                           f"add a {lacking} engine on a host in sglang_engine_hosts."))
    if not router_hosts:
        errors.append(_err(first_host, "sglang_router_hosts", "is empty; nothing routes requests to the engines.",
                           "put one host in the sglang_router_hosts group."))
    for router in router_hosts:
        for mode, entries in modes.items():
            for host, engine in entries:
                address = str(engine.get("host", layout[host].get("listen_address", "")))
                if host != router and _is_loopback_only(address):
                    errors.append(_err(host, f"sglang_engines ({engine.get('name')}).host",
                                       f"the engine listens on {address} only, so the router on "
                                       f"{router} cannot reach it.",
                                       "set sglang_listen_address (or the engine's host) to an address the router host can reach."))
    return errors


def recipe_errors(model, recipes, host):
    """The model recipe the hosts serve has what the release and engine roles need."""
    if not isinstance(recipes, dict) or model not in recipes:
        known = ", ".join(sorted(recipes)) if isinstance(recipes, dict) else "none"
        return [_err(host, "sglang_model", f"{model!r} names no recipe in sglang_model_recipes (known: {known}).",
                     "set sglang_model to one of the known recipes, or add a recipe for it.")]
    recipe = recipes[model]
    var = f"sglang_model_recipes[{model!r}]"
    errors = []
    if not isinstance(recipe, dict):
        return [_err(host, var, "is not a mapping.", "write the recipe as a mapping of its fields.")]
    has_hf = "hf_repo" in recipe
    has_path = "path" in recipe
    if has_hf == has_path:
        errors.append(_err(host, var, "needs exactly one source: hf_repo (with hf_revision) or path.",
                           "set hf_repo and hf_revision for a Hugging Face model, or path for local/NFS weights."))
    if has_hf:
        revision = str(recipe.get("hf_revision", ""))
        if not re.fullmatch(r"[0-9a-f]{40}", revision):
            errors.append(_err(host, f"{var}.hf_revision", f"{revision!r} is not a commit hash; a branch or "
                               "tag can move under a running deployment.",
                               "pin the model to the 40-character commit hash of the revision you tested."))
    for field in ("served_model_name", "quantization"):
        if not recipe.get(field):
            errors.append(_err(host, f"{var}.{field}", "is missing.", f"set {field} in the recipe."))
    disk = recipe.get("disk_gb")
    if not isinstance(disk, (int, float)) or isinstance(disk, bool) or disk <= 0:
        errors.append(_err(host, f"{var}.disk_gb", f"{disk!r} is not a positive size.",
                           "set disk_gb to the size of the weights in GB (the free-disk check uses it)."))
    return errors


def version_errors(variables, host):
    """Every *_version / *_revision variable in the inventory names one exact version."""
    errors = []
    for name in sorted(variables):
        if not re.search(r"_(version|revision)$", name) or name.startswith("ansible_"):
            continue
        value = variables[name]
        text = str(value).strip()
        if text.lower() in UNPINNED_WORDS or RANGE_CHARS.search(text):
            errors.append(_err(host, name, f"{text!r} is not a pinned version.",
                               "set the exact version (e.g. 580.95.05), never latest or a range."))
    return errors


def disk_errors(mounts, path, needed_gb, host, var, needed_for="model weights and one release"):
    """Free space on the filesystem that holds path (longest mount prefix)."""
    best = None
    for mount in mounts or []:
        point = mount.get("mount", "")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and (
                best is None or len(point) > len(best["mount"])):
            best = mount
    if best is None:
        return [_err(host, var, f"no mounted filesystem holds {path}.", "mount the storage for it, or point the variable elsewhere.")]
    free_gb = best.get("size_available", 0) / 1e9
    if free_gb < needed_gb:
        return [_err(host, var, f"{path} is on {best['mount']} with {free_gb:.0f} GB free; "
                     f"{needed_gb:.0f} GB are needed ({needed_for}).",
                     "free space there, or point the variable to a larger filesystem.")]
    return []


def valid_address(value):
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return value == "localhost"


class FilterModule:
    def filters(self):
        return {
            "preflight_engine_errors": engine_errors,
            "preflight_topology_errors": topology_errors,
            "preflight_recipe_errors": recipe_errors,
            "preflight_version_errors": version_errors,
            "preflight_disk_errors": disk_errors,
        }
