"""Checkpoints an agent saves under its own user, read by the grader through the workspace's group.

Real users, as on a cluster (as root here; each side drops to its user): the workspace is laid out
by ownership.py's own functions, the agent's user saves with ``save_pretrained`` (safetensors writes
the weights 0600), the keeper (``autorl agent-runner mirror --group-readable``, the custom image's
sidecar; the runner does the same beside a built-in agent) runs as the agent's user, and the grader
reads as the platform's. Then what an agent told to maximise a score might do with a process that
changes modes for it: links out of the workspace, hard links to other users' files, fifos, deep
trees, entries swapped while walked. And with no keeper: the grader's refusal.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from autorl.checkpoints.snapshot import snapshot_base_model, snapshot_submission
from autorl_agent_runner.workspace.group_read import MAX_DEPTH, WalkResult, make_group_readable
from autorl_agent_runner.workspace.ownership import claim_workspace, open_experiments_folder
from tests.support.grading import RegisteredExperiment, register, submit_no_wait
from tests.support.infra import free_port
from tests.support.service_processes import service_env, stop, wait_until_serving
from tests.support.settings import DeploymentSettings
from tests.support.users import AGENT_A, AGENT_B, PLATFORM, Outcome, as_user, call_as, setpriv, shared_volume
from tests.support.waiting import wait_for

pytestmark = pytest.mark.requires(
    os.geteuid() == 0 and shutil.which("setpriv") is not None, reason="needs root and setpriv to switch users"
)

AUTORL = str(Path(sys.executable).parent / "autorl")
AGENT = AGENT_A
#: save_pretrained as a user's program does it (TRL scripts end so).
SAVE = """
import sys, tempfile
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
base, output, fresh = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "mkdtemp"
folder = (Path(tempfile.mkdtemp(dir=output)) if fresh else output) / "ckpt"
AutoModelForCausalLM.from_pretrained(base).save_pretrained(folder)
AutoTokenizer.from_pretrained(base).save_pretrained(folder)
print(folder)
"""


@dataclass
class Volume:
    """A shared volume with one experiment's workspace on it, as the prepare Job leaves it."""

    base: Path
    workspace: Path
    #: The cached base model: the platform's, readable by everyone who mounts it.
    model: Path
    #: The grader's snapshot storage (the platform's user).
    snapshots: Path
    #: A file of the platform's user beside the workspace, mode 0600: no agent may read it.
    platform_secret: Path
    #: A file of the agent's user outside its workspace, mode 0600.
    agent_elsewhere: Path

    @property
    def output(self) -> Path:
        return self.workspace / "output"


def make_output(workspace: Path) -> None:
    (workspace / "output").mkdir()


