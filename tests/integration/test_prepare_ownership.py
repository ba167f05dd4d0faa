"""The prepare Job's two steps under real, distinct users (as root here, each step dropped to its user
with setpriv, as the pod's securityContext does): one experiment's agent cannot read another's
folder, the grader's group reads both, and a folder is never taken over by another experiment."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from autorl.layout import BUILTIN_BUILD_VERSION
from tests.conftest import FIXTURE_DATA
from tests.support.users import AGENT_A, AGENT_B, PLATFORM, as_user, shared_volume

pytestmark = pytest.mark.requires(
    os.geteuid() == 0 and shutil.which("setpriv") is not None, reason="needs root and setpriv to switch users"
)

AUTORL = str(Path(sys.executable).parent / "autorl")
MODEL_DIR = f"cache/models/builtin/tiny-qwen2-v{BUILTIN_BUILD_VERSION}"


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    with shared_volume() as volume:
        yield volume


def prepare(shared: Path, name: str, step: str, uid: int, gid: int) -> subprocess.CompletedProcess[str]:
    args = [AUTORL, "agent-runner", "prepare", "--task", "gsm8k", "--model", "builtin:tiny-qwen2"]
    args += ["--workspace", str(shared / "experiments" / "team-a" / name), "--timeout", "600", "--step", step]
    if step == "workspace":
        args += ["--group", str(PLATFORM), "--model-dir", str(shared / MODEL_DIR)]
    env = [
        "env",
        f"AUTORL_CACHE_DIR={shared / 'cache'}",
        f"AUTORL_HOME={tempfile.gettempdir()}/autorl-{uid}",
        f"AUTORL_DATA_SOURCE_DIR={FIXTURE_DATA}",
        "HF_HUB_OFFLINE=1",
    ]
    return as_user(uid, *env, *args, groups=(gid,), read_anything=True)


@pytest.fixture(scope="module")
def prepared(shared: Path) -> Path:
    cache = prepare(shared, "exp-a", "cache", PLATFORM, PLATFORM)
    assert cache.returncode == 0, cache.stderr
    for name, uid in (("exp-a", AGENT_A), ("exp-b", AGENT_B)):
        done = prepare(shared, name, "workspace", uid, PLATFORM)
        assert done.returncode == 0, done.stderr
    return shared / "experiments" / "team-a"


def test_each_workspace_belongs_to_its_experiment_and_the_platform_group(prepared: Path) -> None:
    folder = prepared.stat()
    assert (folder.st_uid, stat.S_IMODE(folder.st_mode)) == (PLATFORM, 0o1733)
    for name, uid in (("exp-a", AGENT_A), ("exp-b", AGENT_B)):
        info = (prepared / name).stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, PLATFORM, 0o2750)
        for child in ("code", "output", "description.md", "run_meta.json"):
            assert (prepared / name / child).stat().st_uid == uid
        # The agent pod mounts the cached model here: an empty mount point, not a copy.
        assert list((prepared / name / "models" / "tiny-qwen2").iterdir()) == []
        assert (prepared / name / "data" / "train.jsonl").is_file()
    model = (prepared.parent.parent / MODEL_DIR / "config.json").stat()
    assert model.st_uid == PLATFORM  # the cache is the platform's, read-only to agents


def test_an_agent_cannot_read_another_experiments_files(prepared: Path) -> None:
    # Agent A saves a checkpoint as its own user, in no other group (the agent pod).
    saved = as_user(
        AGENT_A, "sh", "-c", f"mkdir {prepared}/exp-a/output/ckpt && echo w > {prepared}/exp-a/output/ckpt/w"
    )
    assert saved.returncode == 0, saved.stderr
    checkpoint = prepared / "exp-a" / "output" / "ckpt" / "w"
    for attempt in (
        ["cat", str(checkpoint)],
        ["ls", str(prepared / "exp-a")],
        ["cat", str(prepared / "exp-a" / "description.md")],
        ["ls", str(prepared)],  # not even the names of the namespace's experiments
        ["rm", "-rf", str(prepared / "exp-a")],  # the sticky bit: no removing another's folder
        ["mv", str(prepared / "exp-a"), str(prepared / "mine")],
    ):
        refused = as_user(AGENT_B, *attempt)
        assert refused.returncode != 0, attempt
        assert "Permission denied" in refused.stderr or "Operation not permitted" in refused.stderr
    assert checkpoint.read_text() == "w\n"
    # The grader (the platform's user and group) reads what the agent saved, without owning it.
    assert checkpoint.stat().st_gid == PLATFORM  # inherited from the setgid folder
    read = as_user(PLATFORM, "cat", str(checkpoint), groups=(PLATFORM,))
    assert read.returncode == 0 and read.stdout == "w\n", read.stderr


def test_a_workspace_is_never_taken_over_and_a_retry_is_harmless(shared: Path, prepared: Path) -> None:
    retried = prepare(shared, "exp-a", "workspace", AGENT_A, PLATFORM)
    assert retried.returncode == 0, retried.stderr
    taken = prepare(shared, "exp-a", "workspace", AGENT_B, PLATFORM)
    assert taken.returncode != 0
    assert f"belongs to user {AGENT_A}, not to this experiment's user {AGENT_B}" in taken.stderr
    assert (prepared / "exp-a").stat().st_uid == AGENT_A


def test_the_workspace_step_says_what_it_needs(shared: Path) -> None:
    args = [AUTORL, "agent-runner", "prepare", "--task", "gsm8k", "--model", "builtin:tiny-qwen2"]
    refused = subprocess.run(
        [*args, "--workspace", str(shared / "x"), "--step", "workspace"], capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert "--step workspace needs --group" in refused.stderr
