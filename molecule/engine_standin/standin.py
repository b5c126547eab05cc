#!/usr/bin/env python3
"""TEST DOUBLE for an SGLang engine process (prefill, decode or unified). Lab and CI only.

The lab hosts have no GPU, so `python -m sglang.launch_server` cannot run there. This
stand-in takes its place, started by a systemd drop-in that the lab and the Molecule
scenarios write over the real engine unit's ExecStart (the roles never know about it).
It runs from the release venv, with the real SGLang installed, and:

* reads the engine's rendered config (`--config engines/<name>.yaml`) through SGLang's
  own `prepare_server_args` (with `--device cpu`), so host, port, mode, served model name
  and parsers come from the real rendered arguments. SGLang is imported for that in a
  separate process, sglang_resolve.py, once per config, environment and SGLang version:
  its answer (the resolved arguments, what SGLang's PD hook sets in the environment, the
  transfer engine's arguments and SGLang's metric families) is kept in
  $XDG_CACHE_HOME/sm120-standin, and the serving process imports no SGLang module but
  its msgspec-only sse_utils (an import of SGLang costs about 25 s of CPU; the lab starts
  engines tens of times per run);
* serves the HTTP surface the router, the smoke test, the benchmark and the agent suite
  use: /health (503 during a warmup and when told to fail), /health_generate,
  /server_info, /model_info (and the deprecated /get_* spellings), /v1/models,
  /generate, /v1/chat/completions and /metrics;
* answers chat completions deterministically: structured `tool_calls` when the request
  asks for a tool, an answer from the tool's result when the conversation ends with one,
  `reasoning_content` when thinking is requested, and recall of facts stated in earlier
  turns of the conversation ("my name is X" ... "what is my name?"): it only knows what
  the request carries, so a stack that drops history fails the smoke test and the agent
  suite;
* streams like SGLang 0.5.23 when a request says `stream: true`: server-sent events built
  with SGLang's own sse_utils.build_sse_content (tool-call and usage chunks in the same
  JSON that SGLang's protocol classes write: tests/monitoring/test_standin_surface.py
  compares them byte for byte), the role chunk first, then
  reasoning, tool-call or content deltas one token (word) at a time, the finish chunk, a
  usage chunk when `stream_options.include_usage` is set, and `data: [DONE]`; /generate
  streams cumulative `text` with `meta_info` per token as SGLang's http_server does;
* produces `max_new_tokens` tokens (words) when `ignore_eos` is set, as a load generator
  asks, and paces its tokens: `ttft_s` before the first, `token_s` between the next ones
  (decode and unified engines; a prefill engine answers at once);
* hands the KV cache over from prefill to decode through the real Mooncake transfer engine
  of the release venv (mooncake.engine.TransferEngine, initialised with the arguments
  SGLang's MooncakeTransferEngine wrapper passes it: the transport, ports and timeouts come
  from the engine's environment as in a real engine): a prefill engine serves
  its bootstrap port, a decode engine registers a host-memory buffer for the request's
  bootstrap_room there, the prefill engine writes the request's KV bytes into it with
  transfer_sync_write, and the decode engine checks them against what the request implies
  before it answers (a failed or corrupted hand-off answers HTTP 500 and counts
  num_transfer_failed_reqs, as SGLang aborts such a request);
* requires the engine's API keys as SGLang 0.5.23 does (`--api-key`, `--admin-api-key`):
  every request goes through SGLang's own decide_request_auth (sglang/srt/utils/auth.py)
  with the auth level SGLang's http_server gives the route (its @auth_level marks, read from
  the source), so /health and /metrics stay open, the serving endpoints need the API key
  and the admin endpoints the admin key; it logs its resolved arguments at start, as
  SGLang's engine does (keys included: the unit's launcher redacts them);
* records the last requests it received (GET /standin/requests: path, messages, words, and
  the KV hand-off: bytes, intact, milliseconds);
* exports /metrics with SGLang's own metric families (those its SchedulerMetricsCollector
  and TokenizerMetricsCollector define, read by sglang_resolve.py), starting from the
  samples a fresh engine exports and updated on every request as those collectors'
  methods update them (tests/monitoring/test_standin_surface.py feeds the same requests
  to SGLang's collectors and compares the two expositions sample by sample); Prometheus
  multiprocess mode when PROMETHEUS_MULTIPROC_DIR is set, as in the unit;
* has switches for fault tests, read from the environment or from the JSON file
  $STANDIN_CONTROL_DIR/<engine name>.json (default dir /etc/sm120-serve/standin):
    warmup_s      seconds /health answers 503 after start (default 2)
    fail_health   true: /health always 503
    crash         true: exit 1 shortly after start (crash loop under Restart=on-failure)
    fail_chat     true: chat completions answer HTTP 500
    ttft_s        seconds before the first token (default 0; env STANDIN_TTFT_S)
    token_s       seconds between tokens (default 0; env STANDIN_TOKEN_S)
    drop_oldest_turns  N: the engine loses the first N user turns of a conversation (and
                  the replies after them), as a stack that truncates context would
    spec_accept_length  the speculative accept length it reports in /metrics and
                  /server_info when the engine speculates (default 2.0)
  The file is re-read on every /health and chat request, so a test can flip a switch on
  a running process.
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

STARTED = time.monotonic()
DEFAULT_CONTROL_DIR = "/etc/sm120-serve/standin"


def parse_args(argv):
    ap = argparse.ArgumentParser(description="SGLang engine stand-in (test double)")
    ap.add_argument("--config", required=True, help="the engine's SGLang YAML config")
    ap.add_argument("--name", default=os.environ.get("STANDIN_NAME", ""),
                    help="engine name (control file); default: the config file's stem")
    known, rest = ap.parse_known_args(argv)
    return known, rest


RESOLVER = Path(__file__).resolve().with_name("sglang_resolve.py")
# Environment variables that change what SGLang resolves or its transfer engine does.
RESOLVE_ENV_PREFIXES = ("SGLANG_", "SGL_", "MC_", "MOONCAKE_")


def surface_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sm120-standin"


def load_surface(config: str, rest: list[str]) -> dict:
    """What SGLang makes of this config (sglang_resolve.py), from the cache when the config,
    the arguments, the SGLang-relevant environment, SGLang's version and the resolver are
    the ones it was made for."""
    argv = ["--config", config, *rest]
    text = Path(config).read_text()
    # SGLang also reads the model's (and a draft's) config.json
    model_configs = {}
    for directory in re.findall(r"^[a-z-]*path:\s*(\S+)\s*$", text, re.M):
        try:
            model_configs[directory] = (Path(directory) / "config.json").read_text()
        except OSError:
            pass
    key = hashlib.sha256(json.dumps({
        "config": text, "models": model_configs, "argv": argv, "sglang": version("sglang"),
        "resolver": RESOLVER.read_text(),
        "environ": sorted((k, v) for k, v in os.environ.items() if k.startswith(RESOLVE_ENV_PREFIXES)),
    }).encode()).hexdigest()
    cached = surface_cache_dir() / f"{key}.json"
    try:
        return json.loads(cached.read_text())
    except (OSError, ValueError):
        pass
    done = subprocess.run([sys.executable, str(RESOLVER), *argv], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"[standin] SGLang refused the engine's arguments ({RESOLVER.name} exited {done.returncode})")
    surface = json.loads(done.stdout.strip().splitlines()[-1])
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(surface))
        partial.replace(cached)
    except OSError as exc:  # a read-only home: every start resolves again
        print(f"[standin] not caching SGLang's answer: {exc}", file=sys.stderr, flush=True)
    return surface


def sglang_module(relative: str, name: str):
    """One dependency-light module of the installed SGLang, loaded from its file without
    its packages' __init__ (sglang/__init__ imports torch and transformers)."""
    origin = importlib.util.find_spec("sglang").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location(name, Path(origin) / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class Control:
    def __init__(self, name: str):
        self.path = Path(os.environ.get("STANDIN_CONTROL_DIR", DEFAULT_CONTROL_DIR)) / f"{name}.json"

    def get(self) -> dict:
        values = {
            "warmup_s": float(os.environ.get("STANDIN_WARMUP_S", "2")),
            "fail_health": os.environ.get("STANDIN_FAIL_HEALTH", "") == "1",
            "crash": os.environ.get("STANDIN_CRASH", "") == "1",
            "fail_chat": os.environ.get("STANDIN_FAIL_CHAT", "") == "1",
            "ttft_s": float(os.environ.get("STANDIN_TTFT_S", "0")),
            "token_s": float(os.environ.get("STANDIN_TOKEN_S", "0")),
            "drop_oldest_turns": 0,
            "spec_accept_length": 2.0,
        }
        try:
            values.update(json.loads(self.path.read_text()))
        except (OSError, ValueError):
            pass
        return values


class Metrics:
    """SGLang's own metric families (read from its collectors by sglang_resolve.py), holding
    what a fresh engine exports, and updated as the collectors' methods the engine calls
    update them (observe_one_finished_request, observe_time_to_first_token,
    observe_inter_token_latency, log_stats, observe_kv_transfer_metrics,
    increment_transfer_failed_reqs)."""

    def __init__(self, surface: dict | None):
        self.enabled = surface is not None
        if not self.enabled:
            return
        from prometheus_client import Counter, Gauge, Histogram, Summary

        kinds = {"counter": Counter, "gauge": Gauge, "histogram": Histogram, "summary": Summary}
        self.families = {}
        for f in surface["families"]:
            extra = {}
            if f["type"] == "histogram":
                extra["buckets"] = [float(b) for b in f["buckets"]]
            if f["type"] == "gauge":
                extra["multiprocess_mode"] = f["multiprocess_mode"]
            self.families[f["name"]] = kinds[f["type"]](f["name"], f["help"], labelnames=f["labelnames"],
                                                        unit=f["unit"], **extra)
        self.by_attr = {attr: self.families[name] for attr, name in surface["attributes"].items()}
        self.labels = surface["labels"]
        self.scheduler_labels = surface["scheduler_labels"]
        self.lock = threading.Lock()
        self.fresh_gauges = []  # what log_stats(SchedulerStats()) sets: every scheduler gauge's default
        for sample in surface["samples"]:
            metric = self.families[sample["family"]]
            labels = {k: v for k, v in sample["labels"].items() if k in metric._labelnames}  # not a bucket's le
            child = metric.labels(**labels) if metric._labelnames else metric
            if sample["type"] == "gauge":
                child.set(sample["value"])
                self.fresh_gauges.append((child, sample["value"]))
            elif sample["type"] == "counter" and sample["value"]:
                child.inc(sample["value"])
            elif sample["name"].endswith("_count") and sample["value"]:
                raise ValueError(f"{sample['family']}: a fresh engine's observations cannot be replayed")

    def _m(self, attr: str, **extra):
        return self.by_attr[attr].labels(**{**self.labels, **extra})

    def _s(self, attr: str):
        return self.by_attr[attr].labels(**self.scheduler_labels)

    def request(self, prompt_tokens: int, generation_tokens: int, latency: float, disagg_mode: str,
                cached_tokens: int = 0, ttft: float | None = None, stream: bool = False,
                spec_accept_length: float = 0.0):
        if not self.enabled:
            return
        ttft = latency / 2 if ttft is None else min(ttft, latency)
        with self.lock:
            # observe_one_finished_request (has_grammar false, is_streaming left false)
            self._m("tokenizer.prompt_tokens_total", is_streaming="false").inc(prompt_tokens)
            self._m("tokenizer.generation_tokens_total", is_streaming="false").inc(generation_tokens)
            if cached_tokens > 0:
                self._m("tokenizer.cached_tokens_total", cache_source="total").inc(cached_tokens)
            self._m("tokenizer.num_requests_total", is_streaming="false").inc(1)
            self._m("tokenizer.histogram_e2e_request_latency", is_streaming="false").observe(float(latency))
            self._m("tokenizer.prompt_tokens_histogram").observe(float(prompt_tokens))
            self._m("tokenizer.uncached_prompt_tokens_histogram").observe(float(prompt_tokens - cached_tokens))
            self._m("tokenizer.generation_tokens_histogram").observe(float(generation_tokens))
            # observe_time_to_first_token
            self._m("tokenizer.histogram_time_to_first_token", is_streaming="true" if stream else "false").observe(ttft)
            # observe_inter_token_latency: the interval spread over the new tokens, in one bucket
            tokens, interval = max(generation_tokens, 1), latency - ttft
            itl = self._m("tokenizer.histogram_inter_token_latency")
            itl._sum.inc(interval)
            for i, bound in enumerate(itl._upper_bounds):
                if interval / tokens <= bound:
                    itl._buckets[i].inc(tokens)
                    break
            # log_stats(SchedulerStats(gen_throughput, token_usage, cache_hit_rate, spec_accept_length))
            for child, value in self.fresh_gauges:
                child.set(value)
            self._s("scheduler.gen_throughput").set(generation_tokens / max(latency, 1e-3))
            self._s("scheduler.token_usage").set(0.01)
            self._s("scheduler.cache_hit_rate").set(cached_tokens / max(prompt_tokens, 1))
            self._s("scheduler.spec_accept_length").set(spec_accept_length)

    def kv_transfer(self, nbytes: int, seconds: float):
        if self.enabled:
            with self.lock:
                self._s("scheduler.kv_transfer_latency_ms").observe(seconds * 1000)
                self._s("scheduler.kv_transfer_total_mb").observe(nbytes / 2**20)
                self._s("scheduler.kv_transfer_speed_gb_s").observe(nbytes / max(seconds, 1e-6) / 1e9)

    def kv_transfer_failed(self):
        if self.enabled:
            with self.lock:
                self._s("scheduler.num_transfer_failed_reqs").inc(1)

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
FILLER = "token"  # what an ignore_eos request gets after the answer, one word per token


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


def drop_turns(messages: list[dict], turns: int) -> list[dict]:
    """The conversation without its first `turns` user turns (a turn: a user message and
    everything up to the next one); system messages stay."""
    if turns <= 0:
        return messages
    kept, seen = [], 0
    for m in messages:
        if m.get("role") == "user":
            seen += 1
        if m.get("role") == "system" or seen > turns:
            kept.append(m)
    return kept


def answer(messages: list[dict]) -> str:
    """A deterministic reply that uses only the conversation in the request."""
    if messages and messages[-1].get("role") == "tool":
        result = _text(messages[-1].get("content")).strip()
        return f"The tool answered: {result[:300]}"
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


def wants_tool(body: dict, messages: list[dict]) -> bool:
    """Call a tool when the request forces one, or when the user's last message asks for
    the tool (names it, or says "tool"); answer in text after a tool result."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none" or not messages or messages[-1].get("role") != "user":
        return False
    if choice == "required" or isinstance(choice, dict):
        return True
    last = _text(messages[-1].get("content")).lower()
    names = [((t or {}).get("function") or {}).get("name", "") for t in tools]
    return "tool" in last or any(n and n.lower() in last for n in names)


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


def words_of(text: str) -> list[str]:
    """The reply as tokens: one word (with its trailing space) per token."""
    parts = text.split(" ")
    return [w + " " for w in parts[:-1]] + [parts[-1]] if parts else []


def shape_tokens(reply: str, max_tokens, ignore_eos: bool) -> list[str]:
    """The reply's tokens, padded to max_tokens when told to ignore the end of sequence,
    cut at max_tokens otherwise."""
    tokens = words_of(reply)
    if max_tokens:
        if ignore_eos and len(tokens) < max_tokens:
            tokens[-1] = tokens[-1] + " "
            tokens += [FILLER + " "] * (max_tokens - len(tokens) - 1) + [FILLER]
        tokens = tokens[:max_tokens]
    return tokens


# ----------------------------------------------------------------------------- KV hand-off
KV_SLOT_BYTES = 256 * 1024  # one request's KV at most (the lab's prompts are short)
KV_SLOTS = 32               # requests in flight per engine
KV_WAIT_S = 30.0            # either side's wait for the other (prefill's write ends at MC_TRANSFER_TIMEOUT)
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def kv_payload(room: int, words: int) -> bytes:
    """The KV bytes of a request: its size follows the prompt, its content the request's
    bootstrap_room, so decode can tell a missing, short or misrouted hand-off."""
    size = min(KV_SLOT_BYTES, 4096 + 512 * words)
    blocks = (hashlib.sha256(f"{room}:{i}".encode()).digest() for i in range(size // 32 + 1))
    return b"".join(blocks)[:size]


def prompt_words(path: str, body: dict) -> int:
    if path == "/v1/chat/completions":
        return sum(len(_text(m.get("content")).split()) for m in body.get("messages") or [])
    text = body.get("text") or body.get("prompt") or ""
    return len((text if isinstance(text, str) else json.dumps(text)).split())


def preload_cuda_runtime():
    """Load the venv's CUDA runtime (the nvidia wheels' libcudart) globally, as torch does when
    a real engine imports it before its transfer engine: mooncake.engine links libcudart and
    finds it only that way."""
    spec = importlib.util.find_spec("nvidia")
    for base in spec.submodule_search_locations if spec else []:
        for library in sorted(Path(base).glob("*/lib/libcudart.so.*")):
            ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
            return


class TransferEngine:
    """mooncake.engine.TransferEngine (the real transfer engine from the lock), initialised,
    registered and called as SGLang's MooncakeTransferEngine wrapper does."""

    def __init__(self, arguments: dict):
        preload_cuda_runtime()
        from mooncake.engine import TransferEngine as MooncakeEngine

        self.engine = MooncakeEngine()
        if self.engine.initialize(arguments["hostname"], arguments["metadata_server"], arguments["protocol"],
                                  arguments["device_name"]) != 0:
            raise RuntimeError("Mooncake Transfer Engine initialization failed.")
        host, port = arguments["hostname"], self.engine.get_rpc_port()
        self.session_id = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def register(self, ptr: int, length: int):
        if self.engine.register_memory(ptr, length) != 0:
            raise RuntimeError("Mooncake memory registration failed")

    def transfer_sync(self, session_id: str, buffer: int, peer_buffer_address: int, length: int) -> int:
        try:
            return self.engine.transfer_sync_write(session_id, buffer, peer_buffer_address, length)
        except Exception:  # noqa: BLE001 - the wrapper reports any failure as -1
            return -1


