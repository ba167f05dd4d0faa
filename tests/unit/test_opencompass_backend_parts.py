"""The opencompass backend's small parts: device placement, summary reading, OpenCompass's chat shaping."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from autorl.errors import EVALUATOR_FAULT_PREFIX, EvaluationError
from autorl.eval_config import EvalConfig
from autorl.tasks import get_task
from autorl.tasks.base import Problem
from autorl_evaluator.backends.hf.opencompass_chat import cut_at_stop_words, opencompass_messages
from autorl_evaluator.backends.opencompass.backend import (
    OpenCompassBackend,
    engine_fault,
    place,
    read_predictions,
    read_summary_accuracy,
    redact,
    summary_agrees,
    visible_gpus,
)
from autorl_evaluator.backends.opencompass.model_size import weight_bytes
from autorl_evaluator.backends.opencompass.parallel import TensorParallelShape, fits_one_gpu
from autorl_evaluator.failures import EvaluatorFaultError, agent_message
from autorl_evaluator.model_settings import settings_for, within_free_memory_gate
from autorl_evaluator.settings import WorkerSettings
from tests.support.documents import claim

HEADER = "dataset,version,metric,mode,submission\n"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, [0, 1, 2]),
        ({"CUDA_VISIBLE_DEVICES": "3, 5"}, [3, 5]),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        # CUDA stops at the first invalid index: "1,-1,2" means device 1 only.
        ({"CUDA_VISIBLE_DEVICES": "1,-1,2"}, [1]),
    ],
)
def test_visible_gpus_follow_cuda_visible_devices(environ: dict[str, str], expected: list[int]) -> None:
    assert visible_gpus(environ) == expected


def test_device_uuids_are_refused_with_the_fix() -> None:
    with pytest.raises(EvaluationError, match="integer indices"):
        visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8f6c1a2e-0000-0000-0000-000000000000"})


def test_placement(make_settings: Callable[..., WorkerSettings]) -> None:
    shape = TensorParallelShape(attention_heads=12, kv_heads=2, intermediate_size=8960)
    assert place(make_settings(eval_device="cpu"), {"CUDA_VISIBLE_DEVICES": "0,1"}, shape).gpu is None
    assert place(make_settings(eval_device=None), {"CUDA_VISIBLE_DEVICES": ""}, shape).gpu is None
    gpu = place(make_settings(eval_device=None), {"CUDA_VISIBLE_DEVICES": "4,5,6"}, shape).gpu
    assert gpu is not None and gpu.devices == (4, 5) and gpu.cuda_visible_devices == "4,5"
    gpu = place(make_settings(eval_device=None), {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, shape).gpu
    assert gpu is not None and gpu.devices == (0, 1, 2, 3)  # 12 heads do not split over 8
    with pytest.raises(EvaluationError, match="no GPU is visible"):
        place(make_settings(eval_device="cuda"), {"CUDA_VISIBLE_DEVICES": ""}, shape)


def test_summary_accuracy_is_read_and_a_dash_or_missing_row_is_no_score(tmp_path: Path) -> None:
    def summary(name: str, body: str) -> Path:
        work = tmp_path / name
        (work / "20261129_100000" / "summary").mkdir(parents=True)
        (work / "20261129_100000" / "summary" / "summary_20261129_100000.csv").write_text(HEADER + body)
        return work

    assert read_summary_accuracy(summary("ok", "gsm8k,1d7fe4,accuracy,gen,62.50\n")) == 62.5
    assert read_summary_accuracy(summary("dash", "gsm8k,-,-,-,-\n")) is None
    assert read_summary_accuracy(summary("missing", "math,abc,accuracy,gen,10.00\n")) is None
    assert read_summary_accuracy(tmp_path / "nothing") is None


def test_the_summary_agrees_with_a_score_it_rounded_and_not_with_another() -> None:
    # Seen on the whole split: 2 of 1,319 right, summary 0.15, the task's own score 0.1516...
    assert summary_agrees(0.15, 100 * 2 / 1319)
    assert summary_agrees(62.5, 62.5) and summary_agrees(62.12, 62.125) and summary_agrees(62.13, 62.125)
    assert not summary_agrees(0.15, 100 * 3 / 1319)
    assert not summary_agrees(62.5, 62.51)


def test_newest_summary_wins(tmp_path: Path) -> None:
    for stamp, value in (("20261129_100000", "-"), ("20261129_110000", "25.00")):
        folder = tmp_path / stamp / "summary"
        folder.mkdir(parents=True)
        (folder / f"summary_{stamp}.csv").write_text(HEADER + f"gsm8k,1d7fe4,accuracy,gen,{value}\n")
    assert read_summary_accuracy(tmp_path) == 25.0


def test_log_lines_quoting_a_test_problem_are_removed() -> None:
    problem = Problem(
        "Leah buys 6 packs of juice boxes with 8 boxes in each pack. How many boxes does she have?",
        "Leah buys 6*8=<<6*8=48>>48 juice boxes.\n#### 48",
    )
    log = "\n".join(
        [
            "loading model",
            f"prompt: [{problem.question[10:90]}]",
            "ValueError: cannot load weights",
        ]
    )
    assert redact(log, [problem]) == "loading model\nValueError: cannot load weights"


def test_opencompass_shapes_turns_as_its_meta_template_does() -> None:
    messages = [
        {"role": "user", "content": "Question: 1+1?\nAnswer:"},
        {"role": "assistant", "content": "The answer is 2\n"},
        {"role": "user", "content": "Question: 2+2?\nAnswer:"},
        {"role": "user", "content": ""},
    ]
    assert opencompass_messages(messages) == [
        {"role": "user", "content": "Question: 1+1?\nAnswer:\n"},
        {"role": "assistant", "content": "The answer is 2\n"},
        # The empty user turn still carries the meta template's newline, and is merged with "\n".
        {"role": "user", "content": "Question: 2+2?\nAnswer:\n\n\n"},
    ]


def test_a_completion_is_cut_at_every_stop_word() -> None:
    text = "The answer is 4<|im_end|><|endoftext|><|endoftext|>"
    assert cut_at_stop_words(text, ["<|endoftext|>", "<|im_end|>"]) == "The answer is 4"


def test_vllm_takes_no_more_memory_than_the_free_memory_gate_guarantees() -> None:
    default = settings_for({"model_type": "qwen2"})
    assert within_free_memory_gate(default, None).gpu_memory_utilization == 0.9
    # A local worker sharing GPUs with an agent starts once 60 % is free: vLLM may take 60 %, so its
    # own start-up check (free memory >= utilization x total) holds whenever the gate opened.
    assert within_free_memory_gate(default, 0.6).gpu_memory_utilization == 0.6
    assert within_free_memory_gate(default, 0.95).gpu_memory_utilization == 0.9


def test_a_model_that_fits_one_gpu_gets_one_replica_per_gpu(
    make_settings: Callable[..., WorkerSettings],
) -> None:
    shape = TensorParallelShape(attention_heads=28, kv_heads=4, intermediate_size=18944)
    settings = make_settings(eval_device=None)
    gpu = place(settings, {"CUDA_VISIBLE_DEVICES": "2,3,5"}, shape, fits_one_gpu=True).gpu
    assert (
        gpu is not None and gpu.devices == (2, 3, 5) and gpu.replicas == 3 and gpu.tensor_parallel_size == 1
    )
    single = place(settings, {"CUDA_VISIBLE_DEVICES": "4"}, shape, fits_one_gpu=True).gpu
    assert single is not None and single.replicas == 1 and single.devices == (4,)
    sharded = place(settings, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, shape, fits_one_gpu=False).gpu
    assert sharded is not None and sharded.replicas == 1 and sharded.tensor_parallel_size == 4


def test_fitting_one_gpu_leaves_half_of_vllms_share_to_the_kv_cache() -> None:
    h200 = 141 * 1024**3
    qwen_7b = 7_615_616_512 * 2  # bf16
    assert fits_one_gpu(qwen_7b, h200, 0.9)  # 15 GB of weights under 63 GB
    assert not fits_one_gpu(qwen_7b, 24 * 1024**3, 0.9)  # a 24 GB card: shard it
    assert fits_one_gpu(int(0.45 * h200), h200, 0.9) and not fits_one_gpu(int(0.46 * h200), h200, 0.9)
    assert not fits_one_gpu(1, None, 0.9)  # unknown GPU memory: never assume it fits


def test_weight_bytes_count_parameters_from_the_headers(tiny_base_model: Path) -> None:
    import torch
    from safetensors.torch import load_file

    tensors = {
        name: tensor
        for path in tiny_base_model.glob("*.safetensors")
        for name, tensor in load_file(path).items()
    }
    parameters = sum(tensor.numel() for tensor in tensors.values())
    assert parameters > 0 and all(t.dtype in (torch.float32, torch.bfloat16) for t in tensors.values())
    assert weight_bytes(tiny_base_model, "bfloat16") == 2 * parameters
    assert weight_bytes(tiny_base_model, "float32") == 4 * parameters


def predictions(folder: Path, name: str, completions: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    records = {str(i): {"prediction": text} for i, text in enumerate(completions)}
    (folder / name).write_text(json.dumps(records))


def test_predictions_are_read_whole_or_gathered_from_shards_in_order(tmp_path: Path) -> None:
    whole = tmp_path / "whole" / "20261130_000000" / "predictions" / "submission"
    predictions(whole, "gsm8k.json", ["a", "b", "c"])
    assert read_predictions(tmp_path / "whole", 3) == ["a", "b", "c"]
    shards = tmp_path / "shards" / "20261130_000000" / "predictions" / "submission"
    for index, part in enumerate([["a", "b"], ["c", "d"], ["e"]]):
        predictions(shards, f"gsm8k_{index}.json", part)
    assert read_predictions(tmp_path / "shards", 5) == ["a", "b", "c", "d", "e"]
    (shards / "gsm8k_1.json").unlink()  # a shard lost: the count no longer adds up
    with pytest.raises(EvaluationError, match="2 predictions for 5 problems"):
        read_predictions(tmp_path / "shards", 5)
    with pytest.raises(EvaluationError, match="no predictions file"):
        read_predictions(tmp_path / "none", 5)


def test_an_engine_that_could_not_start_is_the_evaluators_fault(tmp_path: Path) -> None:
    task_log = tmp_path / "work" / "20261130_000000" / "logs" / "infer" / "submission" / "gsm8k.out"
    task_log.parent.mkdir(parents=True)
    task_log.write_text("loading weights\nTraceback (most recent call last):\nValueError: model failed\n")
    assert not engine_fault(tmp_path)  # a checkpoint that fails to load is the submission's failure
    task_log.write_text(
        "ValueError: Total number of attention heads (14) must be divisible by tensor parallel size (4).\n"
    )
    assert engine_fault(tmp_path)
    message = agent_message(EvaluatorFaultError("vLLM could not start the model on this worker's GPUs"))
    assert message.startswith("evaluator error (not your checkpoint's fault; it does not count")


def test_a_missing_opencompass_command_is_the_evaluators_fault_from_any_folder(
    tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from a folder outside the repository: the default command is still the repository's
    (`make setup`'s), and a command that is not there fails the evaluation at once as the
    evaluator's fault (not counted against the submission), naming the command and the fix, all as
    docs/EVALUATION.md says: the environment it names, the setting that names another command, and
    the words the agent reads."""
    repository = Path(__file__).resolve().parents[2]
    environment, setting, agent_reads = claim(
        r"By default the `opencompass` of the repository's `([^`]+)`.*?; `(AUTORL_\w+)` names another"
        r".*?A missing command fails the evaluation as the evaluator's fault: the agent reads `([^`]+)`",
        "docs/EVALUATION.md",
    ).groups()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(setting, raising=False)
    assert WorkerSettings().opencompass_bin == repository / environment / "bin" / "opencompass"
    monkeypatch.setenv(setting, str(tmp_path / "elsewhere" / "opencompass"))
    assert WorkerSettings().opencompass_bin == tmp_path / "elsewhere" / "opencompass"
    monkeypatch.delenv(setting)
    missing = tmp_path / "nowhere" / "bin" / "opencompass"
    config = EvalConfig(task="arith", backend="opencompass", max_new_tokens=8, limit=1)
    problem = Problem(question="What is 1 + 1?", answer="1 + 1 = 2\n#### 2")
    with pytest.raises(EvaluatorFaultError) as failure:
        OpenCompassBackend().evaluate(
            tiny_base_model, get_task("arith"), [problem], config, WorkerSettings(opencompass_bin=missing)
        )
    message = agent_message(failure.value)
    assert message.startswith(f"{EVALUATOR_FAULT_PREFIX} (not your checkpoint's fault")
    assert message.startswith(agent_reads)
    assert str(missing) in message and setting in message
    assert not (tmp_path / "nowhere").exists()


def test_the_fit_is_read_from_the_gpus_and_the_weights(
    tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, 80000, 81559'\necho '1, 80000, 81559'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    model = settings_for({"model_type": "qwen2"})
    assert OpenCompassBackend._fits_one_gpu(tiny_base_model, model)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    assert not OpenCompassBackend._fits_one_gpu(broken, model)  # unreadable: shard, let vLLM say why
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert not OpenCompassBackend._fits_one_gpu(tiny_base_model, model)  # no GPU to fit
