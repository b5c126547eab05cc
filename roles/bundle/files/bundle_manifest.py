#!/usr/bin/env python3
"""The offline bundle's manifest: every file's path, size and sha256, in path order.

  bundle_manifest.py write DIR [--meta JSON]   write DIR/manifest.json; print its summary
  bundle_manifest.py check DIR                 every file against the manifest; exit 1 on a difference

The manifest holds no time or host, so building the same bundle twice gives the same file.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def scan(root: Path) -> list[dict]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() != MANIFEST)
    return [{"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "sha256": sha256(p)} for p in files]


def summary(files: list[dict]) -> dict:
    parts: dict[str, dict] = {}
    for entry in files:
        part = parts.setdefault(entry["path"].split("/", 1)[0], {"files": 0, "bytes": 0})
        part["files"] += 1
        part["bytes"] += entry["size"]
    return {"files": len(files), "bytes": sum(p["bytes"] for p in parts.values()), "parts": parts}


def write(root: Path, meta: dict) -> dict:
    files = scan(root)
    manifest = {"meta": meta, "summary": summary(files), "files": files}
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    target = root / MANIFEST
    changed = not target.exists() or target.read_text() != text
    if changed:
        target.write_text(text)
    return {"changed": changed, "manifest_sha256": hashlib.sha256(text.encode()).hexdigest(), **manifest["summary"]}


def check(root: Path) -> list[str]:
    target = root / MANIFEST
    if not target.is_file():
        return [f"{target} is missing: offline_bundle_dir names no bundle. Fix: build it with "
                f"ansible-playbook -i inventory/<yours> bundle.yml -e offline_bundle_dir={root}"]
    listed = {e["path"]: e for e in json.loads(target.read_text())["files"]}
    found = {e["path"]: e for e in scan(root)}
    problems = [f"{p}: listed in the manifest, missing from the bundle" for p in sorted(listed.keys() - found.keys())]
    problems += [f"{p}: in the bundle, not in its manifest" for p in sorted(found.keys() - listed.keys())]
    problems += [f"{p}: size or sha256 differs from the manifest" for p in sorted(listed.keys() & found.keys())
                 if (listed[p]["size"], listed[p]["sha256"]) != (found[p]["size"], found[p]["sha256"])]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["write", "check"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--meta", default="{}", help="JSON object stored as the manifest's meta")
    args = parser.parse_args()
    if args.action == "write":
        print(json.dumps(write(args.dir, json.loads(args.meta))))
        return 0
    problems = check(args.dir)
    for problem in problems:
        print(f"{args.dir}: {problem}", file=sys.stderr)
    print(json.dumps({"ok": not problems, "problems": len(problems)}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
