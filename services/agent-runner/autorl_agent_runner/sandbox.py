"""Agent isolation on a single machine (DESIGN.md, "Trust model").

Three modes, chosen by ``auto`` in this order:

``user`` (the platform runs as root)
    The agent runs as a user id of its own (no passwd entry needed), with no capabilities and
    ``no_new_privs``, inside a private mount namespace in which
    - the platform home, cache and evaluator folders, the invoking user's home and ``/tmp`` are
      replaced by empty tmpfs "skeletons" that hold only what the agent needs: its workspace
      (read-write) and the Python installation it runs (read-only);
    - a folder the agent's user could not traverse (``/root`` is 0700) is replaced the same
      way, so the workspace and interpreter keep their absolute paths;
    - ``models/`` and ``data/`` are read-only mounts.
    Its own uid keeps it from signalling platform processes, and lets every process it started
    be killed at the deadline (``kill(-1)`` as that uid), wherever they moved.
``bwrap`` (not root, bubblewrap installed)
    The same view built by bubblewrap, in a PID namespace that dies with it.
``none``
    No isolation: a loud warning says what the agent can reach.

Not covered on a single machine: network isolation (an agent can open connections to local
services; the database and Redis need credentials it is never given) and resource limits.
"""

from __future__ import annotations

import contextlib
import enum
import os
import random
import shlex
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autorl.errors import AutoRLError

#: User ids handed to agents. No passwd entry is needed; ids with one are skipped.
AGENT_UID_RANGE = range(61000, 65000)
_STAGING_PARENTS = (Path("/run"), Path("/dev/shm"), Path("/var/tmp"), Path("/tmp"))
_SHARED_TMP = (Path("/tmp"),)


class SandboxMode(enum.StrEnum):
    AUTO = "auto"
    USER = "user"
    BWRAP = "bwrap"
    NONE = "none"


class SandboxError(AutoRLError):
    """The requested isolation cannot be set up here."""


@dataclass(frozen=True)
class SandboxPlan:
    """How to start the agent: a command prefix, and the user id it runs as (``user`` mode)."""

    mode: SandboxMode
    prefix: tuple[str, ...] = ()
    uid: int | None = None
    gid: int | None = None
    staging_dirs: tuple[Path, ...] = ()
    warning: str | None = None
    details: dict[str, str] = field(default_factory=dict)

    def command(self, argv: Sequence[str]) -> list[str]:
        return [*self.prefix, *argv]

    def cleanup(self) -> None:
        """Remove the (empty, on the host) mount points used to build the namespace."""
        for folder in self.staging_dirs:
            with contextlib.suppress(OSError):
                folder.rmdir()


