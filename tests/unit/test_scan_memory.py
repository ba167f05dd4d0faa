"""A decompression bomb among an agent's files costs the platform's process nothing: bzip2 and LZMA
zip members are expanded within what is asked, a Parquet row group that declares more than the
limit leaves is not decoded, and the scan runs in a process of its own under a memory limit, where
a file past it is unreadable and a process that ends early leaves the read unverified, never clean.

Peak memory is the kernel's high-water mark of this process (VmHWM), reset before each measure
(``/proc/self/clear_refs``): ``ru_maxrss`` cannot be reset, so after any larger earlier test it
would show no growth whatever a scan allocated. Real files; the child that dies is the one mock."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import multiprocessing
import os
import signal
import struct
import tarfile
import zipfile
import zlib
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from autorl.provenance import scan_process
from autorl.provenance.file_text import Reading, file_text
from autorl.provenance.overlap import OverlapIndex, scan_files
from autorl.provenance.scan_process import scan_files_apart
from autorl.provenance.unverified import TEST_UNVERIFIED, note
from autorl.provenance.walk import Walk
from autorl.settings import EvaluationSettings
from autorl.tasks import get_task
from autorl.tasks.base import Problem, read_problems
from autorl_evaluator.provenance import read_agent_files

# Each test starts a reading process or fills one to its memory limit: seconds, shared nothing.
pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data" / "gsm8k"
TEST = read_problems(DATA / "test.jsonl")
INDEX = OverlapIndex(TEST)
MIB = 1024 * 1024


def jsonl(problems: list[Problem]) -> bytes:
    return "".join(json.dumps({"question": p.question}) + "\n" for p in problems).encode()


def bzip2_repeated(block: bytes, times: int) -> bytes:
    """A bzip2 stream of ``block`` ``times`` over, made in milliseconds: ``block``'s one compressed
    block written ``times`` times (bzip2's blocks are bit-aligned), the stream's CRC combined."""
    stream = bz2.compress(block, 9)
    bits = bin(int.from_bytes(stream, "big"))[2:].zfill(len(stream) * 8)
    end = bits.rindex(format(0x177245385090, "048b"))  # the end-of-stream mark
    crc = combined = int(bits[80:112], 2)  # after "BZh9" and the block's mark
    for _ in range(times - 1):
        combined = ((combined << 1) | (combined >> 31)) & 0xFFFFFFFF ^ crc
    body = bits[:32] + bits[32:end] * times + bits[end : end + 48] + format(combined, "032b")
    body += "0" * (-len(body) % 8)
    return int(body, 2).to_bytes(len(body) // 8, "big")


def zip_of_one(name: bytes, method: int, compressed: bytes, size: int, crc: int) -> bytes:
    """A zip of one member already compressed with ``method``."""
    local = struct.pack(
        "<4s5H3L2H", b"PK\x03\x04", 46, 0, method, 0, 0x21, crc, len(compressed), size, len(name), 0
    )
    central = struct.pack(
        "<4s6H3L5H2L",
        b"PK\x01\x02",
        46,
        46,
        0,
        method,
        0,
        0x21,
        crc,
        len(compressed),
        size,
        len(name),
        0,
        0,
        0,
        0,
        0,
        0,
    )
    directory = central + name
    end = struct.pack(
        "<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(directory), len(local) + len(name) + len(compressed), 0
    )
    return local + name + compressed + directory + end


def bzip2_bomb(gib: int) -> bytes:
    """A zip of about 9 KB whose one bzip2 member holds ``gib`` GiB of 'a'."""
    block = b"a" * (4 * MIB)
    times = gib * 256
    crc = 0
    for _ in range(times):
        crc = zlib.crc32(block, crc)
    return zip_of_one(b"notes.txt", zipfile.ZIP_BZIP2, bzip2_repeated(block, times), times * len(block), crc)


def one_value_parquet(path: Path, size: int) -> None:
    pq.write_table(pa.table({"text": ["a" * size]}), path, compression="zstd")
    pa.default_memory_pool().release_unused()  # what writing took, not kept to be reused


def peak_reset() -> int:
    """This process's resident high-water mark reset to what it holds now, in bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return peak()


def peak() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024


def output_in(tmp_path: Path) -> Path:
    (tmp_path / "output").mkdir()
    return tmp_path / "output"


def test_a_bzip2_zip_bomb_is_expanded_within_the_limit_never_whole(tmp_path: Path) -> None:
    bomb = tmp_path / "notes.zip"
    bomb.write_bytes(bzip2_bomb(1))
    assert bomb.stat().st_size < 16 * 1024
    reading = Reading(8 * MIB)
    fd = os.open(bomb, os.O_RDONLY)
    before = peak_reset()
    try:
        text = sum(len(piece) for piece in file_text(fd, reading))
    finally:
        os.close(fd)
    assert reading.cut and text <= 8 * MIB and reading.used <= 8 * MIB
    assert peak() - before < 48 * MIB


def test_bzip2_and_lzma_members_are_read_and_cut_at_the_limit(tmp_path: Path) -> None:
    output = output_in(tmp_path)
    for method, problem in ((zipfile.ZIP_BZIP2, 0), (zipfile.ZIP_LZMA, 1)):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", method) as archive:
            archive.writestr("test.jsonl", jsonl(TEST[problem : problem + 1]))
            archive.writestr("filler.txt", b"filler words " * (MIB // 4))
        (output / f"data{method}.zip").write_bytes(buffer.getvalue())
        # Inside a tar too: the zip is then held in memory, its members expanded the same way.
        with tarfile.open(output / f"data{method}.tar", "w") as archive:
            info = tarfile.TarInfo("inner.zip")
            info.size = len(buffer.getvalue())
            archive.addfile(info, io.BytesIO(buffer.getvalue()))
    report = scan_files([output], INDEX, max_file_bytes=MIB)
    assert report.found == {0, 1}
    assert sorted(report.truncated) == [f"output/data{m}.{kind}" for m in (12, 14) for kind in ("tar", "zip")]
    assert not report.unreadable


def test_a_member_of_a_method_not_opened_cuts_the_file(tmp_path: Path) -> None:
    output = output_in(tmp_path)
    member = gzip.compress(jsonl(TEST[:1]))
    (output / "odd.zip").write_bytes(zip_of_one(b"a.jsonl", 9, member, 10 * len(member), 0))  # deflate64
    report = scan_files([output], INDEX)
    assert report.truncated == ("output/odd.zip",) and not report.complete


def test_a_parquet_row_group_declared_past_the_limit_is_not_decoded(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    one_value_parquet(path, 40 * MIB)
    reading = Reading(16 * MIB)
    fd = os.open(path, os.O_RDONLY)
    before = peak_reset()
    try:
        assert list(file_text(fd, reading)) == []
    finally:
        os.close(fd)
    assert reading.cut and reading.used < MIB  # the footer, read twice: nothing decoded
    assert peak() - before < 16 * MIB


def test_the_scan_apart_finds_what_the_scan_in_process_finds(tmp_path: Path) -> None:
    output = output_in(tmp_path)
    (output / "test.jsonl.gz").write_bytes(gzip.compress(jsonl(TEST[0:2])))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_BZIP2) as archive:
        archive.writestr("a.jsonl", jsonl(TEST[2:3]))
    (output / "data.zip").write_bytes(buffer.getvalue())
    pq.write_table(pa.table({"question": [p.question for p in TEST[3:5]]}), output / "part.parquet")
    (output / "notes.md").write_text(TEST[5].question.upper())
    (output / "bin").write_bytes(b"\0" * 70_000 + jsonl(TEST[6:7]))
    apart = scan_files_apart([output], INDEX, leave_out=[output / "bin"])
    assert apart == scan_files([output], INDEX, leave_out=[output / "bin"])
    assert apart.found == {0, 1, 2, 3, 4, 5} and apart.complete


def test_a_bomb_read_apart_costs_the_caller_nothing(tmp_path: Path) -> None:
    output = output_in(tmp_path)
    (output / "notes.zip").write_bytes(bzip2_bomb(1))
    (output / "q.txt").write_text(TEST[0].question)
    before = peak_reset()
    report = scan_files_apart([output], INDEX, max_file_bytes=8 * MIB)
    assert peak() - before < 16 * MIB
    assert report.found == {0} and report.truncated == ("output/notes.zip",)


def test_a_file_past_the_memory_limit_is_unreadable_and_the_scan_goes_on(tmp_path: Path) -> None:
    output = output_in(tmp_path)
    one_value_parquet(output / "big.parquet", 40 * MIB)
    (output / "q.txt").write_text(TEST[0].question)
    report = scan_files_apart([output], INDEX, memory_bytes=16 * MIB)
    assert report.unreadable == ("output/big.parquet",) and not report.stopped_early
    assert report.found == {0} and not report.complete


def _found_then_killed(answers: Connection, *args: Any) -> None:
    """A reading process that finds a question and is then killed (as the kernel's OOM killer would)."""
    answers.send_bytes(json.dumps(["file", ["output/early.txt", [3]]]).encode())
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_reading_process_that_dies_leaves_an_incomplete_report_with_what_it_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = output_in(tmp_path)
    monkeypatch.setattr(scan_process, "_scan_in_child", _found_then_killed)
    report = scan_files_apart([output], INDEX)
    assert report.stopped_early and not report.complete
    assert "killed by signal 9" in report.stop_reason and "2048-MiB memory limit" in report.stop_reason
    assert report.found == {3} and report.files == (("output/early.txt", 1),)
    assert report.unverified().startswith("the scan stopped early (the process reading them ended")


def test_a_reading_process_past_its_time_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = output_in(tmp_path)
    monkeypatch.setattr(scan_process, "GRACE_SECONDS", 0.0)
    report = scan_files_apart([output], INDEX, walk=Walk(max_seconds=0.0))
    assert report.stopped_early and "time budget ran out" in report.stop_reason
    assert not multiprocessing.active_children()


def test_a_read_of_the_agents_files_that_died_is_unverified_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = output_in(tmp_path)
    monkeypatch.setattr(scan_process, "_scan_in_child", _found_then_killed)
    settings = EvaluationSettings(home=tmp_path / "home")
    read = read_agent_files(get_task("arith"), settings, run_id="r1", roots={"output": output}, sealed=False)
    assert read.counts["test"] == 1  # what was found before it died: a lower bound, still a finding
    assert "memory limit" in read.unverified
    assert note(TEST_UNVERIFIED, read.unverified).startswith(
        "test questions unverified: the scan stopped early (the process reading them ended"
    )
    record = json.loads(read.record.read_text())
    assert record["test"]["stopped_early"] and not record["test"]["complete"]
