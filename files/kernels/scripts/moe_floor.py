"""The floor under the MoE speed targets, on the local GPU (in stream).

For each bench case (EP8 share, batch 1 / 8 / 32 / 64) this times launch
chains that only move the case's bytes (copy_floor.py), next to its target:
- the shipped launch structure: one token, two launches (gate/up's bytes,
  down's bytes); 8 tokens and more, four (an empty kernel for the alignment,
  gate/up's bytes, down's bytes, an empty kernel for the combine);
- one launch reading every byte.
Each as reads (a Triton sum: the weights are only read) and as copies (the
bench's bandwidth is a copy's). A chain of plain reads slower than the target
means no kernel chain of that structure can meet it on this GPU.

    PYTHONPATH=src python3 scripts/moe_floor.py
"""
import torch

from copy_floor import floor_us, rec, start
from sm120_kernels.bench import TARGET_BATCH1_US, TARGET_FRACTION
from sm120_kernels.moe_cases import moe_bytes
from sm120_kernels.models import MODELS
from sm120_kernels.registry import stream_sets

dev = torch.device("cuda")


def main():
    bw = start(dev)
    for model in MODELS:
        for batch in (1, 8, 32, 64):
            active = model.expected_active(batch)  # as the bench takes it
            total = moe_bytes(model, batch, active)
            act = 2 * 2 * batch * model.hidden
            gate_up = (total - act) * 2 // 3 + act // 2  # gate/up is two thirds of each expert's weights
            down = total - gate_up
            target = TARGET_BATCH1_US if batch == 1 else total / (TARGET_FRACTION * bw) * 1e6
            sets = stream_sets(total, dev)
            row = dict(kind="moe_floor", model=model.name, batch=batch, bytes=total, target_us=round(target, 2))
            for how in ("read", "copy"):
                chain = [(how, gate_up), (how, down)]
                if batch > 1:
                    chain = [("empty",)] + chain + [("empty",)]
                row[f"{how}_shipped_launches_us"] = floor_us(chain, sets, dev)
                row[f"{how}_one_launch_us"] = floor_us([(how, total)], sets, dev)
            rec(**row)


if __name__ == "__main__":
    main()
