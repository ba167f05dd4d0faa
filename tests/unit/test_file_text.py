"""An agent's files are read by their content: compressed files, archives, Parquet tables, text
with a byte-order mark and binary files' text runs give up their test questions; weights are
recognised, skipped and named (a PyTorch checkpoint's pickle read); a decompression bomb is cut at
the caps. Real files; nothing mocked."""

from __future__ import annotations

import codecs
import gzip
import io
import json
import struct
import tarfile
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from autorl.provenance.agent_copy import copy_text_files
from autorl.provenance.file_text import MAX_MEMBERS
from autorl.provenance.overlap import OverlapIndex, scan_files
from autorl.tasks.base import Problem, read_problems

DATA = Path(__file__).resolve().parents[1] / "data" / "gsm8k"
TEST = read_problems(DATA / "test.jsonl")
TRAIN = read_problems(DATA / "train.jsonl")
INDEX = OverlapIndex(TEST)


@pytest.fixture
def output(tmp_path: Path) -> Path:
    folder = tmp_path / "output"
    folder.mkdir()
    return folder


def jsonl(problems: list[Problem]) -> bytes:
    return "".join(json.dumps({"question": p.question, "answer": p.answer}) + "\n" for p in problems).encode()


def tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zipped(members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def npy(descr: bytes, shape: bytes) -> bytes:
    """A NumPy file's header (version 1, padded to 128 bytes as NumPy pads it)."""
    header = b"{'descr': " + descr + b", 'fortran_order': False, 'shape': " + shape + b", }"
    return b"\x93NUMPY\x01\x00v\x00" + header.ljust(117) + b"\n"


def safetensors_bytes(metadata: dict[str, str]) -> bytes:
    header = json.dumps(
        {"__metadata__": metadata, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    )
    return struct.pack("<Q", len(header)) + header.encode() + b"\0" * 8


def test_compressed_archived_and_parquet_test_questions_are_found_whatever_the_name(output: Path) -> None:
    (output / "test.jsonl.gz").write_bytes(gzip.compress(jsonl(TEST[0:2])))
    (output / "cache").write_bytes(gzip.compress(jsonl(TEST[2:3])) + gzip.compress(jsonl(TEST[3:4])))
    (output / "data.zip").write_bytes(
        zipped({"a/test.jsonl": jsonl(TEST[4:5]), "b.gz": gzip.compress(jsonl(TEST[5:6]))})
    )
    (output / "data.tar.gz").write_bytes(tar_gz({"test.jsonl": jsonl(TEST[6:7])}))
    table = pa.table({"question": [p.question for p in TEST[7:9]], "id": [7, 8]})
    pq.write_table(table, output / "test-00000-of-00001.parquet")  # snappy, as the Hub's
    pq.write_table(pa.table({"q": [TEST[9].question] * 3}), output / "plain", compression="none")
    pq.write_table(pa.table({"b": [TEST[11].question.encode()]}), output / "bytes.parquet")
    (output / "utf16.txt").write_bytes(jsonl(TEST[10:11]).decode().encode("utf-16"))  # with a BOM

    report = scan_files([output], INDEX)

    assert report.found == set(range(12))
    assert dict(report.files) == {
        "output/test.jsonl.gz": 2,
        "output/cache": 2,
        "output/data.zip": 2,
        "output/data.tar.gz": 1,
        "output/test-00000-of-00001.parquet": 2,
        "output/plain": 1,
        "output/bytes.parquet": 1,
        "output/utf16.txt": 1,
    }
    assert report.complete


def test_utf16_without_a_byte_order_mark_is_decoded_and_what_follows_in_utf8_is_read(output: Path) -> None:
    (output / "le.jsonl").write_bytes(jsonl(TEST[:1]).decode().encode("utf-16-le"))
    (output / "be.jsonl").write_bytes(jsonl(TEST[1:2]).decode().encode("utf-16-be"))
    # What a file's start says of its encoding (NULs, a mark) holds for its start only.
    notes = ("notes " * 100).encode("utf-16-le")
    (output / "then-utf8.txt").write_bytes(notes + jsonl(TEST[2:3]))
    (output / "marked-then-utf8.txt").write_bytes(codecs.BOM_UTF16_LE + notes + jsonl(TEST[3:4]))

    assert scan_files([output], INDEX, chunk_bytes=64).found == {0, 1, 2, 3}  # across small reads


def test_the_train_split_compressed_or_as_parquet_holds_no_test_question(output: Path) -> None:
    (output / "train.jsonl.gz").write_bytes(gzip.compress(jsonl(TRAIN)))
    pq.write_table(pa.table({"question": [p.question for p in TRAIN]}), output / "train.parquet")
    (output / "train.zip").write_bytes(zipped({"train.jsonl": jsonl(TRAIN)}))

    report = scan_files([output], INDEX)

    assert report.count == 0
    assert report.scanned_files == 3


def test_weights_are_recognised_by_content_and_skipped_and_a_weights_prefix_hides_nothing(
    output: Path,
) -> None:
    weights = {
        "model.safetensors": safetensors_bytes({"format": "pt"}),
        "weights.txt": safetensors_bytes({"format": "pt"}),  # weights whatever the name
        "arrays.npy": npy(b"'<f4'", b"(4,)") + bytes(16),
    }
    for name, data in weights.items():
        (output / name).write_bytes(data)
    report = scan_files([output], INDEX)
    assert (report.scanned_files, report.scanned_bytes) == (0, 0)
    assert set(report.weights) == {f"output/{name}" for name in weights}  # named, not ignored

    # What only looks like weights at its start is read.
    header = b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
    (output / "prefixed.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + jsonl(TEST[:1]))
    torch_like = {"archive/data.pkl": b"\x80\x02}q\0.", "archive/test.jsonl": jsonl(TEST[1:2])}
    (output / "optimizer.pt").write_bytes(zipped(torch_like))
    (output / "strings.npy").write_bytes(b"\x93NUMPY\x01\x00v\x00{'descr': '|S300'}\n" + jsonl(TEST[2:3]))
    (output / "notes.safetensors").write_bytes(jsonl(TEST[3:4]))  # text, whatever its name
    (output / "questions.npy").write_bytes(npy(b"'<U300'", b"(1,)") + TEST[4].question.encode("utf-32-le"))
    (output / "prefixed.npy").write_bytes(npy(b"'<f4'", b"(4,)") + bytes(16) + jsonl(TEST[5:6]))

    assert scan_files([output], INDEX).found == {0, 1, 2, 3, 4, 5}


def test_a_pytorch_checkpoints_pickle_is_read_its_tensors_skipped_and_it_is_named(
    output: Path, tmp_path: Path
) -> None:
    tensor = torch.ones(256 * 1024)  # 1 MiB of storage: not read
    questions = [p.question for p in TEST[:2]]
    torch.save({"questions": questions, "w": tensor}, output / "questions.pt")
    torch.save(
        {"questions": [TEST[2].question], "w": tensor},
        output / "old.pt",
        _use_new_zipfile_serialization=False,
    )
    magic = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
    (output / "prefixed.jsonl").write_bytes(magic + jsonl(TEST[3:4]))  # only its start is PyTorch's
    torch.save({"step": 1}, output / "scheduler.pt")
    hidden = zipped(
        {"archive/data.pkl": b"\x80\x02}q\0.", "archive/data/0": jsonl(TEST[4:5])}, zipfile.ZIP_STORED
    )
    (output / "tensor.pt").write_bytes(hidden)  # text stored as a tensor: hidden, but named

    report = scan_files([output], INDEX)
    assert report.found == {0, 1, 2, 3} and report.complete
    assert set(report.weights) == {
        "output/questions.pt",
        "output/old.pt",
        "output/scheduler.pt",
        "output/tensor.pt",
    }
    assert report.scanned_bytes < 100_000  # two megabytes of tensors not read

    # The grader's copy for the evaluators holds the same text and names the same checkpoints.
    copied = copy_text_files({"output": output}, tmp_path / "copy")
    assert copied.complete and set(copied.weights) == set(report.weights) and copied.bytes < 100_000
    assert scan_files([tmp_path / "copy" / "output"], INDEX).found == {0, 1, 2, 3}


def test_a_decompression_bomb_costs_at_most_the_caps_and_is_named(output: Path) -> None:
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=1)  # about 0.3 MB
    (output / "a.gz").write_bytes(bomb)
    (output / "b.zip").write_bytes(zipped({"z": b"\0" * (64 * 1024 * 1024)}))
    (output / "c.jsonl").write_bytes(jsonl(TEST[:1]))

    report = scan_files([output], INDEX, max_file_bytes=4 * 1024 * 1024)

    assert set(report.truncated) == {"output/a.gz", "output/b.zip"}  # cut at the per-file cap
    assert report.scanned_bytes <= 2 * 4 * 1024 * 1024 + len(jsonl(TEST[:1]))
    assert report.found == {0}
    assert not report.complete

    # The expanded bytes count toward the total: a bomb's expansion ends the scan.
    report = scan_files([output], INDEX, max_total_bytes=4 * 1024 * 1024)
    assert report.stopped_early
    assert report.scanned_bytes == 4 * 1024 * 1024


def test_an_archive_of_too_many_members_is_cut(output: Path) -> None:
    members = {f"m{i}": b"" for i in range(MAX_MEMBERS)} | {"last.jsonl": jsonl(TEST[:1])}
    (output / "many.zip").write_bytes(zipped(members, zipfile.ZIP_STORED))

    report = scan_files([output], INDEX)

    assert report.truncated == ("output/many.zip",)
    assert report.count == 0


def test_a_malformed_container_is_read_as_its_bytes(output: Path) -> None:
    (output / "broken.zip").write_bytes(b"PK\x03\x04" + jsonl(TEST[:2]))
    (output / "broken.gz").write_bytes(b"\x1f\x8b" + jsonl(TEST[2:3]))

    assert scan_files([output], INDEX).found == {0, 1, 2}
