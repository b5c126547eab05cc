"""preflight's listener check: every (address, port) a role of site.yml opens on a host,
from the inventory and the roles' defaults, and the clashes it refuses before any change."""

from __future__ import annotations

import re
from pathlib import Path
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
checks = load("preflight_checks", REPO / "roles" / "preflight" / "filter_plugins" / "preflight_checks.py")

# "<host>: <variable>: <what is wrong> Fix: <what to do>."
MESSAGE = re.compile(r"^[\w.-]+: [\w\[\]().' -]+: .+[.;)] Fix: .+\.$")
PD = [{"name": "prefill-0", "mode": "prefill", "gpus": [0, 1, 2, 3], "port": 30000, "bootstrap_port": 8998},
      {"name": "decode-0", "mode": "decode", "gpus": [4, 5, 6, 7], "port": 30001}]
# One box that runs everything: engines, router and monitoring.
ALL_IN_ONE = {"sglang_engine_hosts": ["box"], "sglang_router_hosts": ["box"], "monitoring_hosts": ["box"]}


def box(**variables):
    """A host's variables as the inventory gives them (templated defaults left to the check)."""
    return {"ansible_host": "10.0.0.11", "sglang_listen_address": "{{ ansible_host | default(inventory_hostname) }}",
            "sglang_engines": PD, **variables}


def errors(variables, groups=None, host="box"):
    found = checks.listener_errors(variables, host, groups or ALL_IN_ONE)
    for error in found:
        assert MESSAGE.match(error), error
    return found


def test_every_roles_listener_on_one_box_from_the_roles_defaults():
    found = checks.listeners(box(), "box", ALL_IN_ONE)
    # Mooncake's transfer listeners: two ports per GPU rank of each PD engine, on every address
    transfer = [("*", p) for p in range(17000, 17016)]
    # the router's own API on loopback, behind the gateway on the public port (8000)
    assert sorted((a, p) for a, p, _, _ in found) == sorted(
        [("10.0.0.11", p) for p in (9100, 30000, 8998, 30001, 9400, 8000, 29000, 9090, 9093, 3000)] + transfer
        + [("127.0.0.1", 8010)])
    assert errors(box()) == []


def test_the_transfer_ports_on_an_exporters_port_are_refused_naming_the_base():
    (error,) = errors(box(sglang_release_transfer_port_base=9390))
    assert error.startswith("box: gpu_exporter_port: 10.0.0.11:9400 is wanted by GPU exporter (gpu_exporter_port) "
                            "and by engine decode-0 (KV transfer) (sglang_release_transfer_port_base);"), error


def test_router_metrics_port_on_prometheus_port_is_refused_naming_both():
    assert errors(box(sglang_router_metrics_port=9090)) == [
        "box: prometheus_port: 10.0.0.11:9090 is wanted by Prometheus (prometheus_port) and by router (metrics) "
        "(sglang_router_metrics_port); the second to start would fail to bind. Fix: give one of them another port: "
        "set prometheus_port or sglang_router_metrics_port in the inventory."]


def test_two_engines_on_one_port():
    engines = [dict(PD[0]), dict(PD[1], port=30000)]
    (error,) = errors(box(sglang_engines=engines))
    assert error.startswith("box: sglang_engines[1] (decode-0).port: 10.0.0.11:30000 is wanted by engine decode-0 "
                            "(HTTP API and /metrics) (sglang_engines[1] (decode-0).port) and by engine prefill-0 "
                            "(HTTP API and /metrics) (sglang_engines[0] (prefill-0).port);")


def test_a_bootstrap_port_on_the_gpu_exporters_port():
    engines = [dict(PD[0], bootstrap_port=9400), PD[1]]
    (error,) = errors(box(sglang_engines=engines))
    assert "gpu_exporter_port: 10.0.0.11:9400 is wanted by GPU exporter" in error
    assert "engine prefill-0 (PD bootstrap) (sglang_engines[0] (prefill-0).bootstrap_port)" in error


