"""preflight's checks of the inputs that the roles after it would refuse only late.

Each later role (nvidia_driver, cuda_toolkit, node_exporter, gpu_exporter, alertmanager,
prometheus, grafana, sglang_release, sglang_router, sglang_gateway) refuses some inputs itself, but only in its own
play, after earlier plays or hosts have changed. preflight_checks.py refuses them first;
these tests pin what it refuses, what it lets through, and that the roles' defaults it falls
back to are values it can judge.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
checks = load("preflight_checks", REPO / "roles" / "preflight" / "filter_plugins" / "preflight_checks.py")

LOCK = REPO / "files" / "sglang" / "requirements.lock"
# "<host>: <variable>: <what is wrong> Fix: <what to do>."
MESSAGE = re.compile(r"^[\w.-]+: [\w\[\]().' -]+: .+[.;)] Fix: .+\.$")
ROLE_PREFIXES = ("alertmanager", "grafana", "prometheus", "node_exporter", "gpu_exporter", "nvidia_driver", "cuda_toolkit",
                 "sglang_release", "sglang_router", "sglang_gateway", "sglang_acceptance")


def _role_of(variable: str) -> str:
    return next(p for p in ROLE_PREFIXES if variable.startswith(p + "_"))


def _well_formed(errors):
    for error in errors:
        assert MESSAGE.match(error), error
    return errors


# Every later role's variable whose default a check falls back to (_get(..., "<name>")).
# The loops over (name, ...) tuples pass the name in a variable: those are listed here.
DEFAULTED = sorted(set(re.findall(r'_get\(\w+, "(\w+)"\)', Path(checks.__file__).read_text()))
                   | {"prometheus_alert_ttft_p99_seconds", "prometheus_alert_queue_backlog_requests",
                      "prometheus_alert_gpu_temperature_celsius", "prometheus_alert_model_disk_free_ratio",
                      "sglang_release_sglang_version", "sglang_release_router_version",
                      "sglang_acceptance_max_drop_pct", "sglang_acceptance_max_ttft_rise_pct"})


@pytest.mark.parametrize("variable", DEFAULTED)
def test_checks_fall_back_to_the_roles_own_literal_defaults(variable):
    """A default a check relies on is read from its role's defaults/main.yml, and is a value,
    not a template the check would see unrendered."""
    defaults = yaml.safe_load((REPO / "roles" / _role_of(variable) / "defaults" / "main.yml").read_text())
    assert variable in defaults, f"{variable} is no longer a default of {_role_of(variable)}"
    assert checks.role_defaults()[variable] == defaults[variable]
    assert "{{" not in repr(defaults[variable])


# ----------------------------------------------------------------------------- grafana
def test_grafana_password_missing_or_short_is_refused_and_never_shown():
    assert "is not set" in _well_formed(checks.grafana_errors({}, "h"))[0]
    assert "is not set" in checks.grafana_errors({"grafana_admin_password": ""}, "h")[0]
    short = _well_formed(checks.grafana_errors({"grafana_admin_password": "s3cret-pw"}, "h"))
    assert "shorter than 12 characters" in short[0] and "s3cret-pw" not in short[0]
    assert checks.grafana_errors({"grafana_admin_password": "a-long-enough-password"}, "h") == []


WORKER = "w" * 40
ADMIN = "a" * 40


@pytest.mark.parametrize("variables, engine, router, problems", [
    ({"sglang_worker_api_key": WORKER, "sglang_admin_api_key": ADMIN}, True, True, []),
    # a router-only host needs the worker key alone
    ({"sglang_worker_api_key": WORKER}, False, True, []),
    ({}, True, False, ["sglang_worker_api_key: is not set", "sglang_admin_api_key: is not set"]),
    ({"sglang_worker_api_key": "short", "sglang_admin_api_key": ADMIN}, True, False,
     ["sglang_worker_api_key: is shorter than 32 characters"]),
    ({"sglang_worker_api_key": "w" * 20 + " " + "w" * 20, "sglang_admin_api_key": ADMIN}, True, False,
     ["sglang_worker_api_key: has a space"]),
    ({"sglang_worker_api_key": WORKER, "sglang_admin_api_key": WORKER}, True, False,
     ["sglang_admin_api_key: is the same as sglang_worker_api_key"]),
    # a monitoring-only host needs neither
    ({}, False, False, []),
])
def test_serving_keys(variables, engine, router, problems):
    found = checks.serving_key_errors(variables, "h1", engine, router)
    assert len(found) == len(problems), found
    for message, problem in zip(found, problems):
        assert message.startswith("h1: " + problem) and "Fix:" in message
        assert WORKER not in message and ADMIN not in message


def test_grafana_local_package(tmp_path):
    ok = {"grafana_admin_password": "a-long-enough-password"}
    deb = tmp_path / "grafana_12.1.1_amd64.deb"
    assert "not an absolute path to a .deb" in _well_formed(
        checks.grafana_errors({**ok, "grafana_deb_path": "grafana.deb"}, "h"))[0]
    assert "is not a file on the controller" in _well_formed(
        checks.grafana_errors({**ok, "grafana_deb_path": str(deb)}, "h"))[0]
    # Without the package tasks (grafana_install_package: false) the .deb is never copied.
    assert checks.grafana_errors({**ok, "grafana_deb_path": str(deb), "grafana_install_package": False}, "h") == []
    deb.write_bytes(b"")
    assert checks.grafana_errors({**ok, "grafana_deb_path": str(deb)}, "h") == []


# ------------------------------------------------------------- install methods (plan)
MONITORING = ["node_exporter", "gpu_exporter", "alertmanager", "prometheus"]
SMI_SUM = {"gpu_exporter_nvidia_smi_checksum": "sha256:" + "b" * 64}


def _plan(variables, distribution="Debian", major="12", roles=MONITORING, **kw):
    result = checks.install_plan(variables, "h", distribution, major, roles, **kw)
    _well_formed(result["errors"])
    return {e["role"]: (e["method"], e["version"]) for e in result["plan"]}, result["errors"]


def test_plan_takes_the_package_where_the_release_pins_one():
    plan, errors = _plan(SMI_SUM)
    assert errors == []
    assert plan == {"node_exporter": ("package", "prometheus-node-exporter=1.5.0-1+b6"),
                    "gpu_exporter": ("tarball", "nvidia_gpu_exporter 1.3.2"),
                    "alertmanager": ("package", "prometheus-alertmanager=0.25.0-1+b4"),
                    "prometheus": ("package", "prometheus=2.42.0+ds-5+deb12u1")}


def test_plan_takes_the_pinned_archive_where_no_package_is_pinned():
    """Ubuntu: no package pins ship, so every binary comes from its pinned release archive."""
    plan, errors = _plan(SMI_SUM, "Ubuntu", "24", os_version="24.04")
    assert errors == []
    assert plan == {"node_exporter": ("tarball", "1.9.1"), "gpu_exporter": ("tarball", "nvidia_gpu_exporter 1.3.2"),
                    "alertmanager": ("tarball", "0.28.1"), "prometheus": ("tarball", "2.53.3")}
    # A pin added for Ubuntu makes auto take the package there.
    plan, _ = _plan({**SMI_SUM, "node_exporter_package_versions": {"Ubuntu-24": "1.7.0-1ubuntu0.3"}}, "Ubuntu", "24")
    assert plan["node_exporter"] == ("package", "prometheus-node-exporter=1.7.0-1ubuntu0.3")


def test_plan_only_for_the_roles_the_host_runs():
    plan, errors = _plan({}, roles=["node_exporter"])
    assert list(plan) == ["node_exporter"] and errors == []
    plan, _ = _plan({"gpu_exporter_enabled": False}, roles=["node_exporter", "gpu_exporter"])
    assert list(plan) == ["node_exporter"]


def test_plan_refuses_a_host_with_no_package_pin_and_no_verified_archive():
    variables = {"node_exporter_package_versions": {"Debian-13": "1.9.0-1+b4"}, "node_exporter_tarball_checksum": ""}
    _, errors = _plan(variables, roles=["node_exporter"], os_version="12.8")
    assert errors[0] == (
        "h: node_exporter_install_method: no install method for node_exporter on Debian 12.8: "
        "node_exporter_package_versions pins no prometheus-node-exporter for Debian-12, and the tarball method has "
        "no pinned, verified archive (below). Fix: add \"Debian-12: <version>\" to node_exporter_package_versions, "
        "or pin the archive: node_exporter_tarball_version and node_exporter_tarball_checksum (sha256 from the "
        "release's sha256sums.txt).")
    assert "node_exporter_tarball_checksum: is empty" in errors[1] and len(errors) == 2
    # Debian 13 has its pin: the same inputs pass there.
    assert _plan(variables, "Debian", "13", roles=["node_exporter"])[1] == []


def test_plan_refuses_an_unpinned_archive_version():
    _, errors = _plan({"alertmanager_tarball_version": "latest"}, "Ubuntu", "22", roles=["alertmanager"])
    assert [e.split(":")[1].strip() for e in errors] == ["alertmanager_install_method", "alertmanager_tarball_version"]


def test_plan_package_asked_for_without_a_pin():
    errors = _plan({"alertmanager_install_method": "package"}, "Ubuntu", "24", roles=["alertmanager"])[1]
    assert errors == [errors[0]] and "no pinned version of prometheus-alertmanager for Ubuntu-24" in errors[0]
    assert "set alertmanager_install_method: tarball" in errors[0]


def test_plan_tarball_asked_for_where_a_package_is_pinned():
    plan, errors = _plan({"prometheus_install_method": "tarball"}, roles=["prometheus"])
    assert plan == {"prometheus": ("tarball", "2.53.3")} and errors == []
    assert "is not an install method" in _plan({"prometheus_install_method": "docker"}, roles=["prometheus"])[1][0]


@pytest.mark.parametrize("checksum, problem", [
    ("sha256:" + "a" * 64, None),
    ("sha256:https://github.com/prometheus/prometheus/releases/download/v2.53.3/sha256sums.txt", None),
    ("sha256:file:///srv/mirror/sha256sums.txt", None),
    ("", "is empty"),
    ("sha256:0123", "is not sha256:<64 hex digits>"),
    ("a" * 64, "is not sha256:<64 hex digits>"),
])
def test_plan_tarball_checksum(checksum, problem):
    variables = {"prometheus_install_method": "tarball", "prometheus_tarball_checksum": checksum}
    errors = _plan(variables, roles=["prometheus"])[1]
    assert errors == [] if problem is None else problem in errors[0]


def test_plan_tarball_url():
    variables = {"node_exporter_install_method": "tarball", "node_exporter_tarball_url": "mirror/ne.tar.gz"}
    assert "node_exporter_tarball_url: 'mirror/ne.tar.gz' is not a URL" in _plan(variables, roles=["node_exporter"])[1][0]


def test_plan_gpu_exporter_by_kind():
    # The shipped nvidia-smi exporter sum is not verified: empty until the operator sets it.
    _, errors = _plan({}, roles=["gpu_exporter"], os_version="12.8")
    assert errors[0].startswith("h: gpu_exporter_kind: no install method for gpu_exporter on Debian 12.8: DCGM is not")
    assert "gpu_exporter_nvidia_smi_checksum: is empty" in errors[1]
    assert _plan({}, roles=["gpu_exporter"], dcgm_installed=True) == (
        {"gpu_exporter": ("package", "datacenter-gpu-manager-exporter=4.8.2-1")}, [])
    assert _plan({"gpu_exporter_kind": "none"}, roles=["gpu_exporter"]) == (
        {"gpu_exporter": ("none", "textfile collector only")}, [])
    bad = {"gpu_exporter_kind": "nvidia_smi", "gpu_exporter_nvidia_smi_checksum": "sha256:beef",
           "gpu_exporter_nvidia_smi_url": "github.com/x.tar.gz"}
    errors = _plan(bad, roles=["gpu_exporter"])[1]
    assert [e.split(":")[1].strip() for e in errors] == ["gpu_exporter_nvidia_smi_url", "gpu_exporter_nvidia_smi_checksum"]
    # A sums-file URL is not enough for it: the role pins the archive's own sum.
    assert "is not sha256:<64 hex digits>" in _plan(
        {"gpu_exporter_nvidia_smi_checksum": "sha256:https://mirror/checksums.txt"}, roles=["gpu_exporter"])[1][1]


def test_shipped_archive_sums_are_pinned_or_marked_unverified():
    """A shipped tarball default is a 64-hex sha256, upstream's sums file, or empty (refused)."""
    defaults = checks.role_defaults()
    for name in ("node_exporter_tarball_checksum", "alertmanager_tarball_checksum"):
        assert checks.SHA256_PIN.fullmatch(defaults[name]), name
    assert defaults["gpu_exporter_nvidia_smi_checksum"] == ""
    assert "sha256sums.txt" in defaults["prometheus_tarball_checksum"]


