"""Mutation testing of the checks that guard scores: ``make mutation`` (not part of ``make test``).

Runs mutmut (configured in pyproject.toml's ``[tool.mutmut]``: the modules to mutate and the fast
tests that cover them) over the mutants that ``[tool.autorl.mutation]`` names (fnmatch patterns:
whole modules, or only the functions that check something), then writes
``bench/results/mutation.json``: the tool and version, the modules, patterns and tests, the count
of mutants per outcome (in all and per module) and every surviving mutant with the line it
changed and, where the change cannot alter what a user sees, why (from
``tools/mutation_equivalent.toml``). ``python3 -m tools.reliability_doc`` renders that file into
docs/RELIABILITY.md.

mutmut sees only the calls its own test process makes. A test that runs the grader as a process of
its own (the checks that need another user's view of the files) reaches functions mutmut records no
test for, or only in-process tests for. ``[tool.autorl.mutation.process_tests]`` names such tests,
by the mutants they cover: every mutant of those patterns that survives mutmut's run is run again
against them, with the processes they start importing the mutated copy (``PYTHONPATH``) under the
same ``MUTANT_UNDER_TEST``; a failing test kills it. The tests must pass with no mutant first.

mutmut names a mutant after its file's path and records which tests call a function by the module
name the tests import it as; the two agree only where a package sits at the top of the folder
mutmut runs in. The services' packages sit under ``services/``, so mutmut runs in ``.mutation/``,
which links each package (and the tests and pyproject.toml) at its top; the mutants and mutmut's
state are in ``.mutation/mutants/``.

    python3 -m tools.mutation              # run mutmut afresh, then write the results
    python3 -m tools.mutation --survivors  # after adding tests: run the last run's unexplained
                                           # survivors and untested mutants again (the rest, and
                                           # those tools/mutation_equivalent.toml explains, keep
                                           # their outcome)
    python3 -m tools.mutation --collect    # only write the results of the last run (with
                                           # --modules: of a run of those modules)
    python3 -m tools.mutation --modules autorl.checkpoints.snapshot autorl_grader.submissions
                                           # run afresh only those modules' mutants; the other
                                           # modules keep the outcomes bench/results/mutation.json
                                           # holds, marked with the date of their run
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter, defaultdict
from importlib.metadata import version
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "mutation.json"
#: Outcomes of the process-level tests of the last run (mutant name → "killed" or "survived").
PROCESS_OUTCOMES_NAME = "process-outcomes.json"
#: Surviving mutants that cannot change what a user sees: mutant name → the changed line and why.
EQUIVALENT = REPO_ROOT / "tools" / "mutation_equivalent.toml"
MUTMUT = [sys.executable, "-m", "mutmut"]
#: Where mutmut runs, and what it sees there (name → the repository path it links to).
WORKDIR = REPO_ROOT / ".mutation"
LINKS = {
    "autorl": "autorl",
    "autorl_grader": "services/grader/autorl_grader",
    "autorl_agent_runner": "services/agent-runner/autorl_agent_runner",
    "autorl_agents": "services/agents/autorl_agents",
    "tests": "tests",
    "pyproject.toml": "pyproject.toml",
}


def prepare_workdir() -> None:
    """A fresh ``.mutation/``: the links of :data:`LINKS`, no mutants of an earlier run."""
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir()
    for name, target in LINKS.items():
        (WORKDIR / name).symlink_to(REPO_ROOT / target)


def test_env() -> dict[str, str]:
    """Each mutant's tests are a test run of their own: they share one build of the builtin model.

    One thread for torch's OpenMP pool: mutmut forks each mutant's run from a process that has used
    torch, and a pool of threads started before a fork hangs the child at its first parallel op
    (every such mutant then ends as a timeout)."""
    return {
        **os.environ,
        "AUTORL_TEST_MODELS_DIR": str(WORKDIR / "models"),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def repository_path(path: str) -> str:
    """A path as mutmut sees it in ``.mutation/`` → the same file's path in the repository."""
    top, _, rest = path.partition("/")
    return f"{LINKS[top]}/{rest}" if rest else LINKS[top]


