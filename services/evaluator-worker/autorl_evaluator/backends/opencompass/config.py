"""The OpenCompass config file an evaluation runs: dataset ``gsm8k_gen_1d7fe4`` and one model.

Two model types, chosen by where the evaluation runs:

- GPU: ``VLLMwithChatTemplate``. ``tensor_parallel_size`` and ``run_cfg.num_gpus`` are the same
  number, and the caller makes exactly ``replicas`` times that many devices visible to OpenCompass
  (:class:`GpuPlan`): OpenCompass's ``LocalRunner`` hands a task ``num_gpus`` of the devices it
  can see, and vLLM shards over all the devices its process sees, so they must agree. With several
  replicas (data parallel, one engine per GPU) OpenCompass's own ``NumWorkerPartitioner`` cuts the
  test split into that many consecutive shards, its ``LocalRunner`` runs them at once on separate
  devices, and the shards' predictions (``gsm8k_0.json``, ``gsm8k_1.json``, ...) are read back in
  order.
- CPU: ``HuggingFacewithChatTemplate`` (transformers in float32), for development and tests,
  built by our ``chat_model`` (``compass_models/autorl_chat_model.py``, on OpenCompass's path,
  :data:`CHAT_MODEL_FOLDER`): OpenCompass's ``generate`` decodes with ``batch_decode(outputs)`` and
  no options, keeping special tokens, so ``chat_model`` gives its tokenizer the platform's rule
  (:data:`autorl.eval_config.SKIP_SPECIAL_TOKENS`, passed in the config) and keeps its stop words.
- The resident engine (``resident=True``, ``AUTORL_VLLM_PYTHON`` set): ``VLLMwithChatTemplate``
  wherever the model runs, its ``vllm`` module the worker's shim (``resident_engine.py``); the
  task asks OpenCompass for no GPU (the engine server holds the devices) and one replica.

Every value is written with ``repr`` so that a path or a prompt can never break out of its
string. Nothing from the checkpoint is trusted to run: ``trust_remote_code=False`` everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autorl.eval_config import SKIP_SPECIAL_TOKENS
from autorl.tasks.base import Task
from autorl.tasks.gsm8k import QUESTION_TEMPLATE
from autorl_evaluator.model_settings import ModelSettings

#: OpenCompass's dataset config that the reference evaluates GSM8K with.
DATASET_MODULE = "opencompass.configs.datasets.gsm8k.gsm8k_gen_1d7fe4"
#: The dataset abbreviation: the summary's ``dataset`` column and the predictions' file name.
DATASET_ABBR = "gsm8k"
#: OpenCompass loads ``$COMPASS_DATA_CACHE/data/gsm8k/{train,test}.jsonl`` for this dataset path.
DATASET_DATA_SUBDIR = Path("data") / "gsm8k"
#: The model column of the summary and the predictions' folder name.
MODEL_ABBR = "submission"
_ROLES = {"user": "HUMAN", "assistant": "BOT", "system": "SYSTEM"}
#: The folder put on OpenCompass's ``PYTHONPATH`` for a CPU config: the module of its model's builder.
CHAT_MODEL_FOLDER = Path(__file__).resolve().parent / "compass_models"
#: The builder's module (in :data:`CHAT_MODEL_FOLDER`, standard library only) and the builder.
CHAT_MODEL_MODULE = "autorl_chat_model"
CHAT_MODEL_BUILDER = "chat_model"


@dataclass(frozen=True)
class GpuPlan:
    """Devices for one vLLM evaluation: ``replicas`` engines, each sharded over
    ``tensor_parallel_size`` of the devices."""

    devices: tuple[int, ...]
    replicas: int = 1

    @property
    def tensor_parallel_size(self) -> int:
        return len(self.devices) // self.replicas

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(device) for device in self.devices)


@dataclass(frozen=True)
class ConfigInputs:
    """Everything a config is made from."""

    model_dir: Path
    task: Task
    max_out_len: int
    model: ModelSettings
    #: None: evaluate on the CPU with transformers.
    gpu: GpuPlan | None
    #: Prompts per batch on the CPU; the same as the in-process backend's, so both pad alike.
    cpu_batch_size: int
    #: Generation goes to the worker's resident engine (``resident_engine.py``).
    resident: bool = False

    @property
    def uses_vllm_model(self) -> bool:
        return self.gpu is not None or self.resident

    @property
    def replicas(self) -> int:
        return self.gpu.replicas if self.gpu is not None and not self.resident else 1


def render(inputs: ConfigInputs) -> str:
    """The config file's text."""
    model = _gpu_model(inputs) if inputs.uses_vllm_model else _cpu_model(inputs)
    type_name = model_type(inputs)
    replicas = inputs.replicas
    if inputs.uses_vllm_model:
        model_import = f"from opencompass.models import {type_name}"
        model_line = f"models = [dict(type={type_name}, **{model!r})]"
    else:
        # OpenCompass's class, named by its path and built by ours (which imports nothing of OpenCompass's).
        model_import = f"from {CHAT_MODEL_MODULE} import {CHAT_MODEL_BUILDER}"
        model_class = f"opencompass.models.{type_name}"
        model_line = f"models = [dict(type={CHAT_MODEL_BUILDER}, model_class={model_class!r}, **{model!r})]"
    lines = [
        "# Written by autorl_evaluator.backends.opencompass.config (one evaluation); not to be edited.",
        "from mmengine.config import read_base",
        model_import,
        "from opencompass.partitioners import NaivePartitioner, NumWorkerPartitioner",
        "from opencompass.runners import LocalRunner",
        "from opencompass.tasks import OpenICLEvalTask, OpenICLInferTask",
        "",
        "with read_base():",
        f"    from {DATASET_MODULE} import gsm8k_datasets",
        "",
        "datasets = [gsm8k_datasets[0]]",
        f"datasets[0]['abbr'] = {DATASET_ABBR!r}",
        f"datasets[0]['infer_cfg']['inferencer']['max_out_len'] = {inputs.max_out_len!r}",
    ]
    rounds = prompt_rounds(inputs.task)
    if rounds is not None:
        # A task in GSM8K's format with exemplars of its own: same prompt shape, its own shots.
        lines.append(f"datasets[0]['infer_cfg']['prompt_template']['template']['round'] = {rounds!r}")
    lines += [
        "",
        model_line,
        "",
        # One inference task per replica, on devices of its own; one evaluation task.
        "infer = dict(",
        f"    partitioner={_infer_partitioner(replicas)},",
        f"    runner=dict(type=LocalRunner, max_num_workers={replicas!r}, task=dict(type=OpenICLInferTask)),",
        ")",
        "eval = dict(",
        "    partitioner=dict(type=NaivePartitioner),",
        "    runner=dict(",
        "        type=LocalRunner, max_num_workers=1, task=dict(type=OpenICLEvalTask, dump_details=True)",
        "    ),",
        ")",
        "",
    ]
    return "\n".join(lines)