class KvHandoff:
    """One side of the PD hand-off, through the transfer engine, over host-memory buffers
    registered with it."""

    def __init__(self, server_args, mooncake_arguments: dict, metrics: Metrics):
        self.mode = str(server_args.disaggregation_mode)
        self.metrics = metrics
        self.engine = TransferEngine(mooncake_arguments)
        self.buffer = ctypes.create_string_buffer(KV_SLOT_BYTES * KV_SLOTS)
        self.base = ctypes.addressof(self.buffer)
        self.engine.register(self.base, KV_SLOT_BYTES * KV_SLOTS)
        self.free = list(range(KV_SLOTS))
        self.slots = threading.Condition()
        self.rooms: dict[int, dict] = {}  # prefill: bootstrap_room -> decode's buffer and the outcome
        self.rooms_changed = threading.Condition()

    def timeout(self) -> float:
        return KV_WAIT_S

    def _take_slot(self, deadline: float) -> int:
        with self.slots:
            while not self.free:
                if not self.slots.wait(max(deadline - time.monotonic(), 0)) and time.monotonic() >= deadline:
                    raise TimeoutError("no free KV buffer slot")
            return self.free.pop()

    def _give_slot(self, slot: int):
        with self.slots:
            self.free.append(slot)
            self.slots.notify()

    # prefill side: the bootstrap server's state, and the write
    def room(self, room: int) -> dict:
        with self.rooms_changed:
            entry = self.rooms.setdefault(room, {"state": "waiting", "created": time.monotonic()})
            # forget hand-offs long done (a bounded table)
            for old in [r for r, e in self.rooms.items() if time.monotonic() - e["created"] > 600]:
                del self.rooms[old]
            return entry

    def register_destination(self, room: int, destination: dict):
        with self.rooms_changed:
            self.room(room)["destination"] = destination
            self.rooms_changed.notify_all()

    def send(self, room: int, words: int) -> dict:
        """Write the request's KV bytes into the buffer decode registered for this room."""
        entry, deadline, started = self.room(room), time.monotonic() + self.timeout(), time.monotonic()
        with self.rooms_changed:
            while "destination" not in entry:
                if time.monotonic() >= deadline:
                    break
                self.rooms_changed.wait(max(deadline - time.monotonic(), 0.01))
        payload = kv_payload(room, words)
        destination = entry.get("destination")
        if destination is None:
            result = {"state": "failed", "error": f"no decode engine registered room {room} within {self.timeout():.0f} s"}
        elif int(destination["length"]) < len(payload):
            result = {"state": "failed", "error": f"decode's buffer holds {destination['length']} bytes, the KV is {len(payload)}"}
        else:
            slot = self._take_slot(deadline)
            try:
                source = self.base + slot * KV_SLOT_BYTES
                ctypes.memmove(source, payload, len(payload))
                sent = time.monotonic()
                rc = self.engine.transfer_sync(destination["session_id"], source, int(destination["addr"]), len(payload))
                seconds = time.monotonic() - sent
            finally:
                self._give_slot(slot)
            if rc < 0:
                result = {"state": "failed", "error": f"transfer_sync_write to {destination['session_id']} returned {rc} "
                                                      f"after {seconds:.2f} s"}
            else:
                result = {"state": "done", "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
                          "ms": round(seconds * 1000, 3), "to": destination["session_id"]}
                self.metrics.kv_transfer(len(payload), seconds)
        if result["state"] == "failed":
            self.metrics.kv_transfer_failed()
        with self.rooms_changed:
            entry.update(result)
            self.rooms_changed.notify_all()
        return {**result, "room": room, "waited_ms": round((time.monotonic() - started) * 1000, 3)}

    # decode side: register a buffer at the prefill engine's bootstrap port, wait, check
    def receive(self, host: str, port: int, room: int, words: int) -> dict:
        import urllib.error
        import urllib.request

        deadline, started = time.monotonic() + self.timeout(), time.monotonic()
        bootstrap = f"http://{host}:{port}/standin/kv/{room}"
        slot = self._take_slot(deadline)
        destination = self.base + slot * KV_SLOT_BYTES
        ctypes.memset(destination, 0, KV_SLOT_BYTES)
        try:
            body = json.dumps({"session_id": self.engine.session_id, "addr": destination,
                               "length": KV_SLOT_BYTES}).encode()
            status: dict = {}
            try:
                urllib.request.urlopen(urllib.request.Request(bootstrap, data=body, method="POST"),
                                       timeout=max(deadline - time.monotonic(), 0.1)).read()
                # one long poll: the bootstrap answers once the hand-off ended or the wait ran out
                wait = max(deadline - time.monotonic(), 0.1)
                with urllib.request.urlopen(f"{bootstrap}?wait={wait:.3f}", timeout=wait + 5) as answer:
                    status = json.loads(answer.read())
            except (OSError, urllib.error.URLError, ValueError) as exc:
                status = {"state": "failed", "error": f"bootstrap {host}:{port} unreachable: {exc}"}
            if status.get("state") != "done":
                error = status.get("error") or f"no KV within {self.timeout():.0f} s"
                raise KvTransferError(f"KV transfer for bootstrap_room {room} from the prefill engine at "
                                      f"{host}:{port} failed after {time.monotonic() - started:.1f} s: {error}")
            expected = kv_payload(room, words)
            received = ctypes.string_at(destination, len(expected))
            intact = received == expected and hashlib.sha256(received).hexdigest() == status.get("sha256")
            if not intact:
                raise KvTransferError(f"KV transfer for bootstrap_room {room} from {host}:{port}: "
                                      f"{len(expected)} bytes arrived corrupted")
            self.metrics.kv_transfer(len(received), float(status.get("ms", 0)) / 1000)
            return {"room": room, "bytes": len(received), "intact": True, "ms": status.get("ms"),
                    "from": f"{host}:{port}", "session": self.engine.session_id}
        except KvTransferError:
            self.metrics.kv_transfer_failed()
            raise
        finally:
            self._give_slot(slot)


