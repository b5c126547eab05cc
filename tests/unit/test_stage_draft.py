"""EAGLE-3 draft staging (roles/sglang_release/files/stage_model.py), the parts that need no
SGLang: the draft is staged as published (no copy, no renaming); its tensor names and shapes are
read from the safetensors headers; a draft whose names cannot be checked against SGLang is
refused; the refusal lists the first ten names and the count. The check against SGLang 0.5.23
itself runs in tests/drafts (make test-drafts, with .venv-sglang). The drafts are small
checkpoints this test writes with the safetensors package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from repo_module import load

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / "roles/sglang_release/files/stage_model.py"
sys.dont_write_bytecode = True
stage = load("stage_model", STAGE)

LAYER = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.o_proj.weight",
         "mlp.gate_proj.weight", "input_layernorm.weight", "hidden_norm.weight"]


def _draft(directory: Path, prefix: str = "layers.0.") -> dict:
    rng = np.random.default_rng(0)
    tensors = {prefix + name: rng.standard_normal((4, 8)).astype(np.float16) for name in LAYER}
    tensors.update({"fc.weight": rng.standard_normal((4, 24)).astype(np.float32),
                    "norm.weight": np.ones(4, dtype=np.float32), "d2t": np.arange(16, dtype=np.int64)})
    directory.mkdir(parents=True)
    save_file(dict(list(tensors.items())[:4]), str(directory / "model-00001-of-00002.safetensors"))
    save_file(dict(list(tensors.items())[4:]), str(directory / "model-00002-of-00002.safetensors"))
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    subprocess.run("sha256sum config.json *.safetensors > SHA256SUMS", shell=True, cwd=directory, check=True)
    return tensors


def test_checkpoint_tensors_are_read_from_every_shard_header(tmp_path):
    tensors = _draft(tmp_path / "draft")
    (tmp_path / "draft" / "sub").mkdir()
    save_file({"stray.weight": np.zeros(2, dtype=np.float16)}, str(tmp_path / "draft" / "sub" / "x.safetensors"))
    read = stage.checkpoint_tensors(tmp_path / "draft")
    assert read == {name: (list(value.shape), {"float16": "F16", "float32": "F32", "int64": "I64"}[str(value.dtype)])
                    for name, value in tensors.items()}


def test_a_refusal_lists_the_first_ten_names_and_the_count():
    check = {"class": "sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3",
             "unmatched": [f"layers.0.mlp.gate_prj{i}.weight" for i in range(12)],
             "shape_mismatches": ["fc.weight [4, 16] -> model.fc.weight [4, 24]: Attempted to load weight"],
             "missing": []}
    problems = stage.draft_problems(check)
    assert len(problems) == 2
    assert "no parameter of sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3 receives" in problems[0]
    assert "12: layers.0.mlp.gate_prj0.weight, " in problems[0]
    assert "gate_prj9.weight (and 2 more)" in problems[0] and "gate_prj10" not in problems[0]
    assert problems[1].endswith("1: fc.weight [4, 16] -> model.fc.weight [4, 24]: Attempted to load weight")
    assert stage.draft_problems({**check, "unmatched": [], "shape_mismatches": []}) == []


def test_a_draft_sglang_cannot_check_is_refused_and_not_marked(tmp_path):
    """Staged as published, then refused: this interpreter cannot import the SGLang stack (here a
    torch package that fails to import) to check its names; the marker keeps no check."""
    src = tmp_path / "share"
    tensors = _draft(src)
    broken = tmp_path / "site"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text("raise ImportError('no torch in this interpreter')\n")
    dest = tmp_path / "models" / "kimi-draft"
    dest.parent.mkdir()
    argv = [sys.executable, str(STAGE), "--dest", str(dest), "--path", str(src), "--eagle3-draft",
            "--where", "engine-1 sglang_model_recipes['kimi'].speculative"]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(broken)}
    refused = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    result = json.loads(refused.stdout.splitlines()[-1])
    assert result["msg"].startswith(f"engine-1 sglang_model_recipes['kimi'].speculative: {dest}: "
                                    "the draft's names could not be checked")
    assert "against SGLang (not installed for this interpreter): ImportError: no torch in this interpreter. " in result["msg"]
    assert "Fix: pin a draft (draft_hf_repo, draft_hf_revision)" in result["msg"]
    # staged as published: the same files, no second copy beside it
    assert sorted(p.name for p in dest.iterdir()) == sorted([p.name for p in src.iterdir()] + [stage.MARKER])
    assert sorted(p.name for p in dest.parent.iterdir()) == ["kimi-draft"]
    assert stage.checkpoint_tensors(dest) == stage.checkpoint_tensors(src) and len(stage.checkpoint_tensors(dest)) == len(tensors)
    assert json.loads((dest / stage.MARKER).read_text()) == {"source": {"path": str(src)}}


def test_another_draft_staged_before_is_replaced_not_mixed(tmp_path):
    """A draft dir whose marker names another source is emptied before staging (its shards would
    load beside the new ones); a marked DEST.source beside it goes too."""
    old = tmp_path / "models" / "kimi-draft"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"old shard")
    (old / stage.MARKER).write_text(json.dumps({"source": {"hf_repo": "org/old", "hf_revision": "0" * 40}}))
    beside = tmp_path / "models" / "kimi-draft.source"
    beside.mkdir()
    (beside / stage.MARKER).write_text("{}")
    src = tmp_path / "share"
    _draft(src)
    argv = [sys.executable, str(STAGE), "--dest", str(old), "--path", str(src), "--eagle3-draft"]
    subprocess.run(argv, capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert sorted(p.name for p in old.iterdir()) == sorted([p.name for p in src.iterdir()] + [stage.MARKER])
    assert not beside.exists()
    assert json.loads((old / stage.MARKER).read_text())["source"] == {"path": str(src)}


def test_weights_pushed_into_dest_are_verified_in_place(tmp_path):
    """--path naming DEST itself (weights pushed there from the offline bundle): no copy, every
    sum checked."""
    dest = tmp_path / "models" / "recipe"
    _draft(dest)
    argv = [sys.executable, str(STAGE), "--dest", str(dest), "--path", str(dest)]
    staged = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert "rsync" not in staged.stderr and "staged and verified" in staged.stdout
    assert json.loads((dest / stage.MARKER).read_text())["source"] == {"path": str(dest)}
    again = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert again.returncode == 0 and json.loads(again.stdout.splitlines()[-1]) == {
        "changed": False, "msg": f"{dest}: present and verified"}
    # a pushed file that differs from the sums is refused
    (dest / stage.MARKER).unlink()
    (dest / "config.json").write_text("{}")
    refused = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and "config.json: sha256 differs from SHA256SUMS" in refused.stdout