# -------------------------------------------------------------------------- prometheus
def test_prometheus_thresholds():
    variables = {"prometheus_install_method": "tarball", "prometheus_tarball_url": "mirror/prometheus.tar.gz",
                 "prometheus_alert_ttft_p99_seconds": 0, "prometheus_alert_queue_backlog_requests": "many",
                 "prometheus_alert_gpu_temperature_celsius": "hot", "prometheus_alert_model_disk_free_ratio": 1,
                 "sglang_model_root": "srv/models"}
    errors = _well_formed(checks.prometheus_errors(variables, "h"))
    assert [e.split(":")[1].strip() for e in errors] == [
        "prometheus_alert_ttft_p99_seconds", "prometheus_alert_queue_backlog_requests",
        "prometheus_alert_gpu_temperature_celsius", "prometheus_alert_model_disk_free_ratio", "prometheus_model_root"]
    good = {"prometheus_alert_ttft_p99_seconds": "2.5", "prometheus_alert_queue_backlog_requests": 0,
            "prometheus_alert_model_disk_free_ratio": 0.05, "prometheus_model_root": "/data/models"}
    assert checks.prometheus_errors(good, "h") == []


# ------------------------------------------------------------------------- alertmanager
WEBHOOK = {"name": "oncall", "type": "webhook", "url": "https://hooks.example.com/alerts"}