def _mutmut(*args: str) -> str:
    done = subprocess.run([*MUTMUT, *args], cwd=WORKDIR, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def parse_results(text: str) -> dict[str, str]:
    """``mutmut results --all true`` lines (``    name: status``) as name → status."""
    outcomes = {}
    for line in text.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            outcomes[name] = status.strip()
    return outcomes


def changed_line(diff: str) -> str:
    """The mutated line of a ``mutmut show`` diff (its first added line)."""
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


def mutation_config() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return dict(config["tool"]["autorl"]["mutation"])


def mutant_patterns() -> list[str]:
    """The mutants to run: ``[tool.autorl.mutation] mutants`` in pyproject.toml."""
    patterns: list[str] = mutation_config()["mutants"]
    return patterns


def process_tests() -> dict[str, list[str]]:
    """``[tool.autorl.mutation.process_tests]``: mutant pattern → the tests (pytest ids) that run the
    code those mutants change in processes of their own."""
    tests: dict[str, list[str]] = mutation_config().get("process_tests", {})
    return tests


def process_test_env(mutant: str) -> dict[str, str]:
    """The environment of a process-level test run under ``mutant`` ("" for none): every process the
    tests start imports the packages from mutmut's mutated copy first."""
    copy = str(WORKDIR / "mutants")
    path = os.pathsep.join(p for p in (copy, os.environ.get("PYTHONPATH", "")) if p)
    return {**test_env(), "MUTANT_UNDER_TEST": mutant, "PYTHONPATH": path}


def run_process_tests(tests: list[str], mutant: str) -> bool:
    """Whether ``tests`` pass under ``mutant``, run in mutmut's mutated copy as mutmut runs its own."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x"]
    done = subprocess.run(
        [*command, *tests], cwd=WORKDIR / "mutants", env=process_test_env(mutant), capture_output=True
    )
    return done.returncode == 0


def process_stage(outcomes: dict[str, str]) -> dict[str, str]:
    """The surviving (or untested) mutants that :func:`process_tests` names, run against those
    tests: mutant → "killed" or "survived". Written beside mutmut's state for :func:`collect`, over
    what an earlier stage of the same run found (``outcomes`` already counts its kills)."""
    results = process_outcomes()
    for pattern, tests in process_tests().items():
        unkilled = {n for n, s in outcomes.items() if s in ("survived", "no tests")}
        names = sorted(n for n in unkilled if fnmatch.fnmatchcase(n, pattern))
        if not names:
            continue
        if not run_process_tests(tests, ""):
            listed = " ".join(tests)
            raise SystemExit(f"the process-level tests for {pattern} fail without a mutant: {listed}")
        for name in names:
            results[name] = "survived" if run_process_tests(tests, name) else "killed"
            print(f"process tests: {name} {results[name]}")
    (WORKDIR / "mutants" / PROCESS_OUTCOMES_NAME).write_text(json.dumps(results, indent=2) + "\n")
    return results


def known_outcomes() -> dict[str, str]:
    """mutmut's outcomes of the last run, a mutant that a process-level test killed counted as
    killed (:func:`process_stage`)."""
    outcomes = parse_results(_mutmut("results", "--all", "true"))
    killed = {n for n, s in process_outcomes().items() if s == "killed" and n in outcomes}
    outcomes.update(dict.fromkeys(killed, "killed"))
    return outcomes


def process_outcomes() -> dict[str, str]:
    path = WORKDIR / "mutants" / PROCESS_OUTCOMES_NAME
    found: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    return found


def module_patterns(modules: list[str]) -> list[str]:
    """The patterns of :func:`mutant_patterns` that name mutants of ``modules``."""
    patterns = [p for p in mutant_patterns() if any(p.startswith(f"{m}.") for m in modules)]
    unknown = [m for m in modules if not any(p.startswith(f"{m}.") for p in patterns)]
    if unknown:
        raise SystemExit(f"no mutants of {', '.join(unknown)} in [tool.autorl.mutation] mutants")
    return patterns


def selected(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def module_of(mutant: str) -> str:
    """``autorl.tasks.gsm8k.x_reward__mutmut_3`` → ``autorl.tasks.gsm8k`` (methods: ``xǁClassǁname``)."""
    parts = mutant.split(".")
    for index in range(len(parts) - 1, -1, -1):
        if parts[index].startswith(("x_", "xǁ")):
            return ".".join(parts[:index])
    raise SystemExit(f"not a mutmut mutant name: {mutant}")


def load_equivalent() -> dict[str, dict[str, str]]:
    entries: dict[str, dict[str, str]] = tomllib.loads(EQUIVALENT.read_text(encoding="utf-8"))
    for name, entry in entries.items():
        if not {"change", "reason"} <= set(entry) <= {"change", "reason", "untestable_here"}:
            raise SystemExit(
                f"{EQUIVALENT.name}: {name} needs `change` and `reason` (and may say `untestable_here`)"
            )
    return entries


def survivor(name: str, equivalent: dict[str, dict[str, str]]) -> dict[str, str]:
    """A surviving mutant, with the reason it is equivalent when the file's entry still matches
    its changed line (a renumbered mutant is listed without one, so the entry must be redone)."""
    change = changed_line(_mutmut("show", name))
    record = {"mutant": name, "change": change}
    entry = equivalent.get(name)
    if entry is not None and entry["change"] == change:
        record["untestable_here" if entry.get("untestable_here") else "equivalent"] = entry["reason"]
    elif entry is not None:
        print(f"warning: {EQUIVALENT.name}: {name} now changes {change!r}, not {entry['change']!r}")
    return record


def collect(modules: list[str] | None = None) -> dict[str, Any]:
    """The results of the last run; with ``modules``, of those modules only, the others carried
    over from the results file (:func:`carry_over`)."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    patterns = mutant_patterns() if modules is None else module_patterns(modules)
    everything = known_outcomes()
    outcomes = {name: status for name, status in everything.items() if selected(name, patterns)}
    if not outcomes:
        raise SystemExit("no mutants found: run `make mutation` first")
    if "not checked" in outcomes.values():
        print("warning: some selected mutants were not run (an interrupted run?): listed as `not checked`")
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    for name, status in outcomes.items():
        by_module[module_of(name)][status] += 1
    equivalent = load_equivalent()
    survivors = sorted(name for name, status in outcomes.items() if status == "survived")
    for stale in sorted(name for name in set(equivalent) - set(survivors) if selected(name, patterns)):
        print(f"warning: {EQUIVALENT.name}: {stale} did not survive this run; remove its entry")
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tool": f"mutmut {version('mutmut')}",
        "modules": [repository_path(path) for path in config["source_paths"]],
        "mutants_run": mutant_patterns(),
        "tests": config["pytest_add_cli_args_test_selection"],
        "process_tests": process_tests(),
        "outcomes": dict(sorted(Counter(outcomes.values()).items())),
        "outcomes_by_module": {module: dict(sorted(c.items())) for module, c in sorted(by_module.items())},
        "mutants": len(outcomes),
        "survivors": [survivor(name, equivalent) for name in survivors],
    }
    if modules is None:
        return results
    return carry_over(results, json.loads(RESULTS.read_text(encoding="utf-8")), modules)


