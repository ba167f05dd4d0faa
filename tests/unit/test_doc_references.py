"""What the documents name exists: every `autorl` command and flag (as `--help` lists them), every
`make` target, every path of this repository (and test named in it), every file an example names
beside it, every section a citation names, every measured figure (as bench/results holds it) and
every setting's default (as its settings class holds it). A renamed flag, a moved file or a
re-measured number fails here, not in a reader's terminal."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from autorl.cli import build_parser
from tools import docgen

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        REPO_ROOT / "README.md",
        *(REPO_ROOT / "docs").glob("*.md"),
        *(
            p
            for p in (REPO_ROOT / "examples").rglob("*")
            if p.is_file() and p.suffix in {".md", ".yaml", ".sh"}
        ),
        *(REPO_ROOT / "examples").rglob("Dockerfile"),
    ]
)
#: The repository's top-level folders and files a path in a document starts with.
REPO_PATH = re.compile(
    r"^(?:autorl|services|docs|examples|tests|bench|charts|docker|tools)/[\w./-]*(?:::\w+)?$"
    r"|^(?:Makefile|pyproject\.toml|constraints\.txt|requirements-[\w-]+\.txt)$"
)
#: A measured-looking figure with a unit that only a measurement gives (times are also settings).
MEASURED = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s?(tok/s|GiB|GB|TB/s|MB|requests/s|×)(?![\w/])")
#: Figures that are facts rather than this project's measurements, each with where it comes from.
NOT_MEASURED: dict[tuple[str, str], str] = {}


def relative(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def code_texts(path: Path) -> Iterator[str]:
    """The document's code: each inline code span, and each command of a code block (a line,
    joined with the lines its trailing backslash continues)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".md":  # an example file is all code
        yield from _commands(text)
        return
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    for block in blocks:
        yield from _commands(block)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    yield from re.findall(r"`([^`\n]+)`", prose)


def _commands(block: str) -> Iterator[str]:
    yield from block.replace("\\\n", " ").splitlines()


@cache
def parser() -> argparse.ArgumentParser:
    return build_parser()


