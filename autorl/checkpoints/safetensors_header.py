"""The safetensors header: what a weight file declares, read without reading the tensors.

A safetensors file is an 8-byte little-endian header length, a JSON header naming every tensor's
dtype, shape and byte range, then the tensor data. :func:`read_header` takes only the header
(bounded by :data:`MAX_HEADER_BYTES`) and checks that the byte ranges tile the data exactly and
that the file is exactly as long as the header says: nothing is hidden after the data, and an
8 GiB sparse file behind a small header is refused before a byte of it is read. The header is the
agent's JSON: every entry is checked for its type and range (a known dtype; sizes and offsets whole
numbers below 2**63, no JSON true among them; names of at most :data:`MAX_TENSOR_NAME_CHARS`
characters) before any arithmetic on it, and a refusal shows its names and values through
:mod:`autorl.checkpoints.agent_names`.

:func:`compare_to_base` holds a submission's tensors to the base model's. The dtype rule: a
tensor whose base dtype is a floating type of 16 or 32 bits (F16, BF16, F32) may be stored in
any of those three (agents train in one precision and save in another; the evaluator casts to
its own dtype on load); every other tensor keeps the base's dtype exactly.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from autorl.checkpoints.agent_names import quoted, quoted_names, shown_value
from autorl.errors import CheckpointError

#: Larger than any real model's header (Qwen2.5-72B's is about 100 KB), small enough to parse at once.
MAX_HEADER_BYTES = 16 * 1024 * 1024
LENGTH_PREFIX_BYTES = 8
#: Bytes per element of every dtype safetensors defines.
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
#: Every size and offset of a header is a whole number below this, as safetensors' reader (u64 sizes,
#: usize offsets) and any file can hold: checked before any arithmetic on them.
MAX_COUNT = 2**63
#: More sizes in one shape than any tensor of a model has.
MAX_DIMENSIONS = 32
#: A tensor name longer than this is no model's (Qwen2.5's longest is 47 characters).
MAX_TENSOR_NAME_CHARS = 1000
INTERCHANGEABLE_FLOATS = frozenset({"F16", "BF16", "F32"})
METADATA_KEY = "__metadata__"
_FIX = "save the model with model.save_pretrained(path), which writes safetensors"


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]


#: The metadata every canonical header carries: what transformers writes and checks on load.
CANONICAL_METADATA = {"format": "pt"}


@dataclass(frozen=True)
class Header:
    """One file's declared tensors and sizes."""

    raw: bytes  # the length prefix and the JSON header, exactly as read
    tensors: Mapping[str, Tensor]
    data_bytes: int
    #: Each tensor's byte range in the data, as declared.
    offsets: Mapping[str, tuple[int, int]]

    @property
    def file_bytes(self) -> int:
        return len(self.raw) + self.data_bytes

    def canonical(self) -> bytes:
        """The length prefix and header that describe the same tensors and their data, packed in
        the order the data lay (as it lies already in a file read whole), and nothing else: tensors
        in name order, only ``format: pt`` as metadata, spaces to an 8-byte boundary as safetensors
        pads. Two files with the same tensors and data have the same canonical header, whatever
        metadata, key order or spacing their own headers had."""
        packed: dict[str, tuple[int, int]] = {}
        at = 0
        for (start, end), name in sorted((offsets, name) for name, offsets in self.offsets.items()):
            packed[name] = (at, at + end - start)
            at += end - start
        entries: dict[str, object] = {METADATA_KEY: CANONICAL_METADATA}
        for name in sorted(self.tensors):
            tensor = self.tensors[name]
            entries[name] = {
                "dtype": tensor.dtype,
                "shape": list(tensor.shape),
                "data_offsets": list(packed[name]),
            }
        body = json.dumps(entries, separators=(",", ":")).encode("utf-8")
        body += b" " * (-len(body) % 8)
        return len(body).to_bytes(LENGTH_PREFIX_BYTES, "little") + body

    def without(self, names: AbstractSet[str]) -> Header:
        """The same file's header less the tensors ``names``: :meth:`ranges` then spans only the
        data of the others, and :meth:`canonical` describes them packed."""
        return Header(
            raw=self.raw,
            tensors={name: tensor for name, tensor in self.tensors.items() if name not in names},
            data_bytes=self.data_bytes,
            offsets={name: offsets for name, offsets in self.offsets.items() if name not in names},
        )

    def ranges(self) -> list[tuple[int, int]]:
        """The byte ranges of the data its tensors take, in order, adjacent ones joined: the whole
        data of a header read from a file, which its tensors tile."""
        joined: list[tuple[int, int]] = []
        for start, end in sorted(self.offsets.values()):
            if joined and joined[-1][1] == start:
                joined[-1] = (joined[-1][0], end)
            elif end > start:
                joined.append((start, end))
        return joined


