#!/usr/bin/env python3
"""TEST DOUBLE for an SGLang engine process (prefill, decode or unified). Lab and CI only.

The lab hosts have no GPU, so `python -m sglang.launch_server` cannot run there. This
stand-in takes its place, started by a systemd drop-in that the lab and the Molecule
scenarios write over the real engine unit's ExecStart (the roles never know about it).
It runs from the release venv, with the real SGLang installed, and:

* reads the engine's rendered config (`--config engines/<name>.yaml`) through SGLang's
  own `prepare_server_args` (with `--device cpu`), so host, port, mode, served model name
  and parsers come from the real rendered arguments;
* serves the HTTP surface the router and the smoke test use: /health (503 during a
  warmup and when told to fail), /health_generate, /server_info, /model_info (and the
  deprecated /get_* spellings), /v1/models, /generate, /v1/chat/completions and /metrics;
* answers chat completions deterministically: structured `tool_calls` when tools are
  given, `reasoning_content` when thinking is requested, and recall of facts stated in
  earlier turns of the conversation ("my name is X" ... "what is my name?"): it only knows
  what the request carries, so a stack that drops history fails the smoke test;
* exports /metrics through SGLang's own SchedulerMetricsCollector and
  TokenizerMetricsCollector (Prometheus multiprocess mode when PROMETHEUS_MULTIPROC_DIR is
  set, as in the unit), updated on every request so the counters move;
* has switches for fault tests, read from the environment or from the JSON file
  $STANDIN_CONTROL_DIR/<engine name>.json (default dir /etc/sm120-serve/standin):
    warmup_s      seconds /health answers 503 after start (default 2)
    fail_health   true: /health always 503
    crash         true: exit 1 shortly after start (crash loop under Restart=on-failure)
    fail_chat     true: chat completions answer HTTP 500
  The file is re-read on every /health and chat request, so a test can flip a switch on
  a running process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STARTED = time.monotonic()
DEFAULT_CONTROL_DIR = "/etc/sm120-serve/standin"


def parse_args(argv):
    ap = argparse.ArgumentParser(description="SGLang engine stand-in (test double)")
    ap.add_argument("--config", required=True, help="the engine's SGLang YAML config")
    ap.add_argument("--name", default=os.environ.get("STANDIN_NAME", ""),
                    help="engine name (control file); default: the config file's stem")
    known, rest = ap.parse_known_args(argv)
    return known, rest


def load_server_args(config: str, rest: list[str]):
    """SGLang's own parser: the stand-in serves exactly what the rendered config says."""
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--config", config, *rest, "--device", "cpu"])


class Control:
    def __init__(self, name: str):
        self.path = Path(os.environ.get("STANDIN_CONTROL_DIR", DEFAULT_CONTROL_DIR)) / f"{name}.json"

    def get(self) -> dict:
        values = {
            "warmup_s": float(os.environ.get("STANDIN_WARMUP_S", "2")),
            "fail_health": os.environ.get("STANDIN_FAIL_HEALTH", "") == "1",
            "crash": os.environ.get("STANDIN_CRASH", "") == "1",
            "fail_chat": os.environ.get("STANDIN_FAIL_CHAT", "") == "1",
        }
        try:
            values.update(json.loads(self.path.read_text()))
        except (OSError, ValueError):
            pass
        return values


