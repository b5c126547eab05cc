"""Every role documents exactly the variables it defines: defaults keys == argument_specs options."""

from pathlib import Path

import pytest
import yaml

ROLES = sorted(p for p in (Path(__file__).resolve().parents[2] / "roles").iterdir() if p.is_dir())


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_defaults_match_argument_specs(role: Path) -> None:
    specs_file = role / "meta" / "argument_specs.yml"
    assert specs_file.exists(), f"{role.name}: meta/argument_specs.yml is missing"
    specs = yaml.safe_load(specs_file.read_text())["argument_specs"]
    options = {}
    for entry in specs.values():
        options.update(entry.get("options") or {})
    defaults_file = role / "defaults" / "main.yml"
    defaults = (yaml.safe_load(defaults_file.read_text()) or {}) if defaults_file.exists() else {}
    assert set(defaults) == set(options), (
        f"{role.name}: only in defaults: {sorted(set(defaults) - set(options))}; "
        f"only in argument_specs: {sorted(set(options) - set(defaults))}")
    prefix = role.name + "_"
    unprefixed = [name for name in options if not name.startswith(prefix)]
    assert not unprefixed, f"{role.name}: variables without the role prefix: {unprefixed}"
    for name, spec in options.items():
        assert spec.get("description"), f"{role.name}: {name} has no description"
        if name in defaults and "default" in spec:
            assert spec["default"] == defaults[name], f"{role.name}: {name} default differs from defaults/main.yml"
