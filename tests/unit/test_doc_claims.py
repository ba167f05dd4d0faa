"""What the documents say the code does or measured, read from the documents and checked against the
code's own values and the committed results: a change on either side that the other does not follow
fails here, not in a reader's hands."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from autorl_evaluator.backends.opencompass.parallel import fits_one_gpu
from autorl_evaluator.model_settings import ModelSettings
from tests.support.documents import claim
from tests.support.result_rows import result_row

REPO = Path(__file__).resolve().parents[2]

#: Parameters of the Qwen2.5 base models, in order of size, as their model cards on the Hugging Face
#: hub state them (huggingface.co/Qwen/Qwen2.5-<size>).
QWEN25_PARAMETERS = {
    "0.5B": 0.49e9,
    "1.5B": 1.54e9,
    "3B": 3.09e9,
    "7B": 7.61e9,
    "14B": 14.7e9,
    "32B": 32.5e9,
    "72B": 72.7e9,
}


def results(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPO / "bench" / "results" / f"{name}.json").read_text("utf-8"))
    return data


def test_the_qwen_sizes_said_to_fit_one_h200_are_those_the_rule_admits() -> None:
    """EVALUATION.md names the H200's memory (as the GPU benchmarks read it) and the largest Qwen2.5
    that runs as one replica per GPU there: the rule's own answer for bf16 weights."""
    found = claim(
        r"On one H200 \(([\d.]+) GiB\) that admits every Qwen2\.5 up to (\w+); (\w+) is sharded",
        "docs/EVALUATION.md",
    )
    memory_gib, largest, sharded = float(found[1]), found[2], found[3]
    assert memory_gib == results("hf_generation_gpu")["environment"]["gpu_memory_gib"]
    utilization = ModelSettings().gpu_memory_utilization
    fit = [
        size
        for size, parameters in QWEN25_PARAMETERS.items()
        if fits_one_gpu(int(2 * parameters), int(memory_gib * 2**30), utilization)
    ]
    sizes = list(QWEN25_PARAMETERS)
    assert fit == sizes[: len(fit)], "the rule admits every size up to a largest one"
    assert largest == fit[-1]
    assert sharded == sizes[len(fit)]


def _default_of(path: Path, name: str) -> str:
    """The default ``os.environ.get(VARIABLE, DEFAULT)`` gives the module constant ``name``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            assert isinstance(node.value, ast.Call) and isinstance(node.value.args[1], ast.Constant)
            return str(node.value.args[1].value)
    raise AssertionError(f"{name} is not assigned in {path}")


def test_the_test_suites_servers_are_those_the_readme_requires() -> None:
    """README's requirements of `make test` name the PostgreSQL the tests connect to and the Redis
    command they start their own servers with (no Redis has to be running)."""
    found = claim(
        r"`make test` also podman \(`make (images GPU=0)`.*?PostgreSQL on ([\d.]+):(\d+) with trust "
        r"authentication and `([\w-]+)` \(the tests start their own\)",
        "README.md",
    )
    images, host, port, redis_command = found.groups()
    infra = REPO / "tests" / "support" / "infra.py"
    dsn = dict(part.split("=", 1) for part in _default_of(infra, "PG_ADMIN_DSN").split())
    assert (dsn["host"], dsn["port"]) == (host, port)
    assert _default_of(infra, "REDIS_SERVER") == redis_command
    assert "port = free_port()" in infra.read_text(encoding="utf-8")  # each test Redis on a port of its own
    recipe = (REPO / "Makefile").read_text(encoding="utf-8").split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    assert f"$(MAKE) --no-print-directory {images}" in recipe


def test_the_demos_figures_are_the_committed_runs() -> None:
    """README quotes the demo's run from bench/results/demo_cpu.json (its `default` variant)."""
    found = claim(
        r"the demo went from ([\d.]+) to ([\d.]+) in ([\d.]+) s \(SFT reached ([\d.]+), GRPO ([\d.]+);",
        "README.md",
    )
    run = results("demo_cpu")["variants"]["default"]
    quoted = [float(value) for value in found.groups()]
    assert quoted == [run["baseline"], run["best_score"], run["wall_s"], run["best_sft"], run["best_grpo"]]
    assert run["agent_args"] == "" and run["exit_code"] == 0  # the defaults of `make run`