class Metrics:
    """SGLang's own collectors, labelled as the real engine labels them."""

    def __init__(self, server_args):
        self.enabled = bool(server_args.enable_metrics)
        if not self.enabled:
            return
        from sglang.srt import runtime_context
        runtime_context.publish(server_args, role="tokenizer")
        from sglang.srt.observability import metrics_collector as mc

        labels = mc.tokenizer_metric_labels()
        self.labels = labels
        self.tokenizer = mc.TokenizerMetricsCollector(server_args=server_args, labels=labels)
        sched_labels = {**{k: v for k, v in labels.items() if k != "priority"},
                        "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
        self.scheduler = mc.SchedulerMetricsCollector(labels=sched_labels, server_args=server_args)
        self.mc = mc
        self.lock = threading.Lock()
        self.running = 0
        self.scheduler.log_stats(mc.SchedulerStats())

    def request(self, prompt_tokens: int, generation_tokens: int, latency: float, disagg_mode: str,
                cached_tokens: int = 0):
        if not self.enabled:
            return
        with self.lock:
            mc = self.mc
            self.tokenizer.observe_one_finished_request(
                self.labels, prompt_tokens=prompt_tokens, generation_tokens=generation_tokens,
                cached_tokens=cached_tokens, e2e_latency=latency, has_grammar=False)
            self.tokenizer.observe_time_to_first_token(self.labels, latency / 2, stream=False)
            self.tokenizer.observe_inter_token_latency(self.labels, latency / 2, max(generation_tokens, 1))
            stats = mc.SchedulerStats()
            stats.gen_throughput = generation_tokens / max(latency, 1e-3)
            stats.token_usage = 0.01
            stats.cache_hit_rate = cached_tokens / max(prompt_tokens, 1)
            self.scheduler.log_stats(stats)
            if disagg_mode in ("prefill", "decode"):
                self.scheduler.observe_kv_transfer_metrics(
                    latency_ms=latency * 1000 / 4, total_mb=prompt_tokens / 1024, speed_gb_s=1.0)

    def exposition(self) -> bytes:
        from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(REGISTRY)


# ----------------------------------------------------------------------------- answers
FACT = re.compile(r"\b(?:my|the|our)\s+([a-z][a-z ]{0,30}?)\s+(?:is|was)\s+[\"']?([A-Za-z0-9][\w.-]*)", re.I)
QUESTION = re.compile(r"\bwhat(?:'s| is| was)\s+(?:my|the|our)\s+([a-z][a-z ]{0,30}?)\s*\??$", re.I)


def _common_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def answer(messages: list[dict]) -> str:
    """A deterministic reply that uses only the conversation in the request."""
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    last = users[-1].strip() if users else ""
    asked = QUESTION.search(last)
    if asked:
        key = asked.group(1).strip().lower()
        facts = {}
        for text in users[:-1] + [_text(m.get("content")) for m in messages if m.get("role") == "assistant"]:
            for k, v in FACT.findall(text):
                facts.setdefault(k.strip().lower(), v.rstrip(".-"))
        if key in facts:
            return f"Your {key} is {facts[key]}."
        return f"I do not know your {key}: nothing earlier in this conversation says it."
    facts = FACT.findall(last)
    if facts:
        return f"Noted: your {facts[0][0].strip().lower()} is {facts[0][1].rstrip('.-')}."
    return f"Hello from the engine stand-in. You said: {last[:200]}"


def tool_call(tools: list[dict], messages: list[dict]) -> dict:
    fn = (tools[0] or {}).get("function", {})
    props = (fn.get("parameters") or {}).get("properties", {}) or {}
    text = _text(messages[-1].get("content")) if messages else ""
    # Proper nouns: capitalised words that do not start a sentence (Paris, not What).
    words = re.findall(r"(?<=[a-z,] )[A-Z][a-z]+\b", text)
    args = {}
    for i, (prop, schema) in enumerate(props.items()):
        kind = (schema or {}).get("type", "string")
        if "enum" in (schema or {}):
            args[prop] = schema["enum"][0]
        elif kind in ("integer", "number"):
            args[prop] = 1
        elif kind == "boolean":
            args[prop] = True
        else:
            args[prop] = words[i] if i < len(words) else "unknown"
    return {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function", "index": 0,
            "function": {"name": fn.get("name", "unknown"), "arguments": json.dumps(args)}}


def thinking_requested(body: dict) -> bool:
    kwargs = body.get("chat_template_kwargs") or {}
    return bool(kwargs.get("thinking") or kwargs.get("enable_thinking")
                or body.get("reasoning_effort") or body.get("separate_reasoning"))


# ----------------------------------------------------------------------------- server
class Engine:
    def __init__(self, server_args, name: str):
        self.sa = server_args
        self.name = name
        self.control = Control(name)
        self.metrics = Metrics(server_args)
        self.mode = str(server_args.disaggregation_mode or "null")
        self.model = server_args.served_model_name or server_args.model_path
        self.requests = 0
        self.seen_prompts: list = []

    def healthy(self) -> bool:
        ctl = self.control.get()
        return not ctl["fail_health"] and time.monotonic() - STARTED >= float(ctl["warmup_s"])

    def server_info(self) -> dict:
        info = {}
        for key, value in vars(self.sa).items():
            try:
                json.dumps(value)
                info[key] = value
            except TypeError:
                info[key] = str(value)
        info.update({"version": _sglang_version(), "standin": True, "requests": self.requests,
                     "internal_states": [{"last_gen_throughput": 0.0}]})
        return info

    def model_info(self) -> dict:
        return {"model_path": self.sa.model_path, "served_model_name": self.model,
                "tokenizer_path": self.sa.tokenizer_path or self.sa.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": "standin", "architectures": ["StandinForCausalLM"]}

    def chat(self, body: dict) -> dict:
        started = time.monotonic()
        messages = body.get("messages") or []
        tools = body.get("tools") or []
        message: dict = {"role": "assistant", "content": None}
        finish = "stop"
        if tools and body.get("tool_choice", "auto") != "none":
            message["tool_calls"] = [tool_call(tools, messages)]
            finish = "tool_calls"
        else:
            message["content"] = answer(messages)
        if thinking_requested(body) and self.sa.reasoning_parser:
            message["reasoning_content"] = ("The user asked something; I look at the whole "
                                            "conversation before answering.")
        words = [w for m in messages for w in _text(m.get("content")).split()]
        prompt_tokens = len(words)
        completion_tokens = len((message["content"] or json.dumps(message.get("tool_calls"))).split())
        cached = self._count(words, completion_tokens, started)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or self.model,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                             "matched_stop": None}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens,
                          "prompt_tokens_details": {"cached_tokens": cached}},
                "metadata": {"engine": self.name, "mode": self.mode}}

    def generate(self, body: dict) -> dict:
        started = time.monotonic()
        text = body.get("text") or ""
        prompt = text if isinstance(text, str) else json.dumps(text)
        reply = answer([{"role": "user", "content": prompt}])
        cached = self._count(prompt.split(), len(reply.split()), started)
        return {"text": reply, "meta_info": {"id": uuid.uuid4().hex, "finish_reason": {"type": "stop"},
                                             "prompt_tokens": len(prompt.split()),
                                             "completion_tokens": len(reply.split()),
                                             "cached_tokens": cached, "e2e_latency": time.monotonic() - started,
                                             "engine": self.name, "mode": self.mode}}

    def _count(self, words: list, completion_tokens: int, started: float) -> int:
        """Count a finished request; returns its cached tokens: the longest prefix (in words)
        it shares with an earlier prompt, as a radix cache would reuse it."""
        self.requests += 1
        cached = max((_common_prefix(words, seen) for seen in self.seen_prompts), default=0)
        self.seen_prompts.append(words)
        del self.seen_prompts[:-256]
        self.metrics.request(len(words), completion_tokens, time.monotonic() - started + 1e-3, self.mode,
                             cached_tokens=cached)
        return cached


