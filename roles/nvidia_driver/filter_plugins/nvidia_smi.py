"""Pure parsers and checks for nvidia-smi output, used by the nvidia_driver role.

Nothing here runs a command: the role runs nvidia-smi (or reads recorded output in tests)
and hands the text to these filters, so the same checks are unit-tested against fixtures.

Every error names the host, the GPU, the variable that sets the expectation and the fix.
"""

from __future__ import annotations

import re

# The fields the role asks for, in this order:
#   nvidia-smi --query-gpu=<QUERY_FIELDS joined by ','> --format=csv,nounits
QUERY_FIELDS = (
    "index", "name", "pci.bus_id", "compute_cap", "driver_version", "persistence_mode",
    "power.limit", "power.min_limit", "power.max_limit", "memory.total",
)
NUMERIC_FIELDS = ("power.limit", "power.min_limit", "power.max_limit", "memory.total")
SMI_FAILED = re.compile(r"NVIDIA-SMI has failed|couldn't communicate with the NVIDIA driver|No devices were found")


class NvidiaSmiParseError(ValueError):
    """nvidia-smi printed something that is not the documented CSV or matrix."""


def _number(text):
    """'600.00 W' / '600.00' / '97887 MiB' -> float; '[N/A]' / 'N/A' -> None."""
    match = re.match(r"^\s*(-?\d+(?:\.\d+)?)", str(text))
    return float(match.group(1)) if match else None


def parse_query(text):
    """Parse `nvidia-smi --query-gpu=... --format=csv[,nounits]` (header line included).

    Returns one dict per GPU keyed by the field names without units; numeric fields are
    floats (None when nvidia-smi prints [N/A]) and `index` is an int.
    """
    text = str(text or "")
    if SMI_FAILED.search(text):
        raise NvidiaSmiParseError("nvidia-smi cannot talk to the driver: " + text.strip().splitlines()[0])
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [re.sub(r"\s*\[[^\]]*\]\s*$", "", cell.strip()) for cell in lines[0].split(",")]
    if "index" not in header:
        raise NvidiaSmiParseError(f"no CSV header with an index column: {lines[0]!r}")
    gpus = []
    for number, line in enumerate(lines[1:], start=2):
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(header):
            raise NvidiaSmiParseError(
                f"line {number} has {len(cells)} fields, the header has {len(header)}: {line!r}")
        gpu = dict(zip(header, cells))
        gpu["index"] = int(gpu["index"])
        for field in NUMERIC_FIELDS:
            if field in gpu:
                gpu[field] = _number(gpu[field])
        gpus.append(gpu)
    return gpus


def parse_topo(text):
    """Parse `nvidia-smi topo -m` into a mapping that a local fact can hold.

    {"devices": [GPU0, ...], "matrix": {GPU0: {GPU1: "NODE", ...}}, "cpu_affinity": {GPU0: "0-47"},
     "numa_affinity": {GPU0: "0"}, "links": {"NODE": 12, ...}, "nvlink": bool}
    `links` counts each GPU pair once. Columns after the device columns (CPU Affinity,
    NUMA Affinity, GPU NUMA ID) are kept per GPU.
    """
    text = str(text or "")
    if SMI_FAILED.search(text):
        raise NvidiaSmiParseError("nvidia-smi cannot talk to the driver: " + text.strip().splitlines()[0])
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if re.match(r"^\s*GPU0\b", line.strip())
                      and "\t" in line and not re.match(r"^GPU0\s+X", line.strip())), None)
    if header_at is None:
        raise NvidiaSmiParseError("no topology matrix header (GPU0 GPU1 ...) in nvidia-smi topo -m output")
    header = [cell.strip() for cell in lines[header_at].split("\t")]
    if header and header[0] == "":
        header = header[1:]
    devices = [cell for cell in header if re.fullmatch(r"(GPU|NIC)\d+", cell)]
    extra = [cell for cell in header if cell not in devices]
    result = {"devices": [d for d in devices if d.startswith("GPU")], "matrix": {},
              "cpu_affinity": {}, "numa_affinity": {}, "links": {}, "nvlink": False}
    for line in lines[header_at + 1:]:
        cells = [cell.strip() for cell in line.split("\t")]
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            if cells and cells[0].startswith("Legend"):
                break
            continue
        row, values = cells[0], cells[1:]
        if len(values) < len(devices):
            raise NvidiaSmiParseError(f"row {row} has {len(values)} cells, expected {len(devices)}+")
        result["matrix"][row] = {dev: values[i] for i, dev in enumerate(devices) if dev != row}
        tail = dict(zip(extra, values[len(devices):]))
        if "CPU Affinity" in tail:
            result["cpu_affinity"][row] = tail["CPU Affinity"]
        if "NUMA Affinity" in tail:
            result["numa_affinity"][row] = tail["NUMA Affinity"]
    gpus = result["devices"]
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            link = result["matrix"].get(a, {}).get(b)
            if link:
                result["links"][link] = result["links"].get(link, 0) + 1
                result["nvlink"] = result["nvlink"] or link.startswith("NV")
    if len(result["matrix"]) != len(gpus):
        raise NvidiaSmiParseError(f"the matrix has {len(result['matrix'])} GPU rows for {len(gpus)} GPU columns")
    return result