def test_alertmanager_receivers_of_each_type_pass():
    variables = {"alertmanager_receivers": [
        WEBHOOK, {"name": "mail", "type": "email", "to": "ops@example.com"},
        {"name": "chat", "type": "slack", "url": "https://chat.example.com/hooks/x", "channel": "#alerts"}],
        "alertmanager_smtp_smarthost": "smtp.example.com:587", "alertmanager_smtp_from": "am@example.com",
        "alertmanager_default_receiver": "mail", "alertmanager_watchdog_receiver": "oncall",
        "alertmanager_routes": [{"matchers": ['severity="critical"'], "receiver": "oncall"}, {"matchers": ["x=y"]}]}
    assert checks.alertmanager_errors(variables, "h") == []


@pytest.mark.parametrize("receiver, variable, problem", [
    ({"name": "oncall", "type": "webhook"}, "alertmanager_receivers[0] (oncall)", "url None is not an http(s) URL"),
    ({"name": "chat", "type": "slack", "url": "hooks.slack.com/x"}, "alertmanager_receivers[0] (chat)",
     "is not an http(s) URL"),
    ({"name": "mail", "type": "email"}, "alertmanager_receivers[0] (mail)", "to None is not a mail address"),
    ({"name": "pager", "type": "pagerduty", "url": "https://x"}, "alertmanager_receivers[0] (pager)",
     "type 'pagerduty' is not a receiver type"),
    ({"type": "webhook", "url": "https://x"}, "alertmanager_receivers[0]", "has no name"),
    ({"name": "none", "type": "webhook", "url": "https://x"}, "alertmanager_receivers[0] (none)", "reserved name"),
    ("https://x", "alertmanager_receivers[0]", "is not a mapping"),
])
def test_alertmanager_receiver_without_a_destination_is_refused(receiver, variable, problem):
    relay = {"alertmanager_smtp_smarthost": "smtp.example.com:587", "alertmanager_smtp_from": "am@example.com"}
    errors = _well_formed(checks.alertmanager_errors({"alertmanager_receivers": [receiver], **relay}, "h"))
    assert len(errors) == 1 and errors[0].startswith(f"h: {variable}: ") and problem in errors[0], errors