def test_the_sample_summary_is_what_autorl_run_prints_for_the_demos_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LOCAL.md's sample summary is the one `autorl run` prints, line for line, for the numbers of
    the demo's committed run (bench/results/demo_cpu.json, `default`): every line the summary has,
    none it lacks. The interval and the paired test follow from the scores, since the baseline got
    every one of arith's test problems wrong."""
    from autorl.protocol.statistics import accuracy_interval, compare
    from autorl.runs.seeds import RunSeed
    from autorl.tasks.arith import TEST_SIZE
    from autorl_local.experiment import LocalRun

    guide = (REPO / "docs" / "LOCAL.md").read_text(encoding="utf-8")
    shown = guide.split("`bench/results/demo_cpu.json`", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    run = results("demo_cpu")["variants"]["default"]
    header = next(line for line in run["terminal_tail"] if line.startswith("Run "))
    match = re.fullmatch(r"Run (\S+) (\w+) in (\d+):(\d\d)", header)
    assert match is not None
    run_id = match[1]
    assert match[2] == "completed"
    right, base_right = (round(score * TEST_SIZE / 100) for score in (run["best_score"], run["baseline"]))
    assert base_right == 0
    best, baseline = "1" * right + "0" * (TEST_SIZE - right), "0" * TEST_SIZE
    low, high = accuracy_interval(best)
    comparison = compare(best, baseline)
    scored = sum(s["status"] == "scored" for s in run["submissions"])
    home = Path("/home/you/.autorl")
    row = result_row(
        run_id,
        timestamp="",
        baseline=run["baseline"],
        best_score=run["best_score"],
        improvement=run["improvement"],
        submissions=scored,
        duration_s=60 * int(match[3]) + int(match[4]),
        workspace=str(home / "runs" / run_id / "workspace"),
        feedback="test",
        final_score=run["best_score"],
        final_low=low,
        final_high=high,
        final_p_value=comparison.p_value,
        selection="best_on_test",
        test_evaluations=scored,
    )
    metrics = {
        "best_score": run["best_score"],
        "best_interval": [low, high],
        "best_difference_interval": list(comparison.interval),
        "best_p_value": comparison.p_value,
        "best_distinguishable": comparison.distinguishable,
    }
    monkeypatch.setenv("COLUMNS", "200")  # one line each, as on a wide terminal
    local_run = SimpleNamespace(
        config=SimpleNamespace(seed=RunSeed(0)),
        last_view=None,
        settings=SimpleNamespace(home=home),
        unverified=[],
    )
    LocalRun._print_summary(local_run, row, None, metrics)
    assert shown == capsys.readouterr().out.lstrip("\n")


def test_the_learning_rates_said_to_differ_by_model_size_are_the_agents_defaults() -> None:
    """LOCAL.md's learning rates of the example agent for a tiny and a larger model, and how many
    times larger they are, are its defaults (with the size that makes a model tiny)."""
    from autorl_agents.example_config import ExampleGRPOConfig, grpo_sizes, sft_sizes
    from autorl_agents.example_grpo import TINY_MODEL_PARAMETERS

    found = claim(
        r"a tiny model \(under (\d+) M parameters\) trains at (\d+) times the SFT learning rate "
        r"\(([\de.-]+) against ([\de.-]+)\) and (\d+) times the GRPO one \(([\de.-]+) against the "
        r"reference's ([\de.-]+)\)",
        "docs/LOCAL.md",
    )
    millions, sft_times, sft_tiny, sft_other, grpo_times, grpo_tiny, grpo_other = found.groups()
    assert int(millions) * 1_000_000 == TINY_MODEL_PARAMETERS
    config = ExampleGRPOConfig()
    sft = {tiny: sft_sizes(config, tiny=tiny).learning_rate for tiny in (True, False)}
    grpo = {tiny: grpo_sizes(config, tiny=tiny).learning_rate for tiny in (True, False)}
    assert (float(sft_tiny), float(sft_other)) == (sft[True], sft[False])
    assert (float(grpo_tiny), float(grpo_other)) == (grpo[True], grpo[False])
    assert int(sft_times) == round(sft[True] / sft[False])
    assert int(grpo_times) == round(grpo[True] / grpo[False])


def test_the_kubernetes_the_guide_requires_is_the_charts_and_the_oldest_that_knows_the_pods_fields() -> None:
    """KUBERNETES.md's minimum Kubernetes is the chart's kubeVersion, and the release it names for
    supplementalGroupsPolicy (set by default on the controller's pods) is the first whose API has it."""
    import kubernetes_validate

    from autorl_controller.operator.settings import ControllerSettings

    found = claim(
        r"Kubernetes ([\d.]+) or newer .*? `supplementalGroupsPolicy`, a field from ([\d.]+): "
        r"on (.*?) install with `--set agents.strictSupplementalGroups=false`",
        "docs/KUBERNETES.md",
    )
    required, field_since, older = found.groups()
    chart = (REPO / "charts" / "autorl" / "Chart.yaml").read_text(encoding="utf-8")
    assert f'kubeVersion: ">={required}.0-0"' in chart
    assert ControllerSettings.model_fields["agent_strict_groups"].default is True
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"securityContext": {"supplementalGroupsPolicy": "Strict"}, "containers": [{"name": "c"}]},
    }

    def knows_the_field(version: str) -> bool:
        try:
            kubernetes_validate.validate(pod, version, strict=True)
        except kubernetes_validate.ValidationError:
            return False
        return True

    versions = sorted(
        {".".join(v.split(".")[:2]) for v in kubernetes_validate.utils.all_versions()},
        key=lambda v: tuple(map(int, v.split("."))),
    )
    first = next(version for version in versions if knows_the_field(f"{version}.0"))
    assert field_since == first
    below = [
        v
        for v in versions
        if tuple(map(int, required.split(".")))
        <= tuple(map(int, v.split(".")))
        < tuple(map(int, first.split(".")))
    ]
    assert older == " and ".join(below)  # the releases the chart installs on that lack the field


