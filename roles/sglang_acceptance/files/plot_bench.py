"""Plot one release's serving benchmark (bench.json) beside the previous release's.

Usage: plot_bench.py BENCH_JSON PNG [PREVIOUS_BENCH_JSON]

Two panels against concurrency: output throughput (tok/s), and time to first token and
inter-token latency at p50 and p99 (ms). The previous release, when given, is drawn dashed.
Runs on the controller with its Python (matplotlib is in requirements/controller.txt).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display on a controller or CI runner
import matplotlib.pyplot as plt  # noqa: E402

LATENCIES = (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"),
             ("itl_p50_ms", "ITL p50"), ("itl_p99_ms", "ITL p99"))


def series(bench, key):
    """(concurrency, value) pairs of the levels that have the figure."""
    points = [(lv["concurrency"], lv.get(key)) for lv in bench["levels"]]
    return [c for c, v in points if v is not None], [v for _, v in points if v is not None]


def plot(bench, png, previous=None):
    fig, (tput, lat) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    runs = [(bench, "-", f"release {bench.get('release', '?')}")]
    if previous:
        runs.append((previous, "--", f"release {previous.get('release', '?')} (previous)"))
    for run, style, label in runs:
        tput.plot(*series(run, "output_tok_s"), style, marker="o", label=label)
        for (key, name), color in zip(LATENCIES, ("C0", "C1", "C2", "C3")):
            lat.plot(*series(run, key), style, marker="o", color=color, label=f"{name}, {label}")
    for ax, title, unit in ((tput, "Output throughput", "tok/s"), (lat, "Latency", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks([lv["concurrency"] for lv in bench["levels"]],
                      [str(lv["concurrency"]) for lv in bench["levels"]])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    lat.set_yscale("log")
    fig.suptitle(f"{bench.get('recipe', '')} — {bench.get('input_len', '?')} tokens in, "
                 f"{bench.get('output_len', '?')} out", fontsize=10)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit(__doc__.strip().splitlines()[2])
    with open(argv[1]) as f:
        bench = json.load(f)
    previous = None
    if len(argv) == 4:
        with open(argv[3]) as f:
            previous = json.load(f)
    plot(bench, argv[2], previous)


if __name__ == "__main__":
    main(sys.argv)
