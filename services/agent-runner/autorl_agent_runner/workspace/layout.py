"""The workspace an agent sees (docs/AGENTS.md, "The workspace and the environment"), and the two
mirrors the platform keeps in it.

    code/  output/  models/<base>/ (read-only)  data/ (train split only, read-only)
    description.md  instructions.md  run_meta.json  scores.json  agent.log

Everything here is written by the platform. ``run_meta.json`` and ``scores.json`` are mirrors:
the grader's database is the truth, and nothing an agent writes here is ever read back as a score.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from autorl.client import SubmissionResult
from autorl.errors import AutoRLError
from autorl.layout import (
    AGENT_LOG_FILE,
    CODE_DIR,
    DATA_DIR,
    DESCRIPTION_FILE,
    INSTRUCTIONS_FILE,
    MODELS_DIR,
    OUTPUT_DIR,
    RUN_META_FILE,
    SCORES_FILE,
)
from autorl.protocol.feedback import Feedback
from autorl_agent_runner.agent_python import AGENT_PACKAGES
from autorl_agent_runner.workspace.tree_walk import remove_entry

#: Written by the platform; proves a non-empty folder is this run's own workspace.
RUN_MARKER_FILE = ".autorl-run.json"
READ_ONLY_FILE = 0o444
READ_ONLY_DIR = 0o555
PLATFORM_FILE = 0o644


class WorkspaceError(AutoRLError):
    """The workspace cannot be created (a foreign non-empty folder, a missing input)."""


@dataclass(frozen=True)
class Workspace:
    """Paths of one run's workspace."""

    root: Path
    base_model_name: str

    @property
    def code(self) -> Path:
        return self.root / CODE_DIR

    @property
    def output(self) -> Path:
        return self.root / OUTPUT_DIR

    @property
    def models(self) -> Path:
        return self.root / MODELS_DIR

    @property
    def model(self) -> Path:
        return self.models / self.base_model_name

    @property
    def data(self) -> Path:
        return self.root / DATA_DIR

    @property
    def description(self) -> Path:
        return self.root / DESCRIPTION_FILE

    @property
    def instructions(self) -> Path:
        return self.root / INSTRUCTIONS_FILE

    @property
    def run_meta(self) -> Path:
        return self.root / RUN_META_FILE

    @property
    def scores(self) -> Path:
        return self.root / SCORES_FILE

    @property
    def agent_log(self) -> Path:
        return self.root / AGENT_LOG_FILE

    @property
    def marker(self) -> Path:
        return self.root / RUN_MARKER_FILE

    @property
    def read_only_dirs(self) -> tuple[Path, ...]:
        return (self.models, self.data)


def check_workspace_free(root: Path, run_id: str) -> None:
    """Accept a missing folder that can be created, an empty folder, or one this run created;
    refuse anything else."""
    if not root.exists():
        _check_creatable(root)
        return
    if not root.is_dir():
        raise WorkspaceError(f"workspace {root} is a file; pass a new or empty folder with --workspace")
    try:
        if not any(root.iterdir()):
            return
    except OSError as exc:
        raise WorkspaceError(
            f"workspace {root} cannot be read ({exc.strerror}); pass a new or empty folder with --workspace"
        ) from None
    owner = _marker_run_id(root)
    if owner == run_id:
        return
    whose = f"run {owner}" if owner else "something else"
    raise WorkspaceError(
        f"workspace {root} is not empty (it holds {whose}); pass a new or empty folder with --workspace"
    )


def _check_creatable(root: Path) -> None:
    """Refuse a workspace that cannot be created (a parent that is a file, missing where nothing
    can be made, or not writable): creating its first missing folder is tried, and undone."""
    missing = root.absolute()
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    parent = missing.parent
    if not parent.is_dir():
        raise WorkspaceError(
            f"workspace {root} cannot be created: {parent} is a file, not a folder; pass a --workspace "
            "path under an existing folder"
        )
    try:
        missing.mkdir()
    except FileExistsError:
        return  # made meanwhile: as an existing folder, it is checked when the workspace is made
    except OSError as exc:
        raise WorkspaceError(
            f"workspace {root} cannot be created in {parent} ({exc.strerror}); pass a --workspace path "
            "in a folder you can write to"
        ) from None
    missing.rmdir()


