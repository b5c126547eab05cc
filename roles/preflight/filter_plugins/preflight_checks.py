"""Cross-field checks of the user's inputs for the preflight role.

Each filter returns a list of error strings; an empty list means the input is sound.
Every error names the host, the variable (with its index) and the fix, so a user can
act on it without reading the role.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
from pathlib import Path

import jinja2
import jinja2.meta
import yaml

ENGINE_MODES = ("prefill", "decode", "unified")
LOOPBACK_ONLY = {"127.0.0.1", "localhost", "::1"}
UNPINNED_WORDS = {"", "latest", "main", "master", "head", "stable", "nightly", "*", "any"}
RANGE_CHARS = re.compile(r"[*<>^~,|]|\.x$")


def _err(host: str, var: str, problem: str, fix: str) -> str:
    return f"{host}: {var}: {problem} Fix: {fix}"


def _engine_label(engine: dict, index: int) -> str:
    return f"sglang_engines[{index}]" + (f" ({engine['name']})" if engine.get("name") else "")


def engine_errors(engines, host, gpu_count):
    """Checks within one host: names, modes, GPU sets, parallelism, port ranges (clashes
    between ports are listener_errors')."""
    errors = []
    if not isinstance(engines, list) or not engines:
        return [_err(host, "sglang_engines", "is empty or not a list; this host is in "
                     "sglang_engine_hosts and has no engine to run.",
                     "list at least one engine ({name, mode, gpus, port}) for this host, or "
                     "remove the host from sglang_engine_hosts.")]
    names, gpu_owner, bootstrap_owner = {}, {}, {}
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
        for key, port in ports:
            if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
                errors.append(_err(host, f"{label}.{key}", f"{port!r} is not a port in 1024-65535.",
                                   "use an unprivileged TCP port."))
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
                               f"pin the 40-character commit you tested in your inventory: sglang_recipe_overrides: "
                               f"{{{model}: {{hf_revision: <commit>}}}}."))
    for field in ("served_model_name", "quantization"):
        if not recipe.get(field):
            errors.append(_err(host, f"{var}.{field}", "is missing.", f"set {field} in the recipe."))
    disk = recipe.get("disk_gb")
    if not isinstance(disk, (int, float)) or isinstance(disk, bool) or disk <= 0:
        errors.append(_err(host, f"{var}.disk_gb", f"{disk!r} is not a positive size.",
                           "set disk_gb to the size of the weights in GB (the free-disk check uses it)."))
    return errors + speculative_block_errors(model, recipe, host)


SPECULATIVE_COUNTS = ("num_steps", "eagle_topk", "num_draft_tokens")


def speculative_block_errors(model, recipe, host):
    """The recipe's speculative block (switched on): an algorithm that fits its draft, the
    three EAGLE counts set together, a draft pinned to a commit."""
    spec = recipe.get("speculative")
    var = f"sglang_model_recipes[{model!r}].speculative"
    if spec is None:
        return []
    if not isinstance(spec, dict):
        return [_err(host, var, "is not a mapping.", "write it as a mapping (enabled, algorithm, num_steps, ...).")]
    if not _bool(spec.get("enabled")):
        return []
    errors = []
    algorithm = str(spec.get("algorithm") or "").upper()
    draft = spec.get("draft_hf_repo")
    if algorithm == "EAGLE" and draft:
        errors.append(_err(host, f"{var}.algorithm", f"is EAGLE, which drafts with the checkpoint's own MTP head, "
                           f"but draft_hf_repo names a separate EAGLE-3 draft ({draft}); SGLang would load the draft "
                           "with the wrong layer layout.",
                           "set algorithm: EAGLE3 for the draft, or remove draft_hf_repo to use the MTP head."))
    if algorithm == "EAGLE3" and not draft:
        errors.append(_err(host, f"{var}.draft_hf_repo", "is missing; EAGLE3 needs a separate EAGLE-3 draft model.",
                           "set draft_hf_repo and draft_hf_revision to the draft you validated."))
    given = [field for field in SPECULATIVE_COUNTS if spec.get(field) not in (None, "")]
    if given and len(given) != len(SPECULATIVE_COUNTS):
        missing = [field for field in SPECULATIVE_COUNTS if field not in given]
        errors.append(_err(host, f"{var}.{missing[0]}", f"is unset while {', '.join(given)} "
                           f"{'is' if len(given) == 1 else 'are'} set; SGLang refuses steps, topk and draft tokens "
                           "unless all three are given (or none, to let it choose).",
                           "set num_steps, eagle_topk and num_draft_tokens together (e.g. 3, 1, 4), or none of them."))
    for field in given:
        value = spec.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(_err(host, f"{var}.{field}", f"{value!r} is not a positive whole number.",
                               f"set {field} to a whole number of 1 or more."))
    if draft:
        revision = str(spec.get("draft_hf_revision") or "")
        if not re.fullmatch(r"[0-9a-f]{40}", revision):
            errors.append(_err(host, f"{var}.draft_hf_revision", f"{revision!r} is not a commit hash; a branch or "
                               "tag can move the draft under a running deployment.",
                               f"pin the 40-character commit of {draft} you tested in your inventory: "
                               f"sglang_recipe_overrides: {{{model}: {{speculative: {{draft_hf_revision: <commit>}}}}}}."))
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


# ---------------------------------------------------------------------------------------
# Inputs of the roles that run after preflight. Each of them fails its own play when an input
# is missing or wrong, but only after earlier plays (or earlier hosts of a serial play) have
# changed hosts. These functions refuse the same inputs before any change.
#
# They read the host's variables under the roles' own names (inventory, group_vars, host_vars,
# extra vars: hostvars[inventory_hostname]). Where a decision needs a role's default, it is
# read from that role's defaults/main.yml. A variable whose role default is a template (a URL
# built from a version) is only checked when the inventory sets it: the default is valid by
# construction.

# The roles after preflight, whose defaults/main.yml sit beside this role's directory.
LATER_ROLES = ("alertmanager", "grafana", "prometheus", "node_exporter", "gpu_exporter", "nvidia_driver", "cuda_toolkit",
               "sglang_release", "sglang_router", "sglang_gateway", "sglang_acceptance")
ROLES_DIR = Path(__file__).resolve().parents[2]


@functools.cache
def role_defaults() -> dict:
    """The later roles' defaults, read from their own defaults/main.yml (no copy to drift)."""
    defaults = {}
    for role in LATER_ROLES:
        defaults.update(yaml.safe_load((ROLES_DIR / role / "defaults" / "main.yml").read_text()) or {})
    return defaults

GPU_EXPORTER_KINDS = ("auto", "dcgm", "nvidia_smi", "none")
ROUTER_MODES = ("auto", "pd", "plain")
GRAFANA_PASSWORD_MIN = 12
DOWNLOAD_URL = re.compile(r"(https?|ftp|file)://\S+")
APT_URL = re.compile(r"(https?|file)://\S+")
KEY_URL = re.compile(r"(https?|file)://")
SHA256_PIN = re.compile(r"sha256:[0-9a-f]{64}")
SHA256_PIN_OR_LIST = re.compile(r"sha256:([0-9a-f]{64}|(https?|ftp|file)://\S+)")


@functools.cache
def _role_plugin(role: str, name: str):
    """A later role's own filter plugin module (roles/<role>/filter_plugins/<name>.py), not a copy."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"sm120_{name}", ROLES_DIR / role / "filter_plugins" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nvidia_apt():
    """nvidia_driver's package-name helpers."""
    return _role_plugin("nvidia_driver", "nvidia_apt")


def sglang_release_plugin():
    """sglang_release's rendering helpers (the transfer backend and ports)."""
    return _role_plugin("sglang_release", "sglang_release")


