"""The parts of the GPU benchmarks that run on a CPU (bench/grpo_trl_vllm_gpu.py,
bench/vllm_warm_reload_gpu.py, bench/engine_race_gpu.py): variant names, step summaries, ratios within
a call, joining calls' files, the padded tokenizer, the learning comparison's problems, order and
summary, answer comparison, and the engine race's settings and profile (the measurements themselves
run only on a GPU machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[ModuleType, ModuleType]]:
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import grpo_trl_vllm_gpu
        import vllm_warm_reload_gpu

        yield grpo_trl_vllm_gpu, vllm_warm_reload_gpu
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))


@pytest.fixture(scope="module")
def common() -> Iterator[ModuleType]:
    """bench/common.py, the benchmarks' shared helpers."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import common

        yield common
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))


def test_variant_names_parse_and_give_trl_one_update_per_generation_batch(common: Any) -> None:
    variant = common.parse_variant("trl_vllm_64x8")
    assert (variant.engine, variant.prompts, variant.generations, variant.name) == (
        "trl_vllm",
        64,
        8,
        "trl_vllm_64x8",
    )
    assert variant.trl_batches(32) == (32, 16)
    assert variant.trl_batches(16) == (16, 32)
    assert common.parse_variant("fast_2x4").trl_batches(16) == (8, 1)
    assert common.parse_variant("trl_16x8").engine == "trl"
    for bad in ("vllm_2x4", "fast_2by4", "fast_0x4", "fast_2x1", "fast_40x2", "fast_12x2", "fast"):
        with pytest.raises(ValueError, match="variant"):
            common.parse_variant(bad)


