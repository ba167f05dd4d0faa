"""The bounded walk shared by the scan and the cluster's copy (autorl.provenance.walk), as a hostile
agent would lay its files out to make the check stop early, skip a file, or fail: every budget or
unread file makes the result incomplete, never clean; nothing it lays out makes the copy raise."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from autorl.provenance.agent_copy import copy_text_files
from autorl.provenance.overlap import MAX_LISTED_PATHS, OverlapIndex, scan_files
from autorl.provenance.walk import MAX_SHOWN_PATH_CHARS, Walk
from tests.support.hostile_files import nest_past_path_max

QUESTION = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
    "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
    "per fresh duck egg. How much in dollars does she make every day at the farmers' market?"
)
INDEX = OverlapIndex([QUESTION])


@pytest.fixture
def output(tmp_path: Path) -> Path:
    folder = tmp_path / "output"
    folder.mkdir()
    return folder


def test_names_the_scan_skips_and_links_still_spend_the_entry_budget(output: Path) -> None:
    junk = output / "a-junk"
    junk.mkdir()
    (junk / "w.safetensors").write_text("x")
    for index in range(60):  # hard links and weight-named files: no inode, no bytes, still entries
        os.link(junk / "w.safetensors", junk / f"{index}.safetensors")
        (junk / f"l{index}").symlink_to("/etc/hostname")
    (output / "z-stolen.txt").write_text(QUESTION)

    bounded = scan_files([output], INDEX, walk=Walk(max_entries=50))
    assert bounded.count == 0 and not bounded.complete
    assert "50-entry budget" in bounded.unverified()
    assert scan_files([output], INDEX).count == 1 and scan_files([output], INDEX).complete


def test_a_walk_holds_one_entry_at_a_time_and_stops_at_its_budget(output: Path) -> None:
    for index in range(2_000):
        (output / f"{index}.bin").touch()
    walk = Walk(max_entries=100)
    names = [name for _, name, _ in walk.files(output, "output")]
    assert len(names) == 100 and walk.entries == 101 and not walk.complete


def test_the_time_budget_ends_the_scan_as_incomplete(output: Path) -> None:
    for index in range(300):
        (output / f"{index}.txt").write_text("loss 0.25\n")
    report = scan_files([output], INDEX, walk=Walk(max_seconds=0))
    assert not report.complete and "time budget" in report.unverified()


def test_sparse_files_are_not_read_or_copied_but_named(output: Path, tmp_path: Path) -> None:
    sparse = output / "sparse.txt"
    with sparse.open("w") as handle:
        handle.write(QUESTION)
        handle.truncate(64 * 1024 * 1024)  # 64 MiB of holes on a few KiB of disk
    report = scan_files([output], INDEX)
    assert report.scanned_bytes == 0 and not report.complete
    assert len(report.skipped) == 1 and report.skipped[0].startswith("output/sparse.txt (sparse: 67108864")
    copied = copy_text_files({"output": output}, tmp_path / "copy")
    assert copied.bytes == 0 and not copied.complete


def test_a_folder_that_cannot_be_listed_is_recorded(output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (output / "locked").mkdir()
    (output / "locked" / "test.txt").write_text(QUESTION)
    real = os.scandir
    locked = (output / "locked").stat().st_ino

    def scandir(fd: int) -> object:  # a folder of mode 0300: opened, not listed (root lists any)
        if os.fstat(fd).st_ino == locked:
            raise PermissionError(13, "Permission denied")
        return real(fd)

    monkeypatch.setattr(os, "scandir", scandir)
    report = scan_files([output], INDEX)
    assert report.count == 0 and report.unreadable == ("output/locked/",)
    assert "1 file(s) or folder(s) could not be read" in report.unverified()


def test_paths_longer_than_path_max_are_copied_and_found(output: Path, tmp_path: Path) -> None:
    nest_past_path_max(output, "stolen.json", json.dumps([QUESTION]))

    copied = copy_text_files({"output": output}, tmp_path / "copy")

    assert copied.files == 1 and copied.complete, copied
    assert scan_files([tmp_path / "copy" / "output"], INDEX).count == 1
    assert scan_files([output], INDEX).count == 1


def test_one_file_that_cannot_be_written_is_recorded_and_the_copy_goes_on(
    output: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (output / "a.txt").write_text("first")
    (output / "b.txt").write_text(QUESTION)
    from autorl.provenance import agent_copy

    real = agent_copy._copy

    def failing(fd: int, dest: Path, below: str, limit: int) -> tuple[int, bool]:
        if below.endswith("a.txt"):
            raise OSError(36, "File name too long")
        return real(fd, dest, below, limit)

    monkeypatch.setattr(agent_copy, "_copy", failing)
    copied = copy_text_files({"output": output}, tmp_path / "copy")
    assert copied.files == 1 and copied.unreadable == ("output/a.txt",) and not copied.complete


def test_a_file_that_cannot_be_opened_is_recorded(output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (output / "hidden.txt").write_text(QUESTION)
    (output / "seen.txt").write_text("loss 0.25")
    real = os.open

    def deny(path: object, flags: int, *args: object, **kwargs: object) -> int:  # a mode-000 file
        if path == "hidden.txt":
            raise PermissionError(13, "Permission denied")
        return real(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", deny)
    report = scan_files([output], INDEX)
    assert report.count == 0 and report.unreadable == ("output/hidden.txt",) and not report.complete


def test_two_splits_scanned_in_one_pass_are_what_two_scans_find(output: Path) -> None:
    other = "A farmer has 12 cows and buys 30 more at the market on a sunny Tuesday morning. How many cows?"
    (output / "a.txt").write_text(QUESTION)
    (output / "b.txt").write_text(f"{QUESTION}\n{other}")
    both = scan_files([output], OverlapIndex([QUESTION, other]))
    assert (
        both.part(0, 1).files
        == scan_files([output], INDEX).files
        == (("output/a.txt", 1), ("output/b.txt", 1))
    )
    second = both.part(1, 2)
    assert second.found == {0} and second.files == scan_files([output], OverlapIndex([other])).files


def test_a_file_that_breaks_the_reader_is_named_and_the_scan_goes_on(
    output: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autorl.provenance import overlap

    (output / "a-broken.parquet").write_text("PAR1")
    (output / "b.txt").write_text(QUESTION)
    real = overlap._scan_fd

    def breaks(fd: int, *args: Any, **kwargs: Any) -> Any:
        if os.fstat(fd).st_size == 4:
            raise RuntimeError("a reader's own error")
        return real(fd, *args, **kwargs)

    monkeypatch.setattr(overlap, "_scan_fd", breaks)
    report = scan_files([output], INDEX)
    assert report.count == 1 and report.unreadable == ("output/a-broken.parquet",) and not report.complete


def test_the_time_budget_cuts_a_file_being_read(output: Path) -> None:
    (output / "slow.txt").write_text("how many apples does she have left " * 20_000)
    report = scan_files([output], INDEX, walk=Walk(max_seconds=0), chunk_bytes=4096)
    assert report.truncated == ("output/slow.txt",) and report.scanned_bytes < 700_000
    assert "time budget" in report.unverified()


def test_a_report_names_a_bounded_number_of_paths_each_escaped_and_cut(output: Path, tmp_path: Path) -> None:
    # An agent names its folders and makes as many as it likes: what the report (and the child
    # process's answer, the operator's record) holds of them does not grow with either.
    for index in range(MAX_LISTED_PATHS + 50):
        (output / f"{chr(1) * 250}{index}" / "deeper").mkdir(parents=True)
    for report in (
        scan_files([output], INDEX, walk=Walk(max_depth=1)),
        copy_text_files({"output": output}, tmp_path / "copy", walk=Walk(max_depth=1)),
    ):
        assert len(report.skipped) == MAX_LISTED_PATHS + 1 and report.skipped[-1] == "(and 50 more)"
        assert not report.complete
        for path in report.skipped[:-1]:
            assert path.isprintable() and path.startswith("output/\\x01")
            assert len(path) <= MAX_SHOWN_PATH_CHARS + len("/ (deeper than 1 folders)")
