"""Stage model weights into the shared model store (outside releases), verified.

    python stage_model.py --dest DIR --disk-gb N (--path SRC | --hf-repo REPO --hf-revision SHA)
                          [--checksums SHA256SUMS] [--eagle3-draft [--trust-remote-code] [--where TEXT]]
                          [--token-stdin]

* --path: rsync from a local or NFS directory (resumable: --partial; progress shown),
  then every line of the checksum file (sha256sum format, inside the weights) is verified.
  A path that is DEST itself (weights pushed there from the offline bundle) is only verified.
* --hf-repo: huggingface_hub's snapshot_download at the pinned commit (resumable), then every
  LFS file is checked against the sha256 the Hub lists. The token: with --token-stdin the
  first line of standard input (how the roles pass it: no command line or environment of a
  process holds it), else huggingface_hub's own (HF_TOKEN, HF_TOKEN_PATH, `hf auth login`).
* --eagle3-draft: DEST is served as an EAGLE-3 draft, as published (no copy, no renaming).
  Once staged and verified, every tensor name and shape of the checkpoint is checked against
  the class this interpreter's SGLang picks for the draft config's architectures, by SGLang's
  own model construction and load_weights() on torch's meta device (no weight is read; see
  draft_name_check). SGLang skips a tensor no parameter takes without an error, so a draft
  with such names, with shapes its loader refuses, or leaving parameters empty is refused.
  The marker records the check, which runs again under another SGLang version.
* Skipped when DEST holds a marker for the same source that a verification wrote (and, for a
  draft, the passed check of this SGLang version).
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

    token = args.token
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


# safetensors dtype names -> torch dtype names (the check builds meta tensors, no data)
SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
                      "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                      "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
# Tensors both 0.5.23 EAGLE-3 loaders (llama_eagle3.py, kimi_k25_eagle3.py) drop on purpose:
# the target-to-draft vocabulary map, which SGLang does not use.
DRAFT_IGNORED = re.compile(r"(^|\.)t2d$")
# Parameters the EAGLE-3 worker takes from the target (eagle_worker_v2.py: set_embed, and
# set_embed_and_head when the draft class sets load_lm_head_from_target).
FROM_TARGET = re.compile(r"^model\.embed_tokens\.")
FROM_TARGET_HEAD = re.compile(r"^lm_head\.")
LISTED = 10


def read_safetensors_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a .safetensors file and the offset where its data starts."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return header, 8 + size


def checkpoint_tensors(directory: Path) -> dict[str, tuple[list[int], str]]:
    """Every tensor of the checkpoint's top-level .safetensors files (where SGLang's loader
    reads them): name -> (shape, safetensors dtype), from the headers alone."""
    tensors = {}
    for shard in sorted(directory.glob("*.safetensors")):
        header, _ = read_safetensors_header(shard)
        tensors.update({name: (info["shape"], info["dtype"]) for name, info in header.items()
                        if name != "__metadata__"})
    return tensors


def listed(items: list[str]) -> str:
    """The first ten of ITEMS and how many there are."""
    more = f" (and {len(items) - LISTED} more)" if len(items) > LISTED else ""
    return f"{len(items)}: " + ", ".join(items[:LISTED]) + more


def _sglang_single_process(draft_dir: Path, trust_remote_code: bool, workdir: str) -> None:
    """The process state SGLang's model classes read when they are built: the published server
    arguments and a one-rank (gloo, file rendezvous: no port) model-parallel world."""
    import torch
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import prepare_server_args

    argv = ["--model-path", str(draft_dir), "--device", "cpu"] + (["--trust-remote-code"] if trust_remote_code else [])
    publish(prepare_server_args(argv), role="scheduler", ranks=SpawnRanks(world_rank=0))
    if not torch.distributed.is_initialized():
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{workdir}/rendezvous")
    if not model_parallel_is_initialized():
        initialize_model_parallel(backend="gloo")


def _rope_stand_in():
    """A context in which SGLang's rotary-embedding builders fall back to a parameterless module
    when they cannot build on this CPU (the CPU builder takes only deepseek_yarn, the generic
    one imports vllm). Rotary embeddings hold buffers, never parameters, so names are unchanged."""
    import contextlib
    import sys as _sys

    from torch import nn

    def fallback(real):
        def build(*args, **kwargs):
            try:
                return real(*args, **kwargs)
            except (AssertionError, ImportError, ModuleNotFoundError):
                return nn.Module()
        return build

    @contextlib.contextmanager
    def patched():
        saved = []
        for name, module in list(_sys.modules.items()):
            if not name.startswith("sglang.srt.") or module is None:
                continue
            for attr in ("get_rope", "get_rope_wrapper", "get_rope_cpu"):
                real = module.__dict__.get(attr)
                if callable(real):
                    saved.append((module, attr, real))
                    setattr(module, attr, fallback(real))
        try:
            yield
        finally:
            for module, attr, real in saved:
                setattr(module, attr, real)

    return patched()


def draft_name_check(draft_dir: Path, trust_remote_code: bool = False) -> dict:
    """Replay SGLang's own loading of the draft in DRAFT_DIR without its weights: the class SGLang
    picks for the config's architectures (as the draft of an EAGLE3 engine) is built on torch's
    meta device, and its own load_weights() is fed meta tensors named and shaped as the
    checkpoint's. Each parameter's weight_loader is wrapped to record which checkpoint tensors
    reach it (names travel with the tensors through the class's renames, stacking and
    concatenation) and to catch the loader's shape errors. Returns the class, the tensors no
    parameter received (`unmatched`), the loader errors (`shape_mismatches`) and the parameters
    no tensor reached (`missing`, less those the EAGLE-3 worker takes from the target)."""
    import tempfile

    tensors = checkpoint_tensors(draft_dir)
    if not tensors:
        raise ValueError(f"{draft_dir}: no tensor in a top-level .safetensors file")
    with tempfile.TemporaryDirectory() as workdir:
        return _draft_name_check(draft_dir, trust_remote_code, workdir, tensors)


def _draft_name_check(draft_dir: Path, trust_remote_code: bool, workdir: str, tensors: dict) -> dict:
    import importlib.metadata

    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    _sglang_single_process(draft_dir, trust_remote_code, workdir)
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model
    from sglang.srt.model_loader.utils import get_model_architecture, set_default_torch_dtype
    from sglang.srt.model_loader.weight_utils import default_weight_loader

    model_config = ModelConfig(model_path=str(draft_dir), trust_remote_code=trust_remote_code,
                               is_draft_model=True, speculative_algorithm="EAGLE3")
    model_class, arch = get_model_architecture(model_config)
    load_config = LoadConfig()
    with _rope_stand_in(), set_default_torch_dtype(model_config.dtype), torch.device("meta"):
        model = _initialize_model(model_config, load_config, _get_quantization_config(model_config, load_config))

    class Named(torch.Tensor):
        """A meta tensor that carries the checkpoint names it was made from."""

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            inputs = tree_flatten((args, kwargs))[0]
            names = frozenset().union(*(x.__dict__.get("names", ()) for x in inputs if isinstance(x, Named)))
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            if not names:
                return out

            def tag(x):
                if (not isinstance(x, torch.Tensor) or isinstance(x, torch.nn.Parameter)
                        or any(x is i for i in inputs)):
                    return x  # an in-place result or a parameter stays as it is
                named = x.as_subclass(Named)
                named.names = names
                return named
            return tree_map(tag, out)

    def named(name: str, shape, dtype: str):
        tensor = torch.empty(shape, dtype=getattr(torch, SAFETENSORS_DTYPES.get(dtype, "float32")),
                             device="meta").as_subclass(Named)
        tensor.names = frozenset({name})
        return tensor

    reached, loaded, errors = set(), set(), []

    def recording(param_name, loader):
        def weight_loader(param, loaded_weight, *args, **kwargs):
            sources = sorted(loaded_weight.__dict__.get("names", ()))
            reached.update(sources)
            try:
                loader(param, loaded_weight, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the class's own loader refused the shape
                errors.append(f"{'+'.join(sources)} {list(loaded_weight.shape)} -> {param_name} "
                              f"{list(param.shape)}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            else:
                loaded.add(param_name)
        return weight_loader

    params = dict(model.named_parameters())
    for param_name, param in params.items():
        param.weight_loader = recording(param_name, getattr(param, "weight_loader", default_weight_loader))
    with torch.device("meta"):
        model.load_weights((name, named(name, shape, dtype)) for name, (shape, dtype) in tensors.items())
    # what the class keeps beside its parameters (hot_token_id from d2t)
    for value in vars(model).values():
        if isinstance(value, Named):
            reached.update(value.names)
    from_target = [FROM_TARGET] + ([FROM_TARGET_HEAD] if getattr(model, "load_lm_head_from_target", False) else [])
    return {
        "architecture": arch,
        "class": f"{model_class.__module__}.{model_class.__qualname__}",
        "sglang_version": importlib.metadata.version("sglang"),
        "tensors": len(tensors),
        "unmatched": sorted(n for n in tensors if n not in reached and not DRAFT_IGNORED.search(n)),
        "shape_mismatches": errors,
        "missing": sorted(n for n in params if n not in loaded and not any(p.search(n) for p in from_target)),
    }


def draft_problems(check: dict) -> list[str]:
    """What makes the check's draft unusable, one sentence each."""
    problems = []
    if check["unmatched"]:
        problems.append(f"checkpoint tensors no parameter of {check['class']} receives "
                        f"(SGLang skips them without an error) {listed(check['unmatched'])}")
    if check["shape_mismatches"]:
        problems.append(f"tensors whose shape {check['class']}'s loader refuses {listed(check['shape_mismatches'])}")
    if check["missing"]:
        problems.append(f"parameters of {check['class']} no checkpoint tensor fills {listed(check['missing'])}")
    return problems


