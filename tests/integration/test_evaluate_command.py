"""`autorl evaluate`: one checkpoint scored through the worker's own path, without an experiment.

The tiny models on the CPU with a few problems and short answers. The command's score, protocols,
evaluation key and ``--base`` comparison are those the worker (the real job function, a grader on
Postgres) computes for a submission of the same files; results are kept by the files and the key,
so a second call evaluates nothing; it works from any folder; bad input exits 2 naming the fix.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from rich.text import Text

import autorl.tasks
import autorl_evaluator.backends as backends
from autorl.cli import EXIT_BAD_INPUT, main
from autorl.protocol.statistics import compare, wilson_interval
from autorl.store import Database, submissions
from autorl.tasks.arith import ArithTask
from autorl.untrusted_text import printable
from autorl_evaluator.evaluate_command import CACHED, _status
from autorl_evaluator.jobs import evaluate
from autorl_grader.main import create_app
from tests.conftest import FIXTURE_DATA, REPO_ROOT
from tests.support.checkpoints import read_safetensors, split_into_shards, write_safetensors
from tests.support.grading import (
    admin_headers,
    copy_model,
    evaluating_settings,
    make_unique,
    new_experiment,
    row_id,
    submit_accepted,
)
from tests.support.models import EVAL_MAX_NEW_TOKENS, TrainedModel
from tests.support.settings import DeploymentSettings

#: The keys of ``--json``'s one object (docs/EVALUATION.md, "Score one checkpoint").
JSON_KEYS = {"task", "model", "split", "n", "score", "interval", "scores", "eval_key"}
COMPARISON_KEYS = {"difference", "interval", "p_value", "discordant", "distinguishable"}
#: Answers of the untrained tiny model are never right: a few tokens show that as well as 64.
SHORT_ANSWERS = "4"


def home_environment(home: Path, *, max_new_tokens: str = SHORT_ANSWERS) -> dict[str, str]:
    """A platform home of the test's own; evaluation settings as a worker of the grader under test."""
    return {
        "AUTORL_HOME": str(home),
        "AUTORL_DATA_SOURCE_DIR": str(FIXTURE_DATA),
        "AUTORL_EVAL_DEVICE": "cpu",
        "AUTORL_EVAL_MAX_NEW_TOKENS": max_new_tokens,
    }


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's AUTORL_* variables: only a home of this test's own (no other database or folder)."""
    for name in list(os.environ):
        if name.startswith("AUTORL_") and name != "AUTORL_TEST_MODELS_DIR":
            monkeypatch.delenv(name)
    folder = tmp_path / "home"
    for name, value in home_environment(folder).items():
        monkeypatch.setenv(name, value)
    return folder


@pytest.fixture
def evaluations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The backends' evaluations in this process, by backend name: the real backends, counted."""
    counted: list[str] = []
    real = backends.get_backend

    def counting(name: str) -> backends.Backend:
        counted.append(name)
        return real(name)

    monkeypatch.setattr(backends, "get_backend", counting)
    return counted


