"""The shipped inventories (examples and the lab) pass preflight's engine, listener and topology checks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location(
    "preflight_checks", REPO / "roles/preflight/filter_plugins/preflight_checks.py")
checks = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(checks)
INVENTORIES = sorted(p for p in (REPO / "inventory/examples").iterdir() if p.is_dir()) + [REPO / "inventory/lab"]


def host_vars(inventory: Path) -> tuple[dict, InventoryManager]:
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(inventory)])
    variables = VariableManager(loader=loader, inventory=manager)
    return {h.name: variables.get_vars(host=h) for h in manager.get_hosts()}, manager


@pytest.mark.parametrize("inventory", INVENTORIES, ids=[p.name for p in INVENTORIES])
def test_inventory_passes_engine_listener_and_topology_checks(inventory: Path) -> None:
    hostvars, manager = host_vars(inventory)
    engine_hosts = [h.name for h in manager.groups["sglang_engine_hosts"].get_hosts()]
    router_hosts = [h.name for h in manager.groups["sglang_router_hosts"].get_hosts()]
    assert engine_hosts and router_hosts
    errors = []
    for host in engine_hosts:
        errors += checks.engine_errors(hostvars[host]["sglang_engines"], host, 8)
    groups = {name: [h.name for h in group.get_hosts()] for name, group in manager.groups.items()}
    for host in hostvars:
        errors += checks.listener_errors(hostvars[host], host, groups)
    resolved = {h: {"sglang_engines": hostvars[h]["sglang_engines"], "ansible_host": hostvars[h].get("ansible_host")}
                for h in engine_hosts}
    errors += checks.topology_errors(resolved, engine_hosts, router_hosts)
    assert errors == []


@pytest.mark.parametrize("inventory", INVENTORIES[:-1], ids=[p.name for p in INVENTORIES[:-1]])
def test_examples_install_the_driver_on_every_engine_host(inventory: Path) -> None:
    """site.yml's driver and CUDA play runs on nvidia_gpu_hosts; in the examples that is every engine host."""
    _, manager = host_vars(inventory)
    engine_hosts = {h.name for h in manager.groups["sglang_engine_hosts"].get_hosts()}
    gpu_hosts = {h.name for h in manager.groups["nvidia_gpu_hosts"].get_hosts()}
    assert engine_hosts and engine_hosts <= gpu_hosts


def test_checks_catch_an_overlap_in_an_example() -> None:
    """The same checks fail when an example is broken (the test above can fail)."""
    hostvars, _ = host_vars(REPO / "inventory/examples/single-node-pd")
    engines = [dict(e) for e in hostvars["gpu-box-1"]["sglang_engines"]]
    engines[1]["gpus"] = [3, 4, 5, 6]
    errors = checks.engine_errors(engines, "gpu-box-1", 8)
    assert errors == ["gpu-box-1: sglang_engines[1] (decode-0).gpus: GPU 3 is also used by prefill-0. "
                      "Fix: give each engine on a host its own GPUs."]


def test_listeners_of_an_example_box() -> None:
    """Every listener the roles open on the single-node PD box, at the example's address."""
    hostvars, manager = host_vars(REPO / "inventory/examples/single-node-pd")
    groups = {name: [h.name for h in group.get_hosts()] for name, group in manager.groups.items()}
    found = {(address, port, user) for address, port, user, _ in checks.listeners(hostvars["gpu-box-1"], "gpu-box-1", groups)}
    assert found == {("10.0.0.11", 9100, "node exporter"), ("10.0.0.11", 9400, "GPU exporter"),
                     ("10.0.0.11", 30000, "engine prefill-0 (HTTP API and /metrics)"),
                     ("10.0.0.11", 8998, "engine prefill-0 (PD bootstrap)"),
                     ("10.0.0.11", 30001, "engine decode-0 (HTTP API and /metrics)"),
                     ("10.0.0.11", 8000, "router (API)"), ("10.0.0.11", 29000, "router (metrics)"),
                     ("127.0.0.1", 8010, "router (its own API, behind the gateway)")} | {
                     # Mooncake's transfer listeners (every address): two per GPU rank of each PD engine
                     ("*", port, f"engine {name} (KV transfer)")
                     for name, ports in (("prefill-0", range(17000, 17008)), ("decode-0", range(17008, 17016)))
                     for port in ports}
    monitor = {(port, user) for _, port, user, _ in checks.listeners(hostvars["monitor-1"], "monitor-1", groups)}
    assert monitor == {(9100, "node exporter"), (9090, "Prometheus"), (9093, "Alertmanager (API)"), (3000, "Grafana")}
