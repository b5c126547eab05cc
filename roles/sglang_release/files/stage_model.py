"""Stage model weights into the shared model store (outside releases), verified.

    python stage_model.py --dest DIR --disk-gb N (--path SRC | --hf-repo REPO --hf-revision SHA)
                          [--checksums SHA256SUMS]

* --path: rsync from a local or NFS directory (resumable: --partial; progress shown),
  then every line of the checksum file (sha256sum format, inside the weights) is verified.
* --hf-repo: huggingface_hub's snapshot_download at the pinned commit (resumable; token
  from HF_TOKEN), then every LFS file is checked against the sha256 the Hub lists.
* Skipped when DEST holds a marker for the same source that a verification wrote.
* Free disk is checked before any byte moves.

Prints one JSON line: {"changed": bool, "msg": ...}; exit status 1 on failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

MARKER = ".sm120-serve-staged.json"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def free_gb(path: Path) -> float:
    probe = path
    while not probe.exists():
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize / 1e9


def verify_sums(dest: Path, sums_file: Path) -> list[str]:
    problems = []
    for line in sums_file.read_text().splitlines():
        if not line.strip():
            continue
        digest, name = line.split(None, 1)
        name = name.lstrip("*").strip()
        target = dest / name
        if not target.is_file():
            problems.append(f"{name}: missing")
        elif sha256(target) != digest:
            problems.append(f"{name}: sha256 differs from {sums_file.name}")
    return problems


def stage_path(args, dest: Path) -> list[str]:
    src = Path(args.path)
    if not src.is_dir():
        return [f"source path {src} is not a directory on this host (mount the NFS share first)"]
    dest.mkdir(parents=True, exist_ok=True)
    print(f"rsync {src}/ -> {dest}/", file=sys.stderr, flush=True)
    subprocess.run(["rsync", "-a", "--partial", "--info=progress2", f"{src}/", f"{dest}/"], check=True,
                   stdout=sys.stderr)
    sums = dest / args.checksums
    if not sums.is_file():
        return [f"{src}/{args.checksums} is missing: the weights cannot be verified "
                "(write it with `sha256sum` in the weights directory)"]
    return verify_sums(dest, sums)


def stage_hf(args, dest: Path) -> list[str]:
    from huggingface_hub import HfApi, snapshot_download

    token = os.environ.get("HF_TOKEN") or None
    print(f"huggingface {args.hf_repo}@{args.hf_revision} -> {dest}", file=sys.stderr, flush=True)
    snapshot_download(repo_id=args.hf_repo, revision=args.hf_revision, local_dir=str(dest), token=token)
    info = HfApi().model_info(args.hf_repo, revision=args.hf_revision, files_metadata=True, token=token)
    problems = []
    lines = []
    for sibling in info.siblings or []:
        lfs = getattr(sibling, "lfs", None)
        target = dest / sibling.rfilename
        if not target.is_file():
            problems.append(f"{sibling.rfilename}: missing after download")
        elif lfs is not None:
            digest = sha256(target)
            if digest != lfs.sha256:
                problems.append(f"{sibling.rfilename}: sha256 differs from the Hub's")
            lines.append(f"{digest}  {sibling.rfilename}")
    if not problems:
        (dest / args.checksums).write_text("\n".join(lines) + "\n")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dest", required=True)
    ap.add_argument("--disk-gb", type=float, default=0)
    ap.add_argument("--path")
    ap.add_argument("--hf-repo")
    ap.add_argument("--hf-revision")
    ap.add_argument("--checksums", default="SHA256SUMS")
    args = ap.parse_args()
    dest = Path(args.dest)
    source = {"path": args.path} if args.path else {"hf_repo": args.hf_repo, "hf_revision": args.hf_revision}
    marker = dest / MARKER
    try:
        if json.loads(marker.read_text()).get("source") == source:
            print(json.dumps({"changed": False, "msg": f"{dest}: present and verified"}))
            return 0
    except (OSError, ValueError):
        pass
    have = free_gb(dest.parent if not dest.exists() else dest)
    if have < args.disk_gb:
        print(json.dumps({"changed": False, "msg": f"{dest.parent}: {have:.0f} GB free, the weights "
                          f"need {args.disk_gb:.0f} GB. Fix: free space or move sglang_model_root."}))
        return 1
    marker.unlink(missing_ok=True)
    try:
        problems = stage_path(args, dest) if args.path else stage_hf(args, dest)
    except (subprocess.CalledProcessError, OSError, ImportError) as exc:
        problems = [f"{type(exc).__name__}: {exc}"]
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's errors are reported as they are
        problems = [f"{type(exc).__name__}: {exc}"]
    if problems:
        print(json.dumps({"changed": True, "msg": f"{dest}: verification failed: " + "; ".join(problems[:10])}))
        return 1
    marker.write_text(json.dumps({"source": source}))
    print(json.dumps({"changed": True, "msg": f"{dest}: staged and verified"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