def test_alertmanager_email_needs_a_mail_relay_and_a_sender():
    variables = {"alertmanager_receivers": [{"name": "mail", "type": "email", "to": "ops@example.com"}]}
    errors = _well_formed(checks.alertmanager_errors(variables, "h"))
    assert [e.split(":")[1].strip() for e in errors] == ["alertmanager_smtp_smarthost", "alertmanager_smtp_from"]
    errors = checks.alertmanager_errors({**variables, "alertmanager_smtp_smarthost": "smtp.example.com",
                                         "alertmanager_smtp_from": "am@example.com"}, "h")
    assert len(errors) == 1 and "'smtp.example.com' is not host:port" in errors[0]
    # Without an email receiver the relay is not needed.
    assert checks.alertmanager_errors({"alertmanager_receivers": [WEBHOOK]}, "h") == []


def test_alertmanager_routes_name_known_receivers_and_durations_are_durations():
    variables = {"alertmanager_receivers": [WEBHOOK, {**WEBHOOK}], "alertmanager_default_receiver": "pager",
                 "alertmanager_watchdog_receiver": "deadmans", "alertmanager_group_wait": "30 seconds",
                 "alertmanager_routes": [{"matchers": ['severity="critical"'], "receiver": "sms"}]}
    errors = _well_formed(checks.alertmanager_errors(variables, "h"))
    assert [e.split(": ")[1] for e in errors] == [
        "alertmanager_receivers[1] (oncall)", "alertmanager_default_receiver", "alertmanager_watchdog_receiver",
        "alertmanager_routes[0].receiver", "alertmanager_group_wait"]
    assert "'sms' names no receiver" in errors[3]
    assert "is not a list of routes" in _well_formed(
        checks.alertmanager_errors({"alertmanager_routes": {"receiver": "x"}}, "h"))[0]
    assert "is not a list" in _well_formed(
        checks.alertmanager_errors({"alertmanager_receivers": WEBHOOK}, "h"))[0]


# ------------------------------------------------------------------------- gpu_exporter
def test_gpu_exporter_kind():
    assert checks.gpu_exporter_errors({}, "h") == []
    assert checks.gpu_exporter_errors({"gpu_exporter_enabled": False, "gpu_exporter_kind": "bad"}, "h") == []
    assert "is not an exporter kind" in _well_formed(checks.gpu_exporter_errors({"gpu_exporter_kind": "nvsmi"}, "h"))[0]


def test_gpu_exporter_dcgm_repository_key(tmp_path):
    dcgm = {"gpu_exporter_kind": "dcgm", "gpu_exporter_dcgm_manage_repo": True}
    assert checks.gpu_exporter_errors(dcgm, "h") == []  # the default key is a URL
    missing = {**dcgm, "nvidia_driver_repo_key": "keys/3bf863cc.pub"}
    assert "nvidia_driver_repo_key: 'keys/3bf863cc.pub' is neither" in _well_formed(
        checks.gpu_exporter_errors(missing, "h"))[0]
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "3bf863cc.pub").write_text("key")
    assert checks.gpu_exporter_errors(missing, "h", search_dirs=[str(tmp_path)]) == []
    # gpu_exporter's own key wins over the driver role's.
    own = {**missing, "gpu_exporter_dcgm_repo_key": "https://mirror/3bf863cc.pub"}
    assert checks.gpu_exporter_errors(own, "h") == []
    assert checks.gpu_exporter_errors({**missing, "gpu_exporter_dcgm_manage_repo": False}, "h") == []
    assert "is not an http, https or file URL" in _well_formed(
        checks.gpu_exporter_errors({**dcgm, "gpu_exporter_dcgm_repo_url": "mirror/cuda"}, "h"))[0]


