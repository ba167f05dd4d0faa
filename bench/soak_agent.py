#!/usr/bin/env python3
"""The soak benchmark's agent: a new, distinct checkpoint every few seconds until the budget ends.

Each checkpoint is the base model with one weight nudged, so every submission is really evaluated
(identical weights would reuse an earlier score). It waits for each answer, then writes one line
per submission to ``output/soak_submissions.jsonl`` for ``bench/soak.py`` to check.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from safetensors.torch import load_file, save_file

from autorl.client import GradingClient

INTERVAL_S = float(os.environ.get("SOAK_INTERVAL_S", "3"))
#: Stop submitting this long before the deadline, so the last answer still arrives in the budget.
MARGIN_S = float(os.environ.get("SOAK_MARGIN_S", "20"))


def write_checkpoint(base: Path, target: Path, step: int) -> None:
    # File contents only: the base model's files are read-only, the copy must be writable.
    target.mkdir()
    for source in base.iterdir():
        if source.is_file():
            shutil.copyfile(source, target / source.name)
    weights = target / "model.safetensors"
    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1e-3 * step
    save_file(tensors, str(weights), metadata={"format": "pt"})


def main() -> None:
    base = Path(os.environ["MODEL_PATH"])
    output = Path(os.environ["OUTPUT_DIR"])
    log = output / "soak_submissions.jsonl"
    with GradingClient.from_env() as client:
        step = 0
        while (client.time().remaining_s or 0.0) > MARGIN_S:
            step += 1
            target = output / f"ckpt-{step}"
            write_checkpoint(base, target, step)
            started = time.monotonic()
            result = client.submit(f"output/ckpt-{step}")
            entry = {
                "step": step,
                "submission_id": result.submission_id,
                "status": result.status,
                "score": result.score,
                "seconds": round(time.monotonic() - started, 3),
            }
            with log.open("a") as handle:
                handle.write(json.dumps(entry) + "\n")
            shutil.rmtree(target)
            time.sleep(INTERVAL_S)


if __name__ == "__main__":
    main()
