"""Rendering and cross-engine checks of SGLang engine arguments for sglang_release.

engine_args() turns one entry of sglang_engines plus the model recipe into the mapping
written to engines/<name>.yaml (SGLang's `--config`; keys spelled with dashes, as on the
command line), with the recipe's speculative block rendered by speculative_args().
cross_engine_errors() checks what SGLang's own parser cannot see, because
it parses one engine at a time: speculative-decoding arguments identical on every prefill
and decode engine, and bootstrap ports that clash with another listener on an address.
"""

from __future__ import annotations

import hashlib
import json

PD_MODES = ("prefill", "decode")
SPECULATIVE_PREFIX = "speculative-"
# The recipe's speculative block: field -> SGLang argument.
SPECULATIVE_FIELDS = (("algorithm", "speculative-algorithm"), ("num_steps", "speculative-num-steps"),
                      ("eagle_topk", "speculative-eagle-topk"), ("num_draft_tokens", "speculative-num-draft-tokens"),
                      ("moe_runner_backend", "speculative-moe-runner-backend"))


def _norm(key) -> str:
    return str(key).replace("_", "-")


def _merge(target: dict, extra) -> dict:
    for key, value in (extra or {}).items():
        target[_norm(key)] = value
    return target


def _on(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1", "y")
    return bool(value)


def draft_dir(model_dir) -> str:
    """Where a recipe's separate draft model is staged: beside the weights, outside releases."""
    return f"{model_dir}-draft"


def speculative_args(recipe, model_dir):
    """The SGLang arguments of the recipe's speculative block; none when it is off."""
    spec = recipe.get("speculative") or {}
    if not _on(spec.get("enabled")):
        return {}
    args = {}
    for field, key in SPECULATIVE_FIELDS:
        if spec.get(field) not in (None, ""):
            args[key] = int(spec[field]) if field in ("num_steps", "eagle_topk", "num_draft_tokens") else str(spec[field])
    if spec.get("draft_hf_repo"):
        args["speculative-draft-model-path"] = draft_dir(model_dir)
    return args


def engine_args(engine, recipe, model_dir, listen_address, transfer_backend="mooncake",
                ib_device="", host_args=None):
    """The SGLang arguments of one engine, in a stable order."""
    mode = engine["mode"]
    gpus = list(engine["gpus"])
    dp = int(engine.get("dp", 1))
    tp = int(engine.get("tp", len(gpus) // max(dp, 1)))
    args = {
        "model-path": str(model_dir),
        "served-model-name": recipe.get("served_model_name") or engine["name"],
        "host": str(engine.get("host", listen_address)),
        "port": int(engine["port"]),
        "tp-size": tp,
    }
    if dp > 1:
        args["dp-size"] = dp
    quantization = str(recipe.get("quantization") or "none")
    if quantization.lower() not in ("none", ""):
        args["quantization"] = quantization
    if mode in PD_MODES:
        args["disaggregation-mode"] = mode
        args["disaggregation-transfer-backend"] = transfer_backend
        if ib_device:
            args["disaggregation-ib-device"] = ib_device
    if mode == "prefill" and "bootstrap_port" in engine:
        args["disaggregation-bootstrap-port"] = int(engine["bootstrap_port"])
    args["enable-metrics"] = True
    args["extra-metric-labels"] = {"role": mode, "instance": engine["name"]}
    _merge(args, recipe.get("args"))
    _merge(args, speculative_args(recipe, model_dir))
    _merge(args, (recipe.get("mode_args") or {}).get(mode))
    _merge(args, host_args)
    _merge(args, engine.get("args"))
    return args


def engine_env(engine, recipe, host_env=None, runtime_dir="/run/sglang-engine", measured_env=None,
               transfer_ports=None, transfer_timeout=None):
    """The environment file of one engine (values as strings).

    measured_env (gpu_qualify's NCCL decision for the host) applies to engines of several
    GPUs, under the recipe's, the host's and the engine's env: what an operator sets wins.
    """
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in engine["gpus"]),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "PROMETHEUS_MULTIPROC_DIR": f"{runtime_dir}/{engine['name']}",
        "SGLANG_ENGINE_NAME": str(engine["name"]),
        "SGLANG_ENGINE_MODE": str(engine["mode"]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    ports = (transfer_ports or {}).get(engine["name"])
    if ports:
        # Mooncake opens its handshake (RPC) and TCP data listeners in this range, one pair per rank
        env["MC_MIN_RPC_PORT"], env["MC_MAX_RPC_PORT"] = str(ports[0]), str(ports[1])
    if engine["mode"] in PD_MODES and transfer_timeout:
        # a KV transfer to a peer that cannot be reached fails after this many seconds
        env["MC_TRANSFER_TIMEOUT"] = str(int(transfer_timeout))
    measured = measured_env if len(engine["gpus"]) > 1 else None
    for source in (measured, recipe.get("env"), host_env, engine.get("env")):
        for key, value in (source or {}).items():
            env[str(key)] = str(value)
    return env


def transfer_backend(configured, rdma_devices) -> str:
    """The KV-transfer backend a host's PD engines use: `auto` takes RDMA where the host has
    an RDMA device, else Mooncake's TCP transport."""
    configured = str(configured or "auto")
    if configured != "auto":
        return configured
    # mooncake_tcp, not nixl: SGLang 0.5.23's default PD path (its hook forces MC_FORCE_TCP), one package in the lock
    return "mooncake" if list(rdma_devices or []) else "mooncake_tcp"


def transfer_ports(engines, base) -> dict:
    """{engine name: [first, last]}: each PD engine's port range for its transfer engines, in
    list order from `base`, two ports (handshake and data) for each of its GPUs' ranks."""
    ports, first = {}, int(base)
    for engine in engines or []:
        if isinstance(engine, dict) and engine.get("mode") in PD_MODES:
            count = 2 * max(len(engine.get("gpus") or []), 1)
            ports[str(engine.get("name"))] = [first, first + count - 1]
            first += count
    return ports


def env_file(env) -> str:
    lines = ["# Rendered by sglang_release; the engine unit reads it (EnvironmentFile)."]
    for key, value in env.items():
        escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'{key}="{escaped}"')
    return "\n".join(lines) + "\n"


def cross_engine_errors(layout, router_ports=None):
    """layout: {host: {"address": listen address, "engines": {name: {"mode":..., "args": {...}}},
    "router": bool}}. Returns error strings naming the host, the engine and the argument."""
    errors = []
    pd = []
    for host in sorted(layout):
        for name, engine in sorted((layout[host].get("engines") or {}).items()):
            if engine["mode"] in PD_MODES:
                pd.append((host, name, engine))
    # Speculative decoding: every prefill and decode engine must agree.
    if pd:
        ref_host, ref_name, ref = pd[0]
        ref_spec = {k: v for k, v in ref["args"].items() if k.startswith(SPECULATIVE_PREFIX)}
        for host, name, engine in pd[1:]:
            spec = {k: v for k, v in engine["args"].items() if k.startswith(SPECULATIVE_PREFIX)}
            for key in sorted(set(spec) | set(ref_spec)):
                if spec.get(key) != ref_spec.get(key):
                    errors.append(
                        f"{host}: engine {name} ({engine['mode']}): argument --{key} is "
                        f"{_show(spec.get(key))} but {_show(ref_spec.get(key))} on engine {ref_name} "
                        f"({ref['mode']}, {ref_host}). Speculative-decoding arguments must be identical "
                        "on prefill and decode. Fix: set them once in the recipe's speculative block, not per engine "
                        "or per mode.")
    # Ports: a bootstrap port must not clash with another listener on the same address.
    for host in sorted(layout):
        owners = {}
        address = str(layout[host].get("address"))
        if layout[host].get("router"):
            for port in router_ports or []:
                owners[(address, int(port))] = "the router"
        listeners = []
        for name, engine in sorted((layout[host].get("engines") or {}).items()):
            args = engine["args"]
            eaddr = str(args.get("host", address))
            listeners.append((eaddr, int(args["port"]), name, "port"))
            if engine["mode"] == "prefill":
                bport = args.get("disaggregation-bootstrap-port", 8998)
                listeners.append((eaddr, int(bport), name, "disaggregation-bootstrap-port"))
        # Plain ports first, so a clash is reported on the bootstrap port.
        listeners.sort(key=lambda item: item[3] != "port")
        for eaddr, port, name, key in listeners:
            for addr_key in {(eaddr, port), ("0.0.0.0", port)} if eaddr != "0.0.0.0" else {(eaddr, port)}:
                owner = owners.get(addr_key)
                if owner:
                    errors.append(
                        f"{host}: engine {name}: argument --{key} {port} clashes with {owner} on "
                        f"{eaddr}. Fix: give every prefill engine on a host its own bootstrap port, "
                        "different from every engine and router port.")
                    break
            else:
                owners[(eaddr, port)] = f"--{key} of engine {name}"
    return errors


def _show(value) -> str:
    return "unset" if value is None else json.dumps(value)


def content_id(parts, length=12) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:length]


def manifest_diff(old, new):
    """What changed between two release manifests, one line per difference."""
    lines = []
    for key in ("sglang_version", "router_version", "python", "lock_sha256", "kernel_wheel", "model", "repo_version", "repo_revision"):
        if old.get(key) != new.get(key):
            lines.append(f"{key}: {_show(old.get(key))} -> {_show(new.get(key))}")
    old_eng, new_eng = old.get("engines") or {}, new.get("engines") or {}
    for name in sorted(set(old_eng) | set(new_eng)):
        if name not in old_eng:
            lines.append(f"engine {name}: added")
            continue
        if name not in new_eng:
            lines.append(f"engine {name}: removed")
            continue
        for part in ("args", "env"):
            a, b = old_eng[name].get(part) or {}, new_eng[name].get(part) or {}
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    label = f"--{key}" if part == "args" else key
                    lines.append(f"engine {name}: {label} {_show(a.get(key))} -> {_show(b.get(key))}")
    return lines or ["no difference in versions, model or engine arguments"]


class FilterModule:
    def filters(self):
        return {
            "sglang_release_engine_args": engine_args,
            "sglang_release_engine_env": engine_env,
            "sglang_release_speculative_args": speculative_args,
            "sglang_release_draft_dir": draft_dir,
            "sglang_release_env_file": env_file,
            "sglang_release_transfer_backend": transfer_backend,
            "sglang_release_transfer_ports": transfer_ports,
            "sglang_release_cross_engine_errors": cross_engine_errors,
            "sglang_release_content_id": content_id,
            "sglang_release_manifest_diff": manifest_diff,
        }

