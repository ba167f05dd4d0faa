"""What one of an agent's files says, as text to read for test questions: decided by its content,
never by its name.

* Containers are opened: gzip (one or several members), zip, tar, Parquet (its string columns),
  nested at most :data:`MAX_NESTING` deep (a ``.tar.gz``, a ``.jsonl.gz`` in a zip), at most
  :data:`MAX_MEMBERS` members a file.
* Text with a byte-order mark is decoded by it (UTF-8, UTF-16, UTF-32), and so is UTF-16 without
  one, known by NUL bytes at alternate positions of its start (:func:`_utf16_without_bom`);
  everything else as UTF-8, every byte that is not text (a NUL, an undecodable byte) a separator,
  so the text runs of a binary file (an Arrow table, a pickle, a file with one NUL byte) are read
  as its words. Text decoded from UTF-16 or UTF-32 is read as UTF-8 too (:class:`AsUtf8`): what
  its start says holds for its start only, and a file may go on in another encoding.
* Weights are recognised by their content and not read: safetensors (a header whose tensors
  fill the rest of the file exactly), a NumPy array of numbers (its header's shape and type
  account for the rest of the file). Of a PyTorch checkpoint only the tensors' storages are
  skipped and its pickle is read as text (its bytes, never unpickled), since ``torch.save`` stores
  any object: the zip format's ``data.pkl`` (:func:`_pytorch_pickle_member`), the older format's
  pickles (:func:`_pytorch_legacy_end`: walked opcode by opcode, the rest of the file shaped as
  storages). A text file named ``x.safetensors`` is read, and so is a member of an archive
  whatever it holds; text stored inside a weights file (its metadata, a tensor) is hidden on
  purpose and not found, and the file is named (:attr:`Reading.weights`, :attr:`Reading.tensors`)
  in the scan's and the copy's records.

Every byte read from the file and every byte a decoder expands counts towards :class:`Reading`'s
limit (the scan's per-file and total caps); what a limit cut leaves the file marked as cut. A
container that does not parse is read as plain bytes. A byte is counted once a decoder has
produced it, so the caps bound what a decoder is allowed to produce, not what it allocates first:

* gzip, and bzip2 and LZMA members of a zip, are expanded here with an output bound (at most the
  bytes asked, within what the limit leaves); stored and deflated zip members by zipfile, which
  bounds them the same way. Members of other zip methods are not opened (the file is cut).
* A Parquet row group is decoded only when the uncompressed size it declares fits what the limit
  leaves, in batches of about :data:`PARQUET_BATCH_BYTES`, and what was decoded is checked
  against the limit again; but the declared sizes are the agent's, and a decoder (pyarrow,
  its codecs, zipfile's reading of a directory) may still allocate more than the caps before a
  byte is counted. The hard bound is the memory limit of the process the platform reads an
  agent's files in (:mod:`autorl.provenance.scan_process`), where such a file is unreadable.
"""

from __future__ import annotations

import bz2
import codecs
import io
import json
import lzma
import math
import os
import pickletools
import re
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Protocol

