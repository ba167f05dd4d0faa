"""example_grpo: the built-in example agent. SFT warm start (when needed), then GRPO, then stop.

1. Reads the baseline from the grader. When it is below ``--sft-threshold`` (a model that never
   answers right gives GRPO no reward signal), fine-tunes on the train split's reference
   solutions first: the ``sft`` phase, submitted after each epoch.
2. Trains with TRL's ``GRPOTrainer`` on the task's reward (+1 right / -1 wrong), submitted after
   each epoch: the ``grpo`` phase.

Prompts are exactly the evaluator's (``task.render_prompt``: four worked examples in the
model's chat template), so what is trained is what is scored. Every checkpoint is a full model
in safetensors with the base model's tokenizer files, loadable by transformers 4 and 5. The
agent stops itself ``--reserve-s`` seconds before the deadline (read from ``GET /time``), and
starts no training step that would end past that stop (:mod:`autorl_agents.step_clock`).

Settings: ``python -m autorl_agents.example_grpo --help``
(:mod:`autorl_agents.example_config`); the platform also reads extra arguments from
``AUTORL_AGENT_ARGS`` (``autorl run ... --env AUTORL_AGENT_ARGS="--sft never"``). The SFT phase is
:mod:`autorl_agents.sft`; GRPO runs through TRL, or :mod:`autorl_agents.fast_grpo`
on a CUDA GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autorl.checkpoints.model_files import TOKENIZER_FILES
from autorl_agents import sft
from autorl_agents.agent_log import log, log_as
from autorl_agents.example_config import ExampleGRPOConfig, cpu_threads, grpo_sizes, parse_config
from autorl_agents.step_clock import StepClock

#: Files copied from the base model into every checkpoint, unchanged: the tokenizer as the base
#: ships it loads in transformers 4 and 5 (re-saving it with 5 writes fields 4 rejects), and
#: the generation defaults (eos ids) are the base model's.
COPIED_FROM_BASE = (*TOKENIZER_FILES, "generation_config.json")
#: Below this many parameters a model counts as "tiny": it needs far larger learning rates.
TINY_MODEL_PARAMETERS = 50_000_000


class Agent:
    """One run: phases share the model, the tokenizer, the client and the deadline."""

    def __init__(self, config: ExampleGRPOConfig) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
        from transformers.utils import logging as transformers_logging

        from autorl.client import GradingClient
        from autorl.tasks import get_task
        from autorl.tasks.base import read_problems

        # agent.log is read by people: one line per event, no progress bars redrawn into it.
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        self.config = config
        # One seed for every random draw (python's random, numpy, torch on CPU and GPU): repeats of
        # a run (autorl run --repeat, AUTORL_SEED) differ by it alone. The phases seed their own
        # samplers (SFT's shuffling, GRPO's prompt order and sampling) from config.seed as well.
        set_seed(config.seed)
        self.client = GradingClient.from_env()
        self.task = get_task(os.environ["TASK"])
        self.base_dir = Path(os.environ["MODEL_PATH"])
        self.output_dir = Path(os.environ["OUTPUT_DIR"])
        data_dir = Path(os.environ["DATA_PATH"])
        self.problems = read_problems(data_dir / "train.jsonl")[: config.max_train_problems]
        self.cuda = torch.cuda.is_available()
        self.bf16 = self.cuda and torch.cuda.is_bf16_supported()
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(self.base_dir)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.base_dir, dtype=dtype, device_map="cuda" if self.cuda else None
        )
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.tiny = self.parameters < TINY_MODEL_PARAMETERS
        if not self.cuda:
            torch.set_num_threads(cpu_threads(config, tiny=self.tiny))
        budget = self.client.time()
        self.end_time = budget.end_time if budget.end_time is not None else time.time() + 3600
        self.submitted: list[int] = []
        self.stopped_early = False
        self.last_submitted_step = -1
        log(
            "start",
            task=self.task.name,
            problems=len(self.problems),
            parameters=self.parameters,
            device="cuda" if self.cuda else "cpu",
            dtype=str(dtype).removeprefix("torch."),
            cpu_threads=None if self.cuda else torch.get_num_threads(),
            remaining_s=round(self.end_time - time.time()),
            seed=config.seed,
        )

    def stop_time(self) -> float:
        return self.end_time - self.config.reserve_s

    def remaining(self) -> float:
        return self.stop_time() - time.time()

    # --- checkpoints ----------------------------------------------------------------------

    def save(self, name: str) -> Path:
        """Full model in safetensors plus the base model's tokenizer and generation files."""
        target = self.output_dir / name
        if target.exists():
            shutil.rmtree(target)
        self.model.save_pretrained(target)
        for file_name in COPIED_FROM_BASE:
            source = self.base_dir / file_name
            if source.is_file():
                shutil.copyfile(source, target / file_name)
        _backfill_config(target / "config.json", self.base_dir / "config.json")
        return target

    def save_and_submit(self, name: str, phase: str) -> None:
        from autorl.client import GradingError

        if time.time() >= self.end_time - 2:
            log("skip_submit", checkpoint=name, reason="deadline")
            return
        path = self.save(name)
        workspace = Path(os.environ["WORKSPACE"])
        # Relative to the workspace where possible: the grader may see the workspace at another path.
        shown = path.relative_to(workspace) if path.is_relative_to(workspace) else path
        try:
            # wait=False: training goes on while the checkpoint is evaluated.
            submission = self.client.submit(shown, wait=False)
        except GradingError as exc:
            log("submit_refused", checkpoint=name, phase=phase, detail=exc.detail)
            return
        self.submitted.append(submission.submission_id)
        log("submitted", phase=phase, checkpoint=name, submission_id=submission.submission_id)

    # --- phases -----------------------------------------------------------------------------

    def run(self) -> None:
        baseline = self.client.scores().baseline_score
        run_sft = self.config.sft == "always" or (
            self.config.sft == "auto" and (baseline is None or baseline < self.config.sft_threshold)
        )
        log("plan", baseline=baseline, sft=run_sft, rl=self.config.rl, threshold=self.config.sft_threshold)
        if run_sft:
            sft_stop = time.time() + self.config.sft_time_fraction * max(0.0, self.remaining())
            sft.run_phase(self, stop_at=sft_stop)
        if self.config.rl == "none":
            log("skip_phase", phase="grpo", reason="rl=none")
        elif self.refresh_deadline() > 0:
            self.grpo(stop_at=self.stop_time())
        else:
            log("skip_phase", phase="grpo", reason="no time left")
        self.report()

    def refresh_deadline(self) -> float:
        """Seconds left before the stop time, after asking the grader for the deadline again
        (an operator may have extended the budget)."""
        budget = self.client.time()
        if budget.end_time is not None:
            self.end_time = budget.end_time
        return self.remaining()

    def _training_args(self, **overrides: Any) -> dict[str, Any]:
        return {
            "output_dir": str(Path(os.environ["WORKSPACE"]) / "code" / "trainer"),
            "report_to": "none",
            "save_strategy": "no",
            "logging_steps": self.config.logging_steps,
            "seed": self.config.seed,
            "use_cpu": not self.cuda,
            "bf16": self.bf16,
            "dataloader_num_workers": 0,
            "disable_tqdm": True,
            **overrides,
        }

    def grpo(self, *, stop_at: float) -> None:
        config = self.config
        sizes = grpo_sizes(config, tiny=self.tiny)
        lr = sizes.learning_rate
        completion_limit = config.max_completion_length or self._default_completion_length()
        if config.rollouts == "fast" or (config.rollouts == "auto" and (self.cuda or self.tiny)):
            # The fast path needs neither TRL nor datasets (a GPU image may hold neither).
            from autorl_agents import fast_grpo

            fast_grpo.run_phase(self, stop_at=stop_at, sizes=sizes, completion_limit=completion_limit)
            return
        from datasets import Dataset
        from transformers import PrinterCallback
        from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined]

        records = [
            {"prompt": self.task.render_prompt(self.tokenizer, p.question), "answer": p.answer}
            for p in self.problems
        ]
        batch = sizes.prompts_per_step * sizes.num_generations
        log(
            "phase_start",
            phase="grpo",
            prompts=len(records),
            epochs=config.grpo_epochs,
            learning_rate=lr,
            num_generations=sizes.num_generations,
            max_completion_length=completion_limit,
            budget_s=round(stop_at - time.time()),
        )

        def reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float | None]:
            return list(self.task.reward(completions, answer, **kwargs))

        reward.__name__ = f"{self.task.name}_reward"
        args = GRPOConfig(
            **self._training_args(
                num_train_epochs=config.grpo_epochs,
                per_device_train_batch_size=batch,
                num_generations=sizes.num_generations,
                max_completion_length=completion_limit,
                learning_rate=lr,
                lr_scheduler_type="constant",
                beta=0.0,
            )
        )
        trainer = GRPOTrainer(
            model=self.model,
            reward_funcs=[reward],
            args=args,
            train_dataset=Dataset.from_list(records),
            processing_class=self.tokenizer,
            callbacks=self._callbacks("grpo", stop_at),
        )
        # Our callback logs the few numbers that matter, one line each; the default printer
        # would add a 30-key dictionary per log step.
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        self._finish_phase("grpo", trainer)

    def _default_completion_length(self) -> int:
        longest = max(len(self.tokenizer(sft.sft_target(p.answer)).input_ids) for p in self.problems[:500])
        return min(self.task.max_new_tokens, max(16, int(longest * 1.5)))

    def _callbacks(self, phase: str, stop_at: float) -> list[Any]:
        from transformers import TrainerCallback

        agent = self
        clock = StepClock()

        class PhaseCallback(TrainerCallback):
            """Submits after each epoch, stops before a step that would end past ``stop_at``, logs
            losses and rewards."""

            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                clock.begin()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                clock.end()
                if not clock.has_room_before(stop_at):
                    log(
                        "phase_stop",
                        phase=phase,
                        reason="time",
                        step=state.global_step,
                        next_step_s=round(clock.step_estimate(), 1),
                    )
                    control.should_training_stop = True
                    agent.stopped_early = True

            def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if getattr(agent, "stopped_early", False):
                    return
                epoch = round(state.epoch or 0)
                agent.save_and_submit(f"{phase}-epoch-{epoch}", phase)
                agent.last_submitted_step = state.global_step

            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
                shown = {k: v for k, v in (logs or {}).items() if k in ("loss", "reward", "learning_rate")}
                if shown:
                    log("train", phase=phase, step=state.global_step, **shown)

        self.stopped_early = False
        self.last_submitted_step = -1
        return [PhaseCallback()]

    def _finish_phase(self, phase: str, trainer: Any) -> None:
        """Submit what an early stop left unsubmitted."""
        if self.stopped_early and trainer.state.global_step != self.last_submitted_step:
            self.save_and_submit(f"{phase}-final", phase)
        log("phase_end", phase=phase, steps=trainer.state.global_step)

    def report(self) -> None:
        """Print the scores known so far (evaluations may still run: the platform waits for them)."""
        scores = self.client.scores()
        for submission in scores.submissions:
            log(
                "score",
                submission_id=submission.submission_id,
                checkpoint=submission.model_path,
                status=submission.status,
                score=submission.score,
            )
        log("done", baseline=scores.baseline_score, best=scores.best.score, submissions=len(self.submitted))


def _backfill_config(saved: Path, base: Path) -> None:
    """Keep every key of the base config that the saving transformers version dropped.

    transformers 5 writes ``rope_parameters`` and ``dtype``; transformers 4 (OpenCompass'
    environment) reads ``rope_theta`` and ``torch_dtype`` and would fall back to defaults.
    """
    config = json.loads(saved.read_text())
    base_config = json.loads(base.read_text())
    for key, value in base_config.items():
        config.setdefault(key, value)
    if "dtype" in config:
        config["torch_dtype"] = config["dtype"]
    saved.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main(argv: Sequence[str] | None = None, *, name: str = "example_grpo") -> int:
    log_as(name)
    config = parse_config(argv)
    Agent(config).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
