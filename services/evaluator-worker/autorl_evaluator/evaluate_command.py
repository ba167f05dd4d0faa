"""`autorl evaluate MODEL -t TASK`: score one checkpoint, without an experiment, the way the worker
scores a submission.

MODEL (a folder, a hub id or ``builtin:NAME``, :mod:`autorl.models.sources`) is taken through the
grader's snapshot checks (:mod:`autorl.checkpoints.snapshot`): alone, as a base model is taken for its
baseline (safetensors weights only; its own tokenizer and chat template); with ``--base``, as a
submission to an experiment of that base model is (the same architecture; only its weights are
used, beside the base model's tokenizer, chat template and generation config). The snapshot is then
evaluated by the worker's own code (:func:`autorl_evaluator.jobs.evaluate_snapshot`): the split from
evaluator storage, the backend, the three protocols, the per-problem correctness and the evaluation
key. The config is the one a grader would record from the same ``AUTORL_EVAL_*`` settings, with
``--backend`` and ``--limit`` in place of ``AUTORL_EVAL_BACKEND`` and ``AUTORL_EVAL_LIMIT``.

Each result is kept in the platform's database (``$AUTORL_HOME/autorl.db`` unless
``AUTORL_DATABASE_URL`` names another) by the snapshot's fingerprint and the evaluation key
(:class:`autorl.store.EvaluationCache`): the same files under the same key are evaluated once, as a
base model's baseline is. Snapshots live in a temporary folder of evaluator storage, gone at exit.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field
from rich.console import Console
from rich.text import Text

from autorl.api.answers import Answer, Comparison, ProtocolScores
from autorl.checkpoints.snapshot import Snapshot, snapshot_base_model, snapshot_submission
from autorl.errors import (
    CheckpointError,
    ModelSourceError,
    ModelSourceUnreachableError,
    UnknownTaskError,
    UsageError,
)
from autorl.eval_config import EvalConfig
from autorl.layout import BUILTIN_PREFIX
from autorl.protocol.statistics import Evaluated, accuracy_interval, comparison_of
from autorl.store import Database, EvaluationCache, Split, caches, migrate
from autorl.tasks import Task, get_task
from autorl.tasks.base import Problem
from autorl.untrusted_text import printable
from autorl_evaluator.eval_device import check_device
from autorl_evaluator.settings import WorkerSettings

#: Printed on stderr before a result taken from the cache (the tests read it).
CACHED = "taken from the cache"


class EvaluationAnswer(Answer):
    """What ``autorl evaluate --json`` prints: one object (docs/EVALUATION.md, "Score one checkpoint")."""

    task: str
    model: str = Field(
        description="the model as named: a hub id or builtin:NAME, else its folder's absolute path"
    )
    split: str = Field(description="test or validation")
    n: int = Field(description="problems evaluated")
    score: float = Field(description="accuracy in percent under the headline protocol (opencompass)")
    interval: list[float] = Field(description="95 % Wilson interval of the score in percent, [low, high]")
    scores: ProtocolScores
    eval_key: str
    comparison: Comparison | None = Field(
        None, description="with --base: against the base model on the same problems (as the API's answers)"
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "evaluate",
        help="score one checkpoint on a task's test or validation split, as the evaluator scores one",
        description="Score one checkpoint with the evaluator's own checks, backend, scoring and evaluation "
        "key; results are cached by the checkpoint's files and the key. Generation settings come from "
        "AUTORL_EVAL_MAX_NEW_TOKENS, AUTORL_EVAL_BATCH_SIZE and AUTORL_EVAL_DEVICE as for a worker.",
    )
    parser.add_argument(
        "model", metavar="MODEL", help="a checkpoint folder, a hub id (org/name) or builtin:tiny-qwen2"
    )
    parser.add_argument(
        "-t", "--task", required=True, help="the task whose split is evaluated (arith, gsm8k)"
    )
    parser.add_argument(
        "--backend",
        choices=["hf", "opencompass"],
        default=None,
        help="evaluation backend (default: AUTORL_EVAL_BACKEND, else hf)",
    )
    parser.add_argument(
        "--split",
        choices=[Split.TEST.value, Split.VALIDATION.value],
        default=Split.TEST.value,
        help="the test split, or sealed mode's validation split carved from the train split (default: test)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="only the split's first N problems (default: AUTORL_EVAL_LIMIT, else all)",
    )
    parser.add_argument(
        "--base",
        metavar="MODEL",
        default=None,
        help="compare with this base model on the same problems (exact McNemar); MODEL is then checked and "
        "evaluated as a submission to an experiment of this base model",
    )
    parser.add_argument("--json", action="store_true", help="print only one JSON object")
    parser.set_defaults(func=run)


@dataclass(frozen=True)
class Request:
    """The checked command line."""

    task: Task
    split: Split
    backend: str | None
    limit: int | None
    model: str
    base: str | None


def checked(args: argparse.Namespace) -> Request:
    """The command line, or a UsageError naming the fix."""
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit must be a positive number of problems, such as 20, not {args.limit}")
    try:
        task = get_task(args.task)
    except UnknownTaskError as exc:
        raise UsageError(f"{exc}; pass one of them with -t") from None
    return Request(
        task=task,
        split=Split(args.split),
        backend=args.backend,
        limit=args.limit,
        model=args.model,
        base=args.base,
    )


def run(args: argparse.Namespace) -> int:
    request = checked(args)
    console = Console(stderr=True, highlight=False)
    settings = WorkerSettings()
    check_device(settings.eval_device)
    model_dir = _resolved(request.model, settings, console)
    base_dir = _resolved(request.base, settings, console) if request.base is not None else None
    db = Database(settings.database_url)
    try:
        migrate(db)
        with _snapshot_root(settings) as root:
            model, base = _snapshots(model_dir, base_dir, root, console)
            split = _split(request, settings, console)
            config = _config(request, settings)
            from autorl_evaluator.jobs import measured_config

            evaluated = measured_config(config, split, settings)
            result = _result(db, request.model, model, request, split, evaluated, settings, console)
            against = (
                _result(db, request.base, base, request, split, evaluated, settings, console)
                if request.base is not None and base is not None
                else None
            )
    finally:
        db.dispose()
    answer = _answer(request, model_dir, result, against)
    if args.json:
        print(json.dumps(answer.model_dump(mode="json", exclude_none=True)))
    else:
        print(_text(answer, request))
    return 0


def _resolved(source: str, settings: WorkerSettings, console: Console) -> Path:
    from autorl.models.sources import resolve_model

    try:
        return resolve_model(source, settings.models_dir)
    except ModelSourceUnreachableError:
        raise  # the hub, not the input: exit 1 with the fix
    except ModelSourceError as exc:
        raise UsageError(str(exc)) from None


@contextmanager
def _snapshot_root(settings: WorkerSettings) -> Iterator[Path]:
    """A folder of evaluator storage of this call's own for its snapshots, removed at the end."""
    settings.eval_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="evaluate-", dir=settings.eval_dir) as folder:
        yield Path(folder)


