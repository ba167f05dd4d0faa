"""Under a mutant, its tests run unit tests first and each module's tests together (the conftest
hook and tests/support/mutation_order.py), so ``make mutation`` kills most mutants with its fastest
tests; outside a mutant run, the order given is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mutation_order import cheapest_first, tier

REPO_ROOT = Path(__file__).resolve().parents[2]
SANDBOX_A = "tests/integration/test_sandbox_view.py::test_the_agent_has_its_own_users_hosts_and_no_resolver"
GRADER = "tests/integration/test_grader_api.py::test_no_token_is_401_and_names_the_fix"
UNIT = "tests/unit/test_tasks.py::test_unknown_task_names_the_known_ones"
SANDBOX_B = "tests/integration/test_sandbox_view.py::test_egress_gives_the_agent_a_resolver"
#: The order mutmut might hand over: integration before unit, one module split around another.
GIVEN = [SANDBOX_B, GRADER, UNIT, SANDBOX_A]


def collected(mutant: str | None) -> list[str]:
    """The node ids pytest would run for :data:`GIVEN`, in its order, under ``mutant``."""
    env = {k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"}
    if mutant is not None:
        env["MUTANT_UNDER_TEST"] = mutant
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *GIVEN],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_a_mutants_tests_run_unit_first_then_each_module_together_in_file_order() -> None:
    assert collected("autorl.checkpoints.snapshot.x__open__mutmut_7") == [UNIT, GRADER, SANDBOX_A, SANDBOX_B]


@pytest.mark.slow
@pytest.mark.parametrize("mutant", [None, "", "stats"])
def test_outside_a_mutant_the_given_order_is_kept(mutant: str | None) -> None:
    assert collected(mutant) == GIVEN


def test_tiers_follow_the_folder_and_anything_else_runs_last() -> None:
    folders = ("unit", "integration", "e2e", "containers")
    assert [tier(Path(f"tests/{folder}/test_x.py")) for folder in folders] == [0, 1, 2, 3]
    assert tier(Path("/srv/unit/tests/integration/test_x.py")) == 1


def test_a_parametrized_tests_cases_keep_their_order() -> None:
    class Item:
        def __init__(self, name: str, line: int) -> None:
            self.path = Path("tests/unit/test_x.py")
            self.location = ("tests/unit/test_x.py", line, name)

    cases = [Item("t[b]", 9), Item("t[a]", 9), Item("s", 3)]
    assert [i.location[2] for i in cheapest_first(cases)] == ["s", "t[b]", "t[a]"]
