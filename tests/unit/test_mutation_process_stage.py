"""bench/mutation.py's process stage: survivors run again against tests that start processes.

A real mutmut-style copy in a temporary ``.mutation/mutants``: a package whose function picks its
mutant from ``MUTANT_UNDER_TEST`` (as mutmut's trampolines do) and a test that checks that function
only in a child process it starts. mutmut's own run could never kill those mutants; the stage must.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from tools import mutation as mutation_tool

#: The package mutmut's copy holds: mutant 1 changes the answer, mutant 2 is equivalent.
PACKAGE = """
import os

def double(x):
    name = os.environ.get("MUTANT_UNDER_TEST", "")
    if name == "toy.x_double__mutmut_1":
        return x + 2
    if name == "toy.x_double__mutmut_2":
        return x * 2 + 0
    return x * 2
"""
#: A test that sees the function only through a process of its own.
PROCESS_TEST = """
import subprocess, sys

def test_double_in_a_child_process():
    out = subprocess.run([sys.executable, "-c", "import toy; print(toy.double(3))"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "6"
"""


@pytest.fixture
def mutation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = mutation_tool
    copy = tmp_path / ".mutation" / "mutants"
    (copy / "toy").mkdir(parents=True)
    (copy / "toy" / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    (copy / "test_toy.py").write_text(textwrap.dedent(PROCESS_TEST))
    monkeypatch.setattr(module, "WORKDIR", tmp_path / ".mutation")
    monkeypatch.setattr(module, "process_tests", lambda: {"toy.x_double__mutmut_*": ["test_toy.py"]})
    return module


@pytest.mark.slow
def test_a_survivor_that_a_process_level_test_catches_is_killed(mutation: ModuleType) -> None:
    outcomes = {
        "toy.x_double__mutmut_1": "survived",
        "toy.x_double__mutmut_2": "survived",
        "toy.x_double__mutmut_3": "killed",  # mutmut's own run killed it: not run again
        "other.x_f__mutmut_1": "survived",  # no process test names it
    }
    found = mutation.process_stage(outcomes)
    assert found == {"toy.x_double__mutmut_1": "killed", "toy.x_double__mutmut_2": "survived"}
    # Kept beside mutmut's state, where collect() reads it.
    assert mutation.process_outcomes() == found
    written = json.loads((mutation.WORKDIR / "mutants" / mutation.PROCESS_OUTCOMES_NAME).read_text())
    assert written == found


@pytest.mark.slow
def test_process_tests_that_fail_without_a_mutant_stop_the_run(mutation: ModuleType) -> None:
    # A broken test would "kill" every mutant: the stage refuses to count anything then.
    (mutation.WORKDIR / "mutants" / "test_toy.py").write_text("def test_broken():\n    assert False\n")
    with pytest.raises(SystemExit, match="fail without a mutant"):
        mutation.process_stage({"toy.x_double__mutmut_1": "survived"})


def test_the_processes_import_the_mutated_copy_first(mutation: ModuleType) -> None:
    env = mutation.process_test_env("toy.x_double__mutmut_1")
    assert env["MUTANT_UNDER_TEST"] == "toy.x_double__mutmut_1"
    assert env["PYTHONPATH"].split(":")[0] == str(mutation.WORKDIR / "mutants")


@pytest.mark.slow
def test_a_later_stage_keeps_the_kills_of_an_earlier_one_and_does_not_run_them_again(
    mutation: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--survivors`` after a run: a mutant an earlier stage killed is still a survivor in mutmut's
    own state; it counts as killed (known_outcomes) and is neither run again nor forgotten."""
    mutation.process_stage({"toy.x_double__mutmut_1": "survived"})
    mutmut_state = "    toy.x_double__mutmut_1: survived\n    toy.x_double__mutmut_2: survived\n"
    monkeypatch.setattr(mutation, "_mutmut", lambda *args: mutmut_state)
    known = mutation.known_outcomes()
    assert known == {"toy.x_double__mutmut_1": "killed", "toy.x_double__mutmut_2": "survived"}
    ran: list[str] = []
    real_run = mutation.run_process_tests

    def run_and_note(tests: list[str], mutant: str) -> bool:
        ran.append(mutant)
        passed: bool = real_run(tests, mutant)
        return passed

    monkeypatch.setattr(mutation, "run_process_tests", run_and_note)
    found = mutation.process_stage(known)
    assert ran == ["", "toy.x_double__mutmut_2"], "the earlier kill is not run again"
    assert found == {"toy.x_double__mutmut_1": "killed", "toy.x_double__mutmut_2": "survived"}
    assert mutation.process_outcomes() == found