class KvTransferError(RuntimeError):
    pass


class BusyHTTPServer(ThreadingHTTPServer):
    """A thread per request and a listen backlog for a benchmark's bursts (http.server's is 5:
    a burst of 64 PD requests had connections refused)."""
    request_queue_size = 256


def make_bootstrap_handler(kv: KvHandoff):
    """The prefill engine's bootstrap port: decode engines register their buffers here."""
    class Bootstrap(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):
            pass

        def _room(self):
            match = re.fullmatch(r"/standin/kv/(-?\d+)", self.path.split("?")[0])
            return int(match.group(1)) if match else None

        def _send(self, code: int, payload: dict):
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            room = self._room()
            if room is None:
                self._send(404, {"error": "not found"})
                return
            wait = re.search(r"[?&]wait=([0-9.]+)", self.path)
            deadline = time.monotonic() + (float(wait.group(1)) if wait else 0)
            entry = kv.room(room)
            with kv.rooms_changed:
                while entry.get("state") not in ("done", "failed") and time.monotonic() < deadline:
                    kv.rooms_changed.wait(max(deadline - time.monotonic(), 0.01))
            self._send(200, {k: v for k, v in entry.items() if k not in ("destination", "created")})

        def do_POST(self):  # noqa: N802
            room = self._room()
            length = int(self.headers.get("Content-Length") or 0)
            try:
                destination = json.loads(self.rfile.read(length) or b"{}")
                destination["session_id"], destination["addr"], destination["length"]  # noqa: B018
            except (ValueError, KeyError):
                self._send(400, {"error": "want session_id, addr and length"})
                return
            if room is None:
                self._send(404, {"error": "not found"})
                return
            kv.register_destination(room, destination)
            self._send(200, {"ok": True})

    return Bootstrap


