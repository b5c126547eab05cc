"""nvidia_driver's apt helpers: the pin glob, what is off the pin, madison parsing, holds."""

from __future__ import annotations

from pathlib import Path
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
apt = load("nvidia_apt", REPO / "roles" / "nvidia_driver" / "filter_plugins" / "nvidia_apt.py")

HELD = ["nvidia-*", "libnvidia-*", "libcuda1*", "firmware-nvidia-*", "libxnvctrl*"]
MADISON = """nvidia-kernel-open-dkms | 590.48.01-1 | http://mirror/debian12/x86_64  Packages
nvidia-kernel-open-dkms | 580.105.08-1 | http://mirror/debian12/x86_64  Packages
nvidia-kernel-open-dkms | 580.95.05-1 | http://mirror/debian12/x86_64  Packages
""".splitlines()


def installed(**versions):
    return {name.replace("_", "-"): [{"version": v}] for name, v in versions.items()}


def test_pin_glob():
    assert apt.pin_glob("580") == "580.*"
    assert apt.pin_glob("580", "580.95.05") == "580.95.05-*"


def test_off_pin():
    pkgs = ["nvidia-kernel-open-dkms", "nvidia-driver-cuda"]
    assert apt.off_pin(pkgs, {}, "580.*") == pkgs
    on = installed(nvidia_kernel_open_dkms="580.105.08-1", nvidia_driver_cuda="580.105.08-1")
    assert apt.off_pin(pkgs, on, "580.*") == []
    assert apt.off_pin(pkgs, on, "590.*") == pkgs
    assert apt.off_pin(pkgs, on, "580.95.05-*") == pkgs
    # 580.1 must not pass for branch 58 or 5801
    assert apt.off_pin(pkgs, on, "58.*") == pkgs


def test_madison_and_newest_matching():
    versions = apt.madison_versions(MADISON)
    assert versions == ["590.48.01-1", "580.105.08-1", "580.95.05-1"]
    assert apt.newest_matching(versions, "580.*") == "580.105.08-1"
    assert apt.newest_matching(versions, "580.95.05-*") == "580.95.05-1"
    assert apt.newest_matching(versions, "575.*") == ""


def test_driver_packages_for_holds():
    facts = installed(nvidia_kernel_open_dkms="580.95.05-1", nvidia_smi="580.95.05-1",
                      libcuda1="580.95.05-1", nvidia_driver_pinning_580="1.0-1",
                      nvidia_container_toolkit="1.17.8-1", python3="3.11.2-1")
    assert apt.driver_packages(facts, HELD) == [
        "libcuda1", "nvidia-container-toolkit", "nvidia-driver-pinning-580", "nvidia-kernel-open-dkms", "nvidia-smi"]
    assert apt.driver_packages(facts, HELD, "580.95.05-1") == ["libcuda1", "nvidia-kernel-open-dkms", "nvidia-smi"]


def test_upstream_version():
    assert apt.upstream_version("580.95.05-1") == "580.95.05"
    assert apt.upstream_version("1:580.95.05-0ubuntu1") == "580.95.05"
    assert apt.upstream_version("") == ""


BY_DISTRIBUTION = {
    "Debian": ["nvidia-kernel-open-dkms", "nvidia-driver-cuda", "nvidia-persistenced"],
    "Ubuntu": ["nvidia-dkms-{branch}-open", "libnvidia-compute-{branch}", "nvidia-utils-{branch}",
               "nvidia-compute-utils-{branch}"],
}


def test_package_names_per_distribution_and_branch():
    assert apt.package_names([], BY_DISTRIBUTION, "Debian", "580") == BY_DISTRIBUTION["Debian"]
    # NVIDIA's Ubuntu packages carry the branch up to 580 and drop it from 590 on.
    assert apt.package_names([], BY_DISTRIBUTION, "Ubuntu", "580") == [
        "nvidia-dkms-580-open", "libnvidia-compute-580", "nvidia-utils-580", "nvidia-compute-utils-580"]
    assert apt.package_names([], BY_DISTRIBUTION, "Ubuntu", "590") == [
        "nvidia-dkms-open", "libnvidia-compute", "nvidia-utils", "nvidia-compute-utils"]
    # The operator's own list wins; a distribution without names gives none.
    assert apt.package_names(["nvidia-open"], BY_DISTRIBUTION, "Ubuntu", "580") == ["nvidia-open"]
    assert apt.package_names([], BY_DISTRIBUTION, "Rocky", "580") == []


def test_open_and_proprietary_module_packages():
    assert apt.open_module_package(["libnvidia-compute-580", "nvidia-dkms-580-open"]) == "nvidia-dkms-580-open"
    assert apt.open_module_package(["nvidia-dkms-open"]) == "nvidia-dkms-open"
    assert apt.open_module_package(["nvidia-driver-cuda", "nvidia-kernel-open-dkms"]) == "nvidia-kernel-open-dkms"
    assert apt.open_module_package(["nvidia-dkms-580", "nvidia-driver-cuda"]) == ""
    assert apt.proprietary_packages(["nvidia-dkms-580", "nvidia-dkms", "cuda-drivers-580", "nvidia-kernel-dkms",
                                     "nvidia-dkms-580-open", "nvidia-kernel-open-dkms"]) == [
        "nvidia-dkms-580", "nvidia-dkms", "cuda-drivers-580", "nvidia-kernel-dkms"]