def run_evaluate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``autorl evaluate ARGS`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(["evaluate", *args])
    out, err = capsys.readouterr()
    return code, out, err


@dataclass(frozen=True)
class EvaluateCommand:
    """``autorl evaluate`` in this process, in a home of its own; ``evaluations`` lists the backends'
    evaluations its calls made."""

    capsys: pytest.CaptureFixture[str]
    evaluations: list[str]

    def run(self, *args: str) -> tuple[int, str, str]:
        """:func:`run_evaluate` of ``args``."""
        return run_evaluate(self.capsys, *args)


@pytest.fixture
def command(home: Path, capsys: pytest.CaptureFixture[str], evaluations: list[str]) -> EvaluateCommand:
    """``autorl evaluate`` in :func:`home`, its evaluations counted (:func:`evaluations`)."""
    return EvaluateCommand(capsys, evaluations)


def evaluate_from(folder: Path, home: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    """``autorl evaluate ARGUMENTS`` run in ``folder``, with no AUTORL_ setting but ``home``'s."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AUTORL_")}
    env.update(home)
    autorl = Path(sys.executable).parent / "autorl"
    return subprocess.run(
        [str(autorl), "evaluate", *arguments],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_json_from_a_folder_outside_the_repository(tmp_path: Path) -> None:
    """The installed command, run where no repository is: builtin:tiny-qwen2 scored on arith's
    secret test split; stdout is exactly one JSON object of the contract, progress goes to stderr."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = home_environment(tmp_path / "home")
    done = evaluate_from(elsewhere, home, "builtin:tiny-qwen2", "-t", "arith", "--limit", "3", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)  # one object and nothing else
    assert set(answer) == JSON_KEYS
    assert answer["task"] == "arith" and answer["split"] == "test" and answer["n"] == 3
    assert answer["model"] == "builtin:tiny-qwen2"
    assert set(answer["scores"]) == {"opencompass", "flexible", "strict"}
    assert answer["score"] == answer["scores"]["opencompass"]
    correct = round(answer["score"] * 3 / 100)
    assert answer["interval"] == list(wilson_interval(correct, 3))
    assert len(answer["eval_key"]) == 32 and int(answer["eval_key"], 16) >= 0
    assert "evaluating builtin:tiny-qwen2 on 3 arith problems" in done.stderr
    # The secret test seed lives in this home's evaluator storage, the split nowhere in the folder.
    assert (tmp_path / "home" / "eval" / "data" / "arith" / "test-seed").is_file()
    assert list(elsewhere.iterdir()) == []


OPENCOMPASS_BIN = REPO_ROOT / ".venv-opencompass" / "bin" / "opencompass"


@pytest.mark.opencompass
@pytest.mark.slow
@pytest.mark.requires(OPENCOMPASS_BIN.exists(), reason="needs .venv-opencompass (make setup)")
def test_the_opencompass_backend_from_a_folder_outside_the_repository_scores_as_hf(
    trained_tiny_model: TrainedModel, tmp_path: Path
) -> None:
    """OpenCompass on the CPU (about 40 s on 2 shared cores, most of it its start), its command found
    from the installation, scores the model trained to answer every other problem as the hf backend
    does, on the same problems, under a key of its own (the backend and its packages are in it)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = home_environment(tmp_path / "home", max_new_tokens=str(EVAL_MAX_NEW_TOKENS))
    arguments = [str(trained_tiny_model.path), "-t", "gsm8k", "--limit", "2", "--json"]
    answers = {}
    for backend in ("opencompass", "hf"):
        done = evaluate_from(elsewhere, home, *arguments, "--backend", backend)
        assert done.returncode == 0, done.stderr
        answers[backend] = json.loads(done.stdout)
        assert set(answers[backend]) == JSON_KEYS
    assert answers["opencompass"]["scores"] == answers["hf"]["scores"]
    assert answers["opencompass"]["score"] == 50.0  # the first problem right, the second not
    assert answers["opencompass"]["n"] == answers["hf"]["n"] == 2
    assert answers["opencompass"]["eval_key"] != answers["hf"]["eval_key"]


def test_the_score_and_comparison_are_the_workers_for_the_same_files(
    make_settings: Callable[..., DeploymentSettings],
    pg_url: str,
    trained_tiny_model: TrainedModel,
    tiny_base_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The trained model submitted to an experiment of the tiny base model and evaluated by the job
    function, beside `autorl evaluate` of the same folder with --base: the same score, protocols and
    evaluation key, and the comparison the grader answers with (autorl.protocol.statistics's of the two
    correctness strings)."""
    limit = 4
    settings = evaluating_settings(make_settings, pg_url, limit=limit, max_new_tokens=EVAL_MAX_NEW_TOKENS)
    with TestClient(create_app(settings, reconcile=False)) as client:
        experiment = new_experiment(client, settings, tiny_base_model, tmp_path)
        asked = client.post(f"/v1/experiments/{experiment.name}/baseline", headers=admin_headers(settings))
        baseline_id = asked.json()["submission_id"]
        assert evaluate(baseline_id, settings)["status"] == "scored"
        checkpoint = copy_model(trained_tiny_model.path, experiment.output_dir / "trained")
        number = submit_accepted(client, experiment, "output/trained")["submission_id"]
        db = Database(pg_url)
        submission_id = row_id(db, experiment, number)
        assert evaluate(submission_id, settings)["status"] == "scored"
        graders = client.get(f"{experiment.url_path}/submissions/{number}").json()
    with db.session() as session:
        worker = submissions.get_submission(session, submission_id)
        base = submissions.get_submission(session, baseline_id)
        session.expunge_all()
    db.dispose()

    for name in list(os.environ):
        if name.startswith("AUTORL_"):
            monkeypatch.delenv(name)
    environment = home_environment(settings.home, max_new_tokens=str(EVAL_MAX_NEW_TOKENS))
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    arguments = ["-t", "gsm8k", "--limit", str(limit), "--base", str(tiny_base_model), "--json"]
    code, out, err = run_evaluate(capsys, str(checkpoint), *arguments)
    assert code == 0, err
    answer = json.loads(out)
    assert set(answer) == JSON_KEYS | {"comparison"} and set(answer["comparison"]) == COMPARISON_KEYS
    assert answer["model"] == str(checkpoint)
    assert answer["n"] == worker.n_samples == limit
    assert answer["score"] == worker.score and 0 < answer["score"] < 100
    assert answer["scores"] == {
        "opencompass": worker.score_opencompass,
        "flexible": worker.score_flexible,
        "strict": worker.score_strict,
    }
    assert answer["eval_key"] == worker.eval_key
    assert answer["interval"] == graders["interval"]
    assert worker.correctness is not None and base.correctness is not None
    assert answer["comparison"] == compare(worker.correctness, base.correctness).as_dict()
    assert answer["comparison"] == graders["comparison"]
    assert answer["comparison"]["discordant"] == [limit // 2, 0]  # the even problems, taught right


def test_a_result_is_kept_by_files_and_key_and_a_folder_is_named_from_the_working_folder(
    command: EvaluateCommand, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    copy_model(tiny_base_model, work / "ckpt")
    monkeypatch.chdir(work)
    arguments = ("ckpt", "-t", "arith", "--limit", "2", "--json")

    code, first, err = command.run(*arguments)
    assert code == 0, err
    assert command.evaluations == ["hf"] and CACHED not in err
    assert json.loads(first)["model"] == str(work / "ckpt")

    code, again, err = command.run(*arguments)
    assert code == 0, err
    assert command.evaluations == ["hf"], "the second call evaluated again"
    assert CACHED in err
    assert again == first

    # Other weights are another checkpoint; another limit another key: each evaluated once.
    make_unique(work / "ckpt")
    code, changed, err = command.run(*arguments)
    assert code == 0, err
    assert command.evaluations == ["hf", "hf"] and CACHED not in err
    assert json.loads(changed)["eval_key"] == json.loads(first)["eval_key"]
    code, fewer, err = command.run("ckpt", "-t", "arith", "--limit", "1", "--json")
    assert code == 0, err
    assert command.evaluations == ["hf", "hf", "hf"]
    assert json.loads(fewer)["eval_key"] != json.loads(first)["eval_key"]
    assert json.loads(fewer)["n"] == 1


def test_text_output_shows_the_interval_protocols_and_comparison(
    command: EvaluateCommand, tiny_base_model: Path
) -> None:
    """The model against itself: nothing to tell apart, and the base is evaluated once (the same files)."""
    code, out, err = command.run(
        str(tiny_base_model), "-t", "arith", "--limit", "2", "--base", str(tiny_base_model)
    )
    assert code == 0, err
    assert command.evaluations == ["hf"]
    assert "score 0.00  (95 % interval 0.00 to" in out
    assert "protocols: opencompass 0.00  flexible 0.00  strict 0.00" in out
    assert "+0.00 points" in out and "exact McNemar p = 1" in out and "not distinguishable" in out


class OneProblemTask(ArithTask):
    """A task whose train split (one problem) is too small to carve a validation split from."""

    name = "one-problem"

    def __init__(self) -> None:
        super().__init__(train_size=1)


def pickle_only(folder: Path, tiny_base_model: Path) -> Path:
    folder.mkdir()
    shutil.copy(tiny_base_model / "config.json", folder / "config.json")
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    return folder


def malformed(folder: Path, tiny_base_model: Path, case: str) -> Path:
    """A copy of the base model whose header declares sizes past 2**63 (their product had more
    digits than Python formats) or, sharded, whose index maps a tensor to a list."""
    copy_model(tiny_base_model, folder)
    if case.startswith("malformed header"):
        header, data = read_safetensors(folder / "model.safetensors")
        header["model.norm.weight"]["shape"] = [10**299] * 20
        write_safetensors(folder / "model.safetensors", header, data)
    else:
        shards = split_into_shards(folder)
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        index["weight_map"]["model.norm.weight"] = shards
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize(
    ("case", "fix"),
    [
        ("missing folder", "does not exist; pass an existing folder that holds config.json"),
        ("malformed header", "each a whole number below 2**63); save the model"),
        ("malformed header beside a base", "each a whole number below 2**63); save the model"),
        ("malformed index beside a base", "not to the name of a *.safetensors file in the same folder"),
        ("pickle-only weights", "save it with model.save_pretrained(path)"),
        ("pickle-only weights beside a base", "save the model with model.save_pretrained(path)"),
        ("unknown task", "known tasks: arith, gsm8k; pass one of them with -t"),
        ("no validation split", "has no validation split"),
        ("limit 0", "--limit must be a positive number of problems, such as 20, not 0"),
        ("negative limit", "--limit must be a positive number of problems, such as 20, not -3"),
    ],
)
def test_bad_input_exits_2_naming_the_fix(
    case: str,
    fix: str,
    command: EvaluateCommand,
    tiny_base_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, task, extra = str(tiny_base_model), "arith", []
    if case == "missing folder":
        model = str(tmp_path / "nowhere")
    elif case.startswith("malformed"):
        model = str(malformed(tmp_path / "malformed", tiny_base_model, case))
        if case.endswith("beside a base"):
            extra = ["--base", str(tiny_base_model)]
    elif case.startswith("pickle-only"):
        model = str(pickle_only(tmp_path / "pickled", tiny_base_model))
        if case.endswith("beside a base"):
            extra = ["--base", str(tiny_base_model)]
    elif case == "unknown task":
        task = "nope"
    elif case == "no validation split":
        monkeypatch.setitem(autorl.tasks._REGISTRY, OneProblemTask.name, OneProblemTask)
        task, extra = OneProblemTask.name, ["--split", "validation"]
    elif case == "limit 0":
        extra = ["--limit", "0"]
    else:
        extra = ["--limit", "-3"]
    code, out, err = command.run(model, "-t", task, *extra)
    assert code == EXIT_BAD_INPUT, err
    assert out == ""
    assert fix in err and "Traceback" not in err
    assert command.evaluations == []
    if case == "no validation split":
        assert "use --split test" in err


@pytest.fixture(autouse=True)
def _no_leftover_snapshots(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every call removes its snapshots: evaluator storage holds no copy of a model afterwards."""
    yield
    home_dir = request.node.funcargs.get("home")
    if isinstance(home_dir, Path):
        leftovers = list((home_dir / "eval").glob("evaluate-*"))
        assert leftovers == []


#: A folder name that drives a terminal: a hyperlink, the window title, a cursor move, an erased
#: line, colours and a C1 control.
TERMINAL_NAME = (
    "\x1b]8;;https:evil.example\x1b\\OK\x1b]8;;\x1b\\\x1b]0;title\x07\x1b[1A\x1b[2K\x1b[31mRED\x1b[0m\x9b2J"
)
#: What starts a terminal's control sequence or rings it: ESC, BEL, DEL and the C1 controls (a
#: progress bar's carriage returns are the loading library's own).
CONTROLS = re.compile("[\x07\x1b\x7f-\x9f]")


def test_a_folder_reached_through_a_link_is_shown_escaped(
    command: EvaluateCommand, tiny_base_model: Path, tmp_path: Path
) -> None:
    """A checkpoint named through a link (as an agent's output/final) is shown by the folder the
    link resolves to, whatever its name holds: escaped in the progress lines and the result."""
    output = tmp_path / "output"
    checkpoint = copy_model(tiny_base_model, output / TERMINAL_NAME)
    (output / "final").symlink_to(TERMINAL_NAME)
    code, out, err = command.run(
        str(output / "final"), "-t", "arith", "--limit", "1", "--base", str(tiny_base_model)
    )
    assert code == 0, err
    shown = printable(str(checkpoint.resolve()))
    assert f"autorl evaluate: checking and copying {shown}\n" in err
    assert out.startswith(f"{shown} on arith (test split, 1 problems)\n")
    assert CONTROLS.search(out) is None and CONTROLS.search(err) is None


def test_the_spinner_shows_its_message_escaped() -> None:
    """On a terminal the progress is a spinner: its text is escaped too, and never read as markup."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=400)
    with _status(console, f"evaluating {TERMINAL_NAME}[/bold] on 1 arith problems"):
        console.print(Text("working"))
    drawn = out.getvalue()
    assert f"autorl evaluate: evaluating {printable(TERMINAL_NAME)}[/bold] on 1 arith problems" in drawn
    # Only the spinner's own cursor moves: no title, hyperlink, bell or C1 control of the name's.
    assert "\x1b]" not in drawn and "\x07" not in drawn and "\x9b" not in drawn
