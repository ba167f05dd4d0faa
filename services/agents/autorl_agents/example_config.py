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
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, get_args

#: The program name and description ``--help`` shows.
PROG = "example_grpo"
DESCRIPTION = "example_grpo: the built-in example agent. SFT warm start (when needed), then GRPO, then stop."

SftMode = Literal["auto", "always", "never"]
RolloutMode = Literal["auto", "fast", "trl"]
RlMode = Literal["grpo", "none"]
#: Fields whose values are limited to a Literal's choices.
_CHOICES: dict[str, tuple[str, ...]] = {
    "sft": get_args(SftMode),
    "rl": get_args(RlMode),
    "rollouts": get_args(RolloutMode),
}


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
        default=None, metadata={"help": "GRPO learning rate (default: 5e-5 for a tiny model, 1e-6 otherwise)"}
    )
    num_generations: int | None = field(
        default=None,
        metadata={
            "help": "completions per prompt, the GRPO group (default: 8 for a tiny model, 4 otherwise)"
        },
    )
    grpo_prompts_per_step: int | None = field(
        default=None,
        metadata={"help": "prompts per GRPO optimizer step (default: 16 for a tiny model, 2 otherwise)"},
    )
    rollouts: RolloutMode = field(
        default="auto",
        metadata={
            "help": "GRPO generation: auto = the batched engine of fast_grpo.py on a CUDA GPU and for a "
            "tiny model (TRL's GRPOTrainer otherwise), fast = always the engine, trl = always GRPOTrainer"
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
    seed: int = field(
        default_factory=run_seed,
        metadata={"help": "seed of torch, random and sampling (default: $AUTORL_SEED, the run's seed)"},
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    for spec in fields(ExampleGRPOConfig):
        flag = "--" + spec.name.replace("_", "-")
        default = spec.default if spec.default is not MISSING else None
        kind = _arg_type(spec.type)
        # A default computed at start (the seed) is said in the help itself.
        shown = "" if spec.default is MISSING else f" (default: {default})"
        kwargs: dict[str, Any] = {"default": default, "help": f"{spec.metadata['help']}{shown}"}
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
    values = vars(build_parser().parse_args(args))
    # Not given: the field's own default (the run's AUTORL_SEED); an explicit --seed wins.
    given = {name: value for name, value in values.items() if value is not None or name not in _COMPUTED}
    return ExampleGRPOConfig(**given)