# ----------------------------------------------------------------------------- server
class Engine:
    def __init__(self, surface: dict, name: str):
        self.sa = server_args = SimpleNamespace(**surface["server_args"])
        self.name = name
        self.control = Control(name)
        self.metrics = Metrics(surface["metrics"])
        self.mode = str(server_args.disaggregation_mode or "null")
        self.model = server_args.served_model_name or server_args.model_path
        self.speculative = bool(getattr(server_args, "speculative_algorithm", None))
        self.requests = 0
        self.seen_prompts: list = []
        self.received: list = []
        self.lock = threading.Lock()
        self.route_auth = RouteAuth(getattr(server_args, "api_key", None), getattr(server_args, "admin_api_key", None))
        # PD engines load the transfer engine at start, as SGLang's KV manager does
        self.kv = KvHandoff(server_args, surface["mooncake"], self.metrics) if self.mode in ("prefill", "decode") \
            else None

    def healthy(self) -> bool:
        ctl = self.control.get()
        return not ctl["fail_health"] and time.monotonic() - STARTED >= float(ctl["warmup_s"])

    def accept_length(self) -> float:
        return float(self.control.get()["spec_accept_length"]) if self.speculative else 0.0

    def server_info(self) -> dict:
        info = dict(vars(self.sa))
        info.update({"version": version("sglang"), "standin": True, "requests": self.requests,
                     "internal_states": [{"last_gen_throughput": 0.0,
                                          "avg_spec_accept_length": self.accept_length() or None}]})
        return info

    def model_info(self) -> dict:
        return {"model_path": self.sa.model_path, "served_model_name": self.model,
                "tokenizer_path": self.sa.tokenizer_path or self.sa.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": "standin", "architectures": ["StandinForCausalLM"]}

    def pacing(self) -> tuple[float, float]:
        """(seconds to the first token, seconds per next token); a prefill engine only
        computes the prompt and answers at once."""
        if self.mode == "prefill":
            return 0.0, 0.0
        ctl = self.control.get()
        return float(ctl["ttft_s"]), float(ctl["token_s"])

    def handoff(self, path: str, body: dict) -> dict | None:
        """The request's KV hand-off when the router sent it in PD mode (bootstrap fields set);
        raises KvTransferError when it failed."""
        if self.kv is None or body.get("bootstrap_room") is None:
            return None
        room, words = int(body["bootstrap_room"]), prompt_words(path, body)
        if self.mode == "prefill":
            result = self.kv.send(room, words)
            if result["state"] != "done":
                raise KvTransferError(f"KV transfer for bootstrap_room {room}: {result['error']}")
            return result
        return self.kv.receive(str(body["bootstrap_host"]), int(body["bootstrap_port"]), room, words)

    def record(self, path: str, messages: list[dict], words: int, stream: bool, kv: dict | None = None):
        with self.lock:
            self.received.append({"path": path, "stream": stream, "words": words, "messages": len(messages),
                                  "kv": kv, "roles": [m.get("role") for m in messages],
                                  "first_user": next((_text(m.get("content"))[:200] for m in messages
                                                      if m.get("role") == "user"), "")})
            del self.received[:-32]

    def chat_reply(self, body: dict) -> dict:
        """What the engine answers: reasoning, a tool call or content tokens, and usage."""
        received = body.get("messages") or []
        messages = drop_turns(received, int(self.control.get()["drop_oldest_turns"]))
        tools = body.get("tools") or []
        reply = {"reasoning": None, "tool_call": None, "tokens": [], "finish": "stop"}
        if wants_tool(body, messages):
            reply["tool_call"] = tool_call(tools, messages)
            reply["finish"] = "tool_calls"
        else:
            limit = body.get("max_completion_tokens") or body.get("max_tokens")
            reply["tokens"] = shape_tokens(answer(messages), limit, bool(body.get("ignore_eos")))
            if limit and len(reply["tokens"]) >= limit and not body.get("ignore_eos"):
                reply["finish"] = "length"
        if thinking_requested(body) and self.sa.reasoning_parser and body.get("separate_reasoning", True):
            last = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") in ("user", "tool")), "")
            reply["reasoning"] = (f"The conversation has {len(messages)} messages; the last one says: "
                                  f"{' '.join(last.split()[:12])}")
        words = [w for m in received for w in _text(m.get("content")).split()]
        reply["words"] = words
        reply["completion_tokens"] = (len(reply["tokens"]) if reply["tool_call"] is None
                                      else len(reply["tool_call"]["function"]["arguments"].split()))
        self.record("/v1/chat/completions", received, len(words), bool(body.get("stream")), body.get("_standin_kv"))
        return reply

    def chat(self, body: dict) -> dict:
        started = time.monotonic()
        reply = self.chat_reply(body)
        ttft, token_s = self.pacing()
        _sleep_until(started + ttft + token_s * max(reply["completion_tokens"] - 1, 0))
        message: dict = {"role": "assistant", "content": None}
        if reply["tool_call"]:
            message["tool_calls"] = [reply["tool_call"]]
        else:
            message["content"] = "".join(reply["tokens"])
        if reply["reasoning"]:
            message["reasoning_content"] = reply["reasoning"]
        prompt_tokens, completion_tokens = len(reply["words"]), reply["completion_tokens"]
        cached = self._count(reply["words"], completion_tokens, started, ttft=ttft)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or self.model,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reply["finish"],
                             "matched_stop": None}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens,
                          "prompt_tokens_details": {"cached_tokens": cached}},
                "metadata": {"engine": self.name, "mode": self.mode}}

    def chat_stream(self, body: dict):
        """SSE events as SGLang's serving_chat streams them."""
        build_sse_content = sse_utils().build_sse_content
        started = time.monotonic()
        reply = self.chat_reply(body)
        ttft, token_s = self.pacing()
        rid, created, model = uuid.uuid4().hex, int(time.time()), body.get("model") or self.model
        opts = body.get("stream_options") or {}

        def pace(token: int):
            _sleep_until(started + ttft + token_s * token)

        pace(0)
        yield build_sse_content(chunk_id=rid, created=created, model=model, index=0, role="assistant", content="")
        if reply["reasoning"]:
            for word in words_of(reply["reasoning"]):
                yield build_sse_content(chunk_id=rid, created=created, model=model, index=0, reasoning_content=word)
        if reply["tool_call"]:
            call = reply["tool_call"]
            pieces = [(call["id"], call["function"]["name"], "")] + [
                (None, None, part) for part in words_of(call["function"]["arguments"])]
            for i, (call_id, fn_name, arguments) in enumerate(pieces):
                pace(i)
                yield tool_call_chunk(rid, created, model, call_id, fn_name, arguments)
        for i, token in enumerate(reply["tokens"]):
            pace(i)
            yield build_sse_content(chunk_id=rid, created=created, model=model, index=0, content=token)
        yield build_sse_content(chunk_id=rid, created=created, model=model, index=0, finish_reason=reply["finish"])
        prompt_tokens, completion_tokens = len(reply["words"]), reply["completion_tokens"]
        cached = self._count(reply["words"], completion_tokens, started, ttft=ttft, stream=True)
        if opts.get("include_usage"):
            yield usage_chunk(rid, created, model, prompt_tokens, completion_tokens, cached)
        yield "data: [DONE]\n\n"

    def generate_reply(self, body: dict) -> tuple[list[str], list[str]]:
        text = body.get("text") or ""
        prompt = text if isinstance(text, str) else json.dumps(text)
        params = body.get("sampling_params") or {}
        tokens = shape_tokens(answer([{"role": "user", "content": prompt}]),
                              params.get("max_new_tokens"), bool(params.get("ignore_eos")))
        words = prompt.split()
        self.record("/generate", [{"role": "user", "content": prompt}], len(words), bool(body.get("stream")),
                    body.get("_standin_kv"))
        return words, tokens

    def _meta(self, rid: str, words: list, done: int, cached: int, started: float, finished: bool) -> dict:
        return {"id": rid, "finish_reason": {"type": "stop"} if finished else None,
                "prompt_tokens": len(words), "completion_tokens": done, "cached_tokens": cached,
                "spec_accept_length": self.accept_length() or None,
                "e2e_latency": time.monotonic() - started, "engine": self.name, "mode": self.mode}

    def generate(self, body: dict) -> dict:
        started = time.monotonic()
        words, tokens = self.generate_reply(body)
        ttft, token_s = self.pacing()
        _sleep_until(started + ttft + token_s * max(len(tokens) - 1, 0))
        cached = self._count(words, len(tokens), started, ttft=ttft)
        return {"text": "".join(tokens), "meta_info": self._meta(uuid.uuid4().hex, words, len(tokens), cached,
                                                                 started, True)}

    def generate_stream(self, body: dict):
        """SGLang's /generate stream: cumulative text and meta_info per token, then [DONE]."""
        started = time.monotonic()
        words, tokens = self.generate_reply(body)
        ttft, token_s = self.pacing()
        rid = uuid.uuid4().hex
        cached = max((_common_prefix(words, seen) for seen in self.seen_prompts), default=0)
        for i in range(len(tokens)):
            _sleep_until(started + ttft + token_s * i)
            out = {"text": "".join(tokens[:i + 1]),
                   "meta_info": self._meta(rid, words, i + 1, cached, started, i + 1 == len(tokens))}
            yield f"data: {json.dumps(out)}\n\n"
        self._count(words, len(tokens), started, ttft=ttft, stream=True)
        yield "data: [DONE]\n\n"

    def _count(self, words: list, completion_tokens: int, started: float, ttft: float | None = None,
               stream: bool = False) -> int:
        """Count a finished request; returns its cached tokens: the longest prefix (in words)
        it shares with an earlier prompt, as a radix cache would reuse it."""
        with self.lock:
            self.requests += 1
            cached = max((_common_prefix(words, seen) for seen in self.seen_prompts), default=0)
            # a bounded prefix of each prompt: long agent conversations would fill the memory
            self.seen_prompts.append(words[:8192])
            del self.seen_prompts[:-256]
        self.metrics.request(len(words), completion_tokens, time.monotonic() - started + 1e-3, self.mode,
                             cached_tokens=cached, ttft=ttft, stream=stream,
                             spec_accept_length=self.accept_length())
        return cached


