"""The scan of an agent's files for test questions, in a process of its own under a hard memory limit.

Reading an agent's files runs decoders the platform did not write (zlib, bz2, lzma, pyarrow's
Parquet reader and its codecs) on bytes the agent chose, and the scan counts a decoder's output
only once it exists (:mod:`autorl.provenance.file_text` bounds what it can, but a size a file
declares is the agent's). Run in the platform's own process (``autorl run``; an evaluator that
serves every experiment of a cluster), a file of a few kilobytes that expands to gigabytes would
spend the platform's memory, and other experiments' with it. So :func:`scan_files_apart` runs
:func:`autorl.provenance.overlap.scan_files` in a child process, started by spawn (the callers are
multithreaded, so never forked), whose address space (``RLIMIT_AS``) is what it holds once its
libraries are loaded plus :data:`SCAN_MEMORY_BYTES`.

* Inside the child an allocation past the limit raises MemoryError (pyarrow's ArrowMemoryError is
  one), which the scan catches for each file: that file is named unreadable and the scan goes on.
* A child that ends without a report (a decoder that aborts when an allocation fails, a signal) or
  outlasts the walk's time budget (it is then killed) gives a report that stopped early, with the
  reason (the memory limit named) and the files it had found questions in until then: the callers
  show it as unverified, never as clean, and the run's other results stand.
* The child's answers are JSON read with a length limit, never a pickle: the child has run decoders
  on the agent's bytes, so what it says is data.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import time
from collections.abc import Collection, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from autorl.provenance.overlap import OverlapIndex, OverlapReport, scan_files
from autorl.provenance.walk import Walk

#: Address space the scan may take beyond what its process holds once its libraries are loaded.
#: Measured (pyarrow 26, CPython 3.11, Linux x86-64): the child holds 449 MiB of address space
#: (120 MiB resident) once pyarrow is loaded and its reader's threads started; decoding a Parquet
#: file of one 96 MiB string (the page, the array, a dictionary's copy, Python's string) took
#: 580 MiB more at its peak (400 MiB was refused), so the largest value the per-file cap admits
#: (256 MiB) needs about 1.5 GiB. Other files cost less: pieces of 1 MiB, gzip, bzip2 and LZMA
#: expanded within what is asked, a nested zip held whole (at most the cap). In the caller's
#: process a bzip2 zip of 1,678 bytes took 4,119 MiB at its peak.
SCAN_MEMORY_BYTES = 2 * 1024 * 1024 * 1024
#: Seconds past the walk's time budget the child may take before it is killed (its start, and a
#: decoder call that does not return to the scan's checks of the time).
GRACE_SECONDS = 60.0
#: Bytes one answer of the child may have; a longer one is refused. A report names at most
#: MAX_FILES files with questions and a few hundred paths besides, each at most
#: MAX_SHOWN_PATH_CHARS long (autorl.provenance.overlap), about 30 MiB of JSON at the worst.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
_MIB = 1024 * 1024


def scan_files_apart(
    roots: Sequence[Path] | Mapping[str, Path],
    index: OverlapIndex,
    *,
    leave_out: Collection[Path] = (),
    walk: Walk | None = None,
    memory_bytes: int = SCAN_MEMORY_BYTES,
    **caps: int,
) -> OverlapReport:
    """:func:`autorl.provenance.overlap.scan_files` of ``roots`` (with ``leave_out``, ``walk``'s
    budgets and the ``caps`` it takes) in a child process whose address space is limited to its
    size after its imports plus ``memory_bytes``; an incomplete report (stopped early, the reason
    said) when the child ends without one. ``walk`` is used in the child: the report, not it,
    says what was left unread."""
    walk = walk if walk is not None else Walk()
    context = multiprocessing.get_context("spawn")
    answers, child_end = context.Pipe(duplex=False)
    process = context.Process(
        target=_scan_in_child,
        args=(child_end, roots, index, tuple(leave_out), walk, memory_bytes, caps),
        name="autorl-scan",
        daemon=True,
    )
    deadline = time.monotonic() + walk.max_seconds + GRACE_SECONDS
    found: dict[str, frozenset[int]] = {}
    why = ""
    try:
        try:
            process.start()
        except Exception as exc:  # the platform's (no process to be had): the scan was not made
            why = f"the process to read them could not start ({type(exc).__name__})"
        child_end.close()
        while not why:
            left = deadline - time.monotonic()
            if left <= 0 or not answers.poll(left):
                why = f"its {walk.max_seconds:g}-second time budget ran out (the reading process was stopped)"
                break
            try:
                kind, body = json.loads(answers.recv_bytes(MAX_ANSWER_BYTES))
                if kind == "report":
                    return _report(body)
                # Two long paths may show alike (cut to MAX_SHOWN_PATH_CHARS): their findings add up.
                path = str(body[0])
                found[path] = found.get(path, frozenset()) | {int(i) for i in body[1]}
            except EOFError:
                break
            except (OSError, ValueError, TypeError, KeyError, IndexError):  # past the length, malformed
                why = "the process reading them gave an answer that could not be read"
                break
    finally:
        answers.close()
        child_end.close()
        _end(process)
    if not why:
        ended = process.exitcode
        how = f"killed by signal {-ended}" if ended is not None and ended < 0 else f"exit code {ended}"
        why = (
            f"the process reading them ended before the scan did ({how}), past its "
            f"{memory_bytes // _MIB}-MiB memory limit or stopped"
        )
    files = sorted(found.items())
    return OverlapReport(
        found=frozenset().union(*found.values()),
        files=tuple((path, len(held)) for path, held in files),
        scanned_files=0,
        scanned_bytes=0,
        truncated=(),
        stopped_early=True,
        stop_reason=why,
        found_in=tuple(held for _, held in files),
    )


def _end(process: multiprocessing.process.BaseProcess) -> None:
    """The child gone: given a moment to exit after its answer, then killed."""
    if process.pid is None:
        return
    process.join(5)
    if process.exitcode is None:
        process.kill()
        process.join()


def _scan_in_child(
    answers: Connection,
    roots: Sequence[Path] | Mapping[str, Path],
    index: OverlapIndex,
    leave_out: tuple[Path, ...],
    walk: Walk,
    memory_bytes: int,
    caps: dict[str, int],
) -> None:
    """The child's work: its memory limited, the scan made, each finding and then the report sent."""
    _load_pyarrow()
    limit = _address_space() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def send(kind: str, body: object) -> None:
        answers.send_bytes(json.dumps([kind, body]).encode())

    report = scan_files(
        roots,
        index,
        leave_out=leave_out,
        walk=walk,
        on_found=lambda shown, held: send("file", [shown, sorted(held)]),
        **caps,
    )
    send("report", _wire(report))
    answers.close()


