#!/usr/bin/env python3
"""The offline bundle's manifest: every file's path, size and sha256, in path order.

  bundle_manifest.py write DIR [--meta JSON]   write DIR/manifest.json; print its summary
  bundle_manifest.py check DIR [--known FILE]  every file against the manifest; exit 1 on a difference

The manifest holds no time or host, so building the same bundle twice gives the same file.
With --known, a check that passed records each file's sha256 under its inode, size, mtime
and ctime in FILE, and the next check hashes only the files whose record differs: a file
written, copied or touched since gets a new ctime, which no program can set back.
"""

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

MANIFEST = "manifest.json"
# a file changed within the clock's granularity of its hashing could keep its ctime: such
# recent files are hashed again next time
SETTLE_S = 2


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def stat_key(stat: os.stat_result) -> list[int]:
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def scan(root: Path, known: dict | None = None) -> list[dict]:
    """Every file but the manifest, in path order; a file whose stat matches its record in
    known keeps the recorded sha256."""
    known = known or {}
    entries = []
    for p in sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() != MANIFEST):
        path, stat = p.relative_to(root).as_posix(), p.stat()
        record = known.get(path)
        digest = record["sha256"] if record and record["stat"] == stat_key(stat) else sha256(p)
        entries.append({"path": path, "size": stat.st_size, "sha256": digest, "stat": stat_key(stat)})
    return entries


def summary(files: list[dict]) -> dict:
    parts: dict[str, dict] = {}
    for entry in files:
        part = parts.setdefault(entry["path"].split("/", 1)[0], {"files": 0, "bytes": 0})
        part["files"] += 1
        part["bytes"] += entry["size"]
    return {"files": len(files), "bytes": sum(p["bytes"] for p in parts.values()), "parts": parts}


def write(root: Path, meta: dict) -> dict:
    files = [{k: e[k] for k in ("path", "size", "sha256")} for e in scan(root)]
    manifest = {"meta": meta, "summary": summary(files), "files": files}
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    target = root / MANIFEST
    changed = not target.exists() or target.read_text() != text
    if changed:
        target.write_text(text)
    return {"changed": changed, "manifest_sha256": hashlib.sha256(text.encode()).hexdigest(), **manifest["summary"]}


def read_known(path: Path | None) -> dict:
    try:
        return json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        return {}


def write_known(path: Path, found: dict, started: float) -> None:
    settled = {p: {"stat": e["stat"], "sha256": e["sha256"]} for p, e in found.items()
               if e["stat"][4] < (started - SETTLE_S) * 1e9}
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(settled))
    partial.replace(path)


def check(root: Path, known_file: Path | None = None) -> list[str]:
    target = root / MANIFEST
    if not target.is_file():
        return [f"{target} is missing: offline_bundle_dir names no bundle. Fix: build it with "
                f"ansible-playbook -i inventory/<yours> bundle.yml -e offline_bundle_dir={root}"]
    started = time.time()
    listed = {e["path"]: e for e in json.loads(target.read_text())["files"]}
    found = {e["path"]: e for e in scan(root, read_known(known_file))}
    problems = [f"{p}: listed in the manifest, missing from the bundle" for p in sorted(listed.keys() - found.keys())]
    problems += [f"{p}: in the bundle, not in its manifest" for p in sorted(found.keys() - listed.keys())]
    problems += [f"{p}: size or sha256 differs from the manifest" for p in sorted(listed.keys() & found.keys())
                 if (listed[p]["size"], listed[p]["sha256"]) != (found[p]["size"], found[p]["sha256"])]
    if known_file and not problems:
        write_known(known_file, found, started)
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["write", "check"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--meta", default="{}", help="JSON object stored as the manifest's meta")
    parser.add_argument("--known", type=Path, help="check: the sha256 of files a passed check hashed, by stat")
    args = parser.parse_args()
    if args.action == "write":
        print(json.dumps(write(args.dir, json.loads(args.meta))))
        return 0
    problems = check(args.dir, args.known)
    for problem in problems:
        print(f"{args.dir}: {problem}", file=sys.stderr)
    print(json.dumps({"ok": not problems, "problems": len(problems)}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
