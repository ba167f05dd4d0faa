"""Agents written for the reference AutoRL-Bench, run unchanged under `autorl run`: agent folders
(config.yaml + start script, started with bash), the agents' Python (`requests`, TRL), `--env-file`,
and the answers and files in the reference's shape.

Real grader, worker, sandbox and agents; the tiny builtin model on the offline arith task.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_local_run import Run
from tests.support.infra import free_port
from tests.support.reference import REFERENCE_BEST_FIELDS

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
REFERENCE_GRPO = REPO_ROOT / "examples" / "agents" / "reference_grpo"
TINY = ("-t", "arith", "-m", "builtin:tiny-qwen2")

#: The fields of a scored /submit answer that reference clients and scores.json readers use.
REFERENCE_FIELDS = {
    "submission_id",
    "timestamp",
    "model_path",
    "score",
    "baseline_score",
    "improvement",
    "elapsed_seconds",
    "best",
    "total_submissions",
}


def agent_folder(root: Path, files: dict[str, str], *, copy_of: Path | None = None) -> Path:
    """An agent folder the sandboxed agent's user can read (pytest's folders are private)."""
    root.chmod(0o755)
    folder = root / "agent"
    if copy_of is not None:
        shutil.copytree(copy_of, folder)
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def read(out: Path, name: str) -> Any:
    return json.loads((out / f"{name}.json").read_text())


def assert_refusal(status: int, body: dict[str, Any], expected_status: int, *words: str) -> None:
    assert status == expected_status, body
    assert body["error"] == body["detail"] and all(word in body["error"] for word in words), body


def assert_reference_entry(entry: dict[str, Any]) -> None:
    assert set(entry) >= REFERENCE_FIELDS, entry
    assert isinstance(entry["submission_id"], int) and isinstance(entry["score"], float)
    assert datetime.fromisoformat(entry["timestamp"]).tzinfo is not None
    assert isinstance(entry["elapsed_seconds"], int | float) and entry["elapsed_seconds"] >= 0


PLANT = """\
import json, os, pickle, shutil

import requests

OUT = os.environ["OUTPUT_DIR"]


class Payload:
    # Unpickling this creates a file: the proof that someone loaded a trainer file.
    def __reduce__(self):
        return (open, (os.environ["PAYLOAD_MARKER"], "w"))


planted = os.path.join(OUT, "planted")
shutil.copytree(os.path.join(OUT, "checkpoint-epoch2"), planted)
# Other weights (the first weight's low byte), so that this checkpoint is evaluated, not matched
# to an earlier one.
with open(os.path.join(planted, "model.safetensors"), "r+b") as weights:
    start = 8 + int.from_bytes(weights.read(8), "little")
    weights.seek(start)
    low = weights.read(1)[0]
    weights.seek(start)
    weights.write(bytes([low ^ 1]))
for name in ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
    with open(os.path.join(planted, name), "wb") as handle:
        pickle.dump(Payload(), handle)
URL = os.environ["GRADING_SERVER_URL"]
answer = requests.post(URL + "/submit", json={"model_path": planted}, timeout=600)
names = ("TRAIN_RATIO", "MAX_STEPS", "LLM_API_KEY", "LLM_BASE_URL", "PARENT_ONLY_SECRET")
names += ("AUTORL_ADMIN_TOKEN",)
with open(os.path.join(OUT, "planted.json"), "w") as handle:
    json.dump({"status": answer.status_code, "body": answer.json(),
               "env": {name: os.environ.get(name) for name in names}}, handle)
