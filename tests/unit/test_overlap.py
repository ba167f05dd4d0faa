"""Test questions in an agent's files are found however they are formatted; honest train data, a
shared phrase, a question cut in half, links and FIFOs are not counted. Real files
in a temporary workspace; nothing is mocked."""

from __future__ import annotations

import json
import os
import re
import unicodedata
from pathlib import Path

import pytest

from autorl.provenance.agent_area import agent_area
from autorl.provenance.overlap import CHUNK_BYTES, OverlapIndex, normalize, scan_files
from autorl.tasks.arith import ArithTask
from autorl.tasks.base import Problem, read_problems
from autorl.untrusted_text import code_points_showing_nothing

DATA = Path(__file__).resolve().parents[1] / "data" / "gsm8k"
TEST = read_problems(DATA / "test.jsonl")
TRAIN = read_problems(DATA / "train.jsonl")
INDEX = OverlapIndex(TEST)


@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    """The agent's ``code/`` and ``output/`` folders."""
    folders = [tmp_path / "workspace" / "code", tmp_path / "workspace" / "output"]
    for folder in folders:
        folder.mkdir(parents=True)
    return folders


def jsonl(problems: list[Problem]) -> str:
    return "".join(json.dumps({"question": p.question, "answer": p.answer}) + "\n" for p in problems)


def test_normalize_undoes_json_escapes_unicode_forms_case_and_punctuation() -> None:
    assert normalize('{"q": "Zo\\u00eb\'s CAF\\u00c9\\nsold 1,500 cr\\u00eapes"}') == normalize(
        "Q: zoë’s café — sold 1,500 crêpes"
    )
    assert normalize("Zoe\u0308 sold 1,500") == ["zoë", "sold", "1", "500"]  # combining mark composed
    assert normalize("Ｌｅａｈ buys １２ packs") == ["leah", "buys", "12", "packs"]  # NFKC
    assert normalize("STRASSE\\tstraße") == ["strasse", "strasse"]  # casefold, \t a separator
    assert normalize("- **Cost:** $18.50\n\n  (each)") == ["cost", "18", "50", "each"]
    assert normalize("\\ud835\\udc00 and \\\\n") == ["a", "and", "n"]  # a surrogate pair; \\ then n
    assert normalize("Ja\u200bnet\u00ad sold 1\u2060500\ufeff") == ["janet", "sold", "1500"]  # invisible


def test_characters_that_show_nothing_inside_words_hide_no_question(roots: list[Path]) -> None:
    # What every operator surface escapes as showing nothing (one definition) splits no word here;
    # a mark that makes a letter with the one before it (p + U+0301 → ṕ) shows, and is that letter.
    for code in code_points_showing_nothing():
        char = chr(code)
        if len(unicodedata.normalize("NFKC", "p" + char)) == 1 or char.casefold() != char:
            continue
        assert normalize(f"Janet ap{char}ples sold") == ["janet", "apples", "sold"], hex(code)
    marks = ["\u034f", "\ufe0f", "\U000e0100", "\u3164", "\u115f", "\uffa0", "\u2800", "\u0332"]
    for number, mark in enumerate(marks):
        text = jsonl(TEST[number : number + 1])
        hidden = " ".join(mark.join(word) if len(word) > 1 else word for word in text.split(" "))
        (roots[1] / f"hidden-{number}.jsonl").write_text(hidden, encoding="utf-8")
    assert scan_files(roots, INDEX).found == set(range(len(marks)))


def test_json_lines_of_test_questions_are_found_exactly(roots: list[Path]) -> None:
    chosen = [0, 6, 11]
    (roots[1] / "stolen.jsonl").write_text(
        "".join(json.dumps({"q": TEST[i].question}, ensure_ascii=True) + "\n" for i in chosen)
    )

    report = scan_files(roots, INDEX)

    assert report.found == frozenset(chosen)
    assert report.count == 3
    assert report.files == (("output/stolen.jsonl", 3),)
    assert report.scanned_files == 1


def test_a_question_is_found_wherever_it_starts() -> None:
    """The text is looked up every few words: each offset of a question must still be caught."""
    words = normalize(TEST[9].question)
    assert INDEX.stride > 1
    for padding in range(2 * INDEX.stride):
        assert INDEX.find(["pad"] * padding + words + ["end"]) == {9}, padding


def test_reformatted_questions_are_found(roots: list[Path]) -> None:
    def rewrapped(question: str) -> str:
        words = question.upper().split()
        return "\n".join("  ".join(words[i : i + 4]) for i in range(0, len(words), 4))

    (roots[0] / "notes.md").write_text(
        "\n".join(f"- **Q{i}:** {TEST[i].question.replace('.', ' ;')}" for i in (1, 2))
    )
    (roots[0] / "data.py").write_text(f"QUESTIONS = {[TEST[i].question for i in (3, 4)]!r}\n")
    (roots[1] / "wrapped.txt").write_text("\n\n".join(rewrapped(TEST[i].question) for i in (5, 7)))

    report = scan_files(roots, INDEX)

    assert report.found == {1, 2, 3, 4, 5, 7}
    assert sorted(report.files) == [("code/data.py", 2), ("code/notes.md", 2), ("output/wrapped.txt", 2)]