TRANSFER_BACKENDS = ("auto", "mooncake", "mooncake_tcp")


def transfer_errors(hostvars, engine_hosts):
    """The KV-transfer backend of every host with PD engines: one the host can run (RDMA only
    where it has an RDMA device), and one transport on every PD host."""
    errors, used = [], {}
    for host in sorted(engine_hosts or []):
        hv = hostvars[host]
        if not any(engine.get("mode") in ("prefill", "decode") for _, engine in _engines(hv)):
            continue
        if "preflight_rdma_devices" not in hv:
            continue  # not gathered (outside --limit): the host's own run checks it
        configured = str(_get(hv, "sglang_release_transfer_backend"))
        devices = list(hv["preflight_rdma_devices"] or [])
        if configured not in TRANSFER_BACKENDS:
            errors.append(_err(host, "sglang_release_transfer_backend", f"{configured!r} is not a transfer backend "
                               f"this release carries (choose from {', '.join(TRANSFER_BACKENDS)}).",
                               "set auto (RDMA where the host has an RDMA device, else TCP), mooncake or mooncake_tcp."))
            continue
        if configured == "mooncake" and not devices:
            errors.append(_err(host, "sglang_release_transfer_backend", "mooncake moves the KV cache over RDMA "
                               "(Mooncake's protocol is rdma) and this host has no RDMA device "
                               "(/sys/class/infiniband is empty or absent).",
                               "set sglang_release_transfer_backend: auto or mooncake_tcp (Mooncake over TCP) for "
                               "this host, or install its RDMA NIC and driver."))
            continue
        used[host] = sglang_release_plugin().transfer_backend(configured, devices)
    if len(set(used.values())) > 1:
        listing = ", ".join(f"{host} ({backend})" for host, backend in sorted(used.items()))
        errors.append(_err(sorted(used)[0], "sglang_release_transfer_backend", f"the PD hosts would use different "
                           f"KV transports: {listing}; prefill and decode must use one.",
                           "set sglang_release_transfer_backend: mooncake_tcp for all engine hosts (group_vars), "
                           "or give every PD host an RDMA device."))
    return errors


def _get(variables, name):
    """The host's value of a later role's variable, or that role's default."""
    if variables is not None and name in variables:
        return variables[name]
    return role_defaults()[name]


def _set(variables, name):
    """The host's value when the inventory sets it, else None (the role's default applies)."""
    if variables is not None and name in variables:
        return variables[name]
    return None


def _bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1", "y")
    return bool(value)


def _number(value):
    if isinstance(value, bool):
        return None
    try:
        return float(str(value).strip())
    except (TypeError, ValueError):
        return None


def controller_file(path, search_dirs=()) -> bool:
    """Whether a controller path names a file: as given, or below one of search_dirs (where
    a role's file lookup also looks for a relative path)."""
    path = str(path).strip()
    if not path:
        return False
    if os.path.isabs(path):
        return os.path.isfile(path)
    return any(os.path.isfile(os.path.join(str(d), path)) for d in (".", *search_dirs))


def _repo_key_errors(host, var, key, search_dirs, role):
    key = str(key).strip()
    if KEY_URL.match(key) or controller_file(key, search_dirs):
        return []
    return [_err(host, var, f"{key!r} is neither an http(s)/file URL nor a file on the controller; "
                 f"the {role} role reads a key path on the controller after it has changed the host.",
                 "set the URL of the repository's signing key, or the path of a copy of it on the controller.")]


SERVING_KEY_MIN = 32
SERVING_KEY_FIX = ("generate it (openssl rand -hex 32) into an ansible-vault encrypted file for group all "
                   "(ansible-vault create group_vars/all/vault.yml) and run with --ask-vault-pass.")


def serving_key_errors(variables, host, engine_host, router_host):
    """Engine and router hosts: the keys between the serving processes (defaults/sglang.yml)."""
    wanted = (["sglang_worker_api_key"] if engine_host or router_host else []) \
        + (["sglang_admin_api_key"] if engine_host else [])
    errors, values = [], {}
    for name in wanted:
        value = _set(variables, name)
        value = "" if value is None else str(value)
        if not value:
            errors.append(_err(host, name, "is not set; the engines require the key and the roles refuse to "
                               "start them without it.", SERVING_KEY_FIX))
        elif len(value) < SERVING_KEY_MIN:
            errors.append(_err(host, name, f"is shorter than {SERVING_KEY_MIN} characters.", SERVING_KEY_FIX))
        elif not re.fullmatch(r"[\x21-\x7e]+", value):
            errors.append(_err(host, name, "has a space or a character outside printable ASCII, which an HTTP "
                               "Authorization header cannot carry.", SERVING_KEY_FIX))
        else:
            values[name] = value
    if len(values) == 2 and values["sglang_worker_api_key"] == values["sglang_admin_api_key"]:
        errors.append(_err(host, "sglang_admin_api_key", "is the same as sglang_worker_api_key: the router, which "
                           "holds the worker key, could call the engines' admin endpoints.",
                           "use two different keys."))
    return errors


def grafana_errors(variables, host, search_dirs=()):
    """grafana (monitoring hosts): the admin password, and a local package to install."""
    errors = []
    password = _set(variables, "grafana_admin_password")
    fix = ("put it in an ansible-vault encrypted file (ansible-vault create "
           "group_vars/monitoring_hosts/vault.yml) and run with --ask-vault-pass.")
    if password is None or not str(password):
        errors.append(_err(host, "grafana_admin_password", "is not set; Grafana is configured on this host "
                           "(monitoring_hosts) and the grafana role refuses to run without it.", fix))
    elif len(str(password)) < GRAFANA_PASSWORD_MIN:
        errors.append(_err(host, "grafana_admin_password", f"is shorter than {GRAFANA_PASSWORD_MIN} "
                           "characters; the grafana role refuses it.", fix))
    deb = str(_get(variables, "grafana_deb_path") or "")
    if deb:
        if not re.fullmatch(r"/.*\.deb", deb):
            errors.append(_err(host, "grafana_deb_path", f"{deb!r} is not an absolute path to a .deb.",
                               "set the path of the Grafana .deb on the controller, or leave it empty."))
        elif _bool(_get(variables, "grafana_install_package")) and not controller_file(deb, search_dirs):
            errors.append(_err(host, "grafana_deb_path", f"{deb} is not a file on the controller; the grafana "
                               "role copies it from there to install Grafana.",
                               "put the Grafana .deb there or correct the path, or leave it empty to "
                               "install from Grafana's apt repository."))
    return errors


def web_config_errors(variables, host, search_dirs=()):
    """TLS and basic auth of the monitoring endpoints (defaults/monitoring.yml; every host runs
    a node exporter): the three files on the controller, and a password only over TLS."""
    def value(name):
        return str(_set(variables, name) or "").strip()

    cert, password = value("monitoring_web_tls_cert"), value("monitoring_web_password")
    errors = []
    if cert:
        for name in ("monitoring_web_tls_cert", "monitoring_web_tls_key", "monitoring_web_tls_ca"):
            path = value(name)
            if not controller_file(path, search_dirs):
                problem = "is not set" if not path else f"{path!r} is not a file on the controller"
                errors.append(_err(host, name, f"{problem}; TLS is on (monitoring_web_tls_cert is set) and the "
                                   "monitoring roles copy the host's certificate, its key and the CA from there.",
                                   "set all three to files on the controller (per host in host_vars, or one "
                                   "path with {{ inventory_hostname }} in it), or leave monitoring_web_tls_cert "
                                   "empty."))
    elif password:
        errors.append(_err(host, "monitoring_web_password", "is set but TLS is off (monitoring_web_tls_cert is "
                           "empty), and the password would cross the network in clear.",
                           "set monitoring_web_tls_cert, _key and _ca too, or leave the password empty."))
    return errors


