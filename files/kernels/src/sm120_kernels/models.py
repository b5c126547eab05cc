"""Model shapes the kernels serve, and the expert-parallel (EP8) share of one GPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MoEModel:
    name: str
    fmt: str  # "nvfp4" | "int4"
    hidden: int
    inter: int  # expert intermediate size
    experts: int  # routed experts, all ranks
    top_k: int
    scoring: str  # "sqrtsoftplus" | "sigmoid"
    num_expert_group: int
    topk_group: int
    routed_scaling_factor: float
    swiglu_limit: float | None
    ep: int = 8

    @property
    def local_experts(self) -> int:
        return self.experts // self.ep

    def expected_active(self, batch: int) -> int:
        """Expected distinct local experts hit by `batch` tokens under uniform
        routing: E_local * (1 - (1 - k/E)^B), at least one."""
        p = 1.0 - (1.0 - self.top_k / self.experts) ** batch
        return max(1, min(self.local_experts, round(self.local_experts * p)))

    def expected_local_slots(self, batch: int) -> int:
        return max(self.expected_active(batch), round(batch * self.top_k / self.ep))


DEEPSEEK_V4_FLASH = MoEModel(
    name="DeepSeek-V4-Flash", fmt="nvfp4", hidden=4096, inter=2048, experts=256, top_k=6,
    scoring="sqrtsoftplus", num_expert_group=1, topk_group=1, routed_scaling_factor=1.5,
    swiglu_limit=10.0,
)
KIMI_K25 = MoEModel(
    name="Kimi-K2.5", fmt="int4", hidden=7168, inter=2048, experts=384, top_k=8,
    scoring="sigmoid", num_expert_group=1, topk_group=1, routed_scaling_factor=2.827,
    swiglu_limit=None,
)
MODELS = (DEEPSEEK_V4_FLASH, KIMI_K25)


def ep_share_routing(model: MoEModel, batch: int, device, seed: int = 0):
    """Top-k ids and weights of `batch` tokens as one EP rank sees them: local
    ids for slots routed here, -1 for slots routed to other ranks. The number of
    distinct local experts and of local slots are the expectations under uniform
    routing (deterministic, so runs are comparable)."""
    g = torch.Generator().manual_seed(seed)
    n_active = model.expected_active(batch)
    n_slots = min(model.expected_local_slots(batch), batch * min(model.top_k, n_active))
    active = torch.randperm(model.local_experts, generator=g)[:n_active].tolist()
    ids = torch.full((batch, model.top_k), -1, dtype=torch.int32)
    used = [set() for _ in range(batch)]
    ptr = 0
    for j in range(n_slots):
        t = j % batch
        for step in range(n_active):
            e = active[(ptr + step) % n_active]
            if e not in used[t]:
                break
        else:
            continue
        ptr = (ptr + step + 1) % n_active
        ids[t, len(used[t])] = e
        used[t].add(e)
    w = torch.rand((batch, model.top_k), generator=g) * 0.5 + 0.05
    return w.to(device), ids.to(device), sorted({e for u in used for e in u})
