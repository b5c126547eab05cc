#!/usr/bin/env python3
"""Requests through the gateway (roles/sglang_gateway) with the openai client, for the lab's
checks (molecule/shared/tasks/gateway.yml). Keys are read from files, never from the
command line. Prints one JSON document.

  keys     --key-file F (a valid key) --bad-key-file G (a revoked or unknown key): a chat
           completion without a key, with G, and with F, each plain and streamed; the
           status of each (200 or the error's status) and, for 200, the answer's length.
  load     --stream-key-file F --key-file G --stream-tokens N --stop-file S: one streamed
           chat completion of N tokens with F while short completions with G run one after
           another until S exists and the stream has ended; the stream's start and end
           (epoch seconds), content chunks, finish reason, completion tokens (its usage
           chunk) and error, and every short request that failed.
  limits   --key-file F: two streams with F at once (the second must get 429 where one
           request per key is the limit), then 10 short requests back to back (some must
           get 429 where the rate is limited without a burst).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import openai

PROMPT = [{"role": "user", "content": "Say hello in one short sentence."}]


def client(base_url: str, key: str | None) -> openai.OpenAI:
    """An openai client sending the key, or no Authorization header at all without one."""
    return openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=key or "none", timeout=600, max_retries=0,
                         default_headers={} if key else {"Authorization": openai.Omit()})


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def ask(c: openai.OpenAI, model: str, stream: bool, max_tokens: int = 8) -> dict:
    """One chat completion: {"status": 200, "chars": n} or {"status": <error status>, "error": ...}."""
    try:
        if stream:
            text, finish = "", None
            for chunk in c.chat.completions.create(model=model, messages=PROMPT, max_tokens=max_tokens, stream=True):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
            return {"status": 200, "chars": len(text), "finish": finish}
        reply = c.chat.completions.create(model=model, messages=PROMPT, max_tokens=max_tokens)
        return {"status": 200, "chars": len(reply.choices[0].message.content or "")}
    except openai.APIStatusError as exc:
        return {"status": exc.status_code, "error": str(exc)[:200]}
    except openai.APIError as exc:
        return {"status": 0, "error": f"{type(exc).__name__}: {exc}"[:200]}


def keys(args) -> dict:
    out = {}
    for name, key in (("none", None), ("bad", read(args.bad_key_file)), ("good", read(args.key_file))):
        c = client(args.url, key)
        for stream in (False, True):
            out[f"{name}-{'streamed' if stream else 'plain'}"] = ask(c, args.model, stream)
    return out


def load(args) -> dict:
    stream_c, steady_c = client(args.url, read(args.stream_key_file)), client(args.url, read(args.key_file))
    stream = {"chunks": 0, "finish": None, "completion_tokens": None, "error": None}
    done = threading.Event()

    def run_stream():
        stream["start"] = time.time()
        try:
            for chunk in stream_c.chat.completions.create(
                    model=args.model, messages=PROMPT, max_tokens=args.stream_tokens, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
                if chunk.choices and chunk.choices[0].delta.content:
                    stream["chunks"] += 1
                if chunk.choices and chunk.choices[0].finish_reason:
                    stream["finish"] = chunk.choices[0].finish_reason
                if chunk.usage:
                    stream["completion_tokens"] = chunk.usage.completion_tokens
        except Exception as exc:  # noqa: BLE001 - reported
            stream["error"] = f"{type(exc).__name__}: {exc}"[:300]
        stream["end"] = time.time()
        done.set()

    thread = threading.Thread(target=run_stream)
    thread.start()
    steady = {"sent": 0, "failed": []}
    while not (done.is_set() and os.path.exists(args.stop_file)):
        result = ask(steady_c, args.model, False, max_tokens=2)
        steady["sent"] += 1
        if result["status"] != 200:
            steady["failed"].append(dict(result, at=time.time()))
        time.sleep(0.2)
    thread.join()
    return {"stream": stream, "steady": steady}


def limits(args) -> dict:
    c = client(args.url, read(args.key_file))
    first = {}
    started = threading.Event()

    def hold():
        try:
            for chunk in c.chat.completions.create(model=args.model, messages=PROMPT, max_tokens=40, stream=True,
                                                   extra_body={"ignore_eos": True}):
                started.set()
            first["status"] = 200
        except openai.APIStatusError as exc:
            first["status"] = exc.status_code
        started.set()

    thread = threading.Thread(target=hold)
    thread.start()
    started.wait(60)
    second = ask(c, args.model, False, max_tokens=2)
    thread.join()
    statuses = []
    for _ in range(10):
        try:
            c.models.list()
            statuses.append(200)
        except openai.APIStatusError as exc:
            statuses.append(exc.status_code)
    return {"held": first.get("status"), "beside_it": second["status"], "back_to_back": statuses}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["keys", "load", "limits"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--key-file")
    ap.add_argument("--bad-key-file")
    ap.add_argument("--stream-key-file")
    ap.add_argument("--stream-tokens", type=int, default=600)
    ap.add_argument("--stop-file")
    args = ap.parse_args()
    print(json.dumps({"keys": keys, "load": load, "limits": limits}[args.mode](args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