GATEWAY_KEY_MIN = 32
GATEWAY_KEY = re.compile(r"[A-Za-z0-9._~+/-]+=*")
GATEWAY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def gateway_errors(variables, host, search_dirs=()):
    """sglang_gateway (router hosts): the client keys, and TLS's certificate, key and CA. A
    message names an entry by index and name, never shows a key."""
    errors = []
    keys = _get(variables, "sglang_gateway_client_keys")
    vault = ("in your ansible-vault file (README, \"Client keys, TLS and limits\"); make a key with "
             "openssl rand -base64 32.")
    if not isinstance(keys, list) or not keys:
        errors.append(_err(host, "sglang_gateway_client_keys", "is empty; the gateway on this router host would "
                           "refuse every request, the smoke test's too.",
                           "give it at least one {name, key} entry (the first is the deployment's own) " + vault))
        keys = []
    names, values = {}, {}
    for index, entry in enumerate(keys):
        if not isinstance(entry, dict):
            errors.append(_err(host, f"sglang_gateway_client_keys[{index}]", "is not a {name, key} mapping.",
                               "write each entry as {name: <client>, key: <key>} " + vault))
            continue
        name = "" if entry.get("name") is None else str(entry.get("name"))
        label = f"sglang_gateway_client_keys[{index}]" + (f" ({name})" if name else "")
        if not GATEWAY_NAME.fullmatch(name):
            errors.append(_err(host, f"{label}.name", f"{name!r} is not a name of letters, digits, '.', '_' and '-' "
                               "(the gateway's access log records it instead of the key).",
                               "give the entry such a name."))
        elif name in names:
            errors.append(_err(host, f"{label}.name", f"{name} is also the name of sglang_gateway_client_keys"
                               f"[{names[name]}]; clients are told apart (and revoked) by name.",
                               "give each entry a name of its own."))
        else:
            names[name] = index
        key = "" if entry.get("key") is None else str(entry.get("key"))
        if not key:
            errors.append(_err(host, f"{label}.key", "is empty; a client without a key would be let in.",
                               "set the client's key " + vault))
        elif len(key) < GATEWAY_KEY_MIN:
            errors.append(_err(host, f"{label}.key", f"has {len(key)} characters, fewer than {GATEWAY_KEY_MIN}: a "
                               "short key can be guessed.", f"give it a key of {GATEWAY_KEY_MIN} or more characters " + vault))
        elif not GATEWAY_KEY.fullmatch(key):
            errors.append(_err(host, f"{label}.key", "has characters a bearer token cannot carry (letters, digits, "
                               "'-', '.', '_', '~', '+', '/' and trailing '=' only).", "give it such a key " + vault))
        elif key in values:
            errors.append(_err(host, f"{label}.key", f"is the key of sglang_gateway_client_keys[{values[key]}] too; the "
                               "two clients could not be told apart or revoked alone.", "give each client a key of its own " + vault))
        else:
            values[key] = index
    cert = str(_get(variables, "sglang_gateway_tls_cert") or "").strip()
    tls_key = str(_get(variables, "sglang_gateway_tls_key") or "").strip()
    if cert and not tls_key:
        errors.append(_err(host, "sglang_gateway_tls_key", "is not set but sglang_gateway_tls_cert is; nginx cannot "
                           "serve TLS without the certificate's key.",
                           "set it to the key's file on the controller, or leave both empty (plain HTTP)."))
    if tls_key and not cert:
        errors.append(_err(host, "sglang_gateway_tls_cert", "is not set but sglang_gateway_tls_key is; nginx cannot "
                           "serve TLS without the certificate.",
                           "set it to the certificate's file on the controller, or leave both empty (plain HTTP)."))
    ca = str(_get(variables, "sglang_gateway_tls_ca") or "").strip()
    if (cert or tls_key) and not ca:
        errors.append(_err(host, "sglang_gateway_tls_ca", "is not set but TLS is on; the deployment's own clients "
                           "(smoke test, acceptance) verify the gateway's certificate with it.",
                           "set it to the file of the CA that signed the certificate, on the controller."))
    for var, path in (("sglang_gateway_tls_cert", cert), ("sglang_gateway_tls_key", tls_key), ("sglang_gateway_tls_ca", ca)):
        if path and not controller_file(path, search_dirs):
            errors.append(_err(host, var, f"{path!r} is not a file on the controller; the sglang_gateway role copies "
                               "it from there.", "correct the path, or leave the three TLS variables empty."))
    return errors


def _release_key(distribution, major) -> str:
    return f"{distribution}-{major}"


def prometheus_errors(variables, host):
    """prometheus (monitoring hosts): alert thresholds and the model root (its install
    method: install_plan)."""
    errors = []
    thresholds = (
        ("prometheus_alert_ttft_p99_seconds", lambda v: v > 0, "a number of seconds above 0"),
        ("prometheus_alert_queue_backlog_requests", lambda v: v >= 0 and v == int(v), "a whole number, 0 or more"),
        ("prometheus_alert_gpu_temperature_celsius", lambda v: v > 0, "a temperature above 0"),
        ("prometheus_alert_model_disk_free_ratio", lambda v: 0 < v < 1, "a ratio between 0 and 1"),
    )
    for name, good, wanted in thresholds:
        value = _get(variables, name)
        number = _number(value)
        if number is None or not good(number):
            errors.append(_err(host, name, f"{value!r} is not {wanted}.", "correct the threshold in your inventory."))
    root = _set(variables, "prometheus_model_root")
    root = _set(variables, "sglang_model_root") if root is None else root
    if root is not None and not str(root).startswith("/"):
        errors.append(_err(host, "prometheus_model_root", f"{root!r} is not an absolute path; the model-disk "
                           "alert watches the filesystem that holds it.",
                           "set sglang_model_root (or prometheus_model_root) to an absolute path."))
    return errors


ALERTMANAGER_RECEIVER_TYPES = ("webhook", "email", "slack")
ALERTMANAGER_NULL_RECEIVER = "none"  # the role's built-in receiver without a destination
HTTP_URL = re.compile(r"https?://\S+")
MAIL_ADDRESS = re.compile(r"[^@\s]+@[^@\s]+")
HOST_PORT = re.compile(r"\S+:[0-9]+")
DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")


def _receiver_errors(host, receivers):
    """alertmanager_receivers: each one a named destination amtool accepts."""
    if not isinstance(receivers, list):
        return [_err(host, "alertmanager_receivers", f"{receivers!r} is not a list.",
                     "list receivers as {name, type, url} or {name, type: email, to}.")], []
    errors, names = [], []
    for index, receiver in enumerate(receivers):
        var = f"alertmanager_receivers[{index}]"
        if not isinstance(receiver, dict):
            errors.append(_err(host, var, f"{receiver!r} is not a mapping.", "write it as {name, type, url}."))
            continue
        name = str(receiver.get("name") or "")
        if name:
            var += f" ({name})"
        kind = receiver.get("type")
        if not name or name == ALERTMANAGER_NULL_RECEIVER or name in names:
            errors.append(_err(host, var, "has no name, a name used twice, or the reserved name "
                               f"{ALERTMANAGER_NULL_RECEIVER!r}; routes name receivers.",
                               "give each receiver its own name."))
        names.append(name)
        if kind not in ALERTMANAGER_RECEIVER_TYPES:
            errors.append(_err(host, var, f"type {kind!r} is not a receiver type.", "use webhook, email or slack."))
        elif kind == "email" and not MAIL_ADDRESS.fullmatch(str(receiver.get("to") or "").strip()):
            errors.append(_err(host, var, f"to {receiver.get('to')!r} is not a mail address; Alertmanager would "
                               "have nowhere to send.", "set to: <address> (e.g. ops@example.com)."))
        elif kind != "email" and not HTTP_URL.fullmatch(str(receiver.get("url") or "").strip()):
            errors.append(_err(host, var, f"url {receiver.get('url')!r} is not an http(s) URL; Alertmanager would "
                               "have nowhere to send.", f"set url: to the {kind} endpoint (https://...)."))
    return errors, names