def _gpu_label(gpu):
    return f"GPU {gpu.get('index')} ({gpu.get('name', '?')}, {gpu.get('pci.bus_id', '?')})"


def driver_matches(version, branch, exact=""):
    """'580.95.05' is on branch '580'; with exact set it must equal it."""
    version = str(version or "").strip()
    if exact:
        return version == str(exact).strip()
    return version.split(".")[0] == str(branch).strip()


def gpu_errors(gpus, host, expected_count, branch, exact_version="", compute_cap="12.0",
               name_pattern="", persistence=True):
    """Check parsed GPUs against what the host must have. Returns a list of messages."""
    errors = []
    count = len(gpus)
    if int(expected_count) != count:
        found = ", ".join(f"{g['index']}@{g.get('pci.bus_id', '?')}" for g in gpus) or "none"
        errors.append(
            f"{host}: nvidia_driver_gpu_count: nvidia-smi reports {count} GPU(s), {int(expected_count)} "
            f"are expected (found: {found}). Fix: check that every GPU is seated, powered and visible "
            f"(lspci -d 10de:, dmesg | grep -i nvrm), or set nvidia_driver_gpu_count to this host's GPU count.")
    want = "the pinned version " + str(exact_version) if exact_version else f"the pinned branch {branch}"
    for gpu in gpus:
        label = _gpu_label(gpu)
        cap = str(gpu.get("compute_cap", "")).strip()
        if compute_cap and cap != str(compute_cap):
            errors.append(
                f"{host}: {label}: compute capability {cap}, expected {compute_cap} (sm_{str(compute_cap).replace('.', '')}). "
                f"Fix: this deployment targets RTX PRO 6000 Blackwell (sm_120); move the host out of the "
                f"group or set nvidia_driver_compute_cap for its GPUs.")
        if name_pattern and not re.search(name_pattern, str(gpu.get("name", ""))):
            errors.append(
                f"{host}: {label}: the name does not match nvidia_driver_gpu_name_pattern "
                f"{name_pattern!r}. Fix: use the expected GPU model or change the pattern.")
        driver = gpu.get("driver_version", "")
        if not driver_matches(driver, branch, exact_version):
            var = "nvidia_driver_version" if exact_version else "nvidia_driver_branch"
            errors.append(
                f"{host}: {label}: driver {driver} is loaded, not {want} ({var}). Fix: reboot so the "
                f"installed module loads, or check the installed packages (apt-cache policy nvidia-kernel-open-dkms).")
        if persistence and str(gpu.get("persistence_mode", "")).strip() != "Enabled":
            errors.append(
                f"{host}: {label}: persistence mode is {gpu.get('persistence_mode')}, expected Enabled. "
                f"Fix: check nvidia-persistenced (systemctl status nvidia-persistenced).")
    return errors


def power_limit_plan(gpus, limits, host):
    """What to change for per-GPU power limits.

    limits: {} (leave as is), {"all": W} or {index: W, ...}. Returns
    {"changes": [{"index": i, "current": W, "target": W}], "errors": [...]}.
    """
    changes, errors = [], []
    limits = dict(limits or {})
    for gpu in gpus:
        target = limits.get(gpu["index"], limits.get(str(gpu["index"]), limits.get("all")))
        if target in (None, ""):
            continue
        target = float(target)
        low, high = gpu.get("power.min_limit"), gpu.get("power.max_limit")
        if (low is not None and target < low) or (high is not None and target > high):
            errors.append(
                f"{host}: nvidia_driver_power_limits: {target:g} W for {_gpu_label(gpu)} is outside "
                f"its range {low:g}-{high:g} W. Fix: choose a limit within the range.")
            continue
        current = gpu.get("power.limit")
        if current is None or abs(current - target) >= 0.5:
            changes.append({"index": gpu["index"], "current": current, "target": target})
    unknown = [k for k in limits if k != "all" and int(k) not in {g["index"] for g in gpus}]
    for key in unknown:
        errors.append(f"{host}: nvidia_driver_power_limits: GPU {key} does not exist on this host. "
                      f"Fix: use the indices nvidia-smi lists (0-{len(gpus) - 1}) or 'all'.")
    return {"changes": changes, "errors": errors}


FACT_FIELDS = ("index", "name", "pci.bus_id", "compute_cap", "driver_version", "memory.total")


def gpu_fact(gpus):
    """The stable part of each GPU (no power or state) for the local fact."""
    return [{k: gpu[k] for k in FACT_FIELDS if k in gpu} for gpu in gpus]


class FilterModule:
    """nvidia-smi filters for the nvidia_driver role."""

    def filters(self):
        return {
            "nvidia_smi_query": parse_query,
            "nvidia_smi_topo": parse_topo,
            "nvidia_gpu_errors": gpu_errors,
            "nvidia_power_limit_plan": power_limit_plan,
            "nvidia_driver_matches": driver_matches,
            "nvidia_gpu_fact": gpu_fact,
        }
