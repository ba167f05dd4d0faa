"""Where ``autorl results`` and ``autorl report`` read runs: the :class:`RunSource` protocol, this
home's runs (:class:`HomeRuns`: results.csv, the home's store and run folders; a grader's
experiments are in :mod:`autorl.runs.grader_runs`), and :func:`resolve_run_id`, which turns a run
id or a unique prefix of one into that run for both commands."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from autorl.errors import UsageError
from autorl.runs.results import ResultRow, read_rows, results_path
from autorl.runs.seeds import RunSeed, read_run_seed
from autorl.untrusted_text import printable

if TYPE_CHECKING:
    from autorl.settings import HomeSettings
    from autorl.store import Experiment

T = TypeVar("T")

#: How many of the runs an ambiguous prefix matches its refusal names; the rest are counted.
LISTED_MATCHES = 5


def listed(run_ids: Sequence[str]) -> str:
    """The first :data:`LISTED_MATCHES` of ``run_ids`` named, the rest counted ("and N more")."""
    named = ", ".join(run_ids[:LISTED_MATCHES])
    rest = len(run_ids) - LISTED_MATCHES
    return f"{named} and {rest} more" if rest > 0 else named


def resolve_run_id(given: str, run_ids: Sequence[str], where: str, listing: str) -> str:
    """The run ``given`` names among ``run_ids``: its whole id, else the one id it begins.
    Refused (UsageError, exit 2) when it names none (saying ``where`` they were looked for and
    the ``listing`` command that shows them) or several (naming them)."""
    if given in run_ids:
        return given
    hits = [run_id for run_id in run_ids if run_id.startswith(given)]
    if not hits:
        raise UsageError(f"no run {given!r} in {where}; list the runs with `{listing}`")
    if len(hits) > 1:
        raise UsageError(f"{given!r} matches {len(hits)} runs ({listed(hits)}); give more of the id")
    return hits[0]


@dataclass(frozen=True)
class RunKey:
    """A run's evaluation key and the recorded fields it hashes."""

    key: str
    config: dict[str, Any]


class RunSource(Protocol):
    """The runs one command reads, and what it shows beside their rows."""

    #: Where the rows are, as messages name it ("results.csv", "the grader at URL").
    where: str
    #: The command that lists them.
    listing: str

    def rows(self) -> list[ResultRow]:
        """Every finished run, oldest first."""
        ...

    def notes(self, run_ids: Sequence[str]) -> dict[str, str]:
        """How each run ended, in the words recorded when it finished (runs without one left out)."""
        ...

    def keys(self, run_ids: Sequence[str]) -> dict[str, RunKey]:
        """Each run's evaluation key (runs whose key is not known left out)."""
        ...

    def seeds(self, run_ids: Sequence[str]) -> dict[str, RunSeed]:
        """Each run's seed (runs that recorded none left out)."""
        ...

    def metrics(self, run_id: str) -> dict[str, Any]:
        """The run's report metrics (autorl.runs.reports); empty where there is no report."""
        ...


def no_store(database_url: str) -> bool:
    """Whether the store is a SQLite file that does not exist (a home where nothing ran yet): reading
    it would create an empty database and fail on its missing tables."""
    return (
        database_url.startswith("sqlite:///") and not Path(database_url.removeprefix("sqlite:///")).is_file()
    )


class HomeRuns:
    """The runs of this home: results.csv's rows, the notes and evaluation keys its store recorded,
    the seeds and reports in its run folders."""

    listing = "autorl results"

    def __init__(self, settings: HomeSettings) -> None:
        self.settings = settings
        self.home = settings.home
        self.where = str(results_path(settings.home))

    def rows(self) -> list[ResultRow]:
        """results.csv's rows; a run whose `autorl run` was killed wrote none: it is recorded
        first, as interrupted."""
        from autorl.runs.run_lock import recover_orphaned_runs

        for row in recover_orphaned_runs(self.home, self.settings.database_url):
            print(
                f"run {printable(row.run_id)} was killed before it finished; recorded as interrupted",
                file=sys.stderr,
            )
        return read_rows(self.home)

    def notes(self, run_ids: Sequence[str]) -> dict[str, str]:
        """How each run ended, in the words recorded when it finished: why it failed or stopped, and
        for a run that ended while its baseline waited, what for (its wait reason) and what to do."""
        notes = self._from_store(run_ids, lambda e: e.message)
        return {run_id: note for run_id, note in notes.items() if note}

    def keys(self, run_ids: Sequence[str]) -> dict[str, RunKey]:
        """The evaluation key of each run whose experiment this home's store holds."""
        return self._from_store(run_ids, lambda e: RunKey(e.eval_key, dict(e.eval_config)))

    def seeds(self, run_ids: Sequence[str]) -> dict[str, RunSeed]:
        return {run_id: seed for run_id in run_ids if (seed := read_run_seed(self.home, run_id)) is not None}

    def metrics(self, run_id: str) -> dict[str, Any]:
        """The report the run's folder holds (written at the end of the run or by `autorl report`)."""
        from autorl.runs.reports import METRICS_FILE, REPORTS_DIR

        path = self.home.expanduser() / "runs" / run_id / REPORTS_DIR / METRICS_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # no report (an older run): its row is shown without it
        return data if isinstance(data, dict) else {}

    def stored_run_ids(self) -> list[str]:
        """The run ids of this home's store, oldest first: what `autorl report` can report (a run
        in progress included)."""
        if no_store(self.settings.database_url):
            raise UsageError(
                f"no runs recorded yet in {self.home} (it has no database): start one with `autorl run`, "
                "list them with `autorl results`"
            )
        return list(self._from_store(None, lambda e: e.name))

    def _from_store(self, run_ids: Sequence[str] | None, read: Callable[[Experiment], T]) -> dict[str, T]:
        """``read`` of each run (of every one, for None) whose experiment the store holds, oldest first."""
        from sqlalchemy import select

        from autorl.errors import ServiceUnavailableError
        from autorl.store import Database, Experiment

        if no_store(self.settings.database_url):
            return {}  # no store in this home (nothing created one to read)
        query = select(Experiment).order_by(Experiment.id)
        if run_ids is not None:
            query = query.where(Experiment.name.in_(list(run_ids)))
        db = Database(self.settings.database_url)
        try:
            with db.session() as session:
                return {e.name: read(e) for e in session.scalars(query)}
        except ServiceUnavailableError as exc:
            if "no such table" in str(exc):
                return {}  # a store no service has set up yet (an empty file): nothing recorded
            raise  # a store that cannot be read (a damaged file, an unreachable server) says why
        finally:
            db.dispose()
