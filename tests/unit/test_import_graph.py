"""The import graph follows the packaging: the core imports no service; each service imports only
the core, the stdlib, the third-party packages its own pyproject.toml declares, and another service
only where it declares that service as a dependency.

Checked twice: statically (every import statement of every module, lazy ones included), and by
importing each service's entry points in a fresh ``python -I`` that refuses every top-level
package outside the service's declared dependency closure, so an undeclared import fails there.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]

#: The modules a distribution's commands start in, beside the modules of its ``autorl.commands``
#: entry points (the ``register`` functions import their commands' modules lazily).
MAIN_MODULES = {
    "autorl": ["autorl.cli"],
    "autorl-grader": ["autorl_grader.main"],
    "autorl-evaluator": ["autorl_evaluator.rq_worker", "autorl_evaluator.jobs"],
    "autorl-agent-runner": ["autorl_agent_runner.launch", "autorl_agent_runner.runner"],
    "autorl-agents": ["autorl_agents.example_grpo", "autorl_agents.example_sft"],
    "autorl-controller": ["autorl_controller.operator.main"],
    "autorl-local": ["autorl_local.experiment"],
}


@dataclass(frozen=True)
class Distribution:
    """One of the repository's distributions, read from its pyproject.toml."""

    name: str
    folder: Path
    package: str
    requirements: tuple[Requirement, ...]
    #: Optional dependencies by extra.
    extras: dict[str, tuple[Requirement, ...]]
    entry_points: tuple[str, ...]

    def requirements_for(self, extras: frozenset[str]) -> list[Requirement]:
        return [*self.requirements, *(r for extra in sorted(extras) for r in self.extras.get(extra, ()))]


@cache
def own_distributions() -> dict[str, Distribution]:
    found: dict[str, Distribution] = {}
    for pyproject in [REPO / "pyproject.toml", *sorted(REPO.glob("services/*/pyproject.toml"))]:
        project = tomllib.loads(pyproject.read_text())
        include = project["tool"]["setuptools"]["packages"]["find"]["include"]
        (package,) = {pattern.rstrip("*").rstrip(".") for pattern in include}
        name = canonicalize_name(project["project"]["name"])
        optional = project["project"].get("optional-dependencies", {})
        found[name] = Distribution(
            name=name,
            folder=pyproject.parent,
            package=package,
            requirements=tuple(Requirement(text) for text in project["project"].get("dependencies", [])),
            extras={extra: tuple(Requirement(text) for text in reqs) for extra, reqs in optional.items()},
            entry_points=tuple(
                project["project"].get("entry-points", {}).get("autorl.commands", {}).values()
            ),
        )
    return found


def services() -> list[Distribution]:
    return [dist for dist in own_distributions().values() if dist.name != "autorl"]


@cache
def import_names_by_distribution() -> dict[str, frozenset[str]]:
    names: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            names.setdefault(canonicalize_name(dist), set()).add(module)
    for own in own_distributions().values():
        names[own.name] = {own.package}
    return {dist: frozenset(modules) for dist, modules in names.items()}


def import_names(dist: str) -> frozenset[str]:
    """The top-level modules a distribution provides (its name in module form where not installed)."""
    return import_names_by_distribution().get(dist, frozenset({dist.replace("-", "_")}))