"""


def test_reference_grpo_agent_folder_trains_submits_and_is_scored(
    tmp_path: Path, autorl_run: Callable[..., Run]
) -> None:
    """The reference-style GRPO agent (examples/agents/reference_grpo), run as the reference runs an
    agent folder; then a checkpoint whose trainer files are pickles that would create a file."""
    folder = agent_folder(
        tmp_path,
        {
            "start.sh": """\
                #!/bin/bash
                set -e
                bash "$(dirname "$0")/train.sh.orig"
                python3 "$(dirname "$0")/plant.py"
                """,
            "plant.py": PLANT,
        },
        copy_of=REFERENCE_GRPO,
    )
    (folder / "train.sh.orig").write_text((REFERENCE_GRPO / "start.sh").read_text())
    (folder / "train.sh.orig").chmod(0o644)
    env_file = tmp_path / "llm.env"
    env_file.write_text(
        '# the LLM credentials\nexport LLM_API_KEY="sk-from-file"\nLLM_BASE_URL=http://llm # model\n'
    )
    never = tmp_path / "never"
    never.mkdir()
    marker = never / "payload-ran"
    run = autorl_run(
        "-a",
        str(folder),
        *TINY,
        "--timeout",
        "400",
        "--port",
        str(free_port()),
        "--env-file",
        str(env_file),
        "--env",
        "MAX_STEPS=1",
        "--env",
        "NUM_GENERATIONS=2",
        "--env",
        "MAX_COMPLETION_LENGTH=8",
        "--env",
        f"PAYLOAD_MARKER={marker}",
        env={"PARENT_ONLY_SECRET": "hunter2", "AUTORL_EVAL_LIMIT": "2"},
        timeout_s=580,
    )
    workspace = run.workspace()
    log = (workspace / "agent.log").read_text()
    assert run.code == 0, f"{run.stderr}\n{log[-3000:]}"
    assert "=== reference-style GRPO agent: task arith, model builtin:tiny-qwen2 ===" in log

    planted = read(workspace / "output", "planted")
    assert planted["env"] == {
        "TRAIN_RATIO": "0.1",  # config.yaml's env_vars
        "MAX_STEPS": "1",  # --env wins over config.yaml
        "LLM_API_KEY": "sk-from-file",  # --env-file, quotes and `export` as a shell reads them
        "LLM_BASE_URL": "http://llm",
        "PARENT_ONLY_SECRET": None,  # nothing else of the caller's environment
        "AUTORL_ADMIN_TOKEN": None,
    }
    # The trainer's pickles were ignored, never loaded: the checkpoint is scored, the payload never ran.
    assert planted["status"] == 200 and planted["body"]["status"] == "scored", planted
    assert {"training_args.bin", "optimizer.pt"} <= set(planted["body"]["ignored_files"])
    assert not marker.exists()

    (row,) = run.results()
    assert row["status"] == "completed" and row["submissions"] == 3
    scores = json.loads((workspace / "scores.json").read_text())
    assert [entry["model_path"] for entry in scores] == [
        "output/checkpoint-epoch1",
        "output/checkpoint-epoch2",
        "output/planted",
    ]
    assert all(entry["status"] == "scored" for entry in scores)
    for entry in scores:
        assert_reference_entry(entry)


CLIENT = """\
import json, os, shutil, time

import requests

URL, OUT = os.environ["GRADING_SERVER_URL"], os.environ["OUTPUT_DIR"]


def record(name, response):
    with open(os.path.join(OUT, name + ".json"), "w") as handle:
        json.dump([response.status_code, response.json()], handle)
    return response.json()


def checkpoint(name, nonce=None):
    target = os.path.join(OUT, name)
    shutil.copytree(os.environ["MODEL_PATH"], target)  # the base model's files are read-only
    os.chmod(target, 0o755)
    if nonce:  # other weights (the first weight's low byte): an evaluation of its own
        path = os.path.join(target, "model.safetensors")
        os.chmod(path, 0o644)
        with open(path, "r+b") as weights:
            start = 8 + int.from_bytes(weights.read(8), "little")
            weights.seek(start)
            low = weights.read(1)[0]
            weights.seek(start)
            weights.write(bytes([low ^ nonce]))
    return target