def test_the_loss_takes_fewer_rows_at_a_time_on_a_card_under_120_gib(
    common: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    for gib, rows in ((139.8, 32), (79.2, 16)):
        card = SimpleNamespace(total_memory=int(gib * 2**30))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index, card=card: card)
        assert common.micro_batch() == rows
        # Both paths take the same rows: TRL's micro-batch, the fast path's loss micro-batch.
        assert common.parse_variant("trl_vllm_16x8").trl_batches(common.micro_batch()) == (rows, 128 // rows)


def test_summary_leaves_out_the_warmup_step_and_keeps_every_reward(common: Any) -> None:
    steps = [
        {"seconds": 9.0, "completion_tokens": 100, "reward": -1.0},
        {"seconds": 2.0, "completion_tokens": 80, "reward": -0.5},
        {"seconds": 2.0, "completion_tokens": 120, "reward": 0.25},
    ]
    summary = common.summarise(steps, completions=4)
    assert summary["steps_timed"] == 2
    assert summary["completion_tokens_per_s"] == 50.0
    assert summary["step_s"] == 2.0
    assert summary["mean_completion_tokens"] == 25.0
    assert summary["reward_per_step"] == [-1.0, -0.5, 0.25]
    assert summary["warmup_step_s"] == 9.0
    with pytest.raises(ValueError, match="at least 2"):
        common.summarise(steps[:1], completions=4)


def test_ratios_pair_variants_of_one_size_and_merge_joins_calls(bench: Any, common: Any) -> None:
    grpo, _ = bench
    first = {
        "date": "d1",
        "command": "c1",
        "environment": {"gpu": "g"},
        "variants": {
            "trl_vllm_2x4": {"completion_tokens_per_s": 100.0},
            "fast_2x4": {"completion_tokens_per_s": 50.0},
            "fast_16x8": {"completion_tokens_per_s": 900.0},
        },
    }
    second = {
        "date": "d2",
        "command": "c2",
        "variants": {
            "trl_vllm_16x8": {"completion_tokens_per_s": 300.0},
            "fast_64x8": {"status": "error"},
        },
    }
    assert common.ratios(first["variants"]) == {"fast_2x4_over_trl_vllm_2x4": 0.5}
    merged = grpo.merge([first, second])
    assert merged["calls"] == [{"date": "d1", "command": "c1"}, {"date": "d2", "command": "c2"}]
    assert merged["variants"]["trl_vllm_16x8"]["call"] == 1
    assert merged["environment"] == {"gpu": "g"}
    # fast_16x8 (call 0) is set against trl_vllm_16x8 (call 1) apart from the ratios within a call.
    assert merged["ratios"] == {"fast_2x4_over_trl_vllm_2x4": 0.5}
    assert merged["ratios_across_calls"] == {"fast_16x8_over_trl_vllm_16x8": 3.0}
    assert "ratios_across_calls" not in grpo.merge([first])
    with pytest.raises(ValueError, match="two calls"):
        grpo.merge([first, first])


def test_padding_appends_fillers_after_every_id_and_encodes_as_before(common: Any, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate(alphabet)}
    vocab["12"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[("1", "2")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    special = len(vocab)
    texts = ["12 + 30 = 42<|endoftext|>", "\u27e6300\u27e7 caf\u00e9", common.FILLER.format(special + 1)]
    before = [tokenizer.encode(text).ids for text in texts]
    size = special + 1 + 40
    assert common.pad_vocabulary(tmp_path, size) == 40
    padded = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert [padded.encode(text).ids for text in texts] == before
    assert padded.token_to_id("<|endoftext|>") == special
    written = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    # Every id below the size is the model's, the special token's too, each once.
    assert sorted(written.values()) == list(range(size))
    assert written["<|endoftext|>"] == special
    assert json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8")) == written
    assert padded.decode([special + 1, size - 1]) == common.FILLER.format(special + 1) + common.FILLER.format(
        size - 1
    )
    assert common.pad_vocabulary(tmp_path, size) == 0  # padded already


@pytest.fixture(scope="module")
def t2_tokenizer(common: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """bench/resident_engine_gpu.py's T2 tokenizer files (the view of bench/opencompass_vllm_gpu.py's
    submission: the builtin Qwen2-format tokenizer, the Qwen2.5-1.5B config), and a padded copy."""
    from autorl_evaluator.backends.opencompass.model_view import build_view

    root = tmp_path_factory.mktemp("t2")
    common.write_config_and_tokenizer(root / "submission")
    view = build_view(root / "submission", root / "view")
    padded = root / "padded"
    padded.mkdir()
    for path in view.iterdir():
        shutil.copyfile(path, padded / path.name)
    config = json.loads((padded / "config.json").read_text(encoding="utf-8"))
    assert common.pad_vocabulary(padded, config["vocab_size"]) > 0
    return view, padded


def test_padded_t2_tokenizer_keeps_every_id_through_transformers(
    common: Any, t2_tokenizer: tuple[Path, Path]
) -> None:
    from transformers import AutoTokenizer

    from autorl.tasks import get_task
    from autorl.tasks.arith import generate_problems

    view, padded = t2_tokenizer
    before, after = AutoTokenizer.from_pretrained(view), AutoTokenizer.from_pretrained(padded)
    size = json.loads((padded / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    task = get_task("gsm8k")
    problems = generate_problems(3, 3)
    texts = [task.render_prompt(before, p.question) for p in problems] + [
        "Ben has 8 + 3 = 11 cups now.\nThe answer is 11\n<|im_end|>",
        "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
        "naïve café 😀 \t\n\n  1,234.5 #### 42",
        common.FILLER.format(size - 1) + " ⟦ ⟧",
    ]
    assert texts[0] == task.render_prompt(after, problems[0].question)
    for text in texts:
        assert after(text).input_ids == before(text).input_ids
        assert (
            after(text, add_special_tokens=False).input_ids
            == before(text, add_special_tokens=False).input_ids
        )
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert after.convert_tokens_to_ids(token) == before.convert_tokens_to_ids(token) < len(before)
    assert (after.eos_token_id, after.pad_token_id) == (before.eos_token_id, before.pad_token_id)
    assert sorted(after.all_special_ids) == sorted(before.all_special_ids)
    # Every id the model can sample decodes; past the tokenizer's own ids, to a filler's text.
    assert len(after) == size
    tokens = after.convert_ids_to_tokens(list(range(size)))
    assert None not in tokens
    decoded = after.batch_decode([[token_id] for token_id in range(size)])
    assert decoded[len(before)] == common.FILLER.format(len(before))
    assert decoded[size - 1] == common.FILLER.format(size - 1)
    assert decoded[: len(before)] == before.batch_decode([[token_id] for token_id in range(len(before))])


def test_learning_problems_are_none_of_t2s_training_draw_nor_evaluated(bench: Any, common: Any) -> None:
    from autorl.tasks.arith import generate_problems

    grpo, _ = bench
    held_out, problems, described = grpo.learning_problems(256, 16 * 13)
    assert (len(held_out), len(problems), described["held_out"], described["grpo"]) == (256, 208, 256, 208)
    evaluated = {p.question for p in common.evaluated_problems()}
    trained = {p.question for p in generate_problems(common.TRAIN_PROBLEM_SEED, 4096 + len(evaluated))}
    questions = [p.question for p in held_out + problems]
    assert len(set(questions)) == len(questions)
    assert not set(questions) & (evaluated | trained)
    # The held-out set does not depend on how many GRPO problems a run draws.
    assert grpo.learning_problems(256, 16)[0] == held_out


def test_trl_dataset_order_is_the_fast_paths_draw_order(common: Any) -> None:
    import torch

    from autorl_agents.fast_grpo import FastGRPO, FastGRPOSettings

    trainer = FastGRPO(
        model=torch.nn.Linear(2, 2),
        tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=1),
        prompts=[[5, 6, index] for index in range(40)],
        answers=["1"] * 40,
        reward=lambda completions, answers: [0.0] * len(completions),
        settings=FastGRPOSettings(
            prompts_per_step=8, num_generations=2, max_completion_length=4, learning_rate=1.0, seed=3
        ),
    )
    order = common.fast_order(40, 3, epochs=2)
    assert order[:40] == common.fast_order(40, 3)
    assert [trainer.next_problems() for _ in range(10)] == [order[i : i + 8] for i in range(0, 80, 8)]


def test_learning_comparison_sets_the_reward_curves_side_by_side(bench: Any) -> None:
    grpo, _ = bench
    call = {"rewards": [1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0], "problems": [3, 7]}
    step = grpo.step_record(2.0, 40, call, group=4)
    assert step == {
        "seconds": 2.0,
        "completion_tokens": 40,
        "reward": -0.75,
        "accuracy": 0.125,
        "groups_with_signal": 1,
        "problems": [3, 7],
    }

    def steps(rewards: list[float]) -> list[dict[str, Any]]:
        return [{"reward": r, "accuracy": (r + 1) / 2, "problems": [i]} for i, r in enumerate(rewards)]

    variants = {
        "fast_16x8": {"status": "ok", "steps": steps([-0.9, -0.8, -0.7, -0.6, -0.5, -0.4, -0.3])},
        "trl_vllm_16x8": {"status": "ok", "steps": steps([-0.9, -0.9, -0.8, -0.8, -0.7, -0.6])},
        "trl_vllm_2x4": {"status": "error", "error": "x"},
    }
    held_out = {"answers": {"checkpoint": {"accuracy": 10.0}, "fast_16x8": {"accuracy": 14.0}}}
    result = grpo.learning_comparison(variants, held_out)
    assert (result["steps_compared"], result["window"], result["same_problems_every_step"]) == (6, 2, True)
    fast, trl = result["variants"]["fast_16x8"], result["variants"]["trl_vllm_16x8"]
    assert (fast["mean_reward_first"], fast["mean_reward_last"], fast["steps_run"]) == (-0.85, -0.45, 7)
    assert (trl["mean_reward_first"], trl["mean_reward_last"]) == (-0.9, -0.65)
    assert (fast["held_out_accuracy_before"], fast["held_out_accuracy_after"]) == (10.0, 14.0)
    assert "held_out_accuracy_after" not in trl  # its final weights were not answered with
    assert set(result["variants"]) == {"fast_16x8", "trl_vllm_16x8"}
    variants["trl_vllm_16x8"]["steps"][0]["problems"] = [9]
    assert grpo.learning_comparison(variants, None)["same_problems_every_step"] is False


def test_a_learning_run_merges_beside_the_random_weights_calls(bench: Any) -> None:
    grpo, _ = bench
    committed = json.loads((REPO_ROOT / "bench" / "results" / "grpo_trl_vllm_gpu.json").read_text("utf-8"))
    run = {
        "date": "d3",
        "command": "c3",
        "variants": {"fast_16x8": {"status": "ok"}, "trl_vllm_16x8": {"status": "ok"}},
        "learning": {"variants": {}},
    }
    merged = grpo.merge([committed, run])
    assert merged["learning_run"] == run
    assert merged["calls"] == committed["calls"]
    assert merged["variants"] == committed["variants"]
    assert merged["ratios"] == committed["ratios"]
    # Merging the merged file again with another random-weights call numbers that call after.
    later = {"date": "d4", "command": "c4", "variants": {"trl_vllm_8x8": {"completion_tokens_per_s": 1.0}}}
    again = grpo.merge([merged, later])
    assert again["variants"]["trl_vllm_8x8"]["call"] == len(committed["calls"])
    assert again["learning_run"] == run
    with pytest.raises(ValueError, match="random-weights"):
        grpo.merge([run])


def test_answer_comparison_counts_identical_rows_and_shared_leading_ids(bench: Any) -> None:
    _, reload = bench
    result = reload.compare([[1, 2, 3], [1, 2, 3], [4]], [[1, 2, 3], [1, 9, 3], [5, 6]])
    assert result == {"rows": 3, "identical": 1, "mean_identical_leading_ids": 1.3}
    with pytest.raises(ValueError, match="rows"):
        reload.compare([[1]], [])


def test_recorded_command_names_the_environment_and_puts_the_output_under_out(
    common: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/root/site:.:bench")
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER", raising=False)
    monkeypatch.setattr(
        sys, "argv", ["bench/grpo_trl_vllm_gpu.py", "--output", "/tmp/x/r.json", "--steps", "2"]
    )
    assert common.command_line(Path("/tmp/x/r.json")) == (
        "PYTHONPATH=/root/site:.:bench python3 bench/grpo_trl_vllm_gpu.py --output $OUT/r.json --steps 2"
    )


def test_the_worker_run_says_what_the_engine_and_bare_vllm_took_beside_opencompass() -> None:
    """The GPU worker's page names the engine's own share of a warm evaluation and, when the `bare`
    phase ran, vLLM called directly in the same call, with OpenCompass's time over it."""
    from tools import performance_doc

    warm = {"opencompass_s": 6.2, "engine_generate_s": 5.1}
    bare = {"start_s": 41.0, "generate_s": [5.4, 4.9], "opencompass_over_bare": 1.27}
    text = "\n".join(performance_doc.worker_engine_share({"warm_T2": warm, "bare_vllm_T2": bare}))
    assert "generated for 5.1 s" in text and "the split in 5.4, 4.9 s" in text and "**1.27×**" in text
    assert performance_doc.worker_engine_share({"warm_T2": {"opencompass_s": 7.8}}) == []


def test_the_worker_bench_reads_the_engines_share_from_its_log(tmp_path: Path) -> None:
    """bench/opencompass_worker_gpu.py takes the engine's arguments and its last generation's
    seconds from the engine log the worker keeps (the lines engine_server.py prints)."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import opencompass_worker_gpu as worker_bench
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))
    log = tmp_path / "engine.log"
    assert worker_bench.engine_log(log, "generate") == []
    log.write_text(
        "engine ready engine=vllm\n"
        'engine start kwargs={"dtype": "bfloat16", "enforce_eager": false}\n'
        "engine load reused=False seconds=52.1\n"
        "engine generate prompts=1319 seconds=5.432\n"
        "engine load reused=True seconds=0.38\n"
        "engine generate prompts=1319 seconds=4.9\n",
        encoding="utf-8",
    )
    assert worker_bench.engine_generate_s(worker_bench.engine_log(log, "generate")) == 4.9
    started = worker_bench.engine_log(log, "start")
    assert json.loads(started[-1].split("=", 1)[1]) == {"dtype": "bfloat16", "enforce_eager": False}
    assert worker_bench.engine_generate_s([]) is None


@pytest.fixture(scope="module")
def procedure(common: ModuleType) -> tuple[ModuleType, ModuleType]:
    """bench/resident_engine_gpu.py and bench/opencompass_worker_gpu.py (bench/ is on the path while
    ``common`` is held)."""
    import opencompass_worker_gpu
    import resident_engine_gpu

    return resident_engine_gpu, opencompass_worker_gpu


def test_each_worker_phase_keeps_its_own_file_and_the_output_joins_them(
    procedure: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    """A phase run in a later call (whose output folder starts empty) neither loses nor overwrites
    another phase's results: each keeps its file in --keep, the output is written from all of them."""
    _, worker = procedure
    keep, first, later = tmp_path / "keep", tmp_path / "out1" / "w.json", tmp_path / "out2" / "w.json"
    texts = {"warm_T2": ["a", "b"], "command_T2": ["a", "c"]}
    ran = {
        "benchmark": "opencompass_worker_gpu",
        "engine_kwargs": {"dtype": "bfloat16"},
        "runs": {"warm_T2": {"opencompass_s": 6.0}},
    }
    worker.save_phase(SimpleNamespace(keep=keep, output=first), "run", ran, texts)
    in_process = {"runs": {"in_process_T2": {"checkpoint": "T2"}}}
    worker.save_phase(
        SimpleNamespace(keep=keep, output=later), "in-process", in_process, {"in_process_T2": ["a", "b"]}
    )
    joined = json.loads(later.read_text())
    assert set(joined["runs"]) == {"warm_T2", "in_process_T2"}
    assert (
        joined["engine_kwargs"] == {"dtype": "bfloat16"} and joined["benchmark"] == "opencompass_worker_gpu"
    )
    assert joined["agreement"]["in_process_T2"]["identical"] == 2
    assert joined["agreement"]["command_T2"]["identical"] == 1
    # The run phase again: its own file replaced, the in-process phase's kept.
    again = {**ran, "runs": {"warm_T2": {"opencompass_s": 5.0}}}
    worker.save_phase(SimpleNamespace(keep=keep, output=first), "run", again, texts)
    joined = json.loads(first.read_text())
    assert joined["runs"]["warm_T2"]["opencompass_s"] == 5.0 and "in_process_T2" in joined["runs"]


def test_prepare_trains_the_same_steps_a_few_examples_at_a_time_on_a_smaller_card(
    procedure: tuple[ModuleType, ModuleType],
    tiny_base_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The prepare phase's batch through the model in parts gives the whole batch's loss; the part
    size follows the card's memory (the whole batch on an H200, a quarter of it on an 80 GB card)."""
    import torch

    resident, _ = procedure
    base = tmp_path / "A"
    shutil.copytree(tiny_base_model, base)
    examples = [(f"What is {n} plus {n}?", f"{2 * n}\n") for n in range(8)]
    losses = {}
    for micro in (4, 2):
        trained = resident.train(
            base,
            [(2, tmp_path / f"T{micro}")],
            examples,
            batch=4,
            learning_rate=1e-3,
            seed=0,
            micro_batch=micro,
        )
        losses[micro] = trained["loss_every_10"] + [trained["loss_first_last"][-1]]
        assert trained["micro_batch"] == micro and trained["batch"] == 4
    assert losses[2] == pytest.approx(losses[4], rel=1e-4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for total_gib, expected in ((139.8, 16), (79.2, 4)):
        card = SimpleNamespace(total_memory=int(total_gib * 2**30))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _index, card=card: card)
        assert resident.default_micro_batch(16) == expected


@pytest.fixture(scope="module")
def learning(common: ModuleType) -> ModuleType:
    """bench/grpo_learning_gpu.py: the fast path and TRL from one checkpoint with headroom (imported
    while bench/ is on the path, as the common fixture keeps it)."""
    import grpo_learning_gpu

    return grpo_learning_gpu


def test_a_run_is_evaluated_at_its_start_every_interval_and_its_end_and_stops_in_time(learning: Any) -> None:
    import time

    answers = iter(
        [
            [False, False, True, True],
            [True, False, True, True],
            [True, True, True, False],
            [True, True, False, True],
        ]
    )
    progress = learning.Progress(lambda: next(answers), 3.5, 1.5)
    stops = [progress.step(1.0, 100, -0.5, problems=7) for _ in range(4)]
    assert stops == [False, False, False, True]
    assert [(p["t_s"], p["step"], p["accuracy"]) for p in progress.curve] == [
        (0.0, 0, 50.0),
        (2.0, 2, 75.0),
        (3.0, 3, 75.0),
        (4.0, 4, 75.0),
    ]
    run = progress.learned()
    assert (run["steps"], run["trained_s"], run["stopped_by"], run["completion_tokens_per_s"]) == (
        4,
        4.0,
        "seconds",
        100.0,
    )
    # Against the start, problem by problem: gained the first two, lost the third.
    assert (run["accuracy"], run["gains"], run["losses"], run["p_value"]) == (75.0, 2, 1, 1.0)
    speed = learning.Progress(None, float("inf"), 1.0, max_steps=2)
    assert [speed.step(0.5, 10, 0.0), speed.step(0.5, 10, 0.0)] == [False, True]
    assert speed.stopped_by == "steps" and speed.curve == []
    late = learning.Progress(None, float("inf"), 1.0, stop_at=time.time() + 0.5)
    assert late.step(1.0, 10, 0.0) and late.stopped_by == "deadline"


def _paths_call(date: str, runs: dict[str, Any], speed: dict[str, Any]) -> dict[str, Any]:
    return {
        "date": date,
        "command": f"python3 bench/grpo_learning_gpu.py --runs {' '.join(runs)}",
        "environment": {"gpu": "NVIDIA H100 80GB HBM3"},
        "settings": {"learning_rates": [3e-5], "completion_tokens": 64},
        "checkpoint": {
            "accuracy": 20.0,
            "sft_checks": [{"step": 5}],
            "held_out": "10 arith problems of seed 1",
        },
        "runs": runs,
        "speed": speed,
    }


def _learning_run(engine: str, curve: list[tuple[float, float]], problems: list[int]) -> dict[str, Any]:
    return {
        "status": "ok",
        "engine": engine,
        "prompts_per_step": 64,
        "num_generations": 8,
        "curve": [{"t_s": t, "step": i, "accuracy": a} for i, (t, a) in enumerate(curve)],
        "accuracy": curve[-1][1],
        "p_value": 0.01,
        "trained_s": curve[-1][0],
        "steps": len(problems),
        "completion_tokens_per_s": 1000.0,
        "problems_per_step": problems,
        "gains": 3,
        "losses": 1,
    }


def test_the_two_paths_calls_merge_into_time_to_accuracy_both_curves_and_the_table(
    learning: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _learning_run("fast", [(0.0, 20.0), (15.0, 23.0), (30.0, 27.0)], [1, 2, 3])
    trl = _learning_run("trl_vllm", [(0.0, 20.0), (15.0, 21.0), (30.0, 22.5)], [1, 2, 4])
    first = _paths_call(
        "2026-12-06T12:00:00Z",
        {"fast_64x8": fast},
        {"fast_1x8": {"status": "ok", "steps_timed": 20, "completion_tokens_per_s": 50.0}},
    )
    second = _paths_call(
        "2026-12-06T12:10:00Z",
        {"trl_vllm_64x8": trl},
        {"trl_vllm_1x8": {"status": "ok", "steps_timed": 20, "completion_tokens_per_s": 100.0}},
    )
    merged = learning.merge([first, second])
    assert [call["date"] for call in merged["calls"]] == [first["date"], second["date"]]
    assert merged["runs"]["trl_vllm_64x8"]["call"] == 1
    pair = merged["comparison"]["learning"]["fast_64x8_vs_trl_vllm_64x8"]
    assert pair["accuracy"] == {"fast": 27.0, "trl_vllm": 22.5}
    assert pair["seconds_to_accuracy"]["22"] == {"fast": 15.0, "trl_vllm": 30.0}
    assert pair["seconds_to_accuracy"]["26"] == {"fast": 30.0, "trl_vllm": None}
    assert pair["same_problems_leading_steps"] == 2
    assert merged["comparison"]["speed_ratios"] == {"fast_1x8_over_trl_vllm_1x8": 0.5}
    with pytest.raises(ValueError, match="two calls"):
        learning.merge([first, first])
    other = {**second, "checkpoint": {**second["checkpoint"], "sft_checks": [{"step": 10}]}}
    with pytest.raises(ValueError, match="checkpoint"):
        learning.merge([first, other])
    learning.plot(merged, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
    from tools import docgen, performance_doc

    (tmp_path / "grpo_learning_paths_gpu.json").write_text(json.dumps(merged), encoding="utf-8")
    monkeypatch.setattr(docgen, "RESULTS", tmp_path)
    monkeypatch.setattr(performance_doc, "RESULTS", tmp_path)
    table = performance_doc.grpo_paths()
    assert "| `fast_64x8` | 3 | 30.0 | 20.0 → **27.0** | 3 / 1 | 0.01 | 1,000 |" in table
    assert "the same problems in the first 2 of 3 steps" in table
    assert "| `trl_vllm_1x8` (speed) | 20 | — | — | — | — | 100 |" in table
    assert "`fast_1x8_over_trl_vllm_1x8`: **0.5×**" in table


def test_a_fast_path_run_from_a_kept_checkpoint_learns_and_records_its_problems(
    learning: Any, tmp_path: Path
) -> None:
    import argparse

    options = {
        "smoke": True,
        "held_out": 4,
        "completion_tokens": 4,
        "headroom": 100.0,
        "sft_learning_rate": 3e-4,
        "sft_check_steps": 1,
        "sft_max_s": 0.0,
        "learning_rates": [3e-5],
        "seed": 0,
        "grpo_s": 0.01,
        "eval_every_s": 1.0,
        "speed_steps": 1,
    }
    learning.save_checkpoint(tmp_path, tmp_path / "C", argparse.Namespace(**options), "cpu")
    kept = json.loads((tmp_path / "C" / learning.CHECKPOINT_RECORD).read_text(encoding="utf-8"))
    assert kept["held_out"].startswith("4 arith problems") and kept["sft"]["steps"] == 0
    run = argparse.Namespace(
        **options,
        run=learning.common.parse_variant("fast_2x2"),
        mode="learn",
        checkpoint=tmp_path / "C",
        stop_at=None,
    )
    record = learning.run_process(run)
    assert record["status"] == "ok", record.get("error")
    assert (record["steps"], record["stopped_by"], record["train_problems"]) == (1, "seconds", 128)
    assert [point["step"] for point in record["curve"]] == [0, 1]
    assert record["curve"][0]["accuracy"] == kept["accuracy"]
    first = learning.common.fast_order(128, 0)[:2]
    assert record["problems_per_step"] == [learning.digest(first)]


def test_the_engine_race_times_the_engines_own_settings_first_and_puts_them_back(
    common: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/engine_race_gpu.py --settings on the CPU: each setting answers the same ids, the
    engine's own comes first, and the engine's settings are its own again after, a failed call too."""
    import engine_race_gpu
    from transformers import AutoModelForCausalLM

    from autorl.decoding import greedy_engine
    from autorl.models.tiny import build_tiny_qwen2

    model = AutoModelForCausalLM.from_pretrained(build_tiny_qwen2(tmp_path / "m")).eval()
    prompts, stops = [[5, 6, 7], [8, 9, 10, 11], [12]], [3, 9, 5]

    def now() -> tuple[int, float, int]:
        return (greedy_engine.CHECK_EVERY_STEPS, greedy_engine.KEEP_AT_MOST, greedy_engine.SPAN_SLOTS)

    own = now()
    found: dict[str, Any] = {}
    engine_race_gpu.engine_settings(model, prompts, stops, ["check4_keep0.75_span128"], found)
    assert list(found) == [engine_race_gpu.setting_name(own), "check4_keep0.75_span128"]
    assert {run["new_tokens"] for run in found.values()} == {sum(stops)}
    assert now() == own

    def fails_under_another_setting(*args: Any, **kwargs: Any) -> Any:
        if now() != own:
            raise RuntimeError("out of memory")
        return generate(*args, **kwargs)

    generate = greedy_engine.generate_greedy
    monkeypatch.setattr(greedy_engine, "generate_greedy", fails_under_another_setting)
    kept: dict[str, Any] = {}
    with pytest.raises(RuntimeError):
        engine_race_gpu.engine_settings(model, prompts, stops, ["check8_keep0.9_span128"], kept)
    assert list(kept) == [engine_race_gpu.setting_name(own)]  # what was timed before is kept
    assert now() == own

    monkeypatch.setattr(greedy_engine, "generate_greedy", generate)
    profiled = engine_race_gpu.engine_profile(model, prompts, stops)
    assert profiled["wall_s"] >= 0 and profiled["top_kernels"] == []  # no GPU kernels on a CPU


def test_the_engine_race_joins_a_race_with_the_settings_of_another_call(tmp_path: Path) -> None:
    """``engine_race_gpu.py --join RACE SETTINGS``: the race's timings and ratios stay its own; the
    settings, the profile and the call they came from are added; a file without settings is refused."""
    race = {
        "date": "d1",
        "command": "c1",
        "in_process": {"runs": {"ids_stop": {"second": {"seconds": 7.87}}}},
        "ratios": {"ids_stop": {"vllm_over_in_process_second": 0.82}},
    }
    settings = {
        "date": "d0",
        "command": "c0 --settings",
        "in_process": {
            "runs": {"ids_stop": {"second": {"seconds": 7.91}}},
            "ids_stop_settings": {"check8_keep0.75_span128": {"seconds": 8.11}},
            "ids_stop_profile": {"kernel_s": 7.19, "top_kernels": []},
        },
        "ratios": {},
    }
    paths = {name: tmp_path / f"{name}.json" for name in ("race", "settings", "out")}
    for name, data in (("race", race), ("settings", settings)):
        paths[name].write_text(json.dumps(data))

    def join(first: Path, second: Path) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "bench/engine_race_gpu.py", "--join", str(first), str(second)]
        return subprocess.run(
            [*command, "--output", str(paths["out"])], cwd=REPO_ROOT, capture_output=True, text=True
        )

    assert join(paths["race"], paths["settings"]).returncode == 0
    joined = json.loads(paths["out"].read_text())
    assert joined["ratios"] == race["ratios"]
    assert joined["in_process"]["runs"] == race["in_process"]["runs"]
    assert joined["in_process"]["ids_stop_settings"] == {"check8_keep0.75_span128": {"seconds": 8.11}}
    called = {"date": "d0", "command": "c0 --settings", "ids_stop_second_s": 7.91}
    assert joined["in_process"]["settings_call"] == called
    refused = join(paths["settings"], paths["race"])
    assert refused.returncode == 2 and "holds no --settings run" in refused.stderr
