"""Agent isolation on a single machine (docs/SECURITY.md, "Threat model": what the agent can reach).

The agent runs in bubblewrap with its own user, mount, PID, network, IPC, UTS and cgroup
namespaces, no capabilities, no way to create further user namespaces, a session of its own,
and a filesystem built from an allow-list (``filesystem_view``). bubblewrap reads its options
from a descriptor (``--args``): its process, the first of the agent's PID namespace, shows the
agent nothing of the host's paths in its command line. Its network namespace holds
only loopback, where the platform forwards the grader's agent API (``api_relay``); with
``--egress`` a user-mode network stack adds the internet, not the host (``egress``).

Modes (``auto`` picks the first that works here):

``user`` (the platform runs as root)
    root → a host user id of the run's own (``agent_user``) → bubblewrap. The uid owns only the
    agent's files, cannot signal platform processes, and every process it starts can be killed
    by it. Platform folders it could not traverse (``/root``) reach bubblewrap through bind
    mounts staged in a private mount namespace of root's.
``bwrap``
    The same sandbox without the uid drop (a platform that is not root).
``none``
    No isolation: a loud warning says what the agent can reach.

Where the kernel refuses a namespace, the run goes on without it and says loudly which
protection is missing; ``--sandbox none`` is the explicit opt-out.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import os
import select
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autorl.errors import AutoRLError
from autorl_agent_runner.sandbox.agent_user import allocate_uid
from autorl_agent_runner.sandbox.egress import RESOLV_CONF, check_tools
from autorl_agent_runner.sandbox.filesystem_view import Bind, FilesystemView, system_args
from autorl_agent_runner.sandbox.python_env import PythonEnv

_STAGING_PARENTS = (Path("/run"), Path("/dev/shm"), Path("/var/tmp"), Path("/tmp"))
#: Seconds bubblewrap may take to build the namespaces before the run is called failed.
START_TIMEOUT_S = 60.0
#: Namespaces and locks beyond the user namespace, each with what the agent keeps without it.
PROTECTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "pid": (("--unshare-pid",), "its own PID namespace: it sees every process and its command line"),
    "net": (
        ("--unshare-net",),
        "its own network namespace: it can connect to every service of this machine "
        "(database, Redis, the grader's admin API)",
    ),
    "ipc": (("--unshare-ipc",), "its own IPC namespace: it shares System V IPC with the platform"),
    "uts": (("--unshare-uts", "--hostname", "autorl-agent"), "its own host name"),
    "cgroup": (("--unshare-cgroup",), "its own cgroup namespace"),
    "userns-lock": (
        ("--disable-userns",),
        "the lock on nested user namespaces: it can build namespaces of its own",
    ),
}
_BASE_FLAGS = ("--unshare-user", "--die-with-parent", "--new-session")


class SandboxMode(enum.StrEnum):
    AUTO = "auto"
    USER = "user"
    BWRAP = "bwrap"
    NONE = "none"


class SandboxError(AutoRLError):
    """The requested isolation cannot be set up here."""


@dataclass(frozen=True)
class SandboxRequest:
    """What the agent needs to see; the sandbox shows nothing else."""

    workspace: Path
    #: Folders inside the workspace that are mounted read-only (models/, data/).
    read_only: Sequence[Path]
    python_env: PythonEnv
    #: A custom agent's executable (None for a built-in agent).
    program: Path | None = None
    #: Platform folders that must never be exposed (a guard on the allow-list).
    forbidden: Sequence[Path] = ()
    #: The grader is on this machine's loopback: the agent's network can be loopback only.
    loopback_grader: bool = True
    #: Internet access through a user-mode network stack (never the host).
    egress: bool = False


class Gate:
    """bubblewrap's start protocol: it reports its namespaces, then waits until released."""

    def __init__(self) -> None:
        self.info_read, self.info_write = os.pipe()
        self.block_read, self.block_write = os.pipe()
        # Each descriptor is closed once: a number closed twice may belong to another file by then.
        self._child_open = [self.info_write, self.block_read]
        self._parent_open = [self.info_read, self.block_write]

    @property
    def child_fds(self) -> tuple[int, ...]:
        return tuple(self._child_open)

    def close_child_side(self) -> None:
        _close(self._child_open)
        self._child_open = []

    def args(self) -> list[str]:
        return ["--info-fd", str(self.info_write), "--block-fd", str(self.block_read)]

    def wait_started(self, timeout_s: float = START_TIMEOUT_S) -> int:
        """The host pid of the sandbox's first process, once its namespaces exist."""
        data = b""
        while True:
            readable, _, _ = select.select([self.info_read], [], [], timeout_s)
            chunk = os.read(self.info_read, 65536) if readable else b""
            if not chunk:
                raise SandboxError("the sandbox did not start (bubblewrap's message is in agent.log)")
            data += chunk
            with contextlib.suppress(ValueError):
                return int(json.loads(data)["child-pid"])

    def release(self) -> None:
        os.write(self.block_write, b"1")

    def close(self) -> None:
        self.close_child_side()
        _close(self._parent_open)
        self._parent_open = []


