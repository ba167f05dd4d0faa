"""`autorl controller` (the kopf operator) and `autorl run` (the single-machine backend)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from autorl_controller.local.cli import register_run
    from autorl_controller.operator.cli import register_controller

    register_run(sub)
    register_controller(sub)
