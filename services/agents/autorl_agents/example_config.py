"""The example agent's settings (``example_grpo``, and ``example_sft`` with other defaults): a
dataclass whose field help is the command-line help, and the parser built from it.

The platform also reads extra arguments from ``AUTORL_AGENT_ARGS``
(``autorl run ... --env AUTORL_AGENT_ARGS="--sft never"``); given twice, a flag's last value wins.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import types
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

#: The program name and description ``--help`` shows.
PROG = "example_grpo"
DESCRIPTION = "example_grpo: the built-in example agent. SFT warm start (when needed), then GRPO, then stop."

SftMode = Literal["auto", "always", "never"]
RolloutMode = Literal["auto", "fast", "trl"]
RlMode = Literal["grpo", "none"]


def setting(
    default: Any,
    help: str,
    *,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
) -> Any:
    """A setting: its default (a zero-argument callable is called when the config is made), its
    command-line help, and its valid range, checked when the config is made (``low <= value <=
    high``, ``value > above``; a setting left None, the model-dependent default, is not checked)."""
    metadata = {"help": help, "low": low, "high": high, "above": above}
    if callable(default):
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


#: The platform's seed of this run (``autorl run --repeat N`` gives 0..N-1), when no --seed is given.
SEED_VARIABLE = "AUTORL_SEED"


def run_seed() -> int:
    """The run's seed from ``AUTORL_SEED`` (0 where it is unset: an agent started by hand)."""
    value = os.environ.get(SEED_VARIABLE, "").strip()
    try:
        return int(value) if value else 0
    except ValueError:
        raise SystemExit(f"{SEED_VARIABLE}={value!r} is not an integer; pass --seed N") from None


@dataclass
class ExampleGRPOConfig:
    """Settings of the example agent; each field's help is its command-line help."""

    sft: SftMode = setting(
        "auto", "SFT warm start on the reference solutions: auto = when the baseline < --sft-threshold"
    )
    sft_threshold: float = setting(10.0, "baseline score (0-100) below which auto runs SFT", low=0, high=100)
    sft_epochs: int = setting(8, "SFT epochs over the train split (the budget may stop it earlier)", low=1)
    sft_learning_rate: float | None = setting(
        None, "SFT learning rate (default: 3e-3 for a tiny model, 1e-5 otherwise)", above=0
    )
    sft_batch_size: int | None = setting(
        None, "SFT examples per optimizer step (default: 32 for a tiny model, 16 otherwise)", low=1
    )
    sft_time_fraction: float = setting(
        0.7,
        "share of the remaining budget SFT takes once it has made --sft-min-steps; GRPO gets the rest",
        low=0,
        high=1,
    )
    sft_min_steps: int | None = setting(
        None,
        "SFT steps made before the time share can stop SFT, budget permitting (a slow or loaded machine "
        "gives SFT more of the budget rather than stop it short of what learns; default: 500 for a "
        "tiny model, 0 otherwise)",
        low=0,
    )
    rl: RlMode = setting("grpo", "the RL phase after SFT: grpo, or none for SFT alone")
    grpo_epochs: int = setting(1, "GRPO epochs over the train prompts", low=1)
    grpo_learning_rate: float | None = setting(
        None, "GRPO learning rate (default: 5e-5 for a tiny model, 1e-6 otherwise)", above=0
    )
    num_generations: int | None = setting(
        None, "completions per prompt, the GRPO group (default: 8 for a tiny model, 4 otherwise)", low=2
    )
    grpo_prompts_per_step: int | None = setting(
        None, "prompts per GRPO optimizer step (default: 16 for a tiny model, 2 otherwise)", low=1
    )
    rollouts: RolloutMode = setting(
        "auto",
        "GRPO generation: auto = the batched engine of fast_grpo.py on a CUDA GPU and for a tiny model "
        "(TRL's GRPOTrainer otherwise), fast = always the engine, trl = always GRPOTrainer",
    )
    max_completion_length: int | None = setting(
        None, "GRPO completion limit in tokens (default: 1.5x the longest reference solution)", low=1
    )
    max_train_problems: int | None = setting(
        None, "use only the first N train problems (default: all)", low=1
    )
    reserve_s: float = setting(
        40.0, "seconds before the deadline at which training stops to save and submit", low=0
    )
    cpu_threads: int | None = setting(
        None,
        "torch threads on a CPU (default: 1 for a tiny model, whose small steps lose more to threads "
        "waiting for a busy core than they gain; torch's own otherwise)",
        low=1,
    )
    logging_steps: int = setting(10, "log every N optimizer steps", low=1)
    seed: int = setting(
        run_seed, "seed of torch, random and sampling (default: $AUTORL_SEED, the run's seed)", low=0
    )

    def __post_init__(self) -> None:
        """Every setting within its range, else a ValueError that names the flag, the value given
        and what it must be (``parse_config`` turns it into a usage error, exit 2)."""
        for spec in fields(self):
            value = getattr(self, spec.name)
            choices = _choices(_hints()[spec.name])
            flag = "--" + spec.name.replace("_", "-")
            if choices and value not in choices:
                raise ValueError(f"`{flag}` must be one of {', '.join(choices)}, got {value!r}.")
            if value is None or isinstance(value, str):
                continue
            low, high, above = (spec.metadata.get(key) for key in ("low", "high", "above"))
            if above is not None and not value > above:
                raise ValueError(f"`{flag}` must be greater than {above:g}, got {value!r}.")
            if (low is not None and value < low) or (high is not None and value > high):
                wanted = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
                raise ValueError(f"`{flag}` must be {wanted}, got {value!r}.")


