"""EAGLE-3 draft staging (roles/sglang_release/files/stage_model.py): a draft written with
`layers.0.*` is served as `midlayer.*` from a converted, verified copy; the source stays as it
was; a draft whose keys are neither is refused. The drafts are small checkpoints this test
writes with the safetensors package."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / "roles/sglang_release/files/stage_model.py"
sys.dont_write_bytecode = True
stage = load("stage_model", STAGE)

LAYER = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.o_proj.weight",
         "mlp.gate_proj.weight", "input_layernorm.weight", "hidden_norm.weight"]
TOP = ["fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"]


def _draft(directory: Path, prefix: str, extra=()) -> dict:
    rng = np.random.default_rng(0)
    tensors = {prefix + name: rng.standard_normal((4, 8)).astype(np.float16) for name in LAYER}
    tensors.update({name: rng.standard_normal((4, 8)).astype(np.float32) for name in TOP[:3]})
    tensors["d2t"] = np.arange(16, dtype=np.int64)
    tensors["t2d"] = np.ones(32, dtype=np.bool_)
    tensors.update({name: np.zeros((2, 2), dtype=np.float16) for name in extra})
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    return tensors


def _tree(directory: Path) -> dict:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_layers0_draft_is_served_as_midlayer_from_a_converted_copy(tmp_path):
    src, dest = tmp_path / "draft.source", tmp_path / "draft"
    tensors = _draft(src, "layers.0.")
    before = _tree(src)
    manifest = stage.convert_draft(src, dest)
    # Converted keys, the same tensors.
    served = load_file(str(dest / "model.safetensors"))
    assert sorted(served) == sorted([f"midlayer.{n}" for n in LAYER] + TOP)
    for name, value in tensors.items():
        new = name.replace("layers.0.", "midlayer.", 1)
        assert served[new].dtype == value.dtype and np.array_equal(served[new], value)
    assert manifest["key_mapping"] == {"layers.0.": "midlayer."}
    # Checksums: the manifest's and SHA256SUMS name the served files; the tensors' bytes are the source's.
    assert manifest["files"] == {k: v for k, v in _tree(dest).items() if k != "SHA256SUMS"}
    assert (dest / "SHA256SUMS").read_text().splitlines() == [
        f"{digest}  {name}" for name, digest in sorted(manifest["files"].items())]
    assert stage.tensor_digests(dest / "model.safetensors") == {
        k.replace("layers.0.", "midlayer.", 1): v for k, v in stage.tensor_digests(src / "model.safetensors").items()}
    assert (dest / "config.json").read_bytes() == (src / "config.json").read_bytes()
    # The source is untouched.
    assert _tree(src) == before
    assert sorted(load_file(str(src / "model.safetensors"))) == sorted(tensors)


def test_midlayer_draft_is_copied_as_it_is(tmp_path):
    src, dest = tmp_path / "draft.source", tmp_path / "draft"
    _draft(src, "midlayer.")
    manifest = stage.convert_draft(src, dest)
    assert manifest["key_mapping"] == {}
    assert (dest / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


@pytest.mark.parametrize("prefix, extra, unknown", [
    ("model.layers.0.", (), "model.layers.0.hidden_norm.weight"),
    ("layers.0.", ("layers.1.self_attn.q_proj.weight",), "layers.1.self_attn.q_proj.weight"),
    ("midlayer.", ("layers.0.mlp.up_proj.weight",), "layers.0.mlp.up_proj.weight"),
])
def test_a_draft_with_other_keys_is_refused(tmp_path, prefix, extra, unknown):
    src, dest = tmp_path / "draft.source", tmp_path / "draft"
    _draft(src, prefix, extra)
    before = _tree(src)
    with pytest.raises(ValueError, match="keys neither midlayer.\\* nor layers.0.\\* of an EAGLE-3 draft: .*"
                       + unknown.replace(".", "\\.")):
        stage.convert_draft(src, dest)
    assert not (dest / "model.safetensors").exists()
    assert _tree(src) == before


def test_staging_a_draft_end_to_end_records_the_mapping(tmp_path):
    """--eagle3-draft with a local source: verified into <dest>.source, served from <dest>."""
    src = tmp_path / "share"
    _draft(src, "layers.0.")
    subprocess.run("sha256sum config.json model.safetensors > SHA256SUMS", shell=True, cwd=src, check=True)
    dest = tmp_path / "models" / "kimi-draft"
    dest.parent.mkdir()
    argv = [sys.executable, str(STAGE), "--dest", str(dest), "--path", str(src), "--eagle3-draft"]
    first = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    result = json.loads(first.stdout.splitlines()[-1])
    assert result["changed"] and "converted (layers.0.* -> midlayer.*)" in result["msg"]
    assert result["key_mapping"] == {"layers.0.": "midlayer."}
    marker = json.loads((dest / stage.MARKER).read_text())
    assert marker["source"] == {"path": str(src)} and marker["key_mapping"] == {"layers.0.": "midlayer."}
    assert marker["files"]["model.safetensors"] == hashlib.sha256((dest / "model.safetensors").read_bytes()).hexdigest()
    assert (tmp_path / "models" / "kimi-draft.source" / "model.safetensors").is_file()
    again = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    skipped = json.loads(again.stdout.splitlines()[-1])
    assert not skipped["changed"] and skipped["key_mapping"] == {"layers.0.": "midlayer."}


def test_weights_pushed_into_dest_are_verified_in_place(tmp_path):
    """--path naming DEST itself (weights pushed there from the offline bundle): no copy, every
    sum checked; a draft pushed into <dest>.source is converted from there."""
    dest = tmp_path / "models" / "recipe"
    _draft(dest, "midlayer.")
    subprocess.run("sha256sum config.json model.safetensors > SHA256SUMS", shell=True, cwd=dest, check=True)
    argv = [sys.executable, str(STAGE), "--dest", str(dest), "--path", str(dest)]
    staged = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert "rsync" not in staged.stderr and "staged and verified" in staged.stdout
    assert json.loads((dest / stage.MARKER).read_text())["source"] == {"path": str(dest)}
    # a pushed file that differs from the sums is refused
    (dest / stage.MARKER).unlink()
    (dest / "config.json").write_text("{}")
    refused = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and "config.json: sha256 differs from SHA256SUMS" in refused.stdout

    draft = tmp_path / "models" / "recipe-draft"
    _draft(draft.with_name("recipe-draft.source"), "layers.0.")
    subprocess.run("sha256sum config.json model.safetensors > SHA256SUMS", shell=True,
                   cwd=draft.with_name("recipe-draft.source"), check=True)
    argv = [sys.executable, str(STAGE), "--dest", str(draft), "--path", str(draft.with_name("recipe-draft.source")),
            "--eagle3-draft"]
    converted = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert converted.returncode == 0, converted.stdout + converted.stderr
    assert "rsync" not in converted.stderr
    served = load_file(str(draft / "model.safetensors"))
    assert sorted(served) == sorted(["midlayer." + name for name in LAYER] + TOP)