#: Bytes of a file's start that decide what it is (a tar's magic lies at 257).
HEAD_BYTES = 512
#: Containers inside containers opened at most (a ``.tar.gz`` is two).
MAX_NESTING = 2
#: Members of one file's containers read at most; the file is cut past them.
MAX_MEMBERS = 10_000
#: A zip's central directory is read whole: longer ones (a bomb of empty members) are not opened.
MAX_ZIP_DIRECTORY_BYTES = 16 * 1024 * 1024
#: Bytes of a weights file's own description read at most to recognise it: a safetensors header (a
#: real one is under a megabyte: Qwen2.5-72B's about 100 KB) or a PyTorch zip's central directory
#: (about 100 bytes a tensor). A longer one is not taken for weights, and the file is read. The
#: check runs in the grader's own process, which has no memory limit (:mod:`autorl.provenance.
#: agent_copy`): what parsing a description costs is bounded by this (a 16 MiB header of empty JSON
#: objects took 415 MiB).
MAX_WEIGHTS_HEADER = 1024 * 1024
#: A PyTorch checkpoint's members: its pickle, storages and bookkeeping (below one prefix).
_TORCH_MEMBER = re.compile(
    r"[^/]+/(data\.pkl|data/\d+|\.data/serialization_id|\.format_version|\.storage_alignment|byteorder|version)"
)
#: A PyTorch checkpoint's storages (its tensors' bytes): the members not read.
_TORCH_STORAGE = re.compile(r"[^/]+/data/\d+")
#: A bookkeeping member of a PyTorch zip (a version, the byte order: a few bytes as PyTorch writes
#: them) longer than this: not a checkpoint, and the zip is read as any other.
MAX_TORCH_BOOKKEEPING = 64
#: Opcodes of an older PyTorch checkpoint's pickles walked at most (a few a tensor): past them, not
#: a checkpoint, and the file is read whole.
MAX_PICKLE_STEPS = 1_000_000
#: Places in an older PyTorch checkpoint where a storage may start looked at, at most (each element
#: size tried): past them, not a checkpoint.
MAX_STORAGE_STEPS = 100_000
#: Bytes of a pickle argument that ends at a line break (a global's name) looked through at most.
MAX_PICKLE_LINE = 4096
#: Pickles at the start of PyTorch's older format: its magic number, protocol version, system
#: information, the object saved and its storages' keys.
_TORCH_PICKLES = 5
_PICKLE_OPCODES = {op.code.encode("latin-1"): op for op in pickletools.opcodes}
#: An argument's length, by how a pickle's opcode gives it: (its bytes, struct format).
_PICKLE_LENGTHS = {
    pickletools.TAKEN_FROM_ARGUMENT1: (1, "<B"),
    pickletools.TAKEN_FROM_ARGUMENT4: (4, "<i"),
    pickletools.TAKEN_FROM_ARGUMENT4U: (4, "<I"),
    pickletools.TAKEN_FROM_ARGUMENT8U: (8, "<Q"),
}
#: Bytes of an element of an older PyTorch storage (bool, half, float, double, complex double).
_ELEMENT_BYTES = (4, 2, 8, 1, 16)
#: Rows of a Parquet file decoded at once, at most.
PARQUET_BATCH_ROWS = 1024
#: Bytes of a Parquet file's text columns decoded at once, by the sizes its row groups declare:
#: fewer rows a batch where they declare more.
PARQUET_BATCH_BYTES = 64 * 1024 * 1024
#: An LZMA member of a zip whose dictionary is larger is not opened (the decoder allocates it
#: whole; xz's strongest preset uses 64 MiB, zipfile's default 8 MiB).
MAX_LZMA_DICTIONARY = 64 * 1024 * 1024
#: Zip compression methods whose members CPython's zipfile expands within the bytes asked (a read
#: of n bytes inflates about n): stored and deflate. It expands bzip2 and LZMA members with no
#: output bound, so one read of a few kilobytes could expand to gigabytes before anything is
#: charged; those are expanded here, in steps of at most what is asked (:class:`_Expanded`), so
#: they are read within the caps like gzip, rather than left unread (which would make every such
#: archive an incomplete scan). Members of other methods are not opened, and the file is cut.
_BOUNDED_BY_ZIPFILE = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
#: Bytes asked of a stream at once.
READ_BYTES = 1024 * 1024

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
#: torch.save's older format: a pickle whose first object is PyTorch's magic number.
_TORCH_PICKLE = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


class Reading:
    """One file's reading: its byte limit, what it used, whether the limit cut it, whether it was
    recognised as weights (and not read) or bytes of it were skipped as tensors."""

    def __init__(self, limit: int, chunk_bytes: int = READ_BYTES) -> None:
        self.limit = limit
        #: Bytes asked of the file at once.
        self.chunk_bytes = chunk_bytes
        self.used = 0
        self.cut = False
        self.weights = False
        #: A PyTorch checkpoint: its pickle was read, its storages skipped.
        self.tensors = False
        self.members = 0

    @property
    def left(self) -> int:
        return self.limit - self.used

    def charge(self, count: int) -> None:
        self.used += count


