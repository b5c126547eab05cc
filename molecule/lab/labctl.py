#!/usr/bin/env python3
"""Lab hosts for sm120-serve: Debian systemd-nspawn containers with systemd as PID 1.

The lab gives every host its own loopback address (127.0.X.N) in the shared network
namespace and an sshd bound to it, so Ansible reaches lab hosts exactly as it reaches
real ones (SSH, key, pipelining; as root, or as `deploy`, a user with passwordless sudo)
and services on different hosts can use the same ports.

Commands (all print progress to stderr and a JSON result to stdout):
  rootfs RELEASE                 build (or reuse) the cached root filesystem
  up NAME --release R --address A [--bind SRC:DST ...] [--seed SRC:DST ...]
                                 copy the rootfs, boot it, wait for systemd and sshd;
                                 a seed is a hardlinked copy of a controller directory
                                 (a package cache: the host's venvs then hardlink from it)
  down NAME | --all              power off and remove; leaves no process, mount or directory
  up-inventory FILE              boot every host of an inventory that sets lab_release
                                 (ansible_host is its address; lab_binds, lab_seeds optional)
  status                         list the lab's hosts
  check-clean                    exit 1 if any process, mount, directory or fence of the lab remains
  up ... --fenced                boot the host inside the lab's fence cgroup (see fence)
  fence NAME...                  take fenced hosts offline: their packets to any address
                                 outside 127.0.0.0/8 are rejected and counted (nftables,
                                 matched by the net_cls cgroup they booted in)
  fence-report                   the rejected packets so far
  exec-fenced CMD...             run CMD inside the fence (the controller of an offline site)

State lives in $SM120_LAB_STATE (default <repo>/.lab/<lab id>), the rootfs cache in
$SM120_LAB_CACHE (default <repo>/.cache/lab). The lab id ($SM120_LAB_ID, default "lab")
keeps concurrent labs apart.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MIRROR = os.environ.get("SM120_LAB_MIRROR", "http://deb.debian.org/debian")
SECURITY_MIRROR = os.environ.get("SM120_LAB_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
RELEASES = {"bookworm": "12", "trixie": "13"}
# What every lab host has before Ansible touches it: what a minimal cloud image has.
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "python3", "python3-apt", "openssh-server",
    "ca-certificates", "iproute2", "procps", "sudo", "gnupg",
]
# The unprivileged user an operator connects as, with passwordless sudo, as a cloud image's
# default user has it (Debian's cloud images: `debian`; the README's inventory: `deploy`).
# Every host authorizes the lab's key for it and for root.
SUDO_USER = "deploy"
# Units that have nothing to do in a container with a passive console.
MASKED_UNITS = ["console-getty.service", "getty@tty1.service", "systemd-timesyncd.service",
                "apt-daily.timer", "apt-daily-upgrade.timer"]
# Bump when the recipe below changes in a way the hash cannot see.
RECIPE_REVISION = "4"
BOOT_TIMEOUT_S = 300  # generous: a loaded 2-core machine has taken over 120 s
STOP_TIMEOUT_S = 10  # a lab host is thrown away: its clean poweroff is a courtesy
KILL_ROUNDS = 50  # 0.1 s apart: what still runs in a host's root after its poweroff
RMTREE_TRIES = 20  # 0.5 s apart


NET_CLS = Path("/sys/fs/cgroup/net_cls")


def log(msg: str) -> None:
    print(f"[lab] {msg}", file=sys.stderr, flush=True)


def lab_id() -> str:
    return os.environ.get("SM120_LAB_ID", "lab")


def state_dir() -> Path:
    return Path(os.environ.get("SM120_LAB_STATE", REPO / ".lab" / lab_id()))


def cache_dir() -> Path:
    return Path(os.environ.get("SM120_LAB_CACHE", REPO / ".cache" / "lab"))


def ssh_key() -> Path:
    """One key pair for the lab's SSH connections, made on first use."""
    key = cache_dir() / "ssh" / "id_ed25519"
    key.parent.mkdir(parents=True, exist_ok=True)
    with open(key.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # hosts boot side by side: one of them makes the pair
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sm120-serve-lab",
                            "-f", str(key)], check=True)
    return key


