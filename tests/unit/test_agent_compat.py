"""Agents as people write them: reference agent folders, `.env` files, the agents' Python and the
reference-format scores.json, without a grader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autorl.api.answers import SubmissionAnswer
from autorl.errors import ConfigurationError
from autorl_agent_runner.agent_command import AgentNotFoundError, resolve_agent
from autorl_agent_runner.agent_python import AGENT_VENV_NAME, find_agent_python
from autorl_agent_runner.env_file import parse_env_file
from autorl_agent_runner.reference_folder import AgentFolderError
from autorl_agent_runner.sandbox.environment import AgentEnvError
from autorl_agent_runner.sandbox.python_env import PythonEnv, PythonEnvError
from autorl_agent_runner.workspace.layout import Workspace, write_scores
from autorl_controller.operator.handlers.create import validation_error
from tests.support.answers import submission_answer
from tests.unit.test_crd import CONTROLLER, crd_errors

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples" / "agents"


def folder(tmp_path: Path, config: str, *, start: str | None = "start.sh") -> Path:
    agent = tmp_path / "my_agent"
    agent.mkdir()
    (agent / "config.yaml").write_text(config)
    if start:
        (agent / start).write_text("echo hi\n")  # not executable: bash runs it, as the reference does
    return agent


def test_agent_folder_runs_its_start_script_with_bash_and_its_env_vars(tmp_path: Path) -> None:
    agent = folder(
        tmp_path, 'name: "Mine"\nstart: start.sh\nenv_vars:\n  STEPS: 20\n  RATIO: "0.1"\n  "ON": true\n'
    )
    command = resolve_agent(str(agent))
    assert Path(command.argv[0]).name == "bash" and command.argv[1] == str(agent.resolve() / "start.sh")
    assert command.folder == agent.resolve() and command.script == agent.resolve() / "start.sh"
    assert dict(command.env) == {"STEPS": "20", "RATIO": "0.1", "ON": "true"}


def test_agent_folder_defaults_follow_the_reference(tmp_path: Path) -> None:
    command = resolve_agent(str(folder(tmp_path, "")))
    assert command.argv[1].endswith("/my_agent/start.sh") and dict(command.env) == {}


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()))
def test_example_agent_folders_resolve(example: str) -> None:
    command = resolve_agent(str(EXAMPLES / example))
    assert command.script is not None and command.script.is_file()


@pytest.mark.parametrize(
    ("config", "start", "fix"),
    [
        ("start: run.sh\n", "start.sh", "is not a file"),
        ("start: ../outside.sh\n", "start.sh", "outside the agent folder"),
        ("env_vars: [A, B]\n", "start.sh", "mapping of NAME: value"),
        (
            "env_vars:\n  GRADING_SERVER_URL: http://elsewhere\n",
            "start.sh",
            "platform sets GRADING_SERVER_URL",
        ),
        ("env_vars:\n  PATH: /tmp\n", "start.sh", "platform sets PATH"),
        ("env_vars:\n  LIST: [1, 2]\n", "start.sh", "single value"),
        ("env_vars:\n  1BAD: x\n", "start.sh", "not a variable name"),
        ("env_vars:\n  YES: x\n", "start.sh", "quote it"),
        ('env_vars:\n  KEY: "a\\0b"\n', "start.sh", r"env_vars.KEY holds a NUL byte"),
        ('start: "start.sh\\0"\n', "start.sh", "start must be the start script's file name"),
        ("name: [unclosed\n", "start.sh", "cannot be read as YAML"),
        ("- a list\n", "start.sh", "must be a mapping"),
    ],
)
def test_bad_agent_folders_are_refused_with_the_fix(
    tmp_path: Path, config: str, start: str, fix: str
) -> None:
    agent = folder(tmp_path, config, start=start)
    (tmp_path / "outside.sh").write_text("echo escaped\n")
    with pytest.raises(AgentFolderError, match=fix):
        resolve_agent(str(agent))


def test_a_folder_without_config_names_what_to_add(tmp_path: Path) -> None:
    with pytest.raises(AgentNotFoundError, match=r"without config\.yaml"):
        resolve_agent(str(tmp_path))


def test_builtin_agents_start_with_the_agents_python(tmp_path: Path) -> None:
    python = PythonEnv(tmp_path / "venv")
    command = resolve_agent("example_grpo", python)
    assert command.argv[0] == str(python.interpreter) and command.python.bin_dir == tmp_path / "venv" / "bin"


def test_the_references_agent_id_runs_our_example_agent(tmp_path: Path) -> None:
    """``--agent example_agent``, as the reference's README writes it, starts ``example_grpo`` and
    is recorded under that name."""
    command = resolve_agent("example_agent", PythonEnv(tmp_path / "venv"))
    assert command.name == "example_grpo"
    assert command.argv[-1] == "autorl_agents.example_grpo"
    with pytest.raises(AgentNotFoundError, match="example_agent = example_grpo"):
        resolve_agent(str(tmp_path / "example_agnet"))


def test_env_file_reads_what_shells_and_dotenv_write(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text(
        "# LLM credentials\n"
        "\n"
        "export OPENAI_API_KEY=sk-123  # the key\n"
        "OPENAI_API_BASE = https://api.example.com/v1\n"
        "SINGLE='literal $HOME \\n # not a comment'\n"
        'DOUBLE="two\\nlines \\"quoted\\""\n'
        "EMPTY=\n"
        "HASH=a#b\n"
    )
    assert parse_env_file(env) == {
        "OPENAI_API_KEY": "sk-123",
        "OPENAI_API_BASE": "https://api.example.com/v1",
        "SINGLE": "literal $HOME \\n # not a comment",
        "DOUBLE": 'two\nlines "quoted"',
        "EMPTY": "",
        "HASH": "a#b",
    }


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("just words\n", "line 1: expected NAME=VALUE"),
        ("OK=1\nAUTORL_TOKEN=stolen\n", "line 2: the platform sets AUTORL_TOKEN"),
        ("HOME=/root\n", "platform sets HOME"),
        ('KEY="never closed\n', "never closes"),
        ("KEY='a' trailing\n", "after the closing quote"),
        ("OK=1\nKEY=a\x00b\n", r"line 2: holds a NUL byte \(\\x00\).*remove it"),
        ("# note \x00\n", "line 1: holds a NUL byte"),
    ],
)
def test_bad_env_files_are_refused_with_the_line(tmp_path: Path, text: str, fix: str) -> None:
    env = tmp_path / ".env"
    env.write_text(text)
    with pytest.raises(AgentEnvError, match=fix):
        parse_env_file(env)


def test_missing_env_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(AgentEnvError, match=r"--env-file .*no such file"):
        parse_env_file(tmp_path / "absent.env")
    with pytest.raises(AgentEnvError, match=r"--env-file .* is a folder; pass the path of the .env file"):
        parse_env_file(tmp_path)


def test_agent_python_setting_takes_an_interpreter_or_a_folder(tmp_path: Path) -> None:
    venv = tmp_path / "env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    assert find_agent_python(venv).prefix == venv
    assert find_agent_python(venv / "bin" / "python").prefix == venv
    with pytest.raises(ConfigurationError, match="AUTORL_AGENT_PYTHON"):
        find_agent_python(tmp_path / "nothing")


def test_agent_python_defaults_to_the_env_beside_the_platforms() -> None:
    beside = Path(sys.prefix).absolute().parent / AGENT_VENV_NAME
    expected = beside if (beside / "bin" / "python").is_file() else Path(sys.prefix).absolute()
    assert find_agent_python(None).prefix == expected


def test_runtime_paths_cover_the_interpreters_prefix_and_import_path() -> None:
    paths = PythonEnv.current().runtime_paths()
    for needed in (Path(sys.prefix), Path(sys.base_prefix)):
        assert any(needed.is_relative_to(path) for path in paths), needed
    with pytest.raises(PythonEnvError, match="has no"):
        PythonEnv(Path("/nonexistent-env")).runtime_paths()


def test_scores_json_is_the_references_list_oldest_first(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path, "tiny")
    comparison = {
        "difference": 2.0,
        "interval": [-0.5, 4.5],
        "p_value": 0.625,
        "discordant": [3, 1],
        "distinguishable": False,
    }
    later = submission_answer(9, score=50.0, timestamp="t9", interval=[40.4, 59.6], comparison=comparison)
    earlier = submission_answer(4, score=40.0, timestamp="t4")
    write_scores(workspace, [later, earlier])
    written = json.loads(workspace.scores.read_text())
    assert [(s["submission_id"], s["score"], s["timestamp"]) for s in written] == [
        (4, 40.0, "t4"),
        (9, 50.0, "t9"),
    ]
    # Every score carries its interval and its comparison with the baseline, as answered.
    assert written[1]["interval"] == [40.4, 59.6] and written[1]["comparison"] == comparison
    assert written[0]["interval"] is None and written[0]["comparison"] is None
    # Each object as the grader answers it: its fields, none added ("queue_position" only while queued,
    # "number" and "lineage" only in the admin API's answers).
    assert set(written[0]) == set(SubmissionAnswer.model_fields) - {"queue_position", "number", "lineage"}
    write_scores(workspace, [])
    assert json.loads(workspace.scores.read_text()) == []


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*/experiment.yaml")), ids=lambda p: p.parent.name)
def test_example_agent_experiments_are_valid(path: Path) -> None:
    manifest = yaml.safe_load(path.read_text())
    assert crd_errors(manifest) == []
    assert validation_error(manifest["metadata"]["name"], manifest["spec"], CONTROLLER) is None


def test_claude_code_example_without_a_key_says_how_to_pass_one(tmp_path: Path) -> None:
    start = EXAMPLES / "claude_code" / "start.sh"
    env = {"PATH": "/usr/bin:/bin", "WORKSPACE": str(tmp_path), "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(start)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--env-file" in done.stdout


def test_every_documented_local_run_of_an_agent_that_needs_the_network_asks_for_it() -> None:
    """An agent folder whose cluster Experiment allows an outside host (its LLM API) has no network on
    one machine without `--egress`: every `autorl run` of it the documents show passes the flag."""
    from tests.unit.test_doc_references import DOCUMENTS, autorl_invocations, code_texts, relative

    networked = {
        f"examples/agents/{path.parent.name}"
        for path in EXAMPLES.glob("*/experiment.yaml")
        if yaml.safe_load(path.read_text())["spec"].get("egress")
    }
    assert "examples/agents/claude_code" in networked
    runs = []
    for document in DOCUMENTS:
        for code in code_texts(document):
            for words in autorl_invocations(code):
                agent = next(
                    (words[i + 1] for i, word in enumerate(words[:-1]) if word in ("-a", "--agent")), None
                )
                if words[0] == "run" and agent is not None and agent.rstrip("/") in networked:
                    runs.append((relative(document), " ".join(words)))
    assert runs, "the documents show how to run an LLM agent locally"
    assert [(where, run) for where, run in runs if "--egress" not in run.split()] == []
