"""Parsers and the NCCL P2P decision of the gpu_qualify role.

Nothing here runs a command: the role runs nvidia-smi and files/nccl_allreduce.py (or reads
recorded output in tests) and hands the text to these filters, so the decision is
unit-tested against fixtures (tests/unit/test_gpu_qualify.py).
"""

from __future__ import annotations

import hashlib
import json
import re

# nvidia-smi --query-gpu=<PCIE_FIELDS joined by ','> --format=csv,nounits
PCIE_FIELDS = (
    "index", "pci.bus_id", "name", "driver_version",
    "pcie.link.gen.gpucurrent", "pcie.link.gen.max", "pcie.link.gen.gpumax", "pcie.link.gen.hostmax",
    "pcie.link.width.current", "pcie.link.width.max",
)
_INT_FIELDS = PCIE_FIELDS[4:]
# nvidia-smi topo -p2p underlines its header with terminal escapes, even into a pipe.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
P2P_STATES = ("OK", "CNS", "GNS", "TNS", "NS", "U")
SMI_FAILED = re.compile(r"NVIDIA-SMI has failed|couldn't communicate with the NVIDIA driver|No devices were found")
FORCED = ("enabled", "disabled")


class GpuQualifyParseError(ValueError):
    """nvidia-smi or the all-reduce script printed something this role does not know."""


def _int(text):
    match = re.match(r"^\s*(\d+)", str(text))
    return int(match.group(1)) if match else None


def _check_driver(text):
    if SMI_FAILED.search(text):
        raise GpuQualifyParseError("nvidia-smi cannot talk to the driver: " + text.strip().splitlines()[0])


def parse_pcie(text):
    """`nvidia-smi --query-gpu=<PCIE_FIELDS> --format=csv,nounits` -> one dict per GPU.

    Link generation and width are ints, None where nvidia-smi prints [N/A] (seen for
    pcie.link.gen.hostmax in a VM). An idle GPU trains its link down to save power, so the
    current generation is below the maximum at rest: compare the maximum.
    """
    text = _ANSI.sub("", str(text or ""))
    _check_driver(text)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [re.sub(r"\s*\[[^\]]*\]\s*$", "", cell.strip()) for cell in lines[0].split(",")]
    missing = [field for field in ("index", "pci.bus_id") if field not in header]
    if missing:
        raise GpuQualifyParseError(f"no {', '.join(missing)} column in the PCIe query header: {lines[0]!r}")
    gpus = []
    for number, line in enumerate(lines[1:], start=2):
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(header):
            raise GpuQualifyParseError(f"line {number} has {len(cells)} fields, the header has {len(header)}: {line!r}")
        gpu = dict(zip(header, cells))
        gpu["index"] = int(gpu["index"])
        for field in _INT_FIELDS:
            if field in gpu:
                gpu[field] = _int(gpu[field])
        gpus.append(gpu)
    return gpus


def pcie_warnings(gpus, host):
    """Links that run narrower than they can (a x16 card in a x8 slot or a bad riser)."""
    warnings = []
    for gpu in gpus:
        width, width_max = gpu.get("pcie.link.width.current"), gpu.get("pcie.link.width.max")
        if width is not None and width_max is not None and width < width_max:
            warnings.append(
                f"{host}: GPU {gpu['index']} ({gpu.get('pci.bus_id', '?')}): PCIe link x{width}, the GPU "
                f"supports x{width_max}. Fix: reseat the card or move it to a x{width_max} slot; check the riser and BIOS lane split.")
        gen_gpu, gen_max = gpu.get("pcie.link.gen.gpumax"), gpu.get("pcie.link.gen.max")
        if gen_gpu is not None and gen_max is not None and gen_max < gen_gpu:
            warnings.append(
                f"{host}: GPU {gpu['index']} ({gpu.get('pci.bus_id', '?')}): PCIe Gen{gen_max} at most on this "
                f"slot, the GPU supports Gen{gen_gpu}. Fix: check the slot's and riser's generation in the BIOS.")
    return warnings


