#!/usr/bin/env python3
"""Start an SGLang engine with its API keys, which no command line, unit or file others can
read holds.

    sglang-engine-launch -m sglang.launch_server --config engines/<name>.yaml
    sglang-engine-launch SCRIPT [ARGS...]

systemd hands the unit's credentials (LoadCredential=) to the service in a directory only it
can read ($CREDENTIALS_DIRECTORY). This reads `api-key` and `admin-api-key` from there, adds
`--api-key` and `--admin-api-key` to the arguments the server parses (sys.argv, inside this
process: /proc/<pid>/cmdline keeps the arguments the unit started), and runs the module or
script as `python -m` or `python SCRIPT` would. SGLang 0.5.23 logs its resolved arguments,
keys included, at start (engine.py's _server_args_for_logging redacts watermark secrets
only): what this process writes to standard output and error has the keys redacted.
"""

from __future__ import annotations

import io
import os
import runpy
import sys
from pathlib import Path

# credential name -> SGLang argument
CREDENTIALS = {"api-key": "--api-key", "admin-api-key": "--admin-api-key"}
REDACTED = "<redacted>"


class RedactingStream(io.TextIOBase):
    """A text stream that writes through to another with every secret replaced."""

    def __init__(self, stream, secrets: list[str]):
        self._stream = stream
        self._secrets = [s for s in secrets if s]

    def write(self, text: str) -> int:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def encoding(self):
        return self._stream.encoding

    def writable(self) -> bool:
        return True


def read_credentials() -> dict[str, str]:
    """The keys systemd loaded for this unit; none when the unit loads none."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return {}
    found = {}
    for name in CREDENTIALS:
        path = Path(directory) / name
        if path.exists():
            value = path.read_text().strip()
            if not value:
                sys.exit(f"sglang-engine-launch: the credential {name} ({path}) is empty. "
                         "Fix: set sglang_worker_api_key / sglang_admin_api_key and run site.yml.")
            found[name] = value
    return found


def main() -> None:
    argv = sys.argv[1:]
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.exit(__doc__)
    keys = read_credentials()
    extra = [item for name, value in keys.items() for item in (CREDENTIALS[name], value)]
    sys.stdout = RedactingStream(sys.stdout, list(keys.values()))
    sys.stderr = RedactingStream(sys.stderr, list(keys.values()))
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:], *extra]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [argv[0], *argv[1:], *extra]
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
