"""Memory of the GPUs this process may use, read with `nvidia-smi` (the worker imports no torch)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuMemory:
    index: str
    free_bytes: int
    total_bytes: int


def visible_gpu_memory() -> list[GpuMemory]:
    """Each GPU ``CUDA_VISIBLE_DEVICES`` lets this process use (all without it); empty without NVIDIA
    GPUs or `nvidia-smi`."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none"):
        return []
    command = ["nvidia-smi", "--query-gpu=index,memory.free,memory.total", "--format=csv,noheader,nounits"]
    try:
        output = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    wanted = {v.strip() for v in visible.split(",")} if visible else None
    gpus = []
    for line in output.strip().splitlines():
        index, free, total = (field.strip() for field in line.split(","))
        if (wanted is None or index in wanted) and float(total) > 0:
            gpus.append(GpuMemory(index, int(float(free) * MIB), int(float(total) * MIB)))
    return gpus
