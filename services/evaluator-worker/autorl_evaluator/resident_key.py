"""The key of a resident model's state: what must be byte-identical for one evaluation to reuse a
model (or engine) an earlier evaluation left in memory.

Every resident kind keys on this one function: the warm ``hf`` child's resident model
(:mod:`autorl_evaluator.backends.hf.warm_models`) and the resident engine
(``backends/opencompass/engine_server.py``). A resident model holds more than its weights: what
was read from the files beside them when it was built (the generation config's eos ids, the
tokenizer, the chat template, the architecture) and the settings it was built with (device, dtype,
engine arguments). Two evaluations of the same experiment share every one of those files (the
snapshot keeps the base model's); two experiments' bases may differ in a single byte of one of
them, and then the second must not run with the first's. So the key covers every file of the
model folder except the weights and their shard index (how a checkpoint is sharded is the
submission's choice; the weights are swapped in for each evaluation), by name and content, and
the settings given. Folders are walked whole (``additional_chat_templates/`` and whatever a
later library reads from beside the weights), each file named by its path in the folder.

Standard library only: the resident engine's server runs in another Python (vLLM's environment)
and loads this file by its path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

#: How the weights' own files end: the weights and their shard index, swapped for each evaluation.
WEIGHT_FILE_SUFFIXES = (".safetensors", ".safetensors.index.json")


def resident_state_key(model_dir: Path, settings: Mapping[str, object]) -> str:
    """SHA-256 over ``settings`` (as canonical JSON) and every file of ``model_dir`` that is not a
    weight file (its name and bytes): equal for two evaluations exactly when one may run on the
    model the other left resident, once the weights are swapped."""
    digest = hashlib.sha256(b"resident-state-v1\0")
    digest.update(json.dumps(dict(settings), sort_keys=True, default=str).encode() + b"\0")
    for path in sorted(model_dir.rglob("*")):
        if path.is_file() and not path.name.endswith(WEIGHT_FILE_SUFFIXES):
            content = path.read_bytes()
            name = path.relative_to(model_dir).as_posix()
            digest.update(f"{name}\0{len(content)}\0".encode() + content)
    return digest.hexdigest()
