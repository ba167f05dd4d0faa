"""`autorl run` end to end, as a user runs it: a real grader, a real evaluator worker, real agents.

Kept short: the tiny builtin model, a few test problems, few generated tokens. The database is
the product's default (SQLite in the run's home) unless AUTORL_DATABASE_URL says otherwise.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from autorl.layout import runner_log_subpath
from tests.support.fault_records import record_fault
from tests.support.infra import free_port

pytestmark = pytest.mark.slow
#: The installed command, as a user runs it.
AUTORL = str(Path(sys.executable).parent / "autorl")

#: A reference-style agent: plain Python (standard library only), no platform import, no header:
#: the capability URL alone authenticates it.
REFERENCE_AGENT = """\
import json, os, shutil, urllib.error, urllib.request

URL = os.environ["GRADING_SERVER_URL"]
OUT = os.environ["OUTPUT_DIR"]


def call(route, body=None):
    request = urllib.request.Request(
        URL + route,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def save(name, answers=None):
    target = os.path.join(OUT, name)
    shutil.copytree(os.environ["MODEL_PATH"], target)
    os.chmod(target, 0o755)
    for entry in os.listdir(target):
        os.chmod(os.path.join(target, entry), 0o644)
    return "output/" + name


def record(name, value):
    with open(os.path.join(OUT, name + ".json"), "w") as handle:
        json.dump(value, handle)
"""


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    home: Path
    seconds: float

    def results(self) -> list[dict[str, object]]:
        out = subprocess.run(
            [AUTORL, "results", "--json", "--home", str(self.home)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows: list[dict[str, object]] = json.loads(out)
        return rows

    def workspace(self) -> Path:
        return Path(str(self.results()[-1]["workspace"]))

    def runner_log(self, row: int = -1) -> str:
        """The runner's own events of the run of results row ``row`` (the last by default): under
        the home, out of the agent's reach."""
        return (self.home / runner_log_subpath(str(self.results()[row]["run_id"]))).read_text()


@pytest.fixture
def autorl_run(tmp_path: Path) -> Callable[..., Run]:
    home = tmp_path / "home"

    def start(*args: str, env: dict[str, str] | None = None, timeout_s: float = 300) -> Run:
        environment = {
            **os.environ,
            "AUTORL_HOME": str(home),
            "AUTORL_EVAL_LIMIT": "4",
            "AUTORL_EVAL_MAX_NEW_TOKENS": "8",
            "AUTORL_EVAL_DEVICE": "cpu",
            **(env or {}),
        }
        started = time.monotonic()
        done = subprocess.run(
            [AUTORL, "run", *args],
            capture_output=True,
            text=True,
            env=environment,
            timeout=timeout_s,
        )
        return Run(done.returncode, done.stdout, done.stderr, home, time.monotonic() - started)

    return start


def write_agent(tmp_path: Path, body: str) -> str:
    # Readable by the sandboxed agent's own user (pytest makes its folders private).
    tmp_path.chmod(0o755)
    path = tmp_path / "agent.py"
    path.write_text("#!/usr/bin/env python3\n" + REFERENCE_AGENT + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def leftover_processes(home: Path) -> list[int]:
    """Processes whose environment names this test's home (grader, workers, agents)."""
    marker = f"AUTORL_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def run_on_tiny_arith(
    autorl_run: Callable[..., Run],
    agent: str,
    timeout_s: int,
    *args: str,
    env: dict[str, str] | None = None,
) -> Run:
    """``autorl run`` of ``agent`` on arith with the tiny model for ``timeout_s``, its grader on a
    free port, with ``args`` last and ``env`` added to the environment."""
    flags = {"-a": agent, "-t": "arith", "-m": "builtin:tiny-qwen2", "--timeout": str(timeout_s)}
    return autorl_run(
        *[part for item in flags.items() for part in item], "--port", str(free_port()), *args, env=env
    )


def test_short_local_experiment(tmp_path: Path, autorl_run: Callable[..., Run]) -> None:
    agent = write_agent(
        tmp_path,
        """
        workspace = os.environ["WORKSPACE"]
        record("mirrors_at_start", {
            "run_meta": json.load(open(os.path.join(workspace, "run_meta.json"))),
            "scores": json.load(open(os.path.join(workspace, "scores.json"))),
        })
        record("environ", open("/proc/self/environ", "rb").read().decode().split("\\0"))
        record("time", call("/time"))
        record("submit", call("/submit", {"model_path": save("copy-of-base")}))
        """,
    )
    run = run_on_tiny_arith(
        autorl_run,
        agent,
        120,
        "--env",
        "LLM_API_KEY",
        "--env",
        "MODE=fast",
        env={"PARENT_SECRET": "hunter2", "LLM_API_KEY": "sk-passed", "AUTORL_BASELINE_UNAVAILABLE_S": "0"},
    )
    assert run.code == 0, run.stderr
    assert "baseline" in run.stdout and "best score" in run.stdout and "improvement" in run.stdout
    # The best (a copy of the base model) with its interval; against the baseline it differs on no
    # problem: McNemar p = 1, not distinguishable.
    assert "best 95 %" in run.stdout
    assert "McNemar p = 1, not distinguishable" in run.stdout, run.stdout
    # The progress says what the baseline waits for: the worker (started with the grader) has not
    # reported itself yet, or reported and not taken it yet, or it is being evaluated.
    waits = re.findall(r"phase=baseline (\w+): (.*)", run.stderr)
    assert waits, run.stderr
    for reason, message in waits:
        assert reason in ("EvaluatorsUnavailable", "WaitingForEvaluator", "EvaluatingBaseline"), message
        if reason == "EvaluatorsUnavailable":
            assert "no evaluator takes hf work" in message and "autorl worker" in message

    (row,) = run.results()
    assert row["status"] == "completed" and row["success"] is True
    assert row["task"] == "arith" and row["agent"] == agent and row["base_model"] == "builtin:tiny-qwen2"
    assert isinstance(row["baseline"], float) and isinstance(row["best_score"], float)
    assert isinstance(row["improvement"], float) and row["submissions"] == 1
    assert isinstance(row["duration_s"], float) and 0 < row["duration_s"] < run.seconds + 1
    assert row["driver_model"] is None
    assert row["test_overlap"] == 0 and "test overlap 0" in run.stdout
    # The run's report, written at its end: the copy of the base model is counted as one.
    reports = run.home / "runs" / str(row["run_id"]) / "reports"
    metrics = json.loads((reports / "metrics.json").read_text())
    assert metrics["copy_model_count"] == 1 and metrics["valid_submission_rate"] == 1.0
    assert metrics["score_trajectory"] == [row["best_score"]] and metrics["first_valid_idx"] == 1
    assert (reports / "figures" / "score_trajectory.png").stat().st_size > 0

    workspace = run.workspace()
    for name in (
        "code",
        "output",
        "models/tiny-qwen2",
        "data/train.jsonl",
        "description.md",
        "instructions.md",
        "run_meta.json",
        "scores.json",
        "agent.log",
    ):
        assert (workspace / name).exists(), name
    out = workspace / "output"

    status, submitted = json.loads((out / "submit.json").read_text())
    assert status == 200 and submitted["status"] == "scored"
    assert submitted["score"] == submitted["baseline_score"]  # identical weights reuse the baseline

    start = json.loads((out / "mirrors_at_start.json").read_text())
    assert start["run_meta"]["start_time"] is not None
    assert start["run_meta"]["deadline"] - start["run_meta"]["start_time"] == pytest.approx(120, abs=1)
    assert start["run_meta"]["end_time"] is None  # as the reference's: null while the run goes on
    meta = json.loads((workspace / "run_meta.json").read_text())
    assert meta["last_submit_time"] is not None and meta["timeout_s"] == 120
    assert meta["start_time"] < meta["end_time"] < meta["deadline"]  # the agent ended before its budget
    scores = json.loads((workspace / "scores.json").read_text())
    assert [s["status"] for s in scores] == ["scored"]  # the reference's format: a list, oldest first
    assert scores[0]["baseline_score"] == row["baseline"]

    environ = dict(item.split("=", 1) for item in json.loads((out / "environ.json").read_text()) if item)
    assert "PARENT_SECRET" not in environ and "AUTORL_ADMIN_TOKEN" not in environ
    assert environ["LLM_API_KEY"] == "sk-passed" and environ["MODE"] == "fast"
    assert environ["GRADING_SERVER_URL"].rsplit("/a/", 1)[1] == environ["AUTORL_TOKEN"]
    assert not leftover_processes(run.home)


def test_deadline_ends_an_agent_that_ignores_sigterm(tmp_path: Path, autorl_run: Callable[..., Run]) -> None:
    agent = write_agent(
        tmp_path,
        """
        import signal, time

        def late_submission(*_):
            # After the deadline: the grader must refuse, with a reason.
            record("late_submit", call("/submit", {"model_path": save("late")}))

        signal.signal(signal.SIGTERM, late_submission)
        while True:
            time.sleep(0.2)
        """,
    )
    run = run_on_tiny_arith(autorl_run, agent, 8, "--grace-period", "3")
    assert run.code == 0, run.stderr
    (row,) = run.results()
    assert row["status"] == "completed" and row["submissions"] == 0 and row["success"] is False
    workspace = run.workspace()
    status, refused = json.loads((workspace / "output" / "late_submit.json").read_text())
    assert status == 403 and "end_time" in refused["detail"]
    log = run.runner_log()
    assert "event=deadline action=SIGTERM" in log and "signal=SIGKILL" in log
    assert not leftover_processes(run.home)


def test_results_row_equals_the_database_when_evaluations_are_cancelled(
    tmp_path: Path, autorl_run: Callable[..., Run]
) -> None:
    """The agent leaves evaluations queued and exits; with no time to finish them, the run cancels
    them when it finishes, and results.csv reports exactly what the database holds."""
    agent = write_agent(
        tmp_path,
        """
        record("first", call("/submit", {"model_path": save("copy-of-base")}))
        for index in range(3):
            path = save(f"queued-{index}")
            # New weights (the first weight's low byte): no score to reuse.
            with open(os.path.join(OUT, f"queued-{index}", "model.safetensors"), "r+b") as weights:
                start = 8 + int.from_bytes(weights.read(8), "little")
                weights.seek(start)
                low = weights.read(1)[0]
                weights.seek(start)
                weights.write(bytes([low ^ (index + 1)]))
            record(f"queued-{index}", call("/submit?wait=false", {"model_path": path}))
        """,
    )
    run = autorl_run(
        "-a", agent, "-t", "arith", "-m", "builtin:tiny-qwen2", "--timeout", "120",
        "--finish-wait", "0", "--port", str(free_port()),
    )  # fmt: skip
    assert run.code == 0, run.stderr
    (row,) = run.results()
    from autorl.store import Database, experiments, submissions

    db = Database(f"sqlite:///{run.home / 'autorl.db'}")
    with db.session() as session:
        experiment = experiments.get_experiment(session, str(row["run_id"]))
        rows = [s for s in submissions.experiment_submissions(session, experiment) if not s.is_baseline]
        scored = [s for s in rows if s.status == "scored"]
        baseline = submissions.baseline_submission(session, experiment)
        assert baseline is not None
        baseline_score = baseline.score
    db.dispose()
    cancelled = [s for s in rows if s.status == "failed" and (s.error or "").startswith("cancelled:")]
    assert len(rows) == 4 and len(scored) + len(cancelled) == 4 and cancelled
    assert row["submissions"] == len(scored)
    assert row["best_score"] == max(s.score for s in scored if s.score is not None)
    assert row["baseline"] == baseline_score
    assert not leftover_processes(run.home)


def start_until_agent_runs(
    tmp_path: Path, agent_body: str, *, stdio: int, extra: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    """`autorl run` of an agent that writes output/started and then runs on; returns once it did."""
    home = tmp_path / "home"
    agent = write_agent(tmp_path, agent_body + "open(os.path.join(OUT, 'started'), 'w')\ntime.sleep(600)\n")
    process = subprocess.Popen(
        [
            AUTORL,
            "run",
            "-a",
            agent,
            "-t",
            "arith",
            "-m",
            "builtin:tiny-qwen2",
            "--timeout",
            "300",
            "--grace-period",
            "2",
            "--port",
            str(free_port()),
            *extra,
        ],
        env={
            **os.environ,
            "AUTORL_HOME": str(home),
            "AUTORL_EVAL_LIMIT": "4",
            "AUTORL_EVAL_MAX_NEW_TOKENS": "8",
        },
        stdout=stdio,
        stderr=stdio,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not list(home.glob("runs/*/workspace/output/started")):
        assert process.poll() is None, process.communicate()
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the agent did not start within 240 s: {process.communicate()}")
        time.sleep(0.5)
    return process


#: How long a Ctrl-C'd run may take to stop everything and record itself: seconds here, but minutes
#: on a 2-core machine under the whole suite's load (a run's start took 99 s there, 2026-12-04).
STOP_TIMEOUT_S = 300


@pytest.mark.parametrize("parent", ["default", "ignoring SIGINT"])
def test_ctrl_c_stops_everything_and_records_the_run(tmp_path: Path, parent: str) -> None:
    """Also when started by a parent that ignores SIGINT (a background job of a script, a test
    runner's worker): the ignored disposition is inherited, and the run must still take Ctrl-C."""
    home = tmp_path / "home"
    previous = signal.getsignal(signal.SIGINT)
    if parent != "default":
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # what the run inherits as it starts
    try:
        process = start_until_agent_runs(tmp_path, "import time\n", stdio=subprocess.PIPE)
    finally:
        if parent != "default" and previous is not None:
            signal.signal(signal.SIGINT, previous)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=STOP_TIMEOUT_S)
    assert process.returncode == 130, stderr
    rows = json.loads(
        subprocess.run(
            [AUTORL, "results", "--json", "--home", str(home)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert rows[-1]["status"] == "interrupted" and rows[-1]["success"] is False
    assert not leftover_processes(home)


def test_repeats_give_each_run_its_seed_and_ctrl_c_stops_the_rest(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # Seed 0 ends at once; seed 1 runs on until Ctrl-C; seed 2 must never start.
    body = "import sys, time\nrecord('seed', os.environ['AUTORL_SEED'])\n"
    body += "if os.environ['AUTORL_SEED'] == '0':\n    sys.exit(0)\n"
    process = start_until_agent_runs(tmp_path, body, stdio=subprocess.PIPE, extra=("--repeat", "3"))
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=STOP_TIMEOUT_S)
    assert process.returncode == 130, stderr
    assert "repeat 1/3, seed 0" in stderr and "repeat 2/3, seed 1" in stderr and "repeat 3/3" not in stderr
    assert "stopped by Ctrl-C at repeat 2/3 (seed 1); not run: seeds 2" in stderr
    rows = json.loads(
        subprocess.run(
            [AUTORL, "results", "--json", "--home", str(home)], capture_output=True, text=True, check=True
        ).stdout
    )
    assert [row["status"] for row in rows] == ["completed", "interrupted"]
    ids = [str(row["run_id"]) for row in rows]
    assert f"autorl results --compare {' '.join(ids)}" in stderr
    # Each run's agent got its own seed, recorded in its run folder, where --compare reads it.
    for seed, (run_id, row) in enumerate(zip(ids, rows, strict=True)):
        assert json.loads((Path(str(row["workspace"])) / "output" / "seed.json").read_text()) == str(seed)
        recorded = json.loads((home / "runs" / run_id / "seed.json").read_text())
        assert recorded == {"seed": seed, "repeat": seed + 1, "repeats": 3}
    compared = json.loads(
        subprocess.run(
            [AUTORL, "results", "--json", "--home", str(home), "--compare", *ids],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert [member["seed"] for member in compared["groups"][0]["members"]] == [0, 1]
    assert not leftover_processes(home)


@pytest.mark.faults
def test_a_killed_run_is_recorded_as_interrupted_and_leaves_no_process(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    # A grandchild of the agent, too.
    process = start_until_agent_runs(
        tmp_path, "import subprocess, time\nsubprocess.Popen(['sleep', '600'])\n", stdio=subprocess.DEVNULL
    )
    alive = leftover_processes(home)
    assert len(alive) >= 3  # grader, worker, agent
    process.kill()  # SIGKILL: `autorl run` stops nothing and records nothing itself
    process.wait()
    deadline = time.monotonic() + 30
    while leftover_processes(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftover_processes(home) == []
    (run_dir,) = home.glob("runs/*")
    assert (run_dir / "run.lock").exists()

    def results() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [AUTORL, "results", "--json", "--home", str(home)], capture_output=True, text=True, check=True
        )

    first = results()
    rows = json.loads(first.stdout)
    assert f"run {run_dir.name} was killed" in first.stderr
    assert [(r["run_id"], r["status"], r["success"]) for r in rows] == [(run_dir.name, "interrupted", False)]
    assert rows[0]["baseline"] is not None and rows[0]["submissions"] == 0
    assert not (run_dir / "run.lock").exists()
    assert json.loads(results().stdout) == rows  # recorded once
    record_fault(
        request,
        fault="`autorl run` killed with SIGKILL",
        injected="SIGKILL to `autorl run` while its agent (and a grandchild of it) runs",
        cases=1,
        outcome=f"its {len(alive)} processes (grader, worker, agent) died with it; the next `autorl results` "
        "recorded the run once, as interrupted, with the database's baseline",
        observed={"processes_before": len(alive), "processes_after": 0, "rows": len(rows)},
    )


@pytest.mark.parametrize(
    ("override", "fix"),
    [
        ({"-t": "no-such-task"}, "known tasks"),
        ({"-a": "no_such_agent"}, "a folder with config.yaml, or the path of an executable"),
        ({"-m": "builtin:nope"}, "use one of"),
        ({"-m": "/no/such/model"}, "pass an existing folder"),
        ({"--timeout": "-5"}, "positive number of seconds"),
        ({"--env": "NOT_SET_ANYWHERE"}, "export it or pass"),
    ],
)
def test_bad_input_is_one_line_and_starts_nothing(
    autorl_run: Callable[..., Run], override: dict[str, str], fix: str
) -> None:
    flags = {"-t": "arith", "-a": "example_grpo", "-m": "builtin:tiny-qwen2", "--timeout": "60", **override}
    run = autorl_run(
        *[part for item in flags.items() for part in item], "--port", str(free_port()), timeout_s=120
    )
    assert run.code == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and fix in lines[0], run.stderr
    assert not (run.home / "results.csv").exists()
    assert not leftover_processes(run.home)


def test_busy_port_and_foreign_workspace_are_refused(tmp_path: Path, autorl_run: Callable[..., Run]) -> None:
    base = ["-a", "example_grpo", "-t", "arith", "-m", "builtin:tiny-qwen2", "--timeout", "60"]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        run = autorl_run(*base, "--port", str(port), timeout_s=60)
    assert run.code == 2 and "already in use" in run.stderr and "--port" in run.stderr
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    run = autorl_run(*base, "--port", str(free_port()), "--workspace", str(foreign), timeout_s=60)
    assert run.code == 2 and "not empty" in run.stderr and "--workspace" in run.stderr
    assert (foreign / "notes.txt").read_text() == "keep"
    assert not leftover_processes(run.home)


#: `make run`'s budget. The suite runs beside other tests, so the agent gets less than the 2 cores
#: `make run` has; how far it gets alone is a measurement (bench/results/demo_cpu.json).
DEMO_TIMEOUT_S = 300
#: Far above what the untrained model scores (about 0) and below what one SFT epoch reaches under load.
DEMO_MIN_IMPROVEMENT = 10.0


def _phase_rewards(log: str, phase: str) -> list[float]:
    """The mean rewards the example agent logged while training ``phase``, in order."""
    pattern = re.compile(rf"event=train phase={phase} step=\d+ .*?reward=(-?[\d.]+)")
    return [float(match.group(1)) for match in pattern.finditer(log)]


def test_demo_learns_and_grpo_raises_the_reward(tmp_path: Path, autorl_run: Callable[..., Run]) -> None:
    """`make run`'s path: example_grpo on arith from the untrained tiny model. SFT lifts it far above
    its baseline; the GRPO phase then trains on sampled answers with the exact-match reward and
    submits; each phase's checkpoints are scored; `autorl run` reports the phase, time left and
    latest score while the agent works."""
    run = autorl_run(
        "-a",
        "example_grpo",
        "-t",
        "arith",
        "-m",
        "builtin:tiny-qwen2",
        "--timeout",
        str(DEMO_TIMEOUT_S),
        "--port",
        str(free_port()),
        # 100 test problems and answers of at most 48 tokens (a trained reply has about 20): the
        # untrained model's baseline stays short.
        env={"AUTORL_EVAL_LIMIT": "100", "AUTORL_EVAL_MAX_NEW_TOKENS": "48"},
        timeout_s=1800,
    )
    assert run.code == 0, run.stderr
    (row,) = run.results()
    assert isinstance(row["improvement"], float) and row["improvement"] >= DEMO_MIN_IMPROVEMENT, row
    assert f"improvement  +{row['improvement']:.2f}" in run.stdout
    # An honest agent's files (its code, logs, train data and checkpoints) hold no test problem,
    # and its final is not flagged for a gap between the test problems and their twins.
    assert row["test_overlap"] == 0 and row["lineage"] is None
    assert isinstance(row["twin_score"], float) and row["twin_p_value"] >= 0.01, row
    assert "phase=agent time left" in run.stderr and "latest score" in run.stderr

    # Both phases of the built-in agent ran, each submitted, and every submission was scored.
    scores = json.loads((run.workspace() / "scores.json").read_text())
    paths = [s["model_path"] for s in scores]
    phases = {path.split("/")[-1].split("-")[0] for path in paths}
    assert phases == {"sft", "grpo"} and all(s["status"] == "scored" for s in scores), scores
    assert row["submissions"] == len(paths)
    log = (run.workspace() / "agent.log").read_text()
    assert "event=phase_start phase=sft" in log and "event=phase_start phase=grpo" in log
    # What it submitted is a transformers checkpoint in safetensors, with its tokenizer, no pickles.
    checkpoint = run.workspace() / "output" / paths[0].removeprefix("output/")
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "tokenizer_config.json").is_file()
    assert not list(checkpoint.glob("*.bin"))
    # GRPO trained on rewards that vary (SFT made some sampled answers right): a group of equal
    # rewards would give it nothing to learn from. How much it adds is a measurement (docs/LOCAL.md).
    rewards = _phase_rewards(log, "grpo")
    assert rewards and max(rewards) > -1.0, rewards


#: A sealed run's agent that looks everywhere it can reach for a test score: every agent route
#: (the baseline's and its own ids and every id around them), the admin and dashboard routes
#: through the same URL's host, /final with each refusal, and every file of its workspace.
SEALED_AGENT = """
import glob, urllib.parse

def unique(path):
    # Other weights than the base model's: one low byte of the first tensor changed.
    weights = os.path.join(path, "model.safetensors")
    with open(weights, "r+b") as handle:
        start = 8 + int.from_bytes(handle.read(8), "little")
        handle.seek(start)
        byte = handle.read(1)[0]
        handle.seek(start)
        handle.write(bytes([byte ^ 1]))
    return path

seen = {}
copy = call("/submit", {"model_path": save("copy-of-base")})
trained_path = save("trained")
unique(os.path.join(OUT, "trained"))
trained = call("/submit", {"model_path": trained_path})
seen["submit"] = [copy, trained]
own = trained[1]["submission_id"]
seen["final_refusals"] = [
    call("/final", {}),
    call("/final", {"submission_id": "x"}),
    call("/final", {"submission_id": 2**31 - 1}),
]
seen["final"] = call("/final", {"submission_id": own})
seen["final_again"] = call("/final", {"submission_id": own})
seen["probe"] = {n: call(f"/submissions/{n}") for n in range(1, own + 20)}
for route in ("/scores", "/time", "/health"):
    seen[route] = call(route)
root = urllib.parse.urlsplit(URL)
host = f"{root.scheme}://{root.netloc}"
for route in ("/v1/experiments", "/ui", "/ui/api/summary", "/metrics", "/docs"):
    try:
        with urllib.request.urlopen(host + route, timeout=30) as response:
            seen[route] = [response.status, response.read().decode(errors="replace")]
    except urllib.error.HTTPError as error:
        seen[route] = [error.code, error.read().decode(errors="replace")]
    except OSError as error:
        seen[route] = [None, str(error)]
workspace = os.environ["WORKSPACE"]
import time
for _ in range(60):  # the mirrors are refreshed every few seconds: wait for them to list the scores
    try:
        if json.load(open(os.path.join(workspace, "scores.json"))):
            break
    except ValueError:
        pass
    time.sleep(0.5)
files = {}
for path in glob.glob(os.path.join(workspace, "**"), recursive=True):
    if os.path.isfile(path) and not path.endswith((".safetensors", ".json.tmp")) and "/models/" not in path:
        try:
            files[os.path.relpath(path, workspace)] = open(path, errors="replace").read()
        except OSError:
            pass
seen["files"] = files
record("seen", seen)
"""


def test_a_sealed_run_shows_the_agent_no_test_score_and_evaluates_its_nomination_on_test_once(
    tmp_path: Path, autorl_run: Callable[..., Run]
) -> None:
    from autorl.store import Database, Split, experiments, sealed_final, submissions
    from autorl.tasks.arith import ArithTask
    from autorl.tasks.base import read_problems, split_train

    agent = write_agent(tmp_path, SEALED_AGENT)
    args = ("-a", agent, "-t", "arith", "-m", "builtin:tiny-qwen2", "--timeout", "150")
    run = autorl_run(*args, "--port", str(free_port()), "--feedback", "sealed")
    assert run.code == 0, run.stderr
    (row,) = run.results()
    assert row["feedback"] == "sealed" and row["selection"] == "nominated"
    assert row["test_evaluations"] == 1 and row["submissions"] == 2
    assert isinstance(row["final_score"], float) and row["best_score"] == row["final_score"]
    assert row["final_low"] <= row["final_score"] <= row["final_high"]  # type: ignore[operator]
    assert isinstance(row["final_p_value"], float)
    assert row["improvement"] == pytest.approx(row["final_score"] - row["baseline"])  # type: ignore[operator]
    assert "final " in run.stdout and "nominated" in run.stdout
    # The submissions' best and its comparison are on validation, and said to be: the summary's
    # best score is the final on test.
    assert "validation   best " in run.stdout and "points on validation, McNemar p" in run.stdout
    assert "best 95 %" not in run.stdout
    # The progress (the operator's terminal) names both baselines and shows the final apart.
    assert "on test, " in run.stderr and "final evaluation on test: submission" in run.stderr, run.stderr

    db = Database(f"sqlite:///{run.home / 'autorl.db'}")
    with db.session() as session:
        experiment = experiments.get_experiment(session, str(row["run_id"]))
        rows = submissions.experiment_submissions(session, experiment)
        test_ids = {s.id for s in rows if s.split == Split.TEST}
        validation_ids = {s.id for s in rows if s.split == Split.VALIDATION}
        final = sealed_final.final_submission(session, experiment)
        assert final is not None and final.score == row["final_score"]
        validation_baseline = submissions.baseline_submission(session, experiment, Split.VALIDATION)
        assert validation_baseline is not None
        validation_baseline_score = validation_baseline.score
        nominated = experiment.nominated_submission_id
        assert final.final_of == nominated and len(test_ids) == 2  # the baseline and the final
        # The agent's numbers: its own submissions only (no evaluation on test has one).
        numbers = {s.number: s.id for s in rows if s.number is not None}
        assert set(numbers.values()) <= validation_ids
    db.dispose()

    workspace = run.workspace()
    seen = json.loads((workspace / "output" / "seen.json").read_text())
    # Every answer it got is on the validation split, against the baseline there.
    answers = [answer for _code, answer in seen["submit"]] + seen["/scores"][1]["submissions"]
    assert answers and all(a["split"] == "validation" for a in answers)
    assert all(a["baseline_score"] == validation_baseline_score for a in answers)
    assert seen["final"][0] == 200 and numbers[seen["final"][1]["submission_id"]] == nominated
    assert seen["final_again"][0] == 409
    assert [code for code, _answer in seen["final_refusals"]] == [422, 422, 400]
    # Of every id it probed, only its own submissions answered (validation evaluations): nothing
    # on test has a number it could ask for.
    shown = {int(n) for n, (code, _answer) in seen["probe"].items() if code == 200}
    assert shown == set(numbers) == {1, 2}
    for route in ("/v1/experiments", "/ui/api/summary", "/metrics"):
        assert seen[route][0] in (None, 401, 403, 404), (route, seen[route])
    # No file it could read holds a test-split evaluation: the mirrors list validation scores only.
    files = seen["files"]
    assert "Sealed evaluation" in files["instructions.md"]
    for mirrored in (json.loads(files["scores.json"]), json.loads((workspace / "scores.json").read_text())):
        # As the agent read it, and as the run left it after the final evaluation.
        assert mirrored and all(entry["split"] == "validation" for entry in mirrored)
    assert "score" not in files["run_meta.json"]
    # Its train file holds no validation problem: the validation split was removed from it.
    whole = ArithTask().train_problems()
    agent_train = read_problems(workspace / "data" / "train.jsonl")
    assert agent_train == split_train(whole)[0]
    assert not {p.question for p in agent_train} & {p.question for p in split_train(whole)[1]}
    assert not leftover_processes(run.home)


#: A checkpoint moved by seeded noise, written by the test (the registered "public" checkpoint) and
#: by the agent (which adds a little of its own): the same function in both processes.
NOISE = """\
def noisy(source, target, seed, scale):
    import shutil, torch
    from safetensors.torch import load_file, save_file
    shutil.copytree(source, target)
    os.chmod(target, 0o755)
    for entry in os.listdir(target):
        os.chmod(os.path.join(target, entry), 0o644)
    weights = load_file(os.path.join(source, "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    moved = {
        name: (tensor.float() + scale * torch.randn(tensor.shape, generator=generator)).to(tensor.dtype)
        for name, tensor in sorted(weights.items())
    }
    save_file(moved, os.path.join(target, "model.safetensors"), metadata={"format": "pt"})
"""


def test_test_questions_in_the_agents_files_and_a_public_checkpoints_descent_are_found(
    tmp_path: Path, autorl_run: Callable[..., Run]
) -> None:
    """An agent that brought the test split in (it writes test questions into output/, beside train
    questions, and gzipped into ~/.cache, which is in its workspace) and submits a registered public
    checkpoint with a little noise of its own: the run's row counts the test problems (the train ones
    count nothing) and names the checkpoint; its copy of the base descends from nothing registered."""
    from autorl.models.tiny import build_tiny_qwen2
    from autorl.provenance.lineage import submission_lineage
    from autorl.store import Database, experiments, submissions
    from autorl.tasks.arith import ArithTask, secret_test_seed

    home = tmp_path / "home"
    task = ArithTask()
    test = task.test_problems(secret_test_seed(home / "eval" / "data" / "arith"))  # the evaluator's own seed
    brought = [problem.question for problem in test[:5]]
    cached = [problem.question for problem in test[5:8]]
    train = [problem.question for problem in task.train_problems()[:50]]
    public = tmp_path / "public-instruct"
    namespace: dict[str, object] = {"os": os}
    exec(NOISE, namespace)  # the test's own code, shared with the agent's
    namespace["noisy"](build_tiny_qwen2(tmp_path / "base"), public, 1, 0.05)  # type: ignore[operator]
    agent = write_agent(
        tmp_path,
        NOISE
        + textwrap.dedent(
            f"""
        with open(os.path.join(OUT, "notes.jsonl"), "w") as handle:
            for question in {brought!r}:
                handle.write(json.dumps({{"prompt": question.upper().replace(" ", "  ")}}) + "\\n")
        import gzip
        cache = os.path.join(os.environ["WORKSPACE"], ".cache", "huggingface")
        os.makedirs(cache, exist_ok=True)
        with gzip.open(os.path.join(cache, "test.jsonl.gz"), "wt") as handle:
            handle.write("\\n".join(json.dumps({{"question": q}}) for q in {cached!r}))
        with open(os.path.join(OUT, "train_copy.txt"), "w") as handle:
            handle.write("\\n".join({train!r}))
        noisy(os.environ["MODEL_PATH"], os.path.join(OUT, "tuned"), 1, 0.05)
        noisy(os.path.join(OUT, "tuned"), os.path.join(OUT, "tuned-more"), 2, 0.002)
        call("/submit", {{"model_path": "output/tuned-more"}})
        call("/submit", {{"model_path": save("copy-of-base")}})
        """
        ),
    )
    run = autorl_run(
        "-a", agent, "-t", "arith", "-m", "builtin:tiny-qwen2", "--timeout", "180",
        "--port", str(free_port()), "--known-checkpoint", str(public),
    )  # fmt: skip
    assert run.code == 0, run.stderr
    (row,) = run.results()
    assert row["test_overlap"] == 8 and row["lineage"] == str(public.resolve())
    assert "test overlap 8" in run.stdout and "lineage" in run.stdout
    # The final (the best on test) and the base on the twins of the 4 problems they were scored on.
    assert isinstance(row["twin_score"], float) and 0 <= row["twin_p_value"] <= 1
    assert "twin split" in run.stdout and "twin split: the final scores" in run.stderr
    record = json.loads(next((home / "eval" / "provenance").glob("*.json")).read_text())
    assert [entry["path"] for entry in record["test"]["files"]] == [
        "output/notes.jsonl",
        "workspace/.cache/huggingface/test.jsonl.gz",
    ]
    assert not any(question in json.dumps(record) for question in brought + cached)  # never the text
    db = Database(f"sqlite:///{home / 'autorl.db'}")
    with db.session() as session:
        rows = submissions.experiment_submissions(
            session, experiments.get_experiment(session, str(row["run_id"]))
        )
        named = {sub.model_path.rsplit("/", 1)[-1]: submission_lineage(sub) for sub in rows if sub.number}
    assert named == {"tuned-more": str(public.resolve()), "copy-of-base": None}
