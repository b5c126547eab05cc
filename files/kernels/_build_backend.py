"""setuptools' PEP 517 backend plus two steps: write src/sm120_kernels/_version.py,
and drop files from setuptools' build/lib whose source is gone (it never removes
them, so a deleted module or config would still ship in the wheel).

The version is BASE+g<tree> where <tree> is the short git object id of the
committed files/kernels tree (HEAD:files/kernels, which changes exactly when
this package's sources change) and ".dirty" is appended when the working tree
differs from it. Outside this repository's git checkout (an sdist, a git archive) the
existing _version.py is kept, or BASE+unknown written.
"""

import os
import subprocess
from pathlib import Path

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F401,F403

BASE = "0.1.0"
HERE = Path(__file__).resolve().parent
VERSION_FILE = HERE / "src" / "sm120_kernels" / "_version.py"


def _git(*args):
    return subprocess.run(["git", *args], cwd=HERE, check=True, capture_output=True, text=True).stdout.strip()


def compute_version() -> str | None:
    try:
        # Only this repository's own checkout: an unpacked git archive may sit inside another.
        if Path(_git("rev-parse", "--show-toplevel")).resolve() != HERE.parents[1]:
            return None
        prefix = _git("rev-parse", "--show-prefix").rstrip("/")
        tree = _git("rev-parse", "--short=10", f"HEAD:{prefix}" if prefix else "HEAD^{tree}")
        dirty = _git("status", "--porcelain", "--untracked-files=all", "--", ".")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    return f"{BASE}+g{tree}" + (".dirty" if dirty else "")


def write_version_file() -> str:
    version = os.environ.get("SM120_KERNELS_VERSION") or compute_version()
    if version is None:
        if VERSION_FILE.exists():
            return VERSION_FILE.read_text()
        version = f"{BASE}+unknown"
    text = f'# written by _build_backend.py at build time\n__version__ = "{version}"\n'
    if not VERSION_FILE.exists() or VERSION_FILE.read_text() != text:
        VERSION_FILE.write_text(text)
    return version


def prune_stale_build() -> None:
    lib = HERE / "build" / "lib"
    for path in sorted(lib.rglob("*"), reverse=True) if lib.is_dir() else ():
        if path.is_file() and not (HERE / "src" / path.relative_to(lib)).is_file():
            path.unlink()


# setuptools reads the version (an attr of _version.py) already when asked for the build
# requirements, so every hook writes the file first.
def get_requires_for_build_wheel(config_settings=None):
    write_version_file()
    return _orig.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    write_version_file()
    return _orig.get_requires_for_build_sdist(config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    write_version_file()
    prune_stale_build()
    return _orig.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    write_version_file()
    return _orig.build_sdist(sdist_directory, config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    write_version_file()
    return _orig.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    write_version_file()
    return _orig.build_editable(wheel_directory, config_settings, metadata_directory)
