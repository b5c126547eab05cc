#!/usr/bin/env python3
"""Run one step of `make test` and record it in the test report.

    step.py [--group GROUP] NAME -- COMMAND [ARG...]

Runs COMMAND with its output in <reports>/<slug>.log (and copied to stdout as it comes),
then writes <reports>/<slug>.xml: a JUnit testsuite of one testcase NAME with the step's
result (passed, failed, or stopped by a signal), duration, start time and group (the
first phase, a lane, the background checks), and the end of its log when it failed. A
pytest run inside the step writes its own JUnit file at <reports>/pytest/<slug>.xml
(the Makefile passes --junitxml); the record names it when it is there. Prints
"==> NAME passed in N s" or "==> NAME FAILED after N s" and exits with COMMAND's status.
<reports> is $SM120_REPORT_DIR, else .cache/reports in the repository.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (the report's layout and XML helpers, beside this script)

# The command writes to the log file, not a pipe (a daemon it leaves holding its stdout
# cannot keep the step from ending); this copies the new output to stdout this often.
FOLLOW_INTERVAL_S = 0.25
# a second signal could cut short the command's own clean-up (Molecule's destroy)
FORWARD_AFTER_S = 5.0


def follow(src, dst) -> None:
    while chunk := src.read(1 << 16):
        dst.write(chunk)
    dst.flush()


def run(name: str, group: str, command: list[str]) -> int:
    reports = report.report_dir()
    reports.mkdir(parents=True, exist_ok=True)
    slug = report.slug(name)
    log_path = reports / f"{slug}.log"
    pytest_path = reports / "pytest" / f"{slug}.xml"
    pytest_path.unlink(missing_ok=True)  # a stale one would name an earlier run's failures
    pytest_path.parent.mkdir(exist_ok=True)

    stopped_by, stopped_at, forwarded = 0, 0.0, False

    def stop(signum, _frame):
        nonlocal stopped_by, stopped_at
        stopped_by, stopped_at = signum, time.monotonic()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    out = sys.stdout.buffer
    start = time.time()
    began = time.monotonic()
    with open(log_path, "wb") as log, open(log_path, "rb") as tail:
        try:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        except OSError as err:
            log.write(f"{name}: cannot run {command[0]}: {err}\n".encode())
            rc = 127
        else:
            # a thread blocks in wait(): Popen.wait(timeout) would poll every few milliseconds
            ended = threading.Event()
            threading.Thread(target=lambda: (proc.wait(), ended.set()), daemon=True).start()
            while not ended.wait(FOLLOW_INTERVAL_S):
                follow(tail, out)
                # a signal to the process group (make's kill, ^C) reached the command too;
                # one sent to this process alone is passed on once the command outlives it
                if stopped_by and not forwarded and time.monotonic() - stopped_at > FORWARD_AFTER_S:
                    proc.send_signal(stopped_by)
                    forwarded = True
            rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        log.flush()
        follow(tail, out)
    seconds = time.monotonic() - began

    if stopped_by:
        result, rc = "stopped", rc or 128 + stopped_by
    else:
        result = "passed" if rc == 0 else "failed"
    report.write_step(reports / f"{slug}.xml", report.Step(
        name=name, group=group, result=result, start=start, seconds=seconds, exit_status=rc,
        log=log_path.name, pytest=f"pytest/{slug}.xml" if pytest_path.exists() else None,
        detail=(f"stopped by signal {stopped_by}" if stopped_by else f"exit status {rc}")
        if result != "passed" else "",
        output=report.log_tail(log_path) if result != "passed" else ""))
    verdict = f"passed in {seconds:.0f} s" if result == "passed" else f"{result.upper()} after {seconds:.0f} s"
    print(f"==> {name} {verdict}", flush=True)
    return rc


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", default=os.environ.get("SM120_STEP_GROUP", "make"),
                        help="where the step ran (default: $SM120_STEP_GROUP, else 'make')")
    parser.add_argument("name")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    return run(args.name, args.group, command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