def test_a_prefill_engine_without_bootstrap_port_takes_the_default():
    engines = [{k: v for k, v in PD[0].items() if k != "bootstrap_port"}, PD[1]]
    (error,) = errors(box(sglang_engines=engines, grafana_port=8998))
    assert "10.0.0.11:8998 is wanted by Grafana (grafana_port) and by engine prefill-0 (PD bootstrap)" in error


def test_other_addresses_do_not_clash_but_every_address_does():
    assert errors(box(grafana_listen_address="127.0.0.1", grafana_port=9090)) == []
    (error,) = errors(box(grafana_listen_address="0.0.0.0", grafana_port=30001))
    assert "10.0.0.11:30001 is wanted by Grafana (grafana_port) and by engine decode-0" in error


def test_nccl_and_dist_init_ports_from_the_engines_arguments_bind_every_address():
    engines = [dict(PD[0], args={"nccl-port": 9100}), PD[1]]
    (error,) = errors(box(sglang_engines=engines, node_exporter_listen_address="127.0.0.1"))
    assert "127.0.0.1:9100 is wanted by engine prefill-0 (NCCL) (sglang_engines[0] (prefill-0).args.nccl-port)" in error
    # The distributed-init port listens on node 0 only.
    engines = [dict(PD[0], args={"dist-init-addr": "10.0.0.11:8000", "node-rank": 1}), PD[1]]
    assert errors(box(sglang_engines=engines)) == []
    engines = [dict(PD[0], args={"dist_init_addr": "10.0.0.11:8000"}), PD[1]]
    (error,) = errors(box(sglang_engines=engines))
    assert "engine prefill-0 (distributed init) (sglang_engines[0] (prefill-0).args.dist-init-addr)" in error


def test_the_recipes_arguments_count_with_the_variable_that_sets_them():
    recipes = {"m": {"args": {"nccl-port": 29000}}}
    same, router = errors(box(sglang_model="m", sglang_model_recipes=recipes))
    # One recipe value gives both engines the same port: the fix is a port per engine.
    assert same == ("box: sglang_model_recipes['m'].args.nccl-port: 29000 (every address) is wanted by engine decode-0 "
                    "(NCCL) (sglang_model_recipes['m'].args.nccl-port) and by engine prefill-0 (NCCL) "
                    "(sglang_model_recipes['m'].args.nccl-port); the second to start would fail to bind. "
                    "Fix: it gives both the same port: set the port in each engine's own args instead.")
    assert router.startswith("box: sglang_router_metrics_port: 10.0.0.11:29000 is wanted by router (metrics) "
                             "(sglang_router_metrics_port) and by engine prefill-0 (NCCL)")


def test_alertmanagers_cluster_port_only_with_peers():
    one = {"monitoring_hosts": ["mon"]}
    variables = {"ansible_host": "10.0.0.5", "alertmanager_cluster_port": 3000}
    assert errors(variables, one, "mon") == []
    assert errors(variables, {"monitoring_hosts": ["mon", "mon2"]}, "mon") == [
        "mon: grafana_port: 10.0.0.5:3000 is wanted by Grafana (grafana_port) and by Alertmanager (cluster) "
        "(alertmanager_cluster_port); the second to start would fail to bind. Fix: give one of them another port: "
        "set grafana_port or alertmanager_cluster_port in the inventory."]


def test_only_the_roles_that_run_on_the_host_count():
    # An engine host that is no monitoring host: Prometheus's port is free there.
    groups = {"sglang_engine_hosts": ["box"], "sglang_router_hosts": [], "monitoring_hosts": ["mon"]}
    assert errors(box(sglang_engines=[dict(PD[0], port=9090), PD[1]]), groups) == []
    assert errors(box(gpu_exporter_enabled=False, sglang_engines=[dict(PD[0], port=9400), PD[1]]), groups) == []
    assert errors(box(sglang_engines=[dict(PD[0], port=9400), PD[1]]), groups) != []


def test_a_port_that_is_no_number_is_left_to_its_roles_check():
    assert errors(box(grafana_port="three thousand")) == []
