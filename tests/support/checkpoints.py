"""Hostile and well-formed checkpoints made from the tiny model, for the snapshot tests."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any


def read_safetensors(path: Path) -> tuple[dict[str, Any], bytes]:
    """The header (parsed) and the tensor data of a safetensors file."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def write_safetensors(path: Path, header: dict[str, Any], data: bytes) -> None:
    encoded = json.dumps(header).encode("utf-8")
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


def edit_json(path: Path, **changes: Any) -> None:
    """Set keys of a JSON object file."""
    content = json.loads(path.read_text())
    content.update(changes)
    path.write_text(json.dumps(content))


def split_into_shards(folder: Path, count: int | None = 2) -> list[str]:
    """Rewrite ``model.safetensors`` as ``count`` shards (None: one a tensor) and an index, as
    save_pretrained does for big models (or with a small ``max_shard_size``)."""
    header, data = read_safetensors(folder / "model.safetensors")
    metadata = header.pop("__metadata__", {})
    names = sorted(header)
    count = count or len(names)
    parts = [names[i * len(names) // count : (i + 1) * len(names) // count] for i in range(count)]
    shards = [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    weight_map: dict[str, str] = {}
    for shard, members in zip(shards, parts, strict=True):
        offset, chunks, part = 0, [], {"__metadata__": metadata}
        for name in members:
            begin, end = header[name]["data_offsets"]
            chunks.append(data[begin:end])
            part[name] = {**header[name], "data_offsets": [offset, offset + end - begin]}
            offset += end - begin
            weight_map[name] = shard
        write_safetensors(folder / shard, part, b"".join(chunks))
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": len(data)}, "weight_map": weight_map})
    )
    return shards
