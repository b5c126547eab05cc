"""Stage model weights into the shared model store (outside releases), verified.

    python stage_model.py --dest DIR --disk-gb N (--path SRC | --hf-repo REPO --hf-revision SHA)
                          [--checksums SHA256SUMS] [--eagle3-draft]

* --path: rsync from a local or NFS directory (resumable: --partial; progress shown),
  then every line of the checksum file (sha256sum format, inside the weights) is verified.
  A path that is DEST itself (weights pushed there from the offline bundle) is only verified.
* --hf-repo: huggingface_hub's snapshot_download at the pinned commit (resumable; token
  from HF_TOKEN), then every LFS file is checked against the sha256 the Hub lists.
* --eagle3-draft: DEST is served as an EAGLE-3 draft. The source is staged verified into
  DEST.source, then DEST gets a copy whose decoder-layer tensors are named `midlayer.*`, as
  SGLang's EAGLE-3 loader reads them: a draft written with `layers.0.*` is converted (only the
  safetensors headers change; every tensor's bytes are checked against the source's), one
  already named `midlayer.*` is copied as it is, any other key layout is refused. The source
  is never edited; the marker (the manifest) records the key mapping and every file's sha256.
* Skipped when DEST holds a marker for the same source that a verification wrote.
* Free disk is checked before any byte moves.

Prints one JSON line: {"changed": bool, "msg": ...}; exit status 1 on failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
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
    if src.resolve() != dest.resolve():
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


# EAGLE-3 draft checkpoints: the one decoder layer and the tensors beside it.
DRAFT_LAYER = "midlayer."
DRAFT_LAYER_ALIASES = ("layers.0.",)
DRAFT_TOP_LEVEL = re.compile(r"^(fc|norm|lm_head|embed_tokens|d2t|t2d)(\.|$)")


def read_safetensors_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a .safetensors file and the offset where its data starts."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return header, 8 + size


def tensor_digests(path: Path) -> dict[str, str]:
    """sha256 of every tensor's bytes, by name."""
    header, start = read_safetensors_header(path)
    digests = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            f.seek(start + begin)
            digests[name] = hashlib.sha256(f.read(end - begin)).hexdigest()
    return digests


def draft_key_mapping(names) -> tuple[dict[str, str], list[str]]:
    """The prefix mapping an EAGLE-3 draft needs ({} when it is already served as is), and the
    keys that fit neither layout."""
    names = [n for n in names if n != "__metadata__"]
    layer = [n for n in names if not DRAFT_TOP_LEVEL.match(n)]
    if layer and all(n.startswith(DRAFT_LAYER) for n in layer):
        return {}, []
    for alias in DRAFT_LAYER_ALIASES:
        if layer and all(n.startswith(alias) for n in layer):
            return {alias: DRAFT_LAYER}, []
    unknown = [n for n in layer if not n.startswith((DRAFT_LAYER,) + DRAFT_LAYER_ALIASES)] or layer
    return {}, sorted(unknown) if layer else ["no decoder-layer tensor (midlayer.* or layers.0.*)"]


def _renamed(name: str, mapping: dict[str, str]) -> str:
    for old, new in mapping.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def convert_draft(src: Path, dest: Path, checksums: str = "SHA256SUMS") -> dict:
    """Write DEST as the served copy of the EAGLE-3 draft in SRC (SRC is only read). Returns the
    manifest entries: the key mapping and every written file's sha256. Raises ValueError for a
    draft whose keys fit neither layout, or a copy that does not verify."""
    shards = sorted(p for p in src.rglob("*.safetensors") if p.is_file())
    if not shards:
        raise ValueError(f"{src}: no .safetensors file; not an EAGLE-3 draft checkpoint")
    names = [n for shard in shards for n in read_safetensors_header(shard)[0]]
    mapping, unknown = draft_key_mapping(names)
    if unknown:
        raise ValueError(f"{src}: keys neither midlayer.* nor layers.0.* of an EAGLE-3 draft: "
                         + ", ".join(unknown[:5]))
    dest.mkdir(parents=True, exist_ok=True)
    files = {}
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src)
        if rel.parts[0].startswith(".") or str(rel) == checksums:
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".safetensors" and mapping:
            _rewrite_safetensors(path, target, mapping)
        elif rel.name.endswith(".safetensors.index.json") and mapping:
            index = json.loads(path.read_text())
            index["weight_map"] = {_renamed(k, mapping): v for k, v in index.get("weight_map", {}).items()}
            target.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        else:
            shutil.copyfile(path, target)
        files[str(rel)] = sha256(target)
    for shard in shards:
        before = {_renamed(k, mapping): v for k, v in tensor_digests(shard).items()}
        after = tensor_digests(dest / shard.relative_to(src))
        if before != after:
            raise ValueError(f"{shard.name}: the converted copy's tensors differ from the source's")
    (dest / checksums).write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(files.items())))
    return {"key_mapping": mapping, "files": files}