def _load_pyarrow() -> None:
    """pyarrow loaded, and its reader's threads started, before the limit is measured; it allocates
    through malloc with one thread a pool. Its default allocator (mimalloc) reserves address space
    by the gigabyte (measured: 1,551 MiB after reading one small Parquet file, against 528 MiB with
    the system allocator), and each pool thread reserves its stack and a malloc arena (64 MiB)
    when it starts: counted here, they are not taken from :data:`SCAN_MEMORY_BYTES`."""
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"  # read once, when the pool is first asked
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # the scan reads Parquet only where pyarrow is installed
        return
    pa.set_memory_pool(pa.system_memory_pool())
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    sample = pa.BufferOutputStream()
    pq.write_table(pa.table({"text": ["a"]}), sample)
    pq.read_table(pa.BufferReader(sample.getvalue()))


def _address_space() -> int:
    """This process's address space in bytes (Linux's /proc/self/statm, in pages)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _wire(report: OverlapReport) -> dict[str, Any]:
    return {
        "found": sorted(report.found),
        "files": [list(entry) for entry in report.files],
        "scanned_files": report.scanned_files,
        "scanned_bytes": report.scanned_bytes,
        "truncated": list(report.truncated),
        "stopped_early": report.stopped_early,
        "stop_reason": report.stop_reason,
        "unreadable": list(report.unreadable),
        "skipped": list(report.skipped),
        "entries": report.entries,
        "found_in": [sorted(held) for held in report.found_in],
        "weights": list(report.weights),
    }


def _report(body: dict[str, Any]) -> OverlapReport:
    def strings(key: str) -> tuple[str, ...]:
        return tuple(str(item) for item in body[key])

    return OverlapReport(
        found=frozenset(int(i) for i in body["found"]),
        files=tuple((str(path), int(count)) for path, count in body["files"]),
        scanned_files=int(body["scanned_files"]),
        scanned_bytes=int(body["scanned_bytes"]),
        truncated=strings("truncated"),
        stopped_early=bool(body["stopped_early"]),
        stop_reason=str(body["stop_reason"]),
        unreadable=strings("unreadable"),
        skipped=strings("skipped"),
        entries=int(body["entries"]),
        found_in=tuple(frozenset(int(i) for i in held) for held in body["found_in"]),
        weights=strings("weights"),
    )
