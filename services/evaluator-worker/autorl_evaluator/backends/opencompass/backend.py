"""The ``opencompass`` backend: the reference's evaluator, run as a subprocess and made safe.

One evaluation is one folder under ``EVAL_DIR/opencompass/`` (evaluator-only storage):

- ``data/gsm8k/{train,test}.jsonl``: the problems the worker passes in (so ``eval_limit`` works
  and the test split never leaves evaluator storage); ``COMPASS_DATA_CACHE`` points here;
- ``model/``: the read-only transformers-4 view of the submission's snapshot
  (:mod:`autorl_evaluator.backends.opencompass.model_view`);
- ``config.py``: the OpenCompass config (:mod:`autorl_evaluator.backends.opencompass.config`);
- ``work/``: OpenCompass's ``--work-dir``; ``opencompass.log``: its output.

Before OpenCompass starts, every test prompt is rendered once by the sandboxed, limited renderer
(:mod:`autorl.checkpoints.chat_template`): a base model's chat template that loops, explodes or raises
on a test prompt fails here, in seconds, as the platform's failure, instead of inside OpenCompass,
which renders with no limits.

OpenCompass exits 0 when a task fails, so its exit code is never trusted: the score comes from
the newest summary CSV, and a ``-`` (or no row) is a failure carrying the log tail (with lines
quoting a test problem removed; the agent is shown a generic message either way,
:mod:`autorl_evaluator.failures`). Per-sample
completions come from the predictions file and are scored with the task's own three protocols,
so the result has the same keys as the ``hf`` backend's. The folder is removed after a success
(unless ``AUTORL_OPENCOMPASS_KEEP_RUNS``) and kept after a failure, for the operator.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from autorl.checkpoints import model_files
from autorl.checkpoints.chat_template import ChatTemplate
from autorl.errors import CheckpointError, EvaluationError
from autorl.eval_config import EvalConfig
from autorl.settings import CPU_EVAL_BATCH_SIZE
from autorl.tasks.base import Problem, Task, evaluation_messages, write_problems
from autorl.tasks.gsm8k import GSM8KFormatTask
from autorl_evaluator.backends.base import Backend, EvalResult, Evaluation
from autorl_evaluator.backends.opencompass.config import (
    CHAT_MODEL_FOLDER,
    DATASET_ABBR,
    DATASET_DATA_SUBDIR,
    MODEL_ABBR,
    ConfigInputs,
    GpuPlan,
    model_type,
    render,
)
from autorl_evaluator.backends.opencompass.model_size import weight_bytes
from autorl_evaluator.backends.opencompass.model_view import build_view, remove_view
from autorl_evaluator.backends.opencompass.parallel import (
    TensorParallelShape,
    fits_one_gpu,
    tensor_parallel_size,
)
from autorl_evaluator.backends.opencompass.resident_engine import ENGINES, EngineSpec, shim_environment
from autorl_evaluator.backends.opencompass.warm_opencompass import SERVERS, CompassSpec
from autorl_evaluator.failures import EvaluatorFaultError, PublicEvaluationError
from autorl_evaluator.gpu_memory import visible_gpu_memory
from autorl_evaluator.model_settings import ModelSettings, settings_for, within_free_memory_gate
from autorl_evaluator.settings import WorkerSettings
from autorl_evaluator.subprocess_group import log_tail, run_in_group
from autorl_evaluator.time_budget import BudgetExceededError, TimeBudget, remaining_s
from autorl_evaluator.versions import ENGINE_PREFIX, backend_versions, script_python

log = logging.getLogger("autorl.evaluator.opencompass")

#: Variables of the worker's environment that OpenCompass may see: the system's basics and the
#: GPU stack's tuning knobs. Everything else (database URLs, tokens, the agent's settings) stays
#: out of a process that handles untrusted files.
PASSED_VARIABLES = frozenset({"PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "OMP_NUM_THREADS"})
PASSED_PREFIXES = ("NCCL_", "NVIDIA_", "NVSHMEM_", "TORCH_", "VLLM_", "CUDA_")
#: How much of OpenCompass's logs an error message carries.
#: Lines of vLLM's and CUDA's logs that say the engine could not start on this worker: a submission
#: has the base model's architecture (checked at submit), so these are the evaluator's faults.
ENGINE_FAULT_MARKERS = (
    "must be divisible by tensor parallel size",
    "Free memory on device",
    "CUDA out of memory",
    "No CUDA GPUs are available",
    "NCCL error",
    "Engine core initialization failed",
)
ERROR_TAIL_LINES = 30
#: OpenCompass's summary prints each accuracy with this many decimals.
SUMMARY_DECIMALS = 2
#: How much of each log's end is searched for an engine fault.
ENGINE_FAULT_SCAN_LINES = 400
ENGINE_FAULT_SCAN_CHARS = 200_000
ERROR_TAIL_CHARS = 3000
REDACT_PIECE_CHARS = 32


@dataclass(frozen=True)
class Placement:
    """Where the model runs: on the CPU (``gpu`` None) or on these devices through vLLM."""

    gpu: GpuPlan | None

    @property
    def cuda_visible_devices(self) -> str:
        # An empty value hides every GPU: a CPU evaluation must not pick one up by accident.
        return self.gpu.cuda_visible_devices if self.gpu is not None else ""


def visible_gpus(environ: Mapping[str, str]) -> list[int]:
    """Indices of the GPUs this worker may use: ``CUDA_VISIBLE_DEVICES`` if set, else all of them.

    OpenCompass's runner reads device indices back from ``CUDA_VISIBLE_DEVICES`` as integers, so
    device UUIDs cannot be passed on; they are refused with the fix.
    """
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(_cuda_device_count()))
    entries = [entry.strip() for entry in raw.split(",") if entry.strip()]
    devices: list[int] = []
    for entry in entries:
        if not entry.lstrip("-").isdigit():
            raise EvaluationError(
                f"CUDA_VISIBLE_DEVICES={raw!r} names devices by UUID; the opencompass backend needs "
                "integer indices (e.g. CUDA_VISIBLE_DEVICES=0,1)"
            )
        index = int(entry)
        if index < 0:
            # CUDA ignores this entry and every one after it.
            break
        devices.append(index)
    return devices


def _cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count())


def place(
    settings: WorkerSettings,
    environ: Mapping[str, str],
    shape: TensorParallelShape,
    *,
    fits_one_gpu: bool = False,
) -> Placement:
    """CPU when ``eval_device`` is ``cpu`` or no GPU is visible; a model that fits one GPU: one vLLM
    replica on each visible GPU; otherwise one vLLM engine on ``tensor_parallel_size(visible GPUs,
    shape)`` of them, the first ones."""
    if settings.eval_device == "cpu":
        return Placement(gpu=None)
    gpus = visible_gpus(environ)
    if not gpus:
        if settings.eval_device is not None and settings.eval_device.startswith("cuda"):
            raise EvaluatorFaultError(  # the worker's setting, never the checkpoint's fault
                f"AUTORL_EVAL_DEVICE={settings.eval_device} but no GPU is visible to the worker; set it to "
                "cpu or unset it"
            )
        return Placement(gpu=None)
    if fits_one_gpu and len(gpus) > 1:
        return Placement(gpu=GpuPlan(devices=tuple(gpus), replicas=len(gpus)))
    size = tensor_parallel_size(len(gpus), shape)
    return Placement(gpu=GpuPlan(devices=tuple(gpus[:size])))


def subprocess_environment(
    environ: Mapping[str, str], *, run_dir: Path, cache_dir: Path, placement: Placement
) -> dict[str, str]:
    """The environment OpenCompass runs in: offline, contained in the run folder, on the planned devices."""
    env = {
        name: value
        for name, value in environ.items()
        if name in PASSED_VARIABLES or name.startswith(PASSED_PREFIXES)
    }
    env.setdefault("PATH", os.defpath)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": placement.cuda_visible_devices,
            "COMPASS_DATA_CACHE": str(run_dir),
            "HOME": str(run_dir / "home"),
            "HF_HOME": str(run_dir / "home" / "huggingface"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_NO_USAGE_STATS": "1",
            # vLLM's workers must not fork a process that has already touched CUDA.
            "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
            "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
            "TRITON_CACHE_DIR": str(cache_dir / "triton"),
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def engine_environment(cache_dir: Path, placement: Placement) -> dict[str, str]:
    """The resident engine's environment: OpenCompass's, with a home that outlives one evaluation."""
    home = cache_dir / "engine"
    (home / "home").mkdir(parents=True, exist_ok=True)
    env = subprocess_environment(os.environ, run_dir=home, cache_dir=cache_dir, placement=placement)
    # Weights are loaded in place by a function the server sends its own engine workers.
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    return env


def compass_environment(cache_dir: Path) -> dict[str, str]:
    """The warm OpenCompass's environment: OpenCompass's, without GPUs (its home and caches are the
    server's own, :meth:`CompassServer.server_environment`; each run's process gets its run's
    environment when it is forked)."""
    return subprocess_environment(
        os.environ, run_dir=cache_dir / "compass", cache_dir=cache_dir, placement=Placement(gpu=None)
    )


class OpenCompassBackend(Backend):
    """Evaluates with the ``opencompass`` command of its own environment (``AUTORL_OPENCOMPASS_BIN``)."""

    name = "opencompass"

    def check_task(self, task: Task) -> None:
        if not isinstance(task, GSM8KFormatTask):
            raise EvaluationError(
                "the opencompass backend evaluates tasks in GSM8K's format; "
                f"use the hf backend for {task.name}"
            )

    def run(self, evaluation: Evaluation) -> EvalResult:
        model_dir, task, problems = evaluation.model_dir, evaluation.task, evaluation.problems
        config, worker, budget = evaluation.config, evaluation.worker, evaluation.budget
        command = _opencompass_command(worker.opencompass_bin)
        root = worker.eval_dir / "opencompass"
        run_dir = root / f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(parents=True)
        (run_dir / "home").mkdir()
        started = time.monotonic()
        try:
            result = self._run(
                command, model_dir, task, problems, config, worker, run_dir, root / "cache", budget, started
            )
        except BaseException:
            log.warning("event=opencompass_failed run_dir=%s", run_dir)
            # A failed or stopped evaluation may leave the engine mid-request or poisoned, and the
            # warm OpenCompass mid-run.
            ENGINES.stop()
            SERVERS.stop()
            remove_view(run_dir / "model")
            raise
        result.seconds = time.monotonic() - started
        if not worker.eval_warm_worker or worker.eval_gpu_min_free_fraction is not None:
            # Only the warm worker's process evaluates again; elsewhere the engine (its whole
            # process group) goes with this evaluation rather than with the process's exit. On
            # GPUs shared with training, a resident engine would hold the share the next waits for.
            ENGINES.stop()
            SERVERS.stop()
        remove_view(run_dir / "model")
        if worker.opencompass_keep_runs:
            result.details["run_dir"] = str(run_dir)
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
        return result

    @staticmethod
    def _fits_one_gpu(view: Path, model: ModelSettings) -> bool:
        """Whether the model fits the smallest visible GPU (:func:`fits_one_gpu`); False without GPUs
        or when the weights' headers cannot be read (OpenCompass then reports what it finds)."""
        gpus = visible_gpu_memory()
        if not gpus:
            return False
        try:
            size = weight_bytes(view, model.dtype)
        except CheckpointError:
            return False
        return fits_one_gpu(size, min(gpu.total_bytes for gpu in gpus), model.gpu_memory_utilization)

    def _run(
        self,
        command: Path,
        model_dir: Path,
        task: Task,
        problems: list[Problem],
        config: EvalConfig,
        settings: WorkerSettings,
        run_dir: Path,
        cache_dir: Path,
        budget: TimeBudget | None,
        started: float,
    ) -> EvalResult:
        data_dir = run_dir / DATASET_DATA_SUBDIR
        write_problems(data_dir / "test.jsonl", problems)
        # OpenCompass's GSM8K loader opens both splits; the retriever (zero-shot) never reads train.
        write_problems(data_dir / "train.jsonl", [])
        view = build_view(model_dir, run_dir / "model")
        model_config = json.loads((view / "config.json").read_text(encoding="utf-8"))
        model_settings = within_free_memory_gate(
            settings_for(model_config), settings.eval_gpu_min_free_fraction
        )
        fits = self._fits_one_gpu(view, model_settings) if settings.eval_device != "cpu" else False
        try:
            shape = TensorParallelShape.from_config(model_config)
        except EvaluationError as exc:  # the base model's config: not the submission's fault
            raise EvaluatorFaultError(str(exc)) from exc
        placement = place(settings, os.environ, shape, fits_one_gpu=fits)
        resident = settings.vllm_python is not None
        if resident and placement.gpu is not None and placement.gpu.replicas > 1:
            # One engine: the first replica's devices.
            placement = Placement(
                gpu=GpuPlan(devices=placement.gpu.devices[: placement.gpu.tensor_parallel_size])
            )
        check_prompts_render(view, task, problems, model_settings)
        config_path = run_dir / "config.py"
        max_out_len = config.max_new_tokens or task.max_new_tokens
        batch_size = config.batch_size_in_force(settings.eval_batch_size)
        timeout_s = config.timeout_in_force_s(settings.eval_timeout_s)
        inputs = ConfigInputs(
            model_dir=view,
            task=task,
            max_out_len=max_out_len,
            model=model_settings,
            gpu=placement.gpu,
            cpu_batch_size=batch_size or CPU_EVAL_BATCH_SIZE,
            resident=resident,
        )
        config_path.write_text(render(inputs), encoding="utf-8")
        work_dir = run_dir / "work"
        env = subprocess_environment(os.environ, run_dir=run_dir, cache_dir=cache_dir, placement=placement)
        if not inputs.uses_vllm_model:
            env["PYTHONPATH"] = str(CHAT_MODEL_FOLDER)  # the config's model builder
        # The package versions the evaluation key records (measured for this evaluation, or now): a
        # kept server started under others is replaced, so what runs is what the key names.
        versions = config.backend_versions or backend_versions(self.name, settings)
        if settings.vllm_python is not None:
            engine = ENGINES.get(
                EngineSpec(
                    python=settings.vllm_python,
                    engine="vllm" if placement.gpu is not None else "transformers",
                    cuda_visible_devices=placement.cuda_visible_devices,
                    packages=tuple((k, v) for k, v in versions.items() if k.startswith(ENGINE_PREFIX)),
                ),
                engine_environment(cache_dir, placement),
                cache_dir.parent / "engine.log",
            )
            # OpenCompass's task asks for no GPU: the engine holds them.
            env = shim_environment(engine, {**env, "CUDA_VISIBLE_DEVICES": ""})
        log_path = run_dir / "opencompass.log"
        log.info(
            "event=opencompass_started run_dir=%s samples=%d device=%s tensor_parallel_size=%s replicas=%s",
            run_dir,
            len(problems),
            "cuda" if placement.gpu else "cpu",
            placement.gpu.tensor_parallel_size if placement.gpu else "-",
            placement.gpu.replicas if placement.gpu else "-",
        )
        # OpenCompass writes its task configs to ./tmp: the working directory is the run folder.
        arguments = [str(config_path), "--work-dir", str(work_dir)]
        # An agent's evaluation stops at its time budget, where that comes before the hard timeout.
        deadline = budget.deadline(started, "cuda" if placement.gpu else "cpu") if budget else None
        python = script_python(command) if settings.eval_warm_worker else None
        # OpenCompass's process does no GPU work (a CPU run, or the resident engine's): it runs its
        # tasks in its own process (--debug), forked from the warm server in the warm worker.
        one_process = resident or placement.gpu is None
        if one_process:
            arguments.append("--debug")
        process = "command"
        if python is not None and one_process:
            server = SERVERS.get(
                CompassSpec(
                    python=python,
                    pythonpath=env.get("PYTHONPATH", ""),
                    packages=tuple((k, v) for k, v in versions.items() if not k.startswith(ENGINE_PREFIX)),
                ),
                compass_environment(cache_dir),
                cache_dir.parent / "compass.log",
            )
            run_timeout_s = _run_timeout_s(timeout_s, deadline)  # from now: the server's start counts
            outcome = server.run(arguments, cwd=run_dir, env=env, timeout_s=run_timeout_s, log_path=log_path)
            process = "warm"
        else:
            run_timeout_s = _run_timeout_s(timeout_s, deadline)
            outcome = run_in_group(
                [str(command), *arguments], cwd=run_dir, env=env, timeout_s=run_timeout_s, log_path=log_path
            )
        log.info(
            "event=opencompass_finished returncode=%d timed_out=%s seconds=%.1f",
            outcome.returncode,
            outcome.timed_out,
            outcome.seconds,
        )
        if outcome.survivors:
            log.error("event=opencompass_survivors pids=%s", outcome.survivors)
        if outcome.timed_out:
            stopped = (
                f"{len(outcome.survivors)} of its processes survived SIGKILL (pids {outcome.survivors})"
                if outcome.survivors
                else "it and every process it started were stopped"
            )
            if budget is not None and run_timeout_s < timeout_s:
                raise BudgetExceededError(
                    f"{budget.exceeded()} (OpenCompass: {stopped})", detail=_error_tail(run_dir, problems)
                )
            raise PublicEvaluationError(
                f"OpenCompass did not finish within the hard timeout of {timeout_s} s "
                f"(AUTORL_EVAL_TIMEOUT_S); {stopped}.",
                detail=_error_tail(run_dir, problems),
            )
        accuracy = read_summary_accuracy(work_dir)
        if accuracy is None and engine_fault(run_dir):
            raise EvaluatorFaultError(
                "vLLM could not start the model on this worker's GPUs (OpenCompass produced no score)",
                detail=_error_tail(run_dir, problems),
            )
        if accuracy is None:
            raise EvaluationError(
                f"OpenCompass produced no score (exit code {outcome.returncode}): the checkpoint could "
                "not be evaluated.\n" + _error_tail(run_dir, problems)
            )
        completions = read_predictions(work_dir, len(problems))
        scores = task.score(completions, [problem.answer for problem in problems])
        if not summary_agrees(accuracy, scores["opencompass"]):
            log.warning(
                "event=opencompass_score_mismatch summary=%.4f recomputed=%.4f",
                accuracy,
                scores["opencompass"],
            )
        return EvalResult(
            completions=completions,
            scores=scores,
            n_samples=len(problems),
            seconds=outcome.seconds,
            details={
                "backend": self.name,
                "device": "cuda" if placement.gpu else "cpu",
                "model_type": model_type(inputs),
                "engine": "resident" if resident else "opencompass",
                "tensor_parallel_size": placement.gpu.tensor_parallel_size if placement.gpu else 0,
                "replicas": placement.gpu.replicas if placement.gpu else 0,
                "devices": list(placement.gpu.devices) if placement.gpu else [],
                "max_new_tokens": max_out_len,
                "summary_accuracy": accuracy,
                "opencompass_seconds": round(outcome.seconds, 3),
                # "warm": forked from the warm OpenCompass; "command": the opencompass command.
                "opencompass_process": process,
            },
        )


