"""The agent's filesystem: an allow-list, built from nothing (docs/SECURITY.md, "Threat model").

The sandbox's root is an empty tmpfs. Into it go only:

- the system's read-only runtime: ``/usr`` (with the ``/bin``, ``/lib``... links of a merged-usr
  system) and the few files of ``/etc`` that the C library, Python, DNS and TLS read;
- the agent's Python environment, read-only, at its own paths;
- the workspace at its own path: read-write, with ``models/`` and ``data/`` read-only on top;
- a custom agent's program (its folder where that holds nothing of the platform);
- a new ``/proc`` (of the agent's own PID namespace), a minimal ``/dev`` plus the GPUs, the
  parts of ``/sys`` that describe devices, and private tmpfs ``/tmp``, ``/var/tmp`` and
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
#: The parts of /sys that libraries read to find CPUs, NUMA nodes and GPUs.
SYSTEM_SYS = ("bus", "class", "dev", "devices")
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
        return any(path.is_relative_to(f) or f.is_relative_to(path) for f in self.forbidden)

    def _check_exposable(self, path: Path) -> None:
        if self._touches_forbidden(path):
            raise ViewError(
                f"{path} would be visible to the agent but holds (or lies in) platform data "
                f"({', '.join(map(str, self.forbidden))}); keep the agents' Python environment and "
                "agent programs outside the platform home, cache and data folders"
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
    args += ["--proc", "/proc", "--dev", "/dev"]
    for pattern in DEVICE_GLOBS:
        for device in sorted(glob.glob(host(pattern))):
            args += ["--dev-bind", device, "/" + str(Path(device).relative_to(host_root))]
    for folder in PRIVATE_TMP:
        args += ["--tmpfs", folder, "--chmod", "1777", folder]
    return args