@dataclass
class SandboxPlan:
    """How to start the agent: a command prefix, the descriptors it needs, who it runs as."""

    mode: SandboxMode
    prefix: tuple[str, ...] = ()
    uid: int | None = None
    gid: int | None = None
    gate: Gate | None = None
    #: The agent's network is its own loopback (the grader's agent API must be forwarded in).
    network_isolated: bool = False
    egress: bool = False
    #: The sandbox's first process is the init of a PID namespace of its own.
    pid_namespace: bool = False
    warning: str | None = None
    notes: list[str] = field(default_factory=list)
    data_fds: tuple[int, ...] = ()
    staging_dirs: tuple[Path, ...] = ()

    def command(self, argv: Sequence[str]) -> list[str]:
        return [*self.prefix, *argv]

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (*self.data_fds, *(self.gate.child_fds if self.gate else ()))

    def started(self) -> None:
        """The agent's process holds its copies now: close the platform's."""
        _close(self.data_fds)
        self.data_fds = ()
        if self.gate is not None:
            self.gate.close_child_side()

    def cleanup(self) -> None:
        """Close what is left and remove the (empty, on the host) staging folders."""
        self.started()
        if self.gate is not None:
            self.gate.close()
        for folder in self.staging_dirs:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _memfd(name: str, text: str) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, text.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _as_user(uid: int | None) -> list[str]:
    if uid is None:
        return []
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]


@functools.cache
def available_protections(uid: int | None) -> frozenset[str]:
    """The protections bubblewrap gets from this kernel when started as ``uid`` (None: as is).

    Raises SandboxError when not even a user namespace can be made.
    """

    def works(names: Sequence[str]) -> bool:
        flags = [flag for name in names for flag in PROTECTIONS[name][0]]
        command = [
            *_as_user(uid),
            "bwrap",
            *_BASE_FLAGS,
            *flags,
            *system_args(),
            "--",
            "/usr/bin/true",
        ]
        done = subprocess.run(command, capture_output=True, timeout=30)
        return done.returncode == 0

    if works(list(PROTECTIONS)):
        return frozenset(PROTECTIONS)
    if not works([]):
        raise SandboxError(
            "bubblewrap cannot create a user namespace on this kernel "
            "(check kernel.unprivileged_userns_clone and user.max_user_namespaces)"
        )
    return frozenset(name for name in PROTECTIONS if works([name]))


def missing_protections_warning(missing: Sequence[str]) -> str:
    lines = [f"  - no {PROTECTIONS[name][1]}" for name in missing]
    return "WARNING: this kernel refuses parts of the agent's sandbox; the agent runs without:\n" + "\n".join(
        lines
    )