def alertmanager_errors(variables, host):
    """alertmanager (monitoring hosts): receivers with a destination, a mail relay for email receivers, routes that name known receivers,
    and durations. amtool would refuse most of these, but only in the monitoring play."""
    errors = []
    receivers = _get(variables, "alertmanager_receivers")
    receiver_errors, names = _receiver_errors(host, receivers)
    errors += receiver_errors
    if isinstance(receivers, list) and any(isinstance(r, dict) and r.get("type") == "email" for r in receivers):
        smarthost = str(_get(variables, "alertmanager_smtp_smarthost") or "").strip()
        if not HOST_PORT.fullmatch(smarthost):
            errors.append(_err(host, "alertmanager_smtp_smarthost", f"{smarthost!r} is not host:port; the email "
                               "receivers send through it.", "set the mail relay, e.g. smtp.example.com:587."))
        sender = str(_get(variables, "alertmanager_smtp_from") or "").strip()
        if not MAIL_ADDRESS.fullmatch(sender):
            errors.append(_err(host, "alertmanager_smtp_from", f"{sender!r} is not a mail address; email "
                               "notifications need a sender.", "set it, e.g. alertmanager@example.com."))
    known = set(names) | {ALERTMANAGER_NULL_RECEIVER, ""}
    named = [("alertmanager_default_receiver", _get(variables, "alertmanager_default_receiver")),
             ("alertmanager_watchdog_receiver", _get(variables, "alertmanager_watchdog_receiver"))]
    routes = _get(variables, "alertmanager_routes")
    if not isinstance(routes, list) or not all(isinstance(r, dict) for r in routes):
        errors.append(_err(host, "alertmanager_routes", f"{routes!r} is not a list of routes.",
                           "list routes as {matchers: [...], receiver: <name>}."))
        routes = []
    named += [(f"alertmanager_routes[{i}].receiver", r.get("receiver", "")) for i, r in enumerate(routes)]
    for var, name in named:
        if str(name or "") not in known:
            errors.append(_err(host, var, f"{name!r} names no receiver of alertmanager_receivers.",
                               "add that receiver, or correct the name."))
    for var in ("alertmanager_group_wait", "alertmanager_group_interval", "alertmanager_repeat_interval"):
        value = _get(variables, var)
        if not DURATION.fullmatch(str(value).strip()):
            errors.append(_err(host, var, f"{value!r} is not a duration.", "write it as Prometheus does, e.g. 30s, 5m or 4h."))
    return errors


def gpu_exporter_errors(variables, host, dcgm_installed=False, search_dirs=()):
    """gpu_exporter (engine hosts): the exporter kind and DCGM's repository (the nvidia-smi
    exporter's archive: install_plan)."""
    if not _bool(_get(variables, "gpu_exporter_enabled")):
        return []
    kind = _get(variables, "gpu_exporter_kind")
    if kind not in GPU_EXPORTER_KINDS:
        return [_err(host, "gpu_exporter_kind", f"{kind!r} is not an exporter kind.",
                     "use auto, dcgm, nvidia_smi or none.")]
    errors = []
    selected = kind if kind != "auto" else ("dcgm" if dcgm_installed else "nvidia_smi")
    if selected == "dcgm" and _bool(_get(variables, "gpu_exporter_dcgm_manage_repo")):
        for var in ("gpu_exporter_dcgm_repo_url", "nvidia_driver_repo_url"):
            url = _set(variables, var)
            if url is not None:
                if not APT_URL.fullmatch(str(url).strip()):
                    errors.append(_err(host, var, f"{str(url).strip()!r} is not an http, https or file URL.",
                                       "set the base URL of NVIDIA's CUDA repositories or of a mirror."))
                break
        for var in ("gpu_exporter_dcgm_repo_key", "nvidia_driver_repo_key"):
            key = _set(variables, var)
            if key is not None:
                errors += _repo_key_errors(host, var, key, search_dirs, "gpu_exporter")
                break
    return errors


# ---------------------------------------------------------------------------------------
# Install methods of the monitoring binaries. node_exporter, alertmanager and prometheus
# install the distribution's package where <role>_package_versions pins one for the host's
# release ("<distribution>-<major version>"), else the upstream release archive (method auto);
# the GPU exporter's nvidia-smi exporter is always a release archive, DCGM's exporter a
# package from NVIDIA's repository.
INSTALL_METHODS = ("auto", "package", "tarball")
# role: (its package, the variable that pins it, the prefix of its archive's variables)
TARBALL_ROLES = {
    "node_exporter": ("prometheus-node-exporter", "node_exporter_package_versions", "node_exporter_tarball"),
    "alertmanager": ("prometheus-alertmanager", "alertmanager_package_versions", "alertmanager_tarball"),
    "prometheus": ("prometheus", "prometheus_package_versions", "prometheus_tarball"),
}


def _archive_errors(variables, host, prefix, what, hex_only):
    """The archive's version, sha256 and URL (the URL's default is built from the version)."""
    errors = []
    version = str(_get(variables, f"{prefix}_version") or "").strip()
    if version.lower() in UNPINNED_WORDS or RANGE_CHARS.search(version):
        errors.append(_err(host, f"{prefix}_version", f"{version!r} is not a pinned release of {what}.",
                           "set the exact release (e.g. 1.9.1)."))
    url = _set(variables, f"{prefix}_url")
    if url is not None and not DOWNLOAD_URL.fullmatch(str(url).strip()):
        errors.append(_err(host, f"{prefix}_url", f"{str(url).strip()!r} is not a URL.",
                           f"set the http(s) URL of the {what} release archive (or of a mirror)."))
    checksum = _set(variables, f"{prefix}_checksum")
    if checksum is None:
        checksum = role_defaults()[f"{prefix}_checksum"]
        if "{{" in str(checksum):
            return version, errors  # upstream's sums file for the pinned version, read at download
    checksum = str(checksum or "").strip()
    if not checksum:
        errors.append(_err(host, f"{prefix}_checksum", f"is empty: there is no verified sha256 of the {what} "
                           f"{version} archive, and it is never installed unchecked.",
                           "set sha256:<64 hex digits> from the release's checksums file."))
    elif hex_only and not SHA256_PIN.fullmatch(checksum):
        errors.append(_err(host, f"{prefix}_checksum", f"{checksum!r} is not sha256:<64 hex digits>.",
                           "set the archive's SHA-256 from the release's checksums file."))
    elif not hex_only and not SHA256_PIN_OR_LIST.fullmatch(checksum):
        errors.append(_err(host, f"{prefix}_checksum", f"{checksum!r} is not sha256:<64 hex digits> or "
                           "sha256:<URL of a sha256sums file>; the download would fail after the host has changed.",
                           "copy the archive's SHA-256 from the release's sha256sums.txt, or point to that file."))
    return version, errors


