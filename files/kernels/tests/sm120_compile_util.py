"""Cross-compile a Triton kernel for sm_120 (no GPU needed) and read its
resources: shared memory from Triton's metadata, registers and spills from
ptxas -v on the generated PTX."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SM120 = GPUTarget("cuda", 120, 32)
SM120_SHARED_LIMIT = 101_376


def _ptxas() -> str:
    import triton.backends.nvidia as nv

    bindir = os.path.join(os.path.dirname(nv.__file__), "bin")
    for name in ("ptxas-blackwell", "ptxas"):
        path = os.path.join(bindir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError("no ptxas in triton's nvidia backend")


def compile_sm120(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int = 3) -> dict:
    sig = dict(signature)
    for k in constexprs:
        sig[k] = "constexpr"
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    k = triton.compile(src, target=SM120, options={"num_warps": num_warps, "num_stages": num_stages})
    ptx = k.asm["ptx"]
    assert ".target sm_120a" in ptx, "not compiled for sm_120a"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run(
            [_ptxas(), "-v", "--gpu-name", "sm_120a", path, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        )
    report = res.stderr + res.stdout
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)]
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    stack = [int(s) for s in re.findall(r"(\d+) bytes stack frame", report)]
    return {
        "shared": int(k.metadata.shared),
        "spills": sum(spills),
        "registers": max(regs) if regs else None,
        "stack": max(stack) if stack else 0,
        "ptx": ptx,
        "ttir": k.asm.get("ttir", ""),
        "report": report,
    }
