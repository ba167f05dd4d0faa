"""Which ``opencompass`` commands the warm OpenCompass can serve: those whose script names a Python;
and, with a stand-in OpenCompass, that nothing a run started outlives it, not even a process that
left its group."""

from __future__ import annotations

import ast
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from autorl_evaluator.backends.opencompass.warm_opencompass import (
    SERVER,
    CompassServer,
    CompassSpec,
)
from autorl_evaluator.failures import EvaluatorFaultError
from autorl_evaluator.versions import script_python
from tests.support.waiting import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]


def executable(path: Path, text: str) -> Path:
    """A script at ``path`` (written, made executable)."""
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def test_the_command_pip_installs_runs_in_the_python_its_script_names(tmp_path: Path) -> None:
    command = executable(
        tmp_path / "opencompass", f"#!{sys.executable}\nfrom opencompass.cli.main import main\n"
    )
    assert script_python(command) == Path(sys.executable)


def test_the_real_command_of_the_opencompass_environment_names_its_python() -> None:
    command = REPO_ROOT / ".venv-opencompass" / "bin" / "opencompass"
    python = script_python(command)
    assert python is not None and python.parent == command.parent


def test_a_wrapper_a_binary_or_a_missing_command_runs_the_ordinary_way(tmp_path: Path) -> None:
    wrapper = executable(tmp_path / "wrapper", '#!/bin/sh\nexec opencompass "$@"\n')
    with_arguments = executable(tmp_path / "args", f"#!{sys.executable} -S\n")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\x7fELF\x02\x01\x01")
    missing_python = executable(tmp_path / "gone", f"#!{tmp_path / 'no' / 'python3'}\n")
    for command in (wrapper, with_arguments, binary, missing_python, tmp_path / "absent"):
        assert script_python(command) is None, command


def test_the_server_needs_nothing_of_ours_at_import() -> None:
    """The server runs in OpenCompass's environment, which has none of our packages: it imports the
    standard library when it loads and OpenCompass only when it preloads."""
    tree = ast.parse(SERVER.read_text(encoding="utf-8"))
    names = [
        alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names
    ]
    names += [
        node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
    ]
    assert names and set(names) <= set(sys.stdlib_module_names) | {"__future__"}, names


#: What the server imports of OpenCompass (and transformers), standing in: the command's entry runs
#: its first argument as a Python file.
STAND_IN = {
    "opencompass/__init__.py": "",
    "opencompass/cli/__init__.py": "",
    "opencompass/cli/main.py": "import runpy, sys\n\n\ndef main():\n    runpy.run_path(sys.argv[1])\n",
    **{f"opencompass/{name}.py": "" for name in ("datasets", "summarizers", "tasks")},
    "transformers/__init__.py": "AutoTokenizer = None\n",
    # What the server changes of OpenCompass (its length check, role tables' copies, parses) and of
    # mmengine (its config dumps' layout).
    **{f"opencompass/{name}/__init__.py": "" for name in ("models", "openicl", "openicl/icl_inferencer")},
    "opencompass/models/base.py": "",
    "opencompass/models/base_api.py": (
        "class APITemplateParser:\n    def parse_template(self, prompt, mode):\n        return prompt\n"
    ),
    "opencompass/utils/__init__.py": "",
    "opencompass/utils/prompt.py": "class PromptList(list):\n    pass\n",
    "opencompass/openicl/icl_inferencer/icl_gen_inferencer.py": (
        "class GenInferencer:\n"
        "    def get_generation_prompt_list_from_retriever_indices(self, *args, **kwargs):\n"
        "        return []\n"
    ),
    "mmengine/__init__.py": "",
    "mmengine/config/__init__.py": "class Config:\n    def dump(self, file=None):\n        return None\n",
}


