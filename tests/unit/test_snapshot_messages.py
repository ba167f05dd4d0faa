"""What each refusal of a submitted checkpoint says, word for word and at its limits: the path walk,
unreadable files and folders (as the agent names them, with the fix), size caps, sparse files,
the weights. The refusal classes themselves: test_snapshot.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from autorl.checkpoints.agent_names import MAX_NAME_CHARS, quoted, quoted_names, shown_value
from autorl.checkpoints.snapshot import (
    MAX_IGNORED_LISTED,
    MAX_IGNORED_NAME_CHARS,
    Snapshot,
)
from autorl.errors import ServiceUnavailableError
from autorl.untrusted_text import CUT
from tests.support.checkpoints import (
    split_into_shards,
)
from tests.support.snapshots import (
    output_as_a_link,
    snapshot_files,
    taker,
    with_base_files,
    write_with_a_hole,
)

# --- the path walk --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_path", ["output/a\0b", "output/" + "x" * 300, "output/ckpt/../../output/ckpt\0"]
)
def test_unopenable_paths_are_refused_with_the_fix(refusal: Callable[..., str], model_path: str) -> None:
    assert "cannot be opened" in refusal(model_path)


def test_path_walk_refusals_say_exactly_what_to_do(
    refusal: Callable[..., str], workspace: Path, checkpoint: Path, tmp_path: Path
) -> None:
    assert refusal("output/not-there") == (
        "model_path output/not-there does not exist; save the model there first "
        "(model.save_pretrained(path) and tokenizer.save_pretrained(path)) and submit that folder"
    )
    assert refusal("output/ckpt/model.safetensors") == (
        "model_path output/ckpt/model.safetensors: output/ckpt/model.safetensors is a file, not a "
        "folder; submit the folder that save_pretrained wrote"
    )
    assert refusal("output/ckpt/model.safetensors/inner") == (
        "model_path output/ckpt/model.safetensors/inner: output/ckpt/model.safetensors is not a "
        "folder; submit the folder that save_pretrained wrote"
    )
    (tmp_path / "elsewhere").mkdir()
    (workspace / "output" / "runs").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert refusal("output/runs/ckpt") == (
        "model_path output/runs/ckpt: output/runs is a symbolic link, and links are never followed; "
        "save the model into a real folder under OUTPUT_DIR and submit that folder"
    )
    unopenable = (
        "save the model into a plain folder under OUTPUT_DIR with model.save_pretrained(path) and "
        "submit that folder"
    )
    assert (
        refusal("output/a\0b")
        == f"model_path output/a\0b cannot be opened (embedded null byte); {unopenable}"
    )
    long_name = "output/" + "x" * 300
    assert refusal(long_name) == f"model_path {long_name} cannot be opened (File name too long); {unopenable}"


# --- at the limits ---------------------------------------------------------------------------


def test_ignored_links_are_listed_as_links_not_as_what_they_point_to(
    take: Callable[..., Snapshot], checkpoint: Path, tmp_path: Path
) -> None:
    (checkpoint / "checkpoint-500").mkdir()
    (checkpoint / "latest").symlink_to(checkpoint / "checkpoint-500", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    (checkpoint / "runs").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (checkpoint / "dangling").symlink_to(tmp_path / "not-there")
    assert take().ignored_files == with_base_files("checkpoint-500/", "dangling", "latest", "runs")


def test_an_ignored_name_that_is_not_utf8_is_listed_escaped(
    take: Callable[..., Snapshot], checkpoint: Path
) -> None:
    os.close(os.open(os.fsencode(checkpoint) + b"/notes-\xff\xfe.txt", os.O_WRONLY | os.O_CREAT, 0o644))
    os.mkdir(os.fsencode(checkpoint) + b"/run-\xe9")
    assert take().ignored_files == with_base_files("notes-\\udcff\\udcfe.txt", "run-\\udce9/")


def test_ignored_names_are_listed_in_bounded_room_whatever_the_agent_names_them(
    take: Callable[..., Snapshot], checkpoint: Path
) -> None:
    # The names are the agent's: long ones, undecodable ones, many. Each answer about the
    # submission (and GET /scores, each submission's) carries what is listed.
    folder = os.fsencode(checkpoint)
    os.mkdir(checkpoint / ("A" * 200))
    for number in range(3):
        os.close(os.open(folder + b"/" + b"\xff" * 250 + b"-%d" % number, os.O_WRONLY | os.O_CREAT, 0o644))
    for number in range(30):
        (checkpoint / (f"run-{number:02}-" + "x" * 240)).touch()
    listed = take().ignored_files
    # Sorted as shown, the first 20, each cut to 100 characters (never inside an escape, a
    # folder's / kept), then how many more: 1 + 3 + 30 + the base's 5 tokenizer files in all.
    assert listed == (
        "A" * 98 + "…/",
        *["\\udcff" * 16 + "…"] * 3,
        "generation_config.json",
        "merges.txt",
        *[f"run-{number:02}-" + "x" * 92 + "…" for number in range(14)],
        "(and 19 more)",
    )
    assert len(listed) == MAX_IGNORED_LISTED + 1
    assert max(len(name) for name in listed) == MAX_IGNORED_NAME_CHARS
    # Measured as the answers carry it: 2 KB, where these names whole took 13 KB (a name of 250
    # undecodable bytes alone 1.75 KB).
    assert len(json.dumps(listed, ensure_ascii=False).encode()) < 2_100


def test_a_symlinked_model_file_is_refused_with_the_whole_fix(
    refusal: Callable[..., str], checkpoint: Path, tiny_base_model: Path
) -> None:
    (checkpoint / "config.json").unlink()
    (checkpoint / "config.json").symlink_to(tiny_base_model / "config.json")
    assert refusal() == (
        "output/ckpt/config.json is a symbolic link, and links are never followed; copy the file "
        "into the checkpoint folder instead of linking it (model.save_pretrained(path) writes real files)"
    )


@pytest.mark.parametrize("free", [0, 1, 2, 3, 4, 5, 6])
def test_a_grader_out_of_descriptors_says_retry_and_never_refuses_the_checkpoint(
    take: Callable[..., Snapshot], checkpoint: Path, snapshots: Path, free: int
) -> None:
    """The grader's descriptors are every experiment's: run out of them at any file of a snapshot
    (the submitted folder, the base model's, each file of either) and the submit is a 503 to
    retry, never a refusal that blames the checkpoint or counts against its limit."""
    import resource

    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(free + 1)]
    for fd in held:
        os.close(fd)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (held[free], hard))
    try:
        with pytest.raises(ServiceUnavailableError) as caught:
            take()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "no file descriptor free" in str(caught.value) and "submit it again" in str(caught.value)
    assert not snapshots.exists() or list(snapshots.iterdir()) == []


@pytest.mark.parametrize("size", [1024 * 1024, 1024 * 1024 + 1])
def test_a_file_of_exactly_its_size_cap_is_accepted(
    take: Callable[..., Snapshot], refusal: Callable[..., str], checkpoint: Path, size: int
) -> None:
    config = (checkpoint / "config.json").read_bytes()
    (checkpoint / "config.json").write_bytes(config + b" " * (size - len(config)))
    if size == 1024 * 1024:
        assert "config.json" in snapshot_files(take())
    else:
        assert "is 1048577 bytes, more than the 1048576 allowed for config.json" in refusal()


@pytest.mark.parametrize(
    ("size", "hole", "sparse"),
    [
        # 1 MiB at most: never held to the rule, holes or not.
        (1024 * 1024, (4096, 1024 * 1024), False),
        # Exactly half data: not sparse.
        (2 * 1024 * 1024, (1024 * 1024, 2 * 1024 * 1024), False),
        # A hole of 1 MiB, then 2 bytes less than half the file: sparse.
        (2 * 1024 * 1024 - 2, (0, 1024 * 1024), True),
    ],
    ids=["one-mib", "half", "just-under-half"],
)
def test_the_sparse_file_limits(
    take: Callable[..., Snapshot],
    refusal: Callable[..., str],
    checkpoint: Path,
    size: int,
    hole: tuple[int, int],
    sparse: bool,
) -> None:
    # The weights' index is the one file besides the weights that may exceed 1 MiB; holes read as
    # NUL bytes, which no JSON holds, so a file that is not sparse is refused for its JSON.
    split_into_shards(checkpoint)
    index = checkpoint / "model.safetensors.index.json"
    write_with_a_hole(index, size, hole)
    with index.open("r+b") as file:
        file.truncate(size)  # a hole that ends the file
    message = refusal()
    assert ("model.safetensors.index.json is a sparse file" in message) == sparse
    assert sparse or "not a readable JSON file" in message


#: Permission checks need a process that modes deny: user 0 with every capability dropped.
_NEEDS_SETPRIV = pytest.mark.requires(
    os.geteuid() == 0 and shutil.which("setpriv") is not None,
    reason="needs root and setpriv to drop capabilities",
)


def _unprivileged_refusal(model_path: str, workspace: Path, tiny_base_model: Path, snapshots: Path) -> str:
    """The refusal of a snapshot taken as user 0 without capabilities (denied by modes like anyone)."""
    import subprocess
    import sys

    program = (
        "from pathlib import Path\n"
        "from autorl.checkpoints.snapshot import snapshot_submission\n"
        "try:\n"
        f"    snapshot_submission({model_path!r}, workspace=Path({str(workspace)!r}),\n"
        f"        output_dir=Path({str(workspace / 'output')!r}),\n"
        f"        base_model_dir=Path({str(tiny_base_model)!r}),\n"
        f"        snapshot_root=Path({str(snapshots)!r}))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    unprivileged = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"]
    done = subprocess.run(
        [*unprivileged, sys.executable, "-P", "-c", program], capture_output=True, text=True, timeout=120
    )
    return done.stdout.strip() + done.stderr


@_NEEDS_SETPRIV
def test_a_file_the_grader_may_not_read_is_named_with_its_fix(
    checkpoint: Path, workspace: Path, tiny_base_model: Path, snapshots: Path
) -> None:
    """As user 0 without capabilities (the owner of a mode-000 file, denied like anyone)."""
    (checkpoint / "config.json").chmod(0)
    refused = _unprivileged_refusal("output/ckpt", workspace, tiny_base_model, snapshots)
    assert refused.startswith(
        "UnreadableCheckpointError $WORKSPACE/output/ckpt/config.json cannot be read by the grader "
        "(permission denied): the grader reads checkpoints through the workspace's group, and this "
        "file gives the group no read permission"
    ), refused
    assert 'Run chmod -R g+rX "$WORKSPACE/output/ckpt" and submit again' in refused


@_NEEDS_SETPRIV
def test_a_checkpoint_saved_into_output_itself_is_named_as_the_agent_names_it(
    workspace: Path, tiny_base_model: Path, snapshots: Path
) -> None:
    """A checkpoint saved straight into OUTPUT_DIR (model.save_pretrained(OUTPUT_DIR)) and submitted
    as "output": its unreadable file and the fix name the folder as the agent does."""
    shutil.rmtree(workspace / "output")
    shutil.copytree(tiny_base_model, workspace / "output")
    (workspace / "output" / "config.json").chmod(0)
    refused = _unprivileged_refusal("output", workspace, tiny_base_model, snapshots)
    assert refused.startswith(
        "UnreadableCheckpointError $WORKSPACE/output/config.json cannot be read by the grader "
    ), refused
    assert 'Run chmod -R g+rX "$WORKSPACE/output" and submit again' in refused


# --- the submitted path and the folder's weights, message by message ---------------------------

_UNREADABLE_FOLDER = (
    "{name} cannot be read by the grader (permission denied): the grader reads checkpoints through "
    "the workspace's group, and this folder gives the group no read and search permission "
    "(safetensors and tempfile create files 0600, mkdtemp folders 0700; in a pod the platform adds "
    'group-read within seconds of a save, but not here). Run chmod -R g+rX "{name}" and submit '
    "again; this refusal does not count against your submission limit"
)


@_NEEDS_SETPRIV
def test_an_output_folder_the_grader_may_not_read_is_named_as_the_agent_names_it(
    checkpoint: Path, workspace: Path, tiny_base_model: Path, snapshots: Path
) -> None:
    (workspace / "output").chmod(0)
    try:
        refused = _unprivileged_refusal("output/ckpt", workspace, tiny_base_model, snapshots)
    finally:
        (workspace / "output").chmod(0o755)
    assert refused == "UnreadableCheckpointError " + _UNREADABLE_FOLDER.format(name="$WORKSPACE/output")


@_NEEDS_SETPRIV
@pytest.mark.parametrize("mode", [0o000, 0o400], ids=["unopenable", "unsearchable"])
def test_a_folder_on_the_path_the_grader_may_not_read_is_named_with_its_fix(
    workspace: Path, tiny_base_model: Path, snapshots: Path, mode: int
) -> None:
    runs = workspace / "output" / "runs"
    shutil.copytree(tiny_base_model, runs / "ckpt")
    runs.chmod(mode)
    try:
        refused = _unprivileged_refusal("output/runs/ckpt", workspace, tiny_base_model, snapshots)
    finally:
        runs.chmod(0o755)
    assert refused == "UnreadableCheckpointError " + _UNREADABLE_FOLDER.format(name="$WORKSPACE/output/runs")


@_NEEDS_SETPRIV
def test_a_workspace_named_through_a_link_is_submitted_through_its_real_path(
    tiny_base_model: Path, tmp_path: Path, snapshots: Path
) -> None:
    """The platform's path to output/ (the real path of the folder holding it) is accepted; a file
    the grader may not read there is named by that path, the agent's name for it being unknown."""
    real = tmp_path / "real-workspace"
    shutil.copytree(tiny_base_model, real / "output" / "ckpt")
    workspace = tmp_path / "workspace"
    workspace.symlink_to(real, target_is_directory=True)
    take = taker(workspace, tiny_base_model, snapshots)
    assert "model.safetensors" in snapshot_files(take(real / "output" / "ckpt"))
    (real / "output" / "ckpt" / "config.json").chmod(0)
    refused = _unprivileged_refusal(str(real / "output" / "ckpt"), workspace, tiny_base_model, snapshots)
    assert refused.startswith(
        f"UnreadableCheckpointError {real}/output/ckpt/config.json cannot be read by the grader "
    ), refused
    assert f'Run chmod -R g+rX "{real}/output/ckpt" and submit again' in refused


def test_the_output_folder_as_a_link_is_refused_with_the_whole_fix(
    refusal: Callable[..., str], workspace: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    output_as_a_link(workspace, tiny_base_model, tmp_path / "real")
    assert re.fullmatch(
        rf"this experiment's output folder {re.escape(str(workspace / 'output'))} cannot be opened "
        r"\([^)]+\); it must be a plain folder, not a link: save the model under OUTPUT_DIR and submit "
        r"that folder",
        refusal("output/ckpt"),
    )


@pytest.mark.parametrize("entries", [10_000, 10_001])
def test_a_folder_may_hold_at_most_max_entries_entries(
    take: Callable[..., Snapshot], refusal: Callable[..., str], checkpoint: Path, entries: int
) -> None:
    for number in range(entries - len(os.listdir(checkpoint))):
        (checkpoint / f"step-{number:05}.log").touch()
    assert len(os.listdir(checkpoint)) == entries
    if entries == 10_000:
        listed = take().ignored_files
        assert len(listed) == 21 and listed[-1] == f"(and {entries - 2 - 20} more)"
    else:
        assert refusal() == (
            "output/ckpt holds more than 10000 entries; save the model into a folder of its own with "
            "model.save_pretrained(path) and submit that folder"
        )


def test_weight_refusals_say_exactly_what_to_do(
    refusal: Callable[..., str], checkpoint: Path, workspace: Path
) -> None:
    (checkpoint / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    assert refusal() == (
        "output/ckpt holds adapter_config.json: a LoRA/PEFT adapter, not a full model; merge it with "
        "model = model.merge_and_unload() and save the full model with model.save_pretrained(path) "
        "(plus the tokenizer), then submit that folder"
    )
    (checkpoint / "adapter_config.json").unlink()
    (checkpoint / "model.safetensors.index.json").write_text("{}")
    assert refusal() == (
        "output/ckpt holds both model.safetensors and model.safetensors.index.json, two different sets "
        "of weights; save the model into a fresh folder with model.save_pretrained(path) and submit "
        "that folder"
    )
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "model.safetensors.index.json").write_text('{"weight_map": ')
    assert refusal().startswith("output/ckpt/model.safetensors.index.json is not a readable JSON file (")
    (checkpoint / "model.safetensors.index.json").unlink()
    for name in ("a.pt", "b.pth", "c.ckpt", "d.pkl", "pytorch_model.bin", "z.pt"):
        (checkpoint / name).write_bytes(b"\x80\x04pickle")
    assert refusal() == (
        "output/ckpt holds pickle weights ('a.pt', 'b.pth', 'c.ckpt', 'd.pkl', 'pytorch_model.bin' and 1 "
        "more), which can run code when loaded and are not accepted; save the model with "
        "model.save_pretrained(path), which writes model.safetensors (safetensors is its default), and "
        "submit that folder"
    )
    for name in ("a.pt", "b.pth", "c.ckpt", "d.pkl", "pytorch_model.bin", "z.pt"):
        (checkpoint / name).unlink()
    assert refusal() == (
        "output/ckpt has no *.safetensors weights (model.safetensors); save the full model with "
        "model.save_pretrained(path) (safetensors is its default) and submit that folder"
    )


# --- names a submission chose, in a refusal ---------------------------------------------------


def test_a_name_in_a_message_is_quoted_escaped_and_bounded() -> None:
    assert quoted("model.norm.weight") == "'model.norm.weight'"
    # Hidden characters as escapes, a backslash and a quote so that the quotes end the name.
    assert quoted("a'b\\\x1b[31m\n\u202e\u200b") == "'a\\'b\\\\\\x1b[31m\\n\\u202e\\u200b'"
    # Cut between characters, never inside an escape, within MAX_NAME_CHARS.
    long = quoted("\x1b" * 1_000_000)
    assert long == "'" + "\\x1b" * ((MAX_NAME_CHARS - len(CUT)) // 4) + CUT + "'"
    assert len(quoted("n" * 10**6)) == MAX_NAME_CHARS + 2
    assert quoted("n" * MAX_NAME_CHARS) == "'" + "n" * MAX_NAME_CHARS + "'"
    assert quoted_names(["a", "b"]) == "'a', 'b'"
    assert quoted_names([f"t{i}" for i in range(10)]) == "'t0', 't1', 't2' and 7 more"
    assert quoted_names([f"t{i}" for i in range(10)], 5) == "'t0', 't1', 't2', 't3', 't4' and 5 more"
    assert shown_value(["\x1b]0;title\x07"]) == '["\\u001b]0;title\\u0007"]'
    value = shown_value({"sizes": [10**299] * 20})
    assert len(value) == MAX_NAME_CHARS and value.endswith(CUT) and value.isprintable()
