"""``make test``'s processes take the costliest modules first (tests/support/suite_order.py): the
modules of container and OpenCompass tests, then end-to-end, integration and unit modules, each
module's tests together and in the order given (the reverse pass's too)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.suite_order import costliest_first

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Item:
    nodeid: str
    markers: set[str] = field(default_factory=set)

    @property
    def path(self) -> Path:
        return REPO_ROOT / self.nodeid.split("::")[0]

    @property
    def location(self) -> tuple[str, int | None, str]:
        return (self.nodeid, None, self.nodeid)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def test_long_modules_first_then_by_folder_each_module_kept_in_its_order() -> None:
    items = [
        Item("tests/unit/test_a.py::one"),
        Item("tests/integration/test_b.py::one"),
        Item("tests/e2e/test_c.py::two"),
        Item("tests/integration/test_oc.py::quick"),
        Item("tests/integration/test_oc.py::long", {"opencompass"}),
        Item("tests/unit/test_a.py::two"),
        Item("tests/containers/test_d.py::one", {"containers"}),
        Item("tests/e2e/test_c.py::one"),
    ]
    assert [item.nodeid for item in costliest_first(items)] == [
        "tests/containers/test_d.py::one",
        "tests/integration/test_oc.py::quick",  # its module holds an OpenCompass test: all of it goes early
        "tests/integration/test_oc.py::long",
        "tests/e2e/test_c.py::two",
        "tests/e2e/test_c.py::one",
        "tests/integration/test_b.py::one",
        "tests/unit/test_a.py::one",
        "tests/unit/test_a.py::two",
    ]


@pytest.mark.slow
def test_xdist_processes_run_the_costliest_modules_first_and_a_plain_run_keeps_its_order() -> None:
    given = [
        "tests/unit/test_tasks.py::test_unknown_task_names_the_known_ones",
        "tests/integration/test_image_plan.py",
    ]

    def ran(*options: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *options, *given],
            cwd=REPO_ROOT,
            env={k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"},
            capture_output=True,
            text=True,
            check=True,
        )
        return [  # "[gw0] [ 11%] PASSED path::test" with processes, "path::test PASSED [ 11%]" without
            next(word for word in line.split() if "::" in word).split("::")[0]
            for line in done.stdout.splitlines()
            if "PASSED" in line
        ]

    plain = ran()
    in_processes = ran("-n", "1", "--dist", "loadscope", "--no-loadscope-reorder")
    assert plain[0] == "tests/unit/test_tasks.py" and plain[-1] == "tests/integration/test_image_plan.py"
    assert in_processes[0] == "tests/integration/test_image_plan.py"
    assert in_processes[-1] == "tests/unit/test_tasks.py"