class RouteAuth:
    """SGLang's request authorisation: its decide_request_auth, with the auth level its
    http_server marks each route with (@auth_level; unmarked routes are NORMAL)."""

    def __init__(self, api_key, admin_api_key):
        self.auth = sglang_module("srt/utils/auth.py", "sglang_auth")
        self.api_key, self.admin_api_key = api_key, admin_api_key
        origin = importlib.util.find_spec("sglang").submodule_search_locations[0]
        tree = ast.parse((Path(origin) / "srt/entrypoints/http_server.py").read_text())
        self.levels = []  # (methods, path pattern, AuthLevel)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            level, routes = None, []
            for dec in node.decorator_list:
                if not isinstance(dec, ast.Call):
                    continue
                func = dec.func
                if isinstance(func, ast.Name) and func.id == "auth_level":
                    level = self.auth.AuthLevel[dec.args[0].attr]
                elif isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "app" and dec.args \
                        and isinstance(dec.args[0], ast.Constant):
                    methods = {func.attr.upper()}
                    for keyword in dec.keywords:
                        if keyword.arg == "methods":
                            methods = {m.value for m in keyword.value.elts}
                    routes.append((methods, dec.args[0].value))
            for methods, path in routes if level is not None else []:
                pattern = re.compile("^" + re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(path)) + "$")
                self.levels.append((methods, pattern, level))

    def level(self, method: str, path: str):
        for methods, pattern, level in self.levels:
            if method in methods and pattern.match(path):
                return level
        return self.auth.AuthLevel.NORMAL

    def decide(self, method: str, path: str, authorization):
        """(allowed, HTTP status when refused)."""
        decision = self.auth.decide_request_auth(
            method=method, path=path, authorization_header=authorization, api_key=self.api_key,
            admin_api_key=self.admin_api_key, auth_level=self.level(method, path))
        return decision.allowed, decision.error_status_code


