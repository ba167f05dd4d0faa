"""The agent runner's pure parts: workspace layout, the agent's environment, agent resolution,
the sandbox's mount plan, and the example agent's settings."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from autorl.models.sources import reference_model_subpath
from autorl.tasks import get_task
from autorl_agent_runner.agent_command import AgentNotFoundError, resolve_agent
from autorl_agent_runner.sandbox.environment import (
    CONTRACT_VARIABLES,
    RUN_MARKER_VARIABLE,
    AgentEnvError,
    ContractValues,
    build_agent_env,
    parse_env_items,
)
from autorl_agent_runner.sandbox.plan import SandboxMode, SandboxRequest, can_share_base_model, plan_sandbox
from autorl_agent_runner.sandbox.python_env import PythonEnv
from autorl_agent_runner.workspace.layout import (
    WorkspaceError,
    check_workspace_free,
    create_workspace,
    is_read_only_tree,
    remove_workspace,
)
from autorl_agents import example_sft
from autorl_agents.example_config import ExampleGRPOConfig, build_parser, parse_config
from autorl_agents.sft import common_prefix_length, sft_target
from tests.support.workspaces import arith_workspace


@pytest.fixture
def train_dir(tmp_path: Path) -> Path:
    return get_task("arith").download_train_data(tmp_path / "data").parent


def make(root: Path, base: Path, train: Path, run_id: str = "run-1") -> object:
    return arith_workspace(root, base, train, run_id=run_id, timeout_s=120, max_submissions=7)


def test_workspace_layout_and_read_only_parts(tmp_path: Path, tiny_base_model: Path, train_dir: Path) -> None:
    workspace = make(tmp_path / "ws", tiny_base_model, train_dir)
    root = tmp_path / "ws"
    names = {p.name for p in root.iterdir()}
    assert {
        "code",
        "output",
        "models",
        "data",
        "description.md",
        "instructions.md",
        "run_meta.json",
        "scores.json",
    } <= names
    assert (root / "models" / "tiny-qwen2" / "config.json").is_file()
    assert [p.name for p in (root / "data").iterdir()] == ["train.jsonl"]
    assert is_read_only_tree(root / "models") and is_read_only_tree(root / "data")
    assert os.access(root / "output", os.W_OK)
    meta = json.loads((root / "run_meta.json").read_text())
    assert meta == {
        "start_time": None,
        "timeout_s": 120,
        "last_submit_time": None,
        "end_time": None,
        "deadline": None,
    }
    instructions = (root / "instructions.md").read_text()
    assert "merge_and_unload()" in instructions and "120 seconds" in instructions
    assert "`deadline` is your budget's end and `end_time` is null until your run has ended" in instructions
    assert "at most 7 submissions" in instructions
    assert workspace is not None


def test_hard_linked_model_is_read_only_in_the_cache_too(
    tmp_path: Path, tiny_base_model: Path, train_dir: Path
) -> None:
    task = get_task("arith")
    create_workspace(
        tmp_path / "ws",
        run_id="r",
        task_name="arith",
        description=task.description(),
        base_model_dir=tiny_base_model,
        base_model_name="tiny-qwen2",
        train_data_dir=train_dir,
        timeout_s=60,
        link_model=True,
    )
    linked = tmp_path / "ws" / "models" / "tiny-qwen2" / "model.safetensors"
    assert linked.stat().st_ino == (tiny_base_model / "model.safetensors").stat().st_ino
    assert not linked.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


def test_non_empty_workspace_refused_unless_it_is_this_runs(
    tmp_path: Path, tiny_base_model: Path, train_dir: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    check_workspace_free(empty, "run-1")
    make(tmp_path / "ws", tiny_base_model, train_dir, run_id="run-1")
    check_workspace_free(tmp_path / "ws", "run-1")
    with pytest.raises(WorkspaceError, match=r"not empty.*--workspace"):
        check_workspace_free(tmp_path / "ws", "run-2")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(WorkspaceError, match="not empty"):
        make(foreign, tiny_base_model, train_dir)


def contract(tmp_path: Path) -> ContractValues:
    return ContractValues(
        grading_server_url="http://127.0.0.1:9/a/tok",
        token="tok",
        task="arith",
        base_model="builtin:tiny-qwen2",
        model_path=tmp_path / "models" / "tiny-qwen2",
        data_path=tmp_path / "data",
        output_dir=tmp_path / "output",
        workspace=tmp_path,
    )


def test_every_variable_the_agents_guide_promises_is_set_by_the_contract() -> None:
    """docs/AGENTS.md's table of the agent's environment: its contract variables are exactly
    CONTRACT_VARIABLES (dropping or renaming one fails here), besides what the runner adds."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "AGENTS.md").read_text(encoding="utf-8")
    table = text.split("| variable | value |", 1)[1].split("\n\n", 1)[0]
    cells = [line.split("|")[1] for line in table.splitlines()[2:]]
    documented = {name.split("=")[0] for cell in cells for name in re.findall(r"`([^`]+)`", cell)}
    assert documented - set(CONTRACT_VARIABLES) == {"PATH", "HF_HUB_OFFLINE", RUN_MARKER_VARIABLE}
    assert set(CONTRACT_VARIABLES) <= documented


