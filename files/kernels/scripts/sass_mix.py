"""Static instruction mix of the fragment kernel's K loop, no GPU needed:

    PYTHONPATH=src:tests python3 scripts/sass_mix.py [NAME_FILTER ...]

Each shipped fragment-kernel variant whose name (as compile_sm120.py names it)
contains every filter is compiled for sm_120a and for the H200's sm_90a with the
installed Triton; cuobjdump's SASS gives the hottest loop (the backward branch
whose body holds the most HMMA). Prints, per variant and target, that loop's
instructions per HMMA (with NT 1 one HMMA is one packed weight word per lane,
so this is the issue cost of a word) and its opcode classes. One JSON object per
line. Where the one-token path is issue-bound (Nsight Compute on the H200), fewer
instructions per word is what to look for before a GPU run. "load_use" is how
far ahead of its first use each kind of load issues, as a fraction of the loop
(sm120_compile_util.load_use_distance): near 0, the warp waits a full memory
latency every step.
"""

import json
import sys

from triton.backends.compiler import GPUTarget

import compile_sm120 as C
from sm120_compile_util import SM120

TARGETS = {"sm_120a": SM120, "sm_90a": GPUTarget("cuda", 90, 32)}


def main(filters):
    for name, fn, sig, const, warps, stages in C.gemm_variants():
        if "tensor-core" in name or not all(f in name for f in filters):
            continue
        for arch, target in TARGETS.items():
            r = C.compile_one(fn, sig, const, warps, stages, k_loop=True, target=target)
            hmma = r["loop_hmma"]
            print(json.dumps({"name": name, "target": arch, "registers": r["registers"],
                              "loop_instructions": r["loop_instructions"], "hmma": hmma,
                              "per_hmma": round(r["loop_instructions"] / hmma, 2) if hmma else None,
                              "load_use": {k: round(v, 2) for k, v in r["loop_load_use"].items()},
                              "mix": r["loop_mix"]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