record("health", requests.get(URL + "/health", timeout=30))
record("time", requests.get(URL + "/time", timeout=30))
record("set_baseline", requests.post(URL + "/set_baseline", json={"score": 100.0}, timeout=30))
record("no_model_path", requests.post(URL + "/submit", json={}, timeout=30))
record("empty_model_path", requests.post(URL + "/submit", json={"model_path": ""}, timeout=30))
record("malformed", requests.post(URL + "/submit", json={"model_path": ["a"]}, timeout=30))
record("missing_folder", requests.post(URL + "/submit", json={"model_path": OUT + "/nowhere"}, timeout=30))
v1 = checkpoint("v1")
first = record("submit_v1", requests.post(URL + "/submit", json={"model_path": v1}, timeout=600))
checkpoint("v2", nonce=2)
second = record(
    "submit_v2", requests.post(URL + "/submit", json={"model_path": "output/v2", "gpu": "0"}, timeout=600)
)
record("submission", requests.get(URL + "/submissions/%d" % first["submission_id"], timeout=30))
record("scores", requests.get(URL + "/scores", timeout=30))
record("time_after", requests.get(URL + "/time", timeout=30))
for _ in range(60):  # scores.json is a mirror, refreshed every few seconds
    mirror = json.load(open(os.path.join(os.environ["WORKSPACE"], "scores.json")))
    if len(mirror) == 2 and all(entry["status"] == "scored" for entry in mirror):
        break
    time.sleep(0.5)
json.dump(mirror, open(os.path.join(OUT, "scores_mirror.json"), "w"))
"""


def test_reference_instructions_client_sees_the_references_shapes(
    tmp_path: Path, autorl_run: Callable[..., Run]
) -> None:
    """A plain-HTTP client written from the reference's instructions, through every endpoint."""
    folder = agent_folder(
        tmp_path,
        {
            "config.yaml": 'name: "Reference client"\nstart: run.sh\n',
            "run.sh": 'python3 "$(dirname "$0")/client.py"\n',
            "client.py": CLIENT,
        },
    )
    run = autorl_run("-a", str(folder), *TINY, "--timeout", "240", "--port", str(free_port()))
    workspace = run.workspace()
    assert run.code == 0, f"{run.stderr}\n{(workspace / 'agent.log').read_text()[-3000:]}"
    out = workspace / "output"

    status, health = read(out, "health")
    assert status == 200 and health["status"] == "ok" and health["task"] == TINY[1]
    assert health["workspace"] == str(workspace)
    assert isinstance(health["available_gpus"], list) and all(
        isinstance(g, str) for g in health["available_gpus"]
    )
    status, budget = read(out, "time")
    assert status == 200 and budget["timeout_s"] == 240 and budget["last_submit_time"] is None
    assert 0 < budget["remaining"] <= 240 and budget["end_time"] - budget["start_time"] == pytest.approx(240)

    assert_refusal(*read(out, "set_baseline"), 403, "baseline")
    assert_refusal(*read(out, "no_model_path"), 400, "model_path")
    assert_refusal(*read(out, "empty_model_path"), 400, "model_path")
    assert_refusal(*read(out, "malformed"), 422, "model_path")
    assert_refusal(*read(out, "missing_folder"), 400, "does not exist")

    status, first = read(out, "submit_v1")
    assert status == 200 and first["status"] == "scored"
    assert_reference_entry(first)
    assert first["model_path"] == "output/v1" and first["improvement"] == 0.0  # a copy scores the baseline
    # best is the whole entry of the best submission, as the reference's is.
    assert first["best"] == {key: first[key] for key in REFERENCE_BEST_FIELDS}
    assert first["total_submissions"] == 1
    status, second = read(out, "submit_v2")
    assert status == 200 and second["status"] == "scored" and second["total_submissions"] == 2
    assert_reference_entry(second)
    assert second["submission_id"] > first["submission_id"] and second["model_path"] == "output/v2"

    status, shown = read(out, "submission")
    assert status == 200 and shown["submission_id"] == first["submission_id"]
    assert shown["timestamp"] == first["timestamp"] and shown["elapsed_seconds"] == first["elapsed_seconds"]
    status, listed = read(out, "scores")
    assert status == 200 and [s["submission_id"] for s in listed["submissions"]] == [
        first["submission_id"],
        second["submission_id"],
    ]
    status, budget = read(out, "time_after")
    assert budget["last_submit_time"] is not None

    # scores.json, as the agent read it while running and as it is left: the reference's list.
    for mirror in (read(out, "scores_mirror"), json.loads((workspace / "scores.json").read_text())):
        assert isinstance(mirror, list)
        assert [entry["submission_id"] for entry in mirror] == [
            first["submission_id"],
            second["submission_id"],
        ]
        for entry in mirror:
            assert_reference_entry(entry)