def _applies(requirement: Requirement, extras: frozenset[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in {"", *extras})


def dependency_closure(root: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """The distributions ``root`` (with ``extras``) needs, itself included: the repository's own from
    their pyproject.toml (the source of truth), the others from their installed metadata."""
    seen: set[tuple[str, frozenset[str]]] = set()
    closure: set[str] = set()
    pending = [(canonicalize_name(root), extras)]
    while pending:
        name, wanted = pending.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        closure.add(name)
        own = own_distributions().get(name)
        if own is not None:
            requirements = own.requirements_for(wanted)
        else:
            try:
                requirements = [Requirement(text) for text in metadata.requires(name) or []]
            except metadata.PackageNotFoundError:
                continue  # an optional dependency that is not installed: nothing of it can be imported
        for requirement in requirements:
            if _applies(requirement, wanted):
                pending.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return closure


def declared_imports(dist: Distribution) -> set[str]:
    """What ``dist``'s modules may import besides the stdlib: its own package, and the top-level
    modules of what its pyproject.toml declares (with every extra it declares or requests; the
    core's dev tools excepted)."""
    allowed = {dist.package}
    extras = frozenset(extra for extra in dist.extras if extra != "dev")
    for requirement in dist.requirements_for(extras):
        name = canonicalize_name(requirement.name)
        allowed |= import_names(name)
        own = own_distributions().get(name)
        if own is not None:  # the core's extras a service asks for (autorl[ml]) are declared through it
            for extra in requirement.extras:
                for extra_requirement in own.extras.get(extra, ()):
                    allowed |= import_names(canonicalize_name(extra_requirement.name))
    return allowed


def imported_top_levels(path: Path) -> dict[str, int]:
    """Each absolute import's top-level module in ``path``, with the first line that imports it."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name.partition(".")[0], node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.setdefault(node.module.partition(".")[0], node.lineno)
    return found


#: Files that run in another environment's Python: the resident engine's server in vLLM's, its
#: shim and the warm OpenCompass's server in OpenCompass's. They import only the standard library
#: when loaded (tests/unit/test_resident_engine.py); what they import to serve is that environment's.
OTHER_ENVIRONMENTS = (
    "autorl_evaluator/backends/opencompass/engine_server.py",
    "autorl_evaluator/backends/opencompass/compass_server.py",
    "/engine_shim/",
)


def undeclared_imports(dist: Distribution) -> list[str]:
    allowed = declared_imports(dist) | set(sys.stdlib_module_names)
    problems = []
    for path in sorted((dist.folder / dist.package).rglob("*.py")):
        if "migrations/versions" in path.as_posix() or any(p in path.as_posix() for p in OTHER_ENVIRONMENTS):
            continue
        for module, line in imported_top_levels(path).items():
            if module not in allowed:
                problems.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    return problems


def test_every_distribution_names_its_main_modules() -> None:
    """A new service (a pyproject.toml under services/) is checked only once it is listed here."""
    assert set(MAIN_MODULES) == set(own_distributions())
    services_in_makefile = re.search(r"^SERVICES := (.*)$", (REPO / "Makefile").read_text(), re.M)
    assert services_in_makefile is not None
    assert set(services_in_makefile.group(1).split()) == {
        dist.folder.relative_to(REPO).as_posix() for dist in services()
    }


def test_the_core_imports_no_service() -> None:
    core = own_distributions()["autorl"]
    service_packages = {dist.package for dist in services()}
    imports = {
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in (REPO / "autorl").rglob("*.py")
        for module, line in imported_top_levels(path).items()
        if module in service_packages
    }
    assert not imports
    assert not undeclared_imports(core)


def test_the_built_in_agents_import_only_the_core() -> None:
    """The agents' distribution declares the core and nothing of the platform's services, so the
    agents' Python, which installs it, holds no supervisor (sandbox, egress, relay) and no service."""
    agents = own_distributions()["autorl-agents"]
    ours = set(own_distributions()) - {"autorl", "autorl-agents"}
    assert not dependency_closure(agents.name) & ours
    service_packages = {dist.package for dist in services()} - {agents.package}
    imports = {
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in (agents.folder / agents.package).rglob("*.py")
        for module, line in imported_top_levels(path).items()
        if module in service_packages
    }
    assert not imports


def own_modules() -> dict[str, Path]:
    """Every module of the repository's distributions by dotted name (migrations left out)."""
    modules: dict[str, Path] = {}
    for dist in own_distributions().values():
        root = dist.folder / dist.package
        for path in root.rglob("*.py"):
            if "migrations" in path.relative_to(root).parts:
                continue
            parts = [dist.package, *path.relative_to(root).with_suffix("").parts]
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the repository's modules it imports: every import statement, lazy ones and those
    for type checking only included (``from package import module`` counts as the module)."""

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                    for alias in node.names
                ]
            else:
                continue
            graph[name] |= {found for target in targets if (found := owner(target)) not in (None, name)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_cycles_finds_a_cycle_and_passes_a_chain() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_itself_back() -> None:
    """No import cycle between the repository's modules, counting lazy imports and those made for
    type checking: each package's modules form layers a reader can take in order."""
    assert cycles(import_graph(own_modules())) == []


@pytest.mark.parametrize("dist", services(), ids=lambda dist: dist.name)
def test_each_service_imports_only_what_its_pyproject_declares(dist: Distribution) -> None:
    assert not undeclared_imports(dist), (
        f"declare these in {dist.folder.relative_to(REPO)}/pyproject.toml or remove the imports"
    )


#: Run in the child: refuse every top-level module outside the allowed set (argv[1]), then import
#: the main modules (argv[2]) and call each entry point's register function (argv[3]).
CHILD = """
import argparse, importlib, importlib.machinery, json, sys, sysconfig
allowed = set(json.loads(sys.argv[1])) | set(sys.stdlib_module_names)
# The interpreter's own private modules (_sysconfigdata_*) are not in stdlib_module_names.
stdlib = [sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")]
stdlib.append(stdlib[-1] + "/lib-dynload")
refused = []
def installed(top):
    others = [finder for finder in sys.meta_path if finder is not RefuseUndeclared]
    return any(getattr(finder, "find_spec", lambda *a: None)(top, None) is not None for finder in others)
class RefuseUndeclared:
    @staticmethod
    def find_spec(name, path=None, target=None):
        top = name.partition(".")[0]
        if top in allowed or importlib.machinery.PathFinder.find_spec(top, stdlib) is not None:
            return None
        if not installed(top):
            return None  # absent either way (a probe such as find_spec("orjson"))
        refused.append(top)
        raise ModuleNotFoundError(f"{top} is outside the declared dependencies", name=top)
sys.meta_path.insert(0, RefuseUndeclared)
for module in json.loads(sys.argv[2]):
    importlib.import_module(module)
for entry_point in json.loads(sys.argv[3]):
    module, _, function = entry_point.partition(":")
    getattr(importlib.import_module(module), function)(argparse.ArgumentParser().add_subparsers())
print(json.dumps(sorted(set(refused))))
"""


@pytest.mark.parametrize("dist", list(own_distributions().values()), ids=lambda dist: dist.name)
def test_entry_points_import_within_the_declared_dependency_closure(dist: Distribution) -> None:
    closure = dependency_closure(dist.name)
    allowed = sorted(set().union(*(import_names(name) for name in closure)))
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            CHILD,
            json.dumps(allowed),
            json.dumps(MAIN_MODULES[dist.name]),
            json.dumps(list(dist.entry_points)),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    # A refusal caught by a guarded import is fine for an optional third-party package, never
    # for one of the repository's own.
    refused = set(json.loads(result.stdout.splitlines()[-1]))
    own_packages = {own.package for own in own_distributions().values()}
    assert not refused & own_packages, f"{dist.name} reached {sorted(refused & own_packages)}"