def recipe_hash(release: str) -> str:
    recipe = json.dumps([RECIPE_REVISION, release, MIRROR, SECURITY_MIRROR, PACKAGES, MASKED_UNITS, SUDO_USER])
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def sources_deb822(release: str) -> str:
    return (f"Types: deb\nURIs: {MIRROR}\nSuites: {release} {release}-updates\nComponents: main\n"
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
            f"Types: deb\nURIs: {SECURITY_MIRROR}\nSuites: {release}-security\nComponents: main\n"
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")


def build_rootfs(release: str) -> Path:
    if release not in RELEASES:
        sys.exit(f"unknown release {release!r}; supported: {', '.join(RELEASES)}")
    root = cache_dir() / "rootfs" / f"{release}-{recipe_hash(release)}"
    if (root / "etc" / "os-release").exists():
        return root
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    log(f"building the {release} root filesystem (debootstrap, about 90 s)")
    started = time.monotonic()
    subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                    release, str(partial), MIRROR], check=True, stdout=subprocess.DEVNULL)
    (partial / "etc/apt/sources.list").unlink(missing_ok=True)
    (partial / "etc/apt/sources.list.d/debian.sources").write_text(sources_deb822(release))
    for unit in MASKED_UNITS:
        link = partial / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    subprocess.run(["chroot", str(partial), "useradd", "--create-home", "--shell", "/bin/bash", SUDO_USER],
                   check=True)
    sudoers = partial / "etc/sudoers.d" / f"90-{SUDO_USER}"
    sudoers.write_text(f"{SUDO_USER} ALL=(ALL) NOPASSWD:ALL\n")
    sudoers.chmod(0o440)
    subprocess.run(["chroot", str(partial), "visudo", "--check", "--quiet", "--file", f"/etc/sudoers.d/{sudoers.name}"],
                   check=True)
    # Each host gets its own machine id at copy time.
    (partial / "etc/machine-id").write_text("")
    subprocess.run(["chroot", str(partial), "apt-get", "clean"], check=True)
    # Older builds of this release are stale: their recipe changed.
    for old in root.parent.glob(f"{release}-*"):
        if old != partial:
            shutil.rmtree(old, ignore_errors=True)
    partial.rename(root)
    log(f"{release} root filesystem ready in {time.monotonic() - started:.0f} s")
    return root


def authorize(root: Path, key: Path) -> None:
    """The lab's key, authorized for root and SUDO_USER in the host's root filesystem (the
    host has no user namespace: its ids are the controller's numbers)."""
    users = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
    for user in ("root", SUDO_USER):
        _, _, uid, gid, _, home, _ = users[user]
        ssh_dir = root / home.lstrip("/") / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        keys = ssh_dir / "authorized_keys"
        keys.write_text(Path(f"{key}.pub").read_text())
        keys.chmod(0o600)
        for path in (ssh_dir, keys):
            os.chown(path, int(uid), int(gid))


