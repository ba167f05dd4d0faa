"""Test questions in an agent's files: a public test set brought in (to train on it) is found.

After an agent has ended, the platform reads its files (weights are skipped, and named) for the questions of
the task's test split, each file's text taken from its content whatever its name
(:mod:`autorl.provenance.file_text`: compressed files, archives and Parquet tables opened, the text
runs of binary files read). Text is compared as words (:func:`normalize`): Unicode NFKC,
casefolded, characters that show nothing (zero-width spaces, variation selectors, fillers, stray
combining marks: :func:`autorl.untrusted_text.shows_nothing`) removed, every run of characters that
are not letters or digits a separator, JSON string escapes undone. So reformatting does not hide a
question: JSON escaping, line breaks, extra spaces, upper case, changed punctuation, markdown, a
Python list.

The rule (:class:`OverlapIndex`): a question is cut into its word n-grams (``n`` = 13, the usual
long n-gram of contamination studies; a question of at most ``n`` words is its single n-gram, so it
counts only whole and on word boundaries). A file holds a question when

* at least ``min_share`` (default half) of the question's n-grams appear in the file, and never
  fewer than two of them unless the question has only one: a common phrase that many questions
  share ("how many ... does she have left") is one n-gram, never a question; and
* every number of the question lies inside an n-gram that appears: questions written from one
  template (GSM8K's near-duplicates, arith's generated problems) differ only in their numbers,
  and a train question is not a test question because most of its words are.

So a copy of a whole question is found however it is formatted, and so is a copy of most of it
that keeps its numbers (a question without its closing "How many ...?"). A question cut in half
across two files is not: each file is judged on its own. Paraphrases, translations, encodings
(base64, a cipher, a format not opened) and filler words between a question's words are not found:
this catches a test set carried in, not one hidden on purpose.

:func:`scan_files` reads the files without following a symbolic link, never opening anything but a
regular file, within caps on each file's bytes, the total bytes, the number of files, the entries
looked at and the time taken (:mod:`autorl.provenance.walk`). Those caps count what a decoder has
already produced, so they bound the work, not the memory a hostile file makes a decoder allocate
first: the platform runs the scan in a process of its own under a hard memory limit
(:mod:`autorl.provenance.scan_process`), where an allocation past it makes that file unreadable
and a process that ends early makes the report incomplete. Its :class:`OverlapReport` names files
and counts, never a question's text.
"""

from __future__ import annotations

import math
import os
import re
import unicodedata
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import compress, count, islice
from pathlib import Path
from typing import Any

from autorl.provenance.agent_area import left_out
from autorl.provenance.file_text import AsUtf8, Reading, file_text
from autorl.provenance.walk import Walk, shown_path
from autorl.tasks.base import Problem
from autorl.untrusted_text import code_points_showing_nothing

#: The n of the word n-grams: 13, as in the contamination studies of GPT-3 and after.
DEFAULT_N = 13
#: The share of a question's n-grams a file must hold for the question to count.
DEFAULT_MIN_SHARE = 0.5
#: Bytes read from one file at most; the rest of a longer file is not read, and the file is named.
MAX_FILE_BYTES = 256 * 1024 * 1024
#: Bytes read from all files together at most: about a minute at the 20 MB/s measured for JSON lines
#: on one core; about two for a file of nothing but test questions, the slowest kind.
MAX_TOTAL_BYTES = 1024 * 1024 * 1024
#: Files opened at most.
MAX_FILES = 100_000
#: Bytes read at once; a question across two reads is still found (the words carry over).
CHUNK_BYTES = 1024 * 1024
#: Paths a report names of each kind (read only in part, unreadable, skipped) at most; past them,
#: how many more there are. With :data:`autorl.provenance.walk.MAX_SHOWN_PATH_CHARS`, what an
#: agent's names cost a report (its JSON, the operator's record) does not grow with how many files
#: it made.
MAX_LISTED_PATHS = 100

