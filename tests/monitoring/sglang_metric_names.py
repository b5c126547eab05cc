"""Print, as JSON, every sample name the pinned SGLang's own metric collectors export
(SchedulerMetricsCollector and TokenizerMetricsCollector, built on CPU the way an engine
with --enable-metrics builds them). Run with the SGLang venv's Python; argv[1] is a
directory with a model config.json (no weights are read)."""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    from prometheus_client import REGISTRY
    from sglang.srt import runtime_context
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector, TokenizerMetricsCollector
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(["--model-path", sys.argv[1], "--enable-metrics", "--device", "cpu",
                                       "--disaggregation-mode", "prefill"])
    runtime_context.publish(server_args, role="tokenizer")
    labels = {"model_name": "lab-tiny", "engine_type": "prefill", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
    SchedulerMetricsCollector(labels=labels, server_args=server_args)
    TokenizerMetricsCollector(server_args=server_args, labels={"model_name": "lab-tiny"})

    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "summary": ["_sum", "_count", ""],
                "gauge": [""], "info": ["_info"], "unknown": [""]}
    names = set()
    for family in REGISTRY.collect():
        if family.name.startswith("sglang:"):
            names.update(family.name + s for s in suffixes.get(family.type, [""]))
    import sglang
    print(json.dumps({"version": sglang.__version__, "names": sorted(names)}))


if __name__ == "__main__":
    main()
