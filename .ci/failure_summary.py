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


def main(path: str) -> int:
    lines = [BOX.sub("", ANSI.sub("", line.rstrip("\n"))) for line in open(path, errors="replace")]
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
