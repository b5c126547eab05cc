"""The EAGLE-3 draft check of roles/sglang_release/files/stage_model.py against the pinned SGLang
0.5.23 (run with .venv-sglang: make test-drafts). Small drafts written here (configs with tiny
dimensions, safetensors of zeros) go through SGLang's own class choice, construction on the meta
device and load_weights(): the layouts 0.5.23 loads pass; a typo'd name, a shape its loader
refuses, and GQA names given to the MLA draft class are refused, listed. Staging end to end:
the draft is served as published (no copy), the marker keeps the check."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / "roles/sglang_release/files/stage_model.py"
sys.dont_write_bytecode = True
_spec = importlib.util.spec_from_file_location("stage_model", STAGE)
stage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stage)

H, I, V, DV = 64, 96, 256, 128  # hidden, MLP, vocabulary, draft vocabulary
EAGLE = {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True}
# LlamaForCausalLMEagle3: 4 query heads, 2 KV heads of 16 (SpecForge / lightseekorg layout)
LLAMA = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
         "intermediate_size": I, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": DV, "max_position_embeddings": 4096,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
         "torch_dtype": "bfloat16", "eagle_config": EAGLE}
# Eagle3DeepseekV2ForCausalLM with model_type kimi_k2, as NVIDIA ModelOpt exports a Kimi-K2 draft
# (its kimik2 template); MLA ranks and heads shrunk, Kimi-K2's YaRN rope.
MLA = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2", "hidden_size": H,
       "intermediate_size": I, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
       "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
       "vocab_size": V, "draft_vocab_size": DV, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
       "rope_theta": 50000.0, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                               "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
       "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16", "eagle_config": EAGLE}
TOP = {"fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (DV, H), "d2t": (DV,), "t2d": (V,)}
NORMS = {"hidden_norm.weight": (H,), "input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
         "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H), "mlp.down_proj.weight": (H, I)}
GQA = {"self_attn.q_proj.weight": (64, 2 * H), "self_attn.k_proj.weight": (32, 2 * H),
       "self_attn.v_proj.weight": (32, 2 * H), "self_attn.o_proj.weight": (H, 64)}
MLA_ATTN = {"self_attn.q_a_proj.weight": (32, 2 * H), "self_attn.q_a_layernorm.weight": (32,),
            "self_attn.q_b_proj.weight": (4 * 16, 32), "self_attn.kv_a_proj_with_mqa.weight": (16 + 8, 2 * H),
            "self_attn.kv_a_layernorm.weight": (16,), "self_attn.kv_b_proj.weight": (4 * 16, 16),
            "self_attn.o_proj.weight": (H, 4 * 8)}


def _draft(directory: Path, config: dict, layer: dict, prefix: str = "layers.0.", rename=None, reshape=None) -> Path:
    shapes = {**TOP, **{prefix + name: shape for name, shape in {**NORMS, **layer}.items()}}
    shapes = {(rename or {}).get(name, name): (reshape or {}).get(name, shape) for name, shape in shapes.items()}
    dtype = {"d2t": torch.int64, "t2d": torch.bool}
    directory.mkdir(parents=True)
    save_file({name: torch.zeros(shape, dtype=dtype.get(name, torch.bfloat16)) for name, shape in shapes.items()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    subprocess.run("sha256sum config.json model.safetensors > SHA256SUMS", shell=True, cwd=directory, check=True)
    return directory


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """Staging end to end in a child process, started first: it imports SGLang (about 30 s)
    while the tests below check drafts in this process."""
    root = tmp_path_factory.mktemp("staging")
    src = _draft(root / "share", MLA, MLA_ATTN)
    dest = root / "models" / "kimi-draft"
    dest.parent.mkdir()
    argv = [sys.executable, str(STAGE), "--dest", str(dest), "--path", str(src), "--eagle3-draft"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    yield argv, dest, src, root, proc


@pytest.mark.parametrize("config, layer, prefix, cls", [
    (LLAMA, GQA, "layers.0.", "sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3"),
    # 0.5.23's Llama loader still maps the legacy midlayer.* names
    (LLAMA, GQA, "midlayer.", "sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3"),
    # the MLA class maps layers.0.* to its own midlayer.*, q_a_proj + kv_a_proj_with_mqa fused
    (MLA, MLA_ATTN, "layers.0.", "sglang.srt.models.kimi_k25_eagle3.Eagle3DeepseekV2ForCausalLM"),
])
def test_a_layout_sglang_loads_passes(tmp_path, staged, config, layer, prefix, cls):
    check = stage.draft_name_check(_draft(tmp_path / "d", config, layer, prefix))
    assert check["class"] == cls and check["architecture"] == config["architectures"][0]
    assert check["sglang_version"] == "0.5.23" and check["tensors"] == len(TOP) + len(NORMS) + len(layer)
    assert (check["unmatched"], check["shape_mismatches"], check["missing"]) == ([], [], [])
    assert stage.draft_problems(check) == []


def test_a_typo_is_an_unmatched_name(tmp_path, staged):
    check = stage.draft_name_check(_draft(tmp_path / "d", LLAMA, GQA,
                                          rename={"layers.0.mlp.up_proj.weight": "layers.0.mlp.up_prj.weight"}))
    assert check["unmatched"] == ["layers.0.mlp.up_prj.weight"] and check["shape_mismatches"] == []


def test_a_shape_the_loader_refuses_is_listed(tmp_path, staged):
    check = stage.draft_name_check(_draft(tmp_path / "d", LLAMA, GQA, reshape={"fc.weight": (H, 2 * H)}))
    assert check["unmatched"] == []
    assert check["shape_mismatches"] == [
        "fc.weight [64, 128] -> model.fc.weight [64, 192]: Attempted to load weight ((64, 128)) into parameter "
        "(torch.Size([64, 192]))"]
    assert check["missing"] == ["model.fc.weight"]


def test_gqa_names_under_the_mla_class_are_refused(tmp_path, staged):
    """A Llama-layout draft whose config declares the MLA class: 0.5.23 would skip its attention."""
    check = stage.draft_name_check(_draft(tmp_path / "d", MLA, GQA))
    assert check["class"] == "sglang.srt.models.kimi_k25_eagle3.Eagle3DeepseekV2ForCausalLM"
    assert check["unmatched"] == ["layers.0.self_attn.k_proj.weight", "layers.0.self_attn.q_proj.weight",
                                  "layers.0.self_attn.v_proj.weight"]
    assert "model.midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight" in check["missing"]
    assert "model.midlayer.self_attn.o_proj.weight" not in check["missing"]


def test_staging_serves_the_draft_as_published_and_marks_the_check(staged):
    argv, dest, src, root, proc = staged
    out = proc.communicate()[0]
    assert proc.returncode == 0, out
    result = json.loads(out.splitlines()[-1])
    assert result["changed"] and result["msg"] == (
        f"{dest}: EAGLE-3 draft verified; its 18 tensors all load into Eagle3DeepseekV2ForCausalLM (SGLang 0.5.23)")
    assert (dest / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["kimi-draft"]
    marker = json.loads((dest / stage.MARKER).read_text())
    assert marker["source"] == {"path": str(src)} and marker["draft_check"] == result["draft_check"]
    # Again: the marker's passed check of this SGLang version stands (a new check would fail here:
    # the child's torch does not import).
    broken = root / "site" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('torch is not imported for a recorded check')\n")
    again = subprocess.run(argv, capture_output=True, text=True, check=False,
                           env={**os.environ, "PYTHONPATH": str(root / "site")})
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout.splitlines()[-1])["changed"] is False


def test_staging_refuses_a_draft_with_a_name_sglang_skips(tmp_path, staged, monkeypatch, capsys):
    """The refusal staging prints, with this process's check (the child above shows the process
    boundary): the host and variable, the class, the names, the fix; no check in the marker."""
    dest = _draft(tmp_path / "kimi-draft", LLAMA, GQA, rename={"layers.0.mlp.gate_proj.weight": "layers.0.mlp.gate_prj.weight"})
    monkeypatch.setattr(stage, "run_draft_check", stage.draft_name_check)
    args = argparse.Namespace(where="engine-1 sglang_model_recipes['kimi-k2.5-int4'].speculative", trust_remote_code=False)
    assert stage.check_draft(args, dest, {"source": {"path": "/srv/share"}}, True) == 1
    msg = json.loads(capsys.readouterr().out.splitlines()[-1])["msg"]
    assert msg.startswith(f"engine-1 sglang_model_recipes['kimi-k2.5-int4'].speculative: {dest}: draft refused: "
                          "SGLang 0.5.23 loads it as LlamaForCausalLMEagle3 "
                          "(sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3)")
    assert "(SGLang skips them without an error) 1: layers.0.mlp.gate_prj.weight" in msg
    assert "Fix: pin a draft (draft_hf_repo, draft_hf_revision)" in msg
    assert not (dest / stage.MARKER).exists()