def _role_plan(variables, host, role, distribution, major, os_name):
    package, pins_var, prefix = TARBALL_ROLES[role]
    key = _release_key(distribution, major)
    method = _get(variables, f"{role}_install_method")
    if method not in INSTALL_METHODS:
        return None, [_err(host, f"{role}_install_method", f"{method!r} is not an install method.",
                           "use auto, package or tarball.")]
    pins = _get(variables, pins_var)
    pinned = str(pins.get(key) or "") if isinstance(pins, dict) else ""
    if method == "package" or (method == "auto" and pinned):
        if not pinned:
            return None, [_err(host, pins_var, f"no pinned version of {package} for {key}, this host's release "
                               f"({role} on {os_name}).",
                               f'add "{key}: <version>" (apt-cache policy {package}), or set '
                               f"{role}_install_method: tarball.")]
        return {"role": role, "method": "package", "version": f"{package}={pinned}"}, []
    version, errors = _archive_errors(variables, host, prefix, role, hex_only=False)
    if errors and method == "auto":
        errors.insert(0, _err(host, f"{role}_install_method", f"no install method for {role} on {os_name}: "
                              f"{pins_var} pins no {package} for {key}, and the tarball method has no pinned, "
                              "verified archive (below).",
                              f'add "{key}: <version>" to {pins_var}, or pin the archive: {prefix}_version '
                              f"and {prefix}_checksum (sha256 from the release's sha256sums.txt)."))
    return {"role": role, "method": "tarball", "version": version}, errors


def _gpu_exporter_plan(variables, host, os_name, dcgm_installed):
    kind = _get(variables, "gpu_exporter_kind")
    if kind not in GPU_EXPORTER_KINDS:
        return None, []  # gpu_exporter_errors names it
    selected = kind if kind != "auto" else ("dcgm" if dcgm_installed else "nvidia_smi")
    if selected == "none":
        return {"role": "gpu_exporter", "method": "none", "version": "textfile collector only"}, []
    if selected == "dcgm":
        return {"role": "gpu_exporter", "method": "package",
                "version": f"{_get(variables, 'gpu_exporter_dcgm_package')}={_get(variables, 'gpu_exporter_dcgm_version')}"}, []
    version, errors = _archive_errors(variables, host, "gpu_exporter_nvidia_smi", "nvidia_gpu_exporter", hex_only=True)
    if errors and kind == "auto":
        errors.insert(0, _err(host, "gpu_exporter_kind", f"no install method for gpu_exporter on {os_name}: DCGM is "
                              "not installed, so auto picks the nvidia-smi exporter, and its release archive is not "
                              "pinned and verified (below).",
                              "set gpu_exporter_nvidia_smi_checksum (sha256 from the release's checksums.txt), "
                              "install DCGM, or set gpu_exporter_kind: none."))
    return {"role": "gpu_exporter", "method": "tarball", "version": f"nvidia_gpu_exporter {version}"}, errors


def install_plan(variables, host, distribution, major, roles, dcgm_installed=False, os_version=None):
    """Which install method and pinned version each role in `roles` gets on this host:
    {"plan": [{role, method, version}], "errors": [...]}. A role with no usable method (no
    package pin for the host's release and no pinned, verified archive) is an error naming
    the host, the role, the OS and the fix."""
    os_name = f"{distribution} {os_version or major}"
    plan, errors = [], []
    for role in roles:
        if role == "gpu_exporter":
            if not _bool(_get(variables, "gpu_exporter_enabled")):
                continue
            entry, problems = _gpu_exporter_plan(variables, host, os_name, dcgm_installed)
        else:
            entry, problems = _role_plan(variables, host, role, distribution, major, os_name)
        if entry is not None:
            plan.append(entry)
        errors += problems
    return {"plan": plan, "errors": errors}




def gpu_host_errors(variables, host, search_dirs=()):
    """nvidia_driver and cuda_toolkit (nvidia_gpu_hosts, one host at a time): branch, version,
    packages, repository, power limits, CUDA release."""
    errors = []
    branch = str(_get(variables, "nvidia_driver_branch"))
    version = _get(variables, "nvidia_driver_version")
    version = "" if version is None else str(version)
    if not re.fullmatch(r"[0-9]{3}", branch):
        errors.append(_err(host, "nvidia_driver_branch", f"{branch!r} is not a driver branch.",
                           'set the branch number, e.g. "580" (the floor for CUDA 13).'))
    if not re.fullmatch(r"([0-9]+(\.[0-9]+){1,2})?", version):
        errors.append(_err(host, "nvidia_driver_version", f"{version!r} is not an exact driver version.",
                           "set it like 580.95.05, or leave it empty for the branch's newest."))
    elif version and version.split(".")[0] != branch:
        errors.append(_err(host, "nvidia_driver_version", f"{version} is not on branch {branch} "
                           "(nvidia_driver_branch).", "set both to the same branch."))
    packages = _get(variables, "nvidia_driver_packages")
    distribution = str(((variables or {}).get("ansible_facts") or {}).get("distribution", ""))
    packages = nvidia_apt().package_names(
        packages if isinstance(packages, list) else [], _get(variables, "nvidia_driver_distribution_packages"),
        distribution, branch)
    errors += [_err(host, "nvidia_driver_packages", problem, fix)
               for problem, fix in nvidia_apt().package_problems(packages, distribution)]
    url = _set(variables, "nvidia_driver_repo_url")
    if url is not None and not APT_URL.fullmatch(str(url).strip()):
        errors.append(_err(host, "nvidia_driver_repo_url", f"{str(url).strip()!r} is not an http, https or file "
                           "URL; apt could not read the repository the role writes.",
                           "set the base URL of NVIDIA's CUDA repositories "
                           "(https://developer.download.nvidia.com/compute/cuda/repos) or of a mirror."))
    key = _set(variables, "nvidia_driver_repo_key")
    if key is not None:
        errors += _repo_key_errors(host, "nvidia_driver_repo_key", key, search_dirs, "nvidia_driver")
    errors += _power_limit_errors(variables, host)
    cuda = _set(variables, "cuda_toolkit_version")
    if cuda is not None and not re.fullmatch(r"1[3-9]\.[0-9]+", str(cuda)):
        errors.append(_err(host, "cuda_toolkit_version", f"{str(cuda)!r} is not a CUDA 13.x (or newer) "
                           "major.minor release; cuda_toolkit refuses it after the driver is installed.",
                           'set it like "13.0"; sm_120 and SGLang\'s CUDA 13 wheels need 13.x.'))
    return errors


def gpu_count_errors(pci_gpus, host, variables, group="nvidia_gpu_hosts"):
    """nvidia_driver (GPU hosts): the GPUs on the PCI bus (NVIDIA display and 3D controllers,
    as the role lists them) against what its nvidia-smi check will expect after installing
    the driver. pci_gpus: the PCI addresses."""
    if str(_set(variables, "nvidia_driver_smi_output_dir") or ""):
        return []  # tests: the role reads recorded nvidia-smi output instead
    gpus = [str(g).strip() for g in pci_gpus or [] if str(g).strip()]
    if not gpus:
        if not _bool(_get(variables, "nvidia_driver_require_gpu")):
            return []
        return [_err(host, group, "this host is a GPU host but its PCI bus shows no NVIDIA GPU; the "
                     "nvidia_driver role would install the driver and then fail.",
                     "check that the GPUs are seated and visible (lspci -d 10de:), take the host out of "
                     f"{group}, or set nvidia_driver_require_gpu: false for it.")]
    var = "nvidia_driver_gpu_count" if _set(variables, "nvidia_driver_gpu_count") is not None else "sglang_gpu_count"
    expected = _set(variables, var)
    expected = int(_number(8 if expected is None else expected) or 0)
    if len(gpus) == expected:
        return []
    return [_err(host, var, f"{expected} GPUs are expected, but the PCI bus shows {len(gpus)} "
                 f"({', '.join(gpus)}); the nvidia_driver role would stop on the count after installing the driver.",
                 f"check that every GPU is seated and powered (lspci -d 10de:), or set {var} to this host's GPU count.")]