# JSON's string escapes (and Python's \x, \U): a surrogate pair, one code point, or a
# character that stands for a separator (\n, \t, ...) or for a backslash.
_ESCAPE = re.compile(
    r"\\u([dD][89abAB][0-9a-fA-F]{2})\\u([dD][c-fC-F][0-9a-fA-F]{2})"
    r"|\\(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2})|U([0-9a-fA-F]{8}))"
    r"|\\[nrtbf\\]"
)
_WORD = re.compile(r"[^\W_]+")
_DIGIT = re.compile(r"\d")
#: Where a read's text is cut (the rest waits for the next): whitespace, and the NUL and the
#: replacement character that stand between a binary file's text runs.
_SEPARATORS = (" ", "\n", "\t", "\r", "\0", "\ufffd")
#: Characters that show nothing, or nothing of their own (:func:`autorl.untrusted_text.shows_nothing`:
#: zero-width spaces and joiners, fillers, variation selectors, combining marks that compose with
#: nothing): removed, not separators, so that one inside a word hides nothing.
_SHOWING_NOTHING = dict.fromkeys(code_points_showing_nothing())
#: Every ASCII byte that is not a letter or digit → a space.
_ASCII_SEPARATORS = bytes(c if chr(c).isascii() and chr(c).isalnum() else 0x20 for c in range(256))


def _unescape(match: re.Match[str]) -> str:
    high, low, code, byte, wide = match.groups()
    if high is not None:
        return chr(0x10000 + ((int(high, 16) - 0xD800) << 10) + (int(low, 16) - 0xDC00))
    number = code or byte or wide
    if number is None:
        return " "
    value = int(number, 16)
    # A lone surrogate or a code point past Unicode is no letter: a separator.
    return " " if 0xD800 <= value <= 0xDFFF or value > 0x10FFFF else chr(value)


def normalize(text: str) -> list[str]:
    """The words of ``text`` for matching: JSON string escapes undone (``\\u00e9`` → é, ``\\n`` and
    ``\\t`` → separators), Unicode NFKC, casefolded, characters that show nothing removed (a
    zero-width space, a variation selector or a Hangul filler inside a word, a combining mark left
    over), split at every run of characters that are not letters or digits. Numbers are
    words too (``$1,200.50`` → ``1``, ``200``, ``50``)."""
    if "\\" in text:
        text = _ESCAPE.sub(_unescape, text)
    if text.isascii():
        # The same words, found twice as fast: NFKC leaves ASCII as it is and casefold lowers it.
        return text.lower().encode("ascii").translate(_ASCII_SEPARATORS).decode("ascii").split()
    # Marks are removed after NFKC, which composes those that make a letter (e + U+0308 → ë), and
    # after casefolding, which may add one (İ → i + U+0307).
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold().translate(_SHOWING_NOTHING))


@dataclass(frozen=True)
class _Question:
    words: tuple[str, ...]
    #: Words in each of its n-grams: n, or all of them for a question of at most n words.
    gram: int
    #: How many of its n-grams must appear.
    needed: int
    #: Word positions that hold a number.
    numbers: tuple[int, ...]

    @property
    def positions(self) -> int:
        """How many n-grams it has (1 for a question of at most n words)."""
        return len(self.words) - self.gram + 1


