#!/usr/bin/env python3
"""Download the packages `apt-get install --print-uris` listed against the bundle's own
copies of signed indexes (file: URIs into a DIR of the bundle) from the archive each
index came from (MIRROR), each checked against the sha256 of that signed index; a
package already there and matching is kept. A failed connection, timeout or server error
is tried again (ATTEMPTS in all, waiting longer each time), as apt's Acquire::Retries does.

  fetch_debs.py URIS_FILE DIR=MIRROR [DIR=MIRROR ...]
"""

import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bundle_manifest import sha256 as digest  # the manifest's own hash, beside this script

ATTEMPTS = 5
LINE = re.compile(r"^'file:(?P<path>[^']+)' \S+ (?P<size>\d+) SHA256:(?P<sha256>[0-9a-f]{64})$")


def transient(error: OSError) -> bool:
    """A name lookup, connection or timeout failure, or a server error: worth another try."""
    if isinstance(error, urllib.error.HTTPError):
        return error.code >= 500
    return True


def download(url: str, dest: Path) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with urllib.request.urlopen(url, timeout=120) as response, dest.open("wb") as out:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
            return
        except OSError as error:  # URLError, HTTPError, socket errors and timeouts
            if attempt == ATTEMPTS or not transient(error):
                raise RuntimeError(f"{url}: {error} (attempt {attempt} of {ATTEMPTS})") from error
            time.sleep(2 ** attempt)


def fetch(item: dict, sources: dict[Path, str]) -> bool:
    target = Path(urllib.parse.unquote(item["path"]))
    dest = next((d for d in sources if target.is_relative_to(d)), None)
    if dest is None:
        raise RuntimeError(f"{target}: under none of {', '.join(map(str, sources))}")
    mirror = sources[dest]
    relative = target.relative_to(dest)
    if target.is_file() and digest(target) == item["sha256"]:
        return False
    url = f"{mirror.rstrip('/')}/{urllib.parse.quote(relative.as_posix())}"
    partial = target.with_name(target.name + ".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    download(url, partial)
    got = digest(partial)
    if got != item["sha256"]:
        partial.unlink()
        raise RuntimeError(f"{url}: sha256 {got}, the signed index says {item['sha256']}")
    partial.rename(target)
    return True


def main() -> int:
    uris_file = Path(sys.argv[1])
    sources = {Path(d).resolve(): m for d, _, m in (arg.partition("=") for arg in sys.argv[2:])}
    items = [m.groupdict() for m in map(LINE.match, uris_file.read_text().splitlines()) if m]
    if not items:
        sys.exit(f"{uris_file}: no package to fetch (apt-get --print-uris printed none)")
    with ThreadPoolExecutor(max_workers=8) as pool:
        fetched = list(pool.map(lambda item: fetch(item, sources), items))
    print(json.dumps({"changed": any(fetched), "packages": len(items), "fetched": sum(fetched),
                      "bytes": sum(int(i["size"]) for i in items)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
