"""The grader's copy of an ended agent's text files for the evaluators (autorl.provenance.agent_copy),
as a hostile agent would lay its workspace out: links out of it, FIFOs, huge files, weights,
text under weights' names, names built to break things."""

from __future__ import annotations

import json
import os
import struct
import threading
import tracemalloc
from pathlib import Path

import pytest

from autorl.provenance.agent_copy import (
    FILES,
    MANIFEST,
    copy_text_files,
    provenance_folder,
    publish,
    read_manifest,
    stage_copy,
)
from autorl.provenance.overlap import OverlapIndex, scan_files

QUESTION = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
    "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
    "per fresh duck egg. How much in dollars does she make every day at the farmers' market?"
)


def workspace(tmp_path: Path) -> tuple[Path, Path]:
    code, output = tmp_path / "ws" / "code", tmp_path / "ws" / "output"
    code.mkdir(parents=True)
    output.mkdir()
    return code, output


def roots(code: Path, output: Path) -> dict[str, Path]:
    return {"code": code, "output": output}


def copied_names(dest: Path) -> set[str]:
    return {str(path.relative_to(dest)) for path in dest.rglob("*") if path.is_file()}


def test_text_files_are_copied_under_their_roots_name_and_the_copy_scans_as_the_original(
    tmp_path: Path,
) -> None:
    code, output = workspace(tmp_path)
    (code / "train.py").write_text("print('hello')\n")
    (output / "notes").mkdir()
    (output / "notes" / "data.jsonl").write_text(json.dumps({"q": QUESTION}) + "\n")
    (output / "cache.arrow").write_bytes(b"\0\0ARROW" + QUESTION.encode() + b"\0")

    copied = copy_text_files(roots(code, output), tmp_path / "copy")

    expected = {"code/train.py", "output/notes/data.jsonl", "output/cache.arrow"}
    assert copied_names(tmp_path / "copy") == expected
    assert (copied.files, copied.truncated, copied.stopped_early) == (3, (), False)
    index = OverlapIndex([QUESTION])
    original = scan_files([code, output], index)  # labelled by the folders' names, as the copy
    copy = scan_files([tmp_path / "copy" / "code", tmp_path / "copy" / "output"], index)
    assert copy.files == original.files == (("output/cache.arrow", 1), ("output/notes/data.jsonl", 1))


