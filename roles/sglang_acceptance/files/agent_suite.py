#!/usr/bin/env python3
"""Agent correctness through the gateway and router, with the openai client from the release venv.

Each conversation is multi-turn, offers a tool and asks for thinking on every turn, and
runs twice: streamed (server-sent events, usage chunk) and not streamed. Per turn:
  * reasoning comes separated from the answer (reasoning_content, not in content);
  * a tool call's arguments are valid JSON that validates against the tool's schema;
  * after a tool result the conversation resumes with an answer built on that result;
  * at the last turn, a fact given in turn 1 is recalled across the whole context.
Conversations: one per context size (tokens, about; filler turns in between). --smoke runs
one short conversation, streamed (the smoke test's other checks do not stream).

Prints one JSON document: {"conversations": [...], "failures": [...]}; each failure names
the conversation, the turn and the context length.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

import jsonschema
import openai

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
FILLER_WORDS = "sea wind rain stone river field cloud light road hill".split()


def filler(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(FILLER_WORDS) for _ in range(words))


def ask(client, model, messages, stream, extra):
    """One turn; returns (content, reasoning, tool_calls, prompt_tokens, chunks)."""
    kwargs = {"model": model, "messages": messages, "tools": [TOOL], "max_tokens": 256, "extra_body": extra}
    if not stream:
        resp = client.chat.completions.create(**kwargs)
        msg = resp.choices[0].message
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in (msg.tool_calls or [])]
        reasoning = (msg.model_extra or {}).get("reasoning_content")
        return msg.content or "", reasoning or "", calls, resp.usage.prompt_tokens if resp.usage else None, None
    content, reasoning, calls, usage, chunks = [], [], {}, None, 0
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage.prompt_tokens
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            for call in delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = slot["id"] or call.id
                if call.function is not None:
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
    if usage is None:
        raise ValueError(f"the stream ended after {chunks} chunks without a usage chunk (include_usage)")
    return "".join(content), "".join(reasoning), [calls[i] for i in sorted(calls)], usage, chunks


def check_turn(content, reasoning, calls, expect_tool, thinking):
    problems = []
    if thinking:
        if not reasoning.strip():
            problems.append("no reasoning_content")
        elif reasoning.strip() in content or "<think>" in content or "</think>" in content:
            problems.append(f"reasoning not separated from the answer: {content[:120]!r}")
    if expect_tool:
        if not calls:
            problems.append(f"no tool call; content: {content[:120]!r}")
        for call in calls:
            if call["name"] != TOOL["function"]["name"]:
                problems.append(f"tool call to unknown function {call['name']!r}")
                continue
            try:
                jsonschema.validate(json.loads(call["arguments"]), TOOL["function"]["parameters"])
            except (ValueError, jsonschema.ValidationError) as exc:
                problems.append(f"tool arguments {call['arguments']!r} invalid: {str(exc).splitlines()[0]}")
    elif not content.strip():
        problems.append("empty answer")
    return problems


def conversation(client, model, name, size, stream, extra, seed):
    """Turn 1 states a fact, then a tool call and its result (the conversation resumes
    after it), filler to reach the size, and the last turn asks for the fact."""
    fact = f"Kestrel-{random.Random(seed).randint(1000, 9999)}"
    half = max(size // 2 - 64, 0)
    script = [
        ("fact", f"Remember this: my codename is {fact}.", False),
        ("tool", (filler(half, seed) + "\n\n" if half else "") + "What is the weather in Paris right now? Use the tool.", True),
        ("resume", None, False),
        ("recall", (filler(half, seed + 1) + "\n\n" if half else "") + "What is my codename?", False),
    ]
    mode = "streamed" if stream else "not streamed"
    label = f"{name} ({mode})"
    messages, turns, failures, thinking = [], [], [], bool(extra)
    for number, (kind, text, expect_tool) in enumerate(script, start=1):
        if kind == "resume":
            call = turns[-1]["calls"][0] if turns and turns[-1]["calls"] else None
            if call is None:
                break
            messages.append({"role": "tool", "tool_call_id": call["id"] or "call_0", "content": json.dumps(
                {"city": "Paris", "forecast": f"sunny, 21 C, report {fact[-4:]}"})})
        else:
            messages.append({"role": "user", "content": text})
        try:
            content, reasoning, calls, prompt_tokens, chunks = ask(client, model, messages, stream, extra)
        except Exception as exc:  # noqa: BLE001 - reported as the turn's failure
            failures.append(f"conversation {label}, turn {number} ({kind}), context {size} tokens: request failed: "
                            f"{type(exc).__name__}: {str(exc)[:300]}")
            break
        problems = check_turn(content, reasoning, calls, expect_tool, thinking)
        if kind == "resume" and f"report {fact[-4:]}" not in content:
            problems.append(f"the answer after the tool result does not use it: {content[:120]!r}")
        if kind == "recall" and fact not in content:
            problems.append(f"fact {fact} from turn 1 not recalled: {content[:120]!r}")
        turns.append({"turn": number, "kind": kind, "prompt_tokens": prompt_tokens, "chunks": chunks,
                      "calls": calls, "problems": problems})
        failures += [f"conversation {label}, turn {number} ({kind}), context {size} tokens "
                     f"({prompt_tokens} prompt tokens): {p}" for p in problems]
        assistant = {"role": "assistant", "content": content or None}
        if calls:
            assistant["tool_calls"] = [{"id": c["id"] or "call_0", "type": "function",
                                        "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
        messages.append(assistant)
    return {"name": name, "mode": mode, "context_tokens": size, "turns": turns}, failures


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True, help="the gateway in front of the router, e.g. http://host:8000")
    ap.add_argument("--api-key-file", required=True, help="a file holding the client key the gateway asks for")
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", default="4096,32768,131072", help="conversation sizes, tokens")
    ap.add_argument("--context-limit", type=int, default=0, help="the recipe's context length (cap)")
    ap.add_argument("--thinking", default="{}", help="JSON the request adds to turn thinking on")
    ap.add_argument("--smoke", action="store_true", help="one short conversation, streamed")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    with open(args.api_key_file, encoding="utf-8") as f:
        api_key = f.read().strip()
    client = openai.OpenAI(base_url=args.base_url.rstrip("/") + "/v1", api_key=api_key, timeout=args.timeout,
                           max_retries=0)
    extra = json.loads(args.thinking)
    if args.smoke:
        plan = [("smoke", 0)]
    else:
        sizes = [int(x) for x in args.contexts.split(",")]
        if args.context_limit:
            # leave room for the answers and the chat template
            sizes = sorted({min(s, args.context_limit - 1024) for s in sizes})
        plan = [(f"recall-{s // 1024}k" if s >= 1024 else f"recall-{s}", s) for s in sizes]
    report = {"conversations": [], "failures": []}
    # The smoke test streams only: its other checks ask the same things without streaming.
    modes = (True,) if args.smoke else (True, False)
    for seed, (name, size) in enumerate(plan):
        for stream in modes:
            conv, failures = conversation(client, args.model, name, size, stream, extra, seed)
            report["conversations"].append(conv)
            report["failures"] += failures
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