def parse_p2p(text):
    """`nvidia-smi topo -p2p r` (or w, n, a, p) -> {"devices", "matrix", "counts", "all_ok"}.

    matrix[GPUi][GPUj] is OK, CNS (chipset not supported), GNS, TNS, NS or U; counts counts
    each unordered pair once, by the worse of its two directions' states.
    """
    text = _ANSI.sub("", str(text or ""))
    _check_driver(text)
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines)
                      if re.fullmatch(r"(GPU\d+\s*)+", line.strip()) and line.strip().startswith("GPU0")), None)
    if header_at is None:
        raise GpuQualifyParseError("no P2P matrix header (GPU0 GPU1 ...) in nvidia-smi topo -p2p output")
    devices = lines[header_at].split()
    matrix = {}
    for line in lines[header_at + 1:]:
        cells = line.split()
        if not cells:
            if matrix:
                break
            continue
        if not re.fullmatch(r"GPU\d+", cells[0]):
            break
        if len(cells) - 1 != len(devices):
            raise GpuQualifyParseError(f"row {cells[0]} has {len(cells) - 1} cells, the header has {len(devices)}")
        row = {}
        for device, state in zip(devices, cells[1:]):
            if device == cells[0]:
                continue
            if state not in P2P_STATES:
                raise GpuQualifyParseError(f"{cells[0]}->{device}: unknown P2P state {state!r}")
            row[device] = state
        matrix[cells[0]] = row
    if sorted(matrix) != sorted(devices):
        raise GpuQualifyParseError(f"the P2P matrix has rows {sorted(matrix)} for columns {devices}")
    counts = {}
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            pair = {matrix[a][b], matrix[b][a]}
            state = "OK" if pair == {"OK"} else sorted(pair - {"OK"})[0]
            counts[state] = counts.get(state, 0) + 1
    return {"devices": devices, "matrix": matrix, "counts": counts,
            "all_ok": set(counts) <= {"OK"}}


def bus_bandwidth(nbytes, seconds, world_size):
    """nccl-tests' all-reduce figures in GB/s: (algbw, busbw), busbw = algbw * 2(n-1)/n."""
    if seconds <= 0 or world_size <= 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


def allreduce_summary(text, rc=0, timeout_s=None):
    """One run of files/nccl_allreduce.py: its JSON line (stdout) and exit code -> summary.

    status: ok, hung (its own bound or coreutils timeout: rc 3, 124 or 137, or no JSON after
    a kill), failed (an error, wrong sums), or not_run (text is empty and rc is None).
    """
    text = str(text or "").strip()
    if not text and rc is None:
        return {"status": "not_run", "results": []}
    report = None
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                report = json.loads(line)
                break
            except ValueError:
                continue
    hung_rc = rc in (3, 124, 137)
    if report is None:
        status = "hung" if hung_rc else "failed"
        return {"status": status, "results": [], "rc": rc,
                "error": f"no JSON from the all-reduce (rc {rc})" + (f", bound {timeout_s} s" if timeout_s else "")}
    status = report.get("status")
    summary = {key: report.get(key) for key in ("world_size", "torch", "nccl", "devices", "seconds", "p2p_disable")}
    summary["results"] = [{k: row.get(k) for k in ("bytes", "time_us", "algbw_gbs", "busbw_gbs", "correct")}
                          for row in report.get("results") or []]
    summary["rc"] = rc
    if status == "timeout" or hung_rc:
        summary.update(status="hung", error=report.get("error") or f"killed after its bound (rc {rc})")
    elif status == "ok" and rc == 0 and summary["results"]:
        summary["status"] = "ok"
    else:
        summary.update(status="failed", error=report.get("error") or f"rc {rc}")
    return summary


def _busbw_at_largest(summary):
    rows = [row for row in summary.get("results") or [] if row.get("busbw_gbs") is not None]
    return max(rows, key=lambda row: row["bytes"]) if rows else None


