#!/usr/bin/env python3
"""Watch every process of this host for a secret while a run stages weights (lab only).

    secret_watch.py SECRET_FILE RESULT_FILE

Every 20 ms, reads each process's command line and environment (/proc/<pid>/cmdline and
environ, which `ps e` shows) and counts the snapshots, the processes seen running
stage_model.py, and the sightings of the secret. On SIGTERM writes the counts as JSON.
"""

import json
import os
import signal
import sys
import time

secret = open(sys.argv[1], "rb").read().strip()
counts = {"snapshots": 0, "staging_seen": 0, "secret_seen": 0, "where": []}


def stop(*_):
    with open(sys.argv[2], "w") as out:
        json.dump(counts, out)
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
me = str(os.getpid())
while True:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if b"stage_model.py" in cmdline:
            counts["staging_seen"] += 1
        if secret in cmdline or secret in environ:
            counts["secret_seen"] += 1
            counts["where"] = (counts["where"] + [cmdline.replace(b"\0", b" ")[:200].decode(errors="replace")])[-5:]
    counts["snapshots"] += 1
    time.sleep(0.02)
