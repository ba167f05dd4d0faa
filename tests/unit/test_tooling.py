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


def test_make_run_installs_only_what_running_needs_and_make_test_everything(tmp_path: Path) -> None:
    """`make run` never installs or requires the browser (the dashboard's browser test's) nor the
    OpenCompass environment; `make test` still installs both. Dry runs against fresh environments."""
    venvs = [f"VENV={tmp_path}/v", f"AGENT_VENV={tmp_path}/a", f"OC_VENV={tmp_path}/o"]
    run = make("-n", "run", *venvs)
    test = make("-n", "test", *venvs)
    browser = re.search(r"^BROWSER_PACKAGES := (.+)$", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE)
    assert browser is not None
    for package in [*browser.group(1).split(), "chromedriver"]:
        assert package not in run, package
        assert package in test, package
    for installed in (f"{tmp_path}/v/.installed", f"{tmp_path}/a/.installed"):
        assert f"touch {installed}" in run and f"touch {installed}" in test
    assert f"{tmp_path}/o/" not in run and f"touch {tmp_path}/o/.installed" in test
    # README's requirements say the same: none of this for `make run`; the browser, root and the
    # redis-server command (the tests start their own Redis, none need one on :6379) for `make test`.
    readme = " ".join((REPO_ROOT / "README.md").read_text(encoding="utf-8").split())
    requirements = readme.split("Requirements, by command:", 1)[1].split("```", 1)[0]
    for_run, for_test = requirements.split("- `make setup` and `make test`:", 1)
    assert "No root, no browser, no Postgres or Redis" in for_run and "chromium" not in for_run
    assert all(need in for_test for need in ("root", "`chromium`", "`chromium-driver`", "`redis-server`"))
    assert ":6379" not in requirements
    assert run.rstrip().endswith(
        f"{tmp_path}/v/bin/autorl run -t arith -m builtin:tiny-qwen2 -a example_grpo --timeout 300"
    )


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