def _escaping_run(then: str, *, ignore_sigterm: bool = False) -> str:
    """A run that starts a grandchild which leaves the group and the session (``os.setsid()``),
    writes its pid to ``escaped`` and sleeps; it waits for that, then runs ``then``."""
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignore_sigterm else ""
    grandchild = (
        f"import os, signal, time; {ignore}os.setsid(); open('escaped.tmp', 'w').write(str(os.getpid())); "
        "os.rename('escaped.tmp', 'escaped'); time.sleep(300)"
    )
    return (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}])\n"
        "while not os.path.exists('escaped'): time.sleep(0.02)\n"
        f"{then}\n"
    )


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


@pytest.fixture
def stand_in_server(tmp_path: Path) -> Iterator[CompassServer]:
    for name, text in STAND_IN.items():
        (tmp_path / "stand_in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "stand_in" / name).write_text(text, encoding="utf-8")
    spec = CompassSpec(python=Path(sys.executable), pythonpath=str(tmp_path / "stand_in"))
    server = CompassServer(spec, dict(os.environ), tmp_path / "compass.log")
    escaped = tmp_path / "run" / "escaped"
    try:
        server.wait_until_listening()
        yield server
    finally:
        server.stop()
        if escaped.exists() and _alive(pid := int(escaped.read_text())):  # a failing test's
            os.kill(pid, signal.SIGKILL)


def _run(server: CompassServer, tmp_path: Path, body: str, timeout_s: float) -> tuple[int, bool, list[int]]:
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "body.py").write_text(body, encoding="utf-8")
    result = server.run(
        [str(tmp_path / "body.py")],
        cwd=tmp_path / "run",
        env=dict(os.environ),
        timeout_s=timeout_s,
        log_path=tmp_path / "run" / "log",
    )
    return result.returncode, result.timed_out, result.survivors


def test_a_process_a_warm_run_left_outside_its_group_is_ended_when_the_run_exits(
    stand_in_server: CompassServer, tmp_path: Path
) -> None:
    outcome = _run(stand_in_server, tmp_path, _escaping_run("sys.exit(4)"), timeout_s=60)
    assert not _alive(int((tmp_path / "run" / "escaped").read_text()))
    assert outcome == (4, False, [])
    assert stand_in_server.alive()


def test_the_timeout_of_a_warm_run_ends_what_it_left_outside_its_group(
    stand_in_server: CompassServer, tmp_path: Path
) -> None:
    body = _escaping_run("time.sleep(300)", ignore_sigterm=True)
    _, timed_out, survivors = _run(stand_in_server, tmp_path, body, timeout_s=3)
    assert not _alive(int((tmp_path / "run" / "escaped").read_text()))
    assert (timed_out, survivors) == (True, [])
    assert stand_in_server.alive()


def test_a_warm_run_and_what_it_left_outside_its_group_end_with_the_server(
    stand_in_server: CompassServer, tmp_path: Path
) -> None:
    """The server gets SIGTERM when its worker dies: the run going on, and what it started, go too."""
    escaped = tmp_path / "run" / "escaped"
    raised: list[BaseException] = []

    def evaluate() -> None:
        try:
            _run(stand_in_server, tmp_path, _escaping_run("time.sleep(300)"), timeout_s=60)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=evaluate, daemon=True)
    thread.start()
    wait_for(escaped.exists, "the run to start", 30, 0.05)
    os.kill(stand_in_server.process.pid, signal.SIGTERM)
    stand_in_server.process.wait(timeout=30)
    thread.join(30)
    assert len(raised) == 1 and isinstance(raised[0], EvaluatorFaultError), raised
    # Fixed words for the agent (the broken connection's own, if any, are the operator's detail).
    assert str(raised[0]).endswith(
        (
            "): the warm OpenCompass failed during the run",
            "): the warm OpenCompass ended without reporting its run's exit",
        )
    ), raised[0]
    pid = int(escaped.read_text())
    wait_for(lambda: not _alive(pid), f"what the run started ({pid}) to end", 5, 0.05)
