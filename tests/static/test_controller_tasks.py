"""Nothing on the controller asks for sudo, for an operator who connects as a sudo user.

The README's inventory sets `ansible_user: deploy` and `ansible_become: true` in
group_vars/all. That applies to the controller (`localhost`) too, and a task's or play's
`become: false` does not undo it (connection variables outrank keywords): the repository's
vars plugin gives `localhost` `ansible_become: false` instead. The first tests run
ansible-playbook with the repository's ansible.cfg and such an inventory, where become on the
controller goes through a sudo that always refuses (molecule/examples/controller_bin/sudo,
the one the examples scenario uses); the last ones read every playbook and task file for a
controller task that would escape that host variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SUDO_DIR = REPO / "molecule/examples/controller_bin"
REFUSED = "a task asked for sudo on the controller"

INVENTORY = """\
all:
  hosts:
    managed:
      ansible_connection: local
      ansible_python_interpreter: {python}
"""
# What the README's step 3 puts in group_vars/all.
GROUP_VARS_ALL = "ansible_user: deploy\nansible_become: true\n"
PLAYBOOK = """\
- name: A managed host's play
  hosts: all
  gather_facts: false
  tasks:
    - name: managed host's own task
      ansible.builtin.command: id -un
      changed_when: false
      ignore_errors: true
    - name: delegated to the controller
      ansible.builtin.command: id -un
      delegate_to: localhost
      changed_when: false
      ignore_errors: true
    - name: delegated to the controller once, with become false
      ansible.builtin.command: id -un
      delegate_to: localhost
      run_once: true
      become: false
      changed_when: false
      ignore_errors: true
    - name: local action
      local_action:
        module: ansible.builtin.command
        cmd: id -un
      changed_when: false
      ignore_errors: true

- name: The controller's play
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: controller play task
      ansible.builtin.command: id -un
      changed_when: false
      ignore_errors: true
