#!/usr/bin/env python3
"""Check a live Prometheus of an sm120-serve deployment (make lab's, the examples scenario's):

  * every scrape target is up, and the expected jobs have targets;
  * every recording rule Prometheus has loaded returns data;
  * every dashboard query (roles/grafana/files/dashboards, variables set to All) returns data.

GPU panels (DCGM_*, nvidia_smi_*, sm120_gpu_* metrics) are skipped with --skip-gpu (the
lab has no GPU; tests/monitoring/test_dashboards.py checks them against recorded scrapes).
Retries until everything has data or --wait seconds pass: rate() windows need a few
scrapes, and latency histograms need requests, so send traffic before calling this.

Standard library only. Exit status 0 when all checks pass, 1 otherwise.

  python3 tests/monitoring/check_queries.py --prometheus http://127.0.1.11:9090 --skip-gpu
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "roles" / "grafana" / "files" / "dashboards"
GPU_METRIC = re.compile(r"\b(DCGM_FI_\w+|nvidia_smi_\w+|sm120_gpu_\w+)")
VARIABLES = {"host": ".*", "role": ".*", "instance": ".*", "__rate_interval": "5m", "__interval": "1m"}


def api(url: str, path: str, **params) -> dict:
    full = f"{url.rstrip('/')}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    try:
        with urllib.request.urlopen(full, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        return json.loads(err.read() or b'{"status": "error"}')


def substitute(expr: str) -> str:
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", lambda m: VARIABLES.get(m.group(1) or m.group(2), m.group(0)), expr)


def dashboard_queries(skip_gpu: bool) -> list[tuple[str, str]]:
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dash = json.loads(path.read_text())
        panels = []
        for panel in dash.get("panels", []):
            panels.extend(panel.get("panels", []) if panel.get("type") == "row" else [panel])
        for panel in panels:
            for target in panel.get("targets", []):
                if skip_gpu and GPU_METRIC.search(target["expr"]):
                    continue
                out.append((f"{path.name}: '{panel['title']}' {target['refId']}", substitute(target["expr"])))
    return out


def check(url: str, skip_gpu: bool, jobs: list[str], allow_empty: list[str]) -> list[str]:
    problems = []
    targets = api(url, "/api/v1/targets", state="active")["data"]["activeTargets"]
    for target in targets:
        if target["health"] != "up":
            problems.append(f"target {target['labels'].get('job')} {target['scrapeUrl']} is {target['health']}: "
                            f"{target.get('lastError')}")
    seen_jobs = {t["labels"].get("job") for t in targets}
    problems += [f"job {job}: no target" for job in jobs if job not in seen_jobs]

    allowed = [re.compile(a) for a in allow_empty]
    records = [rule["name"] for group in api(url, "/api/v1/rules", type="record")["data"]["groups"]
               for rule in group["rules"]]
    if not records:
        problems.append("no recording rule loaded")
    checks = [(f"recording rule {name}", name) for name in records] + dashboard_queries(skip_gpu)
    for label, expr in checks:
        if any(a.search(label) for a in allowed):
            continue
        answer = api(url, "/api/v1/query", query=expr)
        if answer.get("status") != "success":
            problems.append(f"{label}: query failed: {answer.get('error')}: {expr}")
        elif not answer["data"]["result"]:
            problems.append(f"{label}: no data: {expr}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL")
    parser.add_argument("--skip-gpu", action="store_true", help="skip GPU panels and the gpu job")
    parser.add_argument("--wait", type=float, default=180, help="seconds to keep retrying (default 180)")
    parser.add_argument("--allow-empty", action="append", default=[], metavar="REGEX",
                        help="checks (by label) allowed to return no data; repeatable")
    args = parser.parse_args()
    jobs = ["prometheus", "node", "sglang_engine", "sglang_router"] + ([] if args.skip_gpu else ["gpu"])
    deadline = time.time() + args.wait
    while True:
        try:
            problems = check(args.prometheus, args.skip_gpu, jobs, args.allow_empty)
        except (OSError, KeyError, ValueError) as err:
            problems = [f"Prometheus API at {args.prometheus}: {err}"]
        if not problems or time.time() >= deadline:
            break
        time.sleep(5)
    for line in problems:
        print(f"FAIL {line}")
    total = len(dashboard_queries(args.skip_gpu))
    print(f"{'FAILED' if problems else 'OK'}: targets, recording rules and {total} dashboard queries "
          f"checked against {args.prometheus} ({len(problems)} problems)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
