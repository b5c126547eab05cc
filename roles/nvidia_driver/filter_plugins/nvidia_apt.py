"""Pure helpers for the nvidia_driver role's package logic (apt versions, pins, holds)."""

from __future__ import annotations

import fnmatch
import re

# The open kernel module: Debian's and Ubuntu's (branch-named before 590) package names,
# and NVIDIA's meta package. The proprietary flavour does not drive Blackwell GPUs.
OPEN_MODULE = re.compile(r"nvidia-(kernel-open-dkms|open|dkms(-[0-9]+)?-open)")
PROPRIETARY_MODULE = re.compile(r"nvidia-kernel-dkms|cuda-drivers(-[0-9]+)?|nvidia-dkms(-[0-9]+)?")


def pin_glob(branch, version=""):
    """The apt version glob of the pin: '580.*', or '580.95.05-*' for an exact version."""
    return f"{version}-*" if version else f"{branch}.*"


def off_pin(packages, installed, glob):
    """Names from packages that are not installed, or installed at a version off the glob.

    installed: ansible_facts.packages (name -> [{version: ...}, ...]).
    """
    return [name for name in packages
            if name not in installed
            or not any(fnmatch.fnmatchcase(v.get("version", ""), glob) for v in installed[name])]


def madison_versions(lines):
    """`apt-cache madison PKG` lines -> versions, in apt's order (newest first)."""
    versions = []
    for line in lines or []:
        parts = [p.strip() for p in str(line).split("|")]
        if len(parts) >= 3 and parts[1] not in versions:
            versions.append(parts[1])
    return versions


def newest_matching(versions, glob):
    """The first (newest) version matching the glob, or ''."""
    return next((v for v in versions if fnmatch.fnmatchcase(v, glob)), "")


def driver_packages(installed, globs, version=None):
    """Installed packages whose names match one of the globs (and, when given, at that version)."""
    return sorted(name for name, versions in (installed or {}).items()
                  if any(fnmatch.fnmatchcase(name, g) for g in globs) and (version is None
                                          or any(v.get("version") == version for v in versions)))


def package_names(packages, by_distribution, distribution, branch):
    """The driver packages to install: packages when set, else NVIDIA's names for the
    distribution, with {branch} filled in (Ubuntu's names carry the branch up to 580 and
    drop it from 590 on: nvidia-dkms-580-open, nvidia-dkms-open)."""
    if packages:
        return [str(p) for p in packages]
    branch = str(branch)
    names = (by_distribution or {}).get(str(distribution), [])
    if branch.isdigit() and int(branch) >= 590:
        return [str(n).replace("-{branch}", "") for n in names]
    return [str(n).replace("{branch}", branch) for n in names]


def open_module_package(packages):
    """The package of the open kernel module among packages, or ''."""
    return next((p for p in packages if OPEN_MODULE.fullmatch(p)), "")


def proprietary_packages(packages):
    """Packages of the proprietary kernel module flavour."""
    return [p for p in packages if PROPRIETARY_MODULE.fullmatch(p)]


def package_problems(packages, distribution):
    """(problem, fix) pairs for a driver package list: a proprietary module, or no open one."""
    problems = [(f"{p} is the proprietary kernel module flavour, which does not drive Blackwell GPUs.",
                 "use nvidia-kernel-open-dkms (Ubuntu: nvidia-dkms-<branch>-open) or nvidia-open.")
                for p in proprietary_packages(packages)]
    if not open_module_package(packages):
        problems.append((f"names no open kernel module package "
                         f"({', '.join(packages) or 'none for ' + (str(distribution) or 'an unknown distribution')}).",
                         "include nvidia-kernel-open-dkms (Ubuntu: nvidia-dkms-<branch>-open) or nvidia-open, "
                         "or name the distribution's packages in nvidia_driver_distribution_packages."))
    return problems


def upstream_version(version):
    """'580.95.05-1' -> '580.95.05' (epoch and Debian revision dropped)."""
    version = str(version or "")
    version = version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


class FilterModule:
    """apt helpers for the nvidia_driver role."""

    def filters(self):
        return {
            "nvidia_pin_glob": pin_glob,
            "nvidia_off_pin": off_pin,
            "nvidia_madison_versions": madison_versions,
            "nvidia_newest_matching": newest_matching,
            "nvidia_driver_packages": driver_packages,
            "nvidia_upstream_version": upstream_version,
            "nvidia_package_names": package_names,
            "nvidia_open_module_package": open_module_package,
            "nvidia_package_problems": package_problems,
        }
