"""``autorl controller``: run the Kubernetes operator, or print the CRD it serves."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re

from autorl.crd import render_crd_yaml


def register_controller(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "controller",
        help="run the Kubernetes operator that turns Experiment objects into Jobs",
        description="Watch Experiment objects (autorl.io/v1alpha1) and run each one as Jobs: prepare, "
        "baseline, agent, scoring. Settings come from AUTORL_* variables (see the Helm chart).",
    )
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=None,
        metavar="NS",
        help="watch only this namespace (repeatable; default: AUTORL_WATCH_NAMESPACES, else all)",
    )
    parser.add_argument(
        "--print-crd", action="store_true", help="print the CustomResourceDefinition and exit"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    parser.set_defaults(func=_run)


#: A Kubernetes namespace's name: a DNS-1123 label.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def check_namespaces(namespaces: list[str], source: str) -> None:
    """Refuse a namespace no cluster can have (a :class:`UsageError` naming ``source``)."""
    from autorl.cli import UsageError

    for namespace in namespaces:
        if not _DNS_LABEL.fullmatch(namespace):
            raise UsageError(
                f"{source}: {namespace!r} is not a namespace name (a DNS-1123 label: at most 63 lowercase "
                "letters, digits and '-', starting and ending with a letter or digit); name an existing "
                "namespace, such as autorl"
            )


def _run(args: argparse.Namespace) -> int:
    if args.print_crd:
        print(render_crd_yaml(), end="")
        return 0
    from autorl.untrusted_text import log_printable_lines
    from autorl_controller.operator.handlers.login import check_credentials
    from autorl_controller.operator.main import run_operator
    from autorl_controller.operator.settings import ControllerSettings

    if args.namespace is not None:
        check_namespaces(args.namespace, "-n/--namespace")
    settings = ControllerSettings()
    if args.namespace is not None:
        settings = settings.model_copy(update={"watch_namespaces": args.namespace})
    else:
        check_namespaces(settings.watch_namespaces, "AUTORL_WATCH_NAMESPACES")
    check_credentials(settings)
    log_printable_lines(
        logging.DEBUG if args.verbose else logging.INFO,
        "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    asyncio.run(run_operator(settings))
    return 0