class OverlapIndex:
    """The word n-grams of a test split's questions (the rule is the module's docstring's).

    A text is read in one pass: every ``stride``-th position of it is looked up as a key of
    ``key_length`` words among the questions' own, and only a hit is compared with the n-grams
    around it. With ``key_length + stride - 1`` at most the shortest n-gram, every n-gram of the
    text starts within ``stride`` words before a looked-up position whose key lies inside it, so
    nothing is missed, and the text's words are looked at about ``key_length / stride`` times
    (8 words every 6th position for n = 13).
    """

    def __init__(
        self, questions: Iterable[Problem | str], *, n: int = DEFAULT_N, min_share: float = DEFAULT_MIN_SHARE
    ) -> None:
        if n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        if not 0 < min_share <= 1:
            raise ValueError(f"min_share must be in (0, 1], not {min_share}")
        self.n = n
        self.min_share = min_share
        #: Each question's words and needs; None for one without words (never found).
        self._questions: list[_Question | None] = []
        for question in questions:
            words = tuple(normalize(question.question if isinstance(question, Problem) else question))
            if not words:
                self._questions.append(None)
                continue
            gram = min(n, len(words))
            positions = len(words) - gram + 1
            needed = 1 if positions == 1 else min(positions, max(2, math.ceil(min_share * positions)))
            numbers = tuple(i for i, word in enumerate(words) if _DIGIT.search(word))
            self._questions.append(_Question(words, gram, needed, numbers))
        shortest = min((q.gram for q in self._questions if q is not None), default=1)
        self.stride = max(1, shortest // 2)
        self.key_length = shortest - self.stride + 1
        #: Key (``key_length`` words) → (question index, where the key starts in it), each place.
        self._keys: dict[tuple[str, ...], list[tuple[int, int]]] = {}
        for index, entry in enumerate(self._questions):
            if entry is not None:
                for start in range(len(entry.words) - self.key_length + 1):
                    key = entry.words[start : start + self.key_length]
                    self._keys.setdefault(key, []).append((index, start))

    def __len__(self) -> int:
        return len(self._questions)

    @property
    def longest(self) -> int:
        """The most words an n-gram of the index has (what must carry over between reads)."""
        return max((q.gram for q in self._questions if q is not None), default=0)

    def matches_in(self, words: Sequence[str]) -> set[tuple[int, int]]:
        """(question index, n-gram start) of each of the questions' n-grams that ``words`` holds."""
        matches: set[tuple[int, int]] = set()
        width, stride = self.key_length, self.stride
        probes = zip(*(islice(words, k, None, stride) for k in range(width)), strict=False)
        # Both loops run in C; the Python loop below sees only positions whose key is a question's.
        for at in compress(count(0, stride), map(self._keys.__contains__, probes)):
            for index, key_start in self._keys[tuple(words[at : at + width])]:
                question = self._questions[index]
                assert question is not None
                # The n-grams of the question that hold the key and start at most stride - 1
                # words before it: one of them is where an occurrence of any n-gram is caught.
                for start in range(
                    max(0, key_start - stride + 1), min(key_start, question.positions - 1) + 1
                ):
                    begin = at - (key_start - start)
                    if (index, start) in matches or begin < 0 or begin + question.gram > len(words):
                        continue
                    if (
                        tuple(words[begin : begin + question.gram])
                        == question.words[start : start + question.gram]
                    ):
                        matches.add((index, start))
        return matches

    def problems_with(self, matches: Iterable[tuple[int, int]]) -> set[int]:
        """The indices of the questions that a text with these n-grams (from :meth:`matches_in`,
        over all its parts) holds, by the rule."""
        starts: dict[int, set[int]] = {}
        for index, start in matches:
            starts.setdefault(index, set()).add(start)
        found = set()
        for index, matched in starts.items():
            question = self._questions[index]
            assert question is not None
            if len(matched) >= question.needed and self._numbers_covered(question, matched):
                found.add(index)
        return found

    @staticmethod
    def _numbers_covered(question: _Question, starts: set[int]) -> bool:
        return all(any(p - question.gram < s <= p for s in starts) for p in question.numbers)

    def find(self, words: Sequence[str]) -> set[int]:
        """The indices of the questions that a text of ``words`` (from :func:`normalize`) holds."""
        return self.problems_with(self.matches_in(words))


@dataclass(frozen=True)
class OverlapReport:
    """What :func:`scan_files` found; paths are ``<root's name>/<path below the root>``."""

    #: Indices (in the index's order) of the questions found in some file.
    found: frozenset[int]
    #: Each file that holds a question, and how many it holds.
    files: tuple[tuple[str, int], ...]
    scanned_files: int
    scanned_bytes: int
    #: Files read only up to the per-file cap, or the one where the total cap ran out.
    truncated: tuple[str, ...]
    #: A cap (total bytes or files) ended the scan before every file was read.
    stopped_early: bool = False
    #: Why the scan stopped early (which budget), else "".
    stop_reason: str = ""
    #: Files and folders that could not be opened, listed or read: not checked.
    unreadable: tuple[str, ...] = ()
    #: Sparse files and folders past the depth limit, not read.
    skipped: tuple[str, ...] = ()
    #: Entries the walk looked at (files, folders, links, skipped files alike).
    entries: int = 0
    #: The questions each file of :attr:`files` holds.
    found_in: tuple[frozenset[int], ...] = ()
    #: Files recognised as weights, whose tensors were not read (safetensors and NumPy files whole,
    #: a PyTorch checkpoint's storages; its pickle is read): named, not unverified.
    weights: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.found)

    @property
    def complete(self) -> bool:
        """Every file was read whole: no budget reached, nothing unreadable or skipped."""
        return not (self.stopped_early or self.truncated or self.unreadable or self.skipped)

    def unverified(self) -> str:
        """Why the scan is not complete (for every surface that shows it), else ""."""
        reasons = []
        if self.stopped_early:
            reasons.append(f"the scan stopped early ({self.stop_reason or 'a cap was reached'})")
        if self.truncated:
            reasons.append(f"{len(self.truncated)} file(s) read only in part")
        if self.unreadable:
            reasons.append(f"{len(self.unreadable)} file(s) or folder(s) could not be read")
        if self.skipped:
            reasons.append(f"{len(self.skipped)} sparse file(s) or too-deep folder(s) not read")
        return "; ".join(reasons)

    def part(self, start: int, stop: int) -> OverlapReport:
        """The report of the questions ``start`` to ``stop`` of the index (one split of several
        scanned together), indices from 0."""
        found_in = [frozenset(i - start for i in found if start <= i < stop) for found in self.found_in]
        kept = [(path, found) for (path, _), found in zip(self.files, found_in, strict=True) if found]
        return replace(
            self,
            found=frozenset(i - start for i in self.found if start <= i < stop),
            files=tuple((path, len(found)) for path, found in kept),
            found_in=tuple(found for _, found in kept),
        )

    def to_json(self) -> dict[str, Any]:
        """The operator's record: indices, paths and counts, never a question's text."""
        return {
            "count": self.count,
            "complete": self.complete,
            "unverified": self.unverified(),
            "found": sorted(self.found),
            "files": [{"path": path, "problems": problems} for path, problems in self.files],
            "scanned_files": self.scanned_files,
            "scanned_bytes": self.scanned_bytes,
            "entries": self.entries,
            "truncated": list(self.truncated),
            "stopped_early": self.stopped_early,
            "stop_reason": self.stop_reason,
            "unreadable": list(self.unreadable),
            "skipped": list(self.skipped),
            "weights": list(self.weights),
        }