def _marker_run_id(root: Path) -> str | None:
    try:
        data = json.loads((root / RUN_MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) else None


def create_workspace(
    root: Path,
    *,
    run_id: str,
    task_name: str,
    description: str,
    base_model_dir: Path,
    base_model_name: str,
    train_data_dir: Path,
    timeout_s: float,
    max_submissions: int | None = None,
    link_model: bool = True,
    model_mounted: bool = False,
    reference_model_subpath: str | None = None,
    feedback: Feedback = Feedback.TEST,
) -> Workspace:
    """Create (or complete, for this same run) the workspace under ``root``.

    The base model is hard-linked when ``link_model`` and the file system allow it (a 3 GB model
    is not copied per run), else copied. Its files become read-only (0444): an agent that saves
    into ``MODEL_PATH`` by mistake gets a permission error instead of silently changing the
    cached model that baselines are measured on. The sandbox mounts models/ and data/ read-only
    on top of that wherever it can. With ``model_mounted`` (a Kubernetes agent pod mounts the cached
    model there, read-only) ``models/<base>`` is left an empty mount point instead.
    ``reference_model_subpath`` (``Qwen/Qwen2.5-1.5B``, from
    :func:`autorl.models.sources.reference_model_subpath`) adds the path the reference gives the
    base model, ``models/<org>/<name>``: a relative link to ``models/<base>``.
    """
    check_workspace_free(root, run_id)
    if not (base_model_dir / "config.json").is_file():
        raise WorkspaceError(
            f"base model folder {base_model_dir} has no config.json; prepare the model first"
        )
    train_files = (
        sorted(p for p in train_data_dir.iterdir() if p.is_file()) if train_data_dir.is_dir() else []
    )
    if not train_files:
        raise WorkspaceError(f"train data folder {train_data_dir} is empty; prepare the task's data first")
    root.mkdir(parents=True, exist_ok=True)
    workspace = Workspace(root.resolve(), base_model_name)
    write_platform_file(
        workspace.marker,
        json.dumps({"run_id": run_id, "task": task_name, "base_model": base_model_name}) + "\n",
    )
    workspace.code.mkdir(exist_ok=True)
    workspace.output.mkdir(exist_ok=True)
    workspace.models.mkdir(exist_ok=True)
    if model_mounted:
        workspace.model.mkdir(exist_ok=True)
    elif not workspace.model.exists():
        _install_tree(base_model_dir, workspace.model, link=link_model)
    if reference_model_subpath is not None:
        _link_reference_model_path(workspace, reference_model_subpath)
    workspace.data.mkdir(exist_ok=True)
    for source in train_files:
        target = workspace.data / source.name
        if not target.exists():
            _install_file(source, target, link=False)
    for folder in (workspace.models, workspace.data):
        folder.chmod(READ_ONLY_DIR)
    write_platform_file(workspace.description, description.rstrip() + "\n")
    write_platform_file(
        workspace.instructions,
        render_instructions(
            task_name=task_name,
            base_model_name=base_model_name,
            timeout_s=timeout_s,
            max_submissions=max_submissions,
            feedback=feedback,
        ),
    )
    if not workspace.run_meta.exists():
        write_run_meta(
            workspace, start_time=None, timeout_s=round(timeout_s), last_submit_time=None, deadline=None
        )
    if not workspace.scores.exists():
        write_scores(workspace, [])
    return workspace


def _install_tree(source: Path, target: Path, *, link: bool) -> None:
    """Mirror ``source`` into ``target`` (a staging sibling, then one rename)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for folder, dirs, files in os.walk(source):
            relative = Path(folder).relative_to(source)
            for name in dirs:
                (staging / relative / name).mkdir()
            for name in files:
                _install_file(Path(folder) / name, staging / relative / name, link=link)
        for folder, dirs, _files in os.walk(staging, topdown=False):
            for name in dirs:
                (Path(folder) / name).chmod(READ_ONLY_DIR)
        staging.chmod(READ_ONLY_DIR)
        os.replace(staging, target)
    except BaseException:
        _make_writable(staging)
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _install_file(source: Path, target: Path, *, link: bool) -> None:
    # A hub cache holds symlinks to blobs: link (or copy) the file itself, never the link.
    source = source.resolve()
    if link:
        try:
            os.link(source, target)
            # The mode is the inode's, so the cached file becomes read-only too, as it should be.
            target.chmod(READ_ONLY_FILE)
            return
        except OSError:  # another file system, or links not allowed: copy instead
            pass
    shutil.copyfile(source, target)
    target.chmod(READ_ONLY_FILE)


def detach_model(workspace: Workspace) -> int:
    """Replace hard links into the model cache by copies; returns how many files were copied.

    For an agent that could write through a link (root without a sandbox).
    """
    copied = 0
    for folder, _dirs, files in os.walk(workspace.models):
        for name in files:
            path = Path(folder) / name
            if path.stat().st_nlink > 1:
                fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
                os.close(fd)
                shutil.copyfile(path, tmp_name)
                Path(tmp_name).chmod(READ_ONLY_FILE)
                os.replace(tmp_name, path)
                copied += 1
    return copied


def _make_writable(root: Path) -> None:
    for folder, _dirs, _files in os.walk(root):
        Path(folder).chmod(0o755)


def remove_workspace(root: Path) -> None:
    """Delete a workspace, read-only parts included."""
    if root.exists():
        _make_writable(root)
        shutil.rmtree(root)


def _link_reference_model_path(workspace: Workspace, subpath: str) -> None:
    """``models/<org>/<name>`` → ``../<base>``: a link inside models/ (read-only, as models/ is)."""
    org, _, name = subpath.partition("/")
    folder = workspace.models / org
    folder.mkdir(exist_ok=True)
    link = folder / name
    if not os.path.lexists(link):
        link.symlink_to(Path("..") / workspace.base_model_name)
    folder.chmod(READ_ONLY_DIR)


def write_platform_file(path: Path, text: str) -> None:
    """Write atomically, safe in a folder the agent owns.

    ``mkstemp`` opens with O_EXCL, so a symlink the agent planted cannot redirect the write, and
    the final rename replaces a link instead of following it.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            os.fchmod(out.fileno(), PLATFORM_FILE)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def open_platform_log(path: Path) -> IO[bytes]:
    """``path`` opened for appending by the platform, in a folder the agent may write.

    Whatever the agent put there instead of a plain file of its own (a link, a hard link to
    another file, a FIFO, a folder) is removed without following it, and a new file created.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT, PLATFORM_FILE)
    except OSError:
        fd = -1
    if fd >= 0:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            return os.fdopen(fd, "ab")
        os.close(fd)
    remove_entry(path.parent, path.name)
    return os.fdopen(os.open(path, flags | os.O_CREAT | os.O_EXCL, PLATFORM_FILE), "ab")


def write_json(path: Path, data: Any) -> None:
    write_platform_file(path, json.dumps(data, indent=2) + "\n")


def write_run_meta(
    workspace: Workspace,
    *,
    start_time: float | None,
    timeout_s: int | None,
    last_submit_time: float | None,
    deadline: float | None,
    end_time: float | None = None,
) -> None:
    """``run_meta.json`` in epoch seconds, the reference's fields and ``deadline``: ``start_time``,
    ``timeout_s`` and ``deadline`` (the budget's end) are null before the agent's budget starts;
    ``end_time`` is null until the agent's run has ended, then when it ended, as the reference's."""
    write_json(
        workspace.run_meta,
        {
            "start_time": start_time,
            "timeout_s": timeout_s,
            "last_submit_time": last_submit_time,
            "end_time": end_time,
            "deadline": deadline,
        },
    )


def write_scores(workspace: Workspace, submissions: Sequence[SubmissionResult]) -> None:
    """``scores.json`` in the reference's format: a list of submission objects, oldest first,
    each as the grader answers it (``submission_id``, ``timestamp``, ``model_path``, ``score``,
    ``baseline_score``, ``improvement``, ``elapsed_seconds``, ...); the baseline is not one."""
    ordered = sorted(submissions, key=lambda s: s.submission_id)
    write_json(workspace.scores, [s.model_dump(mode="json", exclude_unset=True) for s in ordered])


def is_read_only_tree(root: Path) -> bool:
    """True when no file or folder under ``root`` has a write bit (used by checks and tests)."""
    for folder, _dirs, files in os.walk(root):
        for entry in [Path(folder), *(Path(folder) / f for f in files)]:
            if entry.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
                return False
    return True


def render_instructions(
    *,
    task_name: str,
    base_model_name: str,
    timeout_s: float,
    max_submissions: int | None,
    feedback: Feedback = Feedback.TEST,
) -> str:
    """The workspace's instructions.md; a sealed experiment's (docs/PROTOCOL.md) says how its
    submissions are scored and how to nominate the final one."""
    limit = (
        f"at most {max_submissions} submissions" if max_submissions else "a per-experiment submission limit"
    )
    packages = "\n".join(f"| `{name}` | {use} |" for name, use in AGENT_PACKAGES.items())
    text = _INSTRUCTIONS.format(
        task=task_name,
        base=base_model_name,
        timeout_s=int(timeout_s),
        timeout_min=timeout_s / 60,
        limit=limit,
        packages=packages,
    )
    return text + _SEALED if feedback == Feedback.SEALED else text


_SEALED = """
## Sealed evaluation

This experiment is **sealed**. Every submission is scored on a validation split: problems held
out of the train split, so `data/train.jsonl` does not hold them. Each answer says
`"split": "validation"`, and `baseline_score`, `improvement` and `comparison` are the base model's
and your gains on that validation split. Nothing shown to you is computed from the test split.

After your budget ends, exactly one of your checkpoints is evaluated on the test split, once: the
one you nominate, inside your budget, with

```bash
curl -s -X POST "$GRADING_SERVER_URL/final" -H 'Content-Type: application/json' \\
     -d '{"submission_id": 3}'
```

(once: a second nomination is refused with 409; the id must be one of your scored submissions),
else your best submission on validation (on a tie, the earliest). That test score is the
experiment's result; it is not shown to you.

Meanwhile only your best submission's files are kept. To nominate another one, leave its folder
under `output/` unchanged: the grader reads it again and accepts it only if it holds the files
that were scored.
"""


_INSTRUCTIONS = """\
# Instructions

Post-train the base model `{base}` so that it scores higher on the `{task}` benchmark than it
does now. You have **{timeout_s} seconds** ({timeout_min:.1f} min) from the moment you start. Submit
checkpoints while you work; the best score counts. The benchmark's test split is not here and
cannot be read: only the grader sees it. `description.md` describes the task and its data.

## Your workspace

| path / variable | what it is |
| --- | --- |
| `$WORKSPACE` (also your `HOME` and working folder) | this folder |
| `$MODEL_PATH` = `models/{base}/` | the base model, **read-only** |
| `$DATA_PATH` = `data/` | the train split, **read-only** |
| `$OUTPUT_DIR` = `output/` | write checkpoints here; only folders under it can be submitted |
| `code/` | your scripts |
| `run_meta.json` | `start_time`, `timeout_s`, `last_submit_time`, `deadline`, `end_time` (epoch seconds) |
| `scores.json` | a JSON list of your submissions, oldest first, refreshed by the platform |
| `$GRADING_SERVER_URL` | the grading API; the URL itself carries your credentials |
| `$TASK`, `$BASE_MODEL` | the task name and the base model |

`run_meta.json` and `scores.json` are copies for convenience; the grading API is the truth.
In `run_meta.json`, `deadline` is your budget's end and `end_time` is null until your run has ended.
There is no internet access to model hubs (`HF_HUB_OFFLINE=1`): load models from `$MODEL_PATH`.

## Your Python

`python3` (and `python`, `pip`, `accelerate`) on your `PATH` is the agents' Python environment.
It holds (`python3 -m pip list` shows the versions):

| package | for |
| --- | --- |
{packages}

It is read-only: write your code in `code/`.

## Time budget

`GET $GRADING_SERVER_URL/time` answers `start_time`, `end_time` (= `deadline`, your budget's end),
`remaining_s` and `last_submit_time`. At `end_time` your processes get SIGTERM, and SIGKILL
shortly after; every process you started ends then, including background ones. Submissions after
`end_time` are refused. Save and submit well before the end: an evaluation takes a while.

## Submitting

Save a **full model** (not an adapter) with its tokenizer into a new folder under `output/`,
then submit that folder (a path relative to this folder, or absolute under `$OUTPUT_DIR`):

```bash
curl -s -X POST "$GRADING_SERVER_URL/submit" -H 'Content-Type: application/json' \\
     -d '{{"model_path": "'$OUTPUT_DIR'/v1"}}'
```

The answer (once scored) holds `submission_id` (your own count: 1, 2, ...), `status`, `score`,
`baseline_score`, `improvement`, `best`, `total_submissions`, `timestamp` and `elapsed_seconds`.
A refusal is a 4xx whose `error` (and `detail`) says why and what to do. In Python, with `requests` as the
reference's example agent does, or with the platform's client:

```python
from autorl.client import GradingClient

client = GradingClient.from_env()
result = client.submit("output/epoch-1")            # waits for the score
print(result.score, result.baseline_score, result.improvement)
pending = client.submit("output/epoch-2", wait=False)  # returns at once; poll later
print(client.submission(pending.submission_id).status, client.time().remaining_s)
```

A blocking submit returns once the checkpoint is scored (the server holds the request for up to
540 s, then answers 202 with the submission id: poll `GET $GRADING_SERVER_URL/submissions/ID`).
`?wait=false` returns at once. `GET $GRADING_SERVER_URL/scores` lists your submissions (past
the first page, whose size is at least your submission limit, `next_after` names where the next
begins: `?after=N`).
`GET $GRADING_SERVER_URL/health` answers `status` and `available_gpus`; the optional `gpu` field
of `/submit` is accepted and ignored (evaluators have GPUs of their own). The baseline is
measured by the platform: `POST /set_baseline` is refused.

## Rules

- Submit a folder under `output/` (symlinks are followed and must stay inside `output/`).
- Full weights in safetensors, the base model's architecture, plus the tokenizer files. Pickle
  weights (`pytorch_model*.bin`) and LoRA/PEFT adapters (`adapter_config.json`) are refused. A
  folder as `Trainer.save_model` or a `checkpoint-N/` save leaves it is fine: the trainer's own
  files beside the weights (`training_args.bin`, `optimizer.pt`, `scheduler.pt`, `rng_state*.pth`,
  `trainer_state.json`) are ignored, never loaded.
- Submitting identical weights twice reuses the earlier score. There is {limit}. Stop writing a
  checkpoint before you submit it (save each one to a new folder): a submit refused because its
  files changed while the grader copied them counts against the limit.
- The score is exact-match accuracy (0-100) of greedy generation on the test split, prompted
  exactly as `autorl.tasks.get_task("{task}").render_prompt(tokenizer, question)` renders a
  question (four worked examples in the model's chat template). Train on that format.

## Saving a model

```python
model.save_pretrained(path)          # safetensors by default
tokenizer.save_pretrained(path)
```

With TRL or `transformers.Trainer`: `trainer.save_model(path)` then
`tokenizer.save_pretrained(path)`. With LoRA/PEFT, merge the adapter into the weights first:

```python
merged = peft_model.merge_and_unload()
merged.save_pretrained(path)
tokenizer.save_pretrained(path)
```
"""