def _power_limit_errors(variables, host):
    limits = _get(variables, "nvidia_driver_power_limits")
    if limits in (None, ""):
        return []
    if not isinstance(limits, dict):
        return [_err(host, "nvidia_driver_power_limits", f"{limits!r} is not a mapping.",
                     "write it as {all: 450} or {0: 450, 1: 500} (GPU index: watts), or {} to leave the limits alone.")]
    count = _set(variables, "nvidia_driver_gpu_count")
    count = _set(variables, "sglang_gpu_count") if count is None else count
    count = int(_number(count) or 8)
    errors = []
    for key, watts in limits.items():
        label = f"nvidia_driver_power_limits[{key}]"
        if str(key) != "all":
            index = int(key) if isinstance(key, int) and not isinstance(key, bool) else (
                int(str(key)) if str(key).isdigit() else None)
            if index is None:
                errors.append(_err(host, "nvidia_driver_power_limits", f"{key!r} is neither a GPU index nor all.",
                                   "key the limits by GPU index (0, 1, ...) or use all."))
                continue
            if index >= count:
                errors.append(_err(host, "nvidia_driver_power_limits", f"GPU {index} does not exist; the host has "
                                   f"{count} GPUs (0-{count - 1}, nvidia_driver_gpu_count).",
                                   "use GPU indices below nvidia_driver_gpu_count, or all."))
                continue
        if watts in (None, ""):
            continue
        number = _number(watts)
        if number is None or number <= 0:
            errors.append(_err(host, label, f"{watts!r} is not a power limit in watts.",
                               "set a number of watts (e.g. 450), or remove the entry."))
    return errors


def _speculative(args):
    return {str(k).replace("_", "-"): v for k, v in (args or {}).items()
            if str(k).replace("_", "-").startswith("speculative-")} if isinstance(args, dict) else {}


# The recipe's speculative block as sglang_release renders it (field -> SGLang argument);
# tests/unit keeps it equal to the role's renderer.
SPECULATIVE_BLOCK_ARGS = (("algorithm", "speculative-algorithm"), ("num_steps", "speculative-num-steps"),
                          ("eagle_topk", "speculative-eagle-topk"), ("num_draft_tokens", "speculative-num-draft-tokens"),
                          ("moe_runner_backend", "speculative-moe-runner-backend"))


def _speculative_block(recipe):
    spec = recipe.get("speculative") if isinstance(recipe, dict) else None
    if not isinstance(spec, dict) or not _bool(spec.get("enabled")):
        return {}
    args = {key: spec[field] for field, key in SPECULATIVE_BLOCK_ARGS if spec.get(field) not in (None, "")}
    if spec.get("draft_hf_repo"):
        args["speculative-draft-model-path"] = "<the staged draft>"
    return args


def _argument_layers(recipe, model, hv, engine, index):
    """The layers an engine's arguments come from, lowest first, each with the variable that
    sets it (sglang_release renders them in this order)."""
    recipe_var = f"sglang_model_recipes[{model!r}]"
    mode_args = recipe.get("mode_args") if isinstance(recipe.get("mode_args"), dict) else {}
    mode = engine.get("mode")
    return [(recipe.get("args"), f"{recipe_var}.args"),
            (_speculative_block(recipe), f"{recipe_var}.speculative"),
            (mode_args.get(mode), f"{recipe_var}.mode_args.{mode}"),
            (hv.get("sglang_release_engine_args"), "sglang_release_engine_args"),
            (engine.get("args"), f"{_engine_label(engine, index)}.args")]


def _engines(hv):
    engines = hv.get("sglang_engines") or []
    return [(index, engine) for index, engine in enumerate(engines if isinstance(engines, list) else [])
            if isinstance(engine, dict)]


def speculative_errors(hostvars, engine_hosts, recipe, model):
    """Speculative-decoding arguments must be identical on every prefill and decode engine
    (sglang_release checks the rendered arguments, after earlier plays changed hosts)."""
    if not isinstance(recipe, dict):
        return []
    recipe_var = f"sglang_model_recipes[{model!r}]"
    entries = []
    for host in sorted(engine_hosts):
        for index, engine in _engines(hostvars[host]):
            if engine.get("mode") not in ("prefill", "decode"):
                continue
            spec, source = {}, {}
            for layer, var in _argument_layers(recipe, model, hostvars[host], engine, index):
                for key, value in _speculative(layer).items():
                    spec[key], source[key] = value, var
            entries.append((host, engine.get("name"), engine["mode"], spec, source))
    if not entries:
        return []
    errors = []
    ref_host, ref_name, ref_mode, ref_spec, ref_source = entries[0]
    for host, name, mode, spec, source in entries[1:]:
        for key in sorted(set(spec) | set(ref_spec)):
            if spec.get(key) == ref_spec.get(key):
                continue
            blame_host, var = (host, source[key]) if key in spec else (ref_host, ref_source[key])
            message = _err(blame_host, var,
                           f"--{key} is {_show(spec.get(key))} on engine {name} ({mode}, {host}) but "
                           f"{_show(ref_spec.get(key))} on engine {ref_name} ({ref_mode}, {ref_host}); "
                           "speculative-decoding arguments must be identical on every prefill and decode engine.",
                           f"set them once in the recipe's speculative block ({recipe_var}.speculative), not per "
                           "engine, per mode or per host.")
            if message not in errors:
                errors.append(message)
    return errors


def _show(value) -> str:
    return "unset" if value is None else repr(value)


KIMI_K25_REPO = "moonshotai/Kimi-K2.5"


def kv_cache_errors(hostvars, engine_hosts, recipe, model):
    """Kimi-K2.5: no FP8 KV cache, from any layer of the engines' arguments."""
    if not isinstance(recipe, dict) or (model != "kimi-k2.5-int4" and recipe.get("hf_repo") != KIMI_K25_REPO):
        return []
    errors = []
    for host in sorted(engine_hosts):
        layers = [layer for index, engine in _engines(hostvars[host])
                  for layer in _argument_layers(recipe, model, hostvars[host], engine, index)]
        for layer, var in layers:
            for key, value in (layer.items() if isinstance(layer, dict) else []):
                if str(key).replace("_", "-") == "kv-cache-dtype" and str(value).lower().startswith("fp8"):
                    message = _err(host, var, f"--kv-cache-dtype is {value!r}; the Kimi-K2.5 recipe keeps its MLA "
                                   "KV cache in BF16 (the Triton MLA backend and the EAGLE-3 draft on sm_120 are not "
                                   "validated with an FP8 cache, and a wrong cache degrades every answer silently).",
                                   "remove kv-cache-dtype (or set it to auto) for this recipe.")
                    if message not in errors:
                        errors.append(message)
    return errors