def _sglang_version() -> str:
    try:
        from importlib.metadata import version
        return version("sglang")
    except Exception:  # noqa: BLE001 - only informative
        return "unknown"


def make_handler(engine: Engine):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "sglang-standin"

        def log_message(self, fmt, *args):  # one line per request in the journal
            sys.stderr.write(f"[standin {engine.name}] {self.command} {self.path} {fmt % args}\n")

        def _send(self, code: int, payload, content_type="application/json"):
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            try:
                return json.loads(raw or b"{}")
            except ValueError:
                return {}

        def do_GET(self):  # noqa: N802 - http.server's naming
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                ok = engine.healthy()
                self._send(200 if ok else 503, {"status": "ok" if ok else "starting"})
            elif path in ("/server_info", "/get_server_info"):
                self._send(200, engine.server_info())
            elif path in ("/model_info", "/get_model_info"):
                self._send(200, engine.model_info())
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": engine.model, "object": "model",
                                                             "owned_by": "sglang", "root": engine.model}]})
            elif path == "/metrics":
                self._send(200, engine.metrics.exposition() if engine.metrics.enabled else b"",
                           "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._send(404, {"error": f"not found: {path}"})

        def do_POST(self):  # noqa: N802
            path = self.path.split("?")[0]
            body = self._body()
            if path in ("/v1/chat/completions", "/generate", "/v1/completions") and engine.control.get()["fail_chat"]:
                self._send(500, {"error": {"message": "stand-in told to fail (fail_chat)"}})
            elif path == "/v1/chat/completions":
                self._send(200, engine.chat(body))
            elif path in ("/generate", "/v1/completions"):
                self._send(200, engine.generate(body))
            elif path in ("/flush_cache", "/abort_request"):
                self._send(200, {"success": True})
            else:
                self._send(404, {"error": f"not found: {path}"})

    return Handler


def main(argv=None) -> int:
    args, rest = parse_args(sys.argv[1:] if argv is None else argv)
    name = args.name or Path(args.config).stem
    control = Control(name)
    if control.get()["crash"]:
        time.sleep(0.5)
        print(f"[standin {name}] told to crash (crash=true); exiting 1", file=sys.stderr, flush=True)
        return 1
    server_args = load_server_args(args.config, rest)
    engine = Engine(server_args, name)
    httpd = ThreadingHTTPServer((server_args.host, server_args.port), make_handler(engine))
    httpd.daemon_threads = True

    def stop(signum, _frame):
        print(f"[standin {name}] signal {signum}: draining and exiting", file=sys.stderr, flush=True)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"[standin {name}] TEST DOUBLE serving {engine.model} as {engine.mode} on "
          f"{server_args.host}:{server_args.port} (warmup {control.get()['warmup_s']} s)",
          file=sys.stderr, flush=True)
    httpd.serve_forever()
    # SGLang's imports leave non-daemon threads behind; the real engine also exits hard.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