"""


def run_playbook(tmp_path: Path, *args: str, vars_plugins: str | None = None) -> dict[str, dict[str, dict]]:
    """Run PLAYBOOK as the README's operator inventory would; {task name: {host: result}}."""
    inventory = tmp_path / "inventory"
    (inventory / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (inventory / "hosts.yml").write_text(INVENTORY.format(python=sys.executable))
    (inventory / "group_vars" / "all" / "main.yml").write_text(GROUP_VARS_ALL)
    (tmp_path / "playbook.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_HOME=str(tmp_path / "ansible-home"),
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.json",
               ANSIBLE_BECOME_ALLOW_SAME_USER="true", PATH=f"{SUDO_DIR}:{os.environ['PATH']}")
    if vars_plugins is not None:
        env["ANSIBLE_VARS_ENABLED"] = vars_plugins
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                           str(tmp_path / "playbook.yml"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    report = json.loads(done.stdout)
    return {task["task"]["name"]: task["hosts"] for play in report["plays"] for task in play["tasks"]}


def controller_results(results: dict[str, dict[str, dict]]) -> dict[str, dict]:
    return {name: hosts.get("managed", hosts.get("localhost")) for name, hosts in results.items()
            if name != "managed host's own task"}


@pytest.mark.parametrize("args", [(), ("--become",)], ids=["inventory", "inventory-and-cli"])
def test_controller_tasks_run_as_the_invoking_user(tmp_path: Path, args: tuple[str, ...]) -> None:
    results = run_playbook(tmp_path, *args)
    # the managed host becomes (through the refusing sudo here): become is on for it
    assert REFUSED in json.dumps(results["managed host's own task"]["managed"])
    controller = controller_results(results)
    assert set(controller) == {"delegated to the controller", "delegated to the controller once, with become false",
                               "local action", "controller play task"}
    for name, result in controller.items():
        assert not result.get("failed"), f"{name}: {result.get('msg')}"
        assert result["stdout"] == subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()


def test_without_the_vars_plugin_controller_tasks_ask_for_sudo(tmp_path: Path) -> None:
    """The test above can fail: without the repository's vars plugin every controller task,
    `become: false` or not, goes through sudo."""
    controller = controller_results(run_playbook(tmp_path, vars_plugins="host_group_vars"))
    assert controller and all(REFUSED in result.get("msg", "") for result in controller.values()), controller


# ------------------------------------------------------------------ the repository's tasks
CONTROLLER_NAMES = {"localhost", "127.0.0.1", "::1"}
SCANNED = ["*.yml", "playbooks/**/*.yml", "roles/**/*.yml", "molecule/**/*.yml"]
SECTIONS = ("pre_tasks", "tasks", "post_tasks", "handlers", "block", "rescue", "always")
INCLUDES = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks")
ROLE_INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")


def truthy(value) -> bool:
    return value is True or str(value).strip().lower() in ("yes", "true", "1", "on")


def problems_of(node: dict, on_controller: bool, where: str) -> list[str]:
    """What in one play, block or task would make the controller become, or escape the
    localhost host variable."""
    found = []
    delegate = node.get("delegate_to")
    if isinstance(delegate, str) and delegate.strip() in CONTROLLER_NAMES - {"localhost"}:
        found.append(f"{where}: delegate_to: {delegate} (name the controller `localhost`: its host variable "
                     "ansible_become=false is set for that name)")
    if "hosts" in node and node.get("connection") == "local" and str(node["hosts"]).strip() != "localhost":
        found.append(f"{where}: a `connection: local` play on {node['hosts']!r} runs on the controller as "
                     "those hosts, with their ansible_become (run it on hosts: localhost)")
    if on_controller:
        if truthy(node.get("become", False)):
            found.append(f"{where}: become on the controller")
        for key in (node.get("vars") or {}):
            if str(key).startswith("ansible_become"):
                found.append(f"{where}: sets {key} on the controller")
    return found


def runs_on_controller(task: dict, inherited: bool) -> bool:
    delegate = task.get("delegate_to")
    if "local_action" in task or task.get("connection") == "local":
        return True
    if delegate is not None:
        return str(delegate).strip() in CONTROLLER_NAMES
    return inherited


class Seen(set):
    """(file, on the controller) pairs scanned, and the plays, blocks and tasks found to run
    on the controller."""

    def __init__(self) -> None:
        super().__init__()
        self.controller: list[str] = []


def scan_file(path: Path, on_controller: bool, seen: Seen) -> list[str]:
    """One playbook or task file, once per way it runs (on the controller or not)."""
    if (path, on_controller) in seen:
        return []
    seen.add((path, on_controller))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return []  # templated YAML (files/, templates/) is not a playbook
    return scan(path, data, on_controller, seen)


def scan(path: Path, items, on_controller: bool, seen: Seen) -> list[str]:
    """The plays, blocks and tasks of a list (a file's, or a section's)."""
    if not isinstance(items, list):
        return []
    found = []
    for item in items:
        if not isinstance(item, dict):
            continue
        name = item.get("name", "unnamed")
        where = f"{path.relative_to(REPO)}: {name}"
        if "hosts" in item:
            here = str(item["hosts"]).strip() in CONTROLLER_NAMES or item.get("connection") == "local"
        else:
            here = runs_on_controller(item, on_controller)
        found += problems_of(item, here, where)
        if here:
            seen.controller.append(where)
        for section in SECTIONS:
            found += scan(path, item.get(section), here, seen)
        if here:
            found += scan_includes(path, item, seen)
    return found


def scan_includes(path: Path, task: dict, seen: Seen) -> list[str]:
    """Task files and roles a controller task includes by a literal name: their tasks run there too."""
    targets = []
    for key in INCLUDES:
        value = task.get(key)
        value = value.get("file") if isinstance(value, dict) else value
        if isinstance(value, str) and "{{" not in value:
            targets.append(path.parent / value)
    for key in ROLE_INCLUDES:
        value = task.get(key)
        if isinstance(value, dict) and isinstance(value.get("name"), str) and "{{" not in value["name"]:
            targets.append(REPO / "roles" / value["name"] / "tasks" / (value.get("tasks_from") or "main.yml"))
    found = []
    for target in targets:
        if target.suffix not in (".yml", ".yaml"):
            target = target.with_suffix(".yml")
        if target.is_file():
            found += scan_file(target.resolve(), True, seen)
    return found


def playbook_and_task_files() -> list[Path]:
    files = set()
    for pattern in SCANNED:
        files |= {p.resolve() for p in REPO.glob(pattern) if not any(part.startswith(".") for part in p.relative_to(REPO).parts)}
    return sorted(files)


def test_no_controller_task_escapes_the_localhost_host_variable() -> None:
    seen = Seen()
    assert [problem for path in playbook_and_task_files() for problem in scan_file(path, False, seen)] == []


def test_the_scan_finds_the_controller_tasks_of_the_repository() -> None:
    """The scan above sees the controller's tasks it checks: the kernel wheel build, the
    bundle's checks, the examples' localhost plays and the task files they include."""
    seen = Seen()
    for path in playbook_and_task_files():
        scan_file(path, False, seen)
    on_controller = {where.split(":")[0] for where in seen.controller}
    assert {"roles/sglang_release/tasks/facts.yml", "roles/bundle/tasks/main.yml", "playbooks/bundle.yml",
            "molecule/examples/converge.yml", "molecule/examples/tasks/run.yml"} <= on_controller


BAD = {
    "become on a delegated task": """
- name: play
  hosts: all
  tasks:
    - name: build
      ansible.builtin.command: make
      delegate_to: localhost
      become: true
""",
    "ansible_become in a controller play's vars": """
- name: play
  hosts: localhost
  vars:
    ansible_become: true
  tasks: []
""",
    "the controller by its address": """
- name: play
  hosts: all
  tasks:
    - name: build
      ansible.builtin.command: make
      delegate_to: 127.0.0.1
""",
    "a local play on other hosts": """
- name: play
  hosts: all
  connection: local
  tasks: []
""",
    "become in a block that runs on the controller": """
- name: play
  hosts: localhost
  tasks:
    - name: block
      become: yes
      block:
        - name: build
          ansible.builtin.command: make
""",
}


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_the_scan_refuses(text: str) -> None:
    path = REPO / "playbooks" / "example.yml"
    assert scan(path, yaml.safe_load(text), False, Seen())


def test_the_scan_passes_a_remote_become() -> None:
    text = """
- name: play
  hosts: all
  become: true
  tasks:
    - name: on the host
      ansible.builtin.command: make
    - name: on a lab host from a local play
      ansible.builtin.command: make
      delegate_to: "{{ item }}"
"""
    assert scan(REPO / "playbooks" / "example.yml", yaml.safe_load(text), False, Seen()) == []

