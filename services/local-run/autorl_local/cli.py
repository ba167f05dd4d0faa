"""``autorl run``: one experiment on this machine, from preparation to the results row."""

from __future__ import annotations

import argparse
import signal

from autorl.cli import UsageError, check_port, check_seconds
from autorl.experiment import MAX_INT32
from autorl.protocol.feedback import FEEDBACK_MODES, Feedback
from autorl_agent_runner.flags import check_at_most, check_not_empty, path_flag

DEFAULT_PORT = 8000
#: Local evaluator processes: each loads a model, so more than a machine's GPUs and cores can serve
#: is a typo, which would start that many processes.
MAX_WORKERS = 64
#: Runs of one ``--repeat``, each with its own workspace, services and results row.
MAX_REPEATS = 1000


def _gpu_list(text: str) -> str:
    """``0,1`` or ``none``; returned in CUDA_VISIBLE_DEVICES form."""
    value = text.strip().lower()
    if value in {"none", ""}:
        return ""
    parts = [part.strip() for part in value.split(",")]
    if not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1 or none, not {text!r}")
    return ",".join(parts)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run one experiment on this machine (prepare, baseline, agent, scoring, results row)",
        description="Prepare the model and data, measure the baseline, run the agent under a time "
        "budget, score what it submits and append a row to $AUTORL_HOME/results.csv.",
    )
    parser.add_argument(
        "--agent",
        "-a",
        required=True,
        help="a built-in agent name, an agent folder (config.yaml + start script) or an executable's path",
    )
    parser.add_argument("--task", "-t", required=True, help="benchmark task, e.g. gsm8k or arith")
    parser.add_argument(
        "--model", "-m", required=True, help="base model: hub id, local folder or builtin:tiny-qwen2"
    )
    parser.add_argument("--timeout", type=float, required=True, help="the agent's time budget in seconds")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="grader port on 127.0.0.1")
    parser.add_argument(
        "--workspace",
        type=path_flag,
        default=None,
        help="the run's workspace (default $AUTORL_HOME/runs/RUN_ID/workspace)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="pass a variable to the agent (repeatable); NAME alone copies it from this environment",
    )
    parser.add_argument(
        "--env-file",
        type=path_flag,
        default=None,
        metavar="FILE",
        help="pass the variables of a .env file (LLM API keys) to the agent, and nothing else of this "
        "environment; --env wins over it",
    )
    parser.add_argument(
        "--backend", choices=("hf", "opencompass"), default="hf", help="evaluation backend (default hf)"
    )
    parser.add_argument(
        "--agent-gpus",
        type=_gpu_list,
        default=None,
        metavar="IDS",
        help="GPUs the agent sees, e.g. 0 or none",
    )
    parser.add_argument(
        "--eval-gpus", type=_gpu_list, default=None, metavar="IDS", help="GPUs the evaluator uses, e.g. 1"
    )
    parser.add_argument("--workers", type=int, default=1, help="local evaluator worker processes")
    parser.add_argument(
        "--finish-wait",
        type=float,
        default=600.0,
        help="seconds to wait for evaluations in flight at the end",
    )
    parser.add_argument(
        "--grace-period", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL at the deadline"
    )
    parser.add_argument(
        "--sandbox",
        choices=("auto", "user", "bwrap", "none"),
        default="auto",
        help="agent isolation: auto (user when root, else bwrap; none with a warning where bubblewrap "
        "cannot run), user (bubblewrap as a user id of the run's own), bwrap, none",
    )
    parser.add_argument(
        "--egress",
        action="store_true",
        help="let the sandboxed agent reach the internet (an outside LLM API): public addresses only, never "
        "this machine's addresses, private (10/8, 172.16/12, 192.168/16), CGNAT (100.64/10), link-local or "
        "other non-public ranges, unless --egress-allow names them",
    )
    parser.add_argument(
        "--egress-allow",
        action="append",
        default=[],
        metavar="CIDR",
        help="with --egress, also let the agent reach this address or network, e.g. 192.168.1.0/24 for an "
        "LLM server on your network (repeatable)",
    )
    parser.add_argument(
        "--feedback",
        choices=FEEDBACK_MODES,
        default=Feedback.TEST.value,
        help="test: every submission scored on the test split (the reference's way); sealed: on a "
        "validation split held out of the agent's train data, and one checkpoint (the agent's "
        "nomination, else the best on validation) evaluated on test once at the end (docs/PROTOCOL.md)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run N experiments one after another with seeds 0..N-1 (the agent's AUTORL_SEED), each its "
        "own run and results row; compare them with autorl results --compare (default 1)",
    )
    parser.add_argument(
        "--known-checkpoint",
        action="append",
        default=[],
        metavar="MODEL",
        help="a public checkpoint of the base's family (folder or hub id; repeat for more): a scored "
        "submission nearer it than the base is named in results.csv lineage (docs/PROTOCOL.md)",
    )
    parser.add_argument("--driver-model", default=None, help="the LLM driving an LLM agent, for results.csv")
    parser.add_argument("--max-submissions", type=int, default=None, help="per-experiment submission limit")
    parser.set_defaults(func=_run)


