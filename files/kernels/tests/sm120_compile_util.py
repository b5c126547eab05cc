"""Cross-compile a Triton kernel for sm_120 (no GPU needed) and read its
resources: shared memory from Triton's metadata (and static shared memory,
registers and spills from ptxas -v on the generated PTX); on request the SASS
(cuobjdump)."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SM120 = GPUTarget("cuda", 120, 32)
SM120_SHARED_LIMIT = 101_376


def _nv_tool(*names: str) -> str:
    import triton.backends.nvidia as nv

    bindir = os.path.join(os.path.dirname(nv.__file__), "bin")
    for name in names:
        path = os.path.join(bindir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"no {names[-1]} in triton's nvidia backend")


def _ptxas() -> str:
    return _nv_tool("ptxas-blackwell", "ptxas")


def compile_sm120(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int = 3,
                  target: GPUTarget = SM120, sass: bool = False, maxnreg: int | None = None) -> dict:
    """Compile for `target` (sm_120 unless told; GPUTarget("cuda", 90, 32) is the H200's
    sm_90a); with sass=True the result also holds the cubin's SASS. maxnreg: the
    launch's register cap (Triton writes it into the PTX as .maxnreg)."""
    sig = dict(signature)
    for k in constexprs:
        sig[k] = "constexpr"
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    options = {"num_warps": num_warps, "num_stages": num_stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    k = triton.compile(src, target=target, options=options)
    ptx = k.asm["ptx"]
    arch = f"sm_{target.arch}a"
    assert f".target {arch}" in ptx, f"not compiled for {arch}"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        cubin = os.path.join(tmp, "k.cubin")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run(
            [_ptxas(), "-v", "--gpu-name", arch, path, "-o", cubin],
            capture_output=True,
            text=True,
            check=True,
        )
        sass_text = ""
        if sass:
            sass_text = subprocess.run([_nv_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True,
                                       check=True).stdout
    report = res.stderr + res.stdout
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)]
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    stack = [int(s) for s in re.findall(r"(\d+) bytes stack frame", report)]
    smem = [int(s) for s in re.findall(r"(\d+) bytes smem", report)]
    return {
        "shared": int(k.metadata.shared),
        "static_shared": max(smem) if smem else 0,  # declared in the PTX (the MoE rings), not Triton's
        "spills": sum(spills),
        "registers": max(regs) if regs else None,
        "stack": max(stack) if stack else 0,
        "ptx": ptx,
        "ttir": k.asm.get("ttir", ""),
        "report": report,
        "sass": sass_text,
    }


# SASS: the K loop of a kernel (cuobjdump's listing)
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
CLASSES = {
    "mma": ("HMMA",),
    "load": ("LDG", "LD", "LDS", "LDC", "LDSM", "ULDC"),
    "store": ("STG", "STS", "ST", "RED", "ATOM"),
    "local": ("LDL", "STL"),  # spilled registers
    "int/logic": ("LOP3", "SHF", "IADD3", "IMAD", "IADD", "SHL", "SHR", "LEA", "PRMT", "ISETP", "SEL", "IABS", "IMNMX",
                  "BMSK", "SGXT", "VIADD", "VIMNMX"),
    "float": ("HFMA2", "HMUL2", "HADD2", "FFMA", "FMUL", "FADD", "F2F", "F2FP", "I2F", "F2I", "FSETP", "FSEL", "FMNMX",
              "MUFU"),
    "move": ("MOV", "UMOV", "CS2R", "S2R", "S2UR", "R2UR", "SHFL", "P2R", "R2P", "PLOP3"),
    "control": ("BRA", "BAR", "DEPBAR", "WARPSYNC", "BSSY", "BSYNC", "NOP", "EXIT", "YIELD"),
}


def sass_instructions(sass: str):
    """[(address, opcode, operands)] of the kernel's instructions."""
    return [(int(a, 16), op, rest) for a, _, op, rest in LINE.findall(sass)]


def hottest_loop(sass: str):
    """Instructions of the backward-branch body holding the most HMMA (of those,
    the shortest: an outer loop holds its inner loop's HMMA too)."""
    instrs = sass_instructions(sass)
    best, key = [], (0, 0)
    for i, (addr, op, rest) in enumerate(instrs):
        if op.split(".")[0] != "BRA":
            continue
        m = re.search(r"0x([0-9a-f]+)", rest)
        if not m or int(m.group(1), 16) >= addr:
            continue
        start = int(m.group(1), 16)
        body = [x for x in instrs[:i + 1] if x[0] >= start]
        k = (sum(x[1].startswith("HMMA") for x in body), -len(body))
        if k > key:
            best, key = body, k
    return best


def opcode_mix(body) -> dict:
    """Instruction counts by class (CLASSES; "other" for the rest)."""
    counts = collections.Counter()
    for _, op, _ in body:
        base = op.split(".")[0]
        cls = next((c for c, ops in CLASSES.items() if base in ops or (base.startswith("U") and base[1:] in ops)),
                   "other")
        counts[cls] += 1
    return dict(counts)


def load_use_distance(body) -> dict:
    """Per load kind in a loop body (hottest_loop): the fewest instructions,
    as a fraction of the loop, from a load to the first instruction that reads
    its destination, going round the loop. "weights" are the streamed
    LDG.E.NA.128 (L1::no_allocate) words, "activations" the other 16-byte
    loads, "scales" the narrower ones. Near 0: the load is waited for right
    after it issues (ptxas sank it to the loop's end, or copies it at once);
    near 1: a whole iteration's work covers its latency."""
    n = len(body)
    out = {}
    for i, (_, op, rest) in enumerate(body):
        m = re.match(r"\s*(?:@!?U?P\w+\s+)?R(\d+)", rest)
        if not op.startswith("LDG") or not m:
            continue
        width = 4 if ".128" in op else 2 if ".64" in op else 1
        regs = [f"R{int(m.group(1)) + j}" for j in range(width)]
        kind = "weights" if ".NA." in op else "activations" if ".128" in op else "scales"
        for d in range(1, n + 1):
            _, op2, rest2 = body[(i + d) % n]
            srcs = rest2 if op2.startswith(("ST", "RED")) or "," not in rest2 else rest2.split(",", 1)[1]
            if any(re.search(rf"\b{r}\b", srcs) for r in regs):
                out[kind] = min(out.get(kind, 1.0), d / n)
                break
    return out