def runtime_paths() -> list[Path]:
    """What the agent's Python needs to read: the interpreter, the venv and the platform's packages."""
    import importlib.util

    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent}
    paths.update(Path(entry) for entry in sys.path if entry and Path(entry).exists())
    for package in ("autorl", "autorl_agent_runner"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin:
            paths.add(Path(spec.origin).parent.parent)
    resolved = {Path(os.path.realpath(p)) for p in paths} | {p.absolute() for p in paths}
    return sorted(p for p in resolved if p.exists() and p != Path("/"))


def _inside(path: Path, root: Path) -> bool:
    return path != root and path.is_relative_to(root)


def _blocked_ancestor(path: Path) -> Path | None:
    """The topmost ancestor of ``path`` that a user other than its owner cannot traverse."""
    for ancestor in reversed(path.parents):
        if ancestor == Path("/"):
            continue
        try:
            mode = ancestor.stat().st_mode
        except OSError:
            return None
        if not mode & stat.S_IXOTH:
            return ancestor
    return None


def _outermost(paths: Iterable[Path]) -> list[Path]:
    unique = sorted(set(paths), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in unique:
        if not any(path == k or _inside(path, k) for k in kept):
            kept.append(path)
    return kept


@dataclass(frozen=True)
class _Exposure:
    path: Path
    writable: bool


def _skeleton_lines(target: Path, staging: Path, exposures: Sequence[_Exposure], mode: int) -> list[str]:
    """Shell lines that put a tmpfs holding only ``exposures`` over ``target``."""
    q = shlex.quote
    lines = [f"mount -t tmpfs -o mode={mode:o},size=16m autorl-sandbox {q(str(staging))}"]
    covered: list[Path] = []
    for exposure in sorted(exposures, key=lambda e: len(e.path.parts)):
        inner = exposure.path.relative_to(target)
        # A read-only folder inside one already bound brings nothing new.
        if not exposure.writable and any(exposure.path.is_relative_to(c) for c in covered):
            continue
        mount_point = staging / inner
        if exposure.path.is_dir():
            lines.append(f"mkdir -p {q(str(mount_point))}")
        else:
            lines.append(f"mkdir -p {q(str(mount_point.parent))} && touch {q(str(mount_point))}")
        lines.append(f"mount --rbind {q(str(exposure.path))} {q(str(mount_point))}")
        if exposure.writable:
            lines.append(f"mount -o remount,bind,rw {q(str(mount_point))}")
        else:
            covered.append(exposure.path)
            lines.append(f"mount -o remount,bind,ro {q(str(mount_point))}")
    lines.append(f"mount --move {q(str(staging))} {q(str(target))}")
    return lines


def _staging_parent(avoid: Sequence[Path]) -> Path:
    for parent in _STAGING_PARENTS:
        if (
            parent.is_dir()
            and os.access(parent, os.W_OK | os.X_OK)
            and not any(parent == a or parent.is_relative_to(a) for a in avoid)
        ):
            return parent
    raise SandboxError("no folder for the sandbox's mount points (/run, /dev/shm, /var/tmp, /tmp)")


def allocate_uid() -> int:
    """A user id no account and no running process uses (so it is this run's alone)."""
    import pwd

    busy = _process_uids()
    candidates = list(AGENT_UID_RANGE)
    random.shuffle(candidates)
    for uid in candidates:
        if uid in busy:
            continue
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise SandboxError(f"no free user id in {AGENT_UID_RANGE.start}-{AGENT_UID_RANGE.stop - 1} for the agent")


def _process_uids() -> set[int]:
    uids: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uids.add(entry.stat().st_uid)
            except OSError:
                continue
    return uids


def plan_user_sandbox(
    *,
    workspace: Path,
    read_only: Sequence[Path],
    hidden: Sequence[Path],
    exposed: Sequence[Path] = (),
    uid: int | None = None,
) -> SandboxPlan:
    """Root only: a private mount namespace, then the agent's own uid (see the module docstring)."""
    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            raise SandboxError(
                f"`{tool}` (util-linux) is not installed; install util-linux or use --sandbox none"
            )
    agent_uid = allocate_uid() if uid is None else uid
    exposures = [
        _Exposure(workspace, True),
        *(_Exposure(p, False) for p in [*runtime_paths(), *exposed]),
    ]
    # The workspace's own parents stay hidden unless the interpreter lives there too.
    blocked = _outermost(b for e in exposures if (b := _blocked_ancestor(e.path)) is not None)
    hidden_roots = _outermost([*(h for h in hidden if h.exists()), *(t for t in _SHARED_TMP if t.is_dir())])
    staging_parent = _staging_parent([*blocked, *hidden_roots])
    staging_dirs: list[Path] = []
    lines = ["set -e"]

    def skeleton(target: Path, mode: int) -> None:
        staging = Path(tempfile.mkdtemp(prefix="autorl-sandbox-", dir=staging_parent))
        staging_dirs.append(staging)
        inside = [e for e in exposures if _inside(e.path, target)]
        lines.extend(_skeleton_lines(target, staging, inside, mode))

    for root in blocked:
        skeleton(root, 0o755)
    for root in hidden_roots:
        if any(root == b for b in blocked):
            continue
        already_hidden = any(_inside(root, b) for b in blocked) and not any(
            root.is_relative_to(e.path) for e in exposures
        )
        if not already_hidden:
            skeleton(root, 0o1777 if root in _SHARED_TMP else 0o755)
    q = shlex.quote
    for folder in read_only:
        lines.append(f"mount --bind {q(str(folder))} {q(str(folder))}")
        lines.append(f"mount -o remount,bind,ro {q(str(folder))}")
    # Re-enter the workspace through the new mounts: a working folder inherited from before
    # them would reach the real tree (and its parents) past the skeletons.
    lines.append(f"cd {q(str(workspace))}")
    # sh exports PWD/OLDPWD after cd; the agent's environment must be exactly the contract's.
    lines.append("unset PWD OLDPWD")
    lines.append(
        f"exec setpriv --reuid={agent_uid} --regid={agent_uid} --clear-groups --no-new-privs "
        '--inh-caps=-all --bounding-set=-all -- "$@"'
    )
    prefix = ("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", "\n".join(lines), "sh")
    return SandboxPlan(
        mode=SandboxMode.USER,
        prefix=prefix,
        uid=agent_uid,
        gid=agent_uid,
        staging_dirs=tuple(staging_dirs),
        details={"uid": str(agent_uid), "hidden": ",".join(str(p) for p in [*blocked, *hidden_roots])},
    )


def plan_bwrap_sandbox(
    *, workspace: Path, read_only: Sequence[Path], hidden: Sequence[Path], exposed: Sequence[Path] = ()
) -> SandboxPlan:
    """bubblewrap: the host read-only, hidden folders as empty tmpfs, the workspace writable."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bubblewrap is not installed (apt-get install bubblewrap) ; or use --sandbox none")
    args = [bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
    covers = _outermost([*(h for h in hidden if h.exists()), *(t for t in _SHARED_TMP if t.is_dir())])
    for root in covers:
        args += ["--tmpfs", str(root)]
    # What the agent must read but a tmpfs now hides: its interpreter, its own folder.
    for path in [*runtime_paths(), *exposed]:
        if any(path == c or _inside(path, c) for c in covers):
            args += ["--ro-bind", str(path), str(path)]
    args += ["--bind", str(workspace), str(workspace)]
    for folder in read_only:
        args += ["--ro-bind", str(folder), str(folder)]
    args += ["--unshare-pid", "--unshare-ipc", "--die-with-parent", "--chdir", str(workspace), "--"]
    # bubblewrap sets PWD after --chdir (after any --unsetenv); the agent's environment must be
    # exactly the contract's.
    args += [shutil.which("env") or "/usr/bin/env", "-u", "PWD", "--"]
    return SandboxPlan(mode=SandboxMode.BWRAP, prefix=tuple(args))


def unsandboxed_warning(reason: str) -> str:
    return (
        "WARNING: the agent runs WITHOUT a sandbox "
        f"({reason}). It runs as {_whoami()} and can read everything that user can (the platform "
        "home with its database and tokens, other runs), and signal platform processes. For "
        "isolation, run the platform as root (the agent then gets a user of its own) or install "
        "bubblewrap, and leave --sandbox at auto."
    )


def _whoami() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def plan_sandbox(
    requested: SandboxMode,
    *,
    workspace: Path,
    read_only: Sequence[Path],
    hidden: Sequence[Path],
    exposed: Sequence[Path] = (),
) -> SandboxPlan:
    """Resolve ``requested`` (``auto`` picks the strongest mode available) into a plan.

    ``exposed`` are extra folders the agent must read (a custom agent's own folder).
    """
    is_root = os.geteuid() == 0

    def user() -> SandboxPlan:
        return plan_user_sandbox(workspace=workspace, read_only=read_only, hidden=hidden, exposed=exposed)

    def bwrap() -> SandboxPlan:
        return plan_bwrap_sandbox(workspace=workspace, read_only=read_only, hidden=hidden, exposed=exposed)

    if requested is SandboxMode.USER:
        if not is_root:
            raise SandboxError("--sandbox user needs the platform to run as root; use bwrap or none")
        return user()
    if requested is SandboxMode.BWRAP:
        return bwrap()
    if requested is SandboxMode.NONE:
        return SandboxPlan(mode=SandboxMode.NONE, warning=unsandboxed_warning("--sandbox none"))
    reasons: list[str] = []
    if is_root:
        try:
            return user()
        except SandboxError as exc:
            reasons.append(str(exc))
    if shutil.which("bwrap"):
        return bwrap()
    reasons.append("not root" if not is_root else "user sandbox unavailable")
    reasons.append("bubblewrap not installed")
    return SandboxPlan(mode=SandboxMode.NONE, warning=unsandboxed_warning("; ".join(reasons)))


def resolve_mode(requested: SandboxMode) -> SandboxMode:
    """The mode ``plan_sandbox`` will most likely use (cheap checks, nothing is set up)."""
    if requested is not SandboxMode.AUTO:
        return requested
    if os.geteuid() == 0 and all(shutil.which(t) for t in ("unshare", "setpriv", "mount")):
        return SandboxMode.USER
    return SandboxMode.BWRAP if shutil.which("bwrap") else SandboxMode.NONE


def can_share_base_model(mode: SandboxMode) -> bool:
    """Whether models/ may hard-link the cached base model.

    Read-only mounts (user, bwrap) and file modes (a non-root agent) keep an agent from writing
    through the links; root without a sandbox ignores file modes, so it gets a copy.
    """
    return mode is not SandboxMode.NONE or os.geteuid() != 0


def check_agent_readable(mode: SandboxMode, program: Path, *, executed: bool = True) -> None:
    """In the ``user`` sandbox the agent runs as another user: its program must be readable.

    The folders above it need not be (the sandbox re-creates the path), its own folder and the
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


def give_to_agent(paths: Iterable[Path], uid: int, gid: int) -> None:
    """Let the agent's user, and only it, write and read these folders (workspace root, code/, output/)."""
    for path in paths:
        os.chown(path, uid, gid)
        path.chmod(0o700)


def reclaim(root: Path) -> None:
    """Give everything the agent wrote back to the platform's user, links not followed.

    Afterwards the agent's uid owns nothing, so it can be handed to a later run safely.
    """
    uid, gid = os.geteuid(), os.getegid()
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            try:
                os.lchown(os.path.join(folder, name), uid, gid)
            except OSError:
                continue
    os.lchown(root, uid, gid)


def signal_uid(uid: int, gid: int, signum: int) -> None:
    """Send ``signum`` to every process of ``uid`` (``kill(-1)`` from a child running as it).

    Race-free where a /proc scan is not: a process cannot fork out of its user id.
    """
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit (the parent may hold locks)
        code = 0
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.kill(-1, signum)
        except ProcessLookupError:
            pass
        except BaseException:
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)


def uid_processes(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids
