#!/usr/bin/env python3
"""Print the cause of a failed CI run in a few lines, for the end of the log.

Reads the full `make test` output (ANSI colours, Molecule's boxed and wrapped Ansible
output) and prints, from the last step banner ("==> ...") on, the last failed task: its
TASK line and the failure message, unwrapped, at most MAX_LINES lines.
"""

import re
import sys

MAX_LINES = 12
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
BOX = re.compile(r"^\s*[│┌└─]+\s?")
# a failed task or Molecule step first; a bare error message when there is none
FAILURE = re.compile(r"(fatal: \[|failed: \[|ERROR! |Idempotence test failed)")
FALLBACK = re.compile(r"(FAILED! =>|Error: |Error [0-9])")
END = re.compile(r"^(PLAY RECAP|TASK \[|TASKS RECAP|real\s)")


def main(path: str) -> int:
    lines = [BOX.sub("", ANSI.sub("", line.rstrip("\n"))) for line in open(path, errors="replace")]
    banners = [i for i, line in enumerate(lines) if line.startswith("==> ")]
    start = banners[-1] if banners else 0
    failures = [i for i in range(start, len(lines)) if FAILURE.search(lines[i])] or [
        i for i in range(start, len(lines)) if FALLBACK.search(lines[i])]
    print("---- CI failure summary ----")
    if banners:
        print(lines[start])
    if not failures:
        print("(no failed task found after the last step banner; see the log above)")
        return 0
    at = failures[-1]
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
    for i in range(0, min(len(text), 200 * MAX_LINES), 200):
        print(text[i:i + 200])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
