#!/usr/bin/env python3
"""Print the cause of a failed CI run in a few lines, for the end of the log.

Reads the full `make test` output (ANSI colours, Molecule's boxed and wrapped Ansible
output; jobs that ran side by side are printed whole, one after the other) and prints
the step that failed, its last failed task and the failure message, unwrapped, in at
most MAX_LINES lines of WIDTH characters.
"""

import re
import sys

MAX_LINES = 12
WIDTH = 200
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
BOX = re.compile(r"^\s*[│┌└─]+\s?")
# where a step failed: Molecule's verdict, the role lane's, or make's
STEP_FAILED = re.compile(r"(Molecule executed \d+ scenarios? \(.*failed|==> roles/\S+ FAILED after|"
                         r"Idempotence test failed|Ansible return code was)")
MAKE_FAILED = re.compile(r"^make(\[\d+\])?: \*\*\* ")
# a failed task or Molecule step first; a bare error message when there is none
FAILURE = re.compile(r"(fatal: \[|failed: \[|ERROR! |Idempotence test failed)")
FALLBACK = re.compile(r"(FAILED! =>|Error: |Error [0-9]|FAILED|ERROR)")
END = re.compile(r"^(PLAY RECAP|TASK \[|TASKS RECAP|real\s)")


def last(pattern, lines, start, stop):
    return next((i for i in range(stop - 1, start - 1, -1) if pattern.search(lines[i])), None)


def main(path: str) -> int:
    lines = [BOX.sub("", ANSI.sub("", line.rstrip("\n"))) for line in open(path, errors="replace")]
    anchor = last(STEP_FAILED, lines, 0, len(lines))
    if anchor is None:
        anchor = last(MAKE_FAILED, lines, 0, len(lines))
    anchor = len(lines) - 1 if anchor is None else anchor
    start = next((i for i in range(anchor, -1, -1) if lines[i].startswith("==> ")), 0)
    at = last(FAILURE, lines, start, anchor + 1)
    if at is None:
        at = last(FALLBACK, lines, start, anchor + 1)
    print("---- CI failure summary ----")
    print(lines[start].strip())
    if at is None:
        print("(no failed task found in this step; see the log above)")
        return 0
    task = next((lines[i] for i in range(at, start - 1, -1) if "TASK [" in lines[i]), "")
    if task:
        print(task.strip())
    body = []
    for line in lines[at:at + 80]:
        if body and END.match(line.strip()):
            break
        if line.strip():
            body.append(line.strip())
    text = " ".join(body)
    for i in range(0, min(len(text), WIDTH * MAX_LINES), WIDTH):
        print(text[i:i + WIDTH])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
