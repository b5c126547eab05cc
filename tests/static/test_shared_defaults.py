"""The repository's defaults/*.yml reach any inventory, below everything the operator sets.

Runs the real `ansible` command from the repository root (its ansible.cfg enables the
sm120_defaults vars plugin) against inventories written here, connection local.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = str(Path(sys.executable).parent / "ansible")
PROBE = ("{{ {'model': sglang_model, 'revision': sglang_model_recipes[sglang_model].hf_revision, "
         "'quantization': sglang_model_recipes[sglang_model].quantization, 'router_port': sglang_router_port, "
         "'root': sglang_root, 'gpus': sglang_gpu_count} | to_json }}")


def probe(*inventories: Path, extra: list[str] = ()) -> dict[str, dict]:
    args = [ANSIBLE, "all", "-c", "local", "-o", "-m", "ansible.builtin.debug", "-a", f"msg={PROBE}"]
    for inventory in inventories:
        args[1:1] = ["-i", str(inventory)]
    out = subprocess.run(args + list(extra), cwd=REPO, capture_output=True, text=True, check=True,
                         env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOAD_CALLBACK_PLUGINS="0")).stdout
    found = {}
    for line in out.splitlines():
        host, _, rest = line.partition(" | SUCCESS => ")
        found[host.strip()] = json.loads(json.loads(rest)["msg"])
    return found


def write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))


def test_an_example_inventory_gets_the_shipped_recipe() -> None:
    """inventory/examples/single-node-pd has no recipe of its own: the shipped one applies."""
    found = probe(REPO / "inventory/examples/single-node-pd")
    assert found["gpu-box-1"] == {"model": "deepseek-v4-flash-nvfp4", "revision": "", "quantization": "fp8",
                                  "router_port": 8000, "root": "/opt/sm120-serve", "gpus": 8}


def test_every_inventory_level_wins_over_the_defaults(tmp_path: Path) -> None:
    write(tmp_path / "hosts.yml", {"all": {
        "vars": {"sglang_router_port": 8100},
        "children": {"sglang_engine_hosts": {"vars": {"sglang_root": "/opt/inline"},
                                             "hosts": {"a": {}, "b": {}}}}}})
    write(tmp_path / "group_vars/all/main.yml", {
        "sglang_model": "kimi-k2.5-int4",
        "sglang_recipe_overrides": {"kimi-k2.5-int4": {"hf_revision": "a" * 40}}})
    write(tmp_path / "host_vars/b.yml", {"sglang_gpu_count": 4})
    found = probe(tmp_path)
    common = {"model": "kimi-k2.5-int4", "revision": "a" * 40, "quantization": "compressed-tensors",
              "router_port": 8100, "root": "/opt/inline"}
    assert found["a"] == dict(common, gpus=8)
    assert found["b"] == dict(common, gpus=4)
    # extra vars win over all of it
    assert probe(tmp_path, extra=["-e", '{"sglang_gpu_count": 2}'])["b"]["gpus"] == 2


def test_a_second_inventory_source_does_not_bring_the_defaults_back(tmp_path: Path) -> None:
    """With two -i sources (an example and an overlay) the defaults sit below both."""
    write(tmp_path / "first/hosts.yml", {"all": {"hosts": {"a": {}}}})
    write(tmp_path / "first/group_vars/all.yml", {"sglang_model": "kimi-k2.5-int4"})
    write(tmp_path / "second/hosts.yml", {"all": {"hosts": {"a": {}}}})
    assert probe(tmp_path / "first", tmp_path / "second/hosts.yml")["a"]["model"] == "kimi-k2.5-int4"