# ------------------------------------------------------------- nvidia_driver, cuda_toolkit
DEBIAN = {"ansible_facts": {"distribution": "Debian"}}
UBUNTU = {"ansible_facts": {"distribution": "Ubuntu"}}


def test_gpu_host_defaults_pass():
    assert checks.gpu_host_errors(DEBIAN, "h") == []
    assert checks.gpu_host_errors({**DEBIAN, "nvidia_driver_version": "580.95.05", "cuda_toolkit_version": "13.1"}, "h") == []
    # Ubuntu: NVIDIA's Ubuntu names, with the branch in them up to 580 and without from 590.
    assert checks.gpu_host_errors(UBUNTU, "h") == []
    assert checks.gpu_host_errors({**UBUNTU, "nvidia_driver_branch": "590"}, "h") == []


def test_gpu_host_distribution_without_driver_names():
    errors = _well_formed(checks.gpu_host_errors({"ansible_facts": {"distribution": "Rocky"}}, "h"))
    assert any("nvidia_driver_packages: names no open kernel module package (none for Rocky)" in e
               and "nvidia_driver_distribution_packages" in e for e in errors), errors
    ubuntu_proprietary = _well_formed(checks.gpu_host_errors(
        {**UBUNTU, "nvidia_driver_packages": ["nvidia-dkms-580", "libnvidia-compute-580"]}, "h"))
    assert any("nvidia_driver_packages: nvidia-dkms-580 is the proprietary kernel module flavour" in e
               for e in ubuntu_proprietary), ubuntu_proprietary


@pytest.mark.parametrize("variables, problem", [
    ({"nvidia_driver_branch": "r580"}, "nvidia_driver_branch: 'r580' is not a driver branch."),
    ({"nvidia_driver_version": "575.57.08"}, "nvidia_driver_version: 575.57.08 is not on branch 580"),
    ({"nvidia_driver_version": "580.x"}, "nvidia_driver_version: '580.x' is not an exact driver version."),
    ({"nvidia_driver_packages": ["nvidia-kernel-dkms", "nvidia-kernel-open-dkms"]},
     "nvidia_driver_packages: nvidia-kernel-dkms is the proprietary kernel module flavour"),
    ({"nvidia_driver_packages": ["nvidia-driver-cuda"]}, "nvidia_driver_packages: names no open kernel module package (nvidia-driver-cuda)."),
    ({"nvidia_driver_repo_url": "developer.download.nvidia.com/compute/cuda/repos"},
     "is not an http, https or file URL"),
    ({"nvidia_driver_repo_key": "/nonexistent/3bf863cc.pub"}, "is neither an http(s)/file URL nor a file on the controller"),
    ({"cuda_toolkit_version": "12.8"}, "cuda_toolkit_version: '12.8' is not a CUDA 13.x"),
    ({"cuda_toolkit_version": 13}, "cuda_toolkit_version: '13' is not a CUDA 13.x"),
])
def test_gpu_host_refusals(variables, problem):
    errors = _well_formed(checks.gpu_host_errors({**DEBIAN, **variables}, "h"))
    assert any(problem in e for e in errors), errors


def test_gpu_host_repository_as_file_url_or_controller_file(tmp_path):
    key = tmp_path / "3bf863cc.pub"
    key.write_text("key")
    assert checks.gpu_host_errors({**DEBIAN, "nvidia_driver_repo_url": "file:///srv/mirror/cuda",
                                   "nvidia_driver_repo_key": str(key)}, "h") == []
    assert checks.gpu_host_errors({**DEBIAN, "nvidia_driver_repo_key": "file:///srv/mirror/3bf863cc.pub"}, "h") == []


def test_power_limits():
    assert checks.gpu_host_errors({**DEBIAN, "nvidia_driver_power_limits": {"all": 450}}, "h") == []
    assert checks.gpu_host_errors({**DEBIAN, "nvidia_driver_power_limits": {0: 450, "7": "500", 3: ""}}, "h") == []
    errors = _well_formed(checks.gpu_host_errors({**DEBIAN, "nvidia_driver_power_limits": {8: 450, "0": "lots", "gpu1": 1}}, "h"))
    assert any("GPU 8 does not exist; the host has 8 GPUs (0-7" in e for e in errors)
    assert any("nvidia_driver_power_limits[0]: 'lots' is not a power limit in watts." in e for e in errors)
    assert any("'gpu1' is neither a GPU index nor all." in e for e in errors)
    # The GPU count follows nvidia_driver_gpu_count, else sglang_gpu_count.
    assert checks.gpu_host_errors({**DEBIAN, "nvidia_driver_power_limits": {5: 450}, "sglang_gpu_count": 4}, "h")
    assert checks.gpu_host_errors({**DEBIAN, "nvidia_driver_power_limits": {5: 450}, "sglang_gpu_count": 4,
                                   "nvidia_driver_gpu_count": 8}, "h") == []
    assert "is not a mapping" in _well_formed(checks.gpu_host_errors({**DEBIAN, "nvidia_driver_power_limits": [450]}, "h"))[0]


