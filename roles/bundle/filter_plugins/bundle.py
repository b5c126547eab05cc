"""Filters of the bundle role: the lock's requirements for one target Python, and
the roles' pinned package versions, a part's digest."""

import hashlib
import importlib.util
import re
from pathlib import Path

import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement


def lock_requirements(lock_text, python_version, machine="x86_64"):
    """The lines of a universal `uv pip compile --generate-hashes` lock that apply to Linux
    on `machine` with CPython `python_version` ("3.11"), markers resolved and hashes kept,
    for `pip download --require-hashes` (pip resolves markers for the Python it runs on)."""
    environment = default_environment()
    environment.update({
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": machine,
    })
    lines = []
    # One requirement per entry: a line at column 0, its continuation lines below it.
    for entry in re.split(r"\n(?=\S)", lock_text):
        entry = "\n".join(line for line in entry.splitlines() if not line.lstrip().startswith("#"))
        if not entry.strip():
            continue
        spec, *hashes = entry.replace("\\\n", " ").split("--hash=")
        requirement = Requirement(spec.strip())
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        requirement.marker = None
        lines.append(" ".join([str(requirement)] + [f"--hash={h.strip()}" for h in hashes]))
    if not lines:
        raise ValueError("the lock names no requirement for this Python")
    return lines


def pinned_specs(pinned, release, variables, repo_dir):
    """apt specs ("package=version") of {package: role}: the version the role's
    `<role>_package_versions` pins for `release` ("Debian-12"), the inventory's value
    where it sets one, else the role's default."""
    specs = []
    for package, role in pinned.items():
        name = f"{role}_package_versions"
        versions = (variables or {}).get(name)
        if not isinstance(versions, dict):
            defaults = yaml.safe_load((Path(repo_dir) / "roles" / role / "defaults" / "main.yml").read_text())
            versions = defaults[name]
        if release not in versions:
            raise ValueError(f"{name} pins no version for {release}; the bundle needs one. "
                             f"Fix: set {name}['{release}'], or build for another release (bundle_debian_release)")
        specs.append(f"{package}={versions[release]}")
    return specs


def part_digest(manifest, part):
    """sha256 of one part's manifest entries (path, size, sha256): it changes when any file
    of the part does, and names the part's copy on a host."""
    entries = [e for e in manifest["files"] if e["path"].split("/", 1)[0] == part]
    if not entries:
        raise ValueError(f"the bundle's manifest lists no file under {part}/")
    text = "\n".join(f"{e['path']} {e['size']} {e['sha256']}" for e in entries)
    return hashlib.sha256(text.encode()).hexdigest()


# The weights go from the bundle straight into the engine hosts' model store (rsync,
# sglang_release): no archive of hundreds of GB on the controller.
UNARCHIVED_PARTS = {"models"}


def part_archives(manifest, work_dir):
    """{part: path of its archive in work_dir}, named by the part's digest."""
    parts = sorted(set(manifest["summary"]["parts"]) - UNARCHIVED_PARTS)
    return {part: f"{work_dir}/{part}-{part_digest(manifest, part)}.tar" for part in parts}


def shard(items, index, count):
    """Every count-th item from index on: count shards of about equal length and size mix."""
    return list(items)[int(index)::int(count)]


def _nvidia_apt(repo_dir):
    """nvidia_driver's own package-name helpers (filter_plugins/nvidia_apt.py), not a copy."""
    spec = importlib.util.spec_from_file_location(
        "sm120_nvidia_apt", Path(repo_dir) / "roles" / "nvidia_driver" / "filter_plugins" / "nvidia_apt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _default(repo_dir, role, name):
    return yaml.safe_load((Path(repo_dir) / "roles" / role / "defaults" / "main.yml").read_text())[name]


def nvidia_packages(variables, repo_dir, distribution="Debian"):
    """What site.yml installs from NVIDIA's repository on a GPU host, as nvidia_driver and
    cuda_toolkit name it (the inventory's values where it sets them, else the roles'
    defaults): the driver packages, the branch's pinning package, the CUDA toolkit."""
    variables = variables or {}

    def get(role, name):
        return variables[name] if name in variables else _default(repo_dir, role, name)

    branch = str(get("nvidia_driver", "nvidia_driver_branch"))
    packages = _nvidia_apt(repo_dir).package_names(
        get("nvidia_driver", "nvidia_driver_packages"), get("nvidia_driver", "nvidia_driver_distribution_packages"),
        distribution, branch)
    pinning = variables.get("nvidia_driver_pinning_package", f"nvidia-driver-pinning-{branch}")
    cuda = variables.get("cuda_toolkit_package") or "cuda-toolkit-" + str(
        get("cuda_toolkit", "cuda_toolkit_version")).replace(".", "-")
    return packages + ([pinning] if pinning else []) + [cuda]


def nvidia_pin(variables, repo_dir):
    """nvidia_driver's apt pin (its template's three fields) for the resolver."""
    variables = variables or {}

    def get(name):
        return variables[name] if name in variables else _default(repo_dir, "nvidia_driver", name)

    version, branch = str(get("nvidia_driver_version") or ""), str(get("nvidia_driver_branch"))
    return (f"Package: {' '.join(get('nvidia_driver_held_packages'))}\n"
            f"Pin: version {version + '-*' if version else branch + '.*'}\nPin-Priority: 1001\n")


def drafts(models):
    """{recipe: its speculative settings} for the recipes that speculate with a separate
    draft model (draft_hf_repo), which the bundle carries beside the weights."""
    return {name: recipe["speculative"] for name, recipe in models.items()
            if recipe.get("speculative", {}).get("enabled") and recipe["speculative"].get("draft_hf_repo")}


class FilterModule:
    def filters(self):
        return {
            "bundle_lock_requirements": lock_requirements,
            "bundle_shard": shard,
            "bundle_pinned_specs": pinned_specs,
            "bundle_part_digest": part_digest,
            "bundle_part_archives": part_archives,
            "bundle_nvidia_packages": nvidia_packages,
            "bundle_nvidia_pin": nvidia_pin,
            "bundle_drafts": drafts,
        }
