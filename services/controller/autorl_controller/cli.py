"""`autorl controller`: the kopf operator."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from autorl_controller.operator.cli import register_controller

    register_controller(sub)