# ------------------------------------------------------------ sglang_release, sglang_router
PD = [{"name": "prefill-0", "mode": "prefill", "gpus": [0, 1, 2, 3], "port": 30000, "bootstrap_port": 8998},
      {"name": "decode-0", "mode": "decode", "gpus": [4, 5, 6, 7], "port": 30001}]
UNIFIED = [{"name": "unified-0", "mode": "unified", "gpus": list(range(8)), "port": 30000}]


def _with_args(engines, index, args):
    out = [dict(e) for e in engines]
    out[index]["args"] = args
    return out


def test_speculative_arguments_in_the_recipe_pass():
    recipe = {"args": {"speculative-algorithm": "EAGLE", "speculative_num_steps": 3}}
    hostvars = {"a": {"sglang_engines": PD}, "b": {"sglang_engines": PD}}
    assert checks.speculative_errors(hostvars, ["a", "b"], recipe, "m") == []
    assert checks.speculative_errors(hostvars, ["a", "b"], None, "m") == []


def test_speculative_arguments_on_one_engine_name_that_engine():
    hostvars = {"a": {"sglang_engines": _with_args(PD, 1, {"speculative_num_steps": 3})}}
    errors = _well_formed(checks.speculative_errors(hostvars, ["a"], {}, "m"))
    assert len(errors) == 1 and errors[0].startswith(
        "a: sglang_engines[1] (decode-0).args: --speculative-num-steps is 3 on engine decode-0 (decode, a) "
        "but unset on engine prefill-0 (prefill, a);")


def test_speculative_arguments_per_mode_or_per_host():
    recipe = {"mode_args": {"prefill": {"speculative-eagle-topk": 1}}}
    errors = checks.speculative_errors({"a": {"sglang_engines": PD}}, ["a"], recipe, "m")
    assert errors and errors[0].startswith("a: sglang_model_recipes['m'].mode_args.prefill: --speculative-eagle-topk")
    hostvars = {"a": {"sglang_engines": PD[:1], "sglang_release_engine_args": {"speculative-num-steps": 2}},
                "b": {"sglang_engines": PD[1:], "sglang_release_engine_args": {"speculative-num-steps": 3}}}
    errors = checks.speculative_errors(hostvars, ["b", "a"], {}, "m")
    assert errors == [errors[0]] and errors[0].startswith("b: sglang_release_engine_args: --speculative-num-steps is 3")
    # Unified engines are not part of a PD pair.
    hostvars = {"a": {"sglang_engines": _with_args(UNIFIED, 0, {"speculative-num-steps": 3})}}
    assert checks.speculative_errors(hostvars, ["a"], {}, "m") == []


@pytest.mark.parametrize("mode, engines, problem", [
    ("auto", PD, None), ("auto", UNIFIED, None), ("pd", PD, None), ("plain", UNIFIED, None),
    ("pd", UNIFIED, "is pd, but the engines are unified"),
    ("plain", PD, "is plain, but the engines are prefill and decode engines"),
    ("PD", PD, "'PD' is not a router mode."),
])
def test_router_mode(mode, engines, problem):
    hostvars = {"gpu": {"sglang_engines": engines}}
    errors = _well_formed(checks.router_mode_errors({"sglang_router_mode": mode}, "h", hostvars, ["gpu"]))
    assert errors == [] if problem is None else problem in errors[0]


def test_lock_versions(tmp_path):
    assert checks.lock_errors({}, "h", str(LOCK)) == []
    errors = _well_formed(checks.lock_errors({"sglang_release_sglang_version": "0.5.24",
                                              "sglang_release_router_version": "0.3.2"}, "h", str(LOCK)))
    assert errors == [errors[0]] and "sglang_release_sglang_version: is 0.5.24, but requirements.lock pins sglang==0.5.23" in errors[0]
    other = tmp_path / "other.lock"
    other.write_text("sglang==0.5.23 \\\n    --hash=sha256:00\n")
    errors = checks.lock_errors({"sglang_release_lock_file": str(other)}, "h", str(LOCK))
    assert len(errors) == 1 and "sglang_release_router_version: is 0.3.2, but other.lock pins no sglang-router" in errors[0]
    assert "cannot be read on the controller" in _well_formed(checks.lock_errors({}, "h", str(tmp_path / "none")))[0]


