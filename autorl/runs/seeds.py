"""A local run's seed: ``HOME/runs/<run id>/seed.json``, written by ``autorl run`` before anything
starts and read by ``autorl results --compare`` and ``autorl report``.

``autorl run --repeat N`` runs N experiments one after another with seeds 0..N-1; a run without
``--repeat`` has seed 0. The agent gets its seed as ``AUTORL_SEED``. The seed lives in the run's
folder, beside its logs and report, rather than in the store: it is a choice of ``autorl run`` on
this machine that the grader never uses, and results.csv's columns are a fixed contract.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autorl.layout import RUN_SEED_FILE, RUNS_DIR


@dataclass(frozen=True)
class RunSeed:
    """The seed of one run, and which of how many repeats it was (1-based; 1 of 1 without --repeat)."""

    seed: int
    repeat: int = 1
    repeats: int = 1

    def describe(self) -> str:
        """``seed 1 (repeat 2 of 5)``, or ``seed 0`` for a run without repeats."""
        repeat = f" (repeat {self.repeat} of {self.repeats})" if self.repeats > 1 else ""
        return f"seed {self.seed}{repeat}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def seed_path(home: Path, run_id: str) -> Path:
    return home.expanduser() / RUNS_DIR / run_id / RUN_SEED_FILE


def write_run_seed(run_dir: Path, seed: RunSeed) -> Path:
    """Write ``run_dir/seed.json`` whole (a reader never sees half a file)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / RUN_SEED_FILE
    partial = run_dir / f".{RUN_SEED_FILE}.tmp"
    partial.write_text(json.dumps(seed.to_json()) + "\n", encoding="utf-8")
    os.replace(partial, target)
    return target


def read_run_seed(home: Path, run_id: str) -> RunSeed | None:
    """The recorded seed of run ``run_id``; None for a run that recorded none (one made before
    seeds were recorded, or one of another home) or an unreadable file."""
    try:
        data = json.loads(seed_path(home, run_id).read_text(encoding="utf-8"))
        seed = RunSeed(int(data["seed"]), int(data.get("repeat", 1)), int(data.get("repeats", 1)))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return seed
