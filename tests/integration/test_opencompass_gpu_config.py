"""The GPU path as far as a machine without GPUs can take it.

- The generated vLLM config loads with OpenCompass's own config loader (mmengine ``Config.fromfile``
  in ``.venv-opencompass``), and OpenCompass's own ``LocalRunner`` allocates devices for it: for
  Qwen2.5-0.5B, 1.5B and 7B shapes on 1, 2, 3, 4 and 8 visible GPUs the tensor-parallel size (derived
  from the heads and the intermediate size), ``run_cfg.num_gpus``, the devices made visible to
  OpenCompass and the devices its runner hands the inference task are one number and one list.
  Only the final start of the task is replaced by a record of it (no vLLM here).
- A model that fits one GPU runs as one replica per GPU: OpenCompass's own ``NumWorkerPartitioner``
  cuts the test split into consecutive shards, one task each, and its ``LocalRunner`` hands each task
  a device of its own; the shards' predictions are read back in problem order.
- The evaluator image's locks resolve for Linux x86_64 from package metadata alone: OpenCompass's for
  Python 3.11 (the base of every image, the gpu evaluator's included) and 3.12, the resident engine's
  (vLLM, the gpu image's /opt/vllm) for 3.11, holding the versions that ran on the GPU.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name

from autorl.tasks import get_task
from autorl.tasks.base import Problem, write_problems
from autorl_evaluator.backends.opencompass.backend import place, subprocess_environment
from autorl_evaluator.backends.opencompass.config import DATASET_DATA_SUBDIR, ConfigInputs, GpuPlan, render
from autorl_evaluator.backends.opencompass.parallel import TensorParallelShape, tensor_parallel_size
from autorl_evaluator.model_settings import settings_for
from autorl_evaluator.settings import WorkerSettings
from tests.support.lock_tool import load_lock_tool
from tests.support.opencompass_models import OC_PYTHON, run_in_opencompass

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCK = REPO_ROOT / "docker" / "evaluator-worker.lock"
ENGINE_LOCK = REPO_ROOT / "docker" / "evaluator-vllm.lock"
#: What ran on the GPU beside the machine's own packages (vLLM 0.25.0 and the wheels it needed).
RAN_ON_THE_GPU = REPO_ROOT / "bench" / "data" / "vllm-0.25-serve-wheels.txt"
LOCK_PLATFORM = ["--python-platform", "x86_64-manylinux_2_36"]

# Runs inside .venv-opencompass: OpenCompass's loader, partitioner and LocalRunner allocation.
OC_SCRIPT = """
import json, os, sys, threading
from mmengine.config import Config
from opencompass.registry import PARTITIONERS, RUNNERS
from opencompass.runners import LocalRunner
from opencompass.runners.local import get_command_template


class RecordingRunner(LocalRunner):
    launched = []

    def _launch(self, task, gpu_ids, index):
        command = task.get_command(cfg_path='params.py', template=get_command_template(list(gpu_ids)))
        RecordingRunner.launched.append(
            {'num_gpus': task.num_gpus, 'gpu_ids': [int(i) for i in gpu_ids], 'command': command,
             'test_range': task.dataset_cfgs[0][0]['reader_cfg'].get('test_range', '')})
        # Hold the devices as a running task would, until every task of the case has started.
        RecordingRunner.barrier.wait()
        return task.name, 0


results = []
for case in json.load(open(sys.argv[1])):
    os.environ['CUDA_VISIBLE_DEVICES'] = case['cuda_visible_devices']
    os.environ['COMPASS_DATA_CACHE'] = case['compass_data_cache']
    cfg = Config.fromfile(case['config'], format_python_code=False)
    cfg['work_dir'] = case['work_dir']
    cfg.infer.partitioner['out_dir'] = os.path.join(case['work_dir'], 'predictions/')
    tasks = PARTITIONERS.build(cfg.infer.partitioner)(cfg)
    runner_cfg = dict(cfg.infer.runner)
    runner_cfg['type'] = RecordingRunner
    RecordingRunner.launched = []
    RecordingRunner.barrier = threading.Barrier(len(tasks), timeout=60)
    list(RUNNERS.build(runner_cfg).launch(tasks))
    model = cfg.models[0]
    dataset = cfg.datasets[0]
    results.append({
        'model_type': model['type'].__name__,
        'tensor_parallel_size': model['model_kwargs']['tensor_parallel_size'],
        'num_gpus': model['run_cfg']['num_gpus'],
        'model_kwargs': dict(model['model_kwargs']),
        'generation_kwargs': dict(model['generation_kwargs']),
        'chat_template_kwargs': dict(model['chat_template_kwargs']),
        'pred_postprocessor': dict(model['pred_postprocessor']),
        'dataset_type': dataset['type'].__name__,
        'max_out_len': dataset['infer_cfg']['inferencer']['max_out_len'],
        'launched': sorted(RecordingRunner.launched, key=lambda launch: launch['test_range']),
    })
