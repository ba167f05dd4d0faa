"""How much GPU memory a model's weights take once vLLM has loaded them."""

from __future__ import annotations

import math
import os
from pathlib import Path

from autorl.checkpoints.safetensors_header import read_header

#: Bytes of one parameter in each dtype vLLM is told to load (``ModelSettings.dtype``).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def parameter_count(model_dir: Path) -> int:
    """Parameters declared by the safetensors headers of ``model_dir`` (the data is not read)."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            header = read_header(fd, os.fstat(fd).st_size, path.name)
        finally:
            os.close(fd)
        total += sum(math.prod(tensor.shape) for tensor in header.tensors.values())
    return total


def weight_bytes(model_dir: Path, dtype: str) -> int:
    """The weights' size in ``dtype``, whatever dtype the files store."""
    return parameter_count(model_dir) * DTYPE_BYTES[dtype]