def test_the_whole_train_split_holds_no_test_question(roots: list[Path]) -> None:
    (roots[1] / "train.jsonl").write_text(jsonl(TRAIN))
    (roots[1] / "questions.txt").write_text(" ".join(p.question for p in TRAIN))

    report = scan_files(roots, INDEX)

    assert report.count == 0
    assert report.scanned_files == 2


def test_a_question_cut_in_half_across_files_is_not_found_and_most_of_one_is(roots: list[Path]) -> None:
    words = TEST[0].question.split()  # "Leah buys 6 packs ... How many juice boxes are left?"
    half = len(words) // 2
    (roots[0] / "first.txt").write_text(" ".join(words[:half]))
    (roots[1] / "second.txt").write_text(" ".join(words[half:]))
    assert scan_files(roots, INDEX).count == 0

    # Without its last four words: 9 of its 13 n-grams, every number among them.
    (roots[1] / "most.txt").write_text(" ".join(words[:-4]))
    report = scan_files(roots, INDEX)
    assert report.found == {0}
    assert report.files == (("output/most.txt", 1),)


def test_a_phrase_that_questions_share_does_not_count_one(roots: list[Path]) -> None:
    """The closing 13 words of a question (one of its n-grams, numbers and all) inside other text."""
    closing = " ".join(TEST[4].question.split()[-13:])
    (roots[1] / "log.txt").write_text(f"step 10: the model wrote {closing} and stopped\n")

    assert scan_files(roots, INDEX).count == 0


def test_numbers_tell_templated_questions_apart() -> None:
    """Another first number leaves 10 of the question's 13 n-grams, all but the first few words."""
    index = OverlapIndex([TEST[0]])
    changed = TEST[0].question.replace("Leah buys 6 packs", "Leah buys 7 packs")

    assert index.find(normalize(changed)) == set()
    assert index.find(normalize(TEST[0].question)) == {0}


def test_one_n_gram_never_counts_a_question_of_several() -> None:
    question = "Ann packs 12 boxes of 8 pens each and then gives some of them to her class"
    index = OverlapIndex([question])  # 17 words: 5 n-grams, 3 needed

    assert index.find(normalize(question)[:14]) == set()  # 2 n-grams
    assert index.find(normalize(question)[:15]) == {0}
    short = OverlapIndex([" ".join(question.split()[:14])])  # 14 words: 2 n-grams, both needed
    assert short.find(normalize(question)[:13]) == set()


def test_links_and_fifos_are_not_read_and_files_are_judged_by_content_not_name(
    tmp_path: Path, roots: list[Path]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "test.jsonl").write_text(jsonl(TEST))
    (roots[0] / "test.jsonl").symlink_to(outside / "test.jsonl")
    (roots[0] / "linked").symlink_to(outside, target_is_directory=True)
    os.mkfifo(roots[1] / "pipe")  # opening it for reading would wait for a writer
    assert scan_files(roots, INDEX).scanned_files == 0

    (roots[1] / "model.safetensors").write_text(jsonl(TEST[:1]))  # text, whatever its name
    (roots[1] / "OPTIMIZER.PT").write_text(jsonl(TEST[1:2]))
    (roots[1] / "notes.jsonl.bin").write_bytes(b"\0\1\2" + jsonl(TEST[2:3]).encode())  # a NUL up front
    (roots[1] / "cache.txt").write_bytes(jsonl(TEST[3:4]).encode().replace(b" ", b"\0", 5))

    report = scan_files(roots, INDEX)

    assert report.found == {0, 1, 2, 3}
    assert report.scanned_files == 4


def test_a_datasets_arrow_cache_is_read_though_it_is_binary(roots: list[Path]) -> None:
    """``datasets.save_to_disk`` writes Arrow tables: NULs and lengths between UTF-8 strings."""
    rows = b"".join(b"\0\0\0" + bytes([len(p.question) % 256]) + p.question.encode() for p in TEST[:3])
    (roots[1] / "data-00000-of-00001.arrow").write_bytes(b"ARROW1\0\0" + rows)
    assert scan_files(roots, INDEX).count == 3