def read_header(fd: int, file_bytes: int, shown: str, *, max_bytes: int = MAX_HEADER_BYTES) -> Header:
    """Read and check the header at the descriptor's current position (the file's start); a header
    longer than ``max_bytes`` is refused before it is read.

    The descriptor is left just past the header, so the caller can stream the data next.
    """
    prefix = _read_exact(fd, LENGTH_PREFIX_BYTES, shown)
    length = int.from_bytes(prefix, "little")
    if LENGTH_PREFIX_BYTES + length > file_bytes:
        raise CheckpointError(
            f"{shown} is not a safetensors file (its header length {length} is impossible for a file of "
            f"{file_bytes} bytes); {_FIX}"
        )
    if length > min(max_bytes, MAX_HEADER_BYTES):
        raise CheckpointError(
            f"{shown} has a safetensors header of {length} bytes, more than the "
            f"{min(max_bytes, MAX_HEADER_BYTES)} its base model's tensors need (metadata or padding "
            f"beside them is not accepted); {_FIX}"
        )
    body = _read_exact(fd, length, shown)
    try:
        parsed = json.loads(body.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{shown} has a safetensors header that is not JSON ({exc}); {_FIX}") from exc
    if not isinstance(parsed, dict):
        raise CheckpointError(f"{shown} has a safetensors header that is not a JSON object; {_FIX}")
    tensors, offsets, data_bytes = _tensors(parsed, shown)
    header = Header(raw=prefix + body, tensors=tensors, data_bytes=data_bytes, offsets=offsets)
    if header.file_bytes != file_bytes:
        raise CheckpointError(
            f"{shown} is {file_bytes} bytes but its header declares {header.file_bytes}; "
            f"the file is truncated or has data appended: {_FIX}"
        )
    return header


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    # Readers disagree on which of two equal keys wins; a header with one is refused outright.
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError("a name appears twice")
    return dict(pairs)


def no_constant(name: str) -> object:
    """``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (Python's reader alone takes them)."""
    raise ValueError(f"{name} is not a JSON value")


def _read_exact(fd: int, count: int, shown: str) -> bytes:
    chunks: list[bytes] = []
    remaining = count
    while remaining:
        chunk = os.read(fd, min(remaining, 1024 * 1024))
        if not chunk:
            raise CheckpointError(f"{shown} ends inside its safetensors header; {_FIX}")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _tensors(
    parsed: dict[str, object], shown: str
) -> tuple[dict[str, Tensor], dict[str, tuple[int, int]], int]:
    tensors: dict[str, Tensor] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, entry in parsed.items():
        if name == METADATA_KEY:
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise CheckpointError(f"{shown}: {METADATA_KEY} must map strings to strings; {_FIX}")
            continue
        check_name(name, shown)
        tensor, offsets = _entry(name, entry, shown)
        tensors[name] = tensor
        ranges.append((*offsets, name))
    if not tensors:
        raise CheckpointError(f"{shown} holds no tensor; {_FIX}")
    position = 0
    for begin, end, name in sorted(ranges):
        if begin != position:
            raise CheckpointError(
                f"{shown}: tensor {quoted(name)} starts at byte {begin}, expected {position} "
                f"(tensor data must be contiguous, without gaps or overlaps); {_FIX}"
            )
        position = end
    return tensors, {name: (begin, end) for begin, end, name in ranges}, position


def check_name(name: str, shown: str) -> None:
    """Refuse a tensor name longer than :data:`MAX_TENSOR_NAME_CHARS`."""
    if len(name) > MAX_TENSOR_NAME_CHARS:
        raise CheckpointError(
            f"{shown} names a tensor of {len(name)} characters ({quoted(name)}), more than the "
            f"{MAX_TENSOR_NAME_CHARS} any model's tensor names take; {_FIX}"
        )


def _entry(name: str, entry: object, shown: str) -> tuple[Tensor, tuple[int, int]]:
    """One tensor's entry, every field checked for its type and range before any arithmetic."""
    if not isinstance(entry, dict):
        raise CheckpointError(f"{shown}: tensor {quoted(name)} has no dtype/shape/data_offsets; {_FIX}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not (isinstance(dtype, str) and dtype in DTYPE_BYTES):
        raise CheckpointError(
            f"{shown}: tensor {quoted(name)} has an unknown dtype {shown_value(dtype)}; {_FIX}"
        )
    if not (
        isinstance(shape, list) and len(shape) <= MAX_DIMENSIONS and all(_is_count(size) for size in shape)
    ):
        raise CheckpointError(
            f"{shown}: tensor {quoted(name)} has an invalid shape {shown_value(shape)} (at most "
            f"{MAX_DIMENSIONS} sizes, each a whole number below 2**63); {_FIX}"
        )
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise CheckpointError(
            f"{shown}: tensor {quoted(name)} has invalid data_offsets {shown_value(offsets)} (two whole "
            f"numbers below 2**63); {_FIX}"
        )
    begin, end = offsets
    needed = math.prod(shape) * DTYPE_BYTES[dtype]
    if needed >= MAX_COUNT:
        raise CheckpointError(
            f"{shown}: tensor {quoted(name)} has a shape that needs 2**63 bytes or more; {_FIX}"
        )
    if end - begin != needed:
        raise CheckpointError(
            f"{shown}: tensor {quoted(name)} occupies {end - begin} bytes, not the {math.prod(shape)} × "
            f"{DTYPE_BYTES[dtype]} its shape and dtype need; {_FIX}"
        )
    return Tensor(dtype=dtype, shape=tuple(shape)), (begin, end)


def _is_count(value: object) -> bool:
    """A whole number in [0, 2**63), as safetensors' own reader takes one (a JSON true is no number)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT


_BASE_FIX = (
    "fine-tune the base model itself and save it with model.save_pretrained(path): the weights "
    "must have the base model's tensors, names and shapes"
)


def compare_names(names: set[str], base: set[str], shown: str) -> None:
    """Refuse unless ``names`` are exactly the base model's tensor names."""
    missing = sorted(base - names)
    extra = sorted(names - base)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} of the base model's tensors ({quoted_names(missing)})")
        if extra:
            parts.append(f"{len(extra)} tensors the base model does not have ({quoted_names(extra)})")
        raise CheckpointError(f"{shown}: the weights hold {' and '.join(parts)}; {_BASE_FIX}")


def compare_to_base(tensors: Mapping[str, Tensor], base: Mapping[str, Tensor], shown: str) -> None:
    """Refuse unless ``tensors`` names exactly the base's tensors, with the same shapes and dtypes
    allowed by the module's dtype rule. ``shown`` names the checkpoint in the message."""
    compare_names(set(tensors), set(base), shown)
    for name in sorted(base):
        got, want = tensors[name], base[name]
        if got.shape != want.shape:
            raise CheckpointError(
                f"{shown}: tensor {quoted(name)} has shape {list(got.shape)}, the base model's has "
                f"{list(want.shape)}; {_BASE_FIX}"
            )
        if got.dtype != want.dtype and not {got.dtype, want.dtype} <= INTERCHANGEABLE_FLOATS:
            raise CheckpointError(
                f"{shown}: tensor {quoted(name)} is {got.dtype}, the base model's is {want.dtype} "
                f"(floating tensors may be F16, BF16 or F32; others keep the base's dtype); {_BASE_FIX}"
            )
