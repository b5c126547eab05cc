"""The floor under the mHC pre + post target, on the local GPU (in stream).

The target for pre + post at n 64 is twice its byte bound (bytes / the 2 GiB
copy bandwidth). This times, in stream as the bench does (back to back in one
CUDA graph, input sets rotating over twice the L2), the fastest ways the GPU
has to move the same bytes with no arithmetic at all:
- one launch moving pre's + post's bytes (read half, write half);
- two launches, one moving pre's bytes and one moving post's;
each as a device-to-device memcpy node and as a Triton copy kernel
(copy_floor.py), next to two empty kernels (the launch floor) and the
shipped pre + post. If the copies alone take longer than the target, no
kernel chain that reads and writes these bytes in that many launches can
meet it on this GPU.

    PYTHONPATH=src python3 scripts/mhc_floor.py
"""
import torch

from copy_floor import floor_us, rec, start
from sm120_kernels import mhc as H, mhc_cases
from sm120_kernels.bench import stream_time_us
from sm120_kernels.registry import stream_sets

dev = torch.device("cuda")


def main():
    bw = start(dev)
    rec(kind="two_empty_kernels", us=floor_us([("empty",), ("empty",)], 2, dev))
    for n in (1, 8, 32, 64):
        pre_b, post_b, _ = mhc_cases.mhc_bytes(n)
        total = pre_b + post_b
        bound = total / bw * 1e6
        sets = stream_sets(total, dev)
        row = dict(kind="floor", n=n, bytes=total, bound_us=round(bound, 2), target_us=round(2 * bound, 2))
        for how in ("memcpy", "copy"):
            row[f"{how}_one_launch_us"] = floor_us([(how, total)], sets, dev)
            row[f"{how}_two_launches_us"] = floor_us([(how, pre_b), (how, post_b)], sets, dev)
        ins = [H.make_inputs(n, H.HIDDEN, device="cuda", seed=90 + i) for i in range(sets)]
        calls = [lambda a=a: (H.mhc_pre(a[0], a[2], a[3], a[4], H.RMS_EPS, H.HC_EPS),
                              H.mhc_post(a[1], a[0], a[5], a[6])) for a in ins]
        row["shipped_pre_post_us"] = round(stream_time_us(calls)[0], 2)
        rec(**row)


if __name__ == "__main__":
    main()