RECIPE = {"path": "/srv/model-source/m", "served_model_name": "m", "quantization": "none", "disk_gb": 1}
DIR = {"exists": True, "isdir": True}
FILE = {"exists": True, "isdir": False}
NONE = {"exists": False}


def test_model_source():
    assert checks.model_source_errors({}, "h", "m", RECIPE, "/srv/models", [DIR, FILE]) == []
    errors = _well_formed(checks.model_source_errors({}, "h", "m", RECIPE, "/srv/models", [NONE, NONE]))
    assert errors[0].startswith("h: sglang_model_recipes['m'].path: /srv/model-source/m is not a directory on this host;")
    errors = _well_formed(checks.model_source_errors({}, "h", "m", RECIPE, "/srv/models", [DIR, NONE]))
    assert "/srv/model-source/m/SHA256SUMS is missing" in errors[0]
    custom = {**RECIPE, "checksums": "SUMS"}
    assert checks.model_source_errors({}, "h", "m", custom, "/srv/models", [DIR, NONE])[0].startswith(
        "h: sglang_model_recipes['m'].checksums: /srv/model-source/m/SUMS is missing")


def test_model_source_not_needed():
    # Hugging Face recipes, staging off, or a verified copy of the same source already staged.
    hf = {"hf_repo": "org/m", "hf_revision": "0" * 40}
    assert checks.model_source_errors({}, "h", "m", hf, "/srv/models", []) == []
    assert checks.model_source_errors({"sglang_release_stage_model": False}, "h", "m", RECIPE, "/srv/models",
                                      [NONE, NONE]) == []
    marker = '{"source": {"path": "/srv/model-source/m"}}'
    assert checks.model_source_errors({}, "h", "m", RECIPE, "/srv/models", [NONE, NONE], marker) == []
    other = '{"source": {"path": "/srv/model-source/old"}}'
    assert checks.model_source_errors({}, "h", "m", RECIPE, "/srv/models", [NONE, NONE], other)
    assert checks.model_source_errors({}, "h", "m", RECIPE, "/srv/models", [NONE, NONE], "not json")


def test_wheelhouse():
    assert checks.wheelhouse_errors({}, "h", {}) == []
    assert checks.wheelhouse_errors({"sglang_release_wheelhouse": "/srv/wheels"}, "h", DIR) == []
    errors = _well_formed(checks.wheelhouse_errors({"sglang_release_wheelhouse": "/srv/wheels"}, "h", NONE))
    assert "sglang_release_wheelhouse: /srv/wheels is not a directory on this host" in errors[0]


def test_gpu_count_on_the_pci_bus():
    eight = [f"0000:{bus:02x}:00.0" for bus in range(0x17, 0x1f)]
    assert checks.gpu_count_errors(eight, "h", {}) == []
    assert checks.gpu_count_errors(eight[:4], "h", {"sglang_gpu_count": 4}) == []
    errors = _well_formed(checks.gpu_count_errors(eight[:4], "h", {"sglang_gpu_count": 8}))
    assert errors[0].startswith("h: sglang_gpu_count: 8 GPUs are expected, but the PCI bus shows 4 (0000:17:00.0,")
    errors = checks.gpu_count_errors(eight, "h", {"sglang_gpu_count": 8, "nvidia_driver_gpu_count": 4})
    assert errors[0].startswith("h: nvidia_driver_gpu_count: 4 GPUs are expected, but the PCI bus shows 8")
    errors = _well_formed(checks.gpu_count_errors([], "h", {}))
    assert "nvidia_gpu_hosts: this host is a GPU host but its PCI bus shows no NVIDIA GPU" in errors[0]
    assert checks.gpu_count_errors([""], "h", {"nvidia_driver_require_gpu": False}) == []
    assert checks.gpu_count_errors([], "h", {"nvidia_driver_smi_output_dir": "/srv/recorded"}) == []


def test_monitoring_tls_needs_all_three_files_on_the_controller(tmp_path):
    for name in ("host.crt", "host.key", "ca.crt"):
        (tmp_path / name).write_text("-----BEGIN-----\n")
    files = {"monitoring_web_tls_cert": str(tmp_path / "host.crt"), "monitoring_web_tls_key": str(tmp_path / "host.key"),
             "monitoring_web_tls_ca": str(tmp_path / "ca.crt")}
    assert checks.web_config_errors({}, "h") == []
    assert checks.web_config_errors(files, "h") == []
    assert checks.web_config_errors({**files, "monitoring_web_password": "pw"}, "h") == []
    # a relative path is found below the controller's search directories
    assert checks.web_config_errors({**files, "monitoring_web_tls_ca": "ca.crt"}, "h", [str(tmp_path)]) == []
    missing_key = _well_formed(checks.web_config_errors({**files, "monitoring_web_tls_key": ""}, "h"))
    assert len(missing_key) == 1 and missing_key[0].startswith("h: monitoring_web_tls_key: is not set;")
    absent_ca = _well_formed(checks.web_config_errors({**files, "monitoring_web_tls_ca": "/nowhere/ca.crt"}, "h"))
    assert absent_ca == [absent_ca[0]] and "'/nowhere/ca.crt' is not a file on the controller" in absent_ca[0]


