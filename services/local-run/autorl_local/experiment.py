"""One experiment on this machine, start to finish (``autorl run``).

    validate input ─► prepare model + data (cached) ─► workspace ─► grader + workers
      ─► register ─► baseline (cached) ─► start budget ─► agent ─► wait for evaluations
      ─► (sealed: the one final evaluation on test) ─► finish ─► results row ─► summary

Bad input is refused before anything starts. From the moment services start, every exit path
(a failure, Ctrl-C) stops them again and records the run.
"""

from __future__ import annotations

import math
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from autorl.api.admin_client import AdminClient
from autorl.api.answers import ExperimentAnswer, RegisteredAnswer
from autorl.api.request_bodies import RegisterExperiment
from autorl.cli import EXIT_INTERRUPTED, UsageError, error_text
from autorl.client import GradingClient
from autorl.errors import AutoRLError, ModelSourceError
from autorl.layout import AGENT_LOG_FILE, SCORES_FILE, runner_log_subpath
from autorl.models.sources import model_dir_name, reference_model_subpath, resolve_model
from autorl.protocol.feedback import Feedback
from autorl.provenance.unverified import TEST_UNVERIFIED, TWIN_UNVERIFIED, note, with_notes
from autorl.runs.grader_runs import answered_columns
from autorl.runs.reports import final_lines, report_after_run, uncertainty_lines
from autorl.runs.results import ResultRow, RunStatus, append_row, new_run_id, results_path, utc_timestamp
from autorl.runs.run_lock import RunInfo, RunLock, recover_orphaned_runs
from autorl.runs.seeds import RunSeed, write_run_seed
from autorl.tasks import Task, get_task
from autorl.tasks.base import write_agent_train
from autorl.untrusted_text import printable, rich_text
from autorl.wait_reasons import Reason
from autorl_agent_runner.agent_command import AgentCommand
from autorl_agent_runner.launch import AgentLaunch, launch_agent, links_base_model, resolve_launch_agent
from autorl_agent_runner.runner import AgentOutcome, AgentRunner
from autorl_agent_runner.sandbox.egress import Network
from autorl_agent_runner.sandbox.plan import SandboxMode
from autorl_agent_runner.workspace.layout import Workspace, check_workspace_free, create_workspace
from autorl_local.agent_files import agent_roots
from autorl_local.final_evaluation import evaluate_final
from autorl_local.progress import Progress, fmt_duration, fmt_score, load_note
from autorl_local.services import ManagedProcess, autorl_command, port_in_use, wait_until_ready
from autorl_local.settings import RunSettings

#: With GPUs shared between agent and evaluator, the evaluator's share: half of each GPU's memory.
SHARED_GPU_MIN_FREE_FRACTION = 0.5

EXIT_FAILED = 1
POLL_S = 2.0


@dataclass(frozen=True)
class LocalRunConfig:
    agent: str
    task: str
    model: str
    timeout_s: float
    port: int = 8000
    workspace: Path | None = None
    env: list[str] = field(default_factory=list)
    backend: str = "hf"
    agent_gpus: str | None = None
    eval_gpus: str | None = None
    workers: int = 1
    finish_wait_s: float = 600.0
    grace_period_s: float = 30.0
    sandbox: str = "auto"
    #: Internet access for the agent (an outside LLM API) through a user-mode network stack.
    egress: bool = False
    #: Non-public destinations the operator lets the agent reach (``--egress-allow``).
    egress_allow: tuple[Network, ...] = ()
    driver_model: str | None = None
    max_submissions: int | None = None
    #: test or sealed (docs/PROTOCOL.md).
    feedback: Feedback = Feedback.TEST
    #: Public checkpoints a submission's lineage is traced to (``--known-checkpoint``).
    known_checkpoints: tuple[str, ...] = ()
    #: The agent's AUTORL_SEED, and which of how many repeats this run is (``--repeat``).
    seed: RunSeed = field(default_factory=lambda: RunSeed(0))


class RunFailedError(AutoRLError):
    """The run cannot go on (a failed baseline, a dead grader)."""


def baseline_not_scored(view: ExperimentAnswer, logs: Path) -> str:
    """Why a run cannot go on without its baseline: what it still waits for when the wait ended
    (its wait reason and what to do), else how its evaluation failed."""
    waited = view.waiting
    why = f"{waited.reason}: {waited.message}" if waited is not None else view.baseline_error
    return f"the baseline evaluation {view.baseline_status}: {why or 'no score'}; see {logs}"


