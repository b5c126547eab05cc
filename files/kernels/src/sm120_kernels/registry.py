"""Where selftest and bench find their cases.

Each module named in CASE_MODULES exposes
  selftest_cases()     -> list[SelfTestCase]
  cpu_selftest_cases() -> list[SelfTestCase]   (optional: small shapes, selftest --cpu)
  bench_cases()        -> list[BenchCase]      (optional)
Add a kernel by appending its module here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Optional

CASE_MODULES = [
    "sm120_kernels.moe_cases",
    "sm120_kernels.routing_cases",
    "sm120_kernels.indexer_cases",
    "sm120_kernels.mhc_cases",
]


@dataclass
class CaseResult:
    ok: bool
    detail: str = ""
    metrics: dict = field(default_factory=dict)


@dataclass
class SelfTestCase:
    name: str
    run: Callable[[object], CaseResult]  # run(device) -> CaseResult


@dataclass
class BenchSpec:
    fn: Callable[[], object]  # the kernel call to time
    bytes: int  # fewest bytes the call must move through device memory
    ref_fn: Optional[Callable[[], object]] = None  # torch reference, for speed-up
    extra: dict = field(default_factory=dict)
    # the same call on distinct input sets (eager), for the in-stream time:
    # together they read at least twice the L2 (stream_sets says how many)
    stream_calls: list = field(default_factory=list)


def graphed(fn: Callable[[], object], warmup: int = 2) -> Callable[[], None]:
    """fn captured in one CUDA graph, as SGLang's decode runs it; returns the
    graph's replay. fn runs `warmup` times first on a side stream, outside the
    capture (kernel compiles, allocator pools)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def stream_sets(bytes_per_call: int, device, cap: int = 64) -> int:
    """How many distinct input sets back-to-back calls must rotate through so
    that no call finds its inputs in the L2: together at least twice its size."""
    import torch

    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(2, min(cap, -(-2 * l2 // max(1, bytes_per_call))))


@dataclass
class BenchCase:
    name: str
    group: str  # plot panel, e.g. "DeepSeek-V4-Flash"
    batch: int
    make: Callable[[object], BenchSpec]  # make(device) -> BenchSpec


def _modules():
    return [importlib.import_module(m) for m in CASE_MODULES]


def selftest_cases(cpu: bool = False) -> list[SelfTestCase]:
    """Every module's selftest_cases(), or with cpu its cpu_selftest_cases()
    (small shapes for the Triton interpreter) where it has them."""
    out = []
    for m in _modules():
        out.extend(getattr(m, "cpu_selftest_cases" if cpu else "selftest_cases", lambda: [])())
    return out


def bench_cases() -> list[BenchCase]:
    out = []
    for m in _modules():
        out.extend(getattr(m, "bench_cases", lambda: [])())
    return out


def compare(out, ref, min_cos: float = 0.999, max_rel: float = 6.7e-3) -> CaseResult:
    """The issue's tolerance on MoE outputs: cosine >= 0.999, relative error
    ||out - ref|| / ||ref|| <= 6.7e-3, no NaN."""
    import torch

    o, r = out.float().flatten(), ref.float().flatten()
    if not torch.isfinite(o).all():
        return CaseResult(False, "non-finite output")
    rn = r.norm().item()
    rel = (o - r).norm().item() / rn if rn > 0 else (o.norm().item())
    cos = torch.nn.functional.cosine_similarity(o, r, dim=0).item() if rn > 0 else 1.0
    ok = cos >= min_cos and rel <= max_rel
    return CaseResult(ok, f"cos={cos:.6f} rel={rel:.2e}", {"cos": cos, "rel": rel})
