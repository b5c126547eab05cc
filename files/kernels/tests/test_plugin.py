"""The SGLang plugin against the real, pinned sglang (0.5.23)."""

import json
import logging
import os

import pytest

if os.environ.get("TRITON_INTERPRET") == "1":
    # no kernel runs here: the compiler tier covers it (and imports sglang once, not twice)
    pytest.skip("runs in the compiler tier", allow_module_level=True)
sglang = pytest.importorskip("sglang")


def test_pinned_sglang():
    from importlib.metadata import version

    assert version("sglang") == "0.5.23"


def test_sglang_loader_discovers_entry_point():
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    plugins = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert "sm120_kernels" in plugins
    func, dist = plugins["sm120_kernels"]
    from sm120_kernels import plugin

    assert func is plugin.register
    assert dist == "sm120-kernels"


def test_hook_targets_exist_with_expected_signatures():
    from sm120_kernels import plugin

    assert plugin.check_targets() == []
    assert len(plugin.HOOK_TARGETS) == 10


def test_signature_check_catches_drift():
    from sm120_kernels import plugin

    saved = dict(plugin.HOOK_TARGETS)
    try:
        plugin.HOOK_TARGETS["sglang.srt.layers.moe.topk.biased_grouped_topk_gpu"] = ["nope"]
        plugin.HOOK_TARGETS["sglang.srt.layers.moe.topk.no_such_function"] = []
        problems = plugin.check_targets(plugin.HOOK_TARGETS)
        assert len(problems) == 2
    finally:
        plugin.HOOK_TARGETS.clear()
        plugin.HOOK_TARGETS.update(saved)


def _registered():
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sm120_kernels import plugin

    return [t for t in HookRegistry._hooks if t in plugin.HOOK_TARGETS or t in plugin.DSV4_HOOK_TARGETS]


def test_without_sm120_nothing_registers(caplog):
    import torch

    from sm120_kernels import plugin

    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 12:
        pytest.skip("this machine has an sm_120 device")
    with caplog.at_level(logging.INFO, logger="sm120_kernels"):
        assert plugin.register() == []
    assert _registered() == []
    assert "not hooking into SGLang" in caplog.text


def _fake_sm120(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (12, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA RTX PRO 6000 Blackwell Server Edition")


def test_sm120_without_selftest_stamp_stays_out(monkeypatch, tmp_path):
    from sm120_kernels import plugin

    _fake_sm120(monkeypatch)
    monkeypatch.setenv("SM120_KERNELS_STAMP", str(tmp_path / "none.json"))
    assert "no self-test stamp" in plugin.why_not()
    assert plugin.register() == []
    # a stamp from another version does not count either
    import triton

    stamp = tmp_path / "old.json"
    stamp.write_text(json.dumps({"version": "0.0.1", "device": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                                 "triton": triton.__version__, "passed": 10, "failed": 0}))
    monkeypatch.setenv("SM120_KERNELS_STAMP", str(stamp))
    assert "version" in plugin.why_not()


def test_sm120_with_passing_stamp_registers_every_target(monkeypatch, tmp_path):
    import triton
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sm120_kernels import __version__, plugin

    _fake_sm120(monkeypatch)
    stamp = tmp_path / "selftest.json"
    plugin.write_stamp(stamp, {"version": __version__, "device": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                               "torch": "x", "triton": triton.__version__, "passed": 18, "failed": 0})
    monkeypatch.setenv("SM120_KERNELS_STAMP", str(stamp))
    saved = {k: list(v) for k, v in HookRegistry._hooks.items()}
    try:
        assert plugin.why_not() is None
        every = {**plugin.HOOK_TARGETS, **plugin.DSV4_HOOK_TARGETS}
        assert sorted(plugin.register()) == sorted(every)
        for target in every:
            types = [ht for ht, _, _ in HookRegistry._hooks[target]]
            assert types == [HookType.AROUND]
    finally:
        HookRegistry._hooks.clear()
        HookRegistry._hooks.update(saved)


def test_disable_switch(monkeypatch):
    from sm120_kernels import plugin

    monkeypatch.setenv("SM120_KERNELS_DISABLE", "1")
    assert plugin.why_not() == "SM120_KERNELS_DISABLE=1"
