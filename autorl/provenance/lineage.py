"""Which model a submission descends from: the base, or a registered public checkpoint.

A submission that is a public checkpoint of the base's family (an instruct or math model) with a
little training or noise of its own is nearer that checkpoint than the base: every tensor moved a
little from it, while it is as far from the base as the public checkpoint is. The distance of a
submission S to a reference R is the median over S's parameters of their tensor's
``‖S − R‖ / ‖R‖`` (Frobenius; a tensor R holds as zeros counts as 0 when S equals it, else 1): the
median over tensors, each weighing its size. So the tensors that hold most of the parameters decide
(a checkpoint whose large matrices are the public one's and whose norms and biases are the base's
is the public one's), while one tensor, however far it moved, shifts the median by no more than
its share of the parameters; one distance over all parameters together would be that tensor's.
A distance that is not a number (a NaN or infinite weight) is not compared: it is named in
``skipped``, never read as "not nearer". Computed once per evaluation from the snapshot, one tensor
at a time.

It catches a public model submitted whole or fine-tuned a little. It cannot catch a checkpoint that
is not registered, one distilled into fresh weights, one moved along a symmetry of its weights (its
MLP neurons or attention heads permuted, the same function: comparing sorted row norms instead
names an honest fine-tune as large as the public one's), or training long enough to move the
weights further from the public checkpoint than from the base.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autorl.untrusted_text import printable_within

if TYPE_CHECKING:
    from autorl.store.models import Submission

#: The label of the base model among the distances.
BASE = "base"


@dataclass(frozen=True)
class Lineage:
    """A submission's distances; ``nearest`` names the known checkpoint it is nearer than the base
    (None when the base is nearest or nothing else was comparable)."""

    nearest: str | None
    distances: dict[str, float]
    #: Known checkpoints not compared, and why (another architecture, unreadable, ...).
    skipped: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"nearest": self.nearest, "distances": self.distances, "skipped": self.skipped}

    @classmethod
    def from_json(cls, record: object) -> Lineage | None:
        if not isinstance(record, dict) or not isinstance(record.get("distances"), dict):
            return None
        nearest = record.get("nearest")
        return cls(
            nearest=nearest if isinstance(nearest, str) else None,
            distances={str(k): float(v) for k, v in record["distances"].items()},
            skipped={str(k): str(v) for k, v in (record.get("skipped") or {}).items()},
        )


def submission_lineage(submission: Submission) -> str | None:
    """The registered public checkpoint an agent's scored checkpoint is nearer than its base, as
    its evaluation recorded it."""
    found = Lineage.from_json((submission.details or {}).get("lineage"))
    return None if found is None else found.nearest


def experiment_lineage(rows: Sequence[Submission], final_of: int | None) -> str | None:
    """An experiment's ``lineage`` from its agent's submissions: the final's (the submission it
    evaluates), else the first that names one."""
    named = [(row.id, name) for row in rows if (name := submission_lineage(row)) is not None]
    chosen = [name for row_id, name in named if row_id == final_of]
    return chosen[0] if chosen else (named[0][1] if named else None)


def lineage(model_dir: Path, base_dir: Path, known: Sequence[tuple[str, Path]]) -> Lineage:
    """The distances of the checkpoint in ``model_dir`` to the base and to each ``(label, folder)``
    of ``known`` with the same tensors (names and shapes); the nearest known checkpoint when it is
    nearer than the base."""
    tensors = _tensor_files(model_dir)
    references: dict[str, dict[str, Path]] = {BASE: _tensor_files(base_dir)}
    skipped: dict[str, str] = {}
    for label, folder in known:
        try:
            files = _tensor_files(folder)
        except (OSError, ValueError) as exc:
            skipped[label] = f"unreadable: {exc}"
            continue
        if not _same_tensors(tensors, files):
            skipped[label] = "other tensors than the submission's (another architecture or size)"
            continue
        references[label] = files
    ratios: dict[str, list[tuple[float, int]]] = {label: [] for label in references}
    for name, own in _each_tensor(tensors):
        for label, files in references.items():
            if label in skipped:
                continue
            reference = _load(files, name) if name in files else None
            ratio = _relative_distance(own, reference)
            if not math.isfinite(ratio):
                skipped[label] = (
                    f"not compared: the distance of {printable_within(name, 200)} is not a number"
                )
                continue
            ratios[label].append((ratio, own.numel()))
    distances = {label: _weighted_median(values) for label, values in ratios.items() if label not in skipped}
    base = distances.get(BASE)
    others = [
        (value, label)
        for label, value in distances.items()
        if label != BASE and base is not None and value < base
    ]
    return Lineage(nearest=min(others)[1] if others else None, distances=distances, skipped=skipped)


def _weighted_median(values: Sequence[tuple[float, int]]) -> float:
    """The median of ``(value, weight)`` pairs, each value counted ``weight`` times (the mean of the
    two middle ones where they differ, as :func:`statistics.median`); inf for none."""
    ordered = sorted(values)
    total = sum(weight for _, weight in ordered)
    if total <= 0:
        return math.inf
    below = 0
    for at, (value, weight) in enumerate(ordered):
        below += weight
        if 2 * below > total:
            return value
        if 2 * below == total:
            return (value + ordered[at + 1][0]) / 2 if at + 1 < len(ordered) else value
    return ordered[-1][0]


def _tensor_files(folder: Path) -> dict[str, Path]:
    """Every tensor name of the safetensors files in ``folder`` → its file."""
    from safetensors import safe_open

    files: dict[str, Path] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                files[name] = path
    if not files:
        raise ValueError(f"no safetensors weights in {folder}")
    return files


def _same_tensors(own: dict[str, Path], other: dict[str, Path]) -> bool:
    if set(own) - set(other):
        return False
    return all(_shape(own, name) == _shape(other, name) for name in own)


def _shape(files: dict[str, Path], name: str) -> list[int]:
    from safetensors import safe_open

    with safe_open(str(files[name]), framework="pt") as handle:
        return list(handle.get_slice(name).get_shape())


def _each_tensor(files: dict[str, Path]) -> Iterator[tuple[str, Any]]:
    for name in sorted(files):
        yield name, _load(files, name)


def _load(files: dict[str, Path], name: str) -> Any:
    from safetensors import safe_open

    with safe_open(str(files[name]), framework="pt") as handle:
        return handle.get_tensor(name).float()


def _relative_distance(own: Any, reference: Any | None) -> float:
    if reference is None:
        return 1.0
    norm = float(reference.norm())
    gap = float((own - reference).norm())
    if not (math.isfinite(norm) and math.isfinite(gap)):
        return math.nan
    if norm == 0.0:
        return 0.0 if gap == 0.0 else 1.0
    return gap / norm
