"""Packaging, version, configs, model shapes."""

import copy
import os
import re
import zipfile

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("runs in the compiler tier (no kernel runs here)", allow_module_level=True)

from sm120_kernels import configs  # noqa: E402
from sm120_kernels.models import DEEPSEEK_V4_FLASH, KIMI_K25, ep_share_routing  # noqa: E402


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


def test_configs_ship_h200_and_default():
    """A device without its own file (every RTX PRO 6000: untuned) loads
    default.json; a file equal to default.json would only repeat it."""
    files = configs.shipped_files()
    assert files == ["NVIDIA_H200.json", "default.json"]
    assert configs.file_for_device("NVIDIA H200") == "NVIDIA_H200.json"
    for name in ("NVIDIA RTX PRO 6000 Blackwell Server Edition",
                 "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                 "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "Some Other GPU", None):
        assert configs.file_for_device(name) == "default.json", name
    default = {k: v for k, v in configs.load_file("default.json").items() if not k.startswith("_")}
    for f in files:
        data = configs.load_file(f)
        for fmt in ("nvfp4", "int4"):
            for b in (1, 8, 32, 64, 4096):
                cfg = configs.pick(data, fmt, b)
                # packed weights (every supported model) run on the fragment kernel
                assert cfg["gate_up"]["kernel"] == cfg["down"]["kernel"] == "frag"
                assert cfg["gate_up"]["NT"] == cfg["down"]["NT"]
        if f != "default.json":
            assert {k: v for k, v in configs.load_file(f).items() if not k.startswith("_")} != default, f


def test_every_config_key_is_shipped():
    """An option stays only while a shipped file uses it: every key validate()
    accepts appears in some shipped MoE file."""
    used_gemm, used_bucket = set(), set()
    for f in configs.shipped_files():
        for fmt, buckets in configs.load_file(f).items():
            if fmt.startswith("_"):
                continue
            for bucket in buckets.values():
                used_bucket |= set(bucket)
                used_gemm |= set(bucket["gate_up"]) | set(bucket["down"])
    assert used_gemm == configs.GEMM_KEYS and used_bucket == configs.BUCKET_KEYS


@pytest.mark.parametrize("where,key", [("bucket", "inline_align"), ("bucket", "combine_in_down"),
                                       ("bucket", "direct"), ("down", "direct_programs_per_sm")])
def test_config_rejects_unknown_keys(where, key):
    """A key no shipped file uses is refused when the file loads, naming it."""
    data = copy.deepcopy(configs.load_file("default.json"))
    bucket = data["int4"]["64"]
    (bucket if where == "bucket" else bucket[where])[key] = True
    with pytest.raises(ValueError, match=r"bad.json: int4.*unknown keys \['" + key):
        configs.validate("bad.json", data)


def test_config_rejects_other_kernels():
    data = copy.deepcopy(configs.load_file("default.json"))
    data["nvfp4"]["1"]["gate_up"]["kernel"] = "mma"
    with pytest.raises(ValueError, match=r"bad.json: nvfp4/gate_up: unknown kernel 'mma'"):
        configs.validate("bad.json", data)


@pytest.mark.parametrize("value", ["yes", ["gate_up", "align"], 1])
def test_config_rejects_unknown_dependent_launches(value):
    """dependent_launches is true, false or a list of the launches that can
    wait on the one before; anything else is refused when the file loads,
    naming the file, the format and the value."""
    data = copy.deepcopy(configs.load_file("default.json"))  # the loaded file is cached: not this one
    configs.validate("default.json", {**data, "int4": {**data["int4"], "64": {**data["int4"]["64"],
                                                                          "dependent_launches": ["gate_up"]}}})
    data["int4"]["64"]["dependent_launches"] = value
    with pytest.raises(ValueError, match=r"bad.json: int4: dependent_launches .*" + re.escape(repr(value))):
        configs.validate("bad.json", data)


@pytest.mark.parametrize("dep", [False, ["gate_up", "combine"]])
def test_config_block_ready_needs_a_dependent_down(dep):
    """block_ready (the down GEMM waiting per expert block) is refused unless
    the down GEMM is a dependent launch, naming the file and the format."""
    data = copy.deepcopy(configs.load_file("default.json"))
    bucket = data["nvfp4"]["64"]
    bucket["block_ready"] = True
    bucket["dependent_launches"] = ["gate_up", "down"]
    configs.validate("ok.json", data)
    bucket["dependent_launches"] = dep
    with pytest.raises(ValueError, match=r"bad.json: nvfp4: block_ready needs the down GEMM"):
        configs.validate("bad.json", data)