def host_dir(name: str) -> Path:
    return state_dir() / "hosts" / name


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def alive(pid: int) -> bool:
    """Whether pid is a running systemd-nspawn (a lab host's recorded process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive, and a reused PID of another program is not the host.
    try:
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"systemd-nspawn")
    except OSError:
        return False


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def container_init(nspawn_pid: int) -> int | None:
    """The container's PID 1 (systemd) among systemd-nspawn's children. nspawn
    first forks a short-lived helper; taking that one as the leader left every
    nsenter failing until the boot timeout."""
    for pid in children(nspawn_pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                return pid
        except OSError:
            continue
    return None


def nsenter(leader: int, *cmd: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["nsenter", f"--target={leader}", "--mount", "--uts", "--ipc", "--net",
                           "--pid", "--wd=/", "--", *cmd], capture_output=True, text=True,
                          timeout=timeout)


def wait_tcp(address: str, port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.3)
    return False


def up(name: str, release: str, address: str, binds: list[str], seeds: list[str] = (), fenced: bool = False) -> dict:
    meta_path = host_dir(name) / "host.json"
    meta = read_json(meta_path)
    if meta and alive(meta.get("pid", -1)):
        if meta.get("release") != release or meta.get("address") != address:
            sys.exit(f"lab host {name} is running as {meta['release']}@{meta['address']}; "
                     f"run `down {name}` first")
        log(f"{name}: already running ({address})")
        return meta
    down(name)
    src = build_rootfs(release)
    hdir = host_dir(name)
    root = hdir / "rootfs"
    hdir.mkdir(parents=True, exist_ok=True)
    log(f"{name}: copying the {release} root filesystem")
    subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(root)], check=True)
    for seed in seeds:
        host_path, _, container_path = seed.partition(":")
        dest = root / container_path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        log(f"{name}: seeding {container_path} from {host_path} (hardlinks)")
        # Hardlinks inside the host's root: no data copied, and uv links venvs from it.
        # resolved: a cache that is a link to another checkout's is seeded with its contents
        subprocess.run(["cp", "-al", str((REPO / host_path).resolve()), str(dest)], check=True)
    (root / "etc/hostname").write_text(f"{name}\n")
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{address} {name}\n")
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    (root / "etc/ssh/sshd_config.d/lab.conf").write_text(
        f"ListenAddress {address}\nPermitRootLogin prohibit-password\nUseDNS no\n")
    authorize(root, ssh_key())
    cmd = ["systemd-nspawn", "-D", str(root), "--boot", "--register=no", "--keep-unit",
           "--console=passive", f"--machine={name}"]
    # Per host: apt locks its archive directory, so hosts installing at the same time
    # cannot share one. The cache still serves the next boot of a host of that name.
    apt_cache = cache_dir() / "apt" / release / name
    (apt_cache / "partial").mkdir(parents=True, exist_ok=True)
    cmd.append(f"--bind={apt_cache}:/var/cache/apt/archives")
    for bind in binds:
        host_path, _, container_path = bind.partition(":")
        # A relative host path is relative to the repository (inventories name .cache/...).
        host_path = str(REPO / host_path) if not os.path.isabs(host_path) else host_path
        Path(host_path).mkdir(parents=True, exist_ok=True)
        cmd.append(f"--bind={host_path}:{container_path}")
    procs = fence_cgroup_setup() / "cgroup.procs" if fenced else None
    log(f"{name}: booting at {address}" + (" inside the lab's fence (no route out)" if fenced else ""))
    with open(hdir / "console.log", "wb") as console:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=console, stderr=console,
                                start_new_session=True,
                                preexec_fn=(lambda: procs.write_text(str(os.getpid()))) if procs else None)
    meta = {"name": name, "release": release, "version": RELEASES[release], "address": address,
            "pid": proc.pid, "rootfs": str(root), "lab_id": lab_id(), "fenced": fenced}
    meta_path.write_text(json.dumps(meta))
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    leader = None
    while time.monotonic() < deadline and proc.poll() is None and not leader:
        leader = container_init(proc.pid)
        time.sleep(0.2)
    if not leader:
        tail = (hdir / "console.log").read_text(errors="replace")[-2000:]
        down(name)
        sys.exit(f"{name}: systemd-nspawn did not start a container:\n{tail}")
    meta["leader"] = leader
    meta_path.write_text(json.dumps(meta))
    while time.monotonic() < deadline:
        try:
            state = nsenter(leader, "systemctl", "is-system-running", "--wait",
                            timeout=max(1, deadline - time.monotonic())).stdout.strip()
        except subprocess.TimeoutExpired:
            state = "timeout"
        if state in ("running", "degraded"):
            break
        time.sleep(0.5)
    else:
        down(name)
        sys.exit(f"{name}: systemd did not finish booting within {BOOT_TIMEOUT_S} s")
    if state == "degraded":
        failed = nsenter(leader, "systemctl", "--failed", "--no-legend", "--plain").stdout
        log(f"{name}: booted degraded; failed units:\n{failed}")
    if not wait_tcp(address, 22, deadline):
        down(name)
        sys.exit(f"{name}: sshd did not listen on {address}:22 within {BOOT_TIMEOUT_S} s")
    log(f"{name}: up ({release}, {address}, systemd {state})")
    meta["identity_file"] = str(ssh_key())
    meta_path.write_text(json.dumps(meta))
    return meta


def lab_processes(prefix: Path) -> list[int]:
    """PIDs whose root directory lies under the lab's state directory."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            root = os.readlink(proc / "root")
        except OSError:
            continue
        if root.startswith(str(prefix)):
            found.append(int(proc.name))
    return found


