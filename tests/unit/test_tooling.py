"""The repository's own tooling: `make help` lists every target, `make test` lints first and CI
calls only `make test`, and `make bench` knows every benchmark in bench/."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RULE = re.compile(r"^([A-Za-z0-9_.-]+):(?!=)", re.MULTILINE)


def make(*args: str) -> str:
    result = subprocess.run(
        ["make", "--no-print-directory", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def phony_targets() -> set[str]:
    text = (REPO_ROOT / "Makefile").read_text()
    [line] = re.findall(r"^\.PHONY:(.*)$", text, re.MULTILINE)
    return set(line.split())


def test_make_help_lists_every_target_once_with_a_description() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    rules = {name for name in RULE.findall(makefile) if not name.startswith(".")}
    assert phony_targets() == rules  # every rule is phony, and no phony name lacks a rule
    lines = make("-s", "help").splitlines()
    listed = [line.split()[1] for line in lines]
    assert sorted(listed) == sorted(rules), lines
    for line in lines:
        assert line.startswith("make ") and len(line.split(maxsplit=2)) == 3, f"no description: {line!r}"


def test_make_test_runs_the_linters_before_the_tests_and_ci_runs_only_make_test() -> None:
    # A dry run prints the commands in the order make would run them (recursive makes included).
    commands = make("-n", "test", "VENV=.venv").splitlines()
    position = {
        what: next(i for i, line in enumerate(commands) if needle in line)
        for what, needle in {
            "ruff": "ruff check",
            "format": "ruff format --check",
            "mypy": "mypy",
            "pytest": "-m pytest",
        }.items()
    }
    assert position["ruff"] < position["pytest"] and position["format"] < position["pytest"]
    assert position["mypy"] < position["pytest"]
    ci = [
        line
        for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert [shlex.split(line) for line in ci if "make" in line] == [["make", "test"]]


def test_make_bench_knows_every_benchmark_and_each_has_its_results_file() -> None:
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import run_all
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))
    scripts = {path.stem for path in (REPO_ROOT / "bench").glob("*.py")}
    known = set(run_all.CPU_BENCHMARKS) | set(run_all.GPU_BENCHMARKS) | run_all.NOT_BENCHMARKS
    assert scripts <= known, f"not run nor printed by make bench: {sorted(scripts - known)}"
    assert not run_all.NOT_BENCHMARKS - scripts, "NOT_BENCHMARKS names a script that is gone"
    for name, arguments in run_all.CPU_BENCHMARKS.items():
        if arguments[:2] == ["-m", "pytest"]:  # a measurement a test module records (fuzzing)
            assert (REPO_ROOT / arguments[-1]).is_file() and name not in scripts, name
        else:
            assert (REPO_ROOT / arguments[0]).is_file() and Path(arguments[0]).stem == name
    for name, command in run_all.GPU_BENCHMARKS.items():
        assert f"bench/{name}.py" in shlex.split(command)  # the exact command names the script
    assert set(run_all.NOT_YET_MEASURED) <= set(run_all.GPU_BENCHMARKS)
    for name in [*run_all.CPU_BENCHMARKS, *run_all.GPU_BENCHMARKS]:
        measured = (REPO_ROOT / "bench" / "results" / f"{name}.json").is_file()
        # A benchmark without results is named as such, and one with results no longer is.
        assert measured != (name in run_all.NOT_YET_MEASURED), name
