"""Every Molecule scenario's lab hosts and archive server have addresses of their own.

Lab hosts share the controller's network namespace, and `make test` runs two scenarios at
once in whichever order the lanes take them: two scenarios that use the same address would
bind the same sockets and answer each other's SSH and HTTP checks.
"""

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted([*REPO.glob("roles/*/molecule/*/molecule.yml"), *REPO.glob("molecule/*/molecule.yml"),
                    *REPO.glob("tests/lab/molecule/*/molecule.yml")])
LAB_ADDRESS = re.compile(r"\$\{SM120_LAB_NET:-127\.0\.2\}\.(\d+)")


def scenario_addresses() -> dict[str, list[str]]:
    """Last octet -> the scenarios (and archive servers) that use it."""
    users: dict[str, list[str]] = {}
    for path in SCENARIOS:
        name = str(path.parent.relative_to(REPO))
        for platform in yaml.safe_load(path.read_text()).get("platforms") or []:
            match = LAB_ADDRESS.fullmatch(str(platform.get("address", "")))
            assert match, f"{name}: {platform.get('name')}: address {platform.get('address')!r} is not on the lab net"
            users.setdefault(match.group(1), []).append(f"{name} ({platform['name']})")
        for prepare in path.parent.glob("*.yml"):
            for octet in re.findall(r"^\s*release_server_host:\s*(\d+)\s*$", prepare.read_text(), re.M):
                users.setdefault(octet, []).append(f"{name} (archive server)")
    return users


def test_scenarios_found():
    assert len(SCENARIOS) >= 10


def test_every_lab_address_has_one_user():
    shared = {octet: names for octet, names in scenario_addresses().items() if len(names) > 1}
    assert not shared, f"lab addresses used twice (give each its own last octet): {shared}"
