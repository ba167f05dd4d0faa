"""Which ``opencompass`` commands the warm OpenCompass can serve: those whose script names a Python."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from autorl_evaluator.backends.opencompass.warm_opencompass import SERVER, opencompass_python

REPO_ROOT = Path(__file__).resolve().parents[2]


def _script(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def test_the_command_pip_installs_runs_in_the_python_its_script_names(tmp_path: Path) -> None:
    command = _script(
        tmp_path / "opencompass", f"#!{sys.executable}\nfrom opencompass.cli.main import main\n"
    )
    assert opencompass_python(command) == Path(sys.executable)


def test_the_real_command_of_the_opencompass_environment_names_its_python() -> None:
    command = REPO_ROOT / ".venv-opencompass" / "bin" / "opencompass"
    python = opencompass_python(command)
    assert python is not None and python.parent == command.parent


def test_a_wrapper_a_binary_or_a_missing_command_runs_the_ordinary_way(tmp_path: Path) -> None:
    wrapper = _script(tmp_path / "wrapper", '#!/bin/sh\nexec opencompass "$@"\n')
    with_arguments = _script(tmp_path / "args", f"#!{sys.executable} -S\n")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\x7fELF\x02\x01\x01")
    missing_python = _script(tmp_path / "gone", f"#!{tmp_path / 'no' / 'python3'}\n")
    for command in (wrapper, with_arguments, binary, missing_python, tmp_path / "absent"):
        assert opencompass_python(command) is None, command


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