@pytest.fixture
def volume(tiny_base_model: Path) -> Iterator[Volume]:
    with shared_volume() as shared:
        base = shared.parent
        model = base / "model"
        shutil.copytree(tiny_base_model, model)
        for path in [model, *model.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        snapshots = base / "snapshots"
        snapshots.mkdir()
        os.chown(snapshots, PLATFORM, PLATFORM)
        # The platform's folder for a namespace's experiments, then the experiment's own (its user,
        # in the platform group only while preparing, as the prepare pod's fsGroup makes it).
        experiments = shared / "experiments"
        assert call_as(PLATFORM, open_experiments_folder, experiments, groups=[PLATFORM]).ok
        workspace = experiments / "exp-a"
        claimed = call_as(AGENT, claim_workspace, workspace, PLATFORM, groups=[PLATFORM])
        assert claimed.ok, claimed.value
        assert call_as(AGENT, make_output, workspace).ok
        secrets = {}
        for name, owner in (("platform-secret", PLATFORM), ("agent-elsewhere", AGENT)):
            secret = base / name
            secret.write_text("not for the grader's group\n")
            os.chown(secret, owner, owner)
            secret.chmod(0o600)
            secrets[name] = secret
        # Warm the snapshot code up here: a child of another user cannot import from /root.
        shutil.rmtree(snapshot_base_model(model, base / "warm-up").path)
        yield Volume(
            base, workspace, model, snapshots, secrets["platform-secret"], secrets["agent-elsewhere"]
        )


def save_checkpoint(volume: Volume, *, fresh_folder: bool) -> Path:
    """save_pretrained of the tiny model as the agent's user (in no other group, as in its pod)."""
    home = volume.base / "agent-home"
    home.mkdir(exist_ok=True)
    os.chown(home, AGENT, AGENT)
    env = os.environ | {"HOME": str(home), "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", SAVE, str(volume.model), str(volume.output)]
    command.append("mkdtemp" if fresh_folder else "plain")
    saved = subprocess.run(
        [*setpriv(AGENT, read_anything=True), *command],
        capture_output=True,
        text=True,
        env=env,
        umask=0o022,
        timeout=300,
    )
    assert saved.returncode == 0, saved.stderr[-3000:]
    return Path(saved.stdout.strip().splitlines()[-1])


def grader_reads(volume: Volume, folder: Path) -> Callable[[], object]:
    """The grader's own check and copy of a submitted folder, as a plain function for call_as."""

    def snapshot() -> str:
        taken = snapshot_submission(
            folder,
            workspace=volume.workspace,
            output_dir=volume.output,
            base_model_dir=volume.model,
            snapshot_root=volume.snapshots,
        )
        return taken.fingerprint

    return snapshot


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.parametrize(
    "sidecar_command",
    [["group-read"], ["mirror", "--group-readable"]],
    ids=["built-in agent's sidecar", "custom image's sidecar"],
)
def test_save_pretrained_checkpoint_becomes_readable_to_the_grader(
    volume: Volume, sidecar_command: list[str]
) -> None:
    # As in the agent's pod: the agent's user, the platform's group as the sidecar's own.
    sidecar = subprocess.Popen(
        [
            *setpriv(AGENT, gid=PLATFORM, read_anything=True),
            AUTORL,
            "agent-runner",
            *sidecar_command,
            "--workspace",
            str(volume.workspace),
        ],
        # No grader answers here: the mirrors are skipped, the workspace is still kept readable.
        env=os.environ
        | {
            "GRADING_SERVER_URL": f"http://127.0.0.1:{free_port()}/a/token",
            "AUTORL_TOKEN": "token",
            "BASE_MODEL": "builtin:tiny-qwen2",
            "HOME": "/tmp",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # In a folder of its own from mkdtemp (0700), as atomic savers do.
        checkpoint = save_checkpoint(volume, fresh_folder=True)
        read = grader_reads(volume, checkpoint)
        tries: list[Outcome] = []

        def readable() -> bool:
            tries.append(call_as(PLATFORM, read, groups=[PLATFORM]))
            return tries[-1].ok

        try:
            wait_for(readable, "the grader to read it", 20)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last answer: {tries[-1].value}") from None
    finally:
        sidecar.send_signal(signal.SIGTERM)
        output = sidecar.communicate(timeout=60)[0].decode()
    assert sidecar.returncode == 0, output
    # Group-read added and nothing else: never for other users, never group-write (safetensors
    # wrote the weights 0600, mkdtemp the folder 0700).
    assert mode(checkpoint / "model.safetensors") == 0o640
    # The folder keeps its setgid bit: what is saved there later still gets the platform's group.
    assert mode(checkpoint.parent) == 0o2750
    assert (checkpoint / "model.safetensors").stat().st_gid == PLATFORM
    assert not [path for path in [checkpoint, *checkpoint.iterdir()] if mode(path) & stat.S_IWGRP]
    # Another experiment's agent still reads nothing of it.
    refused = as_user(AGENT_B, "cat", str(checkpoint / "model.safetensors"))
    assert refused.returncode != 0
    # Fixed quietly (debug level only): the sidecar said nothing about each file.
    assert "model.safetensors" not in output


def plant(volume: Volume) -> None:
    """What the agent leaves for the keeper: links out, a fifo, its own private files."""
    output = volume.output
    (output / "to-platform-secret").symlink_to(volume.platform_secret)
    (output / "to-own-file-elsewhere").symlink_to(volume.agent_elsewhere)
    (output / "to-the-volume").symlink_to(volume.base)
    os.mkfifo(output / "fifo", 0o600)
    private = output / "private"
    private.mkdir(mode=0o700)
    (private / "weights").write_bytes(b"w")
    (private / "weights").chmod(0o600)


def test_the_keeper_follows_no_link_and_changes_nothing_but_the_agents_own_files(volume: Volume) -> None:
    assert call_as(AGENT, plant, volume).ok
    # A hard link to the platform's file (a kernel without protected_hardlinks lets an agent make one).
    os.link(volume.platform_secret, volume.output / "hard-link")
    # A set-group-id program of the platform's group (no agent can make one: it stands for any way).
    program = volume.output / "program"
    program.write_bytes(b"#!/bin/sh\n")
    os.chown(program, AGENT, PLATFORM)
    program.chmod(0o2700)
    walked = call_as(AGENT, make_group_readable, volume.workspace, gid=PLATFORM)
    assert walked.ok, walked.value
    assert isinstance(walked.value, WalkResult) and walked.value.fixed == 3
    assert mode(program) == 0o740
    assert mode(volume.output / "private") == 0o2750
    assert mode(volume.output / "private" / "weights") == 0o640
    # Untouched: the links' targets, the other user's file behind the hard link, the fifo.
    assert mode(volume.platform_secret) == 0o600
    assert mode(volume.agent_elsewhere) == 0o600
    assert mode(volume.base) == 0o755
    assert mode(volume.output / "fifo") == 0o600
    assert call_as(PLATFORM, volume.platform_secret.read_text, groups=[PLATFORM]).ok
    assert not call_as(AGENT, volume.platform_secret.read_text).ok


def save_privately(output: Path) -> None:
    (output / "run").mkdir(mode=0o700)
    (output / "run" / "weights").write_bytes(b"w")
    (output / "run" / "weights").chmod(0o600)


def test_outside_the_platform_group_the_keeper_never_strips_a_setgid_bit(volume: Volume) -> None:
    assert call_as(AGENT, save_privately, volume.output).ok
    walked = call_as(AGENT, make_group_readable, volume.workspace)  # the agent's own group only
    assert walked.ok, walked.value
    # The kernel would drop the folder's setgid bit on a chmod by a user outside its group, and files
    # saved there later would get the agent's group for good: the folder is left as it was.
    assert mode(volume.output / "run") == 0o2700
    assert mode(volume.output / "run" / "weights") == 0o640


def test_a_folder_the_grader_may_not_enter_is_named_with_its_fix(volume: Volume) -> None:
    assert call_as(AGENT, save_privately, volume.output).ok  # mkdtemp's 0700, no keeper
    refused = call_as(PLATFORM, grader_reads(volume, volume.output / "run" / "ckpt"), groups=[PLATFORM])
    assert not refused.ok
    assert refused.value.startswith(
        "UnreadableCheckpointError: $WORKSPACE/output/run cannot be read by the grader (permission denied)"
    )
    assert 'chmod -R g+rX "$WORKSPACE/output/run"' in refused.value
    assert list(volume.snapshots.iterdir()) == []


def nest(root: Path, depth: int) -> None:
    folder = root
    for _ in range(depth):
        folder = folder / "d"
        folder.mkdir(mode=0o700)
    (folder / "deepest").write_bytes(b"x")


def test_a_tree_deeper_than_the_limit_is_walked_down_to_it(volume: Volume) -> None:
    assert call_as(AGENT, nest, volume.output, MAX_DEPTH + 20).ok
    walked = call_as(AGENT, make_group_readable, volume.workspace, gid=PLATFORM)
    assert walked.ok, walked.value
    folders = [volume.output / Path(*["d"] * level) for level in range(1, MAX_DEPTH + 21)]
    readable = [mode(folder) & 0o050 == 0o050 for folder in folders]
    # The workspace is level 0, output/ level 1: its folders are fixed down to MAX_DEPTH.
    assert readable == [True] * (MAX_DEPTH - 1) + [False] * 21


def churn_while_walking(volume: Volume) -> int:
    """Entries created, removed and swapped for links while the keeper walks, over and over."""
    stop = threading.Event()
    churn = volume.output / "churn"
    churn.mkdir()

    def swap() -> None:
        index = 0
        while not stop.is_set():
            entry = churn / f"e{index % 20}"
            entry.mkdir(mode=0o700)
            (entry / "f").write_bytes(b"x")
            (entry / "f").unlink()
            entry.rmdir()
            entry.symlink_to(volume.platform_secret)
            entry.unlink()
            index += 1

    swapper = threading.Thread(target=swap)
    swapper.start()
    walks = 0
    deadline = time.monotonic() + 3
    try:
        while time.monotonic() < deadline:
            make_group_readable(volume.workspace)
            walks += 1
    finally:
        stop.set()
        swapper.join()
    return walks


def test_entries_that_vanish_or_become_links_mid_walk_are_skipped(volume: Volume) -> None:
    churned = call_as(AGENT, churn_while_walking, volume, gid=PLATFORM)
    assert churned.ok, churned.value
    assert churned.value > 10
    assert mode(volume.platform_secret) == 0o600


@pytest.fixture
def grader_settings(
    make_settings: Callable[..., DeploymentSettings],
    tmp_path: Path,
    pg_url: str,
    redis_url: str,
    fresh_queue_prefix: str,
) -> DeploymentSettings:
    """A grader on the real Postgres and Redis of the test run, its snapshots in ``tmp_path``."""
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    queue = {"redis_url": redis_url, "redis_key_prefix": fresh_queue_prefix}
    return make_settings(database_url=pg_url, snapshot_dir=snapshots, **queue)


def test_without_the_keeper_the_grader_refuses_and_says_what_to_do(
    volume: Volume, grader_settings: DeploymentSettings, tmp_path: Path
) -> None:
    settings = grader_settings
    settings.home.mkdir(parents=True)
    port = free_port()
    log = tmp_path / "grader.log"
    # One agent thread: waits that held it would hold up every other request.
    env = service_env(settings) | {"AUTORL_UNREADABLE_WAIT_S": "3", "AUTORL_AGENT_THREADS": "1"}
    # The grader under user 0 stripped of every capability, in the platform's group: reads through
    # the group like the platform's user, and can start Python from /root, which that user cannot.
    unprivileged = ["setpriv", f"--regid={PLATFORM}", f"--groups={PLATFORM}", "--inh-caps=-all"]
    unprivileged.append("--bounding-set=-all")
    with log.open("wb") as out:
        grader = subprocess.Popen(
            [*unprivileged, AUTORL, "grader", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_serving(url, grader, log)
        with httpx.Client(base_url=url, timeout=120) as client:
            experiment = register(client, settings, volume.model, volume.workspace)
            checkpoint = save_checkpoint(volume, fresh_folder=False)
            assert mode(checkpoint / "model.safetensors") == 0o600  # what safetensors writes
            before = sorted(p.name for p in (tmp_path / "snapshots").iterdir())

            started = time.monotonic()
            refused = client.post(f"{experiment.url_path}/submit", json={"model_path": "output/ckpt"})
            waited = time.monotonic() - started
            assert refused.status_code == 400, refused.text
            detail = refused.json()["detail"]
            assert "$WORKSPACE/output/ckpt/model.safetensors cannot be read by the grader" in detail
            assert 'chmod -R g+rX "$WORKSPACE/output/ckpt"' in detail
            assert refused.json()["error"] == detail
            assert waited >= 2.5  # it gave the keeper its chance first
            # Nothing counted, nothing left behind.
            assert client.get(f"{experiment.url_path}/scores").json()["total_submissions"] == 0
            assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == before

            # Two at once: they take the experiment's turn one after the other (autorl_grader.snapshot_slots),
            # each giving the keeper its chance; the second waits for its turn in the event loop.
            def submit_timed() -> float:
                began = time.monotonic()
                answer = client.post(f"{experiment.url_path}/submit", json={"model_path": "output/ckpt"})
                assert answer.status_code == 400 and answer.json()["detail"] == detail
                return time.monotonic() - began

            with ThreadPoolExecutor(2) as pool:
                took = sorted(pool.map(lambda _: submit_timed(), range(2)))
            assert took[0] >= 2.5 and took[1] >= 5.0, took
            assert client.get(f"{experiment.url_path}/scores").json()["total_submissions"] == 0

            # Two experiments at once: each waits at the same time (one turn per experiment, not per grader).
            other = register(client, settings, volume.model, unreadable_copy(volume, checkpoint, AGENT_B))

            def submit_to(target: RegisteredExperiment) -> float:
                began = time.monotonic()
                answer = client.post(f"{target.url_path}/submit", json={"model_path": "output/ckpt"})
                assert answer.status_code == 400 and "cannot be read by the grader" in answer.json()["detail"]
                return time.monotonic() - began

            with ThreadPoolExecutor(2) as pool:
                waiting = [pool.submit(submit_to, target) for target in (experiment, other)]
                time.sleep(1.0)
                began = time.monotonic()
                scores = client.get(f"{experiment.url_path}/scores")
                read_s = time.monotonic() - began
                took = [future.result() for future in waiting]
            assert min(took) >= 2.5, took
            # Waiting, they hold no thread: the one agent thread serves a read meanwhile, and the
            # two wait at the same time, not one after the other.
            assert scores.status_code == 200 and read_s < 1.0, read_s
            assert max(took) < 5.0, took

            # The agent does what the answer says, while a second submit is still waiting: accepted.
            def fix_later() -> None:
                time.sleep(1.0)
                fix = f'WORKSPACE={volume.workspace}; chmod -R g+rX "$WORKSPACE/output/ckpt"'
                assert as_user(AGENT, "sh", "-c", fix).returncode == 0

            fixer = threading.Thread(target=fix_later)
            fixer.start()
            accepted = submit_no_wait(client, experiment, "output/ckpt")
            fixer.join()
            assert accepted.status_code == 202, accepted.text
            assert client.get(f"{experiment.url_path}/scores").json()["total_submissions"] == 1
    finally:
        stop(grader)


def unreadable_copy(volume: Volume, checkpoint: Path, agent: int) -> Path:
    """A second experiment's workspace beside the first, of another agent's user, holding a copy
    of ``checkpoint`` whose files are that user's alone (0600, as safetensors writes them)."""
    workspace = volume.workspace.with_name("exp-b")
    claimed = call_as(agent, claim_workspace, workspace, PLATFORM, groups=[PLATFORM])
    assert claimed.ok, claimed.value
    assert call_as(agent, make_output, workspace).ok
    copy = workspace / "output" / "ckpt"
    shutil.copytree(checkpoint, copy)
    for path in [copy, *copy.iterdir()]:
        os.chown(path, agent, agent)
        path.chmod(0o755 if path.is_dir() else 0o600)
    return workspace


def replace_output_by_link(output: Path, target: Path) -> None:
    output.rename(output.with_name("output.saved"))
    output.symlink_to(target, target_is_directory=True)


def test_an_output_folder_replaced_by_a_link_lets_no_other_folder_be_submitted(volume: Volume) -> None:
    # A checkpoint the grader can read and the agent cannot (another run's, here the platform's).
    elsewhere = volume.base / "another-run" / "output"
    shutil.copytree(volume.model, elsewhere / "ckpt")
    os.chown(elsewhere.parent, PLATFORM, PLATFORM)
    elsewhere.parent.chmod(0o750)
    assert not call_as(AGENT, os.listdir, elsewhere).ok
    # The agent owns its workspace: it swaps output/ for a link there, then names the link's target
    # (the grader's path, which its refusals show), or the link itself.
    assert call_as(AGENT, replace_output_by_link, volume.output, elsewhere).ok
    for submitted, reason in ((elsewhere / "ckpt", "lies outside"), (volume.output / "ckpt", "not a link")):
        refused = call_as(PLATFORM, grader_reads(volume, submitted), groups=[PLATFORM])
        assert not refused.ok, f"{submitted} was snapshotted"
        assert refused.value.startswith("CheckpointError") and reason in refused.value, refused.value
    assert list(volume.snapshots.iterdir()) == []


#: PTRACE_SEIZE: attach to a process without stopping it (a tracer's exit detaches it).
SEIZE = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
print("seized" if libc.ptrace(0x4206, int(sys.argv[1]), None, None) == 0 else f"refused {ctypes.get_errno()}")
"""


def catches_sigterm(status: Path) -> bool:
    """The process has set its SIGTERM handler (setpriv has become the keeper and it has started)."""
    caught = next(line for line in status.read_text().splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & 1 << (signal.SIGTERM - 1))


def test_an_agent_process_that_sees_the_keeper_cannot_take_over_its_group(volume: Volume) -> None:
    # The worst case of a pod (one process namespace for all its containers): the agent's user sees
    # the keeper, which runs as that same user. The platform's group is the keeper's own group, not an
    # extra one, so the kernel lets no process of the agent's group trace it (and inject code that
    # reads every experiment's folder through that group).
    keeper = subprocess.Popen(
        [
            *setpriv(AGENT, gid=PLATFORM, read_anything=True),
            AUTORL,
            "agent-runner",
            "group-read",
            "--workspace",
            str(volume.workspace),
        ],
        env=os.environ | {"HOME": "/tmp"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    status = Path(f"/proc/{keeper.pid}/status")
    try:
        wait_for(lambda: catches_sigterm(status), "the keeper to start", 30)
        assert f"Gid:\t{PLATFORM}\t" in status.read_text() and f"Uid:\t{AGENT}\t" in status.read_text()
        # The agent's process, with the same capabilities as the keeper's (none would do less).
        attack = [*setpriv(AGENT, read_anything=True), sys.executable, "-c", SEIZE, str(keeper.pid)]
        seized = subprocess.run(attack, capture_output=True, text=True, timeout=60)
        assert seized.stdout.strip() == "refused 1", seized.stdout + seized.stderr
        environ = as_user(AGENT, "cat", f"/proc/{keeper.pid}/environ", read_anything=True)
        assert environ.returncode != 0 and "Permission denied" in environ.stderr
    finally:
        keeper.send_signal(signal.SIGTERM)
        output = keeper.communicate(timeout=60)[0].decode()
    assert keeper.returncode == 0, output


#: The agent's process: a write lease on a file makes whoever opens it wait for the lease to be
#: given up, the kernel's lease-break-time (45 s by default) at most, unless the open is non-blocking.
LEASE = """
import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)  # told of each open that breaks the lease: stays
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.fcntl(fd, 1024, fcntl.F_WRLCK)  # F_SETLEASE
print("leased", flush=True)
time.sleep(300)
"""


def copy_checkpoint(model: Path, folder: Path) -> None:
    shutil.copytree(model, folder)


def test_a_lease_on_a_checkpoint_file_does_not_hold_the_grader(volume: Volume) -> None:
    checkpoint = volume.output / "ckpt"
    assert call_as(AGENT, copy_checkpoint, volume.model, checkpoint).ok
    weights = checkpoint / "model.safetensors"
    holder = subprocess.Popen(
        [*setpriv(AGENT, read_anything=True), sys.executable, "-c", LEASE, str(weights)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "leased"
        started = time.monotonic()
        refused = call_as(PLATFORM, grader_reads(volume, checkpoint), groups=[PLATFORM])
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert not refused.ok and "cannot be opened (Resource temporarily unavailable)" in refused.value
    assert took < 10, f"the grader waited {took:.0f} s on the agent's lease"
    assert list(volume.snapshots.iterdir()) == []
    # Without the lease, the same folder is taken.
    taken = call_as(PLATFORM, grader_reads(volume, checkpoint), groups=[PLATFORM])
    assert taken.ok, taken.value
