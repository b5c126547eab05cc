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


def _interpreter_patches_once() -> None:
    """Triton's interpreter re-patches triton.language on every call of a
    @triton.jit helper (InterpretedFunction.__call__ -> _patch_lang), scanning
    each module with inspect.getmembers although nothing is left to patch
    after the first scan (the slowest fragment-kernel cases spent a fifth of
    their time there). Scan each module once until a launch restores the
    originals. Only where the
    interpreter has the functions this relies on; otherwise the tier is just
    slower."""
    try:
        from triton.runtime import interpreter as I
    except ImportError:
        return
    if not (callable(getattr(I, "_patch_builtin", None)) and hasattr(getattr(I, "_LangPatchScope", None), "restore")):
        return
    patch_builtin, restore = I._patch_builtin, I._LangPatchScope.restore
    patched = set()

    def patch_builtin_once(pkg, builder, scope):
        if id(pkg) not in patched:  # after a scan no builtin is left in pkg
            patch_builtin(pkg, builder, scope)
            patched.add(id(pkg))

    def restore_all(self):
        patched.clear()  # the originals are back: the next call scans again
        restore(self)

    I._patch_builtin, I._LangPatchScope.restore = patch_builtin_once, restore_all


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreter_patches_once()


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
