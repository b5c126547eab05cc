"""Feed one fixed sequence of engine events to either SGLang's own metric collectors and
stream-chunk classes (`sglang <config>`: what the engine stand-in asked of SGLang when it
imported it at every start) or to the stand-in's SGLang-free equivalents (`standin
<surface.json>`: the metrics built from sglang_resolve.py's answer, the chunk builders), and
print, as JSON, the /metrics exposition and the chunks. Run with the SGLang venv's Python
and PROMETHEUS_MULTIPROC_DIR set (as in the engine unit)."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# (prompt tokens, generation tokens, latency s, cached tokens, ttft s or None, streamed, accept length)
REQUESTS = [(10, 5, 0.5, 0, 0.1, False, 0.0), (20, 7, 1.2, 8, None, True, 2.5), (3, 1, 0.004, 3, 0.001, False, 1.0)]
KV_TRANSFERS = [(10240, 0.002), (262144, 0.05)]
CHUNK = {"rid": "r1", "created": 1796654783, "model": "lab-tiny"}
TOOL_PIECES = [("call_0123456789ab", "get_weather", ""), (None, None, '{"city": '), (None, None, '"Zürich"}')]
USAGE = (31, 12, 8)


def with_sglang(config: str) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from sglang.srt import runtime_context
    from sglang.srt.entrypoints.openai.protocol import (
        ChatCompletionResponseStreamChoice, ChatCompletionStreamResponse, DeltaMessage, FunctionResponse,
        PromptTokensDetails, ToolCall, UsageInfo)
    from sglang.srt.observability import metrics_collector as mc
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(["--config", config, "--device", "cpu"])
    runtime_context.publish(server_args, role="tokenizer")
    labels = mc.tokenizer_metric_labels()
    tokenizer = mc.TokenizerMetricsCollector(server_args=server_args, labels=labels)
    scheduler = mc.SchedulerMetricsCollector(
        labels={**{k: v for k, v in labels.items() if k != "priority"}, "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0},
        server_args=server_args)
    scheduler.log_stats(mc.SchedulerStats())
    for prompt, generation, latency, cached, ttft, stream, accept in REQUESTS:
        ttft = latency / 2 if ttft is None else min(ttft, latency)
        tokenizer.observe_one_finished_request(labels, prompt_tokens=prompt, generation_tokens=generation,
                                               cached_tokens=cached, e2e_latency=latency, has_grammar=False)
        tokenizer.observe_time_to_first_token(labels, ttft, stream=stream)
        tokenizer.observe_inter_token_latency(labels, latency - ttft, max(generation, 1))
        stats = mc.SchedulerStats()
        stats.gen_throughput = generation / max(latency, 1e-3)
        stats.token_usage = 0.01
        stats.cache_hit_rate = cached / max(prompt, 1)
        stats.spec_accept_length = accept
        scheduler.log_stats(stats)
    for nbytes, seconds in KV_TRANSFERS:
        scheduler.observe_kv_transfer_metrics(latency_ms=seconds * 1000, total_mb=nbytes / 2**20,
                                              speed_gb_s=nbytes / max(seconds, 1e-6) / 1e9)
    scheduler.increment_transfer_failed_reqs()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)

    chunks = []
    for call_id, name, arguments in TOOL_PIECES:
        fn = FunctionResponse(name=name, arguments=arguments) if name else FunctionResponse(arguments=arguments)
        delta = DeltaMessage(tool_calls=[ToolCall(id=call_id, index=0, function=fn)])
        chunk = ChatCompletionStreamResponse(id=CHUNK["rid"], created=CHUNK["created"], model=CHUNK["model"], choices=[
            ChatCompletionResponseStreamChoice(index=0, delta=delta, finish_reason=None)])
        chunks.append(f"data: {chunk.model_dump_json()}\n\n")
    prompt, completion, cached = USAGE
    usage = UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                      prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))
    chunk = ChatCompletionStreamResponse(id=CHUNK["rid"], created=CHUNK["created"], model=CHUNK["model"], choices=[],
                                         usage=usage)
    chunks.append(f"data: {chunk.model_dump_json()}\n\n")
    return {"exposition": generate_latest(registry).decode(), "chunks": chunks}


def with_standin(surface_path: str) -> dict:
    sys.path.insert(0, str(REPO / "molecule/engine_standin"))
    import standin

    metrics = standin.Metrics(json.loads(Path(surface_path).read_text())["metrics"])
    for prompt, generation, latency, cached, ttft, stream, accept in REQUESTS:
        metrics.request(prompt, generation, latency, "", cached_tokens=cached, ttft=ttft, stream=stream,
                        spec_accept_length=accept)
    for nbytes, seconds in KV_TRANSFERS:
        metrics.kv_transfer(nbytes, seconds)
    metrics.kv_transfer_failed()
    chunks = [standin.tool_call_chunk(CHUNK["rid"], CHUNK["created"], CHUNK["model"], *piece) for piece in TOOL_PIECES]
    chunks.append(standin.usage_chunk(CHUNK["rid"], CHUNK["created"], CHUNK["model"], *USAGE))
    return {"exposition": metrics.exposition().decode(), "chunks": chunks,
            "sglang_modules": sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang."))}


if __name__ == "__main__":
    result = with_sglang(sys.argv[2]) if sys.argv[1] == "sglang" else with_standin(sys.argv[2])
    sys.stdout.write(json.dumps(result) + "\n")