def cpu_threads(config: ExampleGRPOConfig, *, tiny: bool) -> int:
    """torch's intra-op threads on a CPU. A tiny model's step took 0.13 s on one thread and 1.3 s
    on two of a busy 2-core machine (0.39 s and 2.2 s beside two CPU-bound processes)."""
    import torch

    return config.cpu_threads or (1 if tiny else torch.get_num_threads())


@dataclass(frozen=True)
class SFTSizes:
    """The SFT settings whose defaults depend on the model's size."""

    learning_rate: float
    batch_size: int
    min_steps: int


def sft_sizes(config: ExampleGRPOConfig, *, tiny: bool) -> SFTSizes:
    """A tiny model (the builtin demo model) learns the answer format from random weights: a learning
    rate 300 times a pretrained model's, in batches twice as large."""
    return SFTSizes(
        learning_rate=config.sft_learning_rate or (3e-3 if tiny else 1e-5),
        batch_size=config.sft_batch_size or (32 if tiny else 16),
        # The tiny model answers about half of arith after ~430 steps of 32 and nearly all after ~600;
        # 500 is about the default 8 epochs of its train split.
        min_steps=config.sft_min_steps if config.sft_min_steps is not None else (500 if tiny else 0),
    )


@dataclass(frozen=True)
class GRPOSizes:
    """The GRPO settings whose defaults depend on the model's size."""

    learning_rate: float
    num_generations: int
    prompts_per_step: int


def grpo_sizes(config: ExampleGRPOConfig, *, tiny: bool) -> GRPOSizes:
    """A tiny model (the builtin demo model) learns from more prompts a step at a smaller learning
    rate than the reference's 2 x 4 at 5e-4: measured side by side on 2 cores each
    (bench/demo_cpu.py), 5e-4 undid most of what SFT had reached, 5e-5 with 16 x 8 added to it."""
    return GRPOSizes(
        learning_rate=config.grpo_learning_rate or (5e-5 if tiny else 1e-6),
        num_generations=config.num_generations or (8 if tiny else 4),
        prompts_per_step=config.grpo_prompts_per_step or (16 if tiny else 2),
    )


#: Fields whose default is computed when the config is made (from the environment).
_COMPUTED = frozenset(spec.name for spec in fields(ExampleGRPOConfig) if spec.default_factory is not MISSING)


def _hints() -> dict[str, Any]:
    """The fields' annotations, resolved (this module postpones annotations)."""
    return get_type_hints(ExampleGRPOConfig)


def _without_none(annotation: Any) -> Any:
    """``X | None`` → ``X``; anything else unchanged."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _choices(annotation: Any) -> tuple[Any, ...]:
    """A Literal's values (after ``| None``), else none."""
    annotation = _without_none(annotation)
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def _arg_type(annotation: Any) -> Any:
    """The command-line type of a field, from its annotation: int, float or str (Literal choices)."""
    annotation = _without_none(annotation)
    if annotation in (int, float, str):
        return annotation
    choices = _choices(annotation)
    if choices and all(isinstance(choice, str) for choice in choices):
        return str
    raise TypeError(f"no command-line type for {annotation!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    hints = _hints()
    for spec in fields(ExampleGRPOConfig):
        flag = "--" + spec.name.replace("_", "-")
        default = spec.default if spec.default is not MISSING else None
        # A default computed at start (the seed) is said in the help itself.
        shown = "" if spec.default is MISSING else f" (default: {default})"
        kwargs: dict[str, Any] = {"default": default, "help": f"{spec.metadata['help']}{shown}"}
        choices = _choices(hints[spec.name]) or None
        parser.add_argument(flag, type=_arg_type(hints[spec.name]), choices=choices, **kwargs)
    return parser


def parse_config(argv: Sequence[str] | None = None) -> ExampleGRPOConfig:
    args = list(sys.argv[1:] if argv is None else argv)
    args += shlex.split(os.environ.get("AUTORL_AGENT_ARGS", ""))
    parser = build_parser()
    values = vars(parser.parse_args(args))
    # Not given: the field's own default (the run's AUTORL_SEED); an explicit --seed wins.
    given = {name: value for name, value in values.items() if value is not None or name not in _COMPUTED}
    try:
        return ExampleGRPOConfig(**given)
    except ValueError as exc:
        parser.error(str(exc))  # exits 2 with the usage line