def run_experiment(config: LocalRunConfig, settings: RunSettings) -> int:
    """Run the experiment; return the process exit code (0, 1 failed, 130 interrupted)."""
    return prepare_run(config, settings).execute()


def prepare_run(config: LocalRunConfig, settings: RunSettings) -> LocalRun:
    """Check the input (UsageError: bad input, nothing started), prepare the model and the train
    split, and return the run, ready to :meth:`LocalRun.execute`."""
    started = time.time()
    try:
        task = get_task(config.task)
        sandbox = SandboxMode(config.sandbox)
        resolved = resolve_launch_agent(config.agent, config.env, os.environ, sandbox, settings)
    except (AutoRLError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    if port_in_use(config.port):
        raise UsageError(
            f"port {config.port} on 127.0.0.1 is already in use; pass --port with a free port "
            "or stop what listens there"
        )
    for row in recover_orphaned_runs(settings.home, settings.database_url):
        killed = printable(row.run_id)  # read from the run's lock file
        print(f"autorl run: run {killed} was killed earlier; recorded it as interrupted", file=sys.stderr)
    run_id = new_run_id(task.name)
    run_dir = settings.home / "runs" / run_id
    workspace_root = (config.workspace or run_dir / "workspace").expanduser().absolute()
    try:
        check_workspace_free(workspace_root, run_id)
    except AutoRLError as exc:
        raise UsageError(str(exc)) from exc
    # Preparing is part of validating: an unknown model source is bad input, refused before
    # anything starts. Both are cached, so a second run with the same inputs skips this.
    console = Console(stderr=True)
    with console.status(rich_text(f"preparing model {config.model} and the {task.name} train split")):
        try:
            base_dir = resolve_model(config.model, settings.models_dir)
            known = tuple(
                str(resolve_model(source, settings.models_dir)) for source in config.known_checkpoints
            )
        except ModelSourceError as exc:
            raise UsageError(str(exc)) from exc
        data_file = task.download_train_data(
            settings.data_dir / task.name, source_dir=settings.data_source_dir
        )
        if config.feedback == Feedback.SEALED:
            # The agent's train data without the validation split its submissions are scored on.
            data_file = write_agent_train(data_file, settings.data_dir / Feedback.SEALED / task.name)
    prepared = Prepared(
        base_dir=base_dir, train_data_dir=data_file.parent, started=started, known_checkpoints=known
    )
    return LocalRun(
        RunPlan(
            config=config,
            settings=settings,
            task=task,
            agent=resolved.agent,
            passed_env=resolved.passed_env,
            sandbox=sandbox,
            run_id=run_id,
            run_dir=run_dir,
            workspace_root=workspace_root,
            prepared=prepared,
        )
    )


@dataclass(frozen=True)
class Prepared:
    base_dir: Path
    train_data_dir: Path
    #: When `autorl run` began: a run's duration includes preparing the model and data.
    started: float
    #: ``--known-checkpoint`` folders, resolved.
    known_checkpoints: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunPlan:
    """Everything a checked, prepared run is made of (:func:`prepare_run` builds it)."""

    config: LocalRunConfig
    settings: RunSettings
    task: Task
    agent: AgentCommand
    #: The variables passed to the agent (``--env``), resolved against this process's environment.
    passed_env: dict[str, str]
    sandbox: SandboxMode
    run_id: str
    run_dir: Path
    workspace_root: Path
    prepared: Prepared


class LocalRun:
    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        config, run_id, task, agent = plan.config, plan.run_id, plan.task, plan.agent
        self.config = config
        self.settings = plan.settings
        self.task = task
        self.agent = agent
        self.passed_env = plan.passed_env
        self.sandbox = plan.sandbox
        self.run_id = run_id
        self.run_dir = plan.run_dir
        self.workspace_root = plan.workspace_root
        self.prepared = plan.prepared
        workspace_root, prepared, run_dir = plan.workspace_root, plan.prepared, plan.run_dir
        self.admin_token = secrets.token_urlsafe(32)
        self.url = f"http://127.0.0.1:{config.port}"
        self.services: list[ManagedProcess] = []
        self.admin = AdminClient(self.url, self.admin_token)
        repeat = config.seed
        of_repeats = f"repeat {repeat.repeat}/{repeat.repeats}, " if repeat.repeats > 1 else ""
        self.progress = Progress(
            f"autorl run {run_id}: {of_repeats}seed {repeat.seed}, task={task.name} model={config.model} "
            f"agent={agent.name} timeout={config.timeout_s:g}s"
        )
        self.registered = False
        self.last_view: ExperimentAnswer | None = None
        #: What the checks after the agent could not verify (autorl.provenance.unverified).
        self.unverified: list[str] = []
        self.lock = RunLock(
            run_dir,
            RunInfo(
                run_id=run_id,
                task=task.name,
                agent=agent.name,
                driver_model=config.driver_model,
                base_model=config.model,
                workspace=str(workspace_root),
                started=prepared.started,
                feedback=config.feedback.value,
            ),
        )
        self._stop_polling = threading.Event()

    # --- the whole run ----------------------------------------------------------------------

    def execute(self) -> int:
        status: RunStatus = "failed"
        message: str | None = None
        timed_out = False
        exit_code = EXIT_FAILED
        # Held until the row is written: if this process is killed, the next `autorl run` or
        # `autorl results` finds the lock unheld and records the run as interrupted.
        self.lock.acquire()
        try:
            write_run_seed(self.run_dir, self.config.seed)
            with self.progress:
                status, message, timed_out = self._lifecycle()
            exit_code = 0
        except KeyboardInterrupt:
            status, message, exit_code = "interrupted", "stopped by Ctrl-C", EXIT_INTERRUPTED
            self.progress.note("interrupted: stopping everything this run started")
        except AutoRLError as exc:
            status, message = "failed", str(exc)
            print(f"autorl run: error: {error_text(exc)}", file=sys.stderr)
        finally:
            # A second Ctrl-C must not leave services running or the run unrecorded.
            with _ignore_sigint():
                self._finalize(status, message, timed_out)
                row = self._record(status, self.prepared.started)
                self.lock.release()
                report = report_after_run(self.settings, self.run_id) if self.registered else None
        self._print_summary(row, message, report.metrics if report is not None else {})
        return exit_code

    def _lifecycle(self) -> tuple[RunStatus, str | None, bool]:
        """Returns the run's status, a note, and whether the agent was ended at its deadline."""
        config, task, prepared = self.config, self.task, self.prepared
        workspace = create_workspace(
            self.workspace_root,
            run_id=self.run_id,
            task_name=task.name,
            description=task.description(),
            base_model_dir=prepared.base_dir,
            base_model_name=model_dir_name(config.model),
            reference_model_subpath=reference_model_subpath(config.model),
            train_data_dir=prepared.train_data_dir,
            timeout_s=config.timeout_s,
            max_submissions=config.max_submissions,
            link_model=links_base_model(self.sandbox),
            feedback=config.feedback,
        )
        self.progress.phase(
            "starting services", f"grader on {self.url}, {config.workers} evaluator worker(s)"
        )
        self._start_services()
        registered = self.admin.register(
            RegisterExperiment(
                name=self.run_id,
                task=task.name,
                model=config.model,
                timeout_s=math.ceil(config.timeout_s),
                workspace=str(workspace.root),
                base_model_dir=str(prepared.base_dir),
                output_dir=str(workspace.output),
                agent=self.agent.name,
                driver_model=config.driver_model,
                max_submissions=config.max_submissions,
                feedback=config.feedback,
                known_checkpoints=list(prepared.known_checkpoints),
            )
        )
        self.registered = True
        evaluating = f"evaluating {config.model} with the {config.backend} backend"
        self.progress.phase("baseline", evaluating)
        shown: list[str] = []

        def show_wait(view: ExperimentAnswer) -> None:
            """Say why the baseline waits (no evaluator yet, its queue position), once per reason."""
            waiting = view.waiting
            reason = waiting.reason if waiting is not None else Reason.EVALUATING_BASELINE.value
            if shown[-1:] != [reason]:
                shown.append(reason)
                detail = f"{reason}: {waiting.message}" if waiting is not None else f"{reason}: {evaluating}"
                self.progress.phase("baseline", printable(detail))

        view = self.admin.wait_for_baseline(
            self.run_id, max_wait_s=float(self.settings.eval_timeout_s), poll_s=1.0, on_wait=show_wait
        )
        if view.baseline_status != "scored":
            raise RunFailedError(baseline_not_scored(view, self.run_dir / "logs"))
        if config.feedback == Feedback.SEALED:
            # Submissions are scored and compared on validation; the test baseline is the final's.
            self.progress.set_baseline(view.validation_baseline_score)
            self.progress.note(
                f"baseline score {fmt_score(view.baseline_score)} on test, "
                f"{fmt_score(view.validation_baseline_score)} on validation"
            )
        else:
            self.progress.set_baseline(view.baseline_score)
            self.progress.note(f"baseline score {fmt_score(view.baseline_score)}")
        with GradingClient(registered.grading_server_url) as client:
            runner, outcome = self._run_agent(workspace, registered, client)
            self._read_agent_files(workspace)
            self.progress.phase("finishing", "waiting for evaluations in flight")
            self._wait_in_flight()
            if config.feedback == Feedback.SEALED:
                self._final_evaluation()
            self._score_twins()
            # The mirrors' last refresh: with the scores of evaluations that ended after the agent.
            runner.refresh_mirrors()
        if outcome.exit_code not in (0, None) and not outcome.timed_out:
            note = f"the agent exited with code {outcome.exit_code}; see {workspace.agent_log}"
            return "failed", note, False
        return "completed", None, outcome.timed_out

    def _run_agent(
        self, workspace: Workspace, registered: RegisteredAnswer, client: GradingClient
    ) -> tuple[AgentRunner, AgentOutcome]:
        config = self.config
        launch = AgentLaunch(
            agent=self.agent,
            task=self.task.name,
            base_model=config.model,
            sandbox=self.sandbox,
            passed_env=self.passed_env,
            platform_env={} if config.agent_gpus is None else {"CUDA_VISIBLE_DEVICES": config.agent_gpus},
            egress=config.egress,
            egress_allow=config.egress_allow,
            grace_period_s=config.grace_period_s,
            runner_log=self.settings.home / runner_log_subpath(self.run_id),
            seed=config.seed.seed,
        )
        self.progress.phase("agent", f"{self.agent.name} in {workspace.root}")
        loaded = load_note()
        if loaded is not None:
            self.progress.note(loaded)
        started = self.admin.start(self.run_id)
        self.progress.set_deadline(started.end_time)
        poller = threading.Thread(target=self._poll, name="autorl-progress", daemon=True)
        poller.start()
        try:
            runner = launch_agent(
                launch,
                workspace,
                grading_server_url=registered.grading_server_url,
                token=registered.token,
                client=client,
                settings=self.settings,
            )
            outcome = runner.run()
        finally:
            self._stop_polling.set()
            poller.join(timeout=5)
            self.progress.set_deadline(None)
        if outcome.timed_out:
            killed = " (SIGKILL after the grace period)" if outcome.killed else ""
            self.progress.note(f"agent reached its deadline and was stopped{killed}")
        else:
            self.progress.note(f"agent exited with code {outcome.exit_code}")
        loaded = load_note()
        if loaded is not None:
            self.progress.note(loaded)
        return runner, outcome

    def _score_twins(self) -> None:
        """The final and the base model on the twin split, once (autorl_local.twin_evaluation)."""
        from autorl.provenance.final_twin import FinalChanged, NoTwinScore
        from autorl_evaluator.settings import WorkerSettings
        from autorl_local.twin_evaluation import score_twins

        self.progress.phase("finishing", "scoring the final and the base model on the twin split")
        # The local workers' settings: this run's home, store and backend over the environment's.
        own: dict[str, Any] = {
            "home": self.settings.home,
            "database_url": self.settings.database_url,
            "eval_backend": self.config.backend,
        }
        settings = WorkerSettings(**own)
        try:
            found = score_twins(self.run_id, settings)
        except FinalChanged as exc:
            self.progress.note(f"twin split: not scored ({exc})")
            self.unverified.append(note(TWIN_UNVERIFIED, str(exc)))
            return
        except NoTwinScore as exc:
            self.progress.note(f"twin split: not scored ({exc})")
            return
        except (AutoRLError, OSError, ValueError) as exc:  # the platform's: the run's scores stand
            self.progress.note(f"twin split: could not be scored ({exc})")
            self.unverified.append(note(TWIN_UNVERIFIED, f"it could not be scored ({exc})"))
            return
        self.last_view = self.admin.record_provenance(
            self.run_id, twin_score=found.score, twin_p_value=found.p_value
        )
        self.progress.note(
            f"twin split: the final scores {found.score:.2f} on the twins of {found.twins} of its "
            f"{found.problems} test problems (gap against the base model's: p={found.p_value:.3g})"
        )

    def _read_agent_files(self, workspace: Workspace) -> None:
        """Once the agent has ended (it cannot react): its files read for the test questions."""
        from autorl_evaluator.provenance import read_agent_files

        self.progress.phase("finishing", "reading the agent's files for test questions")
        settings = self.settings
        platform = [
            settings.home,
            settings.cache_dir,
            settings.eval_dir,
            *filter(None, [settings.data_source_dir]),
        ]
        area, program = agent_roots(
            workspace.root,
            self.agent.folder,
            self.agent.script,
            [path.resolve() for path in platform],
        )
        try:
            read = read_agent_files(
                self.task,
                self.settings,
                run_id=self.run_id,
                roots=area.roots,
                leave_out=area.leave_out,
                sealed=self.config.feedback == Feedback.SEALED,
                program=program,
            )
        except (AutoRLError, OSError, ValueError) as exc:  # the platform's: the run's scores stand
            self.progress.note(f"could not read the agent's files for test questions: {exc}")
            self.unverified.append(note(TEST_UNVERIFIED, f"the read failed ({exc})"))
            return
        if read.counts["test"] is not None:
            self.last_view = self.admin.record_provenance(self.run_id, test_overlap=read.counts["test"])
        if read.unverified:
            self.unverified.append(note(TEST_UNVERIFIED, f"{read.unverified} (see {read.record})"))
            self.progress.note(f"the agent's files were not all read: {read.unverified}; see {read.record}")
        found = {split: count for split, count in read.counts.items() if count}
        if found:
            listed = ", ".join(f"{count} {split}" for split, count in found.items())
            self.progress.note(
                f"the agent's files hold {listed} problem(s); files and counts in {read.record}"
            )

    # --- services ---------------------------------------------------------------------------

    def _service_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "AUTORL_LOCAL_MODE": "1",
                "AUTORL_HOME": str(self.settings.home),
                "AUTORL_DATABASE_URL": self.settings.database_url,
                "AUTORL_ADMIN_TOKEN": self.admin_token,
                "AUTORL_EVAL_BACKEND": self.config.backend,
                "AUTORL_PUBLIC_URL": self.url,
            }
        )
        return env

    def _start_services(self) -> None:
        logs = self.run_dir / "logs"
        env = self._service_env()
        grader = ManagedProcess(
            "grader",
            autorl_command("grader", "--host", "127.0.0.1", "--port", str(self.config.port)),
            env,
            logs / "grader.log",
        )
        self.services.append(grader)
        grader.start()
        wait_until_ready(grader, self.admin.ready)
        worker_env = dict(env)
        if self.config.eval_gpus is not None:
            worker_env["CUDA_VISIBLE_DEVICES"] = self.config.eval_gpus
        elif self.config.agent_gpus is None:
            # Agent and evaluator share every GPU: an evaluation waits until enough of each GPU's
            # memory is free rather than crash the agent's training (or itself) out of memory.
            worker_env.setdefault("AUTORL_EVAL_GPU_MIN_FREE_FRACTION", str(SHARED_GPU_MIN_FREE_FRACTION))
        for index in range(self.config.workers):
            worker = ManagedProcess(
                f"worker-{index}", autorl_command("worker"), worker_env, logs / f"worker-{index}.log"
            )
            self.services.append(worker)
            worker.start()

    def _check_services(self) -> None:
        for service in self.services:
            if not service.running():
                raise RunFailedError(
                    f"{service.name} exited with code {service.exit_code()}; its log "
                    f"({service.log_path}) ends with:\n{service.log_tail()}"
                )

    def _stop_services(self) -> None:
        # Workers first, so that none is left claiming work from a grader that is gone.
        for service in reversed(self.services):
            service.stop()
        self.admin.close()

    def _poll(self) -> None:
        while not self._stop_polling.wait(POLL_S):
            self._refresh_view()
            self.progress.tick()

    def _refresh_view(self) -> None:
        try:
            view = self.admin.experiment(self.run_id)
            submissions = self.admin.submissions(self.run_id)
        except AutoRLError:
            return
        self.last_view = view
        self.progress.update(view, submissions)

    def _wait_in_flight(self) -> None:
        deadline = time.monotonic() + self.config.finish_wait_s
        while True:
            self._check_services()
            self._refresh_view()
            in_flight = 0 if self.last_view is None else self.last_view.in_flight
            if in_flight == 0:
                return
            if time.monotonic() >= deadline:
                self.progress.note(
                    f"{in_flight} evaluation(s) still running after {self.config.finish_wait_s:g} s; "
                    "finishing without them (raise --finish-wait to wait longer)"
                )
                return
            self.progress.phase("finishing", f"{in_flight} evaluation(s) in flight")
            time.sleep(POLL_S)

    def _final_evaluation(self) -> None:
        """Sealed: the one evaluation on the test split, after the agent has ended (its answer is
        the platform's, never the agent's); made again after a failure of the platform's, each attempt
        with its own --finish-wait."""

        def wait() -> ExperimentAnswer | None:
            self._wait_in_flight()
            return self.last_view

        evaluate_final(
            self.admin,
            self.run_id,
            wait=wait,
            phase=lambda detail: self.progress.phase("final", detail),
            note=self.progress.note,
        )

    # --- the end ----------------------------------------------------------------------------

    def _finalize(self, status: RunStatus, message: str | None, timed_out: bool) -> None:
        """Finish first: the grader cancels what was not evaluated, in the same transaction, and
        answers with the experiment as finished. Those numbers cannot change any more, so the
        results row written from them equals the database."""
        if self.registered:
            db_status = "timed_out" if status == "completed" and timed_out else status
            try:
                # Bounded, its notes kept: an agent's strings never make it too large to be recorded.
                noted = with_notes(message, self.unverified)
                self.last_view = self.admin.finish(self.run_id, db_status, noted)
            except AutoRLError as exc:
                print(
                    f"autorl run: could not record the end in the grader: {error_text(exc)}", file=sys.stderr
                )
        self._stop_services()

    def _record(self, status: RunStatus, started: float) -> ResultRow:
        # Every number of the row is on the test split: a sealed run's best there is its final.
        row = ResultRow(
            run_id=self.run_id,
            timestamp=utc_timestamp(),
            task=self.task.name,
            agent=self.agent.name,
            driver_model=self.config.driver_model,
            base_model=self.config.model,
            duration_s=round(time.time() - started, 1),
            workspace=str(self.workspace_root),
            **answered_columns(self.last_view, self.config.feedback, status),
        )
        append_row(row, self.settings.home)
        return row

    def _print_summary(self, row: ResultRow, message: str | None, metrics: dict[str, Any]) -> None:
        console = Console()
        improvement = "-" if row.improvement is None else f"{row.improvement:+.2f}"
        console.print(
            Text.assemble(
                "\n", (f"Run {row.run_id}", "bold"), f" {row.status} in {fmt_duration(row.duration_s)}"
            )
        )
        warning = nothing_scored_warning(self.last_view, row.status, Path(row.workspace))
        if warning is not None:
            console.print(Text(f"  warning      {printable(warning)}", style="bold yellow"))
        # Text throughout, never markup: the note can quote the agent's strings and a service's log.
        lines = [
            *([f"note         {error_text(message)}"] if message else []),
            f"seed         {self.config.seed.describe().removeprefix('seed ')}",
            f"baseline     {fmt_score(row.baseline)}",
            f"best score   {fmt_score(row.best_score)}",
            f"improvement  {improvement}",
            # A sealed run's submissions were scored on validation; its best score is its final on test.
            *uncertainty_lines(metrics, "validation" if row.feedback == Feedback.SEALED else None),
            *final_lines({**row.to_json(), "unverified": self.unverified}),
            f"submissions  {row.submissions} scored",
            f"workspace    {printable(row.workspace)}",
            f"results      {printable(str(results_path(self.settings.home)))}",
        ]
        for line in lines:
            console.print(Text(f"  {line}"))


def nothing_scored_warning(view: ExperimentAnswer | None, status: RunStatus, workspace: Path) -> str | None:
    """The summary's warning for a run that completed with nothing of the agent's scored. Its status
    stays ``completed`` (the platform did its part; results.csv says ``success`` false): the warning
    says why there is no best score, where a user would otherwise read a quiet "-"."""
    if view is None or status != "completed" or view.submissions > 0:
        return None
    if view.total_submissions == 0 and view.refused_submissions > 0:
        return (
            f"every submit of the agent was refused ({view.refused_submissions} after the grader read its "
            f"weights), so there is no best score or improvement; see its log {workspace / AGENT_LOG_FILE}"
        )
    if view.total_submissions == 0:
        return (
            "the agent submitted nothing, so there is no best score or improvement; see its log "
            f"{workspace / AGENT_LOG_FILE} (an agent that keeps time in reserve before its deadline, as the "
            "built-in ones do, submits nothing when --timeout is not above that reserve: give it more time)"
        )
    return (
        f"none of the agent's {view.total_submissions} submissions was scored, so there is no best score "
        f"or improvement; each one's error is in {workspace / SCORES_FILE}"
    )


@contextmanager
def _ignore_sigint() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