def _bwrap_args(
    request: SandboxRequest, binds: Sequence[tuple[Bind, Path]], flags: Sequence[str], *, privileged: bool
) -> list[str]:
    """bubblewrap's options (without the command's name): namespaces, the view, the working folder."""
    args = [*_BASE_FLAGS, *flags]
    if privileged:  # bubblewrap started by root keeps capabilities unless told otherwise
        args += ["--cap-drop", "ALL"]
    args += system_args()
    for bind, source in binds:
        args += ["--bind" if bind.writable else "--ro-bind", str(source), str(bind.target)]
    args += ["--chdir", str(request.workspace)]
    return args


def _staging_parent() -> Path:
    for parent in _STAGING_PARENTS:
        if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK):
            return parent
    raise SandboxError("no folder for the sandbox's mount points (/run, /dev/shm, /var/tmp, /tmp)")


def plan_bubblewrap(request: SandboxRequest, *, as_own_user: bool) -> SandboxPlan:
    """The sandbox, with (``user``, root only) or without its own host user id."""
    needed = ["bwrap", *(["unshare", "setpriv", "mount"] if as_own_user else [])]
    for tool in needed:
        if shutil.which(tool) is None:
            raise SandboxError(
                f"`{tool}` is not installed (as root: apt-get install bubblewrap util-linux, or "
                "`make system-packages`); or pass --sandbox none"
            )
    if request.egress:
        if not request.loopback_grader:
            raise SandboxError("--egress needs the grader on this machine's loopback")
        check_tools()
    uid = allocate_uid() if as_own_user else None
    gid = uid
    available = available_protections(uid)
    wanted = [name for name in PROTECTIONS if name != "net" or request.loopback_grader]
    missing = [name for name in wanted if name not in available]
    flags = [flag for name in wanted if name in available for flag in PROTECTIONS[name][0]]
    notes: list[str] = []
    if not request.loopback_grader:
        notes.append("the grader is not on loopback: the agent shares the host's network namespace")
    view = FilesystemView(
        workspace=request.workspace,
        read_only=request.read_only,
        python_paths=request.python_env.runtime_paths(),
        program=request.program,
        forbidden=request.forbidden,
        resolv_conf=RESOLV_CONF if request.egress else None,
    )
    binds = view.binds()
    notes += view.notes
    in_view_uid = uid if uid is not None else os.geteuid()
    in_view_gid = gid if gid is not None else os.getegid()
    data_fds: list[int] = []
    data_args: list[str] = []
    for target, text in view.etc_files(in_view_uid, in_view_gid).items():
        fd = _memfd(Path(target).name, text)
        data_fds.append(fd)
        data_args += ["--ro-bind-data", str(fd), target]
    gate = Gate()
    staging_dirs: list[Path] = []
    if as_own_user:
        staging = Path(tempfile.mkdtemp(prefix="autorl-sandbox-", dir=_staging_parent()))
        staging_dirs.append(staging)
        sources = [(bind, staging / str(index)) for index, bind in enumerate(binds)]
        options = _bwrap_args(request, sources, flags, privileged=False)
        prefix = _staged(staging, sources, uid=uid)
    else:
        direct = [(bind, bind.source) for bind in binds]
        options = _bwrap_args(request, direct, flags, privileged=os.geteuid() == 0)
        prefix = []
    options += [*data_args, *gate.args()]
    args_fd = _memfd("bwrap-args", "".join(f"{option}\0" for option in options))
    data_fds.append(args_fd)
    # bubblewrap sets PWD after --chdir; the agent's environment must be exactly the contract's.
    env = shutil.which("env") or "/usr/bin/env"
    bwrap = ["bwrap", "--args", str(args_fd), "--", env, "-u", "PWD", "-u", "OLDPWD", "--"]
    warning = missing_protections_warning(missing) if missing else None
    return SandboxPlan(
        mode=SandboxMode.USER if as_own_user else SandboxMode.BWRAP,
        prefix=(*prefix, *bwrap),
        uid=uid,
        gid=gid,
        gate=gate,
        network_isolated="net" in available and request.loopback_grader,
        egress=request.egress,
        pid_namespace="pid" in available,
        warning=warning,
        notes=notes,
        data_fds=tuple(data_fds),
        staging_dirs=tuple(staging_dirs),
    )