def _rewrite_safetensors(src: Path, dest: Path, mapping: dict[str, str]) -> None:
    """The same tensors under new names: a new header, the data bytes copied unchanged."""
    header, start = read_safetensors_header(src)
    renamed = {(k if k == "__metadata__" else _renamed(k, mapping)): v for k, v in header.items()}
    raw = json.dumps(renamed, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    tmp = dest.with_name(dest.name + ".partial")
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        fout.write(len(raw).to_bytes(8, "little"))
        fout.write(raw)
        fin.seek(start)
        shutil.copyfileobj(fin, fout, 1 << 22)
    os.replace(tmp, dest)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dest", required=True)
    ap.add_argument("--disk-gb", type=float, default=0)
    ap.add_argument("--path")
    ap.add_argument("--hf-repo")
    ap.add_argument("--hf-revision")
    ap.add_argument("--checksums", default="SHA256SUMS")
    ap.add_argument("--eagle3-draft", action="store_true")
    args = ap.parse_args()
    served = Path(args.dest)
    # An EAGLE-3 draft is fetched beside the served copy, which conversion writes.
    dest = served.with_name(served.name + ".source") if args.eagle3_draft else served
    source = {"path": args.path} if args.path else {"hf_repo": args.hf_repo, "hf_revision": args.hf_revision}
    if args.eagle3_draft:
        return stage_draft(args, dest, served, source)
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


def stage_draft(args, source_dir: Path, served: Path, source: dict) -> int:
    """An EAGLE-3 draft: the verified source in SOURCE_DIR, the served copy in SERVED."""
    marker = served / MARKER
    try:
        staged = json.loads(marker.read_text())
        if staged.get("source") == source:
            print(json.dumps({"changed": False, "msg": f"{served}: present and verified",
                              "key_mapping": staged.get("key_mapping", {})}))
            return 0
    except (OSError, ValueError):
        pass
    argv = [sys.executable, __file__, "--dest", str(source_dir), "--disk-gb", str(args.disk_gb),
            "--checksums", args.checksums]
    argv += ["--path", args.path] if args.path else ["--hf-repo", args.hf_repo, "--hf-revision", args.hf_revision]
    fetched = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    if fetched.returncode != 0:
        print(fetched.stdout.strip().splitlines()[-1] if fetched.stdout.strip() else
              json.dumps({"changed": True, "msg": f"{source_dir}: staging failed"}))
        return 1
    marker.unlink(missing_ok=True)
    try:
        converted = convert_draft(source_dir, served, checksums=args.checksums)
    except (ValueError, OSError) as exc:
        print(json.dumps({"changed": True, "msg": f"{served}: draft refused: {exc}"}))
        return 1
    marker.write_text(json.dumps({"source": source, "from": str(source_dir), **converted}, indent=2, sort_keys=True))
    how = "converted (layers.0.* -> midlayer.*)" if converted["key_mapping"] else "copied (already midlayer.*)"
    print(json.dumps({"changed": True, "msg": f"{served}: EAGLE-3 draft {how} and verified",
                      "key_mapping": converted["key_mapping"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