def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(p: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``p`` and of its own subcommands (``autorl agent-runner mirror``)."""
    found = {s for action in p._actions for s in action.option_strings}
    for child in subparsers(p).values():
        found |= options(child)
    return found


def autorl_invocations(code: str) -> Iterator[list[str]]:
    """Each ``autorl SUBCOMMAND ...`` of a piece of code as words, up to the end of its command."""
    start = r"(?:^|[;&|(]\s*)(?:\$\s+)?(?:\w+=\S*\s+)*(?:\S*/)?"  # a command's start: `X=1 .venv/bin/autorl`
    for match in re.finditer(start + r"autorl ([a-z][\w-]*)(.*)", code):
        rest = re.split(r"\s(?:\||&&|;|#)\s?|[)]", match.group(2))[0]
        try:
            words = shlex.split(rest.replace("\\|", "|"))
        except ValueError:
            words = rest.split()
        yield [match.group(1), *words]


def test_every_autorl_command_and_flag_a_document_names_exists() -> None:
    commands = subparsers(parser())
    wrong = []
    seen = 0
    for document in DOCUMENTS:
        for code in code_texts(document):
            for words in autorl_invocations(code):
                name, *rest = words
                seen += 1
                if name not in commands:
                    wrong.append(f"{relative(document)}: `autorl {name}` is not a command ({code})")
                    continue
                known = options(commands[name]) | {"-h", "--help"}
                for word in rest:
                    flag = word.split("=", 1)[0].split("/", 1)[0]
                    if re.fullmatch(r"--?[a-z][\w-]*", flag) and flag not in known:
                        wrong.append(f"{relative(document)}: `autorl {name}` has no {flag} ({code})")
    assert seen > 30  # the documents do show commands
    assert not wrong, "\n".join(wrong)


#: Where the documents say how they write the command (the one rule the test below holds them to).
COMMAND_RULE = "After set-up the command is `.venv/bin/autorl`"


def test_every_autorl_command_to_type_is_written_as_set_up_leaves_it() -> None:
    """`make setup` puts `autorl` in .venv/bin, not on PATH: every command a reader types (a line of a
    code block in README.md or docs/) writes it `.venv/bin/autorl`, as README says once. Prose names
    commands (`autorl run`), and a usage synopsis (`autorl evaluate MODEL [--json]`) describes one:
    neither is typed as it stands."""
    readme = " ".join((REPO_ROOT / "README.md").read_text(encoding="utf-8").split())
    assert COMMAND_RULE in readme
    commands = subparsers(parser())
    wrong = []
    for document in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        text = document.read_text(encoding="utf-8")
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE):
            for line in block.splitlines():
                if "[-" in line:
                    continue  # a synopsis: its optional parts are not typed as written
                for match in re.finditer(r"(\S*)\bautorl ([a-z][\w-]*)", line):
                    written, name = match.groups()
                    if name in commands and written != ".venv/bin/":
                        wrong.append(f"{relative(document)}: {line.strip()}")
    assert not wrong, "write `.venv/bin/autorl ...`:\n" + "\n".join(wrong)


def test_the_flag_table_of_autorl_run_is_its_help() -> None:
    """docs/LOCAL.md's table lists every flag of `autorl run`, and nothing else."""
    text = (REPO_ROOT / "docs" / "LOCAL.md").read_text(encoding="utf-8")
    section = text.split("## `autorl run`", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)`(?:, `([^`]+)`)? \|", section, flags=re.MULTILINE)
    documented = {re.split(r"[ /]", cell)[0] for row in rows for cell in row if cell.startswith("--")}
    run = subparsers(parser())["run"]
    flags = {s for action in run._actions for s in action.option_strings if s.startswith("--")} - {"--help"}
    assert documented == flags


@cache
def make_targets() -> frozenset[str]:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    return frozenset(re.findall(r"^([A-Za-z][\w.-]*):", makefile, flags=re.MULTILINE))


def test_every_make_target_a_document_names_exists() -> None:
    wrong = []
    for document in DOCUMENTS:
        for code in code_texts(document):
            for match in re.finditer(r"(?:^|[\s(])make((?: [\w.-]+)+)", code):
                for word in match.group(1).split():
                    if "=" in word:
                        continue  # a variable: make images GPU=1
                    if word not in make_targets():
                        wrong.append(f"{relative(document)}: `make {word}` is not a target ({code})")
                    break  # the first word is the target; what follows is not make's
    assert not wrong, "\n".join(wrong)


def named_paths(document: Path) -> Iterator[str]:
    for code in code_texts(document):
        for word in code.split():
            word = word.strip("\"'.,;:()")
            if not REPO_PATH.match(word) or re.search(r"[<>*{}$]|\.\.\.", word):
                continue
            if word.startswith("autorl/") and "." not in word and not word.endswith("/"):
                continue  # an image's name (autorl/grader:0.1.0), not the package's folder
            yield word
    if document.suffix == ".md":
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", document.read_text(encoding="utf-8")):
            if not re.match(r"[a-z]+:", target):  # a web address is not the repository's
                yield relative((document.parent / target).resolve())


def test_every_repository_path_and_test_a_document_names_exists() -> None:
    wrong = []
    for document in DOCUMENTS:
        for name in named_paths(document):
            path_text, _, test = name.partition("::")
            path = REPO_ROOT / path_text
            if not path.exists():
                wrong.append(f"{relative(document)}: {path_text} does not exist")
            elif test and not re.search(
                rf"^(?:async )?def {re.escape(test)}\(", path.read_text(), re.MULTILINE
            ):
                wrong.append(f"{relative(document)}: {path_text} has no {test}")
    assert not wrong, "\n".join(wrong)


#: A file an example's own files name by its bare name (its folder's README, start script, Dockerfile).
BARE_FILE = re.compile(r"[\w.-]+\.(?:md|sh|yaml|yml|py|txt|json)|Dockerfile|README")


def test_every_file_an_example_names_beside_it_exists() -> None:
    """An example's config, script or Dockerfile that names a file by its bare name (a README, its
    start script) names one in its own folder, or a file of the workspace the agent runs in (a path
    from the repository's root is checked above)."""
    from autorl.layout import DESCRIPTION_FILE, INSTRUCTIONS_FILE, RUN_META_FILE, SCORES_FILE

    workspace = {DESCRIPTION_FILE, INSTRUCTIONS_FILE, RUN_META_FILE, SCORES_FILE}
    wrong = []
    for document in DOCUMENTS:
        if document.suffix == ".md":
            continue  # a document's bare names are often the workspace's or another tool's
        for code in code_texts(document):
            for word in code.split():
                word = word.strip("\"'.,;:()`")
                if not BARE_FILE.fullmatch(word) or word in workspace:
                    continue
                if not (document.parent / word).exists():
                    wrong.append(f"{relative(document)}: {word} is not beside it")
    assert not wrong, "\n".join(wrong)


def test_the_documents_tests_are_named_with_their_files() -> None:
    """A table cell `::test_name` after `path::other_test` names a test of that same file."""
    wrong = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for file, rest in re.findall(r"`(tests/[\w/]+\.py)::\w+`((?:, `::\w+`)+)", text):
            for test in re.findall(r"`::(\w+)`", rest):
                if not re.search(rf"^def {test}\(", (REPO_ROOT / file).read_text(), re.MULTILINE):
                    wrong.append(f"{relative(document)}: {file} has no {test}")
    assert not wrong, "\n".join(wrong)


@cache
def bench_numbers() -> frozenset[float]:
    numbers: set[float] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            numbers.add(float(value))

    for path in (REPO_ROOT / "bench" / "results").rglob("*.json"):
        walk(json.loads(path.read_text(encoding="utf-8")))
    return frozenset(numbers)


@pytest.mark.parametrize("document", [p for p in DOCUMENTS if p.suffix == ".md"], ids=relative)
def test_every_measured_figure_is_in_the_bench_results(document: Path) -> None:
    """A figure such as `13,211 tok/s` or `85 GiB` is one that bench/results holds, as written
    (rounded to the digits shown; milli- and giga- scaled forms count)."""
    text = docgen.BLOCK.sub("", document.read_text(encoding="utf-8"))
    wrong = []
    for match in MEASURED.finditer(text):
        if (relative(document), match.group(0)) in NOT_MEASURED:
            continue
        digits = match.group(1).replace(",", "")
        shown = float(digits)
        places = len(digits.partition(".")[2])
        scales = (1.0, 1e3, 1e-3, 1e-9, 2**-30)
        if not any(round(n * scale, places) == shown for n in bench_numbers() for scale in scales):
            wrong.append(f"{match.group(0)}: {text[max(0, match.start() - 80) : match.end()]!r}")
    assert not wrong, f"{relative(document)} states figures bench/results does not hold:\n" + "\n".join(wrong)


def settings_defaults() -> dict[str, object]:
    """Every ``AUTORL_*`` setting's default, by its variable's name, from each service's settings class."""
    from autorl.settings import AutoRLSettings
    from autorl_agent_runner.settings import AgentRunnerSettings
    from autorl_controller.operator.settings import ControllerSettings
    from autorl_evaluator.settings import WorkerSettings
    from autorl_grader.settings import GraderSettings
    from autorl_local.settings import RunSettings

    defaults: dict[str, object] = {}
    classes: list[type[AutoRLSettings]] = [
        GraderSettings,
        WorkerSettings,
        AgentRunnerSettings,
        ControllerSettings,
        RunSettings,
    ]
    for cls in classes:
        for name, field in cls.model_fields.items():
            defaults[f"AUTORL_{name.upper()}"] = field.default
    return defaults


def test_every_setting_default_a_document_states_is_the_settings() -> None:
    """`AUTORL_X` (default N) or `AUTORL_X` (N ...) says what the settings class holds."""
    defaults = settings_defaults()
    stated = 0
    wrong = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for name, number in re.findall(
            r"`(AUTORL_[A-Z_]+)`(?: ?\((?:default )?|,? default )(\d[\d,]*(?:\.\d+)?)", text
        ):
            if name not in defaults:
                continue
            stated += 1
            value = defaults[name]
            if not isinstance(value, int | float) or float(value) != float(number.replace(",", "")):
                wrong.append(
                    f"{relative(document)}: {name} is said to default to {number}, the settings say {value}"
                )
    assert stated >= 8
    assert not wrong, "\n".join(wrong)


def sections(document: Path) -> set[str]:
    """What a citation may name: a heading (without its step number or code quotes) or the bold
    label a list item starts with (`- **One evaluation for identical files in flight.**`)."""
    text = document.read_text(encoding="utf-8")
    found = {
        re.sub(r"^\d+\.\s*", "", line.lstrip("#").strip()).replace("`", "")
        for line in text.splitlines()
        if line.startswith("#")
    }
    found |= {
        label.rstrip(".").replace("`", "") for label in re.findall(r"^\s*- \*\*([^*]+)\*\*", text, re.M)
    }
    return found


def test_every_section_a_document_cites_exists() -> None:
    """`docs/NAME.md, "Section"` in a document leads to a heading (or labelled item) of that name."""
    wrong = []
    cited = 0
    for document in DOCUMENTS:
        text = " ".join(document.read_text(encoding="utf-8").split())  # a citation may span lines
        for name, section in re.findall(r'\b((?:docs/)?[A-Z]+\.md),? "([^"]+)"', text):
            cited += 1
            target = REPO_ROOT / (name if "/" in name or name == "README.md" else f"docs/{name}")
            if not target.is_file():
                wrong.append(f"{relative(document)}: {name} does not exist")
            elif not any(heading.startswith(section.replace("`", "")) for heading in sections(target)):
                wrong.append(f'{relative(document)}: {name} has no section "{section}"')
    assert cited > 10  # the documents do cite one another
    assert not wrong, "\n".join(wrong)
