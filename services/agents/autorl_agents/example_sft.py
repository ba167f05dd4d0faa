"""example_sft: supervised fine-tuning alone, the baseline that ``example_grpo`` is compared with.

The same agent as ``example_grpo`` (same prompts, model, SFT loop and checkpoints) with its RL
phase switched off: SFT on the train split's reference solutions for the whole budget, submitted
after each epoch. Run both on one task, model and budget, and ``autorl results --compare`` shows
what GRPO adds over what SFT alone reaches.

Settings are example_grpo's (``--help``); these defaults differ: ``--sft always
--sft-time-fraction 1 --rl none``. Arguments given (or in ``AUTORL_AGENT_ARGS``) override them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from autorl_agents.example_grpo import main as run_example_agent

NAME = "example_sft"
#: Put before the caller's arguments: argparse keeps the last value of a flag given twice.
SFT_ONLY_ARGS = ("--sft", "always", "--sft-time-fraction", "1", "--rl", "none")


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    return run_example_agent([*SFT_ONLY_ARGS, *given], name=NAME)


if __name__ == "__main__":
    raise SystemExit(main())