def test_the_registration_fields_the_map_lists_are_the_routes_own_and_as_optional() -> None:
    """ARCHITECTURE.md lists every field of `POST /v1/experiments`, with `?` after exactly those the
    request model lets a caller leave out."""
    from autorl.api.request_bodies import RegisterExperiment

    body = claim(r"`POST /v1/experiments` `\{(.*?)\}` → 201", "docs/ARCHITECTURE.md")[1]
    fields = [field.strip() for field in re.sub(r"\([^()]*\)", "", body).split(",")]
    listed = {field.rstrip("?"): field.endswith("?") for field in fields}
    assert len(listed) == len(fields), "a field listed twice"
    model = RegisterExperiment.model_fields
    assert set(listed) == set(model)
    assert {name for name, optional in listed.items() if optional} == {
        name for name, field in model.items() if not field.is_required()
    }


def test_the_results_columns_listed_in_local_md_are_the_files() -> None:
    """LOCAL.md's list of results.csv's columns is the header ``autorl run`` writes, in order."""
    from autorl.runs.results import COLUMNS

    text = " ".join((Path(__file__).parents[2] / "docs" / "LOCAL.md").read_text().split())
    listed = re.search(r"appended under a file lock: `([^`]+)`", text)
    assert listed is not None
    assert tuple(name.strip() for name in listed.group(1).split(",")) == COLUMNS


def test_the_sft_budget_local_md_states_is_the_agents_default() -> None:
    """LOCAL.md's SFT time share and least steps for a tiny model are the example agent's defaults."""
    from autorl_agents.example_config import ExampleGRPOConfig, sft_sizes

    text = " ".join((Path(__file__).parents[2] / "docs" / "LOCAL.md").read_text().split())
    found = re.search(r"`--sft-time-fraction` \(([\d.]+)\) .*?`--sft-min-steps` \((\d+), tiny model\)", text)
    assert found is not None
    config = ExampleGRPOConfig()
    assert float(found[1]) == config.sft_time_fraction
    assert int(found[2]) == sft_sizes(config, tiny=True).min_steps


def test_the_loaded_demos_figures_are_the_committed_run() -> None:
    """README's demo beside two CPU-bound processes is bench/results/demo_cpu_loaded.json's run."""
    found = claim(
        r"Beside two CPU-bound processes on the same two cores it went from 0\.0 to ([\d.]+) in ([\d.]+) s",
        "README.md",
    )
    run = results("demo_cpu_loaded")["variants"]["default_loaded"]
    assert [float(value) for value in found.groups()] == [run["improvement"], run["wall_s"]]
    assert run["busy_processes"] == 2 and run["agent_args"] == "" and run["exit_code"] == 0
    assert run["baseline"] == 0.0