json.dump(results, open(sys.argv[2], 'w'))
"""

pytestmark = pytest.mark.requires(OC_PYTHON.exists(), reason="needs .venv-opencompass (make setup)")


#: config.json sizes of the Qwen2.5 models (heads, KV heads, intermediate size).
SHAPES = {
    "qwen2.5-0.5b": TensorParallelShape(attention_heads=14, kv_heads=2, intermediate_size=4864),
    "qwen2.5-1.5b": TensorParallelShape(attention_heads=12, kv_heads=2, intermediate_size=8960),
    "qwen2.5-7b": TensorParallelShape(attention_heads=28, kv_heads=4, intermediate_size=18944),
}


def _gpu_config(
    tmp_path: Path, worker_devices: str, shape_name: str = "qwen2.5-1.5b", *, fits_one_gpu: bool = False
) -> tuple[Path, dict[str, str], int]:
    settings = WorkerSettings(home=tmp_path / "home", eval_device=None)
    environ = {"CUDA_VISIBLE_DEVICES": worker_devices}
    placement = place(settings, environ, SHAPES[shape_name], fits_one_gpu=fits_one_gpu)
    assert placement.gpu is not None
    model = settings_for({"model_type": "qwen2", "max_position_embeddings": 32768})
    inputs = ConfigInputs(
        model_dir=tmp_path / "model",
        task=get_task("gsm8k"),
        max_out_len=512,
        model=model,
        gpu=placement.gpu,
        cpu_batch_size=64,
    )
    layout = "dp" if fits_one_gpu else "tp"
    config = tmp_path / f"config-{layout}-{shape_name}-{worker_devices.replace(',', '_')}.py"
    config.write_text(render(inputs))
    env = subprocess_environment(environ, run_dir=tmp_path, cache_dir=tmp_path / "cache", placement=placement)
    return config, env, placement.gpu.tensor_parallel_size


WORKER_VIEWS = ["0", "0,1", "0,1,2", "0,1,2,3", "0,1,2,3,4,5,6,7", "2,3,5"]


@dataclass
class Allocation:
    shape: str
    worker_view: str
    tensor_parallel_size: int
    devices: list[int]
    env: dict[str, str]
    opencompass: dict[str, Any]


#: Problems in the test split the partitioner shards (its size is read from the dataset itself).
SPLIT_SIZE = 50


def _run_opencompass(root: Path, prepared: list[tuple[Path, dict[str, str]]]) -> list[dict[str, Any]]:
    """Load each config and allocate its tasks with OpenCompass's own code, in one process."""
    data = root / "compass-data" / DATASET_DATA_SUBDIR
    problems = [Problem(f"question {i}?", f"step\n#### {i}") for i in range(SPLIT_SIZE)]
    write_problems(data / "test.jsonl", problems)
    write_problems(data / "train.jsonl", [])
    cases = [
        {
            "config": str(config),
            "cuda_visible_devices": env["CUDA_VISIBLE_DEVICES"],
            "work_dir": str(root),
            "compass_data_cache": str(root / "compass-data"),
        }
        for config, env in prepared
    ]
    results: list[dict[str, Any]] = run_in_opencompass(OC_SCRIPT, cases, root, timeout_s=300)
    return results


@pytest.fixture(scope="module")
def allocations(tmp_path_factory: pytest.TempPathFactory) -> list[Allocation]:
    """Configs for each worker view, loaded and allocated by OpenCompass in one process."""
    root = tmp_path_factory.mktemp("gpu-config")
    prepared = []
    for shape in SHAPES:
        for view in WORKER_VIEWS:
            config, env, tp = _gpu_config(root, view, shape)
            prepared.append((shape, view, config, env, tp))
    results = _run_opencompass(root, [(config, env) for _, _, config, env, _ in prepared])
    return [
        Allocation(shape, view, tp, [int(d) for d in view.split(",")][:tp], env, result)
        for (shape, view, _, env, tp), result in zip(prepared, results, strict=True)
    ]