def _snapshots(
    model_dir: Path, base_dir: Path | None, root: Path, console: Console
) -> tuple[Snapshot, Snapshot | None]:
    """The model's snapshot (a submission to an experiment of ``base_dir`` when given, else its own
    base) and the base model's; a refused checkpoint is bad input."""
    _say(console, f"checking and copying {model_dir}")
    try:
        if base_dir is None:
            return snapshot_base_model(model_dir, root), None
        base = snapshot_base_model(base_dir, root)
        # The grader's rules for a submission: the folder is its own "output folder" here.
        folder = model_dir.parent
        return snapshot_submission(
            model_dir, workspace=folder, output_dir=folder, base_model_dir=base_dir, snapshot_root=root
        ), base
    except (CheckpointError, ModelSourceError) as exc:
        raise UsageError(str(exc)) from None


def _split(request: Request, settings: WorkerSettings, console: Console) -> list[Problem]:
    from autorl_evaluator.jobs import load_split

    _say(console, f"loading the {request.task.name} {request.split.value} split")
    split = load_split(request.task, request.split, settings)
    if not split:
        raise UsageError(
            f"task {request.task.name} has no {request.split.value} split (its train split is too small "
            "to carve one from); use --split test"
        )
    return split


def _config(request: Request, settings: WorkerSettings) -> EvalConfig:
    """What a grader records for an experiment of this task under these settings, with the
    command line's backend and limit."""
    overrides: dict[str, object] = {}
    if request.backend is not None:
        overrides["eval_backend"] = request.backend
    if request.limit is not None:
        overrides["eval_limit"] = request.limit
    return EvalConfig.record(
        request.task.name,
        settings.model_copy(update=overrides),
        split="validation" if request.split == Split.VALIDATION else None,
    )