def _staged(staging: Path, sources: Sequence[tuple[Bind, Path]], *, uid: int | None) -> list[str]:
    """root, in a private mount namespace: each platform folder bind-mounted under ``staging``
    (a tmpfs there, so the host sees an empty folder), then the agent's user runs bubblewrap."""
    q = shlex.quote
    lines = ["set -e", f"mount -t tmpfs -o mode=0755,size=1m autorl-sandbox {q(str(staging))}"]
    for bind, mount_point in sources:
        make = "mkdir" if bind.source.is_dir() else "touch"
        lines.append(f"{make} {q(str(mount_point))}")
        lines.append(f"mount --bind {q(str(bind.source))} {q(str(mount_point))}")
    lines.append(f'exec {shlex.join(_as_user(uid))} "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", "\n".join(lines), "sh"]


def unsandboxed_warning(reason: str) -> str:
    return (
        "WARNING: the agent runs WITHOUT a sandbox "
        f"({reason}). It runs as {_whoami()} and can read everything that user can (the platform "
        "home with its database and tokens, other runs, test data), reach every local service "
        "(database, Redis, the grader's admin API) and signal platform processes. For isolation, "
        "install bubblewrap (as root: `apt-get install bubblewrap`, or `make system-packages`) and "
        "leave --sandbox at auto."
    )


def _whoami() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def plan_sandbox(requested: SandboxMode, request: SandboxRequest) -> SandboxPlan:
    """Resolve ``requested`` (``auto`` picks the strongest mode available) into a plan."""
    is_root = os.geteuid() == 0
    if requested is SandboxMode.USER:
        if not is_root:
            raise SandboxError("--sandbox user needs the platform to run as root; use bwrap or none")
        return plan_bubblewrap(request, as_own_user=True)
    if requested is SandboxMode.BWRAP:
        return plan_bubblewrap(request, as_own_user=False)
    if requested is SandboxMode.NONE:
        if request.egress:
            raise SandboxError("--egress needs the sandbox (it is the agent's network); drop --sandbox none")
        return SandboxPlan(mode=SandboxMode.NONE, warning=unsandboxed_warning("--sandbox none"))
    try:
        return plan_bubblewrap(request, as_own_user=is_root)
    except SandboxError as exc:
        if request.egress:
            raise
        return SandboxPlan(mode=SandboxMode.NONE, warning=unsandboxed_warning(str(exc)))


def resolve_mode(requested: SandboxMode) -> SandboxMode:
    """The mode ``plan_sandbox`` will most likely use (cheap checks, nothing is set up)."""
    if requested is not SandboxMode.AUTO:
        return requested
    if shutil.which("bwrap") is None:
        return SandboxMode.NONE
    return SandboxMode.USER if os.geteuid() == 0 else SandboxMode.BWRAP


def can_share_base_model(mode: SandboxMode) -> bool:
    """Whether models/ may hard-link the cached base model.

    Read-only mounts (user, bwrap) and file modes (a non-root agent) keep an agent from writing
    through the links; root without a sandbox ignores file modes, so it gets a copy.
    """
    return mode is not SandboxMode.NONE or os.geteuid() != 0


def check_agent_readable(mode: SandboxMode, program: Path, *, executed: bool = True) -> None:
    """In the ``user`` sandbox the agent runs as another user: its program must be readable.

    The folders above it need not be (the sandbox mounts it at its path), its own folder and the
    file must (and be executable when ``executed``; a start script run by bash need not be).
    Checked before anything starts, so that the failure is a message, not a run.
    """
    if mode is not SandboxMode.USER:
        return
    folder = program.parent
    needed = stat.S_IROTH | (stat.S_IXOTH if executed else 0)
    if (folder.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH)) != stat.S_IROTH | stat.S_IXOTH or (
        program.stat().st_mode & needed
    ) != needed:
        bits = "rx" if executed else "r"
        raise SandboxError(
            f"the agent {program} is not readable by the sandboxed agent's user; run "
            f"`chmod o+rx {folder} && chmod o+{bits} {program}` or pass --sandbox none"
        )