@pytest.mark.parametrize("value", [0, 2.5, True, "8"])
def test_config_walkers_is_a_positive_count(value):
    """A GEMM's walkers (the most block walkers per row tile) is a whole
    number from 1 on; anything else is refused when the file loads, naming the
    file, the format, the GEMM and the value."""
    data = copy.deepcopy(configs.load_file("default.json"))
    data["nvfp4"]["64"]["down"]["walkers"] = 8
    configs.validate("ok.json", data)
    data["nvfp4"]["64"]["down"]["walkers"] = value
    with pytest.raises(ValueError, match=r"bad.json: nvfp4/down: walkers is a whole number .*" + re.escape(repr(value))):
        configs.validate("bad.json", data)


def test_block_ready_only_for_a_dependent_register_path_down():
    """block_ready applies where the down GEMM is a dependent launch reading
    its rows with plain loads, not through a ring's bulk copies."""
    from sm120_kernels import fused_moe_w4a16_frag as F

    reg = {"NT": 1, "num_warps": 1, "pipe": False, "depth": 2, "RT": 2}
    ring = {**reg, "depth": 4, "bulk": 2}
    assert F.block_ready({"block_ready": True, "down": reg}, frozenset({"gate_up", "down"}), 32)
    assert not F.block_ready({"block_ready": True, "down": reg}, frozenset({"gate_up"}), 32)
    assert not F.block_ready({"block_ready": True, "down": ring}, frozenset({"gate_up", "down"}), 32)
    assert not F.block_ready({"down": reg}, frozenset({"gate_up", "down"}), 32)


def test_dependent_launches_stay_off_without_a_gpu():
    """The interpreter and CPU tensors never launch dependent kernels, whatever
    the config says."""
    from sm120_kernels import fused_moe_w4a16_frag as F

    cfg = {"dependent_launches": True, "gate_up": {}, "down": {"NT": 1, "num_warps": 4, "pipe": True, "pdl": 0}}
    assert F.dependent_launches(cfg, torch.device("cpu")) == frozenset()
    assert not F.dependent_down(cfg["down"], 32, torch.device("cpu"))


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


@pytest.mark.parametrize("batch", [1, 8])
def test_tune_picks_fastest_and_tries_one_token_grids(monkeypatch, batch):
    """bench --tune keeps the fastest candidate per GEMM, then at batch 1 the
    fastest one-token grid (direct_split 1, 2, 3, top_k, the rule), then the
    fastest register cap on it (other batches get
    no one-token or register-cap keys), then per GEMM the shared-memory rings
    (at batch 1 for the down GEMM also prefetching ones), last the dependent
    launches (at batch 1 none: the prefetching down GEMM already is one).
    Timings are faked from the config under trial (no GPU)."""
    from types import SimpleNamespace

    from sm120_kernels import bench
    from sm120_kernels import moe_cases as M
    from sm120_kernels.models import MODELS

    model = next(m for m in MODELS if m.fmt == "int4")
    key = (model.fmt, batch)
    tried = []

    def fake_time(cfg):
        gu, down = cfg["gate_up"], cfg["down"]
        t = 100.0 - 5 * gu["num_warps"] / 16 - 3 * down.get("RT", 1) - 2 * down.get("depth", 1)
        t -= {None: 0, 1: 1, 2: 4, 3: 2, model.top_k: 3}[gu.get("direct_split")]
        t -= 0.5 * bool(gu.get("maxnreg")) + 0.25 * bool(gu.get("scales_ahead"))
        t -= 5 * bool(down.get("maxnreg") and not down.get("bulk")) - 0.25 * bool(down.get("scales_ahead"))
        t -= 1 * bool(gu.get("bulk")) - 1 * bool(down.get("bulk"))  # the rings: faster on the gate/up only,
        t -= 7 * bool(down.get("prefetch")) + 0.1 * down["num_warps"] / 8  # and prefetching ones on the down
        dep = cfg.get("dependent_launches")
        t -= 0.5 * (dep is True) + 0.7 * isinstance(dep, list) + 0.3 * (down.get("pdl") is not None)
        return t

    def make(dev):
        cfg = M._BENCH_CONFIG_OVERRIDE[key]
        tried.append(cfg)
        return SimpleNamespace(stream_calls=[cfg], fn=None)

    monkeypatch.setattr(bench, "stream_time_us", lambda calls, **kw: (fake_time(calls[0]), 16))
    monkeypatch.setitem(M._BENCH_CONFIG_OVERRIDE, key, None)
    case = SimpleNamespace(name=f"moe b{batch}", group=model.name, batch=batch, make=make)
    best = bench._tune(case, "cpu", None)
    # the fake timing favours the most warps, RT 2 and the deepest ring (4)
    assert best["gate_up"]["num_warps"] == 16 and best["down"]["RT"] == 2
    assert best["down"]["depth"] == 4
    # last, every batch: the rings, kept on the gate/up (scales_ahead and the cap
    # dropped); at batch 1 the prefetching down GEMM with 8 warps (one stage)
    assert best["gate_up"]["bulk"] == 2 and best["gate_up"]["depth"] == 2
    assert "scales_ahead" not in best["gate_up"] and "maxnreg" not in best["gate_up"]
    assert any(c["down"].get("bulk") == 2 and c["down"]["depth"] == 2 for c in tried)
    if batch == 1:
        assert {k: best["down"].get(k) for k in ("bulk", "depth", "num_warps", "prefetch", "maxnreg")} == dict(
            bulk=1, depth=4, num_warps=8, prefetch=True, maxnreg=104)
        assert not any(c.get("dependent_launches") or "pdl" in c["down"] for c in tried)
    else:
        assert "bulk" not in best["down"] and not any(c["down"].get("prefetch") for c in tried)
        assert any(c.get("dependent_launches") is True for c in tried)
        assert best["dependent_launches"] == ["gate_up", "down"]
    if batch == 1:
        assert best["gate_up"]["direct_split"] == 2
        # before them, the register cap on that grid, per GEMM: the gate/up with
        # the scales decoded ahead, the down GEMM without (as the fake timing
        # favours; the rings then drop both keys)
        assert any(c["gate_up"].get("scales_ahead") and c["gate_up"].get("maxnreg") == 128 for c in tried)
        assert any(c["down"].get("maxnreg") == 128 and "scales_ahead" not in c["down"] and c["down"]["depth"] == 2
                   and not c["down"].get("bulk") for c in tried)
        splits = {c["gate_up"].get("direct_split") for c in tried}
        assert splits == {None, 1, 2, 3, model.top_k}
    else:
        assert all("direct_split" not in c["gate_up"] for c in tried)
        assert all("maxnreg" not in c["gate_up"] and "maxnreg" not in c["down"] for c in tried)
    assert M._BENCH_CONFIG_OVERRIDE[key] == best