def carry_over(fresh: dict[str, Any], last: dict[str, Any], modules: list[str]) -> dict[str, Any]:
    """``fresh`` (a run of ``modules`` only) with the other modules' outcomes and survivors as
    ``last`` holds them; ``carried_over`` names each such module and the date of its run."""
    dates = last.get("carried_over", {})
    carried = {
        module: dates.get(module, last["date"])
        for module in last["outcomes_by_module"]
        if module not in modules
    }
    by_module = {**fresh["outcomes_by_module"]}
    by_module.update({module: last["outcomes_by_module"][module] for module in carried})
    totals: Counter[str] = Counter()
    for counts in by_module.values():
        totals.update(counts)
    survivors = fresh["survivors"] + [s for s in last["survivors"] if module_of(s["mutant"]) in carried]
    return {
        **fresh,
        "outcomes": dict(sorted(totals.items())),
        "outcomes_by_module": dict(sorted(by_module.items())),
        "carried_over": dict(sorted(carried.items())),
        "mutants": sum(totals.values()),
        "survivors": sorted(survivors, key=lambda s: str(s["mutant"])),
    }


def run_record(wall_s: float) -> dict[str, Any]:
    """How long a run of every mutant from scratch took (mutmut and the process stage), and on what;
    runs with --modules, --survivors or --collect keep the last such record."""
    return {"wall_s": round(wall_s), "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collect", action="store_true", help="only collect the last run's results")
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="run the last run's unexplained surviving and untested mutants again, then collect",
    )
    parser.add_argument(
        "--modules",
        nargs="+",
        metavar="MODULE",
        help="run afresh only these modules' mutants (e.g. autorl.checkpoints.snapshot); "
        "keep the others' results",
    )
    args = parser.parse_args()
    started = time.monotonic()
    if args.collect:
        pass
    elif args.modules:
        prepare_workdir()
        subprocess.run(
            [*MUTMUT, "run", *module_patterns(args.modules)], cwd=WORKDIR, env=test_env(), check=False
        )
    elif args.survivors:
        last = known_outcomes()
        explained = load_equivalent()
        again = sorted(
            n
            for n, s in last.items()
            if s in ("survived", "no tests") and selected(n, mutant_patterns()) and n not in explained
        )
        if not again:
            raise SystemExit("nothing to run again: no survivors in .mutation/ (run without --survivors)")
        subprocess.run([*MUTMUT, "run", *again], cwd=WORKDIR, env=test_env(), check=False)
    else:
        prepare_workdir()
        subprocess.run([*MUTMUT, "run", *mutant_patterns()], cwd=WORKDIR, env=test_env(), check=False)
    if not args.collect:
        process_stage(known_outcomes())
    results = collect(args.modules)
    from_scratch = not (args.collect or args.survivors or args.modules)
    results["run"] = (
        run_record(time.monotonic() - started)
        if from_scratch
        else json.loads(RESULTS.read_text(encoding="utf-8")).get("run")
    )
    RESULTS.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
