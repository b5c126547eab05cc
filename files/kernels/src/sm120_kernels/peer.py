"""The MoE kernel SGLang itself runs for INT4 group-32 weights without this
wheel, for ``bench --peer``: the Triton fused-MoE W4A16 kernel
(``fused_moe_kernel_gptq_awq``) of CompressedTensorsWNA16TritonMoE, compiled
from the SGLang source given (the pinned wheel's own file) and launched as
SGLang's invoke_fused_moe_kernel launches it, with the launch config SGLang
picks when it has no tuned file for the shape (it ships none for these).

Only the two GEMM launches are timed. SGLang also runs its token alignment,
the SiLU product and the top-k sum as separate kernels; here they run in
torch outside the timing, so a speed-up over this peer is a lower bound.

Not covered: SGLang's default INT4 MoE on sm_120 and SM90 is Marlin, and
NVFP4 MoE on SM80-SM90 is Marlin FP4; both are CUDA kernels of sgl-kernel,
built for the lock's torch, so they run only in a full SGLang install. On
sm_120 SGLang's NVFP4 MoE default is FlashInfer's TRT-LLM kernel, which has
SM100 cubins only: there SGLang has no NVFP4 MoE kernel to compare with.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import torch

from .weights import W4A16Weights

KERNEL_FILE = "kernels/ops/moe/fused_moe_triton_kernels.py"  # inside the sglang package
KERNELS = ("write_zeros_to_output", "fused_moe_kernel_gptq_awq")
INT4_GROUP = 32


def sglang_dir(given: str | None = None) -> Path:
    """The sglang package directory: the one given, else the installed one."""
    if given:
        return Path(given)
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("SGLang is not installed here; pass its package directory to --peer")
    return Path(list(spec.submodule_search_locations)[0])


def sglang_version(pkg: Path) -> str:
    """The version its wheel wrote (sglang/_version.py), read without importing SGLang."""
    for node in ast.parse((pkg / "_version.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError(f"{pkg}/_version.py sets no __version__")


def load_kernel(pkg: Path):
    """SGLang's Triton W4A16 kernel, compiled from its own source file: only
    the kernel and the helper it calls are taken, so none of SGLang's runtime
    has to import."""
    import triton
    import triton.language as tl

    path = pkg / KERNEL_FILE
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in KERNELS]
    if len(nodes) != len(KERNELS):
        raise RuntimeError(f"{path}: expected {KERNELS}, found {[n.name for n in nodes]}")
    module = types.ModuleType("sglang_fused_moe_gptq_awq")
    module.__file__ = str(path)  # Triton reads each kernel's source from its file
    module.__dict__.update(triton=triton, tl=tl)
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), module.__dict__)
    return module.fused_moe_kernel_gptq_awq


def default_config(tokens: int, local_experts: int) -> dict:
    """SGLang's get_default_config for int4_w4a16 (no tuned file)."""
    if tokens <= local_experts:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}