def lab_mounts(prefix: Path) -> list[str]:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(str(prefix)):
            mounts.append(point)
    return mounts


def begin_poweroff(name: str) -> None:
    """Ask a running host to power off and return at once (down() waits)."""
    pid = read_json(host_dir(name) / "host.json").get("pid")
    if pid and alive(pid):
        log(f"{name}: powering off")
        os.kill(pid, signal.SIGTERM)  # nspawn turns SIGTERM into a clean poweroff


def kill_lab_processes(hdir: Path) -> None:
    """SIGKILL whatever still runs inside the host's root, until nothing does
    (or KILL_ROUNDS tries, 0.1 s apart)."""
    for _ in range(KILL_ROUNDS):
        procs = lab_processes(hdir)
        if not procs:
            return
        for p in procs:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def trash_dir() -> Path:
    """Where removed hosts' roots wait for their deletion: beside the labs' state
    directories, on the same filesystem (a rename), outside every lab's own."""
    return state_dir().parent / ".trash"


def remove_host_dir(name: str, hdir: Path) -> None:
    """Move the host's directory aside (a rename: the host is gone at once) and delete it in
    a detached session at nice 19 and idle I/O priority. A host that installed releases
    holds a few hundred thousand files (the offline box about 15 GB): rm took minutes,
    which nothing needs to wait for."""
    target = trash_dir() / f"{lab_id()}-{name}-{uuid.uuid4().hex[:8]}"
    target.parent.mkdir(parents=True, exist_ok=True)
    hdir.rename(target)
    # A killed container's last writes (a journal flush) can race the first rm: tried again.
    script = ('{ echo 19 > /proc/self/autogroup; } 2>/dev/null; '
              f'for attempt in $(seq {RMTREE_TRIES}); do '
              'ionice -c3 rm -rf --one-file-system -- "$0" 2>/dev/null; [ -e "$0" ] || exit 0; sleep 0.5; done; exit 1')
    subprocess.Popen(["bash", "-c", script, str(target)], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def down(name: str, deadline: float | None = None) -> None:
    """Power the host off (killing it at the deadline, STOP_TIMEOUT_S from now unless
    given: then its poweroff has already begun) and remove it."""
    hdir = host_dir(name)
    meta = read_json(hdir / "host.json")
    pid = meta.get("pid")
    if pid and alive(pid):
        if deadline is None:
            begin_poweroff(name)
            deadline = time.monotonic() + STOP_TIMEOUT_S
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(pid):
            log(f"{name}: poweroff took over {STOP_TIMEOUT_S} s; killing")
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it ended between the check and the kill
    # Whatever still runs inside the container's root is killed too.
    kill_lab_processes(hdir)
    for point in sorted(lab_mounts(hdir), reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    if hdir.exists():
        remove_host_dir(name, hdir)
        log(f"{name}: removed (its files are deleted in the background)")


def fence_cgroup() -> Path:
    return NET_CLS / f"sm120-lab-{lab_id()}"


def fence_table() -> str:
    return "sm120_lab_" + "".join(c if c.isalnum() else "_" for c in lab_id())


def fence_classid() -> int:
    """net_cls class id (major:minor) of this lab's fence, one per lab id."""
    return (0x5E12 << 16) | int(hashlib.sha256(lab_id().encode()).hexdigest()[:4], 16)


def fence_cgroup_setup() -> Path:
    """The lab's net_cls cgroup, with the lab's class id. A host booted in it (up --fenced)
    has it as its cgroup namespace's root: whatever its systemd starts, wherever it puts
    it, stays below and keeps the class id (a host moved in later would not: its systemd
    moves the processes it starts to its own root)."""
    def mounted() -> bool:
        return any(line.split()[1] == str(NET_CLS) for line in Path("/proc/mounts").read_text().splitlines())

    if not mounted():
        NET_CLS.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "cgroup", "-o", "net_cls", "net_cls", str(NET_CLS)],
                              capture_output=True, text=True)
        if done.returncode != 0 and not mounted():  # not a host booting beside this one
            sys.exit(f"fence: mounting the net_cls cgroup hierarchy failed: {done.stderr.strip()}")
    cgroup = fence_cgroup()
    cgroup.mkdir(exist_ok=True)
    (cgroup / "net_cls.classid").write_text(str(fence_classid()))
    return cgroup


