"""Test setup: the tests import sm120_kernels from the wheel built from this
tree (so the entry point and version metadata are the shipped ones), unpacked
into a temporary site directory. scripts/test-cpu.sh sets TRITON_INTERPRET=1."""

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]


def _build_site() -> Path:
    site = os.environ.get("SM120_TEST_SITE")
    if site:
        return Path(site)
    tmp = Path(tempfile.mkdtemp(prefix="sm120-kernels-test-"))
    out = subprocess.run(
        [sys.executable, "-c", "import _build_backend as b, sys; print(b.build_wheel(sys.argv[1]))", str(tmp / "dist")],
        cwd=PKG, check=True, capture_output=True, text=True)
    wheel = tmp / "dist" / out.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp / "site")
    os.environ["SM120_TEST_SITE"] = str(tmp / "site")  # for subprocesses
    os.environ["SM120_TEST_WHEEL"] = str(wheel)
    return tmp / "site"


SITE = _build_site()
sys.path.insert(0, str(SITE))


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def interpret():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU kernel tests run under TRITON_INTERPRET=1 (scripts/test-cpu.sh)")
