"""The PD KV transfer: the backend each host's engines get (RDMA only where the host has an
RDMA device), the transfer engine's ports in the engines' environment, and preflight's
refusals before any change."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
release = load("sglang_release_filters", REPO / "roles" / "sglang_release" / "filter_plugins" / "sglang_release.py")
checks = load("preflight_checks", REPO / "roles" / "preflight" / "filter_plugins" / "preflight_checks.py")

PD = [{"name": "prefill-0", "mode": "prefill", "gpus": [0, 1, 2, 3], "port": 30000, "bootstrap_port": 8998},
      {"name": "decode-0", "mode": "decode", "gpus": [4, 5, 6, 7], "port": 30001}]
UNIFIED = [{"name": "unified-0", "mode": "unified", "gpus": list(range(8)), "port": 30000}]


@pytest.mark.parametrize(("configured", "devices", "used"), [
    ("auto", [], "mooncake_tcp"), ("auto", ["mlx5_0"], "mooncake"), ("", [], "mooncake_tcp"),
    ("mooncake_tcp", ["mlx5_0"], "mooncake_tcp"), ("mooncake", ["mlx5_0"], "mooncake")])
def test_the_backend_follows_the_hosts_rdma_devices_unless_set(configured, devices, used):
    assert release.transfer_backend(configured, devices) == used


def test_each_pd_engine_gets_two_ports_per_gpu_in_list_order():
    engines = [PD[0], {"name": "decode-0", "mode": "decode", "gpus": [4, 5], "port": 30001}] + UNIFIED
    assert release.transfer_ports(engines, 17000) == {"prefill-0": [17000, 17007], "decode-0": [17008, 17011]}
    assert release.transfer_ports(UNIFIED, 17000) == {}


def test_the_engine_environment_bounds_mooncakes_listeners_to_its_range():
    ports = release.transfer_ports(PD, 17000)
    env = release.engine_env(PD[1], {"env": {}}, transfer_ports=ports)
    assert (env["MC_MIN_RPC_PORT"], env["MC_MAX_RPC_PORT"]) == ("17008", "17015")
    assert "MC_MIN_RPC_PORT" not in release.engine_env(UNIFIED[0], {"env": {}}, transfer_ports=ports)


def test_pd_engines_get_the_transfer_timeout_unified_ones_do_not():
    assert release.engine_env(PD[0], {"env": {}}, transfer_timeout=30)["MC_TRANSFER_TIMEOUT"] == "30"
    assert "MC_TRANSFER_TIMEOUT" not in release.engine_env(UNIFIED[0], {"env": {}}, transfer_timeout=30)


def host(engines=PD, devices=(), **variables):
    return {"sglang_engines": engines, "preflight_rdma_devices": list(devices), **variables}


def test_rdma_mooncake_on_a_host_without_an_rdma_device_is_refused_naming_host_variable_and_fix():
    (error,) = checks.transfer_errors({"box": host(sglang_release_transfer_backend="mooncake")}, ["box"])
    assert error.startswith("box: sglang_release_transfer_backend: mooncake moves the KV cache over RDMA")
    assert "Fix: set sglang_release_transfer_backend: auto or mooncake_tcp" in error


def test_the_default_passes_with_and_without_rdma_and_unified_hosts_are_not_asked():
    assert checks.transfer_errors({"box": host()}, ["box"]) == []
    assert checks.transfer_errors({"box": host(devices=["mlx5_0"], sglang_release_transfer_backend="mooncake")},
                                  ["box"]) == []
    assert checks.transfer_errors({"box": host(UNIFIED, sglang_release_transfer_backend="mooncake")}, ["box"]) == []


def test_a_backend_the_release_does_not_carry_is_refused():
    (error,) = checks.transfer_errors({"box": host(sglang_release_transfer_backend="nixl")}, ["box"])
    assert error.startswith("box: sglang_release_transfer_backend: 'nixl' is not a transfer backend")


def test_pd_hosts_that_would_use_different_transports_are_refused():
    hosts = {"prefill-box": host([PD[0]], devices=["mlx5_0"]), "decode-box": host([PD[1]])}
    (error,) = checks.transfer_errors(hosts, sorted(hosts))
    assert "decode-box (mooncake_tcp), prefill-box (mooncake)" in error
    assert "Fix: set sglang_release_transfer_backend: mooncake_tcp for all engine hosts" in error