def test_agent_environment_is_built_from_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARENT_SECRET", "hunter2")
    env = build_agent_env(
        contract(tmp_path), {"OPENAI_API_KEY": "k"}, run_marker="m", python_env=PythonEnv(tmp_path / "venv")
    )
    assert set(env) == {
        *CONTRACT_VARIABLES,
        "HOME",
        "PATH",
        "HF_HUB_OFFLINE",
        RUN_MARKER_VARIABLE,
        "OPENAI_API_KEY",
    }
    assert env["HOME"] == str(tmp_path) and env["HF_HUB_OFFLINE"] == "1"
    assert env["PATH"].split(":")[0] == str(tmp_path / "venv" / "bin") and "/usr/bin" in env["PATH"]
    assert "hunter2" not in env.values()


def test_env_items_copy_set_and_refuse() -> None:
    parent = {"API_KEY": "secret"}
    assert parse_env_items(["API_KEY", "MODE=fast", "EMPTY="], parent) == {
        "API_KEY": "secret",
        "MODE": "fast",
        "EMPTY": "",
    }
    with pytest.raises(AgentEnvError, match="not set in this environment"):
        parse_env_items(["MISSING"], parent)
    with pytest.raises(AgentEnvError, match="platform sets GRADING_SERVER_URL"):
        parse_env_items(["GRADING_SERVER_URL=http://elsewhere"], parent)
    with pytest.raises(AgentEnvError, match="NAME or NAME=VALUE"):
        parse_env_items(["1BAD=x"], parent)
    with pytest.raises(AgentEnvError, match=r"--env KEY: holds a NUL byte"):
        parse_env_items(["KEY=a\x00b"], parent)


def test_agents_resolve_by_name_or_executable_path(tmp_path: Path) -> None:
    assert resolve_agent("example_grpo").argv[-1] == "autorl_agents.example_grpo"
    assert resolve_agent("example_sft").argv[-1] == "autorl_agents.example_sft"
    script = tmp_path / "agent.py"
    script.write_text("#!/usr/bin/env python3\n")
    with pytest.raises(AgentNotFoundError, match="chmod \\+x"):
        resolve_agent(str(script))
    script.chmod(0o755)
    assert resolve_agent(str(script)).argv == (str(script.resolve()),)
    with pytest.raises(AgentNotFoundError, match="not a built-in agent"):
        resolve_agent("no_such_agent")


def test_root_without_sandbox_never_shares_the_cached_model() -> None:
    assert can_share_base_model(SandboxMode.USER)
    assert can_share_base_model(SandboxMode.NONE) is (os.geteuid() != 0)


@pytest.mark.requires(
    os.geteuid() == 0 and shutil.which("bwrap") is not None,
    reason="the user sandbox needs root and bubblewrap",
)
def test_user_sandbox_is_bubblewrap_as_a_user_of_its_own(tmp_path: Path) -> None:
    home = tmp_path / "home"
    workspace = home / "runs" / "r" / "workspace"
    (workspace / "models").mkdir(parents=True)
    (workspace / "data").mkdir()
    plan = plan_sandbox(
        SandboxMode.USER,
        SandboxRequest(
            workspace=workspace,
            read_only=[workspace / "models", workspace / "data"],
            python_env=PythonEnv.current(),
            forbidden=[home],
        ),
    )
    try:
        assert plan.uid is not None and plan.uid != 0
        command = plan.command(["agent"])
        assert command[:2] == ["unshare", "--mount"] and command[-1] == "agent"
        launcher = command[command.index("bwrap") :]
        assert launcher[1] == "--args" and int(launcher[2]) in plan.pass_fds
        # bubblewrap's options travel in a descriptor, one NUL-terminated option each.
        bwrap = os.pread(int(launcher[2]), 1 << 20, 0).decode().split("\0")[:-1]
        for flag in (
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--disable-userns",
            "--die-with-parent",
        ):
            assert flag in bwrap
        # The platform home is never mounted: only the workspace inside it, at its own path.
        targets = [bwrap[i + 2] for i, arg in enumerate(bwrap) if arg in ("--bind", "--ro-bind")]
        assert str(workspace) in targets and str(home) not in targets
        assert plan.network_isolated and plan.pid_namespace and plan.warning is None
    finally:
        plan.cleanup()