def run_draft_check(draft_dir: Path, trust_remote_code: bool) -> dict:
    """draft_name_check() in a child process of this interpreter (SGLang's process-wide state
    and its log stay out of this one); {"error": ...} when it could not run."""
    argv = [sys.executable, __file__, "--check-draft", str(draft_dir)] + (["--trust-remote-code"] if trust_remote_code else [])
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or [f"exit status {done.returncode}"]
        return {"error": tail[0]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dest")
    ap.add_argument("--disk-gb", type=float, default=0)
    ap.add_argument("--path")
    ap.add_argument("--hf-repo")
    ap.add_argument("--hf-revision")
    ap.add_argument("--checksums", default="SHA256SUMS")
    ap.add_argument("--eagle3-draft", action="store_true")
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--where", default="", help="host and variable named in a refusal")
    ap.add_argument("--token-stdin", action="store_true", help="read the Hugging Face token from standard input")
    ap.add_argument("--check-draft", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.token = (sys.stdin.readline().strip() or None) if args.token_stdin else None
    if args.check_draft:
        try:
            print(json.dumps(draft_name_check(Path(args.check_draft), args.trust_remote_code)))
        except Exception as exc:  # noqa: BLE001 - reported to the staging process as the check's error
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}))
        return 0
    if not args.dest:
        ap.error("--dest is required")
    dest = Path(args.dest)
    source = {"path": args.path} if args.path else {"hf_repo": args.hf_repo, "hf_revision": args.hf_revision}
    marker = dest / MARKER
    try:
        staged = json.loads(marker.read_text())
    except (OSError, ValueError):
        staged = {}
    if staged.get("source") == source and not args.eagle3_draft:
        print(json.dumps({"changed": False, "msg": f"{dest}: present and verified"}))
        return 0
    if staged.get("source") != source:
        if args.eagle3_draft and staged and not (args.path and Path(args.path).resolve() == dest.resolve()):
            # another draft staged here before: its files would sit beside the new ones (and load)
            shutil.rmtree(dest)
        stale = dest.with_name(dest.name + ".source")
        if args.eagle3_draft and (stale / MARKER).is_file():
            shutil.rmtree(stale)  # a staged copy beside the draft that nothing serves
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
        staged = {"source": source}
        changed = True
    else:
        changed = False
    if not args.eagle3_draft:
        print(json.dumps({"changed": True, "msg": f"{dest}: staged and verified"}))
        return 0
    return check_draft(args, dest, staged, changed)