def router_mode_errors(variables, host, hostvars, engine_hosts):
    """sglang_router (router hosts): an explicit router mode must fit the engines' modes."""
    mode = _get(variables, "sglang_router_mode")
    if mode not in ROUTER_MODES:
        return [_err(host, "sglang_router_mode", f"{mode!r} is not a router mode.", "use auto, pd or plain.")]
    modes = set()
    for engine_host in engine_hosts:
        for engine in hostvars[engine_host].get("sglang_engines") or []:
            if isinstance(engine, dict):
                modes.add(engine.get("mode"))
    if mode == "pd" and "unified" in modes and not {"prefill", "decode"} & modes:
        return [_err(host, "sglang_router_mode", "is pd, but the engines are unified (co-located); the router "
                     "would find no prefill or decode engine to route to.",
                     "set it to auto (or plain), or run prefill and decode engines.")]
    if mode == "plain" and {"prefill", "decode"} & modes:
        return [_err(host, "sglang_router_mode", "is plain, but the engines are prefill and decode engines; the "
                     "router would send whole requests to them as if they were co-located.",
                     "set it to auto (or pd).")]
    return []


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def acceptance_errors(variables, host, model, recipe, baseline=None):
    """sglang_acceptance (first router host), with sglang_acceptance_gate on: the gate's
    thresholds and levels, the recipe's bench block and the recipe's baseline file (its text,
    or None when there is none) must be sound, or the gate would fail after the switch and
    roll back a release that may be good."""
    if not _bool(_get(variables, "sglang_acceptance_gate")):
        return []
    errors = []
    for var in ("sglang_acceptance_max_drop_pct", "sglang_acceptance_max_ttft_rise_pct"):
        value = _number(_get(variables, var))
        if value is None or not 0 < value < 100:
            errors.append(_err(host, var, f"is {_get(variables, var)!r}; the gate needs a percentage above 0 and "
                               "below 100.", f"set {var} to a number such as 5 or 10."))
    levels = _get(variables, "sglang_acceptance_concurrency")
    if not isinstance(levels, list) or not levels or not all(_positive_int(x) for x in levels) or 1 not in levels:
        errors.append(_err(host, "sglang_acceptance_concurrency", f"is {levels!r}; the benchmark needs a list of "
                           "positive integers that holds 1 (the single-stream level).",
                           "set it to a list such as [1, 8, 32, 64]."))
        levels = []
    bench = (recipe or {}).get("bench") if isinstance(recipe, dict) else None
    var = f"sglang_model_recipes['{model}'].bench"
    if not isinstance(bench, dict):
        return errors + [_err(host, var, "is missing; the gate benchmarks with the recipe's request lengths.",
                              "give the recipe a bench block: input_len, output_len, reference_concurrency and "
                              "context_length (see defaults/models.yml).")]
    for key in ("input_len", "output_len", "reference_concurrency", "context_length"):
        if not _positive_int(bench.get(key)):
            errors.append(_err(host, f"{var}.{key}", f"is {bench.get(key)!r}; it must be a positive integer.",
                               f"set {key} in the recipe's bench block (sglang_recipe_overrides)."))
    ref = bench.get("reference_concurrency")
    if levels and _positive_int(ref) and ref not in levels:
        errors.append(_err(host, f"{var}.reference_concurrency", f"is {ref}, which is not one of the benchmark's "
                           f"levels {levels}; the gate would have no throughput to compare.",
                           "add it to sglang_acceptance_concurrency or pick one of its levels."))
    if baseline is not None:
        try:
            data = yaml.safe_load(baseline) or {}
        except yaml.YAMLError as exc:
            data = None
            problem = f"is not YAML ({str(exc).splitlines()[0]})."
        else:
            gate = data.get("gate") if isinstance(data, dict) else None
            bad = ([k for k, v in gate.items() if k not in ("single_stream_tok_s", "throughput_tok_s", "ttft_p99_ms")
                    or _number(v) is None or _number(v) <= 0] if isinstance(gate, dict) else ["gate"])
            problem = (f"has gate figures the gate cannot use: {', '.join(map(str, bad))}." if bad else None)
        if problem:
            errors.append(_err(host, "sglang_acceptance_baselines_dir", f"the baseline file {model}.yml there {problem}",
                               "give it gate: {single_stream_tok_s, throughput_tok_s, ttft_p99_ms} with positive "
                               "numbers (or gate: {})."))
    return errors


def lock_errors(variables, host, lock_file):
    """sglang_release (engine and router hosts): the lock pins the SGLang and router versions
    the release expects."""
    lock_file = str(_set(variables, "sglang_release_lock_file") or lock_file)
    try:
        with open(lock_file, encoding="utf-8") as handle:
            text = "\n" + handle.read()
    except OSError as exc:
        return [_err(host, "sglang_release_lock_file", f"{lock_file} cannot be read on the controller "
                     f"({exc.strerror or exc}).", "point it at the hashed lock (files/sglang/requirements.lock).")]
    errors = []
    for var, package in (("sglang_release_sglang_version", "sglang"), ("sglang_release_router_version", "sglang-router")):
        wanted = str(_get(variables, var))
        if f"\n{package}=={wanted} " in text:
            continue
        pinned = re.search(rf"\n{re.escape(package)}==(\S+)", text)
        errors.append(_err(host, var, f"is {wanted}, but {os.path.basename(lock_file)} pins "
                           f"{package + '==' + pinned.group(1) if pinned else 'no ' + package}; the release "
                           "play would stop after earlier plays changed hosts.",
                           f"set {var} to the version the lock pins, or recompile the lock."))
    return errors


def model_source_errors(variables, host, model, recipe, model_root, source_stats, marker=None):
    """sglang_release (engine hosts): a recipe with a local/NFS path is staged from that
    directory, verified with its checksum file, unless a verified copy of the same source is
    already staged. source_stats: stat results of the path and of its checksum file; marker:
    the staged copy's marker file (JSON text), or None."""
    if not (isinstance(recipe, dict) and "path" in recipe and _bool(_get(variables, "sglang_release_stage_model"))):
        return []
    source = str(recipe["path"])
    try:
        if json.loads(marker or "null").get("source") == {"path": source}:
            return []
    except (ValueError, AttributeError):
        pass
    var = f"sglang_model_recipes[{model!r}].path"
    directory, sums = (list(source_stats or []) + [{}, {}])[:2]
    checksums = str(recipe.get("checksums") or "SHA256SUMS")
    if not (directory or {}).get("isdir"):
        return [_err(host, var, f"{source} is not a directory on this host; the release stages the weights "
                     f"from it into {model_root}/{model}.",
                     "mount the share or copy the weights there, or correct the path.")]
    if not (sums or {}).get("exists"):
        var = f"sglang_model_recipes[{model!r}].checksums" if recipe.get("checksums") else var
        return [_err(host, var, f"{source}/{checksums} is missing; the staged weights could not be verified.",
                     f"write it in the weights directory (sha256sum * > {checksums}), or name the "
                     "checksum file in the recipe's checksums.")]
    return []


def wheelhouse_errors(variables, host, wheelhouse_stat):
    """sglang_release (engine and router hosts): an offline wheelhouse must be a directory."""
    wheelhouse = str(_get(variables, "sglang_release_wheelhouse") or "")
    if not wheelhouse or (wheelhouse_stat or {}).get("isdir"):
        return []
    return [_err(host, "sglang_release_wheelhouse", f"{wheelhouse} is not a directory on this host; the "
                 "release installs uv and the lock from it, offline.",
                 "copy the wheels of the lock and of uv there, or leave it empty to install from PyPI.")]


# ----------------------------------------------------------------------------- listeners
# Addresses that bind every address of the host.
WILDCARD_ADDRESSES = {"", "*", "0.0.0.0", "::", "[::]"}
HOST_ADDRESS_DEFAULT = "{{ ansible_host | default(inventory_hostname) }}"


def _render(value, variables, host):
    """A value as Ansible would template it: a role default such as
    "{{ ansible_host | default(inventory_hostname) }}" against the host's variables."""
    env = jinja2.Environment()
    for _ in range(4):
        if not (isinstance(value, str) and "{{" in value):
            break
        context = {"inventory_hostname": host}
        for name in jinja2.meta.find_undeclared_variables(env.parse(value)):
            if variables is not None and name in variables:
                context[name] = variables[name]
        value = env.from_string(value).render(context)
    return value


