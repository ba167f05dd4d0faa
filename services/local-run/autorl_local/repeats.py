"""``autorl run --repeat N``: N experiments one after another, with seeds 0..N-1.

Each repeat is an ordinary run (its own run id, workspace, results row and report) whose agent gets
``AUTORL_SEED``; the seed is recorded in the run's folder (:mod:`autorl.runs.seeds`). Ctrl-C stops
the repeat that runs (recorded as interrupted, as any run) and starts no other. At the end the runs
are named with the ``autorl results --compare`` command that shows their mean ± SEM.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from autorl.cli import EXIT_INTERRUPTED, UsageError, error_text
from autorl.errors import AutoRLError
from autorl.runs.repeats import RepeatGroup, group_runs
from autorl.runs.results import read_rows
from autorl.runs.seeds import RunSeed, read_run_seed
from autorl_agent_runner.workspace.layout import check_workspace_free
from autorl_local.experiment import EXIT_FAILED, LocalRunConfig, prepare_run
from autorl_local.settings import RunSettings


def repeat_workspaces(workspace: Path | None, repeats: int) -> list[Path | None]:
    """Each repeat's workspace: ``--workspace DIR`` itself for one run, ``DIR/seed-S`` for each seed
    of several; None (the default) puts each under its own run folder."""
    if workspace is None:
        return [None] * repeats
    if repeats == 1:
        return [workspace]
    return [workspace / f"seed-{seed}" for seed in range(repeats)]


def check_workspaces_free(workspaces: Sequence[Path | None]) -> None:
    """Refuse, before the first repeat starts, a repeat's workspace that is not new or empty."""
    for workspace in workspaces:
        if workspace is not None:
            try:
                check_workspace_free(workspace.expanduser().absolute(), run_id="")
            except AutoRLError as exc:
                raise UsageError(str(exc)) from exc


def run_repeats(configs: Sequence[LocalRunConfig], settings_factory: type[RunSettings] = RunSettings) -> int:
    """Run each config in turn; the exit code: 130 after Ctrl-C (the later repeats not run), else 1
    when a repeat failed, else 0."""
    console = Console(stderr=True, soft_wrap=True)
    run_ids: list[str] = []
    failed = False
    settings = settings_factory()
    for index, config in enumerate(configs):
        seed = config.seed
        heading = f"autorl run: repeat {seed.repeat}/{seed.repeats}, seed {seed.seed}"
        console.print(Text(heading, style="bold"))
        try:
            try:
                run = prepare_run(config, settings)
            except UsageError as exc:
                if not run_ids:
                    raise  # the first repeat: bad input, nothing started
                raise UsageError(
                    f"repeat {seed.repeat}/{seed.repeats} (seed {seed.seed}) cannot start: {exc}; "
                    f"repeats 1-{index} are recorded"
                ) from exc
            run_ids.append(run.run_id)
            code = run.execute()
        except KeyboardInterrupt:
            code = EXIT_INTERRUPTED
        if code == EXIT_INTERRUPTED:
            # Stopped while it prepared: this repeat did not start either.
            started = len(run_ids) > index
            _stopped(console, configs[index + 1 if started else index :], seed)
            _name_runs(console, settings, run_ids)
            return EXIT_INTERRUPTED
        failed = failed or code == EXIT_FAILED
    _name_runs(console, settings, run_ids)
    return EXIT_FAILED if failed else 0


def _stopped(console: Console, rest: Sequence[LocalRunConfig], at: RunSeed) -> None:
    left = ", ".join(str(config.seed.seed) for config in rest)
    skipped = f"; not run: seeds {left}" if left else ""
    where = f"repeat {at.repeat}/{at.repeats} (seed {at.seed})"
    console.print(Text(f"autorl run: stopped by Ctrl-C at {where}{skipped}"))


def _name_runs(console: Console, settings: RunSettings, run_ids: Sequence[str]) -> None:
    """The repeats' runs, their mean ± SEM, and the command that compares them."""
    if not run_ids:
        return
    try:
        rows = [row for row in read_rows(settings.home) if row.run_id in set(run_ids)]
    except AutoRLError as exc:
        print(f"autorl run: cannot read the results rows: {error_text(exc)}", file=sys.stderr)
        return
    seeds = {run_id: seed for run_id in run_ids if (seed := read_run_seed(settings.home, run_id)) is not None}
    for group in group_runs(rows, seeds, {}):
        console.print(Text(_group_line(group)))
    console.print(Text(f"compare them: autorl results --compare {' '.join(run_ids)}"))


def _group_line(group: RepeatGroup) -> str:
    def shown(value: float | None, *, signed: bool = False) -> str:
        return "-" if value is None else (f"{value:+.2f}" if signed else f"{value:.2f}")

    final, improvement = group.final_score, group.improvement
    return (
        f"repeats: {len(group.runs)} run(s), {final.n} with a final score: final score "
        f"{shown(final.mean)} ± {shown(final.sem)} (mean ± SEM), improvement "
        f"{shown(improvement.mean, signed=True)} ± {shown(improvement.sem)}"
    )