def _result(
    db: Database,
    source: str,
    snapshot: Snapshot,
    request: Request,
    split: list[Problem],
    evaluated: EvalConfig,
    settings: WorkerSettings,
    console: Console,
) -> EvaluationCache:
    """The kept result of ``snapshot`` under ``evaluated``'s key, evaluated now if there is none."""
    from autorl_evaluator.jobs import evaluate_snapshot

    with db.session() as session:
        kept = caches.cached_evaluation(session, fingerprint=snapshot.fingerprint, eval_key=evaluated.key)
        if kept is not None:
            session.expunge(kept)
    if kept is not None:
        _say(
            console,
            f"{source}: {CACHED} (evaluated {kept.created_at:%Y-%m-%d %H:%M} UTC under evaluation key "
            f"{evaluated.key})",
        )
        return kept
    count = len(split) if evaluated.limit is None else min(evaluated.limit, len(split))
    started = time.monotonic()
    with _status(
        console, f"evaluating {source} on {count} {request.task.name} problems ({evaluated.backend})"
    ):
        scored = evaluate_snapshot(snapshot.path, request.task, split, evaluated, settings)
    seconds = time.monotonic() - started
    _say(console, f"{source}: evaluated {count} problems in {seconds:.1f} s")
    scores = scored.result.scores
    row = EvaluationCache(
        task=request.task.name,
        model=source,
        fingerprint=snapshot.fingerprint,
        eval_key=evaluated.key,
        eval_config=evaluated.stored(),
        score=scores[evaluated.protocol],
        score_opencompass=scores.get("opencompass"),
        score_flexible=scores.get("flexible"),
        score_strict=scores.get("strict"),
        n_samples=scored.result.n_samples,
        correctness=scored.correctness,
        problems_digest=scored.problems_digest,
        eval_seconds=seconds,
    )
    with db.session() as session:
        kept = caches.remember_evaluation(session, row)
        session.flush()
        session.expunge(kept)
    return kept


def _evaluated(row: EvaluationCache) -> Evaluated:
    return Evaluated(row.score, row.n_samples, row.correctness, row.problems_digest)


def _answer(
    request: Request, model_dir: Path, result: EvaluationCache, against: EvaluationCache | None
) -> EvaluationAnswer:
    comparison = None
    if against is not None:
        compared = comparison_of(_evaluated(result), _evaluated(against))
        assert compared is not None, "both were evaluated on the same problems"
        comparison = Comparison.of(compared)
    return EvaluationAnswer(
        task=request.task.name,
        model=shown_model(request.model, model_dir),
        split=request.split.value,
        n=result.n_samples,
        score=result.score,
        interval=list(accuracy_interval(result.correctness)),
        scores=ProtocolScores(
            opencompass=result.score_opencompass, flexible=result.score_flexible, strict=result.score_strict
        ),
        eval_key=result.eval_key,
        comparison=comparison,
    )


def shown_model(source: str, resolved: Path) -> str:
    """A hub id or builtin:NAME as named; a folder by its absolute path (the same from any folder)."""
    if source.startswith(BUILTIN_PREFIX) or not Path(source).expanduser().exists():
        return source
    return str(resolved)


def _text(answer: EvaluationAnswer, request: Request) -> str:
    low, high = answer.interval
    scores = answer.scores
    lines = [
        f"{printable(answer.model)} on {answer.task} ({answer.split} split, {answer.n} problems)",
        f"score {answer.score:.2f}  (95 % interval {low:.2f} to {high:.2f})",
        f"protocols: opencompass {_points(scores.opencompass)}  flexible {_points(scores.flexible)}  "
        f"strict {_points(scores.strict)}",
    ]
    if answer.comparison is not None:
        compared = answer.comparison
        gains, losses = compared.discordant
        verdict = "distinguishable" if compared.distinguishable else "not distinguishable from noise"
        base = printable(str(request.base))
        lines.append(
            f"against {base} on the same problems: {compared.difference:+.2f} points "
            f"(95 % interval {compared.interval[0]:+.2f} to {compared.interval[1]:+.2f}), exact McNemar "
            f"p = {compared.p_value:.4g}, {gains} gained and {losses} lost: {verdict}"
        )
    lines.append(f"evaluation key {answer.eval_key}")
    return "\n".join(lines)


def _points(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _shown(message: str) -> Text:
    """A progress line: ``message`` escaped (:func:`autorl.untrusted_text.printable`), as it names a
    folder read from disk (a resolved link can name anything) and a model as given."""
    return Text(f"autorl evaluate: {printable(message)}")


def _say(console: Console, message: str) -> None:
    console.print(_shown(message), soft_wrap=True)


@contextmanager
def _status(console: Console, message: str) -> Iterator[None]:
    """A spinner on a terminal; a line where stderr is not one."""
    if not console.is_terminal:
        _say(console, message)
        yield
        return
    with console.status(_shown(message)):
        yield
