"""The repository's shared inputs (defaults/*.yml) for whatever inventory is passed with -i.

Ansible reads group_vars/ beside an inventory or beside the playbook that runs, so files
in this repository would either not apply to an operator's inventory (site.yml imports
playbooks/site.yml) or outrank its group_vars (a playbook at the root). This plugin gives
them to group `all` just below the first inventory source's own group_vars/all, so every
value an operator sets (inventory file, group_vars, host_vars, extra vars) wins.

It also gives the controller (host `localhost`: every `delegate_to: localhost` task and
every `hosts: localhost` play) `ansible_become: false`, as a host variable: the operator's
`ansible_become: true` in group_vars/all applies to localhost too, and a task's or play's
`become: false` does not undo it (connection variables outrank keywords), so without this a
controller task of a sudo operator would run sudo on the controller.
"""

from __future__ import annotations

import os

from ansible import constants as C
from ansible import context
from ansible.inventory.group import InventoryObjectType
from ansible.plugins.vars import BaseVarsPlugin

DOCUMENTATION = """
    name: sm120_defaults
    short_description: sm120-serve's shared inputs and model recipes, below the inventory
    description:
        - Loads every YAML file in the repository's defaults/ directory, in name order, as
          variables of group C(all) for the first inventory source.
        - Keys that the inventory file sets inline (C(vars:) of any group) are left out, so
          those inline values apply too.
        - Gives host C(localhost) (the controller) C(ansible_become=false), below the
          inventory's own host_vars.
    options:
      stage:
        ini:
          - key: stage
            section: vars_sm120_defaults
        env:
          - name: ANSIBLE_VARS_PLUGIN_STAGE
    extends_documentation_fragment:
      - vars_plugin_staging
"""

DEFAULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "defaults")


def _first_inventory_dir() -> str | None:
    sources = list(context.CLIARGS.get("inventory") or ()) or list(C.DEFAULT_HOST_LIST or ())
    for source in sources:
        if "," in source and not os.path.exists(source):
            continue  # a host list, not a path
        path = os.path.realpath(source)
        return path if os.path.isdir(path) else os.path.dirname(path)
    return None


def _inline_keys(group, seen=None) -> set[str]:
    """Variables set in the inventory file itself on this group or any group below it."""
    seen = set() if seen is None else seen
    if group.name in seen:
        return set()
    seen.add(group.name)
    keys = set(group.get_vars())
    for child in group.child_groups:
        keys |= _inline_keys(child, seen)
    return keys


class VarsModule(BaseVarsPlugin):
    REQUIRES_ENABLED = True
    is_stateless = True

    def get_vars(self, loader, path, entities, cache=True):
        super().get_vars(loader, path, entities)
        entities = entities if isinstance(entities, list) else [entities]
        if os.path.realpath(path) != _first_inventory_dir():
            return {}
        if any(e.base_type is InventoryObjectType.HOST and e.name == "localhost" for e in entities):
            return {"ansible_become": False}
        everyone = [e for e in entities if e.base_type is InventoryObjectType.GROUP and e.name == "all"]
        if not everyone:
            return {}
        data = {}
        for name in sorted(os.listdir(DEFAULTS_DIR)):
            if name.endswith((".yml", ".yaml")):
                loaded = loader.load_from_file(os.path.join(DEFAULTS_DIR, name), cache="all", unsafe=True,
                                               trusted_as_template=True)
                data.update(loaded or {})
        inline = _inline_keys(everyone[0])
        return {key: value for key, value in data.items() if key not in inline}