@pytest.mark.opencompass
def test_one_value_drives_tensor_parallel_size_num_gpus_and_visible_devices(
    allocations: list[Allocation],
) -> None:
    sizes = {shape: [a.tensor_parallel_size for a in allocations if a.shape == shape] for shape in SHAPES}
    # Worker views: 1, 2, 3, 4 and 8 GPUs, then 3 GPUs that are not the first ones.
    assert sizes == {
        "qwen2.5-0.5b": [1, 2, 2, 2, 2, 2],
        "qwen2.5-1.5b": [1, 2, 2, 4, 4, 2],
        "qwen2.5-7b": [1, 2, 2, 4, 4, 2],
    }
    for allocation in allocations:
        tp, devices, result = allocation.tensor_parallel_size, allocation.devices, allocation.opencompass
        assert tp == tensor_parallel_size(len(allocation.worker_view.split(",")), SHAPES[allocation.shape])
        assert allocation.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, devices))
        assert result["model_type"] == "VLLMwithChatTemplate"
        assert result["tensor_parallel_size"] == result["num_gpus"] == tp
        [launched] = result["launched"]
        assert launched["num_gpus"] == tp
        assert launched["gpu_ids"] == devices
        assert launched["command"].startswith(f"CUDA_VISIBLE_DEVICES={','.join(map(str, devices))} ")
        # vLLM shards itself: one process, never torchrun with one rank per GPU.
        assert "torch.distributed.run" not in launched["command"]


@pytest.mark.opencompass
def test_gpu_config_carries_the_reference_settings(allocations: list[Allocation]) -> None:
    result, env = allocations[0].opencompass, allocations[0].env
    assert result["dataset_type"] == "GSM8KDataset" and result["max_out_len"] == 512
    assert result["model_kwargs"] == {
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "dtype": "bfloat16",
        "max_model_len": 32768,
        "trust_remote_code": False,
        "enforce_eager": True,
        "distributed_executor_backend": "mp",
    }
    assert result["generation_kwargs"] == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 1,
        "skip_special_tokens": True,  # vLLM's default, the platform's rule: said, not assumed
    }
    assert result["chat_template_kwargs"] == {"enable_thinking": False}
    assert result["pred_postprocessor"] == {"type": "extract-non-reasoning-content"}
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1"


def _model_kwargs(config_text: str) -> dict[str, Any]:
    """The model keyword arguments of a rendered config (its ``models = [dict(type=T, **{...})]``)."""
    line = next(line for line in config_text.splitlines() if line.startswith("models = [dict("))
    model: dict[str, Any] = ast.literal_eval(line[line.index("**") + 2 : line.rindex(")]")])
    return dict(model["model_kwargs"])


def test_the_resident_engine_captures_cuda_graphs_with_prefix_caching_and_a_one_off_engine_stays_eager(
    tmp_path: Path,
) -> None:
    model = settings_for({"model_type": "qwen2", "max_position_embeddings": 32768})
    common = {"model_dir": tmp_path, "task": get_task("gsm8k"), "max_out_len": 512, "model": model}
    one_off = _model_kwargs(render(ConfigInputs(**common, gpu=GpuPlan((0,)), cpu_batch_size=64)))
    resident = _model_kwargs(
        render(ConfigInputs(**common, gpu=GpuPlan((0,)), cpu_batch_size=64, resident=True))
    )
    assert one_off["enforce_eager"] is True and "enable_prefix_caching" not in one_off
    assert resident["enforce_eager"] is False and resident["enable_prefix_caching"] is True
    # Everything else the engine is given is the same.
    assert {k: v for k, v in resident.items() if k not in ("enforce_eager", "enable_prefix_caching")} == {
        k: v for k, v in one_off.items() if k != "enforce_eager"
    }