def _run_timeout_s(timeout_s: float, deadline: float | None) -> float:
    """How long OpenCompass's run may take from now: the hard timeout, or less to the deadline."""
    left_s = remaining_s(deadline)
    return timeout_s if left_s is None else min(timeout_s, left_s)


def check_prompts_render(view: Path, task: Task, problems: Sequence[Problem], model: ModelSettings) -> None:
    """Render every test prompt with the limited renderer; raises ChatTemplateError."""
    tokenizer_config = json.loads((view / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = ChatTemplate(
        str(tokenizer_config.get("chat_template", "")), model_files.special_tokens(tokenizer_config)
    )
    conversations = [evaluation_messages(task.build_messages(problem.question)) for problem in problems]
    template.render_batch(conversations, add_generation_prompt=True, **model.chat_template_kwargs())


def summary_agrees(summary: float, recomputed: float) -> bool:
    """Whether OpenCompass's summary accuracy is ``recomputed`` as the summary prints it: rounded
    to :data:`SUMMARY_DECIMALS` decimals (on the whole split, 2 of 1,319 right is 0.1516… and the
    summary says 0.15)."""
    return abs(summary - recomputed) <= 0.5 * 10.0**-SUMMARY_DECIMALS + 1e-9


def _opencompass_command(configured: Path) -> Path:
    """The opencompass command to run (absolute: WorkerSettings makes it so). A missing one is the
    evaluator's fault, never the checkpoint's."""
    command = configured.expanduser()
    if not command.is_file():
        raise EvaluatorFaultError(
            f"the evaluator's opencompass command {command} does not exist; build its environment with "
            "`make .venv-opencompass/.installed` in the repository or point AUTORL_OPENCOMPASS_BIN at it"
        )
    return command


def newest_run(work_dir: Path) -> Path | None:
    """The newest of OpenCompass's timestamped run folders under ``work_dir``."""
    runs = sorted(path for path in work_dir.glob("*") if path.is_dir())
    return runs[-1] if runs else None


def read_summary_accuracy(work_dir: Path) -> float | None:
    """The ``accuracy`` of dataset ``gsm8k`` for our model in the newest summary CSV; None when
    there is no summary, no such row, or OpenCompass wrote ``-`` (the task failed)."""
    run = newest_run(work_dir)
    if run is None:
        return None
    summaries = sorted((run / "summary").glob("summary_*.csv"))
    if not summaries:
        return None
    with summaries[-1].open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row.get("dataset") == DATASET_ABBR and row.get("metric") == "accuracy":
                value = (row.get(MODEL_ABBR) or "").strip()
                try:
                    return float(value)
                except ValueError:
                    return None
    return None


def read_predictions(work_dir: Path, expected: int) -> list[str]:
    """Raw completions in problem order from OpenCompass's predictions file, or from its shards
    (``gsm8k_0.json``, ``gsm8k_1.json``, ... of consecutive problems) when replicas split the work."""
    run = newest_run(work_dir)
    folder = run / "predictions" / MODEL_ABBR if run else None
    if folder is None:
        raise EvaluationError("OpenCompass reported a score but wrote no predictions file")
    whole = folder / f"{DATASET_ABBR}.json"
    shards = (folder / f"{DATASET_ABBR}_{index}.json" for index in itertools.count())
    paths = [whole] if whole.is_file() else list(itertools.takewhile(Path.is_file, shards))
    if not paths:
        raise EvaluationError("OpenCompass reported a score but wrote no predictions file")
    completions: list[str] = []
    for path in paths:
        records = json.loads(path.read_text(encoding="utf-8"))
        completions += [str(records[str(index)]["prediction"]) for index in range(len(records))]
    if len(completions) != expected:
        raise EvaluationError(f"OpenCompass wrote {len(completions)} predictions for {expected} problems")
    return completions


def _logs(run_dir: Path) -> list[Path]:
    task_logs = sorted((run_dir / "work").glob("*/logs/*/*/*.out"))
    return [path for path in [*task_logs, run_dir / "opencompass.log"] if path.is_file()]


def engine_fault(run_dir: Path) -> bool:
    """Whether a log of the run says the engine could not start (:data:`ENGINE_FAULT_MARKERS`)."""
    return any(
        marker in log_tail(path, max_lines=ENGINE_FAULT_SCAN_LINES, max_chars=ENGINE_FAULT_SCAN_CHARS)
        for path in _logs(run_dir)
        for marker in ENGINE_FAULT_MARKERS
    )


def _error_tail(run_dir: Path, problems: Sequence[Problem]) -> str:
    """The end of OpenCompass's own log and of each task log, with any line quoting a test
    question removed: the message is shown to the agent, the test set is not."""
    sections: list[str] = []
    logs = _logs(run_dir)
    # One budget for all logs: the stored error keeps 4,000 characters, headline included.
    budget = ERROR_TAIL_CHARS // max(len(logs), 1)
    for path in logs:
        tail = log_tail(path, max_lines=ERROR_TAIL_LINES, max_chars=budget)
        if tail:
            sections.append(f"--- {path.relative_to(run_dir)} (last lines) ---\n{redact(tail, problems)}")
    return "\n".join(sections) if sections else "(OpenCompass wrote no log)"


def redact(text: str, problems: Sequence[Problem]) -> str:
    """``text`` without the lines that quote a test question or answer."""
    needles = [snippet for problem in problems for snippet in _snippets(problem)]
    kept = [line for line in text.splitlines() if not any(needle in line for needle in needles)]
    return "\n".join(kept)


def _snippets(problem: Problem) -> list[str]:
    # Consecutive 32-character pieces: any quote of 63 characters or more holds one whole, and
    # a piece this long does not turn up in a log line by chance.
    text = " ".join([problem.question, problem.answer])
    return [
        text[start : start + REDACT_PIECE_CHARS]
        for start in range(0, len(text) - REDACT_PIECE_CHARS + 1, REDACT_PIECE_CHARS)
    ]