def _role_value(variables, host, name):
    """A later role's variable for this host (the inventory's value, else the role's
    default), rendered."""
    if variables is not None and name in variables:
        value = variables[name]
    else:
        value = role_defaults()[name]
    return _render(value, variables, host)


def _port(value):
    try:
        port = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return port if 0 < port <= 65535 else None


def _engine_listeners(variables, host, listen_address):
    """(address, port, user, variable) of every engine of the host: its HTTP port (API,
    /health and /metrics), a prefill engine's PD bootstrap port, and the NCCL and
    distributed-init ports when its arguments set them (torch binds those on every address)."""
    model = variables.get("sglang_model") if variables is not None else None
    recipes = variables.get("sglang_model_recipes") if variables is not None else None
    recipe = recipes.get(model) if isinstance(recipes, dict) else None
    found = []
    # Mooncake binds its transfer listeners on every address.
    transfer_ports = sglang_release_plugin().transfer_ports(
        [engine for _, engine in _engines(variables or {})],
        _port(_role_value(variables, host, "sglang_release_transfer_port_base")) or 0)
    for index, engine in _engines(variables or {}):
        label, name = _engine_label(engine, index), engine.get("name", f"#{index}")
        address = str(engine.get("host", listen_address))
        found.append((address, engine.get("port"), f"engine {name} (HTTP API and /metrics)", f"{label}.port"))
        if engine.get("mode") == "prefill":
            found.append((address, engine.get("bootstrap_port", 8998), f"engine {name} (PD bootstrap)",
                          f"{label}.bootstrap_port"))
        layers = (_argument_layers(recipe, model, variables, engine, index) if isinstance(recipe, dict)
                  else [(engine.get("args"), f"{label}.args")])
        args, source = {}, {}
        for layer, var in layers:
            for key, value in (layer.items() if isinstance(layer, dict) else []):
                key = str(key).replace("_", "-")
                args[key], source[key] = value, var
        first, last = transfer_ports.get(str(name), (0, -1))
        for port in range(first, last + 1):
            found.append(("*", port, f"engine {name} (KV transfer)", "sglang_release_transfer_port_base"))
        if "nccl-port" in args:
            found.append(("*", args["nccl-port"], f"engine {name} (NCCL)", f"{source['nccl-port']}.nccl-port"))
        if "dist-init-addr" in args and str(args.get("node-rank", 0)) == "0":
            found.append(("*", str(args["dist-init-addr"]).rpartition(":")[2], f"engine {name} (distributed init)",
                          f"{source['dist-init-addr']}.dist-init-addr"))
    return found


def listeners(variables, host, groups, group_names=None):
    """Every (address, port) a role of site.yml opens on this host, from the inventory and
    the roles' defaults: [(address, port, user, variable)]. groups: the inventory's groups;
    group_names: the engine, router and monitoring groups' names."""
    names = {"engine": "sglang_engine_hosts", "router": "sglang_router_hosts", "monitoring": "monitoring_hosts",
             **(group_names or {})}

    def member(kind, group=None):
        return host in ((groups or {}).get(group or names[kind]) or [])

    listen_address = _render(variables.get("sglang_listen_address", HOST_ADDRESS_DEFAULT)
                             if variables is not None else HOST_ADDRESS_DEFAULT, variables, host)
    found = []
    # site.yml runs node_exporter on every host.
    found.append((_role_value(variables, host, "node_exporter_listen_address"),
                  _role_value(variables, host, "node_exporter_port"), "node exporter", "node_exporter_port"))
    if member("engine"):
        found += _engine_listeners(variables, host, listen_address)
        if _bool(_role_value(variables, host, "gpu_exporter_enabled")):
            found.append((_role_value(variables, host, "gpu_exporter_listen_address"),
                          _role_value(variables, host, "gpu_exporter_port"), "GPU exporter", "gpu_exporter_port"))
    if member("router"):
        router = _role_value(variables, host, "sglang_router_host")
        # The gateway (nginx) serves the router's API on the public port; the router itself
        # listens on its loopback address.
        found.append((router, _role_value(variables, host, "sglang_router_port"), "router (API)",
                      "sglang_router_port"))
        found.append((_role_value(variables, host, "sglang_router_internal_host"),
                      _role_value(variables, host, "sglang_router_internal_port"), "router (its own API, behind the gateway)",
                      "sglang_router_internal_port"))
        found.append((router, _role_value(variables, host, "sglang_router_metrics_port"), "router (metrics)",
                      "sglang_router_metrics_port"))
    if member("monitoring"):
        found.append((_role_value(variables, host, "prometheus_listen_address"),
                      _role_value(variables, host, "prometheus_port"), "Prometheus", "prometheus_port"))
        alertmanager = _role_value(variables, host, "alertmanager_listen_address")
        found.append((alertmanager, _role_value(variables, host, "alertmanager_port"), "Alertmanager (API)",
                      "alertmanager_port"))
        # Alertmanager listens for its cluster only with peers (two or more hosts in the group).
        cluster_group = _role_value(variables, host, "alertmanager_cluster_group")
        if member("monitoring", cluster_group) and len((groups or {}).get(cluster_group) or []) > 1:
            found.append((alertmanager, _role_value(variables, host, "alertmanager_cluster_port"),
                          "Alertmanager (cluster)", "alertmanager_cluster_port"))
        found.append((_role_value(variables, host, "grafana_listen_address"),
                      _role_value(variables, host, "grafana_port"), "Grafana", "grafana_port"))
    return [(str(address).strip(), _port(port), user, var) for address, port, user, var in found]


def listener_errors(variables, host, groups, group_names=None):
    """No two listeners of this host on one port of one address (an address that binds every
    address clashes with each address)."""
    errors, seen = [], []
    for address, port, user, var in listeners(variables, host, groups, group_names):
        if port is None:
            continue  # a port that is no number: the owning role's own check says so
        wildcard = address in WILDCARD_ADDRESSES
        for other_address, other_port, other_user, other_var in seen:
            if port != other_port or not (wildcard or other_address in WILDCARD_ADDRESSES or address == other_address):
                continue
            where = (f"{port} (every address)" if wildcard and other_address in WILDCARD_ADDRESSES
                     else f"{other_address if wildcard else address}:{port}")
            fix = (f"give one of them another port: set {var} or {other_var} in the inventory." if var != other_var
                   else "it gives both the same port: set the port in each engine's own args instead.")
            errors.append(_err(host, var, f"{where} is wanted by {user} ({var}) and by {other_user} ({other_var}); "
                               "the second to start would fail to bind.", fix))
            break
        seen.append((address, port, user, var))
    return errors


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
            "preflight_grafana_errors": grafana_errors,
            "preflight_serving_key_errors": serving_key_errors,
            "preflight_web_config_errors": web_config_errors,
            "preflight_gateway_errors": gateway_errors,
            "preflight_prometheus_errors": prometheus_errors,
            "preflight_alertmanager_errors": alertmanager_errors,
            "preflight_install_plan": install_plan,
            "preflight_gpu_exporter_errors": gpu_exporter_errors,
            "preflight_gpu_host_errors": gpu_host_errors,
            "preflight_gpu_count_errors": gpu_count_errors,
            "preflight_speculative_errors": speculative_errors,
            "preflight_kv_cache_errors": kv_cache_errors,
            "preflight_router_mode_errors": router_mode_errors,
            "preflight_acceptance_errors": acceptance_errors,
            "preflight_lock_errors": lock_errors,
            "preflight_model_source_errors": model_source_errors,
            "preflight_wheelhouse_errors": wheelhouse_errors,
            "preflight_listener_errors": listener_errors,
            "preflight_transfer_errors": transfer_errors,
        }