def model_type(inputs: ConfigInputs) -> str:
    """OpenCompass's model class for the config: its vLLM wrapper, or transformers on the CPU."""
    return "VLLMwithChatTemplate" if inputs.uses_vllm_model else "HuggingFacewithChatTemplate"


def _infer_partitioner(replicas: int) -> str:
    if replicas == 1:
        return "dict(type=NaivePartitioner)"
    # As many consecutive shards as replicas, one task each, however small the split.
    return (
        f"dict(type=NumWorkerPartitioner, num_worker={replicas!r}, num_split={replicas!r}, min_task_size=1)"
    )


def prompt_rounds(task: Task) -> list[dict[str, str]] | None:
    """OpenCompass template rounds for ``task``, or None where the dataset config's own are used.

    GSM8K keeps ``gsm8k_gen_1d7fe4``'s prompt untouched (the task's exemplars are the same four,
    which the tests check); another task in the same format gets its own few-shot turns.
    """
    if task.name == DATASET_ABBR:
        return None
    return messages_to_rounds([*task.few_shot_messages(), {"role": "user", "content": QUESTION_TEMPLATE}])


def messages_to_rounds(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    return [{"role": _ROLES[message["role"]], "prompt": message["content"]} for message in messages]


def _common_model(inputs: ConfigInputs) -> dict[str, Any]:
    path = str(inputs.model_dir)
    common: dict[str, Any] = {
        "abbr": MODEL_ABBR,
        "path": path,
        "max_seq_len": inputs.model.max_seq_len,
    }
    if inputs.model.strip_reasoning:
        common["pred_postprocessor"] = {"type": "extract-non-reasoning-content"}
    return common


def _gpu_model(inputs: ConfigInputs) -> dict[str, Any]:
    settings = inputs.model
    tp = inputs.gpu.tensor_parallel_size if inputs.gpu is not None else 1
    return {
        **_common_model(inputs),
        "model_kwargs": {
            "tensor_parallel_size": tp,
            "gpu_memory_utilization": settings.gpu_memory_utilization,
            "dtype": settings.dtype,
            "max_model_len": settings.max_seq_len,
            "trust_remote_code": False,
            # An engine for one evaluation stays eager: capturing CUDA graphs costs more start-up
            # than one split wins back. The resident engine starts once and serves many: graphs and
            # prefix caching, measured faster with the same final answers (docs/PERFORMANCE.md).
            "enforce_eager": settings.enforce_eager and not inputs.resident,
            # Ray would start daemons in sessions of their own, out of reach of the hard timeout.
            "distributed_executor_backend": "mp",
            **({"enable_prefix_caching": True} if inputs.resident else {}),
        },
        "batch_size": settings.gpu_batch_size,
        "generation_kwargs": settings.vllm_generation_kwargs(),
        "chat_template_kwargs": settings.chat_template_kwargs(),
        # The resident engine holds the devices; OpenCompass's task only talks to it.
        "run_cfg": {"num_gpus": 0 if inputs.resident else tp, "num_procs": 1},
    }


def _cpu_model(inputs: ConfigInputs) -> dict[str, Any]:
    return {
        **_common_model(inputs),
        "model_kwargs": {"device_map": "cpu", "torch_dtype": "torch.float", "trust_remote_code": False},
        "tokenizer_kwargs": {"trust_remote_code": False},
        "batch_size": inputs.cpu_batch_size,
        "generation_kwargs": inputs.model.hf_generation_kwargs(),
        "skip_special_tokens": SKIP_SPECIAL_TOKENS,
        "run_cfg": {"num_gpus": 0, "num_procs": 1},
    }