def test_the_agents_writable_area_is_read_each_file_once_and_never_the_platforms_data(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    area = agent_area(workspace)
    (workspace / "code").mkdir(parents=True)
    (workspace / "data").mkdir()
    (workspace / "data" / "train.jsonl").write_text(jsonl(TEST[:1]))  # the platform's, read-only
    (workspace / "code" / "notes.jsonl").write_text(jsonl(TEST[1:2]))
    (workspace / ".cache" / "huggingface").mkdir(parents=True)  # HOME is the workspace
    (workspace / ".cache" / "huggingface" / "test.jsonl").write_text(jsonl(TEST[2:3]))

    report = scan_files(area.roots, INDEX, leave_out=area.leave_out)

    assert report.files == (("code/notes.jsonl", 1), ("workspace/.cache/huggingface/test.jsonl", 1))
    assert report.scanned_files == 2


def test_a_root_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "test.jsonl").write_text(jsonl(TEST))
    (tmp_path / "output").symlink_to(outside, target_is_directory=True)

    assert scan_files([tmp_path / "output"], INDEX).scanned_files == 0


def test_caps_name_what_they_cut_and_chunk_boundaries_hide_nothing(roots: list[Path]) -> None:
    question = json.dumps(TEST[3].question)
    filler = "loss 0.25 é\n" * 100  # 1,300 bytes, a two-byte character among them
    (roots[1] / "big.log").write_text(filler * 2 + question)
    small = filler[:-57] + question + filler[:300]
    (roots[1] / "small.log").write_text(small)

    # big.log's question lies past the per-file cap; small.log's crosses reads of 64 bytes.
    report = scan_files(roots, INDEX, max_file_bytes=2_000, chunk_bytes=64)

    assert report.truncated == ("output/big.log",)
    assert report.files == (("output/small.log", 1),)
    assert report.scanned_bytes == 2_000 + len(small.encode())
    assert not report.stopped_early

    # The total cap ends the scan inside the first file (names are read in order).
    report = scan_files(roots, INDEX, max_total_bytes=1_500, chunk_bytes=64)
    assert report.truncated == ("output/big.log",)
    assert report.stopped_early
    assert (report.scanned_files, report.scanned_bytes, report.count) == (1, 1_500, 0)


def test_a_question_across_reads_that_hold_few_words_each_is_found(roots: list[Path]) -> None:
    # A read (1 MiB) of a binary file may end with a few words: all of them carry over to the next.
    question = TEST[1].question.encode()
    start = len(b" ".join(question.split(b" ")[:9]))  # the read ends after 9 words
    assert len(normalize(question[:start].decode())) == 9
    (roots[1] / "blob.bin").write_bytes(b"\0" * (CHUNK_BYTES - start) + question)
    assert scan_files(roots, INDEX).found == {1}
    (roots[1] / "blob.bin").unlink()
    (roots[1] / "q.jsonl").write_text(jsonl(TEST[2:3]))  # reads of 64 bytes
    assert scan_files(roots, INDEX, chunk_bytes=64).found == {2}


def test_deep_folders_are_not_entered_past_the_limit(roots: list[Path]) -> None:
    fd = os.open(roots[1], os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(200):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("q.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as deep:
            deep.write(TEST[0].question)
    finally:
        os.close(fd)
    (roots[1] / "q.txt").write_text(TEST[1].question)

    report = scan_files(roots, INDEX)
    assert report.found == {1}
    assert not report.complete
    assert "too-deep" in report.unverified()


def test_the_report_holds_paths_and_counts_never_question_text(roots: list[Path]) -> None:
    (roots[1] / "stolen.jsonl").write_text(jsonl(TEST))
    (roots[0] / "train.jsonl").write_text(jsonl(TRAIN))

    record = json.dumps(scan_files(roots, INDEX).to_json())

    assert json.loads(record) == {
        "count": len(TEST),
        "complete": True,
        "unverified": "",
        "found": list(range(len(TEST))),
        "files": [{"path": "output/stolen.jsonl", "problems": len(TEST)}],
        "scanned_files": 2,
        "scanned_bytes": len(jsonl(TEST).encode()) + len(jsonl(TRAIN).encode()),
        "entries": 2,
        "truncated": [],
        "stopped_early": False,
        "stop_reason": "",
        "unreadable": [],
        "skipped": [],
        "weights": [],
    }
    question_words = {w for p in TEST for w in normalize(p.question) if not w.isdigit()}
    assert question_words & set(re.findall(r"[a-z]+", record.lower())) <= {"problems", "count", "files"}


def test_arith_train_questions_hold_no_test_question_and_its_test_questions_are_found(
    roots: list[Path],
) -> None:
    task = ArithTask()
    test = task.test_problems(20261204)
    index = OverlapIndex(test)
    (roots[1] / "train.jsonl").write_text(jsonl(task.train_problems()))
    assert scan_files(roots, index).count == 0

    (roots[1] / "test.jsonl").write_text(jsonl(test[:50]))
    assert scan_files(roots, index).found == set(range(50))


def test_a_short_question_counts_only_whole_and_on_word_boundaries() -> None:
    index = OverlapIndex(["Ann has 3 apples.", "How many pens?"])

    assert index.find(normalize("Joann has 3 apples; Ann has 13 apples; Ann has 3 apple")) == set()
    assert index.find(normalize("ANN HAS 3 APPLES!")) == {0}
    assert index.find(normalize("how many pens are there")) == {1}
