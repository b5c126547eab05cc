#!/usr/bin/env python3
"""The test report of `make test`: JUnit XML under one directory, and its tables.

Layout of the report directory ($SM120_REPORT_DIR, else .cache/reports in the repository):
  report.xml          the run: <testsuites> with its start and, once finished, its wall
                      time and every step's <testsuite>
  <slug>.xml          one step (written by .ci/step.py): a <testsuite> of one <testcase>
  <slug>.log          that step's whole output
  pytest/<slug>.xml   pytest's own JUnit report of the step, when it ran pytest
  ansible/<scenario>/ a Molecule scenario's playbook runs (Ansible's junit callback; the
                      Makefile enables it)

    report.py start                      a new run: empties the directory
    report.py finish                     records the wall time, prints the table
    report.py table [--markdown]         prints the table of the report as it stands
    report.py readme [README]            writes the Markdown table into README.md between
                                         the ci-times markers
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_FILE = "report.xml"
README_BEGIN = "<!-- ci-times:begin"
README_END = "<!-- ci-times:end -->"
# the order of the groups in the tables; steps of any other group come last
GROUP_ORDER = ("first phase", "lane", "background")
# colours and cursor moves (CSI), and the hyperlinks ansible-lint prints (OSC 8)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
# characters XML 1.0 cannot hold (a log may carry any byte)
NOT_XML = re.compile(r"[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass
class Step:
    name: str
    group: str
    result: str  # passed, failed or stopped
    start: float  # epoch seconds
    seconds: float
    exit_status: int = 0
    log: str | None = None  # relative to the report directory
    pytest: str | None = None  # likewise
    detail: str = ""  # why it did not pass
    output: str = ""  # the end of its log, when it did not pass
    where: str = ""  # the group, or its lane for a lane step (set by order_steps)


@dataclass
class Run:
    directory: Path
    steps: list[Step]
    started: float | None = None
    wall: float | None = None
    revision: str = ""

    @property
    def result(self) -> str:
        return "failed" if any(s.result != "passed" for s in self.steps) else "passed"


def report_dir() -> Path:
    return Path(os.environ.get("SM120_REPORT_DIR") or REPO / ".cache" / "reports")


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "step"


def clean(text: str) -> str:
    return NOT_XML.sub("", ANSI.sub("", text))


def log_tail(path: Path, lines: int = 60) -> str:
    """The last lines of a log, read from its end (a scenario's log runs to megabytes)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 200 * lines))
        text = f.read().decode(errors="replace")
    return clean("\n".join(text.splitlines()[-lines:]))


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")


def epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _write(path: Path, root: ET.Element) -> None:
    ET.indent(root)
    tmp = path.with_name(path.name + ".tmp")
    ET.ElementTree(root).write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, path)  # a reader never sees half a file


def _properties(parent: ET.Element, **props) -> None:
    element = ET.SubElement(parent, "properties")
    for key, value in props.items():
        if value not in (None, ""):
            ET.SubElement(element, "property", name=key, value=str(value))


def step_element(step: Step) -> ET.Element:
    failed, stopped = step.result == "failed", step.result == "stopped"
    suite = ET.Element("testsuite", name=step.group, tests="1", failures=str(int(failed)),
                       errors="0", skipped=str(int(stopped)), time=f"{step.seconds:.3f}",
                       timestamp=iso(step.start))
    _properties(suite, exit_status=step.exit_status, log=step.log, pytest=step.pytest)
    case = ET.SubElement(suite, "testcase", classname=step.group, name=step.name, time=f"{step.seconds:.3f}")
    if failed:
        ET.SubElement(case, "failure", message=clean(step.detail)).text = clean(step.output)
    elif stopped:
        ET.SubElement(case, "skipped", message=clean(step.detail)).text = clean(step.output)
    return suite


def write_step(path: Path, step: Step) -> None:
    _write(path, step_element(step))


def parse_step(suite: ET.Element) -> Step:
    case = suite.find("testcase")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    outcome = case.find("failure")
    result = "failed"
    if outcome is None:
        outcome = case.find("skipped")
        result = "passed" if outcome is None else "stopped"
    return Step(name=case.get("name"), group=case.get("classname"), result=result,
                start=epoch(suite.get("timestamp")), seconds=float(case.get("time")),
                exit_status=int(props.get("exit_status", 0)), log=props.get("log"),
                pytest=props.get("pytest"),
                detail=outcome.get("message", "") if outcome is not None else "",
                output=(outcome.text or "") if outcome is not None else "")


def order_steps(steps: list[Step]) -> list[Step]:
    """The steps by group, then start; a lane step's `where` names its lane: the lane that
    had just freed up when it started (make starts the next scenario as one ends)."""
    lane_ends: list[float] = []
    for step in sorted((s for s in steps if s.group == "lane"), key=lambda s: s.start):
        free = [i for i, end in enumerate(lane_ends) if end <= step.start + 1]
        if free:
            lane = max(free, key=lambda i: lane_ends[i])
            lane_ends[lane] = step.start + step.seconds
        else:
            lane_ends.append(step.start + step.seconds)
            lane = len(lane_ends) - 1
        step.where = f"lane {lane + 1}"
    for step in steps:
        step.where = step.where or step.group
    rank = {group: i for i, group in enumerate(GROUP_ORDER)}
    return sorted(steps, key=lambda s: (rank.get(s.group, len(rank)), s.start))