def p2p_decision(host, gpu_count, p2p_on, p2p_off, forced="auto", min_gain=0.05):
    """Decide NCCL_P2P_DISABLE for this host's engines.

    p2p_on / p2p_off: allreduce_summary() of the runs with NCCL_P2P_DISABLE=0 and =1.
    forced: auto, or enabled/disabled (gpu_qualify_nccl_p2p). Returns {"p2p": enabled,
    disabled or unchanged, "env": {...} to apply under the operator's env, "source":
    forced, single-gpu, measured or unmeasured, "reason": one line, "problems": [...]}.
    P2P is enabled only when its run completed and its bus bandwidth at the largest size
    beats the P2P-off run's by min_gain (5% by default: noise must not flip releases).
    """
    forced = str(forced or "auto")
    if forced not in FORCED + ("auto",):
        return {"p2p": "unchanged", "env": {}, "source": "invalid", "reason": "",
                "problems": [f"{host}: gpu_qualify_nccl_p2p is {forced!r}. Fix: use auto, enabled or disabled."]}
    if forced in FORCED:
        return {"p2p": forced, "env": {"NCCL_P2P_DISABLE": "0" if forced == "enabled" else "1"},
                "source": "forced", "reason": f"gpu_qualify_nccl_p2p is {forced}", "problems": []}
    if int(gpu_count) <= 1:
        return {"p2p": "unchanged", "env": {}, "source": "single-gpu", "problems": [],
                "reason": f"{int(gpu_count)} GPU: no GPU-to-GPU traffic, NCCL's default stays"}
    on, off = (p2p_on or {}).get("status", "not_run"), (p2p_off or {}).get("status", "not_run")
    if on == "not_run" or off == "not_run":
        return {"p2p": "disabled", "env": {"NCCL_P2P_DISABLE": "1"}, "source": "unmeasured", "problems": [],
                "reason": "not measured yet: P2P stays off (the field workaround) until a measurement says otherwise"}
    if on != "ok" and off != "ok":
        return {"p2p": "disabled", "env": {"NCCL_P2P_DISABLE": "1"}, "source": "measured",
                "reason": f"both all-reduce runs {on}/{off}",
                "problems": [f"{host}: the NCCL all-reduce over {int(gpu_count)} GPUs failed with P2P on ({on}: "
                             f"{p2p_on.get('error', '?')}) and off ({off}: {p2p_off.get('error', '?')}); engines with "
                             f"several GPUs would not start. Fix: check the driver and NCCL (run the role's "
                             f"nccl_allreduce.py by hand with NCCL_DEBUG=INFO), or set gpu_qualify_nccl_p2p to force a value."]}
    if on != "ok":
        return {"p2p": "disabled", "env": {"NCCL_P2P_DISABLE": "1"}, "source": "measured", "problems": [],
                "reason": f"the all-reduce with P2P on {on} ({p2p_on.get('error', '')}); P2P off completed"}
    if off != "ok":
        return {"p2p": "enabled", "env": {"NCCL_P2P_DISABLE": "0"}, "source": "measured", "problems": [],
                "reason": f"the all-reduce with P2P off {off} ({p2p_off.get('error', '')}); P2P on completed"}
    row_on, row_off = _busbw_at_largest(p2p_on), _busbw_at_largest(p2p_off)
    if row_on is None or row_off is None or row_on["bytes"] != row_off["bytes"]:
        return {"p2p": "disabled", "env": {"NCCL_P2P_DISABLE": "1"}, "source": "measured", "problems": [],
                "reason": "the two runs have no common largest size to compare: P2P stays off"}
    gain = (row_on["busbw_gbs"] / row_off["busbw_gbs"] - 1) if row_off["busbw_gbs"] > 0 else float("inf")
    figures = (f"{row_on['busbw_gbs']:g} GB/s with P2P, {row_off['busbw_gbs']:g} without, "
               f"at {row_on['bytes'] // (1 << 20)} MiB")
    if gain >= float(min_gain):
        return {"p2p": "enabled", "env": {"NCCL_P2P_DISABLE": "0"}, "source": "measured", "problems": [],
                "reason": f"P2P faster: {figures}"}
    return {"p2p": "disabled", "env": {"NCCL_P2P_DISABLE": "1"}, "source": "measured", "problems": [],
            "reason": f"P2P not faster by {float(min_gain):.0%}: {figures}"}


def busbw_table(p2p_on, p2p_off):
    """One line per size: 'all-reduce 256 MiB busbw: P2P on 39.6 GB/s, off 21.3 GB/s'."""
    rows = {}
    for label, run in (("on", p2p_on or {}), ("off", p2p_off or {})):
        for row in run.get("results") or []:
            rows.setdefault(row["bytes"], {})[label] = row.get("busbw_gbs")
    lines = []
    for nbytes in sorted(rows):
        cells = [f"P2P {label} " + (f"{rows[nbytes][label]:g} GB/s" if rows[nbytes].get(label) is not None
                                    else (p2p_on if label == "on" else p2p_off or {}).get("status", "-"))
                 for label in ("on", "off")]
        lines.append(f"all-reduce {nbytes / (1 << 20):g} MiB busbw: " + ", ".join(cells))
    return lines


def qualify_key(*parts):
    """What the measurement depends on (GPUs, driver, links, P2P matrices, script, sizes):
    a cached measurement is reused while this key holds."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def identity(gpus):
    """The parts of the PCIe query that identify the hardware (not the idle link state)."""
    keep = ("index", "pci.bus_id", "name", "driver_version", "pcie.link.gen.max", "pcie.link.width.max")
    return [{k: gpu.get(k) for k in keep} for gpu in gpus]


class FilterModule:
    """Filters of the gpu_qualify role."""

    def filters(self):
        return {
            "gpu_qualify_pcie": parse_pcie,
            "gpu_qualify_pcie_warnings": pcie_warnings,
            "gpu_qualify_p2p": parse_p2p,
            "gpu_qualify_allreduce": allreduce_summary,
            "gpu_qualify_decision": p2p_decision,
            "gpu_qualify_key": qualify_key,
            "gpu_qualify_busbw_table": busbw_table,
            "gpu_qualify_identity": identity,
        }
