"""Tunable launch configurations, one JSON file per device name.

File name: the CUDA device name with every run of non-alphanumerics replaced by
"_" (``NVIDIA RTX PRO 6000 Blackwell Server Edition`` ->
``NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json``). ``default.json`` is the
safe fallback: its tiles fit sm_120's 101,376 B of shared memory.

Layout: {format: {max_tokens: {"gate_up": cfg, "down": cfg}}}; the first bucket
whose max_tokens >= the batch is used, else the largest. cfg is for the
fragment kernel (fused_moe_w4a16_frag, what packed weights run on): kernel
"frag", NT (8 NT tokens per expert block), num_warps (the warps that split K),
depth (K groups per warp and step: register sets in flight, 1 to 4; default
1), pipe (all of the next step's loads issued before this step's MMAs; false:
the register ring, each set reloaded in place right after its MMAs) and, for
the down GEMM, RT (row tiles per program). Optional: maxnreg (the launch's
register cap; under it ptxas keeps a pipe step's loads ahead of its MMAs),
scales_ahead (pipe only: a step decodes the next step's block scales after its
MMAs), one_clamp (where K is a whole number of steps: one address computation
per step, the other register sets at constant offsets from it; the same
results, fewer instructions), exchange (several tokens, NT 1: the warps' partial
sums of a block exchanged in one round through shared memory without bank
conflicts, and each warp finishing its own C registers, instead of one
reduction with four barriers per C register; the same sums in another order),
bulk (the K loop through each warp's shared-memory ring of that many
stages of depth K groups, copied by cp.async.bulk; pipe and scales_ahead then
do not apply; at most 48 KB of rings per program) and, at one token,
direct_split (fused_moe_w4a16_frag.direct_split), prefetch (the down GEMM's
rings: its first stages copied before the gate/up GEMM ends) and pdl (the
down GEMM's register path launched dependent on the gate/up GEMM, asking L2
for that many K steps of its first slot first), and from several tokens on
walkers (the most programs per row tile that walk the expert blocks; default
one per block that can exist, most of which find no block at small batches
and exit).

Whole-bucket key dependent_launches (sm_90 and newer; true, or a list of
DEPENDENT_LAUNCHES): those launches start while the launch before them
runs (programmatic dependent launch) and wait for its outputs. block_ready
(with "down" among them, its config on the register path): the down GEMM
starts on each expert block once the gate/up GEMM has written all of it.

A key stays only while a shipped file uses it; validate() refuses the rest.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources

REQUIRED = ("NT", "num_warps", "pipe")
# the keys a GEMM's config and a bucket may have (tests check each is shipped)
GEMM_KEYS = frozenset(REQUIRED) | {"kernel", "depth", "RT", "maxnreg", "scales_ahead", "one_clamp", "exchange",
                                   "bulk", "direct_split", "prefetch", "pdl", "walkers"}
BUCKET_KEYS = frozenset({"gate_up", "down", "dependent_launches", "block_ready"})
DEPENDENT_LAUNCHES = ("gate_up", "down", "combine")


def device_file_name(device_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_") + ".json"


def shipped_files() -> list[str]:
    """The MoE files. Files named <kernel>-<device>.json belong to other kernels
    (indexer.py, mhc.py) and are read by them."""
    return sorted(p.name for p in resources.files(__package__).iterdir()
                  if p.name.endswith(".json") and "-" not in p.name)


@functools.lru_cache(maxsize=None)
def load_file(name: str) -> dict:
    return validate(name, json.loads(resources.files(__package__).joinpath(name).read_text()))


def validate(name: str, data: dict) -> dict:
    """data (config file name's contents), or ValueError naming what is wrong."""
    for fmt, buckets in data.items():
        if fmt.startswith("_"):
            continue
        for bucket in buckets.values():
            unknown = sorted(set(bucket) - BUCKET_KEYS)
            if unknown:
                raise ValueError(f"{name}: {fmt}: unknown keys {unknown}")
            for kernel in ("gate_up", "down"):
                kind = bucket[kernel].get("kernel")
                if kind != "frag":
                    raise ValueError(f"{name}: {fmt}/{kernel}: unknown kernel {kind!r} (only \"frag\")")
                missing = [k for k in REQUIRED if k not in bucket[kernel]]
                if missing:
                    raise ValueError(f"{name}: {fmt}/{kernel} lacks {missing}")
                unknown = sorted(set(bucket[kernel]) - GEMM_KEYS)
                if unknown:
                    raise ValueError(f"{name}: {fmt}/{kernel}: unknown keys {unknown}")
                walkers = bucket[kernel].get("walkers", 1)
                if not (isinstance(walkers, int) and not isinstance(walkers, bool) and walkers >= 1):
                    raise ValueError(f"{name}: {fmt}/{kernel}: walkers is a whole number of programs from 1 on, "
                                     f"not {walkers!r}")
            dep = bucket.get("dependent_launches", False)
            if not (isinstance(dep, bool) or (isinstance(dep, list) and set(dep) <= set(DEPENDENT_LAUNCHES))):
                raise ValueError(f"{name}: {fmt}: dependent_launches is true, false or a list of "
                                 f"{list(DEPENDENT_LAUNCHES)}, not {dep!r}")
            if bucket.get("block_ready") and not (dep is True or (isinstance(dep, list) and "down" in dep)):
                raise ValueError(f"{name}: {fmt}: block_ready needs the down GEMM among dependent_launches")
            if bucket["gate_up"].get("NT") != bucket["down"].get("NT"):
                raise ValueError(f"{name}: {fmt}: gate_up and down must share NT (one alignment)")
    return data


@functools.lru_cache(maxsize=None)
def load_config_file(name: str) -> dict:
    """The entries of another kernel's ``configs/<name>`` (keys starting with
    "_" dropped). A file with ``"_extends": "<other file>"`` is that file's
    entries with its own merged over them, entry by entry."""
    data = json.loads(resources.files(__package__).joinpath(name).read_text())
    merged = dict(load_config_file(data["_extends"])) if "_extends" in data else {}
    for key, value in data.items():
        if key.startswith("_"):
            continue
        base = merged.get(key)
        merged[key] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
    return merged


@functools.lru_cache(maxsize=None)
def load_configs(prefix: str, device_name: str | None) -> dict:
    """``configs/<prefix>-<device file name>`` (indexer, mhc), else
    ``configs/<prefix>-default.json``, else {} (load_config_file)."""
    root = resources.files(__package__)
    names = [f"{prefix}-{device_file_name(device_name)}"] if device_name else []
    names.append(f"{prefix}-default.json")
    for name in names:
        if root.joinpath(name).is_file():
            return load_config_file(name)
    return {}


@functools.lru_cache(maxsize=None)
def _current_device_name() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except Exception:
        pass
    return None


@functools.lru_cache(maxsize=None)
def file_for_device(device_name: str | None) -> str:
    if device_name:
        name = device_file_name(device_name)
        if name in shipped_files():
            return name
    return "default.json"


def pick(data: dict, fmt: str, num_tokens: int) -> dict:
    buckets = sorted(data[fmt].items(), key=lambda kv: int(kv[0]))
    for max_tokens, cfg in buckets:
        if num_tokens <= int(max_tokens):
            return cfg
    return buckets[-1][1]


def get_config(fmt: str, num_tokens: int, hidden: int = 0, inter: int = 0, experts: int = 0,
               top_k: int = 0, device_name: str | None = None) -> dict:
    name = file_for_device(device_name or _current_device_name())
    return pick(load_file(name), fmt, num_tokens)


def register_cap(cfg: dict) -> dict:
    """The launch's register cap as Triton launch options: {"maxnreg": n}
    where the config sets maxnreg (ptxas then budgets at most n registers per
    thread), else none."""
    return {"maxnreg": int(cfg["maxnreg"])} if cfg.get("maxnreg") else {}
