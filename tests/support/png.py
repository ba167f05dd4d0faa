"""Find drawn markers in a PNG by their exact colour (antialiasing only changes their edges)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PIL import Image


@dataclass(frozen=True)
class Blob:
    x: float  # centroid, pixels from the left
    y: float  # centroid, pixels from the top
    pixels: int


def hex_rgb(color: str) -> tuple[int, int, int]:
    value = color.lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16)


def color_blobs(png: Path, color: str, *, min_pixels: int = 6) -> list[Blob]:
    """Connected regions of exactly ``color``, left to right."""
    image = Image.open(png).convert("RGB")
    width, height = image.size
    target = hex_rgb(color)
    data = image.load()
    assert data is not None
    todo = {(x, y) for y in range(height) for x in range(width) if data[x, y] == target}
    blobs = []
    while todo:
        stack = [todo.pop()]
        members = []
        while stack:
            x, y = stack.pop()
            members.append((x, y))
            for neighbour in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if neighbour in todo:
                    todo.remove(neighbour)
                    stack.append(neighbour)
        if len(members) >= min_pixels:
            blobs.append(
                Blob(
                    x=sum(p[0] for p in members) / len(members),
                    y=sum(p[1] for p in members) / len(members),
                    pixels=len(members),
                )
            )
    return sorted(blobs, key=lambda b: b.x)