def test_worker_secrets_do_not_reach_opencompass(tmp_path: Path) -> None:
    settings = WorkerSettings(home=tmp_path / "home", eval_device="cpu")
    placement = place(settings, {}, SHAPES["qwen2.5-1.5b"])
    environ = {
        "PATH": "/usr/bin",
        "AUTORL_DATABASE_URL": "postgresql://user:pw-0a1b2c@db/autorl",
        "AUTORL_ADMIN_TOKEN": "pw-0a1b2c",
        "HF_TOKEN": "pw-0a1b2c",
        "NCCL_NVLS_ENABLE": "0",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    env = subprocess_environment(environ, run_dir=tmp_path, cache_dir=tmp_path / "cache", placement=placement)
    assert not any("pw-0a1b2c" in value for value in env.values())
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU evaluation sees no GPU


#: A ``name==version`` line of a lock or of ``uv pip compile``'s output.
PIN = re.compile(r"^([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==(\S+)", re.MULTILINE)
UV = shutil.which("uv", path=str(REPO_ROOT / ".venv" / "bin"))
QUIET = ("--no-header", "--no-annotate", "--quiet")
needs_uv = pytest.mark.requires(UV is not None, reason="needs uv in .venv (make setup)")


def pins(requirements: str) -> dict[str, str]:
    """``{normalized name: version}`` of the ``name==version`` lines of a requirements text."""
    return {str(canonicalize_name(name)): version for name, version in PIN.findall(requirements)}


def resolve_for_linux(lock: Path, python: str, *options: str) -> dict[str, str]:
    """``{name: version}`` that ``uv pip compile`` resolves ``lock`` to for Linux x86_64 and ``python``,
    from package metadata alone."""
    assert UV is not None
    resolved = subprocess.run(
        [UV, "pip", "compile", str(lock), *options, "--python-version", python, *LOCK_PLATFORM, *QUIET],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    return pins(resolved.stdout)


@pytest.mark.slow
@needs_uv
@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_evaluator_image_lock_resolves_for_linux_python(python: str) -> None:
    locked = pins(LOCK.read_text())
    assert resolve_for_linux(LOCK, python) == locked
    assert locked["opencompass"] == "0.5.2" and "vllm" not in locked
    assert locked["transformers"].startswith("4.")
    # The worker runs in the same environment: every dependency of the core is locked.
    core = (REPO_ROOT / "pyproject.toml").read_text().split("dependencies = [", 1)[1].split("]", 1)[0]
    for requirement in re.findall(r'"([A-Za-z0-9_-]+)', core):
        assert requirement.lower().replace("_", "-") in {name.lower() for name in locked}, requirement


def _requirement_names(path: Path) -> set[str]:
    """The package names a requirements file lists, one a line (comments and blank lines aside)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {str(canonicalize_name(line)) for line in lines if line}


@pytest.mark.slow
@needs_uv
def test_engine_image_lock_resolves_for_linux_python_and_holds_what_ran_on_the_gpu() -> None:
    overrides, excludes = (
        REPO_ROOT / "docker" / f"evaluator-vllm.{kind}" for kind in ("overrides", "excludes")
    )
    resolved = resolve_for_linux(
        ENGINE_LOCK, "3.11", "--overrides", str(overrides), "--excludes", str(excludes)
    )
    # Every entry is hash-pinned (parse refuses one without hashes).
    locked: dict[str, str] = {
        name: version for name, (version, _, _) in load_lock_tool().parse(ENGINE_LOCK.read_text()).items()
    }
    assert resolved == locked
    # The engine that ran: vLLM 0.25.0 on torch 2.11.0 (PyPI's CUDA 13.0 build) and transformers 5, and
    # every wheel that went in beside the GPU machine's own packages at the version that ran.
    assert (locked["vllm"], locked["torch"], locked["transformers"]) == ("0.25.0", "2.11.0", "5.17.0")
    assert locked["cuda-toolkit"].startswith("13.0.")
    ran = pins(RAN_ON_THE_GPU.read_text())
    assert {name: locked.get(name) for name in ran} == ran
    # ... and so does every version the .in file asks for (the GPU machine's own packages'): the lock is
    # the .in file's resolution.
    asked = pins((REPO_ROOT / "docker" / "evaluator-vllm.in").read_text())
    assert {name: locked.get(name) for name in asked} == asked
    # What the run did not have is not there: flashinfer among it (VLLM_USE_FLASHINFER_SAMPLER=0).
    assert "flashinfer-python" in _requirement_names(excludes)
    assert not _requirement_names(excludes) & set(locked)
    # The engine server's one import beside vLLM and the standard library.
    assert "safetensors" in locked


@pytest.mark.opencompass
def test_a_model_that_fits_one_gpu_runs_one_replica_per_gpu_on_consecutive_shards(tmp_path: Path) -> None:
    views = ["0,1", "0,1,2", "0,1,2,3", "0,1,2,3,4,5,6,7", "2,3,5"]
    prepared = [_gpu_config(tmp_path, view, "qwen2.5-7b", fits_one_gpu=True) for view in views]
    results = _run_opencompass(tmp_path, [(config, env) for config, env, _ in prepared])
    for view, (_, env, tp), result in zip(views, prepared, results, strict=True):
        devices = [int(device) for device in view.split(",")]
        assert tp == 1 and env["CUDA_VISIBLE_DEVICES"] == view
        assert result["tensor_parallel_size"] == result["num_gpus"] == 1
        launched = result["launched"]
        # One task per GPU, each on a device of its own, all of them in use.
        assert sorted(device for launch in launched for device in launch["gpu_ids"]) == devices
        assert all(launch["num_gpus"] == 1 for launch in launched)
        # Consecutive shards that cover the split once, in order.
        ranges = [re.fullmatch(r"\[(\d+):(\d+)\]", launch["test_range"]) for launch in launched]
        bounds = sorted((int(match.group(1)), int(match.group(2))) for match in ranges if match)
        assert len(bounds) == len(devices) and bounds[0][0] == 0 and bounds[-1][1] >= SPLIT_SIZE
        assert all(end == start for (_, end), (start, _) in itertools.pairwise(bounds))
