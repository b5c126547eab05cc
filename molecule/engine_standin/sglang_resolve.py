#!/usr/bin/env python3
"""Part of the engine stand-in (a TEST DOUBLE, lab and CI only): what the pinned SGLang makes
of one engine's rendered config, as JSON, so that the stand-in's serving process does not
import SGLang (about 25 s of CPU) at every start. standin.py runs this once per config and
SGLang version and keeps the answer in its cache.

Run with the release venv's Python: `sglang_resolve.py --config engines/<name>.yaml [args]`.
Prints one JSON object:
  server_args   SGLang's resolved ServerArgs (prepare_server_args with --device cpu), as its
                /server_info reports them (resolved_dict and launch_command), each value as
                JSON or its str()
  environ       what SGLang's PD hook set in the environment (MC_FORCE_TCP for mooncake_tcp)
  mooncake      the arguments SGLang's MooncakeTransferEngine passes to mooncake's
                TransferEngine.initialize (PD engines)
  metrics       null without --enable-metrics; else SGLang's own metric families as its
                SchedulerMetricsCollector and TokenizerMetricsCollector define them (name,
                type, help, label names, buckets, multiprocess mode), which collector
                attribute holds each, their labels, and every sample after construction and
                a first log_stats (the state a fresh engine exports)
"""

from __future__ import annotations

import json
import os
import sys


def jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def resolve_server_args(argv: list[str]):
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args([*argv, "--device", "cpu"])
    before = dict(os.environ)
    if server_args.disaggregation_mode in ("prefill", "decode"):
        from sglang.srt.arg_groups.pd_disaggregation_hook import handle_pd_disaggregation
        handle_pd_disaggregation(server_args)
    environ = {k: v for k, v in os.environ.items() if before.get(k) != v}
    return server_args, environ


def mooncake_arguments(server_args) -> dict:
    """What MooncakeTransferEngine.__init__/initialize pass to TransferEngine.initialize."""
    from sglang.srt.distributed.device_communicators import mooncake_transfer_engine as mte
    from sglang.srt.environ import envs

    if os.environ.get("MC_FORCE_TCP") == "1":
        device = ""
    else:
        device = mte.get_ib_devices_for_gpu(server_args.disaggregation_ib_device, 0) or ""
    return {"hostname": server_args.host, "metadata_server": "P2PHANDSHAKE",
            "protocol": envs.MOONCAKE_PROTOCOL.get(), "device_name": device}


def metric_surface(server_args) -> dict:
    from prometheus_client import REGISTRY
    from prometheus_client.metrics import MetricWrapperBase
    from sglang.srt import runtime_context

    runtime_context.publish(server_args, role="tokenizer")
    from sglang.srt.observability import metrics_collector as mc

    labels = mc.tokenizer_metric_labels()
    scheduler_labels = {**{k: v for k, v in labels.items() if k != "priority"},
                        "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
    tokenizer = mc.TokenizerMetricsCollector(server_args=server_args, labels=labels)
    scheduler = mc.SchedulerMetricsCollector(labels=scheduler_labels, server_args=server_args)
    scheduler.log_stats(mc.SchedulerStats())

    families = []
    for metric in list(REGISTRY._collector_to_names):
        if not isinstance(metric, MetricWrapperBase) or not metric._name.startswith("sglang:"):
            continue
        families.append({"name": metric._name, "type": metric._type, "help": metric._documentation,
                         "labelnames": list(metric._labelnames), "unit": metric._unit,
                         "buckets": [str(b) for b in getattr(metric, "_upper_bounds", [])] or None,
                         "multiprocess_mode": getattr(metric, "_multiprocess_mode", None)})
    attributes = {}
    for role, collector in (("tokenizer", tokenizer), ("scheduler", scheduler)):
        for attr, value in vars(collector).items():
            if isinstance(value, MetricWrapperBase):
                attributes[f"{role}.{attr}"] = value._name
    samples = []
    for family in REGISTRY.collect():
        if family.name.startswith("sglang:"):
            samples.extend({"family": family.name, "type": family.type, "name": s.name, "labels": s.labels,
                            "value": s.value} for s in family.samples if not s.name.endswith("_created"))
    return {"families": families, "attributes": attributes, "labels": labels,
            "scheduler_labels": {k: str(v) for k, v in scheduler_labels.items()}, "samples": samples}


def main() -> None:
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the surface is read from this process alone
    server_args, environ = resolve_server_args(sys.argv[1:])
    from importlib.metadata import version

    surface = {"sglang_version": version("sglang"),
               # what SGLang's /server_info reports (build_server_info): the resolved fields
               "server_args": {**{k: jsonable(v) for k, v in server_args.resolved_dict().items()},
                               "launch_command": jsonable(server_args.launch_command)},
               "environ": environ,
               "mooncake": mooncake_arguments(server_args) if server_args.disaggregation_mode in ("prefill", "decode")
               else None,
               "metrics": metric_surface(server_args) if server_args.enable_metrics else None}
    sys.stdout.write(json.dumps(surface) + "\n")


if __name__ == "__main__":
    main()