def check_draft(args, dest: Path, staged: dict, changed: bool) -> int:
    """The staged EAGLE-3 draft against the SGLang of this interpreter, once per SGLang version
    (the marker keeps the result); a draft with a name or shape SGLang would not load is refused."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = None
    check = staged.get("draft_check") or {}
    if version is None or check.get("sglang_version") != version or draft_problems(check):
        check = run_draft_check(dest, args.trust_remote_code)
    where = f"{args.where}: " if args.where else ""
    sglang = f"SGLang {version}" if version else "SGLang (not installed for this interpreter)"
    fix = ("Fix: pin a draft (draft_hf_repo, draft_hf_revision) whose tensor names and shapes are the ones "
           f"{sglang} loads for its config's architectures, or switch speculative decoding off for this "
           "recipe (speculative.enabled: false).")
    if "error" in check:
        print(json.dumps({"changed": changed, "msg": f"{where}{dest}: the draft's names could not be checked "
                          f"against {sglang}: {check['error']}. {fix}"}))
        return 1
    problems = draft_problems(check)
    if problems:
        print(json.dumps({"changed": changed, "msg": f"{where}{dest}: draft refused: SGLang {check['sglang_version']} "
                          f"loads it as {check['architecture']} ({check['class']}) and would serve it "
                          f"without these weights: " + "; ".join(problems) + f". {fix}", "draft_check": check}))
        return 1
    if staged.get("draft_check") != check:
        (dest / MARKER).write_text(json.dumps({**staged, "draft_check": check}, indent=2, sort_keys=True))
        changed = True
    print(json.dumps({"changed": changed, "msg": f"{dest}: EAGLE-3 draft verified; its {check['tensors']} tensors "
                      f"all load into {check['architecture']} (SGLang {check['sglang_version']})", "draft_check": check}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
