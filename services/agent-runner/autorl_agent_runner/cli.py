"""``autorl agent-runner``: run one agent in its workspace under the experiment's time budget.

This is the agent pod's entry point in Kubernetes, so the run's flags also read environment
variables (the contract's own names where there is one): with ``GRADING_SERVER_URL``,
``WORKSPACE``, ``TASK`` and ``BASE_MODEL`` set, ``autorl agent-runner --agent example_grpo`` is
enough. ``autorl run`` launches its agent through the same function (:mod:`autorl_agent_runner.launch`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

from autorl.cli import EXIT_INTERRUPTED, UsageError, check_seconds
from autorl.errors import AutoRLError
from autorl.protocol.feedback import FEEDBACK_MODES, Feedback
from autorl_agent_runner.flags import path_flag

#: Exit status after SIGTERM to the runner itself (128 + 15, as a shell reports it).
EXIT_TERMINATED = 143


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


_GROUP_READABLE_HELP = (
    "keep everything under the workspace readable by its group (the grader reads submissions through "
    "it), whatever modes the agent's writers use; run as the agent's user with the workspace's group as "
    "the process's group"
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "agent-runner",
        help="run one agent in its workspace under a time budget (the agent pod's entry point)",
        description="Create the workspace if needed, start the agent with exactly the contract's "
        "environment, keep run_meta.json and scores.json fresh, end every agent process at the deadline.",
    )
    parser.add_argument(
        "--agent",
        "-a",
        default=_env("AUTORL_AGENT"),
        help="built-in name, agent folder (config.yaml + start script) or executable path",
    )
    parser.add_argument("--workspace", type=path_flag, default=_env("WORKSPACE"), help="the run's workspace")
    parser.add_argument("--task", "-t", default=_env("TASK"), help="task name (env TASK)")
    parser.add_argument("--base-model", default=_env("BASE_MODEL"), help="base model source (env BASE_MODEL)")
    parser.add_argument(
        "--model-dir",
        type=path_flag,
        default=_env("AUTORL_BASE_MODEL_DIR"),
        help="prepared base model folder, linked into models/ when the workspace is new",
    )
    parser.add_argument(
        "--data-dir",
        type=path_flag,
        default=_env("AUTORL_TRAIN_DATA_DIR"),
        help="folder with the train split, copied into data/ when the workspace is new",
    )
    parser.add_argument("--grading-url", default=_env("GRADING_SERVER_URL"), help="env GRADING_SERVER_URL")
    parser.add_argument("--token", default=_env("AUTORL_TOKEN"), help="env AUTORL_TOKEN")
    parser.add_argument("--run-id", default=_env("AUTORL_RUN_ID"), help="the run this workspace belongs to")
    parser.add_argument(
        "--timeout", type=float, default=None, help="budget in seconds when the grader reports none"
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME[=VALUE]", help="pass a variable to the agent"
    )
    parser.add_argument(
        "--sandbox", choices=("auto", "user", "bwrap", "none"), default=_env("AUTORL_SANDBOX") or "auto"
    )
    parser.add_argument("--grace-period", type=float, default=30.0, help="seconds from SIGTERM to SIGKILL")
    parser.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an argument appended to the agent's command (repeat for more; write --agent-arg=-x for "
        "one that starts with '-')",
    )
    parser.add_argument(
        "--echo-output",
        action="store_true",
        help="copy the agent's output to stdout as well as agent.log (a pod's kubectl logs)",
    )
    parser.set_defaults(func=_run)
    steps = parser.add_subparsers(dest="step", metavar="STEP", required=False)
    prepare = steps.add_parser(
        "prepare",
        help="fill the cache with the base model and train split, and lay out the workspace",
        description="Idempotent: the model is built or downloaded once into AUTORL_CACHE_DIR/models, the "
        "train split once into AUTORL_CACHE_DIR/data/<task>; the workspace is created or completed. "
        "The Kubernetes prepare Job runs this before the agent pod starts.",
    )
    # Each may also come before ``prepare`` (agent-runner's own --task, --base-model, --workspace).
    prepare.add_argument("--task", "-t", dest="prepare_task", default=None, help="task name (required)")
    prepare.add_argument(
        "--model", "-m", dest="prepare_model", default=None, help="base model source (required)"
    )
    prepare.add_argument(
        "--workspace", dest="prepare_workspace", type=path_flag, default=None, help="the workspace (required)"
    )
    prepare.add_argument("--timeout", dest="prepare_timeout", type=float, default=0.0, help="budget (s)")
    prepare.add_argument("--run-id", dest="prepare_run_id", default=None, help="default: workspace name")
    prepare.add_argument(
        "--feedback",
        dest="prepare_feedback",
        choices=FEEDBACK_MODES,
        default=Feedback.TEST.value,
        help="sealed: the workspace's train split leaves out the validation split (docs/PROTOCOL.md)",
    )
    prepare.add_argument(
        "--step",
        dest="prepare_step",
        choices=("all", "cache", "workspace"),
        default="all",
        help="cache: the model, the train split and the folder holding the workspace (the platform's "
        "user); workspace: the workspace alone, owned by the experiment's user, with the cached model "
        "mounted over models/<base> later; all: both, as one user (default)",
    )
    prepare.add_argument(
        "--group",
        dest="prepare_group",
        type=int,
        default=None,
        help="workspace step: the group that may read the workspace (mode 2750), the platform's",
    )
    prepare.add_argument(
        "--model-dir",
        dest="prepare_model_dir",
        type=path_flag,
        default=None,
        help="workspace step: the cached model folder (read-only there; nothing is downloaded)",
    )
    prepare.set_defaults(func=_prepare)
    mirror = steps.add_parser(
        "mirror",
        help="keep run_meta.json and scores.json fresh until SIGTERM (a custom agent's sidecar)",
        description="Beside an agent the runner does not start (a custom image in Kubernetes): copy the "
        "grader's budget and scores into the workspace every few seconds; on SIGTERM, once more, then "
        "exit. With --group-readable, also keep the workspace readable by its group. Reads "
        "GRADING_SERVER_URL, AUTORL_TOKEN, WORKSPACE and BASE_MODEL.",
    )
    mirror.add_argument("--workspace", dest="mirror_workspace", type=path_flag, default=_env("WORKSPACE"))
    mirror.add_argument(
        "--interval", dest="mirror_interval", type=float, default=10.0, help="seconds between refreshes"
    )
    mirror.add_argument(
        "--group-readable",
        dest="mirror_group_readable",
        action="store_true",
        help=_GROUP_READABLE_HELP,
    )
    mirror.set_defaults(func=_mirror)
    group_read = steps.add_parser(
        "group-read",
        help="keep the workspace readable by its group until SIGTERM (a built-in agent's sidecar)",
        description="Beside an agent in Kubernetes: every second, add group-read (group-search on "
        "folders) to what the agent's user wrote under the workspace, so that the grader, in the "
        "workspace's group, can read its checkpoints; on SIGTERM, once more, then exit. Run as the "
        "agent's user with the workspace's group as the process's group (a folder chmodded by a user "
        "outside its group loses its setgid bit).",
    )
    group_read.add_argument(
        "--workspace", dest="group_read_workspace", type=path_flag, default=_env("WORKSPACE")
    )
    group_read.set_defaults(func=_group_read)


def _mirror(args: argparse.Namespace) -> int:
    import threading

    from autorl.client import GradingClient
    from autorl.models.sources import model_dir_name
    from autorl_agent_runner.workspace.group_read import GroupReadKeeper
    from autorl_agent_runner.workspace.layout import Workspace
    from autorl_agent_runner.workspace.mirrors import keep_mirrors_fresh

    grading_url, token, base_model = _env("GRADING_SERVER_URL"), _env("AUTORL_TOKEN"), _env("BASE_MODEL")
    if not (args.mirror_workspace and grading_url and token and base_model):
        raise UsageError(
            "mirror needs --workspace (or WORKSPACE), GRADING_SERVER_URL, AUTORL_TOKEN and BASE_MODEL"
        )
    check_seconds("--interval", args.mirror_interval, example=10)
    workspace = Workspace(args.mirror_workspace.absolute(), model_dir_name(base_model))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    keeper = GroupReadKeeper(workspace.root).start() if args.mirror_group_readable else None
    try:
        with GradingClient(grading_url, token) as client:
            keep_mirrors_fresh(workspace, client, stop, interval_s=args.mirror_interval)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        if keeper is not None:
            keeper.stop()
    return 0


def _group_read(args: argparse.Namespace) -> int:
    import threading

    from autorl_agent_runner.workspace.group_read import GroupReadKeeper

    if not args.group_read_workspace:
        raise UsageError("group-read needs --workspace (or WORKSPACE)")
    workspace = args.group_read_workspace.absolute()
    if not workspace.is_dir():
        raise UsageError(f"--workspace {workspace} is not a folder")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    keeper = GroupReadKeeper(workspace).start()
    try:
        stop.wait()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        keeper.stop()
    return 0


def _prepare_inputs(args: argparse.Namespace) -> tuple[str, str, Path]:
    """prepare's task, model and workspace: given after ``prepare``, else before it (agent-runner's
    --task, --base-model, --workspace, or their environment variables)."""
    task = args.prepare_task or args.task
    model = args.prepare_model or args.base_model
    root = args.prepare_workspace or args.workspace
    missing = [
        flag for flag, value in (("--task", task), ("--model", model), ("--workspace", root)) if not value
    ]
    if missing:
        them = "it" if len(missing) == 1 else "them"
        raise UsageError(
            f"prepare needs {', '.join(missing)}: pass {them} after prepare, e.g. autorl agent-runner "
            "prepare --task gsm8k --model Qwen/Qwen2.5-0.5B --workspace /experiments/NAME"
        )
    return task, model, root


def _prepare(args: argparse.Namespace) -> int:
    from autorl.errors import ModelSourceError, ModelSourceUnreachableError, UnknownTaskError
    from autorl.models.sources import model_dir_name, reference_model_subpath, resolve_model
    from autorl.tasks import get_task
    from autorl.tasks.base import write_agent_train
    from autorl_agent_runner.settings import AgentRunnerSettings
    from autorl_agent_runner.workspace.layout import check_workspace_free, create_workspace
    from autorl_agent_runner.workspace.ownership import claim_workspace, open_experiments_folder

    task_name, model, given_root = _prepare_inputs(args)
    check_seconds("--timeout", args.prepare_timeout, example=3600, zero=True)
    if args.prepare_step == "workspace" and (args.prepare_group is None or args.prepare_model_dir is None):
        raise UsageError("--step workspace needs --group (the platform's group) and --model-dir")
    try:
        task = get_task(task_name)
    except UnknownTaskError as exc:
        raise UsageError(str(exc)) from exc
    settings = AgentRunnerSettings()
    root: Path = given_root.absolute()
    run_id = args.prepare_run_id or args.run_id or root.name
    if args.prepare_step != "cache":  # before the cache is filled: an unusable workspace is refused at once
        try:
            check_workspace_free(root, run_id)
        except AutoRLError as exc:
            raise UsageError(str(exc)) from exc
    if args.prepare_step == "workspace":
        claim_workspace(root, args.prepare_group)
        base_dir: Path = args.prepare_model_dir
        train_dir = settings.data_dir / task.name
    else:
        print(f"preparing {model} in {settings.models_dir}", file=sys.stderr, flush=True)
        try:
            base_dir = resolve_model(model, settings.models_dir)
        except ModelSourceUnreachableError:
            raise  # exit code 1: the Job tries again, the hub may answer then
        except ModelSourceError as exc:
            # Exit code 2, which fails the Job at once (its podFailurePolicy): no retry will find it.
            raise UsageError(str(exc)) from exc
        print(f"preparing the {task.name} train split in {settings.data_dir}", file=sys.stderr, flush=True)
        train_dir = task.download_train_data(
            settings.data_dir / task.name, source_dir=settings.data_source_dir
        ).parent
        if args.prepare_step == "cache":
            open_experiments_folder(root.parent)
            print(f"cache ready; {root.parent} takes the workspace", file=sys.stderr, flush=True)
            return 0
    with tempfile.TemporaryDirectory(prefix="autorl-train-") as scratch:
        if args.prepare_feedback == Feedback.SEALED:
            # The cache is read-only here: the agent's train split, without the validation split
            # its submissions are scored on, is written aside and copied into the workspace.
            train_dir = write_agent_train(train_dir / "train.jsonl", Path(scratch)).parent
        workspace = create_workspace(
            root,
            run_id=run_id,
            task_name=task.name,
            description=task.description(),
            base_model_dir=base_dir,
            base_model_name=model_dir_name(model),
            reference_model_subpath=reference_model_subpath(model),
            train_data_dir=train_dir,
            timeout_s=args.prepare_timeout,
            model_mounted=args.prepare_step == "workspace",
            feedback=Feedback(args.prepare_feedback),
        )
    print(f"workspace ready: {workspace.root}", file=sys.stderr, flush=True)
    return 0


def _run(args: argparse.Namespace) -> int:
    from autorl.client import GradingClient
    from autorl.models.sources import model_dir_name, reference_model_subpath
    from autorl.tasks import get_task
    from autorl_agent_runner.launch import AgentLaunch, launch_agent, links_base_model, resolve_launch_agent
    from autorl_agent_runner.sandbox.environment import declared_env, gpu_driver_env
    from autorl_agent_runner.sandbox.plan import SandboxMode
    from autorl_agent_runner.settings import AgentRunnerSettings
    from autorl_agent_runner.workspace.layout import RUN_MARKER_FILE, Workspace, create_workspace

    missing = [
        flag
        for flag, value in (
            ("--agent", args.agent),
            ("--workspace", args.workspace),
            ("--task", args.task),
            ("--base-model", args.base_model),
            ("--grading-url", args.grading_url),
        )
        if not value
    ]
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (or the matching environment variables)")
    if args.timeout is not None:
        check_seconds("--timeout", args.timeout, example=3600)
    check_seconds("--grace-period", args.grace_period, example=30, zero=True)
    settings = AgentRunnerSettings()
    sandbox = SandboxMode(args.sandbox)
    try:
        resolved = resolve_launch_agent(
            args.agent, args.env, os.environ, sandbox, settings, extra_args=args.agent_arg
        )
        task = get_task(args.task)
        declared, refused = declared_env(os.environ)
    except AutoRLError as exc:
        raise UsageError(str(exc)) from exc
    for name in refused:
        print(
            f"agent-runner: {name} is not passed to the agent: the platform sets it or keeps it to "
            "itself; rename the variable in the Experiment's env or envFrom",
            file=sys.stderr,
        )
    base_name = model_dir_name(args.base_model)
    root: Path = args.workspace.absolute()
    if (root / RUN_MARKER_FILE).exists() and (root / "models" / base_name).exists():
        workspace = Workspace(root.resolve(), base_name)
    else:
        if args.model_dir is None or args.data_dir is None:
            raise UsageError(
                f"workspace {root} is not prepared; pass --model-dir and --data-dir to create it"
            )
        workspace = create_workspace(
            root,
            run_id=args.run_id or root.name,
            task_name=task.name,
            description=task.description(),
            base_model_dir=args.model_dir,
            base_model_name=base_name,
            reference_model_subpath=reference_model_subpath(args.base_model),
            train_data_dir=args.data_dir,
            timeout_s=args.timeout or 0.0,
            link_model=links_base_model(sandbox),
        )
    launch = AgentLaunch(
        agent=resolved.agent,
        task=task.name,
        base_model=args.base_model,
        sandbox=sandbox,
        passed_env={**declared, **resolved.passed_env},
        platform_env=gpu_driver_env(os.environ),
        grace_period_s=args.grace_period,
        timeout_s=args.timeout,
        echo_output=args.echo_output,
    )
    with GradingClient(args.grading_url, args.token) as client:
        runner = launch_agent(
            launch,
            workspace,
            grading_server_url=args.grading_url,
            token=args.token or "",
            client=client,
            settings=settings,
        )
        terminated = False

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            nonlocal terminated
            terminated = True
            runner.stop()

        previous = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            outcome = runner.run()
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        finally:
            signal.signal(signal.SIGTERM, previous)
    print(
        f"agent {resolved.agent.name}: exit code {outcome.exit_code}, "
        f"{'ended at the deadline' if outcome.timed_out else 'finished'}",
        file=sys.stderr,
    )
    if terminated:
        return EXIT_TERMINATED
    if outcome.timed_out:
        return 0
    return outcome.exit_code or 0