_SSE_UTILS = []


def sse_utils():
    """SGLang's sse_utils (msgspec only), loaded once."""
    if not _SSE_UTILS:
        _SSE_UTILS.append(sglang_module("srt/entrypoints/openai/sse_utils.py", "sglang_sse_utils"))
    return _SSE_UTILS[0]


def _sse_json(chunk: dict) -> str:
    """JSON as pydantic's model_dump_json writes it: compact, UTF-8 unescaped."""
    return "data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False) + "\n\n"


def tool_call_chunk(rid: str, created: int, model: str, call_id, name, arguments: str) -> str:
    """SGLang's ChatCompletionStreamResponse with one tool-call delta (protocol.py)."""
    delta = {"role": None, "content": None, "reasoning_content": None,
             "tool_calls": [{"id": call_id, "index": 0, "type": "function",
                             "function": {"name": name, "arguments": arguments}}]}
    return _sse_json({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                      "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None,
                                   "matched_stop": None}], "usage": None})


def usage_chunk(rid: str, created: int, model: str, prompt_tokens: int, completion_tokens: int, cached: int) -> str:
    """SGLang's ChatCompletionStreamResponse carrying only UsageInfo (protocol.py)."""
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
             "completion_tokens": completion_tokens, "prompt_tokens_details": {"cached_tokens": cached},
             "reasoning_tokens": 0, "completion_tokens_details": None}
    return _sse_json({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                      "choices": [], "usage": usage})