class _Budget:
    def __init__(self, max_total_bytes: int, max_files: int) -> None:
        self.bytes_left = max_total_bytes
        self.files_left = max_files
        self.exhausted = False


def _scan_fd(
    fd: int, index: OverlapIndex, limit: int, chunk_bytes: int, walk: Walk | None = None
) -> tuple[set[int], int, bool, bool] | None:
    """(questions found, bytes read and expanded, whether ``limit`` or ``walk``'s time budget cut
    the file, whether tensors of it were skipped) for a file's text
    (:func:`autorl.provenance.file_text.file_text`); None for weights."""
    reading = Reading(limit, chunk_bytes)
    carry_words = max(index.longest - 1, 0)
    matches: set[tuple[int, int]] = set()
    # What waits for the next piece (text, words) of each reading: the text, and its bytes read
    # again as UTF-8 where it was decoded from another encoding (AsUtf8).
    tails: dict[bool, tuple[str, list[str]]] = {False: ("", []), True: ("", [])}
    for piece in file_text(fd, reading):
        second = isinstance(piece, AsUtf8)
        text_tail, words_tail = tails[second]
        text = text_tail + piece
        # Cut after the last separator: no word and no escape is split; the rest waits for the
        # next piece. Text without one is taken whole.
        cut = max(text.rfind(space) for space in _SEPARATORS) + 1 or len(text)
        text, text_tail = text[:cut], text[cut:]
        words = words_tail + normalize(text)
        matches |= index.matches_in(words)
        tails[second] = (text_tail, words[max(len(words) - carry_words, 0) :] if carry_words else [])
        if walk is not None and walk.out_of_time():
            break  # text made slow to match (one phrase repeated) is bounded by time too
    if reading.weights:
        return None
    for text_tail, words_tail in tails.values():
        matches |= index.matches_in(words_tail + normalize(text_tail))
    cut = reading.cut or bool(walk and walk.stopped)
    return index.problems_with(matches), reading.used, cut, reading.tensors


def listed(paths: Sequence[str]) -> tuple[str, ...]:
    """The first :data:`MAX_LISTED_PATHS` of ``paths``, then how many more there are."""
    more = len(paths) - MAX_LISTED_PATHS
    return (*paths[:MAX_LISTED_PATHS], *([f"(and {more} more)"] if more > 0 else []))


