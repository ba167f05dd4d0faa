"""The agent's filesystem: an allow-list, built from nothing (docs/SECURITY.md, "Threat model").

The sandbox's root is an empty tmpfs. Into it go only:

- the system's read-only runtime: ``/usr`` (with the ``/bin``, ``/lib``... links of a merged-usr
  system) and the few files of ``/etc`` that the C library, Python, DNS and TLS read;
- the agent's Python environment, read-only, at its own paths;
- the workspace at its own path: read-write, with ``models/`` and ``data/`` read-only on top;
- a custom agent's program (its folder where that holds nothing of the platform);
- a new ``/proc`` (of the agent's own PID namespace) with the host-wide files that name the
  host's own paths (its boot command line, swap files) made unreadable, a minimal ``/dev`` plus
  the GPUs, of ``/sys`` only the CPU and NUMA topology and the GPUs' own PCI devices (no network
  interfaces, no MAC addresses, no other device), and private tmpfs ``/tmp``, ``/var/tmp`` and
  ``/dev/shm`` that vanish with the sandbox.

Everything else (the platform home and its database, caches, data sources, evaluator storage,
other runs, the repository, other users' files) is simply not there. ``forbidden`` folders are
a guard on top: a view that would expose one of them is refused rather than built.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autorl.errors import AutoRLError

#: Top-level folders that merged-usr systems make links into /usr (real folders elsewhere).
SYSTEM_ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: What of /etc the C library, Python, DNS and TLS read; nothing with credentials.
SYSTEM_ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "protocols",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "localtime",
    "timezone",
    "alternatives",
    "mime.types",
    "os-release",
    "debian_version",
)
#: The parts of /sys that libraries read for the CPU and NUMA topology (torch, OpenMP, numactl).
SYSTEM_SYS = ("devices/system/cpu", "devices/system/node")
#: Where the PCI devices are listed in /sys: each entry a link to the device's own folder.
PCI_DEVICES = "sys/bus/pci/devices"
#: PCI vendors whose devices (GPUs, their switches) the agent's CUDA runtime reads: NVIDIA.
GPU_PCI_VENDORS = frozenset({"0x10de"})
#: Host-wide files of /proc that name the host's paths or its other processes: unreadable.
PROC_MASKED = ("cmdline", "swaps", "sched_debug", "timer_list", "keys", "latency_stats")
#: GPU device nodes (NVIDIA); absent on machines without them.
DEVICE_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps")
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
AGENT_USER_NAME = "agent"


class ViewError(AutoRLError):
    """The view would expose a folder the agent must never see."""


@dataclass(frozen=True)
class Bind:
    source: Path
    target: Path
    writable: bool = False
    #: Platform-owned: may sit under folders that the agent's own user cannot traverse.
    private: bool = True


@dataclass(frozen=True)
class FilesystemView:
    """What the agent sees, by the paths it sees them at."""

    workspace: Path
    #: Inside the workspace, mounted read-only on top of it (models/, data/).
    read_only: Sequence[Path]
    #: The agent's Python environment (see ``PythonEnv.runtime_paths``).
    python_paths: Sequence[Path]
    #: A custom agent's program: the executable file itself.
    program: Path | None = None
    #: Folders the view must never expose (platform home, caches, data sources, evaluator storage).
    forbidden: Sequence[Path] = ()
    #: /etc/resolv.conf's text; None where the agent has no network beyond loopback.
    resolv_conf: str | None = None
    notes: list[str] = field(default_factory=list)

    def binds(self) -> list[Bind]:
        """The platform folders mounted into the view, outer ones first."""
        exposed = [Bind(p, p) for p in self.python_paths]
        if self.program is not None:
            exposed.append(self._program_bind(self.program))
        for bind in exposed:
            self._check_exposable(bind.source)
        workspace = [Bind(self.workspace, self.workspace, writable=True)]
        workspace += [Bind(p, p) for p in self.read_only]
        return [*exposed, *workspace]

    def _program_bind(self, program: Path) -> Bind:
        """The agent's folder (its modules beside it), unless that folder holds platform data."""
        folder = program.parent
        if self._touches_forbidden(folder) or self.workspace.is_relative_to(folder):
            self.notes.append(f"only the agent's file {program} is mounted: its folder holds platform data")
            return Bind(program, program)
        return Bind(folder, folder)

    def _touches_forbidden(self, path: Path) -> bool:
        return any(lies_in(path, f) or lies_in(f, path) for f in self.forbidden)

    def _check_exposable(self, path: Path) -> None:
        if self._touches_forbidden(path):
            raise ViewError(
                f"{path} would be visible to the agent but holds (or lies in) platform data "
                f"({', '.join(map(str, self.forbidden))}); keep the agents' Python environment and "
                "agent programs outside the platform home, cache and data folders and the Hugging Face "
                "caches (HF_HOME, HF_DATASETS_CACHE, HF_HUB_CACHE, ...)"
            )

    def etc_files(self, uid: int, gid: int) -> dict[str, str]:
        """Files written for the sandbox: its own users, hosts and resolver."""
        files = {
            "/etc/passwd": (
                "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                f"{AGENT_USER_NAME}:x:{uid}:{gid}:agent:{self.workspace}:/bin/sh\n"
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
            "/etc/group": f"root:x:0:\n{AGENT_USER_NAME}:x:{gid}:\nnogroup:x:65534:\n",
            "/etc/hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
            "/etc/hostname": "autorl-agent\n",
        }
        if self.resolv_conf is not None:
            files["/etc/resolv.conf"] = self.resolv_conf
        return files


def lies_in(inner: Path, outer: Path) -> bool:
    """Whether ``inner`` is ``outer`` or lies in it, however either is named: by their paths, by their
    real paths (a link to a folder, or into one), or by a folder above ``inner`` that is ``outer``
    itself seen at another path (another mount of it: the same device and inode)."""
    real = Path(os.path.realpath(inner))
    if inner.is_relative_to(outer) or real.is_relative_to(os.path.realpath(outer)):
        return True
    try:
        target = os.stat(outer)
    except OSError:
        return False
    for folder in (real, *real.parents):
        try:
            info = os.stat(folder)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False


def system_args(host_root: Path = Path("/")) -> list[str]:
    """bubblewrap arguments for the read-only system runtime, devices and private temporary folders.

    ``host_root`` is where the host's system is read (``/``; tests give a folder shaped like a
    system that is not merged-usr, or one with GPUs); each part keeps its usual path inside."""

    def host(path: str) -> str:
        return str(host_root / path.lstrip("/"))

    args = ["--ro-bind", host("/usr"), "/usr"]
    for name in SYSTEM_ROOT_LINKS:
        path = host_root / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    for name in SYSTEM_ETC:
        args += ["--ro-bind-try", host(f"/etc/{name}"), f"/etc/{name}"]
    for name in SYSTEM_SYS:
        args += ["--ro-bind-try", host(f"/sys/{name}"), f"/sys/{name}"]
    args += _gpu_sys_args(host_root)
    args += ["--proc", "/proc"]
    for name in PROC_MASKED:
        # Where this kernel has the file (the new /proc is of the same kernel): a device node on
        # the sandbox's nodev mounts, it cannot be opened.
        if os.path.lexists(host(f"/proc/{name}")):
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    args += ["--dev", "/dev"]
    for pattern in DEVICE_GLOBS:
        for device in sorted(glob.glob(host(pattern))):
            args += ["--dev-bind", device, "/" + str(Path(device).relative_to(host_root))]
    for folder in PRIVATE_TMP:
        args += ["--tmpfs", folder, "--chmod", "1777", folder]
    return args


def _gpu_sys_args(host_root: Path) -> list[str]:
    """Each GPU's PCI device folder at its own path under /sys/devices, read-only, and its entry
    in /sys/bus/pci/devices: what the CUDA runtime and NVML read (bus ids, NUMA node, link)."""
    args: list[str] = []
    listing = host_root / PCI_DEVICES
    entries = sorted(listing.iterdir()) if listing.is_dir() else []
    for entry in entries:
        try:
            vendor = (entry / "vendor").read_text().strip()
        except OSError:
            continue
        if vendor not in GPU_PCI_VENDORS:
            continue
        device = Path(os.path.realpath(entry))
        if not device.is_relative_to(host_root / "sys/devices"):
            continue
        inside = "/" + str(device.relative_to(host_root))
        args += ["--ro-bind", str(device), inside]
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry), f"/{PCI_DEVICES}/{entry.name}"]
    return args
