"""example_grpo: the built-in example agent. SFT warm start (when needed), then GRPO, then stop.

1. Reads the baseline from the grader. When it is below ``--sft-threshold`` (a model that never
   answers right gives GRPO no reward signal), fine-tunes on the train split's reference
   solutions first: the ``sft`` phase, submitted after each epoch.
2. Trains with TRL's ``GRPOTrainer`` on the task's reward (+1 right / -1 wrong), submitted after
   each epoch: the ``grpo`` phase.

Prompts are exactly the evaluator's (``task.render_prompt``: four worked examples in the
model's chat template), so what is trained is what is scored. Every checkpoint is a full model
in safetensors with the base model's tokenizer files, loadable by transformers 4 and 5. The
agent stops itself ``--reserve-s`` seconds before the deadline (read from ``GET /time``).

Settings: ``python -m autorl_agent_runner.agents.example_grpo --help``; the platform also reads
extra arguments from ``AUTORL_AGENT_ARGS`` (``autorl run ... --env AUTORL_AGENT_ARGS="--sft never"``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from autorl.model_files import TOKENIZER_FILES

#: Files copied from the base model into every checkpoint, unchanged: the tokenizer as the base
#: ships it loads in transformers 4 and 5 (re-saving it with 5 writes fields 4 rejects), and
#: the generation defaults (eos ids) are the base model's.
COPIED_FROM_BASE = (*TOKENIZER_FILES, "generation_config.json")
#: Below this many parameters a model counts as "tiny": it needs far larger learning rates.
TINY_MODEL_PARAMETERS = 50_000_000
_CALCULATOR = re.compile(r"<<[^>]*>>")
_FINAL_ANSWER = re.compile(r"\n?####\s*(.+?)\s*$")

SftMode = Literal["auto", "always", "never"]
RolloutMode = Literal["auto", "trl"]
RlMode = Literal["grpo", "none"]
#: Fields whose values are limited to a Literal's choices.
_CHOICES: dict[str, tuple[str, ...]] = {
    "sft": get_args(SftMode),
    "rl": get_args(RlMode),
    "rollouts": get_args(RolloutMode),
}
#: The name this agent logs under (example_sft runs this module with SFT alone).
_agent_name = "example_grpo"


@dataclass
class ExampleGRPOConfig:
    """Settings of the example agent; each field's help is its command-line help."""

    sft: SftMode = field(
        default="auto",
        metadata={
            "help": "SFT warm start on the reference solutions: auto = when the baseline < --sft-threshold"
        },
    )
    sft_threshold: float = field(
        default=10.0, metadata={"help": "baseline score (0-100) below which auto runs SFT"}
    )
    sft_epochs: int = field(
        default=8, metadata={"help": "SFT epochs over the train split (the budget may stop it earlier)"}
    )
    sft_learning_rate: float | None = field(
        default=None, metadata={"help": "SFT learning rate (default: 3e-3 for a tiny model, 1e-5 otherwise)"}
    )
    sft_batch_size: int | None = field(
        default=None,
        metadata={"help": "SFT examples per optimizer step (default: 32 for a tiny model, 16 otherwise)"},
    )
    sft_time_fraction: float = field(
        default=0.7,
        metadata={"help": "largest share of the remaining budget SFT may take; GRPO gets the rest"},
    )
    rl: RlMode = field(
        default="grpo", metadata={"help": "the RL phase after SFT: grpo, or none for SFT alone"}
    )
    grpo_epochs: int = field(default=1, metadata={"help": "GRPO epochs over the train prompts"})
    grpo_learning_rate: float | None = field(
        default=None, metadata={"help": "GRPO learning rate (default: 5e-4 for a tiny model, 1e-6 otherwise)"}
    )
    num_generations: int = field(
        default=4, metadata={"help": "completions sampled per prompt (GRPO group size)"}
    )
    grpo_prompts_per_step: int = field(default=2, metadata={"help": "prompts per GRPO optimizer step"})
    rollouts: RolloutMode = field(
        default="auto",
        metadata={
            "help": "GRPO generation: auto = the batched engine of fast_grpo.py on a CUDA GPU "
            "(TRL's GRPOTrainer elsewhere), trl = always GRPOTrainer"
        },
    )
    max_completion_length: int | None = field(
        default=None,
        metadata={"help": "GRPO completion limit in tokens (default: 1.5x the longest reference solution)"},
    )
    max_train_problems: int | None = field(
        default=None, metadata={"help": "use only the first N train problems (default: all)"}
    )
    reserve_s: float = field(
        default=40.0,
        metadata={"help": "seconds before the deadline at which training stops to save and submit"},
    )
    logging_steps: int = field(default=10, metadata={"help": "log every N optimizer steps"})
    seed: int = field(default=0, metadata={"help": "random seed"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="example_grpo", description=__doc__.split("\n\n")[0])
    for spec in fields(ExampleGRPOConfig):
        flag = "--" + spec.name.replace("_", "-")
        default = spec.default if spec.default is not MISSING else None
        kind = _arg_type(spec.type)
        kwargs: dict[str, Any] = {"default": default, "help": f"{spec.metadata['help']} (default: {default})"}
        choices = _CHOICES.get(spec.name)
        parser.add_argument(flag, type=kind, choices=choices, **kwargs)
    return parser


def _arg_type(annotation: object) -> Any:
    text = str(annotation)
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str


def parse_config(argv: Sequence[str] | None = None) -> ExampleGRPOConfig:
    args = list(sys.argv[1:] if argv is None else argv)
    args += shlex.split(os.environ.get("AUTORL_AGENT_ARGS", ""))
    return ExampleGRPOConfig(**vars(build_parser().parse_args(args)))


def log(event: str, **values: object) -> None:
    """One event per line, key=value, on stdout (the platform keeps it in agent.log)."""
    parts = " ".join(f"{key}={_format(value)}" for key, value in values.items())
    print(f"{time.strftime('%H:%M:%S')} {_agent_name} event={event} {parts}".rstrip(), flush=True)


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return json.dumps(text) if " " in text else text


def sft_target(answer: str) -> str:
    """A reference solution written the way the evaluator's worked examples answer.

    GSM8K-style answers carry calculator annotations (``<<3+4=7>>``) and end in ``#### 7``; the
    few-shot examples the evaluator shows have neither and end in ``The answer is 7``.
    """
    text = _CALCULATOR.sub("", answer).strip()
    match = _FINAL_ANSWER.search(text)
    if match is None:
        return text + "\n"
    reasoning = text[: match.start()].rstrip()
    final = f"The answer is {match.group(1)}\n"
    return f"{reasoning}\n{final}" if reasoning else final


class Agent:
    """One run: phases share the model, the tokenizer, the client and the deadline."""

    def __init__(self, config: ExampleGRPOConfig) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as transformers_logging

        from autorl.client import GradingClient
        from autorl.tasks import get_task
        from autorl.tasks.base import read_problems

        # agent.log is read by people: one line per event, no progress bars redrawn into it.
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        self.config = config
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
            remaining_s=round(self.end_time - time.time()),
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
            self.sft(stop_at=sft_stop)
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

    def sft(self, *, stop_at: float) -> None:
        """Supervised fine-tuning on the reference solutions, in the evaluator's prompt format.

        Every prompt starts with the same few-shot examples (~85% of its tokens). That shared
        prefix is encoded once per step, without gradient, and its cache is reused by the whole
        batch, so a step costs the question and answer tokens only: several times faster than
        encoding the full prompt per example, which is what makes SFT fit a CPU budget of minutes.
        """
        import torch

        config = self.config
        lr = config.sft_learning_rate or (3e-3 if self.tiny else 1e-5)
        batch_size = config.sft_batch_size or (32 if self.tiny else 16)
        prompts = [
            self.tokenizer(self.task.render_prompt(self.tokenizer, p.question)).input_ids
            for p in self.problems
        ]
        eos = self.tokenizer.eos_token or ""
        targets = [self.tokenizer(sft_target(p.answer) + eos).input_ids for p in self.problems]
        shared = _common_prefix_length(prompts)
        device = self.model.device
        prefix = torch.tensor([prompts[0][:shared]], device=device)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        steps_per_epoch = math.ceil(len(prompts) / batch_size)
        log(
            "phase_start",
            phase="sft",
            examples=len(prompts),
            epochs=config.sft_epochs,
            learning_rate=lr,
            shared_prefix_tokens=shared,
            budget_s=round(stop_at - time.time()),
        )
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        generator = random.Random(config.seed)
        order = list(range(len(prompts)))
        self.model.train()
        step, stopped = 0, False
        for epoch in range(1, config.sft_epochs + 1):
            generator.shuffle(order)
            for start in range(0, len(order), batch_size):
                if time.time() >= stop_at:
                    stopped = True
                    break
                batch = order[start : start + batch_size]
                inputs, labels, mask = _sft_batch(
                    [prompts[i][shared:] for i in batch], [targets[i] for i in batch], shared, pad_id
                )
                with torch.no_grad():
                    cache = _output_cache(_forward(self.model, prefix, use_cache=True))
                cache.batch_repeat_interleave(len(batch))
                positions = torch.arange(shared, shared + inputs.shape[1], device=device).expand(
                    len(batch), -1
                )
                for group in optimizer.param_groups:
                    group["lr"] = lr * min(1.0, (step + 1) / 10)  # a short warm-up
                loss = _forward(
                    self.model,
                    inputs.to(device),
                    cache=cache,
                    attention_mask=mask.to(device),
                    position_ids=positions,
                    labels=labels.to(device),
                    use_cache=False,
                ).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                if step % config.logging_steps == 0:
                    log(
                        "train",
                        phase="sft",
                        epoch=epoch,
                        step=step,
                        of=steps_per_epoch * config.sft_epochs,
                        loss=loss.item(),
                    )
            if stopped:
                log("phase_stop", phase="sft", reason="time", epoch=epoch, step=step)
                break
            self.save_and_submit(f"sft-epoch-{epoch}", "sft")
        if stopped and step % steps_per_epoch:
            self.save_and_submit("sft-final", "sft")
        self.model.eval()  # type: ignore[no-untyped-call]
        del optimizer
        log("phase_end", phase="sft", steps=step)

    def grpo(self, *, stop_at: float) -> None:
        config = self.config
        lr = config.grpo_learning_rate or (5e-4 if self.tiny else 1e-6)
        completion_limit = config.max_completion_length or self._default_completion_length()
        if self.cuda and config.rollouts == "auto":
            # The fast path needs neither TRL nor datasets (a GPU image may hold neither).
            from autorl_agent_runner.agents import fast_grpo

            fast_grpo.run_phase(self, stop_at=stop_at, learning_rate=lr, completion_limit=completion_limit)
            return
        from datasets import Dataset
        from transformers import PrinterCallback
        from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined]

        records = [
            {"prompt": self.task.render_prompt(self.tokenizer, p.question), "answer": p.answer}
            for p in self.problems
        ]
        batch = config.grpo_prompts_per_step * config.num_generations
        log(
            "phase_start",
            phase="grpo",
            prompts=len(records),
            epochs=config.grpo_epochs,
            learning_rate=lr,
            num_generations=config.num_generations,
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
                num_generations=config.num_generations,
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
        longest = max(len(self.tokenizer(sft_target(p.answer)).input_ids) for p in self.problems[:500])
        return min(self.task.max_new_tokens, max(16, int(longest * 1.5)))

    def _callbacks(self, phase: str, stop_at: float) -> list[Any]:
        from transformers import TrainerCallback

        agent = self

        class PhaseCallback(TrainerCallback):
            """Submits after each epoch, stops at ``stop_at``, logs losses and rewards."""

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if time.time() >= stop_at:
                    log("phase_stop", phase=phase, reason="time", step=state.global_step)
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


def _common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Tokens every sequence starts with, leaving each at least one token of its own."""
    first = sequences[0]
    length = min(len(s) for s in sequences) - 1
    for sequence in sequences[1:]:
        k = 0
        while k < length and sequence[k] == first[k]:
            k += 1
        length = k
    return max(0, length)


def _sft_batch(
    prompt_tails: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], prefix_length: int, pad_id: int
) -> tuple[Any, Any, Any]:
    """Right-padded inputs (prompt tail + target), labels on the target only, and the attention
    mask over prefix + inputs."""
    import torch

    rows = [list(tail) + list(target) for tail, target in zip(prompt_tails, targets, strict=True)]
    width = max(len(row) for row in rows)
    inputs = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), prefix_length + width), dtype=torch.long)
    mask[:, :prefix_length] = 1
    for i, (row, tail) in enumerate(zip(rows, prompt_tails, strict=True)):
        inputs[i, : len(row)] = torch.tensor(row)
        labels[i, len(tail) : len(row)] = torch.tensor(row[len(tail) :])
        mask[i, prefix_length : prefix_length + len(row)] = 1
    return inputs, labels, mask


def _forward(model: Any, input_ids: Any, *, cache: Any = None, **kwargs: Any) -> Any:
    """Call the model with a KV cache under whichever name this transformers version takes."""
    if cache is not None:
        kwargs["cache" if _takes_cache_kwarg(model) else "past_key_values"] = cache
    return model(input_ids=input_ids, **kwargs)


def _output_cache(output: Any) -> Any:
    """The KV cache of a forward pass (``cache`` in transformers 5, ``past_key_values`` before)."""
    return output["cache"] if "cache" in output else output["past_key_values"]


def _takes_cache_kwarg(model: Any) -> bool:
    import inspect

    return "cache" in inspect.signature(model.forward).parameters


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
    global _agent_name
    _agent_name = name
    config = parse_config(argv)
    Agent(config).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
