"""Pure helpers for the nvidia_driver role's package logic (apt versions, pins, holds)."""

from __future__ import annotations

import fnmatch


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
        }