def test_links_fifos_and_weights_are_not_copied_and_binary_or_oddly_named_text_is(tmp_path: Path) -> None:
    code, output = workspace(tmp_path)
    secret = tmp_path / "platform-secret.txt"
    secret.write_text(QUESTION)
    (output / "link.txt").symlink_to(secret)
    (output / "linked-dir").symlink_to(tmp_path)
    os.mkfifo(output / "pipe.txt")  # opening it would block the grader forever
    (output / "model.safetensors").write_text(QUESTION)  # text: copied, read by its content
    (output / "blob.txt").write_bytes(b"\0" + QUESTION.encode())
    (output / "kept.txt").write_text("ok")
    header = b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
    (output / "real.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))

    done = threading.Event()

    def copy() -> None:
        copy_text_files(roots(code, output), tmp_path / "copy")
        done.set()

    worker = threading.Thread(target=copy, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert done.is_set(), "the copy blocked on a FIFO"
    assert copied_names(tmp_path / "copy") == {
        "output/kept.txt",
        "output/model.safetensors",
        "output/blob.txt",
    }


def test_what_a_file_that_looks_like_weights_costs_the_grader_is_bounded(tmp_path: Path) -> None:
    # The grader's process has no memory limit: recognising weights must not parse 16 MiB of an
    # agent's header (a safetensors header of empty JSON objects, a zip's central directory).
    code, output = workspace(tmp_path)
    mib = 1024 * 1024
    body = b'{"a":[' + b"{}," * (16 * mib // 3) + b"{}]}"
    (output / "fake.safetensors").write_bytes(struct.pack("<Q", len(body)) + body + b"x")
    entry = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, *[0] * 7, 1, *[0] * 6) + b"a"
    directory = entry * (16 * mib // len(entry))
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, len(directory), 4, 0)
    (output / "many.zip").write_bytes(b"PK\x03\x04" + directory + end)

    tracemalloc.start()
    try:
        copy_text_files(roots(code, output), tmp_path / "copy")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * mib, f"recognising weights took {peak / mib:.0f} MiB"
    assert copied_names(tmp_path / "copy") == {"output/fake.safetensors", "output/many.zip"}  # not weights


def test_a_file_the_grader_may_not_read_is_named_not_skipped_in_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, output = workspace(tmp_path)
    hidden = output / "hidden.txt"
    hidden.write_text(QUESTION)
    hidden.chmod(0)  # refused to the grader's user; root reads any file, so its open is refused here
    real = os.open

    def refuse(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if path == "hidden.txt":
            raise PermissionError(13, "Permission denied")
        return real(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refuse)
    try:
        copied = copy_text_files(roots(code, output), tmp_path / "copy")
    finally:
        monkeypatch.undo()
        hidden.chmod(0o600)
    assert copied.files == 0 and copied.unreadable == ("output/hidden.txt",)
    assert copied.to_json()["unreadable"] == ["output/hidden.txt"]


def test_a_root_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    code, output = workspace(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "test.txt").write_text(QUESTION)
    output.rmdir()
    output.symlink_to(outside)

    copied = copy_text_files(roots(code, output), tmp_path / "copy")

    assert copied.files == 0 and copied_names(tmp_path / "copy") == set()


def test_caps_bound_each_file_the_total_and_the_count_and_name_what_they_cut(tmp_path: Path) -> None:
    code, output = workspace(tmp_path)
    (output / "a-huge.txt").write_text("x " * 5000)
    (output / "b.txt").write_text("y " * 10)

    per_file = copy_text_files(roots(code, output), tmp_path / "one", max_file_bytes=100)
    assert (tmp_path / "one" / "output" / "a-huge.txt").stat().st_size == 100
    assert per_file.truncated == ("output/a-huge.txt",) and not per_file.stopped_early

    total = copy_text_files(roots(code, output), tmp_path / "two", max_total_bytes=150)
    assert total.stopped_early and total.bytes <= 150

    for index in range(5):
        (code / f"f{index}.txt").write_text("z")
    counted = copy_text_files(roots(code, output), tmp_path / "three", max_files=3)
    assert counted.files == 3 and counted.stopped_early


def test_names_built_to_break_things_are_copied_as_bytes_and_shown_as_text(tmp_path: Path) -> None:
    code, output = workspace(tmp_path)
    odd = [b"new\nline.txt", b"\xff\xfe-not-utf8.txt", b"-rf", b"\x1b[31mred.txt"]
    for name in odd:
        with open(os.fsencode(output) + b"/" + name, "wb") as handle:
            handle.write(b"a " * 200)

    copied = copy_text_files(roots(code, output), tmp_path / "copy", max_file_bytes=10)

    on_disk = set(os.listdir(os.fsencode(tmp_path / "copy" / "output")))
    assert on_disk == set(odd)
    # The manifest's names are valid UTF-8 text: undecodable bytes escaped, never raw.
    text = json.dumps(copied.to_json())
    assert "\\\\xff\\\\xfe-not-utf8.txt" in text
    text.encode("utf-8")


def test_the_destination_must_be_new_and_labels_plain_names(tmp_path: Path) -> None:
    code, output = workspace(tmp_path)
    (tmp_path / "copy").mkdir()
    with pytest.raises(FileExistsError):
        copy_text_files(roots(code, output), tmp_path / "copy")
    with pytest.raises(ValueError, match="plain name"):
        copy_text_files({"../up": code}, tmp_path / "other")


def test_a_copy_is_seen_only_once_complete_and_replaces_an_earlier_one(tmp_path: Path) -> None:
    code, output = workspace(tmp_path)
    (output / "a.txt").write_text("a")
    folder = tmp_path / "snapshots" / provenance_folder(7)
    assert folder.name == "provenance-7"
    staging, copied = stage_copy(roots(code, output), folder)
    assert read_manifest(folder) is None and (staging / FILES / "output" / "a.txt").is_file()
    folder.mkdir()
    (folder / "stale").write_text("left by a copy that died")
    publish(staging, folder, {"copied": copied.to_json(), "final": None})
    assert read_manifest(folder) == {"copied": copied.to_json(), "final": None}
    assert not (folder / "stale").exists() and not staging.exists()
    (folder / MANIFEST).write_text("[]")
    assert read_manifest(folder) is None


def test_the_rest_of_the_workspace_is_copied_once_beside_its_code_and_output(tmp_path: Path) -> None:
    """An agent's pod may write anywhere in its workspace but its read-only mounts: what lies beside
    code/ and output/ is copied under the workspace's label, code/ and output/ only under their own,
    and what is left out (the platform's data/) not at all."""
    code, output = workspace(tmp_path)
    (tmp_path / "ws" / "stash").mkdir()
    (tmp_path / "ws" / "stash" / "q.txt").write_text(QUESTION)
    (tmp_path / "ws" / "top.md").write_text("notes")
    (output / "o.txt").write_text("o")
    (tmp_path / "ws" / "data").mkdir()
    (tmp_path / "ws" / "data" / "train.jsonl").write_text("the platform's, left out")

    copied = copy_text_files(
        {**roots(code, output), "workspace": tmp_path / "ws"},
        tmp_path / "copy",
        leave_out=[tmp_path / "ws" / "data"],
    )

    assert copied_names(tmp_path / "copy") == {"output/o.txt", "workspace/stash/q.txt", "workspace/top.md"}
    assert copied.files == 3