def test_monitoring_basic_auth_is_refused_without_tls():
    errors = _well_formed(checks.web_config_errors({"monitoring_web_password": "pw"}, "h"))
    assert len(errors) == 1 and errors[0].startswith("h: monitoring_web_password: is set but TLS is off")


# ----------------------------------------------------------------------------- sglang_gateway
GOOD_KEYS = [{"name": "operator", "key": "A" * 31 + "b"}, {"name": "team-a", "key": "x/Y+z_-.~" * 4 + "=="}]


def test_gateway_keys_well_formed_pass():
    assert checks.gateway_errors({"sglang_gateway_client_keys": GOOD_KEYS}, "h") == []


def test_gateway_without_keys_is_refused():
    for variables in ({}, {"sglang_gateway_client_keys": []}):
        (error,) = _well_formed(checks.gateway_errors(variables, "h"))
        assert error.startswith("h: sglang_gateway_client_keys: is empty;"), error


def test_gateway_empty_short_and_odd_keys_are_refused_and_never_shown():
    keys = [{"name": "a", "key": ""}, {"name": "b", "key": "short-key-0123"}, {"name": "c", "key": "has space" * 4},
            {"name": "d", "key": None}]
    errors = _well_formed(checks.gateway_errors({"sglang_gateway_client_keys": keys}, "h"))
    assert [e.split(":")[1].strip() for e in errors] == [
        "sglang_gateway_client_keys[0] (a).key", "sglang_gateway_client_keys[1] (b).key",
        "sglang_gateway_client_keys[2] (c).key", "sglang_gateway_client_keys[3] (d).key"]
    assert "is empty" in errors[0] and "has 14 characters, fewer than 32" in errors[1]
    assert "a bearer token cannot carry" in errors[2] and "is empty" in errors[3]
    assert not any("short-key-0123" in e or "has space" in e for e in errors)


def test_gateway_duplicate_names_and_keys_are_refused_naming_both_entries():
    key = "k" * 40
    keys = [{"name": "a", "key": key}, {"name": "a", "key": "m" * 40}, {"name": "c", "key": key}, {"key": "n" * 40}]
    errors = _well_formed(checks.gateway_errors({"sglang_gateway_client_keys": keys}, "h"))
    assert errors[0].startswith("h: sglang_gateway_client_keys[1] (a).name: a is also the name of "
                                "sglang_gateway_client_keys[0];"), errors[0]
    assert errors[1].startswith("h: sglang_gateway_client_keys[2] (c).key: is the key of sglang_gateway_client_keys[0] "
                                "too;"), errors[1]
    assert errors[2].startswith("h: sglang_gateway_client_keys[3].name: '' is not a name"), errors[2]
    assert len(errors) == 3 and not any(key in e for e in errors)


def test_gateway_tls_needs_certificate_and_key_on_the_controller(tmp_path):
    for name in ("gw.crt", "gw.key", "ca.crt"):
        (tmp_path / name).write_text("-----BEGIN-----\n")
    base = {"sglang_gateway_client_keys": GOOD_KEYS, "sglang_gateway_tls_ca": str(tmp_path / "ca.crt")}
    both = {"sglang_gateway_tls_cert": str(tmp_path / "gw.crt"), "sglang_gateway_tls_key": str(tmp_path / "gw.key")}
    assert checks.gateway_errors({**base, **both}, "h") == []
    assert checks.gateway_errors({**base, "sglang_gateway_tls_cert": "gw.crt", "sglang_gateway_tls_key": "gw.key",
                                  "sglang_gateway_tls_ca": "ca.crt"}, "h", [str(tmp_path)]) == []
    (no_key,) = _well_formed(checks.gateway_errors({**base, "sglang_gateway_tls_cert": both["sglang_gateway_tls_cert"]}, "h"))
    assert no_key.startswith("h: sglang_gateway_tls_key: is not set but sglang_gateway_tls_cert is;"), no_key
    (no_cert,) = _well_formed(checks.gateway_errors({**base, "sglang_gateway_tls_key": both["sglang_gateway_tls_key"]}, "h"))
    assert no_cert.startswith("h: sglang_gateway_tls_cert: is not set but sglang_gateway_tls_key is;"), no_cert
    (no_ca,) = _well_formed(checks.gateway_errors({**base, **both, "sglang_gateway_tls_ca": ""}, "h"))
    assert no_ca.startswith("h: sglang_gateway_tls_ca: is not set but TLS is on;"), no_ca
    (absent,) = _well_formed(checks.gateway_errors({**base, **both, "sglang_gateway_tls_key": "/nowhere/gw.key"}, "h"))
    assert "'/nowhere/gw.key' is not a file on the controller" in absent