def fence(names: list[str]) -> dict:
    """Take the fenced hosts offline: from now on every packet of the lab's class (the
    hosts booted with up --fenced, and commands run with exec-fenced) to an address
    outside 127.0.0.0/8 is rejected and counted. The hosts share the controller's
    network namespace, so the rule tells them apart by their cgroup."""
    for name in names:
        meta = read_json(host_dir(name) / "host.json")
        if not alive(meta.get("pid", -1)):
            sys.exit(f"fence: lab host {name} is not running")
        if not meta.get("fenced"):
            sys.exit(f"fence: lab host {name} was not booted inside the fence; boot it with up --fenced")
    fence_cgroup_setup()
    table, classid = fence_table(), fence_classid()
    if subprocess.run(["nft", "list", "table", "inet", table], capture_output=True).returncode != 0:
        subprocess.run(["nft", "-f", "-"], check=True, text=True, input=(
            f"table inet {table} {{\n chain output {{\n  type filter hook output priority 0; policy accept;\n"
            f"  meta cgroup {classid} ip daddr != 127.0.0.0/8 counter reject with icmpx type admin-prohibited\n"
            f"  meta cgroup {classid} ip6 daddr != ::1 counter reject with icmpx type admin-prohibited\n }}\n}}\n"))
    log(f"fenced {', '.join(names)}: their packets outside 127.0.0.0/8 are rejected and counted")
    return {"fenced": names, "table": table, "classid": classid}


def fence_report() -> dict:
    done = subprocess.run(["nft", "-j", "list", "table", "inet", fence_table()],
                          capture_output=True, text=True, check=True)
    packets = bytes_ = 0
    for item in json.loads(done.stdout)["nftables"]:
        for expr in item.get("rule", {}).get("expr", []):
            if "counter" in expr:
                packets += expr["counter"]["packets"]
                bytes_ += expr["counter"]["bytes"]
    return {"table": fence_table(), "rejected_packets": packets, "rejected_bytes": bytes_}


def unfence() -> None:
    """Remove the fence's table and its cgroup, with the cgroups its hosts' systemd made in it."""
    subprocess.run(["nft", "delete", "table", "inet", fence_table()], capture_output=True, check=False)
    cgroup = fence_cgroup()
    if cgroup.is_dir():
        for path in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            path.rmdir()
        cgroup.rmdir()