#: The grader keeps ids and limits in 32-bit integers.
MAX_SUBMISSIONS_LIMIT = MAX_INT32


def check_numbers(args: argparse.Namespace) -> None:
    """Refuse a number that cannot work before anything starts, naming the flag and the fix."""
    check_seconds("--timeout", args.timeout, example=3600)
    check_port("--port", args.port)
    check_at_most("--workers", args.workers, MAX_WORKERS, "evaluator processes on this machine")
    check_seconds("--finish-wait", args.finish_wait, example=600, zero=True)
    check_seconds("--grace-period", args.grace_period, example=30, zero=True)
    if not 1 <= args.repeat <= MAX_REPEATS:
        raise UsageError(
            f"--repeat must be from 1 to {MAX_REPEATS} (the number of runs, with seeds 0 to N-1), not "
            f"{args.repeat}; leave it out for one run"
        )
    limit = args.max_submissions
    if limit is not None and not 1 <= limit <= MAX_SUBMISSIONS_LIMIT:
        raise UsageError(
            f"--max-submissions must be from 1 to {MAX_SUBMISSIONS_LIMIT} (the number of submissions the "
            f"agent may make), not {limit}; leave it out for the default of 100"
        )


def check_egress(args: argparse.Namespace) -> None:
    """Refuse an ``--egress-allow`` that cannot work; replace each value by its network."""
    if args.egress_allow and not args.egress:
        raise UsageError(
            "--egress-allow opens destinations of --egress, which is off; add --egress, or drop "
            "--egress-allow to keep the agent on the grader alone"
        )
    from autorl_agent_runner.sandbox.egress import EgressError, allowed_network

    try:
        args.egress_allow = [allowed_network(text) for text in args.egress_allow]
    except EgressError as exc:
        raise UsageError(str(exc)) from exc


def take_ctrl_c() -> None:
    """Ctrl-C stops a run, however it was started: a parent that ignores SIGINT (a shell's background
    job, a test runner's worker) would otherwise leave the run deaf to it until its deadline, since
    an ignored signal stays ignored across exec and Python then installs no handler."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _run(args: argparse.Namespace) -> int:
    from autorl.runs.seeds import RunSeed
    from autorl_local.experiment import LocalRunConfig, run_experiment
    from autorl_local.repeats import check_workspaces_free, repeat_workspaces, run_repeats
    from autorl_local.settings import RunSettings

    check_not_empty(agent=args.agent, model=args.model, task=args.task)
    for checkpoint in args.known_checkpoint:
        check_not_empty(known_checkpoint=checkpoint)
    check_numbers(args)
    check_egress(args)
    take_ctrl_c()
    env = list(args.env)
    if args.env_file is not None:
        from autorl.errors import AutoRLError
        from autorl_agent_runner.env_file import env_file_items

        try:
            env = [*env_file_items(args.env_file), *env]
        except AutoRLError as exc:
            raise UsageError(str(exc)) from exc
    workspaces = repeat_workspaces(args.workspace, args.repeat)
    if args.repeat > 1:
        check_workspaces_free(workspaces)
    configs = [
        LocalRunConfig(
            agent=args.agent,
            task=args.task,
            model=args.model,
            timeout_s=args.timeout,
            port=args.port,
            workspace=workspaces[seed],
            env=env,
            backend=args.backend,
            agent_gpus=args.agent_gpus,
            eval_gpus=args.eval_gpus,
            workers=args.workers,
            finish_wait_s=args.finish_wait,
            grace_period_s=args.grace_period,
            sandbox=args.sandbox,
            egress=args.egress,
            egress_allow=tuple(args.egress_allow),
            driver_model=args.driver_model,
            max_submissions=args.max_submissions,
            feedback=Feedback(args.feedback),
            known_checkpoints=tuple(args.known_checkpoint),
            seed=RunSeed(seed, repeat=seed + 1, repeats=args.repeat),
        )
        for seed in range(args.repeat)
    ]
    if len(configs) == 1:
        return run_experiment(configs[0], RunSettings())
    return run_repeats(configs)