def test_exchange_trials():
    from sm120_kernels import bench

    cfg = {"gate_up": {"kernel": "frag", "NT": 1, "num_warps": 4, "pipe": True},
           "down": {"kernel": "frag", "NT": 1, "num_warps": 2, "pipe": False, "RT": 2}}
    trials = bench.exchange_trials(cfg, 8)
    assert trials[0] == cfg
    assert [(bool(t["gate_up"].get("exchange")), bool(t["down"].get("exchange"))) for t in trials] == [
        (False, False), (False, True), (True, False), (True, True)]
    assert bench.exchange_trials(cfg, 1) == [cfg]  # one token: the direct path has no such epilogue
    nt2 = {p: {**c, "NT": 2} for p, c in cfg.items()}
    assert bench.exchange_trials(nt2, 64) == [nt2]  # 16-token blocks keep the per-register reductions
    both = {p: {**c, "exchange": True} for p, c in cfg.items()}
    # from an incumbent with both on: it first, then the other three (not itself twice)
    assert [(bool(t["gate_up"].get("exchange")), bool(t["down"].get("exchange")))
            for t in bench.exchange_trials(both, 8)] == [(True, True), (False, False), (False, True), (True, False)]


def test_dependent_trials():
    """The tuner's last stage: one token's down GEMM on the register path tries
    pdl (0 and 1 K steps asked of L2), a prefetching ring down GEMM nothing
    more; several tokens (or 16-token blocks at one token) try the dependent
    launches, all or the GEMMs only, each also with block_ready where the
    down GEMM runs on the register path."""
    from sm120_kernels import bench

    reg = {"gate_up": {"num_warps": 8}, "down": {"num_warps": 4, "pipe": True}}
    ring = {**reg, "down": {"num_warps": 8, "bulk": 1, "prefetch": True}}
    assert [t["down"].get("pdl") for t in bench.dependent_trials(reg, 1)] == [None, 0, 1]
    assert bench.dependent_trials(ring, 1) == [ring]
    nt2 = {"gate_up": {"NT": 2, "num_warps": 8}, "down": {"NT": 2, "num_warps": 4, "pipe": True}}
    for cfg, batch in ((reg, 8), (reg, 32), (nt2, 1)):
        trials = bench.dependent_trials(cfg, batch)
        gu_down = ["gate_up", "down"]
        assert [(t.get("dependent_launches"), t.get("block_ready")) for t in trials] == [
            (None, None), (True, None), (gu_down, None), (True, True), (gu_down, True)]
    # block_ready is not tried where the down GEMM runs through rings
    ring8 = {**reg, "down": {"num_warps": 1, "bulk": 2}}
    assert not any(t.get("block_ready") for t in bench.dependent_trials(ring8, 8))