FAKE_CLAUDE = """\
#!/bin/bash
# Stands in for the Claude Code CLI: records how it was started, then does what the prompt asks.
printf '%s\\n' "$@" > "$OUTPUT_DIR/claude_args.txt"
env > "$OUTPUT_DIR/claude_env.txt"
python3 - <<'PY'
import json, os, shutil

import requests

target = os.path.join(os.environ["OUTPUT_DIR"], "v1")
shutil.copytree(os.environ["MODEL_PATH"], target)
os.chmod(target, 0o755)
answer = requests.post(os.environ["GRADING_SERVER_URL"] + "/submit", json={"model_path": target}, timeout=600)
json.dump(answer.json(), open(os.path.join(os.environ["OUTPUT_DIR"], "v1.json"), "w"))
PY
"""


def test_claude_code_example_gets_the_task_prompt_and_its_key(
    tmp_path: Path, autorl_run: Callable[..., Run]
) -> None:
    """examples/agents/claude_code, with a stand-in for the CLI: started with the task prompt, the
    model from config.yaml, the key from --env-file, a time limit inside the budget."""
    folder = agent_folder(
        tmp_path, {"fake-claude": FAKE_CLAUDE}, copy_of=REPO_ROOT / "examples/agents/claude_code"
    )
    (folder / "fake-claude").chmod(0o755)
    env_file = tmp_path / ".env"
    env_file.write_text("ANTHROPIC_API_KEY=sk-ant-test\n")
    run = autorl_run(
        "-a",
        str(folder),
        *TINY,
        "--timeout",
        "420",
        "--port",
        str(free_port()),
        "--env-file",
        str(env_file),
        "--env",
        f"CLAUDE_BIN={folder / 'fake-claude'}",
    )
    workspace = run.workspace()
    assert run.code == 0, f"{run.stderr}\n{(workspace / 'agent.log').read_text()[-3000:]}"
    out = workspace / "output"
    args = (out / "claude_args.txt").read_text()
    assert "--print\n" in args and "--dangerously-skip-permissions\n" in args and "--model\nsonnet\n" in args
    prompt = args.split("--dangerously-skip-permissions\n", 1)[1]
    description = (workspace / "description.md").read_text().strip()
    instructions = (workspace / "instructions.md").read_text().strip()
    first_train_line = (workspace / "data" / "train.jsonl").read_text().splitlines()[0]
    for part in (description, instructions, first_train_line, str(out), "You have "):
        assert part in prompt
    seconds = int(prompt.split("You have ", 1)[1].split(" seconds", 1)[0])
    assert 60 < seconds <= 420 - 300  # the budget less config.yaml's RESERVE_S
    assert "ANTHROPIC_API_KEY=sk-ant-test" in (out / "claude_env.txt").read_text().splitlines()
    assert json.loads((out / "v1.json").read_text())["status"] == "scored"


def test_the_guides_minimal_training_loop_trains_and_is_scored(
    tmp_path: Path, autorl_run: Callable[..., Run]
) -> None:
    """docs/AGENTS.md's "minimal training loop that submits", run as written (fewer rows)."""
    guide = (REPO_ROOT / "docs" / "AGENTS.md").read_text()
    section = guide.split("## A minimal training loop that submits", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert code.startswith("#!/usr/bin/env python3\n") and "[:200]" in code
    tmp_path.chmod(0o755)
    agent = tmp_path / "train.py"
    agent.write_text(code.replace("[:200]", "[:8]"))
    agent.chmod(0o755)
    run = autorl_run("-a", str(agent), *TINY, "--timeout", "300", "--port", str(free_port()))
    workspace = run.workspace()
    log = (workspace / "agent.log").read_text()
    assert run.code == 0, f"{run.stderr}\n{log[-3000:]}"
    (row,) = run.results()
    assert row["submissions"] == 1 and row["status"] == "completed", log[-3000:]
    (entry,) = json.loads((workspace / "scores.json").read_text())
    assert entry["model_path"] == "output/sft-1" and entry["status"] == "scored"
    assert "200 " in log  # the loop prints the answer's status code and score