def _sleep_until(deadline: float):
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


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

        def _stream(self, events):
            """Server-sent events in HTTP/1.1 chunked transfer encoding, flushed per event."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for event in events:
                    data = event.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            try:
                return json.loads(raw or b"{}")
            except ValueError:
                return {}

        def _authorised(self, path: str) -> bool:
            allowed, status = engine.route_auth.decide(self.command, path, self.headers.get("Authorization"))
            if not allowed:
                if self.command == "POST":
                    self._body()  # read it, so the connection can carry the next request
                self._send(status, {"error": "Unauthorized" if status == 401 else "Forbidden"})
            return allowed

        def do_GET(self):  # noqa: N802 - http.server's naming
            path = self.path.split("?")[0]
            if not self._authorised(path):
                return
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
            elif path == "/standin/requests":
                with engine.lock:
                    self._send(200, {"requests": list(engine.received)})
            else:
                self._send(404, {"error": f"not found: {path}"})

        def do_POST(self):  # noqa: N802
            path = self.path.split("?")[0]
            if not self._authorised(path):
                return
            body = self._body()
            stream = bool(body.get("stream"))
            # The KV hand-off comes first, as in SGLang: an engine told to fail its generations still
            # takes its KV, so its peer is not left waiting for a registration that never comes.
            if path in ("/v1/chat/completions", "/generate", "/v1/completions"):
                try:
                    body["_standin_kv"] = engine.handoff(path, body)
                except KvTransferError as exc:
                    print(f"[standin {engine.name}] {exc}", file=sys.stderr, flush=True)
                    self._send(500, {"error": {"message": str(exc), "type": "KVTransferError"}})
                    return
                if engine.control.get()["fail_chat"]:
                    self._send(500, {"error": {"message": "stand-in told to fail (fail_chat)"}})
                    return
            if path == "/v1/chat/completions":
                self._stream(engine.chat_stream(body)) if stream else self._send(200, engine.chat(body))
            elif path in ("/generate", "/v1/completions"):
                self._stream(engine.generate_stream(body)) if stream else self._send(200, engine.generate(body))
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
    surface = load_surface(args.config, rest)
    os.environ.update(surface["environ"])  # SGLang's PD hook: MC_FORCE_TCP for mooncake_tcp
    engine = Engine(surface, name)
    server_args = engine.sa
    # SGLang's engine logs its resolved arguments at start (engine.py, _server_args_for_logging)
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] server_args={surface['server_args']}", file=sys.stderr, flush=True)
    httpd = BusyHTTPServer((server_args.host, server_args.port), make_handler(engine))
    httpd.daemon_threads = True
    if engine.kv is not None and engine.mode == "prefill":
        bootstrap = BusyHTTPServer((server_args.host, server_args.disaggregation_bootstrap_port),
                                   make_bootstrap_handler(engine.kv))
        bootstrap.daemon_threads = True
        threading.Thread(target=bootstrap.serve_forever, daemon=True).start()

    def stop(signum, _frame):
        print(f"[standin {name}] signal {signum}: draining and exiting", file=sys.stderr, flush=True)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"[standin {name}] TEST DOUBLE serving {engine.model} as {engine.mode} on "
          f"{server_args.host}:{server_args.port} (warmup {control.get()['warmup_s']} s)"
          + (f"; KV transfer engine session {engine.kv.engine.session_id}" if engine.kv else ""),
          file=sys.stderr, flush=True)
    httpd.serve_forever()
    # The transfer engine leaves non-daemon threads behind; the real engine also exits hard.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
