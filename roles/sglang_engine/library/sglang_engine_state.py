#!/usr/bin/python3
"""Read what the engine role decides restarts from, for every engine of the host in one module run.

One Python start on the host instead of one per engine and per file: systemd's version, which
release current points at, each engine's unit state and the release and unit checksum it was
started with, and the engine instances systemd knows about. Reads only; check mode reads too.
"""

import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: sglang_engine_state
short_description: Read the engines' state (systemd, current release, recorded release and unit)
description:
  - Reads only; runs in check mode.
options:
  names: {description: Engine names (instances of sglang-engine@.service)., type: list, elements: str, required: true}
  state_dir: {description: Directory of engine-NAME.release and engine-NAME.unit., type: path, required: true}
  root: {description: Release root holding the current link., type: path, required: true}
"""

UNIT = "sglang-engine@{}.service"
WANTS = "/etc/systemd/system/multi-user.target.wants"


def read_text(path):
    """A state file's content without surrounding whitespace; '' when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def current_release(root):
    """The name of the release ROOT/current points at ('' when current is not a link)."""
    link = os.path.join(root, "current")
    if not os.path.islink(link):
        return ""
    return os.path.basename(os.path.realpath(link))


def known_instances(unit_lines, wants_entries):
    """Engine instances systemd has loaded or that are enabled (sorted, unique)."""
    names = {line.split()[0] for line in unit_lines if line.strip()}
    names.update(entry for entry in wants_entries if entry.startswith("sglang-engine@"))
    return sorted(name for name in names if name.startswith("sglang-engine@") and name.endswith(".service"))


def main():
    module = AnsibleModule(
        argument_spec={
            "names": {"type": "list", "elements": "str", "required": True},
            "state_dir": {"type": "path", "required": True},
            "root": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    names = module.params["names"]
    state_dir = module.params["state_dir"]
    systemctl = module.get_bin_path("systemctl", required=True)

    rc, out, err = module.run_command([systemctl, "--version"])
    if rc != 0:
        module.fail_json(msg="systemctl --version failed: " + err.strip())
    systemd_version = out.splitlines()[0].split()[1] if out.strip() else ""

    active = {}
    for name in names:
        _, out, _ = module.run_command([systemctl, "is-active", UNIT.format(name)])
        active[name] = out.strip()

    _, out, _ = module.run_command([systemctl, "list-units", "--all", "--plain", "--no-legend", UNIT.format("*")])
    try:
        wants = os.listdir(WANTS)
    except OSError:
        wants = []

    module.exit_json(
        changed=False,
        systemd_version=systemd_version,
        current=current_release(module.params["root"]),
        active=active,
        release={name: read_text(os.path.join(state_dir, "engine-{}.release".format(name))) for name in names},
        unit={name: read_text(os.path.join(state_dir, "engine-{}.unit".format(name))) for name in names},
        known=known_instances(out.splitlines(), wants),
    )


if __name__ == "__main__":
    main()
