#!/usr/bin/env python3
"""Print the cause of a failed CI run in a few lines, for the end of the log.

    failure_summary.py [--reports DIR] LOG

With --reports (the test report of .ci/step.py and .ci/report.py): each failed step with
its duration, then for a pytest step its failed tests and their messages from pytest's
JUnit report, for any other step (a Molecule scenario, a lint) the last failed task and its
message from that step's own log, else the end of that log. Without a report, or with one
that records no failed step, the full `make test` output in LOG (ANSI colours, Molecule's
boxed and wrapped Ansible output; jobs that ran side by side are printed whole, one after
the other): the step that failed, its last failed task and the failure message, unwrapped.
Either way in at most MAX_LINES lines of WIDTH characters a step.
"""

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (the report's reader, beside this script)

MAX_LINES = 12
WIDTH = 200
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
BOX = re.compile(r"^\s*[│┌└─]+\s?")
# where a step failed: Molecule's verdict, a scenario lane's, or make's
STEP_FAILED = re.compile(r"(Molecule executed \d+ scenarios? \(.*failed|==> (roles|molecule)/\S+ FAILED after|"
                         r"Idempotence test failed|Ansible return code was)")
MAKE_FAILED = re.compile(r"^make(\[\d+\])?: \*\*\* ")
# a failed task or Molecule step first; a bare error message when there is none
FAILURE = re.compile(r"(fatal: \[|failed: \[|ERROR! |Idempotence test failed)")
FALLBACK = re.compile(r"(FAILED! =>|Error: |Error [0-9]|FAILED|ERROR)")
END = re.compile(r"^(PLAY RECAP|TASK \[|TASKS RECAP|real\s)")


def last(pattern, lines, start, stop):
    return next((i for i in range(stop - 1, start - 1, -1) if pattern.search(lines[i])), None)


def failure_in(lines, start, stop):
    """The last failed task (else the last bare error) in lines[start:stop]; make's own
    error lines do not count."""
    for pattern in (FAILURE, FALLBACK):
        at = next((i for i in range(stop - 1, start - 1, -1)
                   if pattern.search(lines[i]) and not MAKE_FAILED.match(lines[i])), None)
        if at is not None:
            return at
    return None


def plain(text_lines):
    return [BOX.sub("", ANSI.sub("", line.rstrip("\n"))) for line in text_lines]


def wrapped(text: str) -> list[str]:
    return [text[i:i + WIDTH] for i in range(0, min(len(text), WIDTH * MAX_LINES), WIDTH)]


def from_log(lines: list[str]) -> list[str]:
    """The failed step's banner, its last failed task and the failure message; the banner
    alone when no failure shows in it."""
    anchor = last(STEP_FAILED, lines, 0, len(lines))
    if anchor is not None:
        # the step's banner: above the anchor when the anchor is a lane's own verdict line
        top = anchor - 1 if lines[anchor].startswith("==> ") else anchor
        start = next((i for i in range(top, -1, -1) if lines[i].startswith("==> ")), 0)
        at = failure_in(lines, start, anchor + 1)
    else:
        # only make's error: jobs run side by side print whole, so the failed step need
        # not be the last; take the last step that shows a failure
        banners = [i for i, line in enumerate(lines) if line.startswith("==> ")] or [0]
        ends = banners[1:] + [len(lines)]
        start, at = banners[-1], None
        for b, e in reversed(list(zip(banners, ends))):
            at = failure_in(lines, b, e)
            if at is not None:
                start = b
                break
    if not lines:
        return []
    out = [lines[start].strip()]
    if at is None:
        return out
    task = next((lines[i] for i in range(at, start - 1, -1) if "TASK [" in lines[i]), "")
    if task:
        out.append(task.strip())
    body = []
    for line in lines[at:at + 80]:
        if body and END.match(line.strip()):
            break
        if line.strip():
            body.append(line.strip())
    return out + wrapped(" ".join(body))


def failed_tests(path: Path) -> list[str]:
    """pytest's failed and erroring tests in its JUnit report, with their messages."""
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = next((e for e in case if e.tag in ("failure", "error")), None)
        if outcome is not None:
            message = outcome.get("message") or (outcome.text or "").strip()
            first = next((line for line in message.splitlines() if line.strip()), "")
            found.append(f"FAILED {case.get('classname')}::{case.get('name')} - {first}"[:WIDTH])
    return found


def step_summary(run: "report.Run", step: "report.Step") -> list[str]:
    out = [f"==> {step.name} FAILED after {step.seconds:.0f} s ({step.where}; {step.detail})"]
    if step.pytest and (run.directory / step.pytest).exists():
        tests = failed_tests(run.directory / step.pytest)
        if tests:
            return out + tests[:MAX_LINES] + [f"(pytest's report: {run.directory / step.pytest})"]
    log = run.directory / step.log if step.log else None
    if log is None or not log.exists():
        return out + plain(step.output.splitlines())[-MAX_LINES:]
    found = from_log(plain(open(log, errors="replace")))
    if len(found) > 1:  # a failed task or message, under the scenario's banner
        out += found[1:]
    else:
        out += [line for line in plain(report.log_tail(log, MAX_LINES * 4).splitlines()) if line.strip()][-MAX_LINES:]
    return out + [f"(its log: {log})"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Print the cause of a failed CI run in a few lines.")
    parser.add_argument("--reports", type=Path, help="the test report's directory")
    parser.add_argument("log", type=Path, help="the whole `make test` output")
    args = parser.parse_args(argv)

    print("---- CI failure summary ----")
    run = report.load(args.reports) if args.reports else None
    failed = [s for s in run.steps if s.result == "failed"] if run else []
    if failed:
        for step in failed:
            print("\n".join(step_summary(run, step)))
        stopped = [s.name for s in run.steps if s.result == "stopped"]
        if stopped:
            print(f"stopped after the failure: {', '.join(stopped)}")
        return 0
    if run is not None:
        print(f"(no failed step in the report {args.reports}; from the log)")
    found = from_log(plain(open(args.log, errors="replace")))
    print("\n".join(found))
    if len(found) < 2:
        print("(no failed task found in this step; see the log above)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
