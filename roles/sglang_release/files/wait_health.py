"""Wait until a service answers GET /health with 200, or fail early and show why.

    python3 wait_health.py --url URL --unit UNIT --timeout S [--interval S] [--journal-lines N]

Fails as soon as the unit is failed, or restarted by systemd while we wait (a crash
loop), or when the timeout passes; then prints the unit's last journal lines.
Standard library only: runs with the host's Python.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.error
import urllib.request


def unit_state(unit: str) -> tuple[str, int]:
    out = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "NRestarts", unit],
                         capture_output=True, text=True).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return values.get("ActiveState", "unknown"), int(values.get("NRestarts", "0") or 0)


def health(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--unit", required=True)
    ap.add_argument("--timeout", type=float, required=True)
    ap.add_argument("--interval", type=float, default=2)
    ap.add_argument("--journal-lines", type=int, default=40)
    args = ap.parse_args()
    started = time.monotonic()
    _, restarts0 = unit_state(args.unit)
    reason = ""
    while True:
        code = health(args.url)
        if code == 200:
            print(f"{args.unit}: {args.url} answered 200 after {time.monotonic() - started:.0f} s")
            return 0
        state, restarts = unit_state(args.unit)
        if state == "failed":
            reason = f"{args.unit} failed (last /health answer: {code or 'no connection'})"
        elif restarts > restarts0:
            reason = f"{args.unit} crashed and was restarted {restarts - restarts0} time(s) while starting"
        elif time.monotonic() - started > args.timeout:
            reason = (f"{args.unit}: {args.url} did not answer 200 within {args.timeout:.0f} s "
                      f"(last answer: {code or 'no connection'}, unit {state})")
        if reason:
            break
        time.sleep(args.interval)
    journal = subprocess.run(["journalctl", "-u", args.unit, "-n", str(args.journal_lines), "--no-pager",
                              "-o", "short-iso"], capture_output=True, text=True).stdout
    print(f"{reason}\n--- last {args.journal_lines} journal lines of {args.unit} ---\n{journal}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