def test_sft_targets_match_the_worked_examples() -> None:
    target = sft_target("Ann has 3 + 4 = <<3+4=7>>7 pens now.\n#### 7")
    assert target == "Ann has 3 + 4 = 7 pens now.\nThe answer is 7\n"
    assert sft_target("#### 12") == "The answer is 12\n"


def test_shared_prefix_leaves_each_sequence_a_token() -> None:
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert common_prefix_length([[1, 2], [1, 2]]) == 1


def test_example_agent_settings_are_its_cli() -> None:
    help_text = build_parser().format_help()
    assert "--sft-threshold" in help_text and "--num-generations" in help_text
    config = parse_config(["--sft", "never", "--num-generations", "2", "--sft-learning-rate", "0.01"])
    assert config == ExampleGRPOConfig(sft="never", num_generations=2, sft_learning_rate=0.01)


def test_example_agent_seeds_from_autorl_seed_unless_given_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTORL_AGENT_ARGS", raising=False)
    monkeypatch.setenv("AUTORL_SEED", "3")
    assert parse_config([]).seed == 3  # the run's seed (autorl run --repeat)
    assert parse_config(["--seed", "7"]).seed == 7  # an explicit setting wins
    monkeypatch.setenv("AUTORL_AGENT_ARGS", "--seed 9")
    assert parse_config([]).seed == 9
    monkeypatch.delenv("AUTORL_AGENT_ARGS")
    monkeypatch.delenv("AUTORL_SEED")
    assert parse_config([]).seed == 0  # started by hand, outside the platform
    assert "$AUTORL_SEED" in build_parser().format_help()


def test_example_sft_is_the_example_agent_without_rl(monkeypatch: pytest.MonkeyPatch) -> None:
    """example_sft passes its defaults first, so that arguments given to it still win."""
    seen: dict[str, object] = {}

    def fake_main(argv: list[str], *, name: str) -> int:
        seen["config"], seen["name"] = parse_config(argv), name
        return 0

    monkeypatch.setattr(example_sft, "run_example_agent", fake_main)
    monkeypatch.delenv("AUTORL_AGENT_ARGS", raising=False)
    assert example_sft.main([]) == 0
    assert seen["name"] == "example_sft"
    assert seen["config"] == ExampleGRPOConfig(sft="always", sft_time_fraction=1.0, rl="none")
    example_sft.main(["--sft-time-fraction", "0.5", "--sft-epochs", "2"])
    assert seen["config"] == ExampleGRPOConfig(sft="always", sft_time_fraction=0.5, rl="none", sft_epochs=2)


def test_example_agent_rl_choices_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_config(["--rl", "none"]).rl == "none"
    with pytest.raises(SystemExit):
        parse_config(["--rl", "ppo"])
    error = capsys.readouterr().err
    assert "argument --rl: invalid choice: 'ppo'" in error and "grpo" in error


@pytest.mark.parametrize(
    ("source", "subpath"),
    [
        ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B"),
        ("builtin:tiny-qwen2", None),
        ("Qwen2.5-0.5B/Qwen2.5-0.5B", None),  # the organisation's folder would be the model's own
    ],
)
def test_reference_model_subpath(source: str, subpath: str | None) -> None:
    assert reference_model_subpath(source) == subpath


def test_the_base_model_is_also_where_the_reference_puts_it(
    tmp_path: Path, tiny_base_model: Path, train_dir: Path
) -> None:
    """models/<org>/<name>, as reference agents read it, is the same read-only model as MODEL_PATH."""
    root = tmp_path / "ws"
    for _attempt in range(2):  # completing the same run's workspace keeps the link
        workspace = create_workspace(
            root,
            run_id="run-1",
            task_name="arith",
            description="d",
            base_model_dir=tiny_base_model,
            base_model_name="Qwen2.5-0.5B",
            reference_model_subpath="Qwen/Qwen2.5-0.5B",
            train_data_dir=train_dir,
            timeout_s=60,
            link_model=False,
        )
    reference = root / "models" / "Qwen" / "Qwen2.5-0.5B"
    assert reference.resolve() == workspace.model.resolve() == (root / "models" / "Qwen2.5-0.5B").resolve()
    assert os.readlink(reference) == "../Qwen2.5-0.5B"  # relative: it holds wherever models/ is mounted
    assert (reference / "config.json").read_bytes() == (tiny_base_model / "config.json").read_bytes()
    assert is_read_only_tree(root / "models")
    remove_workspace(root)
    assert not root.exists()