def fence_leftovers() -> list[str]:
    """The fence's nftables table and cgroup, where either remains."""
    table = shutil.which("nft") and subprocess.run(["nft", "list", "table", "inet", fence_table()], capture_output=True)
    return ([f"nft table inet {fence_table()}"] if table and table.returncode == 0 else []) + \
        ([str(fence_cgroup())] if fence_cgroup().is_dir() else [])


def all_hosts() -> list[str]:
    hosts = state_dir() / "hosts"
    return sorted(p.name for p in hosts.iterdir()) if hosts.exists() else []


def check_clean() -> int:
    prefix = state_dir()
    leftovers = {"processes": lab_processes(prefix), "mounts": lab_mounts(prefix),
                 "hosts": all_hosts(), "fence": fence_leftovers()}
    print(json.dumps(leftovers))
    return 1 if any(leftovers.values()) else 0


def up_inventory(path: str) -> list[dict]:
    """Boot the hosts of a YAML inventory: every host with lab_release is a lab host."""
    import yaml  # the controller venv has it; the other commands need only the stdlib

    hosts: dict[str, dict] = {}

    def walk(group: dict) -> None:
        for name, hvars in (group.get("hosts") or {}).items():
            hosts.setdefault(name, {}).update(hvars or {})
        for child in (group.get("children") or {}).values():
            walk(child or {})

    walk(yaml.safe_load(Path(path).read_text())["all"])
    return [up(name, hv["lab_release"], hv["ansible_host"], hv.get("lab_binds", []), hv.get("lab_seeds", []))
            for name, hv in sorted(hosts.items()) if "lab_release" in hv]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("rootfs")
    p.add_argument("release", choices=sorted(RELEASES))
    p = sub.add_parser("up")
    p.add_argument("name")
    p.add_argument("--release", required=True, choices=sorted(RELEASES))
    p.add_argument("--address", required=True)
    p.add_argument("--bind", action="append", default=[])
    p.add_argument("--seed", action="append", default=[])
    p.add_argument("--fenced", action="store_true", help="boot inside the lab's fence cgroup (see fence)")
    p = sub.add_parser("down")
    p.add_argument("name", nargs="?")
    p.add_argument("--all", action="store_true")
    p = sub.add_parser("up-inventory")
    p.add_argument("inventory")
    sub.add_parser("status")
    sub.add_parser("check-clean")
    p = sub.add_parser("fence")
    p.add_argument("names", nargs="+")
    sub.add_parser("fence-report")
    p = sub.add_parser("exec-fenced")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args()

    if os.geteuid() != 0:
        sys.exit("the lab needs root (systemd-nspawn, nsenter)")
    if args.command == "rootfs":
        print(json.dumps({"rootfs": str(build_rootfs(args.release))}))
    elif args.command == "up":
        print(json.dumps(up(args.name, args.release, args.address, args.bind, args.seed, args.fenced)))
    elif args.command == "up-inventory":
        print(json.dumps(up_inventory(args.inventory)))
    elif args.command == "down":
        if not args.name and not args.all:
            sys.exit("down: name a host or pass --all")
        names = all_hosts() if args.all else [args.name]
        # Every host shuts down at once, within one shared deadline, and is removed
        # beside the others.
        for name in names:
            begin_poweroff(name)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            for future in [pool.submit(down, name, deadline) for name in names]:
                future.result()
        if args.all:
            unfence()
            shutil.rmtree(state_dir(), ignore_errors=True)
    elif args.command == "status":
        print(json.dumps([dict(read_json(host_dir(n) / "host.json"),
                               running=alive(read_json(host_dir(n) / "host.json").get("pid", -1)))
                          for n in all_hosts()]))
    elif args.command == "check-clean":
        return check_clean()
    elif args.command == "fence":
        print(json.dumps(fence(args.names)))
    elif args.command == "fence-report":
        print(json.dumps(fence_report()))
    elif args.command == "exec-fenced":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            sys.exit("exec-fenced: name a command")
        (fence_cgroup_setup() / "cgroup.procs").write_text(str(os.getpid()))
        os.execvp(cmd[0], cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