def load(directory: Path | None = None) -> Run | None:
    """The report in directory, or None when it holds neither a run nor a step."""
    directory = directory or report_dir()
    if not directory.is_dir():
        return None
    steps = [parse_step(ET.parse(p).getroot()) for p in sorted(directory.glob("*.xml")) if p.name != RUN_FILE]
    run = Run(directory=directory, steps=order_steps(steps))
    run_file = directory / RUN_FILE
    if run_file.exists():
        root = ET.parse(run_file).getroot()
        run.started = epoch(root.get("timestamp"))
        run.wall = float(root.get("time")) if root.get("time") else None
        run.revision = next((p.get("value") for p in root.findall("properties/property")
                             if p.get("name") == "revision"), "")
    elif not steps:
        return None
    return run


def wall_time(run: Run) -> float:
    """The run's wall time; for a run not finished, the span from its start (or its first
    step) to the end of its last step."""
    if run.wall is not None:
        return run.wall
    if not run.steps:
        return 0.0
    start = run.started if run.started is not None else min(s.start for s in run.steps)
    return max(s.start + s.seconds for s in run.steps) - start


def _run_element(run: Run) -> ET.Element:
    root = ET.Element("testsuites", name="make test", timestamp=iso(run.started or time.time()))
    _properties(root, revision=run.revision)
    if run.wall is not None:
        root.set("time", f"{run.wall:.3f}")
        root.set("tests", str(len(run.steps)))
        root.set("failures", str(sum(s.result == "failed" for s in run.steps)))
        root.set("skipped", str(sum(s.result == "stopped" for s in run.steps)))
        root.extend(step_element(s) for s in run.steps)
    return root


def start(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    try:
        revision = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip()
    except OSError:  # no git: a tree without its history still gets a report
        revision = ""
    _write(directory / RUN_FILE, _run_element(Run(directory, [], started=time.time(), revision=revision)))


def finish(directory: Path) -> Run:
    run = load(directory) or Run(directory=directory, steps=[])
    if run.started is None:
        run.started = min((s.start for s in run.steps), default=time.time())
    run.wall = time.time() - run.started
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / RUN_FILE, _run_element(run))
    return run


def _offset(run: Run, step: Step) -> float:
    origin = run.started if run.started is not None else min(s.start for s in run.steps)
    return step.start - origin


def _share(run: Run, step: Step) -> str:
    wall = wall_time(run)
    return f"{100 * step.seconds / wall:.0f} %" if wall > 0 else "-"


def table(run: Run) -> str:
    """The plain-text table `make test` prints at its end."""
    wall = wall_time(run)
    rows = [("step", "where", "result", "started at s", "seconds", "share of wall")]
    rows += [(s.name, s.where, s.result, f"{_offset(run, s):.0f}", f"{s.seconds:.0f}", _share(run, s))
             for s in run.steps]
    rows.append(("wall time", "", run.result, "", f"{wall:.0f}", "100 %"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    return "\n".join(lines)


def markdown(run: Run) -> str:
    """The README's table: one row per step, and the wall time."""
    wall = wall_time(run)
    when = datetime.fromtimestamp(run.started or min(s.start for s in run.steps), timezone.utc).date()
    of = f" of {run.revision}" if run.revision else ""
    verdict = "every step passed" if run.result == "passed" else "not every step passed"
    lines = [f"`make test`{of}, {when.isoformat()}: **{wall:,.0f} s** wall time; {verdict}.", "",
             "| step | where | result | started at s | seconds | share of wall time |",
             "|---|---|---|---:|---:|---:|"]
    lines += [f"| {s.name} | {s.where} | {s.result} | {_offset(run, s):,.0f} | {s.seconds:,.0f} | {_share(run, s)} |"
              for s in run.steps]
    lines.append(f"| **wall time** | | {run.result} | | **{wall:,.0f}** | 100 % |")
    return "\n".join(lines)


def update_readme(readme: Path, run: Run) -> None:
    text = readme.read_text()
    begin = text.find(README_BEGIN)
    end = text.find(README_END, begin)
    if begin < 0 or end < 0:
        raise SystemExit(f"{readme}: no {README_BEGIN} ... {README_END} markers")
    head = text.index("\n", begin) + 1  # the begin marker's line stays as it is
    # a blank line before the end marker: a comment right under the table would end it
    readme.write_text(text[:head] + markdown(run) + "\n\n" + text[end:])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="the report directory (default: $SM120_REPORT_DIR, else .cache/reports)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("start")
    sub.add_parser("finish")
    show = sub.add_parser("table")
    show.add_argument("--markdown", action="store_true")
    readme = sub.add_parser("readme")
    readme.add_argument("readme", nargs="?", type=Path, default=REPO / "README.md")
    args = parser.parse_args(argv)
    directory = args.dir or report_dir()

    if args.command == "start":
        start(directory)
        return 0
    if args.command == "finish":
        run = finish(directory)
        print(f"\n---- test report: {directory}/{RUN_FILE} ----")
        print(table(run))
        return 0
    run = load(directory)
    if run is None or not run.steps:
        print(f"{directory}: no test report", file=sys.stderr)
        return 1
    if args.command == "table":
        print(markdown(run) if args.markdown else table(run))
    else:
        update_readme(args.readme, run)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