def scan_files(
    roots: Sequence[Path] | Mapping[str, Path],
    index: OverlapIndex,
    *,
    leave_out: Collection[Path] = (),
    max_file_bytes: int = MAX_FILE_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    max_files: int = MAX_FILES,
    chunk_bytes: int = CHUNK_BYTES,
    walk: Walk | None = None,
    on_found: Callable[[str, frozenset[int]], None] | None = None,
) -> OverlapReport:
    """The questions of ``index`` that the text files under ``roots`` hold, each file judged alone.

    ``roots`` are folders by label, or a list labelled by their names (``code``, ``output``), so
    names must differ; a root inside another (:mod:`autorl.provenance.agent_area`: ``code`` in the
    workspace) is read once, under its own label, and nothing under ``leave_out``. The folders are
    walked by :class:`autorl.provenance.walk.Walk` (``walk`` sets its entry and time budgets).
    Skipped: links (a root that is one too), anything but regular files, weights (by their
    content; named in :attr:`OverlapReport.weights`); recorded and
    making the report incomplete: sparse files, folders too deep (the walk's ``max_depth``), what could
    not be read, a budget reached. ``on_found`` is told each file that holds a question as soon as
    it is read (the scan in a process of its own, :mod:`autorl.provenance.scan_process`, keeps what
    was found if that process ends early).

    It runs in the caller's process: a decoder's output is counted only once it exists, so an
    agent's file can make it allocate past the caps before they refuse it (a decoder that ignores
    an output bound; a size a Parquet file declares). The platform reads an agent's files with
    :func:`autorl.provenance.scan_process.scan_files_apart`, which runs this under a hard memory limit.
    """
    if isinstance(roots, Mapping):
        labelled = dict(roots)
    else:
        labelled = {root.name: root for root in roots}
        if len(labelled) != len(roots):
            raise ValueError(f"roots must have distinct names, not {[root.name for root in roots]}")
    walk = walk if walk is not None else Walk()
    budget = _Budget(max_total_bytes, max_files)
    found: set[int] = set()
    files: list[tuple[str, frozenset[int]]] = []
    truncated: list[str] = []
    weights: list[str] = []
    scanned_files = scanned_bytes = 0
    for label, root in labelled.items():
        for below, name, dir_fd in walk.files(root, label, leave_out=left_out(labelled, label, leave_out)):
            if budget.files_left <= 0 or budget.bytes_left <= 0:
                walk.stop(
                    f"its {max_files}-file cap was reached"
                    if budget.files_left <= 0
                    else f"its {max_total_bytes}-byte cap was reached"
                )
                break
            fd = walk.open_file(name, dir_fd, below)
            if fd is None:
                continue
            budget.files_left -= 1
            try:
                limit = min(max_file_bytes, budget.bytes_left)
                result = _scan_fd(fd, index, limit, chunk_bytes, walk)
            except Exception:  # one file's error (an agent's file made to break a reader): named
                walk.unreadable.append(shown_path(below))
                continue
            finally:
                os.close(fd)
            shown = shown_path(below)
            if result is None:
                weights.append(shown)
                continue
            in_file, read, more, tensors = result
            scanned_files += 1
            scanned_bytes += read
            budget.bytes_left -= read
            if tensors:
                weights.append(shown)
            if more:
                truncated.append(shown)
                if limit < max_file_bytes:
                    walk.stop(f"its {max_total_bytes}-byte cap was reached")
            if in_file:
                files.append((shown, frozenset(in_file)))
                found |= in_file
                if on_found is not None:
                    on_found(shown, frozenset(in_file))
            if walk.stopped or walk.out_of_time():
                break
        if walk.stopped:
            break
    files.sort()
    return OverlapReport(
        found=frozenset(found),
        files=tuple((path, len(held)) for path, held in files),
        scanned_files=scanned_files,
        scanned_bytes=scanned_bytes,
        truncated=listed(truncated),
        stopped_early=bool(walk.stopped),
        stop_reason=walk.stopped,
        unreadable=listed(walk.unreadable),
        skipped=listed(walk.skipped),
        entries=walk.entries,
        found_in=tuple(held for _, held in files),
        weights=listed(weights),
    )