class _Stream(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


def is_weights(fd: int) -> bool:
    """Whether the open file ``fd`` is weights and nothing else (safetensors, a NumPy array of
    numbers), by its content; a PyTorch checkpoint is not (:func:`pytorch_pickles`)."""
    size = os.fstat(fd).st_size
    head = os.pread(fd, HEAD_BYTES, 0)
    if _numbers_npy(head, size):
        return True
    if len(head) > 8 and head[8:9] == b"{":
        length: int = struct.unpack("<Q", head[:8])[0]
        if length <= min(MAX_WEIGHTS_HEADER, size - 8):
            return _safetensors_end(os.pread(fd, length, 8)) == size - 8 - length
    return False


def pytorch_pickles(fd: int) -> _Stream | None:
    """The pickle of the PyTorch checkpoint in the open file ``fd`` as a stream of its bytes (the
    older format's pickles, the zip format's ``data.pkl``): what of it is text, its storages left
    out; None for any other file. A zip's directory is read within :data:`MAX_WEIGHTS_HEADER`."""
    size = os.fstat(fd).st_size
    end = _pytorch_legacy_end(fd, size)
    if end is not None:
        return _Slice(_FileReader(fd, Reading(end)), 0, end)
    if not os.pread(fd, 4, 0).startswith(b"PK\x03\x04"):
        return None
    reader = _FileReader(fd, Reading(size))
    reader.max_read = MAX_WEIGHTS_HEADER
    try:
        archive = zipfile.ZipFile(reader)
        member = _pytorch_pickle_member(archive)
        if member is None:
            return None
        reader.max_read = None
        return archive.open(member)
    except MemoryError:  # past the reading process's memory limit: not a finding, raised
        raise
    except Exception:  # an agent's malformed zip: not a checkpoint
        return None


def _pytorch_pickle_member(archive: zipfile.ZipFile) -> zipfile.ZipInfo | None:
    """The pickle (``data.pkl``) of ``archive`` where it is a PyTorch checkpoint: every member a
    checkpoint's (:data:`_TORCH_MEMBER`), its bookkeeping at most :data:`MAX_TORCH_BOOKKEEPING`
    bytes a member, its pickle stored or deflated; else None."""
    members = archive.infolist()
    pickles = [info for info in members if info.filename.endswith("/data.pkl")]
    if len(pickles) != 1 or pickles[0].compress_type not in _BOUNDED_BY_ZIPFILE:
        return None
    for info in members:
        if not _TORCH_MEMBER.fullmatch(info.filename):
            return None
        bookkeeping = info is not pickles[0] and not _TORCH_STORAGE.fullmatch(info.filename)
        if bookkeeping and info.file_size > MAX_TORCH_BOOKKEEPING:
            return None
    return pickles[0]


def _pytorch_legacy_end(fd: int, size: int) -> int | None:
    """Where the pickles of a PyTorch checkpoint of the older format end: the file starts with
    PyTorch's magic number, its :data:`_TORCH_PICKLES` pickles are walked opcode by opcode (never
    unpickled), and what follows them is storages to the file's end, each an 8-byte count of its
    elements then their bytes; None for any other file."""
    if os.pread(fd, len(_TORCH_PICKLE), 0) != _TORCH_PICKLE:
        return None
    window = _Window(fd, size)
    end: int | None = 0
    for _ in range(_TORCH_PICKLES):
        end = _pickle_end(window, end or 0)
        if end is None:
            return None
    assert end is not None
    return end if _storages_fill(window, end) else None


def _pickle_end(window: _Window, start: int) -> int | None:
    """Where the pickle at ``start`` ends (after its STOP), by its opcodes and their arguments'
    lengths; None where an opcode is unknown or it runs past the file or :data:`MAX_PICKLE_STEPS`."""
    position = start
    for _ in range(MAX_PICKLE_STEPS):
        op = _PICKLE_OPCODES.get(window.get(position, 1))
        if op is None:
            return None
        position += 1
        if op.name == "STOP":
            return position
        argument = op.arg
        if argument is None:
            continue
        if argument.n >= 0:
            position += argument.n
        elif argument.n == pickletools.UP_TO_NEWLINE:
            for _line in range(2 if argument.name == "stringnl_noescape_pair" else 1):
                found = window.get(position, MAX_PICKLE_LINE).find(b"\n")
                if found < 0:
                    return None
                position += found + 1
        else:
            width, layout = _PICKLE_LENGTHS[argument.n]
            raw = window.get(position, width)
            length = struct.unpack(layout, raw)[0] if len(raw) == width else -1
            if length < 0:
                return None
            position += width + length
        if position > window.size:
            return None
    return None


def _storages_fill(window: _Window, start: int) -> bool:
    """Whether the bytes from ``start`` to the file's end are storages of PyTorch's older format,
    each an 8-byte count of elements of :data:`_ELEMENT_BYTES` then their bytes (the element size
    is in the pickle, not read: each is tried, a storage's end looked at once)."""
    pending, seen = [start], set[int]()
    while pending and len(seen) < MAX_STORAGE_STEPS:
        position = pending.pop()
        if position == window.size:
            return True
        if position in seen:
            continue
        seen.add(position)
        raw = os.pread(window.fd, 8, position)  # one storage's count: no more read
        if len(raw) < 8:
            continue
        count: int = struct.unpack("<Q", raw)[0]
        pending.extend(
            end for width in reversed(_ELEMENT_BYTES) if (end := position + 8 + count * width) <= window.size
        )
    return False


class _Window:
    """Bytes of the file ``fd`` at any position, read a megabyte at once."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.start = 0
        self.data = b""

    def get(self, position: int, count: int) -> bytes:
        offset = position - self.start
        if offset < 0 or (offset + count > len(self.data) and self.start + len(self.data) < self.size):
            self.start, offset = position, 0
            self.data = os.pread(self.fd, max(count, READ_BYTES), position)
        return self.data[offset : offset + count]


def _numbers_npy(head: bytes, size: int) -> bool:
    """A NumPy file (version 1) of numbers whose shape and type account for all of it; an array of
    strings ('U', 'S') or objects (a pickle) holds text."""
    if not head.startswith(b"\x93NUMPY\x01"):
        return False
    found = re.search(rb"'descr': *'[<>|=]?[fiubc](\d+)'.*'shape': *\(([\d, ]*)\)", head[10:])
    if found is None:
        return False
    items = math.prod(int(n) for n in found[2].split(b",") if n.strip())
    return 10 + int.from_bytes(head[8:10], "little") + items * int(found[1]) == size


def _safetensors_end(header: bytes) -> int | None:
    """Where a safetensors header's tensors end in its data, or None for no header."""
    try:
        entries = json.loads(header)
        ends = [int(entry["data_offsets"][1]) for name, entry in entries.items() if name != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    return max(ends, default=0)


def file_text(fd: int, reading: Reading) -> Iterator[str]:
    """The text of the open file ``fd`` in pieces, within ``reading``'s limit; nothing when it is
    weights (``reading.weights``)."""
    if is_weights(fd):
        reading.weights = True
        return
    size = os.fstat(fd).st_size
    pickles_end = _pytorch_legacy_end(fd, size)
    if pickles_end is not None:
        reading.tensors = True
        yield from _plain(_Slice(_FileReader(fd, reading), 0, pickles_end), reading)
        return
    head = os.pread(fd, HEAD_BYTES, 0)
    source = _FileReader(fd, reading)
    try:
        yield from _text(source, head, reading, 0)
    except MemoryError:  # past the memory limit: the file is unreadable, not read as bytes
        raise
    except Exception:  # an agent's malformed container: its bytes are read as they are
        if not source.containers:
            raise
        yield from _plain(_FileReader(fd, reading), reading)


def _text(source: _Stream, head: bytes, reading: Reading, depth: int) -> Iterator[str]:
    """The text of ``source``, which starts with ``head``, ``depth`` containers deep."""
    opener = _container(head) if depth < MAX_NESTING else None
    if isinstance(source, _FileReader) and opener is not None:
        source.containers = True
    if opener is None:
        if head.startswith(b"\x93NUMPY") and re.search(rb"'descr': *'<U", head):
            # An array of strings as NumPy saves them: UTF-32, its header 64-byte aligned.
            yield from _plain(source, reading, "utf-32-le")
            return
        for bom, encoding in _BOMS:
            if head.startswith(bom):
                yield from _plain(source, reading, encoding)
                return
        yield from _plain(source, reading, _utf16_without_bom(head) or "utf-8")
        return
    yield from opener(source, reading, depth + 1)


def _container(head: bytes) -> Callable[[_Stream, Reading, int], Iterator[str]] | None:
    if head.startswith(b"\x1f\x8b"):
        return _gzip
    if head.startswith(_ZIP_MAGICS):
        return _zip
    if head[257:262] == b"ustar":
        return _tar
    if head.startswith(b"PAR1"):
        return _parquet
    return None


class AsUtf8(str):
    """A piece of the same bytes read a second time, as UTF-8, beside their text in another
    encoding: its words go on from the previous piece of this kind, not from the one before it."""


def _utf16_without_bom(head: bytes) -> str | None:
    """``utf-16-le`` or ``utf-16-be`` where ``head`` (at least two code units) holds NUL bytes at
    alternate positions, as UTF-16 text of mostly Latin letters does: in more than half of its
    code units the NUL is on one side, and in at most an eighth on the other."""
    units = len(head) // 2
    if units < 2:
        return None
    low, high = head[: 2 * units : 2].count(0), head[1 : 2 * units : 2].count(0)
    if 2 * high > units and 8 * low <= units:
        return "utf-16-le"
    if 2 * low > units and 8 * high <= units:
        return "utf-16-be"
    return None


def _plain(source: _Stream, reading: Reading, encoding: str = "utf-8") -> Iterator[str]:
    """``source``'s text in ``encoding``, and in another encoding its bytes as UTF-8 too
    (:class:`AsUtf8`), each byte read once."""
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    second = codecs.getincrementaldecoder("utf-8")(errors="replace") if encoding != "utf-8" else None
    while chunk := source.read(reading.chunk_bytes):
        yield decoder.decode(chunk)
        if second is not None:
            yield AsUtf8(second.decode(chunk))
    yield decoder.decode(b"", final=True)
    if second is not None:
        yield AsUtf8(second.decode(b"", final=True))


def _member(stream: _Stream, reading: Reading, depth: int) -> Iterator[str]:
    """One member of a container, its own containers opened."""
    reading.members += 1
    if reading.members > MAX_MEMBERS:
        reading.cut = True
        return
    peeked = _Peeked(stream)
    head = peeked.peek(HEAD_BYTES)
    yield from _text(peeked, head, reading, depth)


def _gzip(source: _Stream, reading: Reading, depth: int) -> Iterator[str]:
    yield from _member(_Gunzipped(source, reading), reading, depth)


def _zip(source: _Stream, reading: Reading, depth: int) -> Iterator[str]:
    seekable = source if isinstance(source, _FileReader) else io.BytesIO(_all(source, reading))
    if isinstance(seekable, _FileReader):
        seekable.max_read = MAX_ZIP_DIRECTORY_BYTES
    with zipfile.ZipFile(seekable) as archive:
        members = archive.infolist()
        pickle = _pytorch_pickle_member(archive)
        if pickle is not None:  # a PyTorch checkpoint: its pickle, not its storages
            reading.tensors = True
            members = [pickle]
        for info in members:
            if reading.cut:
                return
            if info.is_dir():
                continue
            if info.compress_type in _BOUNDED_BY_ZIPFILE:
                with archive.open(info) as member:
                    yield from _member(_Charged(member, reading), reading, depth)
                continue
            expanded = _expanded_member(seekable, info, reading)
            if expanded is None:
                reading.cut = True  # a method not opened: the member is not read
                continue
            yield from _member(expanded, reading, depth)


def _expanded_member(seekable: Any, info: zipfile.ZipInfo, reading: Reading) -> _Expanded | None:
    """A bzip2 or LZMA member of a zip, expanded by this module (:data:`_BOUNDED_BY_ZIPFILE` says
    why); None for another method, or an LZMA dictionary past :data:`MAX_LZMA_DICTIONARY`."""
    if info.flag_bits & 0x1:
        raise RuntimeError("an encrypted zip member")  # as zipfile: the file is read as bytes
    seekable.seek(info.header_offset)
    header = seekable.read(30)
    if len(header) != 30 or not header.startswith(b"PK\x03\x04"):
        raise zipfile.BadZipFile("no local header where the directory says")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    raw = _Slice(seekable, info.header_offset + 30 + name_length + extra_length, info.compress_size)
    decoder: bz2.BZ2Decompressor | lzma.LZMADecompressor
    if info.compress_type == zipfile.ZIP_BZIP2:
        decoder = bz2.BZ2Decompressor()
    elif info.compress_type == zipfile.ZIP_LZMA:
        # APPNOTE 5.8.8: a version (2 bytes), the properties' length (2), LZMA1's 5 bytes of
        # properties (lc, lp and pb in one byte; the dictionary's size), then raw LZMA.
        head = raw.read(4)
        properties = raw.read(struct.unpack("<H", head[2:4])[0]) if len(head) == 4 else b""
        if len(properties) < 5:
            raise zipfile.BadZipFile("an LZMA member without its properties")
        packed, dictionary = properties[0], int.from_bytes(properties[1:5], "little")
        if packed >= 9 * 5 * 5 or dictionary > MAX_LZMA_DICTIONARY:
            return None
        lzma1 = {"id": lzma.FILTER_LZMA1, "lc": packed % 9, "lp": packed // 9 % 5, "pb": packed // 45}
        decoder = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[{**lzma1, "dict_size": dictionary}])
    else:
        return None
    return _Expanded(raw, decoder, reading)


def _tar(source: _Stream, reading: Reading, depth: int) -> Iterator[str]:
    with tarfile.open(fileobj=source, mode="r|") as archive:  # type: ignore[call-overload]
        for info in archive:
            if reading.cut:
                return
            if info.isreg():
                member = archive.extractfile(info)
                if member is not None:
                    yield from _member(member, reading, depth)
            elif reading.members + 1 > MAX_MEMBERS:
                reading.cut = True
            else:
                reading.members += 1


def _parquet(source: _Stream, reading: Reading, depth: int) -> Iterator[str]:
    """The string and binary columns of a Parquet file, value by value; a dictionary's values once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    seekable: Any = source if isinstance(source, _FileReader) else io.BytesIO(_all(source, reading))
    table = pq.ParquetFile(pa.PythonFile(seekable, mode="r"))
    textual = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
    columns = [
        field.name
        for field in table.schema_arrow
        for kind in [field.type.value_type if pa.types.is_dictionary(field.type) else field.type]
        if any(is_text(kind) for is_text in textual)
    ]
    if not columns:
        return
    table = pq.ParquetFile(pa.PythonFile(seekable, mode="r"), read_dictionary=columns)
    for group in range(table.num_row_groups):
        batch_rows = _parquet_batch_rows(table.metadata.row_group(group), set(columns), reading)
        if batch_rows is None:
            reading.cut = True
            return
        if batch_rows:
            batches = table.iter_batches(batch_size=batch_rows, row_groups=[group], columns=columns)
            if not (yield from _parquet_batches(batches, reading)):
                return


def _parquet_batch_rows(group: Any, columns: set[str], reading: Reading) -> int | None:
    """Rows of a row group to decode at once, by the uncompressed size its text columns declare:
    about :data:`PARQUET_BATCH_BYTES` a batch; 0 for an empty group; None when the group declares
    more than the limit leaves, and is not decoded (a page, what a decoder expands at once, may
    hold the whole group: fewer rows a batch would not bound it). The sizes are the agent's, and
    what was decoded is checked against the limit afterwards; the bound on what a file that lies
    costs is the memory limit of the process the scan runs in (:mod:`autorl.provenance.scan_process`)."""
    rows = int(group.num_rows)
    if rows <= 0:
        return 0
    declared: int = sum(
        group.column(chunk).total_uncompressed_size
        for chunk in range(group.num_columns)
        if group.column(chunk).path_in_schema in columns
    )
    if declared > reading.left:
        return None
    return max(1, min(PARQUET_BATCH_ROWS, PARQUET_BATCH_BYTES * rows // max(declared, 1)))


def _parquet_batches(batches: Iterator[Any], reading: Reading) -> Generator[str, None, bool]:
    """The text of decoded batches' values (a dictionary's once); returns False where the limit
    cut them."""
    import pyarrow as pa

    seen: set[int] = set()
    for batch in batches:
        for column in batch.columns:
            values = column.dictionary if pa.types.is_dictionary(column.type) else column
            key = values.buffers()[-1].address if values.buffers()[-1] is not None else 0
            if values is not column and key in seen:
                continue
            seen.add(key)
            if values.nbytes > reading.left:
                reading.cut = True
                return False
            reading.charge(values.nbytes)
            texts = (_as_text(value) for value in values.to_pylist() if value)
            yield from _pieces(texts, reading.chunk_bytes)
    return True


def _pieces(texts: Iterable[str], size: int) -> Iterator[str]:
    """``texts``, each followed by a line break, in pieces of about ``size`` characters (a long
    value in several, as a plain file's text comes)."""
    parts: list[str] = []
    held = 0
    for text in texts:
        for start in range(0, len(text), size):
            parts.append(text[start : start + size])
            held += len(parts[-1])
            if held >= size:
                yield "".join(parts)
                parts, held = [], 0
        parts.append("\n")
        held += 1
    if parts:
        yield "".join(parts)


def _as_text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", errors="replace")


def _all(source: _Stream, reading: Reading) -> bytes:
    """The rest of ``source`` (already charged as it is read)."""
    return b"".join(iter(lambda: source.read(READ_BYTES), b""))


class _FileReader:
    """The file ``fd`` as a seekable stream whose every read is charged to ``reading``; a read
    past the limit is cut short (``reading.cut`` when bytes remained)."""

    def __init__(self, fd: int, reading: Reading) -> None:
        self.fd = fd
        self.reading = reading
        self.position = 0
        self.size = os.fstat(fd).st_size
        #: A single read longer than this returns nothing (a zip's oversized central directory).
        self.max_read: int | None = None
        #: Whether the content was taken for a container (a failure then falls back to bytes).
        self.containers = False

    def read(self, size: int = -1, /) -> bytes:
        if size is None or size < 0:
            size = max(self.size - self.position, READ_BYTES)
        if self.max_read is not None and size > self.max_read:
            self.reading.cut = True
            return b""
        allowed = min(size, self.reading.left)
        data = os.pread(self.fd, allowed, self.position) if allowed > 0 else b""
        self.position += len(data)
        self.reading.charge(len(data))
        if len(data) < size and len(data) == allowed and os.pread(self.fd, 1, self.position):
            self.reading.cut = True
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:
        """The descriptor is the caller's."""


class _Charged:
    """A decoder's output, charged as it is read and cut at the limit. Bounded only by a stream
    whose ``read(n)`` returns at most ``n`` bytes (zipfile's stored and deflated members)."""

    def __init__(self, stream: _Stream, reading: Reading) -> None:
        self.stream = stream
        self.reading = reading

    def read(self, size: int = -1, /) -> bytes:
        want = READ_BYTES if size is None or size < 0 else size
        allowed = min(want, self.reading.left)
        if allowed <= 0:
            if want > 0 and self.stream.read(1):
                self.reading.cut = True
            return b""
        data = self.stream.read(allowed)
        self.reading.charge(len(data))
        return data


class _Gunzipped:
    """The gzip members of ``source`` one after another, expanded within the limit."""

    def __init__(self, source: _Stream, reading: Reading) -> None:
        self.source = source
        self.reading = reading
        self.decoder = zlib.decompressobj(wbits=31)
        self.pending = b""
        self.done = False

    def read(self, size: int = -1, /) -> bytes:
        want = READ_BYTES if size is None or size < 0 else size
        while not self.done and want > 0:
            if self.decoder.eof:
                self.pending = self.decoder.unused_data + self.pending
                if not self.pending:
                    self.pending = self.source.read(READ_BYTES)
                if not self.pending.startswith(b"\x1f\x8b"):
                    self.done = True
                    break
                self.decoder = zlib.decompressobj(wbits=31)
            data = self.pending or self.source.read(READ_BYTES)
            if not data:
                self.done = True
                break
            allowed = min(want, self.reading.left)
            if allowed <= 0:
                self.reading.cut = True
                self.done = True
                break
            out = self.decoder.decompress(data, allowed)
            self.pending = self.decoder.unconsumed_tail
            self.reading.charge(len(out))
            if out:
                return out
        return b""


class _Slice:
    """``length`` bytes of ``seekable`` from ``start`` (a zip member's compressed bytes)."""

    def __init__(self, seekable: Any, start: int, length: int) -> None:
        self.seekable = seekable
        self.position = start
        self.left = length

    def read(self, size: int = -1, /) -> bytes:
        size = self.left if size is None or size < 0 else min(size, self.left)
        self.seekable.seek(self.position)
        data: bytes = self.seekable.read(size) if size > 0 else b""
        self.position += len(data)
        self.left -= len(data)
        return data


class _Expanded:
    """Compressed bytes expanded by a bz2 or lzma decompressor, charged, never more at once than
    asked or than the limit leaves (``decompress``'s ``max_length``, as :class:`_Gunzipped` bounds
    zlib's)."""

    def __init__(
        self, raw: _Stream, decoder: bz2.BZ2Decompressor | lzma.LZMADecompressor, reading: Reading
    ) -> None:
        self.raw = raw
        self.decoder = decoder
        self.reading = reading
        self.done = False

    def read(self, size: int = -1, /) -> bytes:
        want = READ_BYTES if size is None or size < 0 else size
        while want > 0 and not self.done and not self.decoder.eof:
            allowed = min(want, self.reading.left)
            if allowed <= 0:
                self.reading.cut = True
                self.done = True
                break
            data = self.raw.read(READ_BYTES) if self.decoder.needs_input else b""
            if self.decoder.needs_input and not data:
                self.done = True  # the member ends without its end mark: what it held was read
                break
            out = self.decoder.decompress(data, allowed)
            self.reading.charge(len(out))
            if out:
                return out
        return b""


class _Peeked:
    """``stream`` with its first bytes looked at before they are read."""

    def __init__(self, stream: _Stream) -> None:
        self.stream = stream
        self.buffer = b""

    def peek(self, size: int) -> bytes:
        while len(self.buffer) < size:
            data = self.stream.read(size - len(self.buffer))
            if not data:
                break
            self.buffer += data
        return self.buffer

    def read(self, size: int = -1, /) -> bytes:
        if self.buffer:
            data = self.buffer if size is None or size < 0 else self.buffer[:size]
            self.buffer = self.buffer[len(data) :]
            return data
        return self.stream.read(size)