def align(topk_ids: torch.Tensor, block_m: int, local_experts: int):
    """moe_align_block_size's output (in torch): slots sorted by expert, each
    expert's run padded to block_m with the invalid id numel, one expert id per
    block, other ranks' slots (-1) in blocks of expert -1 (which the kernel
    fills with zeros); buffers sized as SGLang sizes them."""
    flat = topk_ids.flatten().long()
    numel = flat.numel()
    size = numel * block_m if numel < local_experts + 1 else numel + (local_experts + 1) * (block_m - 1)
    size = (size + 3) // 4 * 4
    sorted_ids = torch.full((size,), numel, dtype=torch.int32, device=flat.device)
    expert_ids = torch.full((-(-size // block_m),), -1, dtype=torch.int32, device=flat.device)
    pos = 0
    for e in [-1] + sorted(set(flat.tolist()) - {-1}):
        slots = torch.nonzero(flat == e).flatten()
        if slots.numel() == 0:
            continue
        sorted_ids[pos:pos + slots.numel()] = slots.to(torch.int32)
        blocks = -(-slots.numel() // block_m)
        expert_ids[pos // block_m:pos // block_m + blocks] = e
        pos += blocks * block_m
    return sorted_ids, expert_ids, torch.tensor([pos], dtype=torch.int32, device=flat.device)


class TritonW4A16:
    """SGLang's Triton W4A16 MoE on one EP rank's weights (INT4 only):
    w [E, N, K/2] uint8 and scales [E, N, K/32] bf16, as
    CompressedTensorsWNA16TritonMoE.process_weights_after_loading leaves them."""

    def __init__(self, model, W: W4A16Weights, pkg: Path):
        assert W.fmt == "int4"
        self.model = model
        self.kernel = load_kernel(pkg)
        self.w13, self.w2 = W.words("w13").view(torch.uint8).contiguous(), W.words("w2").view(torch.uint8).contiguous()
        self.s13, self.s2 = W.scales("s13").contiguous(), W.scales("s2").contiguous()

    def _launch(self, A, B, C, B_scale, topk_weights, aligned, mul_routed_weight, top_k, config):
        import triton
        import triton.language as tl

        sorted_ids, expert_ids, post_padded = aligned
        grid = (triton.cdiv(sorted_ids.shape[0], config["BLOCK_SIZE_M"]) * triton.cdiv(B.shape[1], config["BLOCK_SIZE_N"]),)
        self.kernel[grid](
            A, B, C, B_scale, None, topk_weights, sorted_ids, expert_ids, post_padded,
            B.shape[1], A.shape[1], sorted_ids.shape[0], topk_weights.numel(),
            A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(-2), C.stride(-1),
            B_scale.stride(0), B_scale.stride(2), B_scale.stride(1), 0, 0, 0,
            group_size=INT4_GROUP, MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k,
            compute_type=tl.float32 if A.dtype == torch.float32 else tl.bfloat16, has_zp=False, use_int4_w4a16=True, use_int8_w8a16=False,
            even_Ks=A.shape[1] % config["BLOCK_SIZE_K"] == 0, **config)

    def bind(self, x, topk_weights, topk_ids):
        """(gemms, full): gemms() runs the two GEMM launches alone (what is
        timed); full() the whole layer with torch glue, for the check. x is
        bf16 as in SGLang; fp32 only for the Triton interpreter, whose bf16
        dot is wrong."""
        m = self.model
        T, k = topk_ids.shape
        config = default_config(T, m.local_experts)
        aligned = align(topk_ids, config["BLOCK_SIZE_M"], m.local_experts)
        tw = topk_weights.float().contiguous()
        c1 = torch.empty((T, k, 2 * m.inter), dtype=x.dtype, device=x.device)
        c3 = torch.empty((T, k, m.hidden), dtype=x.dtype, device=x.device)

        def act():
            gate, up = c1.view(-1, 2 * m.inter).float().chunk(2, dim=-1)
            if m.swiglu_limit:
                gate, up = gate.clamp(max=m.swiglu_limit), up.clamp(-m.swiglu_limit, m.swiglu_limit)
            return (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).to(x.dtype)

        def gemm1():
            self._launch(x, self.w13, c1, self.s13, tw, aligned, False, k, config)

        c2 = torch.zeros((T * k, m.inter), dtype=x.dtype, device=x.device)

        def gemm2():
            self._launch(c2, self.w2, c3, self.s2, tw, aligned, True, 1, config)

        def gemms():
            gemm1()
            gemm2()

        def full():
            gemm1()
            c2.copy_(act())
            gemm2()
            return (c3.float().sum(dim=1) * m.routed_scaling_factor).to(torch.bfloat16)

        return gemms, full


def peers(model, W: W4A16Weights, pkg: Path) -> dict:
    """name -> factory() -> object with bind(x, topk_weights, topk_ids)."""
    if W.fmt == "int4":
        return {"sglang-triton-w4a16": lambda: TritonW4A16(model, W, pkg)}
    return {}
