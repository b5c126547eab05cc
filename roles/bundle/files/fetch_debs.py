#!/usr/bin/env python3
"""Download the packages `apt-get install --print-uris` listed against the bundle's own
copies of signed indexes (file: URIs into a DIR of the bundle) from the archive each
index came from (MIRROR), each checked against the sha256 of that signed index; a
package already there and matching is kept.

  fetch_debs.py URIS_FILE DIR=MIRROR [DIR=MIRROR ...]
"""

import json
import re
import sys
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bundle_manifest import sha256 as digest  # the manifest's own hash, beside this script

LINE = re.compile(r"^'file:(?P<path>[^']+)' \S+ (?P<size>\d+) SHA256:(?P<sha256>[0-9a-f]{64})$")


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
    with urllib.request.urlopen(url, timeout=120) as response, partial.open("wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
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
